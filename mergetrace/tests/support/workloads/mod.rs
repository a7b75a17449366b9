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
    fs,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use super::{children_of, in_lab, scaled, unique_name, BlockDev, Cgroup, DiskStats, Fio};

mod drivers;
mod ext4;
mod kind;
mod postgres;
mod process;
mod raw;

// One flat namespace (`use support::workloads::*`), as when this was one file.
#[allow(unused_imports)]
pub use self::{drivers::*, ext4::*, kind::*, postgres::*, process::*, raw::*};

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
