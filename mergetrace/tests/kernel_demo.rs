//! `mergetrace demo --quick` in CI: the article's lab runs end to end on a real loop device and
//! its own self-check (every count equal to /proc/diskstats and blk-throttle's counter) passes.
mod support;

use std::process::Command;

use support::require_root;

#[test]
fn quick_demo_reproduces_the_article_and_checks_itself() {
    require_root();
    let out = Command::new(env!("CARGO_BIN_EXE_mergetrace"))
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
}
