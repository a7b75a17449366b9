//! `mergetrace report run.mtr`: a capture read back through the same aggregator and snapshot
//! code as the live view, so the same run gives the same numbers.
use std::{io::Write as _, path::PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{
    cli::args::{SpanArgs, SubtreeArg},
    model::snapshot::Snapshot,
    offline::{
        analysis, latency, lineage,
        load::{header_of, load, snapshot},
        names::Names,
    },
    view::{self, quiet_pipe, text::TextView, View},
};

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A capture written by `mergetrace record`.
    pub file: PathBuf,
    /// Print JSON instead of text: the live view's "total" object plus "distributions"
    /// (with --lineage: one object per request).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub subtree: SubtreeArg,
    #[command(flatten)]
    pub span: SpanArgs,
    /// Request by request: which bios ended in each request the device saw, and how each
    /// joined it (see docs/report.md for what is exact and what is inferred).
    #[arg(long)]
    pub lineage: bool,
    /// With --lineage: only the first N requests issued.
    #[arg(long, value_name = "N", requires = "lineage")]
    pub limit: Option<usize>,
    /// Latency per cgroup, replayed request by request: each request's queue and device
    /// latency (apart for requests that carried merged bios, as the live view's --latency) and
    /// each bio's wait until its request was issued, by how it joined (a full capture only).
    #[arg(long, conflicts_with = "lineage")]
    pub latency: bool,
    /// Write a self-contained HTML report (tables, verdicts, charts) to FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["lineage", "json"])]
    pub html: Option<PathBuf>,
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
    distributions: &'a analysis::Distributions,
}

pub fn run(args: &ReportArgs) -> Result<()> {
    if args.lineage {
        return quiet_pipe(run_lineage(args));
    }
    quiet_pipe(run_report(args))
}

fn run_report(args: &ReportArgs) -> Result<()> {
    let header = header_of(&args.file)?;
    if args.latency && header.requests_only {
        refuse_requests_only(args, "per-bio latency (--latency)")?;
    }
    let mut an = analysis::Analysis::default();
    let mut tracker = args.latency.then(lineage::Tracker::new);
    let mut loaded = load(&args.file, args.span.from, args.span.to, |ev| {
        an.apply(ev);
        if let Some(t) = tracker.as_mut() {
            t.apply(ev);
        }
    })?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let lin = tracker.map(lineage::Tracker::finish);
    if let Some(lin) = &lin {
        loaded.window.latency = latency::request_histograms(lin).into_iter().collect();
    }
    let subtree = subtree_of(args.subtree.cgroup.as_deref());
    let s = snapshot(&loaded, subtree.as_deref());
    let mut dist = an.finish(&s, &loaded.intervals);
    if let Some(lin) = &lin {
        dist.bio_wait = latency::bio_waits(lin, &s);
    }
    if let Some(out) = &args.html {
        let page = view::html::render(&loaded.header, &args.file, &s, &dist)?;
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
        out.write_all(view::distributions::render_text(&s, &dist).as_bytes())?;
        out.flush()?;
        Ok(())
    }
}

/// `report --lineage`: request by request.
/// One line for what a `record --requests` capture cannot give: it has no bio events.
fn refuse_requests_only(args: &ReportArgs, what: &str) -> Result<()> {
    anyhow::bail!(
        "{} was recorded with --requests (request events only): {what} needs a full capture \
         (record without --requests); its report has the totals and paths",
        args.file.display()
    )
}

fn run_lineage(args: &ReportArgs) -> Result<()> {
    if crate::offline::load::header_of(&args.file)?.requests_only {
        refuse_requests_only(args, "bio-by-bio lineage")?;
    }
    let subtree = subtree_of(args.subtree.cgroup.as_deref());
    // With a cgroup filter the limit applies after filtering.
    let mut tracker = match (args.limit, &subtree) {
        (Some(n), None) => lineage::Tracker::with_limit(n),
        _ => lineage::Tracker::new(),
    };
    let loaded = load(&args.file, args.span.from, args.span.to, |ev| {
        tracker.apply(ev)
    })?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let lin = tracker.finish();
    let mut names = Names::new(&loaded.header);
    let mut out = std::io::stdout().lock();
    let mut shown = 0usize;
    for r in &lin.requests {
        if args.limit.is_some_and(|n| shown >= n) {
            break;
        }
        if let Some(sub) = &subtree {
            if !analysis::shown(names.cgroup(r.cgroup_id), Some(sub)) {
                continue;
            }
        }
        shown += 1;
        if args.json {
            serde_json::to_writer(&mut out, &lineage::to_json(r, &mut names))?;
            writeln!(out)?;
        } else {
            write!(out, "{}", lineage::render_text(r, &mut names))?;
        }
    }
    let summary = lineage::summary(&lin.stats);
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
        capture::{CaptureWriter, Header, RecordedDevice, WriterOptions},
        testing::synth::{Synth, START_NS},
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

        let mut an = analysis::Analysis::default();
        let loaded = load(&file, None, None, |ev| an.apply(ev)).unwrap();
        let snap = snapshot(&loaded, None);
        let dist = an.finish(&snap, &loaded.intervals);
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
