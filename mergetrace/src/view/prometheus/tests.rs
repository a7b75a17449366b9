//! The model and the exposition against hand-built snapshots.
use super::*;
use crate::model::snapshot::{CgroupSnapshot, DeviceSnapshot, Directions, SnapshotKind};

pub fn write_stats(bios: u64, requests: u64) -> DirStats {
    let mut st = DirStats {
        bios,
        bytes: bios * 4096,
        merged: bios - requests,
        requests,
        request_bytes: bios * 4096,
        ..Default::default()
    };
    st.merged_by_path.plug = bios - requests;
    st
}

pub fn snapshot(rows: &[(&str, DirStats)]) -> Snapshot {
    Snapshot {
        kind: SnapshotKind::Total,
        start_ns: 0,
        end_ns: 1,
        tier: "tracepoint".into(),
        lost_events: 0,
        lost_by_kind: BTreeMap::new(),
        changes: Vec::new(),
        program_stats: Vec::new(),
        unsaid: Default::default(),
        devices: vec![DeviceSnapshot {
            device: "loop3".into(),
            major: 7,
            minor: 3,
            cgroups: rows
                .iter()
                .enumerate()
                .map(|(i, (path, st))| CgroupSnapshot {
                    cgroup: path.to_string(),
                    cgroup_id: i as u64 + 10,
                    gone: false,
                    name: crate::sys::container::readable(path),
                    dirs: Directions {
                        write: st.clone(),
                        ..Default::default()
                    },
                })
                .collect(),
            total: Directions::default(),
            unplug: Default::default(),
        }],
    }
}

pub fn parse(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

pub fn sample_lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn bucket_bounds() {
    let s = size_bounds();
    assert_eq!((s[0], s[14]), (512.0, 8.0 * 1048576.0));
    assert!(s[15].is_infinite());
    let c = bpr_bounds();
    assert_eq!((c[0], c[1], c[10]), (1.0, 3.0, 2047.0));
    assert!(c[11].is_infinite());
    assert_eq!(bucket_of(u64::MAX, &s), 15);
    assert_eq!(bucket_of(4096, &s), 3);
    assert_eq!(bucket_of(63, &c), 5);
}

#[test]
fn folds_cgroups_beyond_the_limit_and_stays_monotonic() {
    let mut m = Model::new(2, "tracepoint");
    m.update(&snapshot(&[
        ("/a", write_stats(10, 1)),
        ("/b", write_stats(20, 2)),
        ("/c", write_stats(30, 3)),
        ("/d", write_stats(40, 4)),
    ]));
    let text = m.render();
    assert!(text.contains(
        "mergetrace_bios_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\",name=\"\"} 10\n"
    ));
    assert!(text.contains(
        "mergetrace_bios_total{device=\"loop3\",cgroup=\"/b\",direction=\"write\",name=\"\"} 20\n"
    ));
    assert!(text.contains("mergetrace_bios_total{device=\"loop3\",cgroup=\"(other)\",direction=\"write\",name=\"\"} 70\n"), "{text}");
    assert!(!text.contains("cgroup=\"/c\""));
    assert!(text.contains("mergetrace_cgroups_folded 2\n"));
    // A new cgroup later sorts first, but the labels handed out stay: /aa goes to (other).
    m.update(&snapshot(&[
        ("/a", write_stats(11, 1)),
        ("/aa", write_stats(5, 5)),
        ("/b", write_stats(20, 2)),
        ("/c", write_stats(30, 3)),
        ("/d", write_stats(40, 4)),
    ]));
    let text = m.render();
    assert!(text.contains(
        "mergetrace_bios_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\",name=\"\"} 11\n"
    ));
    assert!(text.contains("mergetrace_bios_total{device=\"loop3\",cgroup=\"(other)\",direction=\"write\",name=\"\"} 75\n"), "{text}");
    assert!(text.contains("mergetrace_cgroups_folded 3\n"));
    let labels: BTreeSet<&str> = m.rows.keys().map(|k| k.cgroup.as_str()).collect();
    assert_eq!(labels, BTreeSet::from(["/a", "/b", OTHER]));
    // A derived value that dips (a requeue) never makes the counter go back.
    m.update(&snapshot(&[("/a", write_stats(11, 0))]));
    let k = SeriesKey {
        device: "loop3".into(),
        cgroup: "/a".into(),
        direction: "write",
        name: String::new(),
    };
    assert_eq!(m.rows[&k].requests, 1);
    assert_eq!(m.rows[&k].bios, 11);
    // (other) keeps its series even when nothing folded shows up in a scrape
    assert!(m.render().contains("cgroup=\"(other)\""));
}

/// A snapshot at `end_ns` of (path, cgroup id, write bios) rows.
fn snapshot_at(end_ns: u64, rows: &[(&str, u64, u64)]) -> Snapshot {
    let mut s = snapshot(
        &rows
            .iter()
            .map(|(p, _, bios)| (*p, write_stats(*bios, 1)))
            .collect::<Vec<_>>(),
    );
    s.end_ns = end_ns;
    for (cg, (_, id, _)) in s.devices[0].cgroups.iter_mut().zip(rows) {
        cg.cgroup_id = *id;
    }
    s
}

fn bios_by_cgroup(m: &Model) -> BTreeMap<String, u64> {
    m.rows
        .iter()
        .map(|(k, r)| (k.cgroup.clone(), r.bios))
        .collect()
}

#[test]
fn reclaimed_cgroups_keep_their_series_until_the_label_is_recycled() {
    let mut m = Model::with_staleness(2, "tracepoint", std::time::Duration::from_nanos(10));
    m.update(&snapshot_at(0, &[("/a", 1, 10), ("/b", 2, 20)]));
    // /a was reclaimed: the kernel shows its 10 and 1 late bio as (removed). Its series
    // keeps 10, (removed) shows only the rest; /c finds the labels taken.
    m.update(&snapshot_at(
        5,
        &[
            ("(removed)", REMOVED_CGROUP, 11),
            ("/b", 2, 20),
            ("/c", 3, 5),
        ],
    ));
    let want = |v: &[(&str, u64)]| {
        v.iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        bios_by_cgroup(&m),
        want(&[("(removed)", 1), ("/a", 10), ("/b", 20), (OTHER, 5)])
    );
    // /a unused for 10 ns: its label is recycled, its 10 move to (removed), and the new
    // /d gets the label. /c stays in (other) while it is counted.
    m.update(&snapshot_at(
        20,
        &[
            ("(removed)", REMOVED_CGROUP, 11),
            ("/b", 2, 20),
            ("/c", 3, 5),
            ("/d", 4, 7),
        ],
    ));
    assert_eq!(
        bios_by_cgroup(&m),
        want(&[("(removed)", 11), ("/b", 20), ("/d", 7), (OTHER, 5)])
    );
    assert_eq!(m.labelled_cgroups(), 2);
    // A new cgroup of a labelled path (a restarted unit) continues its series.
    m.update(&snapshot_at(
        21,
        &[
            ("(removed)", REMOVED_CGROUP, 18),
            ("/b", 2, 20),
            ("/c", 3, 5),
            ("/d", 5, 2),
        ],
    ));
    assert_eq!(
        bios_by_cgroup(&m),
        want(&[("(removed)", 11), ("/b", 20), ("/d", 9), (OTHER, 5)])
    );
}

#[test]
fn names_are_a_label_fixed_per_cgroup() {
    let id = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
    let path = format!("/system.slice/docker-{id}.scope");
    let mut m = Model::new(10, "tracepoint");
    m.update(&snapshot(&[
        (&path, write_stats(4, 1)),
        ("/mt", write_stats(2, 1)),
    ]));
    let want = |n: u64| {
        format!("mergetrace_bios_total{{device=\"loop3\",cgroup=\"{path}\",direction=\"write\",name=\"docker:3f2a9c1b7d4e\"}} {n}\n")
    };
    let text = m.render();
    assert!(text.contains(&want(4)), "{text}");
    assert!(
        text.contains("cgroup=\"/mt\",direction=\"write\",name=\"\"} 2\n"),
        "{text}"
    );
    // A name the runtime's files give later does not start a second series.
    let mut s = snapshot(&[(&path, write_stats(5, 1))]);
    s.devices[0].cgroups[0].name.as_mut().unwrap().short = "docker:web (3f2a9c1b7d4e)".into();
    m.update(&s);
    let text = m.render();
    assert!(text.contains(&want(5)), "{text}");
    assert!(!text.contains("docker:web"), "{text}");
    assert_eq!(sample_lines(&text, "mergetrace_bios_total{").len(), 2);
}

#[test]
fn delay_is_zero_when_nothing_waited_and_absent_when_unknown() {
    let mut waited = write_stats(4, 4);
    waited.throttled.bios = 2; // no limit known: no estimate
    waited.throttled.delay_estimated = true;
    let mut m = Model::new(10, "tracepoint");
    m.update(&snapshot(&[("/a", write_stats(4, 4)), ("/b", waited)]));
    let text = m.render();
    assert!(text.contains("mergetrace_throttle_delay_seconds_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\",name=\"\"} 0.0\n"), "{text}");
    assert!(
        !text.contains("mergetrace_throttle_delay_seconds_total{device=\"loop3\",cgroup=\"/b\""),
        "{text}"
    );
    assert!(
        !text.contains("mergetrace_throttle_delay_estimated{device=\"loop3\",cgroup=\"/b\""),
        "{text}"
    );
}

#[test]
fn wbt_and_iocost_are_exported_where_on_and_fold_exactly() {
    use crate::model::{iocost::Charge, wbt::WbtCount};
    let mut buffered = write_stats(64, 2);
    buffered.meters.wbt = Some(WbtCount::of(2, 2));
    let mut direct = write_stats(32, 1);
    direct.meters.wbt = Some(WbtCount::of(1, 0));
    direct.meters.iocost = Some(Charge {
        requests: 1,
        merged: 31,
        cost_us: 2_000_000.0,
        ..Default::default()
    });
    // /b and /c folded into "(other)": its sums stay exact, and /c (neither meter on) adds
    // nothing to them.
    let mut m = Model::new(1, "tracepoint");
    m.update(&snapshot(&[
        ("/a", buffered),
        ("/b", direct),
        ("/c", write_stats(8, 8)),
    ]));
    let text = m.render();
    let wbt = sample_lines(&text, "mergetrace_wbt_requests_total");
    let series = |cg: &str, class: &str| {
        wbt.iter()
            .find(|l| l.contains(&format!("cgroup=\"{cg}\"")) && l.contains(class))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    assert_eq!(wbt.len(), 4, "{text}");
    assert_eq!(
        series("/a", "wbt=\"slot\"").as_deref(),
        Some("2"),
        "{wbt:?}"
    );
    assert_eq!(
        series("(other)", "wbt=\"passed\"").as_deref(),
        Some("1"),
        "{wbt:?}"
    );
    assert_eq!(
        series("(other)", "wbt=\"slot\"").as_deref(),
        Some("0"),
        "{wbt:?}"
    );
    let io = sample_lines(&text, "mergetrace_iocost_bios_total");
    assert!(
        io.iter()
            .any(|l| l.contains("charge=\"pages\"") && l.ends_with(" 31")),
        "{io:?}"
    );
    let secs = sample_lines(&text, "mergetrace_iocost_charged_seconds_total");
    assert_eq!(secs.len(), 1, "{text}");
    assert!(secs[0].ends_with(" 2.0"), "{secs:?}");
    parse(&text);
}
