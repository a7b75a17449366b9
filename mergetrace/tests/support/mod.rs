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
//!   the disk the article is about. /proc/diskstats is per disk, so tests of one binary that use
//!   it take turns (a process-wide lock held for the `TestDisk`'s life); its queue settings are
//!   put back on drop. [`LoopDevice`] stays a loop device everywhere (6.1's tmpfs has no
//!   O_DIRECT for files, but O_DIRECT on the loop device itself works there: the loop driver
//!   does buffered I/O to its backing file).
//! - [`Cgroup`]: the v1 blkio hierarchy when it is mounted (this host), otherwise cgroup v2
//!   (the lab), with `io.max` for limits and `io.stat` for blk-cgroup's counters.
//! - [`Tracer`]: `--tier $MERGETRACE_TEST_TIER` when that is set (`tracepoint` / `fentry`).
#![allow(dead_code)]

use std::{
    fs,
    io::{BufRead, BufReader, Read},
    ops::Deref,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc, Mutex, MutexGuard, Once, OnceLock, PoisonError,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The real blktrace + blkparse as a second oracle (guests only: it needs debugfs).
pub mod blktrace;
/// Real programs' I/O (ext4, fsync, fstrim, SQLite, PostgreSQL...) for the conformance suite.
pub mod workloads;

/// How long the tracer may take to load and attach its probes (BPF verification on a busy
/// 2-core machine can be slow). A bound against hangs, not an assertion on speed.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the tracer may take to drain and print its totals after SIGINT.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(120);

pub const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";

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

// ---------------------------------------------------------------------------------------
// Block devices: the common identity, loop devices, and the test disk

/// A block device the tests drive: its name, node, numbers, and the bytes the test may use
/// (from offset 0). [`LoopDevice`] and [`TestDisk`] dereference to it, so everything that
/// takes a `&BlockDev` takes either.
#[derive(Debug)]
pub struct BlockDev {
    /// e.g. "loop3", "vdb"
    pub name: String,
    /// e.g. "/dev/loop3"
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Bytes the test may use, from offset 0 (a loop device's whole size; on the lab's scratch
    /// disk the region asked for, which may be smaller than the disk).
    pub size: u64,
}

impl BlockDev {
    /// The device behind `/dev/<name>`, its numbers from sysfs.
    fn open(name: &str, size: u64) -> BlockDev {
        let devno = fs::read_to_string(format!("/sys/block/{name}/dev"))
            .unwrap_or_else(|e| panic!("cannot read /sys/block/{name}/dev: {e}"));
        let (maj, min) = devno.trim().split_once(':').expect("MAJ:MIN in sysfs dev");
        BlockDev {
            name: name.to_string(),
            path: PathBuf::from(format!("/dev/{name}")),
            major: maj.parse().unwrap(),
            minor: min.parse().unwrap(),
            size,
        }
    }

    pub fn sysfs(&self) -> PathBuf {
        PathBuf::from(format!("/sys/block/{}", self.name))
    }

    fn queue(&self, attr: &str) -> PathBuf {
        self.sysfs().join("queue").join(attr)
    }

    /// "7:3"
    pub fn maj_min(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    /// The schedulers the device offers (`queue/scheduler`'s entries, brackets removed).
    pub fn schedulers(&self) -> Vec<String> {
        let s = fs::read_to_string(self.queue("scheduler"))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", self.queue("scheduler").display()));
        s.split_whitespace()
            .map(|w| w.trim_start_matches('[').trim_end_matches(']').to_string())
            .collect()
    }

    /// Whether the device offers `sched` ("none" always counts).
    pub fn offers_scheduler(&self, sched: &str) -> bool {
        sched == "none" || self.schedulers().iter().any(|s| s == sched)
    }

    /// Sets the I/O scheduler ("none", "mq-deadline", ...) and checks it took. Panics naming
    /// the cause when the device does not offer it at all (5.10's loop devices list only
    /// "[none]", and writing another name there is silently ignored): use a disk that offers
    /// one ([`scheduler_disk`]).
    pub fn set_scheduler(&self, sched: &str) {
        // A modular scheduler (bfq, kyber, 6.12's mq_deadline) is listed only once loaded,
        // which the kernel's own request_module does on this write.
        let wrote = fs::write(self.queue("scheduler"), sched);
        let now = self.scheduler();
        if now == sched {
            return;
        }
        assert!(
            self.offers_scheduler(sched),
            "{}: the device offers no {sched} scheduler (queue/scheduler lists {:?}; writing it \
             gave {wrote:?}): a queue without elevator support, as 5.10's loop devices are, \
             offers none and ignores the write — run this on a disk that offers it \
             (support::scheduler_disk)",
            self.name,
            self.schedulers()
        );
        panic!(
            "{}: scheduler is {now} after writing {sched} ({wrote:?})",
            self.name
        );
    }

    /// The active scheduler (the bracketed entry).
    pub fn scheduler(&self) -> String {
        let s = fs::read_to_string(self.queue("scheduler")).expect("read scheduler");
        s.split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .unwrap_or("none")
            .to_string()
    }

    /// 0 = all merges, 1 = no extended merges, 2 = no merges. Checked after writing.
    pub fn set_nomerges(&self, level: u32) {
        write_sysfs(&self.queue("nomerges"), &level.to_string());
        let now: u32 = fs::read_to_string(self.queue("nomerges"))
            .expect("read nomerges")
            .trim()
            .parse()
            .expect("nomerges is a number");
        assert_eq!(now, level, "{}: nomerges", self.name);
    }

    pub fn set_queue_attr(&self, attr: &str, value: &str) {
        write_sysfs(&self.queue(attr), value);
    }

    pub fn diskstats(&self) -> DiskStats {
        diskstats(&self.name)
    }
}

/// A loop device over a fresh sparse file in /dev/shm. Detached and deleted on drop.
#[derive(Debug)]
pub struct LoopDevice {
    dev: BlockDev,
    pub backing: PathBuf,
    /// The settings it had when attached (a reused loop device keeps an earlier user's).
    saved: QueueSettings,
    /// The index of a device [`LoopDevice::disposable`] made with LOOP_CTL_ADD, removed
    /// (LOOP_CTL_REMOVE) on drop.
    made: Option<u32>,
}

impl Deref for LoopDevice {
    type Target = BlockDev;
    fn deref(&self) -> &BlockDev {
        &self.dev
    }
}

impl LoopDevice {
    /// A loop device of `size` bytes, udev settled, with a loop device's default queue
    /// settings (scheduler none, nomerges 0, max_sectors_kb the hardware's), whatever an
    /// earlier user of the device left; those are put back on drop.
    pub fn new(size: u64) -> LoopDevice {
        let backing = PathBuf::from(format!("/dev/shm/{}.img", unique_name()));
        {
            let f = fs::File::create(&backing)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", backing.display()));
            f.set_len(size).expect("cannot size the backing file");
        }
        let mut last_err = String::new();
        let mut dev = None;
        for _ in 0..10 {
            let out = {
                let _guard = LOSETUP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
                Command::new("losetup")
                    .args(["-f", "--show"])
                    .arg(&backing)
                    .output()
                    .expect("cannot run losetup")
            };
            if out.status.success() {
                dev = Some(String::from_utf8_lossy(&out.stdout).trim().to_string());
                break;
            }
            // Another process may have taken the same free device: try again.
            last_err = String::from_utf8_lossy(&out.stderr).into_owned();
            thread::sleep(Duration::from_millis(200));
        }
        let Some(dev) = dev else {
            let _ = fs::remove_file(&backing);
            panic!("losetup -f --show {} failed: {last_err}", backing.display());
        };
        LoopDevice::attached(&dev, backing, size, None)
    }

    /// A loop device of its own, which no later user gets: a new /dev/loopN made with
    /// LOOP_CTL_ADD (from index 512 up, above the ones `losetup -f` hands out), attached to a
    /// fresh file like [`LoopDevice::new`], and removed with LOOP_CTL_REMOVE on drop. For tests
    /// that change a queue limit sysfs cannot put back as it was: 6.18's discard_max_bytes
    /// store takes only multiples of the discard granularity up to UINT_MAX bytes, and a loop
    /// device's default (4294966784, granularity 4096) is neither, while a reused loop device
    /// keeps its queue limits after `losetup -d`.
    pub fn disposable(size: u64) -> LoopDevice {
        const LOOP_CTL_ADD: libc::c_ulong = 0x4C80;
        let backing = PathBuf::from(format!("/dev/shm/{}.img", unique_name()));
        {
            let f = fs::File::create(&backing)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", backing.display()));
            f.set_len(size).expect("cannot size the backing file");
        }
        let ctl = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .unwrap_or_else(|e| panic!("cannot open /dev/loop-control: {e}"));
        let _guard = LOSETUP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let made = (512..1024u32).find(|i| {
            // SAFETY: LOOP_CTL_ADD takes the index as its argument; nothing is written back.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&ctl),
                    LOOP_CTL_ADD as _,
                    *i as libc::c_ulong,
                ) >= 0
            }
        });
        let Some(index) = made else {
            let _ = fs::remove_file(&backing);
            panic!("LOOP_CTL_ADD made no loop device with an index from 512 to 1023");
        };
        let dev = format!("/dev/loop{index}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&dev).exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let out = Command::new("losetup").arg(&dev).arg(&backing).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            remove_loop(index);
            let _ = fs::remove_file(&backing);
            panic!("losetup {dev} {} failed: {out:?}", backing.display());
        }
        LoopDevice::attached(&dev, backing, size, Some(index))
    }

    /// The rest of making a [`LoopDevice`] once `dev` is bound to `backing`.
    fn attached(dev: &str, backing: PathBuf, size: u64, made: Option<u32>) -> LoopDevice {
        let path = PathBuf::from(dev);
        let name = path
            .file_name()
            .expect("losetup printed a device path")
            .to_string_lossy()
            .into_owned();
        // From here on Drop cleans up, even if a step below panics.
        let mut lo = LoopDevice {
            dev: BlockDev {
                name,
                path,
                major: 0,
                minor: 0,
                size,
            },
            backing,
            saved: QueueSettings::default(),
            made,
        };
        udev_settle();
        let opened = BlockDev::open(&lo.dev.name, size);
        lo.dev.major = opened.major;
        lo.dev.minor = opened.minor;
        lo.saved = QueueSettings::of(&lo.dev);
        let max_hw = fs::read_to_string(lo.queue("max_hw_sectors_kb")).expect("max_hw_sectors_kb");
        lo.set_scheduler("none");
        lo.set_nomerges(0);
        lo.set_queue_attr("max_sectors_kb", max_hw.trim());
        lo
    }

    /// The device is still bound to our backing file.
    fn still_ours(&self) -> bool {
        fs::read_to_string(self.sysfs().join("loop/backing_file"))
            .is_ok_and(|f| Path::new(f.trim()) == self.backing)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        self.saved.restore();
        // Detaching can briefly fail while something (udev's probe) still holds it open.
        for _ in 0..50 {
            let ok = Command::new("losetup")
                .arg("-d")
                .arg(&self.path)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !self.still_ours() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        if self.still_ours() {
            eprintln!(
                "warning: could not detach {} ({})",
                self.path.display(),
                self.backing.display()
            );
        }
        let _ = fs::remove_file(&self.backing);
        if let Some(index) = self.made {
            remove_loop(index);
        }
    }
}

/// LOOP_CTL_REMOVE of a loop device [`LoopDevice::disposable`] made (retried while it is
/// still busy, e.g. its detach not yet finished).
fn remove_loop(index: u32) {
    const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;
    let Ok(ctl) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    else {
        eprintln!("warning: cannot open /dev/loop-control to remove loop{index}");
        return;
    };
    for _ in 0..50 {
        // SAFETY: LOOP_CTL_REMOVE takes the index as its argument.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ctl),
                LOOP_CTL_REMOVE as _,
                index as libc::c_ulong,
            )
        };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "warning: could not remove loop{index}: {}",
        std::io::Error::last_os_error()
    );
}

/// Tests of one binary run in parallel threads; those on the lab's one scratch disk take
/// turns, since /proc/diskstats (and a scheduler switch) is per disk.
static LAB_DISK_LOCK: Mutex<()> = Mutex::new(());

/// This test's turn on the lab's disks (the scratch disk, the requeue disk, a null_blk
/// device): held for as long as the test uses one, so the tests of one binary run there one
/// after the other.
pub fn lab_turn() -> MutexGuard<'static, ()> {
    LAB_DISK_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Queue attributes a test may change; put back when it is done.
const QUEUE_ATTRS: [&str; 3] = ["scheduler", "nomerges", "max_sectors_kb"];

/// A device's [`QUEUE_ATTRS`] as they were, to put back (loop devices are reused and keep
/// their queue settings after a detach; the lab's disk is shared by the tests).
#[derive(Debug, Default)]
struct QueueSettings(Vec<(PathBuf, String)>);

impl QueueSettings {
    fn of(dev: &BlockDev) -> QueueSettings {
        QueueSettings(
            QUEUE_ATTRS
                .iter()
                .map(|a| {
                    let p = dev.queue(a);
                    let v = if *a == "scheduler" {
                        dev.scheduler()
                    } else {
                        fs::read_to_string(&p)
                            .unwrap_or_default()
                            .trim()
                            .to_string()
                    };
                    (p, v)
                })
                .collect(),
        )
    }

    fn restore(&self) {
        for (p, v) in self.0.iter().rev() {
            if let Err(e) = fs::write(p, v) {
                eprintln!("warning: could not restore {} to {v}: {e}", p.display());
            }
        }
    }
}

/// The disk a kernel test writes to: a fresh loop device over /dev/shm on the host; in the
/// lab the scratch virtio disk (`MERGETRACE_LAB_DISK`, /dev/vdb: virtio-blk, one queue,
/// mq-deadline, 256 tags), held exclusively for the test's life and with its queue settings
/// restored afterwards. Dereferences to [`BlockDev`].
pub enum TestDisk {
    Loop(LoopDevice),
    Lab(LabDisk),
}

/// The lab's scratch disk, held by one test.
pub struct LabDisk {
    dev: BlockDev,
    saved: QueueSettings,
    _turn: MutexGuard<'static, ()>,
}

impl Deref for TestDisk {
    type Target = BlockDev;
    fn deref(&self) -> &BlockDev {
        match self {
            TestDisk::Loop(l) => l,
            TestDisk::Lab(d) => &d.dev,
        }
    }
}

/// Whether this kernel's mq-deadline serves requests by I/O priority (5.14 and later:
/// `dd_dispatch_request` skips lower priorities while higher ones are pending). Before, it
/// has no priorities at all, so an idle-class writer is not held back behind reads.
pub fn mq_deadline_has_priorities() -> bool {
    kernel_version() >= (5, 14)
}

/// A test disk on which requests of `sched` wait in the scheduler while a deep writer runs
/// ([`TestDisk::hold_writes`]): [`scheduler_disk`], except in a lab guest whose mq-deadline
/// has no I/O priorities (5.10: measured 0 merges of 4,096 bios on vdb, reader or not).
/// There it is the lab's requeue disk (vdc), whose ring takes about 5 requests at a time:
/// the rest wait in mq-deadline, where the next bios merge into them, as on a busy disk.
pub fn elevator_disk(size: u64, sched: &str) -> TestDisk {
    if in_lab() && sched == "mq-deadline" && !mq_deadline_has_priorities() {
        let disk = TestDisk::lab_requeue_disk(size);
        disk.set_scheduler(sched);
        return disk;
    }
    scheduler_disk(size, sched)
}

/// A test disk that offers the I/O scheduler `sched` ("mq-deadline", "bfq", ...), for tests
/// that need an elevator: [`TestDisk::new`] — on the host a loop device (6.18's offer
/// mq-deadline), in the lab the scratch disk vdb, which offers mq-deadline on every lab
/// kernel (5.10's loop devices offer no scheduler at all). Panics naming the device and what
/// it lists when it does not offer `sched`.
pub fn scheduler_disk(size: u64, sched: &str) -> TestDisk {
    let disk = TestDisk::new(size);
    if !disk.offers_scheduler(sched) {
        // Modular schedulers are listed once loaded: setting it loads it, or names the cause.
        disk.set_scheduler(sched);
    }
    disk
}

impl TestDisk {
    /// A disk with at least `size` usable bytes from offset 0 (see [`TestDisk`]). In the lab
    /// this waits for the tests of this binary that hold the scratch disk.
    pub fn new(size: u64) -> TestDisk {
        if !in_lab() {
            return TestDisk::Loop(LoopDevice::new(size));
        }
        let turn = lab_turn();
        let path = std::env::var("MERGETRACE_LAB_DISK").unwrap_or_else(|_| "/dev/vdb".into());
        TestDisk::lab_device(&path, size, turn, "(cargo xtask lab --disk MIB)")
    }

    /// The lab's disk that requeues (`MERGETRACE_LAB_REQUEUE_DISK`, /dev/vdc: virtio-blk with
    /// a 16-entry ring and no indirect descriptors, mq-deadline, nr_requests 16, max_segments
    /// 14; README, "Guest-kernel lab"), held and restored like the scratch disk and taking
    /// turns with it. Panics outside the lab: no host device requeues.
    pub fn lab_requeue_disk(size: u64) -> TestDisk {
        assert!(
            in_lab(),
            "the requeue disk exists only in the guest-kernel lab (MERGETRACE_LAB=1)"
        );
        let turn = lab_turn();
        let path =
            std::env::var("MERGETRACE_LAB_REQUEUE_DISK").unwrap_or_else(|_| "/dev/vdc".into());
        TestDisk::lab_device(&path, size, turn, "(the lab's requeue disk)")
    }

    /// A lab disk by path (`/dev/vdb`, `/dev/nullb0`...), held for the test's life with
    /// `turn` (from [`lab_turn`]), its [`QUEUE_ATTRS`] put back on drop. Panics when it has
    /// fewer than `size` bytes (`hint` says how to get more).
    pub fn lab_device(
        path: &str,
        size: u64,
        turn: MutexGuard<'static, ()>,
        hint: &str,
    ) -> TestDisk {
        let name = Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dev = BlockDev::open(&name, size);
        let bytes: u64 = fs::read_to_string(dev.sysfs().join("size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|sectors| sectors * 512)
            .unwrap_or(0);
        assert!(
            bytes >= size,
            "the lab's disk {path} has {bytes} bytes; the test needs {size} {hint}"
        );
        let saved = QueueSettings::of(&dev);
        TestDisk::Lab(LabDisk {
            dev,
            saved,
            _turn: turn,
        })
    }

    /// Like [`TestDisk::new`], but on the host a loop device of its own that is removed after
    /// the test ([`LoopDevice::disposable`]), for tests that change queue limits which cannot
    /// be put back exactly. In the lab the scratch disk, whose settings are put back.
    pub fn new_disposable(size: u64) -> TestDisk {
        if in_lab() {
            TestDisk::new(size)
        } else {
            TestDisk::Loop(LoopDevice::disposable(size))
        }
    }

    /// A loop device of its own, removed after the test ([`TestDisk::new_disposable`]).
    pub fn is_disposable(&self) -> bool {
        matches!(self, TestDisk::Loop(l) if l.made.is_some())
    }

    /// The lab's scratch disk rather than a loop device.
    pub fn is_lab_disk(&self) -> bool {
        matches!(self, TestDisk::Lab(_))
    }
}

impl TestDisk {
    /// The whole disk's size in bytes (at least [`BlockDev::size`]).
    pub fn capacity(&self) -> u64 {
        fs::read_to_string(self.sysfs().join("size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|sectors| sectors * 512)
            .unwrap_or(self.size)
    }

    /// Makes the requests of a writer (a fio job on this disk, below [`BlockDev::size`], run
    /// with [`HeldWrites::run`]) wait in the I/O scheduler `sched`, as they do on a busy disk.
    /// Call it before a tracer starts: for kyber it writes for a while (below), and those
    /// writes must not be in the traced counts. The busy reader runs only inside `run`, so two
    /// tracers started one after the other see the same reads.
    ///
    /// On the host's loop devices they do by themselves (128 tags served by one worker
    /// thread), and `writer` runs as it is. The lab's virtio disk takes every request at once:
    /// 256 tags, and the emulated device completes faster than the emulated CPU submits
    /// (measured on 6.1 and 6.12: 0 merges of 2,048-4,096 bios at iodepth 512 with mq-deadline,
    /// bfq and kyber). There a best-effort reader keeps requests pending on another region of
    /// the disk while the writer runs (its reads are in the read direction, apart from the
    /// writes the tests check; it is stopped, its reads done, before `run` returns), and the
    /// scheduler is made to hold the writes back behind them:
    /// - mq-deadline, bfq: the writer runs in I/O priority class idle (fio `prioclass=3`).
    ///   mq-deadline does not dispatch a lower priority while a higher one is pending
    ///   (`dd_dispatch_request`: "Ignore lower priority requests if any higher priority
    ///   requests are pending"; aged ones go after `prio_aging_expire`, 10 s), and bfq serves
    ///   its idle class only when no other class has requests. (Measured on 6.12: 1,893 and
    ///   2,038 merges of 2,048 bios.)
    /// - kyber (no priorities): a read latency target of 1 µs (`iosched/read_lat_nsec`) that
    ///   every read misses, and a write target of 10 s that every write meets. kyber's timer
    ///   (`kyber_timer_fn`) then sees congestion and throttles the domains with good latencies
    ///   — the writes' token depth shrinks, so write requests wait in kyber's per-CPU lists
    ///   where the next bio merges (`blk_bio_list_merge`, the software-queue path). (Measured:
    ///   604 to 1,976 merges of 2,048 bios on 6.1 and 6.12 — and once, on 6.12, 0 of 4,096:
    ///   the depth had not shrunk before every write was done. So 2 s of writes elsewhere on
    ///   the disk come first, here.) The targets are put back after.
    /// - none: nothing (there is no scheduler to hold them; merges in the software queue need
    ///   a busy device).
    pub fn hold_writes(&self, sched: &str) -> HeldWrites<'_> {
        let mut held = HeldWrites {
            disk: self,
            busy_reader: false,
            prioclass_idle: false,
            _targets: None,
        };
        if !self.is_lab_disk() || !["mq-deadline", "bfq", "kyber"].contains(&sched) {
            return held;
        }
        held.busy_reader = true;
        held.prioclass_idle = sched != "kyber";
        if sched == "kyber" {
            held._targets = Some([
                self.set_queue_attr_restored("iosched/read_lat_nsec", "1000"),
                self.set_queue_attr_restored("iosched/write_lat_nsec", "10000000000"),
            ]);
            // kyber shrinks the write domain's depth only from a p99 of write latencies (500
            // samples, or a second of them) taken while reads are late; without writes before
            // the measured ones, all of those could be done first (seen on 6.12: 0 merges of
            // 4,096). 2 s of writes elsewhere on the disk, with the reader busy, leave the depth
            // at 1-2; it does not grow back while writes meet their 10 s target.
            let reader = self.start_busy_reader();
            Fio::new("kyber-warm-up", &self.path)
                .opt("rw", "randwrite")
                .opt("bs", "4k")
                .opt("direct", "1")
                .opt("ioengine", "libaio")
                .opt("iodepth", "64")
                .offset(self.capacity() / 4)
                .size(self.capacity() / 4)
                .opt("time_based", "1")
                .opt("runtime", "2")
                .run();
            reader.kill();
        }
        held
    }

    /// Random reads on the third quarter of the disk until killed, started once its requests
    /// are going (10 s at most) and kyber's timer (every 100 ms) has seen their latencies.
    fn start_busy_reader(&self) -> FioRun {
        let cap = self.capacity();
        assert!(
            cap >= 2 * self.size,
            "the lab disk ({cap} bytes) has no room for the reader beside {} bytes",
            self.size
        );
        let reads_before = self.diskstats().reads;
        let reader = Fio::new("busy-reader", &self.path)
            .opt("rw", "randread")
            .opt("bs", "4k")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "16")
            .offset(cap / 2)
            .size(cap / 4)
            .opt("time_based", "1")
            .opt("runtime", "3600")
            // One process: waiting for it waits for its reads.
            .opt("thread", "1")
            .spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.diskstats().reads == reads_before && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(500));
        reader
    }
}

/// What holds the writes back on the lab's disk; see [`TestDisk::hold_writes`].
pub struct HeldWrites<'a> {
    disk: &'a TestDisk,
    busy_reader: bool,
    prioclass_idle: bool,
    _targets: Option<[QueueAttrRestore; 2]>,
}

impl HeldWrites<'_> {
    /// Starts the busy reader, runs `writer` to completion (in I/O priority class idle where
    /// that holds it back), stops the reader (its reads are done when this returns).
    pub fn run(self, writer: Fio) -> Value {
        let reader = self.busy_reader.then(|| self.disk.start_busy_reader());
        let writer = if self.prioclass_idle {
            writer.opt("prioclass", "3")
        } else {
            writer
        };
        let report = writer.run();
        if let Some(r) = reader {
            r.kill();
        }
        report
    }
}

impl Drop for LabDisk {
    fn drop(&mut self) {
        // Before the turn is handed on (fields drop after this body).
        self.saved.restore();
    }
}

// ---------------------------------------------------------------------------------------
// /proc/diskstats

/// One /proc/diskstats line, every field (Documentation/admin-guide/iostats.rst).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub major: u32,
    pub minor: u32,
    pub reads: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub ms_reading: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub ms_writing: u64,
    /// A level, not a counter.
    pub in_flight: u64,
    pub io_ticks_ms: u64,
    pub time_in_queue_ms: u64,
    pub discards: u64,
    pub discards_merged: u64,
    pub sectors_discarded: u64,
    pub ms_discarding: u64,
    pub flushes: u64,
    pub ms_flushing: u64,
}

impl DiskStats {
    /// Counter deltas `self - before` (in_flight is taken from `self`).
    pub fn since(&self, before: &DiskStats) -> DiskStats {
        let d = |a: u64, b: u64| {
            assert!(a >= b, "diskstats counter went backwards: {b} -> {a}");
            a - b
        };
        DiskStats {
            major: self.major,
            minor: self.minor,
            reads: d(self.reads, before.reads),
            reads_merged: d(self.reads_merged, before.reads_merged),
            sectors_read: d(self.sectors_read, before.sectors_read),
            ms_reading: d(self.ms_reading, before.ms_reading),
            writes: d(self.writes, before.writes),
            writes_merged: d(self.writes_merged, before.writes_merged),
            sectors_written: d(self.sectors_written, before.sectors_written),
            ms_writing: d(self.ms_writing, before.ms_writing),
            in_flight: self.in_flight,
            io_ticks_ms: d(self.io_ticks_ms, before.io_ticks_ms),
            time_in_queue_ms: d(self.time_in_queue_ms, before.time_in_queue_ms),
            discards: d(self.discards, before.discards),
            discards_merged: d(self.discards_merged, before.discards_merged),
            sectors_discarded: d(self.sectors_discarded, before.sectors_discarded),
            ms_discarding: d(self.ms_discarding, before.ms_discarding),
            flushes: d(self.flushes, before.flushes),
            ms_flushing: d(self.ms_flushing, before.ms_flushing),
        }
    }
}

/// Parses one line of /proc/diskstats (the name is the third field).
pub fn parse_diskstats_line(line: &str) -> Option<(String, DiskStats)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 14 {
        return None;
    }
    let n = |i: usize| -> u64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0) };
    Some((
        f[2].to_string(),
        DiskStats {
            major: f[0].parse().ok()?,
            minor: f[1].parse().ok()?,
            reads: n(3),
            reads_merged: n(4),
            sectors_read: n(5),
            ms_reading: n(6),
            writes: n(7),
            writes_merged: n(8),
            sectors_written: n(9),
            ms_writing: n(10),
            in_flight: n(11),
            io_ticks_ms: n(12),
            time_in_queue_ms: n(13),
            discards: n(14),
            discards_merged: n(15),
            sectors_discarded: n(16),
            ms_discarding: n(17),
            flushes: n(18),
            ms_flushing: n(19),
        },
    ))
}

/// The current /proc/diskstats line of device `name` (e.g. "loop3"). Panics if absent.
pub fn diskstats(name: &str) -> DiskStats {
    let text = fs::read_to_string("/proc/diskstats").expect("read /proc/diskstats");
    text.lines()
        .filter_map(parse_diskstats_line)
        .find(|(n, _)| n == name)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{name} is not in /proc/diskstats"))
}

// ---------------------------------------------------------------------------------------
// cgroups: v1 blkio (this host) or v2 io (the lab)

/// Which cgroup hierarchy carries blk-throttle here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 blkio hierarchy: `blkio.throttle.*_device` limits and counters.
    V1,
    /// The unified hierarchy with the io controller: `io.max` limits, `io.stat` counters.
    V2,
}

/// The hierarchy the tests use and its mount, chosen as mergetrace chooses it
/// (`cgroups::io_hierarchy`): the v1 blkio mount if there is one, otherwise the first cgroup2
/// mount. Panics (never skips) when there is neither.
pub fn cgroup_hierarchy() -> &'static (CgroupVersion, PathBuf) {
    detect_cgroup_hierarchy().as_ref().unwrap_or_else(|| {
        panic!("no cgroup v1 blkio or cgroup v2 hierarchy is mounted (these tests need one)")
    })
}

fn detect_cgroup_hierarchy() -> &'static Option<(CgroupVersion, PathBuf)> {
    static H: OnceLock<Option<(CgroupVersion, PathBuf)>> = OnceLock::new();
    H.get_or_init(|| {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
        let mut v2 = None;
        for line in mountinfo.lines() {
            // id parent maj:min root mountpoint opts - fstype source superopts
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mountpoint = PathBuf::from(left.split(' ').nth(4).unwrap_or_default());
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or_default();
            let superopts = r.nth(1).unwrap_or_default();
            if fstype == "cgroup" && superopts.split(',').any(|o| o == "blkio") {
                return Some((CgroupVersion::V1, mountpoint));
            }
            if fstype == "cgroup2" && v2.is_none() {
                v2 = Some(mountpoint);
            }
        }
        v2.map(|root| (CgroupVersion::V2, root))
    })
}

/// A cgroup of its own under the blk-throttle hierarchy's root (v1 blkio or v2, see
/// [`cgroup_hierarchy`]). Removed on drop, after moving any remaining tasks to the root.
///
/// Limits and counters, per version:
/// - limits: v1 `blkio.throttle.{read,write}_{iops,bps}_device` "MAJ:MIN N"; v2 `io.max`
///   "MAJ:MIN riops=N wiops=N rbps=N wbps=N" (the `set_*` methods write either).
/// - [`Cgroup::io_serviced`] / [`Cgroup::io_service_bytes`] are blk-cgroup's own per-cgroup
///   counts of the bios it submitted to a device, and they are not the same counter on v1 and v2:
///   - v1 `blkio.throttle.io_serviced` is counted in `blk_should_throtl` (6.12;
///     `blk_throtl_bio` before): on every pass of a bio through blk-throttle, *before* it waits,
///     on a device where throttling is active (a rule on any group of that device), whether
///     or not this group has a rule. A split remainder passes again: +1 io, +0 bytes.
///   - v2 `io.stat` `rios`/`wios`/`dios` (bytes `rbytes`/`wbytes`/`dbytes`) is counted in
///     `blk_cgroup_bio_start`, from `submit_bio_noacct_nocheck`: *after* blk-throttle let the
///     bio through, on every device, throttled or not; not for the root cgroup. A split
///     remainder is resubmitted through `submit_bio_noacct` and counted again as an io (its
///     bytes not: `BIO_CGROUP_ACCT`), on 6.1 and 6.12 alike (block/blk-cgroup.c,
///     block/blk-merge.c) — so once all I/O has drained, both count bios + split remainders.
///   While bios still wait in the throttle, v1 has counted them and v2 has not yet: compare
///   deltas only after the workload finished.
#[derive(Debug)]
pub struct Cgroup {
    /// e.g. "mt-test-123-4", "mt-test-123-4/mt-test-123-5"
    pub name: String,
    pub dir: PathBuf,
}

/// Per-direction counts of one cgroup and device: v1 `blkio.throttle.io_serviced` /
/// `io_service_bytes`, or the matching v2 `io.stat` fields (`sync`, `async_` and `total` stay
/// 0 on v2 except `total` = read + write + discard).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlkioStat {
    pub read: u64,
    pub write: u64,
    pub sync: u64,
    pub async_: u64,
    pub discard: u64,
    pub total: u64,
}

impl Cgroup {
    pub fn new() -> Cgroup {
        let (version, root) = cgroup_hierarchy();
        match version {
            CgroupVersion::V1 => assert!(
                root.join("cgroup.procs").exists(),
                "{} is not a cgroup v1 blkio hierarchy (these tests need it)",
                root.display()
            ),
            CgroupVersion::V2 => enable_io_controller(root),
        }
        let name = unique_name();
        let dir = root.join(&name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Cgroup { name, dir }
    }

    pub fn version(&self) -> CgroupVersion {
        cgroup_hierarchy().0
    }

    /// The path mergetrace reports: relative to the hierarchy's mount, e.g. "/mt-test-123-4".
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn add_pid(&self, pid: u32) {
        write_sysfs(&self.procs_file(), &pid.to_string());
    }

    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sets one limit, named by its v1 file (`blkio.throttle.write_iops_device`, ...): on v1
    /// writes `"MAJ:MIN value"` to that file, on v2 `"MAJ:MIN wiops=value"` (the matching
    /// key) to `io.max`.
    pub fn set_device_limit(&self, file: &str, dev: &BlockDev, value: u64) {
        match self.version() {
            CgroupVersion::V1 => {
                write_sysfs(&self.dir.join(file), &format!("{} {value}", dev.maj_min()))
            }
            CgroupVersion::V2 => {
                let key = match file.trim_start_matches("blkio.throttle.") {
                    "read_iops_device" => "riops",
                    "write_iops_device" => "wiops",
                    "read_bps_device" => "rbps",
                    "write_bps_device" => "wbps",
                    other => panic!("no io.max key for the v1 limit file {other}"),
                };
                self.set_io_max(dev, &format!("{key}={value}"));
            }
        }
    }

    /// cgroup v2 only: writes `"MAJ:MIN <limits>"` to `io.max`, e.g. `"wiops=2000 wbps=max"`.
    pub fn set_io_max(&self, dev: &BlockDev, limits: &str) {
        assert_eq!(self.version(), CgroupVersion::V2, "io.max is cgroup v2");
        write_sysfs(
            &self.dir.join("io.max"),
            &format!("{} {limits}", dev.maj_min()),
        );
    }

    pub fn set_write_iops(&self, dev: &BlockDev, iops: u64) {
        self.set_device_limit("blkio.throttle.write_iops_device", dev, iops)
    }
    pub fn set_read_iops(&self, dev: &BlockDev, iops: u64) {
        self.set_device_limit("blkio.throttle.read_iops_device", dev, iops)
    }
    pub fn set_write_bps(&self, dev: &BlockDev, bps: u64) {
        self.set_device_limit("blkio.throttle.write_bps_device", dev, bps)
    }
    pub fn set_read_bps(&self, dev: &BlockDev, bps: u64) {
        self.set_device_limit("blkio.throttle.read_bps_device", dev, bps)
    }

    /// v1: parses a `MAJ:MIN Op N` stat file for one device (all zero when the device is
    /// absent).
    pub fn read_stat(&self, file: &str, dev: &BlockDev) -> BlkioStat {
        let text = fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("cannot read {file} of {}: {e}", self.name));
        let mm = dev.maj_min();
        let mut s = BlkioStat::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 3 || f[0] != mm {
                continue;
            }
            let v: u64 = f[2].parse().unwrap_or(0);
            match f[1] {
                "Read" => s.read = v,
                "Write" => s.write = v,
                "Sync" => s.sync = v,
                "Async" => s.async_ = v,
                "Discard" => s.discard = v,
                "Total" => s.total = v,
                _ => {}
            }
        }
        s
    }

    /// v2: the `io.stat` line of one device as key → value (empty when the device is absent,
    /// e.g. before the cgroup's first bio on it).
    pub fn io_stat(&self, dev: &BlockDev) -> std::collections::BTreeMap<String, u64> {
        let text = fs::read_to_string(self.dir.join("io.stat"))
            .unwrap_or_else(|e| panic!("cannot read io.stat of {}: {e}", self.name));
        let mm = dev.maj_min();
        text.lines()
            .filter(|l| l.split_whitespace().next() == Some(mm.as_str()))
            .flat_map(|l| l.split_whitespace().skip(1))
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    fn io_stat_dirs(&self, dev: &BlockDev, r: &str, w: &str, d: &str) -> BlkioStat {
        let st = self.io_stat(dev);
        let g = |k: &str| st.get(k).copied().unwrap_or(0);
        BlkioStat {
            read: g(r),
            write: g(w),
            discard: g(d),
            total: g(r) + g(w) + g(d),
            ..Default::default()
        }
    }

    /// Bios per direction blk-cgroup counted for this cgroup on `dev`: v1
    /// `blkio.throttle.io_serviced`, v2 `io.stat` rios/wios/dios. See [`Cgroup`] for where
    /// each is counted (they agree once the I/O drained).
    pub fn io_serviced(&self, dev: &BlockDev) -> BlkioStat {
        match self.version() {
            CgroupVersion::V1 => self.read_stat("blkio.throttle.io_serviced", dev),
            CgroupVersion::V2 => self.io_stat_dirs(dev, "rios", "wios", "dios"),
        }
    }

    /// Bytes per direction: v1 `blkio.throttle.io_service_bytes`, v2 `io.stat`
    /// rbytes/wbytes/dbytes (a bio's bytes once, split or not).
    pub fn io_service_bytes(&self, dev: &BlockDev) -> BlkioStat {
        match self.version() {
            CgroupVersion::V1 => self.read_stat("blkio.throttle.io_service_bytes", dev),
            CgroupVersion::V2 => self.io_stat_dirs(dev, "rbytes", "wbytes", "dbytes"),
        }
    }
}

/// cgroup v2: a child of `parent` has io.max / io.stat only while `io` is in the parent's
/// `cgroup.subtree_control`; turn it on if it is not (the lab's /init does it for the root).
fn enable_io_controller(parent: &Path) {
    let control = parent.join("cgroup.subtree_control");
    let on = |p: &Path| {
        fs::read_to_string(p)
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "io")
    };
    if on(&control) {
        return;
    }
    let available = fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    assert!(
        available.split_whitespace().any(|c| c == "io"),
        "the io controller is not available in {} (cgroup.controllers: {available:?}); the \
         throttle tests need cgroup v2 io (or v1 blkio)",
        parent.display()
    );
    // Racing tests may enable it at the same time: only the end state matters.
    let _ = fs::write(&control, "+io");
    assert!(
        on(&control),
        "cannot enable the io controller in {}",
        control.display()
    );
}

fn remove_cgroup_dir(dir: &Path) -> std::io::Result<()> {
    let root_procs = cgroup_hierarchy().1.join("cgroup.procs");
    let mut last = Ok(());
    for _ in 0..50 {
        // Move anything still inside out first (a cgroup with tasks cannot be removed).
        if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().map(str::trim).filter(|p| !p.is_empty()) {
                let _ = fs::write(&root_procs, pid);
            }
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Err(e),
        }
        thread::sleep(Duration::from_millis(100));
    }
    last
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_cgroup_dir(&self.dir) {
            eprintln!(
                "warning: could not remove cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The tracer

/// `mergetrace --json` running as a child; started only once its probes are attached.
pub struct Tracer {
    child: Option<Child>,
    stdout: Option<thread::JoinHandle<String>>,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<thread::JoinHandle<()>>,
}

/// What a tracer printed over its run.
#[derive(Debug, Clone)]
pub struct TraceOutput {
    /// The final `"type": "total"` object.
    pub total: Value,
    /// Every `"type": "interval"` object, in order.
    pub intervals: Vec<Value>,
    pub stderr: String,
}

impl Tracer {
    /// Starts `mergetrace --json <args>` and returns once it printed "mergetrace: tracing"
    /// on stderr. Panics with its stderr if it exits first or does not attach in time.
    ///
    /// Adds `--tier $MERGETRACE_TEST_TIER` when that is set and `args` choose no tier.
    pub fn start<S: AsRef<str>>(args: &[S]) -> Tracer {
        Tracer::start_with_env(args, &[])
    }

    /// [`Tracer::start`] with extra environment variables for the tracer.
    pub fn start_with_env<S: AsRef<str>>(args: &[S], env: &[(&str, &str)]) -> Tracer {
        let bin = env!("CARGO_BIN_EXE_mergetrace");
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().copied());
        let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
        cmd.arg("--json").args(&args);
        if let Some(tier) = test_tier() {
            if !args
                .iter()
                .any(|a| *a == "--tier" || a.starts_with("--tier="))
            {
                cmd.args(["--tier", &tier]);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let mut out = child.stdout.take().unwrap();
        let stdout = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let stderr_thread = {
            let stderr = stderr.clone();
            thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    stderr.lock().unwrap().push_str(&line);
                    stderr.lock().unwrap().push('\n');
                    let _ = tx.send(line);
                }
            })
        };
        let mut tracer = Tracer {
            child: Some(child),
            stdout: Some(stdout),
            stderr,
            stderr_thread: Some(stderr_thread),
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let first = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(line) => break line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = tracer.try_wait() {
                        tracer.join_stderr();
                        panic!(
                            "mergetrace exited ({status}) before attaching; args {:?}; stderr:\n{}",
                            cmd.get_args().collect::<Vec<_>>(),
                            tracer.stderr()
                        );
                    }
                    if left.is_zero() {
                        panic!(
                            "mergetrace did not report its probes attached within {ATTACH_TIMEOUT:?}; stderr:\n{}",
                            tracer.stderr()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = tracer.child.as_mut().unwrap().wait().ok();
                    panic!(
                        "mergetrace closed stderr ({status:?}) before attaching; args {:?}; stderr:\n{}",
                        cmd.get_args().collect::<Vec<_>>(),
                        tracer.stderr()
                    );
                }
            }
        };
        if !first.starts_with("mergetrace: tracing") {
            // Most likely an error: give it a moment to exit so the report is complete.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut status = None;
            while status.is_none() && Instant::now() < deadline {
                status = tracer.try_wait();
                thread::sleep(Duration::from_millis(50));
            }
            if status.is_some() {
                tracer.join_stderr();
            }
            panic!(
                "mergetrace's first stderr line is not the attach banner: {first:?} \
                 (exit status: {status:?}); args {:?}; stderr:\n{}",
                cmd.get_args().collect::<Vec<_>>(),
                tracer.stderr()
            );
        }
        tracer
    }

    /// `mergetrace --json -d <device>`.
    pub fn on(dev: &BlockDev) -> Tracer {
        Tracer::start(&["-d", dev.name.as_str()])
    }

    /// `mergetrace --json -d <device> --tier <tier>`, whatever `MERGETRACE_TEST_TIER` says.
    pub fn on_tier(dev: &BlockDev, tier: &str) -> Tracer {
        Tracer::start(&["-d", dev.name.as_str(), "--tier", tier])
    }

    /// The attach banner ("mergetrace: tracing loop3 (7:3) on the fentry tier (...)").
    pub fn banner(&self) -> String {
        self.stderr()
            .lines()
            .find(|l| l.starts_with("mergetrace: tracing"))
            .unwrap_or_default()
            .to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Everything on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn join_stderr(&mut self) {
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child {
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGINT, wait, require exit code 0, and parse the NDJSON it printed.
    pub fn stop(mut self) -> TraceOutput {
        self.signal(libc::SIGINT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(s) = self.try_wait() {
                break s;
            }
            if Instant::now() >= deadline {
                self.signal(libc::SIGKILL);
                panic!(
                    "mergetrace did not exit within {STOP_TIMEOUT:?} of SIGINT; stderr:\n{}",
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(50));
        };
        self.child = None;
        self.join_stderr();
        let stdout = self.stdout.take().unwrap().join().unwrap_or_default();
        let stderr = self.stderr();
        assert!(
            status.success(),
            "mergetrace exited with {status} after SIGINT; stderr:\n{stderr}\nstdout:\n{stdout}"
        );
        parse_ndjson(&stdout, stderr)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Only reached without `stop()` when a test panicked: do not leave it running.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Splits mergetrace's NDJSON into interval objects and the final total.
pub fn parse_ndjson(stdout: &str, stderr: String) -> TraceOutput {
    let mut intervals = Vec::new();
    let mut total = None;
    for (i, line) in stdout
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line {} is not JSON ({e}): {line}", i + 1));
        assert!(total.is_none(), "a line follows the total object: {line}");
        match v["type"].as_str() {
            Some("interval") => intervals.push(v),
            Some("total") => total = Some(v),
            other => panic!("unexpected object type {other:?}: {line}"),
        }
    }
    let total = total.unwrap_or_else(|| {
        panic!("mergetrace printed no total object; stdout:\n{stdout}\nstderr:\n{stderr}")
    });
    TraceOutput {
        total,
        intervals,
        stderr,
    }
}

impl TraceOutput {
    /// The `devices[]` entry of `dev` in the total object.
    pub fn device(&self, dev: &BlockDev) -> &Value {
        device_in(&self.total, dev)
    }

    /// The device's `total` (sum of its cgroup rows), e.g. `t.device_total(&lo)["write"]`.
    pub fn device_total(&self, dev: &BlockDev) -> &Value {
        &self.device(dev)["total"]
    }

    /// The row of cgroup `path` (e.g. "/mt-test-1-2") on `dev`, if it had any activity.
    pub fn cgroup_row(&self, dev: &BlockDev, path: &str) -> Option<&Value> {
        self.device(dev)["cgroups"]
            .as_array()
            .expect("cgroups is an array")
            .iter()
            .find(|r| r["cgroup"] == path)
    }

    pub fn lost_events(&self) -> u64 {
        u(&self.total, "lost_events")
    }

    /// Sum of one numeric field of one direction over all interval objects for `dev`.
    pub fn interval_sum(&self, dev: &BlockDev, dir: &str, field: &str) -> u64 {
        self.intervals
            .iter()
            .map(|i| u(&device_in(i, dev)["total"][dir], field))
            .sum()
    }
}

fn device_in<'a>(snapshot: &'a Value, dev: &BlockDev) -> &'a Value {
    snapshot["devices"]
        .as_array()
        .expect("devices is an array")
        .iter()
        .find(|d| d["major"] == dev.major && d["minor"] == dev.minor)
        .unwrap_or_else(|| panic!("{} ({}) is not in {snapshot}", dev.name, dev.maj_min()))
}

/// A non-negative integer field; panics with the object when missing.
pub fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("field {field:?} missing or not an integer in {v}"))
}

// ---------------------------------------------------------------------------------------
// fio

/// A fio run, one job, JSON output. Build with the setters, then `run()` or `spawn()`.
#[derive(Debug, Clone)]
pub struct Fio {
    name: String,
    opts: Vec<(String, String)>,
    cgroup: Option<PathBuf>,
}

/// A fio started with [`Fio::spawn`].
pub struct FioRun {
    child: Option<Child>,
    describe: String,
}

impl Fio {
    /// A job named `name` against `filename` (a device or file).
    pub fn new(name: &str, filename: &Path) -> Fio {
        Fio {
            name: name.to_string(),
            opts: vec![("filename".into(), filename.display().to_string())],
            cgroup: None,
        }
    }

    /// A job named `name` whose files fio makes in `dir` (`--directory`: with `numjobs`, one
    /// file per job).
    pub fn in_directory(name: &str, dir: &Path) -> Fio {
        Fio {
            name: name.to_string(),
            opts: vec![("directory".into(), dir.display().to_string())],
            cgroup: None,
        }
    }

    /// The article's workload: 4 KiB sequential O_DIRECT libaio, iodepth 64, submit and
    /// complete batches of `batch` (both options: see docs/scenarios.md), `rw` = write/read.
    pub fn sequential(name: &str, dev: &BlockDev, rw: &str, size: u64, batch: u32) -> Fio {
        Fio::new(name, &dev.path)
            .opt("rw", rw)
            .opt("bs", "4k")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "64")
            .opt("size", &size.to_string())
            .batch(batch)
    }

    /// Sets `--key=value` (replacing an earlier value of the same key).
    pub fn opt(mut self, key: &str, value: &str) -> Fio {
        self.opts.retain(|(k, _)| k != key);
        self.opts.push((key.to_string(), value.to_string()));
        self
    }

    /// `--iodepth_batch_submit=N --iodepth_batch_complete_min=N`.
    pub fn batch(self, n: u32) -> Fio {
        self.opt("iodepth_batch_submit", &n.to_string())
            .opt("iodepth_batch_complete_min", &n.to_string())
    }

    pub fn offset(self, bytes: u64) -> Fio {
        self.opt("offset", &bytes.to_string())
    }

    pub fn size(self, bytes: u64) -> Fio {
        self.opt("size", &bytes.to_string())
    }

    /// Runs fio inside `cg` (its pid is written to cgroup.procs before exec).
    pub fn in_cgroup(mut self, cg: &Cgroup) -> Fio {
        self.cgroup = Some(cg.dir.clone());
        self
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--name={}", self.name),
            "--output-format=json".to_string(),
        ];
        a.extend(self.opts.iter().map(|(k, v)| format!("--{k}={v}")));
        a
    }

    pub fn spawn(&self) -> FioRun {
        let mut cmd = match &self.cgroup {
            None => {
                let mut c = Command::new("fio");
                c.args(self.args());
                c
            }
            Some(dir) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$0/cgroup.procs" && exec fio "$@""#)
                    .arg(dir)
                    .args(self.args());
                c
            }
        };
        // Its own process group, so a panicking test can kill fio and its job processes.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let describe = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fio ({describe}): {e}"));
        FioRun {
            child: Some(child),
            describe,
        }
    }

    /// Runs to completion and returns fio's JSON report.
    pub fn run(&self) -> Value {
        self.spawn().wait()
    }
}

impl FioRun {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Waits, requires success, returns the JSON report.
    pub fn wait(mut self) -> Value {
        let out = self
            .child
            .take()
            .expect("fio already waited for")
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for fio: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "fio failed ({}): {}\nstderr:\n{stderr}\nstdout:\n{stdout}",
            out.status,
            self.describe
        );
        // fio may print notes before the JSON document.
        let start = if stdout.starts_with('{') {
            Some(0)
        } else {
            stdout.find("\n{").map(|i| i + 1)
        }
        .unwrap_or_else(|| panic!("no JSON in fio's output: {stdout}\nstderr:\n{stderr}"));
        let v: Value = serde_json::from_str(&stdout[start..])
            .unwrap_or_else(|e| panic!("fio's JSON does not parse ({e}): {stdout}"));
        let errs = v["jobs"][0]["error"].as_u64().unwrap_or(0);
        assert_eq!(errs, 0, "fio job reported an error: {}", v["jobs"][0]);
        v
    }
}

impl FioRun {
    /// Kills fio (SIGKILL to its process group) and waits for it.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

impl Drop for FioRun {
    fn drop(&mut self) {
        // Only reached without `wait()` when a test panicked: stop fio and its jobs.
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `jobs[0].<dir>.total_ios` of a fio JSON report (dir = "read" / "write").
pub fn fio_total_ios(report: &Value, dir: &str) -> u64 {
    report["jobs"][0][dir]["total_ios"]
        .as_u64()
        .unwrap_or_else(|| panic!("no jobs[0].{dir}.total_ios in fio's report"))
}

/// `jobs[0].<dir>.io_bytes` of a fio JSON report.
pub fn fio_io_bytes(report: &Value, dir: &str) -> u64 {
    report["jobs"][0][dir]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no jobs[0].{dir}.io_bytes in fio's report"))
}

// ---------------------------------------------------------------------------------------
// Additions for kernel_throttle / kernel_merge_paths

/// Restores one queue attribute of a loop device to the value it had, on drop. Loop devices
/// are reused and keep their queue settings (max_sectors_kb, nomerges, scheduler) across
/// `losetup -d`, so a test that changes a limit the other tests do not set must put it back.
/// Declare it after the `LoopDevice` so it drops first.
#[derive(Debug)]
pub struct QueueAttrRestore {
    path: PathBuf,
    old: String,
}

impl BlockDev {
    /// Sets `queue/<attr>` to `value` and returns a guard that writes the old value back.
    pub fn set_queue_attr_restored(&self, attr: &str, value: &str) -> QueueAttrRestore {
        let path = self.queue(attr);
        let old = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .trim()
            .to_string();
        write_sysfs(&path, value);
        let now = fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            now.trim(),
            value,
            "{}: wrote {value}, reads {now}",
            path.display()
        );
        QueueAttrRestore { path, old }
    }

    /// The current value of `queue/<attr>`, trimmed.
    pub fn queue_attr(&self, attr: &str) -> String {
        fs::read_to_string(self.queue(attr))
            .unwrap_or_else(|e| panic!("cannot read queue/{attr} of {}: {e}", self.name))
            .trim()
            .to_string()
    }
}

impl Drop for QueueAttrRestore {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.path, &self.old) {
            eprintln!(
                "warning: could not restore {} to {}: {e}",
                self.path.display(),
                self.old
            );
        }
    }
}

impl Cgroup {
    /// A child cgroup inside this one (`<parent>/<unique name>`). Declare it after the
    /// parent so it is dropped (removed) first.
    pub fn child(&self) -> Cgroup {
        self.child_named(&unique_name())
    }

    /// A child cgroup named `leaf` (`docker-<id>.scope`); removed first like [`Cgroup::child`].
    pub fn child_named(&self, leaf: &str) -> Cgroup {
        if self.version() == CgroupVersion::V2 {
            enable_io_controller(&self.dir);
        }
        let dir = self.dir.join(leaf);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Cgroup {
            name: format!("{}/{leaf}", self.name),
            dir,
        }
    }
}

/// `blkio.throttle.io_serviced` and `io_service_bytes` of one cgroup and device, so a test
/// can take the delta over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottleStats {
    pub ios: BlkioStat,
    pub bytes: BlkioStat,
}

impl Cgroup {
    pub fn throttle_stats(&self, dev: &BlockDev) -> ThrottleStats {
        ThrottleStats {
            ios: self.io_serviced(dev),
            bytes: self.io_service_bytes(dev),
        }
    }
}

impl ThrottleStats {
    /// Write deltas `self - before`: (ios, bytes).
    pub fn write_since(&self, before: &ThrottleStats) -> (u64, u64) {
        (
            self.ios
                .write
                .checked_sub(before.ios.write)
                .expect("io_serviced went backwards"),
            self.bytes
                .write
                .checked_sub(before.bytes.write)
                .expect("io_service_bytes went backwards"),
        )
    }
}

/// Runs the built-in workload: `mergetrace __workload --target <dev> <args>`, optionally
/// inside `cg`, and returns what it printed ({"ios", "bytes", "submit_calls"}).
pub fn run_workload(dev: &BlockDev, cg: Option<&Cgroup>, args: &[&str]) -> Value {
    let bin = env!("CARGO_BIN_EXE_mergetrace");
    let mut cmd = Command::new(bin);
    cmd.arg("__workload")
        .arg("--target")
        .arg(&dev.path)
        .args(args);
    if let Some(cg) = cg {
        cmd.arg("--cgroup").arg(&cg.dir);
    }
    let out = run_ok(&mut cmd);
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("__workload printed no JSON ({e}): {out}"))
}

/// Runs the mergetrace binary with `args` to completion (stdin closed): what it did.
pub fn mergetrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mergetrace"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run mergetrace")
}

/// The run failed as bad input must: exit code 1 and exactly one stderr line, a
/// "mergetrace: error: " line containing `needle`, and no panic.
pub fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got: {stderr}");
    assert!(lines[0].starts_with("mergetrace: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "want {needle:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Runs a command to completion, requiring success; returns its stdout.
pub fn run_cmd(cmd: &mut Command) -> String {
    run_ok(cmd)
}

/// The sum of every `merged_by_path` field of a direction object.
pub const MERGE_PATHS: [&str; 7] = [
    "plug",
    "elevator_back",
    "elevator_front",
    "sw_queue",
    "discard",
    "request",
    "unknown",
];

/// `merged_by_path.<path>` of a direction object.
pub fn path_count(dir: &Value, path: &str) -> u64 {
    u(&dir["merged_by_path"], path)
}
