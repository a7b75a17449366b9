//! A real Prometheus scrapes `mergetrace serve`: Debian's `prometheus` server, on loopback
//! with a config of its own (scrape every 1 s) and a scratch storage directory, scrapes the
//! exporter tracing a loop device while fio writes to it. The counter deltas that PromQL
//! computes over the run, over Prometheus's HTTP API, must equal the /proc/diskstats deltas
//! of the run (requests, merges, sectors) and fio's I/O count (bios), exactly. Twice: over
//! plain HTTP, and over TLS with a client certificate and basic auth (`--web.config.file`,
//! a test CA made at test time), as a fleet runs it.
//!
//! The two samples the deltas are taken between are not found by sleeping: the test reads
//! diskstats, then polls the API until Prometheus has stored a scrape that started after that
//! read (`timestamp(up)`), and evaluates PromQL at those scrapes' own timestamps (`@`).
//!
//! The second test evaluates deploy/grafana-dashboard.json against that Prometheus: every
//! template variable's query and every panel's target, interpolated as Grafana does
//! (`dashboard`), over a run that exercises every panel (two cgroups, one under a write IOPS
//! limit that binds, one reading and writing under a bandwidth limit that does not; merging
//! writes). Each must return series whose labels fill its legend and include the cgroups it is
//! about; a target that returns nothing fails, naming its panel.
//!
//! Needs root, BPF, loop devices, cgroup v1 blkio or v2 io, fio and prometheus
//! (scripts/setup --test installs it). Missing any of them is a FAILURE, never a skip. Both
//! servers are stopped by their pid, and the scratch directory removed, also on failure. Run:
//!   cargo xtask test --test kernel_prometheus
mod dashboard;
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;
use support::{serve::*, *};

const SIZE: u64 = 64 << 20;
const BS: u64 = 4096;
/// How long Prometheus may take to start, or to store a scrape that started after a given
/// moment (it scrapes every second): a bound against hangs, not an assertion on speed.
const PROM_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// Prometheus as a child process

/// `prometheus` on loopback, scraping one target every second, its config and TSDB in a
/// scratch directory. Dropping it stops the process (SIGTERM, then SIGKILL, by its pid) and
/// then removes the directory.
struct Prometheus {
    proc: Spawned,
    addr: SocketAddr,
    // Declared after `proc`: removed once the process is gone.
    dir: tempfile::TempDir,
}

/// Panics unless `prometheus` runs: the test fails, never skips, without it.
fn require_prometheus() {
    require_program("prometheus", "kernel_prometheus");
}

impl Prometheus {
    /// Scrapes `target` every second; `job` is more of the job's YAML (scheme, tls_config,
    /// basic_auth), each line indented by four spaces.
    fn start(target: SocketAddr, job: &str) -> Prometheus {
        require_prometheus();
        let dir = tempfile::Builder::new()
            .prefix("mt-test-prometheus-")
            .tempdir()
            .expect("a scratch directory for Prometheus");
        let config = dir.path().join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: mergetrace\n{job}    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start prometheus");
        let (proc, _lines) = Spawned::new(child);
        let mut prom = Prometheus { proc, addr, dir };
        let deadline = Instant::now() + PROM_TIMEOUT;
        loop {
            if let Some(status) = prom.proc.try_wait() {
                prom.proc.join_stderr();
                panic!(
                    "prometheus exited ({status}) before it was ready; stderr:\n{}",
                    prom.proc.stderr()
                );
            }
            if get(addr, "/-/ready").is_some_and(|(code, _)| code == 200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus was not ready within {PROM_TIMEOUT:?}; stderr:\n{}",
                prom.proc.stderr()
            );
            thread::sleep(Duration::from_millis(200));
        }
        prom
    }

    /// An instant query evaluated at `time` (Unix seconds): the result vector's samples,
    /// each (labels, value).
    fn query(&self, promql: &str, time: f64) -> Vec<(Value, f64)> {
        let path = format!(
            "/api/v1/query?query={}&time={time:.3}",
            percent_encode(promql)
        );
        let (code, body) = get(self.addr, &path)
            .unwrap_or_else(|| panic!("no answer from prometheus to {promql}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("prometheus answered {code} with no JSON ({e}): {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "query {promql} failed ({code}): {body}"
        );
        assert_eq!(v["data"]["resultType"], "vector", "{body}");
        v["data"]["result"]
            .as_array()
            .expect("a result list")
            .iter()
            .map(|s| {
                let value = s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("no value in {s}"));
                (s["metric"].clone(), value)
            })
            .collect()
    }

    /// A query whose result is one sample (e.g. a `sum`): its value.
    fn scalar(&self, promql: &str, time: f64) -> f64 {
        let r = self.query(promql, time);
        assert_eq!(r.len(), 1, "{promql} at {time}: want one sample, got {r:?}");
        r[0].1
    }

    /// Waits until Prometheus has stored a successful scrape of the exporter that started
    /// after Unix time `after`, and returns that scrape's timestamp.
    fn scrape_after(&self, after: f64) -> f64 {
        // Prometheus may move a scrape's timestamp by up to 2 ms to align it to the interval
        // (--scrape.timestamp-tolerance): a margin above that.
        let after = after + 0.005;
        let deadline = Instant::now() + PROM_TIMEOUT;
        loop {
            let now = unix_now();
            let r = self.query("timestamp(up{job=\"mergetrace\"})", now);
            if let Some((_, ts)) = r.first() {
                if *ts > after {
                    let up = self.scalar("up{job=\"mergetrace\"}", *ts);
                    assert_eq!(up, 1.0, "the scrape at {ts} failed: {}", self.targets());
                    return *ts;
                }
            }
            assert!(
                Instant::now() < deadline,
                "prometheus stored no scrape after {after} within {PROM_TIMEOUT:?}: {}\nstderr:\n{}",
                self.targets(),
                self.proc.stderr()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// What Prometheus says about its target (health, last error), for failure messages.
    fn targets(&self) -> String {
        get(self.addr, "/api/v1/targets")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.proc.signal(libc::SIGTERM);
        if self.proc.wait_exit(Duration::from_secs(30)).is_none() {
            // Spawned's own Drop kills what is still running (SIGKILL, by pid) and reaps it.
            eprintln!("prometheus did not stop within 30 s of SIGTERM: killing it");
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_secs_f64()
}

/// Everything but unreserved characters percent-encoded (a query string's value).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One HTTP/1.0 GET (so the answer comes whole, never chunked): (status, body), or `None`
/// when nothing listens yet or the exchange breaks.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).ok()?;
    s.set_read_timeout(Some(HTTP_TIMEOUT)).ok()?;
    s.set_write_timeout(Some(HTTP_TIMEOUT)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

// ---------------------------------------------------------------------------------------
// The test

/// fio's 4 KiB sequential O_DIRECT writes, submitted 32 at a time (31 of 32 merge), in a
/// cgroup of their own; Prometheus's deltas over the run against diskstats and fio.
#[test]
fn prometheus_deltas_match_diskstats() {
    deltas_match_diskstats(&[], "", "http");
}

/// The same over TLS, with the client certificate the server requires and verifies and a
/// basic-auth password checked against its bcrypt hash, while serve runs as nobody with its
/// privileges dropped.
#[test]
fn prometheus_deltas_match_diskstats_over_tls_with_basic_auth() {
    let pki = support::tls::TestPki::new();
    let config = pki.path().join("web.yml");
    fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n\
             basic_auth_users:\n  prometheus: {}\n",
            support::tls::bcrypt_hash("scrape me")
        ),
    )
    .unwrap();
    let job = format!(
        "    scheme: https\n    tls_config:\n      ca_file: {}\n      cert_file: {}\n      \
         key_file: {}\n    basic_auth:\n      username: prometheus\n      password: scrape me\n",
        pki.ca.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    let args = [
        "--web.config.file",
        config.to_str().unwrap(),
        "--user",
        "nobody",
    ];
    deltas_match_diskstats(&args, &job, "https");
}

/// serve with `serve_args` (its scheme `scheme`), Prometheus with the job's `job` lines.
fn deltas_match_diskstats(serve_args: &[&str], job: &str, scheme: &str) {
    require_root();
    require_prometheus();
    let started = Instant::now();
    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();

    let server = Server::start(&lo, serve_args);
    assert_eq!(server.scheme, scheme);
    let prom = Prometheus::start(server.addr, job);

    let d0 = lo.diskstats();
    let t0 = prom.scrape_after(unix_now());
    let report = Fio::sequential("prometheus", &lo, "write", SIZE, 32)
        .in_cgroup(&cg)
        .run();
    let d1 = lo.diskstats();
    let t1 = prom.scrape_after(unix_now());
    let d = d1.since(&d0);
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, SIZE / BS, "fio wrote {ios} I/Os");
    assert_eq!(d.in_flight, 0);

    // PromQL: the value at the last scrape minus the value at the first, summed over the
    // device's series (a series born during the run counts from 0, one never born is 0).
    let dev = lo.name.as_str();
    let delta = |metric: &str, selector: &str| -> u64 {
        let sel = format!("{metric}{{{selector}}}");
        let q = format!("(sum({sel}) or vector(0)) - (sum({sel} @ {t0:.3}) or vector(0))");
        let v = prom.scalar(&q, t1);
        assert!(v >= 0.0 && v.fract() == 0.0, "{q} = {v}");
        v as u64
    };
    let write = format!("device=\"{dev}\",direction=\"write\"");
    let read = format!("device=\"{dev}\",direction=\"read\"");
    let requests = delta("mergetrace_requests_total", &write);
    let merged = delta("mergetrace_merged_total", &write);
    let bios = delta("mergetrace_bios_total", &write);
    let bio_bytes = delta("mergetrace_bio_bytes_total", &write);
    let request_bytes = delta("mergetrace_request_bytes_total", &write);
    let splits = delta("mergetrace_splits_total", &write);
    let read_requests = delta("mergetrace_requests_total", &read);
    let read_merged = delta("mergetrace_merged_total", &read);
    let lost = delta("mergetrace_lost_events_total", "");
    let path = cg.path();
    let cgroup_bios = delta(
        "mergetrace_bios_total",
        &format!("{write},cgroup=\"{path}\""),
    );
    let cgroup_requests = delta(
        "mergetrace_requests_total",
        &format!("{write},cgroup=\"{path}\""),
    );
    let samples = prom.scalar(
        &format!(
            "count_over_time(up{{job=\"mergetrace\"}}[{}ms])",
            ((t1 - t0) * 1000.0).round() as u64 + 1
        ),
        t1,
    );

    let ctx = format!(
        "scrapes at {t0:.3} and {t1:.3} ({samples} stored); diskstats delta {d:?}; prometheus \
         targets {}",
        prom.targets()
    );
    assert_eq!(requests, d.writes, "write requests vs diskstats; {ctx}");
    assert_eq!(merged, d.writes_merged, "write merges vs diskstats; {ctx}");
    assert_eq!(
        request_bytes % 512,
        0,
        "request bytes are whole sectors; {ctx}"
    );
    assert_eq!(
        request_bytes / 512,
        d.sectors_written,
        "request bytes / 512 vs diskstats' sectors written; {ctx}"
    );
    assert_eq!(bios, ios, "bios vs fio's I/Os; {ctx}");
    assert_eq!(splits, 0, "4 KiB bios are not split; {ctx}");
    assert_eq!(
        bios,
        d.writes + d.writes_merged,
        "each bio started a request or merged: diskstats' writes + merges; {ctx}"
    );
    assert_eq!(bio_bytes, SIZE, "{ctx}");
    assert_eq!(read_requests, d.reads, "read requests vs diskstats; {ctx}");
    assert_eq!(
        read_merged, d.reads_merged,
        "read merges vs diskstats; {ctx}"
    );
    assert_eq!(cgroup_bios, ios, "fio's cgroup has every bio; {ctx}");
    assert_eq!(
        cgroup_requests, d.writes,
        "fio's cgroup has every request; {ctx}"
    );
    assert_eq!(lost, 0, "lost events; {ctx}");
    assert!(
        d.writes < ios,
        "batches of 32 merge, or this compares nothing: {d:?}"
    );
    eprintln!(
        "kernel_prometheus: {dev} over {scheme}: prometheus (scrapes {t0:.3} → {t1:.3}, {samples} stored) \
         requests {requests} = diskstats writes {}, merged {merged} = writes_merged {}, \
         sectors {} = sectors_written {}, bios {bios} = fio {ios} = writes + merged, reads \
         {read_requests} = {}; {:.1} s",
        d.writes,
        d.writes_merged,
        request_bytes / 512,
        d.sectors_written,
        d.reads,
        started.elapsed().as_secs_f64()
    );

    let (pid, dir) = (prom.proc.pid(), prom.dir.path().to_path_buf());
    drop(prom);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "prometheus (pid {pid}) still runs"
    );
    assert!(!dir.exists(), "{} is still there", dir.display());
    let (status, stderr) = server.stop(libc::SIGTERM);
    assert_eq!(
        status.code(),
        Some(0),
        "mergetrace serve: exit status {status}; stderr:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------
// The Grafana dashboard

/// The run's two cgroups, as a target's series must show them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Writes under a write IOPS limit that binds: charged, throttled, delayed.
    Limited,
    /// Writes and reads under a read bandwidth limit far above what it reads.
    Free,
}

/// The value a target's series must hold: each required cgroup has a series (of one of its
/// directions) that holds it, or, for a target without a cgroup label, every series does.
#[derive(Clone, Copy, Debug)]
enum Check {
    /// A number above 0 (a rate of what the run did).
    Positive,
    /// A number (not NaN), e.g. a quantile or a mean.
    Finite,
    /// Exactly this (a gauge, or a count of things that did not happen).
    Exactly(f64),
}

impl Check {
    fn holds(self, v: f64) -> bool {
        match self {
            Check::Positive => v > 0.0,
            Check::Finite => v.is_finite(),
            Check::Exactly(x) => v == x,
        }
    }
}

/// One target's expectation: the cgroups its series must include (none for a target that
/// aggregates the cgroup label away), and their values.
struct Expect {
    panel_id: u64,
    ref_id: &'static str,
    roles: &'static [Role],
    check: Check,
}

const LIMIT_IOPS: u64 = 1000;
const FREE_READ_BPS: u64 = 1 << 30;
const BOTH: &[Role] = &[Role::Limited, Role::Free];

/// Every target of the dashboard, by panel id and refId: a target missing here (a new panel)
/// fails the test until its expectation is written.
const EXPECT: &[Expect] = &[
    // exporters: count by (tier, version)
    expect(1, "A", &[], Check::Exactly(1.0)),
    // lost events, folded cgroups: nothing lost or folded in this run
    expect(2, "A", &[], Check::Exactly(0.0)),
    expect(3, "A", &[], Check::Exactly(0.0)),
    // bios/s and requests/s
    expect(4, "A", BOTH, Check::Positive),
    expect(4, "B", BOTH, Check::Positive),
    // bios per request: the mean and the median
    expect(5, "A", BOTH, Check::Positive),
    expect(5, "B", BOTH, Check::Finite),
    // merges by path
    expect(6, "A", &[], Check::Finite),
    // charged IOPS and its limit (the limited cgroup's, exactly)
    expect(7, "A", BOTH, Check::Positive),
    expect(7, "B", &[Role::Limited], Check::Exactly(LIMIT_IOPS as f64)),
    // charged bytes and its limit (the free cgroup's, exactly)
    expect(8, "A", BOTH, Check::Positive),
    expect(8, "B", &[Role::Free], Check::Exactly(FREE_READ_BPS as f64)),
    // throttled bios and their mean delay
    expect(9, "A", &[Role::Limited], Check::Positive),
    expect(9, "B", &[Role::Limited], Check::Finite),
    // request sizes by bucket
    expect(10, "A", &[], Check::Finite),
    // lost events by kind: every kind, at 0
    expect(11, "A", &[], Check::Exactly(0.0)),
];

const fn expect(
    panel_id: u64,
    ref_id: &'static str,
    roles: &'static [Role],
    check: Check,
) -> Expect {
    Expect {
        panel_id,
        ref_id,
        roles,
        check,
    }
}

impl Prometheus {
    /// The values of `label` on the series `selector` matches between `start` and `end`, as
    /// Grafana 10 asks for a `label_values(SELECTOR, LABEL)` variable.
    fn label_values(&self, label: &str, selector: &str, start: f64, end: f64) -> Vec<String> {
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}&start={start:.3}&end={end:.3}",
            percent_encode(selector)
        );
        let (code, body) =
            get(self.addr, &path).unwrap_or_else(|| panic!("no answer from prometheus to {path}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("prometheus answered {code} with no JSON ({e}): {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "label values of {label} on {selector} failed ({code}): {body}"
        );
        v["data"]
            .as_array()
            .expect("a list of values")
            .iter()
            .map(|x| x.as_str().expect("a string value").to_string())
            .collect()
    }
}

/// Every query of deploy/grafana-dashboard.json against a Prometheus holding a run that
/// exercises every panel; first with every variable on All, then with the run's own values
/// selected (its device, its two cgroups).
#[test]
fn dashboard_queries_return_their_series() {
    require_root();
    require_prometheus();
    let board = dashboard::load();
    let variables = dashboard::variables(&board);
    let targets = dashboard::targets(&board);
    for t in &targets {
        assert!(
            EXPECT
                .iter()
                .any(|e| e.panel_id == t.panel_id && e.ref_id == t.ref_id),
            "panel {} {:?} target {}: no expectation in EXPECT",
            t.panel_id,
            t.panel,
            t.ref_id
        );
    }
    assert_eq!(
        EXPECT.len(),
        targets.len(),
        "EXPECT names targets the dashboard lacks"
    );

    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let limited = Cgroup::new();
    limited.set_write_iops(&lo, LIMIT_IOPS);
    let free = Cgroup::new();
    free.set_read_bps(&lo, FREE_READ_BPS);
    let server = Server::start(&lo, &[]);
    let prom = Prometheus::start(server.addr, "");

    // Each cgroup's I/O twice: a little first, so that every series exists at the first
    // scrape of the window (rate() sees increases between samples, not a series' birth), then
    // the run the panels show.
    let part = 2 << 20;
    let runs = [
        (&limited, "write", 0),
        (&free, "write", part),
        (&free, "read", part),
    ];
    for (cg, rw, offset) in runs {
        Fio::sequential(&format!("dashboard-first-{rw}"), &lo, rw, 64 << 10, 16)
            .offset(offset)
            .in_cgroup(cg)
            .run();
    }
    let t0 = prom.scrape_after(unix_now());
    // The limited cgroup's 512 bios at 1,000 IOPS, 32 at a time: blk-throttle queues most.
    for (cg, rw, offset) in runs {
        Fio::sequential(&format!("dashboard-{rw}"), &lo, rw, part, 32)
            .offset(offset)
            .in_cgroup(cg)
            .run();
    }
    let t1 = prom.scrape_after(unix_now());
    let window = format!("{}ms", ((t1 - t0) * 1000.0).round() as u64 + 1);
    let roles = [(Role::Limited, limited.path()), (Role::Free, free.path())];

    // The variables, in order: each one's values, then the query of the next with it set.
    let wanted: BTreeMap<&str, Vec<String>> = BTreeMap::from([
        ("instance", vec![server.addr.to_string()]),
        ("device", vec![lo.name.clone()]),
        ("cgroup", vec![limited.path(), free.path()]),
        ("direction", vec!["read".to_string(), "write".to_string()]),
    ]);
    let mut all = BTreeMap::new();
    let mut mine = BTreeMap::new();
    for var in &variables {
        let want = wanted
            .get(var.name.as_str())
            .unwrap_or_else(|| panic!("variable {}: no values to select in this test", var.name));
        for (values, sel) in [
            (&mut all, dashboard::Selection::All),
            (&mut mine, dashboard::Selection::Values(want.clone())),
        ] {
            let selector = dashboard::interpolate(&var.selector, values);
            let found = prom.label_values(&var.label, &selector, t0, t1);
            for w in want {
                assert!(
                    found.contains(w),
                    "variable {}: label_values({selector}, {}) = {found:?}, without {w}",
                    var.name,
                    var.label
                );
            }
            values.insert(var.name.clone(), dashboard::render(var, &sel));
        }
    }

    for (pass, mut values) in [("All", all), ("the run's values", mine)] {
        for range in ["__rate_interval", "__interval", "__range"] {
            values.insert(range.to_string(), window.clone());
        }
        for t in &targets {
            let e = EXPECT
                .iter()
                .find(|e| e.panel_id == t.panel_id && e.ref_id == t.ref_id)
                .unwrap();
            let expr = dashboard::interpolate(&t.expr, &values);
            let what = format!(
                "panel {} {:?} target {} ({pass}): {expr}",
                t.panel_id, t.panel, t.ref_id
            );
            let series = prom.query(&expr, t1);
            check_target(&what, t, e, &series, &roles, pass != "All");
        }
    }
    eprintln!(
        "kernel_prometheus: the dashboard's {} variables and {} targets returned their series, \
         twice (All, and the run's values), over scrapes {t0:.3} → {t1:.3}",
        variables.len(),
        targets.len()
    );
    drop(prom);
    let (status, stderr) = server.stop(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "serve: {status}; stderr:\n{stderr}");
}

/// One target's result: not empty; every series carries the labels its legend names; the
/// cgroups it is about are there with the values wanted; with the run's values selected, no
/// other cgroup.
fn check_target(
    what: &str,
    t: &dashboard::Target,
    e: &Expect,
    series: &[(Value, f64)],
    roles: &[(Role, String)],
    selected: bool,
) {
    assert!(!series.is_empty(), "{what} returned nothing");
    let legend = dashboard::legend_labels(&t.legend);
    for (labels, _) in series {
        for l in &legend {
            assert!(
                labels[l.as_str()].is_string(),
                "{what}: a series without the label {l} its legend shows: {labels}"
            );
        }
    }
    if e.roles.is_empty() {
        for (labels, v) in series {
            assert!(
                e.check.holds(*v),
                "{what}: {labels} = {v}, want {:?}",
                e.check
            );
        }
        return;
    }
    let cgroups: BTreeSet<&str> = series
        .iter()
        .filter_map(|(l, _)| l["cgroup"].as_str())
        .collect();
    for role in e.roles {
        let path = &roles.iter().find(|(r, _)| r == role).unwrap().1;
        let of_role: Vec<&(Value, f64)> = series
            .iter()
            .filter(|(l, _)| l["cgroup"] == path.as_str())
            .collect();
        // One series per direction where the query keeps it: the direction the cgroup did
        // must hold the value.
        assert!(
            of_role.iter().any(|(_, v)| e.check.holds(*v)),
            "{what}: the {role:?} cgroup {path} has {of_role:?}, want a series {:?}; cgroups: \
             {cgroups:?}",
            e.check
        );
    }
    if selected {
        for c in &cgroups {
            assert!(
                roles.iter().any(|(_, p)| p == c),
                "{what}: cgroup {c} was not selected"
            );
        }
    }
}
