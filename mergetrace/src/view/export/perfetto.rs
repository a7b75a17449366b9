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
//! Times are µs since the capture's start (`ts`, `dur`), with ns precision.
use std::{collections::HashMap, io::Write, path::Path};

use anyhow::Result;
use mergetrace_common::{kind, vocab, Event};
use serde_json::{json, Value};

use crate::{
    capture::Header,
    fmt,
    offline::{
        lineage,
        names::{addr, maj_min, op_name, Names},
    },
};

/// Shortest bio slice drawn (a bio that joined in the same ns it was queued still shows).
const MIN_BIO_NS: u64 = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Role {
    Bios,
    Requests,
    Device,
}

/// A thread (track): (pid, cgroup, role, lane).
type TrackKey = (u32, u64, Role, usize);

/// Threads (tracks) → tid.
#[derive(Default)]
struct Tracks {
    tids: HashMap<TrackKey, u64>,
    /// Last slice end per (pid, cgroup, role) lane.
    lanes: HashMap<(u32, u64, Role), Vec<u64>>,
}

impl Tracks {
    fn tid(&mut self, key: TrackKey) -> u64 {
        let n = self.tids.len() as u64 + 1;
        *self.tids.entry(key).or_insert(n)
    }

    /// The first lane free before `start` (ends strictly earlier), taken until `end`.
    fn place(&mut self, pid: u32, cg: u64, role: Role, start: u64, end: u64) -> u64 {
        let lanes = self.lanes.entry((pid, cg, role)).or_default();
        let lane = match lanes.iter().position(|e| *e < start) {
            Some(i) => {
                lanes[i] = end;
                i
            }
            None => {
                lanes.push(end);
                lanes.len() - 1
            }
        };
        self.tid((pid, cg, role, lane))
    }
}

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
    let end_ts = events
        .iter()
        .map(|e| e.ts_ns)
        .max()
        .unwrap_or(h.start_monotonic_ns);
    // Devices: the header's, then any other seen.
    let mut pids: HashMap<u32, u32> = HashMap::new();
    let mut devs: Vec<u32> = Vec::new();
    for d in &h.devices {
        let dev = d.dev().0;
        if let std::collections::hash_map::Entry::Vacant(e) = pids.entry(dev) {
            devs.push(dev);
            e.insert(devs.len() as u32);
        }
    }
    for e in events {
        if let std::collections::hash_map::Entry::Vacant(v) = pids.entry(e.dev) {
            devs.push(e.dev);
            v.insert(devs.len() as u32);
        }
    }
    let mut tracks = Tracks::default();

    // Layout: every slice placed on a lane in start order.
    struct Slice {
        start: u64,
        end: u64,
        /// (request index, bio index) or (request index, usize::MAX) for a request.
        req: usize,
        bio: usize,
        tid: u64,
    }
    let mut slices: Vec<Slice> = Vec::new();
    for (ri, r) in lin.requests.iter().enumerate() {
        let start = r.insert_ts.unwrap_or(r.issue_ts);
        let end = r.complete_ts.unwrap_or(end_ts).max(r.issue_ts + 2);
        slices.push(Slice {
            start,
            end,
            req: ri,
            bio: usize::MAX,
            tid: 0,
        });
        for (bi, b) in r.bios.iter().enumerate() {
            let start = b.queue_ts.unwrap_or(b.join_ts).min(b.join_ts);
            slices.push(Slice {
                start,
                end: b.join_ts.max(start + MIN_BIO_NS),
                req: ri,
                bio: bi,
                tid: 0,
            });
        }
    }
    slices.sort_by_key(|s| (s.start, s.bio == usize::MAX));
    for s in slices.iter_mut() {
        let r = &lin.requests[s.req];
        let pid = pids[&r.dev];
        s.tid = if s.bio == usize::MAX {
            tracks.place(pid, r.cgroup_id, Role::Requests, s.start, s.end)
        } else {
            tracks.place(pid, r.bios[s.bio].cgroup_id, Role::Bios, s.start, s.end)
        };
    }
    // Where each placed bio's slice is: (bio address, join time) → (tid, midpoint).
    let mut bio_at: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    let mut rq_tid: Vec<u64> = vec![0; lin.requests.len()];
    for s in &slices {
        if s.bio == usize::MAX {
            rq_tid[s.req] = s.tid;
        } else {
            let b = &lin.requests[s.req].bios[s.bio];
            bio_at.insert((b.bio, b.join_ts), (s.tid, s.start + (s.end - s.start) / 2));
        }
    }
    let placed_queue: std::collections::HashSet<(u64, u64)> = lin
        .requests
        .iter()
        .flat_map(|r| r.bios.iter())
        .filter(|b| b.split_from.is_none())
        .filter_map(|b| b.queue_ts.map(|t| (b.bio, t)))
        .collect();
    // Tracks of instants that are not on a lane: lane 0 of the cgroup's bios, the device's.
    for e in events {
        let pid = pids[&e.dev];
        match e.kind {
            kind::BIO_QUEUE | kind::BACK_MERGE | kind::FRONT_MERGE => {
                tracks.tid((pid, e.cgroup_id, Role::Bios, 0));
            }
            kind::UNPLUG | kind::RQ_MERGE => {
                tracks.tid((pid, 0, Role::Device, 0));
            }
            _ => {}
        }
    }

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

    // Metadata: process and thread names and order.
    for (i, dev) in devs.iter().enumerate() {
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
    let mut threads: Vec<(&TrackKey, &u64)> = tracks.tids.iter().collect();
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

    // Requests, bios and the flows between them.
    let mut flows = 0u64;
    for s in &slices {
        let r = &lin.requests[s.req];
        let pid = pids[&r.dev];
        if s.bio != usize::MAX {
            let b = &r.bios[s.bio];
            out.ev(json!({
                "ph": "X", "cat": "bio", "name": format!("bio {}", fmt::size(b.bytes as u64)),
                "pid": pid, "tid": s.tid, "ts": us(names, s.start), "dur": dur_us(s.start, s.end),
                "args": {
                    "bio": addr(b.bio), "cgroup": names.cgroup(b.cgroup_id), "sector": b.sector,
                    "bytes": b.bytes, "joined": b.join.describe(),
                    "via_request_merge": b.via_request_merge,
                    "split_from": b.split_from.map(addr), "charged": b.charged,
                    "throttled": b.throttled, "throttle_wait_ns": b.throttle_wait_ns,
                    "queue_time_known": b.queue_ts.is_some(), "inferred": b.ambiguous,
                    "request": addr(r.rq),
                }
            }))?;
            continue;
        }
        if let Some(i) = r.insert_ts {
            out.ev(json!({
                "ph": "X", "cat": "request", "name": "queued (insert → issue)",
                "pid": pid, "tid": s.tid, "ts": us(names, i), "dur": dur_us(i, r.issue_ts),
                "args": {"rq": addr(r.rq)}
            }))?;
        }
        let end = r.complete_ts.unwrap_or(end_ts).max(r.issue_ts + 2);
        out.ev(json!({
            "ph": "X", "cat": "request",
            "name": format!("{} {} · {} bios", op_name(r.op), fmt::size(r.bytes as u64), r.bios.len()),
            "pid": pid, "tid": s.tid, "ts": us(names, r.issue_ts), "dur": dur_us(r.issue_ts, end),
            "args": {
                "rq": addr(r.rq), "cgroup": names.cgroup(r.cgroup_id), "sector": r.sector,
                "bytes": r.bytes, "bios_kernel_counted": r.bio_count, "bios_found": r.bios.len(),
                "match": r.matched.name(), "consistent": r.consistent(),
                "completed": r.complete_ts.is_some(), "requeues": r.requeues,
                "absorbed_requests": r.absorbed,
            }
        }))?;
        // Flow ends in the middle of the issue → complete slice.
        let f_ts = r.issue_ts + (end - r.issue_ts) / 2;
        for b in &r.bios {
            let Some((btid, b_mid)) = bio_at.get(&(b.bio, b.join_ts)).copied() else {
                continue;
            };
            flows += 1;
            out.ev(
                json!({"ph": "s", "cat": "lineage", "name": "bio → request", "id": flows,
                "pid": pid, "tid": btid, "ts": us(names, b_mid)}),
            )?;
            out.ev(
                json!({"ph": "f", "bp": "e", "cat": "lineage", "name": "bio → request",
                "id": flows, "pid": pid, "tid": s.tid, "ts": us(names, f_ts)}),
            )?;
        }
    }

    // Instants: merges, plug flushes, request merges, bios in no request of the capture.
    for e in events {
        let pid = pids[&e.dev];
        match e.kind {
            kind::BACK_MERGE | kind::FRONT_MERGE => {
                let tid = bio_at
                    .get(&(e.id, e.ts_ns))
                    .map(|x| x.0)
                    .unwrap_or_else(|| tracks.tid((pid, e.cgroup_id, Role::Bios, 0)));
                let how = if e.kind == kind::BACK_MERGE {
                    "back"
                } else {
                    "front"
                };
                out.ev(json!({"ph": "i", "s": "t", "cat": "merge",
                    "name": format!("{how} merge ({})", vocab::merge_path_name(e.path)),
                    "pid": pid, "tid": tid, "ts": us(names, e.ts_ns),
                    "args": {"bio": addr(e.id), "sector": e.sector, "bytes": e.bytes}}))?;
            }
            kind::BIO_QUEUE if !placed_queue.contains(&(e.id, e.ts_ns)) => {
                let tid = tracks.tid((pid, e.cgroup_id, Role::Bios, 0));
                out.ev(json!({"ph": "i", "s": "t", "cat": "bio",
                    "name": "bio queued (no request in the capture)",
                    "pid": pid, "tid": tid, "ts": us(names, e.ts_ns),
                    "args": {"bio": addr(e.id), "sector": e.sector, "bytes": e.bytes}}))?;
            }
            kind::UNPLUG => {
                let tid = tracks.tid((pid, 0, Role::Device, 0));
                let why = if e.flags & mergetrace_common::flags::UNPLUG_EXPLICIT != 0 {
                    "explicit"
                } else {
                    "from schedule"
                };
                out.ev(json!({"ph": "i", "s": "t", "cat": "plug",
                    "name": format!("plug flush: {} requests ({why})", e.aux),
                    "pid": pid, "tid": tid, "ts": us(names, e.ts_ns)}))?;
            }
            kind::RQ_MERGE => {
                let tid = tracks.tid((pid, 0, Role::Device, 0));
                out.ev(
                    json!({"ph": "i", "s": "t", "cat": "merge", "name": "request merge",
                    "pid": pid, "tid": tid, "ts": us(names, e.ts_ns),
                    "args": {"absorbed_rq": addr(e.id), "sector": e.sector, "bytes": e.bytes,
                             "cgroup": names.cgroup(e.cgroup_id)}}),
                )?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::synth::{Synth, START_NS};
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
        let a = s.open(DEV, 200, 4096, 4096);
        s.insert(&a);
        let b = s.open(DEV, 200, 8192, 4096);
        s.insert(&b);
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
