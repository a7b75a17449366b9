//! `--format perfetto`: Chrome trace-event JSON (the "JSON Object Format"), which
//! ui.perfetto.dev and chrome://tracing open. Structure (docs/export.md has the details):
//!
//! - one process per device (`pid` = its position in the capture's header, from 1);
//! - per cgroup, "CGROUP · bios" threads: each bio a complete ("X") slice from its queue time
//!   (`bio_queue`) to the moment it joined a request (getrq or merge), and each merge an
//!   instant ("i") at that moment; "CGROUP · requests" threads: each request an "X" slice
//!   "queued" from insert to issue (when it was inserted) and an "X" slice from issue to
//!   completion. Slices that overlap in time go to further threads of the same name
//!   ("… #2"), because a thread's slices must nest;
//! - per device a "block layer" thread with plug flushes and request merges as instants;
//! - flows ("s" → "f", `bp: "e"`, one id per bio) from each bio's slice to the slice of the
//!   request that carried it, from [`crate::offline::lineage`].
//!
//! Times are µs since the capture's start (`ts`, `dur`), with ns precision. [`layout`] places
//! the tracks; [`bios`], [`requests`] and [`device`] write each kind of track.
mod bios;
mod device;
mod layout;
mod requests;

use std::{io::Write, path::Path};

use anyhow::Result;
use mergetrace_common::{kind, Event};
use serde_json::{json, Value};

use crate::{
    capture::Header,
    offline::{
        lineage,
        names::{maj_min, Names},
    },
};
use layout::{Layout, Role, TrackKey};

/// What was written.
pub struct Written {
    pub trace_events: u64,
    pub flows: u64,
}

fn us(names: &Names, ts: u64) -> f64 {
    names.rel_ns(ts) as f64 / 1000.0
}

fn dur_us(a: u64, b: u64) -> f64 {
    b.saturating_sub(a) as f64 / 1000.0
}

/// The trace events array, written one event at a time.
struct Out<'a> {
    w: &'a mut dyn Write,
    n: u64,
}

impl Out<'_> {
    fn ev(&mut self, v: Value) -> Result<()> {
        if self.n > 0 {
            self.w.write_all(b",\n")?;
        }
        serde_json::to_writer(&mut *self.w, &v)?;
        self.n += 1;
        Ok(())
    }
}

pub fn write(
    w: &mut dyn Write,
    events: &[Event],
    h: &Header,
    capture: &Path,
    names: &mut Names,
) -> Result<Written> {
    let lin = lineage::trace(events, None);
    let mut layout = Layout::new(events, h, &lin);
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"otherData\":")?;
    serde_json::to_writer(
        &mut *w,
        &json!({
            "generator": format!("mergetrace {}", env!("CARGO_PKG_VERSION")),
            "capture": capture.display().to_string(),
            "kernel": h.kernel_release,
            "tier": h.tier,
            "start_monotonic_ns": h.start_monotonic_ns,
            "time": "ts and dur are microseconds since the capture's start",
        }),
    )?;
    w.write_all(b",\"traceEvents\":[\n")?;
    let mut out = Out { w, n: 0 };
    metadata(&mut out, &layout, names)?;
    // Requests, bios and the flows between them, in start order.
    let mut flows = 0u64;
    for s in &layout.slices {
        let r = &lin.requests[s.req];
        match s.bio {
            Some(bi) => bios::slice(&mut out, layout.pids[&r.dev], s, r, &r.bios[bi], names)?,
            None => flows = requests::slices(&mut out, &layout, s, r, names, flows)?,
        }
    }
    // Instants, in stream order.
    for e in events {
        match e.kind {
            kind::BACK_MERGE | kind::FRONT_MERGE => bios::merge(&mut out, &mut layout, e, names)?,
            kind::BIO_QUEUE if !layout.placed_queue.contains(&(e.id, e.ts_ns)) => {
                bios::queued_alone(&mut out, layout.instant(e, Role::Bios), e, names)?
            }
            kind::UNPLUG => {
                device::plug_flush(&mut out, layout.instant(e, Role::Device), e, names)?
            }
            kind::RQ_MERGE => {
                device::request_merge(&mut out, layout.instant(e, Role::Device), e, names)?
            }
            _ => {}
        }
    }
    let n = out.n;
    out.w.write_all(b"\n]}\n")?;
    Ok(Written {
        trace_events: n,
        flows,
    })
}

/// Process and thread names and their order: devices as in the header, then per device its
/// cgroups' bios and requests tracks (by path), then its block layer track.
fn metadata(out: &mut Out, layout: &Layout, names: &mut Names) -> Result<()> {
    for (i, dev) in layout.devs.iter().enumerate() {
        let pid = i as u32 + 1;
        out.ev(
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": format!("{} ({})", names.device(*dev), maj_min(*dev))}}),
        )?;
        out.ev(
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
            "args": {"sort_index": pid}}),
        )?;
    }
    let mut threads: Vec<(&TrackKey, &u64)> = layout.tracks.tids.iter().collect();
    threads.sort_by_key(|((pid, cg, role, lane), _)| {
        (
            *pid,
            *role == Role::Device,
            names.cgroup(*cg).to_string(),
            *cg,
            *role,
            *lane,
        )
    });
    for (order, ((pid, cg, role, lane), tid)) in threads.into_iter().enumerate() {
        let base = match role {
            Role::Device => "block layer: plug flushes, request merges".to_string(),
            Role::Bios => format!("{} · bios", names.cgroup(*cg)),
            Role::Requests => format!("{} · requests", names.cgroup(*cg)),
        };
        let name = if *lane == 0 {
            base
        } else {
            format!("{base} #{}", lane + 1)
        };
        out.ev(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
            "args": {"name": name}}),
        )?;
        out.ev(
            json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
            "args": {"sort_index": order}}),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::synth::{Synth, START_NS};
    use mergetrace_common::path;
    use std::collections::BTreeMap;

    const DEV: u32 = 7 << 20 | 2;

    fn header() -> Header {
        Header {
            start_monotonic_ns: START_NS,
            devices: vec![crate::capture::RecordedDevice {
                name: "loop2".into(),
                major: 7,
                minor: 2,
                ..Default::default()
            }],
            ..Header::default()
        }
    }

    fn export(s: &Synth) -> Value {
        let h = header();
        let mut buf = Vec::new();
        write(
            &mut buf,
            &s.events,
            &h,
            Path::new("t.mtr"),
            &mut Names::new(&h),
        )
        .unwrap();
        serde_json::from_slice(&buf).unwrap()
    }

    #[test]
    fn export_perfetto_has_processes_threads_slices_and_paired_flows() {
        let mut s = Synth::new();
        s.batch(DEV, 100, 0, 4, 4096, false, path::PLUG);
        // two requests in flight at once: the second needs another request lane
        let mut a = s.open(DEV, 200, 4096, 4096);
        s.insert(&mut a);
        let mut b = s.open(DEV, 200, 8192, 4096);
        s.insert(&mut b);
        let ra = s.issue(&a);
        let rb = s.issue(&b);
        s.complete_rq(&a, ra);
        s.complete_rq(&b, rb);
        let v = export(&s);
        let evs = v["traceEvents"].as_array().unwrap();
        assert_eq!(v["displayTimeUnit"], "ns");
        fn phase<'a>(evs: &'a [Value], ph: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
            evs.iter().filter(move |e| e["ph"] == ph)
        }
        let of = |ph: &'static str| phase(evs, ph);
        let proc_names: Vec<&str> = of("M")
            .filter(|e| e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(proc_names, ["loop2 (7:2)"]);
        let threads: Vec<String> = of("M")
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap().to_string())
            .collect();
        for t in [
            "(unknown cgroup id 100) · bios",
            "(unknown cgroup id 100) · requests",
            "(unknown cgroup id 200) · requests #2",
            "block layer: plug flushes, request merges",
        ] {
            assert!(threads.iter().any(|x| x == t), "{t} not in {threads:?}");
        }
        let bios = of("X").filter(|e| e["cat"] == "bio").count();
        assert_eq!(bios, 6);
        let requests = of("X")
            .filter(|e| e["cat"] == "request" && e["args"]["match"].is_string())
            .count();
        assert_eq!(requests, 3);
        assert_eq!(
            of("X")
                .filter(|e| e["name"] == "queued (insert → issue)")
                .count(),
            2
        );
        assert_eq!(of("i").filter(|e| e["cat"] == "merge").count(), 3);
        // every flow id: one start on a bio's thread, one end (bp=e) on a request's thread
        let mut ids: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        for e in evs {
            match e["ph"].as_str() {
                Some("s") => ids.entry(e["id"].as_u64().unwrap()).or_default().0 += 1,
                Some("f") => {
                    assert_eq!(e["bp"], "e");
                    ids.entry(e["id"].as_u64().unwrap()).or_default().1 += 1
                }
                _ => {}
            }
        }
        assert_eq!(ids.len(), 6);
        assert!(ids.values().all(|c| *c == (1, 1)));
        // slices on one thread never overlap (they must nest for the trace viewers)
        let mut by_tid: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
        for e in of("X") {
            let ts = e["ts"].as_f64().unwrap();
            by_tid
                .entry(e["tid"].as_u64().unwrap())
                .or_default()
                .push((ts, ts + e["dur"].as_f64().unwrap()));
        }
        for v in by_tid.values_mut() {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            for w in v.windows(2) {
                assert!(w[0].1 <= w[1].0 + 1e-9, "{w:?}");
            }
        }
        // flow starts fall inside their bio slice, ends inside their request slice
        for e in of("s").chain(of("f")) {
            let (tid, ts) = (e["tid"].as_u64().unwrap(), e["ts"].as_f64().unwrap());
            assert!(
                by_tid[&tid].iter().any(|(a, b)| *a < ts && ts < *b),
                "flow at {ts} on {tid} outside a slice"
            );
        }
    }
}
