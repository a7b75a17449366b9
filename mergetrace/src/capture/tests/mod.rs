//! Capture format tests: exact round trips, cut and corrupted files, compactness, files.
//! No timing assertions anywhere.
use std::{io, os::unix::fs::PermissionsExt, path::PathBuf};

use mergetrace_common::{flags, kind, path, Event};
use proptest::prelude::*;

use super::{
    codec::{EventDecoder, EventEncoder},
    format::{self, chunk, ChunkHeader, CHUNK_HEADER_LEN, PREAMBLE_LEN},
    *,
};

mod damage;
mod files;
mod round_trip;
mod streams;

use streams::{extreme_events, lifecycle_stream, realistic_stream};

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
            wbt: None,
            queue: RecordedQueue {
                scheduler: Some("none".into()),
                nomerges: Some(0),
                max_sectors_kb: Some(128),
                max_segments: Some(127),
                nr_requests: Some(1023),
                rotational: Some(false),
                ..RecordedQueue::default()
            },
            iocost: None,
            iolatency: None,
        }],
        cgroup_hierarchy: "v2".into(),
        cgroup_mount: "/sys/fs/cgroup".into(),
        cgroups: vec![
            RecordedCgroup {
                id: 1,
                path: "/".into(),
                name: None,
            },
            RecordedCgroup {
                id: 4242,
                path: "/mt".into(),
                name: None,
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
            Op::Lost(k, n) => lost.push((events.len(), *k, *n)),
        }
    }
    (events, merge_lost(&lost))
}

/// Lost-event entries with those of one kind at one place added up, as a writer may (the
/// format allows either; one that flushed between two such entries keeps them apart).
fn merge_lost(lost: &[(usize, u8, u64)]) -> Vec<(usize, u8, u64)> {
    let mut out: Vec<(usize, u8, u64)> = Vec::new();
    for &(at, k, n) in lost {
        match out.iter_mut().find(|(a, kk, _)| *a == at && *kk == k) {
            Some(e) => e.2 = e.2.saturating_add(n),
            None => out.push((at, k, n)),
        }
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
    let mut out = bytes::BytesMut::new();
    for e in events {
        enc.encode(e, &mut out);
    }
    (out.to_vec(), enc.base_ts())
}

fn quick(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
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
