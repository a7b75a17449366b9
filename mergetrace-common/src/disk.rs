//! The traced disks as the programs know them: the frozen list or the slots of the per-disk
//! maps, where a disk that appears during the run takes one, and what each is told.

/// How many disks the frozen list holds ([`TracedDevices::devs`]): a run that names at most
/// this many compares each event's disk with them (no map lookup); more, or disks found
/// during the run, are looked up in the `DISK_SLOTS` map.
pub const FROZEN_DISKS: usize = 16;

/// The most disks a run can trace: each has a slot in the per-disk maps, sized at load.
pub const MAX_DISKS: u32 = 1024;

/// How the programs find a traced disk's slot ([`TracedDevices::lookup`]).
pub mod lookup {
    /// In the frozen list (`count` disks, at most [`super::FROZEN_DISKS`]).
    pub const FROZEN: u32 = 0;
    /// In the `DISK_SLOTS` map, which user space filled in.
    pub const MAP: u32 = 1;
    /// In the `DISK_SLOTS` map, where a disk not found yet takes a free slot at its first
    /// event (every disk is traced; user space tells the programs which to ignore).
    pub const EVERY_DISK: u32 = 2;
}

/// The traced disks, in the kernel's `dev_t` encoding, frozen at load: a disk's index here
/// is its slot in the per-disk maps. Unused entries are 0 (no disk has dev_t 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracedDevices {
    /// With [`lookup::FROZEN`]: the disks, by slot.
    pub devs: [u32; FROZEN_DISKS],
    pub count: u32,
    /// One of [`lookup`].
    pub lookup: u32,
    /// Slots of the per-disk maps (a power of two with [`lookup::EVERY_DISK`]).
    pub slots: u32,
    /// With [`lookup::EVERY_DISK`]: slots `0..placed` hold the disks present at load; a disk
    /// that appears later takes one of the others ([`new_disk_slot`]).
    pub placed: u32,
}

/// How many slots a disk that appears during the run tries before it is counted lost.
pub const NEW_DISK_PROBES: u32 = 32;

/// The `probe`th slot a disk `dev` appearing during the run tries: in `placed..slots` (the
/// slots the disks present at load left free, at least as many as they took), from the one
/// its number hashes to.
#[inline(always)]
pub fn new_disk_slot(dev: u32, placed: u32, slots: u32, probe: u32) -> Option<u32> {
    let free = slots.checked_sub(placed).filter(|f| *f > 0)?;
    let start = dev.wrapping_mul(0x9e37_79b9) >> 16;
    Some(placed + start.wrapping_add(probe) % free)
}

/// What the programs are told of one traced disk, by its slot (the `DISK_CONFIG` map), and
/// may be told again during the run: user space writes it, the programs only read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskConfig {
    /// Bits of [`crate::iocost`]: io.cost is on for the disk now, and how this kernel charges an
    /// empty bio.
    pub iocost: u32,
    /// Non-zero where the disk is bio-based (no requests: zram, device-mapper, md).
    pub bio_based: u32,
    /// Non-zero where the run does not trace the disk (it took a slot at its first event, with
    /// [`lookup::EVERY_DISK`], and is not one the user asked for).
    pub ignored: u32,
    pub _pad: u32,
}
