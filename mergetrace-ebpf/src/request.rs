//! Programs on the request tracepoints: a request absorbed by another, inserted, issued
//! (once, however often requeued), handed back by the driver, completed; and plug flushes.
//!
//! The live view counts bios and merges here, per request rather than per bio
//! (`mergetrace_common::rq_aux`): a request's bios are its chain (`rq->bio` → `bi_next`), and
//! a bio merged where its request was then — in the task's plug until the request left it
//! (insert, issue straight from the plug, or absorption before an insert), in the queue
//! after its insert.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use mergetrace_common::{flags, kind, path, rq_aux, DeviceState, Event};

use crate::{
    chain::walk,
    charge::{note_rules, rule_flags},
    emit::{charges_per_request, emit, emit_slotted, now},
    latency,
    maps::{frozen, off, Inserted, ABSORBED, INSERTED, REQUEUED, SPLIT_PIECES},
    read::{
        blkg_cgroup_id, disk_dev, elevator_is_kyber, forget, forget_all, forget_all_stored,
        pending_add, queue_disk, read, read_probe, ready, rq_disk, traced, Disk,
    },
    slot::{self, key_of},
};

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

/// The common part of every request event, its disk and its queue (`rq->q`); `None` if the
/// disk is not traced.
///
/// The request's pointers are read here, once, before the program branches: from 6.5 the
/// verifier looks each pointer read from a tracepoint's argument up in the kernel's BTF by
/// name (4 linear searches of ~100,000 types), again on every path that reaches the read.
#[inline(always)]
fn rq_event(rq: u64, kind: u8) -> Option<(Event, Disk, u64)> {
    if rq == 0 || !ready() {
        return None;
    }
    let q: u64 = read(rq, off!(rq_q));
    // A request never mixes cgroups (blk_cgroup_mergeable), so its first bio tells its cgroup.
    let first_bio: u64 = read(rq, off!(rq_bio));
    let dev = disk_dev(rq_disk(rq, q));
    let disk = traced(dev)?;
    let cmd_flags: u32 = read(rq, off!(rq_cmd_flags));
    let cgroup_id = if first_bio != 0 {
        blkg_cgroup_id(read(first_bio, off!(bio_bi_blkg)))
    } else {
        // A flush request carries no bio: it is the flush of the cgroup that asked last.
        // Through the helper, not a load: the compiler would sink two loads, of a kernel
        // pointer and of a map value, into one instruction, which the verifier refuses
        // ("same insn cannot be used with different pointers").
        let state = disk.state as u64;
        read_probe::<u64>(
            state,
            core::mem::offset_of!(DeviceState, flush_cgroup) as u32,
        )
    };
    let ev = Event {
        ts_ns: now(),
        cgroup_id,
        id: rq,
        aux64: first_bio,
        sector: rq_trace_sector(rq),
        dev,
        bytes: read(rq, off!(rq_data_len)),
        kind,
        op: (cmd_flags & 0xff) as u8,
        // aux, path and flags are the kind's to fill in.
        ..Event::default()
    };
    Some((ev, disk, q))
}

/// `REQ_OP_DISCARD`.
const OP_DISCARD: u8 = 3;

/// Where the merges of a request leaving the plug count: the plug, or a multi-range discard
/// (a discard bio joins such a request as a range, wherever the request is:
/// `blk_discard_mergable`).
#[inline(always)]
fn plug_place(q: u64, op: u8) -> u8 {
    if discard_ranges(q, op) {
        path::DISCARD
    } else {
        path::PLUG
    }
}

/// Where the merges of a request in the queue count: its disk's scheduler (mq-deadline, bfq),
/// or the software queue (scheduler none, or kyber, which merges bios on plain lists); a
/// multi-range discard as in [`plug_place`].
#[inline(always)]
fn queue_place(q: u64, op: u8) -> u8 {
    if discard_ranges(q, op) {
        return path::DISCARD;
    }
    let elevator: u64 = read(q, off!(q_elevator));
    if elevator == 0 || elevator_is_kyber(elevator) {
        path::SW_QUEUE
    } else {
        path::ELEVATOR
    }
}

/// A discard request on a queue that takes several discard ranges per request.
#[inline(always)]
fn discard_ranges(q: u64, op: u8) -> bool {
    if op != OP_DISCARD {
        return false;
    }
    read_probe::<u16>(q, off!(q_max_discard_segments)) > 1
}

/// Which of the disk's pending counts (`DeviceState`) to move.
#[derive(Clone, Copy)]
pub enum Pending {
    Inserted,
    Absorbed,
    SplitPieces,
}

/// The request's entry in `INSERTED`, taken out, if it was inserted (only disks with entries
/// pending pay the lookup).
#[inline(always)]
fn take_inserted(rq: u64, disk: Disk) -> Option<Inserted> {
    if unsafe { (*disk.state).inserted } == 0 {
        return None;
    }
    let key = rq;
    let found = unsafe { INSERTED.get(&key) }.copied()?;
    let _ = INSERTED.remove(&key);
    pending_add(disk, Pending::Inserted, -1);
    Some(found)
}

/// Packs what `rq` carries when it leaves the plug now (`at` None) or after its time in the
/// queue (`at` its insert): the event's `aux` and `path`. One walk of the chain either way
/// (`LOOP_HELPER`: see [`crate::chain`]). Whether this is a requeued request's issue again is
/// asked (`reissued`) after the walk, and returned: asked before, each answer would have had
/// the verifier check the walk's bounded loops again (at load, 4 times over).
#[inline(always)]
fn account<const LOOP_HELPER: bool>(
    ev: &mut Event,
    q: u64,
    at: Option<Inserted>,
    disk: Disk,
    reissued: impl FnOnce() -> bool,
) -> bool {
    let (first_at_insert, absorbed) = match at {
        Some(i) => (i.first, unsafe { (*disk.state).absorbed } != 0),
        None => (0, false),
    };
    let c = walk::<LOOP_HELPER>(ev.aux64, first_at_insert, absorbed, disk);
    let reissue = reissued();
    match at {
        None => {
            ev.aux = rq_aux::pack(c.bios, 0, 0, 0);
            ev.path = plug_place(q, ev.op);
        }
        Some(i) => {
            let queued = c.bios.saturating_sub(i.bios + c.absorbed);
            // A requeued request: the bios of what it absorbed since are new bios too, and
            // the bytes of all that joined it since are new bytes (its first bio is known).
            let third = if reissue { c.absorbed } else { c.front };
            if reissue {
                ev.aux64 = ev.bytes.saturating_sub(i.bytes) as u64;
            }
            ev.aux = rq_aux::pack(c.bios, queued, third, rq_aux::QUEUED);
            ev.path = i.place;
        }
    }
    reissue
}

/// `block_rq_merge(next)`: `next` is absorbed into another request, its bios appended to
/// that request's chain. Its bios are counted with that request's; here its merges: those in
/// the plug if it never was inserted (a merge at insert), else those in the queue. Its first
/// bio goes into `ABSORBED`, where the walk of the request that took it finds it.
#[inline(always)]
fn rq_merge<const LOOP_HELPER: bool>(ctx: BtfTracePointContext) -> u32 {
    let next: u64 = ctx.arg(0);
    if let Some((mut ev, disk, q)) = rq_event(next, kind::RQ_MERGE) {
        let at = take_inserted(next, disk);
        account::<LOOP_HELPER>(&mut ev, q, at, disk, || false);
        // What it carries as values the verifier does not know (`read::forget`): 6,900 → 1,300
        // instructions to check on 6.18.
        let [aux, path] = forget_all([ev.aux as u64, ev.path as u64]);
        (ev.aux, ev.path) = (aux as u32, path as u8);
        let (first, bios) = (ev.aux64, rq_aux::chain(ev.aux));
        if first != 0 && ABSORBED.insert(&first, &bios, 0).is_ok() {
            pending_add(disk, Pending::Absorbed, bios as i64);
        }
        emit(&ev, disk.slot);
    }
    0
}

#[btf_tracepoint(function = "block_rq_merge")]
pub fn block_rq_merge(ctx: BtfTracePointContext) -> u32 {
    rq_merge::<true>(ctx)
}

/// Before 5.17 (no `bpf_loop`): its walks as bounded loops.
#[btf_tracepoint(function = "block_rq_merge")]
pub fn block_rq_merge_bl(ctx: BtfTracePointContext) -> u32 {
    rq_merge::<false>(ctx)
}

/// `block_rq_insert(rq)`: the request leaves the plug for the scheduler or the software
/// queue, carrying its plug merges; what joins it from now on merged in the queue. A
/// requeued request put back left the plug before (`rq_aux::QUEUED`).
#[inline(always)]
fn rq_insert<const LOOP_HELPER: bool>(ctx: BtfTracePointContext) -> u32 {
    let rq: u64 = ctx.arg(0);
    if let Some((mut ev, disk, q)) = rq_event(rq, kind::RQ_INSERT) {
        let c = walk::<LOOP_HELPER>(ev.aux64, 0, false, disk);
        let requeued = was_requeued(rq, disk);
        ev.aux = rq_aux::pack(c.bios, 0, 0, if requeued { rq_aux::QUEUED } else { 0 });
        ev.path = plug_place(q, ev.op);
        let entry = Inserted {
            first: ev.aux64,
            bios: c.bios,
            bytes: ev.bytes,
            place: queue_place(q, ev.op),
            _pad: [0; 7],
        };
        let key = rq;
        if INSERTED.insert(&key, &entry, 0).is_ok() {
            pending_add(disk, Pending::Inserted, 1);
        }
        emit(&ev, disk.slot);
    }
    0
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert(ctx: BtfTracePointContext) -> u32 {
    rq_insert::<true>(ctx)
}

/// Before 5.17 (no `bpf_loop`): its walk as a bounded loop.
#[btf_tracepoint(function = "block_rq_insert")]
pub fn block_rq_insert_bl(ctx: BtfTracePointContext) -> u32 {
    rq_insert::<false>(ctx)
}

/// Issue: the request's bios and the merges not counted yet (see [`account`]); a request
/// issued again after a requeue counts only what joined it since. Also flags a split's front
/// piece (alone in its request: split pieces carry `REQ_NOMERGE`).
#[inline(always)]
fn rq_issue<const LOOP_HELPER: bool>(ctx: BtfTracePointContext) -> u32 {
    let rq: u64 = ctx.arg(0);
    if let Some((mut ev, disk, q)) = rq_event(rq, kind::RQ_ISSUE) {
        // A run that charges per request charges the request's bios here, as blk-throttle charged them: by
        // their group's rules (one group: a request never mixes cgroups), asked of its first
        // bio. So a limit counts from its first request, whenever it was set.
        if charges_per_request() {
            let rules = forget(rule_flags(ev.aux64, ev.op) as u64) as u8;
            ev.flags |= rules;
            note_rules(&disk, ev.dev, rules);
        }
        let at = take_inserted(rq, disk);
        // A requeued request issued again: only what joined it since it was put back counts
        // (without an insert entry, nothing did: the rule counts no plug merges again).
        let reissue = account::<LOOP_HELPER>(&mut ev, q, at, disk, || reissued(ctx.arg(0), disk));
        let bios = rq_aux::chain(ev.aux);
        if reissue {
            ev.flags |= flags::REISSUE;
        } else if bios == 1 && split_piece(ev.aux64, disk) {
            ev.aux |= rq_aux::SPLIT_PIECE;
        }
        // What the issue carries as values the verifier does not know (`read::forget`; and
        // `aux64` no longer the pointer it can be). On 6.18 the verifier's instructions for
        // rq_issue: 20,800 → 3,900; with --latency (and `latency::bucket`) 345,500 → 15,100.
        let [aux, aux64, path, flags, reissue] = forget_all_stored([
            ev.aux as u64,
            ev.aux64,
            ev.path as u64,
            ev.flags as u64,
            reissue as u64,
        ]);
        (ev.aux, ev.aux64, ev.path, ev.flags) = (aux as u32, aux64, path as u8, flags as u8);
        if latency::wanted() {
            // One slot lookup for the request's counters and its latency.
            let slot = slot::of(&key_of(&ev));
            // From the forgotten `aux`: the count before it is one the verifier still knows.
            let bios = rq_aux::chain(ev.aux);
            latency::issued(rq, &ev, bios, reissue != 0, disk, slot);
            emit_slotted(&ev, slot);
        } else {
            emit(&ev, disk.slot);
        }
    }
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue(ctx: BtfTracePointContext) -> u32 {
    rq_issue::<true>(ctx)
}

/// Before 5.17 (no `bpf_loop`): its walks as bounded loops.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn block_rq_issue_bl(ctx: BtfTracePointContext) -> u32 {
    rq_issue::<false>(ctx)
}

/// Whether `bio` is the front piece of a split (`SPLIT_PIECES`, taken out).
#[inline(always)]
fn split_piece(bio: u64, disk: Disk) -> bool {
    if unsafe { (*disk.state).split_pieces } == 0 {
        return false;
    }
    let key = bio;
    if unsafe { SPLIT_PIECES.get(&key) }.is_none() {
        return false;
    }
    let _ = SPLIT_PIECES.remove(&key);
    pending_add(disk, Pending::SplitPieces, -1);
    true
}

/// Whether the request being inserted is a requeued one put back (it stays in `REQUEUED`
/// for its next issue).
#[inline(always)]
fn was_requeued(rq: u64, disk: Disk) -> bool {
    if unsafe { (*disk.state).requeues_seen } == 0 {
        return false;
    }
    let start_time: u64 = read(rq, off!(rq_start_time_ns));
    let key = rq;
    unsafe { REQUEUED.get(&key) }.is_some_and(|started| *started == start_time)
}

/// Whether the request being issued was issued before and requeued (and forgets it). Only
/// disks that have requeued a request during the run pay for the lookup.
#[inline(always)]
fn reissued(rq: u64, disk: Disk) -> bool {
    if unsafe { (*disk.state).requeues_seen } == 0 {
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
    if let Some((ev, disk, _)) = rq_event(ctx.arg(0), kind::RQ_REQUEUE) {
        let rq: u64 = ctx.arg(0);
        // `__blk_mq_requeue_request` fires this before it sets the state back to idle.
        let state: u32 = read(rq, off!(rq_state));
        let started: u64 = read(rq, off!(rq_start_time_ns));
        if state != 0 && REQUEUED.insert(&rq, &started, 0).is_ok() {
            unsafe { (*disk.state).requeues_seen = 1 };
        }
        emit(&ev, disk.slot);
    }
    0
}

/// `block_rq_complete(rq, error, nr_bytes)`; may be partial.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete(ctx: BtfTracePointContext) -> u32 {
    // The tests' stand-in for a completion the kernel did not run us for (pruned otherwise).
    let skip = frozen!(MODES.skip_completions_at);
    if skip != 0 && rq_trace_sector(ctx.arg(0)) + 1 == skip as u64 {
        return 0;
    }
    let error: u64 = ctx.arg(1);
    let nr_bytes: u64 = ctx.arg(2);
    if let Some((mut ev, disk, _)) = rq_event(ctx.arg(0), kind::RQ_COMPLETE) {
        ev.path = error as u8;
        ev.aux = nr_bytes as u32;
        if latency::wanted() {
            let slot = slot::of(&key_of(&ev));
            latency::completed(ctx.arg(0), &ev, nr_bytes, disk, slot);
            emit_slotted(&ev, slot);
        } else {
            emit(&ev, disk.slot);
        }
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
    let Some((dev, disk)) = queue_disk(q) else {
        return 0;
    };
    let ev = Event {
        ts_ns: now(),
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
    emit(&ev, disk.slot);
    0
}
