//! `report run.mtr --html report.html`: one self-contained page (inline CSS and SVG, no
//! scripts, no external resources) with the per-cgroup table, the verdicts, per-second
//! bios, charged ios, merges and requests per cgroup with the blk-throttle limit in force,
//! the request size and bios-per-request histograms, plug flush
//! depths and request latencies. Charts are drawn by `plotters`' SVG backend.
mod charts;
mod series;

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::Result;
use plotters::style::RGBColor;

use crate::model::latency::{bucket_bound_us, Class, Latency, Stage};
use crate::offline::analysis::{unplug_rows, Distributions, REQUEST_HISTOGRAMS};
use crate::{
    capture::Header,
    model::aggregate::Dir,
    model::snapshot::{DeviceSnapshot, Histograms, Snapshot},
    view::table,
};
use charts::{bar_chart, CGROUP_COLORS, EXPLICIT, SCHEDULE};
use mergetrace_common::latency::LAT_BUCKETS;

pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = r#"
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1180px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin-top: 20px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e4e4e4; }
th { background: #f3f3f3; text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; background: #fafafa; }
.meta { color: #555; font-size: 13px; }
.verdict { background: #fff7e0; border-left: 4px solid #e0a800; padding: 6px 10px; margin: 6px 0; font-size: 14px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.charts svg { max-width: 100%; height: auto; border: 1px solid #eee; }
.note { color: #666; font-size: 12px; }
"#;

fn table_html(s: &Snapshot) -> String {
    let rows = table::rows(s);
    let shown = table::shown_columns(&rows);
    let mut o = String::from("<table><tr>");
    for &i in &shown {
        let h = table::HEADER[i];
        let class = if table::right_aligned(i) {
            " class=\"n\""
        } else {
            ""
        };
        let _ = write!(o, "<th{class}>{}</th>", esc(h));
    }
    o.push_str("</tr>\n");
    for r in rows {
        o.push_str(if r.is_total {
            "<tr class=\"total\">"
        } else {
            "<tr>"
        });
        for (i, c) in r
            .cells
            .iter()
            .enumerate()
            .filter(|(i, _)| shown.contains(i))
        {
            let class = if table::right_aligned(i) {
                " class=\"n\""
            } else {
                ""
            };
            let _ = write!(o, "<td{class}>{}</td>", esc(c));
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</table>\n");
    o
}

fn latency_html(d: &Distributions, device: &str) -> String {
    let rows: Vec<_> = d.latency.iter().filter(|r| r.device == device).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "<h3>Request latency (µs)</h3><table><tr><th>direction</th><th>stage</th>\
         <th class=\"n\">count</th><th class=\"n\">min</th><th class=\"n\">p50</th>\
         <th class=\"n\">p90</th><th class=\"n\">p99</th><th class=\"n\">max</th></tr>\n",
    );
    for r in rows {
        for (stage, st) in [
            ("insert → issue", &r.insert_to_issue),
            ("issue → complete", &r.issue_to_complete),
        ] {
            let _ = write!(o, "<tr><td>{}</td><td>{stage}</td>", r.dir);
            match st {
                Some(s) => {
                    let _ = write!(o, "<td class=\"n\">{}</td>", s.count);
                    for v in [s.min_us, s.p50_us, s.p90_us, s.p99_us, s.max_us] {
                        let _ = write!(o, "<td class=\"n\">{v:.1}</td>");
                    }
                }
                None => o.push_str("<td class=\"n\">0</td><td colspan=\"5\"></td>"),
            }
            o.push_str("</tr>\n");
        }
        if r.direct_issues > 0 {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td colspan=\"7\">{} requests issued directly (no insert event, \
                 so no insert → issue time)</td></tr>",
                r.dir, r.direct_issues
            );
        }
    }
    o.push_str("</table>\n");
    o
}

/// A histogram of the device's requests stacked by cgroup (the busiest first; past the
/// palette, the rest as one "other cgroups" stack).
fn by_cgroup(
    dev: &DeviceSnapshot,
    dir: Dir,
    buckets: &[(u64, u64)],
    pick: impl Fn(&Histograms) -> &BTreeMap<u64, u64>,
) -> Vec<(String, Vec<u64>, RGBColor)> {
    let mut rows: Vec<(String, Vec<u64>)> = dev
        .cgroups
        .iter()
        .map(|c| {
            let h = pick(&c.dirs.get(dir).histograms);
            (
                // the legend says what a container's path is
                match &c.name {
                    Some(n) => format!("{} ({})", c.cgroup, n.short),
                    None => c.cgroup.clone(),
                },
                buckets
                    .iter()
                    .map(|(b, _)| h.get(b).copied().unwrap_or(0))
                    .collect::<Vec<u64>>(),
            )
        })
        .filter(|(_, v)| v.iter().any(|n| *n > 0))
        .collect();
    rows.sort_by_key(|(name, v)| (std::cmp::Reverse(v.iter().sum::<u64>()), name.clone()));
    let keep = CGROUP_COLORS.len() - 1;
    let mut out: Vec<(String, Vec<u64>, RGBColor)> = Vec::new();
    for (i, (name, v)) in rows.iter().enumerate() {
        if i < keep || rows.len() == CGROUP_COLORS.len() {
            out.push((format!("cgroup {name}"), v.clone(), CGROUP_COLORS[i]));
        } else if i == keep {
            out.push(("other cgroups".into(), v.clone(), CGROUP_COLORS[keep]));
        } else {
            for (a, b) in out[keep].1.iter_mut().zip(v) {
                *a += b;
            }
        }
    }
    out
}

/// Plug flush depths to draw: every depth from 1 to the deepest when that is few enough
/// to read, else the depths seen.
fn unplug_depths(rows: &[(u32, u64, u64)]) -> Vec<(u32, u64, u64)> {
    let max = rows.iter().map(|r| r.0).max().unwrap_or(0);
    if max > 48 {
        return rows.to_vec();
    }
    (1..=max.max(2))
        .map(|d| rows.iter().find(|r| r.0 == d).copied().unwrap_or((d, 0, 0)))
        .collect()
}

/// The page.
pub fn render(h: &Header, file: &Path, s: &Snapshot, d: &Distributions) -> Result<String> {
    let mut o = String::new();
    head(&mut o, h, file, s);
    for dev in &s.devices {
        device_section(&mut o, dev, d)?;
    }
    let _ = writeln!(
        o,
        "<p class=\"note\">Generated by mergetrace {} from {}. Per-second series count events \
         by their timestamp; histograms count issued requests.</p>\n</body></html>",
        env!("CARGO_PKG_VERSION"),
        esc(&file.display().to_string())
    );
    Ok(o)
}

/// The title, what was traced, the per-cgroup table and the verdicts.
fn head(o: &mut String, h: &Header, file: &Path, s: &Snapshot) {
    let title = format!("mergetrace report: {}", file.display());
    let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    let _ = writeln!(
        o,
        "<p class=\"meta\">kernel {}, {} tier, mergetrace {}; {secs:.1} s; lost events: {}; \
         cgroup hierarchy {} at {}</p>",
        esc(&h.kernel_release),
        esc(&s.tier),
        esc(&h.mergetrace_version),
        s.lost_events,
        esc(&h.cgroup_hierarchy),
        esc(&h.cgroup_mount)
    );
    if s.lost_events > 0 {
        let _ = writeln!(
            o,
            "<p class=\"verdict\">{} events were lost (ring buffer full): the counts are too low.</p>",
            s.lost_events
        );
    }
    o.push_str("<h2>Per cgroup</h2>\n");
    o.push_str(&table_html(s));
    o.push_str(
        "<p class=\"note\">BIOS: bios submitted (what blk-throttle charges, before merging); \
         CHARGED: ios charged where a limit applies; MERGED: bios and requests merged (as \
         /proc/diskstats counts); REQS: requests the device saw.</p>\n",
    );
    let remarks = table::remarks(s);
    if !remarks.is_empty() {
        o.push_str("<h2>Verdicts</h2>\n");
        for r in remarks {
            let _ = writeln!(o, "<div class=\"verdict\">{}</div>", esc(&r));
        }
    }
}

/// One device: its series, the requests it saw, its plug flushes and latencies.
fn device_section(o: &mut String, dev: &DeviceSnapshot, d: &Distributions) -> Result<()> {
    let _ = writeln!(
        o,
        "<h2>{} ({}:{})</h2>",
        esc(&dev.device),
        dev.major,
        dev.minor
    );
    series::charts(o, dev, d)?;
    request_charts(o, dev)?;
    plug_chart(o, dev)?;
    latency_charts(o, dev)?;
    o.push_str(&latency_html(d, &dev.device));
    Ok(())
}

/// `report --latency`: per cgroup and direction, the requests' queue and device latency
/// histograms, requests of one bio and requests with merged bios stacked.
fn latency_charts(o: &mut String, dev: &DeviceSnapshot) -> Result<()> {
    let mut charts = String::new();
    for c in &dev.cgroups {
        for dir in Dir::ALL {
            let Some(l) = c.dirs.get(dir).latency.filter(|l| *l != Latency::default()) else {
                continue;
            };
            for (stage, what) in [
                (Stage::Queue, "queue (created → issued)"),
                (Stage::Device, "device (issued → completed)"),
            ] {
                let (single, merged) = (
                    l.buckets(stage, Class::Single),
                    l.buckets(stage, Class::Merged),
                );
                let used = |b: &usize| single[*b] + merged[*b] > 0;
                let (Some(lo), Some(hi)) =
                    ((0..LAT_BUCKETS).find(used), (0..LAT_BUCKETS).rfind(used))
                else {
                    continue;
                };
                let labels: Vec<String> = (lo..=hi)
                    .map(|b| crate::fmt::latency_bound(bucket_bound_us(b)))
                    .collect();
                charts.push_str(&bar_chart(
                    &format!("{} {} {}: {what}", dev.device, c.cgroup, dir.name()),
                    "latency (bucket's upper bound)",
                    "requests",
                    &labels,
                    &[
                        ("requests of one bio", single[lo..=hi].to_vec(), SCHEDULE),
                        (
                            "requests with merged bios",
                            merged[lo..=hi].to_vec(),
                            EXPLICIT,
                        ),
                    ],
                )?);
                charts.push('\n');
            }
        }
    }
    if !charts.is_empty() {
        o.push_str("<h3>Request latency per cgroup</h3>\n<div class=\"charts\">\n");
        o.push_str(&charts);
        o.push_str("</div>\n");
    }
    Ok(())
}

/// The request size and bios-per-request histograms, stacked by cgroup.
fn request_charts(o: &mut String, dev: &DeviceSnapshot) -> Result<()> {
    let mut hists = String::new();
    for dir in Dir::ALL {
        let hg = &dev.total.get(dir).histograms;
        for hist in &REQUEST_HISTOGRAMS {
            let buckets = (hist.buckets)((hist.of)(hg));
            if buckets.is_empty() {
                continue;
            }
            let labels: Vec<String> = buckets.iter().map(|(b, _)| (hist.label)(*b)).collect();
            hists.push_str(&bar_chart(
                &format!("{} {}: {}", dev.device, dir.name(), hist.what),
                hist.axis,
                "requests",
                &labels,
                &by_cgroup(dev, dir, &buckets, hist.of),
            )?);
            hists.push('\n');
        }
    }
    if !hists.is_empty() {
        o.push_str("<h3>Requests the device saw</h3>\n<div class=\"charts\">\n");
        o.push_str(&hists);
        o.push_str("</div>\n");
    }
    Ok(())
}

/// Requests per plug flush, explicit and from schedule.
fn plug_chart(o: &mut String, dev: &DeviceSnapshot) -> Result<()> {
    let rows = unplug_depths(&unplug_rows(dev.unplug.as_ref()));
    if !rows.is_empty() {
        o.push_str("<h3>Plug flushes</h3>\n<div class=\"charts\">\n");
        o.push_str(&bar_chart(
            &format!("{}: requests per plug flush", dev.device),
            "requests in the flush (depth)",
            "flushes",
            &rows.iter().map(|r| r.0.to_string()).collect::<Vec<_>>(),
            &[
                (
                    "explicit (blk_finish_plug)",
                    rows.iter().map(|r| r.1).collect(),
                    EXPLICIT,
                ),
                (
                    "from schedule",
                    rows.iter().map(|r| r.2).collect(),
                    SCHEDULE,
                ),
            ],
        )?);
        o.push_str("\n</div>\n");
    }
    Ok(())
}
