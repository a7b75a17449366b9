//! What the benchmark sets up and must take down again, whatever happens: the work directory
//! in /dev/shm, the loop device (and the queue settings it had), the limited workload's
//! cgroup, tracefs (when we mounted it), and every child process. Each is a guard whose `Drop` undoes it; Ctrl-C, SIGTERM and SIGHUP
//! only set a flag that the waits poll, so an interrupted run unwinds through the same drops
//! as a finished one.
use std::{
    fs::{self, File},
    io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::run_quiet;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// From now on SIGINT, SIGTERM and SIGHUP set a flag instead of killing us.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails with "interrupted" once a signal came.
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps, in short steps so that a signal is noticed.
pub fn nap(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        sleep((end - Instant::now()).min(Duration::from_millis(20)));
    }
    check_interrupt()
}

/// /dev/shm/mt-bench-PID: the backing file, captures, perf.data and the children's output.
pub struct WorkDir {
    pub path: PathBuf,
}

const WORK_PREFIX: &str = "mt-bench-";

impl WorkDir {
    pub fn create() -> Result<WorkDir> {
        let path = PathBuf::from(format!("/dev/shm/{WORK_PREFIX}{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A pid that no longer runs (our naming carries the pid that made the directory).
fn pid_gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Loop devices, cgroups and work directories left by a bench that was killed with SIGKILL:
/// only ours (backed by /dev/shm/mt-bench-PID/disk.img, named mt-bench-PID), and only when
/// that PID is gone.
pub fn remove_stale() {
    let Ok(list) = run_quiet(Command::new("losetup").args(["-n", "-O", "NAME,BACK-FILE", "-l"]))
    else {
        return;
    };
    for line in list.lines() {
        let mut it = line.split_whitespace();
        let (Some(dev), Some(back)) = (it.next(), it.next()) else {
            continue;
        };
        if let Some(pid) = stale_pid(back) {
            if pid_gone(pid) {
                eprintln!("bench: removing {dev} left by an earlier bench (pid {pid})");
                let _ = run_quiet(Command::new("losetup").args(["-d", dev]));
            }
        }
    }
    // The limited workload's cgroups (empty once their fio is gone).
    for root in [V1_BLKIO, CGROUP_ROOT] {
        for e in fs::read_dir(root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(WORK_PREFIX).and_then(|p| p.parse().ok()) {
                if pid_gone(pid) {
                    let _ = fs::remove_dir(e.path());
                }
            }
        }
    }
    if let Ok(entries) = fs::read_dir("/dev/shm") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(WORK_PREFIX).and_then(|p| p.parse().ok()) {
                if pid_gone(pid) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// The PID in /dev/shm/mt-bench-PID/disk.img (possibly "(deleted)"-suffixed by losetup).
fn stale_pid(back_file: &str) -> Option<u32> {
    back_file
        .strip_prefix(&format!("/dev/shm/{WORK_PREFIX}"))?
        .strip_suffix("/disk.img")?
        .parse()
        .ok()
}

/// A loop device on a sparse file; its queue settings put back and detached on drop.
pub struct LoopDev {
    /// /dev/loopN
    pub dev: String,
    /// loopN
    pub name: String,
    /// MAJ:MIN
    pub majmin: String,
    /// Queue settings as they were before [`LoopDev::prepare_queue`] (a reused loop device
    /// keeps an earlier user's), put back before it is detached.
    saved: Vec<(&'static str, String)>,
}

/// The queue settings [`LoopDev::prepare_queue`] changes.
const QUEUE_ATTRS: [&str; 3] = ["scheduler", "nomerges", "max_sectors_kb"];

impl LoopDev {
    pub fn create(file: &Path, size: u64) -> Result<LoopDev> {
        let f = File::create(file).with_context(|| format!("cannot create {}", file.display()))?;
        f.set_len(size)
            .with_context(|| format!("cannot size {}", file.display()))?;
        drop(f);
        let dev = run_quiet(Command::new("losetup").arg("-f").arg("--show").arg(file))
            .context("cannot create a loop device")?;
        let name = dev.trim_start_matches("/dev/").to_string();
        let mut l = LoopDev {
            dev,
            name,
            majmin: String::new(),
            saved: Vec::new(),
        };
        l.majmin = fs::read_to_string(format!("/sys/block/{}/dev", l.name))
            .with_context(|| format!("cannot read /sys/block/{}/dev", l.name))?
            .trim()
            .to_string();
        Ok(l)
    }

    /// The loop driver's own direct I/O to the backing file (no second page cache copy).
    pub fn set_direct_io(&self, on: bool) -> Result<()> {
        run_quiet(
            Command::new("losetup")
                .arg(format!("--direct-io={}", if on { "on" } else { "off" }))
                .arg(&self.dev),
        )?;
        Ok(())
    }

    fn queue_file(&self, attr: &str) -> String {
        format!("/sys/block/{}/queue/{attr}", self.name)
    }

    /// A queue attribute's value; for the scheduler, the active one ("[none] mq-deadline").
    pub fn queue(&self, attr: &str) -> Result<String> {
        let p = self.queue_file(attr);
        let v = fs::read_to_string(&p).with_context(|| format!("cannot read {p}"))?;
        let v = v.trim();
        Ok(match (v.find('['), v.find(']')) {
            (Some(a), Some(b)) if a < b => v[a + 1..b].to_string(),
            _ => v.to_string(),
        })
    }

    pub fn set_queue(&self, attr: &str, value: &str) -> Result<()> {
        let p = self.queue_file(attr);
        fs::write(&p, value).with_context(|| format!("cannot write {value} to {p}"))
    }

    /// Scheduler none, merging on, and requests as big as the device takes (max_sectors_kb
    /// = max_hw_sectors_kb, so that 32 bios of 4 KiB fit one request), whatever an earlier
    /// user of the loop device left. What it could not set comes back as warnings; the old
    /// values are put back on drop.
    pub fn prepare_queue(&mut self) -> Vec<String> {
        let mut warnings = Vec::new();
        for attr in QUEUE_ATTRS {
            match self.queue(attr) {
                Ok(v) => self.saved.push((attr, v)),
                Err(e) => warnings.push(format!("{e:#}")),
            }
        }
        let max_hw = self.queue("max_hw_sectors_kb");
        for (attr, value) in [
            ("max_sectors_kb", max_hw.map_err(|e| format!("{e:#}"))),
            ("nomerges", Ok("0".to_string())),
            ("scheduler", Ok("none".to_string())),
        ] {
            match value {
                Ok(v) => {
                    if let Err(e) = self.set_queue(attr, &v) {
                        warnings.push(format!("{e:#}"));
                    }
                }
                Err(e) => warnings.push(e),
            }
        }
        warnings
    }

    /// The device's read and write counters (/sys/block/NAME/stat).
    pub fn stat(&self) -> Option<super::fio::DiskStat> {
        super::fio::parse_disk_stat(
            &fs::read_to_string(format!("/sys/block/{}/stat", self.name)).ok()?,
        )
    }

    /// The kernel's dev_t as block tracepoints print it: major << 20 | minor.
    pub fn dev_t(&self) -> u64 {
        let mut it = self
            .majmin
            .split(':')
            .map(|n| n.parse::<u64>().unwrap_or(0));
        let (ma, mi) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        ma << 20 | mi
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        // max_sectors_kb before the scheduler, in the reverse of the order they were read.
        for (attr, value) in self.saved.iter().rev() {
            if let Err(e) = self.set_queue(attr, value) {
                eprintln!("bench: warning: {e:#}");
            }
        }
        if let Err(e) = run_quiet(Command::new("losetup").args(["-d", &self.dev])) {
            eprintln!("bench: warning: {e:#}");
        }
    }
}

/// The limited workload's cgroup: fio runs in it, and while [`LimitCgroup::set`] is on, it has
/// a blk-throttle read limit on the bench's device far above what the device does (it never
/// binds). On cgroup v1 in the blkio hierarchy (`blkio.throttle.read_iops_device`), on v2 with
/// `io.max` (the io controller enabled for the root's children when it was not, and disabled
/// again on drop). Removed on drop.
pub struct LimitCgroup {
    pub dir: PathBuf,
    majmin: String,
    v1: bool,
    /// We enabled the io controller in the v2 root's `cgroup.subtree_control`.
    enabled_io: bool,
}

/// Read I/Os per second the limit allows: no loop device comes near.
pub const NEVER_BINDING_IOPS: u64 = 1_000_000_000;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const V1_BLKIO: &str = "/sys/fs/cgroup/blkio";

impl LimitCgroup {
    pub fn create(majmin: &str) -> Result<LimitCgroup> {
        let name = format!("{WORK_PREFIX}{}", std::process::id());
        let v1 = Path::new(V1_BLKIO)
            .join("blkio.throttle.read_iops_device")
            .exists();
        let mut enabled_io = false;
        let dir = if v1 {
            Path::new(V1_BLKIO).join(&name)
        } else {
            let root = Path::new(CGROUP_ROOT);
            let controllers = fs::read_to_string(root.join("cgroup.controllers"))
                .context("neither cgroup v1's blkio nor cgroup v2 is mounted at /sys/fs/cgroup")?;
            if !controllers.split_whitespace().any(|c| c == "io") {
                bail!("cgroup v2 has no io controller here (cgroup.controllers: {controllers:?})");
            }
            let control = root.join("cgroup.subtree_control");
            let on = fs::read_to_string(&control).unwrap_or_default();
            if !on.split_whitespace().any(|c| c == "io") {
                fs::write(&control, "+io").with_context(|| {
                    format!("cannot enable the io controller in {}", control.display())
                })?;
                enabled_io = true;
            }
            root.join(&name)
        };
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(LimitCgroup {
            dir,
            majmin: majmin.to_string(),
            v1,
            enabled_io,
        })
    }

    /// Puts the limit on (before the limited workload's arms: a tracer sees it from its start)
    /// or takes it off (so that the other workloads run without one).
    pub fn set(&self, on: bool) -> Result<()> {
        let (file, value) = match (self.v1, on) {
            (true, true) => (
                "blkio.throttle.read_iops_device",
                NEVER_BINDING_IOPS.to_string(),
            ),
            (true, false) => ("blkio.throttle.read_iops_device", "0".to_string()),
            (false, true) => ("io.max", format!("riops={NEVER_BINDING_IOPS}")),
            (false, false) => ("io.max", "riops=max".to_string()),
        };
        let path = self.dir.join(file);
        let line = format!("{} {value}", self.majmin);
        fs::write(&path, &line)
            .with_context(|| format!("cannot write {line:?} to {}", path.display()))
    }
}

impl Drop for LimitCgroup {
    fn drop(&mut self) {
        let _ = self.set(false);
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("bench: warning: cannot remove {}: {e}", self.dir.display());
        }
        if self.enabled_io {
            let _ = fs::write(Path::new(CGROUP_ROOT).join("cgroup.subtree_control"), "-io");
        }
    }
}

/// tracefs at /sys/kernel/tracing, which bpftrace and perf need for the block tracepoints;
/// mounted only if it was not, and then unmounted on drop.
pub struct Tracefs {
    mounted_by_us: bool,
}

pub const TRACEFS: &str = "/sys/kernel/tracing";

impl Tracefs {
    pub fn ensure() -> Result<Tracefs> {
        if Path::new(TRACEFS).join("events/block").is_dir() {
            return Ok(Tracefs {
                mounted_by_us: false,
            });
        }
        run_quiet(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
            .context("tracefs is not mounted and mounting it failed")?;
        if !Path::new(TRACEFS).join("events/block").is_dir() {
            bail!("tracefs has no block events at {TRACEFS}/events/block");
        }
        Ok(Tracefs {
            mounted_by_us: true,
        })
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.mounted_by_us {
            let _ = run_quiet(Command::new("umount").arg(TRACEFS));
        }
    }
}

/// A child process with its stdout and stderr in files, in its own process group (so a
/// terminal's Ctrl-C reaches only us; we stop it), dying with us if we are killed. Killed on
/// drop if it still runs.
pub struct Proc {
    pub what: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

/// How waiting for a child to become ready ended.
pub enum Ready {
    Yes,
    /// It exited first: why, from its stderr.
    Exited(String),
    TimedOut,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// It had to be killed with SIGKILL.
    pub killed: bool,
}

impl Proc {
    pub fn spawn(what: &str, mut cmd: Command, dir: &Path, tag: &str) -> Result<Proc> {
        let out = dir.join(format!("{tag}.out"));
        let err = dir.join(format!("{tag}.err"));
        cmd.stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(File::create(&err)?)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {what} ({:?})", cmd.get_program()))?;
        Ok(Proc {
            what: what.to_string(),
            child,
            out,
            err,
            status: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&self) -> String {
        fs::read(&self.out)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read(&self.err)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits until `ready` says so, the child exits, or `timeout`; fails only on a signal.
    pub fn wait_ready(
        &mut self,
        timeout: Duration,
        mut ready: impl FnMut(&Proc) -> bool,
    ) -> Result<Ready> {
        let end = Instant::now() + timeout;
        loop {
            check_interrupt()?;
            if ready(self) {
                return Ok(Ready::Yes);
            }
            if let Some(st) = self.poll() {
                return Ok(Ready::Exited(format!(
                    "{} ({st}, before it was ready)",
                    last_line(&self.stderr()).unwrap_or("no message")
                )));
            }
            if Instant::now() >= end {
                return Ok(Ready::TimedOut);
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the child to exit by itself; fails on a signal or after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Finished> {
        let end = Instant::now() + timeout;
        loop {
            check_interrupt()?;
            if let Some(status) = self.poll() {
                return Ok(self.finished(status, false));
            }
            if Instant::now() >= end {
                bail!(
                    "{} did not finish within {} s",
                    self.what,
                    timeout.as_secs()
                );
            }
            sleep(Duration::from_millis(10));
        }
    }

    /// SIGINT, then up to `grace` to exit cleanly, then SIGKILL. Runs to the end even after
    /// a signal came (it is how we clean up).
    pub fn stop(&mut self, grace: Duration) -> Finished {
        if self.poll().is_none() {
            signal_pid(self.pid(), libc::SIGINT);
        }
        let end = Instant::now() + grace;
        while self.poll().is_none() && Instant::now() < end {
            sleep(Duration::from_millis(10));
        }
        let mut killed = false;
        if self.poll().is_none() {
            signal_pid(self.pid(), libc::SIGKILL);
            killed = true;
            self.status = self.child.wait().ok();
        }
        let status = self.status.unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            ExitStatus::from_raw(libc::SIGKILL)
        });
        self.finished(status, killed)
    }

    fn finished(&self, status: ExitStatus, killed: bool) -> Finished {
        Finished {
            status,
            stdout: self.stdout(),
            stderr: self.stderr(),
            killed,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            signal_pid(self.pid(), libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Sends a signal to a child we started and to its process group, which it leads (fio's
/// job processes are in it).
fn signal_pid(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions; -pid is the group the child
        // leads (spawned with process_group(0)).
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

/// The last non-empty line of some output, trimmed.
pub fn last_line(s: &str) -> Option<&str> {
    s.lines().map(str::trim).rfind(|l| !l.is_empty())
}

/// How many perf event file descriptors a process holds (perf record's readiness).
pub fn perf_event_fds(pid: u32) -> usize {
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            fs::read_link(e.path())
                .map(|l| l.to_string_lossy() == "anon_inode:[perf_event]")
                .unwrap_or(false)
        })
        .count()
}

/// A process's CPU time so far, user and system, all its threads (/proc/PID/stat), ns.
pub fn process_cpu_ns(pid: u32) -> Option<f64> {
    let ticks = parse_process_cpu(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    Some(ticks as f64 * super::fio::jiffy_ns())
}

/// utime + stime of a /proc/PID/stat line, in clock ticks: fields 14 and 15, counted after
/// the command name's closing parenthesis (the name may hold spaces and parentheses).
fn parse_process_cpu(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_cpu_time_is_its_utime_and_stime() {
        let line = "4242 (mergetrace (x) y) S 1 4242 4242 0 -1 4194560 812 0 0 0 \
                    137 58 0 0 20 0 3 0 123456 0 0";
        assert_eq!(parse_process_cpu(line), Some(137 + 58));
        assert_eq!(parse_process_cpu("4242 (short) S 1 2"), None);
        assert_eq!(parse_process_cpu("no parenthesis"), None);
    }

    #[test]
    fn stale_pids_only_from_our_files() {
        assert_eq!(stale_pid("/dev/shm/mt-bench-123/disk.img"), Some(123));
        assert_eq!(stale_pid("/dev/shm/mt-test-1-2.img"), None);
        assert_eq!(stale_pid("/dev/shm/mt-bench-x/disk.img"), None);
        assert_eq!(stale_pid("/tmp/mt-bench-123/disk.img"), None);
    }

    #[test]
    fn last_lines() {
        assert_eq!(last_line("a\nb\n\n  \n"), Some("b"));
        assert_eq!(last_line(""), None);
    }
}
