//! Where everything goes: a process per device, and threads (tracks) per cgroup and role,
//! with overlapping slices spread over lanes ("… #2") because a thread's slices must nest.
use std::collections::{hash_map::Entry, HashMap, HashSet};

use mergetrace_common::{kind, Event};

use crate::{capture::Header, offline::lineage::Lineage};

/// Shortest bio slice drawn (a bio that joined in the same ns it was queued still shows).
const MIN_BIO_NS: u64 = 1000;

/// The kind of a track.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Role {
    Bios,
    Requests,
    Device,
}

/// A thread (track): (pid, cgroup, role, lane).
pub(super) type TrackKey = (u32, u64, Role, usize);

/// Where an event is drawn: its device's process and a thread of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Track {
    pub(super) pid: u32,
    pub(super) tid: u64,
}

/// Threads (tracks) → tid, numbered in the order they are first used.
#[derive(Default)]
pub(super) struct Tracks {
    pub(super) tids: HashMap<TrackKey, u64>,
    /// Last slice end per (pid, cgroup, role) lane.
    lanes: HashMap<(u32, u64, Role), Vec<u64>>,
}

impl Tracks {
    pub(super) fn tid(&mut self, key: TrackKey) -> u64 {
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

/// A request's slice (`bio` is `None`) or one of its bios' slices, placed on a thread.
pub(super) struct Slice {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) req: usize,
    pub(super) bio: Option<usize>,
    pub(super) tid: u64,
}

pub(super) struct Layout {
    /// Device (as events carry it) → pid, in pid order in `devs`.
    pub(super) pids: HashMap<u32, u32>,
    pub(super) devs: Vec<u32>,
    pub(super) tracks: Tracks,
    /// Every slice, in start order (a bio before the request starting with it).
    pub(super) slices: Vec<Slice>,
    /// Where each placed bio's slice is: (bio address, join time) → (tid, midpoint).
    pub(super) bio_at: HashMap<(u64, u64), (u64, u64)>,
    /// `bio_queue` events a bio slice starts at: (bio address, queue time).
    pub(super) placed_queue: HashSet<(u64, u64)>,
    /// The last event's time: where requests never completed end.
    pub(super) end_ts: u64,
}

impl Layout {
    pub(super) fn new(events: &[Event], h: &Header, lin: &Lineage) -> Layout {
        let end_ts = events
            .iter()
            .map(|e| e.ts_ns)
            .max()
            .unwrap_or(h.start_monotonic_ns);
        let (pids, devs) = processes(events, h);
        let mut l = Layout {
            pids,
            devs,
            tracks: Tracks::default(),
            slices: slices(lin, end_ts),
            bio_at: HashMap::new(),
            placed_queue: HashSet::new(),
            end_ts,
        };
        l.place(lin);
        l.placed_queue = lin
            .requests
            .iter()
            .flat_map(|r| r.bios.iter())
            .filter(|b| b.split_from.is_none())
            .filter_map(|b| b.queue_ts.map(|t| (b.bio, t)))
            .collect();
        // Number the tracks of instants that are not on a lane now, after the slices' tracks.
        for e in events {
            match e.kind {
                kind::BIO_QUEUE | kind::BACK_MERGE | kind::FRONT_MERGE => {
                    l.instant(e, Role::Bios);
                }
                kind::UNPLUG | kind::RQ_MERGE => {
                    l.instant(e, Role::Device);
                }
                _ => {}
            }
        }
        l
    }

    /// Where an instant of `e` that is not on a lane goes: lane 0 of its cgroup's bios track
    /// (`Role::Bios`), or its device's block layer track (`Role::Device`).
    pub(super) fn instant(&mut self, e: &Event, role: Role) -> Track {
        let pid = self.pids[&e.dev];
        let cgroup = if role == Role::Device { 0 } else { e.cgroup_id };
        Track {
            pid,
            tid: self.tracks.tid((pid, cgroup, role, 0)),
        }
    }

    /// Every slice on a lane, in start order.
    fn place(&mut self, lin: &Lineage) {
        for s in self.slices.iter_mut() {
            let r = &lin.requests[s.req];
            let pid = self.pids[&r.dev];
            s.tid = match s.bio {
                None => self
                    .tracks
                    .place(pid, r.cgroup_id, Role::Requests, s.start, s.end),
                Some(bi) => {
                    let b = &r.bios[bi];
                    let tid = self
                        .tracks
                        .place(pid, b.cgroup_id, Role::Bios, s.start, s.end);
                    self.bio_at
                        .insert((b.bio, b.join_ts), (tid, s.start + (s.end - s.start) / 2));
                    tid
                }
            };
        }
    }
}

/// Devices: the header's, then any other seen, numbered from 1.
fn processes(events: &[Event], h: &Header) -> (HashMap<u32, u32>, Vec<u32>) {
    let mut pids: HashMap<u32, u32> = HashMap::new();
    let mut devs: Vec<u32> = Vec::new();
    for dev in h
        .devices
        .iter()
        .map(|d| d.dev().0)
        .chain(events.iter().map(|e| e.dev))
    {
        if let Entry::Vacant(e) = pids.entry(dev) {
            devs.push(dev);
            e.insert(devs.len() as u32);
        }
    }
    (pids, devs)
}

/// Each request from insert (or issue) to completion, each bio from its queue time to when it
/// joined; sorted by start.
fn slices(lin: &Lineage, end_ts: u64) -> Vec<Slice> {
    let mut slices = Vec::new();
    for (ri, r) in lin.requests.iter().enumerate() {
        slices.push(Slice {
            start: r.insert_ts.unwrap_or(r.issue_ts),
            end: r.complete_ts.unwrap_or(end_ts).max(r.issue_ts + 2),
            req: ri,
            bio: None,
            tid: 0,
        });
        for (bi, b) in r.bios.iter().enumerate() {
            let start = b.queue_ts.unwrap_or(b.join_ts).min(b.join_ts);
            slices.push(Slice {
                start,
                end: b.join_ts.max(start + MIN_BIO_NS),
                req: ri,
                bio: Some(bi),
                tid: 0,
            });
        }
    }
    slices.sort_by_key(|s| (s.start, s.bio.is_none()));
    slices
}
