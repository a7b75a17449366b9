//! The replay on synthetic streams: batches, front merges, cgroups, splits, request merges,
//! requeues, flushes, inference and orphans, throttling, rendering, limits.
use mergetrace_common::{flags, kind, path};

use super::*;
use crate::{offline::names::Names, testing::synth::Synth};

const DEV: u32 = 7 << 20 | 2;

fn one_batch(reverse: bool) -> (Synth, Lineage) {
    let mut s = Synth::new();
    s.batch(DEV, 100, 0, 32, 4096, reverse, path::PLUG);
    let l = trace(&s.events, None);
    (s, l)
}

#[test]
fn lineage_batch_of_back_merges_is_exact() {
    let (s, l) = one_batch(false);
    assert_eq!(l.requests.len(), 1);
    let r = &l.requests[0];
    assert_eq!(r.matched, Match::Exact);
    assert!(r.consistent());
    assert_eq!(r.bios.len(), 32);
    assert_eq!(r.bio_count, 32);
    assert_eq!(r.bios[0].join, Join::NewRequest);
    assert!(r.bios[1..]
        .iter()
        .all(|b| b.join == Join::BackMerge(path::PLUG)));
    // chain order = sector order, first bio = the getrq bio = the issue's aux64
    assert_eq!(r.bios[0].bio, r.first_bio);
    assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
    assert!(r.bios.iter().all(|b| b.queue_ts.is_some() && !b.ambiguous));
    assert_eq!(r.complete_ts, Some(s.last_ts()));
    assert_eq!(l.stats.consistent, 1);
    assert_eq!(l.stats.orphan_merges, 0);
    assert_eq!(l.stats.never_issued, 0);
}

#[test]
fn lineage_reverse_batch_is_front_merges() {
    let (_, l) = one_batch(true);
    assert_eq!(l.requests.len(), 1);
    let r = &l.requests[0];
    assert_eq!(
        r.matched,
        Match::Exact,
        "first bio follows the front merges"
    );
    assert!(r.consistent());
    assert_eq!(r.sector, 0);
    // the last bio submitted (lowest sector) is first in the chain
    assert_eq!(r.bios[0].join, Join::FrontMerge(path::PLUG));
    assert_eq!(r.bios[31].join, Join::NewRequest);
    assert_eq!(r.bios[0].bio, r.first_bio);
    assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
}

#[test]
fn lineage_two_cgroups_interleaved_never_mix() {
    let mut s = Synth::new();
    // Two cgroups write adjacent ranges, their bios interleaved one by one: cgroup 100
    // sectors 0..256, cgroup 200 sectors 256..512 (so 200's first bio starts where 100's
    // request ends: only the cgroup tells them apart).
    let mut a = s.open(DEV, 100, 0, 4096);
    let mut b = s.open(DEV, 200, 256, 4096);
    for _ in 1..32 {
        s.add(&mut a, 4096, path::PLUG);
        s.add(&mut b, 4096, path::PLUG);
    }
    s.unplug(DEV, 2, true);
    let ra = s.issue(&a);
    let rb = s.issue(&b);
    s.complete_rq(&a, ra);
    s.complete_rq(&b, rb);
    let l = trace(&s.events, None);
    assert_eq!(l.requests.len(), 2);
    for (r, cg) in l.requests.iter().zip([100, 200]) {
        assert_eq!(r.matched, Match::Exact);
        assert!(r.consistent(), "{r:?}");
        assert_eq!(r.bios.len(), 32);
        assert!(r.bios.iter().all(|b| b.cgroup_id == cg));
        assert!(r.bios.iter().all(|b| !b.ambiguous));
    }
}

#[test]
fn lineage_split_pieces_keep_their_parent() {
    let mut s = Synth::new();
    // One 1 MiB bio split in two 512 KiB pieces: the front piece is a new bio, the
    // original continues as the remainder.
    let parent = s.bio_queue(DEV, 100, 1, 0, 1 << 20, flags::RULES_IOPS);
    let piece = s.split(DEV, 100, parent, 0, 512 << 10);
    s.getrq(DEV, 100, piece, 0, 512 << 10);
    let r1 = s.request(DEV, 100, piece, 0, 512 << 10);
    let rq1 = s.issue(&r1);
    s.getrq(DEV, 100, parent, 1024, 512 << 10);
    let r2 = s.request(DEV, 100, parent, 1024, 512 << 10);
    let rq2 = s.issue(&r2);
    s.complete_rq(&r1, rq1);
    s.complete_rq(&r2, rq2);
    let l = trace(&s.events, None);
    assert_eq!(l.requests.len(), 2);
    let (r1, r2) = (&l.requests[0], &l.requests[1]);
    assert!(r1.consistent() && r2.consistent());
    assert_eq!(r1.bios[0].split_from, Some(parent));
    assert_eq!(r1.bios[0].bio, piece);
    assert!(
        r1.bios[0].queue_ts.is_some(),
        "inherits the parent's bio_queue"
    );
    assert!(r1.bios[0].charged);
    assert_eq!(r2.bios[0].split_from, None);
    assert_eq!(r2.bios[0].bio, parent);
    assert_eq!(r2.bios[0].bytes, 512 << 10);
    assert_eq!(l.stats.split_pieces, 1);
    assert_eq!(l.stats.without_queue, 0);
    assert_eq!(l.stats.consistent, 2);
}

#[test]
fn lineage_request_merge_after_insert() {
    let mut s = Synth::new();
    // Elevator: two requests inserted, then a bio back-merges into the first, which now
    // touches the second: the second is absorbed (rq_merge) into the first.
    let mut a = s.open(DEV, 100, 0, 4096);
    s.add(&mut a, 4096, path::PLUG);
    s.insert(&mut a);
    let mut b = s.open(DEV, 100, 24, 4096);
    s.add(&mut b, 4096, path::PLUG);
    s.insert(&mut b);
    s.add(&mut a, 4096, path::ELEVATOR); // a now ends at sector 24, where b starts
    s.absorb(&mut a, &b);
    let rq = s.issue(&a);
    s.complete_rq(&a, rq);
    let l = trace(&s.events, None);
    assert_eq!(l.requests.len(), 1, "{:?}", l.requests);
    let r = &l.requests[0];
    assert_eq!(r.matched, Match::Exact);
    assert!(r.consistent(), "{r:?}");
    assert_eq!(r.bio_count, 5);
    assert_eq!(r.absorbed, 1);
    assert!(r.insert_ts.is_some());
    let via: Vec<bool> = r.bios.iter().map(|b| b.via_request_merge).collect();
    assert_eq!(via, [false, false, false, true, true]);
    assert_eq!(r.bios[2].join, Join::BackMerge(path::ELEVATOR));
    assert_eq!(r.bios[3].join, Join::NewRequest);
    assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
}

#[test]
fn lineage_front_merge_then_request_merge() {
    let mut s = Synth::new();
    // a = [0, 8), b = [16, 24); a bio at [8, 16) front-merges into b, then b is absorbed
    // into a (attempt_front_merge: prev = a).
    let a = {
        let mut a = s.open(DEV, 100, 0, 4096);
        s.insert(&mut a);
        a
    };
    let mut a = a;
    let mut b = s.open(DEV, 100, 16, 4096);
    s.insert(&mut b);
    s.add_front(&mut b, 4096, path::ELEVATOR);
    s.absorb(&mut a, &b);
    let rq = s.issue(&a);
    s.complete_rq(&a, rq);
    let l = trace(&s.events, None);
    assert_eq!(l.requests.len(), 1);
    let r = &l.requests[0];
    assert!(r.consistent(), "{r:?}");
    assert_eq!(r.matched, Match::Exact);
    let joins: Vec<Join> = r.bios.iter().map(|b| b.join).collect();
    assert_eq!(
        joins,
        [
            Join::NewRequest,
            Join::FrontMerge(path::ELEVATOR),
            Join::NewRequest
        ]
    );
}

#[test]
fn lineage_requeue_is_one_request_and_flush_has_no_bios() {
    let mut s = Synth::new();
    let mut a = s.open(DEV, 100, 0, 4096);
    let rq = s.issue(&a);
    s.requeue(&mut a, rq);
    s.insert(&mut a);
    s.issue(&a);
    s.complete_rq(&a, rq);
    s.flush(DEV);
    let l = trace(&s.events, None);
    assert_eq!(l.requests.len(), 2);
    assert_eq!(l.requests[0].requeues, 1);
    assert!(l.requests[0].complete_ts.is_some());
    assert!(l.requests[0].consistent());
    assert_eq!(l.requests[1].matched, Match::NoBios);
    assert!(l.requests[1].consistent());
    assert_eq!(l.stats.requests, 2);
}

#[test]
fn lineage_ambiguous_and_orphans_are_reported() {
    let mut s = Synth::new();
    // Two pending requests of one cgroup end at the same sector (the same range written
    // twice): a back merge there could go to either.
    let a = s.open(DEV, 100, 0, 4096);
    let mut b = s.open(DEV, 100, 0, 4096);
    s.add(&mut b, 4096, path::ELEVATOR);
    // A merge into a request the capture never saw built.
    let lone = s.bio_queue(DEV, 100, 1, 5000, 4096, 0);
    s.raw(kind::BACK_MERGE, DEV, 100, lone, 5000, 4096, path::PLUG);
    let rb = s.issue(&b);
    let ra = s.issue(&a);
    s.complete_rq(&b, rb);
    s.complete_rq(&a, ra);
    let l = trace(&s.events, None);
    assert_eq!(l.stats.orphan_merges, 1);
    assert_eq!(l.stats.ambiguous, 1);
    assert!(l.requests.iter().all(|r| r.consistent()));
    // A request whose building the capture missed.
    let mut s2 = Synth::new();
    let r = s2.request(DEV, 100, 0xdead, 0, 4096);
    s2.issue(&r);
    let l2 = trace(&s2.events, None);
    assert_eq!(l2.requests[0].matched, Match::Unmatched);
    assert!(!l2.requests[0].consistent());
}

#[test]
fn lineage_throttle_wait_and_charge_follow_the_bio() {
    let mut s = Synth::new();
    // fentry tier: the release (with the measured wait) comes just before bio_queue,
    // which the throttle's dispatch work marks as released.
    let bio_addr = 0xffff_8880_0100_0100; // the next address Synth hands out
    s.raw(kind::THROTTLE_RELEASE, DEV, 100, bio_addr, 0, 4096, 0)
        .aux64 = 2_500_000;
    let bio = s.bio_queue(
        DEV,
        100,
        1,
        0,
        4096,
        flags::THROTTLE_RELEASED | flags::RULES_IOPS,
    );
    assert_eq!(bio, bio_addr);
    s.getrq(DEV, 100, bio, 0, 4096);
    let r = s.request(DEV, 100, bio, 0, 4096);
    let rq = s.issue(&r);
    s.complete_rq(&r, rq);
    let l = trace(&s.events, None);
    let b = &l.requests[0].bios[0];
    assert!(b.throttled && b.charged);
    assert_eq!(b.throttle_wait_ns, Some(2_500_000));
    assert!(l.requests[0].consistent());
}

#[test]
fn lineage_renders_text_and_json() {
    let (_, l) = one_batch(false);
    let h = crate::capture::Header {
        start_monotonic_ns: crate::testing::synth::START_NS,
        devices: vec![crate::capture::RecordedDevice {
            name: "loop2".into(),
            major: 7,
            minor: 2,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut names = Names::new(&h);
    let r = &l.requests[0];
    let text = render_text(r, &mut names);
    assert_eq!(text.lines().count(), 2 + 32, "{text}");
    assert!(text.starts_with("request 0x"), "{text}");
    assert!(text.contains("loop2 (unknown cgroup id 100) write: sector 0 + 256 (128.0 KiB), 32 bios (kernel counted 32), exact"), "{text}");
    assert!(text.contains("back merge (plug)"));
    let v = serde_json::to_value(to_json(r, &mut names)).unwrap();
    assert_eq!(v["type"], "request");
    assert_eq!(v["device"], "loop2");
    assert_eq!(v["bio_count"], 32);
    assert_eq!(v["bios_found"], 32);
    assert_eq!(v["bios_bytes"], 131072);
    assert_eq!(v["consistent"], true);
    assert_eq!(v["match"], "exact");
    assert_eq!(v["bios"][1]["merge_path"], "plug");
    assert_eq!(v["bios"][0]["join"], "new_request");
    assert!(v["bios"][0]["merge_path"].is_null());
    assert!(summary(&l.stats).starts_with("lineage: 1 requests, 1 consistent"));
}

#[test]
fn lineage_limit_keeps_the_first_requests_and_counts_all() {
    let mut s = Synth::new();
    for i in 0..5 {
        s.batch(DEV, 100, i * 1024, 8, 4096, false, path::PLUG);
    }
    let l = trace(&s.events, Some(2));
    assert_eq!(l.requests.len(), 2);
    assert_eq!(l.stats.requests, 5);
    assert_eq!(l.stats.consistent, 5);
    assert_eq!(l.stats.bios, 40);
}

#[test]
fn lineage_counts_requests_never_seen_completed() {
    let mut s = Synth::new();
    // Completed; issued twice with no completion between (found unseen at its second issue,
    // which starts a new request that completes); issued and never completed.
    let done = s.open(DEV, 100, 0, 4096);
    let rq = s.issue(&done);
    s.complete_rq(&done, rq);
    let twice = s.open(DEV, 100, 64, 4096);
    s.issue(&twice);
    let again = s.open(DEV, 100, 128, 4096);
    let again = crate::testing::synth::Rq {
        rq: twice.rq,
        ..again
    };
    let rq = s.issue(&again);
    s.complete_rq(&again, rq);
    let open = s.open(DEV, 100, 256, 4096);
    s.issue(&open);
    let l = trace(&s.events, None);
    assert_eq!(l.stats.requests, 4);
    assert_eq!(l.stats.completions_unseen, 1);
    assert_eq!(l.stats.never_completed, 1);
    let without: Vec<u64> = (l.requests.iter())
        .filter(|r| r.complete_ts.is_none())
        .map(|r| r.sector)
        .collect();
    assert_eq!(without, [64, 256]);
    assert!(summary(&l.stats).ends_with(
        "1 were issued again with no completion between (the kernel ended them without running \
         the completion program); 1 were issued and not seen completed by its end (in flight as \
         it ended, or ended unseen and their tag not issued again)"
    ));
}
