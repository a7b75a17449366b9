//! Moves events from the kernel's per-CPU rings to a consumer in batches, in time order
//! ([`TimeOrder`]), sending on the way the programs' event batches that a CPU left waiting.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};
use mergetrace_common::Event;
use tokio::{io::unix::AsyncFd, sync::watch};

use super::{
    monotonic_ns,
    rings::{self, Batches, CpuRing},
    time_order::TimeOrder,
};

/// How often the reader looks without a wake-up (the programs wake it for big batches only).
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// What a collection did beside handing out the events.
#[derive(Debug, Default, Clone, Copy)]
pub struct Collected {
    /// Events that reached user space after later ones had been written (kept, out of order).
    pub late: u64,
    /// Where the collecting thread's CPU went, when asked for ([`run`]'s `time_stages`).
    pub costs: Option<Costs>,
}

/// The collecting thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, so preemption is not in it)
/// by stage of the data path, in ns. Read around each stage of a step (a few a poll), never
/// per event.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Costs {
    /// Taking the records off the rings and queueing their events for the merge.
    pub reading_ns: u64,
    /// Merging the CPUs' queues into time order.
    pub ordering_ns: u64,
    /// The consumer's time with each batch in time order (a capture: encoding and writing).
    pub consuming_ns: u64,
}

/// Adds the thread CPU time `f` took to `*into`, when timed.
#[inline]
fn timed<T>(into: Option<&mut u64>, f: impl FnOnce() -> T) -> T {
    match into {
        None => f(),
        Some(ns) => {
            let at = crate::sys::thread_cpu_ns();
            let r = f();
            *ns += crate::sys::thread_cpu_ns().saturating_sub(at);
            r
        }
    }
}

/// The rings and the programs' batches on their way there, the merge, and the batches of
/// events in time order it hands out.
struct Reader {
    rings: Vec<CpuRing>,
    /// The programs' batches, where they gather events (`Modes::staged`).
    batches: Option<Batches>,
    order: TimeOrder,
    batch: Vec<Event>,
    costs: Option<Costs>,
}

impl Reader {
    /// Sends the batches a CPU has held too long to their rings, all of them once `last`:
    /// on the poll timer only (a wake-up comes from a CPU that is sending anyway).
    fn send_old_batches(&self, last: bool) -> Result<()> {
        match &self.batches {
            Some(b) => b.send_old(if last { u64::MAX } else { monotonic_ns() }),
            None => Ok(()),
        }
    }

    /// Drains every ring into the merge, then hands `sink` what is in time order by now (all
    /// of it once `last`).
    fn step(&mut self, last: bool, sink: &mut impl FnMut(&[Event])) -> Result<()> {
        // The time is read before the rings: an event not in its ring by then and older than
        // the watermark would have had to wait longer than the grace.
        let read_at = monotonic_ns();
        let (rings, order) = (&mut self.rings, &mut self.order);
        timed(self.costs.as_mut().map(|c| &mut c.reading_ns), || {
            for (i, r) in rings.iter_mut().enumerate() {
                while let Some(record) = r.ring.next() {
                    // A record of another size is not the programs': skipped.
                    if let Some(events) = rings::decode(&record) {
                        order.push(i, events);
                    }
                }
            }
        });
        let ordering = self.costs.as_mut().map(|c| &mut c.ordering_ns);
        if last {
            // With the programs detached, what no flush could send (an offline CPU's batch)
            // is read from the map.
            if let Some(b) = &self.batches {
                for (cpu, events) in b.take_left()? {
                    if cpu < self.rings.len() {
                        self.order.push(cpu, events);
                    }
                }
            }
            timed(ordering, || self.order.release_all(&mut self.batch));
        } else {
            let watermark = TimeOrder::watermark(read_at);
            timed(ordering, || self.order.release(watermark, &mut self.batch));
        }
        if !self.batch.is_empty() {
            let batch = &self.batch;
            timed(self.costs.as_mut().map(|c| &mut c.consuming_ns), || {
                sink(batch)
            });
            self.batch.clear();
        }
        Ok(())
    }
}

/// An epoll instance watching every ring: readable when a program woke any of them.
fn watch_rings(rings: &[CpuRing]) -> Result<OwnedFd> {
    // SAFETY: plain syscalls; the fd is owned from here on.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("epoll_create1");
    }
    let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
    for r in rings {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: r.cpu as u64,
        };
        let rc = unsafe {
            libc::epoll_ctl(
                epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                r.ring.as_raw_fd(),
                &mut ev,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot watch CPU {}'s event ring", r.cpu));
        }
    }
    Ok(epoll)
}

/// Empties the epoll instance's ready list (the rings are drained right after).
fn clear_wakeups(epoll: &OwnedFd) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    // SAFETY: the buffer holds 64 entries; a zero timeout never blocks.
    while unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), 64, 0) } == 64 {}
}

/// Reads the rings until `stop` changes, handing each batch to `sink` in time order; after
/// the stop it drains what is left (call it after detaching the programs so that nothing
/// more arrives). `time_stages`: also tell where the thread's CPU went ([`Costs`]).
pub async fn run(
    rings: Vec<CpuRing>,
    batches: Option<Batches>,
    mut stop: watch::Receiver<bool>,
    time_stages: bool,
    mut sink: impl FnMut(&[Event]) + Send,
) -> Result<Collected> {
    // SAFETY: the AsyncFd owns the epoll fd, so it stays open while registered.
    let fd = unsafe {
        AsyncFd::register_with_interest(watch_rings(&rings)?, tokio::io::Interest::READABLE)?
    };
    let mut reader = Reader {
        order: TimeOrder::new(rings.len()),
        rings,
        batches,
        batch: Vec::with_capacity(4096),
        costs: time_stages.then(Costs::default),
    };
    // The programs wake us only once a batch is waiting; this picks up the rest.
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = poll.tick() => {
                reader.send_old_batches(false)?;
                reader.step(false, &mut sink)?;
            }
            guard = fd.readable() => {
                let mut guard = guard?;
                clear_wakeups(fd.get_ref());
                guard.clear_ready();
                reader.step(false, &mut sink)?;
            }
            _ = stop.changed() => break,
        }
    }
    reader.send_old_batches(true)?;
    reader.step(true, &mut sink)?;
    Ok(Collected {
        late: reader.order.late(),
        costs: reader.costs,
    })
}
