//! `report --latency`: a capture's latency per cgroup, replayed request by request (the
//! lineage tracker). Requests into the same log2 histograms as the live view's `--latency`
//! (queue: `block_getrq` → first issue; device: first issue → the completion that finished
//! it; apart for requests that carried merged bios), and each bio's own wait — queued → its
//! request issued — by how it joined its request (started it, or merged on which path),
//! which only a capture can tell.
use std::collections::BTreeMap;

use mergetrace_common::latency::{lat_bucket, LatencyHist, MERGED, SINGLE};
use serde::Serialize;

use crate::{
    model::aggregate::{Dir, Key},
    model::snapshot::Snapshot,
    offline::{analysis::LatencyStats, lineage::Lineage},
};

/// Each key's request latency histograms (for the snapshot's rows, as the live view's).
pub fn request_histograms(lin: &Lineage) -> BTreeMap<Key, LatencyHist> {
    let mut out: BTreeMap<Key, LatencyHist> = BTreeMap::new();
    for r in &lin.requests {
        let key = Key {
            dev: r.dev,
            cgroup_id: r.cgroup_id,
            dir: Dir::of_op(r.op),
        };
        let h = out.entry(key).or_default();
        let class = if r.bio_count > 1 { MERGED } else { SINGLE };
        if let Some(created) = r.getrq_ts {
            let ns = r.issue_ts.saturating_sub(created);
            h.queue[class][lat_bucket(ns)] += 1;
            h.queue_ns[class] += ns;
        }
        if let Some(done) = r.complete_ts {
            let ns = done.saturating_sub(r.issue_ts);
            h.device[class][lat_bucket(ns)] += 1;
            h.device_ns[class] += ns;
        }
    }
    out
}

/// The bios of one (device, cgroup, direction) that joined their requests one way: how long
/// each waited from `block_bio_queue` to its request's first issue.
#[derive(Debug, Clone, Serialize)]
pub struct BioWait {
    pub device: String,
    pub cgroup: String,
    pub dir: &'static str,
    /// "new request", "back merge (plug)", "front merge (elevator)", ...
    pub joined: String,
    pub wait: LatencyStats,
}

/// Every bio's wait in `lin`, by (device, cgroup, direction, how it joined), for the rows
/// `snap` shows (it applied the cgroup filter). Bios the capture has no `bio_queue` for
/// (queued before it started) are left out.
pub fn bio_waits(lin: &Lineage, snap: &Snapshot) -> Vec<BioWait> {
    let mut shown: BTreeMap<(u32, u64), (&str, &str)> = BTreeMap::new();
    for d in &snap.devices {
        for c in &d.cgroups {
            shown.insert((d.dev().0, c.cgroup_id), (&d.device, &c.cgroup));
        }
    }
    let mut samples: BTreeMap<(u32, u64, Dir, String), Vec<u64>> = BTreeMap::new();
    for r in &lin.requests {
        if !shown.contains_key(&(r.dev, r.cgroup_id)) {
            continue;
        }
        for b in &r.bios {
            if let Some(q) = b.queue_ts {
                let key = (r.dev, r.cgroup_id, Dir::of_op(r.op), b.join.describe());
                samples
                    .entry(key)
                    .or_default()
                    .push(r.issue_ts.saturating_sub(q));
            }
        }
    }
    samples
        .into_iter()
        .filter_map(|((dev, cg, dir, joined), mut ns)| {
            let (device, cgroup) = shown[&(dev, cg)];
            Some(BioWait {
                device: device.to_string(),
                cgroup: cgroup.to_string(),
                dir: dir.name(),
                joined,
                wait: LatencyStats::of(&mut ns)?,
            })
        })
        .collect()
}
