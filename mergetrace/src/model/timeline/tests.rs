//! The verdict over time, on synthetic runs replayed interval by interval as the live view
//! shows them: each case a way a whole-run average, or one interval's, told the wrong story.
use std::collections::BTreeMap;

use mergetrace_common::flags::{RULES_BPS, RULES_IOPS};

use crate::{
    model::{
        aggregate::Dir,
        dir_stats::DirStats,
        limits::{Effective, Limit},
        snapshot::Snapshot,
    },
    testing::{
        intervals::{replay, Limited, Replayed, LOOP7},
        synth::{Synth, START_NS},
    },
};

const SEC: u64 = 1_000_000_000;
const CG: u64 = 1;
const WRITE: u8 = 1;
const READ: u8 = 0;

fn limit(v: u64) -> Option<Limit> {
    Some(Limit {
        limit: v,
        cgroup: "/cg1".into(),
    })
}

/// `/cg1` limited by `e`.
fn limited(e: Effective) -> Limited {
    Limited(BTreeMap::from([("/cg1".to_string(), e)]))
}

/// Moves the stream's clock to `secs` seconds (and a little) after the start.
fn at(s: &mut Synth, secs: f64) {
    let t = START_NS + (secs * SEC as f64) as u64;
    s.sleep(t.saturating_sub(s.last_ts()));
}

/// `n` bios of `bytes` from the cgroup through blk-throttle, each its own request.
fn bios(s: &mut Synth, op: u8, n: u64, bytes: u32, rules: u8, waited: Option<u64>) {
    for i in 0..n {
        s.through_throttle((LOOP7, CG, op), (i * 8, bytes), rules, waited);
    }
}

fn row(s: &Snapshot, dir: Dir) -> &DirStats {
    let c = s.devices[0]
        .cgroups
        .iter()
        .find(|c| c.cgroup == "/cg1")
        .unwrap_or_else(|| panic!("no /cg1 row in {s:#?}"));
    c.dirs.get(dir)
}

fn verdict(s: &Snapshot, dir: Dir) -> &str {
    row(s, dir).verdict.as_deref().unwrap_or_default()
}

/// A run of `secs` seconds in 1 s intervals on the tracepoint tier.
fn run(s: &Synth, secs: u64, lookup: &mut Limited) -> Replayed {
    replay(
        &s.events,
        (START_NS, START_NS + secs * SEC, SEC),
        lookup,
        false,
    )
}

/// wbps 2 MiB/s; the cgroup idle for a second, then 4 s of 64 KiB bios, every one of which
/// waited, then idle again. Over the 6 s the average is 67 % — it used to say "is 67 %
/// used" of a limit that held every bio. Over the 4 s it did I/O it is 100 %, held in all 4.
#[test]
fn a_limit_that_held_every_bio_is_not_averaged_away_by_idle_time() {
    let mut s = Synth::new();
    for sec in 1..5 {
        at(&mut s, sec as f64 + 0.01);
        bios(&mut s, WRITE, 32, 64 << 10, RULES_BPS, Some(SEC / 2));
    }
    let mut lookup = limited(Effective {
        wbps: limit(2 << 20),
        ..Default::default()
    });
    let r = run(&s, 6, &mut lookup);
    let w = row(&r.total, Dir::Write);
    let u = &w.limits["wbps"];
    assert!((u.used_pct - 66.7).abs() < 0.1, "{u:?}");
    assert!((u.used_pct_active.unwrap() - 100.0).abs() < 0.1, "{u:?}");
    assert_eq!((u.held, u.intervals_held), (true, Some(4)));
    let t = w.over_time.unwrap();
    assert_eq!(
        (
            t.intervals,
            t.active_intervals,
            t.active_secs,
            t.waited_intervals
        ),
        (6, 4, 4.0, 4)
    );
    assert_eq!(
        verdict(&r.total, Dir::Write),
        "wbps 2.0 MiB/s (set on /cg1) held it back in 4 of the 4 intervals with I/O: all 128 \
         bios waited; 100 % used over the 4.0 s it did I/O; merging does not change bytes, so \
         it cannot raise your throughput"
    );
    // Each busy interval says so too; the idle ones have no row.
    let busy: Vec<&Snapshot> = r
        .intervals
        .iter()
        .filter(|i| !i.devices[0].cgroups.is_empty())
        .collect();
    assert_eq!(busy.len(), 4);
    for i in busy {
        assert!(
            verdict(i, Dir::Write).starts_with(
                "wbps 2.0 MiB/s (set on /cg1) held it back: all 32 bios waited; 100 % used;"
            ),
            "{}",
            verdict(i, Dir::Write)
        );
        assert_eq!(
            row(i, Dir::Write).over_time,
            None,
            "only the whole run has it"
        );
    }
}

/// wiops 200 and wbps 1 MiB/s. For 2 s small bios wait for wiops (at 100 % of it, 78 % of
/// wbps), then for 3 s 1 MiB bios wait for wbps. The whole-run averages (wiops 34 %, wbps
/// 76 %) named wbps alone and called wiops "not binding"; each held in its own intervals.
#[test]
fn each_limit_is_named_for_the_intervals_it_held() {
    let mut s = Synth::new();
    for sec in 0..2 {
        at(&mut s, sec as f64 + 0.01);
        bios(
            &mut s,
            WRITE,
            200,
            4096,
            RULES_IOPS | RULES_BPS,
            Some(SEC / 4),
        );
    }
    for sec in 2..5 {
        at(&mut s, sec as f64 + 0.01);
        bios(
            &mut s,
            WRITE,
            1,
            1 << 20,
            RULES_IOPS | RULES_BPS,
            Some(SEC / 2),
        );
    }
    let mut lookup = limited(Effective {
        wiops: limit(200),
        wbps: limit(1 << 20),
        ..Default::default()
    });
    let r = run(&s, 5, &mut lookup);
    let w = row(&r.total, Dir::Write);
    assert_eq!(w.limits["wiops"].intervals_held, Some(2));
    assert_eq!(w.limits["wbps"].intervals_held, Some(3));
    let v = verdict(&r.total, Dir::Write);
    assert!(
        v.starts_with(
            "wbps 1.0 MiB/s (set on /cg1) held it back in 3 of the 5 intervals with I/O: all 403 \
             bios waited;"
        ) && v
            .contains("wiops 200 (set on /cg1) held it back in 2 of the 5 intervals with I/O too;")
            && !v.contains("not binding"),
        "{v}"
    );
    for (i, held) in r
        .intervals
        .iter()
        .zip(["wiops", "wiops", "wbps", "wbps", "wbps"])
    {
        let l = &row(i, Dir::Write).limits;
        let named: Vec<&str> = l.iter().filter(|(_, u)| u.held).map(|(n, _)| *n).collect();
        assert_eq!(named, [held], "{l:?}");
    }
}

/// wbps 1 MiB/s and one 2 MiB bio: it waits 2 s and is charged when released. On the
/// tracepoint tier it shows only then, as 200 % of the rate in that interval (said, and why);
/// on the fentry tier its queueing shows too, and the intervals it waited through count as
/// held although nothing of the cgroup moved in them.
#[test]
fn a_large_bio_charged_when_released() {
    let mut lookup = limited(Effective {
        wbps: limit(1 << 20),
        ..Default::default()
    });
    let mut s = Synth::new();
    at(&mut s, 1.01);
    s.throttle_queue(LOOP7, CG, WRITE);
    at(&mut s, 3.01);
    s.through_throttle((LOOP7, CG, WRITE), (0, 2 << 20), RULES_BPS, Some(2 * SEC));

    let r = run(&s, 5, &mut lookup);
    let released = &r.intervals[3];
    assert!(
        verdict(released, Dir::Write).starts_with(
            "wbps 1.0 MiB/s (set on /cg1) held it back: its one bio waited; it was charged 200 % \
             of its rate (bios held back earlier are charged as they are released);"
        ),
        "{}",
        verdict(released, Dir::Write)
    );
    assert_eq!(
        row(&r.total, Dir::Write).limits["wbps"].intervals_held,
        Some(1)
    );
    // The whole run: the tier saw one busy second, and says how long the charge took at the
    // limit's rate.
    assert!(
        verdict(&r.total, Dir::Write).contains(
            "it was charged 200 % of its rate over the 1.0 s it did I/O, 2.0 s at its rate (bios \
             held back earlier are charged as they are released)"
        ),
        "{}",
        verdict(&r.total, Dir::Write)
    );

    let f = replay(
        &s.events,
        (START_NS, START_NS + 5 * SEC, SEC),
        &mut lookup,
        true,
    );
    let w = row(&f.total, Dir::Write);
    let t = w.over_time.unwrap();
    assert_eq!((t.active_intervals, t.waited_intervals), (3, 3));
    assert_eq!(w.limits["wbps"].intervals_held, Some(3));
    assert_eq!(w.throttled.queued, Some(1));
    assert!(
        verdict(&f.total, Dir::Write).starts_with(
            "wbps 1.0 MiB/s (set on /cg1) held it back in 3 of the 3 intervals with I/O: its \
             one bio waited (2 s in all); 67 % used over the 3.0 s it did I/O;"
        ),
        "{}",
        verdict(&f.total, Dir::Write)
    );
    // The interval the bio entered the queue in: held, nothing charged yet.
    assert!(
        verdict(&f.intervals[1], Dir::Write).starts_with(
            "wbps 1.0 MiB/s (set on /cg1) held it back: a bio entered its queue; 0 % used;"
        ),
        "{}",
        verdict(&f.intervals[1], Dir::Write)
    );
    // The interval it waited through has no row: nothing of it moved.
    assert!(f.intervals[2].devices[0].cgroups.is_empty());
}

/// An interval in which blk-throttle released bios that had waited 11 s, with little charged
/// in it: the limit held them; it used to read "0 % used: not binding".
#[test]
fn bios_released_after_a_long_wait_are_held_whatever_the_use() {
    let mut s = Synth::new();
    at(&mut s, 0.5);
    bios(&mut s, WRITE, 2, 4096, RULES_IOPS, Some(11 * SEC / 2));
    let mut lookup = limited(Effective {
        wiops: limit(1000),
        ..Default::default()
    });
    let r = replay(
        &s.events,
        (START_NS, START_NS + SEC, SEC),
        &mut lookup,
        true,
    );
    let v = verdict(&r.intervals[0], Dir::Write);
    assert!(
        v.starts_with(
            "wiops 1000 (set on /cg1) held it back: all 2 bios waited (11 s in all); 0 % used by \
             bios;"
        ),
        "{v}"
    );
    assert!(!v.contains("not binding"), "{v}");
}

/// Reads and writes of one cgroup: wiops 200 holds the writes, the reads never wait (riops
/// far away). The reads' verdict names the write limit instead of stopping at "not binding";
/// without a read limit it still names it.
#[test]
fn reads_held_back_by_the_write_limit_name_it() {
    let mut s = Synth::new();
    for sec in 0..3 {
        at(&mut s, sec as f64 + 0.01);
        bios(&mut s, WRITE, 200, 4096, RULES_IOPS, Some(SEC / 4));
        bios(&mut s, READ, 50, 4096, RULES_IOPS, None);
    }
    let mut lookup = limited(Effective {
        wiops: limit(200),
        riops: limit(10_000),
        ..Default::default()
    });
    let r = run(&s, 3, &mut lookup);
    let reads = verdict(&r.total, Dir::Read);
    assert_eq!(
        reads,
        "riops 10000 (set on /cg1) is 0 % used over the 3.0 s it did I/O: not binding; its \
         writes were held back by wiops 200 (set on /cg1): a task that also waits for its \
         writes (one queue depth for both, an fsync) is held with them"
    );
    assert!(verdict(&r.intervals[1], Dir::Read).contains("its writes were held back by wiops 200"));
    assert!(verdict(&r.total, Dir::Write).starts_with("wiops 200 (set on /cg1) held it back"));
    let mut writes_only = limited(Effective {
        wiops: limit(200),
        ..Default::default()
    });
    let r = run(&s, 3, &mut writes_only);
    assert!(
        verdict(&r.total, Dir::Read)
            .starts_with("no read limit; its writes were held back by wiops 200"),
        "{}",
        verdict(&r.total, Dir::Read)
    );
}

/// The JSON of a whole run carries what the verdict rests on; intervals do not.
#[test]
fn the_whole_runs_json_has_over_time_and_intervals_held() {
    let mut s = Synth::new();
    at(&mut s, 0.01);
    bios(&mut s, WRITE, 10, 4096, RULES_IOPS, Some(SEC / 100));
    let mut lookup = limited(Effective {
        wiops: limit(20),
        ..Default::default()
    });
    let r = run(&s, 2, &mut lookup);
    let v = serde_json::to_value(&r.total).unwrap();
    let w = &v["devices"][0]["cgroups"][0]["write"];
    assert_eq!(w["over_time"]["intervals"], 2);
    assert_eq!(w["over_time"]["active_intervals"], 1);
    assert_eq!(w["over_time"]["active_secs"], 1.0);
    assert_eq!(w["over_time"]["waited_intervals"], 1);
    assert_eq!(w["limits"]["wiops"]["held"], true);
    assert_eq!(w["limits"]["wiops"]["intervals_held"], 1);
    assert_eq!(w["limits"]["wiops"]["used_pct"], 25.0);
    assert_eq!(w["limits"]["wiops"]["used_pct_active"], 50.0);
    assert!(w["throttled"]["queued"].is_null(), "tracepoint tier");
    let i = serde_json::to_value(&r.intervals[0]).unwrap();
    let w = &i["devices"][0]["cgroups"][0]["write"];
    assert!(w.get("over_time").is_none());
    assert!(w["limits"]["wiops"].get("intervals_held").is_none());
    assert_eq!(w["limits"]["wiops"]["held"], true);
}

/// A cgroup reclaimed into `(removed)` is forgotten; the others are kept.
#[test]
fn the_timeline_follows_the_living_cgroups() {
    let mut s = Synth::new();
    at(&mut s, 0.01);
    bios(&mut s, WRITE, 2, 4096, RULES_IOPS, None);
    s.through_throttle((LOOP7, 2, WRITE), (64, 4096), RULES_IOPS, None);
    let mut lookup = limited(Effective::default());
    let mut timeline = super::Timeline::default();
    for i in run(&s, 1, &mut lookup).intervals {
        timeline.observe(&i);
    }
    assert!(timeline.track(LOOP7, 2, Dir::Write).is_some());
    timeline.retain(|id| id == CG);
    assert!(timeline.track(LOOP7, 2, Dir::Write).is_none());
    assert!(timeline.track(LOOP7, CG, Dir::Write).is_some());
}
