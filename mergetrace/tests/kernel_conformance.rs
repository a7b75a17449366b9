//! Conformance of mergetrace's counts on REAL workloads (support/workloads.rs): a scratch
//! ext4 with fsync / fdatasync / O_DSYNC writers, many small files, fstrim, umount, SQLite,
//! a PostgreSQL server, a tree copy; and write zeroes on the raw disk. Unlike fio O_DIRECT on a
//! raw device, these send cache flushes (empty `REQ_PREFLUSH` bios, journal commit blocks with
//! `PREFLUSH|FUA`), discards and write zeroes, and much of their I/O is submitted by kernel
//! threads outside the workload's cgroup (the flusher, jbd2).
//!
//! Each workload runs on the test disk (a loop device; in the lab /dev/vdb), inside a cgroup,
//! with `mergetrace --json` attached from before the workload until its I/O drained; its
//! filesystem is made and mounted before the window and unmounted inside it (so every write
//! it caused is in the window, see workloads.rs). Then, per direction (read, write, discard,
//! flush), the CONTRACT below is checked against /proc/diskstats, blk-cgroup's per-cgroup
//! counters (v1 `blkio.throttle.io_serviced`, v2 `io.stat`) and, in the lab's guests (the only
//! place with debugfs), the real blktrace over the same window. All failures of one workload
//! are reported together.
//!
//! CONTRACT, for each direction object `d` (device total and cgroup rows):
//! - read, write, discard: `bios + splits == requests + merged + flush_only`;
//! - `flush_only` (empty PREFLUSH/FUA write bios the flush machinery completed without a
//!   write request) is 0 outside the write direction; `requeues` counts requests issued
//!   again after the driver handed them back (each still one request);
//! - diskstats deltas: reads == read.requests, writes == write.requests + write.flush_only,
//!   discards == discard.requests, flushes (field 18) == flush.requests; merged per direction
//!   == the merged field; request_bytes == sectors * 512 (read, write, discard);
//! - per cgroup: `bios + splits` of a row == the cgroup's own blk-cgroup count of the bios it
//!   was charged for (v1 io_serviced counts every pass through blk-throttle once throttling is
//!   on for the device — we put a never-binding limit on the workload's cgroup for that; v2
//!   io.stat every `submit_bio_noacct_nocheck`, not for the root). Both count by the bio's blkg,
//!   whoever submitted it: on v1 the flusher's writeback and on both jbd2's journal land in the
//!   root, so the workload's own row holds only what it submitted itself. The rows add up to
//!   the device total.
//! - blktrace (guests): see support/blktrace.rs for the kernel source behind each relation.
//!
//! Needs root, BPF, a test disk, cgroups, mkfs.ext4, fio, sqlite3, PostgreSQL, fstrim,
//! fallocate, and in the guests blktrace: missing any is a FAILURE, never a skip.
//!   cargo test --release -p mergetrace --test kernel_conformance -- --test-threads=1
//!   ./mt lab --kernel all -- kernel_conformance
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use serde_json::Value;
use support::{
    blktrace::{self, Blktrace},
    workloads::{self, quiesce, Did, Kind},
    *,
};

const DATA_DIRS: [&str; 3] = ["read", "write", "discard"];
const ALL_DIRS: [&str; 4] = ["read", "write", "discard", "flush"];
/// Fields of a direction object the rows must add up to the device total in.
const SUMMED: [&str; 8] = [
    "bios",
    "bytes",
    "splits",
    "merged",
    "requests",
    "request_bytes",
    "flush_only",
    "requeues",
];

// ---------------------------------------------------------------------------------------
// Collected checks

/// Every relation that failed for one workload, reported together at the end.
struct Checks {
    ctx: String,
    failures: BTreeSet<String>,
    missing: BTreeSet<String>,
}

impl Checks {
    fn new(ctx: &str) -> Checks {
        Checks {
            ctx: ctx.to_string(),
            failures: BTreeSet::new(),
            missing: BTreeSet::new(),
        }
    }

    fn fail(&mut self, msg: String) {
        self.failures.insert(msg);
    }

    fn eq(&mut self, what: &str, left: u64, right: u64) {
        if left != right {
            self.fail(format!("{what}: {left} != {right}"));
        }
    }

    fn le(&mut self, what: &str, left: u64, right: u64) {
        if left > right {
            self.fail(format!("{what}: {left} > {right}"));
        }
    }

    /// `v[field]`, or 0 and a "missing field" failure.
    fn get(&mut self, v: &Value, field: &str) -> u64 {
        match v[field].as_u64() {
            Some(n) => n,
            None => {
                self.missing.insert(field.to_string());
                0
            }
        }
    }

    fn finish(self) {
        let mut all: Vec<String> = self
            .missing
            .iter()
            .map(|f| format!("field `{f}` missing from the JSON (counted as 0 in the relations below)"))
            .collect();
        all.extend(self.failures);
        if !all.is_empty() {
            panic!("{}: {} failed check(s):\n  {}", self.ctx, all.len(), all.join("\n  "));
        }
    }
}

fn dir_of(name: &str) -> blktrace::Dir {
    match name {
        "read" => blktrace::Dir::Read,
        "write" => blktrace::Dir::Write,
        "discard" => blktrace::Dir::Discard,
        _ => blktrace::Dir::Flush,
    }
}

// ---------------------------------------------------------------------------------------
// blk-cgroup's per-cgroup counts, every cgroup of the hierarchy

/// Bios per direction blk-cgroup counted for one cgroup on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Ios {
    read: u64,
    write: u64,
    discard: u64,
}

impl Ios {
    fn get(&self, dir: &str) -> u64 {
        match dir {
            "read" => self.read,
            "write" => self.write,
            "discard" => self.discard,
            _ => 0,
        }
    }
}

/// The counts of every cgroup that has them for `dev`, by the path mergetrace reports:
/// v1 `blkio.throttle.io_serviced` (the root included), v2 `io.stat` rios/wios/dios (no root).
fn cgroup_ios(dev: &BlockDev) -> BTreeMap<String, Ios> {
    let (version, root) = cgroup_hierarchy();
    let mm = dev.maj_min();
    let mut map = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&dir) {
            stack.extend(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
        }
        let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
        let path = format!("/{}", rel.display());
        let mut ios = Ios::default();
        match version {
            CgroupVersion::V1 => {
                let Ok(t) = fs::read_to_string(dir.join("blkio.throttle.io_serviced")) else {
                    continue;
                };
                for l in t.lines() {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    if f.len() == 3 && f[0] == mm {
                        let n = f[2].parse().unwrap_or(0);
                        match f[1] {
                            "Read" => ios.read = n,
                            "Write" => ios.write = n,
                            "Discard" => ios.discard = n,
                            _ => {}
                        }
                    }
                }
            }
            CgroupVersion::V2 => {
                if dir == *root {
                    continue;
                }
                let Ok(t) = fs::read_to_string(dir.join("io.stat")) else {
                    continue;
                };
                for kv in t
                    .lines()
                    .filter(|l| l.split_whitespace().next() == Some(mm.as_str()))
                    .flat_map(|l| l.split_whitespace().skip(1))
                {
                    let Some((k, v)) = kv.split_once('=') else { continue };
                    let n = v.parse().unwrap_or(0);
                    match k {
                        "rios" => ios.read = n,
                        "wios" => ios.write = n,
                        "dios" => ios.discard = n,
                        _ => {}
                    }
                }
            }
        }
        map.insert(path, ios);
    }
    map
}

// ---------------------------------------------------------------------------------------
// The relations

/// The device total against /proc/diskstats, and the accounting identity per direction.
fn check_device(c: &mut Checks, out: &TraceOutput, disk: &BlockDev, d: &DiskStats) {
    c.eq("lost_events", out.lost_events(), 0);
    let t = out.device_total(disk);
    for dir in ALL_DIRS {
        let m = &t[dir];
        let (bios, splits, requests, merged) = (
            c.get(m, "bios"),
            c.get(m, "splits"),
            c.get(m, "requests"),
            c.get(m, "merged"),
        );
        let flush_only = c.get(m, "flush_only");
        c.get(m, "requeues");
        if dir != "flush" {
            c.eq(
                &format!("{dir}: bios + splits == requests + merged + flush_only"),
                bios + splits,
                requests + merged + flush_only,
            );
        }
        if dir != "write" {
            c.eq(&format!("{dir}.flush_only == 0"), flush_only, 0);
        }
    }
    let g = |c: &mut Checks, dir: &str, f: &str| c.get(&t[dir], f);
    let (rr, wr, wf, dr, fr) = (
        g(c, "read", "requests"),
        g(c, "write", "requests"),
        g(c, "write", "flush_only"),
        g(c, "discard", "requests"),
        g(c, "flush", "requests"),
    );
    c.eq("diskstats reads == read.requests", d.reads, rr);
    c.eq("diskstats writes == write.requests + write.flush_only", d.writes, wr + wf);
    c.eq("diskstats discards == discard.requests", d.discards, dr);
    c.eq("diskstats flushes == flush.requests", d.flushes, fr);
    for (dir, merged, sectors) in [
        ("read", d.reads_merged, d.sectors_read),
        ("write", d.writes_merged, d.sectors_written),
        ("discard", d.discards_merged, d.sectors_discarded),
    ] {
        let m = g(c, dir, "merged");
        c.eq(&format!("diskstats {dir} merged == {dir}.merged"), merged, m);
        let rb = g(c, dir, "request_bytes");
        c.eq(&format!("diskstats {dir} sectors * 512 == {dir}.request_bytes"), sectors * 512, rb);
    }
}

/// The rows add up to the device total; each row's bios + splits is its cgroup's own count.
fn check_cgroups(
    c: &mut Checks,
    out: &TraceOutput,
    disk: &BlockDev,
    cg: &Cgroup,
    before: &BTreeMap<String, Ios>,
    after: &BTreeMap<String, Ios>,
) {
    let rows = out.device(disk)["cgroups"].as_array().cloned().unwrap_or_default();
    let total = out.device_total(disk);
    for dir in ALL_DIRS {
        for f in SUMMED {
            let sum: u64 = rows.iter().map(|r| c.get(&r[dir], f)).sum();
            let t = c.get(&total[dir], f);
            c.eq(&format!("sum of the rows' {dir}.{f} == the device total"), sum, t);
        }
    }
    let mut seen = BTreeSet::new();
    for r in &rows {
        let path = r["cgroup"].as_str().unwrap_or("?").to_string();
        for dir in DATA_DIRS {
            if dir != "write" {
                let fo = c.get(&r[dir], "flush_only");
                c.eq(&format!("row {path}: {dir}.flush_only == 0"), fo, 0);
            }
        }
        if !path.starts_with('/') {
            // mergetrace's row for what it could give no cgroup ("(none)": flush requests
            // issued before a flush bio named one). Every bio has a blkg by block_bio_queue.
            for dir in DATA_DIRS {
                let (bios, splits) = (c.get(&r[dir], "bios"), c.get(&r[dir], "splits"));
                c.eq(&format!("row {path}: {dir}.bios + splits (bios without a cgroup)"), bios + splits, 0);
            }
            continue;
        }
        let (Some(a), Some(b)) = (after.get(&path), before.get(&path)) else {
            let v2_root = path == "/" && cg.version() == CgroupVersion::V2;
            if !v2_root && r["gone"] != true {
                c.fail(format!("row {path} has no blk-cgroup counters to compare with"));
            }
            continue;
        };
        seen.insert(path.clone());
        for dir in DATA_DIRS {
            let (bios, splits) = (c.get(&r[dir], "bios"), c.get(&r[dir], "splits"));
            c.eq(
                &format!("row {path}: {dir}.bios + splits == blk-cgroup's count"),
                bios + splits,
                a.get(dir) - b.get(dir),
            );
        }
    }
    for (path, a) in after {
        let b = before.get(path).copied().unwrap_or_default();
        if !seen.contains(path) && *a != b {
            c.fail(format!("cgroup {path} was counted {:?} -> {a:?} on the disk but has no row", b));
        }
    }
}

/// mergetrace against the real blktrace over the same window (support/blktrace.rs says
/// where each relation comes from in the kernel).
fn check_blktrace(c: &mut Checks, out: &TraceOutput, disk: &BlockDev, t: &blktrace::Trace) {
    use blktrace::Dir as B;
    let total = out.device_total(disk);
    let (mut requeues, mut issues) = (0, 0);
    for dir in ALL_DIRS {
        let m = &total[dir];
        let b = dir_of(dir);
        let (bios, splits, merged, requests) = (
            c.get(m, "bios"),
            c.get(m, "splits"),
            c.get(m, "merged"),
            c.get(m, "requests"),
        );
        let (fo, rq) = (c.get(m, "flush_only"), c.get(m, "requeues"));
        let discard_merges = c.get(&m["merged_by_path"], "discard");
        let rq_merges = c.get(&m["merged_by_path"], "request");
        requeues += rq;
        issues += requests + rq;
        c.eq(&format!("blktrace Q {dir} == {dir}.bios"), t.count_dir("Q", b), bios);
        c.eq(&format!("blktrace X {dir} == {dir}.splits"), t.count_dir("X", b), splits);
        c.eq(
            &format!("blktrace M+F {dir} == {dir}.merged - merged_by_path.discard"),
            t.count_dir("M", b) + t.count_dir("F", b),
            merged - discard_merges,
        );
        if dir != "flush" {
            c.eq(
                &format!("blktrace G {dir} == {dir}.requests + flush_only + merged_by_path.request"),
                t.count_dir("G", b),
                requests + fo + rq_merges,
            );
        }
        c.eq(&format!("blktrace D {dir} == {dir}.requests + requeues"), t.count_dir("D", b), requests + rq);
        c.eq(&format!("blktrace R {dir} == {dir}.requeues"), t.count_dir("R", b), rq);
        if dir != "flush" {
            let rb = c.get(m, "request_bytes");
            c.eq(&format!("blktrace first-issue bytes {dir} == {dir}.request_bytes"), t.first_issue_bytes(b), rb);
        }
    }
    let fo = c.get(&total["write"], "flush_only");
    c.eq("blktrace empty PREFLUSH/FUA write G == write.flush_only", t.flush_only_getrqs(), fo);
    c.eq("blktrace D == sum of requests + requeues", t.count("D"), issues);
    c.eq("blktrace R == sum of requeues", t.count("R"), requeues);
    let c0 = t.zero_byte_write_completions();
    c.eq("blktrace C - C0 == D - R", t.count("C") - c0, t.count("D") - t.count("R"));
    if disk.queue_attr("write_cache") == "write back" {
        let fua = disk.queue_attr("fua") == "1";
        c.eq(
            "blktrace C0 == requests that entered the flush machinery",
            c0,
            t.flush_sequence_getrqs(fua),
        );
    }
    c.le("blktrace I <= D", t.count("I"), t.count("D"));
    let unplug = &out.device(disk)["unplug"];
    for (action, key) in [("U", "explicit"), ("UT", "from_schedule")] {
        let json: BTreeMap<u64, u64> = unplug[key]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        let bt = t.unplug_depths(action);
        if bt != json {
            c.fail(format!("blktrace {action} depths {bt:?} != unplug.{key} {json:?}"));
        }
    }
    for a in ["S", "B", "A"] {
        c.eq(&format!("blktrace {a} (none on a blk-mq whole disk)"), t.count(a), 0);
    }
    let _ = B::None;
}

// ---------------------------------------------------------------------------------------
// One workload

/// The deltas and counts of one window, as the report prints them.
fn describe(kind: Kind, did: &Did, d: &DiskStats, out: &TraceOutput, disk: &BlockDev) -> String {
    let t = out.device_total(disk);
    let pick = |dir: &str| {
        let m = &t[dir];
        let f = |k: &str| m[k].as_u64().map_or("-".to_string(), |n| n.to_string());
        format!(
            "{dir}: bios {} splits {} merged {} requests {} flush_only {} requeues {}",
            f("bios"),
            f("splits"),
            f("merged"),
            f("requests"),
            f("flush_only"),
            f("requeues")
        )
    };
    let rows: Vec<String> = out.device(disk)["cgroups"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let n = |dir: &str, f: &str| r[dir][f].as_u64().unwrap_or(0);
                    format!(
                        "{}: read {}/{} write {}/{} discard {}/{} flush -/{} (bios/requests)",
                        r["cgroup"].as_str().unwrap_or("?"),
                        n("read", "bios"),
                        n("read", "requests"),
                        n("write", "bios"),
                        n("write", "requests"),
                        n("discard", "bios"),
                        n("discard", "requests"),
                        n("flush", "requests")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let q = |a: &str| disk.queue_attr(a);
    let queue = format!(
        "scheduler {}, write_cache {}, fua {}, discard_max_bytes {}, write_zeroes_max_bytes {}, max_sectors_kb {}",
        disk.scheduler(),
        q("write_cache"),
        q("fua"),
        q("discard_max_bytes"),
        q("write_zeroes_max_bytes"),
        q("max_sectors_kb")
    );
    format!(
        "conformance [{}] on {} ({queue}): did {did}\n  rows: {}\n  diskstats: reads {} (merged {}, sectors {}), writes {} \
         (merged {}, sectors {}), discards {} (merged {}, sectors {}), flushes {}\n  mergetrace {}\n  \
         mergetrace {}\n  mergetrace {}\n  mergetrace {}",
        kind.name(),
        disk.name,
        rows.join("; "),
        d.reads,
        d.reads_merged,
        d.sectors_read,
        d.writes,
        d.writes_merged,
        d.sectors_written,
        d.discards,
        d.discards_merged,
        d.sectors_discarded,
        d.flushes,
        pick("read"),
        pick("write"),
        pick("discard"),
        pick("flush")
    )
}

/// Prepares `kind` on a fresh test disk in a fresh cgroup, measures its window (tracer,
/// diskstats, blk-cgroup counters, blktrace in the guests), and checks everything.
fn conformance(kind: Kind) {
    require_root();
    let disk = TestDisk::new(workloads::FS_SIZE);
    let cg = Cgroup::new();
    if cg.version() == CgroupVersion::V1 {
        // Turns blk-throttle on for the disk, so v1 counts every cgroup's bios; never binds.
        cg.set_write_iops(&disk, 10_000_000);
    }
    let mut w = kind.prepare(&disk, Some(&cg));

    let tracer = Tracer::on(&disk);
    let bt = in_lab().then(|| Blktrace::start(&disk));
    let ios_before = cgroup_ios(&disk);
    let before = disk.diskstats();
    let did = w.run(Some(&cg));
    quiesce(&disk);
    let after = disk.diskstats();
    let ios_after = cgroup_ios(&disk);
    let trace = bt.map(Blktrace::stop);
    let out = tracer.stop();
    let d = after.since(&before);

    eprintln!("{}", describe(kind, &did, &d, &out, &disk));
    if let Some(t) = &trace {
        let (rqs, unmatched) = t.requests();
        eprintln!(
            "  blktrace: {:?}\n  blktrace: {} requests rebuilt from G/M/F/D ({} events unmatched), C0 {}",
            t.counts(),
            rqs.len(),
            unmatched,
            t.zero_byte_write_completions()
        );
    }
    let mut c = Checks::new(kind.name());
    for claim in w.check_claims(&did, &d) {
        c.fail(claim);
    }
    check_device(&mut c, &out, &disk, &d);
    check_cgroups(&mut c, &out, &disk, &cg, &ios_before, &ios_after);
    if let Some(t) = &trace {
        check_blktrace(&mut c, &out, &disk, t);
    }
    drop(w);
    c.finish();
}

macro_rules! conformance_tests {
    ($($name:ident: $kind:expr;)*) => {$(
        #[test]
        fn $name() {
            conformance($kind);
        }
    )*};
}

// The workloads: one test each, so a failure names it.
conformance_tests! {
    buffered_writes_then_sync: Kind::BufferedSync;
    write_fsync_per_write: Kind::FsyncPerWrite;
    overwrite_fdatasync_per_write: Kind::FdatasyncPerWrite;
    o_dsync_writes: Kind::ODsync;
    small_files_then_syncfs: Kind::SmallFiles;
    fstrim_discards: Kind::Fstrim;
    write_zeroes_on_the_raw_disk: Kind::WriteZeroes;
    umount_writes_dirty_data: Kind::Umount;
    sqlite_wal_full_sync: Kind::SqliteWal;
    sqlite_delete_journal_full_sync: Kind::SqliteDelete;
    postgres_pgbench_inserts: Kind::Postgres;
    copy_tree_then_sync: Kind::CopyTree;
}

/// Every tool the workloads drive is installed (a missing one fails here, by name, as well
/// as in its workload).
#[test]
fn workload_tools_are_installed() {
    for t in ["mkfs.ext4", "fio", "sqlite3", "fstrim", "fallocate", "dd", "cp", "umount", "blktrace", "blkparse"] {
        workloads::require_tool(t);
    }
    workloads::postgres_bindir();
}

// ---------------------------------------------------------------------------------------
// The blkparse parser (no kernel needed: these run anywhere)

mod blkparse_parser {
    use super::support::blktrace::*;
    use std::collections::BTreeMap;

    fn ev(line: &str) -> Event {
        parse_line(line).unwrap().unwrap()
    }

    #[test]
    fn rwbs_flags_and_directions() {
        let r = Rwbs::parse("FWFS").unwrap();
        assert!(r.preflush && r.fua && r.sync && !r.meta);
        assert_eq!(r.dir(), Dir::Write);
        assert_eq!(Rwbs::parse("FN").unwrap().dir(), Dir::Flush);
        assert_eq!(Rwbs::parse("N").unwrap().dir(), Dir::None);
        assert_eq!(Rwbs::parse("RA").unwrap().dir(), Dir::Read);
        assert_eq!(Rwbs::parse("D").unwrap().dir(), Dir::Discard);
        assert_eq!(Rwbs::parse("DS").unwrap().dir(), Dir::Discard);
        let w = Rwbs::parse("FWS").unwrap();
        assert!(w.preflush && !w.fua);
        let m = Rwbs::parse("WSM").unwrap();
        assert!(m.meta && m.sync && !m.preflush);
        assert!(Rwbs::parse("X").is_none());
        assert!(Rwbs::parse("").is_none());
        assert!(Rwbs::parse("WQ").is_none());
    }

    #[test]
    fn parses_our_lines_and_skips_others() {
        let e = ev("@mt Q WS 2048 4096 254,16 1 17 3.000012345 812");
        assert_eq!(e.action, "Q");
        assert_eq!((e.sector, e.bytes, e.end()), (2048, 4096, 2056));
        assert_eq!((e.major, e.minor, e.cpu, e.seq, e.pid), (254, 16, 1, 17, 812));
        assert_eq!(e.time_ns, 3_000_012_345);
        assert_eq!(e.dir(), Dir::Write);
        assert_eq!(e.pdu, None);
        let x = ev("@mt X W 0 1310720 254,16 0 5 0.5 99 2560");
        assert_eq!(x.pdu, Some(2560));
        let u = ev("@mt UT N 0 0 254,16 0 6 0.6 99 3");
        assert_eq!((u.action.as_str(), u.dir(), u.pdu), ("UT", Dir::None, Some(3)));
        assert_eq!(parse_line("CPU0 (vdb):").unwrap(), None);
        assert_eq!(parse_line("254,16   0  1  0.000 812  m   N cfq note").unwrap(), None);
        assert!(parse_line("@mt Q WS x 4096 254,16 1 17 3.0 812").is_err());
        assert!(parse_line("@mt Q WQ 1 4096 254,16 1 17 3.0 812").is_err());
        assert!(parse_line("@mt Q WS 1 4096 254,16 1 17").is_err());
    }

    #[test]
    fn blktrace_summary_dropped() {
        let s = "=== vdb ===\n  CPU  0:                 1200 events,       57 KiB data\n  \
                 CPU  1:                   30 events,        2 KiB data\n  \
                 Total:                  1230 events (dropped 0),       58 KiB data\n";
        assert_eq!(parse_dropped(s), Some(0));
        assert_eq!(parse_dropped("Total: 5 events (dropped 7), 1 KiB data"), Some(7));
        assert_eq!(parse_dropped("nothing"), None);
    }

    /// An fsync on ext4 over a write-back-cache disk without FUA, as blkparse shows it: the
    /// data write (two bios back-merged in the plug), the journal commit block (PREFLUSH|FUA,
    /// a flush sequence: pre-flush, data, post-flush, a 0-byte completion at its end), and an
    /// empty flush bio (G, a flush request, the 0-byte completion; no D of its own).
    const FSYNC: &str = "\
@mt Q WS 8192 4096 254,16 0 1 0.000001000 500
@mt G WS 8192 4096 254,16 0 2 0.000002000 500
@mt P N 0 0 254,16 0 3 0.000003000 500
@mt Q WS 8200 4096 254,16 0 4 0.000004000 500
@mt M WS 8200 4096 254,16 0 5 0.000005000 500
@mt U N 0 0 254,16 0 6 0.000006000 500 1
@mt I WS 8192 8192 254,16 0 7 0.000007000 500
@mt D WS 8192 8192 254,16 0 8 0.000008000 500
@mt C WS 8192 8192 254,16 0 9 0.000009000 0
@mt Q FWFS 1000 4096 254,16 1 1 0.000010000 300
@mt G FWFS 1000 4096 254,16 1 2 0.000011000 300
@mt D FN 0 0 254,16 1 3 0.000012000 300
@mt C FN 0 0 254,16 1 4 0.000013000 0
@mt D WS 1000 4096 254,16 1 5 0.000014000 0
@mt C WS 1000 4096 254,16 1 6 0.000015000 0
@mt D FN 0 0 254,16 1 7 0.000016000 0
@mt C FN 0 0 254,16 1 8 0.000017000 0
@mt C WS 1008 0 254,16 1 9 0.000018000 0
@mt Q FWS 0 0 254,16 0 10 0.000019000 500
@mt G FWS 0 0 254,16 0 11 0.000020000 500
@mt D FN 0 0 254,16 0 12 0.000021000 0
@mt C FN 0 0 254,16 0 13 0.000022000 0
@mt C WS 0 0 254,16 0 14 0.000023000 0
CPU0 (vdb):
";

    #[test]
    fn counts_and_flush_relations_of_an_fsync() {
        let t = parse_blkparse(FSYNC).unwrap();
        assert_eq!(t.other_lines, vec!["CPU0 (vdb):".to_string()]);
        assert_eq!(t.count("Q"), 4);
        assert_eq!(t.count_dir("Q", Dir::Write), 4);
        assert_eq!(t.count("G"), 3);
        assert_eq!(t.count("M") + t.count("F"), 1);
        assert_eq!(t.count_dir("D", Dir::Flush), 3);
        assert_eq!(t.count_dir("D", Dir::Write), 2);
        assert_eq!(t.count("C"), 7);
        assert_eq!(t.bytes_dir("D", Dir::Write), 8192 + 4096);
        assert_eq!(t.flush_only_getrqs(), 1);
        // Both the commit block and the empty flush entered the flush machinery.
        assert_eq!(t.flush_sequence_getrqs(false), 2);
        assert_eq!(t.zero_byte_write_completions(), 2);
        // C - C0 = D - R
        assert_eq!(t.count("C") - t.zero_byte_write_completions(), t.count("D") - t.count("R"));
        assert_eq!(t.unplug_depths("U"), BTreeMap::from([(1, 1)]));
        let c = t.counts();
        assert_eq!(c[&("D".to_string(), Dir::Flush)], 3);
        assert_eq!(c[&("P".to_string(), Dir::None)], 1);
    }

    #[test]
    fn requests_collect_their_bios() {
        let t = parse_blkparse(FSYNC).unwrap();
        let (rqs, unmatched) = t.requests();
        assert_eq!(unmatched, 0);
        let w: Vec<(u64, u64, u64)> = rqs
            .iter()
            .filter(|r| r.dir == Dir::Write)
            .map(|r| (r.sector, r.bytes, r.bios))
            .collect();
        assert_eq!(w, vec![(8192, 8192, 2), (1000, 4096, 1)]);
        assert_eq!(rqs[0].bio_extents, vec![(8192, 4096), (8200, 4096)]);
        assert_eq!(t.counts_by_rwbs("D"), BTreeMap::from([("FN".to_string(), 3), ("WS".to_string(), 2)]));
        assert_eq!(t.count_where("Q", |e| e.flags.fua), 1);
        assert_eq!(t.lines("C").filter(|e| e.bytes == 0).count(), 5);
        assert_eq!(rqs.iter().filter(|r| r.dir == Dir::Flush).count(), 3);
        assert!(rqs.iter().all(|r| r.completions == 1 && r.issues == 1));
    }

    #[test]
    fn front_merges_requeues_and_request_merges() {
        let text = "\
@mt Q W 100 4096 8,0 0 1 0.1 1
@mt G W 100 4096 8,0 0 2 0.2 1
@mt Q W 92 4096 8,0 0 3 0.3 1
@mt F W 92 4096 8,0 0 4 0.4 1
@mt Q W 116 4096 8,0 0 5 0.5 1
@mt G W 116 4096 8,0 0 6 0.6 1
@mt Q W 108 4096 8,0 0 7 0.7 1
@mt M W 108 4096 8,0 0 8 0.8 1
@mt M W 116 4096 8,0 0 9 0.9 1
@mt D W 92 16384 8,0 0 10 1.0 1
@mt R W 92 16384 8,0 0 11 1.1 1
@mt D W 92 16384 8,0 0 12 1.2 1
@mt C W 92 16384 8,0 0 13 1.3 1
@mt Q D 4096 1048576 8,0 1 1 2.0 2
@mt G D 4096 1048576 8,0 1 2 2.1 2
@mt Q D 6144 1048576 8,0 1 3 2.2 2
@mt D D 4096 2097152 8,0 1 4 2.3 2
@mt C D 4096 2097152 8,0 1 5 2.4 2
";
        let t = parse_blkparse(text).unwrap();
        assert_eq!(t.reissues(), 1);
        assert_eq!(t.first_issue_bytes(Dir::Write), 16384);
        assert_eq!(t.first_issue_bytes(Dir::Discard), 2 << 20);
        let (rqs, unmatched) = t.requests();
        // A discard merge fires no tracepoint: the discard's D matches no waiting request.
        assert_eq!(unmatched, 1);
        let w = &rqs[0];
        // 100 (G), 92 (front merge), 108 (back merge), then the request at 116 merged whole.
        assert_eq!((w.sector, w.bytes, w.bios, w.issues, w.requeues), (92, 16384, 4, 2, 1));
        assert_eq!(w.bio_extents, vec![(100, 4096), (92, 4096), (108, 4096), (116, 4096)]);
        assert_eq!(w.completions, 1);
        assert_eq!(t.count("C") - t.zero_byte_write_completions(), t.count("D") - t.count("R"));
    }
}
