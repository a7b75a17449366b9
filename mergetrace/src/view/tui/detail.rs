//! The detail pane of the terminal UI: the selected row's numbers (all of them, also those
//! of columns too wide for the terminal), which meter binds it, and its verdict — the same
//! verdict text the JSON and text views print.
use crate::{
    fmt,
    model::latency::{Class, Latency, Stage},
    model::snapshot::{DirStats, Snapshot},
    view::table::RowAt,
};

/// The pane's title (what the row is) and its lines.
pub fn detail(s: &Snapshot, at: RowAt) -> (String, Vec<String>) {
    let Some(d) = s.devices.get(at.device) else {
        return (String::new(), Vec::new());
    };
    let cgroup = at.cgroup.and_then(|c| d.cgroups.get(c));
    let dir = at.dir.map_or("-", |d| d.name());
    let title = match cgroup {
        Some(c) => match &c.name {
            Some(n) => format!("{} {} ({}) {dir}", d.device, c.cgroup, n.short),
            None => format!("{} {} {dir}", d.device, c.cgroup),
        },
        None => format!("{} (total) {dir}", d.device),
    };
    let Some(st) = at.stats(s) else {
        return (title, vec!["no I/O in this span".into()]);
    };
    let mut lines = vec![counts(st)];
    if let Some(l) = &st.latency {
        lines.push(latency(l));
    }
    if cgroup.is_none() {
        lines.push("the disk's total: limits and verdicts are per cgroup".into());
        return (title, lines);
    }
    lines.push(binds(st));
    lines.push(match &st.verdict {
        Some(v) => format!("verdict: {v}"),
        None => "verdict: none (no meter in force held or charged it)".into(),
    });
    (title, lines)
}

/// `--latency`: p50 / p99 of each stage, for requests of one bio and those with merged bios.
fn latency(l: &Latency) -> String {
    let part = |stage: Stage, class: Class| -> String {
        let n = l.count(stage, class);
        match (
            l.quantile_us(stage, class, 0.5),
            l.quantile_us(stage, class, 0.99),
        ) {
            (Some(p50), Some(p99)) => format!(
                "{} {} / {}",
                fmt::thousands(n),
                fmt::latency_bound(p50),
                fmt::latency_bound(p99)
            ),
            _ => "none".into(),
        }
    };
    format!(
        "latency p50 / p99 — queue: single {}, merged {} · device: single {}, merged {}",
        part(Stage::Queue, Class::Single),
        part(Stage::Queue, Class::Merged),
        part(Stage::Device, Class::Single),
        part(Stage::Device, Class::Merged),
    )
}

/// Every count of the row, in words.
fn counts(st: &DirStats) -> String {
    let t = fmt::thousands;
    let mut out = format!(
        "bios {} ({}) · charged {} · waited {} · merged {} · requests {} ({})",
        t(st.bios),
        fmt::size(st.bytes),
        t(st.charged_ios),
        t(st.throttled.bios),
        t(st.merged),
        t(st.requests),
        fmt::size(st.request_bytes),
    );
    if let (Some(per), Some(avg)) = (st.bios_per_request(), st.avg_request_bytes()) {
        out.push_str(&format!(
            " · {per:.1} bios/request, {} each",
            fmt::avg_size(avg)
        ));
    }
    if st.splits > 0 {
        out.push_str(&format!(" · split {}", t(st.splits)));
    }
    out
}

/// Which meter holds the row back, and the others in force: blk-throttle's limits (where
/// one binds, it counts bios before merging), io.cost and wbt (they count requests).
fn binds(st: &DirStats) -> String {
    let binding: Vec<&str> = st
        .limits
        .iter()
        .filter(|(_, u)| u.held)
        .map(|(n, _)| *n)
        .collect();
    let mut out = if let Some(first) = binding.first() {
        let how = if first.ends_with("iops") {
            "one io per bio and split piece, before merging: merging does not help"
        } else {
            "bytes, before merging: merging does not change them"
        };
        format!(
            "binds: blk-throttle {} — it charges {how}",
            binding.join(", ")
        )
    } else if st.limits.is_empty() {
        "binds: no blk-throttle limit is in force".to_string()
    } else {
        let names: Vec<&str> = st.limits.keys().copied().collect();
        format!(
            "binds: nothing — no bio waited for its blk-throttle {}",
            names.join(", ")
        )
    };
    let mut others = Vec::new();
    if st.meters.iocost.is_some() {
        others.push("io.cost (charges a base cost per new request, pages per merged bio)");
    }
    // O_DIRECT writes pass wbt: only requests that took a slot were metered by it.
    if st.meters.wbt.is_some_and(|w| w.requests > 0) {
        others.push("wbt (a slot per new buffered-write request)");
    }
    if !others.is_empty() {
        out.push_str(&format!("; also metered by {}", others.join(" and ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::aggregate::Dir;
    use crate::model::meter::LimitUse;
    use crate::view::prometheus::tests::{snapshot, write_stats};

    fn at(cgroup: Option<usize>) -> RowAt {
        RowAt {
            device: 0,
            cgroup,
            dir: Some(Dir::Write),
        }
    }

    #[test]
    fn detail_names_the_binding_meter_and_shows_the_verdict() {
        let mut held = write_stats(2048, 64);
        held.charged_ios = 2048;
        held.throttled.bios = 1900;
        held.limits.insert(
            "wiops",
            LimitUse {
                limit: 1000,
                cgroup: "/mt-a".into(),
                used_pct: 97.0,
                used_pct_merge_aware: Some(3.0),
                held: true,
                ..LimitUse::default()
            },
        );
        held.verdict = Some("wiops 1000 (set on /mt-a) is 97 % used by bios".into());
        let s = snapshot(&[("/mt-a", held), ("/mt-b", write_stats(512, 512))]);
        let (title, lines) = detail(&s, at(Some(0)));
        assert_eq!(title, "loop3 /mt-a write");
        assert!(
            lines[0].starts_with(
                "bios 2,048 (8.0 MiB) · charged 2,048 · waited 1,900 · merged 1,984 · requests 64"
            ),
            "{lines:?}"
        );
        assert!(
            lines[0].contains("32.0 bios/request, 128.0 KiB each"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("binds: blk-throttle wiops — "),
            "{lines:?}"
        );
        assert_eq!(
            lines[2],
            "verdict: wiops 1000 (set on /mt-a) is 97 % used by bios"
        );
        let (title, lines) = detail(&s, at(Some(1)));
        assert_eq!(title, "loop3 /mt-b write");
        assert_eq!(lines[1], "binds: no blk-throttle limit is in force");
        assert!(lines[2].starts_with("verdict: none"), "{lines:?}");
        let (title, lines) = detail(&s, at(None));
        assert_eq!(title, "loop3 (total) write");
        assert!(lines[1].contains("per cgroup"), "{lines:?}");
    }

    #[test]
    fn a_limit_no_bio_waited_for_binds_nothing() {
        let mut st = write_stats(8, 8);
        st.limits.insert(
            "wiops",
            LimitUse {
                limit: 100_000,
                cgroup: String::new(),
                used_pct: 0.1,
                used_pct_merge_aware: None,
                held: false,
                ..LimitUse::default()
            },
        );
        assert_eq!(
            binds(&st),
            "binds: nothing — no bio waited for its blk-throttle wiops"
        );
    }
}
