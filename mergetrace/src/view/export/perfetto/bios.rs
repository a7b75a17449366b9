//! The "CGROUP · bios" tracks: each bio a slice from its queue time to when it joined a
//! request, each bio merge an instant, and bios queued in no request of the capture.
use anyhow::Result;
use mergetrace_common::{kind, vocab, Event};
use serde_json::json;

use super::{
    dur_us,
    layout::{Layout, Role, Slice, Track},
    us, Out,
};
use crate::{
    fmt,
    offline::{
        lineage::{BioLink, Request},
        names::{addr, Names},
    },
};

pub(super) fn slice(
    out: &mut Out,
    pid: u32,
    s: &Slice,
    r: &Request,
    b: &BioLink,
    names: &mut Names,
) -> Result<()> {
    out.ev(json!({
        "ph": "X", "cat": "bio", "name": format!("bio {}", fmt::size(b.bytes as u64)),
        "pid": pid, "tid": s.tid, "ts": us(names, s.start), "dur": dur_us(s.start, s.end),
        "args": {
            "bio": addr(b.bio), "cgroup": names.cgroup(b.cgroup_id), "sector": b.sector,
            "bytes": b.bytes, "joined": b.join.describe(),
            "via_request_merge": b.via_request_merge,
            "split_from": b.split_from.map(addr), "charged": b.charged,
            "throttled": b.throttled, "throttle_wait_ns": b.throttle_wait_ns,
            "queue_time_known": b.queue_ts.is_some(), "inferred": b.ambiguous,
            "request": addr(r.rq),
        }
    }))
}

/// A back or front merge, on the merged bio's own track where it has a slice.
pub(super) fn merge(out: &mut Out, layout: &mut Layout, e: &Event, names: &Names) -> Result<()> {
    let pid = layout.pids[&e.dev];
    let tid = match layout.bio_at.get(&(e.id, e.ts_ns)) {
        Some(at) => at.0,
        None => layout.instant(e, Role::Bios).tid,
    };
    let how = if e.kind == kind::BACK_MERGE {
        "back"
    } else {
        "front"
    };
    out.ev(json!({"ph": "i", "s": "t", "cat": "merge",
        "name": format!("{how} merge ({})", vocab::merge_path_name(e.path)),
        "pid": pid, "tid": tid, "ts": us(names, e.ts_ns),
        "args": {"bio": addr(e.id), "sector": e.sector, "bytes": e.bytes, "bios": e.run_len()}}))
}

/// A `bio_queue` whose bio is in no request of the capture (no slice to start).
pub(super) fn queued_alone(out: &mut Out, at: Track, e: &Event, names: &Names) -> Result<()> {
    out.ev(json!({"ph": "i", "s": "t", "cat": "bio",
        "name": "bio queued (no request in the capture)",
        "pid": at.pid, "tid": at.tid, "ts": us(names, e.ts_ns),
        "args": {"bio": addr(e.id), "sector": e.sector, "bytes": e.bytes, "bios": e.run_len()}}))
}
