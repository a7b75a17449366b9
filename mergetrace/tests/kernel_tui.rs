//! The terminal UI in a real terminal (tmux) at 80, 100 and 160 columns, with two cgroups
//! whose paths differ only at the end: no line wider than the terminal, every header whole,
//! the two rows told apart, and after `q` the whole-run table left on the normal screen with
//! the bios each cgroup submitted, exactly (the screen is left once, so the shell's next
//! output lands below the table instead of over it).
mod support;
use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use support::*;

struct Tmux {
    session: String,
}

impl Tmux {
    fn start(width: u16, command: &str) -> Tmux {
        let session = format!("mt-tui-{}-{width}", std::process::id());
        // A new session can lose a race with the server of the previous one shutting down
        // (it exits when its last session ends: "server exited unexpectedly"); a second try
        // starts a new server. Anything else fails with tmux's own words.
        let mut errors = Vec::new();
        for _ in 0..3 {
            let out = Command::new("tmux")
                .args([
                    "new-session",
                    "-d",
                    "-s",
                    &session,
                    "-x",
                    &width.to_string(),
                    "-y",
                    "50",
                ])
                .arg(command)
                .output()
                .expect("tmux runs (scripts/setup --test installs it)");
            if out.status.success() {
                return Tmux { session };
            }
            errors.push(String::from_utf8_lossy(&out.stderr).trim().to_string());
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("tmux new-session failed three times: {errors:?}");
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen once it contains `what` (panics with the screen after `secs`).
    fn wait_for(&self, what: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{what:?} never appeared on the screen:\n{s}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    fn keys(&self, keys: &str) {
        let _ = Command::new("tmux")
            .args(["send-keys", "-t", &self.session, keys])
            .status();
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

/// The bios column of `leaf`'s write row in the whole-run table below `marker`.
fn bios_after(screen: &str, marker: &str, leaf: &str) -> Option<u64> {
    let table = &screen[screen.find(marker)?..];
    let header = table.lines().find(|l| l.contains("CGROUP"))?;
    let col = header.split_whitespace().position(|h| h == "BIOS")?;
    // A narrow table shortens the path in the middle: its end names the cgroup.
    let tail = &leaf[leaf.len().saturating_sub(8)..];
    let row = table
        .lines()
        .find(|l| l.split_whitespace().any(|c| c.ends_with(tail)) && l.contains("write"))?;
    row.split_whitespace().nth(col)?.parse().ok()
}

#[test]
fn tui_fits_80_100_and_160_columns_and_leaves_its_table_on_quit() {
    require_root();
    let disk = TestDisk::new(64 << 20);
    disk.set_scheduler("none");
    udev_settle();
    let parent = Cgroup::new();
    let a = parent.child();
    let b = parent.child();
    let leaf = |c: &Cgroup| c.path().rsplit('/').next().unwrap().to_string();
    let bin = mergetrace_bin();
    for width in [80u16, 100, 160] {
        let cmd = format!(
            "{bin} -d {} --interval 200ms; echo MT-DONE; sleep 60",
            disk.name
        );
        let tmux = Tmux::start(width, &cmd);
        tmux.wait_for("per cgroup", 30);
        let wa = run_workload(&disk, Some(&a), &["--ios", "2048", "--batch", "32"]);
        let wb = run_workload(&disk, Some(&b), &["--ios", "512", "--batch", "1"]);
        let (ios_a, ios_b) = (u(&wa, "ios"), u(&wb, "ios"));
        // Both rows on screen in the live table (an interval holding both workloads, or the
        // rows of the last interval: either way both cgroups have written by now).
        thread::sleep(Duration::from_millis(300));
        let live = tmux.screen();
        let ctx = format!("{width} columns:\n{live}");
        for line in live.lines() {
            assert!(
                line.chars().count() <= width as usize,
                "a line wider than the terminal; {ctx}"
            );
        }
        let header = live
            .lines()
            .find(|l| l.contains("CGROUP"))
            .unwrap_or_else(|| panic!("no table header; {ctx}"));
        for col in ["CGROUP", "DIR", "BIOS", "MERGED", "REQS"] {
            assert!(
                header
                    .split(|c: char| c.is_whitespace() || c == '│')
                    .any(|h| h == col),
                "header {col} missing or cut; {ctx}"
            );
        }
        tmux.keys("q");
        let after = tmux.wait_for("MT-DONE", 30);
        let ctx = format!("{width} columns, after q:\n{after}");
        let marker = "mergetrace: whole run";
        let done = after.find("MT-DONE").unwrap();
        let table = after
            .find(marker)
            .unwrap_or_else(|| panic!("the whole-run table is gone; {ctx}"));
        assert!(table < done, "the shell wrote over the table; {ctx}");
        assert_eq!(bios_after(&after, marker, &leaf(&a)), Some(ios_a), "{ctx}");
        assert_eq!(bios_after(&after, marker, &leaf(&b)), Some(ios_b), "{ctx}");
        for line in after.lines() {
            assert!(line.chars().count() <= width as usize, "{ctx}");
        }
    }
}
