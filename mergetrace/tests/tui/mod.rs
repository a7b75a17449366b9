//! The harness of kernel_tui: mergetrace's terminal UI in a real terminal (a tmux session),
//! keys typed into it, and its screen read back: the table's rows under a title, the detail
//! pane, the footer.
use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

pub(crate) struct Tmux {
    session: String,
}

impl Tmux {
    pub(crate) fn start(width: u16, command: &str) -> Tmux {
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
            thread::sleep(Duration::from_millis(300));
        }
        panic!("tmux new-session failed three times: {errors:?}");
    }

    pub(crate) fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen once `ok` holds for it (panics with the screen and `what` after `secs`).
    pub(crate) fn wait_until(&self, what: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "never on the screen: {what}\n{s}"
            );
            thread::sleep(Duration::from_millis(150));
        }
    }

    /// The screen once it contains `what`.
    pub(crate) fn wait_for(&self, what: &str, secs: u64) -> String {
        self.wait_until(&format!("{what:?}"), secs, |s| s.contains(what))
    }

    /// Keys by tmux's names (`q`, `Down`, `Escape`, `Enter`).
    pub(crate) fn keys(&self, keys: &str) {
        self.send(&[keys]);
    }

    /// Text typed as it is (no key names).
    pub(crate) fn type_text(&self, text: &str) {
        self.send(&["-l", text]);
    }

    fn send(&self, args: &[&str]) {
        let status = Command::new("tmux")
            .args(["send-keys", "-t", &self.session])
            .args(args)
            .status()
            .expect("tmux send-keys");
        assert!(status.success(), "tmux send-keys {args:?} failed");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

/// The cells of a line of the TUI's table: its box borders taken off, cells split at two or
/// more blanks (cells hold single blanks: "AVG REQ", "128 KiB").
fn cells(line: &str) -> Vec<String> {
    line.trim_matches(|c: char| c == '│' || c.is_whitespace())
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

/// The table whose top border has `title` in it: its header and rows, as cells.
pub(crate) struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn find(screen: &str, title: &str) -> Option<Table> {
        let mut lines = screen
            .lines()
            .skip_while(|l| !(l.starts_with('┌') && l.contains(title)))
            .skip(1);
        let header = cells(lines.next()?);
        let rows = lines
            .take_while(|l| !l.starts_with('└'))
            .map(cells)
            .filter(|c| !c.is_empty())
            .collect();
        Some(Table { header, rows })
    }

    /// The write row of the cgroup whose path ends with `leaf` (a narrow table shortens a
    /// path in the middle, keeping its last characters: they name it), by position.
    pub(crate) fn position(&self, leaf: &str) -> Option<usize> {
        let col = self.header.iter().position(|h| h == "CGROUP")?;
        let leaf = tail(leaf);
        self.rows.iter().position(|r| {
            r.get(col).is_some_and(|c| c.ends_with(leaf)) && r.contains(&"write".into())
        })
    }

    /// A count in `column` of `leaf`'s write row.
    pub(crate) fn count(&self, leaf: &str, column: &str) -> Option<u64> {
        let col = self.header.iter().position(|h| h == column)?;
        self.rows[self.position(leaf)?].get(col)?.parse().ok()
    }
}

/// The end of a cgroup's leaf name that a path shortened to the narrowest cgroup column
/// still shows ("mt-test-4242-3" → "t-4242-3").
pub(crate) fn tail(leaf: &str) -> &str {
    &leaf[leaf.len().saturating_sub(8)..]
}

/// The detail pane (the box whose title starts with the device's name): its title and its
/// text, lines joined (the pane wraps long lines at the terminal's width).
pub(crate) fn detail_pane(screen: &str, device: &str) -> Option<(String, String)> {
    let mut lines = screen
        .lines()
        .skip_while(|l| !l.starts_with(&format!("┌ {device} ")));
    let title = lines
        .next()?
        .trim_matches(|c| c == '┌' || c == '─' || c == '┐' || c == ' ');
    let text: Vec<&str> = lines
        .take_while(|l| !l.starts_with('└'))
        .map(|l| l.trim_matches(|c: char| c == '│' || c.is_whitespace()))
        .collect();
    Some((title.to_string(), text.join(" ")))
}
