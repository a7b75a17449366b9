//! Real programs' I/O on a test disk, for the conformance suite (kernel_conformance): a
//! scratch ext4, fsync / fdatasync / O_DSYNC writers, many small files, fstrim, write zeroes,
//! umount, SQLite, a PostgreSQL server started here, and a copy of a directory tree; and for
//! requeues, splits and a multi-queue device: fio at iodepth 32 (raw, and two jobs on two CPUs
//! on ext4), an SQLite bulk insert, 64 KiB O_DIRECT writes, an O_DIRECT pwritev of scattered
//! buffers (python3), blkdiscard of one range. Unlike fio
//! O_DIRECT on a raw device, these send cache flushes (empty `REQ_PREFLUSH` bios and journal
//! commit blocks with `PREFLUSH|FUA`), discards and write-zeroes, and their writeback and
//! journal I/O is submitted by kernel threads outside the workload's cgroup.
//!
//! Each [`Kind`] is prepared before the measured window ([`Kind::prepare`]: mkfs, mount, a file
//! to overwrite, initdb and a running server — mkfs alone writes a lot) and run inside it
//! ([`Prepared::run`]), which for the filesystem workloads ends with the filesystem unmounted:
//! umount writes back everything dirty, commits the journal and checkpoints it, so all of a
//! workload's I/O is inside the window and nothing is left for a timer to write later (the
//! flusher's 30 s expiry, jbd2's 5 s commit interval). Preparation ends with `sync -f` and
//! [`quiesce`], so no I/O is in flight when the window opens either; mkfs runs with
//! `lazy_itable_init=0,lazy_journal_init=0` and the mount with `no_prefetch_block_bitmaps`,
//! so the mount gives the `ext4lazyinit` thread nothing to do in the background (no inode
//! tables to zero, no block bitmaps to prefetch: see [`Ext4::new`]).
//!
//! Every process started here runs in its own process group, optionally in a [`Cgroup`] (its
//! pid written to `cgroup.procs` in `pre_exec`, before it does any I/O) and optionally as
//! another user (postgres refuses root: `nobody`); [`Running`]'s drop kills it by pid and
//! process group, [`Postgres`]'s drop the server and its backends (which start sessions of
//! their own), [`Ext4`]'s drop unmounts. Missing tools are a failure, never a skip.
#![allow(dead_code)]

use std::{
    ffi::CString,
    fmt, fs,
    io::Read,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{in_lab, scaled, unique_name, BlockDev, Cgroup, DiskStats, Fio};

/// A bound against hangs for one program of a workload (the lab's emulated guests are ~10x
/// slower than the host), not an assertion on speed.
pub const PROGRAM_TIMEOUT: Duration = Duration::from_secs(600);

/// Size of the scratch filesystem (the lab's /dev/vdb is 1 GiB).
pub const FS_SIZE: u64 = 512 << 20;

// ---------------------------------------------------------------------------------------
// Tools

/// The path of `tool` (PATH, then /usr/sbin and /sbin); panics when it is missing: the
/// conformance suite fails, never skips (`scripts/setup --test` installs them).
pub fn require_tool(tool: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("`{tool}` is required by the conformance workloads and was not found (scripts/setup --test installs it)")
    })
}

/// The directory with PostgreSQL's server binaries (`initdb`, `postgres`, `pg_ctl`,
/// `pgbench`, `psql`, `pg_isready`): Debian's /usr/lib/postgresql/N/bin (the newest N), or
/// where `postgres` on PATH points. Panics when there is none.
pub fn postgres_bindir() -> PathBuf {
    let need = [
        "initdb",
        "postgres",
        "pg_ctl",
        "pgbench",
        "psql",
        "pg_isready",
    ];
    let complete = |d: &Path| need.iter().all(|b| d.join(b).is_file());
    let mut dirs: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .map(|r| r.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(d) = dirs.into_iter().rev().find(|d| complete(d)) {
        return d;
    }
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(d).join("postgres");
        if let Some(dir) = fs::canonicalize(&p)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if complete(&dir) {
                return dir;
            }
        }
    }
    panic!(
        "PostgreSQL's server binaries ({}) were not found in /usr/lib/postgresql/*/bin or next to \
         `postgres` on PATH (scripts/setup --test installs postgresql)",
        need.join(", ")
    )
}

// ---------------------------------------------------------------------------------------
// Processes

/// A user to run a program as (postgres refuses to run as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// `nobody` (65534:65534), present on every Debian system and in the lab's guests (they see
/// the host's /etc/passwd).
pub const NOBODY: User = User {
    uid: 65534,
    gid: 65534,
};

/// Makes `cmd` start in its own process group, inside `cg` (its pid written to
/// `cgroup.procs` by the child itself, before exec, so its first I/O is already the cgroup's)
/// and as `user` (after joining the cgroup: the cgroup files are root's).
pub fn confine(cmd: &mut Command, cg: Option<&Cgroup>, user: Option<User>) {
    let procs = cg.map(|c| CString::new(c.procs_file().as_os_str().as_bytes()).unwrap());
    cmd.process_group(0);
    // SAFETY: only async-signal-safe calls (open, write, close, setgroups, setgid, setuid)
    // on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself (cgroup v1 and v2).
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            if let Some(u) = user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(u.gid) != 0
                    || libc::setuid(u.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A program a driver started. Dropping it before [`Running::wait`] kills it: SIGKILL to
/// its process group and to its pid.
pub struct Running {
    child: Option<Child>,
    what: String,
    stdout: Option<thread::JoinHandle<String>>,
    stderr: Option<thread::JoinHandle<String>>,
}

/// What a finished program printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Running {
    /// Starts `cmd` (stdin from /dev/null unless set, stdout and stderr captured) confined as
    /// [`confine`] says.
    pub fn start(mut cmd: Command, cg: Option<&Cgroup>, user: Option<User>) -> Running {
        confine(&mut cmd, cg, user);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let what = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let reader = |s: Option<Box<dyn Read + Send>>| {
            s.map(|mut s| {
                thread::spawn(move || {
                    let mut v = Vec::new();
                    let _ = s.read_to_end(&mut v);
                    String::from_utf8_lossy(&v).into_owned()
                })
            })
        };
        let stdout = reader(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let stderr = reader(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        Running {
            child: Some(child),
            what,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Waits up to `timeout` (then kills it and panics).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            let c = self.child.as_mut().expect("waited for twice");
            if let Some(s) = c.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("{} did not finish within {timeout:?}", self.what);
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.child = None;
        let join = |h: Option<thread::JoinHandle<String>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Output {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }

    /// Waits, requires exit status 0, returns stdout.
    pub fn wait_ok(self) -> String {
        let what = self.what.clone();
        let out = self.wait(PROGRAM_TIMEOUT);
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}{}",
            out.status,
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` to completion (confined), requiring success; returns its stdout.
pub fn run(cmd: Command, cg: Option<&Cgroup>, user: Option<User>) -> String {
    Running::start(cmd, cg, user).wait_ok()
}

/// `Command::new(program).args(args)`, with a C locale (no locale warnings from postgres).
pub fn cmd<S: AsRef<std::ffi::OsStr>>(program: impl AsRef<std::ffi::OsStr>, args: &[S]) -> Command {
    let mut c = Command::new(program);
    c.args(args).env("LC_ALL", "C").stdin(Stdio::null());
    c
}

/// A shell command line.
pub fn sh(script: &str) -> Command {
    cmd("sh", &["-c", script])
}

// ---------------------------------------------------------------------------------------
// Quiescence

/// Waits until nothing is in flight on `dev` and its /proc/diskstats line has not changed
/// for 300 ms (at most 30 s, then panics): the window may open (or close) with no request
/// issued on one side of it and completed on the other.
pub fn quiesce(dev: &BlockDev) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = dev.diskstats();
    let mut since = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(50));
        let now = dev.diskstats();
        if now != last {
            last = now;
            since = Instant::now();
        } else if now.in_flight == 0 && since.elapsed() >= Duration::from_millis(300) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not go quiet within 30 s: {now:?}",
            dev.name
        );
    }
}

// ---------------------------------------------------------------------------------------
// A scratch ext4

/// Optional ext4 features a newer mkfs.ext4 may turn on that this kernel's ext4 cannot mount
/// (the guests run the host's e2fsprogs, 1.47, against kernels back to 5.10): those of
/// `/sys/fs/ext4/features/` it does not list (metadata_csum_seed, fast_commit), and
/// orphan_file, which ext4 does not list there at all, before 5.15 (where it came). Empty on
/// the host and the 6.x guests, so their mkfs is the default one.
pub fn ext4_features_to_turn_off() -> Vec<&'static str> {
    let listed = |f: &str| Path::new("/sys/fs/ext4/features").join(f).exists();
    assert!(
        Path::new("/sys/fs/ext4/features").is_dir(),
        "/sys/fs/ext4/features is missing: this kernel has no ext4"
    );
    let mut off: Vec<&'static str> = ["metadata_csum_seed", "fast_commit"]
        .into_iter()
        .filter(|f| !listed(f))
        .collect();
    if super::kernel_version() < (5, 15) {
        off.push("orphan_file");
    }
    off
}

/// A fresh ext4 on a test disk, mounted on a fresh directory. Unmounted (and the directory
/// removed) on drop if [`Ext4::unmount`] did not do it.
#[derive(Debug)]
pub struct Ext4 {
    dev: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Ext4 {
    /// `mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0` over the first
    /// `min(dev.size, FS_SIZE)` bytes of `dev` (inode tables and journal zeroed now, so no
    /// `ext4lazyinit` thread writes later), mounted on a fresh directory with the defaults
    /// but `no_prefetch_block_bitmaps` (below), then synced. Call before the measured window.
    pub fn new(dev: &BlockDev) -> Ext4 {
        let mkfs = require_tool("mkfs.ext4");
        let kib = dev.size.min(FS_SIZE) / 1024;
        let mut c = cmd(
            &mkfs,
            &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
        );
        let off = ext4_features_to_turn_off();
        if !off.is_empty() {
            let o: Vec<String> = off.iter().map(|f| format!("^{f}")).collect();
            c.arg("-O").arg(o.join(","));
        }
        c.arg(&dev.path).arg(format!("{kib}k"));
        run(c, None, None);
        let mnt = std::env::temp_dir().join(format!("{}.mnt", unique_name()));
        fs::create_dir(&mnt).unwrap_or_else(|e| panic!("cannot create {}: {e}", mnt.display()));
        let mut fs_ = Ext4 {
            dev: dev.path.clone(),
            mnt,
            mounted: false,
        };
        // no_prefetch_block_bitmaps: otherwise every mount registers an ext4lazyinit request
        // that reads the block bitmaps in the background, starting at a random moment within
        // EXT4_DEF_LI_MAX_START_DELAY (5 s) of the mount (fs/ext4/super.c,
        // ext4_register_li_request / ext4_li_request_new, 6.1 and 6.12 alike) — reads that
        // can straddle the window's start (seen in 6.12: 3 read bios before blktrace and the
        // diskstats snapshot, after mergetrace attached). With the inode tables zeroed by mkfs
        // and this option no request is registered at all.
        //
        // Kernels before the prefetch became the default (Debian 11's 5.10) do not know the
        // option ("Unrecognized mount option") and prefetch only when asked
        // (`prefetch_block_bitmaps`): there the mount without it is the same.
        let mut m = cmd("mount", &["-t", "ext4", "-o", "no_prefetch_block_bitmaps"]);
        m.arg(&fs_.dev).arg(&fs_.mnt);
        let out = Running::start(m, None, None).wait(PROGRAM_TIMEOUT);
        if !out.status.success() {
            let mut m = cmd("mount", &["-t", "ext4"]);
            m.arg(&fs_.dev).arg(&fs_.mnt);
            run(m, None, None);
            let opts = fs::read_to_string(format!(
                "/proc/fs/ext4/{}/options",
                fs_.dev.file_name().unwrap_or_default().to_string_lossy()
            ))
            .unwrap_or_default();
            fs_.mounted = true;
            assert!(
                !opts.lines().any(|o| o.trim() == "prefetch_block_bitmaps"),
                "ext4 refused no_prefetch_block_bitmaps ({}) and prefetches block bitmaps without it",
                out.stderr.trim()
            );
        }
        fs_.mounted = true;
        fs::set_permissions(&fs_.mnt, fs::Permissions::from_mode(0o755)).expect("chmod mnt");
        fs_.sync();
        fs_
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// A directory on the filesystem (created), owned by `owner` if given.
    pub fn dir(&self, name: &str, owner: Option<User>) -> PathBuf {
        let d = self.mnt.join(name);
        fs::create_dir_all(&d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        if let Some(u) = owner {
            chown(&d, u);
        }
        d
    }

    /// `sync -f` on the filesystem (syncfs: writeback, journal commit, cache flush). Not a
    /// measured workload: preparation ends with it.
    pub fn sync(&self) {
        let mut c = cmd("sync", &["-f"]);
        c.arg(&self.mnt);
        run(c, None, None);
    }

    /// Unmounts (a measured workload: umount writes back what is dirty, commits and
    /// checkpoints the journal, flushes). `umount` runs inside `cg`.
    pub fn unmount(&mut self, cg: Option<&Cgroup>) -> Did {
        let mut c = cmd("umount", &[] as &[&str]);
        c.arg(&self.mnt);
        run(c, cg, None);
        self.mounted = false;
        let _ = fs::remove_dir(&self.mnt);
        Did {
            unmounts: 1,
            ..Did::default()
        }
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            for _ in 0..50 {
                let ok = Command::new("umount")
                    .arg(&self.mnt)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    self.mounted = false;
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            if self.mounted {
                eprintln!(
                    "warning: {} still mounted; detaching it lazily",
                    self.mnt.display()
                );
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        // Not remove_dir_all: never delete through a mount that is still there.
        let _ = fs::remove_dir(&self.mnt);
    }
}

fn chown(path: &Path, u: User) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let r = unsafe { libc::chown(c.as_ptr(), u.uid, u.gid) };
    assert_eq!(
        r,
        0,
        "chown {} {}:{}: {}",
        path.display(),
        u.uid,
        u.gid,
        std::io::Error::last_os_error()
    );
}

/// A temporary directory outside the measured disk (scripts, sockets, logs), readable by
/// everyone.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(&format!("{}.", unique_name()))
        .tempdir()
        .expect("cannot create a scratch directory");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).expect("chmod scratch");
    d
}

// ---------------------------------------------------------------------------------------
// What a workload did

/// What a workload did, as the programs report it (fio's JSON, fstrim's output, the
/// driver's own counts). Zero where it does not apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Did {
    /// write(2) calls (fio's I/Os, dd's blocks).
    pub writes: u64,
    pub bytes_written: u64,
    /// fsync(2) / fdatasync(2) calls, or O_DSYNC writes.
    pub syncs: u64,
    pub files: u64,
    /// Database transactions committed.
    pub transactions: u64,
    /// Bytes fstrim reports trimmed.
    pub trimmed: u64,
    /// Bytes zeroed with write zeroes.
    pub zeroed: u64,
    pub unmounts: u64,
    /// Bytes discarded by blkdiscard.
    pub discarded: u64,
}

impl std::ops::Add for Did {
    type Output = Did;
    fn add(self, o: Did) -> Did {
        Did {
            writes: self.writes + o.writes,
            bytes_written: self.bytes_written + o.bytes_written,
            syncs: self.syncs + o.syncs,
            files: self.files + o.files,
            transactions: self.transactions + o.transactions,
            trimmed: self.trimmed + o.trimmed,
            zeroed: self.zeroed + o.zeroed,
            unmounts: self.unmounts + o.unmounts,
            discarded: self.discarded + o.discarded,
        }
    }
}

impl fmt::Display for Did {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut parts = Vec::new();
        for (n, v) in [
            ("writes", self.writes),
            ("bytes", self.bytes_written),
            ("syncs", self.syncs),
            ("files", self.files),
            ("transactions", self.transactions),
            ("trimmed", self.trimmed),
            ("zeroed", self.zeroed),
            ("unmounts", self.unmounts),
            ("discarded", self.discarded),
        ] {
            if v > 0 {
                parts.push(format!("{n} {v}"));
            }
        }
        write!(f, "{}", parts.join(", "))
    }
}

// ---------------------------------------------------------------------------------------
// The drivers

/// `dd` of `bytes` (1 MiB blocks, buffered) into a new file, then `sync -f` of the
/// filesystem ([`sync_fs_only`]): the page cache is written back by the flusher (on cgroup v1
/// in the root cgroup; v2 charges the cgroup that dirtied it), the journal committed by jbd2
/// (root).
pub fn buffered_then_sync(fs: &Ext4, cg: Option<&Cgroup>, bytes: u64) -> Did {
    let did = dd(fs, cg, "buffered", bytes);
    sync_fs_only(fs, cg);
    did
}

/// `sync -f` of the workload's filesystem (syncfs: writeback, journal commit, cache flush),
/// inside `cg`. Not a global `sync`: that syncs every filesystem, so on the host, where the
/// tests of a binary run in parallel on loop devices of their own, it sends a cache flush to
/// the other tests' disks at any moment of their windows — seen as one flush-only write and
/// one flush request on a postgres test's loop device while its tracer attached.
pub fn sync_fs_only(fs: &Ext4, cg: Option<&Cgroup>) {
    let mut c = cmd("sync", &["-f"]);
    c.arg(fs.path());
    run(c, cg, None);
}

/// `dd` of `bytes` (1 MiB blocks, buffered) into a new file, nothing synced.
pub fn dd(fs: &Ext4, cg: Option<&Cgroup>, name: &str, bytes: u64) -> Did {
    let blocks = bytes.div_ceil(1 << 20);
    let mut c = cmd("dd", &["if=/dev/zero", "bs=1M", "status=none"]);
    c.arg(format!("of={}", fs.path().join(name).display()))
        .arg(format!("count={blocks}"));
    run(c, cg, None);
    Did {
        writes: blocks,
        bytes_written: blocks << 20,
        files: 1,
        ..Did::default()
    }
}

/// fio, one job, psync: `n` writes of 4 KiB to `file`, with `opts` (fsync=1, sync=dsync...).
fn fio_writes(file: &Path, cg: Option<&Cgroup>, n: u64, opts: &[(&str, &str)]) -> Value {
    let mut f = Fio::new("conformance", file)
        .opt("rw", "write")
        .opt("bs", "4k")
        .opt("ioengine", "psync")
        .opt("size", &(n * 4096).to_string())
        .opt("fallocate", "none");
    for (k, v) in opts {
        f = f.opt(k, v);
    }
    if let Some(cg) = cg {
        f = f.in_cgroup(cg);
    }
    f.run()
}

fn fio_did(report: &Value) -> Did {
    let job = &report["jobs"][0];
    Did {
        writes: job["write"]["total_ios"].as_u64().unwrap_or(0),
        bytes_written: job["write"]["io_bytes"].as_u64().unwrap_or(0),
        // fio counts fsync calls in sync.total_ios, but fdatasync calls only as samples of
        // their latency (sync.lat_ns.N; total_ios stays 0): the larger of the two.
        syncs: job["sync"]["total_ios"]
            .as_u64()
            .unwrap_or(0)
            .max(job["sync"]["lat_ns"]["N"].as_u64().unwrap_or(0)),
        files: 1,
        ..Did::default()
    }
}

/// `n` appending 4 KiB writes, each followed by fsync (fio `fsync=1`): every fsync commits
/// the journal (i_size changed), whose commit block is a `PREFLUSH|FUA` write — on a disk
/// without FUA a pre-flush, the block, and a post-flush.
pub fn fsync_per_write(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    fio_did(&fio_writes(
        &fs.path().join("fsync"),
        cg,
        n,
        &[("fsync", "1")],
    ))
}

/// Lays out the file [`fdatasync_per_write`] overwrites (`n` × 4 KiB, synced). Preparation.
pub fn prepare_overwrite(fs: &Ext4, n: u64) {
    fio_writes(
        &fs.path().join("overwrite"),
        None,
        n,
        &[("bs", "64k"), ("end_fsync", "1")],
    );
    fs.sync();
}

/// `n` 4 KiB overwrites of the file [`prepare_overwrite`] laid out, each followed by
/// fdatasync (fio `fdatasync=1`, `overwrite=1`): nothing a datasync must commit changes (only
/// timestamps), so ext4 sends an empty `REQ_PREFLUSH` bio per call (`blkdev_issue_flush`):
/// the flush-only writes /proc/diskstats counts as writes.
pub fn fdatasync_per_write(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    fio_did(&fio_writes(
        &fs.path().join("overwrite"),
        cg,
        n,
        &[("fdatasync", "1"), ("overwrite", "1")],
    ))
}

/// `n` appending 4 KiB writes through O_DSYNC (fio `sync=dsync`): each write is a datasync
/// of its range, a journal commit (i_size).
pub fn o_dsync_writes(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    let mut did = fio_did(&fio_writes(
        &fs.path().join("dsync"),
        cg,
        n,
        &[("sync", "dsync")],
    ));
    did.syncs = did.writes;
    did
}

/// `n` files of 512 bytes created by a shell loop in one directory, then `sync -f` (syncfs):
/// many inodes and directory blocks in few journal commits.
pub fn small_files(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    let d = fs.dir("small", None);
    let script = format!(
        "cd '{}' && i=0 && while [ $i -lt {n} ]; do i=$((i+1)); printf '%0512d' $i > f$i; done && sync -f .",
        d.display()
    );
    run(sh(&script), cg, None);
    Did {
        writes: n,
        bytes_written: n * 512,
        syncs: 1,
        files: n,
        ..Did::default()
    }
}

/// Panics unless `dev` takes discards (`queue/discard_max_bytes` > 0).
pub fn require_discard(dev: &BlockDev) {
    let max = dev.queue_attr("discard_max_bytes");
    assert!(
        max.parse::<u64>().unwrap_or(0) > 0,
        "{} does not take discards (queue/discard_max_bytes = {max}); the fstrim workload needs them",
        dev.name
    );
}

/// Preparation for [`fstrim`]: 16 MiB written, synced and deleted, so there is freshly
/// freed space besides the never-used rest (a fresh mount trims every free extent).
pub fn prepare_fstrim(fs: &Ext4, dev: &BlockDev) {
    require_discard(dev);
    require_tool("fstrim");
    dd(fs, None, "to-delete", 16 << 20);
    fs.sync();
    fs::remove_file(fs.path().join("to-delete")).expect("rm to-delete");
    fs.sync();
}

/// `fstrim -v` of the mounted filesystem: ext4 discards its free extents
/// (`ext4_trim_fs`), submitted by fstrim itself.
pub fn fstrim(fs: &Ext4, cg: Option<&Cgroup>) -> Did {
    let mut c = cmd(require_tool("fstrim"), &["-v"]);
    c.arg(fs.path());
    let out = run(c, cg, None);
    // "/tmp/x.mnt: 485.4 MiB (508948480 bytes) trimmed"
    let trimmed = out
        .split_once('(')
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in fstrim's output: {out:?}"));
    Did {
        trimmed,
        ..Did::default()
    }
}

/// Panics unless `dev` takes write zeroes (`queue/write_zeroes_max_bytes` > 0). (A loop
/// device over tmpfs takes them only without REQ_NOUNMAP, which tmpfs can do as a hole punch:
/// a NOUNMAP one — `blkdiscard -z` — fails with EOPNOTSUPP and the loop driver then turns
/// write zeroes off for the device until it is set up again.)
pub fn require_write_zeroes(dev: &BlockDev) {
    let max = dev.queue_attr("write_zeroes_max_bytes");
    assert!(
        max.parse::<u64>().unwrap_or(0) > 0,
        "{} does not take write zeroes (queue/write_zeroes_max_bytes = {max})",
        dev.name
    );
}

/// `fallocate --punch-hole` of the first `bytes` of the raw device: `blkdev_fallocate` →
/// `blkdev_issue_zeroout(.., BLKDEV_ZERO_NOFALLBACK)` → REQ_OP_WRITE_ZEROES bios (without
/// REQ_NOUNMAP), never a fallback to writing zero pages (it fails instead). /proc/diskstats
/// counts them as writes with their sectors.
pub fn write_zeroes(dev: &BlockDev, cg: Option<&Cgroup>, bytes: u64) -> Did {
    require_write_zeroes(dev);
    assert!(
        bytes <= dev.size,
        "write_zeroes: {bytes} > the {} bytes the test may use",
        dev.size
    );
    let mut c = cmd(
        require_tool("fallocate"),
        &[
            "--punch-hole",
            "--offset",
            "0",
            "--length",
            &bytes.to_string(),
        ],
    );
    c.arg(&dev.path);
    run(c, cg, None);
    Did {
        zeroed: bytes,
        ..Did::default()
    }
}

/// The statements of [`sqlite`]: `journal_mode` (WAL, DELETE), synchronous=FULL, one table,
/// `n` INSERT statements, each its own transaction (autocommit).
pub fn sqlite_script(journal_mode: &str, n: u64) -> String {
    let mut s = format!(
        "PRAGMA journal_mode={journal_mode};\nPRAGMA synchronous=FULL;\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
    );
    for i in 0..n {
        s.push_str(&format!(
            "INSERT INTO t(v) VALUES('row {i} of the conformance workload, padded a little');\n"
        ));
    }
    s
}

/// `sqlite3` (the real shell) running [`sqlite_script`] against a new database on the
/// filesystem: each commit fsyncs (WAL: the -wal file, checkpointed into the database when it
/// closes; DELETE: the rollback journal, the database, the journal deleted).
pub fn sqlite(fs: &Ext4, cg: Option<&Cgroup>, journal_mode: &str, n: u64) -> Did {
    let bin = require_tool("sqlite3");
    let tmp = scratch();
    let script = tmp.path().join("script.sql");
    fs::write(&script, sqlite_script(journal_mode, n)).expect("write the sqlite script");
    let mut c = cmd(bin, &[] as &[&str]);
    c.arg(fs.path().join("db.sqlite"))
        .stdin(fs::File::open(&script).expect("open the sqlite script"));
    let out = run(c, cg, None);
    if journal_mode.eq_ignore_ascii_case("wal") {
        assert_eq!(
            out.lines().next(),
            Some("wal"),
            "sqlite3 did not switch to WAL: {out}"
        );
    }
    Did {
        transactions: n + 1,
        files: 1,
        ..Did::default()
    }
}

/// The first directories of `root` (sorted) with at least `files` files between them, and
/// their file and byte counts.
pub fn pick_tree(root: &Path, files: u64) -> (Vec<PathBuf>, u64, u64) {
    fn walk(p: &Path, files: &mut u64, bytes: &mut u64) {
        let Ok(md) = fs::symlink_metadata(p) else {
            return;
        };
        if md.is_dir() {
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.flatten() {
                    walk(&e.path(), files, bytes);
                }
            }
        } else {
            *files += 1;
            if md.is_file() {
                *bytes += md.len();
            }
        }
    }
    let mut dirs: Vec<PathBuf> = fs::read_dir(root)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let (mut picked, mut n, mut b) = (Vec::new(), 0, 0);
    for d in dirs {
        if n >= files {
            break;
        }
        walk(&d, &mut n, &mut b);
        picked.push(d);
    }
    assert!(n >= files.min(1), "{} has no files to copy", root.display());
    (picked, n, b)
}

/// `cp -a` of the first directories of /usr/share/doc (at least `files` files) onto the
/// filesystem, then `sync -f` of it ([`sync_fs_only`]).
pub fn copy_tree(fs: &Ext4, cg: Option<&Cgroup>, files: u64) -> Did {
    let (dirs, n, bytes) = pick_tree(Path::new("/usr/share/doc"), files);
    let dest = fs.dir("copy", None);
    let mut c = cmd("cp", &["-a"]);
    c.args(&dirs).arg(&dest);
    run(c, cg, None);
    sync_fs_only(fs, cg);
    Did {
        files: n,
        bytes_written: bytes,
        syncs: 1,
        ..Did::default()
    }
}

// ---------------------------------------------------------------------------------------
// Raw-device drivers (no filesystem): requeues, splits, a multi-queue device

/// Panics unless `bytes` from offset 0 fit in the region the test may use.
fn require_room(dev: &BlockDev, what: &str, bytes: u64) {
    assert!(
        bytes <= dev.size,
        "{what}: {bytes} bytes > the {} bytes the test may use on {}",
        dev.size,
        dev.name
    );
}

/// A fio job on the raw device: 4 KiB O_DIRECT libaio writes, in `cg`.
fn fio_raw(name: &str, dev: &BlockDev, cg: Option<&Cgroup>) -> Fio {
    let f = Fio::new(name, &dev.path)
        .opt("bs", "4k")
        .opt("direct", "1")
        .opt("ioengine", "libaio");
    match cg {
        Some(cg) => f.in_cgroup(cg),
        None => f,
    }
}

/// fio: `n` 4 KiB O_DIRECT random writes over the first `n` x 4 KiB of the raw device
/// (each block once), iodepth 32: many requests in flight at once, what makes the lab's
/// requeue disk hand some back.
pub fn randwrite_direct(dev: &BlockDev, cg: Option<&Cgroup>, n: u64) -> Did {
    require_room(dev, "randwrite", n * 4096);
    let r = fio_raw("randwrite", dev, cg)
        .opt("rw", "randwrite")
        .opt("iodepth", "32")
        .size(n * 4096)
        .run();
    fio_did(&r)
}

/// fio: two jobs (`numjobs=2`, reported together), each pinned to its own CPU (0 and 1,
/// `cpus_allowed_policy=split`), each writing `n` 4 KiB O_DIRECT random writes at iodepth 32
/// into a file of its own on the filesystem (laid out with fallocate: ext4 converts the
/// unwritten extents as they are written), fsync'ed at the end: two CPUs submit at once,
/// which on a multi-queue device are two hardware queues (blk-mq maps each CPU's software
/// queue to one).
pub fn two_jobs_on_ext4(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    let cpus = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    assert!(
        cpus >= 2,
        "two jobs on two CPUs need 2 CPUs; this machine has {cpus}"
    );
    let dir = fs.dir("two-jobs", None);
    let f = Fio::in_directory("two-jobs", &dir)
        .opt("rw", "randwrite")
        .opt("bs", "4k")
        .opt("direct", "1")
        .opt("ioengine", "libaio")
        .opt("iodepth", "32")
        .opt("numjobs", "2")
        .opt("group_reporting", "1")
        .opt("cpus_allowed", "0,1")
        .opt("cpus_allowed_policy", "split")
        .opt("end_fsync", "1")
        .size(n * 4096);
    let f = match cg {
        Some(cg) => f.in_cgroup(cg),
        None => f,
    };
    let mut did = fio_did(&f.run());
    assert_eq!(
        did.writes,
        2 * n,
        "fio's two jobs did not write {n} blocks each: {did}"
    );
    did.files = 2;
    did
}

/// fio: `n` sequential 64 KiB O_DIRECT writes, one at a time (psync): with max_sectors_kb
/// below 64 each bio is split into pieces of max_sectors_kb.
pub fn direct_64k_writes(dev: &BlockDev, cg: Option<&Cgroup>, n: u64) -> Did {
    require_room(dev, "64 KiB writes", n << 16);
    let r = fio_raw("direct-64k", dev, cg)
        .opt("rw", "write")
        .opt("bs", "64k")
        .opt("ioengine", "psync")
        .size(n << 16)
        .run();
    fio_did(&r)
}

/// `/usr/bin/python3` (Debian's: its `os.pwritev` and `mmap` are what [`pwritev_scattered`]
/// needs; a python3 elsewhere on PATH may be a version manager's shim the lab cannot run).
pub fn python3() -> PathBuf {
    let p = PathBuf::from("/usr/bin/python3");
    let ok = Command::new(&p)
        .args(["-c", "import mmap, os; os.pwritev"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "/usr/bin/python3 with mmap and os.pwritev is required by the conformance workloads \
         (scripts/setup --test installs python3)"
    );
    p
}

/// What [`pwritev_scattered`] runs: `calls` O_DIRECT pwritev calls on the device, each of
/// `nvec` separate 4 KiB buffers (every other page of one anonymous mapping, touched from the
/// last page to the first so that neighbours in the list are unlikely to be neighbours in
/// physical memory, which the kernel would join into one segment), at consecutive offsets.
const PWRITEV_SCRIPT: &str = r#"
import mmap, os, sys
dev, calls, nvec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
page = mmap.PAGESIZE
buf = mmap.mmap(-1, 2 * nvec * page)
for i in reversed(range(2 * nvec)):
    buf[i * page] = 0x5A
view = memoryview(buf)
vecs = [view[2 * i * page:(2 * i + 1) * page] for i in range(nvec)]
fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
off = 0
for _ in range(calls):
    n = os.pwritev(fd, vecs, off)
    if n != nvec * page:
        sys.exit("short pwritev: %d of %d bytes" % (n, nvec * page))
    off += n
os.close(fd)
print(off, flush=True)
os._exit(0)
"#;

/// The buffers per pwritev call for [`pwritev_scattered`] on `dev`: twice its max_segments,
/// at most 256 (BIO_MAX_VECS: one bio takes them all) — and the call's bytes within
/// max_sectors_kb, so the only limit the bio breaks is the segment count.
pub fn pwritev_buffers(dev: &BlockDev) -> u64 {
    let max_segments: u64 = dev.queue_attr("max_segments").parse().unwrap_or(0);
    let max_kb: u64 = dev.queue_attr("max_sectors_kb").parse().unwrap_or(0);
    let nvec = (2 * max_segments).min(256);
    assert!(
        nvec > max_segments && nvec * 4 <= max_kb,
        "{}: max_segments {max_segments}, max_sectors_kb {max_kb}: no pwritev of at most 256 \
         4 KiB buffers has more segments than allowed within the size limit",
        dev.name
    );
    nvec
}

/// `calls` O_DIRECT pwritev calls of [`pwritev_buffers`] separate 4 KiB buffers each (python3,
/// [`PWRITEV_SCRIPT`]), from offset 0 of the raw device: each call is one bio with more
/// segments than the queue's max_segments, which the block layer splits.
pub fn pwritev_scattered(dev: &BlockDev, cg: Option<&Cgroup>, calls: u64) -> Did {
    let nvec = pwritev_buffers(dev);
    require_room(dev, "pwritev", calls * nvec * 4096);
    let mut c = cmd(python3(), &["-c", PWRITEV_SCRIPT]);
    c.arg(&dev.path)
        .arg(calls.to_string())
        .arg(nvec.to_string());
    let out = run(c, cg, None);
    let bytes: u64 = out
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the pwritev script printed no byte count: {out:?}"));
    assert_eq!(bytes, calls * nvec * 4096, "pwritev wrote {bytes} bytes");
    Did {
        writes: calls,
        bytes_written: bytes,
        ..Did::default()
    }
}

/// `blkdiscard -f -o OFFSET -l BYTES -p BYTES` (one BLKDISCARD ioctl for the whole range):
/// the kernel makes one discard bio of it (`bio_discard_limit`: up to 4 GiB, whatever the
/// queue's discard_max_bytes), which the block layer then splits at discard_max_bytes.
pub fn blkdiscard(dev: &BlockDev, cg: Option<&Cgroup>, offset: u64, bytes: u64) -> Did {
    require_room(dev, "blkdiscard", offset + bytes);
    let (off, len) = (offset.to_string(), bytes.to_string());
    let mut c = cmd(
        require_tool("blkdiscard"),
        &["-f", "-o", &off, "-l", &len, "-p", &len],
    );
    c.arg(&dev.path);
    run(c, cg, None);
    Did {
        discarded: bytes,
        ..Did::default()
    }
}

/// The statements of [`sqlite_bulk`]: WAL, synchronous=FULL, one table, and one transaction
/// inserting `rows` rows of 1000 random bytes.
pub fn sqlite_bulk_script(rows: u64) -> String {
    format!(
        "PRAGMA journal_mode=WAL;\nPRAGMA synchronous=FULL;\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);\n\
         BEGIN;\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})\n\
         INSERT INTO t(v) SELECT randomblob(1000) FROM c;\n\
         COMMIT;\n"
    )
}

/// `sqlite3` inserting `rows` rows of 1000 bytes in one transaction: the pages go to the WAL
/// with buffered writes as the page cache spills, the commit fsyncs the WAL (megabytes of
/// dirty pages written back at once: many requests in flight), the checkpoints after the
/// commit and at close copy them into the database and fsync it.
pub fn sqlite_bulk(fs: &Ext4, cg: Option<&Cgroup>, rows: u64) -> Did {
    let bin = require_tool("sqlite3");
    let tmp = scratch();
    let script = tmp.path().join("bulk.sql");
    fs::write(&script, sqlite_bulk_script(rows)).expect("write the sqlite script");
    let mut c = cmd(bin, &[] as &[&str]);
    c.arg(fs.path().join("bulk.sqlite"))
        .stdin(fs::File::open(&script).expect("open the sqlite script"));
    let out = run(c, cg, None);
    assert_eq!(
        out.lines().next(),
        Some("wal"),
        "sqlite3 did not switch to WAL: {out}"
    );
    Did {
        transactions: 2,
        files: 1,
        bytes_written: rows * 1000,
        ..Did::default()
    }
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

/// A PostgreSQL cluster on the scratch filesystem, owned by and run as [`NOBODY`], listening
/// only on a unix socket in a temp dir (`listen_addresses=''`). Autovacuum is off and
/// wal_level minimal (either would write on its own schedule: autovacuum, and the background
/// writer's standby snapshots every 15 s); everything else is the default durability: fsync on,
/// synchronous_commit on, full_page_writes on. Dropping it stops the server (SIGQUIT, then
/// SIGKILL to the postmaster and every backend, by pid).
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    sock: tempfile::TempDir,
    server: Option<Running>,
}

impl Postgres {
    /// `initdb -N` (no fsync: the caller syncs the filesystem before its window) into
    /// `<fs>/pgdata`.
    pub fn init(fs: &Ext4) -> Postgres {
        let bin = postgres_bindir();
        let data = fs.dir("pgdata", Some(NOBODY));
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700)).expect("chmod pgdata");
        let sock = scratch();
        chown(sock.path(), NOBODY);
        let mut c = cmd(
            bin.join("initdb"),
            &[
                "-N",
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "-D",
            ],
        );
        c.arg(&data);
        run(c, None, Some(NOBODY));
        Postgres {
            bin,
            data,
            sock,
            server: None,
        }
    }

    /// Starts the server (inside `cg`: its backends, WAL writer, checkpointer and background
    /// writer inherit it) and waits until it accepts connections.
    pub fn start(&mut self, cg: Option<&Cgroup>) {
        let mut c = cmd(self.bin.join("postgres"), &["-D"]);
        c.arg(&self.data)
            .args(["-c", "listen_addresses=", "-k"])
            .arg(self.sock.path())
            .args([
                "-c",
                "autovacuum=off",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_wal_size=64MB",
                "-c",
                "logging_collector=off",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                // No standby snapshot: with wal_level replica (the default) the background
                // writer logs the running transactions every 15 s (LOG_SNAPSHOT_INTERVAL_MS)
                // and the WAL writer writes and fdatasyncs it, whenever that falls — seen in
                // 6.12 between the tracer's attach and the window's first snapshot (1 write,
                // 1 flush-only write and 1 flush more in mergetrace and blktrace than in the
                // diskstats and io.stat deltas). wal_level=minimal logs none.
                "-c",
                "wal_level=minimal",
                "-c",
                "max_wal_senders=0",
            ]);
        self.server = Some(Running::start(c, cg, Some(NOBODY)));
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let mut r = cmd(self.bin.join("pg_isready"), &["-q", "-U", "postgres", "-h"]);
            r.arg(self.sock.path());
            if r.status().is_ok_and(|s| s.success()) {
                return;
            }
            let s = self.server.as_mut().unwrap();
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let out = self.server.take().unwrap().wait(Duration::from_secs(5));
                panic!(
                    "postgres exited ({st}) before accepting connections:\n{}{}",
                    out.stdout, out.stderr
                );
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within 300 s"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn client(&self, tool: &str) -> Command {
        let mut c = cmd(self.bin.join(tool), &["-U", "postgres", "-h"]);
        c.arg(self.sock.path());
        c
    }

    /// Runs SQL with psql (as nobody: the socket directory is nobody's).
    pub fn psql(&self, sql: &str, cg: Option<&Cgroup>) -> String {
        let mut c = self.client("psql");
        c.args(["-q", "-X", "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres"]);
        run(c, cg, Some(NOBODY))
    }

    /// `pgbench -n -c CLIENTS -t TX` with a one-INSERT script: each transaction a commit the
    /// server makes durable (WAL written and fdatasync'ed) before it answers.
    pub fn pgbench_inserts(&self, cg: Option<&Cgroup>, clients: u64, tx: u64) -> Did {
        let tmp = scratch();
        let script = tmp.path().join("insert.sql");
        fs::write(
            &script,
            "INSERT INTO conformance(v) VALUES ('client ' || :client_id || ' of the conformance workload');\n",
        )
        .expect("write the pgbench script");
        let mut c = self.client("pgbench");
        c.args([
            "-n",
            "-c",
            &clients.to_string(),
            "-t",
            &tx.to_string(),
            "-f",
        ])
        .arg(&script)
        .arg("postgres");
        let out = run(c, cg, Some(NOBODY));
        let done: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|r| r.split('/').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no transaction count in pgbench's output:\n{out}"));
        assert_eq!(
            done,
            clients * tx,
            "pgbench did not finish every transaction:\n{out}"
        );
        Did {
            transactions: done,
            ..Did::default()
        }
    }

    /// `pg_ctl stop -m fast` (a shutdown checkpoint: dirty buffers written and fsynced),
    /// then waits for the postmaster to exit.
    pub fn stop(&mut self, cg: Option<&Cgroup>) {
        let mut c = cmd(
            self.bin.join("pg_ctl"),
            &["stop", "-m", "fast", "-t", "300", "-D"],
        );
        c.arg(&self.data);
        run(c, cg, Some(NOBODY));
        if let Some(s) = self.server.take() {
            let out = s.wait(Duration::from_secs(60));
            assert!(
                out.status.success(),
                "postgres exited with {}:\n{}",
                out.status,
                out.stderr
            );
        }
    }
}

/// The pids whose parent is `pid` (from /proc/*/stat).
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            v.push(p);
        }
    }
    v
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let pid = server.pid();
        // Backends are session leaders of their own: find them before their parent goes.
        let kids = children_of(pid);
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && server
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_none())
        {
            thread::sleep(Duration::from_millis(50));
        }
        for k in kids {
            unsafe {
                libc::kill(k as libc::pid_t, libc::SIGKILL);
            }
        }
        server.kill();
    }
}

// ---------------------------------------------------------------------------------------
// The workloads, prepared and run

/// The conformance workloads. See each driver for what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`buffered_then_sync`], then umount.
    BufferedSync,
    /// [`fsync_per_write`], then umount.
    FsyncPerWrite,
    /// [`fdatasync_per_write`] (overwrites), then umount.
    FdatasyncPerWrite,
    /// [`o_dsync_writes`], then umount.
    ODsync,
    /// [`small_files`], then umount.
    SmallFiles,
    /// [`fstrim`], then umount.
    Fstrim,
    /// [`write_zeroes`] on the raw device (no filesystem).
    WriteZeroes,
    /// [`dd`] and a few small files, nothing synced: umount writes it all.
    Umount,
    /// [`sqlite`] with journal_mode=WAL, then umount.
    SqliteWal,
    /// [`sqlite`] with journal_mode=DELETE, then umount.
    SqliteDelete,
    /// [`Postgres::pgbench_inserts`], the server stopped, then umount.
    Postgres,
    /// [`copy_tree`], then umount.
    CopyTree,
    /// [`randwrite_direct`] on the raw device: 4 KiB O_DIRECT random writes, iodepth 32.
    RandWriteDirect,
    /// [`sqlite_bulk`]: one big transaction (WAL, synchronous=FULL), then umount.
    SqliteBulk,
    /// On the raw device, [`direct_64k_writes`] (64 KiB O_DIRECT writes, one at a time), then
    /// [`blkdiscard`] of one large range after them: a write and a discard workload, told
    /// apart by direction.
    Direct64kAndBlkdiscard,
    /// [`pwritev_scattered`] on the raw device: one O_DIRECT pwritev of many separate 4 KiB
    /// buffers per call, more of them than the device's max_segments.
    PwritevScattered,
    /// [`two_jobs_on_ext4`]: two fio jobs on two CPUs, O_DIRECT at iodepth 32 each, into
    /// files of their own on ext4, fsync'ed, then umount.
    TwoJobsOnExt4,
}

/// A workload ready to run: its filesystem mounted, its files and server in place.
pub struct Prepared {
    pub kind: Kind,
    /// Where the raw-device workloads write (the test disk's node).
    dev: PathBuf,
    dev_info: BlockDev,
    pub fs: Option<Ext4>,
    pub pg: Option<Postgres>,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::BufferedSync => "buffered writes + sync",
            Kind::FsyncPerWrite => "write + fsync",
            Kind::FdatasyncPerWrite => "overwrite + fdatasync",
            Kind::ODsync => "O_DSYNC writes",
            Kind::SmallFiles => "small files + syncfs",
            Kind::Fstrim => "fstrim",
            Kind::WriteZeroes => "write zeroes",
            Kind::Umount => "umount of dirty data",
            Kind::SqliteWal => "sqlite WAL",
            Kind::SqliteDelete => "sqlite DELETE journal",
            Kind::Postgres => "postgres pgbench inserts",
            Kind::CopyTree => "cp -a + sync",
            Kind::RandWriteDirect => "fio 4k randwrite O_DIRECT iodepth 32",
            Kind::SqliteBulk => "sqlite bulk insert, one transaction",
            Kind::Direct64kAndBlkdiscard => "64 KiB O_DIRECT writes, then blkdiscard of one range",
            Kind::PwritevScattered => "O_DIRECT pwritev of scattered 4 KiB buffers",
            Kind::TwoJobsOnExt4 => "fio 2 jobs on 2 CPUs, O_DIRECT iodepth 32, files on ext4",
        }
    }

    /// Whether the workload runs on the raw device (no filesystem made or mounted).
    pub fn raw(self) -> bool {
        matches!(
            self,
            Kind::WriteZeroes
                | Kind::RandWriteDirect
                | Kind::Direct64kAndBlkdiscard
                | Kind::PwritevScattered
        )
    }

    /// Sizes: a few seconds on the host, smaller in the ~10x slower lab guests.
    fn count(self) -> u64 {
        match self {
            Kind::BufferedSync => scaled(64 << 20, 16 << 20),
            Kind::FsyncPerWrite | Kind::FdatasyncPerWrite | Kind::ODsync => scaled(200, 50),
            Kind::SmallFiles => scaled(2000, 300),
            Kind::WriteZeroes => scaled(64 << 20, 16 << 20),
            Kind::Umount => scaled(32 << 20, 8 << 20),
            Kind::SqliteWal | Kind::SqliteDelete => scaled(300, 50),
            Kind::Postgres => scaled(200, 25),
            Kind::CopyTree => scaled(3000, 300),
            Kind::Fstrim => 0,
            // 4 KiB I/Os (per job for TwoJobsOnExt4).
            // (Lab: 500 still requeues hundreds of times on vdc; the tracer's attach, not
            // the workload, is most of a window there.)
            Kind::RandWriteDirect => scaled(4096, 500),
            Kind::TwoJobsOnExt4 => scaled(4096, 500),
            // Rows of 1000 random bytes.
            Kind::SqliteBulk => scaled(16384, 4096),
            // 64 KiB writes; the discard is 4 times their bytes (below).
            Kind::Direct64kAndBlkdiscard => scaled(1024, 64),
            // pwritev calls.
            Kind::PwritevScattered => scaled(64, 16),
        }
    }

    /// Everything before the measured window. Ends with the disk quiet.
    pub fn prepare(self, dev: &BlockDev, cg: Option<&Cgroup>) -> Prepared {
        let mut p = Prepared {
            kind: self,
            dev: dev.path.clone(),
            dev_info: BlockDev {
                name: dev.name.clone(),
                path: dev.path.clone(),
                major: dev.major,
                minor: dev.minor,
                size: dev.size,
            },
            fs: None,
            pg: None,
        };
        match self {
            Kind::WriteZeroes => {
                require_write_zeroes(dev);
                require_tool("fallocate");
            }
            Kind::PwritevScattered => {
                python3();
            }
            Kind::Direct64kAndBlkdiscard => {
                require_discard(dev);
                require_tool("blkdiscard");
            }
            _ if self.raw() => {}
            _ => {
                let fs = Ext4::new(dev);
                match self {
                    Kind::FdatasyncPerWrite => prepare_overwrite(&fs, self.count()),
                    Kind::Fstrim => prepare_fstrim(&fs, dev),
                    Kind::SqliteWal | Kind::SqliteDelete | Kind::SqliteBulk => {
                        require_tool("sqlite3");
                    }
                    Kind::Postgres => {
                        let mut pg = Postgres::init(&fs);
                        fs.sync();
                        pg.start(cg);
                        pg.psql(
                            "CREATE TABLE conformance(id serial PRIMARY KEY, v text); CHECKPOINT;",
                            cg,
                        );
                        p.pg = Some(pg);
                    }
                    _ => {}
                }
                fs.sync();
                p.fs = Some(fs);
            }
        }
        quiesce(dev);
        p
    }
}

impl Prepared {
    /// The measured part: the workload, then (filesystem workloads) the unmount.
    pub fn run(&mut self, cg: Option<&Cgroup>) -> Did {
        let n = self.kind.count();
        let dev = &self.dev_info;
        match self.kind {
            Kind::WriteZeroes => return write_zeroes(dev, cg, n),
            Kind::RandWriteDirect => return randwrite_direct(dev, cg, n),
            Kind::Direct64kAndBlkdiscard => {
                let w = direct_64k_writes(dev, cg, n);
                // After the writes, on a 1 MiB boundary.
                let at = (n << 16).next_multiple_of(1 << 20);
                return w + blkdiscard(dev, cg, at, n << 18);
            }
            Kind::PwritevScattered => return pwritev_scattered(dev, cg, n),
            _ => {}
        }
        let fs = self
            .fs
            .as_ref()
            .expect("a filesystem workload has a filesystem");
        let did = match self.kind {
            Kind::BufferedSync => buffered_then_sync(fs, cg, n),
            Kind::FsyncPerWrite => fsync_per_write(fs, cg, n),
            Kind::FdatasyncPerWrite => fdatasync_per_write(fs, cg, n),
            Kind::ODsync => o_dsync_writes(fs, cg, n),
            Kind::SmallFiles => small_files(fs, cg, n),
            Kind::Fstrim => fstrim(fs, cg),
            Kind::Umount => {
                let d = dd(fs, cg, "dirty", n);
                let files = small_files_unsynced(fs, cg, scaled(200, 50));
                d + files
            }
            Kind::SqliteWal => sqlite(fs, cg, "WAL", n),
            Kind::SqliteDelete => sqlite(fs, cg, "DELETE", n),
            Kind::Postgres => {
                let pg = self.pg.as_mut().expect("prepared with a server");
                let did = pg.pgbench_inserts(cg, 2, n);
                pg.stop(cg);
                did
            }
            Kind::CopyTree => copy_tree(fs, cg, n),
            Kind::SqliteBulk => sqlite_bulk(fs, cg, n),
            Kind::TwoJobsOnExt4 => two_jobs_on_ext4(fs, cg, n),
            _ => unreachable!("{} runs on the raw device", self.kind.name()),
        };
        did + self.fs.as_mut().unwrap().unmount(cg)
    }

    /// What the workload claims it made the disk do, checked against the /proc/diskstats
    /// deltas of its window; the failures, empty when it did what it says.
    pub fn check_claims(&self, did: &Did, d: &DiskStats) -> Vec<String> {
        let mut bad = Vec::new();
        let mut claim = |ok: bool, what: &str| {
            if !ok {
                bad.push(format!(
                    "{}: {what}; did {did}; diskstats {d:?}",
                    self.kind.name()
                ));
            }
        };
        let written = d.sectors_written * 512;
        // A disk without a volatile cache (write through: null_blk, a loop device switched
        // to it) gets no flushes at all: submit_bio_noacct drops PREFLUSH/FUA and ends an
        // empty flush bio before it is queued. The flush claims below are for write back.
        let write_back = self.dev_info.queue_attr("write_cache") == "write back";
        if !write_back {
            claim(d.flushes == 0, "flush requests on a write-through disk");
        }
        match self.kind {
            Kind::BufferedSync | Kind::Umount | Kind::CopyTree => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the files hold",
                );
            }
            Kind::FsyncPerWrite | Kind::ODsync if !write_back => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
            }
            Kind::FsyncPerWrite | Kind::ODsync => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
                claim(
                    d.flushes >= did.syncs,
                    "fewer flushes than syncs (each commits the journal)",
                );
            }
            Kind::FdatasyncPerWrite => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
                claim(d.flushes >= did.syncs, "fewer flushes than fdatasyncs");
                // Every fdatasync sent data + an empty flush: more completed writes than the
                // 4 KiB writes could make as requests alone (they do not merge: one per sync).
                claim(d.writes > did.writes, "no flush-only writes counted");
            }
            Kind::SmallFiles => {
                claim(
                    written >= did.files * 4096,
                    "less than a block per file written",
                );
                claim(d.flushes >= 1, "syncfs sent no flush");
            }
            Kind::Fstrim => {
                claim(did.trimmed > 0, "fstrim trimmed nothing");
                claim(
                    d.sectors_discarded * 512 == did.trimmed,
                    "discarded sectors != the bytes fstrim reports",
                );
            }
            Kind::WriteZeroes => {
                claim(written == did.zeroed, "sectors written != the bytes zeroed");
                // Zero pages would take at least zeroed / max_sectors_kb requests; write zeroes
                // take zeroed / write_zeroes_max_bytes (+ an empty flush).
                let max_wz: u64 = self
                    .dev_info
                    .queue_attr("write_zeroes_max_bytes")
                    .parse()
                    .unwrap_or(1);
                claim(
                    d.writes <= did.zeroed.div_ceil(max_wz.max(1)) + 2,
                    "too many write requests for write zeroes (zero pages written instead?)",
                );
            }
            Kind::SqliteWal | Kind::SqliteDelete => {
                claim(
                    d.flushes >= did.transactions,
                    "fewer flushes than commits (synchronous=FULL)",
                );
            }
            Kind::Postgres => {
                claim(d.flushes >= 1, "no flush");
                claim(written > 0, "nothing written");
            }
            Kind::SqliteBulk => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the rows hold",
                );
                if self.dev_info.queue_attr("write_cache") == "write back" {
                    claim(
                        d.flushes >= 1,
                        "no flush (synchronous=FULL fsyncs at the commit)",
                    );
                }
            }
            // O_DIRECT on the raw device, nothing else writing: every byte once.
            Kind::RandWriteDirect => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes fio wrote",
                );
            }
            Kind::TwoJobsOnExt4 => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the two jobs wrote",
                );
                if write_back {
                    claim(
                        d.flushes >= 1,
                        "no flush (each job fsyncs its file at the end)",
                    );
                }
            }
            Kind::Direct64kAndBlkdiscard => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes fio wrote",
                );
                // Each 64 KiB bio is split into max_sectors_kb pieces, each a request of the
                // largest size allowed, so none can merge with another.
                let max_kb: u64 = self
                    .dev_info
                    .queue_attr("max_sectors_kb")
                    .parse()
                    .unwrap_or(0);
                let pieces = (64u64).div_ceil(max_kb.max(1));
                claim(
                    d.writes == did.writes * pieces,
                    &format!(
                        "write requests != {} writes x {pieces} pieces (max_sectors_kb {max_kb})",
                        did.writes
                    ),
                );
                claim(d.writes_merged == 0, "pieces of the largest size merged");
                claim(
                    d.sectors_discarded * 512 == did.discarded,
                    "discarded sectors != the range blkdiscard discarded",
                );
                // One bio (the block layer makes bios of up to 4 GiB), split into pieces of
                // discard_max_bytes: each piece became a request or merged into one.
                let max: u64 = self
                    .dev_info
                    .queue_attr("discard_max_bytes")
                    .parse()
                    .unwrap_or(0);
                let pieces = did.discarded.div_ceil(max.max(1));
                claim(
                    d.discards + d.discards_merged == pieces,
                    &format!(
                        "discard requests + merges != {pieces} pieces of discard_max_bytes {max}"
                    ),
                );
            }
            Kind::PwritevScattered => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes pwritev wrote",
                );
                claim(
                    d.writes >= 2 * did.writes,
                    "fewer than 2 write requests per pwritev: its bio was not split by max_segments",
                );
            }
        }
        claim(
            d.in_flight == 0,
            "I/O still in flight at the end of the window",
        );
        bad
    }
}

/// `n` 512-byte files, not synced.
fn small_files_unsynced(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    let d = fs.dir("unsynced", None);
    let script = format!(
        "cd '{}' && i=0 && while [ $i -lt {n} ]; do i=$((i+1)); printf '%0512d' $i > f$i; done",
        d.display()
    );
    run(sh(&script), cg, None);
    Did {
        writes: n,
        bytes_written: n * 512,
        files: n,
        ..Did::default()
    }
}

/// Whether these workloads run in the lab (the guests are slower: sizes are smaller).
pub fn in_guest() -> bool {
    in_lab()
}
