//! The live run: attach with in-kernel counting, read the counters every interval, show, stop
//! cleanly, show the whole run. No event crosses to user space here: the programs count in
//! per-CPU maps with the same rule the offline aggregator uses.
use std::{io::IsTerminal, sync::Arc};

use anyhow::Result;
use mergetrace_common::Modes;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::Notify,
};

use crate::{
    aggregate::{self, Window},
    cgroups::{Cgroups, Hierarchy},
    limits::{self, LimitKind},
    cli::LiveArgs,
    device::{self, Device},
    kernel::{self, monotonic_ns},
    snapshot::{self, SnapshotKind},
    view::{json::JsonView, text::TextView, tui::TuiView, View},
};

pub fn resolve_devices(specs: &[String]) -> Result<Vec<Device>> {
    let mut out: Vec<Device> = Vec::new();
    for spec in specs {
        let d = device::resolve(spec)?;
        if !out.iter().any(|o| o.kernel_dev() == d.kernel_dev()) {
            out.push(d);
        }
    }
    Ok(out)
}

/// The banner: what is traced, on which tier, and notes the user should read.
pub fn banner(devices: &[Device], session: &kernel::Session, cgroups: &Cgroups) -> Vec<String> {
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({}:{})", d.name, d.major, d.minor))
        .collect();
    let mut lines = vec![format!(
        "tracing {} on the {}",
        names.join(", "),
        session.tier
    )];
    for d in devices {
        lines.extend(d.notes.iter().cloned());
        if let Ok(q) = crate::queue::QueueSettings::read(d) {
            lines.push(configuration_line(&d.name, &q));
        }
        lines.extend(v1_writeback_note(d, cgroups));
    }
    lines.extend(session.notes.iter().cloned());
    lines
}

/// On cgroup v1, write limits never see buffered writes: say so when a cgroup has one.
pub fn v1_writeback_note(d: &Device, cgroups: &Cgroups) -> Option<String> {
    if cgroups.hierarchy != Hierarchy::V1 {
        return None;
    }
    let mut limited: Vec<&str> = cgroups
        .all()
        .map(|(_, path)| path)
        .filter(|path| {
            let dir = cgroups.mount.join(path.trim_start_matches('/'));
            let own = limits::own_limits(Hierarchy::V1, &dir, d.major, d.minor);
            own.get(LimitKind::Wiops).is_some() || own.get(LimitKind::Wbps).is_some()
        })
        .collect();
    if limited.is_empty() {
        return None;
    }
    limited.sort_unstable();
    let more = limited.len().saturating_sub(3);
    limited.truncate(3);
    Some(format!(
        "{}: cgroup v1 has no writeback attribution: buffered writes are submitted by the \
         kernel's flusher as the root cgroup, so the write limits of {}{} count only direct and \
         synchronous writes, and the writeback shows in the / row",
        d.name,
        limited.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// The per-device configuration line, as the article explains it: scheduler, what nomerges
/// does on this path, the merge ceiling, and when the plug flushes.
pub fn configuration_line(name: &str, q: &crate::queue::QueueSettings) -> String {
    if q.bio_based() {
        return format!("{name}: {}", q.explain_nomerges());
    }
    let flush = match q.plug_flush_bytes() {
        Some(b) => format!(
            "{} requests or a {} KiB request",
            q.plug_max_requests(),
            b >> 10
        ),
        None => format!("{} requests", q.plug_max_requests()),
    };
    format!(
        "{name}: scheduler {}; {}; requests merge up to {} KiB (set by {}); the plug flushes at {flush}",
        q.scheduler_name(),
        q.explain_nomerges(),
        q.merge_ceiling_bytes() >> 10,
        q.merge_ceiling_set_by(),
    )
}

pub async fn run(args: LiveArgs) -> Result<()> {
    // Before anything is attached: a signal during start-up must stop the run cleanly too.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let devices = resolve_devices(&args.devices)?;
    let mut cgroups = Cgroups::discover()?;
    let subtree = args
        .cgroup
        .as_deref()
        .map(|c| cgroups.normalize(c))
        .transpose()?;
    let meter_units = args.meter_units();
    let session = kernel::Session::start(
        &devices,
        &kernel::Options {
            ring_bytes: args.ring_mib << 20,
            tier: args.tier,
            modes: Modes {
                aggregate: 1,
                emit: 0,
                ..Modes::default()
            },
            meter_units: aggregate::meter_units(&meter_units),
            stats: args.stats,
        },
    )?;
    let start = monotonic_ns();
    let tier = session.tier.clone();
    let banner = banner(&devices, &session, &cgroups);
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

    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(args.interval);
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
