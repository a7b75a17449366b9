//! Lineage: which bios ended in each request the device saw (`report --lineage`, and the
//! flows of `export --format perfetto`).
//!
//! The capture has no event that says "bio B is in request R"; the kernel only reports each
//! step. The tracker replays the steps in stream order (the ring buffer's order, which is
//! causal) and keeps the requests being built:
//!
//! - `getrq` (bio B) starts a pending request on B's device covering `[sector, sector+bytes)`,
//!   with B as its first bio;
//! - `back_merge` (bio B) extends the pending request of the same device, op and cgroup whose
//!   end is B's sector; `front_merge` the one whose start is B's end (B becomes its first
//!   bio). The kernel never merges across cgroups (`blk_cgroup_mergeable`) or ops;
//! - `rq_merge` (request N absorbed) appends N's bios to the pending request that ends where N
//!   starts (`attempt_merge` only merges `req` with the `next` that follows it);
//! - `rq_insert` binds a request address to its pending request (first bio = `aux64`);
//! - `rq_issue` (request R, first bio `aux64`, `aux` bios chained) takes the pending request
//!   whose first bio is R's first bio and checks that its range equals R's; failing that, the
//!   one with R's exact range. The kernel counted R's bios itself (`aux`), so every request
//!   says whether the reconstruction agrees: same number of bios, same bytes.
//!
//! Bios get their queue time, throttling and cgroup from their `bio_queue` event (by
//! address; a bio address is unique while the bio is in flight). A split piece has no
//! `bio_queue` of its own: it inherits its parent's (`split.aux64`), and says so.
//!
//! What is exact and what is inferred is in [`Match`] and [`BioLink::ambiguous`]; see
//! docs/report.md.
use std::collections::BTreeMap;

use foldhash::HashMap;

use mergetrace_common::{
    flags, kind,
    vocab::{merge_path_name, Dev},
    Event,
};

use super::names::{addr, dir_name, op_name, Names};
use crate::fmt;

/// How a bio joined its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// `block_getrq`: the bio started a new request.
    NewRequest,
    /// `block_bio_backmerge` on a merge path ([`mergetrace_common::path`]).
    BackMerge(u8),
    /// `block_bio_frontmerge`.
    FrontMerge(u8),
}

impl Join {
    pub fn name(self) -> &'static str {
        match self {
            Join::NewRequest => "new_request",
            Join::BackMerge(_) => "back_merge",
            Join::FrontMerge(_) => "front_merge",
        }
    }

    pub fn merge_path(self) -> Option<u8> {
        match self {
            Join::NewRequest => None,
            Join::BackMerge(p) | Join::FrontMerge(p) => Some(p),
        }
    }

    /// "new request", "back merge (plug)", ...
    pub fn describe(self) -> String {
        match self {
            Join::NewRequest => "new request".into(),
            Join::BackMerge(p) => format!("back merge ({})", merge_path_name(p)),
            Join::FrontMerge(p) => format!("front merge ({})", merge_path_name(p)),
        }
    }
}

/// One bio (or split piece) in a request, in the request's chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BioLink {
    /// Kernel address of the bio as it joined (a split piece's own address).
    pub bio: u64,
    /// A split piece: the address of the bio it was split from (the remainder, which carries
    /// the original `bio_queue`).
    pub split_from: Option<u64>,
    pub cgroup_id: u64,
    pub op: u8,
    /// Start sector and bytes of what joined the request.
    pub sector: u64,
    pub bytes: u32,
    /// `bio_queue` time of the bio (of its parent, for a split piece); `None` when the capture
    /// has no `bio_queue` for it (queued before the capture started, or lost).
    pub queue_ts: Option<u64>,
    /// When it joined the request (the getrq or merge event).
    pub join_ts: u64,
    pub join: Join,
    /// blk-throttle queued it and released it later (`flags::THROTTLE_RELEASED`).
    pub throttled: bool,
    /// fentry tier: the time it waited in blk-throttle, measured (`throttle_release`).
    pub throttle_wait_ns: Option<u64>,
    /// Its cgroup had a blk-throttle rule for the direction: it was charged.
    pub charged: bool,
    /// It came into this request with a request that was merged into it (`rq_merge`).
    pub via_request_merge: bool,
    /// More than one pending request could have taken it (same device, op, cgroup and
    /// adjacent range): the most recently used one was chosen. Inferred, not exact.
    pub ambiguous: bool,
}

/// How a dispatched request was matched to the request the tracker built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// Its first bio (`aux64`) is the first bio of a pending request with exactly its range.
    Exact,
    /// A pending request with exactly its device and range, but another first bio (events
    /// were lost, or a merge was attributed to the wrong request).
    Range,
    /// The pending request with its first bio, but a different range.
    FirstBio,
    /// A request without data (a flush): no bios to find.
    NoBios,
    /// Nothing was pending for it: it was built before the capture started, or its events
    /// were lost. Its bios are unknown.
    Unmatched,
}

impl Match {
    pub fn name(self) -> &'static str {
        match self {
            Match::Exact => "exact",
            Match::Range => "range",
            Match::FirstBio => "first_bio",
            Match::NoBios => "no_bios",
            Match::Unmatched => "unmatched",
        }
    }
}

/// A request as the device saw it, with the bios that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Kernel address of the request.
    pub rq: u64,
    pub dev: u32,
    /// The cgroup of its first bio (requests never mix cgroups).
    pub cgroup_id: u64,
    pub op: u8,
    pub sector: u64,
    pub bytes: u32,
    /// Its first bio, as the issue probe read it.
    pub first_bio: u64,
    /// Bios chained in it, as the issue probe counted them (up to `MAX_CHAIN`).
    pub bio_count: u32,
    pub getrq_ts: Option<u64>,
    pub insert_ts: Option<u64>,
    /// The first issue.
    pub issue_ts: u64,
    /// The completion that finished it.
    pub complete_ts: Option<u64>,
    pub completed_bytes: u64,
    /// `blk_status_t` of the last completion (0 = ok).
    pub status: u8,
    pub requeues: u32,
    /// Requests merged into it (`rq_merge`).
    pub absorbed: u32,
    pub bios: Vec<BioLink>,
    pub matched: Match,
}

impl Request {
    /// The reconstruction agrees with the kernel: as many bios as it counted, and their bytes
    /// add up to the request's.
    pub fn consistent(&self) -> bool {
        self.bios.len() as u64 == self.bio_count as u64
            && self.bios.iter().map(|b| b.bytes as u64).sum::<u64>() == self.bytes as u64
    }

    pub fn bios_bytes(&self) -> u64 {
        self.bios.iter().map(|b| b.bytes as u64).sum()
    }
}

/// How well the reconstruction went, over the whole stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests issued (not counting re-issues after a requeue).
    pub requests: u64,
    /// Requests by [`Match`] name.
    pub matched: BTreeMap<&'static str, u64>,
    /// Requests whose bios agree with the kernel's count and bytes.
    pub consistent: u64,
    /// Bios placed in issued requests.
    pub bios: u64,
    /// Of those: split pieces, ambiguous choices, bios without a `bio_queue` in the capture.
    pub split_pieces: u64,
    pub ambiguous: u64,
    pub without_queue: u64,
    /// Merge events (bio or request) that found no pending request to join.
    pub orphan_merges: u64,
    /// Requests built but never issued in the capture (still pending at its end, or lost).
    pub never_issued: u64,
}

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

/// The result of a replay.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    /// In issue order.
    pub requests: Vec<Request>,
    pub stats: Stats,
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
        let fits = |s: usize| {
            let p = self.slab[s].as_ref().expect("indexed slot is live");
            p.dev == ev.dev && p.start == ev.sector && p.end == end
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
            // Issued again without a requeue: its completion was lost. A new request.
            self.in_flight.remove(&ev.id);
        }
        let found = self.find(ev);
        let pending = found.map(|(slot, m)| (self.remove(slot), m));
        self.stats.requests += 1;
        let m = match &pending {
            Some((_, m)) => *m,
            None if ev.aux == 0 && ev.bytes == 0 => Match::NoBios,
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
            bio_count: ev.aux,
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

/// Replays a whole stream.
pub fn trace<'a>(events: impl IntoIterator<Item = &'a Event>, limit: Option<usize>) -> Lineage {
    let mut t = match limit {
        Some(n) => Tracker::with_limit(n),
        None => Tracker::new(),
    };
    for ev in events {
        t.apply(ev);
    }
    t.finish()
}

/// One request and its bios as text (times in seconds since the capture's start).
pub fn render_text(r: &Request, names: &mut Names) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let device = names.device(r.dev);
    let cgroup = names.cgroup(r.cgroup_id).to_string();
    let t = |names: &Names, ts: Option<u64>| {
        ts.map_or("-".to_string(), |ts| format!("{:.6}", names.secs(ts)))
    };
    let _ = write!(
        out,
        "request {} {device} {cgroup} {}: sector {} + {} ({}), {} bios (kernel counted {}), {}",
        addr(r.rq),
        op_name(r.op),
        r.sector,
        r.bytes / 512,
        fmt::size(r.bytes as u64),
        r.bios.len(),
        r.bio_count,
        r.matched.name()
    );
    if !r.consistent() {
        out.push_str(", INCOMPLETE");
    }
    out.push('\n');
    let _ = write!(out, "  ");
    if r.getrq_ts.is_some() {
        let _ = write!(out, "new {}  ", t(names, r.getrq_ts));
    }
    if let Some(i) = r.insert_ts {
        let _ = write!(out, "inserted {}  ", t(names, Some(i)));
    }
    let _ = write!(out, "issued {}", t(names, Some(r.issue_ts)));
    if let Some(i) = r.insert_ts {
        let _ = write!(out, " (+{} queued)", fmt::micros_between(i, r.issue_ts));
    }
    match r.complete_ts {
        Some(c) => {
            let _ = write!(
                out,
                "  completed {} (+{})",
                t(names, Some(c)),
                fmt::micros_between(r.issue_ts, c)
            );
            if r.status != 0 {
                let _ = write!(out, " status {}", r.status);
            }
        }
        None => out.push_str("  not completed in the capture"),
    }
    if r.requeues > 0 {
        let _ = write!(out, "  requeued {}×", r.requeues);
    }
    if r.absorbed > 0 {
        let _ = write!(out, "  absorbed {} request(s)", r.absorbed);
    }
    out.push('\n');
    for b in &r.bios {
        let cg = names.cgroup(b.cgroup_id).to_string();
        let _ = write!(
            out,
            "    bio {} {cg} sector {} {}  queued {}  {}",
            addr(b.bio),
            b.sector,
            fmt::size(b.bytes as u64),
            t(names, b.queue_ts),
            b.join.describe()
        );
        if b.via_request_merge {
            out.push_str(" then request merge");
        }
        if let Some(p) = b.split_from {
            let _ = write!(out, "  split from {}", addr(p));
        }
        if b.charged {
            out.push_str("  charged");
        }
        if b.throttled {
            out.push_str("  throttled");
        }
        if let Some(w) = b.throttle_wait_ns {
            let _ = write!(out, " (waited {:.1} µs)", w as f64 / 1000.0);
        }
        if b.ambiguous {
            out.push_str("  (inferred: another request was adjacent too)");
        }
        out.push('\n');
    }
    out
}

/// `report --lineage --json`: one request (times: CLOCK_MONOTONIC ns, like the snapshot's
/// `start_ns`/`end_ns`; kernel addresses as hex strings). docs/report.md has the fields.
#[derive(Debug, serde::Serialize)]
pub struct RequestJson {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub rq: String,
    pub device: String,
    pub major: u32,
    pub minor: u32,
    pub cgroup: String,
    pub cgroup_id: u64,
    pub op: String,
    pub dir: &'static str,
    pub sector: u64,
    pub bytes: u32,
    pub first_bio: String,
    pub bio_count: u32,
    pub bios_found: usize,
    pub bios_bytes: u64,
    pub consistent: bool,
    #[serde(rename = "match")]
    pub matched: &'static str,
    pub getrq_ns: Option<u64>,
    pub insert_ns: Option<u64>,
    pub issue_ns: u64,
    pub complete_ns: Option<u64>,
    pub completed_bytes: u64,
    pub status: u8,
    pub requeues: u32,
    pub absorbed_requests: u32,
    pub bios: Vec<BioJson>,
}

#[derive(Debug, serde::Serialize)]
pub struct BioJson {
    pub bio: String,
    pub cgroup: String,
    pub cgroup_id: u64,
    pub sector: u64,
    pub bytes: u32,
    pub queue_ns: Option<u64>,
    pub join_ns: u64,
    pub join: &'static str,
    pub merge_path: Option<&'static str>,
    pub via_request_merge: bool,
    pub split_from: Option<String>,
    pub charged: bool,
    pub throttled: bool,
    pub throttle_wait_ns: Option<u64>,
    pub ambiguous: bool,
}

pub fn to_json(r: &Request, names: &mut Names) -> RequestJson {
    let bios = r
        .bios
        .iter()
        .map(|b| BioJson {
            bio: addr(b.bio),
            cgroup: names.cgroup(b.cgroup_id).to_string(),
            cgroup_id: b.cgroup_id,
            sector: b.sector,
            bytes: b.bytes,
            queue_ns: b.queue_ts,
            join_ns: b.join_ts,
            join: b.join.name(),
            merge_path: b.join.merge_path().map(merge_path_name),
            via_request_merge: b.via_request_merge,
            split_from: b.split_from.map(addr),
            charged: b.charged,
            throttled: b.throttled,
            throttle_wait_ns: b.throttle_wait_ns,
            ambiguous: b.ambiguous,
        })
        .collect();
    RequestJson {
        kind: "request",
        rq: addr(r.rq),
        device: names.device(r.dev),
        major: Dev(r.dev).major(),
        minor: Dev(r.dev).minor(),
        cgroup: names.cgroup(r.cgroup_id).to_string(),
        cgroup_id: r.cgroup_id,
        op: op_name(r.op),
        dir: dir_name(r.op),
        sector: r.sector,
        bytes: r.bytes,
        first_bio: addr(r.first_bio),
        bio_count: r.bio_count,
        bios_found: r.bios.len(),
        bios_bytes: r.bios_bytes(),
        consistent: r.consistent(),
        matched: r.matched.name(),
        getrq_ns: r.getrq_ts,
        insert_ns: r.insert_ts,
        issue_ns: r.issue_ts,
        complete_ns: r.complete_ts,
        completed_bytes: r.completed_bytes,
        status: r.status,
        requeues: r.requeues,
        absorbed_requests: r.absorbed,
        bios,
    }
}

/// The summary line: how much of the lineage is exact.
pub fn summary(s: &Stats) -> String {
    let m = |k: &str| s.matched.get(k).copied().unwrap_or(0);
    format!(
        "lineage: {} requests, {} consistent with the kernel's bio count and bytes; matched by \
         first bio and range: {}, by range only: {}, by first bio only: {}, without data: {}, \
         unmatched: {}; {} bios ({} split pieces, {} without a bio_queue in the capture, {} \
         placed by inference among adjacent requests); {} merges found no request; {} requests \
         were built but not issued in the capture",
        s.requests,
        s.consistent,
        m("exact"),
        m("range"),
        m("first_bio"),
        m("no_bios"),
        m("unmatched"),
        s.bios,
        s.split_pieces,
        s.without_queue,
        s.ambiguous,
        s.orphan_merges,
        s.never_issued
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::synth::Synth;
    use mergetrace_common::path;

    const DEV: u32 = 7 << 20 | 2;

    fn one_batch(reverse: bool) -> (Synth, Lineage) {
        let mut s = Synth::new();
        s.batch(DEV, 100, 0, 32, 4096, reverse, path::PLUG);
        let l = trace(&s.events, None);
        (s, l)
    }

    #[test]
    fn lineage_batch_of_back_merges_is_exact() {
        let (s, l) = one_batch(false);
        assert_eq!(l.requests.len(), 1);
        let r = &l.requests[0];
        assert_eq!(r.matched, Match::Exact);
        assert!(r.consistent());
        assert_eq!(r.bios.len(), 32);
        assert_eq!(r.bio_count, 32);
        assert_eq!(r.bios[0].join, Join::NewRequest);
        assert!(r.bios[1..]
            .iter()
            .all(|b| b.join == Join::BackMerge(path::PLUG)));
        // chain order = sector order, first bio = the getrq bio = the issue's aux64
        assert_eq!(r.bios[0].bio, r.first_bio);
        assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
        assert!(r.bios.iter().all(|b| b.queue_ts.is_some() && !b.ambiguous));
        assert_eq!(r.complete_ts, Some(s.last_ts()));
        assert_eq!(l.stats.consistent, 1);
        assert_eq!(l.stats.orphan_merges, 0);
        assert_eq!(l.stats.never_issued, 0);
    }

    #[test]
    fn lineage_reverse_batch_is_front_merges() {
        let (_, l) = one_batch(true);
        assert_eq!(l.requests.len(), 1);
        let r = &l.requests[0];
        assert_eq!(
            r.matched,
            Match::Exact,
            "first bio follows the front merges"
        );
        assert!(r.consistent());
        assert_eq!(r.sector, 0);
        // the last bio submitted (lowest sector) is first in the chain
        assert_eq!(r.bios[0].join, Join::FrontMerge(path::PLUG));
        assert_eq!(r.bios[31].join, Join::NewRequest);
        assert_eq!(r.bios[0].bio, r.first_bio);
        assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
    }

    #[test]
    fn lineage_two_cgroups_interleaved_never_mix() {
        let mut s = Synth::new();
        // Two cgroups write adjacent ranges, their bios interleaved one by one: cgroup 100
        // sectors 0..256, cgroup 200 sectors 256..512 (so 200's first bio starts where 100's
        // request ends: only the cgroup tells them apart).
        let mut a = s.open(DEV, 100, 0, 4096);
        let mut b = s.open(DEV, 200, 256, 4096);
        for _ in 1..32 {
            s.add(&mut a, 4096, path::PLUG);
            s.add(&mut b, 4096, path::PLUG);
        }
        s.unplug(DEV, 2, true);
        let ra = s.issue(&a);
        let rb = s.issue(&b);
        s.complete_rq(&a, ra);
        s.complete_rq(&b, rb);
        let l = trace(&s.events, None);
        assert_eq!(l.requests.len(), 2);
        for (r, cg) in l.requests.iter().zip([100, 200]) {
            assert_eq!(r.matched, Match::Exact);
            assert!(r.consistent(), "{r:?}");
            assert_eq!(r.bios.len(), 32);
            assert!(r.bios.iter().all(|b| b.cgroup_id == cg));
            assert!(r.bios.iter().all(|b| !b.ambiguous));
        }
    }

    #[test]
    fn lineage_split_pieces_keep_their_parent() {
        let mut s = Synth::new();
        // One 1 MiB bio split in two 512 KiB pieces: the front piece is a new bio, the
        // original continues as the remainder.
        let parent = s.bio_queue(DEV, 100, 1, 0, 1 << 20, flags::RULES_IOPS);
        let piece = s.split(DEV, 100, parent, 0, 512 << 10, 1024);
        s.getrq(DEV, 100, piece, 0, 512 << 10);
        let rq1 = s.issue_raw(DEV, 100, piece, 0, 512 << 10, 1);
        s.getrq(DEV, 100, parent, 1024, 512 << 10);
        let rq2 = s.issue_raw(DEV, 100, parent, 1024, 512 << 10, 1);
        s.complete(DEV, 100, rq1, piece, 0, 512 << 10);
        s.complete(DEV, 100, rq2, parent, 1024, 512 << 10);
        let l = trace(&s.events, None);
        assert_eq!(l.requests.len(), 2);
        let (r1, r2) = (&l.requests[0], &l.requests[1]);
        assert!(r1.consistent() && r2.consistent());
        assert_eq!(r1.bios[0].split_from, Some(parent));
        assert_eq!(r1.bios[0].bio, piece);
        assert!(
            r1.bios[0].queue_ts.is_some(),
            "inherits the parent's bio_queue"
        );
        assert!(r1.bios[0].charged);
        assert_eq!(r2.bios[0].split_from, None);
        assert_eq!(r2.bios[0].bio, parent);
        assert_eq!(r2.bios[0].bytes, 512 << 10);
        assert_eq!(l.stats.split_pieces, 1);
        assert_eq!(l.stats.without_queue, 0);
        assert_eq!(l.stats.consistent, 2);
    }

    #[test]
    fn lineage_request_merge_after_insert() {
        let mut s = Synth::new();
        // Elevator: two requests inserted, then a bio back-merges into the first, which now
        // touches the second: the second is absorbed (rq_merge) into the first.
        let mut a = s.open(DEV, 100, 0, 4096);
        s.add(&mut a, 4096, path::PLUG);
        s.insert(&a);
        let mut b = s.open(DEV, 100, 24, 4096);
        s.add(&mut b, 4096, path::PLUG);
        s.insert(&b);
        s.add(&mut a, 4096, path::ELEVATOR); // a now ends at sector 24, where b starts
        s.absorb(&mut a, &b);
        let rq = s.issue(&a);
        s.complete_rq(&a, rq);
        let l = trace(&s.events, None);
        assert_eq!(l.requests.len(), 1, "{:?}", l.requests);
        let r = &l.requests[0];
        assert_eq!(r.matched, Match::Exact);
        assert!(r.consistent(), "{r:?}");
        assert_eq!(r.bio_count, 5);
        assert_eq!(r.absorbed, 1);
        assert!(r.insert_ts.is_some());
        let via: Vec<bool> = r.bios.iter().map(|b| b.via_request_merge).collect();
        assert_eq!(via, [false, false, false, true, true]);
        assert_eq!(r.bios[2].join, Join::BackMerge(path::ELEVATOR));
        assert_eq!(r.bios[3].join, Join::NewRequest);
        assert!(r.bios.windows(2).all(|w| w[0].sector + 8 == w[1].sector));
    }

    #[test]
    fn lineage_front_merge_then_request_merge() {
        let mut s = Synth::new();
        // a = [0, 8), b = [16, 24); a bio at [8, 16) front-merges into b, then b is absorbed
        // into a (attempt_front_merge: prev = a).
        let a = {
            let a = s.open(DEV, 100, 0, 4096);
            s.insert(&a);
            a
        };
        let mut a = a;
        let mut b = s.open(DEV, 100, 16, 4096);
        s.insert(&b);
        s.add_front(&mut b, 4096, path::ELEVATOR);
        s.absorb(&mut a, &b);
        let rq = s.issue(&a);
        s.complete_rq(&a, rq);
        let l = trace(&s.events, None);
        assert_eq!(l.requests.len(), 1);
        let r = &l.requests[0];
        assert!(r.consistent(), "{r:?}");
        assert_eq!(r.matched, Match::Exact);
        let joins: Vec<Join> = r.bios.iter().map(|b| b.join).collect();
        assert_eq!(
            joins,
            [
                Join::NewRequest,
                Join::FrontMerge(path::ELEVATOR),
                Join::NewRequest
            ]
        );
    }

    #[test]
    fn lineage_requeue_is_one_request_and_flush_has_no_bios() {
        let mut s = Synth::new();
        let a = s.open(DEV, 100, 0, 4096);
        let rq = s.issue(&a);
        s.requeue(&a, rq);
        s.insert(&a);
        s.issue(&a);
        s.complete_rq(&a, rq);
        s.flush(DEV);
        let l = trace(&s.events, None);
        assert_eq!(l.requests.len(), 2);
        assert_eq!(l.requests[0].requeues, 1);
        assert!(l.requests[0].complete_ts.is_some());
        assert!(l.requests[0].consistent());
        assert_eq!(l.requests[1].matched, Match::NoBios);
        assert!(l.requests[1].consistent());
        assert_eq!(l.stats.requests, 2);
    }

    #[test]
    fn lineage_ambiguous_and_orphans_are_reported() {
        let mut s = Synth::new();
        // Two pending requests of one cgroup end at the same sector (the same range written
        // twice): a back merge there could go to either.
        let a = s.open(DEV, 100, 0, 4096);
        let mut b = s.open(DEV, 100, 0, 4096);
        s.add(&mut b, 4096, path::ELEVATOR);
        // A merge into a request the capture never saw built.
        let lone = s.bio_queue(DEV, 100, 1, 5000, 4096, 0);
        s.raw(kind::BACK_MERGE, DEV, 100, lone, 5000, 4096, path::PLUG);
        let rb = s.issue(&b);
        let ra = s.issue(&a);
        s.complete_rq(&b, rb);
        s.complete_rq(&a, ra);
        let l = trace(&s.events, None);
        assert_eq!(l.stats.orphan_merges, 1);
        assert_eq!(l.stats.ambiguous, 1);
        assert!(l.requests.iter().all(|r| r.consistent()));
        // A request whose building the capture missed.
        let mut s2 = Synth::new();
        s2.issue_raw(DEV, 100, 0xdead, 0, 4096, 1);
        let l2 = trace(&s2.events, None);
        assert_eq!(l2.requests[0].matched, Match::Unmatched);
        assert!(!l2.requests[0].consistent());
    }

    #[test]
    fn lineage_throttle_wait_and_charge_follow_the_bio() {
        let mut s = Synth::new();
        // fentry tier: the release (with the measured wait) comes just before bio_queue,
        // which the throttle's dispatch work marks as released.
        let bio_addr = 0xffff_8880_0100_0100; // the next address Synth hands out
        let mut rel = s.raw(kind::THROTTLE_RELEASE, DEV, 100, bio_addr, 0, 4096, 0);
        rel.aux64 = 2_500_000;
        *s.events.last_mut().unwrap() = rel;
        let bio = s.bio_queue(
            DEV,
            100,
            1,
            0,
            4096,
            flags::THROTTLE_RELEASED | flags::RULES_IOPS,
        );
        assert_eq!(bio, bio_addr);
        s.getrq(DEV, 100, bio, 0, 4096);
        let rq = s.issue_raw(DEV, 100, bio, 0, 4096, 1);
        s.complete(DEV, 100, rq, bio, 0, 4096);
        let l = trace(&s.events, None);
        let b = &l.requests[0].bios[0];
        assert!(b.throttled && b.charged);
        assert_eq!(b.throttle_wait_ns, Some(2_500_000));
        assert!(l.requests[0].consistent());
    }

    #[test]
    fn lineage_renders_text_and_json() {
        let (_, l) = one_batch(false);
        let h = crate::capture::Header {
            start_monotonic_ns: crate::offline::synth::START_NS,
            devices: vec![crate::capture::RecordedDevice {
                name: "loop2".into(),
                major: 7,
                minor: 2,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut names = Names::new(&h);
        let r = &l.requests[0];
        let text = render_text(r, &mut names);
        assert_eq!(text.lines().count(), 2 + 32, "{text}");
        assert!(text.starts_with("request 0x"), "{text}");
        assert!(text.contains("loop2 (unknown cgroup id 100) write: sector 0 + 256 (128.0 KiB), 32 bios (kernel counted 32), exact"), "{text}");
        assert!(text.contains("back merge (plug)"));
        let v = serde_json::to_value(to_json(r, &mut names)).unwrap();
        assert_eq!(v["type"], "request");
        assert_eq!(v["device"], "loop2");
        assert_eq!(v["bio_count"], 32);
        assert_eq!(v["bios_found"], 32);
        assert_eq!(v["bios_bytes"], 131072);
        assert_eq!(v["consistent"], true);
        assert_eq!(v["match"], "exact");
        assert_eq!(v["bios"][1]["merge_path"], "plug");
        assert_eq!(v["bios"][0]["join"], "new_request");
        assert!(v["bios"][0]["merge_path"].is_null());
        assert!(summary(&l.stats).starts_with("lineage: 1 requests, 1 consistent"));
    }

    #[test]
    fn lineage_limit_keeps_the_first_requests_and_counts_all() {
        let mut s = Synth::new();
        for i in 0..5 {
            s.batch(DEV, 100, i * 1024, 8, 4096, false, path::PLUG);
        }
        let l = trace(&s.events, Some(2));
        assert_eq!(l.requests.len(), 2);
        assert_eq!(l.stats.requests, 5);
        assert_eq!(l.stats.consistent, 5);
        assert_eq!(l.stats.bios, 40);
    }
}
