//! Kernel tests of the verdict over time: which blk-throttle limit held a cgroup back, judged
//! from what waited and when, on real runs that each told the wrong story before — a limit
//! averaged away by idle time, two limits each binding in its own phase, a large bio charged
//! when it is released, reads held back by the write limit. The tracer runs with 500 ms
//! intervals; the verdict's numbers (bios waited, intervals held) are checked against the
//! JSON, the intervals the tracer printed and blk-cgroup's own counters
//! (`blkio.throttle.io_serviced` on this host, `io.stat` in the guests). No assertion looks at
//! a time or a rate the kernel did not count.
//!
//! Needs root, BPF, a test disk, cgroup v1 blkio or v2 io, and fio; missing any of them is a
//! FAILURE, never a skip. Run: `cargo xtask test --test kernel_verdict` (in a guest:
//! `./mt lab --kernel 6.12 --test kernel_verdict`).
mod support;

use std::{thread, time::Duration};

use serde_json::Value;
use support::*;

const SIZE: u64 = 64 << 20;
const MIB: u64 = 1 << 20;
/// The tracer's interval.
const INTERVAL: &str = "500ms";
/// Longer than an interval: the tracer sees the cgroup idle before and after its I/O.
const IDLE: Duration = Duration::from_millis(1200);

/// A tracer with 500 ms intervals on `lo`.
fn tracer(lo: &BlockDev) -> Tracer {
    Tracer::start(&["-d", lo.name.as_str(), "-i", INTERVAL])
}

/// What the verdict says waited, from the direction object's own counts:
/// "584 of the 6,000 bios waited", "all 64 bios waited", "its one bio waited".
fn waited_words(dir: &Value) -> String {
    let (waited, bios) = (u(&dir["throttled"], "bios"), u(dir, "bios"));
    if waited == 1 && bios == 1 {
        "its one bio waited".to_string()
    } else if waited == bios {
        format!("all {} bios waited", thousands(bios))
    } else {
        format!(
            "{} of the {} bios waited",
            thousands(waited),
            thousands(bios)
        )
    }
}

/// The direction's verdict says what waited, with the JSON's counts, and calls no limit "not
/// binding" (every limit of the direction held).
fn assert_says_what_waited(dir: &Value) {
    let v = verdict(dir);
    let want = waited_words(dir);
    assert!(v.contains(&want), "want {want:?} in {v:?}");
    assert!(!v.contains("not binding"), "{v}");
}

fn verdict(dir: &Value) -> &str {
    dir["verdict"].as_str().unwrap_or_default()
}

/// Per printed interval, the cgroup's direction object where it had one.
fn interval_dirs<'a>(
    out: &'a TraceOutput,
    lo: &BlockDev,
    cg: &Cgroup,
    dir: &str,
) -> Vec<&'a Value> {
    out.interval_rows(lo, &cg.path())
        .into_iter()
        .flatten()
        .map(|r| &r[dir])
        .filter(|d| {
            u(d, "bios") > 0
                || u(d, "requests") > 0
                || u(d, "charged_ios") > 0
                || u(d, "charged_bytes") > 0
                || u(&d["throttled"], "bios") > 0
                || d["throttled"]["queued"].as_u64() > Some(0)
        })
        .collect()
}

/// The whole run's verdict of a limit that held: "<head> held it back in N of the M intervals
/// with I/O: <waited>", N and M the JSON's, which equal what the printed intervals show (the
/// tracer ran idle past the I/O, so the unprinted last interval had none of it).
fn assert_held_over_the_run(
    out: &TraceOutput,
    lo: &BlockDev,
    cg: &Cgroup,
    limit: &str,
    shown: &str,
) {
    let w = &out
        .cgroup_row(lo, &cg.path())
        .expect("no row for the cgroup")["write"];
    let l = &w["limits"][limit];
    let t = &w["over_time"];
    let (n, m) = (u(l, "intervals_held"), u(t, "active_intervals"));
    assert_eq!(l["held"], true, "{w}");
    let printed = interval_dirs(out, lo, cg, "write");
    let held_printed = printed
        .iter()
        .filter(|d| d["limits"][limit]["held"] == true)
        .count() as u64;
    if out.total["tier"] == "tracepoint" {
        assert_eq!(m, printed.len() as u64, "active intervals; {w}");
        assert_eq!(n, held_printed, "intervals {limit} held; {w}");
    } else {
        // fentry: intervals a queued bio waited through, with nothing of it printed, count too.
        assert!(m >= printed.len() as u64 && n >= held_printed, "{w}");
    }
    assert_eq!(u(t, "intervals"), out.intervals.len() as u64 + 1, "{w}");
    assert!(n >= 1 && n <= m && m <= u(t, "intervals"), "{w}");
    let head = format!("{limit} {shown} (set on {})", cg.path());
    let want = format!("{head} held it back in {n} of the {m} intervals with I/O");
    assert!(
        verdict(w).contains(&want),
        "want {want:?} in {:?}",
        verdict(w)
    );
    let used = l["used_pct"].as_f64().unwrap();
    let active = l["used_pct_active"].as_f64().unwrap();
    assert!(active >= used, "use over active time below the run's; {l}");
}

/// Bios, charges and waits add up: the total's are the sum of the intervals' (and the last,
/// unprinted one had none), and blk-cgroup counted what mergetrace says was charged.
fn assert_adds_up(out: &TraceOutput, lo: &BlockDev, cg: &Cgroup, dir: &str, serviced: (u64, u64)) {
    let w = &out
        .cgroup_row(lo, &cg.path())
        .expect("no row for the cgroup")[dir];
    assert_consistent(out, w, dir);
    let printed = interval_dirs(out, lo, cg, dir);
    for f in ["bios", "charged_ios", "charged_bytes"] {
        let sum: u64 = printed.iter().map(|d| u(d, f)).sum();
        assert_eq!(sum, u(w, f), "{dir} {f}: intervals vs total; {w}");
    }
    let waited: u64 = printed.iter().map(|d| u(&d["throttled"], "bios")).sum();
    assert_eq!(waited, u(&w["throttled"], "bios"), "{dir}; {w}");
    if w["limits"].as_object().is_some_and(|l| !l.is_empty()) {
        assert_eq!(
            u(w, "charged_ios"),
            serviced.0,
            "charged_ios vs io_serviced; {w}"
        );
        assert_eq!(
            u(w, "charged_bytes"),
            serviced.1,
            "charged_bytes vs io_service_bytes; {w}"
        );
    }
}

/// A run of fio in `cg`: the live tracer's output, the report of a capture of the same run,
/// fio's reports and blk-cgroup's (write, read) deltas (ios, bytes).
struct Run {
    out: TraceOutput,
    report: Value,
    fio: Vec<Value>,
    wrote: (u64, u64),
    read: (u64, u64),
}

/// `jobs` in `cg`, one after the other, with the tracer (and a recorder) idle for [`IDLE`]
/// before and after them.
fn idle_around(lo: &BlockDev, cg: &Cgroup, jobs: &[Fio]) -> Run {
    let capture = std::path::PathBuf::from(format!("/dev/shm/{}.mtr", unique_name()));
    let t = tracer(lo);
    let recorder = Recorder::start(lo, &capture, None);
    thread::sleep(IDLE);
    let before = cg.throttle_stats(lo);
    let fio = jobs.iter().map(|j| j.run()).collect();
    let after = cg.throttle_stats(lo);
    thread::sleep(IDLE);
    recorder.stop();
    let out = t.stop();
    let (report, _) = succeeded(
        mergetrace(&["report", capture.to_str().unwrap(), "--json"]),
        "report --json",
    );
    let _ = std::fs::remove_file(&capture);
    Run {
        out,
        report: serde_json::from_str(report.trim()).expect("report --json is one object"),
        fio,
        wrote: after.write_since(&before),
        read: after.read_since(&before),
    }
}

/// The capture's report, judged over its own 1 s intervals, names the limits the live view
/// named as holding the cgroup back, direction by direction.
fn assert_report_agrees(run: &Run, lo: &BlockDev, cg: &Cgroup) {
    let live = run.out.cgroup_row(lo, &cg.path()).expect("no live row");
    let offline = run.report["devices"]
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["device"] == lo.name.as_str()))
        .and_then(|d| d["cgroups"].as_array())
        .and_then(|rows| rows.iter().find(|r| r["cgroup"] == cg.path().as_str()))
        .unwrap_or_else(|| panic!("{} not in the report", cg.path()));
    let held = |dir: &Value| -> Vec<String> {
        dir["limits"]
            .as_object()
            .map(|l| {
                l.iter()
                    .filter(|(_, u)| u["held"] == true)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    for dir in ["read", "write"] {
        let (l, r) = (&live[dir], &offline[dir]);
        assert_eq!(held(l), held(r), "{dir}: live {l}\nreport {r}");
        for name in held(r) {
            assert!(u(&r["limits"][&name], "intervals_held") >= 1, "{r}");
            assert!(verdict(r).contains(" held it back in "), "{r}");
        }
        assert_eq!(l["verdict"].is_null(), r["verdict"].is_null(), "{dir}");
    }
}

fn disk() -> TestDisk {
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(0);
    udev_settle();
    lo
}

/// O_DIRECT writes of `bs`, `iodepth` in flight, for `secs` seconds.
fn writes(lo: &BlockDev, name: &str, bs: &str, iodepth: u32, secs: &str) -> Fio {
    Fio::new(name, &lo.path)
        .opt("rw", "write")
        .opt("bs", bs)
        .opt("direct", "1")
        .opt("ioengine", "libaio")
        .opt("iodepth", &iodepth.to_string())
        .opt("size", &SIZE.to_string())
        .opt("time_based", "1")
        .opt("runtime", secs)
}

/// wbps 2 MiB/s, and 64 KiB writes for 2 s between idle seconds: over the whole run the limit
/// reads about half used, although it held the cgroup back whenever it wrote. The verdict
/// says it held, in how many of the intervals with I/O, and its use over those.
#[test]
fn idle_time_does_not_average_away_a_limit_that_held() {
    require_root();
    let lo = disk();
    let cg = Cgroup::new();
    cg.set_write_bps(&lo, 2 * MIB);
    let job = writes(&lo, "bps", "64k", 4, "2").in_cgroup(&cg);
    let run = idle_around(&lo, &cg, &[job]);
    let (out, reports, serviced) = (&run.out, &run.fio, run.wrote);
    let w = &out.cgroup_row(&lo, &cg.path()).expect("no row")["write"];
    eprintln!("wbps 2 MiB/s between idle seconds: io_serviced {serviced:?}; mergetrace {w}");
    assert_eq!(u(w, "bios"), fio_total_ios(&reports[0], "write"), "{w}");
    assert_eq!(u(w, "bios"), serviced.0, "bios vs io_serviced; {w}");
    assert_adds_up(out, &lo, &cg, "write", serviced);
    assert!(
        u(&w["throttled"], "bios") > 0,
        "the limit held no bio back; {w}"
    );
    assert_held_over_the_run(out, &lo, &cg, "wbps", "2.0 MiB/s");
    assert_says_what_waited(w);
    assert!(
        u(&w["over_time"], "active_intervals") + 2 <= u(&w["over_time"], "intervals"),
        "the idle intervals before and after count as active; {w}"
    );
    assert_report_agrees(&run, &lo, &cg);
}

/// wiops 100 and wbps 1 MiB/s: 4 KiB writes wait for wiops (at 400 KiB/s, 39 % of wbps), then
/// 256 KiB writes wait for wbps (4 a second, 4 % of wiops). Each limit is named for the
/// intervals in which it held; neither is "not binding".
#[test]
fn two_limits_each_named_for_the_intervals_it_held() {
    require_root();
    let lo = disk();
    let cg = Cgroup::new();
    cg.set_write_iops(&lo, 100);
    cg.set_write_bps(&lo, MIB);
    let jobs = [
        writes(&lo, "small", "4k", 4, "2").in_cgroup(&cg),
        writes(&lo, "large", "256k", 2, "2").in_cgroup(&cg),
    ];
    let run = idle_around(&lo, &cg, &jobs);
    let (out, reports, serviced) = (&run.out, &run.fio, run.wrote);
    let w = &out.cgroup_row(&lo, &cg.path()).expect("no row")["write"];
    eprintln!("wiops 100 + wbps 1 MiB/s, two phases: io_serviced {serviced:?}; mergetrace {w}");
    let ios: u64 = reports.iter().map(|r| fio_total_ios(r, "write")).sum();
    assert_eq!(u(w, "bios"), ios, "{w}");
    assert_eq!(u(w, "bios"), serviced.0, "{w}");
    assert_adds_up(out, &lo, &cg, "write", serviced);
    assert_held_over_the_run(out, &lo, &cg, "wiops", "100");
    assert_held_over_the_run(out, &lo, &cg, "wbps", "1.0 MiB/s");
    assert_says_what_waited(w);
    assert_report_agrees(&run, &lo, &cg);
}

/// wbps 128 KiB/s and 256 KiB writes one at a time: each waits about 2 s and is charged when
/// blk-throttle releases it, so the interval it is released in was charged several times the
/// rate. The interval's verdict says the limit held and why the use is above 100 %; no
/// interval in which bios waited reads "not binding".
#[test]
fn a_large_bio_is_charged_when_released() {
    require_root();
    let lo = disk();
    let cg = Cgroup::new();
    cg.set_write_bps(&lo, 128 << 10);
    let job = Fio::new("large", &lo.path)
        .opt("rw", "write")
        .opt("bs", "256k")
        .opt("direct", "1")
        .opt("ioengine", "libaio")
        .opt("iodepth", "1")
        .opt("size", &(512u64 << 10).to_string())
        .in_cgroup(&cg);
    let run = idle_around(&lo, &cg, &[job]);
    let (out, serviced) = (&run.out, run.wrote);
    let w = &out.cgroup_row(&lo, &cg.path()).expect("no row")["write"];
    eprintln!("wbps 128 KiB/s, 2 bios of 256 KiB: io_serviced {serviced:?}; mergetrace {w}");
    assert_eq!((u(w, "bios"), u(w, "splits")), (2, 0), "{w}");
    assert_eq!(serviced, (2, 512 << 10), "io_serviced, io_service_bytes");
    assert_adds_up(out, &lo, &cg, "write", serviced);
    assert!(u(&w["throttled"], "bios") >= 1, "{w}");
    let mut over = 0;
    for d in interval_dirs(out, &lo, &cg, "write") {
        let v = verdict(d);
        if u(&d["throttled"], "bios") > 0 {
            assert!(
                v.starts_with("wbps 128 KiB/s (set on ") && v.contains(" held it back: "),
                "{d}"
            );
        }
        if d["limits"]["wbps"]["used_pct"].as_f64().unwrap() > 105.0 {
            over += 1;
            assert!(
                v.contains("held it back")
                    && v.contains("(bios held back earlier are charged as they are released)"),
                "{d}"
            );
        }
    }
    assert!(over >= 1, "no interval was charged above the rate; {w}");
    assert_held_over_the_run(out, &lo, &cg, "wbps", "128 KiB/s");
    assert_report_agrees(&run, &lo, &cg);
}

/// Reads and writes of one fio job sharing its queue depth: wiops 200 holds the writes, the
/// writes fill the depth, and the reads wait for them without a read limit ever holding one.
/// The reads' verdict names the write limit — after "not binding" for a read limit far
/// away, or on its own where there is no read limit.
#[test]
fn reads_held_back_by_the_write_limit_name_it() {
    require_root();
    for read_limit in [true, false] {
        let lo = disk();
        let cg = Cgroup::new();
        cg.set_write_iops(&lo, 200);
        if read_limit {
            cg.set_read_iops(&lo, 10_000_000);
        }
        let job = Fio::new("mixed", &lo.path)
            .opt("rw", "rw")
            .opt("bs", "4k")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "16")
            .opt("size", &SIZE.to_string())
            .opt("time_based", "1")
            .opt("runtime", "2")
            .in_cgroup(&cg);
        let run = idle_around(&lo, &cg, &[job]);
        let (out, reports, wrote, read) = (&run.out, &run.fio, run.wrote, run.read);
        let row = out.cgroup_row(&lo, &cg.path()).expect("no row");
        let (r, w) = (&row["read"], &row["write"]);
        eprintln!("read limit {read_limit}: io_serviced w {wrote:?} r {read:?}; mergetrace {row}");
        assert_eq!(u(r, "bios"), fio_total_ios(&reports[0], "read"), "{r}");
        assert_eq!(u(r, "bios"), read.0, "reads vs io_serviced; {r}");
        assert_eq!(u(w, "bios"), wrote.0, "writes vs io_serviced; {w}");
        assert_adds_up(out, &lo, &cg, "read", read);
        assert_adds_up(out, &lo, &cg, "write", wrote);
        assert_eq!(
            u(&r["throttled"], "bios"),
            0,
            "a read waited in blk-throttle; {r}"
        );
        assert!(u(&w["throttled"], "bios") > 0, "no write waited; {w}");
        let path = cg.path();
        assert_held_over_the_run(out, &lo, &cg, "wiops", "200");
        let named = format!("its writes were held back by wiops 200 (set on {path}): ");
        let v = verdict(r);
        if read_limit {
            let lead = format!("riops 10000000 (set on {path}) is ");
            assert!(
                v.starts_with(&lead) && v.contains(&format!(": not binding; {named}")),
                "{v}"
            );
            assert_eq!(r["limits"]["riops"]["held"], false, "{r}");
        } else {
            assert!(v.starts_with(&format!("no read limit; {named}")), "{v}");
            assert_eq!(u(r, "charged_ios"), 0, "no read rule, nothing charged; {r}");
        }
        assert_report_agrees(&run, &lo, &cg);
    }
}
