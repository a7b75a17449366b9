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
    kernel::Wants,
    model::aggregate::{Counts, Dir, Window},
    model::iocost,
    model::iolatency::IolatencyCount,
    model::judge::{self, Row},
    model::latency::Latency,
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
        limits::effective(&self.limits_chain(cgroup, dev.major, dev.minor))
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
    /// What the run counted beside its per-request counting: plug flushes, merge attempts
    /// (a capture has everything).
    pub wants: Wants,
    /// Bios and merge paths from the per-bio events instead of per request: the merge-path
    /// oracle (`MERGETRACE_MERGE_PATH_FROM_STACK`), and captures of versions that did not
    /// count per request.
    pub per_bio: bool,
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
    /// What changed on the traced disks in the interval (a meter switched on or off, the
    /// scheduler, `nomerges`), one line each, with its time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// `--stats`: what each eBPF program cost (kernel BPF stats), in the total object.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub program_stats: Vec<ProgramStat>,
    /// In the total object: what the kernel side could not say by the run's end.
    #[serde(flatten)]
    pub unsaid: Unsaid,
}

/// What the kernel side leaves unsaid at a run's end (`Session::unsaid`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Unsaid {
    /// The runs the kernel skipped of each program it skipped any of, by program (its
    /// `recursion_misses`: the program was already running on that CPU when an interrupt
    /// reached the same hook). What those runs would have counted may be missing (the kernel
    /// does not say on which disk they were).
    #[serde(
        rename = "kernel_skipped_runs",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub skipped_runs: BTreeMap<String, u64>,
    /// `--latency`: requests issued in the run whose completion no program saw, neither at
    /// their end nor by a later issue of their tag (`completion_unseen`): in flight as the
    /// run ended, or ended without the completion program running. Their device latency is
    /// not in the histograms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished_requests: Option<u64>,
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
    /// Plug flushes: requests per flush → number of flushes; `null` where the run did not
    /// count them (`--plug-flushes`; captures always do).
    pub unplug: Option<UnplugSnapshot>,
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
        changes: Vec::new(),
        program_stats: Vec::new(),
        unsaid: Unsaid::default(),
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
    // A request completes in the interval after its issue, maybe: its latency makes a row.
    for (k, h) in window.latency.iter().filter(|(k, _)| k.dev == dev) {
        let st = rows
            .entry(k.cgroup_id)
            .or_insert_with(|| Directions::empty(opts))
            .get_mut(k.dir);
        st.latency = Some(Latency(*h));
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
        // A removed cgroup's are the last the lookup saw (its files are gone).
        let eff = lookup.limits(&name.path, d);
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
    let unplug = opts.wants.plug_flushes.then(|| {
        window
            .unplugs
            .get(&dev)
            .map(|u| UnplugSnapshot {
                explicit: u.explicit.clone(),
                from_schedule: u.from_schedule.clone(),
            })
            .unwrap_or_default()
    });
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
mod tests;
