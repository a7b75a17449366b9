//! Kernel integration tests of the whole pipeline: probes → ring buffer → aggregator → NDJSON,
//! checked against the kernel's own counters (/proc/diskstats deltas, blk-cgroup's per-cgroup
//! counts: v1 blkio.throttle stats or v2 io.stat) and fio's I/O counts. Exact equality on
//! counts only; nothing here looks at a time.
//!
//! Needs root, BPF, a test disk (a loop device; in the lab the scratch virtio disk), cgroup v1
//! blkio or v2 io, and fio. Missing any of them is a FAILURE (see `support::require_root`),
//! never a skip. Run on this host, or in the 6.1 / 6.12 guests (`cargo xtask lab -- kernel_pipeline`):
//!   cargo test --release -p mergetrace --test kernel_pipeline
mod support;

use serde_json::Value;
use support::*;

/// 64 MiB of 4 KiB I/Os = 16,384 bios per run (256 MiB gives the same ratios; the counts scale);
/// 16 MiB = 4,096 bios in the lab's emulated guests.
fn size() -> u64 {
    scaled(64 << 20, 16 << 20)
}
const BS: u64 = 4096;

/// The exact relations between mergetrace's direction totals and the diskstats deltas, for
/// one direction ("read"/"write"), plus mergetrace's internal consistency.
fn assert_matches_diskstats(dir: &str, m: &Value, requests: u64, merged: u64, sectors: u64) {
    let ctx = format!("{dir}: mergetrace {m} vs diskstats requests {requests}, merged {merged}, sectors {sectors}");
    // diskstats counts a flush-only write (an empty REQ_PREFLUSH write bio the flush
    // machinery completes without issuing it) as a completed write.
    assert_eq!(
        u(m, "requests") + u(m, "flush_only"),
        requests,
        "requests + flush_only != diskstats completed delta; {ctx}"
    );
    assert_eq!(
        u(m, "merged"),
        merged,
        "merged != diskstats merged delta; {ctx}"
    );
    let rq_bytes = u(m, "request_bytes");
    assert_eq!(rq_bytes % 512, 0, "request_bytes not whole sectors; {ctx}");
    assert_eq!(
        rq_bytes / 512,
        sectors,
        "request_bytes/512 != diskstats sectors delta; {ctx}"
    );
    assert_internally_consistent(m, &ctx);
}

/// Every bio (and split remainder) either became a request or merged into one; the merge
/// paths add up to `merged`; no merge from an unrecognised caller.
fn assert_internally_consistent(m: &Value, ctx: &str) {
    let (bios, splits, requests, merged) = (
        u(m, "bios"),
        u(m, "splits"),
        u(m, "requests"),
        u(m, "merged"),
    );
    assert_eq!(
        requests + merged + u(m, "flush_only"),
        bios + splits,
        "requests + merged + flush_only != bios + splits; {ctx}"
    );
    let p = &m["merged_by_path"];
    let by_path: u64 = MERGE_PATHS.iter().map(|f| u(p, f)).sum();
    assert_eq!(
        by_path, merged,
        "merged_by_path does not add up to merged; {ctx}"
    );
    assert_eq!(
        u(p, "unknown"),
        0,
        "merges from an unrecognised path; {ctx}"
    );
    assert_eq!(
        u(m, "request_bytes"),
        u(m, "bytes"),
        "request bytes != bio bytes; {ctx}"
    );
}

/// Interval objects never count more than the total (the run's tail after the last tick is
/// only in the total, so `<=`), and the total object reports no losses.
fn assert_run_sane(out: &TraceOutput, lo: &BlockDev, dir: &str) {
    assert_eq!(out.lost_events(), 0, "lost events; stderr:\n{}", out.stderr);
    let total = out.device_total(lo);
    for field in ["bios", "requests", "merged"] {
        let sum = out.interval_sum(lo, dir, field);
        assert!(
            sum <= u(&total[dir], field),
            "intervals sum to {sum} {dir} {field}, more than the total {}",
            total[dir]
        );
    }
}

/// A traced fio run: 4 KiB sequential O_DIRECT `rw` in batches of `batch` (`name` names its
/// job) on a fresh disk under scheduler `sched` and `nomerges`.
struct TracedFio {
    lo: TestDisk,
    /// fio's JSON report.
    report: Value,
    out: TraceOutput,
    /// The disk's /proc/diskstats over the run.
    d: DiskStats,
}

fn traced_fio(name: &str, rw: &str, sched: &str, nomerges: u32, batch: u32) -> TracedFio {
    require_root();
    let lo = TestDisk::new(size());
    lo.set_scheduler(sched);
    lo.set_nomerges(nomerges);
    udev_settle();

    let tracer = Tracer::on(&lo);
    let before = lo.diskstats();
    let report = Fio::sequential(name, &lo, rw, size(), batch).run();
    let after = lo.diskstats();
    let out = tracer.stop();
    let d = after.since(&before);
    TracedFio { lo, report, out, d }
}

/// fio's `ios` I/Os of 4 KiB are the bios of `x` (a direction's object): none split, none lost.
fn assert_bios_are_fios(x: &Value, ios: u64, ctx: &str) {
    assert_eq!(u(x, "bios"), ios, "bios != fio total_ios; {ctx}; {x}");
    assert_eq!(u(x, "bytes"), size(), "{ctx}; {x}");
    assert_eq!(u(x, "splits"), 0, "{ctx}; {x}");
}

/// One arm of the merging table (nomerges × submit batch): 4 KiB sequential O_DIRECT writes,
/// libaio, iodepth 64, submit/complete batches of `batch`, under `nomerges` and scheduler
/// `sched`.
fn write_arm(sched: &str, nomerges: u32, batch: u32) {
    let TracedFio { lo, report, out, d } = traced_fio("arm", "write", sched, nomerges, batch);
    let ctx = format!("{sched}, nomerges={nomerges}, batch {batch}");
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, size() / BS, "fio wrote {ios} I/Os; {ctx}");
    assert_eq!(fio_io_bytes(&report, "write"), size(), "{ctx}");
    assert_eq!(d.in_flight, 0, "{ctx}");

    assert_run_sane(&out, &lo, "write");
    let t = out.device_total(&lo);
    let w = &t["write"];
    assert_bios_are_fios(w, ios, &ctx);
    assert_matches_diskstats("write", w, d.writes, d.writes_merged, d.sectors_written);
    // No flushes or discards on either side.
    assert_eq!(
        u(&t["flush"], "requests"),
        d.flushes,
        "flush requests; {ctx}"
    );
    assert_eq!(
        u(&t["discard"], "requests"),
        d.discards,
        "discard requests; {ctx}"
    );

    // The shape: a batch of 32 under one plug becomes one 128 KiB
    // request unless nomerges=2; nomerges=1 changes nothing on the plug path; batch 1 never merges.
    let bios = u(w, "bios");
    let (requests, merged) = (u(w, "requests"), u(w, "merged"));
    eprintln!(
        "{ctx}: fio {ios} I/Os; mergetrace bios {bios} requests {requests} merged {merged} \
         sectors {}; diskstats writes {} merged {} sectors {}",
        u(w, "request_bytes") / 512,
        d.writes,
        d.writes_merged,
        d.sectors_written
    );
    match (nomerges, batch) {
        (0 | 1, 32) => {
            assert_eq!(
                requests,
                bios / 32,
                "one request per batch of 32; {ctx}; {w}"
            );
            assert_eq!(merged, bios - bios / 32, "{ctx}; {w}");
            assert_eq!(
                u(w, "request_bytes"),
                requests * 32 * BS,
                "128 KiB requests; {ctx}; {w}"
            );
            assert_eq!(
                u(&w["merged_by_path"], "plug"),
                merged,
                "all merges in the plug; {ctx}; {w}"
            );
        }
        (2, _) | (0, 1) => {
            assert_eq!(merged, 0, "no merges; {ctx}; {w}");
            assert_eq!(requests, bios, "one request per bio; {ctx}; {w}");
        }
        _ => unreachable!("no expectation for {ctx}"),
    }
}

macro_rules! write_arms {
    ($($name:ident: $sched:literal, nomerges $nm:literal, batch $batch:literal;)*) => {$(
        #[test]
        fn $name() {
            write_arm($sched, $nm, $batch);
        }
    )*};
}

write_arms! {
    write_nomerges0_batch32_mq_deadline: "mq-deadline", nomerges 0, batch 32;
    write_nomerges1_batch32_mq_deadline: "mq-deadline", nomerges 1, batch 32;
    write_nomerges2_batch32_mq_deadline: "mq-deadline", nomerges 2, batch 32;
    write_nomerges0_batch1_mq_deadline: "mq-deadline", nomerges 0, batch 1;
    write_nomerges0_batch32_none: "none", nomerges 0, batch 32;
    write_nomerges1_batch32_none: "none", nomerges 1, batch 32;
    write_nomerges2_batch32_none: "none", nomerges 2, batch 32;
    write_nomerges0_batch1_none: "none", nomerges 0, batch 1;
}

/// Sequential 4 KiB O_DIRECT reads in batches of 32: the read fields against diskstats.
/// (fio opens the device read-only, so udev's watch does not probe it afterwards.)
fn read_batched(sched: &str) {
    let TracedFio { lo, report, out, d } = traced_fio("read", "read", sched, 0, 32);
    let ctx = format!("read, {sched}, batch 32");
    let ios = fio_total_ios(&report, "read");
    assert_eq!(ios, size() / BS, "{ctx}");
    assert_eq!(fio_total_ios(&report, "write"), 0, "{ctx}");
    assert_run_sane(&out, &lo, "read");
    let t = out.device_total(&lo);
    let r = &t["read"];
    assert_bios_are_fios(r, ios, &ctx);
    eprintln!("{ctx}: fio {ios} I/Os; mergetrace {r}; diskstats {d:?}");
    assert_matches_diskstats("read", r, d.reads, d.reads_merged, d.sectors_read);
    // Nothing was written.
    assert_eq!(
        (d.writes, u(&t["write"], "bios"), u(&t["write"], "requests")),
        (0, 0, 0),
        "{ctx}"
    );
    assert_eq!(
        u(r, "requests"),
        ios / 32,
        "one request per batch of 32; {ctx}; {r}"
    );
}

#[test]
fn read_batch32_mq_deadline() {
    read_batched("mq-deadline");
}

#[test]
fn read_batch32_none() {
    read_batched("none");
}

/// Two fio processes in two cgroups (v1 blkio or v2) write to the same device at once
/// (different halves). Each cgroup's row must be exactly its own fio's I/Os, also as
/// blk-cgroup counted them (v1 `blkio.throttle.io_serviced`, v2 `io.stat` wios: no bio is
/// split here, so both are the bios), and the rows must add up to the device's diskstats
/// deltas.
#[test]
fn two_cgroups_writing_at_once_are_told_apart() {
    require_root();
    let lo = TestDisk::new(size());
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let half = size() / 2;
    let a = Cgroup::new();
    let b = Cgroup::new();
    // A limit far above what fio can do here: it never delays a bio, but it turns on
    // blk-throttle for this device, so v1's blkio.throttle.io_serviced counts the bios too
    // (v2's io.stat counts them either way) and blk-throttle charges them.
    a.set_write_iops(&lo, 10_000_000);
    b.set_write_iops(&lo, 10_000_000);

    let tracer = Tracer::on(&lo);
    let before = lo.diskstats();
    // Different batch sizes, so a mix-up between the two rows cannot cancel out.
    let fa = Fio::sequential("cg-a", &lo, "write", half, 32)
        .offset(0)
        .in_cgroup(&a)
        .spawn();
    let fb = Fio::sequential("cg-b", &lo, "write", half, 8)
        .offset(half)
        .size(half / 2)
        .in_cgroup(&b)
        .spawn();
    let (ra, rb) = (fa.wait(), fb.wait());
    let after = lo.diskstats();
    let out = tracer.stop();
    let d = after.since(&before);

    let (ios_a, ios_b) = (fio_total_ios(&ra, "write"), fio_total_ios(&rb, "write"));
    assert_eq!((ios_a, ios_b), (half / BS, half / 2 / BS), "fio I/O counts");
    assert_run_sane(&out, &lo, "write");

    let rows: Vec<&Value> = out.device(&lo)["cgroups"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let row = |cg: &Cgroup| {
        out.cgroup_row(&lo, &cg.path())
            .unwrap_or_else(|| panic!("no row for cgroup {} in {}", cg.path(), out.device(&lo)))
    };
    let (wa, wb) = (&row(&a)["write"], &row(&b)["write"]);
    eprintln!(
        "cgroup A {}: {wa}\ncgroup B {}: {wb}\ndiskstats delta {d:?}",
        a.path(),
        b.path()
    );
    // Each row: its own fio's bios and bytes; blk-cgroup's own per-cgroup count of the same
    // bios and mergetrace's view of those charges; and its fio's shape, one request per
    // submit batch (32 for A, 8 for B).
    for (name, cg, w, ios, bytes, batch) in [
        ("A", &a, wa, ios_a, half, 32),
        ("B", &b, wb, ios_b, half / 2, 8),
    ] {
        assert_eq!(
            u(w, "bios"),
            ios,
            "cgroup {name} bios != its fio's total_ios; {w}"
        );
        assert_eq!(u(w, "bytes"), bytes, "{w}");
        assert_internally_consistent(w, &format!("cgroup {name}"));
        assert_eq!(
            cg.io_serviced(&lo).write,
            ios,
            "cgroup {name} blkio.throttle.io_serviced"
        );
        assert_eq!(
            cg.io_service_bytes(&lo).write,
            bytes,
            "cgroup {name} blkio.throttle.io_service_bytes"
        );
        assert_eq!(
            u(w, "charged_ios"),
            ios,
            "{} charged_ios vs io_serviced; {w}",
            cg.path()
        );
        assert_eq!(
            u(w, "charged_bytes"),
            bytes,
            "{} charged_bytes vs io_service_bytes; {w}",
            cg.path()
        );
        assert_eq!(
            u(&w["throttled"], "bios"),
            0,
            "{}: the limit never binds; {w}",
            cg.path()
        );
        assert_eq!(
            u(w, "requests"),
            ios / batch,
            "cgroup {name}: one request per batch of {batch}; {w}"
        );
    }
    // Nobody else wrote to the device.
    for r in &rows {
        if r["cgroup"] != a.path() && r["cgroup"] != b.path() {
            assert_eq!(u(&r["write"], "bios"), 0, "unexpected writer {r}");
            assert_eq!(u(&r["write"], "requests"), 0, "unexpected writer {r}");
        }
    }
    // The two rows add up to the device, and the device to diskstats.
    let sum = |f: &str| u(wa, f) + u(wb, f);
    assert_eq!(
        sum("requests"),
        d.writes,
        "A + B requests != diskstats writes; {wa} {wb} {d:?}"
    );
    assert_eq!(
        sum("merged"),
        d.writes_merged,
        "A + B merged != diskstats merged; {wa} {wb} {d:?}"
    );
    assert_eq!(
        sum("request_bytes") / 512,
        d.sectors_written,
        "A + B sectors; {wa} {wb} {d:?}"
    );
    let w = &out.device_total(&lo)["write"];
    assert_matches_diskstats("write", w, d.writes, d.writes_merged, d.sectors_written);
    assert_eq!(u(w, "bios"), ios_a + ios_b, "{w}");
}

/// fsync after every 4 KiB write (fio psync, `--fsync=1`; a regression test: requests fell
/// short of diskstats by the flush-only writes, 768 vs 1,535, BIOS/REQ read 2.0 with nothing
/// merged, and the flush requests landed in an undocumented "(none)" row). Each fsync sends an
/// empty REQ_PREFLUSH write bio: counted in `bios` and `flush_only`, completed by the flush
/// machinery without a write request; the flush request it makes is the cgroup's.
#[test]
fn fsync_per_write_counts_flush_only_writes_and_flushes() {
    require_root();
    let lo = TestDisk::new(size());
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    assert_eq!(
        lo.queue_attr("write_cache"),
        "write back",
        "the test disk must have a volatile write cache for fsync to send flushes"
    );
    let cg = Cgroup::new();
    let writes = scaled(768, 128);
    let tracer = Tracer::on(&lo);
    let before = lo.diskstats();
    let report = Fio::new("fsync", &lo.path)
        .opt("rw", "write")
        .opt("bs", "4k")
        .opt("ioengine", "psync")
        .opt("fsync", "1")
        .opt("size", &(writes * BS).to_string())
        .in_cgroup(&cg)
        .run();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    let ctx = format!("{writes} writes, fsync after each");
    assert_eq!(fio_total_ios(&report, "write"), writes, "{ctx}");
    assert_run_sane(&out, &lo, "write");
    let t = out.device_total(&lo);
    let (w, f) = (&t["write"], &t["flush"]);
    eprintln!("{ctx}: diskstats {d:?}\nwrite {w}\nflush {f}");
    assert_matches_diskstats("write", w, d.writes, d.writes_merged, d.sectors_written);
    assert!(u(w, "flush_only") > 0, "no flush-only writes; {ctx}; {w}");
    assert_eq!(
        u(w, "requests"),
        writes,
        "one request per data write; {ctx}; {w}"
    );
    assert_eq!(u(w, "bios"), writes + u(w, "flush_only"), "{ctx}; {w}");
    assert_eq!(u(f, "requests"), d.flushes, "flush requests; {ctx}; {f}");
    assert!(d.flushes > 0, "{ctx}");
    // The compression ratio leaves flush-only writes out: one bio per request, not two.
    assert_eq!(u(w, "merged"), 0, "{ctx}; {w}");
    // The cgroup's fsyncs are its own: its rows hold the flush-only writes and the flushes.
    let row = out
        .cgroup_row(&lo, &cg.path())
        .unwrap_or_else(|| panic!("no row for {}; {}", cg.path(), out.device(&lo)));
    assert_eq!(
        u(&row["write"], "flush_only"),
        u(w, "flush_only"),
        "{ctx}; {row}"
    );
    assert_eq!(u(&row["flush"], "requests"), d.flushes, "{ctx}; {row}");
    assert!(
        out.cgroup_row(&lo, "(none)").is_none(),
        "flush requests in a (none) row; {}",
        out.device(&lo)
    );
}

/// `--latency` when the kernel ends a request without running the completion program (on
/// 6.18 it now and then does, for completions in the block softirq; ftrace's own event still
/// records them): the request's tag, issued again, still holds it, and it is counted as lost
/// `completion_unseen`, never silent. The testing knob stands in for the kernel: the program
/// ignores the completions at one sector. Three such requests, each followed by more writes
/// than the disk has tags and requests (each pinned to one CPU, so its tags come round), with
/// and without a scheduler: exactly three unseen, the device latency three short of the
/// requests, and everything else exact against /proc/diskstats. A fourth, the run's last
/// request, has no later issue of its tag to find it: it is the one unfinished request the
/// run's end counts, the disk being quiet, and the device latency is four short.
#[test]
fn completions_the_programs_never_saw_are_counted_lost() {
    require_root();
    let lo = TestDisk::new(size());
    for sched in ["none", "mq-deadline"] {
        lo.set_scheduler(sched);
        lo.set_nomerges(2);
        udev_settle();
        let tracer =
            Tracer::start_with_env(&["-d", lo.name.as_str(), "--latency"], &[SKIP_COMPLETIONS]);
        let before = lo.diskstats();
        unseen_completions(&lo);
        unseen_completion(&lo);
        let d = lo.diskstats().since(&before);
        let out = tracer.stop();
        let w = &out.device_total(&lo)["write"];
        let ctx = format!("scheduler {sched}: {w}\ndiskstats delta {d:?}");
        assert_eq!(
            out.total["lost_by_kind"]["completion_unseen"].as_u64(),
            Some(3),
            "{ctx}\n{}",
            out.total
        );
        assert_eq!(out.lost_events(), 3, "nothing else lost; {ctx}");
        assert_eq!(out.unfinished_requests(), 1, "{ctx}\n{}", out.total);
        assert_eq!(d.writes, 3 * 601 + 1, "{ctx}");
        assert_eq!(u(w, "requests"), d.writes, "{ctx}");
        let count = |stage: &str| u(&w["latency"][stage]["all"], "count");
        assert_eq!(count("queue"), d.writes, "{ctx}");
        assert_eq!(count("device"), d.writes - 4, "{ctx}");
    }
    lo.set_nomerges(0);
}

/// `--latency` on a device-mapper target and the disk below it, traced together (an LVM
/// volume's stack): the target is bio-based, so its bios are counted as they pass and it has
/// no requests; the disk below has every request and its latency. The target is traced first,
/// so the disk below has the second slot of the issue entries; the run's last request, whose
/// completion the program does not see (the testing knob), is the one unfinished request the
/// run's end finds there, and the disk's device latency is one short of /proc/diskstats.
/// Needs device-mapper (the lab's guests load `dm_mod`); this host's kernel has none, and the
/// test asserts that instead.
#[test]
fn latency_on_a_device_mapper_stack_counts_the_disk_belows_requests() {
    require_root();
    if !DmLinear::available_or_asserted_absent() {
        return;
    }
    let disk = TestDisk::new(size());
    disk.set_scheduler("none");
    disk.set_nomerges(2);
    let dm = DmLinear::over(&disk);
    udev_settle();
    let tracer = Tracer::start_with_env(
        &[
            "-d",
            dm.dev.name.as_str(),
            "-d",
            disk.name.as_str(),
            "--latency",
        ],
        &[SKIP_COMPLETIONS],
    );
    let (above0, below0) = (dm.dev.diskstats(), disk.diskstats());
    run_workload(
        &dm.dev,
        None,
        &["--ios", "600", "--batch", "1", "--offset", "1048576"],
    );
    unseen_completion(&dm.dev);
    let (above, below) = (
        dm.dev.diskstats().since(&above0),
        disk.diskstats().since(&below0),
    );
    let out = tracer.stop();
    let (a, b) = (
        &out.device_total(&dm.dev)["write"],
        &out.device_total(&disk)["write"],
    );
    let ctx = format!(
        "{} (dm) {a}\n{} (below) {b}\ndiskstats: dm {above:?}, below {below:?}\n{}",
        dm.dev.name, disk.name, out.total
    );
    let count = |w: &Value, stage: &str| u(&w["latency"][stage]["all"], "count");
    eprintln!(
        "dm: diskstats {} writes, bios {}, requests {}; below: diskstats {} writes, requests {}, \
         latency queue {} device {}; unfinished {}",
        above.writes,
        u(a, "bios"),
        u(a, "requests"),
        below.writes,
        u(b, "requests"),
        count(b, "queue"),
        count(b, "device"),
        out.unfinished_requests()
    );
    assert_eq!(out.lost_events(), 0, "{ctx}");
    assert_eq!(out.unfinished_requests(), 1, "{ctx}");
    assert_eq!(below.writes, 601, "{ctx}");
    assert_eq!(above.writes, 601, "{ctx}");
    assert_eq!(u(a, "bios"), above.writes, "{ctx}");
    assert_eq!(
        u(a, "requests"),
        0,
        "a bio-based target has no requests; {ctx}"
    );
    assert_matches_diskstats(
        "write",
        b,
        below.writes,
        below.writes_merged,
        below.sectors_written,
    );
    assert_eq!(count(b, "queue"), below.writes, "{ctx}");
    assert_eq!(count(b, "device"), below.writes - 1, "{ctx}");
    assert_eq!(
        count(a, "device"),
        0,
        "no requests, no device latency above; {ctx}"
    );
    disk.set_nomerges(0);
}

/// `--latency`: a cgroup whose writes merge (32 bios a request) and one whose reads go one at a
/// time. Every request is counted once in each stage, in its own cgroup's row, as a request
/// that carried merged bios or one of a single bio; the rows add up to /proc/diskstats.
#[test]
fn latency_per_cgroup_tells_merged_requests_from_single_ones() {
    require_root();
    let lo = TestDisk::new(size());
    lo.set_scheduler("none");
    lo.set_nomerges(0);
    udev_settle();
    let (writer, reader) = (Cgroup::new(), Cgroup::new());
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "--latency"]);
    let before = lo.diskstats();
    run_workload(&lo, Some(&writer), &["--ios", "2048", "--batch", "32"]);
    run_workload(
        &lo,
        Some(&reader),
        &["--op", "read", "--ios", "500", "--batch", "1"],
    );
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0);
    let row = |cg: &Cgroup, dir: &str| -> Value {
        out.cgroup_row(&lo, &cg.path())
            .unwrap_or_else(|| panic!("no row for {} in {}", cg.path(), out.device(&lo)))[dir]
            .clone()
    };
    let (w, r) = (row(&writer, "write"), row(&reader, "read"));
    eprintln!("writer: {w}\nreader: {r}\ndiskstats delta {d:?}");
    let count = |m: &Value, stage: &str, class: &str| u(&m["latency"][stage][class], "count");
    for stage in ["queue", "device"] {
        // The writer's requests each carried merged bios; the reader's each one bio.
        assert_eq!(
            count(&w, stage, "merged"),
            u(&w, "requests"),
            "writer {stage}"
        );
        assert_eq!(count(&w, stage, "single"), 0, "writer {stage}");
        assert_eq!(
            count(&r, stage, "single"),
            u(&r, "requests"),
            "reader {stage}"
        );
        assert_eq!(count(&r, stage, "merged"), 0, "reader {stage}");
        assert_eq!(
            count(&w, stage, "all"),
            d.writes,
            "writer {stage} vs diskstats"
        );
        assert_eq!(
            count(&r, stage, "all"),
            d.reads,
            "reader {stage} vs diskstats"
        );
        for m in [&w, &r] {
            assert!(
                m["latency"][stage]["all"]["p99_us"].is_number(),
                "a p99 where requests were counted: {m}"
            );
        }
    }
    assert_eq!(d.reads, 500, "one request per read");
    assert_eq!(
        u(&w, "merged"),
        d.writes_merged,
        "writer merges vs diskstats"
    );
}

/// `--hooks-only`, the benchmark's floor (what the hooks cost with programs that do nothing):
/// every program of a counting run is attached and runs, and returns at its first check.
/// With `--stats`, the kernel's run counts of `block_getrq` and `block_rq_issue` cover the
/// disk's requests while its counts stay 0; the same run without the flag counts them all.
#[test]
fn hooks_only_runs_the_programs_and_counts_nothing() {
    require_root();
    let lo = TestDisk::new(size());
    for hooks_only in [true, false] {
        let mut args = vec!["-d", lo.name.as_str(), "--stats"];
        if hooks_only {
            args.push("--hooks-only");
        }
        let tracer = Tracer::start(&args);
        let before = lo.diskstats();
        run_workload(&lo, None, &["--ios", "2048", "--batch", "32"]);
        let d = lo.diskstats().since(&before);
        let out = tracer.stop();
        let w = &out.device_total(&lo)["write"];
        let ctx = format!("--hooks-only {hooks_only}: {w}\ndiskstats delta {d:?}");
        assert!(d.writes > 0, "{ctx}");
        // A program's name is its build's (`is_build_of`); the runs are on every device.
        let runs = |program: &str| -> u64 {
            out.total["program_stats"]
                .as_array()
                .unwrap_or_else(|| panic!("no program_stats; {ctx}\n{}", out.total))
                .iter()
                .filter(|p| {
                    p["program"]
                        .as_str()
                        .is_some_and(|n| is_build_of(n, program))
                })
                .map(|p| u(p, "runs"))
                .sum()
        };
        assert!(runs("block_getrq") >= d.writes, "{ctx}\n{}", out.total);
        assert!(runs("block_rq_issue") >= d.writes, "{ctx}\n{}", out.total);
        let (bios, requests) = if hooks_only { (0, 0) } else { (2048, d.writes) };
        assert_eq!(u(w, "bios"), bios, "{ctx}");
        assert_eq!(u(w, "requests"), requests, "{ctx}");
        assert_eq!(out.lost_events(), 0, "{ctx}");
    }
}
