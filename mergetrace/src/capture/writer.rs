//! Writing a capture: the header at once, events buffered into chunks, lost-event records in
//! order with them, the end chunk on [`CaptureWriter::finish`].
//!
//! Every chunk goes out in a single `write_all`, so after an I/O error (a full disk) the file
//! holds whole chunks plus at most one partial one, which a reader treats as a cut-short
//! file. After an error the writer writes nothing more.
use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use mergetrace_common::Event;

use super::{
    codec::EventEncoder,
    format::{self, chunk, ChunkHeader, CHUNK_HEADER_LEN, FORMAT_VERSION, PREAMBLE_LEN},
    header::{Header, LateCgroups, Trailer},
};

/// Default events per chunk.
pub const CHUNK_EVENTS: u32 = 4096;
/// Largest events-per-chunk a writer accepts (keeps payloads far below the reader's limit).
pub const MAX_CHUNK_EVENTS: u32 = 65536;

/// Where a capture goes: a file, or anything else that takes bytes (tests).
pub trait CaptureSink: Write {
    /// Makes what was written durable (`fsync` for a file).
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl CaptureSink for File {
    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

impl CaptureSink for Vec<u8> {}

impl<T: CaptureSink + ?Sized> CaptureSink for &mut T {
    fn sync(&mut self) -> io::Result<()> {
        (**self).sync()
    }
}

/// How to create a capture.
#[derive(Debug, Clone, Copy)]
pub struct WriterOptions {
    /// Replace an existing file (default: refuse).
    pub overwrite: bool,
    /// Events per chunk, 1..=65536 (default 4096). Smaller chunks lose less when a run is
    /// cut short and compress slightly worse.
    pub chunk_events: u32,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            overwrite: false,
            chunk_events: CHUNK_EVENTS,
        }
    }
}

/// What [`CaptureWriter::finish`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub path: PathBuf,
    pub events: u64,
    /// Sum of the lost-event counts.
    pub lost: u64,
    /// Events and lost chunks (besides the header and end chunks).
    pub chunks: u64,
    /// File size.
    pub bytes: u64,
    pub min_ts_ns: Option<u64>,
    pub max_ts_ns: Option<u64>,
}

pub struct CaptureWriter<W: CaptureSink = File> {
    sink: W,
    path: PathBuf,
    chunk_events: u32,
    encoder: EventEncoder,
    /// The events chunk being built: header placeholder + payload. Each full chunk is split
    /// off as `Bytes` and written; its memory is reused for the next one.
    buf: BytesMut,
    /// Lost entries not yet written (flushed before the next events).
    lost: Vec<(u8, u64)>,
    /// Bytes written so far (the file offset of the next chunk).
    offset: u64,
    events: u64,
    lost_total: u64,
    chunks: u64,
    min_ts: Option<u64>,
    max_ts: Option<u64>,
    /// Set by the first write error: the writer is done.
    failed: Option<String>,
    finished: bool,
}

impl CaptureWriter<File> {
    /// Creates `path` (mode 0600; refuses an existing file) and writes the header.
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<Self> {
        Self::create_with(path, header, WriterOptions::default())
    }

    pub fn create_with(
        path: impl AsRef<Path>,
        header: &Header,
        opts: WriterOptions,
    ) -> Result<Self> {
        let path = path.as_ref();
        let existed = path.symlink_metadata().is_ok();
        let mut oo = OpenOptions::new();
        oo.write(true).mode(0o600);
        if opts.overwrite {
            oo.create(true).truncate(true);
        } else {
            oo.create_new(true);
        }
        let file = oo.open(path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                anyhow!(
                    "{}: file exists; not overwriting a capture (remove it or choose another name)",
                    path.display()
                )
            } else {
                anyhow!("{}: cannot create the capture: {e}", path.display())
            }
        })?;
        // `mode` only applies to a new file: an overwritten one may have other permissions.
        let meta = file
            .metadata()
            .with_context(|| format!("{}: cannot stat the capture", path.display()))?;
        if meta.is_file() && meta.permissions().mode() & 0o777 != 0o600 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("{}: cannot make the capture private", path.display()))?;
        }
        match Self::from_sink(file, path, header, opts) {
            Ok(w) => Ok(w),
            Err(e) => {
                if !existed && meta.is_file() {
                    let _ = std::fs::remove_file(path);
                }
                Err(e)
            }
        }
    }
}

impl<W: CaptureSink> CaptureWriter<W> {
    /// Starts a capture on any sink; `name` is what errors call it.
    pub fn from_sink(
        sink: W,
        name: impl Into<PathBuf>,
        header: &Header,
        opts: WriterOptions,
    ) -> Result<Self> {
        let path = name.into();
        if opts.chunk_events == 0 || opts.chunk_events > MAX_CHUNK_EVENTS {
            bail!(
                "chunk_events must be 1..={MAX_CHUNK_EVENTS}, not {}",
                opts.chunk_events
            );
        }
        let mut header = header.clone();
        header.format_version = FORMAT_VERSION;
        let mut first = BytesMut::new();
        first.put_slice(&format::preamble(FORMAT_VERSION));
        first.put_bytes(0, CHUNK_HEADER_LEN);
        serde_json::to_writer((&mut first).writer(), &header)
            .context("cannot encode the capture header")?;
        let json_len = first.len() - PREAMBLE_LEN - CHUNK_HEADER_LEN;
        if json_len > format::MAX_PAYLOAD as usize {
            bail!(
                "{}: capture header too large ({json_len} bytes)",
                path.display(),
            );
        }
        seal(
            &mut first[PREAMBLE_LEN..],
            chunk::HEADER,
            0,
            header.start_monotonic_ns,
        );
        let mut w = CaptureWriter {
            sink,
            path,
            chunk_events: opts.chunk_events,
            encoder: EventEncoder::default(),
            buf: chunk_buf(),
            lost: Vec::new(),
            offset: 0,
            events: 0,
            lost_total: 0,
            chunks: 0,
            min_ts: None,
            max_ts: None,
            failed: None,
            finished: false,
        };
        w.write_bytes(&first.freeze(), "the header")?;
        w.sink_flush()?;
        Ok(w)
    }

    /// Buffers events; writes a chunk whenever one is full.
    pub fn write_events(&mut self, events: &[Event]) -> Result<()> {
        self.check()?;
        if !self.lost.is_empty() {
            self.write_lost_chunk()?;
        }
        for ev in events {
            self.encoder.encode(ev, &mut self.buf);
            self.events += 1;
            self.min_ts = Some(self.min_ts.map_or(ev.ts_ns, |m| m.min(ev.ts_ns)));
            self.max_ts = Some(self.max_ts.map_or(ev.ts_ns, |m| m.max(ev.ts_ns)));
            if self.encoder.count() >= self.chunk_events {
                self.write_events_chunk()?;
            }
        }
        Ok(())
    }

    /// Records that the kernel dropped `count` events of `kind` here (after the events
    /// written so far, before those written next). A count of 0 records nothing.
    pub fn write_lost(&mut self, kind: u8, count: u64) -> Result<()> {
        self.check()?;
        if count == 0 {
            return Ok(());
        }
        if self.encoder.count() > 0 {
            self.write_events_chunk()?;
        }
        // No events in between: entries of one kind add up (at most 256 entries a chunk).
        match self.lost.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n = n.saturating_add(count),
            None => self.lost.push((kind, count)),
        }
        self.lost_total = self.lost_total.saturating_add(count);
        Ok(())
    }

    /// Names cgroups that appeared during the run (a `c` chunk, after the events so far).
    /// Not counted in the end chunk's `chunks`: readers that do not know it skip it.
    pub fn write_cgroups(&mut self, late: &LateCgroups) -> Result<()> {
        self.check()?;
        if late.cgroups.is_empty() && late.limits.is_empty() {
            return Ok(());
        }
        self.write_pending()?;
        let chunk = json_chunk(chunk::CGROUPS, late).context("cannot encode the cgroups chunk")?;
        self.write_bytes(&chunk, "cgroup names")
    }

    /// Writes what is buffered (as a possibly short chunk) and flushes the sink.
    pub fn flush(&mut self) -> Result<()> {
        self.check()?;
        self.write_pending()?;
        self.sink_flush()
    }

    /// Writes what is buffered and the end chunk, syncs, and returns the totals.
    pub fn finish(mut self) -> Result<Summary> {
        self.check()?;
        self.write_pending()?;
        let trailer = Trailer {
            events: self.events,
            lost: self.lost_total,
            chunks: self.chunks,
            min_ts_ns: self.min_ts,
            max_ts_ns: self.max_ts,
            end_monotonic_ns: crate::kernel::monotonic_ns(),
        };
        let chunk = json_chunk(chunk::END, &trailer).context("cannot encode the end chunk")?;
        self.write_bytes(&chunk, "the end chunk")?;
        self.sink_flush()?;
        let path = self.path.clone();
        self.sink
            .sync()
            .with_context(|| format!("{}: cannot sync the capture", path.display()))?;
        self.finished = true;
        Ok(Summary {
            path,
            events: self.events,
            lost: self.lost_total,
            chunks: self.chunks,
            bytes: self.offset,
            min_ts_ns: self.min_ts,
            max_ts_ns: self.max_ts,
        })
    }

    fn check(&self) -> Result<()> {
        if let Some(e) = &self.failed {
            bail!(
                "{}: the capture stopped at byte {} after an earlier write error ({e})",
                self.path.display(),
                self.offset
            );
        }
        Ok(())
    }

    fn write_pending(&mut self) -> Result<()> {
        if self.encoder.count() > 0 {
            self.write_events_chunk()?;
        }
        if !self.lost.is_empty() {
            self.write_lost_chunk()?;
        }
        Ok(())
    }

    fn write_events_chunk(&mut self) -> Result<()> {
        let count = self.encoder.count();
        seal(&mut self.buf, chunk::EVENTS, count, self.encoder.base_ts());
        let chunk: Bytes = self.buf.split().freeze();
        let r = self.write_bytes(&chunk, "events");
        // With the chunk gone, `buf` is its memory's only owner again: reserve reuses it.
        let len = chunk.len();
        drop(chunk);
        self.buf.reserve(len);
        self.buf.put_bytes(0, CHUNK_HEADER_LEN);
        self.encoder.reset();
        self.chunks += 1;
        r
    }

    fn write_lost_chunk(&mut self) -> Result<()> {
        let mut buf = chunk_buf();
        format::encode_lost(&self.lost, &mut buf);
        seal(&mut buf, chunk::LOST, self.lost.len() as u32, 0);
        self.lost.clear();
        self.chunks += 1;
        self.write_bytes(&buf, "lost-event records")
    }

    fn write_bytes(&mut self, bytes: &[u8], what: &str) -> Result<()> {
        match self.sink.write_all(bytes) {
            Ok(()) => {
                self.offset += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(anyhow!(
                    "{}: cannot write {what} at byte {}: {e}; the chunks before it stay readable",
                    self.path.display(),
                    self.offset
                ))
            }
        }
    }

    fn sink_flush(&mut self) -> Result<()> {
        self.sink.flush().map_err(|e| {
            self.failed = Some(e.to_string());
            anyhow!("{}: cannot write the capture: {e}", self.path.display())
        })
    }
}

impl<W: CaptureSink> Drop for CaptureWriter<W> {
    /// Not finished (an error or a panic elsewhere): keep the buffered events, without an end
    /// chunk, so a reader sees a capture cut short.
    fn drop(&mut self) {
        if !self.finished && self.failed.is_none() {
            let _ = self.write_pending();
            let _ = self.sink.flush();
        }
    }
}

/// An empty chunk: room for its header.
fn chunk_buf() -> BytesMut {
    let mut buf = BytesMut::with_capacity(CHUNK_HEADER_LEN);
    buf.put_bytes(0, CHUNK_HEADER_LEN);
    buf
}

/// A sealed chunk of `kind` whose payload is `value` as JSON.
fn json_chunk(kind: u8, value: &impl serde::Serialize) -> serde_json::Result<Bytes> {
    let mut buf = chunk_buf();
    serde_json::to_writer((&mut buf).writer(), value)?;
    seal(&mut buf, kind, 0, 0);
    Ok(buf.freeze())
}

/// Fills in the chunk header at the start of `buf` (payload after it).
fn seal(buf: &mut [u8], kind: u8, count: u32, base_ts: u64) {
    let payload = &buf[CHUNK_HEADER_LEN..];
    let h = ChunkHeader {
        kind,
        flags: 0,
        len: payload.len() as u32,
        count,
        base_ts,
        crc: crc32fast::hash(payload),
    };
    buf[..CHUNK_HEADER_LEN].copy_from_slice(&h.encode());
}
