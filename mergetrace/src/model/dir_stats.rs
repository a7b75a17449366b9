//! One (cgroup, device, direction)'s numbers as the views show them, made from the raw
//! counts: bios, merges by path, requests, splits, what each meter charged, histograms.
use std::collections::BTreeMap;

use mergetrace_common::{
    count::{COUNT_BUCKETS, SIZE_BUCKETS},
    path,
};
use serde::Serialize;

use crate::model::{
    aggregate::{Counts, Dir},
    latency::Latency,
    meter::{CloudMeter, LimitUse, Meters},
    snapshot::Options,
    timeline::OverTime,
};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Directions {
    pub read: DirStats,
    pub write: DirStats,
    pub discard: DirStats,
    pub flush: DirStats,
}

impl Directions {
    /// All four directions without I/O, as the tier reports them (a delay that cannot be
    /// known is `null` even where nothing waited).
    pub fn empty(opts: &Options) -> Directions {
        let none = |dir| DirStats::from_counts(&Counts::default(), dir, opts);
        Directions {
            read: none(Dir::Read),
            write: none(Dir::Write),
            discard: none(Dir::Discard),
            flush: none(Dir::Flush),
        }
    }

    pub fn get(&self, dir: Dir) -> &DirStats {
        match dir {
            Dir::Read => &self.read,
            Dir::Write => &self.write,
            Dir::Discard => &self.discard,
            Dir::Flush => &self.flush,
        }
    }
    pub(super) fn get_mut(&mut self, dir: Dir) -> &mut DirStats {
        match dir {
            Dir::Read => &mut self.read,
            Dir::Write => &mut self.write,
            Dir::Discard => &mut self.discard,
            Dir::Flush => &mut self.flush,
        }
    }
    pub fn is_empty(&self) -> bool {
        Dir::ALL.iter().all(|d| self.get(*d).is_empty())
    }
}

/// Bio merges by the mechanism that made them, plus the two kinds without a bio tracepoint
/// path: discard merges (derived) and request-request merges. Sums to `merged`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MergePaths {
    pub plug: u64,
    pub elevator_back: u64,
    pub elevator_front: u64,
    pub sw_queue: u64,
    /// Derived from the accounting identity: discard merges have no tracepoint.
    pub discard: u64,
    pub request: u64,
    /// Bio merges whose caller was not recognised (should stay 0).
    pub unknown: u64,
}

/// Distributions of the requests issued, as `upper bound → count` for non-empty buckets (the
/// last bucket's bound is `u64::MAX`: everything larger).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Histograms {
    /// Request size in bytes: bucket bounds 512, 1024, … 8 MiB.
    pub request_bytes: BTreeMap<u64, u64>,
    /// Bios carried per request: bucket bounds 1, 3, 7, … 2047.
    pub bios_per_request: BTreeMap<u64, u64>,
}

/// Upper bounds of the request size buckets: 512 B, 1 KiB, … 8 MiB, then `u64::MAX` for the
/// larger ones (the kernel's `size_bucket`).
pub fn size_bounds() -> [u64; SIZE_BUCKETS] {
    std::array::from_fn(|i| {
        if i == SIZE_BUCKETS - 1 {
            u64::MAX
        } else {
            512 << i
        }
    })
}

/// Upper bounds of the bios-per-request buckets: 1, 3, 7, … 2047, then `u64::MAX` (the
/// kernel's `count_bucket`).
pub fn count_bounds() -> [u64; COUNT_BUCKETS] {
    std::array::from_fn(|i| {
        if i == COUNT_BUCKETS - 1 {
            u64::MAX
        } else {
            (2 << i) - 1
        }
    })
}

impl Histograms {
    pub fn from_counts(c: &Counts) -> Histograms {
        let nonzero = |bounds: &[u64], counts: &[u64]| {
            bounds
                .iter()
                .zip(counts)
                .filter(|(_, n)| **n > 0)
                .map(|(b, n)| (*b, *n))
                .collect()
        };
        Histograms {
            request_bytes: nonzero(&size_bounds(), &c.request_size_hist),
            bios_per_request: nonzero(&count_bounds(), &c.bios_per_request_hist),
        }
    }

    pub(super) fn add(&mut self, o: &Histograms) {
        for (k, v) in &o.request_bytes {
            *self.request_bytes.entry(*k).or_default() += v;
        }
        for (k, v) in &o.bios_per_request {
            *self.bios_per_request.entry(*k).or_default() += v;
        }
    }
}

/// fentry tier only: what the merge machinery tried, including attempts that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MergeAttempts {
    /// `blk_attempt_plug_merge` calls, and how many merged.
    pub plug_attempts: u64,
    pub plug_merged: u64,
    /// `elv_merge` decisions: no merge, front, back, discard.
    pub elevator_no_merge: u64,
    pub elevator_front: u64,
    pub elevator_back: u64,
    pub elevator_discard: u64,
}

/// Bios that waited in blk-throttle's queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Throttled {
    pub bios: u64,
    /// fentry tier: bios blk-throttle queued in the window (they are in `bios` when released,
    /// maybe in a later window); `null` on the tracepoint tier, which sees a throttled bio only
    /// when it is released.
    pub queued: Option<u64>,
    /// Total time they waited (fentry tier); `null` when it cannot be known: always on the
    /// tracepoint tier, which sees a throttled bio only when blk-throttle releases it.
    pub delay_ns_total: Option<u64>,
    /// `true` on the tracepoint tier: the delay is not measured there (`delay_ns_total` is
    /// null). An estimate from the queue left behind at each release was tried and read 150x
    /// too low: blk-throttle releases its queued bios in batches (the name is kept for the
    /// JSON contract).
    pub delay_estimated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct DirStats {
    /// Bios submitted (after the throttle; split remainders not counted again).
    pub bios: u64,
    pub bytes: u64,
    /// Bios and requests merged into an existing request, on every path (diskstats "merges").
    pub merged: u64,
    /// Requests issued to the device, each once (a requeued request issued again is still
    /// one request).
    pub requests: u64,
    pub request_bytes: u64,
    pub splits: u64,
    /// Write direction: empty write bios with `REQ_PREFLUSH`/`REQ_FUA` (fsync, journal
    /// commits) that the flush machinery completed without a write request; it issued a flush
    /// request (the `flush` direction) instead. /proc/diskstats counts them as completed
    /// writes: its writes are `requests + flush_only`.
    pub flush_only: u64,
    /// Requests the driver handed back (`BLK_STS_RESOURCE`) to be issued again.
    pub requeues: u64,
    pub merged_by_path: MergePaths,
    /// What blk-throttle charged: 1 io per bio and per split remainder, bytes once per bio
    /// (512 per discard), where the cgroup has a rule for the direction.
    pub charged_ios: u64,
    pub charged_bytes: u64,
    pub throttled: Throttled,
    pub meters: Meters,
    pub histograms: Histograms,
    /// `--latency`: queue and device latency of the requests (null when not counted).
    pub latency: Option<Latency>,
    /// fentry tier: merge attempts and their outcome (absent on the tracepoint tier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_attempts: Option<MergeAttempts>,
    /// Limits in force for this direction, with this window's use.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<&'static str, LimitUse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// The live view's total: how the direction went over the run's intervals (what the
    /// verdict's use over active time and intervals held rest on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_time: Option<OverTime>,
}

impl DirStats {
    pub fn from_counts(c: &Counts, dir: Dir, opts: &Options) -> DirStats {
        let (bios, bytes, merged, merged_by_path) = if opts.per_bio {
            Self::per_bio(c, dir)
        } else {
            Self::per_request(c)
        };
        DirStats {
            charged_ios: c.charged_ios,
            charged_bytes: c.charged_bytes,
            throttled: Throttled {
                // fentry: every release from the throttle queue, measured (split remainders
                // included); tracepoint: bios and remainders seen in the dispatch work.
                bios: if opts.fentry {
                    c.throttle_releases
                } else {
                    c.throttled_bios
                },
                queued: opts.fentry.then_some(c.throttle_queued),
                delay_ns_total: opts.fentry.then_some(c.throttle_delay_ns),
                delay_estimated: !opts.fentry,
            },
            merge_attempts: (opts.fentry && opts.wants.attempts).then_some(MergeAttempts {
                plug_attempts: c.plug_attempts,
                plug_merged: c.plug_merged,
                elevator_no_merge: c.elv_decisions[0],
                elevator_front: c.elv_decisions[1],
                elevator_back: c.elv_decisions[2],
                elevator_discard: c.elv_decisions[3],
            }),
            meters: Meters {
                per_bio: bios + c.splits,
                per_request: c.requests(),
                per_request_created: c.requests_created(),
                cloud: opts
                    .meter_units
                    .iter()
                    .zip(c.meter_units)
                    .map(|(unit, units)| CloudMeter {
                        unit_bytes: *unit,
                        units,
                    })
                    .collect(),
                iocost: None,
                wbt: None,
                iolatency: None,
            },
            histograms: Histograms::from_counts(c),
            latency: opts.wants.latency.then(Latency::default),
            limits: BTreeMap::new(),
            verdict: None,
            over_time: None,
            bios,
            bytes,
            merged,
            requests: c.requests(),
            request_bytes: c.issue_bytes,
            splits: c.splits,
            flush_only: c.flush_only,
            requeues: c.requeues,
            merged_by_path,
        }
    }

    /// Bios, their bytes, merges and merges by path as counted per request (every run): the
    /// bios that reached the device in requests (plus data-less flush writes, which never
    /// become one), each merge where its request was at the time.
    fn per_request(c: &Counts) -> (u64, u64, u64, MergePaths) {
        let at = c.merges_at;
        let elevator = at[path::ELEVATOR as usize];
        let front = c.elevator_front_merges.min(elevator);
        let paths = MergePaths {
            plug: at[path::PLUG as usize],
            elevator_back: elevator - front,
            elevator_front: front,
            sw_queue: at[path::SW_QUEUE as usize],
            discard: at[path::DISCARD as usize],
            request: c.rq_merges,
            // Slots past the known places: none is ever written (values the programs never
            // send), but their sum is shown rather than lost.
            unknown: at[path::UNKNOWN as usize] + at[path::COUNT..].iter().sum::<u64>(),
        };
        (
            c.bios_per_request(),
            c.rq_bio_bytes,
            c.merged_per_request(),
            paths,
        )
    }

    /// The same from the per-bio events (each bio as it leaves blk-throttle, each bio merge
    /// with its path): the oracle the per-request counts are tested against, and captures
    /// of versions that did not count per request.
    fn per_bio(c: &Counts, dir: Dir) -> (u64, u64, u64, MergePaths) {
        let back = c.back_merges_by_path;
        let all = c.bio_merges_by_path;
        let paths = MergePaths {
            plug: all[path::PLUG as usize],
            elevator_back: back[path::ELEVATOR as usize],
            elevator_front: all[path::ELEVATOR as usize] - back[path::ELEVATOR as usize],
            sw_queue: all[path::SW_QUEUE as usize],
            discard: c.discard_merges(dir.code()),
            request: c.rq_merges,
            unknown: all[path::UNKNOWN as usize],
        };
        (c.bios, c.bytes, c.merged_per_bio(dir.code()), paths)
    }

    /// Nothing happened: no bio, request, merge or split, no bio entered blk-throttle's queue
    /// (fentry tier: a bio queued now may be released in a later window) and none left it or
    /// was charged. On the fentry tier a bio queued in one window is charged and released in a
    /// later one, and its request may be made in the window after that: the window of the
    /// release then has nothing but the charge and the release, and is not empty (seen in the
    /// 6.1 guest: a 256 KiB bio under wbps 128 KiB/s, its charge in no printed interval).
    pub fn is_empty(&self) -> bool {
        self.bios == 0
            && self.requests == 0
            && self.merged == 0
            && self.splits == 0
            && self.charged_ios == 0
            && self.charged_bytes == 0
            && self.throttled.bios == 0
            && self.throttled.queued.unwrap_or(0) == 0
            && self.latency.is_none_or(|l| l == Latency::default())
    }

    /// Bios waited in blk-throttle in the window: released after waiting, or (fentry) queued.
    pub fn waited(&self) -> bool {
        self.throttled.bios > 0 || self.throttled.queued.unwrap_or(0) > 0
    }

    /// Bios (and split pieces) that reached a request: what merging compressed. Flush-only
    /// writes never become one, so they are left out.
    pub fn bios_to_requests(&self) -> u64 {
        (self.bios + self.splits).saturating_sub(self.flush_only)
    }

    /// Bios per device request, if any requests.
    pub fn bios_per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.bios_to_requests() as f64 / self.requests as f64)
    }

    /// Average request size in bytes, if any requests.
    pub fn avg_request_bytes(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.request_bytes as f64 / self.requests as f64)
    }

    pub(super) fn add(&mut self, o: &DirStats) {
        match (&mut self.latency, &o.latency) {
            (Some(a), Some(b)) => a.add(b),
            (None, Some(b)) => self.latency = Some(*b),
            _ => {}
        }
        self.bios += o.bios;
        self.bytes += o.bytes;
        self.merged += o.merged;
        self.requests += o.requests;
        self.request_bytes += o.request_bytes;
        self.splits += o.splits;
        self.flush_only += o.flush_only;
        self.requeues += o.requeues;
        let (a, b) = (&mut self.merged_by_path, &o.merged_by_path);
        a.plug += b.plug;
        a.elevator_back += b.elevator_back;
        a.elevator_front += b.elevator_front;
        a.sw_queue += b.sw_queue;
        a.discard += b.discard;
        a.request += b.request;
        a.unknown += b.unknown;
        self.charged_ios += o.charged_ios;
        self.charged_bytes += o.charged_bytes;
        self.throttled.bios += o.throttled.bios;
        self.throttled.queued = add_known(self.throttled.queued, o.throttled.queued);
        if let (Some(a), Some(b)) = (&mut self.merge_attempts, &o.merge_attempts) {
            a.plug_attempts += b.plug_attempts;
            a.plug_merged += b.plug_merged;
            a.elevator_no_merge += b.elevator_no_merge;
            a.elevator_front += b.elevator_front;
            a.elevator_back += b.elevator_back;
            a.elevator_discard += b.elevator_discard;
        } else if self.merge_attempts.is_none() {
            self.merge_attempts = o.merge_attempts.clone();
        }
        self.throttled.delay_estimated = o.throttled.delay_estimated;
        self.throttled.delay_ns_total =
            add_known(self.throttled.delay_ns_total, o.throttled.delay_ns_total);
        self.histograms.add(&o.histograms);
        self.meters.per_bio += o.meters.per_bio;
        self.meters.per_request += o.meters.per_request;
        self.meters.per_request_created += o.meters.per_request_created;
        match (&mut self.meters.iocost, &o.meters.iocost) {
            (Some(a), Some(b)) => a.add(b),
            (a @ None, Some(b)) => *a = Some(b.clone()),
            _ => {}
        }
        match (&mut self.meters.wbt, &o.meters.wbt) {
            (Some(a), Some(b)) => a.add(b),
            (a @ None, Some(b)) => *a = Some(*b),
            _ => {}
        }
        match (&mut self.meters.iolatency, &o.meters.iolatency) {
            (Some(a), Some(b)) => a.add(b),
            (a @ None, Some(b)) => {
                let mut b = *b;
                b.target_us = None;
                *a = Some(b);
            }
            _ => {}
        }
        if self.meters.cloud.is_empty() {
            self.meters.cloud = o.meters.cloud.clone();
        } else {
            for (a, b) in self.meters.cloud.iter_mut().zip(&o.meters.cloud) {
                a.units += b.units;
            }
        }
    }
}

/// The sum of two counts a tier may not know (`None`): what is known of them.
fn add_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
