//! A capture of the window: `report` against the live run, lineage against blktrace.

use std::{collections::BTreeMap, path::Path};

use serde_json::Value;

use super::*;
use crate::support::{
    blktrace::{self},
    *,
};

/// `mergetrace ARGS`, requiring success; (stdout, stderr).
pub(crate) fn mergetrace(args: &[&str]) -> (String, String) {
    succeeded(
        crate::support::mergetrace(args),
        &format!("mergetrace {args:?}"),
    )
}

/// One request of `report --lineage --json`.
#[derive(Debug, Clone)]
pub(crate) struct LineageRq {
    pub(crate) dir: String,
    pub(crate) sector: u64,
    pub(crate) bytes: u64,
    /// Its bios, (sector, bytes), in chain order.
    pub(crate) bios: Vec<(u64, u64)>,
    pub(crate) consistent: bool,
    pub(crate) line: String,
}

/// The capture of the window: `report --json` gives the live run's device total;
/// `report --lineage --json` has one request per request the live run counted, each
/// `consistent` (its bios are the kernel's chain: count and bytes), every bio and split
/// piece that made a request in exactly one of them; and (guests) each request's bios —
/// sector and size of each, in chain order — are the bios blktrace saw join that request,
/// requests matched by (direction, sector, size) in issue order. Returns (lineage requests,
/// requests compared with blktrace).
// Long (~150 lines) on purpose: one pass over the lineage checks it against the live counts
// and, in the guests, request by request against blktrace; split, each half would re-walk it.
pub(crate) fn check_capture(
    c: &mut Checks,
    out: &TraceOutput,
    disk: &BlockDev,
    capture: &Path,
    trace: Option<&blktrace::Trace>,
) -> (usize, usize) {
    let cap = capture.to_str().expect("a UTF-8 capture path");
    let (rep, _) = mergetrace(&["report", cap, "--json"]);
    let rep: Value = serde_json::from_str(rep.trim()).expect("report --json is one JSON object");
    let rd = rep["devices"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|d| d["major"] == disk.major && d["minor"] == disk.minor)
        })
        .cloned()
        .unwrap_or_default();
    let live = out.device_total(disk);
    for dir in ALL_DIRS {
        // The fields the capture's report must give as the live run did.
        for f in DIR_COUNTS
            .into_iter()
            .chain(["flush_only", "requeues", "merged_by_path"])
        {
            if live[dir][f] != rd["total"][dir][f] {
                c.fail(format!(
                    "capture report {dir}.{f} {} != live {}",
                    rd["total"][dir][f], live[dir][f]
                ));
            }
        }
    }

    let (text, summary) = mergetrace(&["report", cap, "--lineage", "--json"]);
    let (mut rqs, mut completed) = (Vec::new(), 0);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a lineage line is not JSON ({e}): {line}"));
        let bios = v["bios"]
            .as_array()
            .map(|b| b.iter().map(|b| (u(b, "sector"), u(b, "bytes"))).collect())
            .unwrap_or_default();
        completed += v["complete_ns"].is_u64() as u64;
        rqs.push(LineageRq {
            dir: v["dir"].as_str().unwrap_or("?").to_string(),
            sector: u(&v, "sector"),
            bytes: u(&v, "bytes"),
            bios,
            consistent: v["consistent"] == true,
            line: line.to_string(),
        });
    }
    let inconsistent: Vec<&LineageRq> = rqs.iter().filter(|r| !r.consistent).collect();
    if !inconsistent.is_empty() {
        c.fail(format!(
            "lineage: {} of {} requests not consistent, e.g. {}",
            inconsistent.len(),
            rqs.len(),
            inconsistent[0].line
        ));
    }
    let requests: u64 = ALL_DIRS.iter().map(|d| c.get(&live[*d], "requests")).sum();
    c.eq(
        "lineage requests == requests (every direction)",
        rqs.len() as u64,
        requests,
    );
    // Every bio and split piece either made a request, merged into one, or was a flush-only
    // write; discard merges fire no tracepoint, so those bios are in no lineage.
    let mut pieces = 0;
    for dir in DATA_DIRS {
        pieces += c.get(&live[dir], "requests") + c.get(&live[dir], "merged");
        pieces -= c.get(&live[dir]["merged_by_path"], "discard");
    }
    let bios: u64 = rqs.iter().map(|r| r.bios.len() as u64).sum();
    c.eq(
        "lineage bios == requests + merged - discard merges (read, write, discard)",
        bios,
        pieces,
    );
    // The disk is quiet at the end: a request with no completion in the capture ended
    // without the completion program running, and the summary counts it once, found by a
    // later issue of its tag or at the capture's end.
    let count_before = |phrase: &str| {
        let at = summary.find(phrase)?;
        summary[..at].rsplit(' ').next()?.parse::<u64>().ok()
    };
    match (
        count_before(" were issued again with no completion between"),
        count_before(" were issued and not seen completed by its end"),
    ) {
        (Some(unseen), Some(open)) => c.eq(
            "lineage requests without a completion == issued again with none + not seen \
             completed by the end",
            rqs.len() as u64 - completed,
            unseen + open,
        ),
        _ => c.fail(format!(
            "lineage summary without its completion counts: {summary}"
        )),
    }
    eprintln!(
        "  lineage: {} requests, {bios} bios; {}",
        rqs.len(),
        summary.trim()
    );

    let Some(t) = trace else {
        return (rqs.len(), 0);
    };
    let (bt, unmatched) = t.requests();
    c.eq(
        "blktrace: M / F / D events that match no request",
        unmatched,
        0,
    );
    // (direction, sector, bytes) -> the requests of that identity, in issue order.
    let mut by_key: BTreeMap<(String, u64, u64), std::collections::VecDeque<&blktrace::Request>> =
        BTreeMap::new();
    for r in &bt {
        by_key
            .entry((r.dir.name().to_string(), r.sector, r.bytes))
            .or_default()
            .push_back(r);
    }
    let (mut compared, mut missing, mut differ) = (0usize, Vec::new(), Vec::new());
    for r in &rqs {
        let key = (r.dir.clone(), r.sector, r.bytes);
        match by_key.get_mut(&key).and_then(|q| q.pop_front()) {
            None => missing.push(format!("{key:?}")),
            Some(b) => {
                compared += 1;
                if b.chain != r.bios {
                    differ.push(format!(
                        "{key:?}: lineage bios {:?} != blktrace {:?}",
                        r.bios, b.chain
                    ));
                }
            }
        }
    }
    let extra: Vec<String> = by_key
        .iter()
        .filter(|(_, q)| !q.is_empty())
        .map(|(k, q)| format!("{k:?} x{}", q.len()))
        .collect();
    let few = |v: &[String]| v.iter().take(8).cloned().collect::<Vec<_>>().join("; ");
    if !missing.is_empty() {
        c.fail(format!(
            "lineage: {} requests blktrace did not issue: {}",
            missing.len(),
            few(&missing)
        ));
    }
    if !extra.is_empty() {
        c.fail(format!(
            "blktrace: {} requests (by identity) not in the lineage: {}",
            extra.len(),
            few(&extra)
        ));
    }
    if !differ.is_empty() {
        c.fail(format!(
            "lineage: {} of {compared} requests have other bios than blktrace saw: {}",
            differ.len(),
            few(&differ)
        ));
    }
    (rqs.len(), compared)
}
