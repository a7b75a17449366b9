//! What a workload did ([`Did`]) and the filesystem drivers that do it.

use std::{
    fmt, fs,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::*;

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
pub(super) fn fio_writes(file: &Path, cg: Option<&Cgroup>, n: u64, opts: &[(&str, &str)]) -> Value {
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

pub(super) fn fio_did(report: &Value) -> Did {
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
