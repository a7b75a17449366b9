//! How results are shown: the terminal UI, text tables, NDJSON, the HTML report, the
//! Prometheus exposition, the start-up banner, and exports for other tools.
pub mod banner;
pub mod distributions;
pub mod export;
pub mod html;
pub mod json;
pub mod prometheus;
pub mod table;
pub mod text;
pub mod tui;

use anyhow::Result;

use crate::model::snapshot::Snapshot;

pub trait View {
    /// Whether the view shows the whole run so far between intervals (the terminal UI's
    /// `t`): then [`View::run_so_far`] is given it before each interval.
    fn wants_run_so_far(&self) -> bool {
        false
    }
    /// The whole run so far, just before the interval that ends it.
    fn run_so_far(&mut self, _s: &Snapshot) -> Result<()> {
        Ok(())
    }
    /// One interval's numbers (its `changes` with it).
    fn interval(&mut self, s: &Snapshot) -> Result<()>;
    /// What changed on the traced disks, as it is found (before the interval that shows it):
    /// on standard error, where the banner is, unless the view shows it itself.
    fn changed(&mut self, lines: &[String]) -> Result<()> {
        for l in lines {
            eprintln!("mergetrace: changed: {l}");
        }
        Ok(())
    }
    /// The whole run, once, at the end.
    fn total(&mut self, s: &Snapshot) -> Result<()>;
}

/// A reader that closed the pipe early (`report … | head`) is not an error.
pub fn quiet_pipe(r: Result<()>) -> Result<()> {
    match r {
        Err(e)
            if e.chain().any(|c| {
                let pipe = std::io::ErrorKind::BrokenPipe;
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == pipe)
                    || c.downcast_ref::<serde_json::Error>()
                        .is_some_and(|j| j.io_error_kind() == Some(pipe))
            }) =>
        {
            Ok(())
        }
        r => r,
    }
}
