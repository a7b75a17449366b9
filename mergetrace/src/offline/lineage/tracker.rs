//! The replay: events in stream order, pending requests indexed by first bio, address and
//! range, and the issued requests with their bios.
use foldhash::HashMap;
use mergetrace_common::{flags, kind, rq_aux, Event};

use super::types::{BioLink, Join, Lineage, Match, Request, Stats};

/// What the tracker knows about a queued bio.
#[derive(Debug, Clone, Copy)]
struct Queued {
    ts: u64,
    throttled: bool,
    charged: bool,
    wait_ns: Option<u64>,
}

#[derive(Debug, Clone)]
struct Pending {
    dev: u32,
    op: u8,
    cgroup_id: u64,
    /// `[start, end)` in sectors.
    start: u64,
    end: u64,
    first_bio: u64,
    bios: Vec<BioLink>,
    getrq_ts: Option<u64>,
    insert_ts: Option<u64>,
    rq: Option<u64>,
    absorbed: u32,
    /// Last time it was touched (for "most recent" among ambiguous candidates).
    touched: u64,
}

/// An issued request awaiting completion.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    index: usize,
    requeued: bool,
}

/// Replays events and builds [`Request`]s. Feed every event in stream order with
/// [`Tracker::apply`], then take [`Tracker::finish`].
#[derive(Default)]
pub struct Tracker {
    queued: HashMap<u64, Queued>,
    /// Measured throttle waits of bios not queued yet (fentry `throttle_release`).
    waits: HashMap<u64, u64>,
    /// Split piece → (parent bio, what the parent's `bio_queue` said).
    pieces: HashMap<u64, (u64, Option<Queued>)>,
    slab: Vec<Option<Pending>>,
    free: Vec<usize>,
    by_first_bio: HashMap<u64, usize>,
    by_rq: HashMap<u64, usize>,
    by_start: HashMap<(u32, u64), Vec<usize>>,
    by_end: HashMap<(u32, u64), Vec<usize>>,
    in_flight: HashMap<u64, InFlight>,
    requests: Vec<Request>,
    /// Stop collecting new requests after this many (completions still arrive).
    limit: Option<usize>,
    clock: u64,
    stats: Stats,
}

fn sectors(bytes: u32) -> u64 {
    bytes as u64 / 512
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker::default()
    }

    /// Keep only the first `n` requests issued.
    pub fn with_limit(n: usize) -> Tracker {
        Tracker {
            limit: Some(n),
            ..Tracker::default()
        }
    }

    pub fn apply(&mut self, ev: &Event) {
        self.clock += 1;
        match ev.kind {
            kind::THROTTLE_RELEASE => {
                // A split remainder is throttled again after its bio_queue: add to it.
                if let Some(q) = self.queued.get_mut(&ev.id) {
                    q.wait_ns = Some(q.wait_ns.unwrap_or(0) + ev.aux64);
                } else {
                    self.waits.insert(ev.id, ev.aux64);
                }
            }
            kind::BIO_QUEUE => {
                let q = Queued {
                    ts: ev.ts_ns,
                    throttled: ev.flags & flags::THROTTLE_RELEASED != 0,
                    charged: ev.flags & (flags::RULES_IOPS | flags::RULES_BPS) != 0,
                    wait_ns: self.waits.remove(&ev.id),
                };
                self.queued.insert(ev.id, q);
                self.pieces.remove(&ev.id);
            }
            kind::SPLIT => {
                let parent = self.queued.get(&ev.aux64).copied().or_else(|| {
                    // The parent may itself be a piece of an earlier split.
                    self.pieces.get(&ev.aux64).and_then(|(_, q)| *q)
                });
                self.pieces.insert(ev.id, (ev.aux64, parent));
            }
            kind::GETRQ => self.getrq(ev),
            kind::BACK_MERGE | kind::FRONT_MERGE => self.bio_merge(ev),
            kind::RQ_INSERT => self.insert(ev),
            kind::RQ_MERGE => self.rq_merge(ev),
            kind::RQ_ISSUE => self.issue(ev),
            kind::RQ_REQUEUE => {
                if let Some(f) = self.in_flight.get_mut(&ev.id) {
                    f.requeued = true;
                    self.requests[f.index].requeues += 1;
                }
            }
            kind::RQ_COMPLETE => self.complete(ev),
            _ => {}
        }
    }

    /// The requests and how the reconstruction went.
    pub fn finish(mut self) -> Lineage {
        self.stats.never_issued += self.slab.iter().filter(|p| p.is_some()).count() as u64;
        self.stats.never_completed = self.in_flight.len() as u64;
        Lineage {
            requests: self.requests,
            stats: self.stats,
        }
    }

    /// The link for a bio joining a request now.
    fn link(&mut self, ev: &Event, join: Join) -> BioLink {
        let (split_from, q) = match self.queued.remove(&ev.id) {
            Some(q) => {
                self.pieces.remove(&ev.id);
                (None, Some(q))
            }
            None => match self.pieces.remove(&ev.id) {
                Some((parent, q)) => (Some(parent), q),
                None => (None, None),
            },
        };
        BioLink {
            bio: ev.id,
            split_from,
            cgroup_id: ev.cgroup_id,
            op: ev.op,
            sector: ev.sector,
            bytes: ev.bytes,
            queue_ts: q.map(|q| q.ts),
            join_ts: ev.ts_ns,
            join,
            throttled: q.is_some_and(|q| q.throttled),
            throttle_wait_ns: q.and_then(|q| q.wait_ns),
            charged: q.is_some_and(|q| q.charged),
            via_request_merge: false,
            ambiguous: false,
        }
    }

    fn index(&mut self, slot: usize) {
        let p = self.slab[slot].as_ref().expect("live slot");
        let (dev, start, end, first) = (p.dev, p.start, p.end, p.first_bio);
        self.by_start.entry((dev, start)).or_default().push(slot);
        self.by_end.entry((dev, end)).or_default().push(slot);
        if first != 0 {
            self.by_first_bio.insert(first, slot);
        }
        if let Some(rq) = p.rq {
            self.by_rq.insert(rq, slot);
        }
    }

    fn unindex(&mut self, slot: usize) {
        let p = self.slab[slot].as_ref().expect("live slot");
        let (dev, start, end, first, rq) = (p.dev, p.start, p.end, p.first_bio, p.rq);
        for (map, key) in [
            (&mut self.by_start, (dev, start)),
            (&mut self.by_end, (dev, end)),
        ] {
            if let Some(v) = map.get_mut(&key) {
                v.retain(|s| *s != slot);
                if v.is_empty() {
                    map.remove(&key);
                }
            }
        }
        if self.by_first_bio.get(&first) == Some(&slot) {
            self.by_first_bio.remove(&first);
        }
        if let Some(rq) = rq {
            if self.by_rq.get(&rq) == Some(&slot) {
                self.by_rq.remove(&rq);
            }
        }
    }

    fn remove(&mut self, slot: usize) -> Pending {
        self.unindex(slot);
        self.free.push(slot);
        self.slab[slot].take().expect("live slot")
    }

    fn add(&mut self, p: Pending) -> usize {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slab[s] = Some(p);
                s
            }
            None => {
                self.slab.push(Some(p));
                self.slab.len() - 1
            }
        };
        self.index(slot);
        slot
    }

    fn getrq(&mut self, ev: &Event) {
        // A request still pending with this bio first was never issued (a flush the flush
        // machinery finished itself, or lost events): drop it.
        if let Some(stale) = self.by_first_bio.get(&ev.id).copied() {
            self.remove(stale);
            self.stats.never_issued += 1;
        }
        let link = self.link(ev, Join::NewRequest);
        let p = Pending {
            dev: ev.dev,
            op: ev.op,
            cgroup_id: ev.cgroup_id,
            start: ev.sector,
            end: ev.sector + sectors(ev.bytes),
            first_bio: ev.id,
            bios: vec![link],
            getrq_ts: Some(ev.ts_ns),
            insert_ts: None,
            rq: None,
            absorbed: 0,
            touched: self.clock,
        };
        self.add(p);
    }

    /// Pending requests at `key` in `map` that a bio or request of `ev`'s op and cgroup could
    /// join, most recently touched first.
    fn candidates(
        &self,
        back: bool,
        key: (u32, u64),
        ev: &Event,
        except: Option<usize>,
    ) -> Vec<usize> {
        let map = if back { &self.by_end } else { &self.by_start };
        let mut c: Vec<usize> = map
            .get(&key)
            .into_iter()
            .flatten()
            .copied()
            .filter(|s| Some(*s) != except)
            .filter(|s| {
                let p = self.slab[*s].as_ref().expect("indexed slot is live");
                p.op == ev.op && p.cgroup_id == ev.cgroup_id
            })
            .collect();
        c.sort_by_key(|s| std::cmp::Reverse(self.slab[*s].as_ref().map_or(0, |p| p.touched)));
        c
    }

    fn bio_merge(&mut self, ev: &Event) {
        let back = ev.kind == kind::BACK_MERGE;
        let key = if back {
            (ev.dev, ev.sector)
        } else {
            (ev.dev, ev.sector + sectors(ev.bytes))
        };
        let cands = self.candidates(back, key, ev, None);
        let Some(&slot) = cands.first() else {
            self.stats.orphan_merges += 1;
            // Forget it: it is in a request we do not know.
            self.queued.remove(&ev.id);
            self.pieces.remove(&ev.id);
            return;
        };
        let join = if back {
            Join::BackMerge(ev.path)
        } else {
            Join::FrontMerge(ev.path)
        };
        let mut link = self.link(ev, join);
        link.ambiguous = cands.len() > 1;
        self.unindex(slot);
        let clock = self.clock;
        let p = self.slab[slot].as_mut().expect("live slot");
        if back {
            p.end += sectors(ev.bytes);
            p.bios.push(link);
        } else {
            p.start = ev.sector;
            p.first_bio = ev.id;
            p.bios.insert(0, link);
        }
        p.touched = clock;
        self.index(slot);
    }

    /// The pending request that is request `ev` (insert, merge, issue): by its address if an
    /// insert bound it, else by its first bio, else by its exact range. With how it matched.
    fn find(&self, ev: &Event) -> Option<(usize, Match)> {
        let end = ev.sector + sectors(ev.bytes);
        // The same op too: a flush-only write (a 0-byte write bio at sector 0, which never
        // becomes a write request) must not be taken for the flush request that follows it.
        let fits = |s: usize| {
            let p = self.slab[s].as_ref().expect("indexed slot is live");
            p.dev == ev.dev && p.start == ev.sector && p.end == end && p.op == ev.op
        };
        let by_bio = (ev.aux64 != 0)
            .then(|| self.by_first_bio.get(&ev.aux64).copied())
            .flatten();
        if let Some(s) = self.by_rq.get(&ev.id).copied() {
            let first_ok = self.slab[s]
                .as_ref()
                .is_some_and(|p| p.first_bio == ev.aux64);
            if fits(s) && first_ok {
                return Some((s, Match::Exact));
            }
            if by_bio.is_none() {
                return Some((
                    s,
                    if fits(s) {
                        Match::Range
                    } else {
                        Match::FirstBio
                    },
                ));
            }
        }
        if let Some(s) = by_bio {
            return Some((
                s,
                if fits(s) {
                    Match::Exact
                } else {
                    Match::FirstBio
                },
            ));
        }
        let by_range = self
            .by_start
            .get(&(ev.dev, ev.sector))
            .into_iter()
            .flatten()
            .copied()
            .filter(|s| fits(*s))
            .max_by_key(|s| self.slab[*s].as_ref().map_or(0, |p| p.touched));
        by_range.map(|s| (s, Match::Range))
    }

    fn insert(&mut self, ev: &Event) {
        if self.in_flight.get(&ev.id).is_some_and(|f| f.requeued) {
            return; // a requeued request going back in
        }
        if let Some((slot, _)) = self.find(ev) {
            self.unindex(slot);
            let p = self.slab[slot].as_mut().expect("live slot");
            p.rq = Some(ev.id);
            p.insert_ts = Some(ev.ts_ns);
            p.touched = self.clock;
            self.index(slot);
        }
    }

    fn rq_merge(&mut self, ev: &Event) {
        let Some((next, _)) = self.find(ev) else {
            self.stats.orphan_merges += 1;
            return;
        };
        let cands = self.candidates(true, (ev.dev, ev.sector), ev, Some(next));
        let Some(&survivor) = cands.first() else {
            // We do not know the request it went into: its bios are lost to us.
            self.remove(next);
            self.stats.orphan_merges += 1;
            return;
        };
        let absorbed = self.remove(next);
        self.unindex(survivor);
        let clock = self.clock;
        let p = self.slab[survivor].as_mut().expect("live slot");
        p.end = absorbed.end;
        p.absorbed += 1 + absorbed.absorbed;
        p.touched = clock;
        let ambiguous = cands.len() > 1;
        p.bios.extend(absorbed.bios.into_iter().map(|mut b| {
            b.via_request_merge = true;
            b.ambiguous |= ambiguous;
            b
        }));
        self.index(survivor);
    }

    fn issue(&mut self, ev: &Event) {
        if let Some(f) = self.in_flight.get(&ev.id).copied() {
            if f.requeued {
                self.in_flight.insert(
                    ev.id,
                    InFlight {
                        index: f.index,
                        requeued: false,
                    },
                );
                return;
            }
            // Issued again without a requeue: its completion was never seen. A new request.
            self.in_flight.remove(&ev.id);
            self.stats.completions_unseen += 1;
        }
        let found = self.find(ev);
        let pending = found.map(|(slot, m)| (self.remove(slot), m));
        self.stats.requests += 1;
        let m = match &pending {
            Some((_, m)) => *m,
            None if rq_aux::chain(ev.aux) == 0 && ev.bytes == 0 => Match::NoBios,
            None => Match::Unmatched,
        };
        *self.stats.matched.entry(m.name()).or_default() += 1;
        let (bios, getrq_ts, insert_ts, absorbed) = match pending {
            Some((p, _)) => (p.bios, p.getrq_ts, p.insert_ts, p.absorbed),
            None => (Vec::new(), None, None, 0),
        };
        for b in &bios {
            self.stats.bios += 1;
            self.stats.split_pieces += b.split_from.is_some() as u64;
            self.stats.ambiguous += b.ambiguous as u64;
            self.stats.without_queue += b.queue_ts.is_none() as u64;
        }
        let r = Request {
            rq: ev.id,
            dev: ev.dev,
            cgroup_id: ev.cgroup_id,
            op: ev.op,
            sector: ev.sector,
            bytes: ev.bytes,
            first_bio: ev.aux64,
            bio_count: rq_aux::chain(ev.aux),
            getrq_ts,
            insert_ts,
            issue_ts: ev.ts_ns,
            complete_ts: None,
            completed_bytes: 0,
            status: 0,
            requeues: 0,
            absorbed,
            bios,
            matched: m,
        };
        if r.consistent() {
            self.stats.consistent += 1;
        }
        if self.limit.is_some_and(|n| self.requests.len() >= n) {
            return; // past the limit: counted, not kept
        }
        self.in_flight.insert(
            ev.id,
            InFlight {
                index: self.requests.len(),
                requeued: false,
            },
        );
        self.requests.push(r);
    }

    fn complete(&mut self, ev: &Event) {
        let Some(f) = self.in_flight.get(&ev.id).copied() else {
            return;
        };
        let r = &mut self.requests[f.index];
        r.completed_bytes += ev.aux as u64;
        r.status = ev.path;
        if r.completed_bytes >= r.bytes as u64 || ev.aux == 0 {
            r.complete_ts = Some(ev.ts_ns);
            self.in_flight.remove(&ev.id);
        }
    }
}
