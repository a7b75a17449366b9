//! Kernel integration tests of `mergetrace serve`: the Prometheus exporter, scraped over
//! loopback while fio writes to a loop device. Counter deltas between two scrapes must equal
//! the /proc/diskstats deltas and fio's I/O count exactly; the server must take concurrent
//! scrapes and clients that vanish mid-response, and stop on SIGTERM/SIGINT with exit code 0
//! and its programs gone.
//!
//! Needs root, BPF, loop devices, cgroup v1 blkio, fio and bpftool. Missing any of them is a
//! FAILURE (see `support::require_root`), never a skip. Run:
//!   cargo test --release -p mergetrace --test kernel_serve
mod support;

use std::{
    collections::BTreeSet,
    fs,
    io::{Read, Write},
    net::TcpStream,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use prometheus_parse::{Scrape, Value};
use support::{serve::*, *};

const SIZE: u64 = 64 << 20;
const BS: u64 = 4096;

// ---------------------------------------------------------------------------------------
// Scrapes

impl Server {
    fn scrape(&self) -> Metrics {
        let (status, headers, body) = http_get(self.addr, "/metrics");
        assert_eq!(
            status,
            200,
            "scrape failed: {body}\nstderr:\n{}",
            self.stderr()
        );
        assert!(
            headers
                .to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "not the Prometheus text format: {headers}"
        );
        Metrics::parse(body)
    }
}

// ---------------------------------------------------------------------------------------
// The exposition, parsed

struct Metrics {
    text: String,
    scrape: Scrape,
}

impl Metrics {
    fn parse(text: String) -> Metrics {
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("the exposition does not parse ({e}):\n{text}"));
        Metrics { text, scrape }
    }

    fn number(v: &Value) -> f64 {
        match v {
            Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => *x,
            other => panic!("not a number: {other:?}"),
        }
    }

    /// Sum of `metric` over the samples whose labels include every `(name, value)` given.
    fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.scrape
            .samples
            .iter()
            .filter(|s| s.metric == metric)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| Self::number(&s.value))
            .sum()
    }

    fn has(&self, metric: &str, labels: &[(&str, &str)]) -> bool {
        self.scrape
            .samples
            .iter()
            .any(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    }

    /// `sum` as an integer (every counter here counts whole things).
    fn count(&self, metric: &str, labels: &[(&str, &str)]) -> u64 {
        let v = self.sum(metric, labels);
        assert!(v >= 0.0 && v.fract() == 0.0, "{metric} {labels:?} = {v}");
        v as u64
    }

    /// Cumulative bucket counts of one histogram series.
    fn buckets(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let s = self
            .scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no {metric} {labels:?} in:\n{}", self.text));
        let Value::Histogram(h) = &s.value else {
            panic!("{metric} is not a histogram: {:?}", s.value)
        };
        h.iter().map(|c| (c.less_than, c.count)).collect()
    }
}

/// Every family and its `# TYPE`.
const FAMILIES: &[(&str, &str)] = &[
    ("mergetrace_info", "gauge"),
    ("mergetrace_bios_total", "counter"),
    ("mergetrace_bio_bytes_total", "counter"),
    ("mergetrace_merged_total", "counter"),
    ("mergetrace_requests_total", "counter"),
    ("mergetrace_request_bytes_total", "counter"),
    ("mergetrace_splits_total", "counter"),
    ("mergetrace_throttle_charged_ios_total", "counter"),
    ("mergetrace_throttle_charged_bytes_total", "counter"),
    ("mergetrace_throttled_bios_total", "counter"),
    ("mergetrace_throttle_delay_seconds_total", "counter"),
    ("mergetrace_throttle_delay_estimated", "gauge"),
    ("mergetrace_cloud_meter_units_total", "counter"),
    ("mergetrace_throttle_limit_iops", "gauge"),
    ("mergetrace_throttle_limit_bytes_per_second", "gauge"),
    ("mergetrace_request_size_bytes", "histogram"),
    ("mergetrace_bios_per_request", "histogram"),
    ("mergetrace_lost_events_total", "counter"),
    ("mergetrace_cgroups_folded", "gauge"),
];

// ---------------------------------------------------------------------------------------
// BPF programs held by a process

/// IDs of the BPF programs whose names start with `block_` that process `pid` holds open
/// (from /proc/PID/fdinfo: program and link fds carry `prog_id`).
fn block_programs_of(pid: u32) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    let dir = format!("/proc/{pid}/fdinfo");
    for e in fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {dir}: {e}"))
        .flatten()
    {
        let Ok(info) = fs::read_to_string(e.path()) else {
            continue;
        };
        for line in info.lines() {
            if let Some(id) = line.strip_prefix("prog_id:") {
                if let Ok(id) = id.trim().parse::<u32>() {
                    if program_name(id).is_some_and(|n| n.starts_with("block_")) {
                        ids.insert(id);
                    }
                }
            }
        }
    }
    ids
}

/// The name of loaded program `id`, or `None` if no such program is loaded
/// (`bpftool prog show id N`).
fn program_name(id: u32) -> Option<String> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string(), "--json"])
        .output()
        .expect("bpftool is required by kernel_serve (scripts/setup --test installs it)");
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["name"].as_str().map(str::to_string)
}

/// All loaded programs whose names start with `block_` (`bpftool prog show`).
fn loaded_block_programs() -> BTreeSet<u32> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .expect("bpftool is required by kernel_serve (scripts/setup --test installs it)");
    assert!(out.status.success(), "bpftool prog show failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    v.as_array()
        .expect("a list of programs")
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("block_")))
        .filter_map(|p| p["id"].as_u64().map(|i| i as u32))
        .collect()
}

/// Stops the server with `sig` and checks: exit code 0, the "stopped" line, and none of the
/// `block_` programs it held is still loaded. Other test processes may load their own
/// `block_` programs meanwhile, so the check is by program id, not by a global count.
fn stop_and_check_detached(server: Server, sig: libc::c_int) {
    let pid = server.pid();
    let ours = block_programs_of(pid);
    // A counting run's six: new request, split, request merge, insert, issue, requeue.
    assert!(
        ours.len() >= 6,
        "the server should hold its block_ tracepoint programs, holds {ours:?}"
    );
    let loaded_before = loaded_block_programs();
    assert!(
        ours.is_subset(&loaded_before),
        "bpftool lists every program the server holds: {ours:?} vs {loaded_before:?}"
    );
    let (status, stderr) = server.stop(sig);
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status}; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("mergetrace: stopped; programs detached"),
        "stderr:\n{stderr}"
    );
    // The kernel frees programs after their last reference goes, not always before the
    // process is reaped (seen once in CI): give it up to 10 s, as kernel_reliability does.
    let deadline = Instant::now() + Duration::from_secs(10);
    let loaded_after = loop {
        let now = loaded_block_programs();
        if ours.is_disjoint(&now) || Instant::now() > deadline {
            break now;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let left: Vec<_> = ours.intersection(&loaded_after).collect();
    assert!(
        left.is_empty(),
        "block_ programs of pid {pid} still loaded after it exited: {left:?}"
    );
    // The count of programs that were there before dropped by at least the server's.
    let still = loaded_after.intersection(&loaded_before).count();
    assert!(
        still <= loaded_before.len() - ours.len(),
        "{still} of {} block_ programs still loaded, the server held {}: before {loaded_before:?}, after {loaded_after:?}",
        loaded_before.len(),
        ours.len()
    );
}

// ---------------------------------------------------------------------------------------
// Tests

/// Two scrapes around a fio run: counter deltas against /proc/diskstats and fio, exactly,
/// per device and per cgroup; the limit gauge; the histograms; the `# TYPE` lines. Stops
/// with SIGTERM.
#[test]
fn scrape_deltas_match_diskstats_and_fio() {
    require_root();
    // mq-deadline: a loop device on the host, the lab's vdb in the guests (5.10's loop
    // devices offer no scheduler).
    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();
    // A limit far above what the run needs: charged, never throttled, shown as a gauge.
    cg.set_write_iops(&lo, 1_000_000);

    let server = Server::start(&lo, &[]);
    let before = server.scrape();
    let d0 = lo.diskstats();
    let report = Fio::sequential("serve", &lo, "write", SIZE, 32)
        .in_cgroup(&cg)
        .run();
    let d1 = lo.diskstats();
    let after = server.scrape();
    let d = d1.since(&d0);

    check_exposition(&after);
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, SIZE / BS, "fio wrote {ios} I/Os");
    assert_eq!(d.in_flight, 0);

    check_device_deltas((&before, &after), &lo, &d, ios);
    let path = cg.path();
    let mine = [
        ("device", lo.name.as_str()),
        ("cgroup", path.as_str()),
        ("direction", "write"),
    ];
    let requests = check_cgroup_counts((&before, &after), &mine, &d, ios);
    check_histograms(&after, &mine, requests, ios);

    // Nothing lost, every kind listed.
    assert!(after.has("mergetrace_lost_events_total", &[("kind", "rq_issue")]));
    assert_eq!(
        after.sum("mergetrace_lost_events_total", &[]),
        0.0,
        "{}",
        after.text
    );
    assert_eq!(after.sum("mergetrace_cgroups_folded", &[]), 0.0);

    stop_and_check_detached(server, libc::SIGTERM);
}

/// A limit that appears while serve runs (a pod created with `io.max`): the cgroup is created
/// and limited after serve started and nothing limited anything before. Its charges are
/// exported from its first bio, equal to blk-throttle's own counters; its bios waited.
#[test]
fn a_limit_set_after_serve_started_is_exported_from_its_first_bio() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    udev_settle();
    let server = Server::start(&lo, &[]);
    let cg = Cgroup::new();
    cg.set_write_iops(&lo, 2000);
    let tb = cg.throttle_stats(&lo);
    let d0 = lo.diskstats();
    let report = Fio::sequential("serve-later", &lo, "write", SIZE, 32)
        .opt("time_based", "1")
        .opt("runtime", "2")
        .in_cgroup(&cg)
        .run();
    let (serviced, serviced_bytes) = cg.throttle_stats(&lo).write_since(&tb);
    let d = lo.diskstats().since(&d0);
    let after = server.scrape();
    let path = cg.path();
    let mine = [
        ("device", lo.name.as_str()),
        ("cgroup", path.as_str()),
        ("direction", "write"),
    ];
    let ios = fio_total_ios(&report, "write");
    let ctx = format!("io_serviced {serviced}, fio {ios}, diskstats {d:?}");
    assert_eq!(after.count("mergetrace_bios_total", &mine), ios, "{ctx}");
    assert_eq!(serviced, ios, "{ctx}");
    assert_eq!(
        after.count("mergetrace_throttle_charged_ios_total", &mine),
        serviced,
        "{ctx}"
    );
    assert_eq!(
        after.count("mergetrace_throttle_charged_bytes_total", &mine),
        serviced_bytes,
        "{ctx}"
    );
    assert_eq!(
        after.count("mergetrace_requests_total", &mine),
        d.writes,
        "{ctx}"
    );
    assert!(
        after.count("mergetrace_throttled_bios_total", &mine) > 0,
        "no bio waited under wiops 2000; {ctx}"
    );
    assert_eq!(
        after.sum("mergetrace_throttle_limit_iops", &mine),
        2000.0,
        "{}",
        after.text
    );
    stop_and_check_detached(server, libc::SIGTERM);
}

/// `serve --all-disks`: a disk made while serving (a new loop device, as a pod's volume is
/// attached) is exported from its first bio: its series appear and equal /proc/diskstats.
#[test]
fn a_disk_attached_while_serving_is_exported_from_its_first_bio() {
    require_root();
    let first = LoopDevice::new(SIZE);
    let server = Server::start(&first, &["--all-disks"]);
    let lo = LoopDevice::disposable(SIZE);
    lo.set_scheduler("none");
    let d0 = lo.diskstats();
    let cg = Cgroup::new();
    let report = Fio::sequential("new-disk", &lo, "write", SIZE, 32)
        .in_cgroup(&cg)
        .run();
    let d = lo.diskstats().since(&d0);
    // The new disk is found within a poll of the slot it took.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let m = server.scrape();
        if m.has("mergetrace_requests_total", &[("device", lo.name.as_str())]) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "no series of {} in:\n{}\nstderr:\n{}",
            lo.name,
            m.text,
            server.stderr()
        );
        thread::sleep(Duration::from_millis(200));
    };
    let path = cg.path();
    let mine = [
        ("device", lo.name.as_str()),
        ("cgroup", path.as_str()),
        ("direction", "write"),
    ];
    let ios = fio_total_ios(&report, "write");
    let dev = [("device", lo.name.as_str()), ("direction", "write")];
    assert_eq!(after.count("mergetrace_bios_total", &mine), ios, "{d:?}");
    assert_eq!(
        after.count("mergetrace_requests_total", &dev),
        d.writes,
        "{d:?}"
    );
    let merged: u64 = MERGE_PATHS
        .iter()
        .map(|p| after.count("mergetrace_merged_total", &[dev[0], dev[1], ("path", p)]))
        .sum();
    assert_eq!(merged, d.writes_merged, "{d:?}");
    let stderr = server.stderr();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(&format!("changed: {} (", lo.name))
                && l.contains("a new disk, traced from its first bio")),
        "{stderr}"
    );
    stop_and_check_detached(server, libc::SIGTERM);
}

/// The exposition: every family with its TYPE, once; the info line.
fn check_exposition(after: &Metrics) {
    for (family, ty) in FAMILIES {
        let line = format!("# TYPE {family} {ty}");
        assert_eq!(
            after.text.lines().filter(|l| *l == line).count(),
            1,
            "want exactly one {line:?} in:\n{}",
            after.text
        );
    }
    assert!(
        after.text.contains("mergetrace_info{tier=\""),
        "{}",
        after.text
    );
}

/// Per device (every cgroup), the counter deltas over the run: the kernel's own counters.
fn check_device_deltas(
    (before, after): (&Metrics, &Metrics),
    lo: &BlockDev,
    d: &DiskStats,
    ios: u64,
) {
    let dev = [("device", lo.name.as_str()), ("direction", "write")];
    let delta = |m: &str, labels: &[(&str, &str)]| -> u64 {
        let (a, b) = (after.count(m, labels), before.count(m, labels));
        assert!(a >= b, "{m} {labels:?} went backwards: {b} -> {a}");
        a - b
    };
    let ctx = format!("diskstats delta {d:?}");
    assert_eq!(
        delta("mergetrace_bios_total", &dev),
        ios,
        "bios vs fio; {ctx}"
    );
    assert_eq!(delta("mergetrace_bio_bytes_total", &dev), SIZE, "{ctx}");
    assert_eq!(
        delta("mergetrace_requests_total", &dev),
        d.writes,
        "requests; {ctx}"
    );
    assert_eq!(
        delta("mergetrace_merged_total", &dev),
        d.writes_merged,
        "merged, summed over paths; {ctx}"
    );
    let rq_bytes = delta("mergetrace_request_bytes_total", &dev);
    assert_eq!(rq_bytes % 512, 0);
    assert_eq!(
        rq_bytes / 512,
        d.sectors_written,
        "request bytes / 512 = sectors; {ctx}"
    );
    assert_eq!(delta("mergetrace_splits_total", &dev), 0);
    assert_eq!(
        delta(
            "mergetrace_merged_total",
            &[dev[0], dev[1], ("path", "unknown")]
        ),
        0,
        "merges from an unrecognised path"
    );
    assert!(d.writes < ios, "batches of 32 merge: {d:?}");
}

/// Per cgroup (`mine`: device, cgroup, direction labels): fio's cgroup has every bio, all
/// charged, and its limit as a gauge. Returns its requests.
fn check_cgroup_counts(
    (before, after): (&Metrics, &Metrics),
    mine: &[(&str, &str); 3],
    d: &DiskStats,
    ios: u64,
) -> u64 {
    assert_eq!(
        before.count("mergetrace_bios_total", mine),
        0,
        "a new cgroup starts at 0"
    );
    assert_eq!(after.count("mergetrace_bios_total", mine), ios);
    assert_eq!(
        after.count("mergetrace_throttle_charged_ios_total", mine),
        ios
    );
    assert_eq!(
        after.count("mergetrace_throttle_charged_bytes_total", mine),
        SIZE
    );
    assert_eq!(after.count("mergetrace_throttled_bios_total", mine), 0);
    assert_eq!(
        after.sum("mergetrace_throttle_limit_iops", mine),
        1_000_000.0,
        "{}",
        after.text
    );
    let requests = after.count("mergetrace_requests_total", mine);
    let merged: u64 = MERGE_PATHS
        .iter()
        .map(|p| {
            after.count(
                "mergetrace_merged_total",
                &[mine[0], mine[1], mine[2], ("path", p)],
            )
        })
        .sum();
    assert_eq!(
        requests + merged,
        ios,
        "every bio became a request or merged"
    );
    assert_eq!(requests, d.writes, "all of this run's requests are fio's");
    requests
}

/// Histograms of fio's cgroup: cumulative, _count = requests, _sum = bytes / bios.
fn check_histograms(after: &Metrics, mine: &[(&str, &str); 3], requests: u64, ios: u64) {
    let sizes = histogram(after, "mergetrace_request_size_bytes", mine, requests, SIZE);
    assert_eq!(sizes[0], (512.0, 0.0), "no request under 512 bytes");
    let le_4k = sizes.iter().find(|(le, _)| *le == 4096.0).unwrap().1;
    assert!(
        le_4k < requests as f64,
        "merged requests are larger than 4 KiB: {sizes:?}"
    );
    histogram(after, "mergetrace_bios_per_request", mine, requests, ios);
}

/// The buckets of histogram `name` (le, cumulative count), checked: cumulative, the last one
/// +Inf with all `count` observations, `_count` and `_sum` as given.
fn histogram(
    after: &Metrics,
    name: &str,
    mine: &[(&str, &str); 3],
    count: u64,
    sum: u64,
) -> Vec<(f64, f64)> {
    let b = after.buckets(name, mine);
    assert!(
        b.windows(2).all(|w| w[0].1 <= w[1].1),
        "{name} cumulative: {b:?}"
    );
    assert!(b.last().unwrap().0.is_infinite(), "{name}: {b:?}");
    assert_eq!(b.last().unwrap().1, count as f64, "{name}");
    assert_eq!(after.sum(&format!("{name}_count"), mine), count as f64);
    assert_eq!(after.sum(&format!("{name}_sum"), mine), sum as f64);
    b
}

/// 50 concurrent scrapes all answer 200 with the exposition; clients that disconnect
/// mid-response (or mid-request) do not take the server down; SIGINT stops it cleanly.
#[test]
fn concurrent_scrapes_and_clients_that_go_away() {
    require_root();
    let lo = LoopDevice::new(16 << 20);
    udev_settle();
    let server = Server::start(&lo, &["--max-cgroups", "5"]);
    // Some I/O so the body has rows.
    run_workload(&lo, None, &["--ios", "256", "--batch", "32"]);

    const N: usize = 50;
    let addr = server.addr;
    let handles: Vec<_> = (0..N)
        .map(|_| thread::spawn(move || http_get(addr, "/metrics")))
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (status, _, body) = h.join().expect("a scrape thread panicked");
        assert_eq!(status, 200, "scrape {i}: {body}");
        assert!(
            body.contains("# TYPE mergetrace_bios_total counter"),
            "scrape {i}: {body}"
        );
    }

    // Clients that go away: after a few bytes of the response, before reading anything, and
    // in the middle of their request. Bounded: 20 of each.
    for i in 0..20 {
        let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
        s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut first = [0u8; 16];
        s.read_exact(&mut first)
            .unwrap_or_else(|e| panic!("client {i}: no response start: {e}"));
        assert!(
            first.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&first)
        );
        drop(s); // unread body: the server's writes now fail
    }
    for _ in 0..20 {
        let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        drop(s);
    }
    for _ in 0..20 {
        let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
        s.write_all(b"GET /metr").unwrap();
        drop(s);
    }
    // Still serving, and counting.
    let m = server.scrape();
    assert_eq!(
        m.count(
            "mergetrace_bios_total",
            &[("device", lo.name.as_str()), ("direction", "write")]
        ),
        256,
        "{}",
        m.text
    );
    let (status, _, _) = http_get(addr, "/nothing-here");
    assert_eq!(status, 404);

    // An idle keep-alive connection does not hold up the shutdown.
    let idle = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
    stop_and_check_detached(server, libc::SIGINT);
    drop(idle);
}
