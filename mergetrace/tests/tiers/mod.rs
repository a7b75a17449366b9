//! The harness of kernel_tiers: whether fentry attaches here, both tiers tracing one window,
//! and the checks that they agree with each other and with /proc/diskstats.

use std::process::Command;

use serde_json::Value;

use crate::support::*;

pub(crate) const BS: u64 = 4096;
pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const DIRS: [&str; 4] = ["read", "write", "discard", "flush"];
/// What the tiers do on this machine.
pub(crate) enum Tiers {
    /// fentry attaches: compare the tiers.
    Both,
    /// fentry is refused here (checked: auto falls back and says so; forcing it fails).
    TracepointOnly,
}

/// Whether fentry can attach here. In the lab it must (the guests allow it); elsewhere, if it
/// cannot, this asserts that mergetrace says so clearly, in both the auto and forced cases.
pub(crate) fn tiers(dev: &BlockDev) -> Tiers {
    if in_lab() {
        return Tiers::Both;
    }
    let bin = mergetrace_bin();
    let forced = Command::new(bin)
        .args([
            "-d",
            &dev.name,
            "--json",
            "--duration",
            "1s",
            "--tier",
            "fentry",
        ])
        .output()
        .expect("cannot run mergetrace");
    if forced.status.success() {
        return Tiers::Both;
    }
    let err = String::from_utf8_lossy(&forced.stderr);
    assert!(
        forced.stdout.is_empty(),
        "--tier fentry failed but printed on stdout: {}",
        String::from_utf8_lossy(&forced.stdout)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "a refused --tier fentry must be one line: {err}"
    );
    assert!(
        err.starts_with("mergetrace: error: the fentry tier was forced with --tier fentry: ")
            && (err.contains("Operation not permitted") || err.contains("Permission denied")),
        "--tier fentry refused without a clear error: {err}"
    );
    let auto = Tracer::on_tier(dev, "auto");
    let banner = auto.banner();
    let out = auto.stop();
    assert!(
        banner.ends_with("on the tracepoint tier (fentry refused)"),
        "auto where fentry is refused: {banner:?}"
    );
    assert_eq!(out.total["tier"], "tracepoint", "{}", out.total);
    Tiers::TracepointOnly
}

/// Starts one tracer per tier on `dev` (tracepoint first); `None` where fentry is refused.
pub(crate) fn both_tracers(dev: &BlockDev) -> Option<(Tracer, Tracer)> {
    match tiers(dev) {
        Tiers::TracepointOnly => None,
        Tiers::Both => {
            let tp = Tracer::on_tier(dev, "tracepoint");
            let fe = Tracer::on_tier(dev, "fentry");
            assert!(
                tp.banner()
                    .ends_with("on the tracepoint tier (chosen with --tier tracepoint)"),
                "{}",
                tp.banner()
            );
            assert!(
                fe.banner()
                    .ends_with("on the fentry tier (chosen with --tier fentry)"),
                "{}",
                fe.banner()
            );
            Some((tp, fe))
        }
    }
}

/// Every count the tiers share, equal in one direction object.
pub(crate) fn assert_dir_agrees(tp: &Value, fe: &Value, ctx: &str) {
    let shared = ["flush_only", "requeues", "charged_ios", "charged_bytes"];
    for f in DIR_COUNTS.into_iter().chain(shared) {
        assert_eq!(
            u(tp, f),
            u(fe, f),
            "{f}: tracepoint tier {tp} vs fentry tier {fe}; {ctx}"
        );
    }
    for p in MERGE_PATHS {
        assert_eq!(
            path_count(tp, p),
            path_count(fe, p),
            "merged_by_path.{p}: tracepoint tier {tp} vs fentry tier {fe}; {ctx}"
        );
    }
    assert_eq!(
        u(&tp["throttled"], "bios"),
        u(&fe["throttled"], "bios"),
        "throttled.bios: tracepoint tier {tp} vs fentry tier {fe}; {ctx}"
    );
    // What only one tier has: merge attempts and measured delays on fentry (merge_attempts
    // only in directions with activity: an idle direction has no counters at all).
    assert!(tp.get("merge_attempts").is_none(), "{ctx}; {tp}");
    if !is_idle(fe) {
        assert!(fe["merge_attempts"].is_object(), "{ctx}; {fe}");
    }
    if u(&fe["throttled"], "bios") > 0 {
        assert_eq!(tp["throttled"]["delay_estimated"], true, "{ctx}; {tp}");
        assert!(tp["throttled"]["delay_ns_total"].is_null(), "{ctx}; {tp}");
        assert_eq!(fe["throttled"]["delay_estimated"], false, "{ctx}; {fe}");
        assert!(fe["throttled"]["delay_ns_total"].is_u64(), "{ctx}; {fe}");
    }
}

/// The two tiers' totals agree: per device and per cgroup row, every direction (reads only in
/// the lab: on the host udev may probe a loop device while one tracer is still attached).
pub(crate) fn assert_tiers_agree(tp: &TraceOutput, fe: &TraceOutput, dev: &BlockDev, ctx: &str) {
    assert_eq!(tp.lost_events(), 0, "tracepoint tier lost events; {ctx}");
    assert_eq!(fe.lost_events(), 0, "fentry tier lost events; {ctx}");
    assert_eq!(tp.total["tier"], "tracepoint", "{ctx}");
    assert_eq!(fe.total["tier"], "fentry", "{ctx}");
    let dirs: Vec<&str> = DIRS
        .into_iter()
        .filter(|d| *d != "read" || in_lab())
        .collect();
    for d in &dirs {
        assert_dir_agrees(
            &tp.device_total(dev)[d],
            &fe.device_total(dev)[d],
            &format!("{ctx}, device total, {d}"),
        );
    }
    let rows = |o: &TraceOutput| -> Vec<String> {
        o.device(dev)["cgroups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| dirs.iter().any(|d| !is_idle(&r[d])))
            .map(|r| r["cgroup"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(rows(tp), rows(fe), "the tiers saw different cgroups; {ctx}");
    for cg in rows(tp) {
        for d in &dirs {
            assert_dir_agrees(
                &tp.cgroup_row(dev, &cg).unwrap()[d],
                &fe.cgroup_row(dev, &cg).unwrap()[d],
                &format!("{ctx}, cgroup {cg}, {d}"),
            );
        }
    }
}

pub(crate) fn is_idle(d: &Value) -> bool {
    u(d, "bios") == 0 && u(d, "requests") == 0 && u(d, "merged") == 0
}

/// The fentry relations P1, P2, E1, E2 (module docs) on one write direction object.
pub(crate) fn assert_attempts_consistent(m: &Value, sched: &str, nomerges: u32, ctx: &str) {
    let a = &m["merge_attempts"];
    let (attempts, merged) = (u(a, "plug_attempts"), u(a, "plug_merged"));
    let (no, front, back, discard) = (
        u(a, "elevator_no_merge"),
        u(a, "elevator_front"),
        u(a, "elevator_back"),
        u(a, "elevator_discard"),
    );
    eprintln!(
        "{ctx}: merge_attempts {a}; merged_by_path {}; bios {}",
        m["merged_by_path"], m["bios"]
    );
    // P1
    assert_eq!(
        merged,
        path_count(m, "plug"),
        "P1: plug_merged != merged_by_path.plug; {ctx}; {m}"
    );
    // P2
    assert!(
        merged <= attempts,
        "P2: more plug merges than attempts; {ctx}; {a}"
    );
    // 5.10's blk_mq_submit_bio calls blk_attempt_plug_merge for every piece of a split bio
    // (the REQ_NOMERGE piece is refused inside, by blk_rq_merge_ok); later kernels check
    // bio_mergeable first (blk_mq_attempt_bio_merge), so there it is once per bio. Measured
    // on 5.10: 1,056 attempts for 1,032 bios with 24 splits; 6.1 and 6.12: = bios.
    let pieces_attempt = kernel_version() < (5, 16);
    let expected_attempts = match (nomerges, pieces_attempt) {
        (2, _) => 0,
        (_, false) => u(m, "bios"),
        (_, true) => u(m, "bios") + u(m, "splits"),
    };
    assert_eq!(
        attempts,
        expected_attempts,
        "P2: plug_attempts != {} (nomerges={nomerges}); {ctx}; {m}",
        match (nomerges, pieces_attempt) {
            (2, _) => "0",
            (_, false) => "bios",
            (_, true) => "bios + splits (before 5.16 every split piece attempts)",
        }
    );
    // E1
    let decisions = no + front + back + discard;
    match sched {
        // (Before 5.16 the split pieces' plug attempts go no further: the REQ_NOMERGE piece
        // makes no elv_merge decision. Measured on 5.10: 40 decisions for 64 failed attempts,
        // 24 of them split pieces.)
        "mq-deadline" | "bfq" => assert_eq!(
            decisions,
            attempts - merged - if pieces_attempt { u(m, "splits") } else { 0 },
            "E1: elv_merge decisions != failed plug attempts of mergeable bios; {ctx}; {a}"
        ),
        "none" | "kyber" => assert_eq!(
            decisions, 0,
            "E1: elv_merge without an elevator; {ctx}; {a}"
        ),
        other => panic!("no expectation for scheduler {other}"),
    }
    // E2
    assert!(
        path_count(m, "elevator_back") <= back,
        "E2: more elevator back merges than ELEVATOR_BACK_MERGE decisions; {ctx}; {m}"
    );
    assert!(
        path_count(m, "elevator_front") <= front,
        "E2: more elevator front merges than ELEVATOR_FRONT_MERGE decisions; {ctx}; {m}"
    );
    assert_eq!(discard, 0, "E2: a discard decision for writes; {ctx}; {a}");
}

/// The device's write totals against the diskstats delta (the anchor both tiers share).
pub(crate) fn assert_writes_match(m: &Value, d: &DiskStats, ctx: &str) {
    assert_eq!(
        u(m, "requests") + u(m, "flush_only"),
        d.writes,
        "requests + flush_only != diskstats writes; {ctx}; {m}"
    );
    assert_eq!(
        u(m, "merged"),
        d.writes_merged,
        "merged != diskstats merges; {ctx}; {m}"
    );
    assert_eq!(
        u(m, "request_bytes") / 512,
        d.sectors_written,
        "sectors != diskstats; {ctx}; {m}"
    );
    assert_identity(m, ctx);
}

/// Runs `work` on `disk` traced by both tiers at once; checks that they agree and returns
/// (tracepoint output, fentry output, diskstats delta, work's result). `None` where fentry is
/// refused (after `tiers` checked the refusal).
pub(crate) fn traced_by_both<T>(
    disk: &BlockDev,
    work: impl FnOnce() -> T,
    ctx: &str,
) -> Option<(TraceOutput, TraceOutput, DiskStats, T)> {
    let (tp, fe) = both_tracers(disk)?;
    let before = disk.diskstats();
    let r = work();
    let after = disk.diskstats();
    let (tp, fe) = (tp.stop(), fe.stop());
    assert_tiers_agree(&tp, &fe, disk, ctx);
    Some((tp, fe, after.since(&before), r))
}

/// fio 4 KiB sequential O_DIRECT writes, libaio.
pub(crate) fn fio_writes(disk: &BlockDev, name: &str, size: u64, iodepth: u32, batch: u32) -> Fio {
    Fio::sequential(name, disk, "write", size, batch).opt("iodepth", &iodepth.to_string())
}
