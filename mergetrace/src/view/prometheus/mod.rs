//! The fleet view's model and its Prometheus exposition (`mergetrace serve`): counters per
//! device, cgroup and direction, the throttle limits in force as gauges, and the request size
//! and bios-per-request histograms, kept usable across scrapes by two rules:
//!
//! - **bounded cardinality**: at most `--max-cgroups` cgroup paths have a `cgroup` label of
//!   their own, given in the order they are first seen with I/O; the rest are summed into
//!   `cgroup="(other)"`. The choice is sticky while the path is counted, so a cgroup never
//!   moves between its own series and `(other)` (which would make both go backwards);
//! - **labels for the living**: once no cgroup of a labelled path has been counted for
//!   `--label-stale-after` (its cgroups were removed and their counters reclaimed, see
//!   `kernel::slots`), the label is recycled: its series end and what they counted moves to
//!   `cgroup="(removed)"`, where the counters of every reclaimed cgroup end up. So the sum of
//!   a family over all series always equals what the kernel counted, and only grows;
//! - **monotonic counters**: every counter series is the running maximum of what the kernel
//!   counters gave. The kernel's own counters only grow, but a value can be derived (discard
//!   merges are what is left after the traced paths) and dip while I/O is in flight; a dip
//!   would look like a counter reset to Prometheus.
//!   A series, once exported, stays exported.
//!
//! Each series also has a `name` label, the cgroup's readable name (`docker:3f2a9c1b7d4e`,
//! `svc:nginx`; empty when the path is none of the known kinds): one per cgroup label, the
//! first one seen kept for the process's life (a name the runtime's files add later would
//! otherwise start a second series), so it adds no series of its own.
mod exposition;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use mergetrace_common::{
    count::{COUNT_BUCKETS, SIZE_BUCKETS},
    latency::LatencyHist,
    vocab, LOST_SLOTS, REMOVED_CGROUP,
};
use prometheus_client::{encoding::prometheus_text, registry::Registry};

use crate::model::{
    aggregate::Dir,
    snapshot::{self, DirStats, Snapshot},
};
use crate::sys::cgroups::UNATTRIBUTED_PATH;
use exposition::Exposition;

/// The `cgroup` label of everything beyond `--max-cgroups`.
pub const OTHER: &str = "(other)";
/// The `cgroup` label of removed cgroups' counters (and of recycled labels').
pub const REMOVED: &str = crate::sys::cgroups::REMOVED_PATH;

/// One series' labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub device: String,
    pub cgroup: String,
    pub direction: &'static str,
    /// The cgroup's readable name: fixed by `cgroup` (see the module's comment).
    pub name: String,
}

impl SeriesKey {
    fn labels(&self) -> [(&'static str, &str); 4] {
        [
            ("device", self.device.as_str()),
            ("cgroup", self.cgroup.as_str()),
            ("direction", self.direction),
            ("name", self.name.as_str()),
        ]
    }
}

/// The merge paths of `MergePaths`, in its order: the `path` label values.
pub const MERGE_PATHS: [&str; 7] = vocab::MERGE_PATH_LABELS;

/// Everything exported for one device, cgroup label and direction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub bios: u64,
    pub bio_bytes: u64,
    /// By path, in [`MERGE_PATHS`] order.
    pub merged: [u64; 7],
    pub requests: u64,
    pub request_bytes: u64,
    pub splits: u64,
    pub flush_only: u64,
    pub requeues: u64,
    pub charged_ios: u64,
    pub charged_bytes: u64,
    pub throttled_bios: u64,
    /// Total throttle delay; `None` while it cannot be known.
    pub delay_ns: Option<u64>,
    pub delay_estimated: bool,
    /// Cloud meter unit size → units.
    pub cloud: BTreeMap<u64, u64>,
    /// Request size histogram, per bucket (not cumulative), bucket `i` = sizes ≤ 512 << i.
    pub size_hist: [u64; SIZE_BUCKETS],
    /// Bios per request histogram, per bucket, bucket `i` = 2^i ..= 2^(i+1)-1 bios.
    pub bpr_hist: [u64; COUNT_BUCKETS],
    /// Gauges: the limits in force (none for `(other)`).
    pub limit_iops: Option<u64>,
    pub limit_bps: Option<u64>,
    /// wbt, where on (`wbt_on`): new requests that took an in-flight slot, and those it let by.
    pub wbt: [u64; 2],
    pub wbt_on: bool,
    /// io.cost, where on (`iocost_on`): bios that started a request (base and pages), bios
    /// that merged (pages only), and the charge in µs.
    pub iocost_bios: [u64; 2],
    pub iocost_cost_us: f64,
    pub iocost_on: bool,
    /// `--latency`: the request latency histograms (`latency_on`).
    pub latency: LatencyHist,
    pub latency_on: bool,
}

/// Upper bounds of the request size buckets (the last is +Inf).
pub fn size_bounds() -> [f64; SIZE_BUCKETS] {
    snapshot::size_bounds().map(as_le)
}

/// Upper bounds of the bios-per-request buckets (the last is +Inf).
pub fn bpr_bounds() -> [f64; COUNT_BUCKETS] {
    snapshot::count_bounds().map(as_le)
}

/// A snapshot bucket bound as the exposition's `le` (the last, `u64::MAX`, is +Inf).
fn as_le(bound: u64) -> f64 {
    if bound == u64::MAX {
        f64::INFINITY
    } else {
        bound as f64
    }
}

/// The bucket index of a snapshot histogram bound (`u64::MAX` = the last bucket).
fn bucket_of(bound: u64, bounds: &[f64]) -> usize {
    if bound == u64::MAX {
        return bounds.len() - 1;
    }
    bounds
        .iter()
        .position(|b| *b == bound as f64)
        .unwrap_or(bounds.len() - 1)
}

impl Row {
    pub fn from_dir(st: &DirStats) -> Row {
        let p = &st.merged_by_path;
        let mut r = Row {
            bios: st.bios,
            bio_bytes: st.bytes,
            merged: [
                p.plug,
                p.elevator_back,
                p.elevator_front,
                p.sw_queue,
                p.discard,
                p.request,
                p.unknown,
            ],
            requests: st.requests,
            request_bytes: st.request_bytes,
            splits: st.splits,
            flush_only: st.flush_only,
            requeues: st.requeues,
            charged_ios: st.charged_ios,
            charged_bytes: st.charged_bytes,
            throttled_bios: st.throttled.bios,
            // Nothing waited: the delay is known to be 0, on either tier.
            delay_ns: st
                .throttled
                .delay_ns_total
                .or((st.throttled.bios == 0).then_some(0)),
            delay_estimated: st.throttled.delay_estimated,
            cloud: st
                .meters
                .cloud
                .iter()
                .map(|c| (c.unit_bytes, c.units))
                .collect(),
            limit_iops: None,
            limit_bps: None,
            wbt: st
                .meters
                .wbt
                .map_or([0; 2], |w| [w.requests, w.passed_requests]),
            wbt_on: st.meters.wbt.is_some(),
            iocost_bios: st
                .meters
                .iocost
                .as_ref()
                .map_or([0; 2], |c| [c.requests, c.merged]),
            iocost_cost_us: st.meters.iocost.as_ref().map_or(0.0, |c| c.cost_us),
            iocost_on: st.meters.iocost.is_some(),
            latency: st.latency.map_or(LatencyHist::default(), |l| l.0),
            latency_on: st.latency.is_some(),
            ..Row::default()
        };
        let (sb, cb) = (size_bounds(), bpr_bounds());
        for (bound, n) in &st.histograms.request_bytes {
            r.size_hist[bucket_of(*bound, &sb)] += n;
        }
        for (bound, n) in &st.histograms.bios_per_request {
            r.bpr_hist[bucket_of(*bound, &cb)] += n;
        }
        for (name, l) in &st.limits {
            if name.ends_with("iops") {
                r.limit_iops = Some(l.limit);
            } else if name.ends_with("bps") {
                r.limit_bps = Some(l.limit);
            }
        }
        r
    }

    /// Calls `f` with each plain counter of `self` and the same counter of `o`: the totals, the
    /// merges by path, the histogram buckets and the wbt and io.cost counts. The delay, the
    /// cloud meters, io.cost's µs, the meters' on flags and the gauges each caller combines in
    /// its own way.
    fn each_counter(&mut self, o: &Row, mut f: impl FnMut(&mut u64, u64)) {
        let totals = [
            (&mut self.bios, o.bios),
            (&mut self.bio_bytes, o.bio_bytes),
            (&mut self.requests, o.requests),
            (&mut self.request_bytes, o.request_bytes),
            (&mut self.splits, o.splits),
            (&mut self.flush_only, o.flush_only),
            (&mut self.requeues, o.requeues),
            (&mut self.charged_ios, o.charged_ios),
            (&mut self.charged_bytes, o.charged_bytes),
            (&mut self.throttled_bios, o.throttled_bios),
        ];
        for (a, b) in totals
            .into_iter()
            .chain(self.merged.iter_mut().zip(o.merged))
            .chain(self.size_hist.iter_mut().zip(o.size_hist))
            .chain(self.bpr_hist.iter_mut().zip(o.bpr_hist))
            .chain(self.wbt.iter_mut().zip(o.wbt))
            .chain(self.iocost_bios.iter_mut().zip(o.iocost_bios))
            .chain(
                self.latency
                    .counters_mut()
                    .zip(o.latency.clone().counters_mut().map(|n| *n)),
            )
        {
            f(a, b);
        }
    }

    /// Sums `o` into `self` (rows folded under one label). Limits: the first one known.
    pub fn add(&mut self, o: &Row) {
        self.each_counter(o, |a, b| *a += b);
        self.delay_ns = match (self.delay_ns, o.delay_ns) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.delay_estimated |= o.delay_estimated;
        for (unit, n) in &o.cloud {
            *self.cloud.entry(*unit).or_default() += n;
        }
        self.limit_iops = self.limit_iops.or(o.limit_iops);
        self.limit_bps = self.limit_bps.or(o.limit_bps);
        self.iocost_cost_us += o.iocost_cost_us;
        self.wbt_on |= o.wbt_on;
        self.iocost_on |= o.iocost_on;
        self.latency_on |= o.latency_on;
    }

    /// Takes `o` out of `self`, counter by counter (never below 0). Gauges stay.
    pub fn subtract(&mut self, o: &Row) {
        let sub = |a: &mut u64, b: u64| *a = a.saturating_sub(b);
        self.each_counter(o, sub);
        if let (Some(a), Some(b)) = (self.delay_ns.as_mut(), o.delay_ns) {
            sub(a, b);
        }
        for (unit, n) in &o.cloud {
            if let Some(a) = self.cloud.get_mut(unit) {
                sub(a, *n);
            }
        }
        self.iocost_cost_us = (self.iocost_cost_us - o.iocost_cost_us).max(0.0);
    }

    /// Takes the newer scrape `now`: every counter (and histogram bucket) becomes the maximum
    /// of what was exported and what is counted now; the gauges are `now`'s.
    pub fn raise_to(&mut self, now: &Row) {
        let max = |a: &mut u64, b: u64| *a = (*a).max(b);
        self.each_counter(now, max);
        self.delay_ns = match (self.delay_ns, now.delay_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.delay_estimated = now.delay_estimated;
        for (unit, n) in &now.cloud {
            max(self.cloud.entry(*unit).or_default(), *n);
        }
        self.limit_iops = now.limit_iops;
        self.limit_bps = now.limit_bps;
        self.iocost_cost_us = self.iocost_cost_us.max(now.iocost_cost_us);
        self.wbt_on |= now.wbt_on;
        self.iocost_on |= now.iocost_on;
    }
}

/// A cgroup path with a label of its own.
#[derive(Debug, Clone)]
struct Admitted {
    /// The readable name it was first seen with.
    name: String,
    /// Since when (snapshot time, ns) no cgroup of the path has been counted.
    idle_since: Option<u64>,
}

/// What every scrape shows: the series so far, the cgroup labels handed out, the losses.
#[derive(Debug, Clone)]
pub struct Model {
    max_cgroups: usize,
    /// A label unused this long (ns) is recycled.
    stale_after_ns: u64,
    /// Cgroup paths with a label of their own (sticky while counted, at most `max_cgroups`).
    admitted: BTreeMap<String, Admitted>,
    /// Cgroup paths summed into `(other)`, while counted.
    folded: BTreeSet<String>,
    /// The cgroups of the last snapshot, by (device, cgroup id): their rows, with the series
    /// each is part of.
    counted: HashMap<(String, u64), Vec<(SeriesKey, Row)>>,
    /// Per series, what its reclaimed cgroups had counted when last seen: part of the
    /// series (it stays monotonic), and therefore not of `(removed)`.
    retired: BTreeMap<SeriesKey, Row>,
    pub rows: BTreeMap<SeriesKey, Row>,
    /// Lost events by kind name, every kind (0 when none).
    pub lost: BTreeMap<&'static str, u64>,
    /// The runs the kernel skipped, by program, of the programs it skipped any of.
    pub skipped_runs: BTreeMap<String, u64>,
    pub tier: String,
}

impl Model {
    pub fn new(max_cgroups: usize, tier: &str) -> Model {
        Model::with_staleness(max_cgroups, tier, std::time::Duration::from_secs(300))
    }

    /// A label whose cgroups have all been reclaimed for `stale_after` is recycled.
    pub fn with_staleness(
        max_cgroups: usize,
        tier: &str,
        stale_after: std::time::Duration,
    ) -> Model {
        Model {
            max_cgroups: max_cgroups.max(1),
            stale_after_ns: stale_after.as_nanos() as u64,
            admitted: BTreeMap::new(),
            folded: BTreeSet::new(),
            counted: HashMap::new(),
            retired: BTreeMap::new(),
            rows: BTreeMap::new(),
            lost: (0..LOST_SLOTS)
                .map(|k| (vocab::kind_name(k as u8), 0))
                .collect(),
            skipped_runs: BTreeMap::new(),
            tier: tier.to_string(),
        }
    }

    /// The labels (cgroup, name) of cgroup `path`: its own while there is room or it already
    /// has one, with the name it was first seen with; `(other)` and no name otherwise.
    pub fn cgroup_label(&mut self, path: &str, name: &str) -> (String, String) {
        if path == REMOVED || path == UNATTRIBUTED_PATH {
            return (path.to_string(), String::new());
        }
        if let Some(first) = self.admitted.get(path) {
            return (path.to_string(), first.name.clone());
        }
        if !self.folded.contains(path) && self.admitted.len() < self.max_cgroups {
            let a = Admitted {
                name: name.to_string(),
                idle_since: None,
            };
            self.admitted.insert(path.to_string(), a);
            return (path.to_string(), name.to_string());
        }
        self.folded.insert(path.to_string());
        (OTHER.to_string(), String::new())
    }

    /// Cgroups summed into `(other)` so far.
    pub fn folded_cgroups(&self) -> usize {
        self.folded.len()
    }

    /// Takes a total snapshot (running totals since start). Long because its steps must run in
    /// this order under one borrow: series of reclaimed cgroups kept, stale labels recycled,
    /// then new cgroups labelled or folded.
    pub fn update(&mut self, s: &Snapshot) {
        // First what left: cgroups gone from the snapshot were reclaimed (the kernel counts
        // them in (removed) now) but their series keep what they showed; then labels unused
        // long enough are recycled, before new cgroups ask for one.
        let present: BTreeSet<(&str, u64)> = s
            .devices
            .iter()
            .flat_map(|d| d.cgroups.iter().map(|cg| (d.device.as_str(), cg.cgroup_id)))
            .collect();
        let live: BTreeSet<&str> = s
            .devices
            .iter()
            .flat_map(|d| &d.cgroups)
            .map(|cg| cg.cgroup.as_str())
            .collect();
        let retired = &mut self.retired;
        self.counted.retain(|(device, id), rows| {
            let stays = present.contains(&(device.as_str(), *id));
            if !stays {
                for (key, r) in rows.iter() {
                    let mut r = r.clone();
                    r.limit_iops = None;
                    r.limit_bps = None;
                    retired.entry(key.clone()).or_default().add(&r);
                }
            }
            stays
        });
        self.recycle(s.end_ns, &live);
        let mut now: BTreeMap<SeriesKey, Row> = BTreeMap::new();
        let mut counted: HashMap<(String, u64), Vec<(SeriesKey, Row)>> = HashMap::new();
        // Per (device, direction): what the kernel folded for removed cgroups.
        let mut removed: BTreeMap<(String, &'static str), Row> = BTreeMap::new();
        for d in &s.devices {
            for cg in &d.cgroups {
                if cg.dirs.is_empty() {
                    continue;
                }
                let short = cg.name.as_ref().map_or("", |n| n.short.as_str());
                let (label, name) = if cg.cgroup_id == REMOVED_CGROUP {
                    (REMOVED.to_string(), String::new())
                } else {
                    self.cgroup_label(&cg.cgroup, short)
                };
                for dir in Dir::ALL {
                    let st = cg.dirs.get(dir);
                    if st.is_empty() {
                        continue;
                    }
                    let mut r = Row::from_dir(st);
                    if cg.cgroup_id == REMOVED_CGROUP {
                        removed.insert((d.device.clone(), dir.name()), r);
                        continue;
                    }
                    if label == OTHER {
                        r.limit_iops = None;
                        r.limit_bps = None;
                    }
                    let key = SeriesKey {
                        device: d.device.clone(),
                        cgroup: label.clone(),
                        direction: dir.name(),
                        name: name.clone(),
                    };
                    now.entry(key.clone()).or_default().add(&r);
                    counted
                        .entry((d.device.clone(), cg.cgroup_id))
                        .or_default()
                        .push((key, r));
                }
            }
        }
        self.counted = counted;
        for (k, r) in &self.retired {
            now.entry(k.clone()).or_default().add(r);
        }
        for ((device, direction), mut r) in removed {
            for (k, retired) in &self.retired {
                if k.device == device && k.direction == direction {
                    r.subtract(retired);
                }
            }
            let key = SeriesKey {
                device,
                cgroup: REMOVED.to_string(),
                direction,
                name: String::new(),
            };
            now.insert(key, r);
        }
        for (k, r) in now {
            match self.rows.get_mut(&k) {
                Some(old) => old.raise_to(&r),
                None => {
                    self.rows.insert(k, r);
                }
            }
        }
        for (k, n) in &s.lost_by_kind {
            let e = self.lost.entry(k).or_default();
            *e = (*e).max(*n);
        }
        for (program, n) in &s.unsaid.skipped_runs {
            let e = self.skipped_runs.entry(program.clone()).or_default();
            *e = (*e).max(*n);
        }
    }

    /// Recycles the labels no cgroup has used for `stale_after` (their series end, and what
    /// they counted shows in `(removed)` from now on), and forgets folded paths no longer
    /// counted.
    fn recycle(&mut self, now_ns: u64, live: &BTreeSet<&str>) {
        self.folded.retain(|p| live.contains(p.as_str()));
        let mut stale = Vec::new();
        for (path, a) in &mut self.admitted {
            if live.contains(path.as_str()) {
                a.idle_since = None;
                continue;
            }
            let since = *a.idle_since.get_or_insert(now_ns);
            if now_ns.saturating_sub(since) >= self.stale_after_ns {
                stale.push(path.clone());
            }
        }
        for path in stale {
            self.admitted.remove(&path);
            self.retired.retain(|k, _| k.cgroup != path);
            self.rows.retain(|k, _| k.cgroup != path);
        }
    }

    /// Cgroup paths with a label of their own now.
    pub fn labelled_cgroups(&self) -> usize {
        self.admitted.len()
    }

    /// The Prometheus text exposition (format 0.0.4) of the model.
    pub fn render(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(self.clone())));
        let mut out = String::new();
        prometheus_text::encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
pub(super) mod tests;
