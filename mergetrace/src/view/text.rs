//! Plain text: a table per interval, for pipes, logs and dumb terminals.
use std::io::Write;

use anyhow::Result;

use super::{table, View};
use crate::model::snapshot::Snapshot;

pub struct TextView<W: Write> {
    out: W,
}

impl<W: Write> TextView<W> {
    pub fn new(out: W) -> Self {
        TextView { out }
    }

    fn print(&mut self, title: &str, s: &Snapshot) -> Result<()> {
        let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
        writeln!(
            self.out,
            "--- {title} {secs:.1}s, {} tier, lost events: {}",
            s.tier, s.lost_events
        )?;
        for c in &s.changes {
            writeln!(self.out, "changed: {c}")?;
        }
        write!(self.out, "{}", table::render_text(&table::rows(s)))?;
        for r in table::remarks(s) {
            writeln!(self.out, "{r}")?;
        }
        self.out.flush()?;
        Ok(())
    }
}

impl<W: Write> View for TextView<W> {
    fn interval(&mut self, s: &Snapshot) -> Result<()> {
        self.print("interval", s)
    }
    fn total(&mut self, s: &Snapshot) -> Result<()> {
        self.print("total", s)
    }
}
