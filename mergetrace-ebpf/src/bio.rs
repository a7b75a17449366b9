//! Programs on the bio tracepoints: a bio leaving blk-throttle (`block_bio_queue`), split,
//! merged into a request (and by which path), or starting a new request.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_get_current_task_btf, bpf_get_stack},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
    EbpfContext,
};
use mergetrace_common::{
    bio_aux, count::dir_of_op, flags, gate, getrq_aux, iocost, kind, path, Event, NONE,
};

use crate::{
    charge::{bps_charged, note_rules, rule_flags},
    emit::{charges_per_request, emit, emit_charge, emitting, now, now_for},
    maps::{frozen, off, CursorKey, IOCOST_CURSOR, SPLIT_PIECES},
    read::{
        bio_disk, blkg_cgroup_id, disk_config, disk_dev, elevator_is_kyber, forget, gate_bits,
        learn_queue, offsets_ready, pending_add, read, read_probe, ready, traced, Disk,
    },
    request::Pending,
    throttle::{mark_released, note_queued, note_split},
};

/// The common part of every bio event and the bio's disk; `None` if the disk is not traced.
#[inline(always)]
pub fn bio_event(bio: u64, kind: u8) -> Option<(Event, Disk)> {
    if bio == 0 || !ready() {
        return None;
    }
    let disk_ptr = bio_disk(bio);
    let dev = disk_dev(disk_ptr);
    let disk = traced(dev)?;
    learn_queue(&disk, disk_ptr);
    let opf: u32 = read(bio, off!(bio_bi_opf));
    let blkg: u64 = read(bio, off!(bio_bi_blkg));
    let ev = Event {
        ts_ns: now_for(kind),
        cgroup_id: blkg_cgroup_id(blkg),
        id: bio,
        sector: read(bio, off!(bio_bi_sector)),
        dev,
        bytes: read(bio, off!(bio_bi_size)),
        kind,
        op: (opf & 0xff) as u8,
        flags: if opf & off!(req_flush_mask) != 0 {
            flags::FLUSH_SEQ
        } else {
            0
        },
        // aux64, aux and path are the kind's to fill in.
        ..Event::default()
    };
    Some((ev, disk))
}

/// A bio left blk-throttle (once per bio, after it waited if it did). A full capture sends
/// each with its charge. A run that charges per request counts a bio-based disk's bios and
/// charges here (no request carries them), and on a disk with requests sends or counts only
/// the bios that waited (the bios and every charge are counted with their requests).
#[inline(always)]
fn bio_queue(bio: u64) {
    if let Some((mut ev, disk)) = bio_event(bio, kind::BIO_QUEUE) {
        let bio_based = disk_config(disk.slot).bio_based != 0;
        if charges_per_request() && !bio_based {
            note_queued(&mut ev, &disk);
            if ev.flags & flags::THROTTLE_RELEASED != 0 {
                ev.aux |= bio_aux::RELEASE_ONLY;
                // Not a charge: it joins no run, so it has its own time.
                ev.ts_ns = now();
                emit(&ev, disk.slot);
            }
            return;
        }
        if bio_based {
            ev.aux |= bio_aux::BIO_BASED;
        }
        ev.flags |= rule_flags(bio, ev.op);
        if charges_per_request() {
            note_rules(&disk, ev.dev, ev.flags);
        }
        note_queued(&mut ev, &disk);
        emit_charge(&mut ev, disk.slot);
    }
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue(ctx: BtfTracePointContext) -> u32 {
    bio_queue(ctx.arg(0));
    0
}

/// Up to 5.10: `block_bio_queue(q, bio)`.
#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue_q(ctx: BtfTracePointContext) -> u32 {
    bio_queue(ctx.arg(1));
    0
}

/// `split` is the front piece; the original bio becomes the remainder (`split->bi_private`)
/// and re-enters the throttle, where it is charged again (6.0+).
#[inline(always)]
fn split(split: u64, new_sector: u64) {
    if let Some((mut ev, disk)) = bio_event(split, kind::SPLIT) {
        ev.aux = new_sector as u32;
        let remainder: u64 = read(split, off!(bio_bi_private));
        ev.aux64 = remainder;
        // Up to 5.19 a split remainder passed blk-throttle already (`BIO_THROTTLED`): it is
        // not charged again.
        if off!(remainders_charged) != 0 {
            // As a value the verifier does not know: each of the group lookup's exits would
            // otherwise have the rest checked again (~10,000 instructions on 6.1).
            ev.flags |= forget(rule_flags(split, ev.op) as u64) as u8;
        }
        if off!(bio_bps_throttled_bit) != NONE && bps_charged(remainder) {
            ev.flags |= flags::BPS_CHARGED;
        }
        note_split(&mut ev, remainder, &disk);
        // The front piece goes on to a request of its own (`REQ_NOMERGE`): its issue is one
        // more piece of a bio already counted.
        let key = split;
        if SPLIT_PIECES.insert(&key, &1, 0).is_ok() {
            pending_add(disk, Pending::SplitPieces, 1);
        }
        emit(&ev, disk.slot);
    }
}

/// `block_split(split, new_sector)`.
#[btf_tracepoint(function = "block_split")]
pub fn block_split(ctx: BtfTracePointContext) -> u32 {
    split(ctx.arg(0), ctx.arg(1));
    0
}

/// Up to 5.10: `block_split(q, split, new_sector)`.
#[btf_tracepoint(function = "block_split")]
pub fn block_split_q(ctx: BtfTracePointContext) -> u32 {
    split(ctx.arg(1), ctx.arg(2));
    0
}

/// Which mechanism merged `bio` (at `block_bio_back/frontmerge`, before the request grows).
/// A plug merge joins the request `blk_attempt_plug_merge` tries first, and only one the bio
/// touches: if that request of the task's plug ends where the bio starts (a back merge) or
/// starts where it ends (a front merge), the plug merged it. Otherwise the queue's scheduler
/// did (`blk_mq_sched_try_merge`), or its software queues (`blk_bio_list_merge`) where there
/// is no scheduler or it is kyber. Two requests touching the bio at the same end would need
/// overlapping I/O in flight; there the plug is named. A plug holding requests of another
/// queue first falls back to the kernel stack.
#[inline(always)]
fn merge_path_from_plug(ctx: &BtfTracePointContext, bio: u64, rq: u64, back: bool) -> u8 {
    let q: u64 = read(bio_disk(bio), off!(disk_queue));
    let bio_start: u64 = read(bio, off!(bio_bi_sector));
    let bio_bytes: u32 = read(bio, off!(bio_bi_size));
    let touches = |rq_start: u64, rq_bytes: u32| {
        if back {
            rq_start + (rq_bytes >> 9) as u64 == bio_start
        } else {
            bio_start + (bio_bytes >> 9) as u64 == rq_start
        }
    };
    if off!(plug_list_head) != 0 {
        // Up to 5.15 the plug is a list the merge walks from its newest request. 5.10's
        // tracepoint names the request the bio joins: look for it in the plug (5.11-5.15's
        // does not: the stack tells).
        if rq == 0 {
            return merge_path_from_stack(ctx);
        }
        if in_plug_list(rq) {
            return path::PLUG;
        }
    } else {
        let task = unsafe { bpf_get_current_task_btf() } as u64;
        let plug: u64 = read(task, off!(task_plug));
        let candidate: u64 = read(plug, off!(plug_candidate));
        if candidate != 0 {
            if read::<u64>(candidate, off!(rq_q)) != q {
                return merge_path_from_stack(ctx);
            }
            if touches(
                read(candidate, off!(rq_sector)),
                read(candidate, off!(rq_data_len)),
            ) {
                return path::PLUG;
            }
        }
    }
    let elevator: u64 = read(q, off!(q_elevator));
    if elevator == 0 || elevator_is_kyber(elevator) {
        path::SW_QUEUE
    } else {
        path::ELEVATOR
    }
}

/// How many requests of a plug list (up to 5.15) are looked through; a plug flushes at 32
/// (64 across several queues).
const PLUG_WALK: u32 = 64;

/// Whether `rq` is in the current task's plug list (`struct list_head`, up to 5.15). The
/// task is read without BTF there (`bpf_get_current_task_btf` came in 5.11), so probe reads.
#[inline(always)]
fn in_plug_list(rq: u64) -> bool {
    if rq == 0 {
        return false;
    }
    let task = unsafe { bpf_get_current_task() };
    let plug: u64 = read_probe(task, off!(task_plug));
    if plug == 0 {
        return false;
    }
    let head = plug + off!(plug_candidate) as u64 - 8; // &plug->mq_list (candidate is .prev)
    let target = rq + off!(rq_queuelist) as u64;
    let mut link: u64 = read_probe(plug, off!(plug_candidate));
    let mut i = 0;
    while i < PLUG_WALK {
        if link == 0 || link == head {
            return false;
        }
        if link == target {
            return true;
        }
        link = read_probe(link, 8); // list_head.prev: towards older requests
        i += 1;
    }
    false
}

/// Which merge caller is on the kernel stack: the first frame inside one of the
/// `merge_callers` ranges decides. `path::UNKNOWN` if none (or no ranges were given).
#[inline(always)]
fn merge_path_from_stack<C: EbpfContext>(ctx: &C) -> u8 {
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
    let callers = frozen!(SYMBOLS.merge_callers);
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
    // A diagnostic behind MERGETRACE_EBPF_LOG: the frames say which caller is missing from
    // the merge-path table (look them up in /proc/kallsyms).
    aya_log_ebpf::warn!(
        ctx,
        "merge from an unrecognised caller: {:x} {:x} {:x} {:x}",
        stack[1],
        stack[2],
        stack[3],
        stack[4]
    );
    path::UNKNOWN
}

/// `bio` merged into a request (`rq`, where the tracepoint names it: 5.10), on some path.
#[inline(always)]
fn bio_merge(ctx: &BtfTracePointContext, bio: u64, rq: u64, kind: u8) {
    if let Some((mut ev, disk)) = bio_event(bio, kind) {
        ev.path = if frozen!(MODES.merge_path_from_stack) != 0 {
            merge_path_from_stack(ctx)
        } else {
            merge_path_from_plug(ctx, bio, rq, kind == kind::BACK_MERGE)
        };
        mark_released(&mut ev, &disk);
        charge_iocost(&mut ev, &disk);
        emit(&ev, disk.slot);
    }
}

/// io.cost's charge of a bio that starts a request (getrq) or merges, on a disk with io.cost
/// on: marks the event `IOCOST` (and random, on getrq) and moves the cgroup's cursor as
/// `ioc_rqos_throttle` / `ioc_rqos_merge` do. Only reads and writes are charged, and empty
/// bios only where the kernel charges them. (The root cgroup is never charged: user space
/// leaves it out.)
#[inline(always)]
fn charge_iocost(ev: &mut Event, disk: &Disk) {
    let rule = disk_config(disk.slot).iocost;
    if rule & iocost::ENABLED == 0 || ev.op > 1 {
        return;
    }
    if ev.bytes == 0 && rule & iocost::EMPTY_CHARGED == 0 {
        return;
    }
    ev.flags |= flags::IOCOST;
    if ev.kind == kind::FRONT_MERGE {
        return;
    }
    let key = CursorKey {
        cgroup_id: ev.cgroup_id,
        dev: ev.dev as u64,
    };
    let cursor = unsafe { IOCOST_CURSOR.get(&key) }.copied().unwrap_or(0);
    let next = if ev.kind == kind::GETRQ {
        let (random, next) = iocost::start(cursor, ev.sector, ev.bytes);
        ev.path = random as u8;
        next
    } else {
        iocost::back_merge(cursor, ev.sector, ev.bytes)
    };
    if next != cursor {
        let _ = IOCOST_CURSOR.insert(&key, &next, 0);
    }
}

#[btf_tracepoint(function = "block_bio_backmerge")]
pub fn block_bio_backmerge(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, ctx.arg(0), 0, kind::BACK_MERGE);
    0
}

#[btf_tracepoint(function = "block_bio_frontmerge")]
pub fn block_bio_frontmerge(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, ctx.arg(0), 0, kind::FRONT_MERGE);
    0
}

/// Up to 5.10: `block_bio_backmerge(q, rq, bio)`.
#[btf_tracepoint(function = "block_bio_backmerge")]
pub fn block_bio_backmerge_q(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, ctx.arg(2), ctx.arg(1), kind::BACK_MERGE);
    0
}

/// Up to 5.10: `block_bio_frontmerge(q, rq, bio)`.
#[btf_tracepoint(function = "block_bio_frontmerge")]
pub fn block_bio_frontmerge_q(ctx: BtfTracePointContext) -> u32 {
    bio_merge(&ctx, ctx.arg(2), ctx.arg(1), kind::FRONT_MERGE);
    0
}

/// Whether wbt throttles a bio of this op (`wbt_should_throttle`): discards, and writes
/// other than O_DIRECT ones (those carry both `REQ_SYNC` and `REQ_IDLE`).
#[inline(always)]
fn wbt_class(bio: u64, op: u8) -> bool {
    let mask = off!(req_sync_idle_mask);
    match op {
        1 => read::<u32>(bio, off!(bio_bi_opf)) & mask != mask,
        3 => true,
        _ => false,
    }
}

/// A bio starts a new request. Its request's bios and merges are counted by the request
/// programs; here what only the bio tells: a data-less flush write (completed without a
/// write request), wbt's class, io.cost's charge. Counting, a read tells none of it unless
/// io.cost is on for a traced disk (the gate's bit): two loads and out (a capture sends it:
/// lineage links bios to requests).
#[inline(always)]
fn getrq(bio: u64) {
    // Whether the gate is open is asked past the reads' early way out (in `bio_event`): that
    // way out does nothing the gate guards against.
    if bio == 0 || !offsets_ready() {
        return;
    }
    let op = (read::<u32>(bio, off!(bio_bi_opf)) & 0xff) as u8;
    // Only a full capture (lineage: which bio started which request) or io.cost needs a
    // read's new request.
    if dir_of_op(op) == mergetrace_common::count::dir::READ
        && gate_bits() & gate::IOCOST == 0
        && (!emitting() || frozen!(MODES.requests_only) != 0)
    {
        // Where a queue does not name its disk (up to 5.15), a plug flush is told by the
        // queue learned from the disk's bios: a new request is the first a counting run sees
        // of a plugged one, before its flush.
        if off!(q_disk) == NONE {
            let disk_ptr = bio_disk(bio);
            if let Some(disk) = traced(disk_dev(disk_ptr)) {
                learn_queue(&disk, disk_ptr);
            }
        }
        return;
    }
    if let Some((mut ev, disk)) = bio_event(bio, kind::GETRQ) {
        if wbt_class(bio, ev.op) {
            ev.aux |= getrq_aux::WBT_CLASS;
        }
        mark_released(&mut ev, &disk);
        if ev.flags & flags::FLUSH_SEQ != 0 {
            // This request starts a flush sequence: the flush request the flush machinery
            // issues for it (without a bio) is counted for this cgroup.
            unsafe { (*disk.state).flush_cgroup = ev.cgroup_id };
            // A data-less flush write never reaches a request's issue, where a counting run
            // charges bios: its charge is counted here.
            if charges_per_request() && ev.op == 1 && ev.bytes == 0 {
                let rules = forget(rule_flags(bio, ev.op) as u64) as u8;
                ev.flags |= rules;
                note_rules(&disk, ev.dev, rules);
            }
        }
        charge_iocost(&mut ev, &disk);
        emit(&ev, disk.slot);
    }
}

#[btf_tracepoint(function = "block_getrq")]
pub fn block_getrq(ctx: BtfTracePointContext) -> u32 {
    getrq(ctx.arg(0));
    0
}

/// Up to 5.10: `block_getrq(q, bio, rw)`.
#[btf_tracepoint(function = "block_getrq")]
pub fn block_getrq_q(ctx: BtfTracePointContext) -> u32 {
    getrq(ctx.arg(1));
    0
}
