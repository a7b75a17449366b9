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
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
};

use serde_json::Value;

const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
static NEXT: AtomicUsize = AtomicUsize::new(1);
/// `losetup -f` picks a free device, then binds it: serialise within this process.
static LOSETUP: Mutex<()> = Mutex::new(());

fn unique(what: &str) -> String {
    format!(
        "mt-check-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "kernel_check needs root (loop devices, sysfs queue settings, blkio cgroups): run \
         `sudo -E cargo test --release -p mergetrace --test kernel_check`; it fails instead of \
         skipping on purpose"
    );
    assert!(
        Command::new("losetup").arg("--version").output().is_ok(),
        "kernel_check needs `losetup` (util-linux) in PATH"
    );
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_sysfs(path: &Path, value: &str) {
    fs::write(path, value)
        .unwrap_or_else(|e| panic!("cannot write {value:?} to {}: {e}", path.display()));
}

/// A loop device over a file in /dev/shm; detached and deleted on drop, with the queue
/// settings it had restored (loop devices are reused and keep their sysfs settings).
struct LoopDevice {
    dev: PathBuf,
    name: String,
    file: PathBuf,
    saved: Vec<(PathBuf, String)>,
}

impl LoopDevice {
    fn new(size: u64) -> LoopDevice {
        let file = PathBuf::from(format!("/dev/shm/{}.img", unique("loop")));
        let f = fs::File::create(&file)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", file.display()));
        f.set_len(size).unwrap();
        drop(f);
        let out = {
            let _g = LOSETUP.lock().unwrap_or_else(|p| p.into_inner());
            Command::new("losetup")
                .args(["-f", "--show"])
                .arg(&file)
                .output()
                .expect("cannot run losetup")
        };
        if !out.status.success() {
            let _ = fs::remove_file(&file);
            panic!(
                "losetup -f --show {} failed: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        let name = dev.file_name().unwrap().to_string_lossy().into_owned();
        let mut d = LoopDevice {
            dev,
            name,
            file,
            saved: Vec::new(),
        };
        for attr in ["scheduler", "nomerges"] {
            let p = d.queue(attr);
            let v = fs::read_to_string(&p).unwrap_or_default();
            let v = if attr == "scheduler" {
                v.split_whitespace()
                    .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
                    .unwrap_or("none")
                    .to_string()
            } else {
                v.trim().to_string()
            };
            d.saved.push((p, v));
        }
        let _ = Command::new("udevadm").arg("settle").status();
        d
    }

    fn queue(&self, attr: &str) -> PathBuf {
        PathBuf::from(format!("/sys/block/{}/queue/{attr}", self.name))
    }

    fn maj_min(&self) -> String {
        fs::read_to_string(format!("/sys/block/{}/dev", self.name))
            .unwrap()
            .trim()
            .to_string()
    }

    fn set(&self, scheduler: &str, nomerges: u8) {
        write_sysfs(&self.queue("scheduler"), scheduler);
        write_sysfs(&self.queue("nomerges"), &nomerges.to_string());
        let active = fs::read_to_string(self.queue("scheduler")).unwrap();
        assert!(
            active.contains(&format!("[{scheduler}]")),
            "{}: scheduler {scheduler} not active: {active}",
            self.name
        );
    }

    /// The device's /proc/diskstats numbers after the name.
    fn diskstats(&self) -> Vec<u64> {
        let text = fs::read_to_string("/proc/diskstats").unwrap();
        text.lines()
            .find_map(|l| {
                let mut it = l.split_whitespace();
                let (_, _, n) = (it.next()?, it.next()?, it.next()?);
                (n == self.name).then(|| it.map(|v| v.parse().unwrap()).collect())
            })
            .unwrap_or_else(|| panic!("{} not in /proc/diskstats", self.name))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        for (p, v) in &self.saved {
            let _ = fs::write(p, v);
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = fs::remove_file(&self.file);
    }
}

/// The hierarchy blk-throttle's limits live in, as mergetrace picks it: the v1 blkio mount
/// (this host), else cgroup v2 (the lab's guests). `(v2, mount)`.
fn hierarchy() -> (bool, PathBuf) {
    if Path::new(BLKIO_ROOT)
        .join("blkio.throttle.write_iops_device")
        .exists()
    {
        return (false, PathBuf::from(BLKIO_ROOT));
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = mountinfo
        .lines()
        .filter_map(|l| l.split_once(" - "))
        .find(|(_, right)| right.starts_with("cgroup2 "))
        .and_then(|(left, _)| left.split(' ').nth(4))
        .map(PathBuf::from)
        .expect("kernel_check needs the cgroup v1 blkio hierarchy or cgroup v2");
    (true, root)
}

/// How `check` names the hierarchy ("cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio").
fn hierarchy_words() -> String {
    let (v2, root) = hierarchy();
    let name = if v2 { "cgroup v2" } else { "cgroup v1 blkio" };
    format!("{name} hierarchy at {}", root.display())
}

/// A cgroup of blk-throttle's hierarchy (v1 blkio or v2); removed on drop.
struct Cgroup {
    dir: PathBuf,
    name: String,
}

impl Cgroup {
    fn new() -> Cgroup {
        let (v2, root) = hierarchy();
        if v2 {
            // Children have io.max only with io in the root's subtree_control.
            let control = root.join("cgroup.subtree_control");
            if !fs::read_to_string(&control)
                .unwrap_or_default()
                .contains("io")
            {
                write_sysfs(&control, "+io");
            }
        }
        let name = unique("cg");
        let dir = root.join(&name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Cgroup { dir, name }
    }

    fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// One limit, named by its v1 file: on v2 the matching `io.max` key.
    fn set(&self, file: &str, dev: &LoopDevice, value: u64) {
        if !hierarchy().0 {
            write_sysfs(&self.dir.join(file), &format!("{} {value}", dev.maj_min()));
            return;
        }
        let key = match file {
            "blkio.throttle.read_iops_device" => "riops",
            "blkio.throttle.write_iops_device" => "wiops",
            "blkio.throttle.read_bps_device" => "rbps",
            "blkio.throttle.write_bps_device" => "wbps",
            other => panic!("no io.max key for {other}"),
        };
        write_sysfs(
            &self.dir.join("io.max"),
            &format!("{} {key}={value}", dev.maj_min()),
        );
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Limits go with the directory; no process was ever put in it.
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("warning: cannot remove {}: {e}", self.dir.display());
        }
    }
}

fn mergetrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mergetrace"))
        .args(args)
        .output()
        .expect("cannot run the mergetrace binary")
}

/// `mergetrace check -d DEV --json`, parsed.
fn check_json(dev: &LoopDevice) -> Value {
    let out = mergetrace(&["check", "-d", &dev.name, "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mergetrace check -d {} --json failed ({}): {stderr}",
        dev.name,
        out.status
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

fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn every_scheduler_and_nomerges_level() {
    require_root();
    let dev = LoopDevice::new(32 << 20);
    for sched in ["none", "mq-deadline"] {
        for nm in [0u8, 1, 2] {
            dev.set(sched, nm);
            let v = check_json(&dev);
            let ctx = format!("scheduler {sched}, nomerges {nm}: {v:#}");
            assert_eq!(v["queue"]["scheduler"]["active"], sched, "{ctx}");
            assert_eq!(v["queue"]["nomerges"], nm, "{ctx}");
            assert_eq!(v["queue"]["hw_queues"], 1, "{ctx}");

            assert!(
                finding(&v, "device").starts_with(&format!(
                    "{} ({}): blk-mq device, 1 hardware queue",
                    dev.name,
                    dev.maj_min()
                )),
                "{ctx}"
            );
            let s = finding(&v, "scheduler");
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

            let n = finding(&v, "nomerges");
            let l = lever(&v, "nomerges").unwrap_or_default();
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

            // Loop devices: 128 segments of 4 KiB pages bind before max_sectors_kb (1280).
            assert_eq!(v["queue"]["max_segments"], 128, "{ctx}");
            assert!(
                finding(&v, "merge ceiling").starts_with(
                    "the largest request merging can build is 512 KiB = min(max_sectors_kb 1,280 KiB, max_segments 128 × 4 KiB pages = 512 KiB), set by max_segments"
                ),
                "{ctx}"
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

            // This test sets no limit; one left behind by someone else must still be named.
            let throttled = v["throttled"].as_array().unwrap();
            if throttled.is_empty() {
                assert_eq!(
                    finding(&v, "throttle"),
                    format!("no cgroup limits {} ({})", dev.name, hierarchy_words()),
                    "{ctx}"
                );
            } else {
                assert_eq!(findings(&v, "throttle").len(), throttled.len(), "{ctx}");
            }

            let tier = &v["tier"];
            let t = finding(&v, "tier");
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
    }
}

#[test]
fn diskstats_arithmetic_matches_the_kernel_counters() {
    require_root();
    let dev = LoopDevice::new(32 << 20);
    dev.set("none", 0);
    // 1 MiB of 4 KiB direct writes, one at a time (dd), then a buffered 1 MiB read back.
    run_ok(Command::new("dd").args([
        "if=/dev/zero",
        &format!("of={}", dev.dev.display()),
        "bs=4k",
        "count=256",
        "oflag=direct",
        "status=none",
    ]));
    let before = dev.diskstats();
    let v = check_json(&dev);
    let after = dev.diskstats();
    assert_eq!(
        before[..8],
        after[..8],
        "the device's read/write counters moved while check ran (something else uses {})",
        dev.name
    );
    let (writes, wmerged, wsectors) = (after[4], after[5], after[6]);
    assert!(
        writes + wmerged >= 256,
        "dd's 256 writes are not in diskstats: {after:?}"
    );
    assert_eq!(v["diskstats"]["writes"], writes);
    assert_eq!(v["diskstats"]["writes_merged"], wmerged);
    assert_eq!(v["diskstats"]["write_sectors"], wsectors);
    let w = finding(&v, "write merges");
    let rate = 100.0 * wmerged as f64 / (writes + wmerged) as f64;
    assert!(w.starts_with("write merge rate since boot ("), "{w}");
    assert!(
        w.contains(&format!(
            ": {rate:.1} % ({} of {} write bios merged into {} device requests",
            group(wmerged),
            group(writes + wmerged),
            group(writes)
        )),
        "{w}"
    );
    assert!(lever(&v, "write merges")
        .unwrap()
        .contains("submit in batches"));
    let s = finding(&v, "write request size");
    assert!(
        s.starts_with(&format!(
            "average write request reaching the device: {:.2} KiB ({} sectors over {} requests; merging can build up to 512 KiB)",
            wsectors as f64 / writes as f64 / 2.0,
            group(wsectors),
            group(writes)
        )),
        "{s}"
    );
}

#[test]
fn names_every_throttled_cgroup_and_its_limit_kinds() {
    require_root();
    let dev = LoopDevice::new(32 << 20);
    dev.set("none", 0);
    let iops = Cgroup::new();
    iops.set("blkio.throttle.write_iops_device", &dev, 1000);
    let both = Cgroup::new();
    both.set("blkio.throttle.read_iops_device", &dev, 50);
    both.set("blkio.throttle.write_bps_device", &dev, 8 << 20);

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
    let (source, binds) = if hierarchy().0 {
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
