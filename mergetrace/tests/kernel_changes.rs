//! Kernel tests of a system that changes under the tracer: a blk-throttle limit set after the
//! tracer started (every new container or pod), changed and removed while the cgroup writes,
//! and the cgroup gone before the tracer stops. What mergetrace says the cgroup was charged is
//! checked against blk-cgroup's own counters (v1 `blkio.throttle.io_serviced` on this host,
//! v2 `io.stat` in the lab's guests) and /proc/diskstats, exactly; the verdicts are checked to
//! speak of the limit in force at each time, and the whole run of the limits that held, even
//! once they and the cgroup are gone. No assertion looks at a time or a rate.
//!
//! Needs root, BPF, a test disk, cgroup v1 blkio or v2 io, and fio; missing any of them is a
//! FAILURE (see `support::require_root`), never a skip. Run (or in the guests:
//! `cargo xtask lab -- kernel_changes`):
//!   cargo test --release -p mergetrace --features mergetrace/kernel-tests --test kernel_changes
mod support;

use std::{thread, time::Duration};

use serde_json::Value;
use support::*;

const SIZE: u64 = 256 << 20;
const WIOPS: u64 = 2000;
/// How long a removed cgroup's counters stay its own in the kernel maps: short, so that the
/// runs below go on past it and the whole run must show the row the kernel side folded.
const RECLAIM_AFTER: &str = "1s";

/// Batched 4 KiB O_DIRECT writes (iodepth 64, batches of 32) for `secs` seconds in `cg`.
fn writer(lo: &BlockDev, cg: &Cgroup, secs: &str) -> Fio {
    Fio::sequential("changes", lo, "write", SIZE, 32)
        .opt("time_based", "1")
        .opt("runtime", secs)
        .in_cgroup(cg)
}

/// The interval rows of cgroup `path` with writes, in order.
fn written_intervals<'a>(out: &'a TraceOutput, lo: &BlockDev, path: &str) -> Vec<&'a Value> {
    out.interval_rows(lo, path)
        .into_iter()
        .flatten()
        .map(|r| &r["write"])
        .filter(|w| u(w, "bios") > 0 || u(w, "charged_ios") > 0)
        .collect()
}

/// Every interval in which bios of the direction waited names a limit that held them: no
/// interval says a limit is not binding, nor that none is set, while bios waited.
fn assert_waits_are_named(intervals: &[&Value], ctx: &str) {
    for w in intervals {
        if u(&w["throttled"], "bios") == 0 {
            continue;
        }
        let held = w["limits"]
            .as_object()
            .is_some_and(|l| l.values().any(|u| u["held"] == true));
        assert!(held, "{ctx}: bios waited and no limit held them: {w}");
        let verdict = w["verdict"].as_str().unwrap_or_default();
        assert!(
            !verdict.contains("not binding") && !verdict.contains("no limit is set"),
            "{ctx}: bios waited, yet the verdict says {verdict:?}"
        );
    }
}

/// The tracer starts on a disk with no blk-throttle rule anywhere; then a cgroup is created,
/// limited to 2000 write IOPS, writes, and is removed, and the tracer goes on past
/// `--reclaim-after`. The limit is charged from its first bio, exactly as blk-throttle
/// counts, the bios that waited are told, and the whole run keeps the cgroup's row, its name
/// and the limit that held it.
#[test]
fn a_limit_set_after_the_start_is_charged_from_its_first_bio() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(0);
    udev_settle();
    let tracer = Tracer::start(&[
        "-d",
        lo.name.as_str(),
        "-i",
        "1s",
        "--reclaim-after",
        RECLAIM_AFTER,
    ]);
    assert!(
        !tracer.banner().contains("blk-throttle"),
        "the banner speaks of a limit before any was set: {}",
        tracer.banner()
    );
    let before = lo.diskstats();
    let cg = Cgroup::new();
    let path = cg.path();
    cg.set_write_iops(&lo, WIOPS);
    let tb = cg.throttle_stats(&lo);
    let report = writer(&lo, &cg, "3").run();
    let (serviced, serviced_bytes) = cg.throttle_stats(&lo).write_since(&tb);
    let d = lo.diskstats().since(&before);
    drop(cg);
    // Past --reclaim-after, so that the kernel side folds the removed cgroup's counters.
    thread::sleep(Duration::from_secs(3));
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0, "{}", out.stderr);

    let ctx = format!("wiops {WIOPS} set after the start");
    let row = out.cgroup_row(&lo, &path).unwrap_or_else(|| {
        panic!(
            "{ctx}: no row for the removed cgroup {path}: {}",
            out.device(&lo)
        )
    });
    assert_eq!(
        row["gone"], true,
        "{ctx}: the row is not marked gone: {row}"
    );
    let w = &row["write"];
    eprintln!(
        "{ctx}: io_serviced {serviced}, diskstats writes {}; mergetrace {w}",
        d.writes
    );
    let ios = fio_total_ios(&report, "write");
    assert_eq!(u(w, "bios"), ios, "{ctx}: bios vs fio; {w}");
    assert_eq!(serviced, ios, "{ctx}: io_serviced vs fio");
    assert_eq!(
        u(w, "charged_ios"),
        serviced,
        "{ctx}: charged vs io_serviced; {w}"
    );
    assert_eq!(u(w, "charged_bytes"), serviced_bytes, "{ctx}: {w}");
    assert_eq!(
        u(w, "requests"),
        d.writes,
        "{ctx}: requests vs diskstats; {w}"
    );
    assert_eq!(
        u(w, "merged"),
        d.writes_merged,
        "{ctx}: merged vs diskstats; {w}"
    );
    assert!(
        u(&w["throttled"], "bios") > 0,
        "{ctx}: no bio waited under the limit: {w}"
    );

    // Each interval names the limit while bios waited, and the whole run still does, with
    // what merging can do under it, though the limit and the cgroup are gone.
    let intervals = written_intervals(&out, &lo, &path);
    assert!(!intervals.is_empty(), "{ctx}: no interval row");
    assert_waits_are_named(&intervals, &ctx);
    assert_eq!(w["limits"]["wiops"]["limit"], WIOPS, "{ctx}: {w}");
    assert_eq!(w["limits"]["wiops"]["held"], true, "{ctx}: {w}");
    let verdict = w["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.starts_with(&format!("wiops {WIOPS} (set on {path}) held it back")),
        "{ctx}: {verdict:?}"
    );
    assert!(
        verdict.contains("merging cannot raise your IOPS"),
        "{ctx}: {verdict:?}"
    );
    // Nothing of it left in (removed): it was all counted before the fold.
    if let Some(r) = out.cgroup_row(&lo, "(removed)") {
        assert_eq!(u(&r["write"], "bios"), 0, "{ctx}: {r}");
    }
}

/// On cgroup v2 a parent's limit binds its children: a parent made before the start, a child
/// made after it that writes, and the limit set on the parent mid-run. On v1 (flat) the
/// parent's limit charges the child nothing, and that is checked too.
#[test]
fn a_parents_limit_set_mid_run_charges_its_child_as_the_kernel_does() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    udev_settle();
    let parent = Cgroup::new();
    parent.enable_io_for_children();
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "-i", "1s"]);
    let child = parent.child();
    parent.set_write_iops(&lo, WIOPS);
    let tb = child.throttle_stats(&lo);
    let report = writer(&lo, &child, "2").run();
    let (serviced, _) = child.throttle_stats(&lo).write_since(&tb);
    let out = tracer.stop();
    let w = &out
        .cgroup_row(&lo, &child.path())
        .unwrap_or_else(|| panic!("no row for {}", child.path()))["write"];
    let ios = fio_total_ios(&report, "write");
    let ctx = format!("{:?}, wiops {WIOPS} on the parent", child.version());
    eprintln!("{ctx}: io_serviced {serviced}, fio {ios}; mergetrace {w}");
    match child.version() {
        CgroupVersion::V2 => {
            assert_eq!(u(w, "charged_ios"), serviced, "{ctx}: {w}");
            assert_eq!(serviced, ios, "{ctx}: io.stat wios vs fio");
            assert_eq!(w["limits"]["wiops"]["cgroup"], parent.path(), "{ctx}: {w}");
            assert!(u(&w["throttled"], "bios") > 0, "{ctx}: {w}");
        }
        CgroupVersion::V1 => {
            assert_eq!(u(w, "charged_ios"), 0, "{ctx}: v1 is flat; {w}");
            assert!(w["limits"].get("wiops").is_none(), "{ctx}: {w}");
        }
    }
}

/// The limit is set, lowered, raised and removed while the cgroup writes: each interval names
/// the limit in force at its end (or the one removed in it), in the order they were set, and
/// the whole run names every value it had.
#[test]
fn limits_changed_mid_run_are_named_at_their_time() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    udev_settle();
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "-i", "1s"]);
    let cg = Cgroup::new();
    let values = [2000u64, 1000, 4000];
    cg.set_write_iops(&lo, values[0]);
    // 2.5 s per value, then 3.5 s without a limit.
    let fio = writer(&lo, &cg, "11").spawn();
    for v in &values[1..] {
        thread::sleep(Duration::from_millis(2500));
        cg.set_write_iops(&lo, *v);
    }
    thread::sleep(Duration::from_millis(2500));
    cg.clear_write_iops(&lo);
    fio.wait();
    let out = tracer.stop();
    let ctx = "wiops 2000, 1000, 4000, then none";
    let intervals = written_intervals(&out, &lo, &cg.path());
    assert_waits_are_named(&intervals, ctx);
    // The limits named, in order: a subsequence of the values set.
    let mut named: Vec<u64> = Vec::new();
    for w in &intervals {
        if let Some(l) = w["limits"]["wiops"]["limit"].as_u64() {
            if named.last() != Some(&l) {
                named.push(l);
            }
        }
    }
    let mut rest = values.iter();
    for l in &named {
        assert!(
            rest.any(|v| v == l),
            "{ctx}: the intervals named {named:?}, not in the order set"
        );
    }
    assert!(
        named.len() >= 2,
        "{ctx}: the intervals named only {named:?}"
    );
    // The interval of the removal names the limit removed; after it the cgroup writes
    // uncharged, and no limit is named.
    let removal = intervals
        .iter()
        .position(|w| w["limits"]["wiops"]["removed"] == true)
        .unwrap_or_else(|| panic!("{ctx}: no interval names the limit removed: {intervals:?}"));
    let after = &intervals[removal + 1..];
    assert!(!after.is_empty(), "{ctx}: no interval after the removal");
    for w in after {
        assert_eq!(u(w, "charged_ios"), 0, "{ctx}: {w}");
        assert!(w["limits"].get("wiops").is_none(), "{ctx}: {w}");
    }
    // The whole run: every value, then none.
    let total = &out.cgroup_row(&lo, &cg.path()).expect("a row")["write"];
    let wiops = &total["limits"]["wiops"];
    let changes: Vec<u64> = wiops["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("{ctx}: no changes in the whole run: {wiops}"))
        .iter()
        .map(|c| u(c, "limit"))
        .collect();
    assert_eq!(changes, named, "{ctx}: {wiops}");
    assert_eq!(wiops["removed"], true, "{ctx}: {wiops}");
    let verdict = total["verdict"].as_str().unwrap_or_default();
    let shown: Vec<String> = named.iter().map(|v| v.to_string()).collect();
    assert!(
        verdict.contains(&format!("wiops {}→none", shown.join("→"))),
        "{ctx}: {verdict:?}"
    );
    assert!(verdict.contains("wiops changed: "), "{ctx}: {verdict:?}");
}

/// Waits until the tracer has said `what` on standard error (a change it found); panics with
/// its stderr after `TIMEOUT`.
fn await_said(tracer: &Tracer, what: &str) {
    const TIMEOUT: Duration = Duration::from_secs(30);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !tracer.stderr().contains(what) {
        assert!(
            std::time::Instant::now() < deadline,
            "the tracer did not say {what:?} within {TIMEOUT:?}; stderr:\n{}",
            tracer.stderr()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// The scheduler, `nomerges` and wbt changed while the tracer runs: each change is said once,
/// in the interval it was found in (its JSON `changes` and on standard error), and the
/// counts of the writes after it follow it (no merge with nomerges=2, as diskstats says).
#[test]
fn queue_and_wbt_changes_are_said_when_they_happen() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(0);
    udev_settle();
    let wbt_on = std::fs::read_to_string(lo.queue("wbt_lat_usec"))
        .is_ok_and(|t| t.trim().parse::<u64>().is_ok_and(|v| v > 0));
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "-i", "1s"]);
    let name = lo.name.clone();
    lo.set_scheduler("mq-deadline");
    await_said(
        &tracer,
        &format!("{name}: scheduler changed from none to mq-deadline"),
    );
    lo.set_nomerges(2);
    await_said(
        &tracer,
        &format!("{name}: nomerges changed from 0 to 2: no merges"),
    );
    let _wbt = wbt_on.then(|| lo.set_queue_attr_restored("wbt_lat_usec", "0"));
    if wbt_on {
        await_said(&tracer, &format!("{name}: wbt switched off"));
    }
    let cg = Cgroup::new();
    let before = lo.diskstats();
    Fio::sequential("after", &lo, "write", 16 << 20, 32)
        .in_cgroup(&cg)
        .run();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    lo.set_nomerges(0);
    let said: Vec<&str> = out
        .intervals
        .iter()
        .flat_map(|i| i["changes"].as_array().into_iter().flatten())
        .filter_map(|c| c.as_str())
        .collect();
    let expected = if wbt_on { 3 } else { 2 };
    assert_eq!(said.len(), expected, "each change once: {said:?}");
    let w = &out.cgroup_row(&lo, &cg.path()).expect("a row")["write"];
    assert_eq!(u(w, "merged"), 0, "nomerges=2 merged: {w}");
    assert_eq!(d.writes_merged, 0, "{d:?}");
    assert_eq!(u(w, "requests"), d.writes, "{w}");
    if wbt_on {
        assert!(
            w["meters"].get("wbt").is_none(),
            "wbt is off, yet metered: {w}"
        );
    }
}

/// Disks named by a pattern: those that match when the tracer starts, and one made after it
/// (traced from its first bio), each counted exactly, as diskstats says; a disk that does not
/// match is left out.
#[test]
fn a_pattern_traces_the_disks_that_match_now_and_later() {
    require_root();
    let before = LoopDevice::disposable(SIZE);
    let pattern = "loop5[0-9][0-9]";
    assert!(
        glob_match(pattern, &before.name),
        "{} does not match {pattern}",
        before.name
    );
    let tracer = Tracer::start(&["-d", pattern, "-i", "1s"]);
    let later = LoopDevice::disposable(SIZE);
    let other = LoopDevice::new(SIZE);
    let cg = Cgroup::new();
    let mut written = Vec::new();
    for lo in [&before, &later, &other] {
        let d0 = lo.diskstats();
        Fio::sequential("pattern", lo, "write", 16 << 20, 32)
            .in_cgroup(&cg)
            .run();
        written.push(lo.diskstats().since(&d0));
    }
    // Long enough for the new disk to be found (a poll of the slot it took).
    thread::sleep(Duration::from_secs(2));
    let out = tracer.stop();
    for (lo, d) in [(&before, &written[0]), (&later, &written[1])] {
        let w = &out.device_total(lo)["write"];
        assert_eq!(u(w, "requests"), d.writes, "{}: {w}", lo.name);
        assert_eq!(u(w, "merged"), d.writes_merged, "{}: {w}", lo.name);
        assert_eq!(u(w, "bios"), 4096, "{}: {w}", lo.name);
    }
    let names: Vec<&str> = out.total["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["device"].as_str())
        .collect();
    assert!(!names.contains(&other.name.as_str()), "{names:?}");
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(&format!("changed: {} (", later.name))
                && l.contains("a new disk, traced from its first bio")),
        "{}",
        out.stderr
    );
}

/// Whether `name` matches a shell pattern of the kind `-d` takes (`*`, `?`, `[0-9]`).
fn glob_match(pattern: &str, name: &str) -> bool {
    glob::Pattern::new(pattern).unwrap().matches(name)
}

/// 64 disks at once, named one by one: every disk's writes counted exactly.
#[test]
fn sixty_four_disks_at_once_are_each_counted() {
    require_root();
    let disks: Vec<LoopDevice> = (0..64).map(|_| LoopDevice::new(8 << 20)).collect();
    let mut args: Vec<String> = vec!["-i".into(), "1s".into()];
    for lo in &disks {
        args.push("-d".into());
        args.push(lo.name.clone());
    }
    let tracer = Tracer::start(&args);
    let cg = Cgroup::new();
    let mut written = Vec::new();
    for lo in &disks {
        let d0 = lo.diskstats();
        Fio::sequential("many", lo, "write", 1 << 20, 32)
            .in_cgroup(&cg)
            .run();
        written.push(lo.diskstats().since(&d0));
    }
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0);
    for (lo, d) in disks.iter().zip(&written) {
        let w = &out.device_total(lo)["write"];
        assert_eq!(u(w, "requests"), d.writes, "{}: {w}", lo.name);
        assert_eq!(u(w, "merged"), d.writes_merged, "{}: {w}", lo.name);
        assert_eq!(u(w, "bios"), 256, "{}: {w}", lo.name);
    }
}
