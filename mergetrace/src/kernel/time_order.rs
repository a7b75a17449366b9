//! Merges the per-CPU event rings back into one time order.
//!
//! Each CPU's ring holds that CPU's events nearly in time order: a program takes its
//! timestamp first and writes its event last, so an interrupt's program in between can write
//! a later event first. Across CPUs, one ring can be drained while another still holds
//! earlier events, a program can be between its timestamp and its write while the rings
//! are read, and a CPU's events wait in its batch until it is full or 10 ms old (30 ms at
//! most when the CPU falls quiet: the collector's next poll sends it). So events wait here
//! until no ring can still bring an earlier one: until they are older than the moment the
//! rings were read, less [`GRACE_NS`]. An event later than that (its CPU stalled longer, e.g.
//! a descheduled virtual CPU) is still written, never dropped, in the next batch, and counted
//! as late.
use std::collections::VecDeque;

use mergetrace_common::Event;

/// How long an event can take from its timestamp to its ring, at most, in the merge's view.
pub const GRACE_NS: u64 = 100_000_000;

/// Events waiting for their turn, a queue per CPU ring, each in time order.
#[derive(Default)]
pub struct TimeOrder {
    queues: Vec<VecDeque<Event>>,
    /// The latest timestamp handed out so far.
    released: u64,
    late: u64,
}

impl TimeOrder {
    /// A merge of `rings` rings.
    pub fn new(rings: usize) -> TimeOrder {
        TimeOrder {
            queues: vec![VecDeque::new(); rings],
            ..TimeOrder::default()
        }
    }

    /// Takes what ring `ring` delivered, in its order.
    pub fn push(&mut self, ring: usize, events: impl IntoIterator<Item = Event>) {
        let queue = &mut self.queues[ring];
        for e in events {
            self.late += (e.ts_ns < self.released) as u64;
            if queue.back().is_none_or(|last| last.ts_ns <= e.ts_ns) {
                queue.push_back(e);
            } else {
                // An interrupted program wrote its event after the interrupt's: it goes after
                // the last one not later (near the end: the inversions are short).
                let at = queue.partition_point(|q| q.ts_ns <= e.ts_ns);
                queue.insert(at, e);
            }
        }
    }

    /// Appends to `out`, in time order, every waiting event not later than `watermark`.
    pub fn release(&mut self, watermark: u64, out: &mut Vec<Event>) {
        let due: Vec<usize> = self
            .queues
            .iter()
            .map(|q| q.partition_point(|e| e.ts_ns <= watermark))
            .collect();
        let mut busy = (0..self.queues.len()).filter(|&i| due[i] > 0);
        match (busy.next(), busy.next(), busy.next()) {
            (None, ..) => return,
            (Some(a), None, _) => out.extend(self.queues[a].range(..due[a]).copied()),
            // Two rings (a 2-CPU host, or two CPUs doing the I/O): merged in one pass, each
            // event copied once.
            (Some(a), Some(b), None) => merge_two(
                self.queues[a].range(..due[a]).copied(),
                self.queues[b].range(..due[b]).copied(),
                out,
            ),
            _ => {
                let start = out.len();
                for (queue, &due) in self.queues.iter().zip(&due) {
                    out.extend(queue.range(..due).copied());
                }
                // Each queue is in time order, so a stable sort merges them: it finds the
                // queues' runs and merges those (cheaper than a heap step per event when CPUs
                // take turns event by event). Stable: equal timestamps keep each ring's order,
                // and the rings' index order.
                out[start..].sort_by_key(|e| e.ts_ns);
            }
        }
        for (queue, &due) in self.queues.iter_mut().zip(&due) {
            queue.drain(..due);
        }
        if let Some(last) = out.last() {
            self.released = self.released.max(last.ts_ns);
        }
    }

    /// Appends every waiting event to `out`, in time order (the rings are drained for good).
    pub fn release_all(&mut self, out: &mut Vec<Event>) {
        self.release(u64::MAX, out);
    }

    /// The merge's watermark for rings read at `read_at` (CLOCK_MONOTONIC ns).
    pub fn watermark(read_at: u64) -> u64 {
        read_at.saturating_sub(GRACE_NS)
    }

    /// Events that came after later ones had been handed out (written out of time order).
    pub fn late(&self) -> u64 {
        self.late
    }
}

/// Appends `a` and `b`, each in time order, to `out` in time order; on equal timestamps
/// `a`'s first (the ring of the lower index).
fn merge_two(a: impl Iterator<Item = Event>, b: impl Iterator<Item = Event>, out: &mut Vec<Event>) {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        let next = if y.ts_ns < x.ts_ns {
            b.next()
        } else {
            a.next()
        };
        out.extend(next);
    }
    out.extend(a);
    out.extend(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, id: u64) -> Event {
        Event {
            ts_ns: ts,
            id,
            ..Default::default()
        }
    }

    fn ts(events: &[Event]) -> Vec<u64> {
        events.iter().map(|e| e.ts_ns).collect()
    }

    #[test]
    fn two_cpus_out_of_step_come_out_in_time_order() {
        let mut m = TimeOrder::new(2);
        let mut out = Vec::new();
        // CPU 1 is read first and is ahead; CPU 0's earlier events arrive after.
        m.push(1, [ev(20, 1), ev(40, 1), ev(60, 1)]);
        m.push(0, [ev(10, 0), ev(30, 0)]);
        m.release(45, &mut out);
        assert_eq!(ts(&out), [10, 20, 30, 40]);
        m.push(0, [ev(50, 0), ev(70, 0)]);
        m.release_all(&mut out);
        assert_eq!(ts(&out), [10, 20, 30, 40, 50, 60, 70]);
        assert_eq!(m.late(), 0);
    }

    #[test]
    fn an_interrupted_write_is_put_back_in_its_place() {
        let mut m = TimeOrder::new(1);
        let mut out = Vec::new();
        // An interrupt's event (35) was written before the event it interrupted (30), and
        // one batch ended between them.
        m.push(0, [ev(10, 0), ev(20, 0), ev(35, 0)]);
        m.push(0, [ev(30, 0), ev(25, 0), ev(40, 0)]);
        m.release_all(&mut out);
        assert_eq!(ts(&out), [10, 20, 25, 30, 35, 40]);
        assert_eq!(m.late(), 0);
    }

    #[test]
    fn equal_times_keep_each_ring_order_and_rings_in_index_order() {
        let mut m = TimeOrder::new(2);
        let mut out = Vec::new();
        m.push(1, [ev(5, 10), ev(5, 11)]);
        m.push(0, [ev(5, 1), ev(5, 2)]);
        m.release_all(&mut out);
        assert_eq!(out.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 10, 11]);
    }

    #[test]
    fn a_late_event_is_kept_and_counted() {
        let mut m = TimeOrder::new(2);
        let mut out = Vec::new();
        m.push(0, [ev(100, 0), ev(200, 0)]);
        m.release(250, &mut out);
        // CPU 1 was stalled past the grace: its event is older than what went out.
        m.push(1, [ev(150, 1), ev(300, 1)]);
        m.release(400, &mut out);
        assert_eq!(ts(&out), [100, 200, 150, 300]);
        assert_eq!(m.late(), 1);
    }

    #[test]
    fn nothing_newer_than_the_watermark_goes_out() {
        let mut m = TimeOrder::new(3);
        let mut out = Vec::new();
        m.push(2, [ev(1_000, 2)]);
        m.push(0, [ev(2_000, 0)]);
        m.release(TimeOrder::watermark(1_000 + GRACE_NS - 1), &mut out);
        assert!(out.is_empty());
        m.release(TimeOrder::watermark(1_500 + GRACE_NS), &mut out);
        assert_eq!(ts(&out), [1_000]);
        assert_eq!(TimeOrder::watermark(5), 0);
    }

    /// Many CPUs, each in order with small inversions, shuffled across batches: the merge
    /// gives the sorted whole, with nothing lost or doubled.
    #[test]
    fn many_rings_merge_to_the_sorted_whole() {
        // One ring (no merge), two (merged in one pass), more (sorted).
        for cpus in [1, 2, 3, 8] {
            rings_merge_to_the_sorted_whole(cpus);
        }
    }

    fn rings_merge_to_the_sorted_whole(cpus: usize) {
        let mut m = TimeOrder::new(cpus);
        let mut all = Vec::new();
        let mut out = Vec::new();
        let mut seed = 7u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut clock = vec![0u64; cpus];
        for round in 0..200u64 {
            for (cpu, t) in clock.iter_mut().enumerate() {
                let mut batch: Vec<Event> = (0..rand() % 20)
                    .map(|_| {
                        *t += 1 + rand() % 50;
                        ev(*t, (cpu as u64) << 32 | all.len() as u64)
                    })
                    .collect();
                if batch.len() > 2 && rand() % 3 == 0 {
                    batch.swap(0, 1); // an interrupted program
                }
                all.extend(batch.iter().copied());
                m.push(cpu, batch);
            }
            // Read time: the slowest CPU's clock, as if the rest waited in rings.
            let read_at = clock.iter().min().copied().unwrap_or(0);
            m.release(read_at.saturating_sub(round % 5), &mut out);
        }
        m.release_all(&mut out);
        assert_eq!(m.late(), 0);
        assert!(out.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        let mut got: Vec<(u64, u64)> = out.iter().map(|e| (e.ts_ns, e.id)).collect();
        let mut want: Vec<(u64, u64)> = all.iter().map(|e| (e.ts_ns, e.id)).collect();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
