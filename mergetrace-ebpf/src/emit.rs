//! An event's way out: counted in this CPU's counters with the counting rule user space also
//! applies to captures (`mergetrace_common::count`), and/or sent to user space.
use core::{
    mem::size_of,
    ptr::{read_volatile, write_volatile},
    sync::atomic::{compiler_fence, Ordering},
};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    maps::{PerCpuArray, PerCpuHashMap},
    programs::RawTracePointContext,
};
use mergetrace_common::{
    charge_run_index, flags, kind, unplug_slot, CountKey, Counters, Event, Staged, CHARGE_RUNS,
    LOST_COUNTS_FULL, STAGED_EVENTS, STAGED_MAX_AGE_NS, UNATTRIBUTED_CGROUP,
};

use crate::{
    maps::{
        frozen, COUNTERS, COUNTS, EVENTS, LOST, METER_UNITS, RING_WAKE_BYTES, SENT_SINCE_WAKE,
        STAGED_SINCE, STAGING, UNATTRIBUTED, UNPLUGS, ZERO,
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

/// `record --requests` sends a bio's blk-throttle charge as part of a run ([`emit_charge`]).
#[inline(always)]
pub fn charge_runs() -> bool {
    emitting() && frozen!(MODES.requests_only) != 0 && frozen!(MODES.staged) != 0
}

/// The time of a new event of `kind`: [`now`], but none yet for a charge that may join a run
/// ([`emit_charge`] reads the clock when it starts one).
#[inline(always)]
pub fn now_for(kind: u8) -> u64 {
    if kind::is_charge(kind) && charge_runs() {
        0
    } else {
        now()
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

/// As [`emit`], for a bio's blk-throttle charge (`block_bio_queue`; on the fentry tier
/// `__blk_throtl_bio`'s exit), whose time [`now_for`] left to this function. In
/// `record --requests`, where the charges are the only per-bio events, this CPU gathers like
/// charges (same kind, cgroup, disk, op, flags, aux and path) into an open run of their kind
/// ([`Staged::runs`], [`Event::run_len`]) while its other events go on into the batch. A
/// charge unlike the run ends it, and so does sending the batch (full, ~10 ms old, or flushed
/// by user space when the CPU goes quiet): the run then joins the batch, timed as it ends, so
/// each CPU's events stay in time order. A charge reads no clock.
#[inline(always)]
pub fn emit_charge(ev: &mut Event, disk: u32) {
    if !charge_runs() {
        emit(ev, disk);
        return;
    }
    if counting() {
        count(ev, slot::of(&key_of(ev)));
    }
    if let Some(batch) = STAGING.get_ptr_mut(0) {
        // Not through `holding`: its closure would become a BPF function of its own here.
        if take(batch) {
            let b = unsafe { &mut *batch };
            let r = charge_run_index(ev.kind);
            if !join_run(&mut b.runs[r], ev) {
                if b.runs[r].kind != 0 {
                    // Closed before it is staged: staging may send the batch, which ends the
                    // runs still open.
                    let ended = end_run(b, r, unsafe { bpf_ktime_get_ns() });
                    stage_held(b, &ended, unsafe { bpf_get_smp_processor_id() });
                }
                b.runs[r] = *ev;
                if b.len == 0 && b.first_ts == 0 {
                    // User space flushes a quiet CPU's batch by its age: the run's counts.
                    let t = unsafe { bpf_ktime_get_ns() };
                    b.first_ts = t;
                    set_staged_since(t);
                }
            }
            give_back(batch);
            return;
        }
    }
    // A program this one interrupted is writing the batch: on its own.
    ev.ts_ns = unsafe { bpf_ktime_get_ns() };
    send(ev);
}

/// Adds the charge `ev` to the open run `run` if it is one like it.
#[inline(always)]
fn join_run(run: &mut Event, ev: &Event) -> bool {
    if run.kind != ev.kind
        || run.cgroup_id != ev.cgroup_id
        || run.dev != ev.dev
        || run.op != ev.op
        || run.flags != ev.flags
        || run.aux != ev.aux
        || run.path != ev.path
    {
        return false;
    }
    let Some(bytes) = run.bytes.checked_add(ev.bytes) else {
        return false;
    };
    run.bytes = bytes;
    run.aux64 += 1;
    true
}

/// A run that counts in the kernel (live view, exporter).
#[inline(always)]
fn counting() -> bool {
    frozen!(MODES.aggregate) != 0
}

/// A run that charges bios per request, at their request's issue (counting runs, and the
/// request-level capture): blk-throttle's rules asked once per request, on every disk, so a
/// limit counts from its first request whenever it was set. A full capture sends every bio
/// with its own charge instead.
#[inline(always)]
pub fn charges_per_request() -> bool {
    counting() || frozen!(MODES.requests_only) != 0
}

/// Sends the event to user space on this CPU's ring, in a run that sends events (every
/// possible CPU has one; without it the event counts as lost): through the CPU's batch
/// where batches are on, else (or when the batch is being written by the program this one
/// interrupted) on its own.
#[inline(always)]
fn send(ev: &Event) {
    if !emitting() {
        return;
    }
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if frozen!(MODES.staged) != 0 {
        if let Some(batch) = STAGING.get_ptr_mut(0) {
            if stage(batch, ev, cpu) {
                return;
            }
        }
    }
    let Some(ring) = EVENTS.get(cpu) else {
        count_lost(ev.kind as u32);
        return;
    };
    match ring.reserve(0) {
        Some(mut entry) => {
            entry.write(*ev);
            entry.submit(wake_flag(ENTRY));
        }
        None => count_lost(ev.kind as u32),
    }
}

/// A ring entry of one event: the event and the ring's 8-byte record header.
const ENTRY: u64 = size_of::<Event>() as u64 + 8;

/// Adds `ev` to this CPU's batch, and sends the batch once it is full or its first event
/// [`STAGED_MAX_AGE_NS`] old. A reservation on the ring costs about as much as the rest of
/// sending an event; a batch pays one for 64 events. False, with nothing done, while a
/// program this one interrupted is writing the batch.
#[inline(always)]
fn stage(batch: *mut Staged, ev: &Event, cpu: u32) -> bool {
    holding(batch, |b| stage_held(b, ev, cpu))
}

/// [`stage`]'s work, for a caller that holds the batch.
#[inline(always)]
fn stage_held(b: &mut Staged, ev: &Event, cpu: u32) {
    let len = b.len as usize;
    if len >= STAGED_EVENTS {
        // Never: a full batch is sent at once. Counted, should it happen.
        count_lost(ev.kind as u32);
        return;
    }
    if len == 0 {
        b.first_ts = ev.ts_ns;
        set_staged_since(ev.ts_ns);
    }
    b.events[len] = *ev;
    b.len = len as u32 + 1;
    if len + 1 == STAGED_EVENTS || ev.ts_ns.saturating_sub(b.first_ts) >= STAGED_MAX_AGE_NS {
        send_batch(b, cpu);
    }
}

/// Runs `f` on this CPU's batch, marked busy meanwhile; false, without running it, when a
/// program this one interrupted is in the middle of its own `f` (on the same CPU: the map is
/// per CPU; it goes on once this program returns).
#[inline(always)]
fn holding(batch: *mut Staged, f: impl FnOnce(&mut Staged)) -> bool {
    if !take(batch) {
        return false;
    }
    f(unsafe { &mut *batch });
    give_back(batch);
    true
}

/// Marks this CPU's batch busy; false, with nothing done, when it is already (see
/// [`holding`]).
#[inline(always)]
fn take(batch: *mut Staged) -> bool {
    unsafe {
        if read_volatile(&raw const (*batch).busy) != 0 {
            return false;
        }
        write_volatile(&raw mut (*batch).busy, 1);
    }
    compiler_fence(Ordering::SeqCst);
    true
}

/// Ends [`take`].
#[inline(always)]
fn give_back(batch: *mut Staged) {
    compiler_fence(Ordering::SeqCst);
    unsafe { write_volatile(&raw mut (*batch).busy, 0) };
}

/// Sends this CPU's batch to its ring as one record and empties it; its events count as
/// lost, each under its kind, when the ring has no room. The caller holds the batch
/// (`busy`). One copy for every program that sends (not inlined into each).
#[inline(never)]
fn send_batch(b: &mut Staged, cpu: u32) {
    // Open runs of charges end here, timed now; those that do not fit start the next batch.
    let now = if b.runs.iter().any(|r| r.kind != 0) {
        unsafe { bpf_ktime_get_ns() }
    } else {
        0
    };
    end_runs(b, now);
    let len = b.len as usize;
    if len == 0 || len > STAGED_EVENTS {
        return;
    }
    let events = unsafe { core::slice::from_raw_parts(b.events.as_ptr(), len) };
    let bytes = (len * size_of::<Event>()) as u64 + 8;
    let sent = match EVENTS.get(cpu) {
        Some(ring) => ring
            .output_untyped::<[Event]>(events, wake_flag(bytes))
            .is_ok(),
        None => false,
    };
    if !sent {
        for i in 0..STAGED_EVENTS {
            if i >= len {
                break;
            }
            // A run of charges loses each of its bios.
            let ev = &b.events[i];
            count_lost_n(ev.kind as u32, ev.run_len());
        }
    }
    b.len = 0;
    b.first_ts = 0;
    set_staged_since(0);
    end_runs(b, now);
    if b.len > 0 {
        b.first_ts = now;
        set_staged_since(now);
    }
}

/// Moves the open runs of charges into the batch while it has room, at time `now`.
#[inline(always)]
fn end_runs(b: &mut Staged, now: u64) {
    for r in 0..CHARGE_RUNS {
        if b.runs[r].kind == 0 {
            continue;
        }
        let len = b.len as usize;
        if len >= STAGED_EVENTS {
            return;
        }
        b.events[len] = end_run(b, r, now);
        b.len = len as u32 + 1;
    }
}

/// Closes the open run `r` and returns its event, timed `now`. Through the stack: a copy
/// straight into the batch would be a memmove, a byte loop the verifier cannot bound.
#[inline(always)]
fn end_run(b: &mut Staged, r: usize, now: u64) -> Event {
    let mut ended = unsafe { read_volatile(&raw const b.runs[r]) };
    ended.ts_ns = now;
    b.runs[r].kind = 0;
    ended
}

/// This CPU's `STAGED_SINCE`: its batch's first `ts_ns`, or 0 once sent.
#[inline(always)]
fn set_staged_since(ts_ns: u64) {
    if let Some(since) = STAGED_SINCE.get_ptr_mut(0) {
        unsafe { write_volatile(since, ts_ns) };
    }
}

/// Sends the batch of the CPU it runs on, unless a program there is writing it (then its
/// next event, or user space's next try, sends it). User space runs it on a CPU whose batch
/// has waited too long with no event after it (`BPF_PROG_TEST_RUN` on that CPU), and never
/// attaches it.
#[raw_tracepoint]
pub fn flush_staged(_ctx: RawTracePointContext) -> u32 {
    if let Some(batch) = STAGING.get_ptr_mut(0) {
        let cpu = unsafe { bpf_get_smp_processor_id() };
        holding(batch, |b| send_batch(b, cpu));
    }
    0
}

/// The ring's flag for a record of `bytes` (see [`woke_due`]).
#[inline(always)]
fn wake_flag(bytes: u64) -> u64 {
    if woke_due(bytes) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Batched wake-ups: whether a record of `bytes` (an event or a batch of them, with the
/// ring's header) should wake the reader, once a good amount is waiting (it also polls on a
/// short timer), instead of once per record. Counted per CPU rather than
/// asked of the ring: `bpf_ringbuf_query` is a helper call, ~30 ns on every event here. The
/// count does not see what the reader took on its timer, so a wake-up can come sooner than
/// needed; it wakes once per `RING_WAKE_BYTES` sent at most, as before.
#[inline(always)]
fn woke_due(bytes: u64) -> bool {
    let Some(sent) = SENT_SINCE_WAKE.get_ptr_mut(0) else {
        return true;
    };
    let wake = unsafe { core::ptr::read_volatile(&raw const RING_WAKE_BYTES) };
    let now = unsafe { *sent } + bytes;
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
/// to captures: in its key's `slot`, or without one in the `COUNTS` hash map, or, that full,
/// in its disk's unattributed counters.
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

/// The key's counters in the `COUNTS` hash map, inserted when new; when it is full, its
/// disk's and direction's in `UNATTRIBUTED` (counted lost only when that is full too).
#[inline(always)]
fn hashed_counters(key: &CountKey) -> Option<*mut Counters> {
    if let Some(c) = entry_or_inserted(&COUNTS, key, &ZERO) {
        return Some(c);
    }
    let unattributed = CountKey {
        cgroup_id: UNATTRIBUTED_CGROUP,
        ..*key
    };
    hashed_entry(&UNATTRIBUTED, &unattributed, &ZERO, LOST_COUNTS_FULL)
}

/// This CPU's value of `key` in `map`, inserted from `zero` when new; counted under `lost`
/// when the map is full.
#[inline(always)]
pub fn hashed_entry<V>(
    map: &PerCpuHashMap<CountKey, V>,
    key: &CountKey,
    zero: &PerCpuArray<V>,
    lost: u32,
) -> Option<*mut V> {
    let v = entry_or_inserted(map, key, zero);
    if v.is_none() {
        count_lost(lost);
    }
    v
}

/// This CPU's value of `key` in `map`, inserted from `zero` when new; None when the map is
/// full. The insert never replaces an entry: since the lookup that missed, a program in
/// interrupt context on this CPU (a completion) may have inserted the key and counted in it,
/// and an update of an existing per-CPU entry would overwrite this CPU's value with the zeros.
#[inline(always)]
fn entry_or_inserted<V>(
    map: &PerCpuHashMap<CountKey, V>,
    key: &CountKey,
    zero: &PerCpuArray<V>,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, zero.get(0)?, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

#[inline(always)]
pub fn count_lost(slot: u32) {
    count_lost_n(slot, 1);
}

#[inline(always)]
fn count_lost_n(slot: u32, n: u64) {
    if let Some(lost) = LOST.get_ptr_mut(slot) {
        unsafe { *lost += n };
    }
}
