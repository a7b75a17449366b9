//! `mergetrace record -d DEV -o run.mtr`: every event of a run into a capture file, with the
//! context needed to read it offline. The file is flushed every interval, so a crash or
//! kill -9 loses at most the last interval; losses are recorded where they happened.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use clap::Args;
use mergetrace_common::Modes;
use tokio::sync::watch;

use crate::{
    capture::{
        CaptureWriter, Header, LateCgroups, RecordedCgroup, RecordedDevice, RecordedLimits,
        WriterOptions,
    },
    cli::{
        args::{NamesArg, RunArgs, TraceArgs, RING_MIB_MAX},
        stop::Stop,
    },
    kernel::{self, collector},
    sys::{
        cgroups::{Cgroups, Hierarchy},
        device,
    },
    view::banner,
};

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// The capture file to write (created with permissions 0600).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Record the request events only (new requests, inserts, issues, request merges,
    /// completions, plug flushes), not every bio: a program run per request instead of per
    /// bio, the cheap capture for merging workloads. Its report has the same totals, merge
    /// paths and latencies; bio-by-bio lineage needs a full capture. Where a traced disk has
    /// blk-throttle rules or io.cost, the bios they charge are recorded all the same
    /// (blk-throttle's in runs: one event for the like charges a CPU gathers, with their
    /// count).
    #[arg(long)]
    pub requests: bool,
    /// Report at the end what the recording cost: each eBPF program's kernel time per run
    /// (BPF run-time statistics; `stats_floor`, an empty program, is what the statistics
    /// add to each run) and this process's CPU time per event written, by stage: reading the
    /// rings, time order, encoding and writing, the rest.
    #[arg(long)]
    pub stats: bool,
    #[command(flatten)]
    pub names: NamesArg,
    #[command(flatten)]
    pub run: RunArgs,
}

/// The header: this host, the devices, every cgroup's id, path and readable name, the limits
/// each sets.
fn header(
    tier: &str,
    devices: &[crate::sys::device::Device],
    cgroups: &mut Cgroups,
    meter_units: &[u64],
) -> Header {
    let mut h = Header::for_this_host(tier);
    h.devices = devices.iter().map(RecordedDevice::from).collect();
    h.cgroup_hierarchy = match cgroups.hierarchy {
        Hierarchy::V1 => "v1".into(),
        Hierarchy::V2 => "v2".into(),
    };
    h.cgroup_mount = cgroups.mount.display().to_string();
    let mut all: Vec<(u64, String)> = cgroups.all().map(|(id, p)| (id, p.to_string())).collect();
    all.sort();
    for (id, path) in all {
        h.limits.extend(own_limits(cgroups, &path, devices));
        h.cgroups.push(RecordedCgroup {
            id,
            name: cgroups.readable(&path),
            path,
        });
    }
    h.meter_units = meter_units.to_vec();
    h
}

/// The limits the cgroup at `path` sets itself on each traced device.
fn own_limits(
    cgroups: &Cgroups,
    path: &str,
    devices: &[crate::sys::device::Device],
) -> Vec<RecordedLimits> {
    let dir = cgroups.mount.join(path.trim_start_matches('/'));
    devices
        .iter()
        .filter_map(|d| {
            let own = crate::sys::throttle::own_limits(cgroups.hierarchy, &dir, d.major, d.minor);
            (!own.is_empty()).then(|| RecordedLimits::new(path, d.major, d.minor, &own))
        })
        .collect()
}

/// Cgroups created during the run: their events name an id the header does not have. Each
/// interval they are looked up (one rescan of the hierarchy) and written in a `c` chunk; an
/// id still unknown after [`LateNames::TRIES`] intervals (created and removed in between)
/// stays "unknown cgroup id N" in the report.
struct LateNames {
    known: foldhash::HashSet<u64>,
    /// The previous event's cgroup: consecutive events mostly share one.
    last: u64,
    /// Unnamed id → intervals tried.
    pending: BTreeMap<u64, u32>,
}

impl LateNames {
    const TRIES: u32 = 3;

    fn new(h: &Header) -> LateNames {
        LateNames {
            known: h.cgroups.iter().map(|c| c.id).chain([0]).collect(),
            last: 0,
            pending: BTreeMap::new(),
        }
    }

    fn see(&mut self, batch: &[mergetrace_common::Event]) {
        for ev in batch {
            let id = ev.cgroup_id;
            if id != self.last {
                self.last = id;
                if !self.known.contains(&id) {
                    self.pending.entry(id).or_insert(0);
                }
            }
        }
    }

    /// Names what it can of the pending ids.
    fn resolve(
        &mut self,
        cgroups: &mut Cgroups,
        devices: &[crate::sys::device::Device],
    ) -> LateCgroups {
        let mut late = LateCgroups::default();
        if self.pending.is_empty() {
            return late;
        }
        cgroups.rescan();
        let pending = std::mem::take(&mut self.pending);
        for (id, tries) in pending {
            if let Some(path) = cgroups.path_of(id).map(str::to_string) {
                late.limits.extend(own_limits(cgroups, &path, devices));
                late.cgroups.push(RecordedCgroup {
                    id,
                    name: cgroups.readable(&path),
                    path,
                });
                self.known.insert(id);
            } else if tries + 1 >= Self::TRIES {
                self.known.insert(id); // gone before it could be named
            } else {
                self.pending.insert(id, tries + 1);
            }
        }
        late
    }
}

/// The capture being written and the first error writing it.
struct Recording {
    writer: CaptureWriter<std::fs::File>,
    failure: Option<anyhow::Error>,
    late: LateNames,
}

impl Recording {
    fn write(&mut self, batch: &[mergetrace_common::Event]) {
        self.late.see(batch);
        if self.failure.is_none() {
            if let Err(e) = self.writer.write_events(batch) {
                self.failure = Some(e);
            }
        }
    }

    /// Each interval: names of new cgroups, losses, then a flush.
    fn interval(
        &mut self,
        losses: Vec<(u8, u64)>,
        cgroups: &mut Cgroups,
        devices: &[crate::sys::device::Device],
    ) {
        if self.failure.is_some() {
            return;
        }
        let late = self.late.resolve(cgroups, devices);
        let step = (|| -> Result<()> {
            self.writer.write_cgroups(&late)?;
            for (k, n) in losses {
                self.writer.write_lost(k, n)?;
            }
            self.writer.flush()
        })();
        if let Err(e) = step {
            self.failure = Some(e);
        }
    }
}

pub async fn run(args: RecordArgs) -> Result<()> {
    let mut stop = Stop::on_signals()?;
    // A recording's disks are those named, or matching, when it starts (its header lists
    // them).
    let (devices, _) = device::Selection::resolve(&args.trace.devices, args.trace.all_disks)?;
    let mut cgroups = Cgroups::discover()?;
    if args.names.no_local_names {
        cgroups = cgroups.without_local_names();
    }
    // Fail on an unwritable or existing output before attaching anything.
    let probe_header = header("", &devices, &mut cgroups, &args.trace.meter_unit);
    let mut opts = args
        .trace
        .kernel_options(Modes::EMITTING, args.run.ring_mib << 20, args.stats);
    // --requests: the request events, and what the flags ask for (plug flushes, a program
    // run per flush, only with --plug-flushes); reads' new requests are left out as when
    // counting (a request's events tell it).
    if args.requests {
        opts.modes.requests_only = 1;
    } else {
        opts.wants = kernel::Wants::ALL;
    }
    let mut session = kernel::Session::start(&devices, &opts)?;
    let mut h = probe_header;
    h.tier = session.tier.kind.name().to_string();
    h.requests_only = args.requests;
    h.no_plug_flushes = !session.wants.plug_flushes;
    let iolatency = crate::sys::iolatency::targets_on(&devices, &cgroups);
    for d in &mut h.devices {
        let dev = crate::sys::device::Device::from(&*d).dev().0;
        d.iocost = session.iocost.get(&dev).map(|c| c.recorded());
        d.wbt = session.wbt.get(&dev).copied();
        d.iolatency = iolatency.get(&dev).cloned();
    }
    let writer = CaptureWriter::create_with(
        &args.output,
        &h,
        WriterOptions {
            overwrite: args.force,
            ..WriterOptions::default()
        },
    )?;
    for line in banner::lines(&devices, &session, &cgroups, &iolatency) {
        eprintln!("mergetrace: {line}");
    }
    let (rings, batches) = session.take_rings();
    let ring = rings.iter().map(|r| r.ring_bytes).max().unwrap_or(0);
    eprintln!(
        "mergetrace: recording to {} (events cross on a ring per CPU, {} each)",
        args.output.display(),
        if ring >= 1 << 20 {
            format!("{} MiB", ring >> 20)
        } else {
            format!("{} KiB", ring >> 10)
        }
    );

    let cpu_at_start = crate::sys::process_cpu_ns();
    let (stop_tx, stop_rx) = watch::channel(false);
    // The writer is shared by the collector (events) and the ticker (losses, flushes); the
    // first write error stops the recording.
    let shared = Arc::new(Mutex::new(Recording {
        late: LateNames::new(&h),
        writer,
        failure: None,
    }));
    let collector = {
        let shared = shared.clone();
        tokio::spawn(collector::run(
            rings,
            batches,
            stop_rx,
            args.stats,
            move |batch| shared.lock().expect("recording lock").write(batch),
        ))
    };
    stop.after(args.run.duration);
    let mut ticker = tokio::time::interval(args.run.interval);
    ticker.tick().await;
    let reports = session.report_waker()?;
    loop {
        tokio::select! {
            // Rules seen on a disk attach the throttle-wait programs at once.
            _ = reports.wait() => session.poll_cgroups(),
            _ = ticker.tick() => {
                let mut rec = shared.lock().expect("recording lock");
                kernel::cgroup_events::apply(session.take_cgroup_changes(), &mut cgroups);
                rec.interval(session.new_losses(), &mut cgroups, &devices);
                if rec.failure.is_some() {
                    break;
                }
            }
            _ = stop.wait() => break,
        }
    }
    // Detach, let the collector drain the rings, record the last losses.
    let program_stats = if args.stats {
        session.program_stats()
    } else {
        Vec::new()
    };
    session.detach();
    super::warn_skipped_runs(&session.unsaid()?);
    let _ = stop_tx.send(true);
    let collected = collector.await.context("collector task failed")??;
    let mut rec = Arc::try_unwrap(shared)
        .map_err(|_| anyhow::anyhow!("collector still holds the capture"))?
        .into_inner()
        .expect("recording lock");
    kernel::cgroup_events::apply(session.take_cgroup_changes(), &mut cgroups);
    rec.interval(session.new_losses(), &mut cgroups, &devices);
    if collected.late > 0 {
        // Kept, not lost: a CPU held them past the merge's grace (a stalled virtual CPU).
        eprintln!(
            "mergetrace: {} events reached user space more than {} ms after their time and \
             are written after later ones",
            collected.late,
            kernel::time_order::GRACE_NS / 1_000_000
        );
    }
    let events = rec.finish(&args)?;
    if args.stats {
        print_stats(
            &program_stats,
            crate::sys::process_cpu_ns() - cpu_at_start,
            collected.costs.unwrap_or_default(),
            events,
        );
    }
    Ok(())
}

/// `--stats`: the programs' kernel time, as the live view prints it, and this process's CPU
/// time while it recorded (`cpu_ns`: user and system, every thread) per event written, with
/// the collecting thread's share of it by stage.
fn print_stats(
    programs: &[crate::model::snapshot::ProgramStat],
    cpu_ns: u64,
    costs: collector::Costs,
    events: u64,
) {
    super::print_program_stats(programs);
    let per_event = |ns: u64| ns as f64 / events.max(1) as f64;
    eprintln!(
        "mergetrace: stats: recording took {:.0} ms of this process's CPU, {:.0} ns per event",
        cpu_ns as f64 / 1e6,
        per_event(cpu_ns)
    );
    let staged = costs.reading_ns + costs.ordering_ns + costs.consuming_ns;
    eprintln!(
        "mergetrace: stats: per event, reading the rings {:.0} ns, time order {:.0} ns, \
         encoding and writing {:.0} ns, the rest {:.0} ns (polls, wake-ups, flushes)",
        per_event(costs.reading_ns),
        per_event(costs.ordering_ns),
        per_event(costs.consuming_ns),
        per_event(cpu_ns.saturating_sub(staged))
    );
}

impl Recording {
    /// Closes the capture and says what it holds, or why it stopped early; the events
    /// written.
    fn finish(self, args: &RecordArgs) -> Result<u64> {
        let Recording {
            writer, failure, ..
        } = self;
        if let Some(e) = failure {
            // What reached the disk stays readable up to its last complete chunk.
            drop(writer);
            return Err(e.context(format!(
                "recording stopped; {} is readable up to the last complete chunk",
                args.output.display()
            )));
        }
        let summary = writer.finish()?;
        eprintln!(
            "mergetrace: wrote {} events ({} lost) in {} bytes to {}{}",
            summary.events,
            summary.lost,
            summary.bytes,
            summary.path.display(),
            if summary.events > 0 {
                format!(
                    " ({:.1} bytes/event)",
                    summary.bytes as f64 / summary.events as f64
                )
            } else {
                String::new()
            }
        );
        if summary.lost > 0 {
            eprintln!(
                "mergetrace: warning: {} events were lost (ring buffer full); try --ring-mib {}",
                summary.lost,
                (args.run.ring_mib * 4).min(RING_MIB_MAX)
            );
        }
        Ok(summary.events)
    }
}
