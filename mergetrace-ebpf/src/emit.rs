//! An event's way out: counted in this CPU's counters with the counting rule user space also
//! applies to captures (`mergetrace_common::count`), and/or sent to user space.
use aya_ebpf::helpers::bpf_ktime_get_ns;
use mergetrace_common::{
    count::dir_of_op, flags, kind, unplug_slot, CountKey, Counters, Event, SlotRef,
    LOST_COUNTS_FULL,
};

use crate::maps::{
    frozen, COUNTERS, COUNTS, EVENTS, LOST, METER_UNITS, SLOT_CACHE, SLOT_GEN, SLOT_OF, UNPLUGS,
    ZERO,
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
/// Wake the reader when this much is waiting: about 4,600 events.
const WAKEUP_BYTES: u64 = 256 << 10;

/// A run that sends events (capture): only then are timestamps taken.
#[inline(always)]
pub fn emitting() -> bool {
    frozen!(MODES.emit) != 0
}

/// CLOCK_MONOTONIC now when events are sent, else 0 (counting needs no time).
#[inline(always)]
pub fn now() -> u64 {
    if emitting() {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    }
}

/// Hands an event to whatever the run needs: the in-kernel counters, the ring buffer, or both.
/// `disk` is the event's disk slot.
#[inline(always)]
pub fn emit(ev: &Event, disk: u32) {
    if frozen!(MODES.aggregate) != 0 {
        aggregate(ev, disk);
    }
    if emitting() {
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
fn aggregate(ev: &Event, disk: u32) {
    if ev.kind == kind::UNPLUG {
        let slot = unplug_slot(disk, ev.flags & flags::UNPLUG_EXPLICIT != 0, ev.aux);
        if let Some(n) = UNPLUGS.get_ptr_mut(slot) {
            unsafe { *n += 1 };
        }
        return;
    }
    let key = CountKey {
        cgroup_id: ev.cgroup_id,
        dev: ev.dev,
        dir: dir_of_op(ev.op),
    };
    let counters = match slot_counters(&key) {
        Some(c) => c,
        None => match hashed_counters(&key) {
            Some(c) => c,
            None => return,
        },
    };
    // Volatile: the compiler must not fold the build-time zeros of a read-only global.
    let units = unsafe { core::ptr::read_volatile(&raw const METER_UNITS) };
    unsafe { (*counters).count(ev, &units) };
}

/// The key's counters in `COUNTERS`, if user space gave the key a slot: from this CPU's cache
/// when the last event of the direction had the same key, else from `SLOT_OF`.
#[inline(always)]
fn slot_counters(key: &CountKey) -> Option<*mut Counters> {
    let cached = SLOT_CACHE.get_ptr_mut(key.dir & 3)?;
    let mut slot = unsafe { (*cached).slot };
    if unsafe { (*cached).key } != *key || !current(slot) {
        slot = *unsafe { SLOT_OF.get(key) }?;
        if !current(slot) {
            return None;
        }
        unsafe {
            (*cached).key = *key;
            (*cached).slot = slot;
        }
    }
    COUNTERS.get_ptr_mut(slot.slot)
}

/// The slot still belongs to the key it was given for (its generation has not moved on).
#[inline(always)]
fn current(slot: SlotRef) -> bool {
    slot.gen != 0 && SLOT_GEN.get(slot.slot).is_some_and(|g| *g == slot.gen)
}

/// The key's counters in the `COUNTS` hash map, inserted when new.
#[inline(always)]
fn hashed_counters(key: &CountKey) -> Option<*mut Counters> {
    if let Some(c) = COUNTS.get_ptr_mut(key) {
        return Some(c);
    }
    let zero = ZERO.get(0)?;
    if COUNTS.insert(key, zero, 0).is_err() {
        count_lost(LOST_COUNTS_FULL);
        return None;
    }
    COUNTS.get_ptr_mut(key)
}

#[inline(always)]
pub fn count_lost(slot: u32) {
    if let Some(n) = LOST.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
}
