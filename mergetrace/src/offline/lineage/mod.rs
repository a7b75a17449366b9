//! Lineage: which bios ended in each request the device saw (`report --lineage`, and the
//! flows of `export --format perfetto`).
//!
//! The capture has no event that says "bio B is in request R"; the kernel only reports each
//! step. The tracker replays the steps in stream order (the ring buffer's order, which is
//! causal) and keeps the requests being built:
//!
//! - `getrq` (bio B) starts a pending request on B's device covering `[sector, sector+bytes)`,
//!   with B as its first bio;
//! - `back_merge` (bio B) extends the pending request of the same device, op and cgroup whose
//!   end is B's sector; `front_merge` the one whose start is B's end (B becomes its first
//!   bio). The kernel never merges across cgroups (`blk_cgroup_mergeable`) or ops;
//! - `rq_merge` (request N absorbed) appends N's bios to the pending request that ends where N
//!   starts (`attempt_merge` only merges `req` with the `next` that follows it);
//! - `rq_insert` binds a request address to its pending request (first bio = `aux64`);
//! - `rq_issue` (request R, first bio `aux64`, `aux` bios chained) takes the pending request
//!   whose first bio is R's first bio and checks that its range equals R's; failing that, the
//!   one with R's exact range. The kernel counted R's bios itself (`aux`), so every request
//!   says whether the reconstruction agrees: same number of bios, same bytes.
//!
//! Bios get their queue time, throttling and cgroup from their `bio_queue` event (by
//! address; a bio address is unique while the bio is in flight). A split piece has no
//! `bio_queue` of its own: it inherits its parent's (`split.aux64`), and says so.
//!
//! What is exact and what is inferred is in [`Match`] and [`BioLink::ambiguous`]; see
//! docs/report.md.
mod render;
mod tracker;
mod types;

#[cfg(test)]
mod tests;

use mergetrace_common::Event;

pub use render::{render_text, summary, to_json, BioJson, RequestJson};
pub use tracker::Tracker;
pub use types::{BioLink, Join, Lineage, Match, Request, Stats};

/// Replays a whole stream.
pub fn trace<'a>(events: impl IntoIterator<Item = &'a Event>, limit: Option<usize>) -> Lineage {
    let mut t = match limit {
        Some(n) => Tracker::with_limit(n),
        None => Tracker::new(),
    };
    for ev in events {
        t.apply(ev);
    }
    t.finish()
}
