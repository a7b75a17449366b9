//! Kernel tests of `mergetrace check -d DEV --json` on real loop devices: every scheduler
//! (none, mq-deadline) × nomerges (0, 1, 2), cgroups with limits on the device (v1 blkio on
//! this host, v2 io.max in the lab's guests), the diskstats arithmetic against the kernel's own
//! counters, the tier it names, and a bad device.
//!
//! Needs root, loop devices and a cgroup hierarchy with blk-throttle (v1 blkio or v2 io).
//! Missing any of them is a FAILURE with a message saying what, never a skip. Every loop
//! device, backing file and cgroup is unique to this process and removed in `Drop`, also when
//! a test panics. Run (or in the 6.1 / 6.12 guests: `cargo xtask lab -- kernel_check`):
//!   cargo test --release -p mergetrace --test kernel_check
mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

/// Sets the scheduler and nomerges (each checked after writing).
fn set_queue(dev: &BlockDev, scheduler: &str, nomerges: u32) {
    dev.set_scheduler(scheduler);
    dev.set_nomerges(nomerges);
}

/// How `check` names the hierarchy ("cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio").
fn hierarchy_words() -> String {
    let (version, root) = cgroup_hierarchy();
    let name = match version {
        CgroupVersion::V1 => "cgroup v1 blkio",
        CgroupVersion::V2 => "cgroup v2",
    };
    format!("{name} hierarchy at {}", root.display())
}

/// `mergetrace check -d DEV --json`, parsed.
fn check_json(dev: &BlockDev) -> Value {
    let (stdout, _) = succeeded(
        mergetrace(&["check", "-d", &dev.name, "--json"]),
        &format!("mergetrace check -d {} --json", dev.name),
    );
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("check --json is not one JSON object ({e}): {stdout}"));
    assert_eq!(v["device"], dev.name.as_str(), "{v}");
    assert_eq!(v["dev"], dev.maj_min().as_str(), "{v}");
    v
}

fn findings<'a>(v: &'a Value, topic: &str) -> Vec<&'a Value> {
    v["findings"]
        .as_array()
        .expect("findings is an array")
        .iter()
        .filter(|f| f["topic"] == topic)
        .collect()
}

fn finding<'a>(v: &'a Value, topic: &str) -> &'a str {
    let f = findings(v, topic);
    assert_eq!(f.len(), 1, "expected one {topic} finding in {v:#}");
    f[0]["finding"].as_str().unwrap()
}

fn lever<'a>(v: &'a Value, topic: &str) -> Option<&'a str> {
    findings(v, topic)[0]["lever"].as_str()
}

/// "1,016 KiB" for 1016 (KiB), as check prints sizes.
fn kib(k: u64) -> String {
    format!("{} KiB", thousands(k))
}

/// On a disk that offers mq-deadline ([`scheduler_disk`]: on the host a loop device, in the
/// lab the scratch disk vdb — 5.10's loop devices offer no scheduler).
#[test]
fn every_scheduler_and_nomerges_level() {
    require_root();
    let dev = scheduler_disk(32 << 20, "mq-deadline");
    let (max_segments, ceiling) = merge_ceiling(&dev);
    // The lab's disks are virtio-blk with one queue (num-queues=1), like a loop device.
    let hw_queues = std::fs::read_dir(dev.sysfs().join("mq"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(hw_queues, 1, "{}: hardware queues", dev.name);
    for sched in ["none", "mq-deadline"] {
        for nm in [0u32, 1, 2] {
            set_queue(&dev, sched, nm);
            let v = check_json(&dev);
            let ctx = format!("scheduler {sched}, nomerges {nm}: {v:#}");
            assert_eq!(v["queue"]["scheduler"]["active"], sched, "{ctx}");
            assert_eq!(v["queue"]["nomerges"], nm, "{ctx}");
            assert_eq!(v["queue"]["hw_queues"], 1, "{ctx}");

            check_queue_findings(&v, &dev, (sched, nm), &ctx);
            assert_eq!(v["queue"]["max_segments"], max_segments, "{ctx}");
            assert!(
                finding(&v, "merge ceiling").starts_with(&ceiling),
                "want {ceiling:?}; {ctx}"
            );
            let p = finding(&v, "plug flush");
            if nm == 2 {
                assert!(
                    p.starts_with("a task's plug list is flushed to the device at 32 requests only (the 128 KiB size rule is off with nomerges=2)"),
                    "{ctx}"
                );
            } else {
                assert!(
                    p.starts_with("a task's plug list is flushed to the device at 32 requests, or as soon as its last request has reached 128 KiB"),
                    "{ctx}"
                );
            }

            check_throttle_and_tier(&v, &dev, &ctx);
        }
    }
}

/// `dev`'s max_segments, and the merge ceiling as check must state it, from the device's own
/// limits.
fn merge_ceiling(dev: &TestDisk) -> (u64, String) {
    // A loop device: 128 segments of 4 KiB pages bind before max_sectors_kb 1280; vdb: 254
    // segments.
    let attr = |a: &str| -> u64 {
        dev.queue_attr(a)
            .parse()
            .unwrap_or_else(|_| panic!("{}: queue/{a} is not a number", dev.name))
    };
    let (max_kb, max_segments) = (attr("max_sectors_kb"), attr("max_segments"));
    if !dev.is_lab_disk() {
        assert_eq!(max_segments, 128, "a loop device's max_segments");
    }
    let by_segments = max_segments * 4;
    let set_by = if max_kb <= by_segments {
        "max_sectors_kb"
    } else {
        "max_segments"
    };
    let ceiling = format!(
        "the largest request merging can build is {} = min(max_sectors_kb {}, max_segments \
         {max_segments} × 4 KiB pages = {}), set by {set_by}",
        kib(max_kb.min(by_segments)),
        kib(max_kb),
        kib(by_segments)
    );
    (max_segments, ceiling)
}

/// The device, scheduler and nomerges findings of `check --json` (`v`) for `(sched, nm)`.
fn check_queue_findings(v: &Value, dev: &BlockDev, (sched, nm): (&str, u32), ctx: &str) {
    assert!(
        finding(v, "device").starts_with(&format!(
            "{} ({}): blk-mq device, 1 hardware queue",
            dev.name,
            dev.maj_min()
        )),
        "{ctx}"
    );
    let s = finding(v, "scheduler");
    assert!(s.starts_with(sched), "{ctx}");
    if sched == "none" {
        assert!(
            s.contains("no elevator") && s.contains("blk_bio_list_merge"),
            "{ctx}"
        );
    } else {
        assert!(
            s.contains("elv_merge") && s.contains("elv_attempt_insert_merge"),
            "{ctx}"
        );
    }

    let n = finding(v, "nomerges");
    let l = lever(v, "nomerges").unwrap_or_default();
    let nomerges_file = format!("/sys/block/{}/queue/nomerges", dev.name);
    assert!(l.contains(&nomerges_file), "{ctx}");
    match (sched, nm) {
        (_, 0) => {
            assert!(
                n.starts_with("nomerges=0: all merge attempts are on"),
                "{ctx}"
            );
            assert!(l.starts_with(&format!("echo 2 > {nomerges_file}")), "{ctx}");
        }
        ("none", 1) => {
            assert!(
                n.starts_with("nomerges=1 changes nothing with scheduler none: only elv_merge's hash lookup and elv_attempt_insert_merge consult it"),
                "{ctx}"
            );
            assert!(l.contains("1 is the same as 0 on this path"), "{ctx}");
        }
        (_, 1) => {
            assert!(
                n.starts_with("nomerges=1 with mq-deadline: plug merges still happen"),
                "{ctx}"
            );
            assert!(n.contains("skipping the hash lookup"), "{ctx}");
        }
        _ => {
            assert!(n.starts_with("nomerges=2 disables all bio merges"), "{ctx}");
            assert!(l.starts_with(&format!("echo 0 > {nomerges_file}")), "{ctx}");
        }
    }
}

/// The throttle and tier findings of `check --json` (`v`).
fn check_throttle_and_tier(v: &Value, dev: &BlockDev, ctx: &str) {
    // This test sets no limit; one left behind by someone else must still be named.
    let throttled = v["throttled"].as_array().unwrap();
    if throttled.is_empty() {
        assert_eq!(
            finding(v, "throttle"),
            format!("no cgroup limits {} ({})", dev.name, hierarchy_words()),
            "{ctx}"
        );
    } else {
        assert_eq!(findings(v, "throttle").len(), throttled.len(), "{ctx}");
    }

    let tier = &v["tier"];
    let t = finding(v, "tier");
    if std::env::var("MERGETRACE_LAB").is_ok_and(|l| l == "1") {
        // The lab's guests (6.1, 6.12) allow fentry: check must say so.
        assert_eq!(tier["name"], "fentry", "in the lab; {ctx}");
        assert!(t.starts_with("fentry tier available"), "{t}; {ctx}");
    }
    match tier["name"].as_str() {
        Some("fentry") => assert!(
            tier["reason"]
                .as_str()
                .unwrap()
                .starts_with("fentry tier available"),
            "{ctx}"
        ),
        Some("tracepoint") => {
            let r = tier["reason"].as_str().unwrap();
            assert!(
                r == "fentry refused by this kernel's policy: tracepoint tier"
                    || r.starts_with("fentry probe failed ("),
                "{ctx}"
            );
        }
        other => panic!("tier {other:?} as root on a BTF kernel; {ctx}"),
    }
    assert!(t.starts_with(tier["reason"].as_str().unwrap()), "{ctx}");
    assert!(
        t.contains("BTF present") && t.contains("CAP_SYS_ADMIN"),
        "{ctx}"
    );
}

#[test]
fn diskstats_arithmetic_matches_the_kernel_counters() {
    require_root();
    // A loop device made for this test: its counters start at zero (a reused one's hold its
    // earlier users' I/O, which check must say, and does: the "counters" finding).
    let dev = LoopDevice::disposable(32 << 20);
    set_queue(&dev, "none", 0);
    // 1 MiB of 4 KiB direct writes, one at a time (dd), then a buffered 1 MiB read back.
    run_cmd(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", dev.path.display()),
        "bs=4k",
        "count=256",
        "oflag=direct",
        "status=none",
    ]));
    let before = dev.diskstats();
    let v = check_json(&dev);
    let after = dev.diskstats();
    let rw = |d: &DiskStats| {
        (
            (d.reads, d.reads_merged, d.sectors_read, d.ms_reading),
            (d.writes, d.writes_merged, d.sectors_written, d.ms_writing),
        )
    };
    assert_eq!(
        rw(&before),
        rw(&after),
        "the device's read/write counters moved while check ran (something else uses {})",
        dev.name
    );
    let (writes, wmerged, wsectors) = (after.writes, after.writes_merged, after.sectors_written);
    assert_eq!(
        writes + wmerged,
        256,
        "dd's 256 writes are all the device wrote since it was added: {after:?}"
    );
    assert_eq!(v["diskstats"]["writes"], writes);
    assert_eq!(v["diskstats"]["writes_merged"], wmerged);
    assert_eq!(v["diskstats"]["write_sectors"], wsectors);
    let w = finding(&v, "write merges");
    let rate = 100.0 * wmerged as f64 / (writes + wmerged) as f64;
    // Nothing wrote to the device during check's sample.
    let last = format!("last {:.1} s", v["sample"]["seconds"].as_f64().unwrap());
    assert_eq!(
        w,
        format!(
            "write merge rate since {} was added: {rate:.1} % ({} of {} write bios merged into \
             {} device requests); {last}: no writes; diskstats' merged also counts \
             request-request merges",
            dev.name,
            thousands(wmerged),
            thousands(writes + wmerged),
            thousands(writes)
        )
    );
    assert!(lever(&v, "write merges")
        .unwrap()
        .contains("submit in batches"));
    let s = finding(&v, "write request size");
    assert_eq!(
        s,
        format!(
            "average write request reaching the device since {} was added: {:.2} KiB ({} sectors \
             over {} requests); merging can build up to 512 KiB",
            dev.name,
            wsectors as f64 / writes as f64 / 2.0,
            thousands(wsectors),
            thousands(writes)
        )
    );
    assert!(
        finding(&v, "counters").contains("not from when its file was attached"),
        "{v:#}"
    );
}

/// Discards have diskstats fields of their own and are reported apart; write-zeroes requests
/// are counted as writes there, which check says, and their size shows in the write average.
#[test]
fn discards_apart_and_write_zeroes_named() {
    require_root();
    let dev = LoopDevice::disposable(128 << 20);
    workloads::require_write_zeroes(&dev);
    // 64 MiB of write-zeroes (fallocate --punch-hole: REQ_OP_WRITE_ZEROES, never zero pages),
    // 8 data writes of 4 KiB, then one 8 MiB discard elsewhere.
    workloads::write_zeroes(&dev, None, 64 << 20);
    run_cmd(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", dev.path.display()),
        "bs=4k",
        "count=8",
        "oflag=direct",
        "seek=20480",
        "status=none",
    ]));
    workloads::blkdiscard(&dev, None, 96 << 20, 8 << 20);
    let v = check_json(&dev);
    let d = dev.diskstats();
    assert_eq!(v["diskstats"]["discards"], d.discards, "{v:#}");
    assert_eq!(v["diskstats"]["discard_sectors"], d.sectors_discarded);
    assert_eq!(d.sectors_discarded, (8 << 20) / 512, "{d:?}");
    // The discard lines carry the kernel's discard counters, the write lines its write ones
    // (write-zeroes included: 64 MiB + 32 KiB of sectors).
    let dbios = d.discards + d.discards_merged;
    assert_eq!(
        finding(&v, "discard merges"),
        format!(
            "discard merge rate since {} was added: {:.1} % ({} of {} discard bio{} merged into \
             {} device request{}); last {:.1} s: no discards; diskstats' merged also counts \
             request-request merges",
            dev.name,
            100.0 * d.discards_merged as f64 / dbios as f64,
            thousands(d.discards_merged),
            thousands(dbios),
            if dbios == 1 { "" } else { "s" },
            thousands(d.discards),
            if d.discards == 1 { "" } else { "s" },
            v["sample"]["seconds"].as_f64().unwrap(),
        )
    );
    let ds = finding(&v, "discard request size");
    assert!(
        ds.contains(&format!(
            "({} sectors over {} request",
            thousands(d.sectors_discarded),
            thousands(d.discards)
        )),
        "{ds}"
    );
    assert_eq!(d.sectors_written, (64 << 20) / 512 + 64, "{d:?}");
    let ws = finding(&v, "write request size");
    assert!(
        ws.contains(&format!(
            "({} sectors over {} request",
            thousands(d.sectors_written),
            thousands(d.writes)
        )),
        "{ws}"
    );
    // A write-zeroes request is as large as write_zeroes_max_bytes lets it be, so the 64 MiB
    // lift the write average above max_sectors_kb, which no data write exceeds: check says why.
    let max_sectors_kb: u64 = dev.queue_attr("max_sectors_kb").parse().unwrap();
    assert!(
        d.sectors_written > max_sectors_kb * 2 * d.writes,
        "64 MiB of write-zeroes and 8 writes: an average of {} sectors, not above \
         max_sectors_kb {max_sectors_kb}; {d:?}",
        d.sectors_written / d.writes
    );
    assert!(
        ws.ends_with(&format!(
            "this average is above max_sectors_kb ({}), the most a data write carries: \
             write-zeroes requests, counted as writes, are in it (write-zeroes, below)",
            kib(max_sectors_kb)
        )),
        "{ws}"
    );
    let note = finding(&v, "write-zeroes");
    assert!(
        note.starts_with(&format!(
            "{} takes write-zeroes requests of up to ",
            dev.name
        )) && note
            .contains("; /proc/diskstats counts them as writes and has no field of their own"),
        "{note}"
    );
}

/// The sample is what the device does now: its counts grow between check's two reads, inside
/// what the kernel counted around the whole run of check.
#[test]
fn the_sample_is_what_the_device_does_now() {
    require_root();
    let dev = LoopDevice::disposable(64 << 20);
    set_queue(&dev, "none", 0);
    // 4 KiB sequential writes submitted 32 at a time, until killed: they merge.
    let writer = Fio::sequential("now", &dev, "write", 64 << 20, 32)
        .opt("time_based", "1")
        .opt("runtime", "600")
        .spawn();
    let started = dev.diskstats();
    while dev.diskstats().writes == started.writes {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let before = dev.diskstats();
    let (stdout, _) = succeeded(
        mergetrace(&["check", "-d", &dev.name, "--json", "--sample", "2s"]),
        "check --sample 2s",
    );
    let after = dev.diskstats();
    writer.kill();
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    let s = &v["sample"]["diskstats"];
    let n = |key: &str| s[key].as_u64().unwrap();
    let around = after.since(&before);
    let (writes, merged) = (n("writes"), n("writes_merged"));
    assert!(
        writes > 0 && writes <= around.writes && merged <= around.writes_merged,
        "the sample ({writes} writes, {merged} merged) lies within what the kernel counted \
         around check ({around:?})"
    );
    assert!(n("reads") <= around.reads && n("write_sectors") <= around.sectors_written);
    let seconds = v["sample"]["seconds"].as_f64().unwrap();
    let bios = writes + merged;
    let w = finding(&v, "write merges");
    assert!(
        w.contains(&format!(
            "device requests); last {seconds:.1} s: {:.1} % ({} of {} bios, {} bios/s); \
             diskstats'",
            100.0 * merged as f64 / bios as f64,
            thousands(merged),
            thousands(bios),
            thousands((bios as f64 / seconds).round() as u64)
        )),
        "{w}"
    );
    assert!(
        finding(&v, "write request size").contains(&format!(
            "requests); last {seconds:.1} s: {:.2} KiB; merging",
            n("write_sectors") as f64 / writes as f64 / 2.0
        )),
        "{v:#}"
    );
}

#[test]
fn names_every_throttled_cgroup_and_its_limit_kinds() {
    require_root();
    let dev = LoopDevice::new(32 << 20);
    set_queue(&dev, "none", 0);
    let iops = Cgroup::new();
    iops.set_device_limit("blkio.throttle.write_iops_device", &dev, 1000);
    let both = Cgroup::new();
    both.set_device_limit("blkio.throttle.read_iops_device", &dev, 50);
    both.set_device_limit("blkio.throttle.write_bps_device", &dev, 8 << 20);

    let v = check_json(&dev);
    let t = findings(&v, "throttle");
    assert_eq!(t.len(), 2, "{v:#}");
    let of = |cg: &Cgroup| {
        *t.iter()
            .find(|f| {
                f["finding"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("cgroup {} ", cg.path()))
            })
            .unwrap_or_else(|| panic!("no throttle finding names {}: {v:#}", cg.path()))
    };
    let f = of(&iops);
    let (source, binds) = if cgroup_hierarchy().0 == CgroupVersion::V2 {
        ("cgroup v2 io.max", "it and every cgroup below it")
    } else {
        (
            "cgroup v1 blkio blkio.throttle.*_device",
            "only its own bios (cgroup v1 throttling is flat: children are not limited)",
        )
    };
    assert_eq!(
        f["finding"],
        format!(
            "cgroup {} ({source}) limits {}: wiops=1,000 bios/s — binds {binds}",
            iops.path(),
            dev.name
        )
    );
    assert_eq!(
        f["lever"],
        "wiops: iops limit counts bios before merging: submit larger bios; merging cannot raise it"
    );
    let f = of(&both);
    let text = f["finding"].as_str().unwrap();
    assert!(text.contains("wbps=8 MiB/s, riops=50 bios/s"), "{text}");
    assert_eq!(
        f["lever"],
        "riops: iops limit counts bios before merging: submit larger bios; merging cannot raise it; wbps: bps limit is blind to merging (a merged bio carries the same bytes)"
    );
    let listed: Vec<&str> = v["throttled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&iops.path().as_str()) && listed.contains(&both.path().as_str()));

    // The text form carries the same sentence.
    let out = mergetrace(&["check", "-d", &dev.name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with(&format!("throttle: cgroup {} ", iops.path()))
            && l.contains("wiops=1,000")
            && l.ends_with("— lever: wiops: iops limit counts bios before merging: submit larger bios; merging cannot raise it")),
        "{text}"
    );
    assert_eq!(
        text.lines().count(),
        v["findings"].as_array().unwrap().len(),
        "one line per finding: {text}"
    );

    // Limits removed with their cgroups: nothing names them any more.
    drop(iops);
    drop(both);
    let v = check_json(&dev);
    assert!(
        finding(&v, "throttle").starts_with("no cgroup limits"),
        "{v:#}"
    );
}

#[test]
fn a_bad_device_is_one_line() {
    require_root();
    let out = mergetrace(&["check", "-d", "mt-no-such-disk", "--json"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("mergetrace: error: unknown block device 'mt-no-such-disk'"),
        "{err}"
    );
}

/// The hook table (docs/hooks.md, `compat::HOOKS`) holds on the running kernel: every hook
/// expected for this kernel version is present in its BTF / kallsyms.
#[test]
fn hook_table_holds_on_this_kernel() {
    require_root();
    let dev = LoopDevice::new(16 << 20);
    let v = check_json(&dev);
    let hooks = v["hooks"]
        .as_array()
        .expect("check --json has a hooks section");
    assert!(hooks.len() >= 25, "{hooks:?}");
    let missing: Vec<&serde_json::Value> = hooks
        .iter()
        .filter(|h| h["expected"] == true && h["present"] == false)
        .collect();
    assert!(
        missing.is_empty(),
        "hooks expected on this kernel but missing: {missing:?}"
    );
}

/// `check` names the limit in force as the live view counts it: on cgroup v2 a child's own
/// wiops above its parent's is not in force (the tightest along the path holds); on v1
/// (flat) each limit binds its own cgroup, so nothing is said.
#[test]
fn a_tighter_parent_limit_is_the_one_check_names() {
    require_root();
    let dev = LoopDevice::new(32 << 20);
    set_queue(&dev, "none", 0);
    let parent = Cgroup::new();
    let child = parent.child();
    parent.set_write_iops(&dev, 500);
    child.set_write_iops(&dev, 2000);
    let v = check_json(&dev);
    let t = findings(&v, "throttle");
    let of_child = t
        .iter()
        .find(|f| {
            f["finding"]
                .as_str()
                .unwrap()
                .starts_with(&format!("cgroup {} ", child.path()))
        })
        .unwrap_or_else(|| panic!("no finding for {}: {v:#}", child.path()));
    let text = of_child["finding"].as_str().unwrap();
    let held = format!(
        "its wiops=2,000 is not in force: {}'s 500 binds it",
        parent.path()
    );
    if cgroup_hierarchy().0 == CgroupVersion::V2 {
        assert!(text.contains(&held), "{text}");
    } else {
        assert!(!text.contains("not in force"), "{text}");
    }
}
