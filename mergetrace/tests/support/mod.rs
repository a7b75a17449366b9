//! Shared harness for the kernel integration tests: test disks (loop devices on the host,
//! the lab's scratch virtio disk in a guest), cgroups (v1 blkio or v2 io), /proc/diskstats,
//! the mergetrace binary as a child process, and fio.
//!
//! Every resource is unique per test (pid + counter in its name) and removed by `Drop`, also
//! when the test panics. These tests need root, BPF and fio: when something is missing they
//! FAIL with a message saying what; they never skip.
//!
//! Portability (`cargo xtask lab` runs these binaries inside Debian's 6.1 and 6.12 kernels):
//! - [`TestDisk`]: a fresh loop device over /dev/shm on the host; in the lab
//!   (`MERGETRACE_LAB=1`) the scratch virtio disk `MERGETRACE_LAB_DISK` (/dev/vdb, mq-deadline),
//!   a disk like the virtio volumes of cloud VMs. /proc/diskstats is per disk, so tests of one binary that use
//!   it take turns (a process-wide lock held for the `TestDisk`'s life); its queue settings are
//!   put back on drop. [`LoopDevice`] stays a loop device everywhere (6.1's tmpfs has no
//!   O_DIRECT for files, but O_DIRECT on the loop device itself works there: the loop driver
//!   does buffered I/O to its backing file).
//! - [`Cgroup`]: the v1 blkio hierarchy when it is mounted (this host), otherwise cgroup v2
//!   (the lab), with `io.max` for limits and `io.stat` for blk-cgroup's counters.
//! - [`Tracer`]: `--tier $MERGETRACE_TEST_TIER` when that is set (`tracepoint` / `fentry`).
//! - [`serve::Server`]: `mergetrace serve` on a free loopback port (kernel_serve, kernel_prometheus,
//!   kernel_serve_security); [`tls::TestPki`]: certificates for it, made at test time.
#![allow(dead_code)]

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex, Once,
    },
    time::Duration,
};

/// The real blktrace + blkparse as a second oracle (guests only: it needs debugfs).
pub mod blktrace;
mod busy_disk;
mod cgroup;
mod child;
mod disk;
mod diskstats;
mod fio;
mod interrupt_disk;
mod recorder;
/// `mergetrace serve` as a child (`use support::serve::*`: kernel_churn has a server of its own).
pub mod serve;
// The unit tests' test PKI (made at test time, no key committed), shared rather than copied.
mod test_disk;
#[path = "../../src/testing/tls.rs"]
pub mod tls;
mod tracer;
/// Real programs' I/O (ext4, fsync, fstrim, SQLite, PostgreSQL...) for the conformance suite.
pub mod workloads;

// One flat namespace for the test binaries (`use support::*`); a binary that uses nothing of
// a module would otherwise warn about its re-export.
#[allow(unused_imports)]
pub use self::{
    busy_disk::*, cgroup::*, child::*, disk::*, diskstats::*, fio::*, interrupt_disk::*,
    recorder::*, test_disk::*, tracer::*,
};

/// How long the tracer may take to load and attach its probes (BPF verification on a busy
/// 2-core machine can be slow). A bound against hangs, not an assertion on speed.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the tracer may take to drain and print its totals after SIGINT.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(120);

pub const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

/// A count as mergetrace prints it: "12,345".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The mergetrace binary the tests run: `MERGETRACE_TEST_BIN` when set (e.g. the released
/// static binary, `target/dist/mergetrace-VERSION-x86_64-linux/bin/mergetrace`), else the one
/// cargo built with the tests.
pub fn mergetrace_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("MERGETRACE_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mergetrace").to_string())
    })
}

/// Whether the running kernel was built with `option` (`=y` or `=m`), by its own config:
/// `/proc/config.gz` (through zcat), else `/boot/config-RELEASE`. `None` when neither can be
/// read: the caller then requires the feature, as without this.
pub fn kernel_config(option: &str) -> Option<bool> {
    let text = std::process::Command::new("zcat")
        .arg("/proc/config.gz")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .or_else(|| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
            std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
        })?;
    let set = [format!("{option}=y"), format!("{option}=m")];
    Some(text.lines().any(|l| set.iter().any(|s| l == s)))
}

/// Running inside a guest of `cargo xtask lab` (`MERGETRACE_LAB=1`).
pub fn in_lab() -> bool {
    std::env::var("MERGETRACE_LAB").is_ok_and(|v| v == "1")
}

/// The lab's guest kernel series ("6.1", "6.12"), `None` outside the lab.
pub fn lab_kernel() -> Option<String> {
    in_lab()
        .then(|| std::env::var("MERGETRACE_LAB_KERNEL").ok())
        .flatten()
}

/// The running kernel's release as (major, minor), from `uname -r` (`/proc/sys/kernel/osrelease`,
/// e.g. "5.10.0-46-cloud-amd64" -> (5, 10)). Panics if it cannot be read or parsed.
pub fn kernel_version() -> (u32, u32) {
    let r = fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_else(|e| panic!("cannot read /proc/sys/kernel/osrelease: {e}"));
    let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
    let (Some(Ok(major)), Some(Ok(minor))) = (
        it.next().map(str::parse::<u32>),
        it.next().map(str::parse::<u32>),
    ) else {
        panic!("cannot parse the kernel release {:?}", r.trim());
    };
    (major, minor)
}

/// Whether blk-throttle charges a split remainder one more io: 6.0 and later
/// (BIO_BPS_THROTTLED: only the bytes are charged once, the remainder is resubmitted and
/// charged an io again). Before 6.0 a bio is charged once, before it is split: its remainder
/// carries BIO_THROTTLED and skips blk-throttle, so `charged_ios` = bios there. blk-cgroup's
/// own count (v1 io_serviced, v2 io.stat wios) counts every pass either way (bios + splits).
pub fn throttle_charges_split_remainders() -> bool {
    kernel_version() >= (6, 0)
}

/// `host` on the host, `lab` in a lab guest. The lab runs under QEMU's software emulation,
/// 10-15x slower than the host: its workloads are smaller (the relations checked are the
/// same; only the counts scale).
pub fn scaled(host: u64, lab: u64) -> u64 {
    if in_lab() {
        lab
    } else {
        host
    }
}

/// The tier the tests ask the tracer for: `MERGETRACE_TEST_TIER` (`tracepoint`, `fentry`,
/// `auto`), or `None` (mergetrace's own default, auto).
pub fn test_tier() -> Option<String> {
    std::env::var("MERGETRACE_TEST_TIER")
        .ok()
        .filter(|t| !t.is_empty())
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);
/// `losetup -f` picks a free device and then binds it; two at once can pick the same one.
static LOSETUP_LOCK: Mutex<()> = Mutex::new(());
static STALE_CLEANUP: Once = Once::new();
static LAB_SETUP: Once = Once::new();

/// A name unique in this test binary and across concurrent test binaries: `mt-test-<pid>-<n>`.
pub fn unique_name() -> String {
    format!(
        "mt-test-{}-{}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    )
}

/// Panics unless `tool --version` runs: the test target `by` fails, never skips, without it
/// (`scripts/setup --test` installs every tool a test needs).
pub fn require_program(tool: &str, by: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "`{tool}` is required by {by} and was not found in PATH: `scripts/setup --test` installs it"
    );
}

/// Panics unless running as root with the tools these tests need. Never skips: a CI job
/// that cannot run them must go red, not green.
pub fn require_root() {
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the kernel pipeline tests need root (BPF, loop devices, cgroups): run them as root \
         (e.g. `sudo -E cargo test --release -p mergetrace --test kernel_pipeline`); \
         they deliberately fail instead of skipping"
    );
    if in_lab() {
        LAB_SETUP.call_once(|| {
            // A loop driver built as a module is not loaded on demand without udev's static
            // nodes: load it (the lab's /init makes modprobe work in the guest).
            if !Path::new("/dev/loop-control").exists() {
                let _ = Command::new("modprobe").arg("loop").status();
            }
            // The guest's /init leaves the loopback interface down; tests that talk to
            // mergetrace over 127.0.0.1 (kernel_serve) need it.
            let _ = Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .stderr(Stdio::null())
                .status();
        });
    }
    for tool in ["losetup", "fio"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        assert!(
            found,
            "`{tool}` is required by the kernel pipeline tests and was not found in PATH"
        );
    }
    STALE_CLEANUP.call_once(cleanup_stale);
}

/// Removes loop devices and cgroups left by earlier test processes that were killed before
/// their `Drop`s ran (only our own naming pattern, only when that process is gone).
fn cleanup_stale() {
    fn stale(name: &str) -> bool {
        let Some(rest) = name.strip_prefix("mt-test-") else {
            return false;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            return false;
        };
        let n = n.strip_suffix(".img").unwrap_or(n);
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u64>()) else {
            return false;
        };
        pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
    }
    if let Ok(out) = Command::new("losetup").arg("-a").output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // /dev/loop3: [0027]:2 (/dev/shm/mt-test-123-4.img)
            let Some((dev, rest)) = line.split_once(':') else {
                continue;
            };
            let Some(file) = rest.rsplit_once('(').and_then(|(_, f)| f.strip_suffix(')')) else {
                continue;
            };
            let Some(base) = file.strip_prefix("/dev/shm/") else {
                continue;
            };
            if stale(base) {
                let _ = Command::new("losetup").args(["-d", dev]).status();
            }
        }
    }
    if let Ok(entries) = fs::read_dir("/dev/shm") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".img") && stale(&name) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    let cgroup_root = detect_cgroup_hierarchy()
        .as_ref()
        .map(|(_, root)| root.as_path());
    if let Some(Ok(entries)) = cgroup_root.map(fs::read_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name) && e.path().is_dir() {
                let _ = remove_cgroup_dir(&e.path());
            }
        }
    }
}

/// `udevadm settle` when udev is there; a no-op on machines without it.
pub fn udev_settle() {
    let _ = Command::new("udevadm")
        .args(["settle", "--timeout=60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_sysfs(path: &Path, value: &str) {
    fs::write(path, value)
        .unwrap_or_else(|e| panic!("cannot write {value:?} to {}: {e}", path.display()));
}

/// Runs a command to completion, requiring success; returns its stdout.
pub fn run_cmd(cmd: &mut Command) -> String {
    run_ok(cmd)
}
