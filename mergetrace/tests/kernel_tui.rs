//! The terminal UI in a real terminal (tmux) at 80, 100 and 160 columns, with two cgroups
//! whose paths differ only at the end, one under a blk-throttle wiops limit: no line wider
//! than the terminal, every header whole, the two rows told apart; `t` shows the whole run
//! with the bios each cgroup submitted, exactly; `s`/`r` sort and `/` filters which rows
//! show; ↓ selects a row and the detail pane shows its counts (charged = the kernel's own
//! count), the meter that binds it and its verdict; after `q` the whole-run table is left on
//! the normal screen (the screen is left once, so the shell's next output lands below it).
mod support;
mod tui;

use std::{thread, time::Duration};

use support::*;
use tui::*;

const WHOLE_RUN: &str = "per cgroup, whole run";
/// a's limit: its 2,048 writes wait about 2 s, so wiops binds.
const WIOPS: u64 = 1000;

/// The live table fits: no line wider than the terminal, the headers the verdict rests on
/// whole.
fn check_fits(screen: &str, width: u16) {
    let ctx = format!("{width} columns:\n{screen}");
    for line in screen.lines() {
        assert!(
            line.chars().count() <= width as usize,
            "a line wider than the terminal; {ctx}"
        );
    }
    let table = Table::find(screen, "per cgroup").unwrap_or_else(|| panic!("no table; {ctx}"));
    for col in ["CGROUP", "DIR", "BIOS", "MERGED", "REQS"] {
        assert!(
            table.header.iter().any(|h| h == col),
            "header {col} missing or cut; {ctx}"
        );
    }
}

/// Presses `s` until the footer says the table is sorted by `what` ("BIOS ↓").
fn sort_by(tmux: &Tmux, what: &str) -> String {
    let want = format!("sort: {what}");
    for _ in 0..16 {
        if tmux.screen().contains(&want) {
            break;
        }
        tmux.keys("s");
        thread::sleep(Duration::from_millis(250));
    }
    tmux.wait_for(&want, 10)
}

/// The rows of the whole-run table once `ok` holds for them.
fn whole_run_until(tmux: &Tmux, what: &str, ok: impl Fn(&Table) -> bool) -> (Table, String) {
    let screen = tmux.wait_until(what, 15, |s| {
        Table::find(s, WHOLE_RUN).is_some_and(|t| ok(&t))
    });
    (Table::find(&screen, WHOLE_RUN).unwrap(), screen)
}

/// Selects the first row, then presses ↓ until the detail pane is `leaf`'s write row: the pane's text.
fn select(tmux: &Tmux, device: &str, leaf: &str) -> String {
    let on = |s: &str| {
        detail_pane(s, device)
            .filter(|(title, _)| title.contains(tail(leaf)) && title.ends_with("write"))
    };
    tmux.keys("Home");
    thread::sleep(Duration::from_millis(250));
    for _ in 0..8 {
        if let Some((_, text)) = on(&tmux.screen()) {
            return text;
        }
        tmux.keys("Down");
        thread::sleep(Duration::from_millis(250));
    }
    let screen = tmux.wait_until(&format!("the detail of {leaf}"), 5, |s| on(s).is_some());
    on(&screen).unwrap().1
}

#[test]
fn tui_fits_80_100_and_160_columns_switches_sorts_filters_selects_and_leaves_its_table() {
    require_root();
    let disk = TestDisk::new(64 << 20);
    disk.set_scheduler("none");
    udev_settle();
    let parent = Cgroup::new();
    let a = parent.child();
    let b = parent.child();
    a.set_write_iops(&disk, WIOPS);
    let leaf = |c: &Cgroup| c.path().rsplit('/').next().unwrap().to_string();
    let (leaf_a, leaf_b) = (leaf(&a), leaf(&b));
    let bin = mergetrace_bin();
    for width in [80u16, 100, 160] {
        let cmd = format!(
            "{bin} -d {} --interval 200ms; echo MT-DONE; sleep 60",
            disk.name
        );
        let tmux = Tmux::start(width, &cmd);
        tmux.wait_for("per cgroup, last interval", 30);
        let before = a.throttle_stats(&disk);
        let wa = run_workload(&disk, Some(&a), &["--ios", "2048", "--batch", "32"]);
        let wb = run_workload(&disk, Some(&b), &["--ios", "512", "--batch", "1"]);
        let (ios_a, ios_b) = (u(&wa, "ios"), u(&wb, "ios"));
        let (charged_a, _) = a.throttle_stats(&disk).write_since(&before);
        assert_eq!(charged_a, ios_a, "blk-throttle counted every bio of a once");
        thread::sleep(Duration::from_millis(300));
        check_fits(&tmux.screen(), width);

        // The whole run: the bios each cgroup submitted.
        tmux.keys("t");
        let (run, screen) = whole_run_until(&tmux, "both rows in the whole-run table", |t| {
            t.position(&leaf_a).is_some() && t.position(&leaf_b).is_some()
        });
        let ctx = format!("{width} columns:\n{screen}");
        check_fits(&screen, width);
        assert_eq!(run.count(&leaf_a, "BIOS"), Some(ios_a), "{ctx}");
        assert_eq!(run.count(&leaf_b, "BIOS"), Some(ios_b), "{ctx}");

        // Sorted by bios, a (2,048) comes first; reversed, b (512).
        sort_by(&tmux, "BIOS ↓");
        whole_run_until(&tmux, "a above b", |t| {
            t.position(&leaf_a).is_some() && t.position(&leaf_a) < t.position(&leaf_b)
        });
        tmux.keys("r");
        tmux.wait_for("sort: BIOS ↑", 10);
        whole_run_until(&tmux, "b above a", |t| {
            t.position(&leaf_b).is_some() && t.position(&leaf_b) < t.position(&leaf_a)
        });

        // A filter on b's name leaves b; Esc takes it back.
        tmux.keys("/");
        tmux.type_text(&leaf_b);
        tmux.keys("Enter");
        tmux.wait_for(&format!("filter: {leaf_b}"), 10);
        let (t, screen) = whole_run_until(&tmux, "b alone", |t| t.position(&leaf_a).is_none());
        assert_eq!(t.count(&leaf_b, "BIOS"), Some(ios_b), "{width}:\n{screen}");
        tmux.keys("Escape");
        whole_run_until(&tmux, "both rows again", |t| {
            t.position(&leaf_a).is_some() && t.position(&leaf_b).is_some()
        });

        // The detail of a: every count (whole at any width), wiops binds, its verdict.
        let pane = select(&tmux, &disk.name, &leaf_a);
        let ctx = format!("{width} columns, a's detail: {pane}");
        assert!(
            pane.contains(&format!("bios {} (", thousands(ios_a))),
            "{ctx}"
        );
        assert!(
            pane.contains(&format!("charged {} ·", thousands(charged_a))),
            "{ctx}"
        );
        assert!(pane.contains("binds: blk-throttle wiops"), "{ctx}");
        assert!(pane.contains(&format!("verdict: wiops {WIOPS} ")), "{ctx}");
        let pane = select(&tmux, &disk.name, &leaf_b);
        let ctx = format!("{width} columns, b's detail: {pane}");
        assert!(pane.contains(&format!("bios {} (", ios_b)), "{ctx}");
        assert!(pane.contains("charged 0 ·"), "{ctx}");
        assert!(
            pane.contains("binds: no blk-throttle limit is in force"),
            "{ctx}"
        );
        // b's own verdict (wbt's, where the disk has wbt on), never a's limit
        assert!(
            pane.contains("verdict: ") && !pane.contains("wiops"),
            "{ctx}"
        );

        tmux.keys("q");
        let after = tmux.wait_for("MT-DONE", 30);
        let ctx = format!("{width} columns, after q:\n{after}");
        let marker = "mergetrace: whole run";
        let done = after.find("MT-DONE").unwrap();
        let table = after
            .find(marker)
            .unwrap_or_else(|| panic!("the whole-run table is gone; {ctx}"));
        assert!(table < done, "the shell wrote over the table; {ctx}");
        assert_eq!(after.matches(marker).count(), 1, "{ctx}");
        assert_eq!(bios_after(&after[table..], &leaf_a), Some(ios_a), "{ctx}");
        assert_eq!(bios_after(&after[table..], &leaf_b), Some(ios_b), "{ctx}");
        for line in after.lines() {
            assert!(line.chars().count() <= width as usize, "{ctx}");
        }
    }
}

/// 2048 → "2,048", as the detail pane writes counts.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap())
        .collect();
    groups.join(",")
}

/// The bios column of `leaf`'s write row in the plain whole-run table `text` starts with.
fn bios_after(text: &str, leaf: &str) -> Option<u64> {
    let header = text.lines().find(|l| l.contains("CGROUP"))?;
    let col = header.split_whitespace().position(|h| h == "BIOS")?;
    let row = text
        .lines()
        .find(|l| l.split_whitespace().any(|c| c.ends_with(tail(leaf))) && l.contains("write"))?;
    row.split_whitespace().nth(col)?.parse().ok()
}
