//! `mergetrace demo --quick` in CI: the built-in merging lab runs end to end on a real loop
//! device and its own self-check (every count equal to /proc/diskstats and blk-throttle's
//! counter, and under io.cost every charge equal to io.stat's `cost.usage`) passes. The io.cost
//! arm runs where cgroup v2 has io.cost (the lab's guests: `./mt lab --kernel 6.12 --test
//! kernel_demo`); elsewhere the demo must say in one line why it is skipped. The demo also
//! passes while another process reads its scratch disk, as udev's blkid does a new disk.
mod support;

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    sync::Mutex,
    time::Duration,
};

use support::{
    cgroup_hierarchy, mergetrace_bin, require_root, unique_name, CgroupVersion, Spawned,
};

/// One demo at a time: the first test predicts which loop device the demo gets.
static ONE_DEMO: Mutex<()> = Mutex::new(());

/// The queue settings the demo changes, of /sys/block/NAME/queue.
fn queue_settings(name: &str) -> Vec<String> {
    ["scheduler", "nomerges", "max_sectors_kb"]
        .iter()
        .map(|a| {
            fs::read_to_string(format!("/sys/block/{name}/queue/{a}"))
                .unwrap_or_else(|e| panic!("cannot read {name}'s {a}: {e}"))
                .trim()
                .to_string()
        })
        .collect()
}

/// Puts a loop device's queue settings back as they were before the test changed them.
struct PutBack(String, Vec<String>);

impl PutBack {
    fn new(name: &str) -> PutBack {
        let mut v = queue_settings(name);
        // the active scheduler, not the list
        v[0] = v[0]
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .unwrap_or("none")
            .to_string();
        PutBack(name.to_string(), v)
    }
}

impl Drop for PutBack {
    fn drop(&mut self) {
        for (attr, v) in ["scheduler", "nomerges", "max_sectors_kb"]
            .iter()
            .zip(&self.1)
            .rev()
        {
            let _ = fs::write(format!("/sys/block/{}/queue/{attr}", self.0), v);
        }
    }
}

#[test]
fn quick_demo_runs_the_merging_lab_and_checks_itself() {
    require_root();
    let _one = ONE_DEMO.lock().unwrap_or_else(|p| p.into_inner());
    // The loop device the demo will get (tests of this binary run alone): left by an earlier
    // user with other settings, which the demo must neither depend on nor change.
    let next = String::from_utf8_lossy(&Command::new("losetup").arg("-f").output().unwrap().stdout)
        .trim()
        .trim_start_matches("/dev/")
        .to_string();
    let stale = fs::metadata(format!("/sys/block/{next}/queue")).is_ok();
    let _put_back = stale.then(|| PutBack::new(&next));
    if stale {
        for (attr, v) in [
            ("scheduler", "kyber"),
            ("nomerges", "2"),
            ("max_sectors_kb", "64"),
        ] {
            fs::write(format!("/sys/block/{next}/queue/{attr}"), v).unwrap();
        }
    }
    let before = stale.then(|| queue_settings(&next));
    let run = || {
        Command::new(mergetrace_bin())
            .args(["demo", "--quick"])
            .output()
            .expect("cannot run mergetrace demo")
    };
    let mut out = run();
    if !out.status.success() && only_unseen_completions(&String::from_utf8_lossy(&out.stderr)) {
        // On 6.18 the kernel now and then ends a request without running eBPF programs on
        // block_rq_complete (ftrace's own event records it; bpftrace misses it too): about one
        // demo in 40 here, always in a latency arm, always completions only. The demo says so
        // and fails; one more run must then pass exactly, and any other mismatch fails at once.
        eprintln!(
            "demo run 1 saw completions the kernel never showed the programs; once more:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out = run();
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    // Table 1 as measured on loop devices here (scenarios.md, scaled to 64 MiB).
    for row in [
        "| nomerges=0, batched (32) | 512 | 15,872 | 128.0 KiB | = |",
        "| nomerges=1, batched (32) | 512 | 15,872 | 128.0 KiB | = |",
        "| nomerges=2, batched (32) | 16,384 | 0 | 4.0 KiB | = |",
        "| nomerges=0, one at a time (1) | 16,384 | 0 | 4.0 KiB | = |",
    ] {
        assert!(stdout.contains(row), "missing row {row}\n{stdout}");
    }
    assert!(
        stdout.contains("| 32 | 512 | 32.0 | 128.0 KiB | = |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("this limit counts before merging"),
        "{stdout}"
    );
    // Table 5: the reader's latency beside the writer at each nomerges level, its counts
    // checked (a row each, "=": its latency counts equal its requests and diskstats). The
    // writer's requests: merged into 128 KiB with nomerges 0 and 1, one per bio with 2.
    let latency = stdout
        .split("\n5. What merging costs the requests beside it")
        .nth(1)
        .unwrap_or_else(|| panic!("no latency table: {stdout}"));
    for (nomerges, requests) in [(0, "256"), (1, "256"), (2, "8,192")] {
        let row = latency
            .lines()
            .find(|l| l.starts_with(&format!("| {nomerges} | ")))
            .unwrap_or_else(|| panic!("no row nomerges={nomerges}: {latency}"));
        assert!(
            row.starts_with(&format!("| {nomerges} | {requests} | ")),
            "{row}"
        );
        assert!(row.ends_with("| = |"), "{row}");
    }
    let arms = if iocost_here() {
        assert_iocost_arm(&stdout);
        14
    } else {
        assert!(
            stdout.contains(&format!(
                "\n4. Under io.cost: skipped — {}",
                why_no_iocost()
            )),
            "{stdout}"
        );
        12
    };
    assert!(
        stdout.contains(&format!(
            "self-check: all {arms} arms equal the kernel's counters"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains('≠'), "{stdout}");
    // It cleaned up after itself.
    let pid_marker = "mergetrace-demo-";
    let losetup = Command::new("losetup").arg("-a").output().unwrap();
    let attached = String::from_utf8_lossy(&losetup.stdout);
    let leftovers: Vec<&str> = attached
        .lines()
        .filter(|l| l.contains(pid_marker))
        .collect();
    assert!(
        leftovers.is_empty(),
        "demo left loop devices behind: {leftovers:?}"
    );
    if let Some(before) = before {
        assert!(
            stdout.contains(&format!("/dev/{next}")) || stdout.contains(&next),
            "{stdout}"
        );
        assert_eq!(
            queue_settings(&next),
            before,
            "the demo did not put {next}'s queue settings back"
        );
    }
}

/// Another process reads the demo's scratch disk the whole time (4 KiB O_DIRECT reads, 64 at a
/// time, in a loop until the disk goes away), in its own cgroup: the demo's self-check counts
/// only its own cgroups' I/O and the disk's write counters, so it still passes exactly.
#[test]
fn the_demo_passes_while_another_process_reads_its_disk() {
    require_root();
    let _one = ONE_DEMO.lock().unwrap_or_else(|p| p.into_inner());
    let out = Scratch::new("demo.out");
    let passes = Scratch::new("reads.out");
    let demo = Command::new(mergetrace_bin())
        .args(["demo", "--quick"])
        .stdout(fs::File::create(&out.0).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run mergetrace demo");
    let (mut demo, lines) = Spawned::new(demo);
    // "mergetrace demo: scratch disk loop3 (7:3) on /dev/shm/mergetrace-demo-PID.img"
    let disk = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("the demo named no scratch disk ({e}): {}", demo.stderr()));
        if let Some(rest) = line.strip_prefix("mergetrace demo: scratch disk ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let path = format!("/dev/{disk}");
    // Each pass is one dd; the loop ends when dd fails (the disk detached). Each pass adds a
    // line to a file, so the test knows the reads ran.
    let reader = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while dd if={path} of=/dev/null bs=4k count=64 iflag=direct status=none; do echo .; done"
        ))
        .stdout(fs::File::create(&passes.0).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start the reader");
    let reader_pid = reader.id();
    let mut reader = KillOnDrop(reader);
    let status = demo
        .wait_exit(Duration::from_secs(900))
        .unwrap_or_else(|| panic!("the demo did not finish: {}", demo.stderr()));
    // The disk is gone, so the loop has ended or ends at its next dd; stop it by its pid.
    unsafe {
        libc::kill(reader_pid as libc::pid_t, libc::SIGKILL);
    }
    let _ = reader.0.wait();
    // `losetup -d` of a disk still open (a dd of the reader's) only marks it to be freed at the
    // last close: wait until it is, so the next demo's `losetup -f` finds what the first test
    // predicts.
    let backing = format!("/sys/block/{disk}/loop/backing_file");
    for _ in 0..500 {
        if !std::path::Path::new(&backing).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let passes = fs::read_to_string(&passes.0).unwrap().lines().count();
    let stdout = fs::read_to_string(&out.0).unwrap();
    let stderr = demo.stderr();
    assert!(
        status.success() || only_unseen_completions(&stderr),
        "the demo failed while another process read {disk}: {status}\n{stdout}\n{stderr}"
    );
    assert!(
        passes >= 10,
        "the reader read {disk} only {passes} times (64 reads each) during the demo"
    );
    if status.success() {
        assert!(!stderr.contains("MISMATCH"), "{stderr}");
        assert!(
            stdout.contains("self-check: all ") && !stdout.contains('≠'),
            "{stdout}"
        );
    }
}

/// A file in /dev/shm for one test, removed at its end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        Scratch(PathBuf::from(format!("/dev/shm/{}-{what}", unique_name())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A child killed (by its pid) when the test ends, also on a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// cgroup v2 with io.cost: the root has `io.cost.qos`.
fn iocost_here() -> bool {
    cgroup_hierarchy().0 == CgroupVersion::V2 && cgroup_hierarchy().1.join("io.cost.qos").exists()
}

/// What the demo must say where io.cost cannot be on.
fn why_no_iocost() -> &'static str {
    match cgroup_hierarchy().0 {
        CgroupVersion::V1 => {
            "io.cost is a cgroup v2 controller, and this machine's io controller is blkio on \
             cgroup v1"
        }
        CgroupVersion::V2 => "this kernel has no io.cost (CONFIG_BLK_CGROUP_IOCOST)",
    }
}

/// Table 4: both arms checked against io.stat ("="), merging cutting the requests io.cost
/// charged a base for by more than 8× (counts: batches of 32 merge into one request), and
/// io.cost off again for the scratch disk afterwards.
fn assert_iocost_arm(stdout: &str) {
    let table = stdout
        .split("\n4. Under io.cost (cgroup v2; ")
        .nth(1)
        .unwrap_or_else(|| panic!("no io.cost table: {stdout}"));
    let requests = |arm: &str| -> u64 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {arm} |")))
            .unwrap_or_else(|| panic!("no row {arm}: {table}"));
        assert!(row.ends_with("| = |"), "{row}");
        row.split('|')
            .nth(2)
            .unwrap()
            .trim()
            .replace(',', "")
            .parse()
            .unwrap()
    };
    let (on, off) = (
        requests("nomerges=0 (merging on)"),
        requests("nomerges=2 (merging off)"),
    );
    assert_eq!(
        off, 4097,
        "one request per bio with merging off, the last write included"
    );
    assert!(on * 8 < off, "merging on: {on} requests, off: {off}");
    assert!(table.contains("Where the meter sits: io.cost charges a bio that starts a request"));
    // The scratch disk (named in the title) has io.cost off again.
    let disk = stdout
        .split(" O_DIRECT writes on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the demo names its disk");
    let qos = fs::read_to_string(cgroup_hierarchy().1.join("io.cost.qos")).unwrap();
    let maj_min = fs::read_to_string(format!("/sys/block/{disk}/dev")).unwrap_or_default();
    let maj_min = maj_min.trim();
    assert!(
        maj_min.is_empty()
            || !qos
                .lines()
                .any(|l| l.starts_with(&format!("{maj_min} enable=1"))),
        "io.cost left on for {disk}: {qos}"
    );
}

/// Whether every mismatch the demo reported is a latency arm's completions the kernel never
/// ran the completion program for (each request issued, counted and equal to diskstats).
fn only_unseen_completions(stderr: &str) -> bool {
    let mismatches: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("mergetrace demo: MISMATCH "))
        .collect();
    !mismatches.is_empty()
        && mismatches.iter().all(|l| {
            l.contains("requests ended without the kernel running mergetrace's completion program")
        })
}
