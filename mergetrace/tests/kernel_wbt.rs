//! Kernel tests of wbt (writeback throttling) as a meter. wbt holds the new requests of
//! buffered writes and discards to an in-flight depth (`wbt_wait` in `rq_qos_throttle`, for
//! bios that did not merge) and lets O_DIRECT writes (`REQ_SYNC | REQ_IDLE`) by. mergetrace
//! sorts each new request by the bio that started it, as `wbt_should_throttle` does. wbt keeps
//! no cumulative counter, so the oracle is the split itself: on a disk with wbt on, every new
//! write request is in `meters.wbt.requests` or `passed_requests`, and together they equal
//! /proc/diskstats' writes (scheduler none: no request merges); O_DIRECT writes from fio are
//! all passed, buffered writes from dd all counted; on ext4, both kinds at once still add up.
//! With wbt off there is no wbt meter and the banner says so. `check` says whether io.latency
//! is built into the kernel, as the kernel's BTF does.
//!
//! Needs root, BPF, a test disk with wbt (loop devices have it), fio, dd and mkfs.ext4;
//! missing any of them is a FAILURE, never a skip. In the guests:
//!   cargo xtask lab --kernel 6.1 --test kernel_wbt
mod support;

use serde_json::Value;
use support::{workloads::*, *};

const SIZE: u64 = 64 << 20;

/// The device's total write direction and the diskstats delta of a traced workload, on a
/// disk with wbt on (target 2 ms) or off.
fn traced(lo: &TestDisk, work: impl FnOnce()) -> (TraceOutput, Value, DiskStats) {
    let tracer = Tracer::on(lo);
    let before = lo.diskstats();
    work();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0);
    let w = out.device_total(lo)["write"].clone();
    (out, w, d)
}

/// The write verdicts of the device's cgroup rows, one per line.
fn write_verdicts(out: &TraceOutput, lo: &TestDisk) -> String {
    out.device(lo)["cgroups"]
        .as_array()
        .expect("cgroups")
        .iter()
        .filter_map(|r| r["write"]["verdict"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A test disk with scheduler none and wbt's target set (0 turns wbt off); the guard puts the
/// old target back.
fn disk_with_wbt(target_us: &str) -> (TestDisk, QueueAttrRestore) {
    let lo = TestDisk::new(SIZE);
    lo.set_scheduler("none");
    udev_settle();
    let restore = lo.set_queue_attr_restored("wbt_lat_usec", target_us);
    (lo, restore)
}

#[test]
fn o_direct_writes_pass_wbt_and_buffered_ones_take_slots() {
    require_root();
    let (lo, _restore) = disk_with_wbt("2000");

    let (out, w, d) = traced(&lo, || {
        Fio::sequential("direct", &lo, "write", 8 << 20, 32).run();
    });
    assert!(
        out.stderr
            .contains(&format!("{}: wbt is on (latency target 2 ms)", lo.name)),
        "the banner does not say wbt is on: {}",
        out.stderr
    );
    let m = &w["meters"]["wbt"];
    eprintln!(
        "O_DIRECT: diskstats writes {} merged {}; wbt {m}",
        d.writes, d.writes_merged
    );
    assert!(d.writes > 0 && d.writes_merged > 0, "{d:?}");
    assert_eq!(
        u(m, "requests"),
        0,
        "an O_DIRECT write took a wbt slot: {m}"
    );
    assert_eq!(u(m, "passed_requests"), d.writes, "{m} vs {d:?}");
    let verdict = write_verdicts(&out, &lo);
    assert!(
        verdict.contains("wbt (latency target 2 ms) does not limit these writes"),
        "{verdict}"
    );

    let path = lo.path.to_str().unwrap().to_string();
    let (out, w, d) = traced(&lo, || {
        run(
            cmd(
                "dd",
                &[
                    "if=/dev/zero",
                    &format!("of={path}"),
                    "bs=1M",
                    "count=8",
                    "conv=fsync",
                ],
            ),
            None,
            None,
        );
    });
    let m = &w["meters"]["wbt"];
    eprintln!(
        "buffered dd: diskstats writes {} merged {}; wbt {m}",
        d.writes, d.writes_merged
    );
    assert!(d.writes > 0, "{d:?}");
    assert_eq!(u(m, "requests"), d.writes, "{m} vs {d:?}");
    assert_eq!(
        u(m, "passed_requests"),
        0,
        "a buffered write passed wbt: {m}"
    );
    // The writeback's requests and the fsync's flush may be charged to different cgroups
    // (cgroup v2 attributes writeback): the verdicts' counts add up to diskstats'.
    let verdict = write_verdicts(&out, &lo);
    let counted: u64 = verdict
        .lines()
        .filter_map(|l| l.split("wbt (latency target 2 ms) counted ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.replace(',', "").parse::<u64>().ok())
        .sum();
    assert_eq!(counted, d.writes, "{verdict}");
}

#[test]
fn ext4_buffered_and_direct_writes_add_up_to_diskstats() {
    require_root();
    let (lo, _restore) = disk_with_wbt("2000");
    let fs = Ext4::new(&lo);
    let dir = fs.path().to_str().unwrap().to_string();
    let (_, w, d) = traced(&lo, || {
        buffered_then_sync(&fs, None, 8 << 20);
        run(
            cmd(
                "dd",
                &[
                    "if=/dev/zero",
                    &format!("of={dir}/direct"),
                    "bs=64k",
                    "count=64",
                    "oflag=direct",
                ],
            ),
            None,
            None,
        );
        sync_fs_only(&fs, None);
    });
    let m = &w["meters"]["wbt"];
    eprintln!(
        "ext4: diskstats writes {} merged {}; wbt {m}",
        d.writes, d.writes_merged
    );
    assert!(u(m, "requests") > 0, "no buffered write took a slot: {m}");
    assert!(
        u(m, "passed_requests") >= 64,
        "the 64 O_DIRECT writes did not pass: {m}"
    );
    assert_eq!(
        u(m, "requests") + u(m, "passed_requests"),
        d.writes,
        "{m} vs {d:?}"
    );
    assert_eq!(u(&w, "requests") + u(&w, "flush_only"), d.writes);
}

#[test]
fn wbt_off_is_said_and_not_metered() {
    require_root();
    let (lo, _restore) = disk_with_wbt("0");
    let (out, w, _) = traced(&lo, || {
        Fio::sequential("direct", &lo, "write", 1 << 20, 32).run();
    });
    assert!(
        out.stderr.contains(&format!("{}: wbt is off", lo.name)),
        "{}",
        out.stderr
    );
    assert!(
        w["meters"].get("wbt").is_none(),
        "a wbt meter with wbt off: {w}"
    );
}

#[test]
fn check_says_what_the_rq_qos_meters_are() {
    require_root();
    let (lo, _restore) = disk_with_wbt("2000");
    let (text, _) = succeeded(mergetrace(&["check", "-d", lo.name.as_str()]), "check");
    assert!(
        text.contains(&format!(
            "wbt: {}: wbt is on (latency target 2 ms)",
            lo.name
        )),
        "{text}"
    );
    // The oracle: the kernel's BTF names io.latency's throttle function iff it is built in.
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("BTF");
    let built = btf
        .windows(b"blkcg_iolatency_throttle\0".len())
        .any(|w| w == b"blkcg_iolatency_throttle\0");
    let line = text
        .lines()
        .find(|l| l.starts_with("io.latency: "))
        .unwrap_or_else(|| panic!("no io.latency finding: {text}"));
    assert_eq!(
        line.contains("is not built into this kernel"),
        !built,
        "{line}"
    );
}
