//! Each cgroup row's judgement: the blk-throttle limits in force with their use, which of them
//! held the cgroup back — in the window, or over the run's intervals for a whole run — and
//! the verdict of every meter (blk-throttle, io.cost, wbt, io.latency), a direction held back by the other
//! direction's limit included.
use crate::{
    model::{
        aggregate::Dir,
        dir_stats::{DirStats, Directions},
        limits::Effective,
        meter::{self, SplitLimits},
        timeline::Timeline,
        verdict::{self, Activity},
    },
    sys::{iolatency::IoLatency, wbt::Wbt},
};

/// What judging a row needs besides its counts.
pub struct Row<'a> {
    pub eff: &'a Effective,
    /// The window's length.
    pub secs: f64,
    pub wbt: Option<&'a Wbt>,
    /// io.latency's targets on the disk, where it has any.
    pub iolatency: Option<&'a IoLatency>,
    /// The row's device (`dev_t`) and cgroup id.
    pub dev: u32,
    pub cgroup_id: u64,
    /// The run's intervals: for a whole run (`whole`), what held the cgroup back and when; for
    /// an interval, whether bios queued before it are still waiting (fentry).
    pub timeline: Option<&'a Timeline>,
    pub whole: bool,
}

/// Each direction with I/O: the limits in force with this window's use and whether they held
/// the cgroup back, and the verdict (`split_limits` is asked only where bios were split).
pub fn judge(dirs: &mut Directions, row: &Row, split_limits: &mut dyn FnMut() -> SplitLimits) {
    for dir in Dir::ALL {
        limits_of(dirs.get_mut(dir), dir, row);
    }
    for dir in Dir::ALL {
        let other_held = other_held(dirs, dir);
        let st = dirs.get_mut(dir);
        if st.is_empty() {
            continue;
        }
        let split_cause = (st.splits > 0).then(|| {
            meter::split_cause(
                &split_limits(),
                dir == Dir::Discard,
                st.avg_request_bytes().unwrap_or(0.0),
            )
        });
        let throttle = verdict::verdict(
            &st.limits,
            &Activity {
                bios: st.bios - st.flush_only.min(st.bios),
                splits: st.splits,
                requests: st.requests,
                charged_ios: st.charged_ios,
                throttled_bios: st.throttled.bios,
                queued: st.throttled.queued,
                throttle_delay_ns: st.throttled.delay_ns_total,
                split_cause,
                read: dir == Dir::Read,
                over_time: st.over_time,
                other_held,
            },
        );
        let iocost = st.meters.iocost.as_ref().and_then(|c| c.verdict("it"));
        let merged_bios = st.merged.saturating_sub(st.merged_by_path.request);
        let wbt = st
            .meters
            .wbt
            .zip(row.wbt)
            .and_then(|(n, w)| n.verdict(&w.target(), merged_bios));
        let iolatency = st
            .meters
            .iolatency
            .zip(row.iolatency)
            .and_then(|(n, t)| n.verdict(t, merged_bios));
        let parts: Vec<String> = [throttle, iocost, wbt, iolatency]
            .into_iter()
            .flatten()
            .collect();
        st.verdict = (!parts.is_empty()).then(|| parts.join("; "));
    }
}

/// A direction's limits in force, their use in the window, and which held the cgroup back:
/// over the run's intervals for a whole run, else from what waited in the window.
fn limits_of(st: &mut DirStats, dir: Dir, row: &Row) {
    if st.is_empty() {
        return;
    }
    let write = dir != Dir::Read && dir != Dir::Flush;
    let charged = meter::Charged {
        ios: st.charged_ios,
        bytes: st.charged_bytes,
        requests_created: st.meters.per_request_created,
    };
    st.limits = meter::limit_use(row.eff, write, charged, row.secs);
    let timeline = row.timeline;
    let track = timeline.and_then(|t| t.track(row.dev, row.cgroup_id, dir));
    match (timeline, track) {
        // The limits that were in force while the cgroup did I/O, not those left now.
        (Some(timeline), Some(track)) if row.whole && !track.limit_spans().is_empty() => {
            st.limits = verdict::limits_over_time(track, row.secs);
            st.over_time = Some(timeline.over_time(track));
        }
        (Some(timeline), Some(track)) if row.whole => {
            verdict::judge_over_time(&mut st.limits, track, row.secs);
            st.over_time = Some(timeline.over_time(track));
        }
        _ => {
            // A limit in force in the last interval with I/O and not now was removed in this
            // window, after some of its bios were charged under it: it is still named.
            if let Some(t) = track {
                for k in meter::kinds_for(write) {
                    if st.limits.contains_key(k.name()) || st.charged_ios == 0 {
                        continue;
                    }
                    if let Some(was) = t.in_force(k.name()) {
                        let used = if k.is_iops() {
                            meter::pct(st.charged_ios, was.limit, row.secs)
                        } else {
                            meter::pct(st.charged_bytes, was.limit, row.secs)
                        };
                        let (name, u) = verdict::removed_in_window(k.name(), was, used);
                        st.limits.insert(name, u);
                    }
                }
            }
            let waited = st.waited() || track.is_some_and(|t| t.waiting());
            verdict::mark_held(&mut st.limits, waited);
        }
    }
}

/// What held the cgroup's other direction back: for reads, the write limits that held its
/// writes or discards; for writes and discards, the read limits that held its reads.
fn other_held(dirs: &Directions, dir: Dir) -> Option<(&'static str, Vec<String>)> {
    let (name, others): (_, &[Dir]) = match dir {
        Dir::Read => ("writes", &[Dir::Write, Dir::Discard]),
        Dir::Write | Dir::Discard => ("reads", &[Dir::Read]),
        Dir::Flush => return None,
    };
    let mut held: Vec<String> = Vec::new();
    for d in others {
        for (n, u) in &dirs.get(*d).limits {
            let h = verdict::head(n, u);
            if u.held && !held.contains(&h) {
                held.push(h);
            }
        }
    }
    (!held.is_empty()).then_some((name, held))
}
