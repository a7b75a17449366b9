//! blk-throttle's dispatch work (`blk_throtl_dispatch_work_fn`), where bios that waited for a
//! limit are released: the tracepoint tier tells a throttled bio by being submitted there.
use aya_ebpf::{
    helpers::bpf_get_current_task, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use mergetrace_common::{flags, Event, LOST_DISPATCH_FULL};

use crate::{
    emit::count_lost,
    maps::{frozen, off, DISPATCH},
    read::{read, read_probe, Disk},
};

/// What one CPU knows of a blk-throttle dispatch work item running on it (kthrotld is a
/// per-CPU workqueue: an item runs to its end on one CPU). Every bio its worker submits then
/// was released from the throttle queue, or is a piece of one: a bio's first release shows as
/// its `block_bio_queue`, but a split remainder had that before it waited, so its release
/// shows only as the first split, merge or new request of a bio none of these slots name.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dispatch {
    /// The work item running (0: none).
    work: u64,
    /// The queue whose held bios it releases: what the worker submits to other disks (a
    /// device-mapper target's bios to the disks below it, in the same call) was not held.
    queue: u64,
    /// The worker task running it (0: a free entry). Only its submissions are releases: the
    /// item can sleep (waiting for a request tag on a busy device), and other tasks then
    /// submit on this CPU.
    task: u64,
    /// The last bio whose `block_bio_queue` fired in this run (already counted as released).
    queued: u64,
    /// The remainder of the last split in this run: resubmitted in this same run when it
    /// passes the throttle at once, so not released again.
    remainder: u64,
    /// The front piece of that split: a new bio, not a released one.
    front: u64,
}

/// How many dispatch work items one CPU follows at once. Each throttled disk has one; while
/// one sleeps for a request tag, the workqueue runs the next disk's item on the same CPU with
/// another worker, so several can be under way. One more than this is counted as lost
/// (`LOST_DISPATCH_FULL`): its releases are not told.
pub const DISPATCH_WORKERS: usize = 8;

/// A CPU's dispatch work items under way, an entry per worker.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dispatching {
    /// Entries in use: 0 keeps every bio's look-up to one load when no item runs.
    active: u64,
    workers: [Dispatch; DISPATCH_WORKERS],
}

/// The entry of the dispatch work item the current task runs on this CPU, if it runs one
/// and releases the bios of `disk`.
#[inline(always)]
fn throttle_dispatch(disk: &Disk) -> Option<*mut Dispatch> {
    let all = DISPATCH.get_ptr_mut(0)?;
    if unsafe { (*all).active } == 0 {
        return None;
    }
    let task = unsafe { bpf_get_current_task() };
    for i in 0..DISPATCH_WORKERS {
        let d = unsafe { &raw mut (*all).workers[i] };
        if unsafe { (*d).task } == task {
            return (unsafe { (*d).queue } == unsafe { (*disk.state).queue }).then_some(d);
        }
    }
    None
}

/// In the dispatch work: whether `bio` is a released split remainder, seen for the first time
/// since its release.
#[inline(always)]
fn released_remainder(d: *mut Dispatch, bio: u64) -> bool {
    let d = unsafe { &*d };
    bio != d.queued && bio != d.remainder && bio != d.front
}

/// `block_bio_queue` in the dispatch work: the bio waited.
#[inline(always)]
pub fn note_queued(ev: &mut Event, disk: &Disk) {
    if let Some(d) = throttle_dispatch(disk) {
        ev.flags |= flags::THROTTLE_RELEASED;
        unsafe { (*d).queued = ev.id };
    }
}

/// A split in the dispatch work: its remainder may be a released one.
#[inline(always)]
pub fn note_split(ev: &mut Event, remainder: u64, disk: &Disk) {
    if let Some(d) = throttle_dispatch(disk) {
        if released_remainder(d, remainder) {
            ev.flags |= flags::THROTTLE_RELEASED;
        }
        unsafe {
            (*d).remainder = remainder;
            (*d).front = ev.id;
        }
    }
}

/// Flags a bio that reached a merge or a new request in the dispatch work as a released
/// split remainder when it is one.
#[inline(always)]
pub fn mark_released(ev: &mut Event, disk: &Disk) {
    if let Some(d) = throttle_dispatch(disk) {
        if released_remainder(d, ev.id) {
            ev.flags |= flags::THROTTLE_RELEASED;
        }
    }
}

/// Notes blk-throttle's dispatch work starting on this CPU: the worker's bios are released
/// ones until the matching end.
#[btf_tracepoint(function = "workqueue_execute_start")]
pub fn workqueue_execute_start(ctx: BtfTracePointContext) -> u32 {
    let work: u64 = ctx.arg(0);
    let target = frozen!(SYMBOLS.throtl_dispatch_fn);
    if target == 0 || read::<u64>(work, off!(work_func)) != target {
        return 0;
    }
    let Some(all) = DISPATCH.get_ptr_mut(0) else {
        return 0;
    };
    let task = unsafe { bpf_get_current_task() };
    // The worker's own entry if its last item's end went unseen (the programs attach one
    // after the other), else a free one.
    let mut entry = DISPATCH_WORKERS;
    for i in 0..DISPATCH_WORKERS {
        let t = unsafe { (*all).workers[i].task };
        if t == task {
            entry = i;
            break;
        }
        if t == 0 && entry == DISPATCH_WORKERS {
            entry = i;
        }
    }
    if entry >= DISPATCH_WORKERS {
        count_lost(LOST_DISPATCH_FULL);
        return 0;
    }
    // container_of(work, struct throtl_data, dispatch_work)->queue
    let queue = read_probe(work - off!(td_dispatch_work) as u64, off!(td_queue));
    unsafe {
        let d = &raw mut (*all).workers[entry];
        if (*d).task == 0 {
            (*all).active += 1;
        }
        *d = Dispatch {
            work,
            queue,
            task,
            queued: 0,
            remainder: 0,
            front: 0,
        };
    }
    0
}

/// `workqueue_execute_end(work, func)`: `func` is a function pointer tp_btf cannot read, so
/// match on the work item's address (and its worker) instead.
#[btf_tracepoint(function = "workqueue_execute_end")]
pub fn workqueue_execute_end(ctx: BtfTracePointContext) -> u32 {
    let work: u64 = ctx.arg(0);
    let Some(all) = DISPATCH.get_ptr_mut(0) else {
        return 0;
    };
    if unsafe { (*all).active } == 0 {
        return 0;
    }
    let task = unsafe { bpf_get_current_task() };
    for i in 0..DISPATCH_WORKERS {
        unsafe {
            let d = &raw mut (*all).workers[i];
            if (*d).task == task && (*d).work == work {
                (*d).task = 0;
                (*d).work = 0;
                (*all).active -= 1;
                break;
            }
        }
    }
    0
}
