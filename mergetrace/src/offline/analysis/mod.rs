//! Distributions of a capture, for `report` (text and `--json`'s "distributions") and
//! `report --html`: request latencies (insert → issue, issue → complete) and per-second
//! series per (device, cgroup, direction), taken from the one-second intervals the capture
//! was counted in (not counted twice). The request size, bios-per-request and plug
//! flush histograms are the snapshot's own (counted by the same rule as the live view);
//! [`buckets`] labels them for the text (`view::distributions`) and HTML reports.
mod buckets;

use std::collections::hash_map::Entry;

use foldhash::HashMap;
use mergetrace_common::{kind, Event};
use serde::Serialize;

pub use buckets::{
    count_buckets, count_label, size_buckets, size_label, unplug_rows, RequestHistogram,
    REQUEST_HISTOGRAMS,
};

use crate::{
    model::aggregate::{Counts, Dir, Key, RunMap, Window},
    model::snapshot::Snapshot,
    sys::cgroups::in_subtree,
};

/// Request latency samples of one (device, cgroup, direction), in ns.
#[derive(Debug, Clone, Default)]
struct Samples {
    insert_to_issue: Vec<u64>,
    issue_to_complete: Vec<u64>,
    /// Issued without an insert event (direct issue: no scheduler, or the plug flushed
    /// straight to the driver).
    direct: u64,
}

#[derive(Debug, Clone, Copy)]
struct Issued {
    ts: u64,
    bytes: u64,
    done: u64,
    key: (u32, u64, Dir),
}

/// Collects what the distributions need from every event of a capture, in stream order.
#[derive(Default)]
pub struct Analysis {
    inserted: HashMap<u64, u64>,
    issued: HashMap<u64, Issued>,
    samples: RunMap<(u32, u64, Dir), Samples>,
}

/// count, min, percentiles and max of a set of latencies, in µs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyStats {
    pub count: u64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl LatencyStats {
    /// Nearest-rank percentiles of `ns` (reordered here); `None` when empty.
    pub fn of(ns: &mut [u64]) -> Option<LatencyStats> {
        if ns.is_empty() {
            return None;
        }
        let rank = |p: f64| {
            let i = ((p / 100.0) * ns.len() as f64).ceil() as usize;
            i.clamp(1, ns.len()) - 1
        };
        let ranks = [0, rank(50.0), rank(90.0), rank(99.0), ns.len() - 1];
        let [min, p50, p90, p99, max] = at_ranks(ns, ranks).map(|v| v as f64 / 1000.0);
        Some(LatencyStats {
            count: ns.len() as u64,
            min_us: min,
            p50_us: p50,
            p90_us: p90,
            p99_us: p99,
            max_us: max,
        })
    }
}

/// The values `ns` would have at the (ascending) `ranks` once sorted, found by selection: a
/// fifth of the instructions of a sort, on a million samples.
fn at_ranks<const N: usize>(ns: &mut [u64], ranks: [usize; N]) -> [u64; N] {
    let mut out = [0; N];
    // ns[..from] holds the smallest values, in place after the selections so far.
    let (mut from, mut last) = (0, 0);
    for (o, r) in out.iter_mut().zip(ranks) {
        if r >= from {
            last = *ns[from..].select_nth_unstable(r - from).1;
            from = r + 1;
        }
        *o = last; // else r is the rank before again
    }
    out
}

/// Request latencies of one device and direction (over the cgroups shown).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub device: String,
    pub dir: &'static str,
    /// Requests issued without an insert event: no insert → issue sample.
    pub direct_issues: u64,
    /// From `rq_insert` to `rq_issue` of the same request address; `null` without samples.
    pub insert_to_issue: Option<LatencyStats>,
    /// From `rq_issue` to the `rq_complete` that finished the request.
    pub issue_to_complete: Option<LatencyStats>,
}

/// One (device, cgroup, direction) per second since the capture's start.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub device: String,
    pub cgroup: String,
    pub cgroup_id: u64,
    pub dir: &'static str,
    /// Bios that reached the device (counted per request, as `bios`), per second.
    pub bios: Vec<u64>,
    /// Requests issued (not counting re-issues), per second.
    pub requests: Vec<u64>,
    /// Merges of every kind (the `merged` field's rule), per second.
    pub merged: Vec<u64>,
    /// ios blk-throttle charged (`charged_ios`'s rule), per second.
    pub charged: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimeSeries {
    /// Bucket width in seconds (1).
    pub bucket_s: u64,
    /// CLOCK_MONOTONIC ns of bucket 0's start: the capture's start (or `--from`).
    pub start_ns: u64,
    /// Number of buckets in every series.
    pub buckets: usize,
    pub series: Vec<Series>,
}

/// `report --json`'s "distributions".
#[derive(Debug, Clone, Serialize)]
pub struct Distributions {
    pub latency: Vec<LatencyRow>,
    pub timeseries: TimeSeries,
    /// `report --latency`: each bio's wait until its request was issued, by how it joined.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bio_wait: Vec<crate::offline::latency::BioWait>,
}

impl Analysis {
    pub fn apply(&mut self, ev: &Event) {
        let key = (ev.dev, ev.cgroup_id, Dir::of_op(ev.op));
        match ev.kind {
            kind::RQ_INSERT => {
                self.inserted.insert(ev.id, ev.ts_ns);
            }
            kind::RQ_ISSUE => {
                let s = self.samples.get_or_default(key);
                // No lookup while nothing was inserted (no scheduler: every issue direct).
                let inserted = if self.inserted.is_empty() {
                    None
                } else {
                    self.inserted.remove(&ev.id)
                };
                match inserted {
                    Some(t) => s.insert_to_issue.push(ev.ts_ns.saturating_sub(t)),
                    None => s.direct += 1,
                }
                self.issued.insert(
                    ev.id,
                    Issued {
                        ts: ev.ts_ns,
                        bytes: ev.bytes as u64,
                        done: 0,
                        key,
                    },
                );
            }
            kind::RQ_REQUEUE => {
                self.issued.remove(&ev.id);
            }
            kind::RQ_COMPLETE => {
                if let Entry::Occupied(mut o) = self.issued.entry(ev.id) {
                    let i = o.get_mut();
                    i.done += ev.aux as u64;
                    if i.done >= i.bytes || ev.aux == 0 {
                        let i = o.remove();
                        self.samples
                            .get_or_default(i.key)
                            .issue_to_complete
                            .push(ev.ts_ns.saturating_sub(i.ts));
                    }
                }
            }
            _ => {}
        }
    }

    /// The distributions of the devices and cgroups in `snap` (which applied the cgroup
    /// filter); the per-second series are `intervals`' (the loaded capture's one-second
    /// intervals, [`crate::offline::load::JUDGED_EVERY_NS`]).
    pub fn finish(mut self, snap: &Snapshot, intervals: &[Window]) -> Distributions {
        let devs: Vec<(u32, &str)> = snap
            .devices
            .iter()
            .map(|d| (d.dev().0, d.device.as_str()))
            .collect();
        // The cgroups the snapshot shows, per device (it applied -c).
        let shown: HashMap<(u32, u64), &str> = snap
            .devices
            .iter()
            .flat_map(|d| {
                let dev = d.dev().0;
                d.cgroups
                    .iter()
                    .map(move |c| ((dev, c.cgroup_id), c.cgroup.as_str()))
            })
            .collect();
        let mut latency = Vec::new();
        for (dev, name) in &devs {
            for dir in Dir::ALL {
                let mut merged = Samples::default();
                let mut any = false;
                for ((d, cg, di), s) in self.samples.iter_mut() {
                    if d == dev && *di == dir && shown.contains_key(&(*dev, *cg)) {
                        any = true;
                        merged.insert_to_issue.append(&mut s.insert_to_issue);
                        merged.issue_to_complete.append(&mut s.issue_to_complete);
                        merged.direct += s.direct;
                    }
                }
                if any {
                    latency.push(LatencyRow {
                        device: name.to_string(),
                        dir: dir.name(),
                        direct_issues: merged.direct,
                        insert_to_issue: LatencyStats::of(&mut merged.insert_to_issue),
                        issue_to_complete: LatencyStats::of(&mut merged.issue_to_complete),
                    });
                }
            }
        }
        // Keys with counts in any interval, devices in the snapshot's order, then cgroup
        // path, then direction.
        let mut keys: Vec<Key> = intervals
            .iter()
            .flat_map(|w| w.counts.keys().copied())
            .collect();
        keys.sort_unstable_by_key(|k| (k.dev, k.cgroup_id, k.dir));
        keys.dedup();
        keys.sort_by_key(|k| {
            (
                devs.iter().position(|(d, _)| *d == k.dev),
                shown.get(&(k.dev, k.cgroup_id)).copied(),
                k.cgroup_id,
                k.dir,
            )
        });
        let mut series = Vec::new();
        for key in keys {
            let (Some(cgroup), Some((_, device))) = (
                shown.get(&(key.dev, key.cgroup_id)),
                devs.iter().find(|(d, _)| *d == key.dev),
            ) else {
                continue;
            };
            let col = |f: &dyn Fn(&Counts) -> u64| {
                intervals
                    .iter()
                    .map(|w| w.counts.get(&key).map_or(0, f))
                    .collect()
            };
            let s = Series {
                device: device.to_string(),
                cgroup: cgroup.to_string(),
                cgroup_id: key.cgroup_id,
                dir: key.dir.name(),
                bios: col(&|c| c.bios_per_request()),
                requests: col(&|c| c.issues.saturating_sub(c.requeues)),
                merged: col(&|c| c.merged_per_request()),
                charged: col(&|c| c.charged_ios),
            };
            let busy = |x: &Vec<u64>| x.iter().any(|n| *n > 0);
            if busy(&s.bios) || busy(&s.requests) || busy(&s.merged) || busy(&s.charged) {
                series.push(s);
            }
        }
        Distributions {
            latency,
            timeseries: TimeSeries {
                bucket_s: 1,
                start_ns: intervals.first().map_or(0, |w| w.start_ns),
                buckets: intervals.len(),
                series,
            },
            bio_wait: Vec::new(),
        }
    }
}

/// Whether cgroup `path` is shown under the `-c` filter `subtree`.
pub fn shown(path: &str, subtree: Option<&str>) -> bool {
    subtree.is_none_or(|s| in_subtree(path, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::aggregate::Aggregator,
        model::snapshot::{self, Lookup, SnapshotKind},
        model::timeline::Cuts,
        sys::device::Device,
        testing::synth::{Synth, START_NS},
    };
    use mergetrace_common::path;

    const DEV: u32 = 7 << 20 | 2;

    struct Names;
    impl Lookup for Names {
        fn cgroup_name(&mut self, id: u64) -> crate::sys::cgroups::CgroupName {
            crate::sys::cgroups::CgroupName {
                path: format!("/cg{id}"),
                gone: false,
            }
        }
        fn limits(&mut self, _: &str, _: &Device) -> crate::model::limits::Effective {
            Default::default()
        }
    }

    fn snap(events: &[Event], end: u64, subtree: Option<&str>) -> Snapshot {
        let mut a = Aggregator::new(START_NS);
        a.apply_all(events);
        snapshot::build(
            &a.total(end),
            SnapshotKind::Total,
            &[Device {
                name: "loop2".into(),
                major: 7,
                minor: 2,
                notes: vec![],
                bio_based: false,
            }],
            &mut Names,
            &snapshot::Options {
                tier: "tracepoint",
                fentry: false,
                meter_units: &[],
                subtree,
                iocost: &std::collections::BTreeMap::new(),
                wbt: &std::collections::BTreeMap::new(),
                wants: crate::kernel::Wants::ALL,
                per_bio: false,
                iolatency: &std::collections::BTreeMap::new(),
                timeline: None,
            },
        )
    }

    /// As `report` does: the events counted in one-second intervals from the start, and
    /// analysed.
    fn analyse(s: &Synth, subtree: Option<&str>) -> (Snapshot, Distributions) {
        let mut a = Analysis::default();
        let mut agg = Aggregator::new(START_NS);
        let mut cuts = Cuts::new(&agg, START_NS, crate::offline::load::JUDGED_EVERY_NS);
        for ev in &s.events {
            cuts.up_to(&agg, ev.ts_ns);
            agg.apply(ev);
            a.apply(ev);
        }
        let end = s.last_ts() + 1;
        let sn = snap(&s.events, end, subtree);
        let d = a.finish(&sn, &cuts.finish(&agg, end));
        (sn, d)
    }

    #[test]
    fn analysis_latency_percentiles_are_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).rev().map(|i| i * 1000).collect();
        let s = LatencyStats::of(&mut v).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!((s.min_us, s.max_us), (1.0, 100.0));
        assert_eq!((s.p50_us, s.p90_us, s.p99_us), (50.0, 90.0, 99.0));
        assert_eq!(LatencyStats::of(&mut [7000]).unwrap().p99_us, 7.0);
        assert!(LatencyStats::of(&mut []).is_none());
    }

    #[test]
    fn analysis_ranks_by_selection_are_the_sorted_ones() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in [1usize, 2, 3, 7, 100, 1001] {
            // Few distinct values: ties everywhere.
            let v: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 37
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort_unstable();
            let ranks = [0, n / 2, n / 2, n * 9 / 10, n - 1];
            assert_eq!(
                at_ranks(&mut v.clone(), ranks),
                ranks.map(|r| sorted[r]),
                "{n}"
            );
        }
    }

    #[test]
    fn analysis_latency_by_request_address() {
        let mut s = Synth::new();
        // Direct issue (plugged batch): no insert → issue.
        s.batch(DEV, 1, 0, 4, 4096, false, path::PLUG);
        // Inserted, issued 5 µs later, completed 20 µs after that.
        let mut r = s.open(DEV, 1, 1000, 4096);
        s.insert(&mut r);
        s.sleep(4000);
        let rq = s.issue(&r);
        s.sleep(19_000);
        s.complete_rq(&r, rq);
        let (_, d) = analyse(&s, None);
        assert_eq!(d.latency.len(), 1);
        let l = &d.latency[0];
        assert_eq!((l.device.as_str(), l.dir), ("loop2", "write"));
        assert_eq!(l.direct_issues, 1);
        let ii = l.insert_to_issue.as_ref().unwrap();
        assert_eq!((ii.count, ii.min_us), (1, 5.0));
        let ic = l.issue_to_complete.as_ref().unwrap();
        assert_eq!(ic.count, 2);
        assert_eq!(ic.max_us, 20.0);
        assert_eq!(
            ic.min_us, 1.0,
            "the batch completes one step after its issue"
        );
    }

    #[test]
    fn analysis_series_per_second_and_cgroup() {
        let mut s = Synth::new();
        s.batch(DEV, 1, 0, 32, 4096, false, path::PLUG);
        s.sleep(2_000_000_000);
        s.batch(DEV, 1, 1024, 8, 4096, false, path::PLUG);
        s.batch(DEV, 2, 4096, 4, 4096, true, path::PLUG);
        let (sn, d) = analyse(&s, None);
        let ts = &d.timeseries;
        assert_eq!(ts.buckets, 3);
        assert_eq!(ts.series.len(), 2);
        let a = &ts.series[0];
        assert_eq!((a.cgroup.as_str(), a.dir), ("/cg1", "write"));
        assert_eq!(a.bios, [32, 0, 8]);
        assert_eq!(a.requests, [1, 0, 1]);
        assert_eq!(a.merged, [31, 0, 7]);
        assert_eq!(a.charged, [0, 0, 0]);
        let b = &ts.series[1];
        assert_eq!(b.bios, [0, 0, 4]);
        // The series add up to the snapshot's totals.
        let total: u64 = ts.series.iter().flat_map(|s| s.bios.iter()).sum();
        assert_eq!(total, sn.devices[0].total.write.bios);
        // -c keeps only that subtree.
        let (_, d) = analyse(&s, Some("/cg2"));
        assert_eq!(d.timeseries.series.len(), 1);
        assert_eq!(d.timeseries.series[0].cgroup, "/cg2");
        let text = crate::view::distributions::render_text(&sn, &analyse(&s, None).1);
        assert!(text.contains("bios per request, loop2 write"), "{text}");
        assert!(text.contains("32–63"), "{text}");
        assert!(text.contains("≤ 128 KiB"), "{text}");
        assert!(text.contains("plug flushes, loop2 (requests"), "{text}");
        assert!(text.contains("per second, loop2 /cg2 write"), "{text}");
        // A kernel whose flush path has no block_unplug (6.1, no scheduler): said, not omitted.
        s.events.retain(|e| e.kind != kind::UNPLUG);
        let (sn, d) = analyse(&s, None);
        let text = crate::view::distributions::render_text(&sn, &d);
        assert!(
            text.contains("plug flushes, loop2: none traced (block_unplug never fired"),
            "{text}"
        );
    }
}
