//! `mergetrace report run.mtr`: a capture read back through the same aggregator and snapshot
//! code as the live view, so the same run gives the same numbers.
use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use clap::Args;
use mergetrace_common::Event;

use crate::{
    aggregate::{Aggregator, Window},
    capture::{CaptureReader, Header, HeaderLookup, Next},
    cli::parse_duration,
    device::Device,
    snapshot::{self, Snapshot, SnapshotKind},
    view::{json::JsonView, text::TextView, View},
};

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A capture written by `mergetrace record`.
    pub file: PathBuf,
    /// Print JSON (the live view's "total" object) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only this cgroup and its descendants (path relative to the cgroup mount).
    #[arg(short = 'c', long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Only events from this long after the start of the capture (e.g. 5s).
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub from: Option<Duration>,
    /// Only events up to this long after the start of the capture.
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub to: Option<Duration>,
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
    let header = reader.header().clone();
    let start = header.start_monotonic_ns;
    let lo = start + from.map_or(0, |d| d.as_nanos() as u64);
    let hi = to.map_or(u64::MAX, |d| start + d.as_nanos() as u64);
    let mut agg = Aggregator::with_meter_units(lo, &header.meter_units);
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
        header,
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

pub fn run(args: &ReportArgs) -> Result<()> {
    let loaded = load(&args.file, args.from, args.to, |_| {})?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let subtree = args.cgroup.as_deref().map(|c| {
        let c = format!("/{}", c.trim_start_matches('/'));
        if c.len() > 1 {
            c.trim_end_matches('/').to_string()
        } else {
            c
        }
    });
    let s = snapshot(&loaded, subtree.as_deref());
    if args.json {
        JsonView::new(std::io::stdout()).total(&s)
    } else {
        let h = &loaded.header;
        println!(
            "capture {}: kernel {}, {} tier, mergetrace {}",
            args.file.display(),
            h.kernel_release,
            h.tier,
            h.mergetrace_version
        );
        TextView::new(std::io::stdout()).total(&s)
    }
}
