//! A request and its bios for people (`report --lineage`) and as JSON (`--lineage --json`),
//! and the summary line.
use mergetrace_common::vocab::{merge_path_name, Dev};

use super::types::{Request, Stats};
use crate::{
    fmt,
    offline::names::{addr, dir_name, op_name, Names},
};

/// One request and its bios as text (times in seconds since the capture's start).
pub fn render_text(r: &Request, names: &mut Names) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let device = names.device(r.dev);
    let cgroup = names.cgroup(r.cgroup_id).to_string();
    let t = |names: &Names, ts: Option<u64>| {
        ts.map_or("-".to_string(), |ts| format!("{:.6}", names.secs(ts)))
    };
    let _ = write!(
        out,
        "request {} {device} {cgroup} {}: sector {} + {} ({}), {} bios (kernel counted {}), {}",
        addr(r.rq),
        op_name(r.op),
        r.sector,
        r.bytes / 512,
        fmt::size(r.bytes as u64),
        r.bios.len(),
        r.bio_count,
        r.matched.name()
    );
    if !r.consistent() {
        out.push_str(", INCOMPLETE");
    }
    out.push('\n');
    let _ = write!(out, "  ");
    if r.getrq_ts.is_some() {
        let _ = write!(out, "new {}  ", t(names, r.getrq_ts));
    }
    if let Some(i) = r.insert_ts {
        let _ = write!(out, "inserted {}  ", t(names, Some(i)));
    }
    let _ = write!(out, "issued {}", t(names, Some(r.issue_ts)));
    if let Some(i) = r.insert_ts {
        let _ = write!(out, " (+{} queued)", fmt::micros_between(i, r.issue_ts));
    }
    match r.complete_ts {
        Some(c) => {
            let _ = write!(
                out,
                "  completed {} (+{})",
                t(names, Some(c)),
                fmt::micros_between(r.issue_ts, c)
            );
            if r.status != 0 {
                let _ = write!(out, " status {}", r.status);
            }
        }
        None => out.push_str("  not completed in the capture"),
    }
    if r.requeues > 0 {
        let _ = write!(out, "  requeued {}×", r.requeues);
    }
    if r.absorbed > 0 {
        let _ = write!(out, "  absorbed {} request(s)", r.absorbed);
    }
    out.push('\n');
    for b in &r.bios {
        let cg = names.cgroup(b.cgroup_id).to_string();
        let _ = write!(
            out,
            "    bio {} {cg} sector {} {}  queued {}  {}",
            addr(b.bio),
            b.sector,
            fmt::size(b.bytes as u64),
            t(names, b.queue_ts),
            b.join.describe()
        );
        if b.via_request_merge {
            out.push_str(" then request merge");
        }
        if let Some(p) = b.split_from {
            let _ = write!(out, "  split from {}", addr(p));
        }
        if b.charged {
            out.push_str("  charged");
        }
        if b.throttled {
            out.push_str("  throttled");
        }
        if let Some(w) = b.throttle_wait_ns {
            let _ = write!(out, " (waited {:.1} µs)", w as f64 / 1000.0);
        }
        if b.ambiguous {
            out.push_str("  (inferred: another request was adjacent too)");
        }
        out.push('\n');
    }
    out
}

/// `report --lineage --json`: one request (times: CLOCK_MONOTONIC ns, like the snapshot's
/// `start_ns`/`end_ns`; kernel addresses as hex strings). docs/report.md has the fields.
#[derive(Debug, serde::Serialize)]
pub struct RequestJson {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub rq: String,
    pub device: String,
    pub major: u32,
    pub minor: u32,
    pub cgroup: String,
    pub cgroup_id: u64,
    pub op: String,
    pub dir: &'static str,
    pub sector: u64,
    pub bytes: u32,
    pub first_bio: String,
    pub bio_count: u32,
    pub bios_found: usize,
    pub bios_bytes: u64,
    pub consistent: bool,
    #[serde(rename = "match")]
    pub matched: &'static str,
    pub getrq_ns: Option<u64>,
    pub insert_ns: Option<u64>,
    pub issue_ns: u64,
    pub complete_ns: Option<u64>,
    pub completed_bytes: u64,
    pub status: u8,
    pub requeues: u32,
    pub absorbed_requests: u32,
    pub bios: Vec<BioJson>,
}

#[derive(Debug, serde::Serialize)]
pub struct BioJson {
    pub bio: String,
    pub cgroup: String,
    pub cgroup_id: u64,
    pub sector: u64,
    pub bytes: u32,
    pub queue_ns: Option<u64>,
    pub join_ns: u64,
    pub join: &'static str,
    pub merge_path: Option<&'static str>,
    pub via_request_merge: bool,
    pub split_from: Option<String>,
    pub charged: bool,
    pub throttled: bool,
    pub throttle_wait_ns: Option<u64>,
    pub ambiguous: bool,
}

pub fn to_json(r: &Request, names: &mut Names) -> RequestJson {
    let bios = r
        .bios
        .iter()
        .map(|b| BioJson {
            bio: addr(b.bio),
            cgroup: names.cgroup(b.cgroup_id).to_string(),
            cgroup_id: b.cgroup_id,
            sector: b.sector,
            bytes: b.bytes,
            queue_ns: b.queue_ts,
            join_ns: b.join_ts,
            join: b.join.name(),
            merge_path: b.join.merge_path().map(merge_path_name),
            via_request_merge: b.via_request_merge,
            split_from: b.split_from.map(addr),
            charged: b.charged,
            throttled: b.throttled,
            throttle_wait_ns: b.throttle_wait_ns,
            ambiguous: b.ambiguous,
        })
        .collect();
    RequestJson {
        kind: "request",
        rq: addr(r.rq),
        device: names.device(r.dev),
        major: Dev(r.dev).major(),
        minor: Dev(r.dev).minor(),
        cgroup: names.cgroup(r.cgroup_id).to_string(),
        cgroup_id: r.cgroup_id,
        op: op_name(r.op),
        dir: dir_name(r.op),
        sector: r.sector,
        bytes: r.bytes,
        first_bio: addr(r.first_bio),
        bio_count: r.bio_count,
        bios_found: r.bios.len(),
        bios_bytes: r.bios_bytes(),
        consistent: r.consistent(),
        matched: r.matched.name(),
        getrq_ns: r.getrq_ts,
        insert_ns: r.insert_ts,
        issue_ns: r.issue_ts,
        complete_ns: r.complete_ts,
        completed_bytes: r.completed_bytes,
        status: r.status,
        requeues: r.requeues,
        absorbed_requests: r.absorbed,
        bios,
    }
}

/// The summary line: how much of the lineage is exact.
pub fn summary(s: &Stats) -> String {
    let m = |k: &str| s.matched.get(k).copied().unwrap_or(0);
    format!(
        "lineage: {} requests, {} consistent with the kernel's bio count and bytes; matched by \
         first bio and range: {}, by range only: {}, by first bio only: {}, without data: {}, \
         unmatched: {}; {} bios ({} split pieces, {} without a bio_queue in the capture, {} \
         placed by inference among adjacent requests); {} merges found no request; {} requests \
         were built but not issued in the capture; {} were issued again with no completion \
         between (the kernel ended them without running the completion program); {} were \
         issued and not seen completed by its end (in flight as it ended, or ended unseen and \
         their tag not issued again)",
        s.requests,
        s.consistent,
        m("exact"),
        m("range"),
        m("first_bio"),
        m("no_bios"),
        m("unmatched"),
        s.bios,
        s.split_pieces,
        s.without_queue,
        s.ambiguous,
        s.orphan_merges,
        s.never_issued,
        s.completions_unseen,
        s.never_completed
    )
}
