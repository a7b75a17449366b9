//! Times the capture codec on a capture's events: decode (read the file) and encode (write
//! them again to memory), best of ROUNDS (5) each, on the first MAX_EVENTS (all) of it.
//! `cargo run --release --example codec_speed -- FILE [ROUNDS [MAX_EVENTS]]`
use std::time::Instant;

use mergetrace::capture::{read_all, CaptureWriter, WriterOptions};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: codec_speed FILE [ROUNDS [MAX_EVENTS]]");
    let rounds: usize = args.next().map_or(5, |r| r.parse().expect("ROUNDS"));
    let max: usize = args
        .next()
        .map_or(usize::MAX, |m| m.parse().expect("MAX_EVENTS"));
    let mut best_read = f64::MAX;
    let mut cap = None;
    for _ in 0..rounds {
        let t = Instant::now();
        let c = read_all(&path)?;
        best_read = best_read.min(t.elapsed().as_secs_f64());
        cap = Some(c);
    }
    let cap = cap.unwrap();
    let events: Vec<_> = cap.events().take(max).copied().collect();
    let mut best_write = f64::MAX;
    let mut size = 0;
    let mut crc = 0;
    for _ in 0..rounds {
        let mut out = Vec::with_capacity(events.len() * 16);
        let t = Instant::now();
        let mut w =
            CaptureWriter::from_sink(&mut out, "mem", &cap.header, WriterOptions::default())?;
        for batch in events.chunks(4096) {
            w.write_events(batch)?;
        }
        w.flush()?;
        drop(w);
        best_write = best_write.min(t.elapsed().as_secs_f64());
        size = out.len();
        crc = crc32fast::hash(&out);
    }
    let n = events.len() as f64;
    println!(
        "{} events: read {:.1} ns/event, write {:.1} ns/event, {:.2} bytes/event (crc32 {crc:08x})",
        events.len(),
        best_read * 1e9 / n,
        best_write * 1e9 / n,
        size as f64 / n
    );
    Ok(())
}
