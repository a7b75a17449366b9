//! The OCI image that `cargo xtask dist` builds, run as a node runs it: podman loads
//! `target/dist/mergetrace-VERSION-oci.tar` into a scratch store and runs its default
//! entrypoint with `serve -d LOOP --listen 127.0.0.1:PORT`, in a privileged container with the
//! host's network, /sys, /sys/fs/cgroup and /sys/kernel/btf (as deploy/daemonset.yaml does);
//! /proc is the container's own. Scraped on loopback before and after fio writes to the loop
//! device from a cgroup of the host, its counter deltas must equal /proc/diskstats' and fio's
//! exactly, and the cgroup label must be the host's path of fio's cgroup.
//!
//! Needs root, BPF, loop devices, fio, podman and runc (scripts/setup --test installs them),
//! and the image (`./mt dist`; CI runs it before the tests). Missing any of them is a
//! FAILURE, never a skip. podman runs with `--runtime runc` (crun refuses cgroup v1 mixed with
//! v2, as on this host), explicit ulimits (no CAP_SYS_RESOURCE to raise them), its own store,
//! run and tmp directories (removed after), and `--cgroup-parent` under a cgroup of the test's
//! own (removed after) so nothing of the host's podman state is touched. Run:
//!   cargo xtask test --test kernel_image
mod support;

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use prometheus_parse::{Scrape, Value};
use support::{serve::*, *};

const SIZE: u64 = 16 << 20;
const BS: u64 = 4096;

/// The archive `cargo xtask dist` writes for this version.
fn image_archive() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("mergetrace/ is in the workspace")
        .join("target/dist")
        .join(format!("mergetrace-{}-oci.tar", env!("CARGO_PKG_VERSION")))
}

// ---------------------------------------------------------------------------------------
// podman with a scratch store

/// podman with its own storage (vfs), run and tmp directories, cgroups under a parent of its
/// own. Dropping it removes what it made: `podman system reset`, the directories, the cgroups.
struct Podman {
    dir: tempfile::TempDir,
    cgroup_parent: String,
}

impl Podman {
    fn new() -> Podman {
        let dir = tempfile::Builder::new()
            .prefix("mt-test-podman-")
            .tempdir_in("/dev/shm")
            .expect("a scratch directory for podman");
        Podman {
            dir,
            cgroup_parent: format!("/{}", unique_name()),
        }
    }

    /// `podman` with the scratch store's global flags.
    fn cmd(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.arg(format!("--root={}", d.join("root").display()))
            .arg(format!("--runroot={}", d.join("run").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .args([
                "--storage-driver=vfs",
                "--cgroup-manager=cgroupfs",
                "--events-backend=file",
                "--runtime=runc",
            ])
            .stdin(Stdio::null());
        c
    }

    /// `podman rm --force NAME`, quietly: for clean-up, where nothing more can be done.
    fn remove(&self, name: &str) {
        let _ = self
            .cmd()
            .args(["rm", "--force", "--time=0", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Runs a short podman command: its stdout, or a panic with what it printed.
    fn run(&self, args: &[&str]) -> String {
        let out = self
            .cmd()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run podman {args:?}: {e}"));
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self
            .cmd()
            .args(["system", "reset", "--force"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // The parent's cgroups in every v1 controller (or the v2 tree), leaves first.
        for root in cgroup_roots() {
            remove_cgroup_tree(&root.join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}

/// The mount points of the cgroup hierarchies (v1 controllers, or v2).
fn cgroup_roots() -> Vec<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(left.split(' ').nth(4)?))
        })
        .collect()
}

/// rmdir of a cgroup and its descendants, deepest first (a cgroup directory goes only when
/// empty of children and tasks).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
        let _ = fs::remove_dir(dir);
    }
}

// ---------------------------------------------------------------------------------------
// serve in a container

/// `podman run` of serve, attached. Dropping it while it runs (a failed test) removes the
/// container, which would otherwise outlive the podman client.
struct Container<'a> {
    podman: &'a Podman,
    name: String,
    proc: Spawned,
    addr: SocketAddr,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if self.proc.try_wait().is_none() {
            self.podman.remove(&self.name);
        }
    }
}

impl<'a> Container<'a> {
    /// `podman run IMAGE serve -d DEV --listen 127.0.0.1:PORT` in the foreground (podman
    /// passes signals on to serve), returned once serve printed its serving line.
    fn start(podman: &'a Podman, image: &str, dev: &BlockDev) -> Container<'a> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let name = unique_name();
        let mut cmd = podman.cmd();
        cmd.args([
            "run",
            "--rm",
            "--privileged",
            "--network=host",
            "--log-driver=k8s-file",
        ])
        .arg(format!("--name={name}"))
        .arg(format!("--cgroup-parent={}", podman.cgroup_parent))
        .args(["--ulimit=nofile=1024:20000", "--ulimit=nproc=4096:4096"])
        .args(["-v", "/sys:/sys:ro"])
        .args(["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"])
        .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro"])
        .arg(image)
        .args(["serve", "-d", dev.name.as_str(), "--listen"])
        .arg(addr.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let child = cmd.spawn().expect("cannot start podman run");
        let (proc, rx) = Spawned::new(child);
        let mut c = Container {
            podman,
            name,
            proc,
            addr,
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("mergetrace: serving") => {
                    assert_eq!(line, format!("mergetrace: serving http://{addr}/metrics"));
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(status) = c.proc.try_wait() {
                        c.proc.join_stderr();
                        panic!(
                            "podman run exited ({status}) before serve served; stderr:\n{}",
                            c.proc.stderr()
                        );
                    }
                    assert!(
                        e == mpsc::RecvTimeoutError::Timeout && Instant::now() < deadline,
                        "serve in the container did not print its serving line within \
                         {ATTACH_TIMEOUT:?}; stderr:\n{}",
                        c.proc.stderr()
                    );
                }
            }
        }
        c
    }

    fn scrape(&self) -> Scrape {
        let (status, _, body) = http_get(self.addr, "/metrics");
        assert_eq!(status, 200, "scrape failed: {body}\n{}", self.proc.stderr());
        Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("the exposition does not parse ({e}):\n{body}"))
    }
}

/// Sum of a counter over the samples whose labels include every `(name, value)` given.
fn count(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> u64 {
    let v: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => x,
            ref other => panic!("{metric} is not a number: {other:?}"),
        })
        .sum();
    assert!(v >= 0.0 && v.fract() == 0.0, "{metric} {labels:?} = {v}");
    v as u64
}

// ---------------------------------------------------------------------------------------
// The test

/// The image loaded and run; two scrapes around fio's sequential 4 KiB O_DIRECT writes (32 at
/// a time, so most merge), from a cgroup of the host; deltas against diskstats and fio.
#[test]
fn image_serves_counts_equal_to_diskstats() {
    require_root();
    require_program("podman", "kernel_image");
    require_program("runc", "kernel_image");
    let archive = image_archive();
    assert!(
        archive.is_file(),
        "{} is missing: run `./mt dist` first (CI runs it before the tests)",
        archive.display()
    );
    let started = Instant::now();
    let podman = Podman::new();
    let loaded = podman.run(&["load", "--quiet", "--input", &archive.to_string_lossy()]);
    let image = format!("localhost/mergetrace:{}", env!("CARGO_PKG_VERSION"));
    assert!(
        loaded.contains(&image),
        "podman load names the image {loaded:?}, want {image}"
    );
    let entrypoint = podman.run(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.Entrypoint}}",
        &image,
    ]);
    assert_eq!(entrypoint.trim(), "[/usr/bin/mergetrace]");

    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();
    let mut server = Container::start(&podman, &image, &lo);

    let before = server.scrape();
    let d0 = lo.diskstats();
    let report = Fio::sequential("image", &lo, "write", SIZE, 32)
        .in_cgroup(&cg)
        .run();
    let d1 = lo.diskstats();
    let after = server.scrape();
    let d = d1.since(&d0);
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, SIZE / BS, "fio wrote {ios} I/Os");
    assert_eq!(d.in_flight, 0);

    let dev = [("device", lo.name.as_str()), ("direction", "write")];
    let delta = |m: &str, labels: &[(&str, &str)]| -> u64 {
        let (a, b) = (count(&after, m, labels), count(&before, m, labels));
        assert!(a >= b, "{m} {labels:?} went backwards: {b} -> {a}");
        a - b
    };
    let ctx = format!(
        "diskstats delta {d:?}; serve's stderr:\n{}",
        server.proc.stderr()
    );
    assert_eq!(
        delta("mergetrace_bios_total", &dev),
        ios,
        "bios vs fio; {ctx}"
    );
    assert_eq!(
        delta("mergetrace_requests_total", &dev),
        d.writes,
        "requests vs diskstats; {ctx}"
    );
    assert_eq!(
        delta("mergetrace_merged_total", &dev),
        d.writes_merged,
        "merges vs diskstats; {ctx}"
    );
    assert_eq!(
        delta("mergetrace_request_bytes_total", &dev),
        d.sectors_written * 512,
        "request bytes vs diskstats' sectors; {ctx}"
    );
    assert!(
        d.writes < ios,
        "batches of 32 merge, or this compares nothing: {d:?}"
    );
    // The host's cgroup tree, read through the mounted /sys/fs/cgroup: fio's cgroup by its
    // host path, with every bio and request of the run.
    let path = cg.path();
    let mine = [dev[0], dev[1], ("cgroup", path.as_str())];
    assert_eq!(delta("mergetrace_bios_total", &mine), ios, "{path}; {ctx}");
    assert_eq!(
        delta("mergetrace_requests_total", &mine),
        d.writes,
        "{path}; {ctx}"
    );
    assert_eq!(
        count(&after, "mergetrace_lost_events_total", &[]),
        0,
        "{ctx}"
    );
    let version = [("version", env!("CARGO_PKG_VERSION"))];
    assert_eq!(count(&after, "mergetrace_info", &version), 1, "{ctx}");

    server.proc.signal(libc::SIGTERM);
    let status = server
        .proc
        .wait_exit(STOP_TIMEOUT)
        .unwrap_or_else(|| panic!("podman run did not exit within {STOP_TIMEOUT:?} of SIGTERM"));
    assert_eq!(
        status.code(),
        Some(0),
        "serve in the container: {status}; stderr:\n{}",
        server.proc.stderr()
    );
    let left = podman.run(&["ps", "--all", "--quiet"]);
    assert!(left.trim().is_empty(), "containers left: {left}");
    eprintln!(
        "kernel_image: {image} on {}: bios {ios} = fio, requests {} = diskstats writes, merged \
         {} = writes_merged, cgroup {path}; {:.1} s",
        lo.name,
        d.writes,
        d.writes_merged,
        started.elapsed().as_secs_f64()
    );
}
