//! The event codec of events chunks: each event a head byte and the fields it cannot predict
//! from the previous event of the chunk or of its kind, as varints. Pure; the layout is in
//! docs/capture-format.md, and any change to what a byte means bumps the format version.
use bytes::{BufMut, BytesMut};
use foldhash::{HashMap, HashMapExt};

use mergetrace_common::Event;

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

/// The longest an encoded event can be: head, kind, modes, 3 attribute bytes, timestamp,
/// device and cgroup references with their new values, id, sector, bytes, aux, aux64.
pub const MAX_EVENT_LEN: usize = 1 + 1 + 1 + 3 + 10 + (1 + 5) + (1 + 10) + 10 + 10 + 5 + 5 + 10;

/// One event's bytes, built on the stack and appended to the chunk in one fixed-size copy:
/// a plain store per byte (the mask bounds the index) instead of a capacity check per byte.
struct Scratch {
    buf: [u8; SCRATCH_LEN],
    len: usize,
}

const SCRATCH_LEN: usize = 128;
const _: () = assert!(MAX_EVENT_LEN <= SCRATCH_LEN);

impl Scratch {
    #[inline(always)]
    fn u8(&mut self, b: u8) {
        self.buf[self.len & (SCRATCH_LEN - 1)] = b;
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

    /// Appends the event's bytes to `out`.
    #[inline(always)]
    fn append_to(&self, out: &mut BytesMut) {
        let at = out.len();
        out.reserve(SCRATCH_LEN);
        for (to, b) in out.spare_capacity_mut()[..SCRATCH_LEN]
            .iter_mut()
            .zip(&self.buf)
        {
            to.write(*b);
        }
        // SAFETY: the `len` bytes past `at` were just written (len <= MAX_EVENT_LEN <=
        // SCRATCH_LEN: no event is longer, `capture_max_event_len_holds`).
        unsafe { out.set_len(at + self.len.min(SCRATCH_LEN)) };
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
// previous event of the chunk (`prev`) and from the previous event with the same kind slot
// (`slot`; kinds 0..=14 have their own slot, every larger kind shares slot 15).
//
// head: bits 0-3 kind (15 = a kind byte follows), 0x10 modes byte follows (else the slot's
// last modes), 0x20 op/path/flags bytes follow (else the slot's), 0x40 dev reference follows
// (else prev's), 0x80 cgroup reference follows (else prev's).
//
// modes: bits 0-1 id, 2-3 sector, 4 bytes, 5 aux, 6-7 aux64 (see the constants below).

const SLOTS: usize = 16;
const KIND_ESCAPE: u8 = 15;

const H_MODES: u8 = 0x10;
const H_ATTRS: u8 = 0x20;
const H_DEV: u8 = 0x40;
const H_CGROUP: u8 = 0x80;

/// id = prev.id
const ID_PREV: u8 = 0;
/// id = slot.id ^ varint
const ID_XOR_SLOT: u8 = 1;
/// id = prev.id ^ varint
const ID_XOR_PREV: u8 = 2;
// 3: id = prev.aux64 ^ varint

/// sector = prev.sector
const SEC_PREV: u8 = 0;
/// sector = slot.sector + slot.bytes / 512 (the slot's I/O continues)
const SEC_SEQ: u8 = 1;
/// sector = prev.sector + zigzag varint
const SEC_DELTA_PREV: u8 = 2;
// 3: sector = slot.sector + zigzag varint

/// bytes / aux: 0 = slot's, 1 = varint follows.
const VAL_SLOT: u8 = 0;
const VAL_LIT: u8 = 1;

/// aux64 = slot.aux64
const A64_SLOT: u8 = 0;
/// aux64 = id ^ varint (this event's id)
const A64_XOR_ID: u8 = 1;
/// aux64 = prev.id ^ varint
const A64_XOR_PREV_ID: u8 = 2;
// 3: aux64 = slot.aux64 ^ varint

// The encoder and decoder pick each field's base by indexing an array with its mode (a jump
// table per field mispredicts): the arrays follow these values.
const _: () = assert!(
    ID_PREV == 0
        && ID_XOR_SLOT == 1
        && ID_XOR_PREV == 2
        && SEC_PREV == 0
        && SEC_SEQ == 1
        && SEC_DELTA_PREV == 2
        && A64_SLOT == 0
        && A64_XOR_ID == 1
        && A64_XOR_PREV_ID == 2
);

const NO: u32 = 1 << 16; // cost of an option that cannot encode the value

#[inline]
fn slot_of(kind: u8) -> usize {
    (kind as usize).min(SLOTS - 1)
}

#[inline]
fn modes_byte(id: u8, sector: u8, bytes: u8, aux: u8, aux64: u8) -> u8 {
    id | sector << 2 | bytes << 4 | aux << 5 | aux64 << 6
}

#[derive(Clone, Copy, Default)]
struct Slot {
    prev: Event,
    modes: u8,
}

/// The prediction state both sides keep; reset at every chunk start.
#[derive(Clone)]
struct State {
    prev: Event,
    slots: [Slot; SLOTS],
}

impl State {
    fn new(base_ts: u64) -> State {
        State {
            prev: Event {
                ts_ns: base_ts,
                ..Event::default()
            },
            slots: [Slot::default(); SLOTS],
        }
    }
}

/// Index of the smallest cost, preferring `keep` on ties.
#[inline]
fn best<const N: usize>(costs: [u32; N], keep: usize) -> usize {
    let mut b = keep;
    for (i, c) in costs.iter().enumerate() {
        if *c < costs[b] {
            b = i;
        }
    }
    b
}

/// Encodes the events of one chunk. Reusable: [`EventEncoder::reset`] starts a new chunk.
pub struct EventEncoder {
    state: State,
    devs: Vec<u32>,
    cgroups: HashMap<u64, u64>,
    count: u32,
    base_ts: u64,
}

impl Default for EventEncoder {
    fn default() -> Self {
        EventEncoder {
            state: State::new(0),
            devs: Vec::new(),
            cgroups: HashMap::new(),
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
        self.devs.clear();
        self.cgroups.clear();
    }

    /// Appends `ev` to `out`. The first event after a reset sets the chunk's base timestamp.
    #[inline]
    pub fn encode(&mut self, ev: &Event, out: &mut BytesMut) {
        if self.count == 0 {
            self.base_ts = ev.ts_ns;
            self.state = State::new(ev.ts_ns);
        }
        self.count += 1;
        let si = slot_of(ev.kind);
        let slot = self.state.slots[si];
        let p = self.state.prev;
        let modes = choose_modes(ev, &slot, &p);
        self.write(ev, &slot, &p, modes, out);
        self.state.slots[si] = Slot { prev: *ev, modes };
        self.state.prev = *ev;
    }

    /// The head byte, then what it says follows.
    #[inline]
    fn write(&mut self, ev: &Event, slot: &Slot, p: &Event, modes: u8, out: &mut BytesMut) {
        let mut o = Scratch {
            buf: [0; SCRATCH_LEN],
            len: 0,
        };
        self.write_into(ev, slot, p, modes, &mut o);
        o.append_to(out);
    }

    #[inline(always)]
    fn write_into(&mut self, ev: &Event, slot: &Slot, p: &Event, modes: u8, out: &mut Scratch) {
        let (sp, m) = (slot.prev, slot.modes);
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
        if ev.cgroup_id != p.cgroup_id {
            head |= H_CGROUP;
        }
        out.u8(head);
        if ev.kind >= KIND_ESCAPE {
            out.u8(ev.kind);
        }
        if modes != m {
            out.u8(modes);
        }
        if attrs {
            out.u8(ev.op);
            out.u8(ev.path);
            out.u8(ev.flags);
        }
        out.varint(zigzag(ev.ts_ns.wrapping_sub(p.ts_ns) as i64));
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
        if ev.cgroup_id != p.cgroup_id {
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
        let id_mode = modes & 3;
        if id_mode != ID_PREV {
            out.varint(ev.id ^ [0, sp.id, p.id, p.aux64][id_mode as usize]);
        }
        let sec_mode = modes >> 2 & 3;
        if sec_mode >= SEC_DELTA_PREV {
            let base = [p.sector, sp.sector][(sec_mode - SEC_DELTA_PREV) as usize];
            out.varint(zigzag(ev.sector.wrapping_sub(base) as i64));
        }
        if modes >> 4 & 1 == VAL_LIT {
            out.varint(ev.bytes as u64);
        }
        if modes >> 5 & 1 == VAL_LIT {
            out.varint(ev.aux as u64);
        }
        let a64_mode = modes >> 6;
        if a64_mode != A64_SLOT {
            out.varint(ev.aux64 ^ [0, ev.id, p.id, sp.aux64][a64_mode as usize]);
        }
    }
}

/// Field modes for `ev`: the cheapest per field, unless the slot's last modes cost no more
/// than the cheapest plus the modes byte.
#[inline]
fn choose_modes(ev: &Event, slot: &Slot, p: &Event) -> u8 {
    let sp = slot.prev;
    let id_c = [
        if ev.id == p.id { 0 } else { NO },
        varint_len(ev.id ^ sp.id),
        varint_len(ev.id ^ p.id),
        varint_len(ev.id ^ p.aux64),
    ];
    let seq = sp.sector.wrapping_add((sp.bytes >> 9) as u64);
    let sec_c = [
        if ev.sector == p.sector { 0 } else { NO },
        if ev.sector == seq { 0 } else { NO },
        varint_len(zigzag(ev.sector.wrapping_sub(p.sector) as i64)),
        varint_len(zigzag(ev.sector.wrapping_sub(sp.sector) as i64)),
    ];
    let bytes_c = [
        if ev.bytes == sp.bytes { 0 } else { NO },
        varint_len(ev.bytes as u64),
    ];
    let aux_c = [
        if ev.aux == sp.aux { 0 } else { NO },
        varint_len(ev.aux as u64),
    ];
    let a64_c = [
        if ev.aux64 == sp.aux64 { 0 } else { NO },
        varint_len(ev.aux64 ^ ev.id),
        varint_len(ev.aux64 ^ p.id),
        varint_len(ev.aux64 ^ sp.aux64),
    ];
    let m = slot.modes;
    let (k_id, k_sec, k_bytes, k_aux, k_a64) = (
        (m & 3) as usize,
        (m >> 2 & 3) as usize,
        (m >> 4 & 1) as usize,
        (m >> 5 & 1) as usize,
        (m >> 6 & 3) as usize,
    );
    let keep_cost = id_c[k_id] + sec_c[k_sec] + bytes_c[k_bytes] + aux_c[k_aux] + a64_c[k_a64];
    let (b_id, b_sec, b_bytes, b_aux, b_a64) = (
        best(id_c, k_id),
        best(sec_c, k_sec),
        best(bytes_c, k_bytes),
        best(aux_c, k_aux),
        best(a64_c, k_a64),
    );
    let best_cost = 1 + id_c[b_id] + sec_c[b_sec] + bytes_c[b_bytes] + aux_c[b_aux] + a64_c[b_a64];
    if keep_cost <= best_cost {
        m
    } else {
        modes_byte(
            b_id as u8,
            b_sec as u8,
            b_bytes as u8,
            b_aux as u8,
            b_a64 as u8,
        )
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

/// Decodes events chunks. Reusable: keeps its dictionaries' allocations between chunks.
///
/// The prediction state is the chunk's events decoded so far: `prev` is the last one and
/// each slot an index into them, so an event is written once, into the output.
#[derive(Default)]
pub struct EventDecoder {
    /// Per slot: the index of its last event in the output (`NONE`: none yet), and its modes.
    slots: [(u32, u8); SLOTS],
    devs: Vec<u32>,
    cgroups: Vec<u64>,
}

/// A slot without an event in the chunk yet: it predicts from the all-zero event.
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
        self.slots = [(NONE, 0); SLOTS];
        self.devs.clear();
        self.cgroups.clear();
        let start = Event {
            ts_ns: base_ts,
            ..ZERO
        };
        let mut c = Cursor::new(payload);
        for _ in 0..count {
            let ev = self.event(&mut c, out.last().unwrap_or(&start), out)?;
            out.push(ev);
        }
        if !c.at_end() {
            return Err(c.err("bytes left over after the chunk's last event"));
        }
        Ok(())
    }

    /// One event: its head, then what the head says follows. `p` is the previous event,
    /// `done` the chunk's events so far (the slots index them).
    #[inline]
    fn event(&mut self, c: &mut Cursor, p: &Event, done: &[Event]) -> Result<Event, DecodeError> {
        let head = c.u8()?;
        let kind = match head & 0x0f {
            KIND_ESCAPE => c.u8()?,
            k => k,
        };
        let si = slot_of(kind);
        let (last, slot_modes) = self.slots[si];
        let sp = if last == NONE {
            &ZERO
        } else {
            &done[last as usize]
        };
        let modes = if head & H_MODES != 0 {
            c.u8()?
        } else {
            slot_modes
        };
        let (op, path, flags) = if head & H_ATTRS != 0 {
            (c.u8()?, c.u8()?, c.u8()?)
        } else {
            (sp.op, sp.path, sp.flags)
        };
        let ts_ns = p.ts_ns.wrapping_add(unzigzag(c.varint()?) as u64);
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
        } else {
            p.cgroup_id
        };
        // As the encoder, the field modes pick a base by index, not with a jump table.
        let id_mode = modes & 3;
        let id = if id_mode == ID_PREV {
            p.id
        } else {
            [0, sp.id, p.id, p.aux64][id_mode as usize] ^ c.varint()?
        };
        let sec_mode = modes >> 2 & 3;
        let sector = if sec_mode < SEC_DELTA_PREV {
            let seq = sp.sector.wrapping_add((sp.bytes >> 9) as u64);
            [p.sector, seq][sec_mode as usize]
        } else {
            let base = [p.sector, sp.sector][(sec_mode - SEC_DELTA_PREV) as usize];
            base.wrapping_add(unzigzag(c.varint()?) as u64)
        };
        let bytes = if modes >> 4 & 1 == VAL_SLOT {
            sp.bytes
        } else {
            c.varint_u32()?
        };
        let aux = if modes >> 5 & 1 == VAL_SLOT {
            sp.aux
        } else {
            c.varint_u32()?
        };
        let a64_mode = modes >> 6;
        let aux64 = if a64_mode == A64_SLOT {
            sp.aux64
        } else {
            [0, id, p.id, sp.aux64][a64_mode as usize] ^ c.varint()?
        };
        self.slots[si] = (done.len() as u32, modes);
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
