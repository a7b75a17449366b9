//! What blk-throttle charges a bio: the rules of its throttle group (own or inherited) for its
//! direction. A bio is charged one io at every pass through `blk_throtl_bio` where its group
//! has an iops rule, or a bps rule its bytes were not charged under yet (`blk_should_throtl`).
//! Runs that charge per request (counting runs, the request-level capture) ask it once per
//! request (a request never mixes cgroups, so its bios share one group); a full capture once
//! per bio.
use aya_ebpf::maps::ring_buf::RingBufEntry;
use mergetrace_common::{flags, CgroupEvent, DISK_RULES_SEEN, LOST_CGROUP_NAMES};

use crate::{
    emit::count_lost,
    maps::{off, CGROUP_EVENTS, THROTTLE_POLICY},
    read::{rdonly_cast, read, read_probe, Disk},
};

/// blk-throttle's group (`struct throtl_grp *`) of a bio, or 0 if the queue has no throttle
/// data (no limit was ever set on this disk) or the group is not found.
///
/// The group is the `blkg->pd[]` entry of blk-throttle's policy id. That id is the same for
/// every blkg, but not visible to BPF: the first bio finds it by looking for the `pd` whose
/// `td` is the queue's, and the id is kept for every later bio (one probe read instead of up
/// to eight).
#[inline(always)]
fn throttle_group(bio: u64) -> u64 {
    let blkg: u64 = read(bio, off!(bio_bi_blkg));
    let q: u64 = read(blkg, off!(blkg_q));
    let td: u64 = read(q, off!(q_td));
    if td == 0 {
        return 0;
    }
    let pd_base = off!(blkg_pd);
    let Some(policy) = THROTTLE_POLICY.get_ptr_mut(0) else {
        return 0;
    };
    let known = unsafe { *policy };
    if known != 0 {
        // A constant offset in each arm: plain typed loads, no helper call. An arm past the
        // kernel's `pd[]` (frozen `blkg_pd_count`) is dropped by the verifier.
        let n = off!(blkg_pd_count);
        return match known - 1 {
            0 => read(blkg, pd_base),
            1 if n > 1 => read(blkg, pd_base + 8),
            2 if n > 2 => read(blkg, pd_base + 16),
            3 if n > 3 => read(blkg, pd_base + 24),
            4 if n > 4 => read(blkg, pd_base + 32),
            5 if n > 5 => read(blkg, pd_base + 40),
            6 if n > 6 => read(blkg, pd_base + 48),
            7 if n > 7 => read(blkg, pd_base + 56),
            _ => 0,
        };
    }
    let tg_td = off!(tg_td);
    for i in 0..8u32 {
        if i >= off!(blkg_pd_count) {
            break;
        }
        let pd: u64 = read_probe(blkg, pd_base + i * 8);
        if pd != 0 && read_probe::<u64>(pd, tg_td) == td {
            unsafe { *policy = i + 1 };
            return pd; // pd is the first member of throtl_grp
        }
    }
    0
}

/// Does the bio's group have iops / bps rules (own or inherited) for its direction.
#[inline(always)]
pub fn rule_flags(bio: u64, op: u8) -> u8 {
    let tg = throttle_group(bio);
    if tg == 0 {
        return 0;
    }
    let write = op & 1 != 0; // bio_data_dir(): op_is_write()
    let (iops, bps) = if off!(throtl_grp_btf_id) != 0 {
        rules_typed(tg, write)
    } else {
        rules_probed(tg, write)
    };
    let mut out = 0;
    if iops != 0 {
        out |= flags::RULES_IOPS;
    }
    if bps != 0 {
        out |= flags::RULES_BPS;
    }
    out
}

/// A group's (iops, bps) rules for a direction, as plain loads through the group cast to its
/// type (~60 ns less a bio than [`rules_probed`]'s helper call). A typed load needs a
/// constant offset: one arm per direction.
#[inline(always)]
fn rules_typed(tg: u64, write: bool) -> (u8, u8) {
    let tg = rdonly_cast(tg, off!(throtl_grp_btf_id));
    let (iops, bps) = (off!(tg_has_rules_iops), off!(tg_has_rules_bps));
    if write {
        (read(tg, iops + 1), read(tg, bps + 1))
    } else {
        (read(tg, iops), read(tg, bps))
    }
}

/// A group's (iops, bps) rules for a direction, through `bpf_probe_read_kernel`: the pointer
/// is typed as the `blkg_policy_data` the group embeds, which ends before the rules.
#[inline(always)]
fn rules_probed(tg: u64, write: bool) -> (u8, u8) {
    let rw = write as u32;
    // `has_rules_iops[2]` and `has_rules_bps[2]` are neighbours: one read for both.
    let (iops, bps) = (off!(tg_has_rules_iops) + rw, off!(tg_has_rules_bps) + rw);
    let base = if iops < bps { iops } else { bps };
    // Little-endian: byte `i` of the read is bits 8i..8i+8 (shifts, not stack indexing,
    // which the verifier refuses as pointer arithmetic).
    let word: u64 = read_probe(tg, base);
    let byte = |at: u32| ((word >> (((at - base) & 7) * 8)) & 0xff) as u8;
    (byte(iops), byte(bps))
}

#[inline(always)]
pub fn bps_charged(bio: u64) -> bool {
    // `bio` comes from `bi_private` (a void pointer): not BTF-typed, so probe-read.
    let bi_flags: u16 = read_probe(bio, off!(bio_bi_flags));
    bi_flags & (1u16 << (off!(bio_bps_throttled_bit) & 15)) != 0
}

/// The first time a run that charges per request finds blk-throttle rules on a traced disk,
/// it tells user
/// space (a `DISK_RULES_SEEN` record on `CGROUP_EVENTS`): the programs that tell which bios
/// waited, which cost every bio of every disk, are attached from then on. Charges need no
/// such program: they are counted here, per request, from the run's first request on.
#[inline(always)]
pub fn note_rules(disk: &Disk, dev: u32, rules: u8) {
    if rules == 0 || unsafe { (*disk.state).rules_seen } != 0 {
        return;
    }
    unsafe { (*disk.state).rules_seen = 1 };
    let entry: Option<RingBufEntry<CgroupEvent>> = CGROUP_EVENTS.reserve(0);
    let Some(mut entry) = entry else {
        count_lost(LOST_CGROUP_NAMES);
        return;
    };
    let ev = entry.as_mut_ptr();
    unsafe {
        (*ev).id = dev as u64;
        (*ev).what = DISK_RULES_SEEN;
        (*ev).len = 0;
    }
    entry.submit(0);
}
