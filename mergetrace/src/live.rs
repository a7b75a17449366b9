//! The live run: attach, count every interval, show, stop cleanly, show the whole run.
use std::{
    io::IsTerminal,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::{watch, Notify},
};

use crate::{
    aggregate::Aggregator,
    cgroups::Cgroups,
    cli::LiveArgs,
    device::{self, Device},
    kernel::{self, collector, monotonic_ns},
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

pub async fn run(args: LiveArgs) -> Result<()> {
    let devices = resolve_devices(&args.devices)?;
    let mut cgroups = Cgroups::discover()?;
    let subtree = args
        .cgroup
        .as_deref()
        .map(|c| cgroups.normalize(c))
        .transpose()?;
    let mut session = kernel::Session::start(
        &devices,
        &kernel::Options {
            ring_bytes: args.ring_mib << 20,
            tier: args.tier,
        },
    )?;
    let tier = session.tier.clone();

    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({}:{})", d.name, d.major, d.minor))
        .collect();
    let mut banner = vec![format!("tracing {} on the {tier}", names.join(", "))];
    for d in &devices {
        banner.extend(d.notes.iter().cloned());
    }
    banner.extend(session.notes.iter().cloned());
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

    let start = monotonic_ns();
    let agg = Arc::new(Mutex::new(Aggregator::with_meter_units(
        start,
        &args.meter_units(),
    )));
    let meter_units = agg.lock().expect("aggregator lock").meter_units().to_vec();
    let opts = snapshot::Options {
        tier: tier.kind.name(),
        fentry: tier.kind == kernel::TierKind::Fentry,
        meter_units: &meter_units,
        subtree: subtree.as_deref(),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let ring = session.take_ring().context("ring buffer already taken")?;
    let collector = {
        let agg = agg.clone();
        tokio::spawn(collector::run(ring, stop_rx, move |batch| {
            agg.lock().expect("aggregator lock").apply_all(batch)
        }))
    };

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(args.interval);
    ticker.tick().await; // the first tick is immediate
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {
                let window = {
                    let mut a = agg.lock().expect("aggregator lock");
                    for (k, n) in session.new_losses() {
                        a.lost(k, n);
                    }
                    a.take_interval(monotonic_ns())
                };
                let s = snapshot::build(&window, SnapshotKind::Interval, &devices, &mut cgroups, &opts);
                view.interval(&s)?;
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = stop.notified() => break,
            _ = until_deadline => break,
        }
    }

    // Detach first so nothing more arrives, then drain the ring and count the last losses.
    session.detach();
    let _ = stop_tx.send(true);
    collector.await.context("collector task failed")??;
    let total = {
        let mut a = agg.lock().expect("aggregator lock");
        for (k, n) in session.new_losses() {
            a.lost(k, n);
        }
        a.total(monotonic_ns())
    };
    let s = snapshot::build(&total, SnapshotKind::Total, &devices, &mut cgroups, &opts);
    view.total(&s)?;
    if s.lost_events > 0 {
        eprintln!(
            "mergetrace: warning: {} events were lost (ring buffer full): counts are low; try --ring-mib {}",
            s.lost_events,
            args.ring_mib * 4
        );
    }
    Ok(())
}
