//! blk-throttle's dispatch work (`blk_throtl_dispatch_work_fn`), where bios that waited for a
//! limit are released: the tracepoint tier tells a throttled bio by being submitted there.
use aya_ebpf::{
    helpers::bpf_get_current_task, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use mergetrace_common::{flags, Event};

use crate::{
    maps::{frozen, off, DISPATCH},
    read::read,
};

/// What one CPU knows while blk-throttle's dispatch work item runs on it (kthrotld is a
/// per-CPU workqueue: the item runs to its end on one CPU). Every bio its worker submits then
/// was released from the throttle queue, or is a piece of one: a bio's first release shows as
/// its `block_bio_queue`, but a split remainder had that before it waited, so its release
/// shows only as the first split, merge or new request of a bio none of these slots name.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dispatch {
    /// The work item running (0: none).
    work: u64,
    /// The worker task running it. Only its submissions are releases: the item can sleep
    /// (waiting for a request tag on a busy device), and other tasks then submit on this CPU.
    task: u64,
    /// The last bio whose `block_bio_queue` fired in this run (already counted as released).
    queued: u64,
    /// The remainder of the last split in this run: resubmitted in this same run when it
    /// passes the throttle at once, so not released again.
    remainder: u64,
    /// The front piece of that split: a new bio, not a released one.
    front: u64,
}

/// This CPU's dispatch state while blk-throttle's dispatch work runs on it and the current
/// task is its worker, else `None`.
#[inline(always)]
fn throttle_dispatch() -> Option<*mut Dispatch> {
    let d = DISPATCH.get_ptr_mut(0)?;
    if unsafe { (*d).work } == 0 {
        return None;
    }
    (unsafe { (*d).task } == unsafe { bpf_get_current_task() }).then_some(d)
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
pub fn note_queued(ev: &mut Event) {
    if let Some(d) = throttle_dispatch() {
        ev.flags |= flags::THROTTLE_RELEASED;
        unsafe { (*d).queued = ev.id };
    }
}

/// A split in the dispatch work: its remainder may be a released one.
#[inline(always)]
pub fn note_split(ev: &mut Event, remainder: u64) {
    if let Some(d) = throttle_dispatch() {
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
pub fn mark_released(ev: &mut Event) {
    if let Some(d) = throttle_dispatch() {
        if released_remainder(d, ev.id) {
            ev.flags |= flags::THROTTLE_RELEASED;
        }
    }
}

/// Marks the CPU while blk-throttle's dispatch work runs: bios queued then were held back.
/// The mark is the work item's address, so the matching end clears it.
#[btf_tracepoint(function = "workqueue_execute_start")]
pub fn workqueue_execute_start(ctx: BtfTracePointContext) -> u32 {
    let work: u64 = ctx.arg(0);
    let target = frozen!(SYMBOLS.throtl_dispatch_fn);
    if target != 0 && read::<u64>(work, off!(work_func)) == target {
        if let Some(d) = DISPATCH.get_ptr_mut(0) {
            unsafe {
                *d = Dispatch {
                    work,
                    task: bpf_get_current_task(),
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
