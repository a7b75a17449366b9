//! The aggregator: events in, counters out. Pure and deterministic (no clock, no I/O, no
//! kernel), so live tracing, offline reports and tests all count the same way.
use std::collections::{BTreeMap, HashMap};

use mergetrace_common::{flags, kind, path, Event};

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

    /// `op_stat_group()`: discard and flush apart, then odd ops write, even ops read.
    pub fn of_op(op: u8) -> Dir {
        match op {
            3 => Dir::Discard,
            2 => Dir::Flush,
            op if op & 1 == 1 => Dir::Write,
            _ => Dir::Read,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dir::Read => "read",
            Dir::Write => "write",
            Dir::Discard => "discard",
            Dir::Flush => "flush",
        }
    }
}

/// Raw per-(device, cgroup, direction) counts, straight from events. Derived numbers (device
/// requests net of requeues, discard merges, merged total) are methods, computed on demand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// `block_bio_queue`: bios that passed the throttle (once per bio, after it waited).
    pub bios: u64,
    pub bytes: u64,
    /// `block_split`: each split leaves a remainder that is submitted (and charged) again.
    pub splits: u64,
    pub getrq: u64,
    pub back_merges: u64,
    pub front_merges: u64,
    /// Bio merges by path, indexed by `mergetrace_common::path` value.
    pub bio_merges_by_path: [u64; 4],
    /// Back merges among those, by path (the rest of each path's merges are front merges).
    pub back_merges_by_path: [u64; 4],
    /// `block_rq_merge`: a request absorbed into another.
    pub rq_merges: u64,
    pub inserts: u64,
    pub issues: u64,
    pub issue_bytes: u64,
    pub requeues: u64,
    pub completions: u64,
    pub completed_bytes: u64,
    /// blk-throttle charges (each bio and split remainder in a group with rules).
    pub charged_ios: u64,
    pub charged_bytes: u64,
    /// Bios released by blk-throttle's dispatch work: they waited in the throttle queue.
    pub throttled_bios: u64,
    /// Sum over released bios of the bios still queued behind them (Little's law input).
    pub throttle_queue_samples: u64,
    /// fentry tier: calls of `__blk_throtl_bio` (charges) and how many of them queued the bio.
    pub throttle_calls: u64,
    pub throttle_queued: u64,
    /// fentry tier: bios released from the throttle queue and the time they waited, measured.
    pub throttle_releases: u64,
    pub throttle_delay_ns: u64,
    /// fentry tier: `blk_attempt_plug_merge` calls and those that merged.
    pub plug_attempts: u64,
    pub plug_merged: u64,
    /// fentry tier: `elv_merge` decisions by `enum elv_merge` value (no, front, back, discard).
    pub elv_decisions: [u64; 4],
    /// Device requests counted by a cloud-volume meter, per configured unit size: each
    /// request costs `ceil(bytes / unit)`, at least 1.
    pub meter_units: [u64; METER_SLOTS],
}

/// How many meter unit sizes the aggregator tracks.
pub const METER_SLOTS: usize = 4;

impl Counts {
    /// Requests the device saw: issues, not counting re-issues after a requeue.
    pub fn requests(&self) -> u64 {
        self.issues.saturating_sub(self.requeues)
    }

    /// Discard merges have no tracepoint: every bio (and split remainder) either gets a new
    /// request or merges, so what is left over merged without telling (`bio_attempt_discard_merge`).
    pub fn discard_merges(&self, dir: Dir) -> u64 {
        if dir != Dir::Discard {
            return 0;
        }
        (self.bios + self.splits).saturating_sub(self.getrq + self.back_merges + self.front_merges)
    }

    /// Every merge the kernel's `merges` counter (/proc/diskstats) counts: bio merges on all
    /// paths, discard merges, and request-request merges.
    pub fn merged(&self, dir: Dir) -> u64 {
        self.back_merges + self.front_merges + self.discard_merges(dir) + self.rq_merges
    }

    pub fn add(&mut self, o: &Counts) {
        self.bios += o.bios;
        self.bytes += o.bytes;
        self.splits += o.splits;
        self.getrq += o.getrq;
        self.back_merges += o.back_merges;
        self.front_merges += o.front_merges;
        for i in 0..4 {
            self.bio_merges_by_path[i] += o.bio_merges_by_path[i];
            self.back_merges_by_path[i] += o.back_merges_by_path[i];
        }
        self.rq_merges += o.rq_merges;
        self.inserts += o.inserts;
        self.issues += o.issues;
        self.issue_bytes += o.issue_bytes;
        self.requeues += o.requeues;
        self.completions += o.completions;
        self.completed_bytes += o.completed_bytes;
        self.charged_ios += o.charged_ios;
        self.charged_bytes += o.charged_bytes;
        self.throttled_bios += o.throttled_bios;
        self.throttle_queue_samples += o.throttle_queue_samples;
        self.throttle_calls += o.throttle_calls;
        self.throttle_queued += o.throttle_queued;
        self.throttle_releases += o.throttle_releases;
        self.throttle_delay_ns += o.throttle_delay_ns;
        self.plug_attempts += o.plug_attempts;
        self.plug_merged += o.plug_merged;
        for i in 0..4 {
            self.elv_decisions[i] += o.elv_decisions[i];
        }
        for i in 0..METER_SLOTS {
            self.meter_units[i] += o.meter_units[i];
        }
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

/// Everything counted over one time span.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
    pub counts: HashMap<Key, Counts>,
    pub unplugs: HashMap<u32, Unplugs>,
    /// Events the kernel side could not deliver, by kind.
    pub lost_by_kind: BTreeMap<u8, u64>,
    /// Events seen, by kind (a cheap cross-check and a rate for `--stats`).
    pub events: u64,
}

impl Window {
    pub fn lost_events(&self) -> u64 {
        self.lost_by_kind.values().sum()
    }

    fn apply(&mut self, ev: &Event, meter_units: &[u64]) {
        self.events += 1;
        if ev.kind == kind::UNPLUG {
            let u = self.unplugs.entry(ev.dev).or_default();
            let hist = if ev.flags & flags::UNPLUG_EXPLICIT != 0 {
                &mut u.explicit
            } else {
                &mut u.from_schedule
            };
            *hist.entry(ev.aux).or_default() += 1;
            return;
        }
        let dir = Dir::of_op(ev.op);
        let c = self
            .counts
            .entry(Key {
                dev: ev.dev,
                cgroup_id: ev.cgroup_id,
                dir,
            })
            .or_default();
        let iops_rule = ev.flags & flags::RULES_IOPS != 0;
        let bps_rule = ev.flags & flags::RULES_BPS != 0;
        match ev.kind {
            kind::BIO_QUEUE => {
                c.bios += 1;
                c.bytes += ev.bytes as u64;
                // A bio's first pass through blk-throttle: charged if its group has any rule
                // for the direction; bytes as the throttle counts them (discards: 512).
                if iops_rule || bps_rule {
                    c.charged_ios += 1;
                    c.charged_bytes += if dir == Dir::Discard {
                        512
                    } else {
                        ev.bytes as u64
                    };
                }
                if ev.flags & flags::THROTTLE_RELEASED != 0 {
                    c.throttled_bios += 1;
                    c.throttle_queue_samples += ev.aux as u64;
                }
            }
            kind::SPLIT => {
                c.splits += 1;
                // The remainder passes the throttle again: 1 io, 0 bytes (an iops rule always
                // counts it; a bps rule only if its bytes were not charged yet).
                if iops_rule || (bps_rule && ev.flags & flags::BPS_CHARGED == 0) {
                    c.charged_ios += 1;
                }
            }
            kind::BACK_MERGE | kind::FRONT_MERGE => {
                let p = (ev.path as usize).min(path::SW_QUEUE as usize);
                c.bio_merges_by_path[p] += 1;
                if ev.kind == kind::BACK_MERGE {
                    c.back_merges += 1;
                    c.back_merges_by_path[p] += 1;
                } else {
                    c.front_merges += 1;
                }
            }
            kind::GETRQ => c.getrq += 1,
            kind::RQ_MERGE => c.rq_merges += 1,
            kind::RQ_INSERT => c.inserts += 1,
            kind::RQ_ISSUE => {
                c.issues += 1;
                c.issue_bytes += ev.bytes as u64;
                for (slot, unit) in meter_units.iter().enumerate().take(METER_SLOTS) {
                    c.meter_units[slot] += (ev.bytes as u64).div_ceil(*unit).max(1);
                }
            }
            kind::RQ_REQUEUE => c.requeues += 1,
            kind::THROTTLE_CHARGE => {
                c.throttle_calls += 1;
                c.throttle_queued += (ev.path != 0) as u64;
            }
            kind::THROTTLE_RELEASE => {
                c.throttle_releases += 1;
                c.throttle_delay_ns += ev.aux64;
            }
            kind::PLUG_ATTEMPT => {
                c.plug_attempts += 1;
                c.plug_merged += (ev.path != 0) as u64;
            }
            kind::ELV_MERGE => c.elv_decisions[(ev.path as usize).min(3)] += 1,
            kind::RQ_COMPLETE => {
                c.completions += 1;
                c.completed_bytes += ev.aux as u64;
            }
            _ => {}
        }
    }

    /// Sum of all cgroups of one device and direction.
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

/// Counts the current interval and the whole run side by side.
#[derive(Debug)]
pub struct Aggregator {
    interval: Window,
    total: Window,
    /// Unit sizes (bytes) of the cloud-volume meters, at most [`METER_SLOTS`].
    meter_units: Vec<u64>,
}

impl Aggregator {
    pub fn new(start_ns: u64) -> Aggregator {
        Aggregator::with_meter_units(start_ns, &DEFAULT_METER_UNITS)
    }

    pub fn with_meter_units(start_ns: u64, units: &[u64]) -> Aggregator {
        let mut a = Aggregator {
            interval: Window::default(),
            total: Window::default(),
            meter_units: units
                .iter()
                .copied()
                .filter(|u| *u > 0)
                .take(METER_SLOTS)
                .collect(),
        };
        a.interval.start_ns = start_ns;
        a.total.start_ns = start_ns;
        a
    }

    pub fn meter_units(&self) -> &[u64] {
        &self.meter_units
    }

    pub fn apply(&mut self, ev: &Event) {
        self.interval.apply(ev, &self.meter_units);
        self.total.apply(ev, &self.meter_units);
    }

    pub fn apply_all<'a>(&mut self, evs: impl IntoIterator<Item = &'a Event>) {
        for ev in evs {
            self.apply(ev);
        }
    }

    /// Records events the kernel side dropped.
    pub fn lost(&mut self, kind: u8, n: u64) {
        if n > 0 {
            *self.interval.lost_by_kind.entry(kind).or_default() += n;
            *self.total.lost_by_kind.entry(kind).or_default() += n;
        }
    }

    /// Closes the current interval at `end_ns` and starts the next one there.
    pub fn take_interval(&mut self, end_ns: u64) -> Window {
        let next = Window {
            start_ns: end_ns,
            ..Window::default()
        };
        let mut done = std::mem::replace(&mut self.interval, next);
        done.end_ns = end_ns;
        done
    }

    /// The whole run so far, up to `end_ns`.
    pub fn total(&self, end_ns: u64) -> Window {
        let mut t = self.total.clone();
        t.end_ns = end_ns;
        t
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    /// 32 bios of 4 KiB in one plug: 1 request, 31 plug back merges (the article's batch).
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
        v.push(ev(kind::RQ_INSERT, 1, cgroup, 131072));
        v.push(ev(kind::RQ_ISSUE, 1, cgroup, 131072));
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
        let w = a.take_interval(10);
        let c = w.counts[&Key {
            dev: 7 << 20 | 3,
            cgroup_id: 21,
            dir: Dir::Write,
        }];
        assert_eq!(
            (c.bios, c.bytes, c.requests(), c.issue_bytes),
            (32, 131072, 1, 131072)
        );
        assert_eq!(c.merged(Dir::Write), 31);
        assert_eq!(c.bio_merges_by_path[path::PLUG as usize], 31);
        // identity: bios + splits = getrq + bio merges
        assert_eq!(c.bios + c.splits, c.getrq + c.back_merges + c.front_merges);
        assert_eq!((w.start_ns, w.end_ns), (0, 10));
    }

    #[test]
    fn intervals_partition_the_total() {
        let mut a = Aggregator::new(0);
        a.apply_all(&batch_of_32(21));
        let first = a.take_interval(5);
        a.apply_all(&batch_of_32(22));
        a.lost(kind::RQ_ISSUE, 3);
        let second = a.take_interval(9);
        let total = a.total(9);
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
                c.discard_merges(Dir::Discard),
                c.merged(Dir::Discard),
                c.requests()
            ),
            (3, 3, 1)
        );
        // the identity does not apply to other directions
        assert_eq!(c.discard_merges(Dir::Write), 0);
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
        for _ in 0..3 {
            a.apply(&ev(kind::RQ_ISSUE, 1, 5, 512 << 10));
        }
        a.apply(&ev(kind::RQ_REQUEUE, 1, 5, 512 << 10));
        let c = a.total(1).device_total(7 << 20 | 3, Dir::Write);
        assert_eq!(
            (c.charged_ios, c.charged_bytes, c.throttled_bios),
            (2, 1 << 20, 1)
        );
        assert_eq!(c.requests(), 2);
        assert_eq!(c.merged(Dir::Write), 0);
    }

    #[test]
    fn fentry_tier_events() {
        let mut a = Aggregator::new(0);
        let mut ch = ev(kind::THROTTLE_CHARGE, 1, 5, 4096);
        a.apply(&ch);
        ch.path = 1;
        a.apply(&ch);
        let mut rel = ev(kind::THROTTLE_RELEASE, 1, 5, 4096);
        rel.aux64 = 1_000_000;
        a.apply(&rel);
        let mut pa = ev(kind::PLUG_ATTEMPT, 1, 5, 4096);
        a.apply(&pa);
        pa.path = 1;
        a.apply(&pa);
        let mut em = ev(kind::ELV_MERGE, 1, 5, 4096);
        em.path = 2;
        a.apply(&em);
        em.path = 0;
        a.apply(&em);
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
        assert_eq!((c.bios, c.requests(), c.merged(Dir::Write)), (0, 0, 0));
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
