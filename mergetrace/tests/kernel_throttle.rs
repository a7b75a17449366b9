//! Kernel tests of blk-throttle charges: what mergetrace says a cgroup was charged, checked
//! against blk-cgroup's own per-cgroup counters (cgroup v1 `blkio.throttle.io_serviced` /
//! `io_service_bytes` on this host; cgroup v2 `io.stat` wios / wbytes in the lab's guests,
//! with the limits in `io.max`), /proc/diskstats and fio. Exact equality on counts; no
//! assertion looks at a time or a rate (fio's IOPS is printed, never checked).
//!
//! charged_ios against the kernel's counter: v1 io_serviced counts every pass through the
//! throttle (bios and split remainders, before they wait); v2 io.stat counts every pass through
//! `submit_bio_noacct_nocheck` (after the throttle), which also includes the resubmitted split
//! remainders. So once the workload drained both equal bios + splits; the tests compare them in
//! the no-split arms and in the split arm (where that resubmission is what is checked).
//!
//! Needs root, BPF, a test disk (a loop device; in the lab the scratch virtio disk), cgroup v1
//! blkio or v2 io, and fio; missing any of them is a FAILURE (see `support::require_root`),
//! never a skip. Run (or in the 6.1 / 6.12 guests: `cargo xtask lab -- kernel_throttle`):
//!   cargo test --release -p mergetrace --test kernel_throttle
mod support;

use serde_json::Value;
use support::*;

const SIZE: u64 = 64 << 20;
const MIB: u64 = 1 << 20;
/// The IOPS limit of the binding arms: 3 s at 2000 IOPS is ~6000 bios, ~24 MiB < SIZE.
const WIOPS: u64 = 2000;
/// A bytes limit next to it that never binds (2000 × 4 KiB ≈ 8 MiB/s).
const WBPS: u64 = 100 * MIB;
/// Seconds of the binding arms.
const RUNTIME: &str = "3";
/// A limit fio cannot reach here: turns blk-throttle on (so it charges and counts) without
/// ever delaying a bio.
const NEVER_BINDS: u64 = 10_000_000;

/// `fio` run in `cg` with the tracer attached; diskstats and `cg`'s blk-throttle counters
/// read around it (inside the tracer's window). Returns the tracer's output, the diskstats
/// delta, fio's report, and `cg`'s blk-throttle write counts over it (ios, bytes).
fn traced_window(
    lo: &BlockDev,
    cg: &Cgroup,
    fio: Fio,
) -> (TraceOutput, DiskStats, Value, (u64, u64)) {
    let tracer = Tracer::on(lo);
    let before = lo.diskstats();
    let tb = cg.throttle_stats(lo);
    let report = fio.in_cgroup(cg).run();
    let ta = cg.throttle_stats(lo);
    let after = lo.diskstats();
    let out = tracer.stop();
    (out, after.since(&before), report, ta.write_since(&tb))
}

/// `lo` on mq-deadline with merges on, and a cgroup with a write IOPS limit that never binds
/// on it.
fn never_binding(lo: &BlockDev) -> Cgroup {
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();
    cg.set_write_iops(lo, NEVER_BINDS);
    cg
}

/// The row of `cg` on `lo`; panics with the device object when it is missing.
fn row<'a>(out: &'a TraceOutput, lo: &BlockDev, cg: &Cgroup) -> &'a Value {
    out.cgroup_row(lo, &cg.path())
        .unwrap_or_else(|| panic!("no row for cgroup {} in {}", cg.path(), out.device(lo)))
}

/// The device saw writes from nobody but `cg`: its row is the device's write total.
fn assert_only_writer(out: &TraceOutput, lo: &BlockDev, cg: &Cgroup) {
    for r in out.device(lo)["cgroups"].as_array().unwrap() {
        if r["cgroup"] != cg.path() {
            assert_eq!(u(&r["write"], "bios"), 0, "unexpected writer {r}");
            assert_eq!(u(&r["write"], "requests"), 0, "unexpected writer {r}");
        }
    }
}

/// 4 KiB sequential O_DIRECT writes, libaio, iodepth 64, batches of 32, for 3 s, in a cgroup
/// limited to 2000 write IOPS (and 100 MiB/s). The limit binds: bios wait in blk-throttle.
/// blk-throttle charges one io per bio before merging, so merging (nomerges=0) cuts the
/// requests the device sees by >8× but leaves the charges — and fio's IOPS — where they were.
// Long (~130 lines) on purpose: one window and, in order, every count it is checked on.
fn binding_iops_limit(nomerges: u32) {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(nomerges);
    udev_settle();
    let cg = Cgroup::new();
    cg.set_write_iops(&lo, WIOPS);
    cg.set_write_bps(&lo, WBPS);

    let (out, d, report, (serviced, serviced_bytes)) = traced_window(
        &lo,
        &cg,
        Fio::sequential("throttled", &lo, "write", SIZE, 32)
            .opt("time_based", "1")
            .opt("runtime", RUNTIME),
    );

    let ctx = format!("wiops {WIOPS}, nomerges={nomerges}");
    let ios = fio_total_ios(&report, "write");
    let w = &row(&out, &lo, &cg)["write"];
    eprintln!(
        "{ctx}: fio {ios} I/Os at {:.0} IOPS; io_serviced {serviced}, io_service_bytes \
         {serviced_bytes}; diskstats writes {} merged {}; mergetrace {w}",
        report["jobs"][0]["write"]["iops"]
            .as_f64()
            .unwrap_or(f64::NAN),
        d.writes,
        d.writes_merged
    );
    assert_consistent(&out, w, &ctx);
    assert_only_writer(&out, &lo, &cg);

    // The bios are fio's I/Os; blk-throttle charged each once, as its own counters say.
    assert_eq!(u(w, "bios"), ios, "bios != fio total_ios; {ctx}; {w}");
    assert_eq!(u(w, "bytes"), fio_io_bytes(&report, "write"), "{ctx}; {w}");
    assert_eq!(u(w, "splits"), 0, "{ctx}; {w}");
    assert_eq!(serviced, ios, "io_serviced delta != fio total_ios; {ctx}");
    assert_eq!(
        u(w, "charged_ios"),
        serviced,
        "charged_ios != blkio.throttle.io_serviced delta; {ctx}; {w}"
    );
    assert_eq!(
        u(w, "charged_bytes"),
        serviced_bytes,
        "charged_bytes != blkio.throttle.io_service_bytes delta; {ctx}; {w}"
    );

    // The limit bound: bios waited, and the delay is an estimate on the tracepoint tier.
    let th = &w["throttled"];
    assert!(
        u(th, "bios") > 0,
        "the 2000 IOPS limit never held a bio back in 3 s; {ctx}; {w}"
    );
    assert!(u(th, "bios") <= ios, "{ctx}; {w}");
    // The fentry tier measures the delay; the tracepoint tier cannot (null, said so).
    let tier = out.total["tier"].as_str().unwrap_or_default();
    match tier {
        "tracepoint" => {
            assert_eq!(th["delay_estimated"], true, "{ctx}; {th}");
            assert!(th["delay_ns_total"].is_null(), "{ctx}; {th}");
        }
        "fentry" => {
            assert_eq!(th["delay_estimated"], false, "{ctx}; {th}");
            assert!(
                th["delay_ns_total"].as_u64().is_some_and(|d| d > 0),
                "delay_ns_total is not a positive number; {ctx}; {th}"
            );
        }
        other => panic!("unknown tier {other:?}; {ctx}"),
    }

    // The limits in force, and the verdict that the IOPS limit counts before merging.
    let limits = &w["limits"];
    assert_eq!(limits["wiops"]["limit"], WIOPS, "{ctx}; {limits}");
    assert_eq!(
        limits["wiops"]["cgroup"],
        cg.path().as_str(),
        "{ctx}; {limits}"
    );
    assert_eq!(limits["wbps"]["limit"], WBPS, "{ctx}; {limits}");
    assert_eq!(
        limits["wbps"]["cgroup"],
        cg.path().as_str(),
        "{ctx}; {limits}"
    );
    let verdict = w["verdict"]
        .as_str()
        .unwrap_or_else(|| panic!("no verdict although the limit bound; {ctx}; {w}"));
    assert!(
        verdict.contains("counts before merging"),
        "verdict does not say the IOPS limit counts before merging: {verdict:?}; {ctx}"
    );

    // What the device saw, against diskstats.
    let t = &out.device_total(&lo)["write"];
    assert_eq!(
        u(t, "requests"),
        d.writes,
        "requests != diskstats writes; {ctx}; {t}"
    );
    assert_eq!(
        u(t, "merged"),
        d.writes_merged,
        "merged != diskstats merged; {ctx}; {t}"
    );
    assert_eq!(u(w, "requests"), d.writes, "{ctx}; {w}");
    assert_eq!(u(w, "merged"), d.writes_merged, "{ctx}; {w}");
    assert_eq!(u(t, "request_bytes") / 512, d.sectors_written, "{ctx}; {t}");
    let (bios, requests, merged) = (u(w, "bios"), u(w, "requests"), u(w, "merged"));
    match nomerges {
        2 => {
            assert_eq!(merged, 0, "nomerges=2 merged; {ctx}; {w}");
            assert_eq!(
                requests, bios,
                "nomerges=2: one request per bio; {ctx}; {w}"
            );
        }
        0 => assert!(
            requests * 8 < bios,
            "merging should cut the requests below bios/8 ({requests} requests for {bios} bios); \
             {ctx}; {w}"
        ),
        _ => unreachable!(),
    }
}

#[test]
fn binding_iops_limit_nomerges0() {
    binding_iops_limit(0);
}

#[test]
fn binding_iops_limit_nomerges2() {
    binding_iops_limit(2);
}

/// A limit far above what fio reaches: blk-throttle charges every bio (its counters move)
/// but never holds one back.
#[test]
fn limit_that_never_binds() {
    require_root();
    let lo = TestDisk::new(SIZE);
    let cg = never_binding(&lo);

    let size = 16 * MIB;
    let (out, d, report, (serviced, serviced_bytes)) =
        traced_window(&lo, &cg, Fio::sequential("free", &lo, "write", size, 32));

    let ctx = "wiops 10,000,000";
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, size / 4096, "{ctx}");
    let w = &row(&out, &lo, &cg)["write"];
    eprintln!("{ctx}: fio {ios} I/Os; io_serviced {serviced}; diskstats {d:?}; mergetrace {w}");
    assert_consistent(&out, w, ctx);
    assert_only_writer(&out, &lo, &cg);
    assert_eq!(u(w, "bios"), ios, "{ctx}; {w}");
    assert_eq!(
        u(&w["throttled"], "bios"),
        0,
        "a bio waited under a limit that never binds; {w}"
    );
    assert_eq!(serviced, ios, "{ctx}");
    assert_eq!(
        u(w, "charged_ios"),
        serviced,
        "charged_ios != io_serviced delta; {ctx}; {w}"
    );
    assert_eq!(
        u(w, "charged_bytes"),
        serviced_bytes,
        "charged_bytes != io_service_bytes; {w}"
    );
    assert_eq!(serviced_bytes, size, "{ctx}");
    assert_eq!(w["limits"]["wiops"]["limit"], NEVER_BINDS, "{ctx}; {w}");
    assert_eq!(u(w, "requests"), d.writes, "{ctx}; {w}");
    assert_eq!(u(w, "merged"), d.writes_merged, "{ctx}; {w}");
    assert_eq!(
        u(w, "requests"),
        ios / 32,
        "one request per batch of 32; {ctx}; {w}"
    );
}

/// 1 MiB O_DIRECT writes with max_sectors_kb lowered to 256: every bio is split into four
/// 256 KiB pieces, each its own request. From 6.0 blk-throttle charges each split remainder
/// one more io (but no bytes); before 6.0 it charges the bio once, before it is split (the
/// remainders carry BIO_THROTTLED). blk-cgroup's own count (io_serviced, io.stat wios) counts
/// every pass on every kernel: bios + splits, the oracle for charged_ios either way.
#[test]
fn split_bios_cost_one_io_per_piece() {
    require_root();
    let lo = TestDisk::new(SIZE);
    // Loop devices keep max_sectors_kb across losetup -d: put it back afterwards.
    let _max_sectors = lo.set_queue_attr_restored("max_sectors_kb", "256");
    let cg = never_binding(&lo);

    let size = 16 * MIB;
    let (out, d, report, (serviced, serviced_bytes)) = traced_window(
        &lo,
        &cg,
        Fio::new("split", &lo.path)
            .opt("rw", "write")
            .opt("bs", "1M")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "4")
            .opt("size", &size.to_string()),
    );

    let ctx = "1 MiB bios, max_sectors_kb 256";
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, size / MIB, "{ctx}");
    let w = &row(&out, &lo, &cg)["write"];
    eprintln!(
        "{ctx}: fio {ios} I/Os; io_serviced {serviced}, bytes {serviced_bytes}; diskstats {d:?}; \
         mergetrace {w}"
    );
    assert_consistent(&out, w, ctx);
    assert_only_writer(&out, &lo, &cg);
    let bios = u(w, "bios");
    assert_eq!(bios, ios, "bios != fio's I/Os; {ctx}; {w}");
    assert_eq!(
        u(w, "splits"),
        3 * bios,
        "each 1 MiB bio splits 3 times; {ctx}; {w}"
    );
    let splits = u(w, "splits");
    assert_eq!(
        serviced,
        bios + splits,
        "io_serviced / io.stat wios delta counts every pass, remainders included; {ctx}; {w}"
    );
    if throttle_charges_split_remainders() {
        assert_eq!(
            u(w, "charged_ios"),
            serviced,
            "6.0+: each split remainder costs 1 io, charged_ios == io_serviced delta; {ctx}; {w}"
        );
    } else {
        assert_eq!(
            u(w, "charged_ios"),
            serviced - splits,
            "before 6.0: a bio is charged once, before splitting: charged_ios == io_serviced \
             delta - splits (= bios); {ctx}; {w}"
        );
    }
    assert_eq!(
        u(w, "charged_bytes"),
        size,
        "bytes are charged once per bio; {ctx}; {w}"
    );
    assert_eq!(serviced_bytes, size, "io_service_bytes delta; {ctx}");
    assert_eq!(
        u(w, "requests"),
        d.writes,
        "requests != diskstats writes; {ctx}; {w}"
    );
    assert_eq!(
        u(w, "merged"),
        d.writes_merged,
        "merged != diskstats merged; {ctx}; {w}"
    );
    assert_eq!(
        u(w, "requests"),
        4 * bios,
        "one request per 256 KiB piece; {ctx}; {w}"
    );
    assert_eq!(u(w, "request_bytes"), size, "{ctx}; {w}");
}

/// A parent cgroup with a write IOPS limit and a child without one; fio runs in the child.
/// What must hold depends on the hierarchy, and the test checks the one it runs on.
///
/// On cgroup v1 (this host) blk-throttle's hierarchy is FLAT: `throtl_pd_init` makes every
/// group's parent queue the device's root queue unless the io controller is on the default
/// (v2) hierarchy, so a v1 parent's limit does not apply to its children. Measured here: fio
/// in the child of a parent with write_iops 3000 did 707,328 4 KiB writes in 2 s (~353,000
/// IOPS); the parent's io_serviced stayed 0. The child has no rule, so blk-throttle charges it
/// nothing — but v1's `io_serviced` counts every bio on a device where throttling is active,
/// rule or not, so it is not the charge here.
/// What must hold on v1: no bio waits, nothing is charged, and no limit is reported as in
/// force for the child (a `limits.wiops` of 3000 "set on" the parent would be wrong on v1).
///
/// On cgroup v2 (the lab's guests) io.max is hierarchical: `tg_update_has_rules` gives the
/// child `has_rules_iops` from its ancestor, so blk-throttle charges every bio of the child
/// and holds it to the parent's limit. What must hold on v2: every bio charged (charged_ios =
/// bios = the child's io.stat wios; the parent's io.stat, recursive on v2, has them too),
/// some bios waited, and the limit in force for the child is the parent's.
#[test]
fn parent_limit_flat_on_v1_inherited_on_v2() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(0);
    udev_settle();
    let parent = Cgroup::new();
    let child = parent.child();
    let v2 = parent.version() == CgroupVersion::V2;
    // v1: a limit the child would hit at once if it were inherited; v2: the binding arms'.
    let limit = if v2 { WIOPS } else { 3000 };
    parent.set_write_iops(&lo, limit);

    let tracer = Tracer::on(&lo);
    let before = lo.diskstats();
    let tb = child.throttle_stats(&lo);
    let pb = parent.throttle_stats(&lo);
    let size = 16 * MIB;
    let report = Fio::sequential("child", &lo, "write", size, 32)
        .in_cgroup(&child)
        .run();
    let ta = child.throttle_stats(&lo);
    let pa = parent.throttle_stats(&lo);
    let after = lo.diskstats();
    let out = tracer.stop();
    let d = after.since(&before);
    let (serviced, serviced_bytes) = ta.write_since(&tb);
    let parent_serviced = pa.write_since(&pb).0;

    let ctx = format!(
        "child of a parent with wiops {limit} (cgroup {})",
        if v2 { "v2" } else { "v1" }
    );
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, size / 4096, "{ctx}");
    let w = &row(&out, &lo, &child)["write"];
    eprintln!(
        "{ctx}: fio {ios} I/Os at {:.0} IOPS; child io_serviced {serviced}; parent io_serviced \
         delta {parent_serviced}; mergetrace {w}",
        report["jobs"][0]["write"]["iops"]
            .as_f64()
            .unwrap_or(f64::NAN),
    );
    assert_consistent(&out, w, &ctx);
    assert_eq!(u(w, "bios"), ios, "{ctx}; {w}");
    assert_eq!(u(w, "requests"), d.writes, "{ctx}; {w}");
    assert_eq!(u(w, "merged"), d.writes_merged, "{ctx}; {w}");
    // v1 counts the child's bios in its own io_serviced (throttling is active on the device);
    // v2's io.stat counts them in the child and, recursively, in the parent.
    assert_eq!(
        serviced, ios,
        "child io_serviced / io.stat wios delta; {ctx}"
    );
    if !v2 {
        // ... and v1 none in the parent's: the groups are flat.
        assert_eq!(parent_serviced, 0, "parent io_serviced moved; {ctx}");
        assert_eq!(u(&w["throttled"], "bios"), 0, "a bio waited; {ctx}; {w}");
        assert_eq!(
            u(w, "charged_ios"),
            0,
            "the child has no rule on v1; {ctx}; {w}"
        );
        assert_eq!(u(w, "charged_bytes"), 0, "{ctx}; {w}");
        assert!(
            w.get("limits").is_none() || w["limits"].get("wiops").is_none(),
            "mergetrace reports the parent's write_iops as in force for the child, but cgroup \
             v1 blk-throttle is flat (the parent's rule does not limit the child); {ctx}; \
             limits {}, verdict {}",
            w["limits"],
            w["verdict"]
        );
        return;
    }
    assert_eq!(
        parent_serviced, ios,
        "parent io.stat wios (recursive); {ctx}"
    );
    assert_eq!(serviced_bytes, size, "child io.stat wbytes; {ctx}");
    assert_eq!(
        u(w, "charged_ios"),
        ios,
        "v2: the child inherits the parent's rule, every bio is charged; {ctx}; {w}"
    );
    assert_eq!(u(w, "charged_bytes"), size, "{ctx}; {w}");
    assert!(
        u(&w["throttled"], "bios") > 0,
        "no bio of the child waited under the parent's wiops {limit}; {ctx}; {w}"
    );
    let limits = &w["limits"];
    assert_eq!(limits["wiops"]["limit"], limit, "{ctx}; {limits}");
    assert_eq!(
        limits["wiops"]["cgroup"],
        parent.path().as_str(),
        "the limit in force is the parent's; {ctx}; {limits}"
    );
}

/// Split bios under a binding iops limit (a regression test: the verdict used to say "the
/// device saw as many requests as bios; … submit larger bios"). max_sectors_kb 8 and 64 KiB
/// O_DIRECT writes: every bio becomes 8 requests. From 6.0, 7 of its 8 charged ios are split
/// pieces, and a larger bio would only be split further; before 6.0 the bio is charged once,
/// before it is split, so the pieces cost nothing and larger bios cost fewer ios. The verdict
/// must say what this kernel does, and name the limit.
#[test]
fn split_bios_under_a_binding_limit_get_a_split_verdict() {
    require_root();
    const LIMIT: u64 = 1000;
    let lo = TestDisk::new(SIZE);
    let _max_sectors = lo.set_queue_attr_restored("max_sectors_kb", "8");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();
    cg.set_write_iops(&lo, LIMIT);
    let size = scaled(32, 4) * MIB; // 4,096 ios (4 s) on the host, 512 in the lab
    let tracer = Tracer::on(&lo);
    let before = lo.diskstats();
    let tb = cg.throttle_stats(&lo);
    let report = Fio::new("split-limit", &lo.path)
        .opt("rw", "write")
        .opt("bs", "64k")
        .opt("direct", "1")
        .opt("ioengine", "libaio")
        .opt("iodepth", "4")
        .opt("size", &size.to_string())
        .in_cgroup(&cg)
        .run();
    let (serviced, _) = cg.throttle_stats(&lo).write_since(&tb);
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    let ctx = "64 KiB bios, max_sectors_kb 8, wiops 1000";
    let w = &row(&out, &lo, &cg)["write"];
    eprintln!("{ctx}: io_serviced {serviced}; diskstats {d:?}; mergetrace {w}");
    assert_consistent(&out, w, ctx);
    let bios = fio_total_ios(&report, "write");
    assert_eq!(u(w, "bios"), bios, "{ctx}; {w}");
    assert_eq!(u(w, "splits"), 7 * bios, "{ctx}; {w}");
    assert_eq!(u(w, "requests"), 8 * bios, "{ctx}; {w}");
    assert_eq!(u(w, "requests"), d.writes, "{ctx}; {w}");
    // blk-cgroup counts every pass (bios + split remainders) on every kernel.
    assert_eq!(serviced, 8 * bios, "io_serviced / io.stat wios; {ctx}; {w}");
    let charges_pieces = throttle_charges_split_remainders();
    let charged = if charges_pieces {
        serviced
    } else {
        serviced - u(w, "splits")
    };
    assert_eq!(
        u(w, "charged_ios"),
        charged,
        "charged_ios vs io_serviced / io.stat wios (split remainders charged: {charges_pieces}); \
         {ctx}; {w}"
    );
    assert_eq!(
        u(w, "charged_ios"),
        if charges_pieces { 8 } else { 1 } * bios,
        "{ctx}; {w}"
    );
    assert!(
        u(&w["throttled"], "bios") > 0,
        "the limit never bound; {ctx}; {w}"
    );
    let verdict = w["verdict"].as_str().unwrap_or_default();
    let (wants, never): (&[&str], &[&str]) =
        if charges_pieces {
            (
                &[
                    "bios and their split pieces",
                    "88 % of the",
                    "a larger bio is only split further",
                ],
                &["submit larger bios", "split pieces are not charged"],
            )
        } else {
            (
            &[
                "% used by bios",
                "split pieces are not charged (this kernel charges a bio once, before splitting \
                 it), so the limit counts the bios you submit — submit larger bios",
            ],
            &["bios and their split pieces", "only split further", "% of the"],
        )
        };
    for want in [
        "wiops 1000",
        "bios are split: the device saw 8.0× more requests than bios",
        "max_sectors_kb (8 KiB) caps each request",
    ]
    .iter()
    .chain(wants)
    {
        assert!(verdict.contains(want), "verdict lacks {want:?}: {verdict}");
    }
    for not in never.iter().chain(&["as many requests as bios"]) {
        assert!(!verdict.contains(not), "verdict has {not:?}: {verdict}");
    }
}

/// A bio is told as released from blk-throttle only when the dispatch work's own worker
/// submits it. The work item can sleep: with 4 request tags and a reader in another cgroup
/// keeping them taken, the worker waits for a tag, and the reader's task submits on its CPU
/// meanwhile. When the dispatch state was the CPU's alone, the reader's bios came out
/// throttled: 17,203 of 666,778 in one run of this setup on the 6.18 host.
#[test]
fn a_sleeping_dispatch_work_throttles_no_other_tasks_bios() {
    // Low enough to bind in the lab's emulated guests too, where this writer reached only
    // ~880 IOPS next to the reader (at WIOPS it never waited there).
    const SLEEPING_WORK_WIOPS: u64 = 300;
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(2);
    udev_settle();
    let _tags = lo.set_queue_attr_restored("nr_requests", "4");
    let limited = Cgroup::new();
    limited.set_write_iops(&lo, SLEEPING_WORK_WIOPS);
    let free = Cgroup::new();
    let half = SIZE / 2;
    let random = |name: &str, rw: &str, offset: u64| {
        Fio::random_for(name, &lo, rw, RUNTIME)
            .offset(offset)
            .size(half)
    };
    let tracer = Tracer::on(&lo);
    let writer = random("throttled", "randwrite", 0)
        .in_cgroup(&limited)
        .spawn();
    let reader = random("free", "randread", half)
        .opt("numjobs", "2")
        .opt("group_reporting", "1")
        .in_cgroup(&free)
        .spawn();
    let (w, r) = (writer.wait(), reader.wait());
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0, "lost events; stderr:\n{}", out.stderr);
    let read = &row(&out, &lo, &free)["read"];
    let write = &row(&out, &lo, &limited)["write"];
    eprintln!(
        "fio: {} reads, {} writes; mergetrace: reader {read}, writer {write}",
        fio_total_ios(&r, "read"),
        fio_total_ios(&w, "write")
    );
    assert_eq!(
        u(read, "bios"),
        fio_total_ios(&r, "read"),
        "the reader's bios"
    );
    assert!(
        u(&write["throttled"], "bios") > 0,
        "the limit binds: {write}"
    );
    assert_eq!(
        u(&read["throttled"], "bios"),
        0,
        "the reader has no limit: none of its bios waited ({read})"
    );
}

/// A device-mapper target's throttled bios are its own. Its blk-throttle dispatch work
/// releases the held bios of the dm device, and dm submits their clones to the disk below in
/// the same call, by the same worker: those clones did not wait (the disk below has no
/// limit). Tracing both, the dm device's writer must show waits and the disk's none, with
/// every bio counted on both (a linear target: one clone per bio), on the tracepoint tier,
/// which tells a release by the worker that submits it. Needs device-mapper (the
/// lab's guests load `dm_mod`); where the kernel has none (this host is built without it),
/// no bio can reach a disk that way, and the test asserts that instead.
#[test]
fn a_device_mapper_targets_releases_are_not_the_disk_belows() {
    require_root();
    if !DmLinear::available_or_asserted_absent() {
        return;
    }
    const LIMIT: u64 = 300;
    let disk = TestDisk::new(SIZE);
    let dm = DmLinear::over(&disk);
    udev_settle();
    let limited = Cgroup::new();
    limited.set_write_iops(&dm.dev, LIMIT);
    // The tier that tells a release by the task submitting it (fentry sees each release).
    let tracer = Tracer::start(&[
        "-d",
        disk.name.as_str(),
        "-d",
        dm.dev.name.as_str(),
        "--tier",
        "tracepoint",
    ]);
    let report = Fio::random_for("dm-throttled", &dm.dev, "randwrite", RUNTIME)
        .size(SIZE)
        .in_cgroup(&limited)
        .run();
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0, "lost events; stderr:\n{}", out.stderr);
    let writes = fio_total_ios(&report, "write");
    let above = &row(&out, &dm.dev, &limited)["write"];
    let below = &row(&out, &disk, &limited)["write"];
    eprintln!(
        "fio: {writes} writes; {} {above}\n{} {below}",
        dm.dev.name, disk.name
    );
    assert_eq!(u(above, "bios"), writes, "the dm device's bios");
    assert_eq!(
        u(below, "bios"),
        writes,
        "the disk below's bios (one clone each)"
    );
    assert!(
        u(&above["throttled"], "bios") > 0,
        "wiops {LIMIT} on the dm device binds: {above}"
    );
    assert_eq!(
        u(&below["throttled"], "bios"),
        0,
        "the disk below has no limit: no bio waited there ({below})"
    );
}
