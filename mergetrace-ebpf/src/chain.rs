//! Walks along a request's bio chain (`rq->bio` → `bi_next`), in two builds of each request
//! program:
//!
//! - from 5.17, through the kernel's `bpf_loop`: the verifier checks the step once;
//! - before it (the `_bl` programs), as bounded loops, which the verifier checks iteration by
//!   iteration (up to `MAX_CHAIN` = 512), again on every path the program can take to them.
//!
//! On 6.1 the request programs of a live view took the verifier through 153,000 instructions
//! as loops, 16,400 with `bpf_loop` (seconds at every start under emulation). The counts the
//! walks return are the same either way.
//!
//! What a step adds to lives in a map (`read::untracked_sum`), not on the stack: the verifier
//! then sees the step's state alike on every iteration (from 6.8 it checks a callback until
//! its state stops changing, and a count on the stack never does) and the walk's result as a
//! number it knows nothing about (6.1 checks the callback once and would otherwise take the
//! count after one step for the count after the loop).
use aya_ebpf::helpers::bpf_loop;
use mergetrace_common::MAX_CHAIN;

use crate::{
    maps::{off, ABSORBED},
    read::{forget, pending_add, read, untracked_sum, Disk},
    request::Pending,
};

/// What a walk along a request's bio chain found.
pub struct Chain {
    /// Bios in the chain (up to `MAX_CHAIN`).
    pub bios: u32,
    /// Bios before `first_at_insert` (front merges in the queue); 0 without one.
    pub front: u32,
    /// Bios of absorbed requests found in the chain (from `ABSORBED`, taken out).
    pub absorbed: u32,
}

/// Walks the bio chain from `first` (`LOOP_HELPER`: through `bpf_loop`). With
/// `first_at_insert`, counts the bios in front of it; with `absorbed`, looks each bio up in
/// `ABSORBED` (requests this one absorbed start there). One simple loop per question: a
/// bounded loop that carries several counts, or a flag it tests, has the verifier check every
/// combination of iterations (E2BIG).
#[inline(always)]
pub fn walk<const LOOP_HELPER: bool>(
    first: u64,
    first_at_insert: u64,
    absorbed: bool,
    disk: Disk,
) -> Chain {
    Chain {
        bios: chain_len::<LOOP_HELPER>(first, 0),
        front: if first_at_insert != 0 {
            chain_len::<LOOP_HELPER>(first, first_at_insert)
        } else {
            0
        },
        absorbed: if absorbed {
            let n = absorbed_in::<LOOP_HELPER>(first);
            pending_add(disk, Pending::Absorbed, -(n as i64));
            n as u32
        } else {
            0
        },
    }
}

/// Bios from `first` up to `stop` (or the chain's end), at most `MAX_CHAIN`.
#[inline(always)]
fn chain_len<const LOOP_HELPER: bool>(first: u64, stop: u64) -> u32 {
    // Most requests of random I/O carry one bio: its chain ends at once, no walk.
    if first != 0 && first != stop {
        let next: u64 = read(first, off!(bio_bi_next));
        if next == 0 || next == stop {
            return forget(1) as u32;
        }
    }
    if LOOP_HELPER {
        let Some(count) = untracked_sum() else {
            return 0;
        };
        let mut walk = ChainLen {
            bio: first,
            stop,
            count: count.word,
        };
        unsafe {
            bpf_loop(
                MAX_CHAIN,
                chain_len_step as *mut _,
                (&raw mut walk).cast(),
                0,
            )
        };
        return unsafe { *count.word } as u32;
    }
    let next_off = off!(bio_bi_next);
    let mut bio = first;
    let mut n = 0u32;
    while bio != 0 && bio != stop && n < MAX_CHAIN {
        n += 1;
        bio = read(bio, next_off);
    }
    // Through a map slot: the verifier then forgets which iteration ended the loop, so it
    // checks the rest of the program once instead of once per possible count (6.1 gave up
    // with E2BIG).
    forget(n as u64) as u32
}

/// [`chain_len`]'s walk for `bpf_loop`.
#[repr(C)]
struct ChainLen {
    bio: u64,
    stop: u64,
    count: *mut u64,
}

/// One bio of [`chain_len`]'s walk: 1 (stop) at the chain's end or at `stop`.
#[inline(never)]
extern "C" fn chain_len_step(_i: u64, walk: *mut ChainLen) -> i64 {
    let walk = unsafe { &mut *walk };
    if walk.bio == 0 || walk.bio == walk.stop {
        return 1;
    }
    unsafe { *walk.count += 1 };
    walk.bio = read(walk.bio, off!(bio_bi_next));
    0
}

/// The bios of requests absorbed into the chain from `first`, whose first bios `ABSORBED`
/// names (each entry taken out as found).
#[inline(always)]
fn absorbed_in<const LOOP_HELPER: bool>(first: u64) -> u64 {
    let Some(held) = untracked_sum() else {
        return 0;
    };
    let sum = held.word;
    if LOOP_HELPER {
        let mut walk = Absorbed { bio: first, sum };
        unsafe {
            bpf_loop(
                MAX_CHAIN,
                absorbed_step as *mut _,
                (&raw mut walk).cast(),
                0,
            )
        };
        return unsafe { *sum };
    }
    // The loop body is the same whether a bio is found or not (a lookup, a delete, an add of
    // what was found or 0): a branch that calls helpers on one side only left the verifier
    // unable to tell the two paths alike, and it checked the rest of the loop once per bio.
    let next_off = off!(bio_bi_next);
    let mut bio = first;
    let mut n = 0u32;
    while bio != 0 && n < MAX_CHAIN {
        n += 1;
        let key = bio;
        bio = read(bio, next_off);
        let found = unsafe { ABSORBED.get(&key) }.map_or(0, |c| *c) as u64;
        let _ = ABSORBED.remove(&key);
        unsafe { *sum += found };
    }
    unsafe { *sum }
}

/// [`absorbed_in`]'s walk for `bpf_loop`.
#[repr(C)]
struct Absorbed {
    bio: u64,
    sum: *mut u64,
}

/// One bio of [`absorbed_in`]'s walk: 1 (stop) at the chain's end.
#[inline(never)]
extern "C" fn absorbed_step(_i: u64, walk: *mut Absorbed) -> i64 {
    let walk = unsafe { &mut *walk };
    if walk.bio == 0 {
        return 1;
    }
    let key = walk.bio;
    walk.bio = read(walk.bio, off!(bio_bi_next));
    if let Some(found) = unsafe { ABSORBED.get(&key) } {
        unsafe { *walk.sum += *found as u64 };
        let _ = ABSORBED.remove(&key);
    }
    0
}
