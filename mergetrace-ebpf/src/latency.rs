//! `--latency`: each request's queue latency (created → first issued) at its issue and device
//! latency (last issue → completed) at its completion, counted in the histograms of its
//! (cgroup, disk, direction), apart for requests that carried merged bios. Only in runs that
//! ask (`MODES.latency`).
//!
//! The histograms are kept as the counters are: in `LATENCY` at the key's counter slot, found
//! by the slot lookup the request's counters make anyway (`slot::of`); a key without a slot in
//! the `LATENCY_HASHED` hash map, until user space gives it one.
//!
//! The issue's time waits for the completion in `ISSUE_SLOTS`, at the request's (disk,
//! hardware queue, driver tag): the kernel gives a tag to one request in flight at a time, so
//! an array index replaces a hash update at each end (on 4 KiB random reads an LRU hash map
//! cost ~240 ns at the issue and ~215 at the completion). Beyond the array's queues and tags,
//! the LRU map `ISSUED_AT`.
use aya_ebpf::helpers::bpf_ktime_get_ns;
use mergetrace_common::{
    latency::{
        lat_bucket, IssuedAt, LatencyHist, ISSUE_QUEUES, ISSUE_SLOTS_PER_DISK, ISSUE_TAGS, MERGED,
        SINGLE,
    },
    CountKey, Event, FROZEN_DISKS, LOST_COMPLETION_UNSEEN, LOST_LATENCY_FULL,
};

use crate::{
    emit::{count_lost, hashed_entry},
    maps::{frozen, off, ISSUED_AT, ISSUE_SLOTS, LATENCY, LATENCY_HASHED, LATENCY_ZERO},
    read::{forget, read, Disk},
    slot::{self, key_of},
};

/// Whether this run counts latency.
#[inline(always)]
pub fn wanted() -> bool {
    frozen!(MODES.latency) != 0
}

/// The request's index in `ISSUE_SLOTS`, if its disk is among the first
/// [`mergetrace_common::FROZEN_DISKS`] slots and its hardware queue and tag fit. Under a scheduler
/// its scheduler tag: it keeps it from allocation to end, through a requeue (which gives the
/// driver tag back), so each request has one entry and each entry one request memory.
#[inline(always)]
fn issue_index(rq: u64, disk: Disk) -> Option<u32> {
    let sched_tag: i32 = read(rq, off!(rq_internal_tag));
    let tag: i32 = if sched_tag >= 0 {
        sched_tag
    } else {
        read(rq, off!(rq_tag))
    };
    let queue: u32 = read(read::<u64>(rq, off!(rq_mq_hctx)), off!(hctx_queue_num));
    // The first disks' requests have array entries; those of more disks go to the hash map.
    if tag < 0
        || tag as u32 >= ISSUE_TAGS
        || queue >= ISSUE_QUEUES
        || disk.slot >= FROZEN_DISKS as u32
    {
        return None;
    }
    Some(disk.slot * ISSUE_SLOTS_PER_DISK + queue * ISSUE_TAGS + tag as u32)
}

/// At a request's issue (`ev` the issue event, `bios` its chain, `slot` its key's counter
/// slot): its queue latency on its first issue, and the issue's time for its completion.
#[inline(always)]
pub fn issued(rq: u64, ev: &Event, bios: u32, reissue: bool, disk: Disk, slot: Option<u32>) {
    let now = unsafe { bpf_ktime_get_ns() };
    let class = if bios > 1 { MERGED } else { SINGLE };
    if !reissue {
        // Where the kernel keeps no request times (no I/O statistics, no scheduler), 0.
        let created: u64 = read(rq, off!(rq_start_time_ns));
        if created != 0 {
            if let Some(h) = hist(&key_of(ev), slot) {
                let ns = now.saturating_sub(created);
                unsafe { (*h).queue_ns[class & 1] += ns };
                if let Some(n) = unsafe { (*h).queue[class & 1].get_mut(bucket(ns)) } {
                    *n += 1;
                }
            }
        }
    }
    let at = IssuedAt {
        ts_ns: now,
        rq,
        cgroup_id: ev.cgroup_id,
        class: class as u32,
        _pad: 0,
    };
    match issue_index(rq, disk).and_then(|i| ISSUE_SLOTS.get_ptr_mut(i)) {
        Some(entry) => unsafe {
            if !reissue {
                count_unseen(rq, (*entry).rq);
            }
            *entry = at
        },
        None => {
            let _ = ISSUED_AT.insert(&rq, &at, 0);
        }
    }
}

/// At a request's first issue, before it takes its entry: the entry's request memory is this
/// one (see `issue_index`), so if it is still there, the request it held last was issued and
/// ended without the completion program running (the kernel skips eBPF programs now and then;
/// see `LOST_COMPLETION_UNSEEN`): counted lost, never silent. A requeued request keeps its
/// entry and its next issue is a reissue, which does not come here.
#[inline(always)]
fn count_unseen(rq: u64, prev: u64) {
    if prev == rq {
        count_lost(LOST_COMPLETION_UNSEEN);
    }
}

/// At a completion of `nr_bytes` of a request (`ev` the completion event, whose `bytes` are
/// what the request had left; `slot` its key's counter slot): on the final one, its device
/// latency from its last issue.
#[inline(always)]
pub fn completed(rq: u64, ev: &Event, nr_bytes: u64, disk: Disk, slot: Option<u32>) {
    if nr_bytes < ev.bytes as u64 {
        return; // partial: the request goes on
    }
    let at = match issue_index(rq, disk).and_then(|i| ISSUE_SLOTS.get_ptr_mut(i)) {
        Some(entry) => {
            let at = unsafe { *entry };
            // Taken, if it is this request's: an entry is counted once. Another request's
            // stays (a flush request borrows a waiting request's tag; a data request that
            // waited for a post-flush ends again, with no bytes left, after it).
            if at.rq == rq {
                unsafe { (*entry).rq = 0 };
            }
            at
        }
        None => {
            let Some(at) = (unsafe { ISSUED_AT.get(&rq) }).copied() else {
                return;
            };
            let _ = ISSUED_AT.remove(&rq);
            at
        }
    };
    if at.rq != rq {
        return; // issued before the run
    }
    let now = unsafe { bpf_ktime_get_ns() };
    // The issue's cgroup: a flush request's (it has no bio) is told by the disk, which may
    // have moved on since, and then has a slot of its own.
    let key = CountKey {
        cgroup_id: at.cgroup_id,
        ..key_of(ev)
    };
    let slot = if at.cgroup_id == ev.cgroup_id {
        slot
    } else {
        slot::of(&key)
    };
    if let Some(h) = hist(&key, slot) {
        let (ns, class) = (now.saturating_sub(at.ts_ns), at.class as usize & 1);
        unsafe { (*h).device_ns[class] += ns };
        if let Some(n) = unsafe { (*h).device[class].get_mut(bucket(ns)) } {
            *n += 1;
        }
    }
}

/// The histogram bucket of `ns` as a value the verifier does not know (`read::forget`):
/// each outcome of `lat_bucket`'s six halving steps had the rest checked again.
#[inline(always)]
fn bucket(ns: u64) -> usize {
    forget(lat_bucket(ns) as u64) as usize
}

/// This CPU's histograms of `key`: at its counter `slot`, or without one in the hash map
/// (inserted when new; counted lost when it is full, as the counters are).
#[inline(always)]
fn hist(key: &CountKey, slot: Option<u32>) -> Option<*mut LatencyHist> {
    if let Some(h) = slot.and_then(|s| LATENCY.get_ptr_mut(s)) {
        return Some(h);
    }
    hashed_entry(&LATENCY_HASHED, key, &LATENCY_ZERO, LOST_LATENCY_FULL)
}
