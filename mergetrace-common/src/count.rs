//! The counting rule: how one [`Event`] changes the counters of its (device, cgroup,
//! direction). It is compiled twice — into the eBPF programs, which count in per-CPU maps for
//! the live view at near-zero cost, and into user space, which counts a capture's events
//! offline — so live and offline numbers cannot drift apart.
use crate::{flags, kind, path, rq_aux, Event};

/// The directions of `/proc/diskstats` (the kernel's `op_stat_group`).
pub mod dir {
    pub const READ: u32 = 0;
    pub const WRITE: u32 = 1;
    pub const DISCARD: u32 = 2;
    pub const FLUSH: u32 = 3;
}

/// `op_stat_group()`: discard and flush apart, then odd ops write, even ops read.
#[inline(always)]
pub fn dir_of_op(op: u8) -> u32 {
    match op {
        3 => dir::DISCARD,
        2 => dir::FLUSH,
        op if op & 1 == 1 => dir::WRITE,
        _ => dir::READ,
    }
}

/// How many cloud-meter unit sizes are counted.
pub const METER_SLOTS: usize = 4;

/// Key of the per-(device, cgroup, direction) counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountKey {
    pub cgroup_id: u64,
    /// Kernel `dev_t` of the whole disk.
    pub dev: u32,
    /// One of [`dir`].
    pub dir: u32,
}

impl CountKey {
    /// The key as the words of a cache entry ([`crate::nested::CacheEntry`]).
    #[inline(always)]
    pub fn words(&self) -> [u64; 2] {
        [self.cgroup_id, self.dev as u64 | (self.dir as u64) << 32]
    }
}

/// How many (cgroup, disk, direction) keys are counted in per-CPU arrays, by a slot user space
/// gives each key it learns of; until it has one, and beyond this, a key is counted in a
/// per-CPU hash map (slower: a hash lookup per event instead of an array index).
pub const MAX_SLOTS: u32 = 1024;

/// A key's slot in the counter arrays and the slot's generation when it was given: user space
/// bumps a slot's generation when it gives the slot to another key, so a stale cached
/// mapping is noticed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotRef {
    pub slot: u32,
    /// Never 0 for a slot in use (0 marks an empty cache entry).
    pub gen: u32,
}

impl SlotRef {
    /// The slot as one word of a cache entry ([`crate::nested::CacheEntry`]), and back.
    #[inline(always)]
    pub fn word(self) -> u64 {
        self.slot as u64 | (self.gen as u64) << 32
    }

    #[inline(always)]
    pub fn from_word(w: u64) -> SlotRef {
        SlotRef {
            slot: w as u32,
            gen: (w >> 32) as u32,
        }
    }
}

/// Key of the plug flush histogram: (device, requests in the flush, explicit or not).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnplugKey {
    pub dev: u32,
    pub depth: u32,
    /// 1 for `blk_finish_plug`, 0 for a flush from schedule.
    pub explicit: u32,
    pub _pad: u32,
}

/// What the programs keep per traced disk (the value of the device filter map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceState {
    /// The cgroup whose bio most recently started a flush sequence (`REQ_PREFLUSH`/`REQ_FUA`)
    /// on the disk. A flush request the flush machinery issues carries no bio, so it is
    /// counted for this cgroup (0 until one is seen).
    pub flush_cgroup: u64,
    /// Non-zero once a request issued on the disk was handed back (requeued): from then on
    /// the issue probe checks whether a request is issued again.
    pub requeues_seen: u64,
    /// The disk's `struct request_queue *`, learned from its bios: a plug flush names only
    /// the queue, and where the queue does not name its disk (up to 5.15) this finds it; a
    /// bio submitted by blk-throttle's dispatch work of this queue was released by it.
    pub queue: u64,
    /// What the request programs keep for this disk in `INSERTED` (entries), `ABSORBED` (the
    /// bios of its entries) and `SPLIT_PIECES` (entries), moved atomically; while one is 0,
    /// the matching lookup is skipped, so a disk whose requests go straight from the plug to
    /// the driver pays no hash lookup per request.
    pub inserted: u64,
    pub absorbed: u64,
    pub split_pieces: u64,
    /// Non-zero once a counting run found blk-throttle rules on the disk (and told user
    /// space, once: `DISK_RULES_SEEN`).
    pub rules_seen: u64,
}

/// Cloud-meter unit sizes in bytes (0 = unused slot), given to the programs at load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterUnits {
    pub bytes: [u64; METER_SLOTS],
    /// log2 of a unit that is a power of two (a shift instead of a division), else 0.
    pub shift: [u64; METER_SLOTS],
}

impl MeterUnits {
    /// The slots for up to [`METER_SLOTS`] unit sizes (zeros are left unused).
    pub fn new(sizes: &[u64]) -> MeterUnits {
        let mut m = MeterUnits::default();
        let mut slot = 0;
        for size in sizes {
            if *size == 0 || slot == METER_SLOTS {
                continue;
            }
            m.bytes[slot] = *size;
            m.shift[slot] = if size.is_power_of_two() {
                size.trailing_zeros() as u64
            } else {
                0
            };
            slot += 1;
        }
        m
    }

    /// Units a request of `bytes` costs under slot `i`: `ceil(bytes / unit)`, at least 1.
    #[inline(always)]
    pub fn units(&self, i: usize, bytes: u64) -> u64 {
        let unit = self.bytes[i];
        let shift = self.shift[i];
        let n = if shift > 0 {
            (bytes + unit - 1) >> shift
        } else {
            bytes.div_ceil(unit)
        };
        if n == 0 {
            1
        } else {
            n
        }
    }
}

/// Raw counts of one (device, cgroup, direction), straight from events. Only u64s, so sums and
/// differences of snapshots are field-wise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `block_bio_queue`: bios that passed the throttle (once per bio, after it waited).
    pub bios: u64,
    pub bytes: u64,
    /// `block_split`: each split leaves a remainder that is submitted (and charged) again.
    pub splits: u64,
    pub getrq: u64,
    /// `block_getrq` for an empty write bio (`REQ_PREFLUSH`/`REQ_FUA` without data): the flush
    /// machinery completes its request without issuing it as a write (it issues a separate
    /// flush request instead), and /proc/diskstats counts it as a completed write.
    pub flush_only: u64,
    pub back_merges: u64,
    pub front_merges: u64,
    /// Bio merges by path, indexed by [`path`] value.
    pub bio_merges_by_path: [u64; 4],
    /// Back merges among those, by path.
    pub back_merges_by_path: [u64; 4],
    /// `block_rq_merge`: a request absorbed into another.
    pub rq_merges: u64,
    pub inserts: u64,
    /// First issues of requests: the requests the device saw. A request handed back by the
    /// driver and issued again counts once here (its later issues are `reissues`).
    pub issues: u64,
    pub issue_bytes: u64,
    /// `block_rq_requeue`: requests the driver handed back (`BLK_STS_RESOURCE`).
    pub requeues: u64,
    /// Issues of requests that had been issued and requeued before.
    pub reissues: u64,
    pub completions: u64,
    pub completed_bytes: u64,
    /// blk-throttle charges (each bio and split remainder in a group with rules).
    pub charged_ios: u64,
    pub charged_bytes: u64,
    /// Bios (and split remainders) released by blk-throttle's dispatch work: they waited in
    /// the throttle queue.
    pub throttled_bios: u64,
    /// fentry tier: `__blk_throtl_bio` calls and how many queued the bio.
    pub throttle_calls: u64,
    pub throttle_queued: u64,
    /// fentry tier: releases from the throttle queue and the time they waited, measured.
    pub throttle_releases: u64,
    pub throttle_delay_ns: u64,
    /// fentry tier: `blk_attempt_plug_merge` calls and those that merged.
    pub plug_attempts: u64,
    pub plug_merged: u64,
    /// fentry tier: `elv_merge` decisions by `enum elv_merge` value (no, front, back, discard).
    pub elv_decisions: [u64; 4],
    /// Device requests under cloud meters: each request costs `ceil(bytes / unit)`, at least 1.
    pub meter_units: [u64; METER_SLOTS],
    /// Issued requests by size: bucket `i` holds sizes up to `512 << i` bytes (the last bucket
    /// takes everything larger). See [`size_bucket`].
    pub request_size_hist: [u64; SIZE_BUCKETS],
    /// Issued requests by the number of bios they carry: bucket `i` holds `2^i ..= 2^(i+1)-1`
    /// bios (the last bucket takes everything larger). See [`count_bucket`].
    pub bios_per_request_hist: [u64; COUNT_BUCKETS],
    /// io.cost (events with `flags::IOCOST`): bios that started a request (each pays a base
    /// cost), those of them random by the cursor rule, bios that merged (size cost only), and
    /// the 4 KiB pages of all of them (size cost).
    pub iocost_requests: u64,
    pub iocost_random: u64,
    pub iocost_merged: u64,
    pub iocost_pages: u64,
    /// Bios of the class wbt throttles that started a request ([`crate::getrq_aux::WBT_CLASS`]):
    /// where wbt is on, each took an in-flight slot (it counts requests, after merging).
    pub wbt_class_requests: u64,
    /// Counted per request ([`crate::rq_aux`]), every run: bios that reached the device in
    /// the requests issued (each bio once, whatever it was split into), and bios of
    /// bio-based disks as they pass; their bytes.
    pub rq_bios: u64,
    pub rq_bio_bytes: u64,
    /// Bio merges by where the request was, indexed by [`path`] (plug, elevator, software
    /// queue, multi-range discard), counted when the request left the plug, was issued or was
    /// absorbed.
    pub merges_at: [u64; MERGE_PLACES],
    /// Of `merges_at[path::ELEVATOR]`, the front merges.
    pub elevator_front_merges: u64,
}

/// A request event's merge place as an index of `Counters::merges_at`: a mask, not a
/// comparison, so the verifier sees the bound on the register that indexes (a bounds check
/// on a copy does not carry over).
#[inline(always)]
fn p5(p: u8) -> usize {
    p as usize & (MERGE_PLACES - 1)
}

/// Slots of `Counters::merges_at`: the [`path`] values, and room for unknown ones.
pub const MERGE_PLACES: usize = 8;

/// Request size histogram buckets: 512 B, 1 KiB, … 8 MiB, larger.
pub const SIZE_BUCKETS: usize = 16;
/// Bios-per-request histogram buckets: 1, 2–3, 4–7, … 1024–2047, larger.
pub const COUNT_BUCKETS: usize = 12;

/// The histogram bucket of a request of `bytes`: the smallest `i` with `bytes <= 512 << i`.
#[inline(always)]
pub fn size_bucket(bytes: u64) -> usize {
    let mut i = 0;
    while i < SIZE_BUCKETS - 1 {
        if bytes <= 512u64 << i {
            return i;
        }
        i += 1;
    }
    SIZE_BUCKETS - 1
}

/// The histogram bucket of a count `n` ≥ 1: `floor(log2(n))`, capped.
#[inline(always)]
pub fn count_bucket(n: u64) -> usize {
    let mut i = 0;
    while i < COUNT_BUCKETS - 1 {
        if n < 2u64 << i {
            return i;
        }
        i += 1;
    }
    COUNT_BUCKETS - 1
}

impl Counters {
    /// Applies one event (not `UNPLUG`, which has its own histogram). One match over every
    /// kind, kept whole on purpose: it is the rule both sides run, and the eBPF side needs it
    /// as one inlined body (no calls the verifier would have to follow per kind).
    #[inline(always)]
    pub fn count(&mut self, ev: &Event, units: &MeterUnits) {
        let iops_rule = ev.flags & flags::RULES_IOPS != 0;
        let bps_rule = ev.flags & flags::RULES_BPS != 0;
        let p = if ev.path > path::SW_QUEUE {
            path::UNKNOWN
        } else {
            ev.path
        } as usize
            & 3;
        // A bio's charge can stand for a run of them (`Event::run_len`).
        let n = ev.run_len();
        // A bio (or split remainder) seen while blk-throttle's dispatch work released it; the
        // bio kinds are 1 (BIO_QUEUE) to 5 (GETRQ).
        if ev.flags & flags::THROTTLE_RELEASED != 0 && ev.kind <= kind::GETRQ {
            self.throttled_bios += n;
        }
        // The io.cost bit is only set on merges and getrq (kinds 3 to 5).
        if ev.flags & flags::IOCOST != 0 && ev.kind >= kind::BACK_MERGE && ev.kind <= kind::GETRQ {
            self.count_iocost(ev);
        }
        match ev.kind {
            // A note that a bio waited (counted above) from a run that charges per request: the
            // bio and its charge are counted with its request.
            kind::BIO_QUEUE if ev.aux & crate::bio_aux::RELEASE_ONLY != 0 => {}
            kind::BIO_QUEUE => {
                self.bios += n;
                self.bytes += ev.bytes as u64;
                if ev.aux & crate::bio_aux::BIO_BASED != 0 {
                    self.rq_bios += n;
                    self.rq_bio_bytes += ev.bytes as u64;
                }
                // A bio's first pass through blk-throttle: charged if its group has any rule
                // for the direction; bytes as the throttle counts them (discards: 512).
                if iops_rule || bps_rule {
                    self.charged_ios += n;
                    self.charged_bytes += if ev.op == 3 { 512 * n } else { ev.bytes as u64 };
                }
            }
            kind::SPLIT => {
                self.splits += 1;
                // The remainder passes the throttle again: 1 io, 0 bytes (an iops rule always
                // counts it; a bps rule only if its bytes were not charged yet).
                if iops_rule || (bps_rule && ev.flags & flags::BPS_CHARGED == 0) {
                    self.charged_ios += 1;
                }
            }
            kind::BACK_MERGE => {
                self.back_merges += 1;
                self.bio_merges_by_path[p] += 1;
                self.back_merges_by_path[p] += 1;
            }
            kind::FRONT_MERGE => {
                self.front_merges += 1;
                self.bio_merges_by_path[p] += 1;
            }
            kind::GETRQ => {
                self.getrq += 1;
                // REQ_OP_WRITE without data: only a flush sequence sends one.
                if ev.op == 1 && ev.bytes == 0 {
                    self.flush_only += 1;
                }
                if ev.aux & crate::getrq_aux::WBT_CLASS != 0 {
                    self.wbt_class_requests += 1;
                }
                // The charge of a data-less flush write (1 io) in a run that charges per request:
                // no request's issue carries it.
                if iops_rule || bps_rule {
                    self.charged_ios += 1;
                }
            }
            kind::RQ_MERGE => {
                self.rq_merges += 1;
                self.count_left_or_queued(ev);
            }
            kind::RQ_INSERT => {
                self.inserts += 1;
                // A requeued request put back: it left the plug long ago.
                if ev.aux & rq_aux::QUEUED == 0 {
                    self.count_left_plug(ev);
                }
            }
            kind::RQ_ISSUE if ev.flags & flags::REISSUE != 0 => {
                self.reissues += 1;
                // Bios that joined a requeued request while it waited again (software queue),
                // and their bytes (`aux64` of such an issue): the device sees them now.
                let queued = rq_aux::queued_merges(ev.aux) as u64;
                let new_bios = queued + rq_aux::third(ev.aux) as u64;
                self.rq_bios += new_bios;
                self.merges_at[p5(ev.path)] += queued;
                let new_bytes = if ev.aux & rq_aux::QUEUED != 0 {
                    ev.aux64
                } else {
                    0
                };
                self.rq_bio_bytes += new_bytes;
                self.issue_bytes += new_bytes;
                self.count_request_charge(ev, new_bios, new_bytes);
            }
            kind::RQ_ISSUE => {
                self.issues += 1;
                self.issue_bytes += ev.bytes as u64;
                let chain = rq_aux::chain(ev.aux);
                let new_bios = chain as u64 - (ev.aux & rq_aux::SPLIT_PIECE != 0) as u64;
                self.rq_bios += new_bios;
                self.rq_bio_bytes += ev.bytes as u64;
                self.count_request_charge(ev, new_bios, ev.bytes as u64);
                self.count_left_or_queued(ev);
                // A flush request has no data: not a size.
                if ev.bytes > 0 {
                    self.request_size_hist[size_bucket(ev.bytes as u64) & (SIZE_BUCKETS - 1)] += 1;
                }
                // Bios chained in the request (0 for a flush without data).
                if chain > 0 {
                    let b = count_bucket(chain as u64);
                    self.bios_per_request_hist[if b < COUNT_BUCKETS {
                        b
                    } else {
                        COUNT_BUCKETS - 1
                    }] += 1;
                }
                let mut i = 0;
                while i < METER_SLOTS {
                    if units.bytes[i] > 0 {
                        self.meter_units[i] += units.units(i, ev.bytes as u64);
                    }
                    i += 1;
                }
            }
            kind::RQ_REQUEUE => self.requeues += 1,
            kind::RQ_COMPLETE => {
                self.completions += 1;
                self.completed_bytes += ev.aux as u64;
            }
            kind::THROTTLE_CHARGE => {
                self.throttle_calls += n;
                self.throttle_queued += if ev.path != 0 { n } else { 0 };
            }
            kind::THROTTLE_RELEASE => {
                self.throttle_releases += 1;
                self.throttle_delay_ns += ev.aux64;
            }
            kind::PLUG_ATTEMPT => {
                self.plug_attempts += 1;
                self.plug_merged += (ev.path != 0) as u64;
            }
            kind::ELV_MERGE => self.elv_decisions[ev.path as usize & 3] += 1,
            _ => {}
        }
    }

    /// The charge, in a run that charges per request, of the bios an issue brings to the device (`bios` of them, not
    /// counting a split's front piece, with `bytes`), where their group has rules: as
    /// `BIO_QUEUE` counts a bio in a capture — 1 io each, their bytes (a discard: 512 each).
    /// A split bio's bytes come in its pieces, each issued in a request of its own; the
    /// remainder's second pass is charged at the split.
    #[inline(always)]
    fn count_request_charge(&mut self, ev: &Event, bios: u64, bytes: u64) {
        if ev.flags & (flags::RULES_IOPS | flags::RULES_BPS) == 0 {
            return;
        }
        self.charged_ios += bios;
        self.charged_bytes += if ev.op == 3 { 512 * bios } else { bytes };
    }

    /// A request left the plug carrying `chain` bios: all but its first merged there.
    #[inline(always)]
    fn count_left_plug(&mut self, ev: &Event) {
        let chain = rq_aux::chain(ev.aux) as u64;
        if chain > 0 {
            self.merges_at[p5(ev.path)] += chain - 1;
        }
    }

    /// An issue or an absorption: the request's queue merges if it had been inserted (its
    /// plug merges were counted then), else it leaves the plug now.
    #[inline(always)]
    fn count_left_or_queued(&mut self, ev: &Event) {
        if ev.aux & rq_aux::QUEUED == 0 {
            self.count_left_plug(ev);
            return;
        }
        self.merges_at[p5(ev.path)] += rq_aux::queued_merges(ev.aux) as u64;
        if ev.path == path::ELEVATOR {
            self.elevator_front_merges += rq_aux::third(ev.aux) as u64;
        }
    }

    /// Bios that reached the device, counted per request: those in the requests issued (a
    /// split bio once), a bio-based disk's, and data-less flush writes, which never become a
    /// request.
    pub fn bios_per_request(&self) -> u64 {
        self.rq_bios + self.flush_only
    }

    /// Every merge counted per request: bio merges wherever they happened, and requests
    /// absorbed by others (what `/proc/diskstats` calls merges).
    pub fn merged_per_request(&self) -> u64 {
        let mut n = self.rq_merges;
        let mut i = 0;
        while i < MERGE_PLACES {
            n += self.merges_at[i];
            i += 1;
        }
        n
    }

    /// io.cost's charge of a bio that started a request (base and size) or merged (size).
    #[inline(always)]
    fn count_iocost(&mut self, ev: &Event) {
        self.iocost_pages += crate::iocost::pages(ev.bytes);
        if ev.kind == kind::GETRQ {
            self.iocost_requests += 1;
            self.iocost_random += (ev.path != 0) as u64;
        } else {
            self.iocost_merged += 1;
        }
    }

    /// Requests the device saw: each counted once, however often it was requeued.
    pub fn requests(&self) -> u64 {
        self.issues
    }

    /// The requests bios created: those issued, those a request-request merge absorbed later,
    /// and flush-only writes (what a merge-aware iops limit would charge, a what-if).
    pub fn requests_created(&self) -> u64 {
        self.requests() + self.flush_only + self.rq_merges
    }

    /// Bios (and split pieces) that reached a request: what merging compressed into
    /// [`Counters::requests`]. Flush-only writes are left out: they never become one.
    pub fn bios_to_requests(&self) -> u64 {
        (self.bios + self.splits).saturating_sub(self.flush_only)
    }

    /// Discard merges have no tracepoint: every bio (and split remainder) either gets a new
    /// request or merges, so what is left over merged without telling
    /// (`bio_attempt_discard_merge`). Only for the discard direction.
    pub fn discard_merges(&self, dir: u32) -> u64 {
        if dir != dir::DISCARD {
            return 0;
        }
        (self.bios + self.splits).saturating_sub(self.getrq + self.back_merges + self.front_merges)
    }

    /// Every merge the kernel's `merges` counter (/proc/diskstats) counts, from the per-bio
    /// events: bio merges on all paths, discard merges, and request-request merges. (What the
    /// views show is [`Counters::merged_per_request`].)
    pub fn merged_per_bio(&self, dir: u32) -> u64 {
        self.back_merges + self.front_merges + self.discard_merges(dir) + self.rq_merges
    }

    /// Field-wise `self + o` (`plus = true`) or `self - o` (wrapping).
    pub fn combine(&mut self, o: &Counters, plus: bool) {
        // Counters is #[repr(C)] of u64 only: treat both as u64 slices.
        const N: usize = core::mem::size_of::<Counters>() / 8;
        // SAFETY: Counters consists of exactly N u64 fields and arrays of u64, no padding.
        let a = unsafe { &mut *(self as *mut Counters as *mut [u64; N]) };
        let b = unsafe { &*(o as *const Counters as *const [u64; N]) };
        for i in 0..N {
            a[i] = if plus {
                a[i].wrapping_add(b[i])
            } else {
                a[i].wrapping_sub(b[i])
            };
        }
    }

    pub fn add(&mut self, o: &Counters) {
        self.combine(o, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bio_aux, getrq_aux};

    fn ev(kind: u8, op: u8, bytes: u32, flags: u8) -> Event {
        Event {
            kind,
            op,
            bytes,
            flags,
            cgroup_id: 5,
            dev: 7 << 20 | 3,
            ..Event::default()
        }
    }

    fn count(events: &[Event]) -> Counters {
        let mut c = Counters::default();
        for e in events {
            c.count(e, &MeterUnits::default());
        }
        c
    }

    /// A run that charges per request: each issue charges the bios it brings to the device
    /// where their group has rules — as a capture charges each bio at `BIO_QUEUE`.
    #[test]
    fn requests_charge_their_bios_where_their_group_has_rules() {
        let rules = flags::RULES_IOPS;
        let mut three = ev(kind::RQ_ISSUE, 1, 12 << 10, rules);
        three.aux = rq_aux::pack(3, 0, 0, 0);
        let mut unlimited = ev(kind::RQ_ISSUE, 1, 4096, 0);
        unlimited.aux = rq_aux::pack(1, 0, 0, 0);
        // A split bio: its front piece alone in a request (its bio counted with the
        // remainder's request), the remainder's second pass charged at the split.
        let mut front = ev(kind::RQ_ISSUE, 1, 512 << 10, rules);
        front.aux = rq_aux::pack(1, 0, 0, rq_aux::SPLIT_PIECE);
        let split = ev(kind::SPLIT, 1, 1 << 20, rules);
        let mut rest = ev(kind::RQ_ISSUE, 1, 512 << 10, rules);
        rest.aux = rq_aux::pack(1, 0, 0, 0);
        let c = count(&[three, unlimited, front, split, rest]);
        assert_eq!(c.charged_ios, 3 + 1 + 1);
        assert_eq!(c.charged_bytes, (12 << 10) + (1 << 20));
        assert_eq!(c.rq_bios, 3 + 1 + 1);

        // Discards: 512 bytes a bio; a bps rule alone charges too.
        let mut discard = ev(kind::RQ_ISSUE, 3, 8 << 20, flags::RULES_BPS);
        discard.aux = rq_aux::pack(2, 0, 0, 0);
        let c = count(&[discard]);
        assert_eq!((c.charged_ios, c.charged_bytes), (2, 1024));

        // A requeued request issued again: only the bios (and bytes) that joined it since.
        let mut again = ev(kind::RQ_ISSUE, 1, 64 << 10, rules | flags::REISSUE);
        again.aux = rq_aux::pack(16, 2, 1, rq_aux::QUEUED);
        again.aux64 = 12 << 10;
        let c = count(&[again]);
        assert_eq!((c.charged_ios, c.charged_bytes), (3, 12 << 10));
        assert_eq!(c.rq_bios, 3);
    }

    /// A data-less flush write never reaches an issue: its getrq carries its charge.
    #[test]
    fn a_flush_only_write_is_charged_at_its_getrq() {
        let flush = ev(kind::GETRQ, 1, 0, flags::FLUSH_SEQ | flags::RULES_IOPS);
        let mut wbt = ev(kind::GETRQ, 1, 4096, 0);
        wbt.aux = getrq_aux::WBT_CLASS;
        let c = count(&[flush, wbt]);
        assert_eq!((c.flush_only, c.charged_ios, c.charged_bytes), (1, 1, 0));
        assert_eq!(c.wbt_class_requests, 1);
    }

    /// A bio that waited, told by a run that counts it with its request: it counts as
    /// throttled and nothing else.
    #[test]
    fn a_release_note_counts_only_the_wait() {
        let mut waited = ev(
            kind::BIO_QUEUE,
            1,
            4096,
            flags::THROTTLE_RELEASED | flags::RULES_IOPS,
        );
        waited.aux = bio_aux::RELEASE_ONLY;
        let c = count(&[waited]);
        assert_eq!(c.throttled_bios, 1);
        assert_eq!(
            (c.bios, c.bytes, c.charged_ios, c.charged_bytes),
            (0, 0, 0, 0)
        );
        // The same bio in a full capture: a bio, charged, waited.
        waited.aux = 0;
        let c = count(&[waited]);
        assert_eq!((c.bios, c.charged_ios, c.throttled_bios), (1, 1, 1));
    }
}
