//! `mergetrace record -d DEV -o run.mtr`: every event of a run into a capture file, with the
//! context needed to read it offline. The file is flushed every interval, so a crash or
//! kill -9 loses at most the last interval; losses are recorded where they happened.
use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use clap::Args;
use mergetrace_common::Modes;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::watch,
};

use crate::{
    aggregate,
    capture::{
        CaptureWriter, Header, LateCgroups, RecordedCgroup, RecordedDevice, RecordedLimits,
        WriterOptions,
    },
    cgroups::{Cgroups, Hierarchy},
    cli::{parse_duration, parse_size},
    kernel::{self, collector, TierChoice},
    limits, live,
};

#[derive(Args, Debug, Clone)]
pub struct RecordArgs {
    /// Block device to trace (name, /dev/NAME or MAJ:MIN). Repeatable.
    #[arg(short = 'd', long = "device", required = true, value_name = "DEV")]
    pub devices: Vec<String>,
    /// The capture file to write (created with permissions 0600).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
    /// Stop after this long (e.g. 30s); otherwise run until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// How often to flush the file (and record losses).
    #[arg(short = 'i', long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierChoice,
    /// Ring buffer size in MiB (a power of two).
    #[arg(long, default_value_t = 64, value_name = "MIB")]
    pub ring_mib: u32,
    /// Cloud-volume meter unit sizes recorded for the report (e.g. 256k,1m).
    #[arg(long, default_value = "256k,1m", value_delimiter = ',', value_parser = parse_size, num_args = 1..=4)]
    pub meter_unit: Vec<u64>,
}

/// The header: this host, the devices, every cgroup's id and path, the limits each sets.
fn header(
    tier: &str,
    devices: &[crate::device::Device],
    cgroups: &Cgroups,
    meter_units: &[u64],
) -> Header {
    let mut h = Header::for_this_host(tier);
    h.devices = devices.iter().map(RecordedDevice::from).collect();
    h.cgroup_hierarchy = match cgroups.hierarchy {
        Hierarchy::V1 => "v1".into(),
        Hierarchy::V2 => "v2".into(),
    };
    h.cgroup_mount = cgroups.mount.display().to_string();
    let mut all: Vec<(u64, &str)> = cgroups.all().collect();
    all.sort();
    for (id, path) in all {
        h.cgroups.push(RecordedCgroup {
            id,
            path: path.to_string(),
        });
        h.limits.extend(own_limits(cgroups, path, devices));
    }
    h.meter_units = meter_units.to_vec();
    h
}

/// The limits the cgroup at `path` sets itself on each traced device.
fn own_limits(
    cgroups: &Cgroups,
    path: &str,
    devices: &[crate::device::Device],
) -> Vec<RecordedLimits> {
    let dir = cgroups.mount.join(path.trim_start_matches('/'));
    devices
        .iter()
        .filter_map(|d| {
            let own = limits::own_limits(cgroups.hierarchy, &dir, d.major, d.minor);
            (!own.is_empty()).then(|| RecordedLimits::new(path, d.major, d.minor, &own))
        })
        .collect()
}

/// Cgroups created during the run: their events name an id the header does not have. Each
/// interval they are looked up (one rescan of the hierarchy) and written in a `c` chunk; an
/// id still unknown after [`LateNames::TRIES`] intervals (created and removed in between)
/// stays "unknown cgroup id N" in the report.
struct LateNames {
    known: HashSet<u64>,
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
    fn resolve(&mut self, cgroups: &mut Cgroups, devices: &[crate::device::Device]) -> LateCgroups {
        let mut late = LateCgroups::default();
        if self.pending.is_empty() {
            return late;
        }
        cgroups.rescan();
        let pending = std::mem::take(&mut self.pending);
        for (id, tries) in pending {
            if let Some(path) = cgroups.path_of(id) {
                late.cgroups.push(RecordedCgroup {
                    id,
                    path: path.to_string(),
                });
                late.limits.extend(own_limits(cgroups, path, devices));
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
        devices: &[crate::device::Device],
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
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    if !args.ring_mib.is_power_of_two() {
        anyhow::bail!("--ring-mib {} must be a power of two", args.ring_mib);
    }
    let devices = live::resolve_devices(&args.devices)?;
    let mut cgroups = Cgroups::discover()?;
    // Fail on an unwritable or existing output before attaching anything.
    let probe_header = header("", &devices, &cgroups, &args.meter_unit);
    let mut session = kernel::Session::start(
        &devices,
        &kernel::Options {
            ring_bytes: args.ring_mib << 20,
            tier: args.tier,
            modes: Modes {
                aggregate: 0,
                emit: 1,
                ..Modes::default()
            },
            meter_units: aggregate::meter_units(&args.meter_unit),
            stats: false,
        },
    )?;
    let mut h = probe_header;
    h.tier = session.tier.kind.name().to_string();
    let writer = CaptureWriter::create_with(
        &args.output,
        &h,
        WriterOptions {
            overwrite: args.force,
            ..WriterOptions::default()
        },
    )?;
    for line in live::banner(&devices, &session, &cgroups) {
        eprintln!("mergetrace: {line}");
    }
    eprintln!("mergetrace: recording to {}", args.output.display());

    let ring = session.take_ring().context("ring buffer already taken")?;
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
        tokio::spawn(collector::run(ring, stop_rx, move |batch| {
            shared.lock().expect("recording lock").write(batch)
        }))
    };
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticker = tokio::time::interval(args.interval);
    ticker.tick().await;
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {
                let mut rec = shared.lock().expect("recording lock");
                rec.interval(session.new_losses(), &mut cgroups, &devices);
                if rec.failure.is_some() {
                    break;
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = until_deadline => break,
        }
    }
    // Detach, let the collector drain the ring, record the last losses.
    session.detach();
    let _ = stop_tx.send(true);
    collector.await.context("collector task failed")??;
    let mut rec = Arc::try_unwrap(shared)
        .map_err(|_| anyhow::anyhow!("collector still holds the capture"))?
        .into_inner()
        .expect("recording lock");
    rec.interval(session.new_losses(), &mut cgroups, &devices);
    let Recording {
        writer, failure, ..
    } = rec;
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
        "mergetrace: wrote {} events ({} lost) in {} bytes to {} ({:.1} bytes/event)",
        summary.events,
        summary.lost,
        summary.bytes,
        summary.path.display(),
        summary.bytes as f64 / summary.events.max(1) as f64
    );
    if summary.lost > 0 {
        eprintln!(
            "mergetrace: warning: {} events were lost (ring buffer full); try --ring-mib {}",
            summary.lost,
            args.ring_mib * 4
        );
    }
    Ok(())
}
