//! The event codec of events chunks: each event a head byte and the fields it cannot predict
//! from the previous event of the chunk or of its kind, as varints. Pure; the layout is in
//! docs/capture-format.md, and any change to what a byte means bumps the format version.
use bytes::{BufMut, BytesMut};
use std::{collections::VecDeque, mem::MaybeUninit};

use foldhash::HashMap;

use mergetrace_common::{kind, Event};

// ---- varints -------------------------------------------------------------------------------

/// Unsigned LEB128.
#[inline]
pub fn put_varint(out: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        out.put_u8(v as u8 | 0x80);
        v >>= 7;
    }
    out.put_u8(v as u8);
}

/// Bytes [`put_varint`] writes for `v`.
#[inline]
pub fn varint_len(v: u64) -> u32 {
    VARINT_LEN[(v | 1).leading_zeros() as usize] as u32
}

/// [`varint_len`] by the value's leading zeros (a load instead of a division by 7).
const VARINT_LEN: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut lz = 0;
    while lz < 64 {
        t[lz] = (64 - lz as u32).div_ceil(7) as u8;
        lz += 1;
    }
    t
};

/// The longest an encoded event can be: head, kind, modes (2), 3 attribute bytes, timestamp,
/// device and cgroup references with their new values, id, sector, bytes, aux, aux64.
pub const MAX_EVENT_LEN: usize = 1 + 1 + 2 + 3 + 10 + (1 + 5) + (1 + 10) + 10 + 10 + 5 + 5 + 10;

/// One event's bytes, written straight into the chunk's spare capacity: a plain store per
/// byte (the mask bounds the index into a fixed-size window) instead of a capacity check per
/// byte, and no copy. The chunk's length moves once, when the event is done.
struct EventBytes<'a> {
    /// The chunk's spare capacity, from its end on.
    buf: &'a mut [MaybeUninit<u8>; WINDOW_LEN],
    /// Bytes written so far.
    len: usize,
}

/// The room reserved for one event (a power of two, for the mask).
const WINDOW_LEN: usize = 128;
const _: () = assert!(MAX_EVENT_LEN <= WINDOW_LEN);

impl EventBytes<'_> {
    /// Writes one event's bytes with `f` at the end of `out`.
    #[inline(always)]
    fn append(out: &mut BytesMut, f: impl FnOnce(&mut EventBytes)) {
        out.reserve(WINDOW_LEN);
        let at = out.len();
        let window: &mut [MaybeUninit<u8>; WINDOW_LEN] = (&mut out.spare_capacity_mut()
            [..WINDOW_LEN])
            .try_into()
            .expect("reserved");
        let mut s = EventBytes {
            buf: window,
            len: 0,
        };
        f(&mut s);
        let len = s.len.min(WINDOW_LEN);
        // SAFETY: the `len` bytes past `at` were just written (len <= MAX_EVENT_LEN <=
        // WINDOW_LEN: no event is longer, `capture_max_event_len_holds`).
        unsafe { out.set_len(at + len) };
    }

    #[inline(always)]
    fn u8(&mut self, b: u8) {
        self.buf[self.len & (WINDOW_LEN - 1)].write(b);
        self.len += 1;
    }

    #[inline(always)]
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.u8(v as u8 | 0x80);
            v >>= 7;
        }
        self.u8(v as u8);
    }
}

#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Why a payload does not decode; `offset` counts from the start of the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub what: &'static str,
}

/// A bounds-checked read position in a payload.
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub(super) fn err(&self, what: &'static str) -> DecodeError {
        DecodeError {
            offset: self.pos,
            what,
        }
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.err("payload ends inside an event")),
        }
    }

    #[inline]
    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let b0 = self.u8()?;
        if b0 < 0x80 {
            return Ok(b0 as u64);
        }
        let mut v = (b0 & 0x7f) as u64;
        let mut shift = 7;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(self.err("varint longer than 64 bits"));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
        }
    }

    #[inline]
    pub fn varint_u32(&mut self) -> Result<u32, DecodeError> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| self.err("value does not fit 32 bits"))
    }
}

// ---- the event codec -----------------------------------------------------------------------
//
// Each event: a head byte, then optional parts in a fixed order. Predictions come from the
// previous event of the chunk (`prev`), the previous event with the same kind slot (`slot`;
// kinds 0..=14 have their own slot, every larger kind shares slot 15) and, from format 2,
// memories of the chunk's requests: `link`, the last request event (merge, insert, issue,
// complete, requeue) with this event's id (a completion finds its issue: same sector, bytes
// and first bio), the *waiting bios*, bios that got a request (getrq) which no insert or
// issue has named as its first bio yet (an issue finds its bio: the request starts at the
// bio's sector), and the requests *in flight*, issued and not yet completed or requeued (a
// device mostly completes the oldest first).
//
// head: bits 0-3 kind (15 = a kind byte follows), 0x10 modes follow (else the slot's last
// modes), 0x20 op/path/flags bytes follow (else the slot's), 0x40 dev reference follows
// (else prev's), 0x80 cgroup reference follows (else the cgroup mode's: prev's, or from
// format 2 the slot's).
//
// modes (format 2: a varint of the bits that differ from the slot's last modes): bits 0-2 id,
// 3-5 sector, 6-7 bytes, 8 aux, 9-11 aux64, 12 cgroup, 13 timestamp. Format 1 wrote the modes
// themselves in one byte (bits 0-1 id, 2-3 sector, 4 bytes, 5 aux, 6-7 aux64), with the
// values format 2 gives the same modes; [`modes_from_v1`] widens it.

const SLOTS: usize = 16;
const KIND_ESCAPE: u8 = 15;

const H_MODES: u8 = 0x10;
const H_ATTRS: u8 = 0x20;
const H_DEV: u8 = 0x40;
const H_CGROUP: u8 = 0x80;

/// id = prev.id
const ID_PREV: usize = 0;
// 1: id = slot.id ^ varint; 2: id = prev.id ^ varint; 3: id = prev.aux64 ^ varint
/// id = slot.id + the slot's step (request tags handed out in turn): no bytes. The step is
/// the smaller of an id's distances to the slot's last two ids.
const ID_STRIDE: usize = 4;
/// id = the oldest request in flight: no bytes.
const ID_IN_FLIGHT: usize = 5;
/// id = the slot's id before last + the step: two CPUs' requests interleaved. No bytes.
const ID_STRIDE_2: usize = 6;
/// id = the id of the event before prev (another CPU's event came between): no bytes.
const ID_PREV_2: usize = 7;

/// sector = prev.sector
const SEC_PREV: usize = 0;
/// sector = slot.sector + slot.bytes / 512 (the slot's I/O continues)
const SEC_SEQ: usize = 1;
/// sector = prev.sector + zigzag varint
const SEC_DELTA_PREV: usize = 2;
/// sector = slot.sector + zigzag varint
const SEC_DELTA_SLOT: usize = 3;
/// sector = link.sector; 5: the oldest waiting bio's; 6: the newest waiting bio's.
const SEC_LINK: usize = 4;
const SEC_MODES: usize = 7;

/// bytes: 0 = slot's, 1 = varint follows, 2 = link's, 3 = the oldest waiting bio's.
const BYTES_LIT: usize = 1;
/// aux: 0 = slot's, 1 = varint follows.
const AUX_LIT: usize = 1;

/// aux64 = slot.aux64
const A64_SLOT: usize = 0;
// 1: aux64 = id ^ varint (this event's id); 2: prev.id ^ varint; 3: slot.aux64 ^ varint
/// aux64 = link.aux64; 5: the oldest waiting bio's id; 6: the newest's. No bytes.
const A64_LINK: usize = 4;
const A64_MODES: usize = 7;

// The encoder and decoder pick each field's base by indexing an array with its mode (a jump
// table per field mispredicts): the arrays follow these values.
const _: () = assert!(
    ID_PREV == 0
        && SEC_PREV == 0
        && SEC_SEQ == 1
        && SEC_DELTA_PREV == 2
        && SEC_DELTA_SLOT == 3
        && SEC_LINK == 4
        && A64_SLOT == 0
        && A64_LINK == 4
);

/// cgroup without a reference: 0 = prev's, 1 = the slot's (an unplug has none, and the
/// issue after it has its slot's).
const CG_SLOT: usize = 1;

/// The timestamp: 0 = its distance from prev's, 1 = that distance less the slot's (the
/// same code path between two tracepoints takes about the same time each pass).
const TS_SLOT: usize = 1;

/// The widest modes value format 2 writes.
const MODES_MAX: u16 = 0x3fff;

const NO: u32 = 1 << 16; // cost of an option that cannot encode the value

#[inline]
fn slot_of(kind: u8) -> usize {
    (kind as usize).min(SLOTS - 1)
}

#[inline]
fn modes_word(f: Fields) -> u16 {
    (f[0] | f[1] << 3 | f[2] << 6 | f[3] << 8 | f[4] << 9 | f[5] << 12 | f[6] << 13) as u16
}

/// A modes value's field modes: id, sector, bytes, aux, aux64, cgroup, timestamp.
type Fields = [usize; 7];

#[inline]
fn field_modes(m: u16) -> Fields {
    let m = m as usize;
    [
        m & 7,
        m >> 3 & 7,
        m >> 6 & 3,
        m >> 8 & 1,
        m >> 9 & 7,
        m >> 12 & 1,
        m >> 13 & 1,
    ]
}

/// A format-1 modes byte as the format-2 value meaning the same.
#[inline]
fn modes_from_v1(m: u8) -> u16 {
    let m = m as usize;
    modes_word([m & 3, m >> 2 & 3, m >> 4 & 1, m >> 5 & 1, m >> 6 & 3, 0, 0])
}

/// Entries of the link table: a power of two, large enough that a request's issue is still
/// there at its completion with hundreds of requests in flight.
const LINKS: usize = 4096;
/// The waiting bios kept; the oldest is forgotten past this.
const WAITING: usize = 64;
/// The requests in flight kept; the oldest is forgotten past this.
const IN_FLIGHT: usize = 256;

#[inline]
fn link_index(id: u64) -> usize {
    (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - LINKS.trailing_zeros())) as usize
}

/// The requests' memories both sides keep, updated after every event in the same way: the
/// link table (by id, direct-mapped: an entry another id took is simply gone), the waiting
/// bios and the requests in flight. `T` is what an entry holds: the encoder what it predicts,
/// the decoder the event's index in its output.
#[derive(Clone)]
struct Requests<T: Copy> {
    links: Vec<(u64, T)>,
    waiting: VecDeque<(u64, T)>,
    in_flight: VecDeque<(u64, T)>,
}

impl<T: Copy> Requests<T> {
    fn new(empty: T) -> Self {
        Requests {
            links: vec![(0, empty); LINKS],
            waiting: VecDeque::with_capacity(WAITING),
            in_flight: VecDeque::with_capacity(IN_FLIGHT),
        }
    }

    fn clear(&mut self, empty: T) {
        self.links.fill((0, empty));
        self.waiting.clear();
        self.in_flight.clear();
    }

    #[inline]
    fn link(&self, id: u64) -> Option<T> {
        let (k, v) = self.links[link_index(id)];
        (k == id).then_some(v)
    }

    #[inline]
    fn oldest(&self) -> Option<T> {
        self.waiting.front().map(|e| e.1)
    }

    #[inline]
    fn newest(&self) -> Option<T> {
        self.waiting.back().map(|e| e.1)
    }

    #[inline]
    fn oldest_in_flight(&self) -> Option<u64> {
        self.in_flight.front().map(|e| e.0)
    }

    /// After `ev` (held as `v`): a getrq's bio starts waiting; a request's event is its id's
    /// link; an insert or issue names the request's first bio (aux64), which stops waiting;
    /// an issued request is in flight until it completes or is requeued.
    #[inline]
    fn note(&mut self, ev: &Event, v: T) {
        let link = |r: &mut Self| r.links[link_index(ev.id)] = (ev.id, v);
        match ev.kind {
            kind::GETRQ => push_bounded(&mut self.waiting, (ev.id, v), WAITING),
            kind::RQ_INSERT => {
                link(self);
                remove(&mut self.waiting, ev.aux64);
            }
            kind::RQ_ISSUE => {
                link(self);
                remove(&mut self.waiting, ev.aux64);
                push_bounded(&mut self.in_flight, (ev.id, v), IN_FLIGHT);
            }
            kind::RQ_COMPLETE | kind::RQ_REQUEUE => {
                link(self);
                remove(&mut self.in_flight, ev.id);
            }
            kind::RQ_MERGE => link(self),
            _ => {}
        }
    }
}

fn push_bounded<T>(q: &mut VecDeque<(u64, T)>, e: (u64, T), max: usize) {
    if q.len() == max {
        q.pop_front();
    }
    q.push_back(e);
}

/// Removes `id`'s entry, if any: mostly the oldest or the newest.
#[inline]
fn remove<T>(q: &mut VecDeque<(u64, T)>, id: u64) {
    if q.front().is_some_and(|e| e.0 == id) {
        q.pop_front();
    } else if q.back().is_some_and(|e| e.0 == id) {
        q.pop_back();
    } else if let Some(i) = q.iter().position(|e| e.0 == id) {
        q.remove(i);
    }
}

/// What both sides keep of a slot beside its last event, updated by [`History::after`] alike.
#[derive(Clone, Copy, Default)]
struct History {
    modes: u16,
    /// The id of the slot's event before its last.
    id_2: u64,
    /// See [`step`].
    stride: u64,
    /// The slot's last event's distance in time from the event before it.
    dt: u64,
}

impl History {
    /// The history once an event (`id`, `modes`, `dt` after the event before it) follows the
    /// slot's last event, whose id was `last_id`.
    #[inline]
    fn after(self, last_id: u64, id: u64, modes: u16, dt: u64) -> History {
        History {
            modes,
            id_2: last_id,
            stride: step(id, last_id, self.id_2),
            dt,
        }
    }

    /// The ids [`ID_STRIDE`] and [`ID_STRIDE_2`] predict, after the slot's last id `last_id`.
    #[inline]
    fn stepped(&self, last_id: u64) -> [u64; 2] {
        [
            last_id.wrapping_add(self.stride),
            self.id_2.wrapping_add(self.stride),
        ]
    }
}

#[derive(Clone, Copy, Default)]
struct Slot {
    prev: Event,
    h: History,
    /// Bytes the kept modes cost more than the best ones since they were chosen: the
    /// encoder switches once that pays for writing new modes.
    regret: u32,
}

/// The slot's step after `id`, from its last two ids: the smaller distance.
#[inline]
fn step(id: u64, id_1: u64, id_2: u64) -> u64 {
    let (d1, d2) = (id.wrapping_sub(id_1), id.wrapping_sub(id_2));
    if (d1 as i64).unsigned_abs() <= (d2 as i64).unsigned_abs() {
        d1
    } else {
        d2
    }
}

/// The prediction state both sides keep; reset at every chunk start.
#[derive(Clone)]
struct State {
    prev: Event,
    /// The id of the event before `prev`.
    prev_id_2: u64,
    slots: [Slot; SLOTS],
    requests: Requests<Known>,
}

impl State {
    fn reset(&mut self, base_ts: u64) {
        self.prev = Event {
            ts_ns: base_ts,
            ..Event::default()
        };
        self.prev_id_2 = 0;
        self.slots = [Slot::default(); SLOTS];
        self.requests.clear(Known::default());
    }
}

/// What the encoder's request memories keep of an event: what they predict.
#[derive(Clone, Copy, Default)]
struct Known {
    id: u64,
    sector: u64,
    aux64: u64,
    bytes: u32,
}

impl From<&Event> for Known {
    fn from(e: &Event) -> Known {
        Known {
            id: e.id,
            sector: e.sector,
            aux64: e.aux64,
            bytes: e.bytes,
        }
    }
}

/// What the request memories predict for one event (all zeros where they know nothing).
struct Linked {
    link: Known,
    oldest: Known,
    newest: Known,
    in_flight: u64,
}

/// Index of the smallest cost, preferring `keep` on ties.
#[inline]
fn best<const N: usize>(costs: [u32; N], keep: usize) -> usize {
    // The best cost is carried, not looked up again: this runs seven times an event.
    let (mut b, mut bc) = (keep, costs[keep]);
    for (i, c) in costs.into_iter().enumerate() {
        if c < bc {
            (b, bc) = (i, c);
        }
    }
    b
}

/// Encodes the events of one chunk. Reusable: [`EventEncoder::reset`] starts a new chunk.
pub struct EventEncoder {
    state: State,
    refs: References,
    count: u32,
    base_ts: u64,
}

impl Default for EventEncoder {
    fn default() -> Self {
        EventEncoder {
            state: State {
                prev: Event::default(),
                prev_id_2: 0,
                slots: [Slot::default(); SLOTS],
                requests: Requests::new(Known::default()),
            },
            refs: References::default(),
            count: 0,
            base_ts: 0,
        }
    }
}

impl EventEncoder {
    /// Events encoded since the last reset.
    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn base_ts(&self) -> u64 {
        self.base_ts
    }

    pub fn reset(&mut self) {
        self.count = 0;
        self.refs.devs.clear();
        self.refs.cgroups.clear();
    }

    /// Appends `ev` to `out`. The first event after a reset sets the chunk's base timestamp.
    #[inline]
    pub fn encode(&mut self, ev: &Event, out: &mut BytesMut) {
        if self.count == 0 {
            self.base_ts = ev.ts_ns;
            self.state.reset(ev.ts_ns);
        }
        self.count += 1;
        let si = slot_of(ev.kind);
        let state = &mut self.state;
        let (slot, p) = (&state.slots[si], &state.prev);
        // Only an event that names a first bio (requests do, bios do not) is worth asking the
        // request memories: an encoder's choice, which keeps the bios' cost as it was.
        let r = &state.requests;
        let linked = (ev.aux64 != 0).then(|| Linked {
            link: r.link(ev.id).unwrap_or_default(),
            oldest: r.oldest().unwrap_or_default(),
            newest: r.newest().unwrap_or_default(),
            in_flight: r.oldest_in_flight().unwrap_or_default(),
        });
        let (modes, regret) = choose_modes(ev, slot, p, state.prev_id_2, linked.as_ref());
        EventBytes::append(out, |o| self.refs.write(ev, slot, p, modes, o));
        // Updated in place: a slot is ~100 bytes, copied out and back an event cost more.
        let dt = ev.ts_ns.wrapping_sub(p.ts_ns);
        state.prev_id_2 = p.id;
        let slot = &mut state.slots[si];
        slot.h = slot.h.after(slot.prev.id, ev.id, modes, dt);
        slot.prev = *ev;
        slot.regret = regret;
        state.prev = *ev;
        state.requests.note(ev, Known::from(ev));
    }
}

/// The chunk's dictionaries of devices and cgroups: an event names one by its index once it
/// has been written out in full.
#[derive(Default)]
struct References {
    devs: Vec<u32>,
    cgroups: HashMap<u64, u64>,
}

impl References {
    /// The event's head byte, then what it says follows.
    #[inline(always)]
    fn write(&mut self, ev: &Event, slot: &Slot, p: &Event, modes: u16, out: &mut EventBytes) {
        let (sp, m) = (&slot.prev, slot.h.modes);
        let mut head = ev.kind.min(KIND_ESCAPE);
        if modes != m {
            head |= H_MODES;
        }
        let attrs = (ev.op, ev.path, ev.flags) != (sp.op, sp.path, sp.flags);
        if attrs {
            head |= H_ATTRS;
        }
        if ev.dev != p.dev {
            head |= H_DEV;
        }
        let [id_mode, sec_mode, bytes_mode, aux_mode, a64_mode, cg_mode, ts_mode] =
            field_modes(modes);
        let cgroup = [p.cgroup_id, sp.cgroup_id][cg_mode];
        if ev.cgroup_id != cgroup {
            head |= H_CGROUP;
        }
        out.u8(head);
        if ev.kind >= KIND_ESCAPE {
            out.u8(ev.kind);
        }
        if modes != m {
            out.varint((modes ^ m) as u64);
        }
        if attrs {
            out.u8(ev.op);
            out.u8(ev.path);
            out.u8(ev.flags);
        }
        let dt = ev.ts_ns.wrapping_sub(p.ts_ns);
        let base = if ts_mode == TS_SLOT { slot.h.dt } else { 0 };
        out.varint(zigzag(dt.wrapping_sub(base) as i64));
        if ev.dev != p.dev {
            match self.devs.iter().position(|d| *d == ev.dev) {
                Some(i) => out.varint(i as u64 + 1),
                None => {
                    out.u8(0);
                    out.varint(ev.dev as u64);
                    self.devs.push(ev.dev);
                }
            }
        }
        if ev.cgroup_id != cgroup {
            match self.cgroups.get(&ev.cgroup_id) {
                Some(i) => out.varint(*i + 1),
                None => {
                    out.u8(0);
                    out.varint(ev.cgroup_id);
                    let n = self.cgroups.len() as u64;
                    self.cgroups.insert(ev.cgroup_id, n);
                }
            }
        }
        // The field modes pick a base by index (not a `match`: its jump table mispredicts).
        if id_mode != ID_PREV && id_mode < ID_STRIDE {
            out.varint(ev.id ^ [0, sp.id, p.id, p.aux64][id_mode]);
        }
        if sec_mode == SEC_DELTA_PREV || sec_mode == SEC_DELTA_SLOT {
            let base = [p.sector, sp.sector][sec_mode - SEC_DELTA_PREV];
            out.varint(zigzag(ev.sector.wrapping_sub(base) as i64));
        }
        if bytes_mode == BYTES_LIT {
            out.varint(ev.bytes as u64);
        }
        if aux_mode == AUX_LIT {
            out.varint(ev.aux as u64);
        }
        if a64_mode != A64_SLOT && a64_mode < A64_LINK {
            out.varint(ev.aux64 ^ [0, ev.id, p.id, sp.aux64][a64_mode]);
        }
    }
}

/// Field modes for `ev` and the slot's regret after it: the slot's last modes while they cost
/// no more than the cheapest per field, or until what they cost more since adds up to the
/// new modes' varint.
#[inline]
fn choose_modes(
    ev: &Event,
    slot: &Slot,
    p: &Event,
    prev_id_2: u64,
    l: Option<&Linked>,
) -> (u16, u32) {
    let sp = slot.prev;
    let exact = |hit: bool| if hit { 0 } else { NO };
    // Without the memories' predictions, their modes cannot be chosen.
    let (no, l) = match l {
        Some(l) => (0, l),
        None => (
            NO,
            &Linked {
                link: Known::default(),
                oldest: Known::default(),
                newest: Known::default(),
                in_flight: 0,
            },
        ),
    };
    let known = |hit: bool| exact(hit) | no;
    let [stepped, stepped_2] = slot.h.stepped(sp.id);
    let id_c = [
        exact(ev.id == p.id),
        varint_len(ev.id ^ sp.id),
        varint_len(ev.id ^ p.id),
        varint_len(ev.id ^ p.aux64),
        exact(ev.id == stepped),
        known(ev.id == l.in_flight),
        exact(ev.id == stepped_2),
        exact(ev.id == prev_id_2),
    ];
    let seq = sp.sector.wrapping_add((sp.bytes >> 9) as u64);
    let sec_c = [
        exact(ev.sector == p.sector),
        exact(ev.sector == seq),
        varint_len(zigzag(ev.sector.wrapping_sub(p.sector) as i64)),
        varint_len(zigzag(ev.sector.wrapping_sub(sp.sector) as i64)),
        known(ev.sector == l.link.sector),
        known(ev.sector == l.oldest.sector),
        known(ev.sector == l.newest.sector),
    ];
    let bytes_c = [
        exact(ev.bytes == sp.bytes),
        varint_len(ev.bytes as u64),
        known(ev.bytes == l.link.bytes),
        known(ev.bytes == l.oldest.bytes),
    ];
    let aux_c = [exact(ev.aux == sp.aux), varint_len(ev.aux as u64)];
    let a64_c = [
        exact(ev.aux64 == sp.aux64),
        varint_len(ev.aux64 ^ ev.id),
        varint_len(ev.aux64 ^ p.id),
        varint_len(ev.aux64 ^ sp.aux64),
        known(ev.aux64 == l.link.aux64),
        known(ev.aux64 == l.oldest.id),
        known(ev.aux64 == l.newest.id),
    ];
    // A cgroup reference costs its head bit's worth of nothing and about a byte.
    let cg_c = [
        (ev.cgroup_id != p.cgroup_id) as u32,
        (ev.cgroup_id != sp.cgroup_id) as u32,
    ];
    let dt = ev.ts_ns.wrapping_sub(p.ts_ns);
    let ts_c = [
        varint_len(zigzag(dt as i64)),
        varint_len(zigzag(dt.wrapping_sub(slot.h.dt) as i64)),
    ];
    let m = slot.h.modes;
    let k = field_modes(m);
    let keep_cost =
        id_c[k[0]] + sec_c[k[1]] + bytes_c[k[2]] + aux_c[k[3]] + a64_c[k[4]] + cg_c[k[5]];
    let ts_keep = ts_c[k[6]];
    if keep_cost == 0 && ts_keep <= ts_c[0].min(ts_c[1]) {
        return (m, 0);
    }
    let b = [
        best(id_c, k[0]),
        best(sec_c, k[1]),
        best(bytes_c, k[2]),
        best(aux_c, k[3]),
        best(a64_c, k[4]),
        best(cg_c, k[5]),
        best(ts_c, k[6]),
    ];
    let new = modes_word(b);
    let best_cost =
        id_c[b[0]] + sec_c[b[1]] + bytes_c[b[2]] + aux_c[b[3]] + a64_c[b[4]] + cg_c[b[5]];
    let (keep_cost, best_cost) = (keep_cost + ts_keep, best_cost + ts_c[b[6]]);
    if keep_cost <= best_cost {
        return (m, 0);
    }
    let regret = slot.regret.saturating_add(keep_cost - best_cost);
    if regret < varint_len((new ^ m) as u64) {
        (m, regret)
    } else {
        (new, 0)
    }
}

/// A dictionary reference: 0 = a new value follows (added to `dict`), n = `dict[n - 1]`.
#[inline]
fn dictionary<T: Copy>(
    c: &mut Cursor,
    dict: &mut Vec<T>,
    new: impl Fn(&mut Cursor) -> Result<T, DecodeError>,
    past_the_end: &'static str,
) -> Result<T, DecodeError> {
    match c.varint()? {
        0 => {
            let v = new(c)?;
            dict.push(v);
            Ok(v)
        }
        r => dict
            .get((r - 1) as usize)
            .copied()
            .ok_or(c.err(past_the_end)),
    }
}

/// Decodes events chunks of one format version. Reusable: keeps its dictionaries' and
/// tables' allocations between chunks.
///
/// The prediction state is the chunk's events decoded so far: `prev` is the last one, each
/// slot and each request memory entry an index into them, so an event is written once, into
/// the output.
pub struct EventDecoder {
    version: u16,
    slots: [DecoderSlot; SLOTS],
    requests: Requests<u32>,
    devs: Vec<u32>,
    cgroups: Vec<u64>,
}

impl Default for EventDecoder {
    /// A decoder of the newest format.
    fn default() -> Self {
        EventDecoder::for_version(super::format::FORMAT_VERSION)
    }
}

/// What the decoder keeps per slot: the index of its last event in the output (`NONE`: none
/// yet), and its history.
#[derive(Clone, Copy)]
struct DecoderSlot {
    last: u32,
    h: History,
}

const EMPTY_SLOT: DecoderSlot = DecoderSlot {
    last: NONE,
    h: History {
        modes: 0,
        id_2: 0,
        stride: 0,
        dt: 0,
    },
};

/// A slot or memory without an event in the chunk yet: it predicts from the all-zero event.
const NONE: u32 = u32::MAX;
const ZERO: Event = Event {
    ts_ns: 0,
    cgroup_id: 0,
    id: 0,
    aux64: 0,
    sector: 0,
    dev: 0,
    bytes: 0,
    aux: 0,
    kind: 0,
    op: 0,
    path: 0,
    flags: 0,
};

impl EventDecoder {
    /// A decoder of format `version`'s events chunks (1, or 2 and 3: the same bytes).
    pub fn for_version(version: u16) -> Self {
        EventDecoder {
            version,
            slots: [EMPTY_SLOT; SLOTS],
            requests: Requests::new(NONE),
            devs: Vec::new(),
            cgroups: Vec::new(),
        }
    }

    /// Decodes `count` events of a payload into `out` (cleared first). The payload must hold
    /// exactly those events.
    pub fn decode(
        &mut self,
        payload: &[u8],
        count: u32,
        base_ts: u64,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        out.clear();
        // Each event takes at least 2 bytes (head, timestamp): bounds the allocation.
        if count as usize > payload.len() / 2 {
            return Err(DecodeError {
                offset: 0,
                what: "event count larger than the payload can hold",
            });
        }
        out.reserve(count as usize);
        self.slots = [EMPTY_SLOT; SLOTS];
        self.requests.clear(NONE);
        self.devs.clear();
        self.cgroups.clear();
        let start = Event {
            ts_ns: base_ts,
            ..ZERO
        };
        let mut c = Cursor::new(payload);
        for _ in 0..count {
            let ev = self.event(&mut c, out.last().unwrap_or(&start), out)?;
            self.requests.note(&ev, out.len() as u32);
            out.push(ev);
        }
        if !c.at_end() {
            return Err(c.err("bytes left over after the chunk's last event"));
        }
        Ok(())
    }

    /// One event: its head, then what the head says follows. `p` is the previous event,
    /// `done` the chunk's events so far (the slots and request memories index them).
    #[inline]
    fn event(&mut self, c: &mut Cursor, p: &Event, done: &[Event]) -> Result<Event, DecodeError> {
        // An empty table entry holds NONE (with id 0): the all-zero event, as the encoder's.
        let at = |i: Option<u32>| match i {
            Some(i) if i != NONE => &done[i as usize],
            _ => &ZERO,
        };
        let head = c.u8()?;
        let kind = match head & 0x0f {
            KIND_ESCAPE => c.u8()?,
            k => k,
        };
        let si = slot_of(kind);
        let slot = self.slots[si];
        let slot_modes = slot.h.modes;
        let sp = at(Some(slot.last));
        let modes = if head & H_MODES == 0 {
            slot_modes
        } else if self.version == 1 {
            modes_from_v1(c.u8()?)
        } else {
            let m = c.varint()? ^ slot_modes as u64;
            let f = field_modes(m as u16);
            if m > MODES_MAX as u64 || f[1] >= SEC_MODES || f[4] >= A64_MODES {
                return Err(c.err("unknown field mode"));
            }
            m as u16
        };
        let (op, path, flags) = if head & H_ATTRS != 0 {
            (c.u8()?, c.u8()?, c.u8()?)
        } else {
            (sp.op, sp.path, sp.flags)
        };
        let [id_mode, sec_mode, bytes_mode, aux_mode, a64_mode, cg_mode, ts_mode] =
            field_modes(modes);
        let base = if ts_mode == TS_SLOT { slot.h.dt } else { 0 };
        let dt = (unzigzag(c.varint()?) as u64).wrapping_add(base);
        let ts_ns = p.ts_ns.wrapping_add(dt);
        let dev = if head & H_DEV != 0 {
            let new = |c: &mut Cursor| c.varint_u32();
            dictionary(
                c,
                &mut self.devs,
                new,
                "device reference past the chunk's dictionary",
            )?
        } else {
            p.dev
        };
        let cgroup_id = if head & H_CGROUP != 0 {
            let new = |c: &mut Cursor| c.varint();
            dictionary(
                c,
                &mut self.cgroups,
                new,
                "cgroup reference past the chunk's dictionary",
            )?
        } else if cg_mode == CG_SLOT {
            sp.cgroup_id
        } else {
            p.cgroup_id
        };
        // As the encoder, the field modes pick a base by index, not with a jump table.
        let id = match id_mode {
            ID_PREV => p.id,
            ID_STRIDE => slot.h.stepped(sp.id)[0],
            ID_IN_FLIGHT => self.requests.oldest_in_flight().unwrap_or(0),
            ID_STRIDE_2 => slot.h.stepped(sp.id)[1],
            ID_PREV_2 => done.len().checked_sub(2).map_or(0, |i| done[i].id),
            m => [0, sp.id, p.id, p.aux64][m] ^ c.varint()?,
        };
        let (link, oldest, newest) =
            if sec_mode >= SEC_LINK || bytes_mode > BYTES_LIT || a64_mode >= A64_LINK {
                (
                    at(self.requests.link(id)),
                    at(self.requests.oldest()),
                    at(self.requests.newest()),
                )
            } else {
                (&ZERO, &ZERO, &ZERO)
            };
        let sector = match sec_mode {
            SEC_DELTA_PREV | SEC_DELTA_SLOT => {
                let base = [p.sector, sp.sector][sec_mode - SEC_DELTA_PREV];
                base.wrapping_add(unzigzag(c.varint()?) as u64)
            }
            m => {
                let seq = sp.sector.wrapping_add((sp.bytes >> 9) as u64);
                [
                    p.sector,
                    seq,
                    0,
                    0,
                    link.sector,
                    oldest.sector,
                    newest.sector,
                ][m]
            }
        };
        let bytes = match bytes_mode {
            BYTES_LIT => c.varint_u32()?,
            m => [sp.bytes, 0, link.bytes, oldest.bytes][m],
        };
        let aux = if aux_mode == AUX_LIT {
            c.varint_u32()?
        } else {
            sp.aux
        };
        let aux64 = match a64_mode {
            A64_SLOT => sp.aux64,
            m if m >= A64_LINK => [link.aux64, oldest.id, newest.id][m - A64_LINK],
            m => [0, id, p.id, sp.aux64][m] ^ c.varint()?,
        };
        self.slots[si] = DecoderSlot {
            last: done.len() as u32,
            h: slot.h.after(sp.id, id, modes, dt),
        };
        Ok(Event {
            ts_ns,
            cgroup_id,
            id,
            aux64,
            sector,
            dev,
            bytes,
            aux,
            kind,
            op,
            path,
            flags,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_varints() {
        for v in [
            0u64,
            1,
            127,
            128,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len() as u32, varint_len(v), "{v}");
            let mut c = Cursor::new(&out);
            assert_eq!(c.varint().unwrap(), v);
            assert!(c.at_end());
        }
        for v in [0i64, 1, -1, i64::MIN, i64::MAX, 12345, -12345] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        // 11 bytes, or a 10th byte with more than the top bit: not a u64.
        let too_long = [0xffu8; 10];
        assert!(Cursor::new(&too_long).varint().is_err());
        let mut over = vec![0xffu8; 9];
        over.push(0x02);
        assert!(Cursor::new(&over).varint().is_err());
        assert!(Cursor::new(&[0x80]).varint().is_err());
    }

    #[test]
    fn capture_max_event_len_holds() {
        let worst = Event {
            ts_ns: 1 << 63,
            cgroup_id: u64::MAX,
            id: u64::MAX,
            aux64: 1 << 63,
            sector: 1 << 63,
            dev: u32::MAX,
            bytes: u32::MAX,
            aux: u32::MAX,
            kind: 0xff,
            op: 1,
            path: 1,
            flags: 1,
        };
        let mut enc = EventEncoder::default();
        let mut out = BytesMut::new();
        enc.encode(&Event::default(), &mut out);
        let before = out.len();
        enc.encode(&worst, &mut out);
        assert!(out.len() - before <= MAX_EVENT_LEN);
    }
}
