//! A run over time: what each interval showed, per (device, cgroup, direction) — in how many
//! intervals the cgroup did I/O and for how long, in how many bios waited in blk-throttle, and
//! which limit held it back in each. A whole-run verdict judged from these is true over time:
//! an average over the whole wall time hides a limit that bound while the cgroup was busy.
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::{
    model::{
        aggregate::{Aggregator, Dir, Window},
        meter::{LimitSpan, LimitUse},
        snapshot::{self, Lookup, Options, Snapshot, SnapshotKind},
    },
    sys::device::Device,
};

/// How one (cgroup, device, direction) went over the intervals of a run (JSON `over_time`, in
/// the live view's total object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OverTime {
    /// Intervals of the run.
    pub intervals: u64,
    /// Intervals in which the cgroup did I/O in this direction, or had bios waiting in
    /// blk-throttle (fentry tier: a bio queued in one interval and released in a later one).
    pub active_intervals: u64,
    /// Their length in all: what use over active time divides by.
    pub active_secs: f64,
    /// Intervals in which bios of this direction waited in blk-throttle.
    pub waited_intervals: u64,
}

/// One (cgroup, device, direction) over the intervals seen so far.
#[derive(Debug, Clone, Default)]
pub struct Track {
    active_intervals: u64,
    active_ns: u64,
    waited_intervals: u64,
    /// Limit name → intervals in which it held the cgroup back.
    held: BTreeMap<&'static str, u64>,
    /// fentry tier: bios blk-throttle queued and has not released yet.
    waiting: u64,
    /// The limits that held it in the last interval that named one (a bio still waiting
    /// waits for them).
    last_held: Vec<&'static str>,
    /// Each limit in force while it did I/O, as it changed: limit name → its spans, oldest
    /// first.
    spans: BTreeMap<&'static str, Vec<LimitSpan>>,
    /// The end of its last interval with I/O (CLOCK_MONOTONIC ns).
    last_active_ns: u64,
}

impl Track {
    /// Intervals in which limit `name` held the cgroup back.
    pub fn intervals_held(&self, name: &str) -> u64 {
        self.held.get(name).copied().unwrap_or(0)
    }

    pub fn active_secs(&self) -> f64 {
        self.active_ns as f64 / 1e9
    }

    /// fentry tier: bios blk-throttle queued are still waiting (as of the last interval).
    pub fn waiting(&self) -> bool {
        self.waiting > 0
    }

    /// The limits in force while it did I/O, each as it changed (empty where none was).
    pub fn limit_spans(&self) -> &BTreeMap<&'static str, Vec<LimitSpan>> {
        &self.spans
    }

    /// The end of its last interval with I/O.
    pub fn last_active_ns(&self) -> u64 {
        self.last_active_ns
    }

    /// Limit `name` as it stood in the last interval with I/O, if it was in force then.
    pub fn in_force(&self, name: &str) -> Option<&LimitSpan> {
        self.spans
            .get(name)
            .and_then(|s| s.last())
            .filter(|l| l.to_ns == self.last_active_ns)
    }

    /// An interval the cgroup spent waiting for the limits that last held it (nothing of it
    /// moved: a bio queued before), to `to_ns`, `secs` long: they held it through it, unused.
    fn note_wait(&mut self, (to_ns, secs): (u64, f64)) {
        for name in &self.last_held {
            if let Some(span) = self.spans.get_mut(name).and_then(|s| s.last_mut()) {
                let idle = LimitUse {
                    limit: span.limit,
                    ..LimitUse::default()
                };
                span.add(&idle, (to_ns, secs), true);
            }
        }
        self.last_active_ns = to_ns;
    }

    /// Notes the limits in force in an interval with I/O (`from_ns`..`to_ns`, `secs` long),
    /// with their use and whether each held the cgroup back (`held`).
    fn note_limits(
        &mut self,
        limits: &BTreeMap<&'static str, LimitUse>,
        (from_ns, to_ns, secs): (u64, u64, f64),
        held: &[&'static str],
    ) {
        for (name, u) in limits {
            let spans = self.spans.entry(name).or_default();
            let same = spans.last().is_some_and(|l| l.continues(u));
            if !same {
                if let Some(last) = spans.last_mut() {
                    last.end();
                }
                spans.push(LimitSpan::starting(u, from_ns));
            }
            let span = spans.last_mut().expect("pushed above");
            span.add(u, (to_ns, secs), held.contains(name));
        }
        // A limit not in force in this interval with I/O is over.
        for (name, spans) in self.spans.iter_mut() {
            if !limits.contains_key(name) {
                if let Some(last) = spans.last_mut() {
                    last.end();
                }
            }
        }
    }
}

/// Every (cgroup, device, direction) over the intervals of a run, fed interval by interval.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    intervals: u64,
    tracks: HashMap<(u32, u64, Dir), Track>,
}

impl Timeline {
    /// Adds one interval's snapshot (its rows' limits already judged).
    pub fn observe(&mut self, s: &Snapshot) {
        self.intervals += 1;
        let ns = s.end_ns.saturating_sub(s.start_ns);
        let secs = ns as f64 / 1e9;
        let mut seen = HashSet::new();
        for d in &s.devices {
            let dev = d.dev().0;
            for c in &d.cgroups {
                for dir in Dir::ALL {
                    let st = c.dirs.get(dir);
                    if st.is_empty() {
                        continue;
                    }
                    let key = (dev, c.cgroup_id, dir);
                    seen.insert(key);
                    let t = self.tracks.entry(key).or_default();
                    let carried = t.waiting > 0;
                    if let Some(queued) = st.throttled.queued {
                        t.waiting = (t.waiting + queued).saturating_sub(st.throttled.bios);
                    }
                    t.active_intervals += 1;
                    t.active_ns += ns;
                    t.last_active_ns = s.end_ns;
                    if carried || st.waited() {
                        t.waited_intervals += 1;
                    }
                    let held: Vec<&'static str> = st
                        .limits
                        .iter()
                        .filter(|(_, u)| u.held)
                        .map(|(n, _)| *n)
                        .collect();
                    if !held.is_empty() {
                        t.last_held = held;
                    } else if !carried {
                        t.note_limits(&st.limits, (s.start_ns, s.end_ns, secs), &[]);
                        continue;
                    }
                    // A bio still waiting from before is held by what held it then.
                    for n in &t.last_held {
                        *t.held.entry(n).or_default() += 1;
                    }
                    let held = t.last_held.clone();
                    t.note_limits(&st.limits, (s.start_ns, s.end_ns, secs), &held);
                }
            }
        }
        // fentry: a bio queued earlier and not released yet kept the cgroup waiting through an
        // interval in which nothing of it moved (a large bio under a bytes limit).
        for (key, t) in self.tracks.iter_mut() {
            if t.waiting > 0 && !seen.contains(key) {
                t.active_intervals += 1;
                t.active_ns += ns;
                t.waited_intervals += 1;
                for n in &t.last_held {
                    *t.held.entry(n).or_default() += 1;
                }
                t.note_wait((s.end_ns, secs));
            }
        }
    }

    /// Forgets the cgroups the run no longer counts under their own id (removed and reclaimed
    /// into `(removed)`): under churn the timeline follows the living cgroups.
    pub fn retain(&mut self, counted: impl Fn(u64) -> bool) {
        self.tracks.retain(|(_, id, _), _| counted(*id));
    }

    /// How (cgroup `id`, device `dev`, `dir`) went, if it was active in any interval.
    pub fn track(&self, dev: u32, id: u64, dir: Dir) -> Option<&Track> {
        self.tracks.get(&(dev, id, dir))
    }

    /// The JSON summary of a track.
    pub fn over_time(&self, t: &Track) -> OverTime {
        OverTime {
            intervals: self.intervals,
            active_intervals: t.active_intervals,
            active_secs: t.active_secs(),
            waited_intervals: t.waited_intervals,
        }
    }
}

/// A run judged over its `intervals` (in order, together `total`): each interval's snapshot
/// judged knowing the ones before it, and the whole run's judged over all of them.
pub fn judged(
    intervals: &[Window],
    total: &Window,
    devices: &[Device],
    lookup: &mut dyn Lookup,
    opts: &Options,
) -> (Vec<Snapshot>, Snapshot) {
    let mut timeline = Timeline::default();
    let mut shown = Vec::with_capacity(intervals.len());
    for w in intervals {
        let opts = Options {
            timeline: Some(&timeline),
            ..*opts
        };
        let s = snapshot::build(w, SnapshotKind::Interval, devices, lookup, &opts);
        timeline.observe(&s);
        shown.push(s);
    }
    let opts = Options {
        timeline: Some(&timeline),
        ..*opts
    };
    let whole = snapshot::build(total, SnapshotKind::Total, devices, lookup, &opts);
    (shown, whole)
}

/// An aggregator's running totals cut into intervals of `every_ns` as events are applied
/// (a capture read back, a synthetic run).
pub struct Cuts {
    done: Vec<Window>,
    previous: Window,
    next_ns: u64,
    every_ns: u64,
}

impl Cuts {
    pub fn new(agg: &Aggregator, start_ns: u64, every_ns: u64) -> Cuts {
        Cuts {
            done: Vec::new(),
            previous: agg.total(start_ns),
            next_ns: start_ns + every_ns,
            every_ns,
        }
    }

    /// Cuts every interval that ends at or before `ts_ns` (call it before applying an event
    /// of that time).
    pub fn up_to(&mut self, agg: &Aggregator, ts_ns: u64) {
        while ts_ns >= self.next_ns {
            self.cut(agg, self.next_ns);
            self.next_ns += self.every_ns;
        }
    }

    fn cut(&mut self, agg: &Aggregator, at: u64) {
        let now = agg.total(at);
        self.done.push(now.since(&self.previous));
        self.previous = now;
    }

    /// The intervals, the last one ending at `end_ns`.
    pub fn finish(mut self, agg: &Aggregator, end_ns: u64) -> Vec<Window> {
        self.up_to(agg, end_ns);
        if end_ns > self.previous.end_ns {
            self.cut(agg, end_ns);
        }
        self.done
    }
}

#[cfg(test)]
mod tests;
