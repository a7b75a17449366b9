//! mergetrace's kernel side: one small program per block-layer hook, each turning what it sees
//! into a [`mergetrace_common::Event`] on a ring buffer. No struct layout is compiled in: field
//! offsets come from [`OFFSETS`], kernel addresses from [`SYMBOLS`], both filled in from the
//! running kernel by user space before load. Events the ring buffer cannot take are counted per
//! kind in [`LOST`], never dropped silently.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_stack, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, fentry, fexit, map},
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, FExitContext},
    EbpfContext,
};
use mergetrace_common::{
    count::dir_of_op, flags, kind, path, CountKey, Counters, DeviceState, Event, KernelOffsets,
    KernelSymbols, MeterUnits, Modes, UnplugKey, LOST_COUNTS_FULL, LOST_SLOTS, MAX_CHAIN,
};

#[no_mangle]
static OFFSETS: KernelOffsets = unsafe { core::mem::zeroed() };

#[no_mangle]
static SYMBOLS: KernelSymbols = unsafe { core::mem::zeroed() };

#[no_mangle]
static MODES: Modes = unsafe { core::mem::zeroed() };

#[no_mangle]
static METER_UNITS: MeterUnits = unsafe { core::mem::zeroed() };

/// Per CPU: counters per (device, cgroup, direction), when `MODES.aggregate` is set.
#[map]
static COUNTS: PerCpuHashMap<CountKey, Counters> = PerCpuHashMap::with_max_entries(16384, 0);

/// Per CPU: plug flushes per (device, depth, explicit), when `MODES.aggregate` is set.
#[map]
static UNPLUGS: PerCpuHashMap<UnplugKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// A zeroed `Counters` to insert from (too big for the BPF stack).
#[map]
static ZERO: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Events for user space. User space sizes it (`set_max_entries`) before load.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

/// Whole disks to trace, in the kernel's `dev_t` encoding, with what the programs keep per disk.
#[map]
static DEVICES: HashMap<u32, DeviceState> = HashMap::with_max_entries(256, 0);

/// Per CPU, per event kind: events the ring buffer had no room for.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_SLOTS, 0);

/// What one CPU knows while blk-throttle's dispatch work item runs on it (kthrotld is a
/// per-CPU workqueue: the item runs to its end on one CPU). Every bio submitted then was
/// released from the throttle queue, or is a piece of one: a bio's first release shows as its
/// `block_bio_queue`, but a split remainder had that before it waited, so its release shows
/// only as the first split, merge or new request of a bio none of these slots name.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dispatch {
    /// The work item running (0: none).
    work: u64,
    /// The last bio whose `block_bio_queue` fired in this run (already counted as released).
    queued: u64,
    /// The remainder of the last split in this run: resubmitted in this same run when it
    /// passes the throttle at once, so not released again.
    remainder: u64,
    /// The front piece of that split: a new bio, not a released one.
    front: u64,
}

#[map]
static DISPATCH: PerCpuArray<Dispatch> = PerCpuArray::with_max_entries(1, 0);

/// Requests handed back by the driver after they were issued: request address → its
/// `start_time_ns`, so that its next issue is known as the same request again. LRU: a
/// requeued request that is never issued again (its disk went away) cannot fill the map.
#[map]
static REQUEUED: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);


/// fentry tier: bio address → when it entered `__blk_throtl_bio` (ns). LRU, so a bio that
/// never comes back (cancelled with its disk) cannot fill the map.
#[map]
static THROTTLE_ENTRY: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// Per CPU: one slot to pass a value through so that the verifier stops tracking it.
#[map]
static SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Returns `v` as a value the verifier knows nothing about (see `block_rq_issue`).
#[inline(always)]
fn forget(v: u64) -> u64 {
    match SCRATCH.get_ptr_mut(0) {
        Some(slot) => unsafe {
            core::ptr::write_volatile(slot, v);
            core::ptr::read_volatile(slot)
        },
        None => v,
    }
}

/// Reads one offset from the read-only globals. Volatile, so the compiler cannot fold the
/// zero it sees at build time; the verifier sees the real, frozen value.
macro_rules! off {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const OFFSETS.$field) }
    };
}
macro_rules! sym {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const SYMBOLS.$field) }
    };
}

/// Reads a `T` at `base + offset` of a BTF-typed kernel pointer (a tracepoint argument or a
/// pointer field read from one): a plain load the verifier checks against BTF and guards
/// against faults — far cheaper than a helper call. Zero for NULL.
#[inline(always)]
fn read<T: Copy + Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { core::ptr::read_volatile((base + offset as u64) as *const T) }
}

/// Reads through `bpf_probe_read_kernel`: for pointers the verifier cannot type, such as
/// `blkg->pd[i]` used as the `struct throtl_grp` it is embedded in (container_of).
#[inline(always)]
fn read_probe<T: Copy + Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.unwrap_or_default()
}

#[inline(always)]
fn ready() -> bool {
    off!(ready) != 0
}

/// `major << 20 | first_minor` of a `struct gendisk`.
#[inline(always)]
fn disk_dev(disk: u64) -> u32 {
    let major: i32 = read(disk, off!(disk_major));
    let minor: i32 = read(disk, off!(disk_first_minor));
    ((major as u32) << 20) | (minor as u32 & 0xfffff)
}

/// The traced disk's state, or `None` if the disk is not traced.
#[inline(always)]
fn traced(dev: u32) -> Option<*mut DeviceState> {
    DEVICES.get_ptr_mut(&dev)
}

/// The cgroup id (kernfs inode) a `struct blkcg_gq` belongs to; 0 for NULL.
#[inline(always)]
fn blkg_cgroup_id(blkg: u64) -> u64 {
    let blkcg: u64 = read(blkg, off!(blkg_blkcg));
    let cgroup: u64 = read(blkcg, off!(blkcg_css_cgroup));
    let kn: u64 = read(cgroup, off!(cgroup_kn));
    read(kn, off!(kn_id))
}

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// Wake the reader when this much is waiting: about 4,600 events.
const WAKEUP_BYTES: u64 = 256 << 10;

/// Hands an event to whatever the run needs: the in-kernel counters, the ring buffer, or both.
#[inline(always)]
fn emit(ev: &Event) {
    let modes = unsafe { core::ptr::read_volatile(&raw const MODES) };
    if modes.aggregate != 0 {
        aggregate(ev);
    }
    if modes.emit != 0 {
        match EVENTS.reserve::<Event>(0) {
            Some(mut entry) => {
                entry.write(*ev);
                // Batched wake-ups: wake the reader only once a good batch is waiting (it
                // also polls on a short timer), instead of once per event.
                let flags = if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
                    BPF_RB_FORCE_WAKEUP
                } else {
                    BPF_RB_NO_WAKEUP
                };
                entry.submit(flags);
            }
            None => count_lost(ev.kind as u32),
        }
    }
}

/// Counts `ev` in this CPU's counters, with the same rule user space applies to captures.
#[inline(always)]
fn aggregate(ev: &Event) {
    if ev.kind == kind::UNPLUG {
        let key = UnplugKey {
            dev: ev.dev,
            depth: ev.aux,
            explicit: (ev.flags & flags::UNPLUG_EXPLICIT != 0) as u32,
            _pad: 0,
        };
        match UNPLUGS.get_ptr_mut(&key) {
            Some(n) => unsafe { *n += 1 },
            None => {
                if UNPLUGS.insert(&key, &1, 0).is_err() {
                    count_lost(LOST_COUNTS_FULL);
                }
            }
        }
        return;
    }
    let key = CountKey {
        cgroup_id: ev.cgroup_id,
        dev: ev.dev,
        dir: dir_of_op(ev.op),
    };
    let counters = match COUNTS.get_ptr_mut(&key) {
        Some(c) => c,
        None => {
            let Some(zero) = ZERO.get(0) else { return };
            if COUNTS.insert(&key, zero, 0).is_err() {
                count_lost(LOST_COUNTS_FULL);
                return;
            }
            match COUNTS.get_ptr_mut(&key) {
                Some(c) => c,
                None => return,
            }
        }
    };
    // Volatile: the compiler must not fold the build-time zeros of a read-only global.
    let units = unsafe { core::ptr::read_volatile(&raw const METER_UNITS) };
    unsafe { (*counters).count(ev, &units) };
}

#[inline(always)]
fn count_lost(slot: u32) {
    if let Some(n) = LOST.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
}

/// The common part of every bio event; `None` if the bio's disk is not traced.
#[inline(always)]
fn bio_event(bio: u64, kind: u8) -> Option<Event> {
    if bio == 0 || !ready() {
        return None;
    }
    let bdev: u64 = read(bio, off!(bio_bi_bdev));
    let disk: u64 = read(bdev, off!(bdev_bd_disk));
    let dev = disk_dev(disk);
    traced(dev)?;
    let opf: u32 = read(bio, off!(bio_bi_opf));
    let blkg: u64 = read(bio, off!(bio_bi_blkg));
    Some(Event {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id: blkg_cgroup_id(blkg),
        id: bio,
        aux64: 0,
        sector: read(bio, off!(bio_bi_sector)),
        dev,
        bytes: read(bio, off!(bio_bi_size)),
        aux: 0,
        kind,
        op: (opf & 0xff) as u8,
        path: 0,
        flags: if opf & off!(req_flush_mask) != 0 {
            flags::FLUSH_SEQ
        } else {
            0
        },
    })
}

/// A request's start sector as the kernel's own block tracepoints report it
/// (`blk_rq_trace_sector`): 0 where none was set, as for a flush request (`(sector_t)-1`).
#[inline(always)]
fn rq_trace_sector(rq: u64) -> u64 {
    let sector: u64 = read(rq, off!(rq_sector));
    if sector == u64::MAX {
        0
    } else {
        sector
    }
}

/// The common part of every request event; `None` if the request's disk is not traced.
#[inline(always)]
fn rq_event(rq: u64, kind: u8) -> Option<Event> {
    if rq == 0 || !ready() {
        return None;
    }
    let q: u64 = read(rq, off!(rq_q));
    let disk: u64 = read(q, off!(q_disk));
    let dev = disk_dev(disk);
    let state = traced(dev)?;
    let cmd_flags: u32 = read(rq, off!(rq_cmd_flags));
    // A request never mixes cgroups (blk_cgroup_mergeable), so its first bio tells its cgroup.
    let first_bio: u64 = read(rq, off!(rq_bio));
    let cgroup_id = if first_bio != 0 {
        blkg_cgroup_id(read(first_bio, off!(bio_bi_blkg)))
    } else {
        // A flush request carries no bio: it is the flush of the cgroup that asked last.
        unsafe { (*state).flush_cgroup }
    };
    Some(Event {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id,
        id: rq,
        aux64: first_bio,
        sector: rq_trace_sector(rq),
        dev,
        bytes: read(rq, off!(rq_data_len)),
        aux: 0,
        kind,
        op: (cmd_flags & 0xff) as u8,
        path: 0,
        flags: 0,
    })
}

/// blk-throttle's group (`struct throtl_grp *`) of a bio, or 0 if the queue has no throttle
/// data (no limit was ever set on this disk) or the group is not found.
#[inline(always)]
fn throttle_group(bio: u64) -> u64 {
    let blkg: u64 = read(bio, off!(bio_bi_blkg));
    let q: u64 = read(blkg, off!(blkg_q));
    let td: u64 = read(q, off!(q_td));
    if td == 0 {
        return 0;
    }
    let pd_base = off!(blkg_pd);
    let tg_td = off!(tg_td);
    for i in 0..8u32 {
        if i >= off!(blkg_pd_count) {
            break;
        }
        let pd: u64 = read_probe(blkg, pd_base + i * 8);
        if pd != 0 && read_probe::<u64>(pd, tg_td) == td {
            return pd; // pd is the first member of throtl_grp
        }
    }
    0
}

/// Does the bio's group have iops / bps rules (own or inherited) for its direction.
#[inline(always)]
fn rule_flags(tg: u64, op: u8) -> u8 {
    if tg == 0 {
        return 0;
    }
    let rw = (op & 1) as u32; // bio_data_dir(): op_is_write()
    let mut out = 0;
    if read_probe::<u8>(tg, off!(tg_has_rules_iops) + rw) != 0 {
        out |= flags::RULES_IOPS;
    }
    if read_probe::<u8>(tg, off!(tg_has_rules_bps) + rw) != 0 {
        out |= flags::RULES_BPS;
    }
    out
}

#[inline(always)]
fn bps_charged(bio: u64) -> bool {
    // `bio` comes from `bi_private` (a void pointer): not BTF-typed, so probe-read.
    let bi_flags: u16 = read_probe(bio, off!(bio_bi_flags));
    bi_flags & (1u16 << (off!(bio_bps_throttled_bit) & 15)) != 0
}

/// This CPU's dispatch state while blk-throttle's dispatch work runs on it, else `None`.
#[inline(always)]
fn throttle_dispatch() -> Option<*mut Dispatch> {
    let d = DISPATCH.get_ptr_mut(0)?;
    (unsafe { (*d).work } != 0).then_some(d)
}

/// In the dispatch work: whether `bio` is a released split remainder, seen for the first time
/// since its release (see [`Dispatch`]).
#[inline(always)]
fn released_remainder(d: *mut Dispatch, bio: u64) -> bool {
    let d = unsafe { &*d };
    bio != d.queued && bio != d.remainder && bio != d.front
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue(ctx: BtfTracePointContext) -> u32 {
    let bio: u64 = ctx.arg(0);
    if let Some(mut ev) = bio_event(bio, kind::BIO_QUEUE) {
        ev.flags |= rule_flags(throttle_group(bio), ev.op);
        if let Some(d) = throttle_dispatch() {
            ev.flags |= flags::THROTTLE_RELEASED;
            unsafe { (*d).queued = bio };
        }
        emit(&ev);
    }
    0
}

/// `block_split(split, new_sector)`: `split` is the front piece; the original bio becomes the
/// remainder (`split->bi_private`) and re-enters the throttle, where it is charged again.
#[btf_tracepoint(function = "block_split")]
pub fn block_split(ctx: BtfTracePointContext) -> u32 {
    let split: u64 = ctx.arg(0);
    let new_sector: u64 = ctx.arg(1);
    if let Some(mut ev) = bio_event(split, kind::SPLIT) {
        ev.aux = new_sector as u32;
        let remainder: u64 = read(split, off!(bio_bi_private));
        ev.aux64 = remainder;
        ev.flags |= rule_flags(throttle_group(split), ev.op);
        if bps_charged(remainder) {
            ev.flags |= flags::BPS_CHARGED;
        }
        if let Some(d) = throttle_dispatch() {
            if released_remainder(d, remainder) {
                ev.flags |= flags::THROTTLE_RELEASED;
            }
            unsafe {
                (*d).remainder = remainder;
                (*d).front = split;
            }
        }
        emit(&ev);
    }
    0
}

/// Flags a bio that reached a merge or a new request in the dispatch work as a released
/// split remainder when it is one.
#[inline(always)]
fn mark_released(ev: &mut Event) {
    if let Some(d) = throttle_dispatch() {
        if released_remainder(d, ev.id) {
            ev.flags |= flags::THROTTLE_RELEASED;
        }
    }
}

/// Which merge caller is on the kernel stack: the first frame inside one of the
/// `merge_callers` ranges decides. `path::UNKNOWN` if none (or no ranges were given).
#[inline(always)]
fn merge_path<C: EbpfContext>(ctx: &C) -> u8 {
    const FRAMES: usize = 8;
    let mut stack = [0u64; FRAMES];
    let got = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            stack.as_mut_ptr() as *mut _,
            (FRAMES * 8) as u32,
            0,
        )
    };
    if got <= 0 {
        return path::UNKNOWN;
    }
    let frames = (got as usize / 8).min(FRAMES);
    let callers = sym!(merge_callers);
    for (i, ip) in stack.iter().enumerate() {
        if i >= frames {
            break;
        }
        for (p, range) in callers.iter().enumerate() {
            if range[0] != 0 && *ip >= range[0] && *ip < range[1] {
                return p as u8 + 1;
            }
        }
    }
    path::UNKNOWN
}

fn bio_merge(ctx: &BtfTracePointContext, kind: u8) {
    let bio: u64 = ctx.arg(0);
    if let Some(mut ev) = bio_event(bio, kind) {
        ev.path = merge_path(ctx);
        mark_released(&mut ev);
        emit(&ev);
    }
}

#[btf_tracepoint(function = "block_bio_backmerge")]
pub fn block_bio_backmerge(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, kind::BACK_MERGE);
    0
}

#[btf_tracepoint(function = "block_bio_frontmerge")]
pub fn block_bio_frontmerge(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, kind::FRONT_MERGE);
    0
}

#[btf_tracepoint(function = "block_getrq")]
pub fn block_getrq(ctx: BtfTracePointContext) -> u32 {
    if let Some(mut ev) = bio_event(ctx.arg(0), kind::GETRQ) {
        mark_released(&mut ev);
        if ev.flags & flags::FLUSH_SEQ != 0 {
            // This request starts a flush sequence: the flush request the flush machinery
            // issues for it (without a bio) is counted for this cgroup.
            if let Some(state) = traced(ev.dev) {
                unsafe { (*state).flush_cgroup = ev.cgroup_id };
            }
        }
        emit(&ev);
    }
    0
}

fn rq_simple(ctx: &BtfTracePointContext, kind: u8) {
    if let Some(ev) = rq_event(ctx.arg(0), kind) {
        emit(&ev);
    }
}

/// `block_rq_merge(next)`: `next` is absorbed into another request.
#[btf_tracepoint(function = "block_rq_merge")]
pub fn block_rq_merge(ctx: BtfTracePointContext) -> u32 {
    rq_simple(&ctx, kind::RQ_MERGE);
    0
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert(ctx: BtfTracePointContext) -> u32 {
    rq_simple(&ctx, kind::RQ_INSERT);
    0
}

/// Issue: also counts the bios chained in the request (`rq->bio` → `bi_next`), for the
/// bios-per-request histogram and lineage.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> u32 {
    if let Some(mut ev) = rq_event(ctx.arg(0), kind::RQ_ISSUE) {
        let next_off = off!(bio_bi_next);
        let mut bio = ev.aux64;
        let mut n = 0u32;
        while bio != 0 && n < MAX_CHAIN {
            n += 1;
            bio = read(bio, next_off);
        }
        // Through a map slot: the verifier then forgets which iteration ended the loop, so it
        // checks the rest of the program once instead of once per possible count (6.1 gave
        // up with E2BIG).
        ev.aux = forget(n as u64) as u32;
        if reissued(ctx.arg(0), ev.dev) {
            ev.flags |= flags::REISSUE;
        }
        emit(&ev);
    }
    0
}

/// Whether the request being issued was issued before and requeued (and forgets it). Only
/// disks that have requeued a request during the run pay for the lookup.
#[inline(always)]
fn reissued(rq: u64, dev: u32) -> bool {
    let Some(state) = traced(dev) else {
        return false;
    };
    if unsafe { (*state).requeues_seen } == 0 {
        return false;
    }
    // Read before the lookup: once `rq` is a map key on the stack, the verifier no longer
    // knows it as a typed pointer.
    let start_time: u64 = read(rq, off!(rq_start_time_ns));
    let key = rq;
    let Some(started) = (unsafe { REQUEUED.get(&key) }).copied() else {
        return false;
    };
    let _ = REQUEUED.remove(&key);
    // The same memory may hold a new request by now (the requeued one went away unissued).
    start_time == started
}

/// `block_rq_requeue(rq)`: a driver handed the request back. If it had been issued (started),
/// its next issue is the same request again, not a new one: remember it.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn block_rq_requeue(ctx: BtfTracePointContext) -> u32 {
    if let Some(ev) = rq_event(ctx.arg(0), kind::RQ_REQUEUE) {
        let rq: u64 = ctx.arg(0);
        // `__blk_mq_requeue_request` fires this before it sets the state back to idle.
        let state: u32 = read(rq, off!(rq_state));
        let started: u64 = read(rq, off!(rq_start_time_ns));
        if state != 0 && REQUEUED.insert(&rq, &started, 0).is_ok() {
            if let Some(disk) = traced(ev.dev) {
                unsafe { (*disk).requeues_seen = 1 };
            }
        }
        emit(&ev);
    }
    0
}

/// `block_rq_complete(rq, error, nr_bytes)`; may be partial.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete(ctx: BtfTracePointContext) -> u32 {
    let error: u64 = ctx.arg(1);
    let nr_bytes: u64 = ctx.arg(2);
    if let Some(mut ev) = rq_event(ctx.arg(0), kind::RQ_COMPLETE) {
        ev.path = error as u8;
        ev.aux = nr_bytes as u32;
        emit(&ev);
    }
    0
}

/// `block_unplug(q, depth, explicit)`.
#[btf_tracepoint(function = "block_unplug")]
pub fn block_unplug(ctx: BtfTracePointContext) -> u32 {
    if !ready() {
        return 0;
    }
    let q: u64 = ctx.arg(0);
    let depth: u64 = ctx.arg(1);
    let explicit: u64 = ctx.arg(2);
    let disk: u64 = read(q, off!(q_disk));
    let dev = disk_dev(disk);
    if traced(dev).is_none() {
        return 0;
    }
    let ev = Event {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        id: q,
        dev,
        aux: depth as u32,
        kind: kind::UNPLUG,
        flags: if explicit & 0xff != 0 {
            flags::UNPLUG_EXPLICIT
        } else {
            0
        },
        ..Event::default()
    };
    emit(&ev);
    0
}

/// Marks the CPU while blk-throttle's dispatch work runs: bios queued then were held back.
/// The mark is the work item's address, so the matching end clears it.
#[btf_tracepoint(function = "workqueue_execute_start")]
pub fn workqueue_execute_start(ctx: BtfTracePointContext) -> u32 {
    let work: u64 = ctx.arg(0);
    let target = sym!(throtl_dispatch_fn);
    if target != 0 && read::<u64>(work, off!(work_func)) == target {
        if let Some(d) = DISPATCH.get_ptr_mut(0) {
            unsafe {
                *d = Dispatch {
                    work,
                    queued: 0,
                    remainder: 0,
                    front: 0,
                }
            };
        }
    }
    0
}

/// `workqueue_execute_end(work, func)`: `func` is a function pointer tp_btf cannot read, so
/// match on the work item's address instead.
#[btf_tracepoint(function = "workqueue_execute_end")]
pub fn workqueue_execute_end(ctx: BtfTracePointContext) -> u32 {
    let work: u64 = ctx.arg(0);
    if let Some(d) = DISPATCH.get_ptr_mut(0) {
        unsafe {
            if (*d).work == work {
                (*d).work = 0;
            }
        }
    }
    0
}

// ---- fentry tier: exact throttle delays and merge decisions (where the kernel allows it) ----

#[fentry(function = "__blk_throtl_bio")]
pub fn throtl_bio_entry(ctx: FEntryContext) -> u32 {
    if bio_event(ctx.arg(0), kind::THROTTLE_CHARGE).is_some() {
        let key: u64 = ctx.arg(0);
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = THROTTLE_ENTRY.insert(&key, &now, 0);
    }
    0
}

/// `__blk_throtl_bio` returns true when it queued the bio (throttled).
///
/// Map helpers take the bio address as a key through the stack, after which the verifier no
/// longer knows that stack slot holds a typed pointer: the programs read the argument from the
/// context again (`ctx.arg`) for field loads instead of reusing the key.
#[fexit(function = "__blk_throtl_bio")]
pub fn throtl_bio_exit(ctx: FExitContext) -> u32 {
    let throttled: u64 = ctx.arg(1);
    if let Some(mut ev) = bio_event(ctx.arg(0), kind::THROTTLE_CHARGE) {
        ev.path = (throttled & 0xff != 0) as u8;
        ev.flags |= rule_flags(throttle_group(ctx.arg(0)), ev.op);
        emit(&ev);
        if ev.path == 0 {
            let key: u64 = ctx.arg(0);
            let _ = THROTTLE_ENTRY.remove(&key);
        }
    }
    0
}

/// Throttled bios are issued from the dispatch work through `submit_bio_noacct_nocheck`.
#[fentry(function = "submit_bio_noacct_nocheck")]
pub fn throtl_release(ctx: FEntryContext) -> u32 {
    let key: u64 = ctx.arg(0);
    let Some(start) = (unsafe { THROTTLE_ENTRY.get(&key) }).copied() else {
        return 0;
    };
    let _ = THROTTLE_ENTRY.remove(&key);
    if let Some(mut ev) = bio_event(ctx.arg(0), kind::THROTTLE_RELEASE) {
        ev.aux64 = ev.ts_ns.saturating_sub(start);
        emit(&ev);
    }
    0
}

/// `blk_attempt_plug_merge(q, bio, nr_segs)` → bool.
#[fexit(function = "blk_attempt_plug_merge")]
pub fn plug_attempt(ctx: FExitContext) -> u32 {
    let bio: u64 = ctx.arg(1);
    let merged: u64 = ctx.arg(3);
    if let Some(mut ev) = bio_event(bio, kind::PLUG_ATTEMPT) {
        ev.path = (merged & 0xff != 0) as u8;
        emit(&ev);
    }
    0
}

/// `elv_merge(q, &req, bio)` → `enum elv_merge`.
#[fexit(function = "elv_merge")]
pub fn elv_merge_exit(ctx: FExitContext) -> u32 {
    let bio: u64 = ctx.arg(2);
    let decision: u64 = ctx.arg(3);
    if let Some(mut ev) = bio_event(bio, kind::ELV_MERGE) {
        ev.path = (decision & 0xff) as u8;
        emit(&ev);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
