//! A real container runtime: podman (with runc) runs fio in a root filesystem built by
//! debootstrap, with a write IOPS limit on a loop device (`--device-write-iops`), the case of
//! issue 43. Each order is checked: the tracer started first (the container and its limit
//! appear during the run) and the container first. In both, the container's row is named by
//! podman's name (the live view's JSON, `-c NAME`, a capture's report and its table, the
//! exporter's `name` label), its bios are fio's writes and /proc/diskstats', and CHARGED (live,
//! `serve`) is the container cgroup's own count (`blkio.throttle.io_serviced`, v2 `io.stat`
//! wios). Exact counts only, never a time.
//!
//! The container starts with fio held on its stdin (`read go`), so that a tracer with
//! `-c NAME` can start once the name exists and before fio writes, and stays up after fio
//! until the counters are read (`read done`).
//!
//! Needs root, BPF, podman, runc, fio and the root filesystem that `scripts/setup --test`
//! builds into the cache (`MERGETRACE_LAB_CACHE`, else `$XDG_CACHE_HOME/mergetrace-lab`, else
//! `~/.cache/mergetrace-lab`: `rootfs/bookworm-fio`); missing any is a failure.
//!   cargo test --release -p mergetrace --features mergetrace/kernel-tests --test kernel_podman
mod support;

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{mpsc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{serve::*, *};

const BS: u64 = 4096;
/// 16 MiB of 4 KiB writes at 2,000 a second: about 2 s of fio.
const IOS: u64 = 4096;
const WIOPS: u64 = 2000;
/// How long podman may take to start or end a container (a bound against hangs).
const PODMAN_TIMEOUT: Duration = Duration::from_secs(120);

/// The tests take turns: one container at a time, and the cgroups podman makes are shared.
static TURN: Mutex<()> = Mutex::new(());

/// The root filesystem with fio that `scripts/setup --test` builds (debootstrap) and caches.
fn rootfs() -> PathBuf {
    let cache = std::env::var_os("MERGETRACE_LAB_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("mergetrace-lab"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mergetrace-lab"))
        })
        .unwrap_or_else(|| PathBuf::from("/var/cache/mergetrace-lab"));
    let dir = cache.join("rootfs/bookworm-fio");
    assert!(
        dir.join("usr/bin/fio").exists(),
        "no root filesystem with fio at {}: `scripts/setup --test` builds it (debootstrap \
         --variant=minbase --include=fio bookworm)",
        dir.display()
    );
    dir
}

fn require_podman() {
    for tool in ["podman", "runc"] {
        require_program(tool, "kernel_podman");
    }
}

/// The cgroups podman makes on cgroup v1 with its cgroupfs manager, in every controller's
/// hierarchy: `libpod_parent/` and the `conmon` cgroup in it. Removed at the end when this
/// test made them (they are empty once the container is gone).
fn libpod_parents() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir("/sys/fs/cgroup")
        .map(|it| {
            it.flatten()
                .map(|e| e.path().join("libpod_parent"))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// A podman container running `read go; fio …; echo FIO-EXIT $?; read done`, removed (with
/// the cgroups podman made for it) on drop.
struct Container {
    name: String,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Its full id and its cgroup (relative to the io hierarchy's mount).
    id: String,
    cgroup: String,
    parents_before: Vec<PathBuf>,
}

impl Container {
    fn start(dev: &BlockDev) -> Container {
        let name = unique_name();
        let node = dev.path.display().to_string();
        let fio = format!(
            "fio --name=w --filename={node} --rw=write --bs={BS} --direct=1 --invalidate=0 \
             --ioengine=libaio --iodepth=64 --iodepth_batch_submit=32 \
             --iodepth_batch_complete_min=32 --size={} --output-format=json",
            IOS * BS
        );
        let script = format!("read go && {fio}; echo FIO-EXIT $?; read done");
        let parents_before = libpod_parents();
        let mut child = Command::new("podman")
            .args([
                "run",
                "-i",
                "--name",
                &name,
                "--runtime",
                "runc",
                "--network",
                "none",
            ])
            // the host lacks CAP_SYS_RESOURCE: podman's default nofile/nproc limits fail
            .args([
                "--ulimit",
                "nofile=1024:20000",
                "--ulimit",
                "nproc=4096:4096",
            ])
            .args(["--device", &node])
            .arg(format!("--device-write-iops={node}:{WIOPS}"))
            .arg("--rootfs")
            .arg(rootfs())
            .args(["sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start podman");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    let _ = tx.send(line);
                }
            });
        }
        let stdin = child.stdin.take();
        let mut c = Container {
            name,
            child: Some(child),
            stdin,
            lines,
            id: String::new(),
            cgroup: String::new(),
            parents_before,
        };
        let (id, pid) = c.wait_running();
        c.id = id;
        c.cgroup = io_cgroup_of(pid);
        c
    }

    /// Waits until podman says the container runs: (its id, its process).
    fn wait_running(&mut self) -> (String, u32) {
        let deadline = Instant::now() + PODMAN_TIMEOUT;
        loop {
            let out = Command::new("podman")
                .args([
                    "inspect",
                    "--format",
                    "{{.Id}} {{.State.Running}} {{.State.Pid}}",
                ])
                .arg(&self.name)
                .output()
                .expect("cannot run podman inspect");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if let [id, "true", pid] = text.split_whitespace().collect::<Vec<_>>()[..] {
                if let Ok(pid) = pid.parse::<u32>() {
                    if pid > 0 {
                        return (id.to_string(), pid);
                    }
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("podman run exited ({status}): {}", self.output());
            }
            assert!(
                Instant::now() < deadline,
                "the container did not run within {PODMAN_TIMEOUT:?}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// What podman and the container printed so far.
    fn output(&self) -> String {
        self.lines.try_iter().collect::<Vec<_>>().join("\n")
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{line}").expect("cannot write to the container's stdin");
        stdin.flush().unwrap();
    }

    /// Lets fio run and waits for it: its JSON report.
    fn run_fio(&mut self) -> Value {
        self.send("go");
        let deadline = Instant::now() + PODMAN_TIMEOUT;
        let mut out = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("FIO-EXIT ") => {
                    assert_eq!(line, "FIO-EXIT 0", "fio failed in the container:\n{out}");
                    break;
                }
                Ok(line) => {
                    out.push_str(&line);
                    out.push('\n');
                }
                Err(e) => panic!("fio did not end in the container ({e}):\n{out}"),
            }
        }
        // fio's JSON is the output's one object (it may warn on lines before it)
        let start = out.find("\n{").map_or(0, |i| i + 1);
        let start = if out.starts_with('{') { 0 } else { start };
        serde_json::from_str(&out[start..])
            .unwrap_or_else(|e| panic!("fio printed no JSON report ({e}):\n{out}"))
    }

    /// Blk-cgroup's count of the container's write bios on `dev`: v1
    /// `blkio.throttle.io_serviced` (every pass through blk-throttle, counted before the bio
    /// waits), v2 `io.stat` wios.
    fn io_serviced_writes(&self, dev: &BlockDev) -> u64 {
        let (version, mount) = cgroup_hierarchy();
        let dir = mount.join(self.cgroup.trim_start_matches('/'));
        match version {
            CgroupVersion::V1 => {
                let text = fs::read_to_string(dir.join("blkio.throttle.io_serviced")).unwrap();
                parse_blkio_stat(&text, &dev.maj_min()).write
            }
            CgroupVersion::V2 => {
                let text = fs::read_to_string(dir.join("io.stat")).unwrap();
                parse_io_stat(&text, &dev.maj_min())
                    .get("wios")
                    .copied()
                    .unwrap_or(0)
            }
        }
    }

    /// The short name mergetrace gives it: `podman:NAME (ID12)`.
    fn short(&self) -> String {
        format!("podman:{} ({})", self.name, &self.id[..12])
    }

    /// Lets the container end and waits for podman.
    fn finish(&mut self) {
        self.send("done");
        self.stdin = None;
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + PODMAN_TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("podman run did not end within {PODMAN_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "podman run: {status}: {}", self.output());
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for parent in libpod_parents() {
            if !self.parents_before.contains(&parent) {
                let _ = fs::remove_dir(parent.join("conmon"));
                let _ = fs::remove_dir(&parent);
            }
        }
    }
}

/// The cgroup of `pid` in the io hierarchy (v1 `blkio`, v2 `0::`), relative to its mount.
fn io_cgroup_of(pid: u32) -> String {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let want_v1 = cgroup_hierarchy().0 == CgroupVersion::V1;
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let hit = if want_v1 {
                controllers.split(',').any(|c| c == "blkio")
            } else {
                controllers.is_empty()
            };
            hit.then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no io cgroup in /proc/{pid}/cgroup:\n{text}"))
}

/// One scrape of the exporter's /metrics.
fn scrape(server: &Server) -> prometheus_parse::Scrape {
    let (status, _, body) = http_get(server.addr, "/metrics");
    assert_eq!(status, 200, "scrape failed: {body}\n{}", server.stderr());
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("the exposition does not parse ({e}):\n{body}"))
}

/// The one sample of `metric` whose labels include `labels`.
fn sample<'a>(
    m: &'a prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> &'a prometheus_parse::Sample {
    let mut found = m
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)));
    let one = found
        .next()
        .unwrap_or_else(|| panic!("no {metric} {labels:?} in the scrape"));
    assert!(found.next().is_none(), "several {metric} {labels:?}");
    one
}

fn number(v: &prometheus_parse::Value) -> f64 {
    match v {
        prometheus_parse::Value::Counter(x)
        | prometheus_parse::Value::Gauge(x)
        | prometheus_parse::Value::Untyped(x) => *x,
        other => panic!("not a number: {other:?}"),
    }
}

/// Which starts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// The tracers, then the container: its limit appears during their run (issue 43).
    TracerFirst,
    /// The container (and its limit), then the tracers.
    ContainerFirst,
}

fn row<'a>(device: &'a Value, path: &str) -> Option<&'a Value> {
    device["cgroups"]
        .as_array()
        .expect("cgroups is an array")
        .iter()
        .find(|r| r["cgroup"] == path)
}

fn run(order: Order) {
    require_root();
    require_podman();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let lo = LoopDevice::new(64 << 20);
    udev_settle();
    let dir = tempfile::tempdir().unwrap();
    let cap = dir.path().join("run.mtr");
    // The live view's JSON, a recording and the exporter, started together.
    let start_tracers = |lo: &LoopDevice| {
        let tracer = Tracer::on(lo);
        let rec = Recorder::start(lo, &cap, test_tier().as_deref());
        let server = Server::start(lo, &[]);
        (tracer, rec, server)
    };
    let disk_before = diskstats(&lo.name);
    let ((tracer, rec, server), mut ctr) = match order {
        Order::TracerFirst => {
            let tracers = start_tracers(&lo);
            (tracers, Container::start(&lo))
        }
        Order::ContainerFirst => {
            let ctr = Container::start(&lo);
            (start_tracers(&lo), ctr)
        }
    };
    // `-c NAME`: podman's name resolves to the container's cgroup once the container exists.
    let by_name = Tracer::start(&["-d", lo.name.as_str(), "-c", ctr.name.as_str()]);
    let fio = ctr.run_fio();
    assert_eq!(fio_total_ios(&fio, "write"), IOS, "fio's writes");
    let serviced = ctr.io_serviced_writes(&lo);
    let metrics = scrape(&server);
    let (status, serve_err) = server.stop(libc::SIGTERM);
    assert!(status.success(), "serve: {status}: {serve_err}");
    let (out, named) = (tracer.stop(), by_name.stop());
    let rec_err = rec.stop();
    let disk = diskstats(&lo.name).since(&disk_before);
    ctr.finish();
    let ctx = format!("{order:?}, container {} in {}", ctr.name, ctr.cgroup);
    eprintln!("{ctx}: io_serviced writes {serviced}, diskstats {disk:?}");
    assert_eq!(serviced, IOS, "{ctx}: io_serviced counts fio's writes");

    // The tracer's JSON names the container by podman's name.
    assert_eq!(out.lost_events(), 0, "{ctx}: {}", out.stderr);
    let dev = out.device(&lo);
    let r = row(dev, &ctr.cgroup).unwrap_or_else(|| panic!("{ctx}: no row in {dev}"));
    let name = &r["name"];
    assert_eq!(name["kind"], "podman", "{ctx}: {r}");
    assert_eq!(name["container_name"], ctr.name.as_str(), "{ctx}: {name}");
    assert_eq!(name["container_id"], ctr.id.as_str(), "{ctx}: {name}");
    assert_eq!(name["short"], ctr.short(), "{ctx}: {name}");
    // Its bios are fio's; the disk's are /proc/diskstats' (nothing else writes the device).
    let w = &r["write"];
    assert_eq!(u(w, "bios"), IOS, "{ctx}: {w}");
    assert_eq!(u(w, "bytes"), IOS * BS, "{ctx}: {w}");
    assert_identity(w, &ctx);
    let total = &dev["total"]["write"];
    assert_eq!(
        u(total, "bios"),
        disk.writes + disk.writes_merged,
        "{ctx}: bios vs diskstats; {total}"
    );
    assert_eq!(
        u(total, "requests"),
        disk.writes,
        "{ctx}: requests vs diskstats"
    );
    assert_eq!(
        u(total, "merged"),
        disk.writes_merged,
        "{ctx}: merged vs diskstats"
    );

    // `-c NAME` traced that cgroup alone, and it counted every bio of it.
    assert_eq!(named.lost_events(), 0, "{ctx}: {}", named.stderr);
    let rows = named.device(&lo)["cgroups"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{ctx}: -c {} gave {rows:?}", ctr.name);
    assert_eq!(rows[0]["cgroup"], ctr.cgroup.as_str(), "{ctx}");
    assert_eq!(rows[0]["name"]["short"], ctr.short(), "{ctx}");
    assert_eq!(u(&rows[0]["write"], "bios"), IOS, "{ctx}");
    // It started after the limit existed: its CHARGED is blk-cgroup's count.
    assert_eq!(
        u(&rows[0]["write"], "charged_ios"),
        serviced,
        "{ctx}: -c run's CHARGED"
    );

    // The capture names it too (a cgroup the recording saw appear, in tracer-first order),
    // in its report's JSON and its table.
    assert!(!rec_err.contains("warning"), "{ctx}: {rec_err}");
    let cap = cap.to_str().unwrap();
    let (json, _) = succeeded(mergetrace(&["report", cap, "--json"]), "report --json");
    let rep: Value = serde_json::from_str(json.trim()).expect("report --json is one object");
    let rdev = rep["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["major"] == lo.major && d["minor"] == lo.minor)
        .unwrap_or_else(|| panic!("{ctx}: {} not in the report", lo.name));
    let rr = row(rdev, &ctr.cgroup).unwrap_or_else(|| panic!("{ctx}: no report row in {rdev}"));
    assert_eq!(
        rr["name"]["container_name"],
        ctr.name.as_str(),
        "{ctx}: {rr}"
    );
    assert_eq!(u(&rr["write"], "bios"), IOS, "{ctx}: report {rr}");
    let (table, _) = succeeded(mergetrace(&["report", cap]), "report");
    assert!(
        table
            .lines()
            .any(|l| l.contains(&ctr.cgroup) && l.contains(&ctr.short())),
        "{ctx}: no table line with {} and {}:\n{table}",
        ctr.cgroup,
        ctr.short()
    );

    // The exporter's series of the container carry its name.
    let series = [
        ("device", lo.name.as_str()),
        ("cgroup", ctr.cgroup.as_str()),
        ("direction", "write"),
    ];
    let bios = sample(&metrics, "mergetrace_bios_total", &series);
    let short = ctr.short();
    assert_eq!(
        bios.labels.get("name"),
        Some(short.as_str()),
        "{ctx}: {bios:?}"
    );
    assert_eq!(number(&bios.value), IOS as f64, "{ctx}: {bios:?}");

    // CHARGED is what blk-throttle charged the container: every bio, whichever started first
    // (issue 43: limits that appear after the tracer started), in the live view and `serve`.
    assert_eq!(
        u(w, "charged_ios"),
        serviced,
        "{ctx}: CHARGED vs io_serviced; {w}"
    );
    let charged = sample(&metrics, "mergetrace_throttle_charged_ios_total", &series);
    assert_eq!(
        number(&charged.value),
        serviced as f64,
        "{ctx}: serve's CHARGED; {charged:?}"
    );
    assert!(
        u(&w["throttled"], "bios") > 0,
        "{ctx}: a 2,000 IOPS limit held fio back; {w}"
    );
}

#[test]
fn podman_container_started_after_the_tracer_is_named_and_charged() {
    run(Order::TracerFirst);
}

#[test]
fn podman_container_started_before_the_tracer_is_named_and_charged() {
    run(Order::ContainerFirst);
}
