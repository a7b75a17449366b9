//! Raw-device drivers (no filesystem): requeues, splits, a multi-queue device.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    thread,
};

use super::*;

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
