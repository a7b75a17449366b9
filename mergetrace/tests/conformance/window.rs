//! One workload's window: prepared, measured by every oracle at once, and checked.

use std::{collections::BTreeMap, fs, time::Instant};

use serde_json::Value;

use super::*;
use crate::support::{
    blktrace::{self, Blktrace},
    workloads::{self, quiesce, Did, Kind},
    *,
};

/// The deltas and counts of one window, as the report prints them.
pub(crate) fn describe(
    kind: Kind,
    did: &Did,
    d: &DiskStats,
    out: &TraceOutput,
    disk: &BlockDev,
) -> String {
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
    let [reads, rmerged, rsectors, writes, wmerged, wsectors, discards, dmerged, dsectors, flushes] =
        counts_of(d);
    format!(
        "conformance [{}] on {} ({queue}): did {did}\n  rows: {}\n  diskstats: reads {reads} (merged \
         {rmerged}, sectors {rsectors}), writes {writes} (merged {wmerged}, sectors {wsectors}), \
         discards {discards} (merged {dmerged}, sectors {dsectors}), flushes {flushes}\n  \
         mergetrace {}\n  mergetrace {}\n  mergetrace {}\n  mergetrace {}",
        kind.name(),
        disk.name,
        rows.join("; "),
        pick("read"),
        pick("write"),
        pick("discard"),
        pick("flush")
    )
}

/// What a test requires of a count the kernel itself decides (requeues, splits) over its
/// window, besides mergetrace agreeing with the kernel on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Whatever the kernel did.
    Any,
    /// None at all (a device that never requeues).
    Zero,
    /// At least one: the workload and device were chosen to make it happen, so a window
    /// without it lost the test's point.
    Some,
}

impl Expect {
    pub(crate) fn check(self, c: &mut Checks, what: &str, n: u64) {
        match self {
            Expect::Any => {}
            Expect::Zero => c.eq(&format!("{what} == 0"), n, 0),
            Expect::Some => {
                if n == 0 {
                    c.fail(format!(
                        "{what} == 0: the window did not do what the test is about"
                    ));
                }
            }
        }
    }
}

/// What one window checks beyond the common relations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opts {
    /// Requeues (sum over the directions).
    pub(crate) requeues: Expect,
    /// Splits (sum over the directions).
    pub(crate) splits: Expect,
    /// `mergetrace record` beside the live tracer, then `report --json` against the live
    /// totals and `report --lineage --json` request by request against blktrace's requests
    /// (guests) and the live counts (everywhere).
    pub(crate) lineage: bool,
    /// Requests per hardware queue (blktrace's G events by CPU, through the queue's CPU map):
    /// more than one queue used. Lab only (blktrace).
    pub(crate) queues: bool,
}

pub(crate) const PLAIN: Opts = Opts {
    requeues: Expect::Any,
    splits: Expect::Any,
    lineage: false,
    queues: false,
};

/// What a window measured (for a test's own assertions and the log).
#[allow(dead_code)]
pub(crate) struct Measured {
    pub(crate) out: TraceOutput,
    /// The device's `total` in the tracer's total object.
    pub(crate) total: Value,
    pub(crate) d: DiskStats,
    pub(crate) did: Did,
    pub(crate) requeues: u64,
    pub(crate) splits: u64,
    /// Lineage requests, and how many of them were compared bio by bio with blktrace's.
    pub(crate) lineage: Option<(usize, usize)>,
}

/// Prepares `kind` on a fresh test disk in a fresh cgroup and checks its window (below).
pub(crate) fn conformance(kind: Kind) {
    require_root();
    let disk = TestDisk::new(workloads::FS_SIZE);
    conformance_on(&disk, kind, PLAIN);
}

/// Prepares `kind` on `disk` in a fresh cgroup, measures its window (tracer, diskstats,
/// blk-cgroup counters, blktrace in the guests; with `opts.lineage` a capture too), and
/// checks everything: the workload's claims, the device total against diskstats and the
/// identity, the cgroup rows against blk-cgroup, blktrace, and what `opts` asks for. Panics
/// with every failure at once.
// Long (~120 lines) on purpose: the window's steps (attach, snapshot, run, snapshot, stop)
// and the checks of what they measured, in the order they must happen.
pub(crate) fn conformance_on(disk: &BlockDev, kind: Kind, opts: Opts) -> Measured {
    let t0 = Instant::now();
    let cg = Cgroup::new();
    if cg.version() == CgroupVersion::V1 {
        // Turns blk-throttle on for the disk, so v1 counts every cgroup's bios; never binds.
        cg.set_write_iops(disk, 10_000_000);
    }
    let mut w = kind.prepare(disk, Some(&cg));
    let prepared = t0.elapsed();

    let t1 = Instant::now();
    let scratch = tempfile::tempdir().expect("a directory for the capture");
    let capture = scratch.path().join("window.mtr");
    let quiet = disk.diskstats();
    // With plug flushes: their depths are checked against blktrace's U and UT; with latency:
    // its counts against the requests.
    let tracer = Tracer::start(&["-d", disk.name.as_str(), "--plug-flushes", "--latency"]);
    let rec = opts
        .lineage
        .then(|| Recorder::start(disk, &capture, test_tier().as_deref()));
    let bt = in_lab().then(|| Blktrace::start(disk));
    let ios_before = cgroup_ios(disk);
    let before = disk.diskstats();
    let attached = t1.elapsed();
    let t2 = Instant::now();
    let did = w.run(Some(&cg));
    quiesce(disk);
    let after = disk.diskstats();
    let ios_after = cgroup_ios(disk);
    let window = t2.elapsed();
    let t3 = Instant::now();
    let trace = bt.map(Blktrace::stop);
    let rec_stderr = rec.map(Recorder::stop);
    let out = tracer.stop();
    let d = after.since(&before);
    let stopped = t3.elapsed();
    let closed = disk.diskstats();

    eprintln!("{}", describe(kind, &did, &d, &out, disk));
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
    let mut c = Checks::new(&format!("{} on {}", kind.name(), disk.name));
    // The tracers count from their attach to their stop; the deltas from the window's first
    // snapshot to its last. Exact only when the disk is quiet in between (something writing
    // on its own schedule breaks every relation at once: this names the cause).
    for (when, a, b) in [
        ("while the tracers attached", &quiet, &before),
        (
            "after the window, before the tracers stopped",
            &after,
            &closed,
        ),
    ] {
        let (a, b) = (counts_of(a), counts_of(b));
        if a != b {
            c.fail(format!(
                "I/O on {} {when}: diskstats counters {a:?} -> {b:?}",
                disk.name
            ));
        }
    }
    for claim in w.check_claims(&did, &d) {
        c.fail(claim);
    }
    check_device(&mut c, &out, disk, &d);
    check_cgroups(&mut c, &out, disk, &cg, &ios_before, &ios_after);
    if let Some(t) = &trace {
        check_blktrace(&mut c, &out, disk, t);
    }
    let total = out.device_total(disk);
    let sum =
        |c: &mut Checks, f: &str| -> u64 { ALL_DIRS.iter().map(|d| c.get(&total[*d], f)).sum() };
    let (requeues, splits) = (sum(&mut c, "requeues"), sum(&mut c, "splits"));
    opts.requeues.check(&mut c, "requeues", requeues);
    opts.splits.check(&mut c, "splits", splits);
    if opts.queues {
        let t = trace
            .as_ref()
            .expect("the hardware-queue check needs blktrace (the lab)");
        let used = requests_per_hw_queue(disk, t);
        eprintln!("  requests per hardware queue (default type, from blktrace G by CPU): {used:?}");
        let busy = used.values().filter(|n| **n > 0).count();
        if busy < 2 {
            c.fail(format!(
                "requests went to {busy} of {} hardware queues ({used:?}): not a multi-queue window",
                used.len()
            ));
        }
    }
    let lineage = rec_stderr.map(|_| check_capture(&mut c, &out, disk, &capture, trace.as_ref()));
    eprintln!(
        "  observed: requeues {requeues}, splits {splits}{}; prepare {:.1} s, attach {:.1} s, \
         window {:.1} s, stop {:.1} s",
        lineage.map_or(String::new(), |(n, cmp)| format!(
            ", lineage {n} requests ({cmp} compared with blktrace)"
        )),
        prepared.as_secs_f64(),
        attached.as_secs_f64(),
        window.as_secs_f64(),
        stopped.as_secs_f64()
    );
    drop(w);
    c.finish();
    Measured {
        total: out.device_total(disk).clone(),
        out,
        d,
        did,
        requeues,
        splits,
        lineage,
    }
}

/// The counters of a diskstats line (not the times, nor the in-flight level).
pub(crate) fn counts_of(d: &DiskStats) -> [u64; 10] {
    [
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
    ]
}

/// Requests per hardware queue of the default type (not poll or read queues): blktrace's G
/// events (`block_getrq`, fired in the submitting task right after blk-mq took a request from
/// the hardware queue its CPU maps to) by CPU, each CPU counted for the queue whose
/// `/sys/block/NAME/mq/N/cpu_list` has it; a queue's type from debugfs `hctxN/type`.
pub(crate) fn requests_per_hw_queue(disk: &BlockDev, t: &blktrace::Trace) -> BTreeMap<u32, u64> {
    let mut cpu_queue: BTreeMap<u32, u32> = BTreeMap::new();
    let mut used: BTreeMap<u32, u64> = BTreeMap::new();
    for e in fs::read_dir(disk.sysfs().join("mq"))
        .expect("/sys/block/NAME/mq")
        .flatten()
    {
        let Ok(n) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let ty = fs::read_to_string(format!(
            "/sys/kernel/debug/block/{}/hctx{n}/type",
            disk.name
        ))
        .unwrap_or_else(|e| panic!("cannot read the type of {}'s hctx{n}: {e}", disk.name));
        if ty.trim() != "default" {
            continue;
        }
        used.insert(n, 0);
        let cpus = fs::read_to_string(e.path().join("cpu_list")).expect("cpu_list");
        for cpu in cpus.split(',').filter_map(|c| c.trim().parse::<u32>().ok()) {
            cpu_queue.insert(cpu, n);
        }
    }
    for e in t.lines("G") {
        if let Some(q) = cpu_queue.get(&e.cpu) {
            *used.get_mut(q).unwrap() += 1;
        }
    }
    used
}

/// The hardware queues of `disk` (`/sys/block/NAME/mq/*`).
pub(crate) fn hw_queues(disk: &BlockDev) -> usize {
    fs::read_dir(disk.sysfs().join("mq"))
        .map(|d| d.flatten().count())
        .unwrap_or(0)
}
