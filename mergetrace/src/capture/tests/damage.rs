//! Cut and corrupted files: every cut point, bad checksums, malformed payloads, unknown
//! chunks, newer versions; none may panic.
use proptest::prelude::*;

use super::*;

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
                name: None,
            },
            RecordedCgroup {
                id: 4242,
                path: "/renamed".into(),
                name: None,
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
