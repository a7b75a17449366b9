//! What the views and exports show: a [`Window`] of counts turned into named, per-device,
//! per-cgroup rows (the JSON contract in docs/json.md). Only adds fields over time.
use std::collections::BTreeMap;

use mergetrace_common::vocab;
use serde::Serialize;

pub use crate::model::dir_stats::{
    count_bounds, size_bounds, DirStats, Directions, Histograms, MergeAttempts, MergePaths,
    Throttled,
};
use crate::{
    model::aggregate::{Counts, Dir, Window},
    model::iocost,
    model::iolatency::IolatencyCount,
    model::judge::{self, Row},
    model::limits::{self, Effective},
    model::meter::SplitLimits,
    model::timeline::Timeline,
    model::wbt::WbtCount,
    sys::cgroups::{in_subtree, CgroupName},
    sys::container::{self, ReadableName},
    sys::device::Device,
    sys::iolatency::IoLatency,
    sys::wbt::Wbt,
};

/// What a snapshot needs to know besides the counts: cgroup names and the throttle limits in
/// force. The live cgroup tree answers live; a capture's header answers offline.
pub trait Lookup {
    fn cgroup_name(&mut self, id: u64) -> CgroupName;
    fn limits(&mut self, cgroup: &str, dev: &Device) -> Effective;
    /// The device's queue limits that split bios (to say why bios were split); unknown by
    /// default.
    fn split_limits(&mut self, _dev: &Device) -> SplitLimits {
        SplitLimits::default()
    }
    /// The cgroup's `io.weight` for the disk (io.cost's weight); unknown by default (a capture
    /// does not record it).
    fn iocost_weight(&mut self, _cgroup: &str, _dev: &Device) -> Option<u64> {
        None
    }
    /// The readable name of a cgroup path: from the path alone by default (a capture read
    /// elsewhere has no runtime state to ask).
    fn readable(&mut self, path: &str) -> Option<ReadableName> {
        container::readable(path)
    }
}

impl Lookup for crate::sys::cgroups::Cgroups {
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        self.name(id)
    }
    fn readable(&mut self, path: &str) -> Option<ReadableName> {
        crate::sys::cgroups::Cgroups::readable(self, path)
    }
    fn iocost_weight(&mut self, cgroup: &str, dev: &Device) -> Option<u64> {
        let file = self
            .mount
            .join(cgroup.trim_start_matches('/'))
            .join("io.weight");
        let text = std::fs::read_to_string(file).ok()?;
        crate::sys::iocost::parse_weight(&text, dev.major, dev.minor)
    }
    fn split_limits(&mut self, dev: &Device) -> SplitLimits {
        crate::sys::queue::QueueSettings::read(dev)
            .map(|q| q.split_limits())
            .unwrap_or_default()
    }
    fn limits(&mut self, cgroup: &str, dev: &Device) -> Effective {
        if !cgroup.starts_with('/') {
            return Effective::default(); // "(none)" or an unknown id
        }
        limits::effective_for(self.hierarchy, &self.mount, cgroup, dev.major, dev.minor)
    }
}

/// How to build a snapshot.
#[derive(Clone, Copy)]
pub struct Options<'a> {
    /// "tracepoint" or "fentry".
    pub tier: &'a str,
    /// The fentry tier ran: throttle delays are measured per bio rather than estimated, and
    /// merge attempts (including failed ones) are known.
    pub fentry: bool,
    /// Cloud-volume meter unit sizes, as given to the aggregator.
    pub meter_units: &'a [u64],
    /// Only cgroups in this subtree.
    pub subtree: Option<&'a str>,
    /// io.cost's model of each traced disk that has io.cost on, by `dev_t`.
    pub iocost: &'a BTreeMap<u32, iocost::Model>,
    /// wbt on each traced disk that had it on, by `dev_t`.
    pub wbt: &'a BTreeMap<u32, Wbt>,
    /// io.latency's targets on each traced disk that had any, by `dev_t`.
    pub iolatency: &'a BTreeMap<u32, IoLatency>,
    /// The run's intervals so far (the live view): a whole run's verdict is judged over them,
    /// an interval's knows the bios still waiting from before.
    pub timeline: Option<&'a Timeline>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    Interval,
    Total,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    #[serde(rename = "type")]
    pub kind: SnapshotKind,
    /// CLOCK_MONOTONIC nanoseconds (the clock of `bpf_ktime_get_ns`).
    pub start_ns: u64,
    pub end_ns: u64,
    /// "tracepoint" or "fentry".
    pub tier: String,
    /// Events the kernel side could not deliver; non-zero means counts are too low.
    pub lost_events: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub lost_by_kind: BTreeMap<&'static str, u64>,
    pub devices: Vec<DeviceSnapshot>,
    /// `--stats`: what each eBPF program cost (kernel BPF stats), in the total object.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub program_stats: Vec<ProgramStat>,
}

/// One eBPF program's runs and time in the kernel (`BPF_ENABLE_STATS`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramStat {
    pub program: String,
    pub runs: u64,
    pub run_time_ns: u64,
    pub ns_per_run: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceSnapshot {
    pub device: String,
    pub major: u32,
    pub minor: u32,
    pub cgroups: Vec<CgroupSnapshot>,
    /// Sum of the rows in `cgroups`.
    pub total: Directions,
    /// Plug flushes: requests per flush → number of flushes.
    pub unplug: UnplugSnapshot,
}

impl DeviceSnapshot {
    /// The device number its events carry.
    pub fn dev(&self) -> vocab::Dev {
        vocab::Dev::new(self.major, self.minor)
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct UnplugSnapshot {
    pub explicit: BTreeMap<u32, u64>,
    pub from_schedule: BTreeMap<u32, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CgroupSnapshot {
    /// Path relative to the hierarchy's mount ("/" for the root).
    pub cgroup: String,
    pub cgroup_id: u64,
    /// The cgroup was removed; `cgroup` is the last path it had.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// What the path is (a container, pod, systemd unit); absent when none is recognised.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<ReadableName>,
    #[serde(flatten)]
    pub dirs: Directions,
}

/// Turns a window into a snapshot: one row per cgroup with activity, per traced device.
pub fn build(
    window: &Window,
    kind: SnapshotKind,
    devices: &[Device],
    lookup: &mut dyn Lookup,
    opts: &Options,
) -> Snapshot {
    let secs = window.end_ns.saturating_sub(window.start_ns) as f64 / 1e9;
    Snapshot {
        kind,
        start_ns: window.start_ns,
        end_ns: window.end_ns,
        tier: opts.tier.to_string(),
        lost_events: window.lost_events(),
        lost_by_kind: window
            .lost_by_kind
            .iter()
            .map(|(k, n)| (vocab::kind_name(*k), *n))
            .collect(),
        devices: devices
            .iter()
            .map(|d| device_snapshot(window, d, lookup, opts, secs, kind))
            .collect(),
        program_stats: Vec::new(),
    }
}

/// One device: its cgroups with activity (in the subtree), sorted by path, and their total.
fn device_snapshot(
    window: &Window,
    d: &Device,
    lookup: &mut dyn Lookup,
    opts: &Options,
    secs: f64,
    kind: SnapshotKind,
) -> DeviceSnapshot {
    let dev = d.dev().0;
    // cgroup id → directions
    let mut rows: BTreeMap<u64, Directions> = BTreeMap::new();
    // The disk's meters besides blk-throttle, where they are on.
    let iocost = opts.iocost.get(&dev);
    let wbt = opts.wbt.get(&dev).filter(|w| w.on());
    let iolatency = opts.iolatency.get(&dev);
    for (k, c) in window.counts.iter().filter(|(k, _)| k.dev == dev) {
        let mut st = DirStats::from_counts(c, k.dir, opts);
        st.meters.iocost = iocost.and_then(|model| iocost_charge(model, k.dir, c));
        st.meters.wbt = wbt.and(wbt_count(k.dir, c));
        st.meters.iolatency = iolatency.and(iolatency_count(k.dir, c));
        *rows
            .entry(k.cgroup_id)
            .or_insert_with(|| Directions::empty(opts))
            .get_mut(k.dir) = st;
    }
    let mut cgroups = Vec::new();
    let mut total = Directions::empty(opts);
    let mut split_limits: Option<SplitLimits> = None;
    // Every row named first: io.cost's shares are among all the cgroups it charged.
    let named: Vec<(u64, CgroupName, Directions)> = rows
        .into_iter()
        .filter(|(_, dirs)| !dirs.is_empty())
        .map(|(id, dirs)| (id, lookup.cgroup_name(id), dirs))
        .collect();
    let shares = match iocost {
        Some(_) => iocost_shares(&named, d, lookup),
        None => BTreeMap::new(),
    };
    for (id, name, mut dirs) in named {
        if opts.subtree.is_some_and(|sub| !in_subtree(&name.path, sub)) {
            continue;
        }
        own_meters(
            &mut dirs,
            &name.path,
            iolatency,
            shares.get(&name.path).copied(),
        );
        let eff = if name.gone {
            Effective::default()
        } else {
            lookup.limits(&name.path, d)
        };
        let row = Row {
            eff: &eff,
            secs,
            wbt,
            iolatency,
            dev,
            cgroup_id: id,
            timeline: opts.timeline,
            whole: kind == SnapshotKind::Total,
        };
        judge::judge(&mut dirs, &row, &mut || {
            *split_limits.get_or_insert_with(|| lookup.split_limits(d))
        });
        for dir in Dir::ALL {
            total.get_mut(dir).add(dirs.get(dir));
        }
        cgroups.push(CgroupSnapshot {
            name: lookup.readable(&name.path),
            cgroup: name.path,
            cgroup_id: id,
            gone: name.gone,
            dirs,
        });
    }
    cgroups.sort_by(|a, b| a.cgroup.cmp(&b.cgroup).then(a.cgroup_id.cmp(&b.cgroup_id)));
    let unplug = window
        .unplugs
        .get(&dev)
        .map(|u| UnplugSnapshot {
            explicit: u.explicit.clone(),
            from_schedule: u.from_schedule.clone(),
        })
        .unwrap_or_default();
    DeviceSnapshot {
        device: d.name.clone(),
        major: d.major,
        minor: d.minor,
        cgroups,
        total,
        unplug,
    }
}

/// The meters that depend on whose row it is: io.cost and io.latency never hold the root (nor
/// bios without a cgroup); io.latency's target of the cgroup's own; io.cost's weight and share
/// (`share`: the cgroup's io.weight and its share in percent).
fn own_meters(
    dirs: &mut Directions,
    path: &str,
    iolatency: Option<&IoLatency>,
    share: Option<(u64, f64)>,
) {
    let below_root = path.starts_with('/') && path != "/";
    for dir in Dir::ALL {
        let m = &mut dirs.get_mut(dir).meters;
        if path == "/" {
            m.iocost = None;
        }
        if let (Some(c), Some((weight, pct))) = (m.iocost.as_mut(), share) {
            (c.weight, c.share_pct) = (Some(weight), Some(pct));
        }
        if let Some(count) = m.iolatency.as_mut() {
            count.target_us = iolatency.and_then(|t| t.own(path));
        }
        if !below_root {
            m.iolatency = None;
        }
    }
}

/// The io.weight and share of the device of each cgroup io.cost charged in the window (never
/// the root, nor a removed cgroup), where the weights can be read.
fn iocost_shares(
    named: &[(u64, CgroupName, Directions)],
    d: &Device,
    lookup: &mut dyn Lookup,
) -> BTreeMap<String, (u64, f64)> {
    let active: Vec<String> = named
        .iter()
        .filter(|(_, name, dirs)| {
            name.path.starts_with('/')
                && name.path != "/"
                && !name.gone
                && [Dir::Read, Dir::Write].iter().any(|dir| {
                    dirs.get(*dir)
                        .meters
                        .iocost
                        .as_ref()
                        .is_some_and(|c| c.requests + c.merged > 0)
                })
        })
        .map(|(_, name, _)| name.path.clone())
        .collect();
    let mut weights = BTreeMap::new();
    let mut known = true;
    let shares = iocost::shares(&active, &mut |p| {
        let w = lookup.iocost_weight(p, d);
        known &= w.is_some();
        *weights.entry(p.to_string()).or_insert(w.unwrap_or(100))
    });
    if !known {
        return BTreeMap::new();
    }
    shares
        .into_iter()
        .map(|(p, pct)| (p.clone(), (weights[&p], pct)))
        .collect()
}

/// io.cost's charge of a cgroup's reads or writes on a disk with io.cost on (none for the
/// other directions). The root cgroup is never charged (`ioc_rqos_throttle` skips level 0):
/// its charge is dropped once rows are named.
fn iocost_charge(model: &iocost::Model, dir: Dir, c: &Counts) -> Option<iocost::Charge> {
    let coefs = match dir {
        Dir::Read => model.read,
        Dir::Write => model.write,
        _ => return None,
    };
    Some(iocost::Charge::of(iocost::Counts::of(c), coefs))
}

/// What io.latency counted of a cgroup's reads, writes or discards: the requests its bios
/// started (none for flush requests, which no bio starts).
fn iolatency_count(dir: Dir, c: &Counts) -> Option<IolatencyCount> {
    (dir != Dir::Flush).then_some(IolatencyCount {
        requests: c.getrq,
        target_us: None,
    })
}

/// What wbt counted of a cgroup's writes or discards on a disk with wbt on (none for reads
/// and flushes, which it does not hold).
fn wbt_count(dir: Dir, c: &Counts) -> Option<WbtCount> {
    matches!(dir, Dir::Write | Dir::Discard).then(|| WbtCount::of(c.getrq, c.wbt_class_requests))
}

#[cfg(test)]
mod tests {
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
        use mergetrace_common::{flags, kind};
        // Two batches of 32 4 KiB writes in /mt, the second's request random; one in "/".
        let mut a = Aggregator::new(100);
        for (cgroup, random) in [(21, false), (21, true), (1, false)] {
            a.apply_all(
                &batch_of_32(cgroup)
                    .into_iter()
                    .map(|mut e| {
                        if matches!(e.kind, kind::GETRQ | kind::BACK_MERGE) {
                            e.flags |= flags::IOCOST;
                            if e.kind == kind::GETRQ {
                                e.path = random as u8;
                            }
                        }
                        e
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let coefs = iocost::Coefs::of(iocost::Linear {
            bps: 100_000_000,
            seqiops: 1000,
            randiops: 500,
        });
        let models = BTreeMap::from([(
            loop3().dev().0,
            iocost::Model {
                read: coefs,
                write: coefs,
            },
        )]);
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
        use mergetrace_common::{flags, kind};
        let mut a = Aggregator::new(100);
        for cgroup in [21, 22] {
            a.apply_all(
                &batch_of_32(cgroup)
                    .into_iter()
                    .map(|mut e| {
                        if matches!(e.kind, kind::GETRQ | kind::BACK_MERGE) {
                            e.flags |= flags::IOCOST;
                        }
                        e
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let coefs = iocost::Coefs::of(iocost::Linear {
            bps: 100_000_000,
            seqiops: 1000,
            randiops: 1000,
        });
        let models = BTreeMap::from([(
            loop3().dev().0,
            iocost::Model {
                read: coefs,
                write: coefs,
            },
        )]);
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
}
