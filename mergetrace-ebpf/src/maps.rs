//! The maps and the frozen read-only globals every program shares.
use aya_ebpf::{
    btf_maps::{ArrayOfMaps, RingBuf as BtfRingBuf},
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use mergetrace_common::{
    latency::{IssuedAt, LatencyHist, ISSUED_AT_ENTRIES},
    nested::CacheEntry,
    CountKey, Counters, DeviceState, DiskConfig, Event, KernelOffsets, KernelSymbols, MeterUnits,
    Modes, SlotRef, Staged, TracedDevices, LOST_SLOTS, MAX_SLOTS, UNATTRIBUTED_KEYS,
};

use crate::throttle::Dispatching;

#[no_mangle]
pub static OFFSETS: KernelOffsets = unsafe { core::mem::zeroed() };

#[no_mangle]
pub static SYMBOLS: KernelSymbols = unsafe { core::mem::zeroed() };

#[no_mangle]
pub static MODES: Modes = unsafe { core::mem::zeroed() };

#[no_mangle]
pub static METER_UNITS: MeterUnits = unsafe { core::mem::zeroed() };

#[no_mangle]
pub static TRACED: TracedDevices = unsafe { core::mem::zeroed() };

/// Wake the reader once a CPU has sent this many bytes to its ring of `EVENTS` since it last
/// woke it (a quarter of a ring, at most 256 KiB); it also looks on a short timer.
#[no_mangle]
pub static RING_WAKE_BYTES: u64 = 0;

/// Reads one field of a frozen global. Volatile, so the compiler cannot fold the zero it sees
/// at build time; the verifier sees the real, frozen value (and drops the code it rules out).
macro_rules! frozen {
    ($global:ident . $($field:tt)+) => {
        unsafe { core::ptr::read_volatile(&raw const crate::maps::$global.$($field)+) }
    };
}
pub(crate) use frozen;

/// A struct offset of the running kernel (see `KernelOffsets`).
macro_rules! off {
    ($field:ident) => {
        crate::maps::frozen!(OFFSETS.$field)
    };
}
pub(crate) use off;

/// Per CPU: counters per (device, cgroup, direction) when `MODES.aggregate` is set, for keys
/// without a slot in `COUNTERS`: new ones, until user space gives them one and moves what
/// they counted here over (the next read), and any beyond `MAX_SLOTS`. Preallocated: a map
/// allocating on insert fails inserts (ENOMEM) when the kernel's atomic per-CPU pool runs
/// low, which cgroup churn brings about.
#[map]
pub static COUNTS: PerCpuHashMap<CountKey, Counters> =
    PerCpuHashMap::with_max_entries(MAX_SLOTS, 0);

/// Per CPU: counters per (disk, [`UNATTRIBUTED_CGROUP`], direction), for events whose key
/// found `COUNTS` full: counted without their cgroup rather than lost. Preallocated, sized
/// for its few keys.
#[map]
pub static UNATTRIBUTED: PerCpuHashMap<CountKey, Counters> =
    PerCpuHashMap::with_max_entries(UNATTRIBUTED_KEYS, 0);

/// Per CPU: counters by slot, for the keys user space gave a slot (`SLOT_OF`); after the
/// first `MAX_SLOTS`, one slot per (disk, direction) where keys of removed cgroups count.
#[map]
pub static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(MAX_SLOTS, 0);

/// A key's slot in `COUNTERS`, written by user space: the keys with a slot of their own, and
/// at most as many of removed cgroups pointed at their disk's removed slot.
#[map]
pub static SLOT_OF: HashMap<CountKey, SlotRef> = HashMap::with_max_entries(2 * MAX_SLOTS, 0);

/// Each slot's generation, written by user space (bumped when the slot changes hands).
#[map]
pub static SLOT_GEN: Array<u32> = Array::with_max_entries(MAX_SLOTS, 0);

/// Per CPU, per direction: the last key counted (`CountKey::words`) and its slot
/// (`SlotRef::word`), so that a run of events of one cgroup (the usual case) finds its
/// counters without a hash lookup.
#[map]
pub static SLOT_CACHE: PerCpuArray<CacheEntry<2, 1>> = PerCpuArray::with_max_entries(4, 0);

/// Per CPU: plug flushes per (disk slot, explicit, depth) (`mergetrace_common::unplug_slot`),
/// when `MODES.aggregate` is set.
#[map]
pub static UNPLUGS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A zeroed `Counters` to insert from (too big for the BPF stack).
#[map]
pub static ZERO: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

/// Events for user space: a ring buffer per CPU, at the CPU's index, so that the CPUs that
/// submit I/O and those that complete it share no lock and no cache line (user space merges
/// the rings back into time order). User space creates and sizes the rings and sets the
/// array's length to the possible CPUs before load; the inner definition is only the template
/// the verifier checks the rings against.
#[btf_map]
pub static EVENTS: ArrayOfMaps<BtfRingBuf<Event, 4096>, 1> = ArrayOfMaps::new();

/// Per CPU: the events on their way to this CPU's ring in `EVENTS`, a batch at a time
/// (`emit::send`, when `MODES.staged`).
#[map]
pub static STAGING: PerCpuArray<Staged> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: the `ts_ns` of the first event in its `STAGING` batch, 0 while empty. User space
/// reads these 8 bytes a CPU, not the 3.6 KB batches, to find the old ones every poll.
#[map]
pub static STAGED_SINCE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Cgroup births and removals for user space (`cgroup_mkdir`, `cgroup_rmdir`). 2 MiB holds
/// ~4,000 records (520 bytes each): a second of cgroups made and removed at 2,000 a second,
/// between two of user space's drains.
#[map]
pub static CGROUP_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 21, 0);

/// What the programs keep per traced disk, by its slot (`TRACED`'s list or `DISK_SLOTS`).
/// User space sizes the per-disk maps to the run's slots (`TracedDevices::slots`).
#[map]
pub static DISKS: Array<DeviceState> = Array::with_max_entries(1, 0);

/// What user space tells the programs of each traced disk, by its slot (io.cost on or off,
/// bio-based, ignored); it may change during the run.
#[map]
pub static DISK_CONFIG: Array<DiskConfig> = Array::with_max_entries(1, 0);

/// A traced disk's slot by its `dev_t`, where the frozen list does not hold them
/// (`TracedDevices::lookup`): filled in by user space, and with `lookup::EVERY_DISK` by a disk's
/// first event ([`SLOT_OWNERS`]).
#[map]
pub static DISK_SLOTS: HashMap<u32, u32> = HashMap::with_max_entries(1, 0);

/// Each slot's disk (`dev_t`): inserting a slot here (`BPF_NOEXIST`) is how a disk's first
/// event takes a free one, one CPU at a time; user space reads new disks from it.
#[map]
pub static SLOT_OWNERS: HashMap<u32, u32> = HashMap::with_max_entries(1, 0);

/// Per CPU: the last disk looked up in `DISK_SLOTS` (`dev_t << 32 | slot + 1`; I/O mostly goes
/// to one disk at a time: one array load instead of a hash lookup).
#[map]
pub static DISK_CACHE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU, per event kind: events that could not be sent or counted.
#[map]
pub static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(LOST_SLOTS, 0);

/// Per CPU: blk-throttle's dispatch work items under way on this CPU (see [`Dispatching`]).
#[map]
pub static DISPATCH: PerCpuArray<Dispatching> = PerCpuArray::with_max_entries(1, 0);

/// Requests handed back by the driver after they were issued: request address → its
/// `start_time_ns`, so that its next issue is known as the same request again. LRU: a
/// requeued request that is never issued again (its disk went away) cannot fill the map.
#[map]
pub static REQUEUED: LruHashMap<u64, u64> = LruHashMap::with_max_entries(4096, 0);

/// Requests inserted into a scheduler or software queue and not issued yet: request
/// address → what it carried then (its plug merges were counted at the insert). LRU, so the
/// entry of a request that never comes out (its disk went away) cannot fill the map.
#[map]
pub static INSERTED: LruHashMap<u64, Inserted> = LruHashMap::with_max_entries(16384, 0);

/// A request at its insert (the value of `INSERTED`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Inserted {
    /// Its first bio then: bios ahead of it at the issue merged at the front.
    pub first: u64,
    /// Its bios and bytes then.
    pub bios: u32,
    pub bytes: u32,
    /// Where merges into it count from then on (`mergetrace_common::path`).
    pub place: u8,
    pub _pad: [u8; 7],
}

/// `--latency`: per CPU, request latency histograms by counter slot, as `COUNTERS` (the
/// removed slots too). User space sizes it to one entry when latency is not asked for.
#[map]
pub static LATENCY: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(1, 0);

/// `--latency`: per CPU, the histograms of keys without a slot, as `COUNTS` (moved over by
/// user space once the key has one). A request whose key finds it full counts as lost
/// (`LOST_LATENCY_FULL`).
#[map]
pub static LATENCY_HASHED: PerCpuHashMap<CountKey, LatencyHist> =
    PerCpuHashMap::with_max_entries(1, 0);

/// Zeros to insert a new `LATENCY_HASHED` entry from (too large for the stack).
#[map]
pub static LATENCY_ZERO: PerCpuArray<LatencyHist> = PerCpuArray::with_max_entries(1, 0);

/// `--latency`: requests issued and not completed yet: request address → its issue. LRU, so
/// the entry of a request that never completes (its disk went away) cannot fill the map; with
/// a free list per CPU (`BPF_F_NO_COMMON_LRU`), not one list behind one lock.
/// Only requests whose (hardware queue, tag) is beyond `ISSUE_SLOTS` come here.
#[map]
pub static ISSUED_AT: LruHashMap<u64, IssuedAt> =
    LruHashMap::with_max_entries(ISSUED_AT_ENTRIES, BPF_F_NO_COMMON_LRU);

/// `--latency`: requests in flight by (disk slot, hardware queue, driver tag)
/// (`mergetrace_common::latency::ISSUE_SLOTS_PER_DISK` a disk): an array index instead of a
/// hash update per issue and completion. User space sizes it to the traced disks (one entry
/// when latency is not counted).
#[map]
pub static ISSUE_SLOTS: Array<IssuedAt> = Array::with_max_entries(1, 0);

/// Per-CPU free lists for an LRU map (`BPF_F_NO_COMMON_LRU` of the UAPI).
const BPF_F_NO_COMMON_LRU: u32 = 2;

/// Requests absorbed into others (`block_rq_merge`): first bio address → the absorbed
/// request's bios, found and taken out by the walk of the request that took them.
#[map]
pub static ABSORBED: LruHashMap<u64, u32> = LruHashMap::with_max_entries(4096, 0);

/// Front pieces of split bios (`block_split`) not issued yet: bio address → 1. Such a piece
/// is one more piece of a bio already counted.
#[map]
pub static SPLIT_PIECES: LruHashMap<u64, u8> = LruHashMap::with_max_entries(16384, 0);

/// fentry tier: bio address → when it entered `__blk_throtl_bio` (ns). LRU, so a bio that
/// never comes back (cancelled with its disk) cannot fill the map.
#[map]
pub static THROTTLE_ENTRY: LruHashMap<u64, u64> = LruHashMap::with_max_entries(65536, 0);

/// io.cost's cursor per (cgroup, disk) (`ioc_gq.cursor`), followed from the bios that start
/// requests and back-merge on disks with io.cost on: it tells a sequential bio from a random
/// one. LRU: the cursors of cgroups gone (or idle longest) make room.
#[map]
pub static IOCOST_CURSOR: LruHashMap<CursorKey, u64> = LruHashMap::with_max_entries(16384, 0);

/// Key of `IOCOST_CURSOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CursorKey {
    pub cgroup_id: u64,
    pub dev: u64,
}

/// Bits of `mergetrace_common::gate`: `OPEN` while the programs run, from when user space has
/// attached every program of the run and installed the rings, to the run's end (see
/// `read::ready`); `IOCOST` while io.cost is on for a traced disk.
#[map]
pub static GATE: Array<u32> = Array::with_max_entries(1, 0);

/// blk-throttle's policy id + 1 (0: not found yet), the index of its data in `blkg->pd[]`.
#[map]
pub static THROTTLE_POLICY: Array<u32> = Array::with_max_entries(1, 0);

/// Per CPU: bytes sent to this CPU's ring since it last woke the reader (`emit::send`).
#[map]
pub static SENT_SINCE_WAKE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: words for values the verifier does not track (`read::forget_all`,
/// `read::untracked_sum`), one held per program nested on the CPU.
#[map]
pub static SCRATCH: PerCpuArray<crate::read::ScratchWords> = PerCpuArray::with_max_entries(1, 0);
