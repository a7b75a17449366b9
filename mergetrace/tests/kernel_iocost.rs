//! Kernel tests of io.cost as a meter: what mergetrace says io.cost charged a cgroup, checked
//! against the kernel's own `io.stat` `cost.usage`, with merging on and off, on sequential and
//! random writes. io.cost exists only on cgroup v2, so in the lab's guests; on a v1 host the
//! test checks that mergetrace says so (and shows no io.cost meter).
//!
//! The bound, and why: the kernel sums a cgroup's charges exactly (in vtime) but adds them to
//! `cost.usage` once per period (the timer), each time flooring to whole µs and dropping the
//! rest. So `cost.usage` is never above the exact sum and below it by less than 1 µs per
//! flush: less than `periods + 1` µs, with one period = 2 × wlat (the qos below: 500 ms). A
//! merge charged after the period's last flush of a cgroup that then goes idle is flushed
//! only when the cgroup is active again: a last single 4 KiB write makes it active before
//! the counter is read. The random arm makes the cursor rule matter (random writes cost
//! 1,959 µs, sequential 959, with the 500 random IOPS of the model below): one wrongly
//! classified bio is 1,000 µs off, far outside the bound.
//!
//! Needs root, BPF, a test disk, cgroup v2 with io.cost (the lab's guests) or v1 (the host),
//! and fio; missing any of them is a FAILURE, never a skip. Run in the guests:
//!   cargo xtask lab --kernel 6.12 --test kernel_iocost
mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const SIZE: u64 = 64 << 20;
/// 100 MB/s; 1,000 sequential and 500 random IOPS: a 4 KiB page costs 41 µs, a sequential
/// base 959 µs, a random one 1,959 µs.
const MODEL: &str = "ctrl=user model=linear rbps=100000000 rseqiops=1000 rrandiops=500 \
                     wbps=100000000 wseqiops=1000 wrandiops=500";
/// vrate pinned at 100 %: io.stat's µs are the model's (no vrate adjustment).
const QOS: &str = "enable=1 ctrl=user rpct=0 rlat=250000 wpct=0 wlat=250000 min=100.00 max=100.00";
/// The test cgroup's io.weight for the disk.
const WEIGHT: u64 = 300;
/// io.cost's period with the qos above: 2 × max(rlat, wlat).
const PERIOD: Duration = Duration::from_millis(500);

/// io.cost turned on for a disk with [`MODEL`] and [`QOS`]; off again when dropped.
struct IocostOn {
    root: std::path::PathBuf,
    maj_min: String,
}

impl IocostOn {
    fn new(dev: &BlockDev) -> IocostOn {
        let root = cgroup_hierarchy().1.clone();
        let maj_min = dev.maj_min();
        let write = |file: &str, line: String| {
            std::fs::write(root.join(file), &line)
                .unwrap_or_else(|e| panic!("cannot write {line:?} to {file}: {e}"))
        };
        write("io.cost.model", format!("{maj_min} {MODEL}"));
        write("io.cost.qos", format!("{maj_min} {QOS}"));
        IocostOn { root, maj_min }
    }
}

impl Drop for IocostOn {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.root.join("io.cost.qos"),
            format!("{} enable=0", self.maj_min),
        );
    }
}

/// One 4 KiB O_DIRECT write at `offset`, from inside `cg`.
fn one_write(cg: &Cgroup, dev: &BlockDev, offset: u64) -> Value {
    Fio::new("last", &dev.path)
        .opt("rw", "write")
        .opt("bs", "4k")
        .opt("direct", "1")
        .opt("size", "4k")
        .offset(offset)
        .in_cgroup(cg)
        .run()
}

/// A cgroup's io.cost charge from mergetrace and from io.stat, on one workload.
fn charged(nomerges: u32, random: bool) {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    lo.set_nomerges(nomerges);
    udev_settle();
    let _on = IocostOn::new(&lo);
    // A new cgroup: its io.cost cursor starts at 0, as mergetrace's does. Its weight for the
    // disk, 300, is read back; alone on the disk it has all of it.
    let cg = Cgroup::new();
    std::fs::write(
        cg.dir.join("io.weight"),
        format!("{} {WEIGHT}", lo.maj_min()),
    )
    .expect("cannot write io.weight");
    let tracer = Tracer::on(&lo);
    // A capture of the same I/O: its report must charge the same.
    let capture = std::path::PathBuf::from(format!("/dev/shm/{}.mtr", unique_name()));
    let recorder = Recorder::start(&lo, &capture, None);
    let before = lo.diskstats();
    let usage_before = cg.io_stat(&lo).get("cost.usage").copied().unwrap_or(0);
    let started = Instant::now();
    let job = if random {
        Fio::sequential("random", &lo, "randwrite", SIZE, 1)
            .opt("iodepth", "1")
            .opt("number_ios", "300")
            .opt("randrepeat", "1")
    } else {
        Fio::sequential("sequential", &lo, "write", 16 << 20, 32)
    };
    let report = job.in_cgroup(&cg).run();
    one_write(&cg, &lo, SIZE - 4096);
    // io.stat shows the last flush: wait two periods for the one after the last write.
    std::thread::sleep(2 * PERIOD + Duration::from_millis(100));
    let usage = cg.io_stat(&lo).get("cost.usage").copied().unwrap_or(0) - usage_before;
    let periods = started.elapsed().as_secs_f64() / PERIOD.as_secs_f64();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    recorder.stop();
    let (offline, _) = succeeded(
        mergetrace(&["report", capture.to_str().unwrap(), "--json"]),
        "report --json",
    );
    let _ = std::fs::remove_file(&capture);
    let offline: Value = serde_json::from_str(offline.trim()).expect("report --json is one object");

    let ctx = format!("nomerges={nomerges}, random={random}");
    assert_eq!(out.lost_events(), 0, "{ctx}");
    assert!(
        out.stderr.contains(&format!("{}: io.cost is on", lo.name)),
        "the banner does not name io.cost: {}",
        out.stderr
    );
    let row = out
        .cgroup_row(&lo, &cg.path())
        .unwrap_or_else(|| panic!("no row for {}; {ctx}", cg.path()));
    let w = &row["write"];
    let c = &w["meters"]["iocost"];
    eprintln!(
        "{ctx}: fio {} I/Os; diskstats writes {} merged {}; io.stat cost.usage +{usage} µs; \
         mergetrace {c}",
        fio_total_ios(&report, "write"),
        d.writes,
        d.writes_merged
    );
    // The counts: every bio started a request or merged (one writer, no request merges with
    // scheduler none), each a 4 KiB page.
    let bios = fio_total_ios(&report, "write") + 1;
    assert_eq!(
        u(c, "requests"),
        d.writes,
        "requests != diskstats writes; {ctx}; {c}"
    );
    assert_eq!(
        u(c, "merged"),
        d.writes_merged,
        "merged != diskstats merged; {ctx}; {c}"
    );
    assert_eq!(u(c, "pages"), bios, "{ctx}; {c}");
    if nomerges == 2 {
        assert_eq!(u(c, "merged"), 0, "{ctx}; {c}");
    }
    // The charge against the kernel's, within its rounding (see the top of this file).
    let ours = c["cost_us"].as_f64().unwrap();
    let bound = periods.ceil() + 1.0;
    let diff = ours - usage as f64;
    assert!(
        (0.0..bound).contains(&diff),
        "mergetrace's io.cost charge {ours:.1} µs is {diff:.1} µs above io.stat's {usage} µs \
         (allowed: 0 to {bound:.0}, one µs per flush); {ctx}; {c}"
    );
    let offline = offline["devices"]
        .as_array()
        .and_then(|ds| ds.iter().find(|d| d["device"] == lo.name.as_str()))
        .and_then(|d| d["cgroups"].as_array())
        .and_then(|rows| rows.iter().find(|r| r["cgroup"] == cg.path().as_str()))
        .unwrap_or_else(|| panic!("{} not in the report; {ctx}", cg.path()));
    assert_eq!(u(c, "weight"), WEIGHT, "io.weight read back; {ctx}; {c}");
    assert_eq!(c["share_pct"], 100.0, "alone on the disk; {ctx}; {c}");
    // The report charges as the live view did; a capture records no weights.
    let mut charge = c.clone();
    charge
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k != "weight" && k != "share_pct");
    assert_eq!(
        offline["write"]["meters"]["iocost"], charge,
        "the capture's report charges otherwise than the live view; {ctx}"
    );
    let verdict = w["verdict"].as_str().unwrap_or_default();
    assert!(verdict.contains("io.cost charged it"), "{ctx}: {verdict}");
    if nomerges == 0 && !random {
        assert!(
            verdict.contains(&format!(
                "merging raises what its io.weight {WEIGHT}, a 100 % share of the device among \
                 the cgroups io.cost charged here, buys"
            )),
            "{ctx}: {verdict}"
        );
    }
}

#[test]
fn sequential_writes_merged_pay_pages_only() {
    on_v2_or_says_why(|| charged(0, false));
}

#[test]
fn sequential_writes_unmerged_each_pay_a_base() {
    on_v2_or_says_why(|| charged(2, false));
}

#[test]
fn random_writes_pay_the_random_base() {
    on_v2_or_says_why(|| charged(2, true));
}

/// io.cost switched on while the tracer runs: the tracer says so, the programs charge from
/// then on, and the whole run's charge is io.stat's `cost.usage` over the writes (within its
/// rounding); then switched off, it says that too.
#[test]
fn switched_on_mid_run_is_charged_from_then_on() {
    on_v2_or_says_why(|| {
        require_root();
        let lo = TestDisk::new(SIZE);
        lo.set_scheduler("none");
        lo.set_nomerges(0);
        udev_settle();
        let cg = Cgroup::new();
        let tracer = Tracer::start(&["-d", lo.name.as_str(), "-i", "1s"]);
        assert!(
            !tracer.stderr().contains("io.cost is on"),
            "{}",
            tracer.stderr()
        );
        let on = IocostOn::new(&lo);
        let said = format!("changed: {}: io.cost switched on", lo.name);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !tracer.stderr().contains(&said) {
            assert!(
                Instant::now() < deadline,
                "not said: {said:?}; {}",
                tracer.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let usage_before = cg.io_stat(&lo).get("cost.usage").copied().unwrap_or(0);
        let started = Instant::now();
        let before = lo.diskstats();
        Fio::sequential("sequential", &lo, "write", 16 << 20, 32)
            .in_cgroup(&cg)
            .run();
        one_write(&cg, &lo, SIZE - 4096);
        std::thread::sleep(2 * PERIOD + Duration::from_millis(100));
        let usage = cg.io_stat(&lo).get("cost.usage").copied().unwrap_or(0) - usage_before;
        let periods = started.elapsed().as_secs_f64() / PERIOD.as_secs_f64();
        let d = lo.diskstats().since(&before);
        drop(on);
        let off = format!("changed: {}: io.cost switched off", lo.name);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !tracer.stderr().contains(&off) {
            assert!(
                Instant::now() < deadline,
                "not said: {off:?}; {}",
                tracer.stderr()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = tracer.stop();
        let c = &out.cgroup_row(&lo, &cg.path()).expect("a row")["write"]["meters"]["iocost"];
        eprintln!("io.stat cost.usage +{usage} µs; diskstats {d:?}; mergetrace {c}");
        assert_eq!(u(c, "requests"), d.writes, "{c}");
        assert_eq!(u(c, "merged"), d.writes_merged, "{c}");
        let ours = c["cost_us"].as_f64().unwrap();
        let bound = periods.ceil() + 1.0;
        let diff = ours - usage as f64;
        assert!(
            (0.0..bound).contains(&diff),
            "mergetrace's io.cost charge {ours:.1} µs is {diff:.1} µs above io.stat's {usage}              µs (allowed: 0 to {bound:.0}); {c}"
        );
    });
}

/// Runs `test` on cgroup v2; on v1 checks what mergetrace says instead: `check` names io.cost
/// as impossible here, and a live run has no io.cost meter.
fn on_v2_or_says_why(test: impl FnOnce()) {
    if cgroup_hierarchy().0 == CgroupVersion::V2 {
        return test();
    }
    require_root();
    let lo = TestDisk::new(SIZE);
    let out = mergetrace(&["check", "-d", &lo.name, "--json"]);
    assert!(out.status.success(), "check failed: {out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    let text = v.to_string();
    assert!(
        text.contains("io.cost (io.weight, io.cost.qos) exists only on cgroup v2"),
        "check does not say io.cost cannot exist on v1: {text}"
    );
    let cg = Cgroup::new();
    let tracer = Tracer::on(&lo);
    Fio::sequential("v1", &lo, "write", 1 << 20, 32)
        .in_cgroup(&cg)
        .run();
    let out = tracer.stop();
    let w = &out.cgroup_row(&lo, &cg.path()).expect("a row")["write"];
    assert!(
        w["meters"].get("iocost").is_none(),
        "io.cost meter on v1: {w}"
    );
}
