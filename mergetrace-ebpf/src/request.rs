//! Programs on the request tracepoints: a request absorbed by another, inserted, issued
//! (once, however often requeued), handed back by the driver, completed; and plug flushes.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use mergetrace_common::{flags, kind, Event, MAX_CHAIN};

use crate::{
    emit::{emit, now},
    maps::{off, REQUEUED},
    read::{blkg_cgroup_id, disk_dev, forget, queue_disk, read, ready, rq_disk, traced, Disk},
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

/// The common part of every request event and its disk; `None` if the disk is not traced.
#[inline(always)]
fn rq_event(rq: u64, kind: u8) -> Option<(Event, Disk)> {
    if rq == 0 || !ready() {
        return None;
    }
    let dev = disk_dev(rq_disk(rq));
    let disk = traced(dev)?;
    let cmd_flags: u32 = read(rq, off!(rq_cmd_flags));
    // A request never mixes cgroups (blk_cgroup_mergeable), so its first bio tells its cgroup.
    let first_bio: u64 = read(rq, off!(rq_bio));
    let cgroup_id = if first_bio != 0 {
        blkg_cgroup_id(read(first_bio, off!(bio_bi_blkg)))
    } else {
        // A flush request carries no bio: it is the flush of the cgroup that asked last.
        unsafe { (*disk.state).flush_cgroup }
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
    Some((ev, disk))
}

fn rq_simple(ctx: &BtfTracePointContext, kind: u8) {
    if let Some((ev, disk)) = rq_event(ctx.arg(0), kind) {
        emit(&ev, disk.slot);
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
    if let Some((mut ev, disk)) = rq_event(ctx.arg(0), kind::RQ_ISSUE) {
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
        if reissued(ctx.arg(0), disk) {
            ev.flags |= flags::REISSUE;
        }
        emit(&ev, disk.slot);
    }
    0
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
    if let Some((ev, disk)) = rq_event(ctx.arg(0), kind::RQ_REQUEUE) {
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
    let error: u64 = ctx.arg(1);
    let nr_bytes: u64 = ctx.arg(2);
    if let Some((mut ev, disk)) = rq_event(ctx.arg(0), kind::RQ_COMPLETE) {
        ev.path = error as u8;
        ev.aux = nr_bytes as u32;
        emit(&ev, disk.slot);
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
