//! Capture files (`mergetrace record -d DEV -o run.mtr`): the raw event stream of a run plus
//! what is needed to interpret it offline (devices, cgroup names, limits, queue settings).
//!
//! A file is a preamble (magic + format version), a JSON header chunk, then events chunks and
//! lost-event chunks in stream order, then an end chunk on a clean close. Every chunk is
//! checksummed and decodes on its own. The byte layout and the compatibility rules are in
//! docs/capture-format.md; [`format`] (framing) and [`codec`] (events) are the code of it.
//!
//! - [`CaptureWriter`]: `create` → `write_events` / `write_lost` → `finish`.
//! - [`CaptureReader`]: `open` → records (iterator, or `next_into` to reuse a buffer);
//!   [`read_all`] for a whole file.
//! - [`HeaderLookup`]: a capture header as the snapshot's [`crate::model::snapshot::Lookup`].
pub mod codec;
pub mod format;
mod header;
mod lookup;
mod reader;
mod writer;

#[cfg(test)]
mod tests;

use mergetrace_common::Event;

pub use format::{FORMAT_VERSION, MAGIC};
pub use header::{
    Header, LateCgroups, RecordedCgroup, RecordedDevice, RecordedIocost, RecordedLimits,
    RecordedQueue, Trailer,
};
pub use lookup::HeaderLookup;
pub use reader::{read_all, Capture, CaptureReader, Next};
pub use writer::{CaptureSink, CaptureWriter, Summary, WriterOptions, CHUNK_EVENTS};

/// One record of a capture's stream, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// One events chunk.
    Events(Vec<Event>),
    /// The kernel dropped `count` events of `kind` (a `mergetrace_common::kind`) here.
    Lost { kind: u8, count: u64 },
}
