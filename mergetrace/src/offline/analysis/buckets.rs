//! The histograms' buckets for people: labels of their bounds, the run of buckets worth
//! drawing, and plug flush depths as rows. Shared by the text and HTML reports.
use std::collections::BTreeMap;

use mergetrace_common::count::COUNT_BUCKETS;

use crate::model::snapshot::{count_bounds, size_bounds, Histograms, UnplugSnapshot};

/// A histogram's counts by bucket bound.
type Counts = BTreeMap<u64, u64>;

/// One of the per-request histograms both reports draw.
pub struct RequestHistogram {
    /// What it counts per request (its title).
    pub what: &'static str,
    /// What its buckets are (a chart's x axis).
    pub axis: &'static str,
    /// The histogram in a direction's [`Histograms`].
    pub of: fn(&Histograms) -> &Counts,
    /// The run of its buckets worth drawing.
    pub buckets: fn(&Counts) -> Vec<(u64, u64)>,
    /// A bucket bound's label.
    pub label: fn(u64) -> String,
}

/// The request histograms, in the order the reports show them.
pub const REQUEST_HISTOGRAMS: [RequestHistogram; 2] = [
    RequestHistogram {
        what: "request size",
        axis: "request size",
        of: |h| &h.request_bytes,
        buckets: size_buckets,
        label: size_label,
    },
    RequestHistogram {
        what: "bios per request",
        axis: "bios in the request",
        of: |h| &h.bios_per_request,
        buckets: count_buckets,
        label: count_label,
    },
];

/// Labels for the request size histogram's bucket bounds: "≤ 4 KiB", "> 8 MiB".
pub fn size_label(bound: u64) -> String {
    if bound == u64::MAX {
        return "> 8 MiB".into();
    }
    if bound >= 1 << 20 {
        format!("≤ {} MiB", bound >> 20)
    } else if bound >= 1024 {
        format!("≤ {} KiB", bound >> 10)
    } else {
        format!("≤ {bound} B")
    }
}

/// Labels for the bios-per-request buckets: bound 1 → "1", 3 → "2–3", …, MAX → "≥ 2048".
pub fn count_label(bound: u64) -> String {
    if bound == u64::MAX {
        return format!("≥ {}", 1u64 << (COUNT_BUCKETS - 1));
    }
    let lo = bound.div_ceil(2);
    if lo == bound {
        bound.to_string()
    } else {
        format!("{lo}–{bound}")
    }
}

/// Every bucket bound of a histogram from its smallest to its largest non-empty bucket.
pub fn size_buckets(h: &BTreeMap<u64, u64>) -> Vec<(u64, u64)> {
    dense(h, &size_bounds())
}

pub fn count_buckets(h: &BTreeMap<u64, u64>) -> Vec<(u64, u64)> {
    dense(h, &count_bounds())
}

/// The buckets from the smallest to the largest non-empty one, with one empty neighbour on
/// each side where there is one (so a single bucket still shows where it sits).
fn dense(h: &BTreeMap<u64, u64>, bounds: &[u64]) -> Vec<(u64, u64)> {
    let lo = bounds.iter().position(|b| h.get(b).is_some_and(|n| *n > 0));
    let hi = bounds
        .iter()
        .rposition(|b| h.get(b).is_some_and(|n| *n > 0));
    match (lo, hi) {
        (Some(lo), Some(hi)) => bounds[lo.saturating_sub(1)..=(hi + 1).min(bounds.len() - 1)]
            .iter()
            .map(|b| (*b, h.get(b).copied().unwrap_or(0)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Plug flush depths of one device: (depth, explicit, from schedule), every depth seen
/// (none where they were not counted).
pub fn unplug_rows(u: Option<&UnplugSnapshot>) -> Vec<(u32, u64, u64)> {
    let Some(u) = u else {
        return Vec::new();
    };
    let mut depths: Vec<u32> = u
        .explicit
        .keys()
        .chain(u.from_schedule.keys())
        .copied()
        .collect();
    depths.sort_unstable();
    depths.dedup();
    depths
        .into_iter()
        .map(|d| {
            (
                d,
                u.explicit.get(&d).copied().unwrap_or(0),
                u.from_schedule.get(&d).copied().unwrap_or(0),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_labels() {
        assert_eq!(size_label(4096), "≤ 4 KiB");
        assert_eq!(size_label(512), "≤ 512 B");
        assert_eq!(size_label(1 << 20), "≤ 1 MiB");
        assert_eq!(size_label(u64::MAX), "> 8 MiB");
        assert_eq!(count_label(1), "1");
        assert_eq!(count_label(3), "2–3");
        assert_eq!(count_label(63), "32–63");
        assert_eq!(count_label(u64::MAX), "≥ 2048");
        let h: BTreeMap<u64, u64> = [(4096, 2), (32768, 1)].into();
        assert_eq!(
            size_buckets(&h),
            [
                (2048, 0),
                (4096, 2),
                (8192, 0),
                (16384, 0),
                (32768, 1),
                (65536, 0)
            ]
        );
        let one: BTreeMap<u64, u64> = [(1, 5)].into();
        assert_eq!(count_buckets(&one), [(1, 5), (3, 0)]);
    }
}
