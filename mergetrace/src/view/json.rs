//! `--json`: one JSON object per line (NDJSON), flushed per line so pipes see it at once.
use std::io::Write;

use anyhow::Result;

use super::View;
use crate::model::snapshot::Snapshot;

pub struct JsonView<W: Write> {
    out: W,
}

impl<W: Write> JsonView<W> {
    pub fn new(out: W) -> Self {
        JsonView { out }
    }
    fn line(&mut self, s: &Snapshot) -> Result<()> {
        serde_json::to_writer(&mut self.out, s)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}

impl<W: Write> View for JsonView<W> {
    fn interval(&mut self, s: &Snapshot) -> Result<()> {
        self.line(s)
    }
    fn total(&mut self, s: &Snapshot) -> Result<()> {
        self.line(s)
    }
}
