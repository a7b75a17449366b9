//! A capture read back: every event counted by the same aggregator as the live view, and the
//! totals as the live view's snapshot, so the same run gives the same numbers. Used by
//! `report` and `export`.
use std::{path::PathBuf, time::Duration};

use anyhow::Result;
use mergetrace_common::Event;

use crate::{
    capture::{CaptureReader, Header, HeaderLookup, Next},
    model::{
        aggregate::{Aggregator, Window},
        iocost,
        snapshot::{self, Snapshot},
        timeline::{self, Cuts},
    },
    sys::device::Device,
};

/// The length of the intervals a capture's run is judged over, as the live view's default.
pub const JUDGED_EVERY_NS: u64 = 1_000_000_000;

/// A capture read into one window, with what the reader had to say.
pub struct Loaded {
    pub header: Header,
    pub window: Window,
    /// The same counts cut every [`JUDGED_EVERY_NS`] of the capture's time: the whole run's
    /// verdict is judged over them, as the live view's is over its intervals.
    pub intervals: Vec<Window>,
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
    let mut cuts = Cuts::new(&agg, lo, JUDGED_EVERY_NS);
    while let Some(next) = reader.next_into(&mut buf)? {
        match next {
            Next::Events => {
                for ev in buf.iter().filter(|e| e.ts_ns >= lo && e.ts_ns < hi) {
                    cuts.up_to(&agg, ev.ts_ns);
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
        intervals: cuts.finish(&agg, end),
        warning,
    })
}

/// The totals of a loaded capture as the live view's "total" snapshot.
pub fn snapshot(loaded: &Loaded, subtree: Option<&str>) -> Snapshot {
    let h = &loaded.header;
    let iocost = iocost_models(h);
    let wbt = wbt_settings(h);
    let iolatency = iolatency_targets(h);
    let opts = snapshot::Options {
        tier: &h.tier,
        fentry: h.tier == "fentry",
        meter_units: &h.meter_units,
        subtree,
        iocost: &iocost,
        wbt: &wbt,
        // A full capture has every program's events; `record --requests` the request ones.
        wants: if h.requests_only {
            crate::kernel::Wants {
                plug_flushes: !h.no_plug_flushes,
                ..Default::default()
            }
        } else {
            // Latency histograms: `report --latency` replays the requests for them.
            crate::kernel::Wants {
                latency: !loaded.window.latency.is_empty(),
                ..crate::kernel::Wants::ALL
            }
        },
        per_bio: !h.per_request,
        iolatency: &iolatency,
        timeline: None,
    };
    let devices: Vec<Device> = h.devices.iter().map(Device::from).collect();
    let mut lookup = HeaderLookup::new(h);
    timeline::judged(
        &loaded.intervals,
        &loaded.window,
        &devices,
        &mut lookup,
        &opts,
    )
    .1
}

/// io.cost's model of each recorded disk that had it on, by `dev_t`.
pub fn iocost_models(h: &Header) -> std::collections::BTreeMap<u32, iocost::Model> {
    h.devices
        .iter()
        .filter_map(|d| {
            let c = d.iocost.as_ref()?;
            let model = iocost::Model {
                read: iocost::Coefs::of(c.read),
                write: iocost::Coefs::of(c.write),
            };
            Some((Device::from(d).dev().0, model))
        })
        .collect()
}

/// wbt on each recorded disk whose queue had it, by `dev_t`.
pub fn wbt_settings(h: &Header) -> std::collections::BTreeMap<u32, crate::sys::wbt::Wbt> {
    h.devices
        .iter()
        .filter_map(|d| Some((Device::from(d).dev().0, d.wbt?)))
        .collect()
}

/// io.latency's targets on each recorded disk that had any, by `dev_t`.
pub fn iolatency_targets(
    h: &Header,
) -> std::collections::BTreeMap<u32, crate::sys::iolatency::IoLatency> {
    h.devices
        .iter()
        .filter_map(|d| Some((Device::from(d).dev().0, d.iolatency.clone()?)))
        .collect()
}

/// The header of a capture (to set up what reads its events).
pub fn header_of(path: &PathBuf) -> Result<Header> {
    Ok(CaptureReader::open(path)?.header().clone())
}
