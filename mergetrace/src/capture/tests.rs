//! Capture format tests: exact round trips, cut and corrupted files, compactness, files.
//! No timing assertions anywhere.
use std::{io, os::unix::fs::PermissionsExt, path::PathBuf};

use mergetrace_common::{flags, kind, path, Event};
use proptest::prelude::*;

use super::{
    format::{
        self, chunk, ChunkHeader, EventDecoder, EventEncoder, CHUNK_HEADER_LEN, PREAMBLE_LEN,
    },
    *,
};

// ---- helpers -------------------------------------------------------------------------------

/// Small deterministic PRNG (xorshift64*): the streams below must not change between runs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn test_header() -> Header {
    Header {
        format_version: FORMAT_VERSION,
        mergetrace_version: "0.1.0".into(),
        kernel_release: "6.8.0-test".into(),
        tier: "tracepoint".into(),
        start_monotonic_ns: 1_000_000_000_000,
        start_unix_ns: 1_767_225_600_000_000_000,
        devices: vec![RecordedDevice {
            name: "nvme0n1".into(),
            major: 259,
            minor: 0,
            bio_based: false,
            notes: vec![],
            queue: RecordedQueue {
                scheduler: Some("none".into()),
                nomerges: Some(0),
                max_sectors_kb: Some(128),
                max_segments: Some(127),
                nr_requests: Some(1023),
                rotational: Some(false),
                ..RecordedQueue::default()
            },
        }],
        cgroup_hierarchy: "v2".into(),
        cgroup_mount: "/sys/fs/cgroup".into(),
        cgroups: vec![
            RecordedCgroup {
                id: 1,
                path: "/".into(),
            },
            RecordedCgroup {
                id: 4242,
                path: "/mt".into(),
            },
        ],
        limits: vec![RecordedLimits {
            cgroup: "/mt".into(),
            major: 259,
            minor: 0,
            wiops: Some(500),
            ..RecordedLimits::default()
        }],
        meter_units: vec![16384, 262144],
        reissues_flagged: true,
        ..Header::default()
    }
}

/// What a test writes: events and lost records in order.
#[derive(Debug, Clone)]
enum Op {
    Events(Vec<Event>),
    Lost(u8, u64),
    Flush,
}

fn write_mem(ops: &[Op], chunk_events: u32, finish: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    let opts = WriterOptions {
        overwrite: false,
        chunk_events,
    };
    let mut w = CaptureWriter::from_sink(&mut buf, "mem.mtr", &test_header(), opts).unwrap();
    for op in ops {
        match op {
            Op::Events(v) => w.write_events(v).unwrap(),
            Op::Lost(k, n) => w.write_lost(*k, *n).unwrap(),
            Op::Flush => w.flush().unwrap(),
        }
    }
    if finish {
        w.finish().unwrap();
    } else {
        w.flush().unwrap();
        drop(w);
    }
    buf
}

fn read_mem(bytes: &[u8]) -> anyhow::Result<Capture> {
    CaptureReader::from_reader(bytes, "mem.mtr")?.read_all()
}

/// The stream a reader should see for `ops`: events in order, lost records in order (a run of
/// lost records without events between them adds up per kind, as the writer does).
fn flatten(records: &[Record]) -> (Vec<Event>, Vec<(usize, u8, u64)>) {
    let mut events = Vec::new();
    let mut lost = Vec::new();
    for r in records {
        match r {
            Record::Events(v) => events.extend_from_slice(v),
            Record::Lost { kind, count } => lost.push((events.len(), *kind, *count)),
        }
    }
    (events, lost)
}

fn expected(ops: &[Op]) -> (Vec<Event>, Vec<(usize, u8, u64)>) {
    let mut events = Vec::new();
    let mut lost: Vec<(usize, u8, u64)> = Vec::new();
    for op in ops {
        match op {
            Op::Events(v) => events.extend_from_slice(v),
            Op::Lost(_, 0) | Op::Flush => {}
            Op::Lost(k, n) => {
                let at = events.len();
                match lost.iter_mut().find(|(a, kk, _)| *a == at && kk == k) {
                    Some(e) => e.2 = e.2.saturating_add(*n),
                    None => lost.push((at, *k, *n)),
                }
            }
        }
    }
    (events, lost)
}

/// A realistic block-layer stream: writers in four cgroups each submitting batches of 32
/// sequential 4 KiB bios under a plug (bio_queue, getrq for the first, plug back merges for
/// the rest), the unplug, one 128 KiB request inserted and issued, its completion a couple of
/// batches later; now and then a single random 4 KiB read. Kernel addresses vary in their low
/// bits like slab objects and a tag set's requests do.
fn realistic_stream(batches: usize, seed: u64) -> Vec<Event> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let dev = 259 << 20;
    let cgroups = [4242u64, 4243, 5120, 6001];
    let queue = 0xffff_8881_0440_2000u64;
    let mut ts = 1_000_000_000_000u64 + rng.below(1_000_000_000);
    let mut cursor = [0u64, 1 << 24, 2 << 24, 3 << 24];
    let mut inflight: Vec<Event> = Vec::new();
    let mut out = Vec::new();
    let bio_addr = |rng: &mut Rng| 0xffff_8881_0a2b_0000u64 + (rng.below(1024) << 8);
    for b in 0..batches {
        let w = rng.below(4) as usize;
        let cg = cgroups[w];
        let rq = 0xffff_8881_0c40_0000u64 + (b as u64 % 64) * 0x1c0;
        let rules = if w == 0 { flags::RULES_IOPS } else { 0 };
        let (first_bio, sector, bytes, op) = if b % 8 == 7 {
            // A random 4 KiB read: its own request.
            let bio = bio_addr(&mut rng);
            let sector = rng.below(1 << 30) * 8;
            ts += 2_000 + rng.below(20_000);
            let ev = Event {
                ts_ns: ts,
                cgroup_id: cg,
                id: bio,
                sector,
                dev,
                bytes: 4096,
                kind: kind::BIO_QUEUE,
                op: 0,
                flags: rules,
                ..Event::default()
            };
            out.push(ev);
            ts += 150 + rng.below(300);
            out.push(Event {
                ts_ns: ts,
                kind: kind::GETRQ,
                flags: 0,
                ..ev
            });
            (bio, sector, 4096u32, 0u8)
        } else {
            let start = cursor[w];
            cursor[w] += 256;
            let mut first = 0;
            for i in 0..32u64 {
                ts += 200 + rng.below(1_500);
                let bio = bio_addr(&mut rng);
                let ev = Event {
                    ts_ns: ts,
                    cgroup_id: cg,
                    id: bio,
                    sector: start + 8 * i,
                    dev,
                    bytes: 4096,
                    kind: kind::BIO_QUEUE,
                    op: 1,
                    flags: rules,
                    ..Event::default()
                };
                out.push(ev);
                ts += 100 + rng.below(400);
                if i == 0 {
                    first = bio;
                    out.push(Event {
                        ts_ns: ts,
                        kind: kind::GETRQ,
                        flags: 0,
                        ..ev
                    });
                } else {
                    out.push(Event {
                        ts_ns: ts,
                        kind: kind::BACK_MERGE,
                        path: path::PLUG,
                        flags: 0,
                        ..ev
                    });
                }
            }
            (first, start, 32 * 4096u32, 1u8)
        };
        ts += 300 + rng.below(700);
        out.push(Event {
            ts_ns: ts,
            id: queue,
            dev,
            aux: 1,
            kind: kind::UNPLUG,
            flags: flags::UNPLUG_EXPLICIT,
            ..Event::default()
        });
        let rq_ev = Event {
            ts_ns: ts,
            cgroup_id: cg,
            id: rq,
            aux64: first_bio,
            sector,
            dev,
            bytes,
            kind: kind::RQ_INSERT,
            op,
            ..Event::default()
        };
        ts += 100 + rng.below(300);
        out.push(Event { ts_ns: ts, ..rq_ev });
        ts += 200 + rng.below(600);
        out.push(Event {
            ts_ns: ts,
            kind: kind::RQ_ISSUE,
            ..rq_ev
        });
        inflight.push(Event {
            kind: kind::RQ_COMPLETE,
            aux: bytes,
            ..rq_ev
        });
        // The device completes requests a couple of batches after they were issued.
        while inflight.len() > 2 {
            let done = inflight.remove(0);
            ts += 500 + rng.below(5_000);
            out.push(Event { ts_ns: ts, ..done });
        }
    }
    out
}

/// Events with every field at interesting values: zeros, maxima, sign bits, kinds past the
/// known ones.
fn extreme_events() -> Vec<Event> {
    let vals64 = [
        0,
        1,
        u64::MAX,
        u64::MAX - 1,
        1 << 63,
        (1 << 63) - 1,
        0xffff_8881_0a2b_3c00,
    ];
    let vals32 = [0, 1, u32::MAX, 1 << 31, 4096];
    let vals8 = [0u8, 1, 14, 15, 16, 0x7f, 0x80, 0xff];
    let mut out = Vec::new();
    let mut rng = Rng(0x5eed);
    for i in 0..400usize {
        let p = |r: &mut Rng| vals64[r.below(vals64.len() as u64) as usize];
        let q = |r: &mut Rng| vals32[r.below(vals32.len() as u64) as usize];
        let b = |r: &mut Rng| vals8[r.below(vals8.len() as u64) as usize];
        out.push(Event {
            ts_ns: p(&mut rng),
            cgroup_id: p(&mut rng),
            id: p(&mut rng),
            aux64: p(&mut rng),
            sector: p(&mut rng),
            dev: q(&mut rng),
            bytes: q(&mut rng),
            aux: q(&mut rng),
            kind: if i % 3 == 0 {
                b(&mut rng)
            } else {
                (i % 12) as u8
            },
            op: b(&mut rng),
            path: b(&mut rng),
            flags: b(&mut rng),
        });
    }
    out
}

/// Equal event lists, reporting the first difference (not thousands of events).
fn assert_same(got: &[Event], want: &[Event]) {
    if let Some(i) = (0..got.len().min(want.len())).find(|i| got[*i] != want[*i]) {
        panic!("event {i} differs:\n got {:?}\nwant {:?}", got[i], want[i]);
    }
    assert_eq!(got.len(), want.len(), "number of events");
}

fn encode_chunk(events: &[Event]) -> (Vec<u8>, u64) {
    let mut enc = EventEncoder::default();
    let mut out = Vec::new();
    for e in events {
        enc.encode(e, &mut out);
    }
    (out, enc.base_ts())
}

// ---- round trips ---------------------------------------------------------------------------

#[test]
fn capture_round_trip_is_exact() {
    let mut ops = vec![
        Op::Lost(kind::BIO_QUEUE, 3),
        Op::Events(realistic_stream(40, 7)),
        Op::Lost(kind::RQ_ISSUE, 5),
        Op::Lost(kind::RQ_ISSUE, 6),
        Op::Lost(kind::UNPLUG, u64::MAX),
        Op::Events(extreme_events()),
        Op::Flush,
        Op::Events(vec![Event::default()]),
        Op::Lost(200, 1),
    ];
    ops.push(Op::Events(realistic_stream(3, 8)));
    let bytes = write_mem(&ops, 100, true);
    let cap = read_mem(&bytes).unwrap();
    assert!(!cap.truncated);
    assert!(cap.warning.is_none());
    let mut h = test_header();
    h.format_version = FORMAT_VERSION;
    assert_eq!(cap.header, h);
    let (events, lost) = flatten(&cap.records);
    let (want_events, want_lost) = expected(&ops);
    assert_same(&events, &want_events);
    assert_eq!(lost, want_lost);
    let t = cap.trailer.clone().unwrap();
    assert_eq!(t.events, want_events.len() as u64);
    assert_eq!(t.lost, u64::MAX, "lost counts saturate");
    assert_eq!(cap.events().count(), want_events.len());
    // Events chunks hold at most chunk_events events.
    assert!(cap
        .records
        .iter()
        .all(|r| !matches!(r, Record::Events(v) if v.len() > 100 || v.is_empty())));
}

#[test]
fn capture_empty_capture_round_trips() {
    let bytes = write_mem(&[], 4096, true);
    let cap = read_mem(&bytes).unwrap();
    assert!(cap.records.is_empty());
    assert!(!cap.truncated);
    let t = cap.trailer.unwrap();
    assert_eq!((t.events, t.lost, t.chunks, t.min_ts_ns), (0, 0, 0, None));
}

#[test]
fn capture_next_into_reuses_the_buffer() {
    let events = realistic_stream(100, 3);
    let bytes = write_mem(&[Op::Events(events.clone())], 512, true);
    let mut r = CaptureReader::from_reader(&bytes[..], "mem.mtr").unwrap();
    let mut buf = Vec::new();
    let mut all = Vec::new();
    let mut chunks = 0;
    while let Some(n) = r.next_into(&mut buf).unwrap() {
        assert_eq!(n, Next::Events);
        all.extend_from_slice(&buf);
        chunks += 1;
    }
    assert_same(&all, &events);
    assert_eq!(chunks, events.len().div_ceil(512));
    assert!(r.finished() && !r.truncated());
    assert_eq!(r.trailer().unwrap().events, events.len() as u64);
    assert_eq!(r.offset(), bytes.len() as u64);
}

/// An event whose fields are drawn from extremes, random values, or copied from / continuing
/// the previous event (so every prediction of the codec gets exercised).
fn arb_events() -> impl Strategy<Value = Vec<Event>> {
    let v64 = || {
        prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            Just(1u64 << 63),
            any::<u64>(),
            0u64..300,
            0xffff_8881_0000_0000u64..0xffff_8881_0100_0000,
        ]
    };
    let v32 = || prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>(), 0u32..70_000];
    let v8 = || prop_oneof![0u8..20, any::<u8>()];
    let one = (
        (v64(), v64(), v64(), v64(), v64()),
        (v32(), v32(), v32()),
        (v8(), v8(), v8(), v8()),
        any::<u16>(), // which fields to copy from the previous event
    );
    prop::collection::vec(one, 0..200).prop_map(|raw| {
        let mut out: Vec<Event> = Vec::with_capacity(raw.len());
        for ((ts, cg, id, a64, sec), (dev, bytes, aux), (k, op, path, fl), copy) in raw {
            let mut e = Event {
                ts_ns: ts,
                cgroup_id: cg,
                id,
                aux64: a64,
                sector: sec,
                dev,
                bytes,
                aux,
                kind: k,
                op,
                path,
                flags: fl,
            };
            if let Some(p) = out.last().copied() {
                let bit = |i: u32| copy & (1 << i) != 0;
                if bit(0) {
                    e.ts_ns = p.ts_ns.wrapping_add(ts % 5000);
                }
                if bit(1) {
                    e.cgroup_id = p.cgroup_id;
                }
                if bit(2) {
                    e.id = p.id;
                }
                if bit(3) {
                    e.aux64 = p.id ^ (a64 & 0xfff);
                }
                if bit(4) {
                    e.sector = p.sector;
                }
                if bit(5) {
                    e.sector = p.sector.wrapping_add((p.bytes >> 9) as u64);
                }
                if bit(6) {
                    e.dev = p.dev;
                }
                if bit(7) {
                    e.bytes = p.bytes;
                }
                if bit(8) {
                    e.aux = p.aux;
                }
                if bit(9) {
                    e.kind = p.kind;
                    e.op = p.op;
                    e.path = p.path;
                    e.flags = p.flags;
                }
                if bit(10) {
                    e.id = p.aux64 ^ (id & 0xff);
                }
            }
            out.push(e);
        }
        out
    })
}

fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => arb_events().prop_map(Op::Events),
        1 => (any::<u8>(), prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()])
            .prop_map(|(k, n)| Op::Lost(k, n)),
        1 => Just(Op::Flush),
    ];
    prop::collection::vec(op, 0..8)
}

fn quick(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(quick(96))]

    #[test]
    fn capture_prop_round_trip(ops in arb_ops(), chunk_events in 1u32..300) {
        let bytes = write_mem(&ops, chunk_events, true);
        let cap = read_mem(&bytes).unwrap();
        prop_assert!(!cap.truncated);
        let got = flatten(&cap.records);
        let want = expected(&ops);
        prop_assert_eq!(got.0, want.0);
        prop_assert_eq!(got.1, want.1);
    }

    #[test]
    fn capture_prop_codec_round_trip(events in arb_events()) {
        let (payload, base) = encode_chunk(&events);
        let mut out = vec![Event::default(); 3]; // cleared by decode
        EventDecoder::default().decode(&payload, events.len() as u32, base, &mut out).unwrap();
        prop_assert_eq!(out, events);
    }
}

// ---- truncation and corruption -------------------------------------------------------------

/// A small capture with several chunks of every kind, and the offsets where its chunks end.
fn small_capture() -> (Vec<u8>, Vec<Op>) {
    let ops = vec![
        Op::Events(realistic_stream(2, 11)),
        Op::Lost(kind::GETRQ, 2),
        Op::Events(extreme_events()[..30].to_vec()),
        Op::Lost(kind::RQ_COMPLETE, 9),
    ];
    (write_mem(&ops, 64, true), ops)
}

/// Chunk boundaries of a well-formed capture: (offset, kind) of each chunk after the preamble.
fn chunk_offsets(bytes: &[u8]) -> Vec<(usize, u8)> {
    let mut out = Vec::new();
    let mut at = PREAMBLE_LEN;
    while at < bytes.len() {
        let hb: [u8; CHUNK_HEADER_LEN] = bytes[at..at + CHUNK_HEADER_LEN].try_into().unwrap();
        let h = ChunkHeader::decode(&hb).unwrap();
        out.push((at, h.kind));
        at += CHUNK_HEADER_LEN + h.len as usize;
    }
    assert_eq!(at, bytes.len());
    out
}

#[test]
fn capture_every_cut_point_reads_complete_chunks_and_flags_truncation() {
    let (bytes, _) = small_capture();
    let full = read_mem(&bytes).unwrap();
    let chunks = chunk_offsets(&bytes);
    assert_eq!(chunks[0].1, chunk::HEADER);
    let header_end = chunks[1].0;
    // Records each chunk contributes (a lost chunk with n entries gives n records).
    let per_chunk = {
        let mut r = CaptureReader::from_reader(&bytes[..], "x").unwrap();
        let mut last = r.offset();
        let mut n = 0;
        let mut ends = Vec::new();
        while let Some(rec) = r.next() {
            rec.unwrap();
            n += 1;
            if r.offset() != last {
                ends.push((r.offset() as usize, n));
                last = r.offset();
            } else if let Some(e) = ends.last_mut() {
                e.1 = n; // more records of the same lost chunk
            }
        }
        ends
    };
    assert!(per_chunk.len() >= 5, "{per_chunk:?}");
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        match read_mem(cut) {
            Err(e) => {
                let msg = e.to_string();
                assert!(len < header_end, "cut at {len} failed: {msg}");
                if len == 0 {
                    assert!(msg.contains("empty file"), "{msg}");
                } else {
                    assert!(msg.contains("truncated within its header"), "{len}: {msg}");
                }
            }
            Ok(cap) => {
                assert!(len >= header_end, "cut at {len} read");
                assert!(cap.truncated, "cut at {len} not flagged");
                assert!(cap.trailer.is_none());
                assert!(cap.warning.as_deref().unwrap().contains("truncated"));
                let complete = per_chunk
                    .iter()
                    .filter(|(end, _)| *end <= len)
                    .map(|(_, n)| *n)
                    .next_back()
                    .unwrap_or(0);
                assert_eq!(cap.records, full.records[..complete], "cut at {len}");
            }
        }
    }
}

#[test]
fn capture_bad_checksum_is_an_error_naming_the_offset() {
    let (bytes, _) = small_capture();
    let chunks = chunk_offsets(&bytes);
    let (at, kind) = chunks[1];
    assert_eq!(kind, chunk::EVENTS);
    // A payload byte: payload checksum.
    let mut b = bytes.clone();
    b[at + CHUNK_HEADER_LEN + 3] ^= 0x40;
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(
        e.contains(&format!("corrupt capture at byte offset {at}"))
            && e.contains("payload checksum"),
        "{e}"
    );
    // A chunk header byte: header checksum (not mistaken for a cut).
    let mut b = bytes.clone();
    b[at + 5] ^= 0x01;
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(
        e.contains(&format!("byte offset {at}: chunk header checksum"))
            && e.starts_with("mem.mtr: "),
        "{e}"
    );
}

/// Re-seals a chunk after its payload was changed, so the decoder itself sees bad data.
fn reseal(bytes: &mut [u8], at: usize) {
    let u32_at = |i: usize| u32::from_le_bytes(bytes[at + i..at + i + 4].try_into().unwrap());
    let p = at + CHUNK_HEADER_LEN;
    let len = u32_at(4);
    let h = ChunkHeader {
        kind: bytes[at],
        flags: bytes[at + 1],
        len,
        count: u32_at(8),
        base_ts: u64::from_le_bytes(bytes[at + 12..at + 20].try_into().unwrap()),
        crc: crc32fast::hash(&bytes[p..p + len as usize]),
    };
    bytes[at..p].copy_from_slice(&h.encode());
}

#[test]
fn capture_malformed_payload_with_valid_checksum_is_an_error() {
    let (bytes, _) = small_capture();
    let (at, _) = chunk_offsets(&bytes)[1];
    // The count says one event more than the payload holds.
    let mut b = bytes.clone();
    let count = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap());
    b[at + 8..at + 12].copy_from_slice(&(count + 1).to_le_bytes());
    reseal(&mut b, at);
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(e.contains("corrupt capture at byte offset"), "{e}");
    // One event fewer: bytes left over.
    let mut b = bytes.clone();
    b[at + 8..at + 12].copy_from_slice(&(count - 1).to_le_bytes());
    reseal(&mut b, at);
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(e.contains("left over"), "{e}");
}

#[test]
fn capture_end_chunk_checks_totals_and_what_follows() {
    let (bytes, _) = small_capture();
    let chunks = chunk_offsets(&bytes);
    // Data after the end chunk.
    let mut b = bytes.clone();
    b.push(0);
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(e.contains("data after the end chunk"), "{e}");
    // A whole events chunk removed: every chunk is intact but the totals do not add up.
    let (at, _) = chunks[1];
    let next = chunks[2].0;
    let mut b = bytes[..at].to_vec();
    b.extend_from_slice(&bytes[next..]);
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(e.contains("end chunk counts"), "{e}");
}

#[test]
fn capture_unknown_chunk_types() {
    let (bytes, _) = small_capture();
    let (at, _) = chunk_offsets(&bytes)[1];
    let insert = |kind: u8| {
        let mut c = vec![0u8; CHUNK_HEADER_LEN];
        c.extend_from_slice(b"future stuff");
        let h = ChunkHeader {
            kind,
            flags: 0,
            len: 12,
            count: 0,
            base_ts: 0,
            crc: crc32fast::hash(b"future stuff"),
        };
        c[..CHUNK_HEADER_LEN].copy_from_slice(&h.encode());
        let mut b = bytes[..at].to_vec();
        b.extend_from_slice(&c);
        b.extend_from_slice(&bytes[at..]);
        b
    };
    // Ancillary (lower-case): skipped.
    let cap = read_mem(&insert(b'x')).unwrap();
    assert_eq!(cap.records, read_mem(&bytes).unwrap().records);
    // Critical: an error that says why.
    let e = read_mem(&insert(b'X')).unwrap_err().to_string();
    assert!(
        e.contains(&format!("byte offset {at}: unknown chunk type 0x58")),
        "{e}"
    );
    // A second header.
    let e = read_mem(&insert(chunk::HEADER)).unwrap_err().to_string();
    assert!(e.contains("second header"), "{e}");
}

/// A `c` chunk names cgroups created during the run: the reader adds them to its header
/// (an id already named keeps its first path), the events and end totals are unchanged, and a
/// damaged one is an error like any chunk.
#[test]
fn capture_late_cgroups_chunk_extends_the_header() {
    let events = realistic_stream(4, 7);
    let mut buf = Vec::new();
    let mut w = CaptureWriter::from_sink(
        &mut buf,
        "mem.mtr",
        &test_header(),
        WriterOptions::default(),
    )
    .unwrap();
    w.write_events(&events[..events.len() / 2]).unwrap();
    let late = LateCgroups {
        cgroups: vec![
            RecordedCgroup {
                id: 777,
                path: "/late".into(),
            },
            RecordedCgroup {
                id: 4242,
                path: "/renamed".into(),
            },
        ],
        limits: vec![RecordedLimits {
            cgroup: "/late".into(),
            major: 259,
            minor: 0,
            riops: Some(100),
            ..RecordedLimits::default()
        }],
    };
    w.write_cgroups(&late).unwrap();
    w.write_cgroups(&LateCgroups::default()).unwrap(); // nothing to say: no chunk
    w.write_events(&events[events.len() / 2..]).unwrap();
    w.finish().unwrap();
    let cap = read_mem(&buf).unwrap();
    let got: Vec<Event> = cap.events().copied().collect();
    assert_same(&got, &events);
    let names: Vec<(u64, &str)> = cap
        .header
        .cgroups
        .iter()
        .map(|c| (c.id, c.path.as_str()))
        .collect();
    assert_eq!(names, [(1, "/"), (4242, "/mt"), (777, "/late")]);
    assert_eq!(cap.header.limits.len(), 2);
    assert_eq!(cap.header.limits[1].riops, Some(100));
    assert_eq!(
        chunk_offsets(&buf)
            .iter()
            .filter(|(_, t)| *t == chunk::CGROUPS)
            .count(),
        1
    );
    // valid checksum, invalid JSON: an error naming the chunk
    let (at, _) = *chunk_offsets(&buf)
        .iter()
        .find(|(_, t)| *t == chunk::CGROUPS)
        .unwrap();
    let mut bad = buf.clone();
    bad[at + CHUNK_HEADER_LEN] = b'!';
    reseal(&mut bad, at);
    let e = read_mem(&bad).unwrap_err().to_string();
    assert!(e.contains("cgroups chunk is not valid JSON"), "{e}");
}

#[test]
fn capture_newer_version_and_not_a_capture() {
    let (bytes, _) = small_capture();
    let mut b = bytes.clone();
    b[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let e = read_mem(&b).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "mem.mtr: capture format version {} is newer than this mergetrace supports ({}): upgrade mergetrace",
            FORMAT_VERSION + 1,
            FORMAT_VERSION
        )
    );
    let e = read_mem(b"{\"type\":\"total\"}\n").unwrap_err().to_string();
    assert!(e.contains("not a mergetrace capture"), "{e}");
    let e = read_mem(b"").unwrap_err().to_string();
    assert!(e.contains("empty file"), "{e}");
    let mut b = bytes.clone();
    b[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert!(read_mem(&b).is_err());
    // The header's own version must agree with the preamble.
    let mut b = bytes;
    let hdr = format::preamble(FORMAT_VERSION);
    assert_eq!(&b[..PREAMBLE_LEN], &hdr);
    let json_at = PREAMBLE_LEN + CHUNK_HEADER_LEN;
    let pos = b[json_at..]
        .windows(17)
        .position(|w| w == b"\"format_version\":")
        .unwrap()
        + json_at
        + 17;
    b[pos] = b'7';
    reseal(&mut b, PREAMBLE_LEN);
    let e = read_mem(&b).unwrap_err().to_string();
    assert!(e.contains("header says format version 7"), "{e}");
}

proptest! {
    #![proptest_config(quick(512))]

    /// Flipped bytes, anywhere, then maybe a cut: never a panic, and an intact prefix reads.
    #[test]
    fn capture_prop_corruption_never_panics(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..5),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let (mut bytes, _) = small_capture();
        for (i, x) in &flips {
            let i = i.index(bytes.len());
            bytes[i] ^= x;
        }
        if do_cut {
            let n = cut.index(bytes.len() + 1);
            bytes.truncate(n);
        }
        let _ = read_mem(&bytes);
    }

    /// Arbitrary payloads straight into the decoders (no checksum in the way).
    #[test]
    fn capture_prop_decoder_never_panics(
        payload in prop::collection::vec(any::<u8>(), 0..400),
        count in prop_oneof![0u32..200, any::<u32>()],
        base in any::<u64>(),
    ) {
        let mut out = Vec::new();
        let _ = EventDecoder::default().decode(&payload, count, base, &mut out);
        let mut lost = Vec::new();
        let _ = format::decode_lost(&payload, count, &mut lost);
    }

    /// Random bytes after a valid preamble.
    #[test]
    fn capture_prop_garbage_after_magic_never_panics(
        tail in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut b = format::preamble(FORMAT_VERSION).to_vec();
        b.extend_from_slice(&tail);
        prop_assert!(read_mem(&b).is_err());
    }
}

/// Bit flips in every byte of a valid event payload, re-sealed: errors or other events, never
/// a panic.
#[test]
fn capture_resealed_payload_flips_never_panic() {
    let (bytes, _) = small_capture();
    let chunks = chunk_offsets(&bytes);
    for &(at, kind) in &chunks[1..3] {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        for i in 0..len {
            for bit in [0x01u8, 0x80] {
                let mut b = bytes.clone();
                b[at + CHUNK_HEADER_LEN + i] ^= bit;
                reseal(&mut b, at);
                if let Err(e) = read_mem(&b) {
                    let e = e.to_string();
                    assert!(
                        e.contains("corrupt capture at byte offset"),
                        "{kind} {i}: {e}"
                    );
                }
            }
        }
    }
}

// ---- compactness ---------------------------------------------------------------------------

#[test]
fn capture_realistic_stream_is_at_most_24_bytes_per_event() {
    for seed in [1, 2, 3] {
        let events = realistic_stream(3000, seed);
        let bytes = write_mem(&[Op::Events(events.clone())], CHUNK_EVENTS, true);
        let per_event = bytes.len() as f64 / events.len() as f64;
        eprintln!(
            "realistic stream, seed {seed}: {} events, {} bytes, {per_event:.2} bytes/event (whole file)",
            events.len(),
            bytes.len()
        );
        assert!(per_event <= 24.0, "{per_event:.2} bytes/event");
        let cap = read_mem(&bytes).unwrap();
        assert_same(&cap.events().copied().collect::<Vec<_>>(), &events);
    }
}

// ---- files ---------------------------------------------------------------------------------

#[test]
fn capture_file_is_private_and_never_overwritten_unasked() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("run.mtr");
    let events = realistic_stream(10, 5);
    let mut w = CaptureWriter::create(&p, &test_header()).unwrap();
    w.write_events(&events).unwrap();
    w.write_lost(kind::BIO_QUEUE, 4).unwrap();
    let s = w.finish().unwrap();
    assert_eq!(s.events, events.len() as u64);
    assert_eq!(s.lost, 4);
    assert_eq!(s.bytes, std::fs::metadata(&p).unwrap().len());
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let cap = read_all(&p).unwrap();
    assert_same(&cap.events().copied().collect::<Vec<_>>(), &events);
    assert_eq!(cap.lost(), 4);

    // Not again without asking; the existing file is untouched.
    let e = CaptureWriter::create(&p, &test_header())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("file exists") && e.contains("run.mtr"), "{e}");
    assert_eq!(read_all(&p).unwrap().events().count(), events.len());

    // Asked: replaced, and private even if the old file was not.
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    let opts = WriterOptions {
        overwrite: true,
        ..WriterOptions::default()
    };
    let w = CaptureWriter::create_with(&p, &test_header(), opts).unwrap();
    w.finish().unwrap();
    assert_eq!(
        std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(read_all(&p).unwrap().events().count(), 0);

    // Errors name the file.
    let missing = t.path().join("no/such/dir/run.mtr");
    let e = CaptureWriter::create(&missing, &test_header())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no/such/dir/run.mtr"), "{e}");
    let e = read_all(t.path().join("nope.mtr")).unwrap_err().to_string();
    assert!(e.contains("nope.mtr"), "{e}");
}

#[test]
fn capture_dropped_writer_leaves_a_truncated_but_readable_file() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("cut.mtr");
    let events = realistic_stream(20, 9);
    {
        let mut w = CaptureWriter::create(&p, &test_header()).unwrap();
        w.write_events(&events).unwrap();
        // dropped without finish (an error elsewhere)
    }
    let cap = read_all(&p).unwrap();
    assert!(cap.truncated);
    assert!(cap.warning.as_deref().unwrap().contains("cut.mtr"));
    assert_same(&cap.events().copied().collect::<Vec<_>>(), &events);
}

/// A sink that takes `room` bytes and then fails like a full disk.
struct FullDisk {
    data: Vec<u8>,
    room: usize,
}

impl io::Write for FullDisk {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.room - self.data.len());
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.data.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl CaptureSink for FullDisk {}

#[test]
fn capture_disk_full_is_an_error_and_complete_chunks_stay_readable() {
    let events = realistic_stream(60, 13);
    let full = write_mem(&[Op::Events(events.clone())], 256, true);
    let chunks = chunk_offsets(&full);
    // Run out of room in the middle of the third events chunk.
    let room = (chunks[3].0 + chunks[4].0) / 2;
    let mut disk = FullDisk {
        data: Vec::new(),
        room,
    };
    let opts = WriterOptions {
        overwrite: false,
        chunk_events: 256,
    };
    let mut w =
        CaptureWriter::from_sink(&mut disk, "/mnt/full/run.mtr", &test_header(), opts).unwrap();
    let e = w.write_events(&events).unwrap_err().to_string();
    assert!(
        e.contains("/mnt/full/run.mtr") && e.contains("No space left on device"),
        "{e}"
    );
    // Nothing more is written after the error; every call says why.
    let e2 = w.write_events(&events[..1]).unwrap_err().to_string();
    assert!(e2.contains("earlier write error"), "{e2}");
    assert!(w.finish().is_err());
    assert_eq!(disk.data.len(), room);
    let cap = read_mem(&disk.data).unwrap();
    assert!(cap.truncated);
    // Header, two whole events chunks, part of the third.
    assert_same(
        &cap.events().copied().collect::<Vec<_>>(),
        &events[..2 * 256],
    );
}

#[test]
fn capture_dev_full_reports_enospc_with_the_name() {
    let p = std::path::Path::new("/dev/full");
    if !p.exists() {
        return; // not on this system
    }
    let opts = WriterOptions {
        overwrite: true,
        ..WriterOptions::default()
    };
    let mode = std::fs::metadata(p).unwrap().permissions().mode();
    let e = CaptureWriter::create_with(p, &test_header(), opts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("/dev/full") && e.contains("No space left"),
        "{e}"
    );
    assert!(p.exists(), "a device is never removed");
    assert_eq!(
        std::fs::metadata(p).unwrap().permissions().mode(),
        mode,
        "nor chmod-ed"
    );
}

// ---- committed inputs ----------------------------------------------------------------------

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/capture")
}

/// The events of `golden-v1.mtr`. Never change this function: the file was written by format
/// version 1 and must read back to exactly these events forever.
fn golden_ops() -> Vec<Op> {
    let mut rng = Rng(0x601d);
    let mut evs = Vec::new();
    let mut ts = 5_000_000_000u64;
    for i in 0..300u64 {
        ts += rng.below(3000);
        evs.push(Event {
            ts_ns: ts,
            cgroup_id: [0, 1, 4242][(i % 3) as usize],
            id: 0xffff_8881_0a2b_0000 + (rng.below(512) << 8),
            aux64: if i % 5 == 0 { rng.next() } else { 0 },
            sector: 2048 + 8 * (i / 2),
            dev: [259 << 20, 7 << 20 | 3][(i % 7 == 0) as usize],
            bytes: [4096, 131072, 0, u32::MAX][(i % 4) as usize],
            aux: (i * 3) as u32,
            kind: [1, 3, 5, 7, 8, 9, 10, 2, 250][(i % 9) as usize],
            op: (i % 4) as u8,
            path: (i % 3) as u8,
            flags: (i % 32) as u8,
        });
    }
    vec![
        Op::Events(evs[..100].to_vec()),
        Op::Lost(kind::BIO_QUEUE, 17),
        Op::Events(evs[100..].to_vec()),
        Op::Events(vec![Event {
            ts_ns: u64::MAX,
            cgroup_id: u64::MAX,
            id: u64::MAX,
            aux64: u64::MAX,
            sector: u64::MAX,
            dev: u32::MAX,
            bytes: u32::MAX,
            aux: u32::MAX,
            kind: u8::MAX,
            op: u8::MAX,
            path: u8::MAX,
            flags: u8::MAX,
        }]),
        Op::Lost(kind::RQ_COMPLETE, 1),
    ]
}

/// Writes `golden-v1.mtr` again: only when format version 1 is first committed.
#[test]
#[ignore]
fn capture_write_golden_file() {
    let bytes = write_mem(&golden_ops(), 128, true);
    std::fs::create_dir_all(data_dir()).unwrap();
    std::fs::write(data_dir().join("golden-v1.mtr"), bytes).unwrap();
}

/// Writes the `truncated-*` and `err-*` inputs again (any format version may do it).
#[test]
#[ignore]
fn capture_write_seed_inputs() {
    let (bytes, _) = small_capture();
    let chunks = chunk_offsets(&bytes);
    let dir = data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let put = |name: &str, b: &[u8]| std::fs::write(dir.join(name), b).unwrap();
    let (e1, e2) = (chunks[1].0, chunks[2].0);
    put("truncated-mid-chunk.mtr", &bytes[..(e1 + e2) / 2]);
    let mut b = bytes[..e2].to_vec();
    b.resize(b.len() + 4096, 0);
    put("truncated-zero-filled-tail.mtr", &b);
    let mut b = bytes[..e2].to_vec();
    b[e1 + 8..e1 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut b, e1);
    put("err-event-count-overflow.mtr", &b);
    let mut b = bytes[..e2].to_vec();
    let huge = ChunkHeader {
        kind: chunk::EVENTS,
        flags: 0,
        len: u32::MAX,
        count: 1,
        base_ts: 0,
        crc: 0,
    };
    b[e1..e1 + CHUNK_HEADER_LEN].copy_from_slice(&huge.encode());
    put("err-payload-length-over-limit.mtr", &b);
    let mut b = bytes[..e2].to_vec();
    b[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    put("err-newer-version.mtr", &b);
}

#[test]
fn capture_zero_filled_tail_is_a_cut() {
    let (bytes, _) = small_capture();
    let chunks = chunk_offsets(&bytes);
    let mut b = bytes[..chunks[2].0].to_vec();
    b.resize(b.len() + 100, 0);
    let cap = read_mem(&b).unwrap();
    assert!(cap.truncated);
    assert_eq!(cap.records, read_mem(&bytes).unwrap().records[..1]);
}

#[test]
fn capture_golden_v1_file_still_reads() {
    let cap = read_all(data_dir().join("golden-v1.mtr")).unwrap();
    assert!(!cap.truncated);
    assert_eq!(cap.header.format_version, 1);
    assert_eq!(cap.header.devices[0].name, "nvme0n1");
    let (events, lost) = flatten(&cap.records);
    let (want_events, want_lost) = expected(&golden_ops());
    assert_same(&events, &want_events);
    assert_eq!(lost, want_lost);
}

/// Committed inputs, by name: `ok-*` reads cleanly, `truncated-*` reads with the truncation
/// flag, `err-*` is an error. None may panic.
#[test]
fn capture_committed_inputs() {
    let mut n = 0;
    for entry in std::fs::read_dir(data_dir()).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let r = read_all(&p);
        if name.starts_with("ok-") || name.starts_with("golden-") {
            let c = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!c.truncated, "{name}");
        } else if name.starts_with("truncated-") {
            let c = r.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(c.truncated, "{name}");
        } else if name.starts_with("err-") {
            let e = r.err().unwrap_or_else(|| panic!("{name} read")).to_string();
            assert!(e.starts_with(&p.display().to_string()), "{name}: {e}");
            if name.contains("newer-version") {
                assert!(e.contains("upgrade mergetrace"), "{name}: {e}");
            } else {
                assert!(e.contains("corrupt capture at byte offset"), "{name}: {e}");
            }
        } else {
            continue;
        }
        n += 1;
    }
    assert!(n >= 6, "{n} inputs");
}

#[test]
fn capture_from_before_reissue_flags_gets_them_on_reading() {
    // mergetrace 0.1 wrote issue events without `flags::REISSUE`: the reader flags the issue
    // that follows a requeue of the same request, so such a capture counts requests once.
    let ev = |kind: u8, id: u64, ts_ns: u64| Event {
        kind,
        id,
        ts_ns,
        op: 1,
        bytes: 4096,
        dev: 259 << 20,
        ..Event::default()
    };
    let stream = vec![
        ev(kind::RQ_ISSUE, 0xa0, 1),
        ev(kind::RQ_ISSUE, 0xb0, 2),
        ev(kind::RQ_REQUEUE, 0xa0, 3),
        ev(kind::RQ_ISSUE, 0xa0, 4),
        ev(kind::RQ_ISSUE, 0xa0, 5), // a new request in the same memory, after completion
    ];
    let header = Header {
        reissues_flagged: false,
        ..test_header()
    };
    let mut buf = Vec::new();
    let opts = WriterOptions {
        overwrite: false,
        chunk_events: 64,
    };
    let mut w = CaptureWriter::from_sink(&mut buf, "old.mtr", &header, opts).unwrap();
    w.write_events(&stream).unwrap();
    w.finish().unwrap();
    let got: Vec<u8> = read_mem(&buf)
        .unwrap()
        .events()
        .map(|e| e.flags & flags::REISSUE)
        .collect();
    assert_eq!(got, [0, 0, 0, flags::REISSUE, 0]);
    // A current capture is read as written.
    let current = write_mem(&[Op::Events(stream.clone())], 64, true);
    assert!(read_mem(&current)
        .unwrap()
        .events()
        .all(|e| e.flags & flags::REISSUE == 0));
}
