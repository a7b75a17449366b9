//! A person's run keeps the rows of removed cgroups: the kernel side folds a removed cgroup's
//! counters into its disk's `(removed)` key once `--reclaim-after` has passed (what bounds the
//! maps under churn), and the whole run then shows them under their own cgroup again, marked
//! gone, with what they had counted when they were folded. Only what was counted after that
//! (a late completion) stays in `(removed)`.
use std::collections::{HashMap, HashSet, VecDeque};

use mergetrace_common::{latency::LatencyHist, REMOVED_CGROUP};

use crate::model::aggregate::{Counts, Key, Window};

/// Rows kept at most; past them the oldest stay folded in `(removed)` (a run of hours under
/// fast churn would otherwise grow without bound).
pub const MAX_KEPT: usize = 4096;

/// The rows of removed cgroups, as their counters stood when the kernel side folded them.
#[derive(Debug, Default)]
pub struct Kept {
    rows: HashMap<Key, (Counts, Option<LatencyHist>)>,
    /// Oldest first.
    order: VecDeque<Key>,
}

impl Kept {
    /// Keeps the keys of `earlier` that `now`, the next read of the same run, no longer has:
    /// the kernel side folded them into their disk's removed key in between.
    pub fn note_folded(&mut self, earlier: &Window, now: &Window) {
        for (k, c) in &earlier.counts {
            if k.cgroup_id == REMOVED_CGROUP || now.counts.contains_key(k) {
                continue;
            }
            if self.rows.contains_key(k) {
                continue;
            }
            let latency = earlier.latency.get(k).copied();
            self.rows.insert(*k, (*c, latency));
            self.order.push_back(*k);
        }
        while self.order.len() > MAX_KEPT {
            if let Some(k) = self.order.pop_front() {
                self.rows.remove(&k);
            }
        }
    }

    /// The cgroups with a kept row.
    pub fn cgroups(&self) -> HashSet<u64> {
        self.rows.keys().map(|k| k.cgroup_id).collect()
    }

    /// `w` (a running total of the run) with each kept row under its own key again, and out
    /// of its disk's removed key.
    pub fn restored(&self, w: &Window) -> Window {
        let mut out = w.clone();
        for (k, (c, latency)) in &self.rows {
            let removed = Key {
                cgroup_id: REMOVED_CGROUP,
                ..*k
            };
            if let Some(r) = out.counts.get_mut(&removed) {
                r.combine(c, false);
                if *r == Counts::default() {
                    out.counts.remove(&removed);
                }
            }
            out.counts.entry(*k).or_default().add(c);
            if let Some(h) = latency {
                if let Some(r) = out.latency.get_mut(&removed) {
                    *r = r.since(h);
                }
                out.latency.entry(*k).or_default().add(h);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::aggregate::Dir;

    fn key(cgroup_id: u64) -> Key {
        Key {
            dev: 7 << 20,
            cgroup_id,
            dir: Dir::Write,
        }
    }

    fn bios(n: u64) -> Counts {
        Counts {
            rq_bios: n,
            charged_ios: n,
            ..Counts::default()
        }
    }

    #[test]
    fn a_folded_row_comes_back_under_its_own_key() {
        let mut earlier = Window::default();
        earlier.counts.insert(key(5), bios(100));
        earlier.counts.insert(key(6), bios(7));
        // The next read: cgroup 5 folded into (removed), with 2 more counted after.
        let mut now = Window::default();
        now.counts.insert(key(REMOVED_CGROUP), bios(102));
        now.counts.insert(key(6), bios(9));
        let mut kept = Kept::default();
        kept.note_folded(&earlier, &now);
        assert_eq!(kept.cgroups(), HashSet::from([5]));
        let w = kept.restored(&now);
        assert_eq!(w.counts[&key(5)], bios(100));
        assert_eq!(w.counts[&key(REMOVED_CGROUP)], bios(2));
        assert_eq!(w.counts[&key(6)], bios(9));
        // Nothing counted after the fold: no (removed) row is left.
        now.counts.insert(key(REMOVED_CGROUP), bios(100));
        assert!(!kept
            .restored(&now)
            .counts
            .contains_key(&key(REMOVED_CGROUP)));
    }

    #[test]
    fn rows_past_the_bound_stay_folded() {
        let mut kept = Kept::default();
        for id in 0..MAX_KEPT as u64 + 3 {
            let mut earlier = Window::default();
            earlier.counts.insert(key(1000 + id), bios(1));
            kept.note_folded(&earlier, &Window::default());
        }
        let ids = kept.cgroups();
        assert_eq!(ids.len(), MAX_KEPT);
        assert!(!ids.contains(&1000) && ids.contains(&(1000 + MAX_KEPT as u64 + 2)));
    }
}
