//! Synthetic event streams for unit tests: what the probes emit for plugged batches,
//! elevator merges, splits, requeues and flushes, in the kernel's order.
use mergetrace_common::{flags, kind, path, rq_aux, Event};

/// Capture start used by [`Synth`]: events begin 1 µs later.
pub const START_NS: u64 = 1_000_000_000_000;

pub struct Synth {
    pub events: Vec<Event>,
    /// Front pieces of splits not issued yet (what `SPLIT_PIECES` holds in the kernel).
    pieces: std::collections::HashSet<u64>,
    ts: u64,
    next_bio: u64,
    next_rq: u64,
    /// Time between consecutive events.
    pub step_ns: u64,
}

/// A request being built by a [`Synth`].
#[derive(Debug, Clone)]
pub struct Rq {
    pub dev: u32,
    pub cgroup: u64,
    pub op: u8,
    pub start: u64,
    pub end: u64,
    pub first_bio: u64,
    pub bios: u32,
    /// The request's address.
    pub rq: u64,
    /// Its first bio, bios and bytes when it was inserted (None: still in the plug).
    pub at_insert: Option<(u64, u32, u32)>,
    /// Since its insert: where bios merged into it ([`path`]), the front merges among them,
    /// and the bios of requests it absorbed.
    pub place: u8,
    pub front_in_queue: u32,
    pub absorbed: u32,
    /// The driver handed it back: its next insert puts it back in the queue.
    pub requeued: bool,
}

impl Rq {
    pub fn bytes(&self) -> u32 {
        ((self.end - self.start) * 512) as u32
    }

    /// What the request programs pack into an issue or absorption of this request
    /// (`rq_aux`): its bios and, if it was inserted, what merged into it since (on an issue
    /// after a requeue, the bios it absorbed in place of its front merges).
    pub fn packed(&self, reissue: bool) -> (u32, u8) {
        match self.at_insert {
            None => (rq_aux::pack(self.bios, 0, 0, 0), path::PLUG),
            Some((_, at, _)) => (
                rq_aux::pack(
                    self.bios,
                    self.bios - at - self.absorbed,
                    if reissue {
                        self.absorbed
                    } else {
                        self.front_in_queue
                    },
                    rq_aux::QUEUED,
                ),
                self.place,
            ),
        }
    }

    /// A bio joined it on `path` (front or back).
    fn grow(&mut self, path: u8, front: bool) {
        self.bios += 1;
        if self.at_insert.is_some() {
            self.place = path;
            self.front_in_queue += front as u32;
        }
    }
}

impl Default for Synth {
    fn default() -> Self {
        Synth::new()
    }
}

impl Synth {
    pub fn new() -> Synth {
        Synth {
            events: Vec::new(),
            pieces: Default::default(),
            ts: START_NS,
            next_bio: 0xffff_8880_0100_0000,
            next_rq: 0xffff_8881_0200_0000,
            step_ns: 1000,
        }
    }

    pub fn last_ts(&self) -> u64 {
        self.ts
    }

    /// Moves the clock forward.
    pub fn sleep(&mut self, ns: u64) {
        self.ts += ns;
    }

    fn bio_addr(&mut self) -> u64 {
        self.next_bio += 0x100;
        self.next_bio
    }

    fn rq_addr(&mut self) -> u64 {
        self.next_rq += 0x180;
        self.next_rq
    }

    /// Appends one event; returns it, to set the fields a kind carries more.
    #[allow(clippy::too_many_arguments)]
    pub fn raw(
        &mut self,
        kind: u8,
        dev: u32,
        cgroup: u64,
        id: u64,
        sector: u64,
        bytes: u32,
        path: u8,
    ) -> &mut Event {
        self.ts += self.step_ns;
        self.events.push(Event {
            ts_ns: self.ts,
            cgroup_id: cgroup,
            id,
            sector,
            dev,
            bytes,
            kind,
            op: 1,
            path,
            ..Event::default()
        });
        self.events.last_mut().unwrap()
    }

    /// A bio passes blk-throttle (`bio_queue`); returns its address.
    pub fn bio_queue(
        &mut self,
        dev: u32,
        cgroup: u64,
        op: u8,
        sector: u64,
        bytes: u32,
        fl: u8,
    ) -> u64 {
        let bio = self.bio_addr();
        let ev = self.raw(kind::BIO_QUEUE, dev, cgroup, bio, sector, bytes, 0);
        (ev.op, ev.flags) = (op, fl);
        bio
    }

    /// `block_split`: a new front piece of `bytes` at `sector` out of `parent`, whose
    /// remainder starts right after it. Returns the piece's address.
    pub fn split(&mut self, dev: u32, cgroup: u64, parent: u64, sector: u64, bytes: u32) -> u64 {
        let piece = self.bio_addr();
        let rest = sector + bytes as u64 / 512;
        let ev = self.raw(kind::SPLIT, dev, cgroup, piece, sector, bytes, 0);
        (ev.aux64, ev.aux) = (parent, rest as u32);
        self.pieces.insert(piece);
        piece
    }

    pub fn getrq(&mut self, dev: u32, cgroup: u64, bio: u64, sector: u64, bytes: u32) {
        self.raw(kind::GETRQ, dev, cgroup, bio, sector, bytes, 0);
    }

    /// A request event (`rq_insert`, `rq_issue`, ...).
    #[allow(clippy::too_many_arguments)]
    pub fn rq_event(
        &mut self,
        kind: u8,
        dev: u32,
        cgroup: u64,
        rq: u64,
        first_bio: u64,
        sector: u64,
        bytes: u32,
        aux: u32,
    ) {
        let ev = self.raw(kind, dev, cgroup, rq, sector, bytes, 0);
        (ev.aux64, ev.aux) = (first_bio, aux);
    }

    /// A request event of `r` (at address `rq`, which a requeue changes): from its first bio
    /// and sector, of all its bytes.
    fn rq_event_of(&mut self, kind: u8, r: &Rq, rq: u64, aux: u32) -> &mut Event {
        let (dev, cgroup, first_bio, start, bytes) =
            (r.dev, r.cgroup, r.first_bio, r.start, r.bytes());
        self.rq_event(kind, dev, cgroup, rq, first_bio, start, bytes, aux);
        let ev = self.events.last_mut().unwrap();
        ev.op = r.op;
        ev
    }

    /// `r`'s issue or absorption, packed as the request programs pack it.
    fn rq_counted(&mut self, kind: u8, r: &Rq, rq: u64, reissue: bool) {
        let (mut aux, place) = r.packed(reissue);
        if kind == kind::RQ_ISSUE && !reissue && r.bios == 1 && self.pieces.remove(&r.first_bio) {
            aux |= rq_aux::SPLIT_PIECE;
        }
        let ev = self.rq_event_of(kind, r, rq, aux);
        ev.path = place;
        if reissue {
            ev.flags |= flags::REISSUE;
            if let Some((_, _, bytes)) = r.at_insert {
                ev.aux64 = (ev.bytes - bytes) as u64;
            }
        }
    }

    /// A request of one bio made outside [`Synth::open`] (of a split piece, say), at a fresh
    /// address; it emits nothing.
    pub fn request(&mut self, dev: u32, cgroup: u64, bio: u64, sector: u64, bytes: u32) -> Rq {
        Rq {
            dev,
            cgroup,
            op: 1,
            start: sector,
            end: sector + bytes as u64 / 512,
            first_bio: bio,
            bios: 1,
            rq: self.rq_addr(),
            at_insert: None,
            place: path::ELEVATOR,
            front_in_queue: 0,
            absorbed: 0,
            requeued: false,
        }
    }

    pub fn unplug(&mut self, dev: u32, depth: u32, explicit: bool) {
        self.ts += self.step_ns;
        self.events.push(Event {
            ts_ns: self.ts,
            id: 0xffff_8882_0000_0000,
            dev,
            aux: depth,
            kind: kind::UNPLUG,
            flags: if explicit { flags::UNPLUG_EXPLICIT } else { 0 },
            ..Event::default()
        });
    }

    /// A write bio of `bytes` at `sector` that starts a new request.
    pub fn open(&mut self, dev: u32, cgroup: u64, sector: u64, bytes: u32) -> Rq {
        let bio = self.bio_queue(dev, cgroup, 1, sector, bytes, 0);
        self.getrq(dev, cgroup, bio, sector, bytes);
        self.request(dev, cgroup, bio, sector, bytes)
    }

    /// A bio back-merged at the end of `r` on `path`.
    pub fn add(&mut self, r: &mut Rq, bytes: u32, path: u8) -> u64 {
        let bio = self.bio_queue(r.dev, r.cgroup, r.op, r.end, bytes, 0);
        self.raw(kind::BACK_MERGE, r.dev, r.cgroup, bio, r.end, bytes, path);
        r.end += bytes as u64 / 512;
        r.grow(path, false);
        bio
    }

    /// A bio front-merged before the start of `r`.
    pub fn add_front(&mut self, r: &mut Rq, bytes: u32, path: u8) -> u64 {
        let sector = r.start - bytes as u64 / 512;
        let bio = self.bio_queue(r.dev, r.cgroup, r.op, sector, bytes, 0);
        self.raw(kind::FRONT_MERGE, r.dev, r.cgroup, bio, sector, bytes, path);
        r.start = sector;
        r.first_bio = bio;
        r.grow(path, true);
        bio
    }

    /// `r` leaves the plug for the queue. Inserted again (a requeued request put back), it
    /// carries nothing new.
    pub fn insert(&mut self, r: &mut Rq) {
        let back = std::mem::take(&mut r.requeued);
        let aux = rq_aux::pack(r.bios, 0, 0, if back { rq_aux::QUEUED } else { 0 });
        self.rq_event_of(kind::RQ_INSERT, r, r.rq, aux).path = path::PLUG;
        r.at_insert = Some((r.first_bio, r.bios, r.bytes()));
        (r.front_in_queue, r.absorbed) = (0, 0);
    }

    /// `b` merged into `a` (`rq_merge` of `b`); `b` must start where `a` ends.
    pub fn absorb(&mut self, a: &mut Rq, b: &Rq) {
        assert_eq!(a.end, b.start);
        self.rq_counted(kind::RQ_MERGE, b, b.rq, false);
        a.end = b.end;
        a.bios += b.bios;
        a.absorbed += b.bios;
    }

    pub fn issue(&mut self, r: &Rq) -> u64 {
        self.rq_counted(kind::RQ_ISSUE, r, r.rq, false);
        r.rq
    }

    /// `r` issued again after a requeue (and put back: [`Synth::insert`]).
    pub fn reissue(&mut self, r: &Rq) -> u64 {
        self.rq_counted(kind::RQ_ISSUE, r, r.rq, true);
        r.rq
    }

    pub fn requeue(&mut self, r: &mut Rq, rq: u64) {
        self.rq_event_of(kind::RQ_REQUEUE, r, rq, 0);
        r.requeued = true;
    }

    pub fn complete_rq(&mut self, r: &Rq, rq: u64) {
        self.rq_event_of(kind::RQ_COMPLETE, r, rq, r.bytes());
    }

    /// A flush request without data: issued and completed, no bios.
    pub fn flush(&mut self, dev: u32) {
        let rq = self.rq_addr();
        for k in [kind::RQ_ISSUE, kind::RQ_COMPLETE] {
            self.rq_event(k, dev, 0, rq, 0, 0, 0, 0);
            self.events.last_mut().unwrap().op = 2;
        }
    }

    /// fentry tier: blk-throttle queues a bio of `op` (`__blk_throtl_bio` returned true).
    pub fn throttle_queue(&mut self, dev: u32, cgroup: u64, op: u8) {
        let ev = self.raw(kind::THROTTLE_CHARGE, dev, cgroup, 0, 0, 0, 1);
        ev.op = op;
    }

    /// A bio of `op` and `bytes` at `sector` through blk-throttle in a group with `rules`
    /// (`flags::RULES_*`), as its own request, issued and completed. `waited`: blk-throttle
    /// released it after it waited this long (the tracepoint tier's mark on the bio, and the
    /// fentry tier's release event carrying the wait).
    pub fn through_throttle(
        &mut self,
        (dev, cgroup, op): (u32, u64, u8),
        (sector, bytes): (u64, u32),
        rules: u8,
        waited: Option<u64>,
    ) {
        let mut fl = rules;
        if let Some(ns) = waited {
            let ev = self.raw(kind::THROTTLE_RELEASE, dev, cgroup, 0, 0, 0, 0);
            (ev.op, ev.aux64) = (op, ns);
            fl |= flags::THROTTLE_RELEASED;
        }
        let bio = self.bio_queue(dev, cgroup, op, sector, bytes, fl);
        self.getrq(dev, cgroup, bio, sector, bytes);
        self.events.last_mut().unwrap().op = op;
        let mut r = self.request(dev, cgroup, bio, sector, bytes);
        r.op = op;
        let rq = self.issue(&r);
        self.complete_rq(&r, rq);
    }

    /// A plugged batch of `n` bios of `bs` bytes from `sector` (descending when `reverse`),
    /// merged on `path` into one request, flushed, issued directly and completed. Returns
    /// the request.
    #[allow(clippy::too_many_arguments)]
    pub fn batch(
        &mut self,
        dev: u32,
        cgroup: u64,
        sector: u64,
        n: u32,
        bs: u32,
        reverse: bool,
        path: u8,
    ) -> Rq {
        let per = bs as u64 / 512;
        let mut r = if reverse {
            self.open(dev, cgroup, sector + per * (n as u64 - 1), bs)
        } else {
            self.open(dev, cgroup, sector, bs)
        };
        for _ in 1..n {
            if reverse {
                self.add_front(&mut r, bs, path);
            } else {
                self.add(&mut r, bs, path);
            }
        }
        self.unplug(dev, 1, true);
        let rq = self.issue(&r);
        self.complete_rq(&r, rq);
        r
    }
}
