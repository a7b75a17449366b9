//! The two ways of counting bios and merges agree: per request (what every run counts) and
//! per bio (the oracle), on the synthetic streams of what the programs emit, for each place a
//! merge happens and each way a request goes.
use std::collections::BTreeMap;

use mergetrace_common::{flags, path};

use super::*;
use crate::{
    kernel::Wants,
    model::aggregate::{Aggregator, Key},
    testing::synth::Synth,
};

const DEV: u32 = (7 << 20) | 5;
const CG: u64 = 42;

/// The write direction's stats of `s`'s events, counted per request or per bio.
fn stats(s: &Synth, per_bio: bool) -> DirStats {
    let mut a = Aggregator::new(0);
    a.apply_all(&s.events);
    let w = a.total(u64::MAX);
    let key = Key {
        dev: DEV,
        cgroup_id: CG,
        dir: Dir::Write,
    };
    let none = BTreeMap::new();
    let opts = Options {
        tier: "tracepoint",
        fentry: false,
        meter_units: &[],
        subtree: None,
        iocost: &none,
        wbt: &BTreeMap::new(),
        iolatency: &BTreeMap::new(),
        timeline: None,
        wants: Wants::ALL,
        per_bio,
    };
    DirStats::from_counts(&w.counts[&key], Dir::Write, &opts)
}

/// Per request and per bio give the same bios, bytes, merges and merge paths; returns them.
fn agree(s: &Synth) -> DirStats {
    let (req, bio) = (stats(s, false), stats(s, true));
    assert_eq!(
        (req.bios, req.bytes, req.merged, req.merged_by_path),
        (bio.bios, bio.bytes, bio.merged, bio.merged_by_path),
        "per request (left) vs per bio (right)"
    );
    assert_eq!(
        req.requests + req.merged + req.flush_only,
        req.bios + req.splits
    );
    req
}

#[test]
fn plug_batches_back_and_front() {
    let mut s = Synth::new();
    s.batch(DEV, CG, 0, 32, 4096, false, path::PLUG);
    s.batch(DEV, CG, 1 << 20, 8, 4096, true, path::PLUG);
    let st = agree(&s);
    assert_eq!((st.bios, st.merged, st.merged_by_path.plug), (40, 38, 38));
}

#[test]
fn merges_in_the_plug_then_the_scheduler_then_a_request_merge() {
    let mut s = Synth::new();
    // a: 2 bios in the plug, inserted; b likewise further on.
    let mut a = s.open(DEV, CG, 0, 4096);
    s.add(&mut a, 4096, path::PLUG);
    s.insert(&mut a);
    let mut b = s.open(DEV, CG, 40, 4096);
    s.add(&mut b, 4096, path::PLUG);
    s.insert(&mut b);
    // In the scheduler: a bio front-merges into b, two back-merge into a, which then
    // reaches b and absorbs it.
    s.add_front(&mut b, 4096, path::ELEVATOR);
    s.add(&mut a, 4096, path::ELEVATOR);
    s.add(&mut a, 4096, path::ELEVATOR);
    s.absorb(&mut a, &b);
    let rq = s.issue(&a);
    s.complete_rq(&a, rq);
    let st = agree(&s);
    let p = st.merged_by_path;
    assert_eq!((st.bios, st.requests, st.merged), (7, 1, 6));
    assert_eq!(
        (p.plug, p.elevator_back, p.elevator_front, p.request),
        (2, 2, 1, 1)
    );
}

#[test]
fn software_queue_merges_and_a_requeued_request_that_takes_more() {
    let mut s = Synth::new();
    let mut a = s.open(DEV, CG, 0, 4096);
    s.insert(&mut a);
    s.add(&mut a, 4096, path::SW_QUEUE);
    let rq = s.issue(&a);
    // Handed back, put back at the head of the software queue, where one more bio joins.
    s.requeue(&mut a, rq);
    s.insert(&mut a);
    s.add(&mut a, 4096, path::SW_QUEUE);
    s.reissue(&a);
    s.complete_rq(&a, rq);
    // A direct issue of a plug batch beside it.
    s.batch(DEV, CG, 1 << 20, 4, 4096, false, path::PLUG);
    let st = agree(&s);
    assert_eq!(
        (st.bios, st.merged_by_path.sw_queue, st.merged_by_path.plug),
        (7, 2, 3)
    );
    assert_eq!((st.requests, st.requeues), (2, 1));
}

#[test]
fn split_pieces_and_flush_only_writes() {
    let mut s = Synth::new();
    // A 12 KiB bio split twice: three pieces, each its own request; one bio.
    let bio = s.bio_queue(DEV, CG, 1, 0, 12288, 0);
    let p1 = s.split(DEV, CG, bio, 0, 4096);
    let p2 = s.split(DEV, CG, bio, 8, 4096);
    for (piece, sector) in [(p1, 0), (p2, 8)] {
        s.getrq(DEV, CG, piece, sector, 4096);
        let r = s.request(DEV, CG, piece, sector, 4096);
        s.issue(&r);
    }
    s.getrq(DEV, CG, bio, 16, 4096);
    let rest = s.request(DEV, CG, bio, 16, 4096);
    s.issue(&rest);
    // An fsync's data-less flush write: a bio, a new request never issued as a write.
    let empty = s.bio_queue(DEV, CG, 1, 0, 0, flags::FLUSH_SEQ);
    s.getrq(DEV, CG, empty, 0, 0);
    let st = agree(&s);
    assert_eq!(
        (st.bios, st.splits, st.requests, st.merged, st.flush_only),
        (2, 2, 3, 0, 1)
    );
}

/// fentry tier: a bio queued in one window is charged and released in a later one, maybe
/// with its request in the window after that. The window of the release is not empty.
#[test]
fn a_window_with_only_a_release_and_its_charge_is_not_empty() {
    assert!(DirStats::default().is_empty());
    let released = DirStats {
        charged_ios: 1,
        charged_bytes: 262_144,
        throttled: Throttled {
            bios: 1,
            queued: Some(0),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(!released.is_empty());
    for one in [
        DirStats {
            charged_ios: 1,
            ..Default::default()
        },
        DirStats {
            charged_bytes: 4096,
            ..Default::default()
        },
        DirStats {
            throttled: Throttled {
                bios: 1,
                ..Default::default()
            },
            ..Default::default()
        },
    ] {
        assert!(!one.is_empty(), "{one:?}");
    }
}
