//! Kernel tests of io.latency as a meter: what `check`, the banner and the JSON say of it
//! against what this kernel and cgroup hierarchy allow. The oracles: the kernel's BTF names
//! `blkcg_iolatency_throttle` iff io.latency is built in, and a cgroup v2 cgroup with the io
//! controller has an `io.latency` file iff it is.
//!
//! Where it is built in (cgroup v2 and `CONFIG_BLK_CGROUP_IOLATENCY`), a target is set and read
//! back, and each new request of the cgroup is counted (`meters.iolatency.requests`, against
//! /proc/diskstats' writes). Of the lab's kernels only `6.1-iolatency` has it (built by the
//! lab: no Debian kernel package is built with it). Debian's 5.10, 6.1 and 6.12 (cgroup v2)
//! are not, and this host mounts blkio on cgroup v1, where it cannot exist. There the test
//! checks that mergetrace says so, in one line, and shows no io.latency meter — it never skips.
//!
//! Needs root, BPF, a test disk, cgroups and fio; missing any of them is a FAILURE. Run:
//! `cargo xtask test --test kernel_iolatency`; in the guests `./mt lab --kernel 6.1-iolatency,6.12
//! --test kernel_iolatency`.
mod support;

use serde_json::Value;
use support::*;

const SIZE: u64 = 64 << 20;
/// The target set where io.latency exists: 10 ms.
const TARGET_US: u64 = 10_000;

/// The kernel's BTF names io.latency's throttle function.
fn built_in() -> bool {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("BTF");
    let name = b"blkcg_iolatency_throttle\0";
    btf.windows(name.len()).any(|w| w == name)
}

/// `check -d DEV --json`'s io.latency finding: (finding, lever).
fn check_finding(lo: &BlockDev) -> (String, Option<String>) {
    let (out, _) = succeeded(mergetrace(&["check", "-d", &lo.name, "--json"]), "check");
    let v: Value = serde_json::from_str(out.trim()).expect("check --json prints JSON");
    let f = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["topic"] == "io.latency")
        .unwrap_or_else(|| panic!("no io.latency finding: {v}"))
        .clone();
    (
        f["finding"].as_str().unwrap().to_string(),
        f["lever"].as_str().map(str::to_string),
    )
}

/// fio's 4 KiB writes in batches of 32 in `cg`, traced in 500 ms intervals until every one of
/// them is printed (an idle interval after the last write): the output, the diskstats delta.
fn traced_writes(lo: &BlockDev, cg: &Cgroup) -> (TraceOutput, DiskStats) {
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "-i", "500ms"]);
    let before = lo.diskstats();
    Fio::sequential("iolat", lo, "write", 16 << 20, 32)
        .in_cgroup(cg)
        .run();
    let d = lo.diskstats().since(&before);
    std::thread::sleep(std::time::Duration::from_millis(1200));
    (tracer.stop(), d)
}

#[test]
fn iolatency_is_said_as_this_kernel_and_hierarchy_allow() {
    require_root();
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    udev_settle();
    let cg = Cgroup::new();
    let built = built_in();
    let v2 = cg.version() == CgroupVersion::V2;
    let (finding, lever) = check_finding(&lo);
    eprintln!("io.latency: built in {built}, cgroup v2 {v2}: check says {finding:?}");
    if v2 {
        assert!(
            cg.dir.join("io.max").exists(),
            "the test cgroup has no io controller"
        );
        assert_eq!(
            cg.dir.join("io.latency").exists(),
            built,
            "io.latency file vs BTF"
        );
    }
    if v2 && built {
        return targets_are_read_and_requests_counted(&lo, &cg);
    }
    if v2 {
        assert_eq!(
            finding,
            "io.latency is not built into this kernel (CONFIG_BLK_CGROUP_IOLATENCY): no \
             latency-target meter"
        );
    } else {
        assert!(
            finding.starts_with(
                "io.latency cannot exist here: it is a cgroup v2 file, and this machine's io \
                 controller is blkio on cgroup v1"
            ),
            "{finding}"
        );
        assert_eq!(
            finding.ends_with(
                "; it is not built into this kernel either (CONFIG_BLK_CGROUP_IOLATENCY)"
            ),
            !built,
            "{finding}"
        );
    }
    assert_eq!(lever, None, "{finding}");
    // No meter and no banner line where no target can be set.
    let (out, _) = traced_writes(&lo, &cg);
    assert!(!out.stderr.contains("io.latency"), "{}", out.stderr);
    let w = &out.cgroup_row(&lo, &cg.path()).expect("a row")["write"];
    assert!(w["meters"].get("iolatency").is_none(), "{w}");
}

/// Where io.latency exists: a 10 ms target on the test cgroup, read back by `check`, named by
/// the banner, and every new request of the cgroup counted (scheduler none, one writer: the
/// cgroup's requests are the disk's). Runs in the lab's `6.1-iolatency` kernel.
fn targets_are_read_and_requests_counted(lo: &BlockDev, cg: &Cgroup) {
    let file = cg.dir.join("io.latency");
    let set = |v: &str| {
        std::fs::write(&file, format!("{} target={v}", lo.maj_min()))
            .unwrap_or_else(|e| panic!("cannot write io.latency: {e}"))
    };
    set(&TARGET_US.to_string());
    let (finding, lever) = check_finding(lo);
    let named = format!("{}: io.latency targets: {} 10 ms", lo.name, cg.path());
    assert!(finding.starts_with(&named), "{finding}");
    assert!(lever.is_some_and(|l| l.contains("meters.iolatency")));
    let (out, d) = traced_writes(lo, cg);
    set("max");
    assert!(out.stderr.contains(&named), "{}", out.stderr);
    let w = &out.cgroup_row(lo, &cg.path()).expect("a row")["write"];
    let m = &w["meters"]["iolatency"];
    assert_eq!(
        u(m, "requests"),
        d.writes,
        "requests vs diskstats writes; {w}"
    );
    assert_eq!(u(m, "target_us"), TARGET_US, "{w}");
    assert!(
        w["verdict"]
            .as_str()
            .unwrap_or_default()
            .contains("io.latency (targets: "),
        "{w}"
    );
    // True in every interval: each one the cgroup wrote in names io.latency with that
    // interval's own count, and the intervals add up to the run.
    let (mut sum, mut said_in) = (0, 0);
    for row in out.interval_rows(lo, &cg.path()).into_iter().flatten() {
        let iw = &row["write"];
        let n = u(&iw["meters"]["iolatency"], "requests");
        sum += n;
        if n == 0 {
            continue;
        }
        let said = format!("it counted {} new request", thousands(n));
        let verdict = iw["verdict"].as_str().unwrap_or_default();
        assert!(
            verdict.contains("io.latency (targets: ") && verdict.contains(&said),
            "an interval's verdict does not say its {n} requests: {iw}"
        );
        assert_eq!(
            u(&iw["meters"]["iolatency"], "target_us"),
            TARGET_US,
            "{iw}"
        );
        said_in += 1;
    }
    assert_eq!(sum, d.writes, "the intervals' requests vs diskstats writes");
    eprintln!(
        "io.latency: {} requests for {} bios ({said_in} intervals said so); the run's verdict: {}",
        d.writes,
        u(w, "bios"),
        w["verdict"]
    );
}
