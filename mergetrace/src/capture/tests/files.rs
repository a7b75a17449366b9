//! Files on disk: permissions, overwrites, a dropped writer, a full disk; the committed
//! golden file and corpus.
use super::*;

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

/// The events of `golden-v2.mtr`: those of version 1's, then request lifecycles, where
/// format 2's request memories predict. Never change this function either.
fn golden_v2_ops() -> Vec<Op> {
    let mut rng = Rng(0x601d_0002);
    let script: Vec<(u8, u64)> = (0..600)
        .map(|_| ((rng.below(8)) as u8, rng.next()))
        .collect();
    let mut ops = golden_ops();
    ops.push(Op::Events(lifecycle_stream(&script)));
    ops
}

/// The events of `golden-v3.mtr`: those of version 2's, then `record --requests` charges
/// in runs (`aux64` more bios each) between requests' issues. Never change this function
/// either.
fn golden_v3_ops() -> Vec<Op> {
    let mut rng = Rng(0x601d_0003);
    let mut evs = Vec::new();
    let mut ts = 9_000_000_000u64;
    for i in 0..200u64 {
        ts += rng.below(5000);
        let run = rng.below(40);
        evs.push(Event {
            ts_ns: ts,
            cgroup_id: [4242, 77][(i % 2) as usize],
            id: 0xffff_8881_0a2b_0000 + (rng.below(512) << 8),
            aux64: run,
            sector: 4096 + 8 * i,
            dev: 259 << 20,
            bytes: 4096 * (run as u32 + 1),
            aux: 0,
            kind: [kind::BIO_QUEUE, kind::THROTTLE_CHARGE][(i % 5 == 0) as usize],
            op: (i % 2) as u8,
            path: (i % 3 == 0) as u8,
            flags: mergetrace_common::flags::RULES_IOPS,
        });
        ts += rng.below(5000);
        evs.push(Event {
            ts_ns: ts,
            kind: kind::RQ_ISSUE,
            id: 0xffff_8881_7700_0000 + (i << 8),
            sector: 4096 + 8 * i,
            dev: 259 << 20,
            bytes: 4096,
            aux: 1,
            ..Event::default()
        });
    }
    let mut ops = golden_v2_ops();
    ops.push(Op::Events(evs));
    ops
}

/// Writes `golden-v3.mtr` again: only when format version 3 is first committed.
#[test]
#[ignore]
fn capture_write_golden_file() {
    let bytes = write_mem(&golden_v3_ops(), 128, true);
    std::fs::create_dir_all(data_dir()).unwrap();
    std::fs::write(data_dir().join("golden-v3.mtr"), bytes).unwrap();
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

/// The writer still encodes the golden file's chunks byte for byte: every chunk between the
/// header (which has gained fields since) and the end chunk (the time it was closed).
#[test]
fn capture_golden_v3_chunks_are_what_the_writer_writes() {
    let golden = std::fs::read(data_dir().join("golden-v3.mtr")).unwrap();
    let written = write_mem(&golden_v3_ops(), 128, true);
    let body = |b: &[u8]| {
        let chunks = chunk_offsets(b);
        b[chunks[1].0..chunks.last().unwrap().0].to_vec()
    };
    assert!(body(&golden) == body(&written));
    assert_eq!(chunk_offsets(&golden).len(), chunk_offsets(&written).len());
}

/// Each format's golden file reads back to its events: a reader reads every version.
#[test]
fn capture_golden_files_still_read() {
    for (version, ops) in [
        (1, golden_ops()),
        (2, golden_v2_ops()),
        (3, golden_v3_ops()),
    ] {
        let cap = read_all(data_dir().join(format!("golden-v{version}.mtr"))).unwrap();
        assert!(!cap.truncated);
        assert_eq!(cap.header.format_version, version);
        assert_eq!(cap.header.devices[0].name, "nvme0n1");
        let (events, lost) = flatten(&cap.records);
        let (want_events, want_lost) = expected(&ops);
        assert_same(&events, &want_events);
        assert_eq!(lost, want_lost);
    }
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
