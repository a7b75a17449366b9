//! The per-device "block layer" track: plug flushes and request-request merges.
use anyhow::Result;
use mergetrace_common::{flags, Event};
use serde_json::json;

use super::{layout::Track, us, Out};
use crate::offline::names::{addr, Names};

pub(super) fn plug_flush(out: &mut Out, at: Track, e: &Event, names: &Names) -> Result<()> {
    let why = if e.flags & flags::UNPLUG_EXPLICIT != 0 {
        "explicit"
    } else {
        "from schedule"
    };
    out.ev(json!({"ph": "i", "s": "t", "cat": "plug",
        "name": format!("plug flush: {} requests ({why})", e.aux),
        "pid": at.pid, "tid": at.tid, "ts": us(names, e.ts_ns)}))
}

pub(super) fn request_merge(out: &mut Out, at: Track, e: &Event, names: &mut Names) -> Result<()> {
    out.ev(
        json!({"ph": "i", "s": "t", "cat": "merge", "name": "request merge",
        "pid": at.pid, "tid": at.tid, "ts": us(names, e.ts_ns),
        "args": {"absorbed_rq": addr(e.id), "sector": e.sector, "bytes": e.bytes,
                 "cgroup": names.cgroup(e.cgroup_id)}}),
    )
}
