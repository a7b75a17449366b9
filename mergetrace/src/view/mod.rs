//! Ways to show snapshots: NDJSON, plain text tables, and a terminal UI.
pub mod export;
pub mod html;
pub mod json;
pub mod table;
pub mod text;
pub mod tui;

use anyhow::Result;

use crate::model::snapshot::Snapshot;

pub trait View {
    /// One interval's numbers.
    fn interval(&mut self, s: &Snapshot) -> Result<()>;
    /// The whole run, once, at the end.
    fn total(&mut self, s: &Snapshot) -> Result<()>;
}
