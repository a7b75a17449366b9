//! The snapshot's shape and the meters its rows carry, on synthetic windows.
use super::*;
use crate::model::aggregate::{tests::batch_of_32, Aggregator};

struct Fixed;
impl Lookup for Fixed {
    fn limits(&mut self, cgroup: &str, _dev: &Device) -> Effective {
        if cgroup == "/mt" {
            Effective {
                wiops: Some(crate::model::limits::Limit {
                    limit: 16,
                    cgroup: "/mt".into(),
                }),
                ..Default::default()
            }
        } else {
            Effective::default()
        }
    }
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        CgroupName {
            path: match id {
                21 => "/mt".into(),
                22 => "/mt/b".into(),
                24 => format!("/system.slice/docker-{}.scope", "ab".repeat(32)),
                _ => "/other".into(),
            },
            gone: id == 22,
        }
    }
}

/// The total of `a`'s events at `end_ns` on loop3, on the tracepoint tier.
fn total(
    a: &Aggregator,
    end_ns: u64,
    lookup: &mut dyn Lookup,
    meter_units: &[u64],
    subtree: Option<&str>,
    iocost: &BTreeMap<u32, iocost::Model>,
) -> Snapshot {
    let opts = Options {
        tier: "tracepoint",
        fentry: false,
        meter_units,
        subtree,
        iocost,
        wbt: &BTreeMap::new(),
        iolatency: &BTreeMap::new(),
        timeline: None,
        wants: Wants::ALL,
        per_bio: false,
    };
    build(
        &a.total(end_ns),
        SnapshotKind::Total,
        &[loop3()],
        lookup,
        &opts,
    )
}

fn loop3() -> Device {
    Device {
        name: "loop3".into(),
        major: 7,
        minor: 3,
        notes: vec![],
        bio_based: false,
    }
}

/// A batch of 32 merged 4 KiB writes on a disk where io.cost is on: its new request and its
/// merges carry the IOCOST flag, and the new request says whether io.cost found it random.
fn iocost_batch_of_32(cgroup: u64, random: bool) -> Vec<mergetrace_common::Event> {
    use mergetrace_common::{flags, kind};
    let mut events = batch_of_32(cgroup);
    for e in events.iter_mut() {
        if matches!(e.kind, kind::GETRQ | kind::BACK_MERGE) {
            e.flags |= flags::IOCOST;
            if e.kind == kind::GETRQ {
                e.path = random as u8;
            }
        }
    }
    events
}

/// io.cost's linear model at 100 MB/s and 1,000 sequential IOPS, the same for reads and
/// writes, on loop3: its coefficients and the per-device model map `total` takes.
fn linear_model_on_loop3(randiops: u64) -> (iocost::Coefs, BTreeMap<u32, iocost::Model>) {
    let coefs = iocost::Coefs::of(iocost::Linear {
        bps: 100_000_000,
        seqiops: 1000,
        randiops,
    });
    let model = iocost::Model {
        read: coefs,
        write: coefs,
    };
    (coefs, BTreeMap::from([(loop3().dev().0, model)]))
}

#[test]
fn json_has_the_documented_shape() {
    let mut a = Aggregator::new(100);
    a.apply_all(&batch_of_32(21));
    a.apply_all(&batch_of_32(22));
    a.apply_all(&batch_of_32(23));
    let s = total(
        &a,
        2_000_000_100,
        &mut Fixed,
        &[256 << 10],
        Some("/mt"),
        &BTreeMap::new(),
    );
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    assert_eq!(v["type"], "total");
    assert_eq!(v["tier"], "tracepoint");
    assert_eq!(v["lost_events"], 0);
    assert_eq!(
        (v["start_ns"].as_u64(), v["end_ns"].as_u64()),
        (Some(100), Some(2_000_000_100))
    );
    let dev = &v["devices"][0];
    assert_eq!(
        (
            dev["device"].as_str(),
            dev["major"].as_u64(),
            dev["minor"].as_u64()
        ),
        (Some("loop3"), Some(7), Some(3))
    );
    let cgs = dev["cgroups"].as_array().unwrap();
    assert_eq!(cgs.len(), 2, "the /other cgroup is outside the filter");
    assert_eq!(cgs[0]["cgroup"], "/mt");
    assert_eq!(cgs[0]["cgroup_id"], 21);
    assert!(cgs[0].get("gone").is_none());
    assert!(cgs[0].get("name").is_none(), "/mt is no container or unit");
    assert_eq!(cgs[1]["gone"], true);
    let w = &cgs[0]["write"];
    for (field, want) in [
        ("bios", 32),
        ("bytes", 131072),
        ("merged", 31),
        ("requests", 1),
        ("request_bytes", 131072),
    ] {
        assert_eq!(w[field].as_u64(), Some(want), "{field}");
    }
    assert_eq!(w["merged_by_path"]["plug"], 31);
    assert_eq!(w["meters"]["per_bio"], 32);
    assert_eq!(w["meters"]["per_request"], 1);
    assert_eq!(w["meters"]["cloud"][0]["unit_bytes"], 262144);
    assert_eq!(w["meters"]["cloud"][0]["units"], 1);
    assert_eq!(w["throttled"]["delay_estimated"], true);
    assert!(
        w["throttled"]["delay_ns_total"].is_null(),
        "nothing was throttled"
    );
    // 32 bios in 2 s = 16/s against wiops 16 (the fixture charges nothing: no rule flags)
    assert_eq!(w["limits"]["wiops"]["limit"], 16);
    assert_eq!(w["limits"]["wiops"]["used_pct"], 0.0);
    assert!(w["verdict"].as_str().unwrap().contains("not binding"));
    assert_eq!(cgs[0]["read"]["bios"], 0);
    assert_eq!(cgs[0]["discard"]["bios"], 0);
    assert_eq!(cgs[0]["flush"]["bios"], 0);
    assert_eq!(dev["total"]["write"]["bios"], 64);
    assert_eq!(dev["total"]["write"]["requests"], 2);
}

#[test]
fn cgroup_rows_carry_their_readable_name() {
    let mut a = Aggregator::new(100);
    a.apply_all(&batch_of_32(24));
    a.apply_all(&batch_of_32(21));
    let s = total(&a, 1_000_000_100, &mut Fixed, &[], None, &BTreeMap::new());
    let v: serde_json::Value = serde_json::to_value(&s).unwrap();
    let cgs = v["devices"][0]["cgroups"].as_array().unwrap();
    let d = cgs.iter().find(|c| c["cgroup_id"] == 24).unwrap();
    assert_eq!(d["name"]["kind"], "docker");
    assert_eq!(d["name"]["short"], "docker:abababababab");
    assert_eq!(d["name"]["container_id"], "ab".repeat(32));
    assert_eq!(d["write"]["bios"], 32, "counts unchanged");
    assert!(cgs
        .iter()
        .find(|c| c["cgroup_id"] == 21)
        .unwrap()
        .get("name")
        .is_none());
}

#[test]
fn ratios() {
    let s = DirStats {
        bios: 64,
        requests: 2,
        request_bytes: 262144,
        ..Default::default()
    };
    assert_eq!(s.bios_per_request(), Some(32.0));
    assert_eq!(s.avg_request_bytes(), Some(131072.0));
    assert_eq!(DirStats::default().bios_per_request(), None);
}

#[test]
fn iocost_charges_requests_a_base_and_merges_their_pages() {
    // Two batches of 32 4 KiB writes in /mt, the second's request random; one in "/".
    let mut a = Aggregator::new(100);
    for (cgroup, random) in [(21, false), (21, true), (1, false)] {
        a.apply_all(&iocost_batch_of_32(cgroup, random));
    }
    let (coefs, models) = linear_model_on_loop3(500);
    let s = total(&a, 1_000_000_100, &mut Root, &[], None, &models);
    let rows = &s.devices[0].cgroups;
    let mt = rows.iter().find(|c| c.cgroup == "/mt").unwrap();
    let c = mt.dirs.get(Dir::Write).meters.iocost.clone().unwrap();
    assert_eq!((c.requests, c.random, c.merged, c.pages), (2, 1, 62, 64));
    let vtime = coefs.seqio + coefs.randio + 64 * coefs.page;
    assert_eq!(c.cost_us, vtime as f64 / 137_438.0);
    assert_eq!(
        c.unmerged_cost_us,
        (vtime + 62 * coefs.seqio) as f64 / 137_438.0
    );
    let root = rows.iter().find(|c| c.cgroup == "/").unwrap();
    assert_eq!(
        root.dirs.get(Dir::Write).meters.iocost,
        None,
        "io.cost never charges the root"
    );
    assert!(mt
        .dirs
        .get(Dir::Write)
        .verdict
        .as_deref()
        .unwrap()
        .contains("io.cost charged it"));
}

#[test]
fn iolatency_counts_new_requests_of_cgroups_below_the_root() {
    use crate::sys::iolatency::Target;
    let mut a = Aggregator::new(100);
    a.apply_all(&batch_of_32(21));
    a.apply_all(&batch_of_32(1));
    let targets = BTreeMap::from([(
        loop3().dev().0,
        IoLatency {
            targets: vec![Target {
                cgroup: "/mt".into(),
                target_us: 5000,
            }],
        },
    )]);
    let opts = Options {
        tier: "tracepoint",
        fentry: false,
        meter_units: &[],
        subtree: None,
        iocost: &BTreeMap::new(),
        wbt: &BTreeMap::new(),
        iolatency: &targets,
        timeline: None,
        wants: Wants::ALL,
        per_bio: false,
    };
    let s = build(
        &a.total(1_000_000_100),
        SnapshotKind::Total,
        &[loop3()],
        &mut Root,
        &opts,
    );
    let d = &s.devices[0];
    let mt = d.cgroups.iter().find(|c| c.cgroup == "/mt").unwrap();
    let w = mt.dirs.get(Dir::Write);
    let c = w.meters.iolatency.unwrap();
    assert_eq!((c.requests, c.target_us), (1, Some(5000)));
    assert!(w.verdict.as_deref().unwrap().starts_with(
        "io.latency (targets: /mt 5 ms): its own target, 5 ms, protects it; it \
                      counted 1 new request, a slot in flight each at every level of its \
                      path; 31 bios merged and took none"
    ));
    let root = d.cgroups.iter().find(|c| c.cgroup == "/").unwrap();
    assert_eq!(
        root.dirs.get(Dir::Write).meters.iolatency,
        None,
        "never the root"
    );
    assert_eq!(mt.dirs.get(Dir::Read).meters.iolatency, None, "no reads");
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["devices"][0]["total"]["write"]["meters"]["iolatency"],
        serde_json::json!({ "requests": 1 })
    );
}

/// Cgroups 21 and 22 are /a and /b with io.weight 100 and 300; no limits.
struct Weighted;
impl Lookup for Weighted {
    fn limits(&mut self, _cgroup: &str, _dev: &Device) -> Effective {
        Effective::default()
    }
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        CgroupName {
            path: if id == 21 { "/a".into() } else { "/b".into() },
            gone: false,
        }
    }
    fn iocost_weight(&mut self, cgroup: &str, _dev: &Device) -> Option<u64> {
        Some(if cgroup == "/b" { 300 } else { 100 })
    }
}

#[test]
fn iocost_shares_the_device_by_weight_among_the_cgroups_it_charged() {
    let mut a = Aggregator::new(100);
    for cgroup in [21, 22] {
        a.apply_all(&iocost_batch_of_32(cgroup, false));
    }
    let (_, models) = linear_model_on_loop3(1000);
    let s = total(&a, 1_000_000_100, &mut Weighted, &[], None, &models);
    let charge = |path: &str| {
        let row = s.devices[0]
            .cgroups
            .iter()
            .find(|c| c.cgroup == path)
            .unwrap();
        row.dirs.get(Dir::Write).meters.iocost.clone().unwrap()
    };
    let (ca, cb) = (charge("/a"), charge("/b"));
    assert_eq!((ca.weight, ca.share_pct), (Some(100), Some(25.0)));
    assert_eq!((cb.weight, cb.share_pct), (Some(300), Some(75.0)));
    let v = s.devices[0].cgroups[1].dirs.write.verdict.clone().unwrap();
    assert!(
        v.contains(
            "merging raises what its io.weight 300, a 75 % share of the device among \
                    the cgroups io.cost charged here, buys"
        ),
        "{v}"
    );
    let total = s.devices[0].total.write.meters.iocost.clone().unwrap();
    assert_eq!((total.weight, total.share_pct), (None, None));
}

/// Cgroup 1 is the root, every other id /mt; no limits.
struct Root;
impl Lookup for Root {
    fn limits(&mut self, _cgroup: &str, _dev: &Device) -> Effective {
        Effective::default()
    }
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        CgroupName {
            path: if id == 1 { "/".into() } else { "/mt".into() },
            gone: false,
        }
    }
}
