//! mergetrace's kernel side: one small program per block-layer hook, each turning what it sees
//! into a [`mergetrace_common::Event`], then counted in per-CPU maps (live view, exporter)
//! and/or sent on a ring buffer (capture). No struct layout is compiled in: field offsets come
//! from `OFFSETS`, kernel addresses from `SYMBOLS`, the traced disks from `TRACED`, all
//! frozen read-only data user space fills in from the running kernel before load. Events that
//! cannot be counted or sent are counted per kind in `LOST`, never dropped silently.
//!
//! - [`maps`]: the maps and the frozen globals;
//! - [`read`]: reading kernel memory, the traced-disk filter, cgroup ids;
//! - [`emit`]: counting an event (the shared counting rule) and sending it (a batch per CPU,
//!   and `flush_staged`, which user space runs on a CPU that fell quiet);
//! - [`slot`]: a key's counter slot, the one lookup an event's counts and latency share;
//! - [`bio`]: programs on bio tracepoints (queue, split, merges, new request);
//! - [`charge`]: what blk-throttle charges a bio (its group's rules);
//! - [`request`]: programs on request tracepoints (merge, insert, issue, requeue, complete,
//!   plug flush);
//! - [`chain`]: the request programs' walks along a request's bio chain (two builds: through
//!   `bpf_loop`, or as bounded loops before 5.17);
//! - [`latency`]: `--latency`'s request latency histograms (at issue and completion);
//! - [`throttle`]: blk-throttle's dispatch work, where throttled bios are released;
//! - [`fentry`]: the fentry tier's programs (exact throttle delays, merge attempts);
//! - [`cgroup`]: cgroup births and removals (names, reclaiming removed cgroups' counters);
//! - [`stats`]: `--stats`' empty program, what the kernel's run-time statistics add to a run.
#![no_std]
#![no_main]
// Atomic adds (`read::pending_add`): the BPF target has no compare-and-swap for core's atomics.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod bio;
mod cgroup;
mod chain;
mod charge;
mod emit;
mod fentry;
mod latency;
mod maps;
mod read;
mod request;
mod slot;
mod stats;
mod throttle;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
