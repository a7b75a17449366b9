//! What wbt counted: on a disk with wbt on, each new request of a buffered write or discard
//! takes one of its in-flight slots (`wbt_wait`, for bios that did not merge), O_DIRECT writes
//! pass it, and a bio that merges rides in a request already let through. Pure arithmetic.
use serde::Serialize;

use crate::fmt;

/// One cgroup's writes or discards under wbt, in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WbtCount {
    /// New requests of the class wbt throttles: each took an in-flight slot.
    pub requests: u64,
    /// New requests wbt let by without a slot (O_DIRECT writes: `REQ_SYNC | REQ_IDLE`).
    pub passed_requests: u64,
}

impl WbtCount {
    /// From the direction's counters: requests started by bios (`getrq`), and those of them
    /// of wbt's class.
    pub fn of(getrq: u64, wbt_class_requests: u64) -> WbtCount {
        WbtCount {
            requests: wbt_class_requests,
            passed_requests: getrq.saturating_sub(wbt_class_requests),
        }
    }

    /// Adds another row's counts (a device's total).
    pub fn add(&mut self, o: &WbtCount) {
        self.requests += o.requests;
        self.passed_requests += o.passed_requests;
    }

    /// The verdict's sentence: what wbt counted and what merging did under it. `merged_bios`:
    /// the bios of the direction that merged into a request in the window.
    pub fn verdict(&self, target: &str, merged_bios: u64) -> Option<String> {
        let passed = |lead: &str| {
            format!(
                "{lead}{} O_DIRECT write requests passed it without a slot",
                fmt::thousands(self.passed_requests)
            )
        };
        if self.requests == 0 {
            return (self.passed_requests > 0).then(|| {
                format!(
                    "wbt (latency target {target}) does not limit these writes: {}",
                    passed("")
                )
            });
        }
        let rode = if merged_bios == 0 {
            "no bio merged, so each took a slot of its own".to_string()
        } else {
            format!(
                "{} bios merged and rode in requests already let through — merging is what \
                 lets more bytes through the same depth",
                fmt::thousands(merged_bios)
            )
        };
        let also = if self.passed_requests > 0 {
            passed("; ")
        } else {
            String::new()
        };
        Some(format!(
            "wbt (latency target {target}) counted {} new requests against its in-flight limit, \
             one slot each; {rode}{also}",
            fmt::thousands(self.requests)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_not_bios() {
        let buffered = WbtCount::of(49, 49);
        assert_eq!(buffered.passed_requests, 0);
        assert_eq!(
            buffered.verdict("2 ms", 12_239).unwrap(),
            "wbt (latency target 2 ms) counted 49 new requests against its in-flight limit, one \
             slot each; 12,239 bios merged and rode in requests already let through — merging \
             is what lets more bytes through the same depth"
        );
        let direct = WbtCount::of(300, 1);
        assert!(direct
            .verdict("2 ms", 0)
            .unwrap()
            .ends_with("no bio merged, so each took a slot of its own; 299 O_DIRECT write requests passed it without a slot"));
        assert_eq!(
            WbtCount::of(300, 0).verdict("75 ms", 9_300).unwrap(),
            "wbt (latency target 75 ms) does not limit these writes: 300 O_DIRECT write requests \
             passed it without a slot"
        );
        assert_eq!(WbtCount::of(0, 0).verdict("2 ms", 0), None);
    }
}
