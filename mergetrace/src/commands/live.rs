//! The live run: attach with in-kernel counting, read the counters every interval, show, stop
//! cleanly, show the whole run. No event crosses to user space here: the programs count in
//! per-CPU maps with the same rule the offline aggregator uses.
use std::{io::IsTerminal, sync::Arc};

use anyhow::Result;
use clap::Args;
use mergetrace_common::Modes;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::Notify,
};

use crate::{
    cli::args::{RunArgs, SubtreeArg, TraceArgs},
    kernel::{self, monotonic_ns},
    model::aggregate::{self, Window},
    model::snapshot::{self, SnapshotKind},
    sys::{cgroups::Cgroups, device},
    view::{banner, json::JsonView, text::TextView, tui::TuiView, View},
};

/// The live view's flags (the command line without a subcommand).
#[derive(Args, Debug, Clone)]
pub struct LiveArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub subtree: SubtreeArg,
    /// Print NDJSON: one object per interval, then one for the whole run.
    #[arg(long)]
    pub json: bool,
    /// Plain text even on a terminal.
    #[arg(long, conflicts_with = "json")]
    pub text: bool,
    /// Report each eBPF program's kernel time per run at the end (BPF run-time statistics).
    #[arg(long)]
    pub stats: bool,
}

pub async fn run(args: LiveArgs) -> Result<()> {
    // Before anything is attached: a signal during start-up must stop the run cleanly too.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let devices = device::resolve_all(&args.trace.devices)?;
    let mut cgroups = Cgroups::discover()?;
    let subtree = args
        .subtree
        .cgroup
        .as_deref()
        .map(|c| cgroups.normalize(c))
        .transpose()?;
    let meter_units = args.trace.meter_unit.clone();
    let session = kernel::Session::start(
        &devices,
        &kernel::Options {
            ring_bytes: args.run.ring_mib << 20,
            tier: args.trace.tier,
            modes: Modes {
                aggregate: 1,
                emit: 0,
            },
            meter_units: aggregate::meter_units(&meter_units),
            stats: args.stats,
        },
    )?;
    let start = monotonic_ns();
    let tier = session.tier.clone();
    let banner = banner::lines(&devices, &session, &cgroups);
    // The first line on stderr says the probes are attached (scripts and tests wait for it).
    for line in &banner {
        eprintln!("mergetrace: {line}");
    }

    let stop = Arc::new(Notify::new());
    let mut view: Box<dyn View> = if args.json {
        Box::new(JsonView::new(std::io::stdout()))
    } else if !args.text && std::io::stdout().is_terminal() {
        let stop = stop.clone();
        Box::new(TuiView::new(banner.clone(), move || stop.notify_one())?)
    } else {
        Box::new(TextView::new(std::io::stdout()))
    };
    let opts = snapshot::Options {
        tier: tier.kind.name(),
        fentry: tier.kind == kernel::TierKind::Fentry,
        meter_units: &meter_units,
        subtree: subtree.as_deref(),
    };

    let deadline = args.run.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(args.run.interval);
    ticker.tick().await; // the first tick is immediate
    let mut previous = Window {
        start_ns: start,
        end_ns: start,
        ..Window::default()
    };
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {
                let mut now = session.read_totals()?;
                now.start_ns = start;
                now.end_ns = monotonic_ns();
                let interval = now.since(&previous);
                previous = now;
                let s = snapshot::build(&interval, SnapshotKind::Interval, &devices, &mut cgroups, &opts);
                view.interval(&s)?;
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = stop.notified() => break,
            _ = until_deadline => break,
        }
    }

    // Detach first so the counters stop moving, then read them one last time.
    let mut session = session;
    let program_stats = if args.stats {
        session.program_stats()
    } else {
        Vec::new()
    };
    session.detach();
    let mut total = session.read_totals()?;
    total.start_ns = start;
    total.end_ns = monotonic_ns();
    let mut s = snapshot::build(&total, SnapshotKind::Total, &devices, &mut cgroups, &opts);
    s.program_stats = program_stats;
    view.total(&s)?;
    for p in &s.program_stats {
        eprintln!(
            "mergetrace: stats: {:<24} {:>12} runs {:>8.0} ns/run",
            p.program, p.runs, p.ns_per_run
        );
    }
    if s.lost_events > 0 {
        eprintln!(
            "mergetrace: warning: {} events could not be counted ({}): the counts are low",
            s.lost_events,
            s.lost_by_kind
                .keys()
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
