//! Reading kernel memory with the running kernel's offsets, the traced-disk filter, and the
//! values every event carries (disk, cgroup).
use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_probe_read_kernel;
use mergetrace_common::{
    gate, lookup, new_disk_slot, DeviceState, DiskConfig, FROZEN_DISKS, LOST_DISKS_FULL,
    NEW_DISK_PROBES, NONE,
};

use crate::request::Pending;

use crate::{
    emit::count_lost,
    maps::{frozen, off, DISKS, DISK_CACHE, DISK_CONFIG, DISK_SLOTS, GATE, SCRATCH, SLOT_OWNERS},
};

/// Reads a `T` at `base + offset` of a BTF-typed kernel pointer (a tracepoint argument or a
/// pointer field read from one): a plain load the verifier checks against BTF and guards
/// against faults — far cheaper than a helper call. Zero for NULL.
#[inline(always)]
pub fn read<T: Copy + Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { core::ptr::read_volatile((base + offset as u64) as *const T) }
}

/// Reads through `bpf_probe_read_kernel`: for pointers the verifier cannot type, such as
/// `blkg->pd[i]` used as the `struct throtl_grp` it is embedded in (container_of).
#[inline(always)]
pub fn read_probe<T: Copy + Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.unwrap_or_default()
}

/// `ptr` as a read-only pointer to the kernel type `btf_id` (the `bpf_rdonly_cast` kfunc):
/// its fields are then plain loads, faults guarded, where `ptr`'s own type does not reach
/// them (a struct that embeds the one `ptr` is typed as). Call it only where
/// `off!(throtl_grp_btf_id)` is non-zero: elsewhere user space made the call `r0 = 0`.
#[inline(always)]
pub fn rdonly_cast(ptr: u64, btf_id: u32) -> u64 {
    // A call to a constant number, as aya's helpers are made: `call RDONLY_CAST_CALL`.
    let call: unsafe extern "C" fn(u64, u32) -> u64 =
        unsafe { core::mem::transmute(mergetrace_common::RDONLY_CAST_CALL as usize) };
    unsafe { call(ptr, btf_id) }
}

/// Returns `v` as a value the verifier knows nothing about: where a value can take a few
/// constants, each would otherwise have the rest of the program checked again.
#[inline(always)]
pub fn forget(v: u64) -> u64 {
    let [v] = forget_all([v]);
    v
}

/// [`forget`] for several numbers, with one map lookup: each is XORed with a map word that is
/// always 0 but that the verifier cannot know. Nothing is written, so a program running inside
/// this one on its CPU cannot change what comes back. Not for a pointer, which the verifier
/// lets no arithmetic touch: [`forget_all_stored`].
#[inline(always)]
pub fn forget_all<const N: usize>(mut vs: [u64; N]) -> [u64; N] {
    if let Some(s) = SCRATCH.get_ptr(0) {
        for v in &mut vs {
            *v ^= unsafe { core::ptr::read_volatile(&raw const (*s).zero) };
        }
    }
    vs
}

/// [`forget_all`] where a value may be a pointer (which this makes a plain number): each is
/// written to a map word of this program's own ([`scratch`]) and read back.
#[inline(always)]
pub fn forget_all_stored<const N: usize>(mut vs: [u64; N]) -> [u64; N] {
    // Never None (a per-CPU array of one entry), but the verifier follows that path too:
    // there a pointer must not come back as it went in, or arithmetic on it is refused.
    let Some(held) = scratch() else {
        return [0; N];
    };
    for v in &mut vs {
        unsafe {
            core::ptr::write_volatile(held.word, *v);
            *v = core::ptr::read_volatile(held.word);
        }
    }
    vs
}

/// A running count or sum, zeroed, kept where the verifier does not track it (a map): a loop
/// adding to a register leaves it bounds that grow with each iteration, and states that differ
/// only there are never recognised as alike (see `chain`).
#[inline(always)]
pub fn untracked_sum() -> Option<Scratch> {
    let held = scratch()?;
    unsafe { core::ptr::write_volatile(held.word, 0) };
    Some(held)
}

/// A CPU's words for values the verifier does not track (the programs' `SCRATCH`).
#[repr(C)]
pub struct ScratchWords {
    /// Never written: always 0 ([`forget_all`]).
    zero: u64,
    /// How many of `words` are held ([`scratch`]).
    held: u64,
    words: [u64; NESTED_WORDS],
}

/// Programs nested on one CPU that can each hold a word: more than block tracepoints ever
/// nest (task, softirq, hardirq, NMI).
const NESTED_WORDS: usize = 8;

/// A map word of this program's own until dropped. The programs of a CPU share `SCRATCH`, and
/// one can run inside another (an interrupt's completion inside a task's issue, between any
/// two instructions): each takes the word after those held by the programs it interrupted,
/// and gives it back before they go on, so no two use a word at once.
#[inline(always)]
fn scratch() -> Option<Scratch> {
    let s = SCRATCH.get_ptr_mut(0)?;
    unsafe {
        let held = &raw mut (*s).held;
        let depth = core::ptr::read_volatile(held);
        // Deeper than can happen: the last word is shared rather than nothing counted.
        let word = &raw mut (*s).words[(depth as usize).min(NESTED_WORDS - 1)];
        core::ptr::write_volatile(held, depth + 1);
        Some(Scratch { word, held })
    }
}

/// A word of `SCRATCH`, held until dropped (see [`scratch`]).
pub struct Scratch {
    pub word: *mut u64,
    held: *mut u64,
}

impl Drop for Scratch {
    #[inline(always)]
    fn drop(&mut self) {
        unsafe {
            let depth = core::ptr::read_volatile(self.held);
            core::ptr::write_volatile(self.held, depth.saturating_sub(1));
        }
    }
}

/// User space filled the offsets in and the gate is open (programs do nothing otherwise).
/// Programs attach one by one, the first while the last are still being verified: the gate
/// makes them all start at one moment, once the rings are in place, and stop at one moment.
/// Else a start under load loses the events sent before the rings exist, and sees requests
/// issued whose completion program was not attached yet.
#[inline(always)]
pub fn ready() -> bool {
    offsets_ready() && gate_bits() & gate::OPEN != 0
}

/// The gate's bits (`mergetrace_common::gate`).
#[inline(always)]
pub fn gate_bits() -> u32 {
    GATE.get(0).copied().unwrap_or(0)
}

/// What user space says of the traced disk in `slot` now.
#[inline(always)]
pub fn disk_config(slot: u32) -> DiskConfig {
    DISK_CONFIG.get(slot).copied().unwrap_or_default()
}

/// User space filled the offsets in (a constant of the loaded program): enough for a way out
/// that changes nothing.
#[inline(always)]
pub fn offsets_ready() -> bool {
    off!(ready) != 0
}

/// `major << 20 | first_minor` of a `struct gendisk`.
#[inline(always)]
pub fn disk_dev(disk: u64) -> u32 {
    let major: i32 = read(disk, off!(disk_major));
    let minor: i32 = read(disk, off!(disk_first_minor));
    ((major as u32) << 20) | (minor as u32 & 0xfffff)
}

/// The `struct gendisk *` of a bio: `bi_bdev->bd_disk`, or `bi_disk` up to 5.11.
#[inline(always)]
pub fn bio_disk(bio: u64) -> u64 {
    let first: u64 = read(bio, off!(bio_bi_bdev));
    if off!(bio_disk_direct) != 0 {
        first
    } else {
        read(first, off!(bdev_bd_disk))
    }
}

/// The `struct gendisk *` of a request (`q` its `rq->q`): `q->disk`, or `rq->rq_disk` up to
/// 5.15.
#[inline(always)]
pub fn rq_disk(rq: u64, q: u64) -> u64 {
    if off!(rq_rq_disk) != NONE {
        read(rq, off!(rq_rq_disk))
    } else {
        read(q, off!(q_disk))
    }
}

/// The traced disk whose request queue is `q` (a plug flush names only the queue): its
/// `q->disk` where the queue has one, else the queue the disk's bios were seen with (up to
/// 5.15: among the first [`FROZEN_DISKS`] slots).
#[inline(always)]
pub fn queue_disk(q: u64) -> Option<(u32, Disk)> {
    if off!(q_disk) != NONE {
        let dev = disk_dev(read(q, off!(q_disk)));
        return Some((dev, traced(dev)?));
    }
    let slots = frozen!(TRACED.slots);
    let mut i = 0u32;
    while (i as usize) < FROZEN_DISKS {
        if i >= slots {
            return None;
        }
        let state = DISKS.get_ptr_mut(i)?;
        if q != 0 && unsafe { (*state).queue } == q {
            let dev = if frozen!(TRACED.lookup) == lookup::FROZEN {
                frozen!(TRACED.devs[i as usize])
            } else {
                unsafe { SLOT_OWNERS.get(&i) }.copied()?
            };
            return Some((dev, Disk { slot: i, state }));
        }
        i += 1;
    }
    None
}

/// Notes the queue of a traced disk (for [`queue_disk`] where queues do not name disks, and
/// to tell which disk's throttle a dispatch work releases bios of).
#[inline(always)]
pub fn learn_queue(disk: &Disk, gendisk: u64) {
    if unsafe { (*disk.state).queue } == 0 {
        let q: u64 = read(gendisk, off!(disk_queue));
        unsafe { (*disk.state).queue = q };
    }
}

/// A traced disk: its slot in the per-disk maps and its state there.
#[derive(Clone, Copy)]
pub struct Disk {
    pub slot: u32,
    pub state: *mut DeviceState,
}

/// The traced disk `dev` (`None` if it is not traced). A run of at most [`FROZEN_DISKS`]
/// named disks compares it with the frozen list (one comparison for one disk, no map lookup);
/// others find its slot in `DISK_SLOTS`, through this CPU's last answer first.
#[inline(always)]
pub fn traced(dev: u32) -> Option<Disk> {
    if frozen!(TRACED.lookup) == lookup::FROZEN {
        let count = frozen!(TRACED.count);
        let mut i = 0u32;
        while (i as usize) < FROZEN_DISKS {
            if i >= count {
                return None;
            }
            if frozen!(TRACED.devs[i as usize]) == dev {
                let state = DISKS.get_ptr_mut(i)?;
                return Some(Disk { slot: i, state });
            }
            i += 1;
        }
        return None;
    }
    let slot = disk_slot(dev)?;
    if disk_config(slot).ignored != 0 {
        return None;
    }
    let state = DISKS.get_ptr_mut(slot)?;
    Some(Disk { slot, state })
}

/// `dev`'s slot in the per-disk maps where the frozen list does not hold them: this CPU's
/// last answer, `DISK_SLOTS`, or (every disk traced) a free slot taken now.
#[inline(always)]
fn disk_slot(dev: u32) -> Option<u32> {
    let cache = DISK_CACHE.get_ptr_mut(0)?;
    // One word, read and written whole: a program interrupting this one on the CPU cannot
    // leave one disk paired with another's slot.
    let word = unsafe { core::ptr::read_volatile(cache) };
    if word >> 32 == dev as u64 && word as u32 != 0 {
        return Some(word as u32 - 1);
    }
    let slot = match unsafe { DISK_SLOTS.get(&dev) } {
        Some(s) => *s,
        None if frozen!(TRACED.lookup) == lookup::EVERY_DISK => take_slot(dev)?,
        None => return None,
    };
    unsafe { core::ptr::write_volatile(cache, (dev as u64) << 32 | (slot + 1) as u64) };
    Some(slot)
}

/// Gives `dev`, seen for the first time, a free slot: the first of a few it hashes to, past
/// the disks placed at load, that no disk owns (`SLOT_OWNERS`, inserted only if absent: one
/// CPU wins a slot). Another CPU may have given `dev` a slot meanwhile: then that one, and
/// this one is given back. None, counted lost, when every slot it tries is taken.
#[inline(always)]
fn take_slot(dev: u32) -> Option<u32> {
    let placed = frozen!(TRACED.placed);
    let slots = frozen!(TRACED.slots);
    for i in 0..NEW_DISK_PROBES {
        let slot = new_disk_slot(dev, placed, slots, i)?;
        if SLOT_OWNERS.insert(&slot, &dev, BPF_NOEXIST as u64).is_err() {
            continue;
        }
        if DISK_SLOTS.insert(&dev, &slot, BPF_NOEXIST as u64).is_ok() {
            return Some(slot);
        }
        let _ = SLOT_OWNERS.remove(&slot);
        return unsafe { DISK_SLOTS.get(&dev) }.copied();
    }
    count_lost(LOST_DISKS_FULL);
    None
}

/// The cgroup id (kernfs inode) a `struct blkcg_gq` belongs to; 0 for NULL.
#[inline(always)]
pub fn blkg_cgroup_id(blkg: u64) -> u64 {
    let blkcg: u64 = read(blkg, off!(blkg_blkcg));
    let cgroup: u64 = read(blkcg, off!(blkcg_css_cgroup));
    let kn: u64 = read(cgroup, off!(cgroup_kn));
    read(kn, off!(kn_id))
}

/// Moves one of the disk's pending counts (see `DeviceState`) by `delta`, atomically: the
/// programs of several CPUs move them at once.
#[inline(always)]
pub fn pending_add(disk: Disk, which: Pending, delta: i64) {
    let field = unsafe {
        match which {
            Pending::Inserted => &raw mut (*disk.state).inserted,
            Pending::Absorbed => &raw mut (*disk.state).absorbed,
            Pending::SplitPieces => &raw mut (*disk.state).split_pieces,
        }
    };
    // A plain atomic add (BPF_XADD, every kernel; its result is not used). The BPF target has
    // no compare-and-swap, so core's atomic types offer no fetch_add: the intrinsic it uses.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            field,
            delta as u64,
        )
    };
}

/// "kyber" and its NUL, the one scheduler that merges bios on plain request lists, as the
/// low 6 bytes of a little-endian read (what follows a `const char *` name is not ours).
const KYBER: u64 = u64::from_le_bytes(*b"kyber\0\0\0");
const KYBER_MASK: u64 = 0xffff_ffff_ffff;

/// Whether the queue's scheduler (`struct elevator_queue *`, not NULL) is kyber.
#[inline(always)]
pub fn elevator_is_kyber(elevator: u64) -> bool {
    let etype: u64 = read(elevator, off!(elv_type));
    let mut name: u64 = read_probe(etype, off!(elv_type_name));
    if off!(elv_name_is_pointer) != 0 {
        name = read_probe(name, 0);
    }
    name & KYBER_MASK == KYBER
}
