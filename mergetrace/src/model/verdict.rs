//! The blk-throttle verdict: which limit held a cgroup back, judged from what waited and when
//! (not from a use averaged over the wall time), how much of it the cgroup used while it did
//! I/O, and what merging can buy under it. Pure, unit-tested.
use std::collections::BTreeMap;

use crate::{
    fmt,
    model::{
        meter::{LimitSpan, LimitUse},
        timeline::{OverTime, Track},
    },
};

/// A limit used at least this much in a window in which bios waited held them too, beside
/// the most used one (a direction's iops and bytes limits can both be at their rate).
pub const BINDING_PCT: f64 = 80.0;

/// A direction's limits in force, by name (`wiops`, `wbps`, …).
pub type Limits = BTreeMap<&'static str, LimitUse>;

/// Marks the limits that held the direction back in a window. None unless bios waited
/// (`waited`: released after waiting, queued, or still queued from before); then the most
/// used one — bios released from blk-throttle's queue leave at the rate of the limit they
/// waited for, which the others do not reach — every other as used, and any other used at
/// least [`BINDING_PCT`].
pub fn mark_held(limits: &mut Limits, waited: bool) {
    let top = limits
        .values()
        .map(|u| u.used_pct)
        .fold(f64::NEG_INFINITY, f64::max);
    for u in limits.values_mut() {
        u.held = waited && (u.used_pct == top || u.used_pct >= BINDING_PCT);
    }
}

/// A whole run judged over its intervals: a limit held the cgroup back if it did in any
/// interval (`track`), and its use is over the seconds the cgroup did I/O in the direction,
/// not over the `window_secs` of the run.
pub fn judge_over_time(limits: &mut Limits, track: &Track, window_secs: f64) {
    let active = track.active_secs();
    for (name, u) in limits.iter_mut() {
        let n = track.intervals_held(name);
        u.intervals_held = Some(n);
        u.held = n > 0;
        u.used_pct_active = (active > 0.0).then(|| u.used_pct * window_secs / active);
    }
}

/// A whole run's limits from what was in force while the cgroup did I/O in the direction
/// (`track`), even if the limit or the cgroup is gone now: per limit, the value in force
/// longest (the latest of equals), and over every value it had, its use over the seconds it
/// was in force and over the run's `window_secs` and the intervals it held the cgroup back
/// in; each value, where it changed or was removed while the cgroup did I/O. Empty where no
/// limit was in force then.
pub fn limits_over_time(track: &Track, window_secs: f64) -> Limits {
    let over_window = |pct_secs: f64| {
        if window_secs > 0.0 {
            pct_secs / window_secs
        } else {
            0.0
        }
    };
    track
        .limit_spans()
        .iter()
        .filter_map(|(name, spans)| {
            let main = spans
                .iter()
                .max_by(|a, b| a.active_secs.total_cmp(&b.active_secs))?;
            let removed = spans.last()?.to_ns < track.last_active_ns();
            let changed = spans.len() > 1 || removed;
            let in_force: f64 = spans.iter().map(|s| s.active_secs).sum();
            let pct_secs: f64 = spans.iter().map(|s| s.used_pct_secs).sum();
            let merge_aware: Option<f64> = spans.iter().map(|s| s.merge_aware_pct_secs).sum();
            let held: u64 = spans.iter().map(|s| s.intervals_held).sum();
            let u = LimitUse {
                limit: main.limit,
                cgroup: main.cgroup.clone(),
                used_pct: over_window(pct_secs),
                used_pct_merge_aware: merge_aware.map(over_window),
                held: held > 0,
                used_pct_active: Some(if in_force > 0.0 {
                    pct_secs / in_force
                } else {
                    0.0
                }),
                intervals_held: Some(held),
                changes: changed.then(|| spans.clone()),
                in_force_secs: changed.then_some(in_force),
                removed,
            };
            Some((*name, u))
        })
        .collect()
}

/// An interval's limit that was in force in the last interval (`was`) and is not now: it was
/// removed during this one, after some of its bios were charged under it (`used_pct` of it).
pub fn removed_in_window(
    name: &'static str,
    was: &LimitSpan,
    used_pct: f64,
) -> (&'static str, LimitUse) {
    let u = LimitUse {
        limit: was.limit,
        cgroup: was.cgroup.clone(),
        used_pct,
        removed: true,
        ..LimitUse::default()
    };
    (name, u)
}

/// "wiops changed: 2000 from 12:03:01, 1000 from 12:03:05, none from 12:03:09": a limit that
/// changed (or went) while the cgroup did I/O.
fn changes_sentence(name: &str, u: &LimitUse) -> Option<String> {
    let changes = u.changes.as_ref()?;
    let mut values: Vec<String> = changes
        .iter()
        .map(|c| {
            format!(
                "{} from {}",
                shown_limit(name, c.limit),
                fmt::clock(c.from_ns)
            )
        })
        .collect();
    if let (true, Some(last)) = (u.removed, changes.last()) {
        values.push(format!("none from {}", fmt::clock(last.to_ns)));
    }
    Some(format!("{name} changed: {}", values.join(", ")))
}

/// What one cgroup and direction did, as the verdict needs it.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    /// Bios submitted, flush-only writes left out (they never reach a request).
    pub bios: u64,
    /// Split remainders: each a piece of its own.
    pub splits: u64,
    pub requests: u64,
    pub charged_ios: u64,
    pub throttled_bios: u64,
    /// fentry tier: bios blk-throttle queued in the window (released later, maybe).
    pub queued: Option<u64>,
    /// The time they waited in all, where measured (fentry tier).
    pub throttle_delay_ns: Option<u64>,
    /// Why bios were split, when they were ([`crate::model::meter::split_cause`]).
    pub split_cause: Option<String>,
    /// The direction is a read (its limits are riops and rbps; the others' wiops and wbps).
    pub read: bool,
    /// The window's intervals, where known (the live view's whole run).
    pub over_time: Option<OverTime>,
    /// The limits that held the cgroup's other direction back in the window, and its name:
    /// `("writes", ["wiops 200 (set on /mt)"])`.
    pub other_held: Option<(&'static str, Vec<String>)>,
}

/// A limit's value as people read it: "2000", "2.0 MiB/s".
fn shown_limit(name: &str, limit: u64) -> String {
    if name.ends_with("iops") {
        limit.to_string()
    } else {
        fmt::rate(limit)
    }
}

/// "wiops 2000 (set on /mt)", "wbps 2.0 MiB/s (set on /mt)"; a limit that changed while the
/// cgroup did I/O, each value it had: "wiops 2000→1000→none (set on /mt)"; one removed in
/// the window: "wiops 2000 (set on /mt, removed since)".
pub fn head(name: &str, u: &LimitUse) -> String {
    let shown = match &u.changes {
        Some(changes) => {
            let mut values: Vec<String> =
                changes.iter().map(|c| shown_limit(name, c.limit)).collect();
            values.dedup();
            if u.removed {
                values.push("none".to_string());
            }
            values.join("→")
        }
        None => shown_limit(name, u.limit),
    };
    let removed = u.removed && u.changes.is_none();
    let about = match (u.cgroup.is_empty(), removed) {
        (true, false) => String::new(),
        (true, true) => " (removed since)".to_string(),
        (false, false) => format!(" (set on {})", u.cgroup),
        (false, true) => format!(" (set on {}, removed since)", u.cgroup),
    };
    format!("{name} {shown}{about}")
}

/// Seconds as the verdict says them: "3.0 s", "41 s", "20 min".
fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        fmt::span(s)
    }
}

/// The limit's use, over the seconds the cgroup did I/O where the run's intervals are known.
/// Above 100 % the window was charged for bios that had waited before it (a bio is charged as
/// it is released), which is a sign of binding, not an error. `by`: " by bios", or empty.
fn use_phrase(u: &LimitUse, a: &Activity, by: &str) -> String {
    let (pct, over, busy) = match (u.used_pct_active, u.in_force_secs, a.over_time) {
        (Some(p), Some(secs), _) => (
            p,
            format!(" over the {} it was in force", seconds(secs)),
            format!(", {} at its rate", seconds(p / 100.0 * secs)),
        ),
        (Some(p), None, Some(t)) => (
            p,
            format!(" over the {} it did I/O", seconds(t.active_secs)),
            // What it charged in seconds at its rate: how long it held the cgroup, at least.
            format!(", {} at its rate", seconds(p / 100.0 * t.active_secs)),
        ),
        _ => (u.used_pct, String::new(), String::new()),
    };
    if pct > 105.0 {
        format!(
            "it was charged {pct:.0} % of its rate{by}{over}{busy} (bios held back earlier are \
             charged as they are released)"
        )
    } else {
        format!("{pct:.0} % used{by}{over}")
    }
}

/// What waited: "584 of the 6,000 bios waited (11 s in all)".
fn waited_phrase(a: &Activity) -> String {
    let n = a.throttled_bios;
    let waited = if n == 0 {
        match a.queued.filter(|q| *q > 0) {
            Some(1) => "a bio entered its queue".to_string(),
            Some(q) => format!("{} bios entered its queue", fmt::thousands(q)),
            None => "bios queued earlier were still waiting".to_string(),
        }
    } else if a.splits == 0 && n == 1 && a.bios == 1 {
        "its one bio waited".to_string()
    } else if a.splits == 0 && n == a.bios {
        format!("all {} bios waited", fmt::thousands(n))
    } else if a.splits == 0 && n < a.bios {
        let bios = fmt::thousands(a.bios);
        format!("{} of the {bios} bios waited", fmt::thousands(n))
    } else {
        format!("{} bios and split pieces waited", fmt::thousands(n))
    };
    match a.throttle_delay_ns {
        Some(ns) if ns > 0 => format!("{waited} ({} in all)", fmt::span(ns as f64 / 1e9)),
        _ => waited,
    }
}

/// How the device's requests compare with the bios: merged, split, or one for one.
fn requests_vs_bios(a: &Activity) -> String {
    if a.requests == 0 {
        return "the device saw no requests".to_string();
    }
    let per_bio = a.requests as f64 / a.bios.max(1) as f64;
    if a.splits > 0 && per_bio >= 1.05 {
        return format!(
            "bios are split: the device saw {per_bio:.1}× more requests than bios ({})",
            a.split_cause.as_deref().unwrap_or("the queue's limits")
        );
    }
    let fewer = a.bios as f64 / a.requests as f64;
    if fewer >= 1.05 {
        format!("the device saw {fewer:.1}× fewer requests")
    } else {
        "the device saw as many requests as bios".to_string()
    }
}

/// Where merging compressed the charge: what a merge-aware limit would have used over the
/// same time (a what-if; no kernel counts this way).
fn merge_aware_what_if(u: &LimitUse) -> String {
    let shown = u.used_pct_active.unwrap_or(u.used_pct);
    let scale = if u.used_pct > 0.0 {
        shown / u.used_pct
    } else {
        1.0
    };
    match u.used_pct_merge_aware.map(|m| m * scale) {
        Some(m) if m < shown * 0.9 => format!(
            " (a limit counting the requests bios merged into, as proposed for blk-throttle in \
             2025 and in no kernel, would be {m:.0} % used)"
        ),
        _ => String::new(),
    }
}

/// The sentence of a limit that held the cgroup back: when, what waited, the use, and what
/// merging can do under it.
/// `first`: the first limit of the direction that held, which says what waited (the others
/// held the same bios back, and blk-throttle does not say which bio waited for which).
fn held_sentence(name: &str, u: &LimitUse, a: &Activity, first: bool) -> String {
    let when = match (a.over_time, u.intervals_held) {
        (Some(t), Some(n)) => format!(" in {n} of the {} intervals with I/O", t.active_intervals),
        _ => String::new(),
    };
    let lead = if first {
        format!("{} held it back{when}: {}", head(name, u), waited_phrase(a))
    } else {
        format!("{} held it back{when} too", head(name, u))
    };
    if !name.ends_with("iops") {
        return format!(
            "{lead}; {}; merging does not change bytes, so it cannot raise your throughput",
            use_phrase(u, a, "")
        );
    }
    if a.splits > 0 && a.requests > a.bios && a.charged_ios <= a.bios {
        // Kernels before 6.0 charge a bio once, before it is split (its pieces carry
        // BIO_THROTTLED): splitting costs nothing here, larger bios cost fewer ios.
        format!(
            "{lead}; {}; {}; split pieces are not charged (this kernel charges a bio once, \
             before splitting it), so the limit counts the bios you submit — submit larger bios",
            use_phrase(u, a, " by bios"),
            requests_vs_bios(a)
        )
    } else if a.splits > 0 && a.requests > a.bios {
        // Each charged io beyond the bios submitted is a split piece charged again (6.0+).
        let pieces = a.charged_ios.saturating_sub(a.bios);
        let share = pieces as f64 / a.charged_ios.max(1) as f64 * 100.0;
        format!(
            "{lead}; {}; {}; {share:.0} % of the {} ios charged were split pieces (each piece \
             costs one io, and a larger bio is only split further)",
            use_phrase(u, a, " by bios and their split pieces"),
            requests_vs_bios(a),
            a.charged_ios
        )
    } else {
        format!(
            "{lead}; {}; {}; this limit counts before merging, so merging cannot raise your \
             IOPS — submit larger bios{}",
            use_phrase(u, a, " by bios"),
            requests_vs_bios(a),
            merge_aware_what_if(u)
        )
    }
}

/// The sentence of a limit that did not hold the cgroup back.
fn free_sentence(name: &str, u: &LimitUse, a: &Activity) -> String {
    let near = u.used_pct_active.unwrap_or(u.used_pct) >= BINDING_PCT;
    format!(
        "{} is {}: {}",
        head(name, u),
        use_phrase(u, a, ""),
        if near {
            "near it, but no bio waited for it"
        } else {
            "not binding"
        }
    )
}

/// A direction no limit of its own held, while the other direction's did: a task that waits
/// for its writes (or reads) is held with them.
fn other_sentence(a: &Activity, has_limits: bool) -> Option<String> {
    let (dir, held) = a.other_held.as_ref()?;
    let lead = match (has_limits, a.read) {
        (true, _) => "",
        (false, true) => "no read limit; ",
        (false, false) => "no write limit; ",
    };
    Some(format!(
        "{lead}its {dir} were held back by {}: a task that also waits for its {dir} (one queue \
         depth for both, an fsync) is held with them",
        held.join(" and ")
    ))
}

/// The one-line verdict for a cgroup and direction; `None` when no limit is in force, nothing
/// waited, and nothing held the other direction back. `limits` are judged ([`mark_held`],
/// [`judge_over_time`]).
pub fn verdict(limits: &Limits, a: &Activity) -> Option<String> {
    let mut first = true;
    let mut parts: Vec<String> = limits
        .iter()
        .map(|(name, u)| {
            if u.held {
                let s = held_sentence(name, u, a, first);
                first = false;
                s
            } else {
                free_sentence(name, u, a)
            }
        })
        .collect();
    parts.extend(
        limits
            .iter()
            .filter_map(|(name, u)| changes_sentence(name, u)),
    );
    if limits.is_empty() && a.throttled_bios > 0 {
        parts.push(format!(
            "{} bios waited in blk-throttle, but no limit is set now",
            a.throttled_bios
        ));
    }
    if !limits.values().any(|u| u.held) {
        parts.extend(other_sentence(a, !limits.is_empty()));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        limits::{Effective, Limit},
        meter::{
            limit_use, split_cause,
            tests::{ch, eff_wiops, max_sectors_8},
            Charged,
        },
    };

    /// `limits` judged for a window in which `a`'s bios waited or not.
    fn judged(mut limits: Limits, a: &Activity) -> Option<String> {
        mark_held(&mut limits, a.throttled_bios > 0);
        verdict(&limits, a)
    }

    fn act(bios: u64, requests: u64, throttled_bios: u64) -> Activity {
        Activity {
            bios,
            requests,
            charged_ios: bios,
            throttled_bios,
            ..Activity::default()
        }
    }

    #[test]
    fn an_iops_limit_that_held_merged_batches() {
        // 30,048 bios in 15 s under wiops=2000, 943 device requests
        let lu = limit_use(&eff_wiops(2000), true, ch(30_048, 30_048 * 4096), 15.0);
        let v = judged(lu.clone(), &act(30_048, 943, 29_000)).unwrap();
        assert_eq!(
            v,
            "wiops 2000 (set on /mt) held it back: 29,000 of the 30,048 bios waited; 100 % used \
             by bios; the device saw 31.9× fewer requests; this limit counts before merging, so \
             merging cannot raise your IOPS — submit larger bios"
        );
        // merging off: as many requests as bios
        let v = judged(lu, &act(30_048, 30_048, 30_048)).unwrap();
        assert!(v.contains("all 30,048 bios waited") && v.contains("as many requests as bios"));
        // The merge-aware what-if is quoted where merging would have lowered the use.
        let merge_aware = Charged {
            requests_created: 943,
            ..ch(30_048, 30_048 * 4096)
        };
        let lu = limit_use(&eff_wiops(2000), true, merge_aware, 15.0);
        let v = judged(lu, &act(30_048, 943, 29_000)).unwrap();
        assert!(
            v.ends_with(
                "submit larger bios (a limit counting the requests bios merged into, as proposed \
                 for blk-throttle in 2025 and in no kernel, would be 3 % used)"
            ),
            "{v}"
        );
    }

    #[test]
    fn binding_is_judged_from_what_waited_not_from_the_use() {
        let lu = limit_use(&eff_wiops(2000), true, ch(100, 0), 1.0);
        assert_eq!(
            judged(lu.clone(), &act(100, 100, 0)).unwrap(),
            "wiops 2000 (set on /mt) is 5 % used: not binding"
        );
        // Bios waited, so the limit bound for part of the window, at 5 % of its rate.
        assert!(judged(lu, &act(100, 100, 7)).unwrap().starts_with(
            "wiops 2000 (set on /mt) held it back: 7 of the 100 bios waited; 5 % used by bios;"
        ));
        // Used at 95 % without a bio waiting: near the limit, not held.
        let lu = limit_use(&eff_wiops(2000), true, ch(1900, 0), 1.0);
        assert_eq!(
            judged(lu, &act(1900, 1900, 0)).unwrap(),
            "wiops 2000 (set on /mt) is 95 % used: near it, but no bio waited for it"
        );
        // A window charged for bios that waited before it, with the wait measured (fentry).
        let over = limit_use(&eff_wiops(2000), true, ch(8000, 0), 1.0);
        let a = Activity {
            throttle_delay_ns: Some(11_300_000_000),
            ..act(8000, 250, 8000)
        };
        assert!(judged(over, &a).unwrap().starts_with(
            "wiops 2000 (set on /mt) held it back: all 8,000 bios waited (11 s in all); it was \
             charged 400 % of its rate by bios (bios held back earlier are charged as they are \
             released);"
        ));
        assert_eq!(judged(Limits::new(), &act(1, 1, 0)), None);
        assert_eq!(
            judged(Limits::new(), &act(1, 1, 5)).unwrap(),
            "5 bios waited in blk-throttle, but no limit is set now"
        );
    }

    /// Both write limits: the one the released bios used fully is the one that held them;
    /// the other is named not binding, and neither is judged by its average.
    #[test]
    fn the_limit_that_held_is_the_one_at_its_rate() {
        let e = Effective {
            wbps: Some(Limit {
                limit: 2 << 20,
                cgroup: "/mt".into(),
            }),
            ..eff_wiops(200)
        };
        // 1 MiB bios: 2 a second fill wbps and use 1 % of wiops.
        let lu = limit_use(&e, true, ch(2, 2 << 20), 1.0);
        let v = judged(lu, &act(2, 2, 2)).unwrap();
        assert!(
            v.starts_with(
                "wbps 2.0 MiB/s (set on /mt) held it back: all 2 bios waited; 100 % used;"
            ) && v.ends_with("wiops 200 (set on /mt) is 1 % used: not binding"),
            "{v}"
        );
        // 4 KiB bios: 200 a second fill wiops and use 39 % of wbps.
        let lu = limit_use(&e, true, ch(200, 200 * 4096), 1.0);
        let v = judged(lu, &act(200, 200, 190)).unwrap();
        assert!(
            v.starts_with("wbps 2.0 MiB/s (set on /mt) is 39 % used: not binding; wiops 200 (set on /mt) held it back: 190 of the 200 bios waited"),
            "{v}"
        );
    }

    #[test]
    fn a_direction_held_back_by_the_other_directions_limit() {
        let writes = Some(("writes", vec!["wiops 200 (set on /mt)".to_string()]));
        // No read limit at all: the write limit is named.
        let reads = Activity {
            read: true,
            other_held: writes.clone(),
            ..act(300, 300, 0)
        };
        assert_eq!(
            judged(Limits::new(), &reads).unwrap(),
            "no read limit; its writes were held back by wiops 200 (set on /mt): a task that \
             also waits for its writes (one queue depth for both, an fsync) is held with them"
        );
        // A read limit that does not bind: said, and the write limit named after it.
        let e = Effective {
            riops: Some(Limit {
                limit: 10_000,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        };
        let lu = limit_use(&e, false, ch(300, 0), 1.0);
        assert_eq!(
            judged(lu.clone(), &reads).unwrap(),
            "riops 10000 (set on /mt) is 3 % used: not binding; its writes were held back by \
             wiops 200 (set on /mt): a task that also waits for its writes (one queue depth for \
             both, an fsync) is held with them"
        );
        // A read limit that held the reads themselves: the writes are not the story.
        let v = judged(
            lu,
            &Activity {
                throttled_bios: 3,
                ..reads
            },
        )
        .unwrap();
        assert!(!v.contains("its writes"), "{v}");
    }

    #[test]
    fn split_bios_under_an_iops_limit() {
        // max_sectors_kb 8, 64 KiB direct writes, wiops 1000: 512 bios, 3,584 split pieces,
        // 4,096 requests of 8 KiB, 4,096 ios charged.
        let lu = limit_use(&eff_wiops(1000), true, ch(4096, 512 * 65536), 4.096);
        let limits = max_sectors_8();
        let a = Activity {
            bios: 512,
            splits: 3584,
            requests: 4096,
            charged_ios: 4096,
            throttled_bios: 3000,
            split_cause: Some(split_cause(&limits, false, 8192.0)),
            ..Activity::default()
        };
        assert_eq!(
            judged(lu, &a).unwrap(),
            "wiops 1000 (set on /mt) held it back: 3,000 bios and split pieces waited; 100 % \
             used by bios and their split pieces; bios are split: the device saw 8.0× more \
             requests than bios (max_sectors_kb (8 KiB) caps each request; raise max_sectors_kb \
             (the device allows up to 1280 KiB), or submit bios of at most 8 KiB); 88 % of the \
             4096 ios charged were split pieces (each piece costs one io, and a larger bio is \
             only split further)"
        );
        // 5.10 charges the 512 bios once each, before splitting: the pieces cost nothing.
        let lu510 = limit_use(&eff_wiops(1000), true, ch(512, 512 * 65536), 4.096);
        let v = judged(
            lu510,
            &Activity {
                charged_ios: 512,
                ..a.clone()
            },
        )
        .unwrap();
        assert!(
            v.contains("bios are split: the device saw 8.0× more requests than bios")
                && v.contains("% used by bios;")
                && v.contains("split pieces are not charged")
                && v.ends_with("submit larger bios")
                && !v.contains("were split pieces"),
            "{v}"
        );
    }
}
