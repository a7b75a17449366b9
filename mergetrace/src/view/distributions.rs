//! `report`'s text after the tables: the request size and bios-per-request histograms, plug
//! flush depths, request latencies and the per-second series.
use std::fmt::Write as _;

use crate::{
    fmt,
    model::{
        aggregate::Dir,
        snapshot::{DeviceSnapshot, Histograms, Snapshot},
    },
    offline::analysis::{unplug_rows, Distributions, REQUEST_HISTOGRAMS},
};

/// The text section printed after the tables.
pub fn render_text(snap: &Snapshot, d: &Distributions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "--- distributions");
    for dev in &snap.devices {
        for dir in Dir::ALL {
            histograms_text(&mut out, &dev.device, dir, &dev.total.get(dir).histograms);
        }
        plug_flushes_text(&mut out, dev);
    }
    latency_text(&mut out, d);
    bio_wait_text(&mut out, d);
    series_text(&mut out, d);
    out
}

/// `report --latency`: each bio's wait until its request was issued, by how it joined.
fn bio_wait_text(out: &mut String, d: &Distributions) {
    if d.bio_wait.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "bio wait, queued → its request issued (µs), by how the bio joined its request:"
    );
    let cw = d
        .bio_wait
        .iter()
        .map(|b| b.cgroup.chars().count())
        .max()
        .unwrap_or(0)
        .max("CGROUP".len());
    let _ = writeln!(
        out,
        "  {:<8} {:<cw$} {:<7} {:<24} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "DEVICE", "CGROUP", "DIR", "JOINED", "BIOS", "P50", "P90", "P99", "MAX"
    );
    for b in &d.bio_wait {
        let w = &b.wait;
        let _ = writeln!(
            out,
            "  {:<8} {:<cw$} {:<7} {:<24} {:>8} {:>9} {:>9} {:>9} {:>9}",
            b.device,
            b.cgroup,
            b.dir,
            b.joined,
            w.count,
            fmt::micros(w.p50_us),
            fmt::micros(w.p90_us),
            fmt::micros(w.p99_us),
            fmt::micros(w.max_us)
        );
    }
}

fn bar(n: u64, max: u64, width: usize) -> String {
    if max == 0 || n == 0 {
        return String::new();
    }
    let w = ((n as f64 / max as f64) * width as f64).round().max(1.0) as usize;
    "#".repeat(w)
}

fn histogram_text(out: &mut String, title: &str, rows: &[(String, u64)]) {
    let _ = writeln!(out, "{title}");
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0);
    let lw = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    let nw = rows
        .iter()
        .map(|r| r.1.to_string().len())
        .max()
        .unwrap_or(1);
    for (label, n) in rows {
        let pad = lw - label.chars().count();
        let _ = writeln!(
            out,
            "  {}{label}  {n:>nw$}  {}",
            " ".repeat(pad),
            bar(*n, max, 40)
        );
    }
}

/// Histograms of the device totals (the snapshot's; `histograms` in the JSON per cgroup).
fn histograms_text(out: &mut String, device: &str, dir: Dir, h: &Histograms) {
    for hist in &REQUEST_HISTOGRAMS {
        let rows: Vec<(String, u64)> = (hist.buckets)((hist.of)(h))
            .into_iter()
            .map(|(b, n)| ((hist.label)(b), n))
            .collect();
        if !rows.is_empty() {
            let title = format!("{}, {device} {} (requests):", hist.what, dir.name());
            histogram_text(out, &title, &rows);
        }
    }
}

/// Plug flush depths of one device, or why there are none.
fn plug_flushes_text(out: &mut String, dev: &DeviceSnapshot) {
    let rows = unplug_rows(dev.unplug.as_ref());
    if !rows.is_empty() {
        let _ = writeln!(
            out,
            "plug flushes, {} (requests per flush → flushes):",
            dev.device
        );
        let max = rows.iter().map(|r| r.1.max(r.2)).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:>5}  {:>9}  {:>13}",
            "DEPTH", "EXPLICIT", "FROM SCHEDULE"
        );
        for (depth, e, s) in rows {
            let _ = writeln!(
                out,
                "  {depth:>5}  {e:>9}  {s:>13}  {}",
                bar(e + s, max * 2, 40)
            );
        }
    } else if Dir::ALL.iter().any(|&dir| dev.total.get(dir).requests > 0) {
        // Not an empty section by accident: some kernels flush without the tracepoint.
        let _ = writeln!(
            out,
            "plug flushes, {}: none traced (block_unplug never fired; 6.1 and 6.6 flush a \
             single-queue plug with no I/O scheduler without it)",
            dev.device
        );
    }
}

/// Request latencies per device and direction.
fn latency_text(out: &mut String, d: &Distributions) {
    if !d.latency.is_empty() {
        let _ = writeln!(out, "request latency (µs):");
        let _ = writeln!(
            out,
            "  {:<8} {:<7} {:<18} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "DEVICE", "DIR", "STAGE", "COUNT", "MIN", "P50", "P90", "P99", "MAX"
        );
        for r in &d.latency {
            for (stage, st) in [
                ("insert → issue", &r.insert_to_issue),
                ("issue → complete", &r.issue_to_complete),
            ] {
                match st {
                    Some(s) => {
                        let _ = writeln!(
                            out,
                            "  {:<8} {:<7} {:<18} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
                            r.device,
                            r.dir,
                            stage,
                            s.count,
                            fmt::micros(s.min_us),
                            fmt::micros(s.p50_us),
                            fmt::micros(s.p90_us),
                            fmt::micros(s.p99_us),
                            fmt::micros(s.max_us)
                        );
                    }
                    None => {
                        let _ =
                            writeln!(out, "  {:<8} {:<7} {:<18} {:>8}", r.device, r.dir, stage, 0);
                    }
                }
            }
            if r.direct_issues > 0 {
                let _ = writeln!(
                    out,
                    "  {:<8} {:<7} issued directly (no insert, no insert → issue time): {}",
                    r.device, r.dir, r.direct_issues
                );
            }
        }
    }
}

/// Each (device, cgroup, direction) second by second.
fn series_text(out: &mut String, d: &Distributions) {
    for s in &d.timeseries.series {
        let _ = writeln!(
            out,
            "per second, {} {} {} (second since the capture's start):",
            s.device, s.cgroup, s.dir
        );
        let _ = writeln!(
            out,
            "  {:>5} {:>9} {:>9} {:>9} {:>9}",
            "SEC", "BIOS", "REQS", "MERGED", "CHARGED"
        );
        for i in 0..d.timeseries.buckets {
            let _ = writeln!(
                out,
                "  {:>5} {:>9} {:>9} {:>9} {:>9}",
                i, s.bios[i], s.requests[i], s.merged[i], s.charged[i]
            );
        }
    }
}
