//! The "CGROUP · requests" tracks: each request "queued" from insert to issue (when it was
//! inserted) and from issue to completion, and a flow from each of its bios' slices.
use anyhow::Result;
use serde_json::json;

use super::{
    dur_us,
    layout::{Layout, Slice},
    us, Out,
};
use crate::{
    fmt,
    offline::{
        lineage::Request,
        names::{addr, op_name, Names},
    },
};

/// The request's slices and the flows into it, numbered from `flows` + 1; returns the flows.
pub(super) fn slices(
    out: &mut Out,
    layout: &Layout,
    s: &Slice,
    r: &Request,
    names: &mut Names,
    mut flows: u64,
) -> Result<u64> {
    let pid = layout.pids[&r.dev];
    if let Some(i) = r.insert_ts {
        out.ev(json!({
            "ph": "X", "cat": "request", "name": "queued (insert → issue)",
            "pid": pid, "tid": s.tid, "ts": us(names, i), "dur": dur_us(i, r.issue_ts),
            "args": {"rq": addr(r.rq)}
        }))?;
    }
    let end = r.complete_ts.unwrap_or(layout.end_ts).max(r.issue_ts + 2);
    out.ev(json!({
        "ph": "X", "cat": "request",
        "name": format!("{} {} · {} bios", op_name(r.op), fmt::size(r.bytes as u64), r.bios.len()),
        "pid": pid, "tid": s.tid, "ts": us(names, r.issue_ts), "dur": dur_us(r.issue_ts, end),
        "args": {
            "rq": addr(r.rq), "cgroup": names.cgroup(r.cgroup_id), "sector": r.sector,
            "bytes": r.bytes, "bios_kernel_counted": r.bio_count, "bios_found": r.bios.len(),
            "match": r.matched.name(), "consistent": r.consistent(),
            "completed": r.complete_ts.is_some(), "requeues": r.requeues,
            "absorbed_requests": r.absorbed,
        }
    }))?;
    // Flow ends in the middle of the issue → complete slice.
    let f_ts = r.issue_ts + (end - r.issue_ts) / 2;
    for b in &r.bios {
        let Some((btid, b_mid)) = layout.bio_at.get(&(b.bio, b.join_ts)).copied() else {
            continue;
        };
        flows += 1;
        out.ev(
            json!({"ph": "s", "cat": "lineage", "name": "bio → request", "id": flows,
            "pid": pid, "tid": btid, "ts": us(names, b_mid)}),
        )?;
        out.ev(
            json!({"ph": "f", "bp": "e", "cat": "lineage", "name": "bio → request",
            "id": flows, "pid": pid, "tid": s.tid, "ts": us(names, f_ts)}),
        )?;
    }
    Ok(flows)
}
