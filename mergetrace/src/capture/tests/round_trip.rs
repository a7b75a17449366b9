//! Exact round trips: files, empty captures, buffer reuse, properties, compactness.
use proptest::prelude::*;

use super::*;

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

/// The case the property test below once found: losses of one kind on both sides of a flush
/// stay two entries in the file (a reader adds them up, saturating).
#[test]
fn capture_losses_of_one_kind_across_a_flush_round_trip() {
    let ops = [Op::Lost(232, u64::MAX), Op::Flush, Op::Lost(232, u64::MAX)];
    let cap = read_mem(&write_mem(&ops, 1, true)).unwrap();
    let (_, lost) = flatten(&cap.records);
    assert_eq!(lost, [(0, 232, u64::MAX), (0, 232, u64::MAX)]);
    assert_eq!(merge_lost(&lost), expected(&ops).1);
    assert_eq!(cap.trailer.unwrap().lost, u64::MAX);
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
        prop_assert_eq!(merge_lost(&got.1), want.1);
    }

    #[test]
    fn capture_prop_codec_round_trip(events in arb_events()) {
        let (payload, base) = encode_chunk(&events);
        let mut out = vec![Event::default(); 3]; // cleared by decode
        EventDecoder::default().decode(&payload, events.len() as u32, base, &mut out).unwrap();
        prop_assert_eq!(out, events);
    }
}

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
