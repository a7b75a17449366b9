//! The report's per-second charts, one row per cgroup and direction: bios, the ios
//! blk-throttle charged, merges and requests each in a panel of its own on one scale (bios and
//! charged ios are equal under an iops limit: drawn on one another, one would hide the other),
//! with the iops limit in force — from the capture's recorded limits — as a line.
use std::fmt::Write as _;

use anyhow::Result;

use super::charts::{small_multiples, LimitLine, Panel, BIOS, CHARGED, MERGED, REQUESTS};
use crate::{
    fmt,
    model::{aggregate::Dir, snapshot::DeviceSnapshot},
    offline::analysis::{Distributions, Series},
};

/// Series charts drawn at most (the rest are listed as omitted).
const MAX_SERIES_CHARTS: usize = 24;

/// The limits in force for a series' cgroup and direction: the iops one, drawn (it counts
/// what the panels count), and the bytes one, named (bytes are not on that scale).
fn limits_of(dev: &DeviceSnapshot, x: &Series) -> (Option<LimitLine>, Option<String>) {
    let Some(st) = dev
        .cgroups
        .iter()
        .find(|c| c.cgroup_id == x.cgroup_id)
        .and_then(|c| {
            Dir::ALL
                .iter()
                .find(|d| d.name() == x.dir)
                .map(|d| c.dirs.get(*d))
        })
    else {
        return (None, None);
    };
    let set_on = |cgroup: &str| {
        if cgroup.is_empty() || cgroup == x.cgroup {
            String::new()
        } else {
            format!(", set on {cgroup}")
        }
    };
    let mut iops = None;
    let mut bps = None;
    for (name, u) in &st.limits {
        if name.ends_with("iops") {
            iops = Some(LimitLine {
                label: format!(
                    "{name} limit {}{}",
                    fmt::thousands(u.limit),
                    set_on(&u.cgroup)
                ),
                value: u.limit,
            });
        } else {
            bps = Some(format!(
                "{name} {}{}",
                fmt::rate(u.limit),
                set_on(&u.cgroup)
            ));
        }
    }
    (iops, bps)
}

/// One row of panels for a series.
fn series_svg(dev: &DeviceSnapshot, x: &Series, buckets: usize) -> Result<String> {
    let (iops, bps) = limits_of(dev, x);
    let mut panels = vec![Panel {
        name: "bios submitted",
        values: &x.bios,
        color: BIOS,
        limited: true,
    }];
    if iops.is_some() || x.charged.iter().any(|n| *n > 0) {
        panels.push(Panel {
            name: "ios charged by blk-throttle",
            values: &x.charged,
            color: CHARGED,
            limited: true,
        });
    }
    panels.push(Panel {
        name: "merged",
        values: &x.merged,
        color: MERGED,
        limited: false,
    });
    panels.push(Panel {
        name: "requests the device saw",
        values: &x.requests,
        color: REQUESTS,
        limited: false,
    });
    let mut title = format!("{} {} {}", x.device, x.cgroup, x.dir);
    if let Some(b) = bps {
        // a bytes limit is not on the scale of these counts: named, not drawn
        let _ = write!(title, " ({b} in force)");
    }
    small_multiples(&title, "per second", buckets, &panels, iops.as_ref())
}

/// Bios, charged ios, merges and requests per second, per cgroup and direction (at most
/// [`MAX_SERIES_CHARTS`]).
pub(super) fn charts(o: &mut String, dev: &DeviceSnapshot, d: &Distributions) -> Result<()> {
    let series: Vec<&Series> = d
        .timeseries
        .series
        .iter()
        .filter(|x| x.device == dev.device)
        .collect();
    if series.is_empty() {
        return Ok(());
    }
    o.push_str(
        "<h3>Over time, per cgroup</h3>\n<p class=\"note\">Each panel one count per second, \
         on one scale per row; the dashed red line is the blk-throttle iops limit in force, \
         which counts bios before they merge.</p>\n<div class=\"charts\">\n",
    );
    for x in series.iter().take(MAX_SERIES_CHARTS) {
        o.push_str(&series_svg(dev, x, d.timeseries.buckets)?);
        o.push('\n');
    }
    o.push_str("</div>\n");
    if series.len() > MAX_SERIES_CHARTS {
        let _ = writeln!(
            o,
            "<p class=\"note\">{} more series not drawn (see <code>report --json</code>).</p>",
            series.len() - MAX_SERIES_CHARTS
        );
    }
    Ok(())
}
