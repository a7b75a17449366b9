//! What io.latency counted: on a disk with io.latency targets, each new request of a cgroup
//! below the root takes an in-flight slot at every level of its path
//! (`blkcg_iolatency_throttle` in `rq_qos_throttle`, for bios that did not merge); a bio that
//! merges takes none. Pure arithmetic.
use serde::Serialize;

use crate::{fmt, sys::iolatency::IoLatency};

/// One cgroup's reads, writes or discards under io.latency, in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IolatencyCount {
    /// New requests started by its bios (flush-only writes included): each took an in-flight
    /// slot at every level of its path below the root.
    pub requests: u64,
    /// The target the cgroup sets itself for the disk, in µs: it protects the cgroup (its
    /// siblings with looser targets are held back when it misses it). Absent where it sets
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_us: Option<u64>,
}

impl IolatencyCount {
    /// Adds another row's counts (a device's total: the targets are the rows' own).
    pub fn add(&mut self, o: &IolatencyCount) {
        self.requests += o.requests;
        self.target_us = None;
    }

    /// The verdict's sentence: what io.latency counted of the cgroup and what merging did
    /// under it. `merged_bios`: the bios of the direction that merged into a request.
    pub fn verdict(&self, targets: &IoLatency, merged_bios: u64) -> Option<String> {
        if self.requests == 0 {
            return None;
        }
        let own = match self.target_us {
            Some(us) => format!("its own target, {}, protects it; ", fmt::latency_us(us)),
            None => String::new(),
        };
        let rode = if merged_bios == 0 {
            "no bio merged, so each bio took a slot of its own".to_string()
        } else {
            format!(
                "{} bios merged and took none — merging is what lets a cgroup held to a few \
                 requests in flight move more per slot",
                fmt::thousands(merged_bios)
            )
        };
        let s = if self.requests == 1 { "" } else { "s" };
        Some(format!(
            "io.latency (targets: {}): {own}it counted {} new request{s}, a slot in flight \
             each at every level of its path; {rode}",
            targets.list(),
            fmt::thousands(self.requests)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::iolatency::Target;

    #[test]
    fn counts_requests_not_bios() {
        let targets = IoLatency {
            targets: vec![Target {
                cgroup: "/db".into(),
                target_us: 10_000,
            }],
        };
        let batch = IolatencyCount {
            requests: 49,
            target_us: None,
        };
        assert_eq!(
            batch.verdict(&targets, 12_239).unwrap(),
            "io.latency (targets: /db 10 ms): it counted 49 new requests, a slot in flight each \
             at every level of its path; 12,239 bios merged and took none — merging is what \
             lets a cgroup held to a few requests in flight move more per slot"
        );
        let db = IolatencyCount {
            requests: 300,
            target_us: Some(10_000),
        };
        assert!(db.verdict(&targets, 0).unwrap().contains(
            "/db 10 ms): its own target, 10 ms, protects it; it counted 300 new requests"
        ));
        assert_eq!(IolatencyCount::default().verdict(&targets, 5), None);
        let mut total = db;
        total.add(&batch);
        assert_eq!((total.requests, total.target_us), (349, None));
    }
}
