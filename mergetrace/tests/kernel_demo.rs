//! `mergetrace demo --quick` in CI: the built-in merging lab runs end to end on a real loop
//! device and its own self-check (every count equal to /proc/diskstats and blk-throttle's
//! counter) passes.
mod support;

use std::{fs, process::Command};

use support::{mergetrace_bin, require_root};

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
    let out = Command::new(mergetrace_bin())
        .args(["demo", "--quick"])
        .output()
        .expect("cannot run mergetrace demo");
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
    assert!(
        stdout.contains("self-check: all 9 arms equal the kernel's counters"),
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
