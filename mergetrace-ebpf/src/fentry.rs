//! The fentry tier, where the kernel allows fentry/fexit: the exact time each throttled bio
//! waited (`__blk_throtl_bio` → `submit_bio_noacct_nocheck`) and what the merge machinery
//! tried, failed attempts included (`blk_attempt_plug_merge`, `elv_merge`).
use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};
use mergetrace_common::kind;

use crate::{
    bio::bio_event,
    charge::rule_flags,
    emit::{emit, emit_charge},
    maps::THROTTLE_ENTRY,
};

#[fentry(function = "__blk_throtl_bio")]
pub fn throtl_bio_entry(ctx: FEntryContext) -> u32 {
    if bio_event(ctx.arg(0), kind::THROTTLE_CHARGE).is_some() {
        let key: u64 = ctx.arg(0);
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = THROTTLE_ENTRY.insert(&key, &now, 0);
    }
    0
}

/// `__blk_throtl_bio` returns true when it queued the bio (throttled).
///
/// Map helpers take the bio address as a key through the stack, after which the verifier no
/// longer knows that stack slot holds a typed pointer: the programs read the argument from the
/// context again (`ctx.arg`) for field loads instead of reusing the key.
#[fexit(function = "__blk_throtl_bio")]
pub fn throtl_bio_exit(ctx: FExitContext) -> u32 {
    let throttled: u64 = ctx.arg(1);
    if let Some((mut ev, disk)) = bio_event(ctx.arg(0), kind::THROTTLE_CHARGE) {
        ev.path = (throttled & 0xff != 0) as u8;
        ev.flags |= rule_flags(ctx.arg(0), ev.op);
        emit_charge(&mut ev, disk.slot);
        if ev.path == 0 {
            let key: u64 = ctx.arg(0);
            let _ = THROTTLE_ENTRY.remove(&key);
        }
    }
    0
}

/// Throttled bios are issued from the dispatch work through `submit_bio_noacct_nocheck`.
#[fentry(function = "submit_bio_noacct_nocheck")]
pub fn throtl_release(ctx: FEntryContext) -> u32 {
    let key: u64 = ctx.arg(0);
    let Some(start) = (unsafe { THROTTLE_ENTRY.get(&key) }).copied() else {
        return 0;
    };
    let _ = THROTTLE_ENTRY.remove(&key);
    if let Some((mut ev, disk)) = bio_event(ctx.arg(0), kind::THROTTLE_RELEASE) {
        // The delay is measured whether or not events are sent.
        ev.aux64 = unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
        emit(&ev, disk.slot);
    }
    0
}

/// A plug merge attempt and whether it merged.
#[inline(always)]
fn plug_attempt(bio: u64, merged: u64) {
    if let Some((mut ev, disk)) = bio_event(bio, kind::PLUG_ATTEMPT) {
        ev.path = (merged & 0xff != 0) as u8;
        emit(&ev, disk.slot);
    }
}

/// `blk_attempt_plug_merge(q, bio, nr_segs)` → bool.
#[fexit(function = "blk_attempt_plug_merge")]
pub fn plug_attempt_exit(ctx: FExitContext) -> u32 {
    plug_attempt(ctx.arg(1), ctx.arg(3));
    0
}

/// Up to 5.15: `blk_attempt_plug_merge(q, bio, nr_segs, same_queue_rq)` → bool.
#[fexit(function = "blk_attempt_plug_merge")]
pub fn plug_attempt_exit_4(ctx: FExitContext) -> u32 {
    plug_attempt(ctx.arg(1), ctx.arg(4));
    0
}

/// `elv_merge(q, &req, bio)` → `enum elv_merge`.
#[fexit(function = "elv_merge")]
pub fn elv_merge_exit(ctx: FExitContext) -> u32 {
    let bio: u64 = ctx.arg(2);
    let decision: u64 = ctx.arg(3);
    if let Some((mut ev, disk)) = bio_event(bio, kind::ELV_MERGE) {
        ev.path = (decision & 0xff) as u8;
        emit(&ev, disk.slot);
    }
    0
}
