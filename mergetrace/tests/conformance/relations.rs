//! The relations: the device total against /proc/diskstats, the cgroup rows against
//! blk-cgroup, and (guests) everything against blktrace.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::support::{
    blktrace::{self},
    *,
};

/// The device total against /proc/diskstats, and the accounting identity per direction.
pub(crate) fn check_device(c: &mut Checks, out: &TraceOutput, disk: &BlockDev, d: &DiskStats) {
    // The one loss allowed: a request the kernel ended without running the completion
    // program (the host kernel does, 1 to 5 in 100,000); each is its device latency missing.
    let unseen = out.completion_unseen();
    c.eq(
        "lost_events == lost completion_unseen",
        out.lost_events(),
        unseen,
    );
    let t = out.device_total(disk);
    let mut device_short = 0;
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
        device_short += check_latency(c, dir, m, requests);
    }
    // The disk is quiet at the end, so a request the run saw issued and never completed
    // ended without the completion program running: found by a later issue of its tag
    // (`completion_unseen`), or, when its tag came round no more, at the run's end
    // (`unfinished_requests`).
    let unfinished = c.get(&out.total, "unfinished_requests");
    c.eq(
        "requests − latency.device.all.count, over the directions, \
         == completion_unseen + unfinished_requests",
        device_short,
        unseen + unfinished,
    );
    let g = |c: &mut Checks, dir: &str, f: &str| c.get(&t[dir], f);
    let (rr, wr, wf, dr, fr) = (
        g(c, "read", "requests"),
        g(c, "write", "requests"),
        g(c, "write", "flush_only"),
        g(c, "discard", "requests"),
        g(c, "flush", "requests"),
    );
    c.eq("diskstats reads == read.requests", d.reads, rr);
    c.eq(
        "diskstats writes == write.requests + write.flush_only",
        d.writes,
        wr + wf,
    );
    c.eq("diskstats discards == discard.requests", d.discards, dr);
    c.eq("diskstats flushes == flush.requests", d.flushes, fr);
    for (dir, merged, sectors) in [
        ("read", d.reads_merged, d.sectors_read),
        ("write", d.writes_merged, d.sectors_written),
        ("discard", d.discards_merged, d.sectors_discarded),
    ] {
        let m = g(c, dir, "merged");
        c.eq(
            &format!("diskstats {dir} merged == {dir}.merged"),
            merged,
            m,
        );
        let rb = g(c, dir, "request_bytes");
        c.eq(
            &format!("diskstats {dir} sectors * 512 == {dir}.request_bytes"),
            sectors * 512,
            rb,
        );
    }
}

/// `--latency`: every request issued in the window counted once at its issue (queue) and once
/// at its completion (device), the disk quiet on both sides; those that carried merged bios
/// are the bios-per-request histogram's buckets above 1 (flush requests carry no bio: they
/// count with the requests of one). A request whose completion the kernel ran no program for
/// has no device latency: returns how many the device stage is short, which the caller
/// matches with `completion_unseen`.
fn check_latency(c: &mut Checks, dir: &str, m: &serde_json::Value, requests: u64) -> u64 {
    let l = &m["latency"];
    if !l.is_object() {
        c.fail(format!(
            "{dir}: no latency object (the tracer runs with --latency)"
        ));
        return 0;
    }
    let several_bios = crate::support::requests_of_several_bios(m);
    let queue = c.get(&l["queue"]["all"], "count");
    c.eq(
        &format!("{dir}: latency.queue.all.count == requests"),
        queue,
        requests,
    );
    let queue_merged = c.get(&l["queue"]["merged"], "count");
    c.eq(
        &format!("{dir}: latency.queue.merged.count == requests of more than one bio"),
        queue_merged,
        several_bios,
    );
    let device = c.get(&l["device"]["all"], "count");
    let device_merged = c.get(&l["device"]["merged"], "count");
    if device > requests || device_merged > several_bios || device_merged > device {
        c.fail(format!(
            "{dir}: latency.device counts more than was issued: all {device} of {requests} \
             requests, merged {device_merged} of {several_bios}"
        ));
        return 0;
    }
    // The unseen requests are among the device stage's missing, merged or not.
    if several_bios - device_merged > requests - device {
        c.fail(format!(
            "{dir}: latency.device.merged is short by more than latency.device.all: \
             {device_merged} of {several_bios}, {device} of {requests}"
        ));
    }
    requests - device
}

/// The rows add up to the device total; each row's bios + splits is its cgroup's own count.
pub(crate) fn check_cgroups(
    c: &mut Checks,
    out: &TraceOutput,
    disk: &BlockDev,
    cg: &Cgroup,
    before: &BTreeMap<String, Ios>,
    after: &BTreeMap<String, Ios>,
) {
    let rows = out.device(disk)["cgroups"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = out.device_total(disk);
    for dir in ALL_DIRS {
        // The fields the rows must add up to the device total in.
        for f in DIR_COUNTS.into_iter().chain(["flush_only", "requeues"]) {
            let sum: u64 = rows.iter().map(|r| c.get(&r[dir], f)).sum();
            let t = c.get(&total[dir], f);
            c.eq(
                &format!("sum of the rows' {dir}.{f} == the device total"),
                sum,
                t,
            );
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
                c.eq(
                    &format!("row {path}: {dir}.bios + splits (bios without a cgroup)"),
                    bios + splits,
                    0,
                );
            }
            continue;
        }
        let (Some(a), Some(b)) = (after.get(&path), before.get(&path)) else {
            let v2_root = path == "/" && cg.version() == CgroupVersion::V2;
            if !v2_root && r["gone"] != true {
                c.fail(format!(
                    "row {path} has no blk-cgroup counters to compare with"
                ));
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
            let bytes = c.get(&r[dir], "bytes");
            c.eq(
                &format!("row {path}: {dir}.bytes == blk-cgroup's bytes"),
                bytes,
                a.bytes(dir) - b.bytes(dir),
            );
        }
    }
    for (path, a) in after {
        let b = before.get(path).copied().unwrap_or_default();
        if !seen.contains(path) && *a != b {
            c.fail(format!(
                "cgroup {path} was counted {:?} -> {a:?} on the disk but has no row",
                b
            ));
        }
    }
}

/// mergetrace against the real blktrace over the same window (support/blktrace/mod.rs says
/// where each relation comes from in the kernel).
// Long (~120 lines) on purpose: one relation per blktrace action (the module doc of
// support/blktrace), in the order the module documents them.
pub(crate) fn check_blktrace(
    c: &mut Checks,
    out: &TraceOutput,
    disk: &BlockDev,
    t: &blktrace::Trace,
) {
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
        c.eq(
            &format!("blktrace Q {dir} == {dir}.bios"),
            t.count_dir("Q", b),
            bios,
        );
        c.eq(
            &format!("blktrace X {dir} == {dir}.splits"),
            t.count_dir("X", b),
            splits,
        );
        c.eq(
            &format!("blktrace M+F {dir} == {dir}.merged - merged_by_path.discard"),
            t.count_dir("M", b) + t.count_dir("F", b),
            merged - discard_merges,
        );
        if dir != "flush" {
            c.eq(
                &format!(
                    "blktrace G {dir} == {dir}.requests + flush_only + merged_by_path.request"
                ),
                t.count_dir("G", b),
                requests + fo + rq_merges,
            );
        }
        c.eq(
            &format!("blktrace D {dir} == {dir}.requests + requeues"),
            t.count_dir("D", b),
            requests + rq,
        );
        c.eq(
            &format!("blktrace R {dir} == {dir}.requeues"),
            t.count_dir("R", b),
            rq,
        );
        if dir != "flush" {
            let rb = c.get(m, "request_bytes");
            c.eq(
                &format!("blktrace first-issue bytes {dir} == {dir}.request_bytes"),
                t.first_issue_bytes(b),
                rb,
            );
        }
    }
    let fo = c.get(&total["write"], "flush_only");
    c.eq(
        "blktrace empty PREFLUSH/FUA write G == write.flush_only",
        t.flush_only_getrqs(),
        fo,
    );
    c.eq(
        "blktrace D == sum of requests + requeues",
        t.count("D"),
        issues,
    );
    c.eq("blktrace R == sum of requeues", t.count("R"), requeues);
    let c0 = t.zero_byte_write_completions();
    c.eq(
        "blktrace C - C0 == D - R",
        t.count("C") - c0,
        t.count("D") - t.count("R"),
    );
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
            c.fail(format!(
                "blktrace {action} depths {bt:?} != unplug.{key} {json:?}"
            ));
        }
    }
    for a in ["S", "B", "A"] {
        c.eq(
            &format!("blktrace {a} (none on a blk-mq whole disk)"),
            t.count(a),
            0,
        );
    }
    let _ = B::None;
}
