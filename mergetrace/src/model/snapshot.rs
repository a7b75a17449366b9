//! What the views and exports show: a [`Window`] of counts turned into named, per-device,
//! per-cgroup rows (the JSON contract in docs/json.md). Only adds fields over time.
use std::collections::BTreeMap;

use mergetrace_common::{
    count::{COUNT_BUCKETS, SIZE_BUCKETS},
    path, vocab,
};
use serde::Serialize;

use crate::{
    model::aggregate::{Counts, Dir, Window},
    model::iocost,
    model::limits::{self, Effective},
    model::meter::{self, CloudMeter, LimitUse, Meters, SplitLimits},
    sys::cgroups::{in_subtree, CgroupName},
    sys::container::{self, ReadableName},
    sys::device::Device,
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct Directions {
    pub read: DirStats,
    pub write: DirStats,
    pub discard: DirStats,
    pub flush: DirStats,
}

impl Directions {
    /// All four directions without I/O, as the tier reports them (a delay that cannot be
    /// known is `null` even where nothing waited).
    pub fn empty(opts: &Options) -> Directions {
        let none = |dir| DirStats::from_counts(&Counts::default(), dir, opts);
        Directions {
            read: none(Dir::Read),
            write: none(Dir::Write),
            discard: none(Dir::Discard),
            flush: none(Dir::Flush),
        }
    }

    pub fn get(&self, dir: Dir) -> &DirStats {
        match dir {
            Dir::Read => &self.read,
            Dir::Write => &self.write,
            Dir::Discard => &self.discard,
            Dir::Flush => &self.flush,
        }
    }
    fn get_mut(&mut self, dir: Dir) -> &mut DirStats {
        match dir {
            Dir::Read => &mut self.read,
            Dir::Write => &mut self.write,
            Dir::Discard => &mut self.discard,
            Dir::Flush => &mut self.flush,
        }
    }
    pub fn is_empty(&self) -> bool {
        Dir::ALL.iter().all(|d| self.get(*d).is_empty())
    }
}

/// Bio merges by the mechanism that made them, plus the two kinds without a bio tracepoint
/// path: discard merges (derived) and request-request merges. Sums to `merged`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MergePaths {
    pub plug: u64,
    pub elevator_back: u64,
    pub elevator_front: u64,
    pub sw_queue: u64,
    /// Derived from the accounting identity: discard merges have no tracepoint.
    pub discard: u64,
    pub request: u64,
    /// Bio merges whose caller was not recognised (should stay 0).
    pub unknown: u64,
}

/// Distributions of the requests issued, as `upper bound → count` for non-empty buckets (the
/// last bucket's bound is `u64::MAX`: everything larger).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Histograms {
    /// Request size in bytes: bucket bounds 512, 1024, … 8 MiB.
    pub request_bytes: BTreeMap<u64, u64>,
    /// Bios carried per request: bucket bounds 1, 3, 7, … 2047.
    pub bios_per_request: BTreeMap<u64, u64>,
}

/// Upper bounds of the request size buckets: 512 B, 1 KiB, … 8 MiB, then `u64::MAX` for the
/// larger ones (the kernel's `size_bucket`).
pub fn size_bounds() -> [u64; SIZE_BUCKETS] {
    std::array::from_fn(|i| {
        if i == SIZE_BUCKETS - 1 {
            u64::MAX
        } else {
            512 << i
        }
    })
}

/// Upper bounds of the bios-per-request buckets: 1, 3, 7, … 2047, then `u64::MAX` (the
/// kernel's `count_bucket`).
pub fn count_bounds() -> [u64; COUNT_BUCKETS] {
    std::array::from_fn(|i| {
        if i == COUNT_BUCKETS - 1 {
            u64::MAX
        } else {
            (2 << i) - 1
        }
    })
}

impl Histograms {
    pub fn from_counts(c: &Counts) -> Histograms {
        let nonzero = |bounds: &[u64], counts: &[u64]| {
            bounds
                .iter()
                .zip(counts)
                .filter(|(_, n)| **n > 0)
                .map(|(b, n)| (*b, *n))
                .collect()
        };
        Histograms {
            request_bytes: nonzero(&size_bounds(), &c.request_size_hist),
            bios_per_request: nonzero(&count_bounds(), &c.bios_per_request_hist),
        }
    }

    fn add(&mut self, o: &Histograms) {
        for (k, v) in &o.request_bytes {
            *self.request_bytes.entry(*k).or_default() += v;
        }
        for (k, v) in &o.bios_per_request {
            *self.bios_per_request.entry(*k).or_default() += v;
        }
    }
}

/// fentry tier only: what the merge machinery tried, including attempts that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MergeAttempts {
    /// `blk_attempt_plug_merge` calls, and how many merged.
    pub plug_attempts: u64,
    pub plug_merged: u64,
    /// `elv_merge` decisions: no merge, front, back, discard.
    pub elevator_no_merge: u64,
    pub elevator_front: u64,
    pub elevator_back: u64,
    pub elevator_discard: u64,
}

/// Bios that waited in blk-throttle's queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Throttled {
    pub bios: u64,
    /// Total time they waited (fentry tier); `null` when it cannot be known: always on the
    /// tracepoint tier, which sees a throttled bio only when blk-throttle releases it.
    pub delay_ns_total: Option<u64>,
    /// `true` on the tracepoint tier: the delay is not measured there (`delay_ns_total` is
    /// null). An estimate from the queue left behind at each release was tried and read 150x
    /// too low: blk-throttle releases its queued bios in batches (the name is kept for the
    /// JSON contract).
    pub delay_estimated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DirStats {
    /// Bios submitted (after the throttle; split remainders not counted again).
    pub bios: u64,
    pub bytes: u64,
    /// Bios and requests merged into an existing request, on every path (diskstats "merges").
    pub merged: u64,
    /// Requests issued to the device, each once (a requeued request issued again is still
    /// one request).
    pub requests: u64,
    pub request_bytes: u64,
    pub splits: u64,
    /// Write direction: empty write bios with `REQ_PREFLUSH`/`REQ_FUA` (fsync, journal
    /// commits) that the flush machinery completed without a write request; it issued a flush
    /// request (the `flush` direction) instead. /proc/diskstats counts them as completed
    /// writes: its writes are `requests + flush_only`.
    pub flush_only: u64,
    /// Requests the driver handed back (`BLK_STS_RESOURCE`) to be issued again.
    pub requeues: u64,
    pub merged_by_path: MergePaths,
    /// What blk-throttle charged: 1 io per bio and per split remainder, bytes once per bio
    /// (512 per discard), where the cgroup has a rule for the direction.
    pub charged_ios: u64,
    pub charged_bytes: u64,
    pub throttled: Throttled,
    pub meters: Meters,
    pub histograms: Histograms,
    /// fentry tier: merge attempts and their outcome (absent on the tracepoint tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_attempts: Option<MergeAttempts>,
    /// Limits in force for this direction, with this window's use.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<&'static str, LimitUse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
}

impl DirStats {
    pub fn from_counts(c: &Counts, dir: Dir, opts: &Options) -> DirStats {
        let back = c.back_merges_by_path;
        let all = c.bio_merges_by_path;
        DirStats {
            charged_ios: c.charged_ios,
            charged_bytes: c.charged_bytes,
            throttled: Throttled {
                // fentry: every release from the throttle queue, measured (split remainders
                // included); tracepoint: bios and remainders seen in the dispatch work.
                bios: if opts.fentry {
                    c.throttle_releases
                } else {
                    c.throttled_bios
                },
                delay_ns_total: opts.fentry.then_some(c.throttle_delay_ns),
                delay_estimated: !opts.fentry,
            },
            merge_attempts: opts.fentry.then_some(MergeAttempts {
                plug_attempts: c.plug_attempts,
                plug_merged: c.plug_merged,
                elevator_no_merge: c.elv_decisions[0],
                elevator_front: c.elv_decisions[1],
                elevator_back: c.elv_decisions[2],
                elevator_discard: c.elv_decisions[3],
            }),
            meters: Meters {
                per_bio: c.bios + c.splits,
                per_request: c.requests(),
                per_request_created: c.requests_created(),
                cloud: opts
                    .meter_units
                    .iter()
                    .zip(c.meter_units)
                    .map(|(unit, units)| CloudMeter {
                        unit_bytes: *unit,
                        units,
                    })
                    .collect(),
                iocost: None,
            },
            histograms: Histograms::from_counts(c),
            limits: BTreeMap::new(),
            verdict: None,
            bios: c.bios,
            bytes: c.bytes,
            merged: c.merged(dir.code()),
            requests: c.requests(),
            request_bytes: c.issue_bytes,
            splits: c.splits,
            flush_only: c.flush_only,
            requeues: c.requeues,
            merged_by_path: MergePaths {
                plug: all[path::PLUG as usize],
                elevator_back: back[path::ELEVATOR as usize],
                elevator_front: all[path::ELEVATOR as usize] - back[path::ELEVATOR as usize],
                sw_queue: all[path::SW_QUEUE as usize],
                discard: c.discard_merges(dir.code()),
                request: c.rq_merges,
                unknown: all[path::UNKNOWN as usize],
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        self.bios == 0 && self.requests == 0 && self.merged == 0 && self.splits == 0
    }

    /// Bios (and split pieces) that reached a request: what merging compressed. Flush-only
    /// writes never become one, so they are left out.
    pub fn bios_to_requests(&self) -> u64 {
        (self.bios + self.splits).saturating_sub(self.flush_only)
    }

    /// Bios per device request, if any requests.
    pub fn bios_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.bios_to_requests() as f64 / self.requests as f64)
    }

    /// Average request size in bytes, if any requests.
    pub fn avg_request_bytes(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.request_bytes as f64 / self.requests as f64)
    }

    fn add(&mut self, o: &DirStats) {
        self.bios += o.bios;
        self.bytes += o.bytes;
        self.merged += o.merged;
        self.requests += o.requests;
        self.request_bytes += o.request_bytes;
        self.splits += o.splits;
        self.flush_only += o.flush_only;
        self.requeues += o.requeues;
        let (a, b) = (&mut self.merged_by_path, &o.merged_by_path);
        a.plug += b.plug;
        a.elevator_back += b.elevator_back;
        a.elevator_front += b.elevator_front;
        a.sw_queue += b.sw_queue;
        a.discard += b.discard;
        a.request += b.request;
        a.unknown += b.unknown;
        self.charged_ios += o.charged_ios;
        self.charged_bytes += o.charged_bytes;
        self.throttled.bios += o.throttled.bios;
        if let (Some(a), Some(b)) = (&mut self.merge_attempts, &o.merge_attempts) {
            a.plug_attempts += b.plug_attempts;
            a.plug_merged += b.plug_merged;
            a.elevator_no_merge += b.elevator_no_merge;
            a.elevator_front += b.elevator_front;
            a.elevator_back += b.elevator_back;
            a.elevator_discard += b.elevator_discard;
        } else if self.merge_attempts.is_none() {
            self.merge_attempts = o.merge_attempts.clone();
        }
        self.throttled.delay_estimated = o.throttled.delay_estimated;
        self.throttled.delay_ns_total =
            match (self.throttled.delay_ns_total, o.throttled.delay_ns_total) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
        self.histograms.add(&o.histograms);
        self.meters.per_bio += o.meters.per_bio;
        self.meters.per_request += o.meters.per_request;
        self.meters.per_request_created += o.meters.per_request_created;
        match (&mut self.meters.iocost, &o.meters.iocost) {
            (Some(a), Some(b)) => a.add(b),
            (a @ None, Some(b)) => *a = Some(b.clone()),
            _ => {}
        }
        if self.meters.cloud.is_empty() {
            self.meters.cloud = o.meters.cloud.clone();
        } else {
            for (a, b) in self.meters.cloud.iter_mut().zip(&o.meters.cloud) {
                a.units += b.units;
            }
        }
    }
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
            .map(|d| device_snapshot(window, d, lookup, opts, secs))
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
) -> DeviceSnapshot {
    let dev = d.dev().0;
    // cgroup id → directions
    let mut rows: BTreeMap<u64, Directions> = BTreeMap::new();
    for (k, c) in window.counts.iter().filter(|(k, _)| k.dev == dev) {
        *rows
            .entry(k.cgroup_id)
            .or_insert_with(|| Directions::empty(opts))
            .get_mut(k.dir) = DirStats::from_counts(c, k.dir, opts);
    }
    if let Some(model) = opts.iocost.get(&dev) {
        charge_iocost(window, dev, model, &mut rows);
    }
    let mut cgroups = Vec::new();
    let mut total = Directions::empty(opts);
    let mut split_limits: Option<SplitLimits> = None;
    for (id, mut dirs) in rows {
        if dirs.is_empty() {
            continue;
        }
        let name = lookup.cgroup_name(id);
        if opts.subtree.is_some_and(|sub| !in_subtree(&name.path, sub)) {
            continue;
        }
        if name.path == "/" {
            for dir in Dir::ALL {
                dirs.get_mut(dir).meters.iocost = None;
            }
        }
        let eff = if name.gone {
            Effective::default()
        } else {
            lookup.limits(&name.path, d)
        };
        judge(&mut dirs, &eff, secs, &mut || {
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

/// io.cost's charge of each cgroup's reads and writes on a disk with io.cost on. The root
/// cgroup is never charged (`ioc_rqos_throttle` skips level 0): it gets none.
fn charge_iocost(
    window: &Window,
    dev: u32,
    model: &iocost::Model,
    rows: &mut BTreeMap<u64, Directions>,
) {
    for (k, c) in window.counts.iter().filter(|(k, _)| k.dev == dev) {
        let coefs = match k.dir {
            Dir::Read => model.read,
            Dir::Write => model.write,
            _ => continue,
        };
        let counts = iocost::Counts {
            requests: c.iocost_requests,
            random: c.iocost_random,
            merged: c.iocost_merged,
            pages: c.iocost_pages,
        };
        if let Some(dirs) = rows.get_mut(&k.cgroup_id) {
            dirs.get_mut(k.dir).meters.iocost = Some(iocost::Charge::of(counts, coefs));
        }
    }
}

/// Each direction with I/O: the limits in force with this window's use, and the verdict
/// (`split_limits` is asked only where bios were split).
fn judge(
    dirs: &mut Directions,
    eff: &Effective,
    secs: f64,
    split_limits: &mut dyn FnMut() -> SplitLimits,
) {
    for dir in Dir::ALL {
        let st = dirs.get_mut(dir);
        if st.is_empty() {
            continue;
        }
        let write = dir != Dir::Read && dir != Dir::Flush;
        let charged = meter::Charged {
            ios: st.charged_ios,
            bytes: st.charged_bytes,
            requests_created: st.meters.per_request_created,
        };
        st.limits = meter::limit_use(eff, write, charged, secs);
        let split_cause = (st.splits > 0).then(|| {
            meter::split_cause(
                &split_limits(),
                dir == Dir::Discard,
                st.avg_request_bytes().unwrap_or(0.0),
            )
        });
        let throttle = meter::verdict(
            &st.limits,
            &meter::Activity {
                bios: st.bios - st.flush_only.min(st.bios),
                splits: st.splits,
                requests: st.requests,
                charged_ios: st.charged_ios,
                throttled_bios: st.throttled.bios,
                throttle_delay_ns: st.throttled.delay_ns_total,
                split_cause,
            },
        );
        let iocost = st.meters.iocost.as_ref().and_then(|c| c.verdict("it"));
        st.verdict = match (throttle, iocost) {
            (Some(t), Some(i)) => Some(format!("{t}; {i}")),
            (t, i) => t.or(i),
        };
    }
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
        let opts = Options {
            tier: "tracepoint",
            fentry: false,
            meter_units: &[256 << 10],
            subtree: Some("/mt"),
            iocost: &BTreeMap::new(),
        };
        let s = build(
            &a.total(2_000_000_100),
            SnapshotKind::Total,
            &[loop3()],
            &mut Fixed,
            &opts,
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
        let opts = Options {
            tier: "tracepoint",
            fentry: false,
            meter_units: &[],
            subtree: None,
            iocost: &BTreeMap::new(),
        };
        let s = build(
            &a.total(1_000_000_100),
            SnapshotKind::Total,
            &[loop3()],
            &mut Fixed,
            &opts,
        );
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
        let opts = Options {
            tier: "tracepoint",
            fentry: false,
            meter_units: &[],
            subtree: None,
            iocost: &models,
        };
        let s = build(
            &a.total(1_000_000_100),
            SnapshotKind::Total,
            &[loop3()],
            &mut Root,
            &opts,
        );
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
