//! `mergetrace report run.mtr`: a capture read back through the same aggregator and snapshot
//! code as the live view, so the same run gives the same numbers.
use std::{io::Write as _, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use clap::Args;
use mergetrace_common::Event;

use crate::{
    capture::{CaptureReader, Header, HeaderLookup, Next},
    cli::args::SpanArgs,
    model::aggregate::{Aggregator, Window},
    model::snapshot::{self, Snapshot, SnapshotKind},
    sys::device::Device,
    view::{text::TextView, View},
};

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A capture written by `mergetrace record`.
    pub file: PathBuf,
    /// Print JSON instead of text: the live view's "total" object plus "distributions"
    /// (with --lineage: one object per request).
    #[arg(long)]
    pub json: bool,
    /// Only this cgroup and its descendants (path relative to the cgroup mount).
    #[arg(short = 'c', long, value_name = "PATH")]
    pub cgroup: Option<String>,
    #[command(flatten)]
    pub span: SpanArgs,
    /// Request by request: which bios ended in each request the device saw, and how each
    /// joined it (see docs/report.md for what is exact and what is inferred).
    #[arg(long)]
    pub lineage: bool,
    /// With --lineage: only the first N requests issued.
    #[arg(long, value_name = "N", requires = "lineage")]
    pub limit: Option<usize>,
    /// Write a self-contained HTML report (tables, verdicts, charts) to FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["lineage", "json"])]
    pub html: Option<PathBuf>,
}

/// The devices as the capture recorded them.
pub fn devices(h: &Header) -> Vec<Device> {
    h.devices
        .iter()
        .map(|d| Device {
            name: d.name.clone(),
            major: d.major,
            minor: d.minor,
            notes: d.notes.clone(),
            bio_based: d.bio_based,
        })
        .collect()
}

/// A capture read into one window, with what the reader had to say.
pub struct Loaded {
    pub header: Header,
    pub window: Window,
    /// Set when the file was cut short (crash, kill -9, full disk).
    pub warning: Option<String>,
}

/// Reads `path` and counts every event in `[from, to)` (times since the capture's start),
/// calling `each` on every counted event as well (for distributions and lineage).
pub fn load(
    path: &PathBuf,
    from: Option<Duration>,
    to: Option<Duration>,
    mut each: impl FnMut(&Event),
) -> Result<Loaded> {
    let mut reader = CaptureReader::open(path)?;
    let start = reader.header().start_monotonic_ns;
    let lo = start + from.map_or(0, |d| d.as_nanos() as u64);
    let hi = to.map_or(u64::MAX, |d| start + d.as_nanos() as u64);
    let mut agg = Aggregator::with_meter_units(lo, &reader.header().meter_units);
    let mut buf: Vec<Event> = Vec::with_capacity(8192);
    let mut last_ts = start;
    while let Some(next) = reader.next_into(&mut buf)? {
        match next {
            Next::Events => {
                for ev in buf.iter().filter(|e| e.ts_ns >= lo && e.ts_ns < hi) {
                    agg.apply(ev);
                    each(ev);
                    last_ts = last_ts.max(ev.ts_ns);
                }
            }
            Next::Lost { kind, count } => agg.lost(kind, count),
        }
    }
    let end = match (reader.trailer(), to) {
        (_, Some(_)) => hi.min(last_ts.max(lo)),
        (Some(t), None) => t.end_monotonic_ns.max(last_ts),
        (None, None) => last_ts,
    };
    let warning = reader.warning().map(str::to_string).or_else(|| {
        reader.truncated().then(|| {
            format!(
                "{} was cut short: reporting the complete chunks",
                path.display()
            )
        })
    });
    Ok(Loaded {
        // Read to the end: it names the cgroups created during the run too.
        header: reader.header().clone(),
        window: agg.total(end),
        warning,
    })
}

/// The totals of a loaded capture as the live view's "total" snapshot.
pub fn snapshot(loaded: &Loaded, subtree: Option<&str>) -> Snapshot {
    let h = &loaded.header;
    let opts = snapshot::Options {
        tier: &h.tier,
        fentry: h.tier == "fentry",
        meter_units: &h.meter_units,
        subtree,
    };
    snapshot::build(
        &loaded.window,
        SnapshotKind::Total,
        &devices(h),
        &mut HeaderLookup::new(h),
        &opts,
    )
}

/// The header of a capture (to set up what reads its events).
pub fn header_of(path: &PathBuf) -> Result<Header> {
    Ok(CaptureReader::open(path)?.header().clone())
}

fn subtree_of(cgroup: Option<&str>) -> Option<String> {
    cgroup.map(|c| {
        let c = format!("/{}", c.trim_start_matches('/'));
        if c.len() > 1 {
            c.trim_end_matches('/').to_string()
        } else {
            c
        }
    })
}

/// The JSON of `report --json`: the live view's "total" object plus "distributions".
#[derive(serde::Serialize)]
struct WithDistributions<'a> {
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    distributions: &'a crate::offline::analysis::Distributions,
}

/// A reader that closed the pipe early (`report … | head`) is not an error.
pub fn quiet_pipe(r: Result<()>) -> Result<()> {
    match r {
        Err(e)
            if e.chain().any(|c| {
                let pipe = std::io::ErrorKind::BrokenPipe;
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == pipe)
                    || c.downcast_ref::<serde_json::Error>()
                        .is_some_and(|j| j.io_error_kind() == Some(pipe))
            }) =>
        {
            Ok(())
        }
        r => r,
    }
}

pub fn run(args: &ReportArgs) -> Result<()> {
    if args.lineage {
        return quiet_pipe(run_lineage(args));
    }
    quiet_pipe(run_report(args))
}

fn run_report(args: &ReportArgs) -> Result<()> {
    let header = header_of(&args.file)?;
    let mut an =
        crate::offline::analysis::Analysis::new(header.start_monotonic_ns, &header.meter_units);
    let loaded = load(&args.file, args.span.from, args.span.to, |ev| an.apply(ev))?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let subtree = subtree_of(args.cgroup.as_deref());
    let s = snapshot(&loaded, subtree.as_deref());
    let dist = an.finish(&s, loaded.window.end_ns);
    if let Some(out) = &args.html {
        let page = crate::view::html::render(&loaded.header, &args.file, &s, &dist)?;
        std::fs::write(out, page).with_context(|| format!("cannot write {}", out.display()))?;
        eprintln!("mergetrace: wrote {}", out.display());
        return Ok(());
    }
    if args.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(
            &mut out,
            &WithDistributions {
                snapshot: &s,
                distributions: &dist,
            },
        )?;
        writeln!(out)?;
        Ok(())
    } else {
        let h = &loaded.header;
        writeln!(
            std::io::stdout(),
            "capture {}: kernel {}, {} tier, mergetrace {}",
            args.file.display(),
            h.kernel_release,
            h.tier,
            h.mergetrace_version
        )?;
        TextView::new(std::io::stdout()).total(&s)?;
        let mut out = std::io::stdout().lock();
        out.write_all(crate::offline::analysis::render_text(&s, &dist).as_bytes())?;
        out.flush()?;
        Ok(())
    }
}

/// `report --lineage`: request by request.
fn run_lineage(args: &ReportArgs) -> Result<()> {
    let subtree = subtree_of(args.cgroup.as_deref());
    // With a cgroup filter the limit applies after filtering.
    let mut tracker = match (args.limit, &subtree) {
        (Some(n), None) => crate::offline::lineage::Tracker::with_limit(n),
        _ => crate::offline::lineage::Tracker::new(),
    };
    let loaded = load(&args.file, args.span.from, args.span.to, |ev| {
        tracker.apply(ev)
    })?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let lin = tracker.finish();
    let mut names = crate::offline::names::Names::new(&loaded.header);
    let mut out = std::io::stdout().lock();
    let mut shown = 0usize;
    for r in &lin.requests {
        if args.limit.is_some_and(|n| shown >= n) {
            break;
        }
        if let Some(sub) = &subtree {
            if !crate::offline::analysis::shown(names.cgroup(r.cgroup_id), Some(sub)) {
                continue;
            }
        }
        shown += 1;
        if args.json {
            serde_json::to_writer(&mut out, &crate::offline::lineage::to_json(r, &mut names))?;
            writeln!(out)?;
        } else {
            write!(
                out,
                "{}",
                crate::offline::lineage::render_text(r, &mut names)
            )?;
        }
    }
    let summary = crate::offline::lineage::summary(&lin.stats);
    if args.json {
        eprintln!("mergetrace: {summary}");
    } else {
        writeln!(out, "{summary}")?;
        writeln!(
            out,
            "(exact: a request's bios are those the kernel chained, found by first bio address \
             and range; inferred: which adjacent request a merge joined when more than one \
             could have — see docs/report.md)"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        capture::{CaptureWriter, RecordedDevice, WriterOptions},
        offline::synth::{Synth, START_NS},
    };
    use mergetrace_common::path;

    /// `report --json` is the snapshot's object with one more key: every snapshot field is
    /// there unchanged, in the same order.
    #[test]
    fn report_json_is_the_snapshot_plus_distributions() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.mtr");
        let h = Header {
            start_monotonic_ns: START_NS,
            tier: "tracepoint".into(),
            devices: vec![RecordedDevice {
                name: "loop2".into(),
                major: 7,
                minor: 2,
                ..Default::default()
            }],
            ..Header::default()
        };
        let mut s = Synth::new();
        s.batch(7 << 20 | 2, 0, 0, 32, 4096, false, path::PLUG);
        let f = std::fs::File::create(&file).unwrap();
        let mut w = CaptureWriter::from_sink(f, &file, &h, WriterOptions::default()).unwrap();
        w.write_events(&s.events).unwrap();
        w.finish().unwrap();

        let mut an = crate::offline::analysis::Analysis::new(START_NS, &[]);
        let loaded = load(&file, None, None, |ev| an.apply(ev)).unwrap();
        let snap = snapshot(&loaded, None);
        let dist = an.finish(&snap, loaded.window.end_ns);
        let plain = serde_json::to_string(&snap).unwrap();
        let with = serde_json::to_string(&WithDistributions {
            snapshot: &snap,
            distributions: &dist,
        })
        .unwrap();
        assert!(with.starts_with(plain.trim_end_matches('}')), "{with}");
        let v: serde_json::Value = serde_json::from_str(&with).unwrap();
        assert_eq!(v["devices"][0]["total"]["write"]["requests"], 1);
        assert_eq!(v["distributions"]["timeseries"]["series"][0]["bios"][0], 32);
        assert_eq!(v["distributions"]["latency"][0]["direct_issues"], 1);
    }
}
