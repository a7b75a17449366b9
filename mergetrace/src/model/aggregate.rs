//! The aggregator: events in, counters out. Pure and deterministic (no clock, no I/O, no
//! kernel). The counting rule itself is `mergetrace_common::Counters::count`, which the eBPF
//! programs also run in the kernel for the live view: live, offline and tests count alike.
use std::collections::BTreeMap;

use foldhash::HashMap;

use mergetrace_common::{
    count::dir, flags, kind, latency::LatencyHist, CountKey, Event, MeterUnits, UnplugKey,
    REMOVED_CGROUP,
};

pub use mergetrace_common::Counters as Counts;

/// The four directions of `/proc/diskstats` (the kernel's `op_stat_group`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    Read = 0,
    Write = 1,
    Discard = 2,
    Flush = 3,
}

impl Dir {
    pub const ALL: [Dir; 4] = [Dir::Read, Dir::Write, Dir::Discard, Dir::Flush];

    pub fn of_op(op: u8) -> Dir {
        Dir::from_code(mergetrace_common::count::dir_of_op(op))
    }

    pub fn from_code(code: u32) -> Dir {
        match code {
            dir::READ => Dir::Read,
            dir::WRITE => Dir::Write,
            dir::DISCARD => Dir::Discard,
            _ => Dir::Flush,
        }
    }

    /// The `mergetrace_common::count::dir` value.
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        mergetrace_common::vocab::dir_name(self.code())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub dev: u32,
    pub cgroup_id: u64,
    pub dir: Dir,
}

/// Per-device plug flush statistics (`block_unplug`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unplugs {
    /// depth → number of flushes, explicit (`blk_finish_plug`) and from schedule.
    pub explicit: BTreeMap<u32, u64>,
    pub from_schedule: BTreeMap<u32, u64>,
}

/// `earlier`, with what each of its keys missing from `later` (reclaimed since) held added
/// to its device's [`REMOVED_CGROUP`] key, where `later` has it now.
fn folded<T: Clone + Default>(
    earlier: &HashMap<Key, T>,
    later: &HashMap<Key, T>,
    add: impl Fn(&mut T, &T),
) -> HashMap<Key, T> {
    let mut before = earlier.clone();
    for (k, v) in earlier {
        if k.cgroup_id != REMOVED_CGROUP && !later.contains_key(k) {
            let removed = Key {
                cgroup_id: REMOVED_CGROUP,
                ..*k
            };
            add(before.entry(removed).or_default(), v);
        }
    }
    before
}

/// Everything counted over one time span.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
    pub counts: HashMap<Key, Counts>,
    pub unplugs: HashMap<u32, Unplugs>,
    /// Events the kernel side could not deliver (or count), by kind.
    pub lost_by_kind: BTreeMap<u8, u64>,
    /// `--latency`: request latency histograms per key (counted in the kernel only).
    pub latency: HashMap<Key, LatencyHist>,
}

impl Window {
    pub fn lost_events(&self) -> u64 {
        self.lost_by_kind.values().sum()
    }

    fn add_unplugs(&mut self, dev: u32, depth: u32, explicit: bool, n: u64) {
        let u = self.unplugs.entry(dev).or_default();
        let hist = if explicit {
            &mut u.explicit
        } else {
            &mut u.from_schedule
        };
        *hist.entry(depth).or_default() += n;
    }

    /// The key of a kernel map's (cgroup, disk, direction).
    pub fn key_of(k: &CountKey) -> Key {
        Key {
            dev: k.dev,
            cgroup_id: k.cgroup_id,
            dir: Dir::from_code(k.dir),
        }
    }

    /// A window from the kernel's per-CPU counters (already summed over CPUs).
    pub fn from_kernel(
        counts: impl IntoIterator<Item = (CountKey, Counts)>,
        unplugs: impl IntoIterator<Item = (UnplugKey, u64)>,
    ) -> Window {
        let mut w = Window::default();
        for (k, c) in counts {
            w.counts.entry(Window::key_of(&k)).or_default().add(&c);
        }
        for (k, n) in unplugs {
            w.add_unplugs(k.dev, k.depth, k.explicit != 0, n);
        }
        w
    }

    /// What happened between `earlier` and `self`, both running totals of the same run. A
    /// key of `earlier` missing from `self` was reclaimed (its cgroup was removed): what it had
    /// counted is now in its device's [`REMOVED_CGROUP`] key, so it is not new there.
    pub fn since(&self, earlier: &Window) -> Window {
        let mut w = Window {
            start_ns: earlier.end_ns,
            end_ns: self.end_ns,
            ..Window::default()
        };
        let before = folded(&earlier.counts, &self.counts, Counts::add);
        for (k, c) in &self.counts {
            let mut d = *c;
            if let Some(e) = before.get(k) {
                d.combine(e, false);
            }
            if d != Counts::default() {
                w.counts.insert(*k, d);
            }
        }
        for (dev, u) in &self.unplugs {
            let before = earlier.unplugs.get(dev);
            for (explicit, hist) in [(true, &u.explicit), (false, &u.from_schedule)] {
                for (depth, n) in hist {
                    let was = before
                        .and_then(|b| {
                            if explicit {
                                b.explicit.get(depth)
                            } else {
                                b.from_schedule.get(depth)
                            }
                        })
                        .copied()
                        .unwrap_or(0);
                    if *n > was {
                        w.add_unplugs(*dev, *depth, explicit, n - was);
                    }
                }
            }
        }
        let earlier_latency = folded(&earlier.latency, &self.latency, LatencyHist::add);
        for (k, h) in &self.latency {
            let d = match earlier_latency.get(k) {
                Some(e) => h.since(e),
                None => *h,
            };
            if d != LatencyHist::default() {
                w.latency.insert(*k, d);
            }
        }
        for (k, n) in &self.lost_by_kind {
            let d = n - earlier.lost_by_kind.get(k).copied().unwrap_or(0);
            if d > 0 {
                w.lost_by_kind.insert(*k, d);
            }
        }
        w
    }

    /// Sum of all cgroups of one device and direction.
    #[cfg(test)]
    pub fn device_total(&self, dev: u32, dir: Dir) -> Counts {
        let mut t = Counts::default();
        for (k, c) in &self.counts {
            if k.dev == dev && k.dir == dir {
                t.add(c);
            }
        }
        t
    }
}

/// Cloud-volume meter unit sizes by default: 256 KiB (SSD volumes), 1 MiB (throughput HDD).
pub const DEFAULT_METER_UNITS: [u64; 2] = [256 << 10, 1 << 20];

/// The meter unit slots for up to [`METER_SLOTS`] sizes (zeros are unused).
pub fn meter_units(sizes: &[u64]) -> MeterUnits {
    MeterUnits::new(sizes)
}

/// A map whose lookups mostly repeat the key before (a capture's events come in runs of one
/// device, cgroup and direction): that key's entry is found without hashing.
#[derive(Debug, Clone)]
pub struct RunMap<K, V> {
    index: HashMap<K, usize>,
    entries: Vec<(K, V)>,
    /// The entry of the last lookup.
    last: usize,
}

impl<K, V> Default for RunMap<K, V> {
    fn default() -> Self {
        RunMap {
            index: HashMap::default(),
            entries: Vec::new(),
            last: 0,
        }
    }
}

impl<K: Copy + Eq + std::hash::Hash, V: Default> RunMap<K, V> {
    /// The entry of `key`, a default one if it had none.
    #[inline]
    pub fn get_or_default(&mut self, key: K) -> &mut V {
        if self.entries.get(self.last).is_none_or(|(k, _)| *k != key) {
            let entries = &mut self.entries;
            self.last = *self.index.entry(key).or_insert_with(|| {
                entries.push((key, V::default()));
                entries.len() - 1
            });
        }
        &mut self.entries[self.last].1
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.index.get(key).map(|i| &self.entries[*i].1)
    }

    /// In the order the keys were first seen.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }
}

/// Counts events (from a capture) into a running total of the whole run. Intervals are
/// differences of running totals ([`Window::since`]), as in the live view.
#[derive(Debug)]
pub struct Aggregator {
    /// The run's window but its counts and plug flushes, which are in `counts` and
    /// `unplugs` (by device, depth, explicit).
    total: Window,
    counts: RunMap<Key, Counts>,
    unplugs: RunMap<(u32, u32, bool), u64>,
    units: MeterUnits,
}

impl Aggregator {
    #[cfg(test)]
    pub fn new(start_ns: u64) -> Aggregator {
        Aggregator::with_meter_units(start_ns, &DEFAULT_METER_UNITS)
    }

    pub fn with_meter_units(start_ns: u64, units: &[u64]) -> Aggregator {
        Aggregator {
            total: Window {
                start_ns,
                ..Window::default()
            },
            counts: RunMap::default(),
            unplugs: RunMap::default(),
            units: meter_units(units),
        }
    }

    #[inline]
    pub fn apply(&mut self, ev: &Event) {
        if ev.kind == kind::UNPLUG {
            let explicit = ev.flags & flags::UNPLUG_EXPLICIT != 0;
            *self.unplugs.get_or_default((ev.dev, ev.aux, explicit)) += 1;
            return;
        }
        let key = Key {
            dev: ev.dev,
            cgroup_id: ev.cgroup_id,
            dir: Dir::of_op(ev.op),
        };
        self.counts.get_or_default(key).count(ev, &self.units);
    }

    #[cfg(test)]
    pub fn apply_all<'a>(&mut self, evs: impl IntoIterator<Item = &'a Event>) {
        for ev in evs {
            self.apply(ev);
        }
    }

    /// Records events the kernel side dropped.
    pub fn lost(&mut self, kind: u8, n: u64) {
        if n > 0 {
            *self.total.lost_by_kind.entry(kind).or_default() += n;
        }
    }

    /// The whole run so far, up to `end_ns`.
    pub fn total(&self, end_ns: u64) -> Window {
        let mut t = self.total.clone();
        t.counts = self.counts.iter().map(|(k, c)| (*k, *c)).collect();
        for ((dev, depth, explicit), n) in self.unplugs.iter() {
            t.add_unplugs(*dev, *depth, *explicit, *n);
        }
        t.end_ns = end_ns;
        t
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mergetrace_common::{path, rq_aux};

    pub fn ev(kind: u8, op: u8, cgroup_id: u64, bytes: u32) -> Event {
        Event {
            kind,
            op,
            cgroup_id,
            bytes,
            dev: 7 << 20 | 3,
            ..Event::default()
        }
    }

    /// 32 bios of 4 KiB in one plug: 1 request, 31 plug back merges (the demo's batch).
    pub fn batch_of_32(cgroup: u64) -> Vec<Event> {
        let mut v = Vec::new();
        for i in 0..32 {
            v.push(ev(kind::BIO_QUEUE, 1, cgroup, 4096));
            if i == 0 {
                v.push(ev(kind::GETRQ, 1, cgroup, 4096));
            } else {
                let mut m = ev(kind::BACK_MERGE, 1, cgroup, 4096);
                m.path = path::PLUG;
                v.push(m);
            }
        }
        // As the request programs pack them: 32 bios leave the plug at the insert (31 plug
        // merges), none joined in the queue.
        let mut insert = ev(kind::RQ_INSERT, 1, cgroup, 131072);
        (insert.aux, insert.path) = (rq_aux::pack(32, 0, 0, 0), path::PLUG);
        v.push(insert);
        let mut issue = ev(kind::RQ_ISSUE, 1, cgroup, 131072);
        (issue.aux, issue.path) = (rq_aux::pack(32, 0, 0, rq_aux::QUEUED), path::ELEVATOR);
        v.push(issue);
        let mut c = ev(kind::RQ_COMPLETE, 1, cgroup, 131072);
        c.aux = 131072;
        v.push(c);
        v
    }

    #[test]
    fn direction_follows_op_stat_group() {
        assert_eq!(Dir::of_op(0), Dir::Read);
        assert_eq!(Dir::of_op(1), Dir::Write);
        assert_eq!(Dir::of_op(2), Dir::Flush);
        assert_eq!(Dir::of_op(3), Dir::Discard);
        assert_eq!(Dir::of_op(9), Dir::Write); // write zeroes
        assert_eq!(Dir::of_op(34), Dir::Read); // driver in
    }

    #[test]
    fn a_batch_becomes_one_request() {
        let mut a = Aggregator::new(0);
        a.apply_all(&batch_of_32(21));
        let w = a.total(10);
        let c = w.counts[&Key {
            dev: 7 << 20 | 3,
            cgroup_id: 21,
            dir: Dir::Write,
        }];
        assert_eq!(
            (c.bios, c.bytes, c.requests(), c.issue_bytes),
            (32, 131072, 1, 131072)
        );
        assert_eq!(c.merged_per_bio(Dir::Write.code()), 31);
        assert_eq!(c.bio_merges_by_path[path::PLUG as usize], 31);
        // identity: bios + splits = getrq + bio merges
        assert_eq!(c.bios + c.splits, c.getrq + c.back_merges + c.front_merges);
        assert_eq!((w.start_ns, w.end_ns), (0, 10));
    }

    #[test]
    fn intervals_partition_the_total() {
        let mut a = Aggregator::new(0);
        a.apply_all(&batch_of_32(21));
        let first = a.total(5);
        a.apply_all(&batch_of_32(22));
        a.lost(kind::RQ_ISSUE, 3);
        let total = a.total(9);
        let second = total.since(&first);
        for dir in Dir::ALL {
            let mut sum = first.device_total(7 << 20 | 3, dir);
            sum.add(&second.device_total(7 << 20 | 3, dir));
            assert_eq!(sum, total.device_total(7 << 20 | 3, dir));
        }
        assert_eq!(
            (second.start_ns, second.lost_events(), total.lost_events()),
            (5, 3, 3)
        );
        assert_eq!(total.device_total(7 << 20 | 3, Dir::Write).requests(), 2);
    }

    #[test]
    fn cgroups_are_kept_apart() {
        let mut a = Aggregator::new(0);
        let mut evs = batch_of_32(21);
        evs.extend(batch_of_32(22));
        evs.extend(batch_of_32(22));
        a.apply_all(&evs);
        let w = a.total(1);
        let get = |cg| {
            w.counts[&Key {
                dev: 7 << 20 | 3,
                cgroup_id: cg,
                dir: Dir::Write,
            }]
        };
        assert_eq!(get(21).bios, 32);
        assert_eq!(get(22).bios, 64);
        assert_eq!(get(22).requests(), 2);
    }

    #[test]
    fn discard_merges_come_from_the_identity() {
        let mut a = Aggregator::new(0);
        // 4 discard bios, 1 request: 3 merged with no tracepoint
        for _ in 0..4 {
            a.apply(&ev(kind::BIO_QUEUE, 3, 1, 1 << 20));
        }
        a.apply(&ev(kind::GETRQ, 3, 1, 1 << 20));
        a.apply(&ev(kind::RQ_ISSUE, 3, 1, 4 << 20));
        let c = a.total(1).device_total(7 << 20 | 3, Dir::Discard);
        assert_eq!(
            (
                c.discard_merges(Dir::Discard.code()),
                c.merged_per_bio(Dir::Discard.code()),
                c.requests()
            ),
            (3, 3, 1)
        );
        // the identity does not apply to other directions
        assert_eq!(c.discard_merges(Dir::Write.code()), 0);
    }

    /// `record --requests` sends like charges of a CPU as one event (`Event::run_len`): it
    /// counts as its bios one by one, whatever the rules, direction and flags.
    #[test]
    fn a_run_of_charges_counts_as_its_bios() {
        for kind_ in [kind::BIO_QUEUE, kind::THROTTLE_CHARGE] {
            for op in [0u8, 1, 3] {
                for fl in [
                    0,
                    flags::RULES_IOPS,
                    flags::RULES_BPS | flags::THROTTLE_RELEASED,
                ] {
                    for (path_, aux) in [(0u8, 0u32), (1, mergetrace_common::bio_aux::BIO_BASED)] {
                        let (mut one, mut run) = (Aggregator::new(0), Aggregator::new(0));
                        let mut e = ev(kind_, op, 5, 8192);
                        (e.flags, e.path, e.aux) = (fl, path_, aux);
                        for _ in 0..7 {
                            one.apply(&e);
                        }
                        let mut r = e;
                        (r.aux64, r.bytes) = (6, 7 * 8192);
                        run.apply(&r);
                        assert_eq!(one.total(1), run.total(1), "{kind_} op {op} flags {fl}");
                        let c = run.total(1).device_total(7 << 20 | 3, Dir::of_op(op));
                        assert!(c.bios == 7 || c.throttle_calls == 7, "{c:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn splits_requeues_and_throttle_charges() {
        let mut a = Aggregator::new(0);
        let mut q = ev(kind::BIO_QUEUE, 1, 5, 1 << 20);
        q.flags = flags::RULES_IOPS | flags::THROTTLE_RELEASED;
        a.apply(&q);
        let mut s = ev(kind::SPLIT, 1, 5, 512 << 10);
        s.flags = flags::RULES_IOPS;
        a.apply(&s);
        a.apply(&ev(kind::GETRQ, 1, 5, 0));
        a.apply(&ev(kind::GETRQ, 1, 5, 0));
        for _ in 0..2 {
            a.apply(&ev(kind::RQ_ISSUE, 1, 5, 512 << 10));
        }
        // The second request is handed back and issued again: still one request, its bytes,
        // size and meter units counted once.
        a.apply(&ev(kind::RQ_REQUEUE, 1, 5, 512 << 10));
        let mut again = ev(kind::RQ_ISSUE, 1, 5, 512 << 10);
        again.flags = flags::REISSUE;
        a.apply(&again);
        let c = a.total(1).device_total(7 << 20 | 3, Dir::Write);
        assert_eq!(
            (c.charged_ios, c.charged_bytes, c.throttled_bios),
            (2, 1 << 20, 1)
        );
        assert_eq!((c.requests(), c.requeues, c.reissues), (2, 1, 1));
        assert_eq!(c.issue_bytes, 1 << 20);
        assert_eq!(c.request_size_hist.iter().sum::<u64>(), 2);
        assert_eq!(c.meter_units[0], 4, "two 512 KiB requests in 256 KiB units");
        assert_eq!(c.merged_per_bio(Dir::Write.code()), 0);
    }

    #[test]
    fn flush_only_writes_and_flush_requests() {
        // fsync after a 4 KiB write: the data write, then an empty REQ_PREFLUSH write whose
        // request the flush machinery completes without issuing it, and a flush request.
        let mut a = Aggregator::new(0);
        a.apply(&ev(kind::BIO_QUEUE, 1, 5, 4096));
        a.apply(&ev(kind::GETRQ, 1, 5, 4096));
        a.apply(&ev(kind::RQ_ISSUE, 1, 5, 4096));
        let mut flush = ev(kind::BIO_QUEUE, 1, 5, 0);
        flush.flags = flags::FLUSH_SEQ;
        a.apply(&flush);
        flush.kind = kind::GETRQ;
        a.apply(&flush);
        let mut flush_rq = ev(kind::RQ_ISSUE, 2, 5, 0);
        flush_rq.sector = u64::MAX;
        a.apply(&flush_rq);
        let w = a.total(1);
        let c = w.device_total(7 << 20 | 3, Dir::Write);
        assert_eq!((c.bios, c.requests(), c.flush_only), (2, 1, 1));
        // the identity: bios + splits = requests + merged + flush_only
        assert_eq!(
            c.bios + c.splits,
            c.requests() + c.merged_per_bio(Dir::Write.code()) + c.flush_only
        );
        assert_eq!(
            c.bios_to_requests(),
            1,
            "the flush-only write is not compressed"
        );
        let f = w.device_total(7 << 20 | 3, Dir::Flush);
        assert_eq!(f.requests(), 1);
        assert_eq!(
            f.request_size_hist.iter().sum::<u64>(),
            0,
            "a flush request has no size"
        );
    }

    #[test]
    fn released_split_remainders_count_as_throttled() {
        // A bio released by the dispatch work (its bio_queue) and a split remainder released
        // later (its first merge, new request or split in the dispatch work).
        let mut a = Aggregator::new(0);
        let mut q = ev(kind::BIO_QUEUE, 1, 5, 8192);
        q.flags = flags::RULES_IOPS | flags::THROTTLE_RELEASED;
        a.apply(&q);
        for k in [kind::GETRQ, kind::BACK_MERGE, kind::SPLIT] {
            let mut e = ev(k, 1, 5, 4096);
            e.flags = flags::RULES_IOPS | flags::THROTTLE_RELEASED;
            a.apply(&e);
        }
        // Request events never carry the flag's meaning.
        let mut i = ev(kind::RQ_ISSUE, 1, 5, 4096);
        i.flags = flags::THROTTLE_RELEASED;
        a.apply(&i);
        let c = a.total(1).device_total(7 << 20 | 3, Dir::Write);
        assert_eq!(c.throttled_bios, 4);
    }

    #[test]
    fn fentry_tier_events() {
        let mut a = Aggregator::new(0);
        // (kind, path, aux64) of each event, in order.
        for (k, path, aux64) in [
            (kind::THROTTLE_CHARGE, 0, 0),
            (kind::THROTTLE_CHARGE, 1, 0),
            (kind::THROTTLE_RELEASE, 0, 1_000_000),
            (kind::PLUG_ATTEMPT, 0, 0),
            (kind::PLUG_ATTEMPT, 1, 0),
            (kind::ELV_MERGE, 2, 0),
            (kind::ELV_MERGE, 0, 0),
        ] {
            let mut e = ev(k, 1, 5, 4096);
            (e.path, e.aux64) = (path, aux64);
            a.apply(&e);
        }
        let c = a.total(1).device_total(7 << 20 | 3, Dir::Write);
        assert_eq!(
            (
                c.throttle_calls,
                c.throttle_queued,
                c.throttle_releases,
                c.throttle_delay_ns
            ),
            (2, 1, 1, 1_000_000)
        );
        assert_eq!((c.plug_attempts, c.plug_merged), (2, 1));
        assert_eq!(c.elv_decisions, [1, 0, 1, 0]);
        // fentry events are not bios: the bio counts stay untouched
        assert_eq!(
            (c.bios, c.requests(), c.merged_per_bio(Dir::Write.code())),
            (0, 0, 0)
        );
    }

    #[test]
    fn bps_only_rule_does_not_recharge_a_charged_remainder() {
        let mut a = Aggregator::new(0);
        let mut q = ev(kind::BIO_QUEUE, 1, 5, 1 << 20);
        q.flags = flags::RULES_BPS;
        a.apply(&q);
        let mut s = ev(kind::SPLIT, 1, 5, 256 << 10);
        s.flags = flags::RULES_BPS | flags::BPS_CHARGED;
        a.apply(&s);
        s.flags = flags::RULES_BPS | flags::RULES_IOPS | flags::BPS_CHARGED;
        a.apply(&s);
        let mut d = ev(kind::BIO_QUEUE, 3, 5, 1 << 20);
        d.flags = flags::RULES_BPS;
        a.apply(&d);
        let w = a.total(1);
        let c = w.device_total(7 << 20 | 3, Dir::Write);
        assert_eq!(
            (c.charged_ios, c.charged_bytes),
            (2, 1 << 20),
            "bio + the iops-ruled remainder"
        );
        let dc = w.device_total(7 << 20 | 3, Dir::Discard);
        assert_eq!(
            (dc.charged_ios, dc.charged_bytes),
            (1, 512),
            "a discard is charged 512 bytes"
        );
    }

    #[test]
    fn kernel_counters_and_interval_deltas() {
        // The same events counted "in the kernel" (Counters::count) and by the aggregator agree,
        // and a later total minus an earlier one is the interval between them.
        let units = meter_units(&DEFAULT_METER_UNITS);
        let key = CountKey {
            cgroup_id: 21,
            dev: 7 << 20 | 3,
            dir: dir::WRITE,
        };
        // One explicit unplug of depth 1: the first window has seen it once, the second 3 times.
        let unplug = UnplugKey {
            dev: 7 << 20 | 3,
            depth: 1,
            explicit: 1,
            _pad: 0,
        };
        // Each window counts one more batch of 32 in the kernel before it is read.
        let mut kernel = Counts::default();
        let mut window = |end_ns, unplugs| {
            for e in batch_of_32(21) {
                kernel.count(&e, &units);
            }
            Window {
                end_ns,
                ..Window::from_kernel([(key, kernel)], [(unplug, unplugs)])
            }
        };
        let first = window(5, 1);
        let second = window(9, 3);
        let mut a = Aggregator::new(0);
        a.apply_all(&batch_of_32(21));
        assert_eq!(first.counts, a.total(0).counts);
        let d = second.since(&first);
        assert_eq!((d.start_ns, d.end_ns), (5, 9));
        assert_eq!(d.counts, a.total(0).counts, "the second batch alone");
        assert_eq!(d.unplugs[&(7 << 20 | 3)].explicit.get(&1), Some(&2));
    }

    #[test]
    fn a_reclaimed_key_is_not_new_in_the_removed_counters() {
        // Cgroup 21 counted 32 bios, then was reclaimed: its 32 and 1 late bio are now the
        // device's removed counters. The interval shows the late bio only, under (removed).
        let units = meter_units(&DEFAULT_METER_UNITS);
        let key = |cgroup_id| CountKey {
            cgroup_id,
            dev: 7 << 20 | 3,
            dir: dir::WRITE,
        };
        let mut c = Counts::default();
        for e in batch_of_32(21) {
            c.count(&e, &units);
        }
        let first = Window::from_kernel([(key(21), c)], []);
        let mut removed = c;
        removed.bios += 1;
        let second = Window::from_kernel([(key(REMOVED_CGROUP), removed)], []);
        let d = second.since(&first);
        assert_eq!(d.counts.len(), 1);
        let r = d.counts[&Key {
            dev: 7 << 20 | 3,
            cgroup_id: REMOVED_CGROUP,
            dir: Dir::Write,
        }];
        assert_eq!(
            r,
            Counts {
                bios: 1,
                ..Counts::default()
            }
        );
    }

    #[test]
    fn a_reclaimed_key_s_latency_is_not_new_in_the_removed_histograms() {
        // Cgroup 21's 3 requests were timed, then it was reclaimed: its histograms and 1 late
        // request's are now the device's removed ones. The interval shows the late one only.
        let key = |cgroup_id| Key {
            dev: 7 << 20 | 3,
            cgroup_id,
            dir: Dir::Write,
        };
        let mut h = LatencyHist::default();
        h.queue[0][2] = 3;
        h.queue_ns[0] = 6000;
        let first = Window {
            latency: [(key(21), h)].into_iter().collect(),
            ..Window::default()
        };
        let mut removed = h;
        removed.queue[0][2] += 1;
        removed.queue_ns[0] += 2000;
        let second = Window {
            latency: [(key(REMOVED_CGROUP), removed)].into_iter().collect(),
            ..Window::default()
        };
        let d = second.since(&first);
        let mut late = LatencyHist::default();
        late.queue[0][2] = 1;
        late.queue_ns[0] = 2000;
        assert_eq!(d.latency.len(), 1);
        assert_eq!(d.latency[&key(REMOVED_CGROUP)], late);
    }

    #[test]
    fn run_map_keeps_keys_apart_across_runs() {
        let mut m: RunMap<u32, u64> = RunMap::default();
        for k in [1, 1, 2, 1, 3, 3, 2] {
            *m.get_or_default(k) += 1;
        }
        let all: Vec<(u32, u64)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(all, [(1, 3), (2, 2), (3, 2)], "first-seen order");
        assert_eq!((m.get(&2), m.get(&4)), (Some(&2), None));
    }

    #[test]
    fn unplug_depths_are_histogrammed() {
        let mut a = Aggregator::new(0);
        let mut u = ev(kind::UNPLUG, 0, 0, 0);
        u.aux = 32;
        u.flags = flags::UNPLUG_EXPLICIT;
        a.apply(&u);
        a.apply(&u);
        u.flags = 0;
        u.aux = 1;
        a.apply(&u);
        let w = a.total(1);
        let h = &w.unplugs[&(7 << 20 | 3)];
        assert_eq!(h.explicit.get(&32), Some(&2));
        assert_eq!(h.from_schedule.get(&1), Some(&1));
    }
}
