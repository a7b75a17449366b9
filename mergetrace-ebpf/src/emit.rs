//! An event's way out: counted in this CPU's counters with the counting rule user space also
//! applies to captures (`mergetrace_common::count`), and/or sent to user space.
use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    maps::{PerCpuArray, PerCpuHashMap},
};
use mergetrace_common::{flags, kind, unplug_slot, CountKey, Counters, Event, LOST_COUNTS_FULL};

use crate::{
    maps::{
        frozen, COUNTERS, COUNTS, EVENTS, LOST, METER_UNITS, RING_WAKE_BYTES, SENT_SINCE_WAKE,
        UNPLUGS, ZERO,
    },
    slot::{self, key_of},
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

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
    if counting() {
        if ev.kind == kind::UNPLUG {
            count_unplug(ev, disk);
        } else {
            count(ev, slot::of(&key_of(ev)));
        }
    }
    send(ev);
}

/// As [`emit`], for a request event whose key's slot the caller has looked up already
/// (`slot::of`), to count its latency in the same slot.
#[inline(always)]
pub fn emit_slotted(ev: &Event, slot: Option<u32>) {
    if counting() {
        count(ev, slot);
    }
    send(ev);
}

/// A run that counts in the kernel (live view, exporter).
#[inline(always)]
fn counting() -> bool {
    frozen!(MODES.aggregate) != 0
}

/// Sends the event to user space on this CPU's ring, in a run that sends events (every
/// possible CPU has one; without it the event counts as lost).
#[inline(always)]
fn send(ev: &Event) {
    if !emitting() {
        return;
    }
    let Some(ring) = EVENTS.get(unsafe { bpf_get_smp_processor_id() }) else {
        count_lost(ev.kind as u32);
        return;
    };
    match ring.reserve(0) {
        Some(mut entry) => {
            entry.write(*ev);
            entry.submit(if woke_due() {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            });
        }
        None => count_lost(ev.kind as u32),
    }
}

/// Batched wake-ups: whether this event should wake the reader, once a good batch is waiting
/// (it also polls on a short timer), instead of once per event. Counted per CPU rather than
/// asked of the ring: `bpf_ringbuf_query` is a helper call, ~30 ns on every event here. The
/// count does not see what the reader took on its timer, so a wake-up can come sooner than
/// needed; it wakes once per `RING_WAKE_BYTES` sent at most, as before.
#[inline(always)]
fn woke_due() -> bool {
    // A ring entry: the event and the ring's 8-byte record header.
    const ENTRY: u64 = core::mem::size_of::<Event>() as u64 + 8;
    let Some(sent) = SENT_SINCE_WAKE.get_ptr_mut(0) else {
        return true;
    };
    let wake = unsafe { core::ptr::read_volatile(&raw const RING_WAKE_BYTES) };
    let now = unsafe { *sent } + ENTRY;
    let due = now >= wake;
    // An interrupt's program on this CPU between the read and the write loses its count:
    // that wake-up comes one event later.
    unsafe { *sent = if due { 0 } else { now } };
    due
}

/// Counts a plug flush by (disk slot, explicit, depth).
#[inline(always)]
fn count_unplug(ev: &Event, disk: u32) {
    let slot = unplug_slot(disk, ev.flags & flags::UNPLUG_EXPLICIT != 0, ev.aux);
    if let Some(n) = UNPLUGS.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
}

/// Counts `ev` (not an unplug) in this CPU's counters, with the same rule user space applies
/// to captures: in its key's `slot`, or without one in the `COUNTS` hash map.
#[inline(always)]
fn count(ev: &Event, slot: Option<u32>) {
    let counters = match slot.and_then(|s| COUNTERS.get_ptr_mut(s)) {
        Some(c) => c,
        None => match hashed_counters(&key_of(ev)) {
            Some(c) => c,
            None => return,
        },
    };
    // Volatile: the compiler must not fold the build-time zeros of a read-only global.
    let units = unsafe { core::ptr::read_volatile(&raw const METER_UNITS) };
    unsafe { (*counters).count(ev, &units) };
}

/// The key's counters in the `COUNTS` hash map, inserted when new.
#[inline(always)]
fn hashed_counters(key: &CountKey) -> Option<*mut Counters> {
    hashed_entry(&COUNTS, key, &ZERO, LOST_COUNTS_FULL)
}

/// This CPU's value of `key` in `map`, inserted from `zero` when new; counted under `lost`
/// when the map is full. The insert never replaces an entry: since the lookup that missed, a
/// program in interrupt context on this CPU (a completion) may have inserted the key and
/// counted in it, and an update of an existing per-CPU entry would overwrite this CPU's value
/// with the zeros.
#[inline(always)]
pub fn hashed_entry<V>(
    map: &PerCpuHashMap<CountKey, V>,
    key: &CountKey,
    zero: &PerCpuArray<V>,
    lost: u32,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, zero.get(0)?, BPF_NOEXIST as u64);
    let v = map.get_ptr_mut(key);
    if v.is_none() {
        count_lost(lost);
    }
    v
}

#[inline(always)]
pub fn count_lost(slot: u32) {
    if let Some(n) = LOST.get_ptr_mut(slot) {
        unsafe { *n += 1 };
    }
}
