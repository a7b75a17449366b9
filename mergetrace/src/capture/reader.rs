//! Reading a capture chunk by chunk. Never panics on any input: a file cut short yields every
//! complete chunk and then ends with [`CaptureReader::truncated`] set and a warning; a chunk
//! that fails its checksum or does not decode is an error naming its byte offset.
use std::{
    fs::File,
    io::{self, BufReader, Read},
    path::Path,
};

use anyhow::{anyhow, bail, Context, Result};
use mergetrace_common::{flags, kind, Event};

use super::{
    codec::EventDecoder,
    format::{self, chunk, ChunkHeader, CHUNK_HEADER_LEN, FORMAT_VERSION, MAGIC, PREAMBLE_LEN},
    header::{Header, Trailer},
    Record,
};

/// What [`CaptureReader::next_into`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A chunk of events, now in the caller's vector.
    Events,
    /// The kernel dropped `count` events of `kind` at this point of the stream.
    Lost { kind: u8, count: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Reading,
    /// The end chunk was read.
    Done,
    /// The file ended before its end chunk.
    Truncated,
    /// An error was returned; nothing more is read.
    Failed,
}

pub struct CaptureReader<R: Read = BufReader<File>> {
    src: R,
    name: String,
    header: Header,
    /// Bytes consumed: the offset of the next chunk.
    offset: u64,
    payload: Vec<u8>,
    decoder: EventDecoder,
    lost: Vec<(u8, u64)>,
    lost_next: usize,
    status: Status,
    trailer: Option<Trailer>,
    warning: Option<String>,
    events: u64,
    lost_total: u64,
    chunks: u64,
    /// Captures written before issue events said whether a request was issued again after a
    /// requeue: the requests requeued since, by address, to flag their next issue here.
    legacy_requeued: Option<foldhash::HashSet<u64>>,
}

/// A whole capture in memory.
#[derive(Debug, Clone)]
pub struct Capture {
    pub header: Header,
    /// Events chunks and lost records, in file order.
    pub records: Vec<Record>,
    /// The file ended before its end chunk (the recording was cut short).
    pub truncated: bool,
    /// The end chunk, if the capture was closed cleanly.
    pub trailer: Option<Trailer>,
    /// For people: why the capture is incomplete.
    pub warning: Option<String>,
}

impl Capture {
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.records.iter().flat_map(|r| match r {
            Record::Events(v) => v.as_slice(),
            Record::Lost { .. } => &[],
        })
    }

    pub fn lost(&self) -> u64 {
        self.records
            .iter()
            .map(|r| match r {
                Record::Lost { count, .. } => *count,
                Record::Events(_) => 0,
            })
            .fold(0, u64::saturating_add)
    }
}

/// Reads a whole capture file.
pub fn read_all(path: impl AsRef<Path>) -> Result<Capture> {
    CaptureReader::open(path)?.read_all()
}

impl CaptureReader<BufReader<File>> {
    /// Opens a capture and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let f = File::open(path)
            .with_context(|| format!("{}: cannot open the capture", path.display()))?;
        Self::from_reader(
            BufReader::with_capacity(1 << 18, f),
            path.display().to_string(),
        )
    }
}

/// Reads until `buf` is full or the input ends; the number of bytes read.
fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl<R: Read> CaptureReader<R> {
    /// Reads a capture from any byte source; `name` is what errors call it.
    pub fn from_reader(mut src: R, name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let mut pre = [0u8; PREAMBLE_LEN];
        let n = read_full(&mut src, &mut pre)
            .with_context(|| format!("{name}: cannot read the capture"))?;
        if n == 0 {
            bail!("{name}: empty file, not a mergetrace capture");
        }
        let m = n.min(MAGIC.len());
        if pre[..m] != MAGIC[..m] {
            bail!("{name}: not a mergetrace capture (it does not start with the MTRACE magic)");
        }
        if n < PREAMBLE_LEN {
            bail!("{name}: capture is truncated within its header ({n} bytes)");
        }
        let version = u16::from_le_bytes([pre[8], pre[9]]);
        if version == 0 {
            bail!("{name}: not a valid capture (format version 0)");
        }
        if version > FORMAT_VERSION {
            bail!(
                "{name}: capture format version {version} is newer than this mergetrace supports ({FORMAT_VERSION}): upgrade mergetrace"
            );
        }
        let mut r = CaptureReader {
            src,
            name,
            header: Header::default(),
            offset: PREAMBLE_LEN as u64,
            payload: Vec::new(),
            decoder: EventDecoder::for_version(version),
            lost: Vec::new(),
            lost_next: 0,
            status: Status::Reading,
            trailer: None,
            warning: None,
            events: 0,
            lost_total: 0,
            chunks: 0,
            legacy_requeued: None,
        };
        let start = r.offset;
        let Some(h) = r.read_chunk()? else {
            bail!(
                "{}: capture is truncated within its header ({} bytes)",
                r.name,
                r.offset
            );
        };
        if h.kind != chunk::HEADER {
            return Err(r.corrupt(start, "the first chunk is not the header"));
        }
        let header: Header = serde_json::from_slice(&r.payload).map_err(|e| {
            r.corrupt(
                start + CHUNK_HEADER_LEN as u64,
                &format!("header is not valid JSON: {e}"),
            )
        })?;
        if header.format_version != version {
            return Err(r.corrupt(
                start,
                &format!(
                    "the header says format version {} but the file starts with {version}",
                    header.format_version
                ),
            ));
        }
        if !header.reissues_flagged {
            r.legacy_requeued = Some(Default::default());
        }
        r.header = header;
        Ok(r)
    }

    /// The header, with the cgroups of the `c` chunks read so far added to it.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes read: the offset of the next chunk.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file ended before its end chunk: everything up to there was read.
    pub fn truncated(&self) -> bool {
        self.status == Status::Truncated
    }

    /// The end chunk was read (the capture was closed cleanly and is complete).
    pub fn finished(&self) -> bool {
        self.status == Status::Done
    }

    /// The end chunk's totals, once read.
    pub fn trailer(&self) -> Option<&Trailer> {
        self.trailer.as_ref()
    }

    /// For people: why the capture is incomplete (also logged as a warning).
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// The next record, without allocating: events are decoded into `events` (cleared
    /// first, its allocation reused). `None` at the end, clean or truncated.
    pub fn next_into(&mut self, events: &mut Vec<Event>) -> Result<Option<Next>> {
        let r = self.next_inner(events);
        if r.is_err() {
            self.status = Status::Failed;
        }
        r
    }

    fn next_inner(&mut self, events: &mut Vec<Event>) -> Result<Option<Next>> {
        loop {
            if let Some(&(kind, count)) = self.lost.get(self.lost_next) {
                self.lost_next += 1;
                return Ok(Some(Next::Lost { kind, count }));
            }
            if self.status != Status::Reading {
                return Ok(None);
            }
            let start = self.offset;
            let Some(h) = self.read_chunk()? else {
                self.status = Status::Truncated;
                let cut = self.offset - start;
                let w = format!(
                    "{}: capture is truncated: it ends at byte {} without an end chunk{} (the recording was cut short); read {} events and {} lost-event records before it",
                    self.name,
                    self.offset,
                    if cut > 0 {
                        format!(", after {cut} bytes of an incomplete chunk")
                    } else {
                        String::new()
                    },
                    self.events,
                    self.lost_total,
                );
                log::warn!("{w}");
                self.warning = Some(w);
                return Ok(None);
            };
            let payload_at = start + CHUNK_HEADER_LEN as u64;
            match h.kind {
                chunk::EVENTS => {
                    self.decoder
                        .decode(&self.payload, h.count, h.base_ts, events)
                        .map_err(|e| self.corrupt(payload_at + e.offset as u64, e.what))?;
                    if let Some(requeued) = &mut self.legacy_requeued {
                        legacy_fixups(requeued, events);
                    }
                    self.events += events.len() as u64;
                    self.chunks += 1;
                    return Ok(Some(Next::Events));
                }
                chunk::LOST => {
                    format::decode_lost(&self.payload, h.count, &mut self.lost)
                        .map_err(|e| self.corrupt(payload_at + e.offset as u64, e.what))?;
                    self.lost_next = 0;
                    for (_, n) in &self.lost {
                        self.lost_total = self.lost_total.saturating_add(*n);
                    }
                    self.chunks += 1;
                }
                chunk::END => {
                    let t: Trailer = serde_json::from_slice(&self.payload).map_err(|e| {
                        self.corrupt(payload_at, &format!("end chunk is not valid JSON: {e}"))
                    })?;
                    for (what, said, seen) in [
                        ("events", t.events, self.events),
                        ("lost events", t.lost, self.lost_total),
                        ("chunks", t.chunks, self.chunks),
                    ] {
                        if said != seen {
                            return Err(self.corrupt(
                                start,
                                &format!(
                                    "the end chunk counts {said} {what} but the file holds {seen}"
                                ),
                            ));
                        }
                    }
                    let mut more = [0u8; 1];
                    if read_full(&mut self.src, &mut more).map_err(|e| self.io_error(e))? > 0 {
                        return Err(self.corrupt(self.offset, "data after the end chunk"));
                    }
                    self.trailer = Some(t);
                    self.status = Status::Done;
                    return Ok(None);
                }
                chunk::CGROUPS => {
                    let late = serde_json::from_slice(&self.payload).map_err(|e| {
                        self.corrupt(payload_at, &format!("cgroups chunk is not valid JSON: {e}"))
                    })?;
                    self.header.add_late(late);
                }
                chunk::HEADER => return Err(self.corrupt(start, "a second header chunk")),
                t if chunk::is_ancillary(t) => {} // a newer writer's optional chunk: skip
                t => {
                    return Err(self.corrupt(
                        start,
                        &format!("unknown chunk type 0x{t:02x} (written by a newer mergetrace?)"),
                    ))
                }
            }
        }
    }

    /// Reads one chunk into `self.payload` and checks both checksums. `None` if the input
    /// ends before the chunk does (then `offset` counts the partial bytes too).
    fn read_chunk(&mut self) -> Result<Option<ChunkHeader>> {
        let start = self.offset;
        let mut hb = [0u8; CHUNK_HEADER_LEN];
        let n = read_full(&mut self.src, &mut hb).map_err(|e| self.io_error(e))?;
        self.offset += n as u64;
        // A zero-filled tail (what a crash can leave after the last write that reached the
        // disk) is a cut too, not corruption.
        if n < CHUNK_HEADER_LEN || hb == [0; CHUNK_HEADER_LEN] {
            return Ok(None);
        }
        let h = ChunkHeader::decode(&hb).map_err(|what| self.corrupt(start, what))?;
        self.payload.clear();
        let got = (&mut self.src)
            .take(h.len as u64)
            .read_to_end(&mut self.payload)
            .map_err(|e| self.io_error(e))?;
        self.offset += got as u64;
        if got < h.len as usize {
            return Ok(None);
        }
        if crc32fast::hash(&self.payload) != h.crc {
            return Err(self.corrupt(
                start,
                &format!("{} chunk payload checksum mismatch", chunk::name(h.kind)),
            ));
        }
        Ok(Some(h))
    }

    fn corrupt(&self, offset: u64, what: &str) -> anyhow::Error {
        anyhow!(
            "{}: corrupt capture at byte offset {offset}: {what}",
            self.name
        )
    }

    fn io_error(&self, e: io::Error) -> anyhow::Error {
        anyhow!("{}: cannot read the capture: {e}", self.name)
    }

    /// Reads every remaining record.
    pub fn read_all(mut self) -> Result<Capture> {
        let mut records = Vec::new();
        for r in &mut self {
            records.push(r?);
        }
        Ok(Capture {
            header: self.header.clone(),
            records,
            truncated: self.truncated(),
            trailer: self.trailer.clone(),
            warning: self.warning.clone(),
        })
    }
}

/// One record per item; events chunks come as their own vectors (one allocation per chunk:
/// use [`CaptureReader::next_into`] to reuse one). Ends after the first error.
impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut v = Vec::new();
        match self.next_into(&mut v) {
            Ok(Some(Next::Events)) => Some(Ok(Record::Events(v))),
            Ok(Some(Next::Lost { kind, count })) => Some(Ok(Record::Lost { kind, count })),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// What the kernel side does since captures say so (`Header::reissues_flagged`), done on
/// reading an older capture: an issue that follows a requeue of the same request is flagged
/// [`flags::REISSUE`], and a request without a start sector (a flush) starts at 0, as the
/// kernel's own tracepoints say, not at `(sector_t)-1`.
fn legacy_fixups(requeued: &mut foldhash::HashSet<u64>, events: &mut [Event]) {
    for ev in events {
        if ev.kind >= kind::RQ_MERGE && ev.kind <= kind::RQ_REQUEUE && ev.sector == u64::MAX {
            ev.sector = 0;
        }
        match ev.kind {
            kind::RQ_REQUEUE => {
                requeued.insert(ev.id);
            }
            kind::RQ_ISSUE if requeued.remove(&ev.id) => ev.flags |= flags::REISSUE,
            _ => {}
        }
    }
}
