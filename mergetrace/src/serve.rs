//! `mergetrace serve`: the fleet view. Counts in the kernel like the live view, and on every
//! scrape of `/metrics` turns the running totals into the Prometheus text exposition format
//! (version 0.0.4): counters per device, cgroup and direction, the throttle limits in force as
//! gauges, and the request size and bios-per-request histograms.
//!
//! Two rules keep what a scrape shows usable by Prometheus:
//! - **bounded cardinality**: the first `--max-cgroups` distinct cgroups seen with I/O keep
//!   their own `cgroup` label for the life of the process; the rest are summed into
//!   `cgroup="(other)"`. The choice is sticky, so a cgroup never moves between its own series
//!   and `(other)` (which would make both go backwards);
//! - **monotonic counters**: every counter series is the running maximum of what the kernel
//!   counters gave. The kernel's own counters only grow, but a value can be derived (discard
//!   merges are what is left after the traced paths) and dip while I/O is in flight; a dip
//!   would look like a counter reset to Prometheus.
//!   A series, once exported, stays exported.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use mergetrace_common::{
    count::{COUNT_BUCKETS, SIZE_BUCKETS},
    kind, Modes, LOST_SLOTS,
};
use prometheus_client::{
    collector::Collector,
    encoding::{prometheus_text, DescriptorEncoder, EncodeMetric, NoLabelSet},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    aggregate::{self, Dir},
    cgroups::{CgroupName, Cgroups},
    device::Device,
    kernel::{self, monotonic_ns, TierChoice},
    limits::Effective,
    live,
    snapshot::{self, DirStats, Lookup, Snapshot, SnapshotKind},
};

/// The `cgroup` label of everything beyond `--max-cgroups`.
pub const OTHER: &str = "(other)";

/// How long in-flight responses may take after SIGTERM/SIGINT before the server closes them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Block device to trace: a name (vda), /dev/NAME or MAJ:MIN. Repeatable. A partition
    /// maps to its disk.
    #[arg(short = 'd', long = "device", required = true, value_name = "DEV")]
    pub devices: Vec<String>,
    /// Address to serve /metrics on. Loopback by default; any other address is an explicit
    /// choice (a warning says so), e.g. 0.0.0.0:9435 for a Prometheus on another host.
    #[arg(long, default_value = "127.0.0.1:9435", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Only this cgroup and its descendants (path relative to the cgroup mount, e.g. /mt).
    #[arg(short = 'c', long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Which probes to use: fentry where the kernel allows it (auto), or force one tier.
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierChoice,
    /// Cloud-volume meter unit sizes: each device request counts ceil(size / unit), at least 1.
    /// Comma-separated, up to 4 (e.g. 256k,1m).
    #[arg(long, default_value = "256k,1m", value_name = "SIZES", value_delimiter = ',', value_parser = crate::cli::parse_size, num_args = 1..=4)]
    pub meter_unit: Vec<u64>,
    /// At most this many distinct cgroup labels; cgroups seen after that are summed into
    /// cgroup="(other)" (the first N seen keep their label for the life of the process).
    #[arg(long, default_value_t = 500, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_cgroups: u32,
}

// ---------------------------------------------------------------------------------------
// The model: what the exposition shows, kept monotonic and bounded across scrapes.

/// One series' labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeriesKey {
    pub device: String,
    pub cgroup: String,
    pub direction: &'static str,
}

impl SeriesKey {
    fn labels(&self) -> [(&'static str, &str); 3] {
        [
            ("device", self.device.as_str()),
            ("cgroup", self.cgroup.as_str()),
            ("direction", self.direction),
        ]
    }
}

/// The merge paths of `MergePaths`, in its order: the `path` label values.
pub const MERGE_PATHS: [&str; 7] = [
    "plug",
    "elevator_back",
    "elevator_front",
    "sw_queue",
    "discard",
    "request",
    "unknown",
];

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
}

/// Upper bounds of the request size buckets (the last is +Inf).
pub fn size_bounds() -> [f64; SIZE_BUCKETS] {
    let mut b = [f64::INFINITY; SIZE_BUCKETS];
    for (i, v) in b.iter_mut().enumerate().take(SIZE_BUCKETS - 1) {
        *v = (512u64 << i) as f64;
    }
    b
}

/// Upper bounds of the bios-per-request buckets (the last is +Inf).
pub fn bpr_bounds() -> [f64; COUNT_BUCKETS] {
    let mut b = [f64::INFINITY; COUNT_BUCKETS];
    for (i, v) in b.iter_mut().enumerate().take(COUNT_BUCKETS - 1) {
        *v = ((2u64 << i) - 1) as f64;
    }
    b
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

    /// Sums `o` into `self` (rows folded under one label). Limits: the first one known.
    pub fn add(&mut self, o: &Row) {
        self.bios += o.bios;
        self.bio_bytes += o.bio_bytes;
        for (a, b) in self.merged.iter_mut().zip(o.merged) {
            *a += b;
        }
        self.requests += o.requests;
        self.request_bytes += o.request_bytes;
        self.splits += o.splits;
        self.flush_only += o.flush_only;
        self.requeues += o.requeues;
        self.charged_ios += o.charged_ios;
        self.charged_bytes += o.charged_bytes;
        self.throttled_bios += o.throttled_bios;
        self.delay_ns = match (self.delay_ns, o.delay_ns) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.delay_estimated |= o.delay_estimated;
        for (unit, n) in &o.cloud {
            *self.cloud.entry(*unit).or_default() += n;
        }
        for (a, b) in self.size_hist.iter_mut().zip(o.size_hist) {
            *a += b;
        }
        for (a, b) in self.bpr_hist.iter_mut().zip(o.bpr_hist) {
            *a += b;
        }
        self.limit_iops = self.limit_iops.or(o.limit_iops);
        self.limit_bps = self.limit_bps.or(o.limit_bps);
    }

    /// Takes the newer scrape `now`: every counter (and histogram bucket) becomes the maximum
    /// of what was exported and what is counted now; the gauges are `now`'s.
    pub fn raise_to(&mut self, now: &Row) {
        let max = |a: &mut u64, b: u64| *a = (*a).max(b);
        max(&mut self.bios, now.bios);
        max(&mut self.bio_bytes, now.bio_bytes);
        for (a, b) in self.merged.iter_mut().zip(now.merged) {
            max(a, b);
        }
        max(&mut self.requests, now.requests);
        max(&mut self.request_bytes, now.request_bytes);
        max(&mut self.splits, now.splits);
        max(&mut self.flush_only, now.flush_only);
        max(&mut self.requeues, now.requeues);
        max(&mut self.charged_ios, now.charged_ios);
        max(&mut self.charged_bytes, now.charged_bytes);
        max(&mut self.throttled_bios, now.throttled_bios);
        self.delay_ns = match (self.delay_ns, now.delay_ns) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.delay_estimated = now.delay_estimated;
        for (unit, n) in &now.cloud {
            max(self.cloud.entry(*unit).or_default(), *n);
        }
        for (a, b) in self.size_hist.iter_mut().zip(now.size_hist) {
            max(a, b);
        }
        for (a, b) in self.bpr_hist.iter_mut().zip(now.bpr_hist) {
            max(a, b);
        }
        self.limit_iops = now.limit_iops;
        self.limit_bps = now.limit_bps;
    }
}

/// What every scrape shows: the series so far, the cgroup labels handed out, the losses.
#[derive(Debug, Clone)]
pub struct Model {
    max_cgroups: usize,
    /// Cgroup paths with a label of their own (sticky, at most `max_cgroups`).
    admitted: BTreeSet<String>,
    /// Cgroup paths summed into `(other)`.
    folded: BTreeSet<String>,
    pub rows: BTreeMap<SeriesKey, Row>,
    /// Lost events by kind name, every kind (0 when none).
    pub lost: BTreeMap<&'static str, u64>,
    pub tier: String,
}

impl Model {
    pub fn new(max_cgroups: usize, tier: &str) -> Model {
        Model {
            max_cgroups: max_cgroups.max(1),
            admitted: BTreeSet::new(),
            folded: BTreeSet::new(),
            rows: BTreeMap::new(),
            lost: (0..LOST_SLOTS).map(|k| (kind::name(k as u8), 0)).collect(),
            tier: tier.to_string(),
        }
    }

    /// The label of cgroup `path`: its own while there is room or it already has one,
    /// `(other)` otherwise.
    pub fn cgroup_label(&mut self, path: &str) -> String {
        if self.admitted.contains(path) {
            return path.to_string();
        }
        if !self.folded.contains(path) && self.admitted.len() < self.max_cgroups {
            self.admitted.insert(path.to_string());
            return path.to_string();
        }
        self.folded.insert(path.to_string());
        OTHER.to_string()
    }

    /// Cgroups summed into `(other)` so far.
    pub fn folded_cgroups(&self) -> usize {
        self.folded.len()
    }

    /// Takes a total snapshot (running totals since start).
    pub fn update(&mut self, s: &Snapshot) {
        let mut now: BTreeMap<SeriesKey, Row> = BTreeMap::new();
        for d in &s.devices {
            for cg in &d.cgroups {
                if cg.dirs.is_empty() {
                    continue;
                }
                let label = self.cgroup_label(&cg.cgroup);
                for dir in Dir::ALL {
                    let st = cg.dirs.get(dir);
                    if st.is_empty() {
                        continue;
                    }
                    let mut r = Row::from_dir(st);
                    if label == OTHER {
                        r.limit_iops = None;
                        r.limit_bps = None;
                    }
                    now.entry(SeriesKey {
                        device: d.device.clone(),
                        cgroup: label.clone(),
                        direction: dir.name(),
                    })
                    .or_default()
                    .add(&r);
                }
            }
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

// ---------------------------------------------------------------------------------------
// Encoding

#[derive(Debug)]
struct Exposition(Model);

type Rows = BTreeMap<SeriesKey, Row>;

/// One counter family: a value per row (rows with `None` have no series).
fn counter<V: prometheus_client::encoding::EncodeCounterValue + std::fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    value: impl Fn(&Row) -> Option<V>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (k, r) in rows {
        if let Some(v) = value(r) {
            ConstCounter::new(v).encode(m.encode_family(&k.labels())?)?;
        }
    }
    Ok(())
}

/// One gauge family: a value per row (rows with `None` have no series).
fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    value: impl Fn(&Row) -> Option<u64>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (k, r) in rows {
        if let Some(v) = value(r) {
            ConstGauge::new(v).encode(m.encode_family(&k.labels())?)?;
        }
    }
    Ok(())
}

/// One histogram family from per-bucket counts.
fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    bounds: &[f64],
    data: impl Fn(&Row) -> (&[u64], u64),
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (k, r) in rows {
        let (counts, sum) = data(r);
        let buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(counts.iter().copied()).collect();
        let count = counts.iter().sum();
        m.encode_family(&k.labels())?
            .encode_histogram::<NoLabelSet>(sum as f64, count, &buckets, None)?;
    }
    Ok(())
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let model = &self.0;
        let rows = &model.rows;
        {
            let mut m = enc.encode_descriptor(
                "mergetrace",
                "mergetrace is running: the probe tier in use and the version.",
                None,
                MetricType::Info,
            )?;
            m.encode_info(&[
                ("tier", model.tier.as_str()),
                ("version", env!("CARGO_PKG_VERSION")),
            ])?;
        }
        counter(&mut enc, "mergetrace_bios",
            "Bios submitted (as they leave blk-throttle, before merging; split remainders not counted again).",
            rows, |r| Some(r.bios))?;
        counter(
            &mut enc,
            "mergetrace_bio_bytes",
            "Bytes in the bios submitted.",
            rows,
            |r| Some(r.bio_bytes),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "mergetrace_merged",
                "Bios and requests merged into an existing request, by path (the sum over paths is what /proc/diskstats calls merges).",
                None,
                MetricType::Counter,
            )?;
            for (k, r) in rows {
                for (path, n) in MERGE_PATHS.iter().zip(r.merged) {
                    let [d, c, dir] = k.labels();
                    let labels = [d, c, dir, ("path", *path)];
                    ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        counter(
            &mut enc,
            "mergetrace_requests",
            "Requests issued to the device, each once (a requeued request issued again is one request).",
            rows,
            |r| Some(r.requests),
        )?;
        counter(&mut enc, "mergetrace_flush_only_writes",
            "Empty write bios with REQ_PREFLUSH/FUA (fsync, journal commits) completed by the flush machinery without a write request; /proc/diskstats counts them as writes.",
            rows, |r| Some(r.flush_only))?;
        counter(
            &mut enc,
            "mergetrace_requeues",
            "Requests the driver handed back to be issued again.",
            rows,
            |r| Some(r.requeues),
        )?;
        counter(
            &mut enc,
            "mergetrace_request_bytes",
            "Bytes in the requests issued to the device.",
            rows,
            |r| Some(r.request_bytes),
        )?;
        counter(
            &mut enc,
            "mergetrace_splits",
            "Bios split into pieces.",
            rows,
            |r| Some(r.splits),
        )?;
        counter(&mut enc, "mergetrace_throttle_charged_ios",
            "Ios blk-throttle charged (one per bio and per split remainder) where the cgroup has a rule for the direction.",
            rows, |r| Some(r.charged_ios))?;
        counter(&mut enc, "mergetrace_throttle_charged_bytes",
            "Bytes blk-throttle charged (once per bio, 512 per discard) where the cgroup has a rule for the direction.",
            rows, |r| Some(r.charged_bytes))?;
        counter(
            &mut enc,
            "mergetrace_throttled_bios",
            "Bios that waited in blk-throttle's queue.",
            rows,
            |r| Some(r.throttled_bios),
        )?;
        counter(&mut enc, "mergetrace_throttle_delay_seconds",
            "Time the throttled bios waited in blk-throttle's queue, measured per bio (fentry tier); on the tracepoint tier only while it is known to be 0 (nothing waited), absent otherwise.",
            rows, |r| r.delay_ns.map(|ns| ns as f64 / 1e9))?;
        gauge(&mut enc, "mergetrace_throttle_delay_estimated",
            "1 when mergetrace_throttle_delay_seconds_total of the same labels is not measured per bio (tracepoint tier: present only as 0 while nothing waited), 0 when it is (fentry tier).",
            rows, |r| r.delay_ns.map(|_| r.delay_estimated as u64))?;
        {
            let mut m = enc.encode_descriptor(
                "mergetrace_cloud_meter_units",
                "Units a cloud-volume meter counting each device request as ceil(size / unit_bytes), at least 1, would charge (--meter-unit).",
                None,
                MetricType::Counter,
            )?;
            for (k, r) in rows {
                for (unit, n) in &r.cloud {
                    let unit = unit.to_string();
                    let [d, c, dir] = k.labels();
                    let labels = [d, c, dir, ("unit_bytes", unit.as_str())];
                    ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
                }
            }
        }
        gauge(&mut enc, "mergetrace_throttle_limit_iops",
            "The blk-throttle IOPS limit in force for the cgroup and direction (the tightest of its own and its ancestors'); absent without one.",
            rows, |r| r.limit_iops)?;
        gauge(&mut enc, "mergetrace_throttle_limit_bytes_per_second",
            "The blk-throttle bandwidth limit in force for the cgroup and direction (the tightest of its own and its ancestors'); absent without one.",
            rows, |r| r.limit_bps)?;
        histogram(
            &mut enc,
            "mergetrace_request_size_bytes",
            "Size of the requests issued to the device (a requeued request counts again).",
            rows,
            &size_bounds(),
            |r| (&r.size_hist[..], r.request_bytes),
        )?;
        histogram(
            &mut enc,
            "mergetrace_bios_per_request",
            "Bios (and split pieces) carried by each request issued; _sum is bios + splits.",
            rows,
            &bpr_bounds(),
            |r| (&r.bpr_hist[..], r.bios + r.splits),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "mergetrace_lost_events",
                "Events the kernel side could not count, by kind; not zero means the counts are low.",
                None,
                MetricType::Counter,
            )?;
            for (kind, n) in &model.lost {
                ConstCounter::new(*n).encode(m.encode_family(&[("kind", *kind)])?)?;
            }
        }
        {
            let m = enc.encode_descriptor(
                "mergetrace_cgroups_folded",
                "Cgroups summed into cgroup=\"(other)\" because --max-cgroups labels were taken.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(model.folded_cgroups() as u64).encode(m)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The server

/// Cgroup names, with removed cgroups remembered: `Cgroups::name` rescans the hierarchy for
/// every unknown or removed id, which a long-running exporter would do on every scrape.
struct Names {
    cgroups: Cgroups,
    gone: HashMap<u64, CgroupName>,
}

impl Lookup for Names {
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        if let Some(n) = self.gone.get(&id) {
            return n.clone();
        }
        let n = self.cgroups.name(id);
        if n.gone {
            self.gone.insert(id, n.clone());
        }
        n
    }
    fn limits(&mut self, cgroup: &str, dev: &Device) -> Effective {
        self.cgroups.limits(cgroup, dev)
    }
    fn split_limits(&mut self, dev: &Device) -> crate::meter::SplitLimits {
        self.cgroups.split_limits(dev)
    }
}

struct Exporter {
    session: kernel::Session,
    names: Names,
    devices: Vec<Device>,
    start_ns: u64,
    fentry: bool,
    meter_units: Vec<u64>,
    subtree: Option<String>,
    model: Model,
}

impl Exporter {
    fn scrape(&mut self) -> Result<String> {
        let mut total = self.session.read_totals()?;
        total.start_ns = self.start_ns;
        total.end_ns = monotonic_ns();
        let opts = snapshot::Options {
            tier: &self.model.tier,
            fentry: self.fentry,
            meter_units: &self.meter_units,
            subtree: self.subtree.as_deref(),
        };
        let s = snapshot::build(
            &total,
            SnapshotKind::Total,
            &self.devices,
            &mut self.names,
            &opts,
        );
        // `opts` borrows the tier string of the model: update after.
        self.model.update(&s);
        Ok(self.model.render())
    }
}

type Shared = Arc<Mutex<Exporter>>;

async fn metrics(State(ex): State<Shared>) -> Response {
    let result = tokio::task::spawn_blocking(move || {
        let mut ex = ex.lock().unwrap_or_else(|p| p.into_inner());
        ex.scrape()
    })
    .await;
    match result {
        Ok(Ok(body)) => (
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("mergetrace: cannot read the counters: {e:#}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("mergetrace: scrape failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn index() -> &'static str {
    "mergetrace exporter: metrics at /metrics\n"
}

/// The one-line warning for an address other than loopback, if any.
pub fn exposure_warning(addr: &SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback()).then(|| {
        format!(
            "mergetrace: warning: listening on {addr}, which is not a loopback address: anyone who can reach it can read device names and cgroup paths"
        )
    })
}

pub async fn run(args: ServeArgs) -> Result<()> {
    // Before anything is attached: a signal during start-up must stop the server cleanly too
    // (it is then served for no time, and the programs are detached as usual).
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let devices = live::resolve_devices(&args.devices)?;
    let cgroups = Cgroups::discover()?;
    let subtree = args
        .cgroup
        .as_deref()
        .map(|c| cgroups.normalize(c))
        .transpose()?;
    // Bind before loading the programs: a taken port fails at once, not after verification.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    if let Some(w) = exposure_warning(&addr) {
        eprintln!("{w}");
    }
    let session = kernel::Session::start(
        &devices,
        &kernel::Options {
            ring_bytes: 4096,
            tier: args.tier,
            modes: Modes {
                aggregate: 1,
                emit: 0,
                ..Modes::default()
            },
            meter_units: aggregate::meter_units(&args.meter_unit),
            stats: false,
        },
    )?;
    let start_ns = monotonic_ns();
    for line in live::banner(&devices, &session, &cgroups) {
        eprintln!("mergetrace: {line}");
    }
    let tier = session.tier.kind;
    let exporter: Shared = Arc::new(Mutex::new(Exporter {
        session,
        names: Names {
            cgroups,
            gone: HashMap::new(),
        },
        devices,
        start_ns,
        fentry: tier == kernel::TierKind::Fentry,
        meter_units: args.meter_unit.clone(),
        subtree,
        model: Model::new(args.max_cgroups as usize, tier.name()),
    }));
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(index))
        .with_state(exporter.clone());

    let stopping = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            tokio::select! {
                _ = sigint.recv() => {}
                _ = sigterm.recv() => {}
            }
            stopping.notify_one();
        }
    };
    eprintln!("mergetrace: serving http://{addr}/metrics");
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let server = std::future::IntoFuture::into_future(server);
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r.context("the HTTP server failed")?,
        _ = async {
            stopping.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            eprintln!("mergetrace: connections still open {SHUTDOWN_GRACE:?} after the signal: closing them");
        }
    }
    // No scrape runs any more (or it finishes with the lock held): detach the programs.
    let mut ex = exporter.lock().unwrap_or_else(|p| p.into_inner());
    ex.session.detach();
    eprintln!("mergetrace: stopped; programs detached");
    Ok(())
}

// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{CgroupSnapshot, DeviceSnapshot, Directions};

    fn write_stats(bios: u64, requests: u64) -> DirStats {
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

    fn snapshot(rows: &[(&str, DirStats)]) -> Snapshot {
        Snapshot {
            kind: SnapshotKind::Total,
            start_ns: 0,
            end_ns: 1,
            tier: "tracepoint".into(),
            lost_events: 0,
            lost_by_kind: BTreeMap::new(),
            program_stats: Vec::new(),
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

    fn parse(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
    }

    fn sample_lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn cumulative_buckets_from_log2_counts() {
        let mut st = write_stats(96, 4);
        // 1 request of 4 KiB (bucket ≤ 4096), 3 of 128 KiB, and one over 8 MiB
        st.histograms.request_bytes = BTreeMap::from([(4096, 1), (131072, 3), (u64::MAX, 1)]);
        // 1 request with 1 bio, 3 with 32–63 bios
        st.histograms.bios_per_request = BTreeMap::from([(1, 1), (63, 3)]);
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[("/mt", st)]));
        let text = m.render();
        let b = sample_lines(&text, "mergetrace_request_size_bytes_bucket");
        assert_eq!(b.len(), SIZE_BUCKETS, "{text}");
        let want = [
            ("512", 0),
            ("1024", 0),
            ("2048", 0),
            ("4096", 1),
            ("8192", 1),
            ("65536", 1),
            ("131072", 4),
            ("4.194304e+06", 4),
            ("8.388608e+06", 4),
            ("+Inf", 5),
        ];
        for (le, n) in want {
            let line = b
                .iter()
                .find(|l| l.contains(&format!("le=\"{le}\"")))
                .unwrap_or_else(|| panic!("no le={le} bucket in {text}"));
            assert!(line.ends_with(&format!(" {n}")), "{line}: want {n}");
        }
        assert!(text.contains(
            "mergetrace_request_size_bytes_count{device=\"loop3\",cgroup=\"/mt\",direction=\"write\"} 5\n"
        ), "{text}");
        assert!(text.contains(
            "mergetrace_request_size_bytes_sum{device=\"loop3\",cgroup=\"/mt\",direction=\"write\"} 393216.0\n"
        ), "{text}");
        let b = sample_lines(&text, "mergetrace_bios_per_request_bucket");
        assert_eq!(b.len(), COUNT_BUCKETS);
        assert!(
            b[0].contains("le=\"1\"") && b[0].ends_with(" 1"),
            "{}",
            b[0]
        );
        assert!(
            b[1].contains("le=\"3\"") && b[1].ends_with(" 1"),
            "{}",
            b[1]
        );
        assert!(
            b[5].contains("le=\"63\"") && b[5].ends_with(" 4"),
            "{}",
            b[5]
        );
        assert!(b[10].contains("le=\"2047\"") && b[10].ends_with(" 4"));
        assert!(b[11].contains("le=\"+Inf\"") && b[11].ends_with(" 4"));
        assert!(text.contains("mergetrace_bios_per_request_sum{device=\"loop3\",cgroup=\"/mt\",direction=\"write\"} 96.0\n"));
        assert!(text.contains("# TYPE mergetrace_request_size_bytes histogram\n"));

        // a parser agrees
        let s = parse(&text);
        let h = s
            .samples
            .iter()
            .find(|s| s.metric == "mergetrace_request_size_bytes")
            .expect("histogram parsed");
        let prometheus_parse::Value::Histogram(hs) = &h.value else {
            panic!("not a histogram: {h:?}")
        };
        let mut last = 0.0;
        for c in hs {
            assert!(c.count >= last, "buckets are cumulative: {hs:?}");
            last = c.count;
        }
        assert_eq!(last, 5.0);
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
    fn escapes_cgroup_paths() {
        let nasty = "/we\"ird\\name\nx";
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[(nasty, write_stats(8, 2))]));
        let text = m.render();
        let want = r#"mergetrace_bios_total{device="loop3",cgroup="/we\"ird\\name\nx",direction="write"} 8"#;
        assert!(text.contains(want), "want {want} in:\n{text}");
        // no raw newline or quote breaks a sample line
        for l in text.lines() {
            assert!(
                l.starts_with('#') || l.starts_with("mergetrace"),
                "a line broken by the label value: {l:?}"
            );
        }
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
            "mergetrace_bios_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\"} 10\n"
        ));
        assert!(text.contains(
            "mergetrace_bios_total{device=\"loop3\",cgroup=\"/b\",direction=\"write\"} 20\n"
        ));
        assert!(text.contains("mergetrace_bios_total{device=\"loop3\",cgroup=\"(other)\",direction=\"write\"} 70\n"), "{text}");
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
            "mergetrace_bios_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\"} 11\n"
        ));
        assert!(text.contains("mergetrace_bios_total{device=\"loop3\",cgroup=\"(other)\",direction=\"write\"} 75\n"), "{text}");
        assert!(text.contains("mergetrace_cgroups_folded 3\n"));
        let labels: BTreeSet<&str> = m.rows.keys().map(|k| k.cgroup.as_str()).collect();
        assert_eq!(labels, BTreeSet::from(["/a", "/b", OTHER]));
        // A derived value that dips (a requeue) never makes the counter go back.
        m.update(&snapshot(&[("/a", write_stats(11, 0))]));
        let k = SeriesKey {
            device: "loop3".into(),
            cgroup: "/a".into(),
            direction: "write",
        };
        assert_eq!(m.rows[&k].requests, 1);
        assert_eq!(m.rows[&k].bios, 11);
        // (other) keeps its series even when nothing folded shows up in a scrape
        assert!(m.render().contains("cgroup=\"(other)\""));
    }

    #[test]
    fn exposition_has_the_documented_families() {
        let mut st = write_stats(32, 1);
        st.charged_ios = 32;
        st.charged_bytes = 32 * 4096;
        st.throttled.bios = 5;
        st.throttled.delay_ns_total = Some(1_500_000_000);
        st.throttled.delay_estimated = true;
        st.limits.insert(
            "wiops",
            crate::meter::LimitUse {
                limit: 500,
                cgroup: "/mt".into(),
                used_pct: 1.0,
            },
        );
        st.limits.insert(
            "wbps",
            crate::meter::LimitUse {
                limit: 1 << 20,
                cgroup: "/".into(),
                used_pct: 1.0,
            },
        );
        st.meters.cloud = vec![crate::meter::CloudMeter {
            unit_bytes: 262144,
            units: 1,
        }];
        let mut s = snapshot(&[("/mt", st)]);
        s.lost_by_kind.insert("rq_issue", 3);
        let mut m = Model::new(10, "tracepoint");
        m.update(&s);
        let text = m.render();
        let l = "{device=\"loop3\",cgroup=\"/mt\",direction=\"write\"}";
        for (ty, family, line) in [
            ("gauge", "mergetrace_info", "mergetrace_info{tier=\"tracepoint\",version=\"0.1.0\"} 1".to_string()),
            ("counter", "mergetrace_bios_total", format!("mergetrace_bios_total{l} 32")),
            ("counter", "mergetrace_bio_bytes_total", format!("mergetrace_bio_bytes_total{l} 131072")),
            ("counter", "mergetrace_merged_total", "mergetrace_merged_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",path=\"plug\"} 31".into()),
            ("counter", "mergetrace_merged_total", "mergetrace_merged_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",path=\"unknown\"} 0".into()),
            ("counter", "mergetrace_requests_total", format!("mergetrace_requests_total{l} 1")),
            ("counter", "mergetrace_request_bytes_total", format!("mergetrace_request_bytes_total{l} 131072")),
            ("counter", "mergetrace_splits_total", format!("mergetrace_splits_total{l} 0")),
            ("counter", "mergetrace_throttle_charged_ios_total", format!("mergetrace_throttle_charged_ios_total{l} 32")),
            ("counter", "mergetrace_throttle_charged_bytes_total", format!("mergetrace_throttle_charged_bytes_total{l} 131072")),
            ("counter", "mergetrace_throttled_bios_total", format!("mergetrace_throttled_bios_total{l} 5")),
            ("counter", "mergetrace_throttle_delay_seconds_total", format!("mergetrace_throttle_delay_seconds_total{l} 1.5")),
            ("gauge", "mergetrace_throttle_delay_estimated", format!("mergetrace_throttle_delay_estimated{l} 1")),
            ("counter", "mergetrace_cloud_meter_units_total", "mergetrace_cloud_meter_units_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",unit_bytes=\"262144\"} 1".into()),
            ("gauge", "mergetrace_throttle_limit_iops", format!("mergetrace_throttle_limit_iops{l} 500")),
            ("gauge", "mergetrace_throttle_limit_bytes_per_second", format!("mergetrace_throttle_limit_bytes_per_second{l} 1048576")),
            ("counter", "mergetrace_lost_events_total", "mergetrace_lost_events_total{kind=\"rq_issue\"} 3".into()),
            ("counter", "mergetrace_lost_events_total", "mergetrace_lost_events_total{kind=\"counters_map_full\"} 0".into()),
            ("gauge", "mergetrace_cgroups_folded", "mergetrace_cgroups_folded 0".into()),
        ] {
            assert!(text.contains(&format!("# TYPE {family} {ty}\n")), "no TYPE for {family} in:\n{text}");
            assert!(text.contains(&format!("{line}\n")), "no {line:?} in:\n{text}");
        }
        // all seven paths
        assert_eq!(sample_lines(&text, "mergetrace_merged_total{").len(), 7);
        // the parser reads every sample line
        let s = parse(&text);
        let bios = s
            .samples
            .iter()
            .find(|s| s.metric == "mergetrace_bios_total")
            .unwrap();
        assert_eq!(bios.labels.get("cgroup"), Some("/mt"));
        assert_eq!(bios.value, prometheus_parse::Value::Counter(32.0));
        // (other) never carries a limit
        let mut m = Model::new(1, "tracepoint");
        let mut s2 = snapshot(&[("/a", write_stats(1, 1)), ("/mt", write_stats(1, 1))]);
        s2.devices[0].cgroups[1].dirs.write.limits.insert(
            "wiops",
            crate::meter::LimitUse {
                limit: 5,
                cgroup: "/mt".into(),
                used_pct: 0.0,
            },
        );
        m.update(&s2);
        assert!(!m.render().contains("mergetrace_throttle_limit_iops{"));
    }

    #[test]
    fn delay_is_zero_when_nothing_waited_and_absent_when_unknown() {
        let mut waited = write_stats(4, 4);
        waited.throttled.bios = 2; // no limit known: no estimate
        waited.throttled.delay_estimated = true;
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[("/a", write_stats(4, 4)), ("/b", waited)]));
        let text = m.render();
        assert!(text.contains("mergetrace_throttle_delay_seconds_total{device=\"loop3\",cgroup=\"/a\",direction=\"write\"} 0.0\n"), "{text}");
        assert!(
            !text
                .contains("mergetrace_throttle_delay_seconds_total{device=\"loop3\",cgroup=\"/b\""),
            "{text}"
        );
        assert!(
            !text.contains("mergetrace_throttle_delay_estimated{device=\"loop3\",cgroup=\"/b\""),
            "{text}"
        );
    }

    #[test]
    fn loopback_is_quiet_anything_else_warns() {
        assert!(exposure_warning(&"127.0.0.1:9435".parse().unwrap()).is_none());
        assert!(exposure_warning(&"[::1]:9435".parse().unwrap()).is_none());
        let w = exposure_warning(&"0.0.0.0:9435".parse().unwrap()).unwrap();
        assert!(w.starts_with("mergetrace: warning:") && !w.contains('\n'));
        assert!(exposure_warning(&"10.1.2.3:9435".parse().unwrap()).is_some());
    }

    #[test]
    fn flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            s: ServeArgs,
        }
        let t = T::try_parse_from(["t", "-d", "loop3"]).unwrap();
        assert_eq!(t.s.listen, "127.0.0.1:9435".parse().unwrap());
        assert_eq!(t.s.max_cgroups, 500);
        assert_eq!(t.s.meter_unit, vec![256 << 10, 1 << 20]);
        let t = T::try_parse_from([
            "t",
            "-d",
            "loop3",
            "--listen",
            "[::1]:9000",
            "--max-cgroups",
            "3",
            "-c",
            "/mt",
        ])
        .unwrap();
        assert_eq!(t.s.listen.port(), 9000);
        assert_eq!(t.s.max_cgroups, 3);
        assert!(T::try_parse_from(["t", "-d", "loop3", "--max-cgroups", "0"]).is_err());
        assert!(T::try_parse_from(["t", "-d", "loop3", "--listen", "nowhere"]).is_err());
        assert!(T::try_parse_from(["t"]).is_err());
    }
}
