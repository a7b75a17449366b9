//! `--latency`: each request's queue latency (created → first issued) at its issue and device
//! latency (last issue → completed) at its completion, counted in the `LATENCY` histograms of
//! its (cgroup, disk, direction), apart for requests that carried merged bios. One hash
//! lookup per request at each end, and only in runs that ask (`MODES.latency`).
use aya_ebpf::helpers::bpf_ktime_get_ns;
use mergetrace_common::{
    count::dir_of_op,
    latency::{lat_bucket, IssuedAt, LatencyHist, MERGED, SINGLE},
    CountKey, Event, LOST_LATENCY_FULL,
};

use crate::{
    emit::count_lost,
    maps::{frozen, off, ISSUED_AT, LATENCY, LATENCY_ZERO},
    read::read,
};

/// Whether this run counts latency.
#[inline(always)]
pub fn wanted() -> bool {
    frozen!(MODES.latency) != 0
}

/// At a request's issue (`ev` the issue event, `bios` its chain): its queue latency on its
/// first issue, and the issue's time for its completion.
#[inline(always)]
pub fn issued(rq: u64, ev: &Event, bios: u32, reissue: bool) {
    let now = unsafe { bpf_ktime_get_ns() };
    let class = if bios > 1 { MERGED } else { SINGLE };
    // Where the kernel keeps no request times (no I/O statistics, no scheduler), 0.
    let created: u64 = read(rq, off!(rq_start_time_ns));
    if !reissue && created != 0 {
        if let Some(h) = hist(ev.cgroup_id, ev) {
            let ns = now.saturating_sub(created);
            unsafe { (*h).queue_ns[class & 1] += ns };
            if let Some(n) = unsafe { (*h).queue[class & 1].get_mut(lat_bucket(ns)) } {
                *n += 1;
            }
        }
    }
    let at = IssuedAt {
        ts_ns: now,
        cgroup_id: ev.cgroup_id,
        class: class as u32,
        _pad: 0,
    };
    let _ = ISSUED_AT.insert(&rq, &at, 0);
}

/// At a completion of `nr_bytes` of a request (`ev` the completion event, whose `bytes` are
/// what the request had left): on the final one, its device latency from its last issue.
#[inline(always)]
pub fn completed(rq: u64, ev: &Event, nr_bytes: u64) {
    if nr_bytes < ev.bytes as u64 {
        return; // partial: the request goes on
    }
    let Some(at) = (unsafe { ISSUED_AT.get(&rq) }).copied() else {
        return; // issued before the run
    };
    let _ = ISSUED_AT.remove(&rq);
    let now = unsafe { bpf_ktime_get_ns() };
    // The issue's cgroup: a flush request's (it has no bio) is told by the disk, which may
    // have moved on since.
    if let Some(h) = hist(at.cgroup_id, ev) {
        let (ns, class) = (now.saturating_sub(at.ts_ns), at.class as usize & 1);
        unsafe { (*h).device_ns[class] += ns };
        if let Some(n) = unsafe { (*h).device[class].get_mut(lat_bucket(ns)) } {
            *n += 1;
        }
    }
}

/// This CPU's histograms of (`cgroup_id`, the event's disk and direction), inserted when new.
#[inline(always)]
fn hist(cgroup_id: u64, ev: &Event) -> Option<*mut LatencyHist> {
    let key = CountKey {
        cgroup_id,
        dev: ev.dev,
        dir: dir_of_op(ev.op),
    };
    if let Some(h) = LATENCY.get_ptr_mut(&key) {
        return Some(h);
    }
    let zero = LATENCY_ZERO.get(0)?;
    if LATENCY.insert(&key, zero, 0).is_err() {
        count_lost(LOST_LATENCY_FULL);
        return None;
    }
    LATENCY.get_ptr_mut(&key)
}
