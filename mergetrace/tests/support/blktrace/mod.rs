//! The real blktrace as a second oracle: `blktrace -d /dev/X` records every block-layer
//! event of the device over a window, `blkparse` prints them in a format of ours
//! ([`BLKPARSE_FORMAT`]), and [`parse_blkparse`] turns that into per-action counts by
//! direction and the requests' identities.
//!
//! blktrace needs debugfs (`/sys/kernel/debug/block/X/trace*`): the lab's guests mount it,
//! this host refuses it, so the tests use it only in the guests ([`super::in_lab`]). The parser
//! is plain text processing and has unit tests that run anywhere.
//!
//! # What each action counts (Debian 6.1.192 and 6.12.117 source, `kernel/trace/blktrace.c`)
//!
//! blktrace registers one probe per block tracepoint; the action letter is the tracepoint:
//!
//! | action | tracepoint | fired from |
//! |---|---|---|
//! | Q | `block_bio_queue` | `submit_bio_noacct_nocheck`, once per bio: it sets `BIO_TRACE_COMPLETION` and fires only while that flag is clear. A split remainder goes back through `submit_bio_noacct` still carrying the flag, so it gets **no** second Q |
//! | X | `block_split` | `bio_submit_split` (6.12) / `__bio_split_to_limits` (6.1): sector and size of the split-off front part, pdu = the remainder's start sector |
//! | M | `block_bio_backmerge` **and** `block_rq_merge` | a bio appended to a request (plug, elevator, software queue) — and a whole request absorbed into another (`attempt_merge`, mapped to `BLK_TA_BACKMERGE` by `blk_add_trace_rq_merge`) |
//! | F | `block_bio_frontmerge` | a bio prepended to a request |
//! | G | `block_getrq` | `blk_mq_submit_bio`, once per request allocated for a bio — including the request of an empty `REQ_PREFLUSH` write bio, which the flush machinery completes without issuing (`blk_insert_flush`). The flush requests it issues instead (`fq->flush_rq`) get no G |
//! | I | `block_rq_insert` | a request put in the scheduler or a software queue (not on direct issue, not for flush requests; 6.12 also for the data step of a flush sequence, 6.1 not) |
//! | D | `block_rq_issue` | `blk_mq_start_request`: every issue, flush requests and re-issues after a requeue included |
//! | R | `block_rq_requeue` | `__blk_mq_requeue_request`: the driver handed the request back (`BLK_STS_*RESOURCE`) |
//! | C | `block_rq_complete` | `blk_update_request` / `blk_complete_request`: every completion call, before `if (!req->bio)`. A request of a flush sequence (`RQF_FLUSH_SEQ`) completes twice: its data step (if any) and again with 0 bytes when the sequence is done (`blk_flush_complete_seq`, `REQ_FSEQ_DONE` → `blk_mq_end_request`); an empty PREFLUSH write only the second time |
//! | P / U, UT | `block_plug` / `block_unplug` | U for an explicit unplug (`blk_finish_plug`), UT from schedule; pdu = requests in the plug |
//! | S, B, A | sleeprq, bounce, remap | none on blk-mq whole disks here (no `block_sleeprq` in 6.x; bounce and remap need highmem / partitions) |
//!
//! Discard merges (`bio_attempt_discard_merge`) fire no tracepoint, so they are in no M.
//!
//! Which relations follow with mergetrace's JSON over the same window, the device drained at
//! both ends (summed over read, write, discard, flush): `Q = bios`; `X = splits`;
//! `M + F = merged - merged_by_path.discard`; `G = requests + flush_only + merged_by_path.request`
//! (read, write, discard: a request absorbed into another had its G but no D); `D = requests +
//! requeues`; `R = requeues`; `C - C0 = D - R` where C0 are the 0-byte write completions that end
//! flush sequences, one per request that entered the machinery: `C0 = G of write bios carrying
//! PREFLUSH, or FUA on a device without FUA` when the device has a write-back cache; and
//! `U` / `UT` with their pdu = the `unplug.explicit` / `unplug.from_schedule` histograms.
//!
//! # RWBS
//!
//! blkparse's `fill_rwbs` (blktrace 1.2.0) writes: `F` if the action carries `BLK_TC_FLUSH`
//! (the kernel sets it for `REQ_PREFLUSH` and for `REQ_OP_FLUSH`), then `D` (discard), `W`
//! (`op_is_write`: write, write zeroes...), `R` (a read with bytes) or `N` (no data: a flush
//! request, `REQ_OP_FLUSH` is even), then `F` for `REQ_FUA`, `A` readahead, `S` sync, `M` meta.
//! So a flush request is `FN` (sector 0, size 0), an fsync's empty flush bio `FW` / `FWS`, a
//! journal commit block `FWFS`.
#![allow(dead_code)]

use std::collections::BTreeMap;

use super::BlockDev;

mod run;

#[allow(unused_imports)] // used by the binaries that run blktrace
pub use run::*;

/// The line format given to blkparse (`-f`, every action). `@mt` marks our lines; fields:
/// action, RWBS, sector, bytes, MAJ,MIN, cpu, sequence, seconds.nanoseconds, pid.
pub const BLKPARSE_FORMAT: &str = r"@mt %a %d %S %N %M,%m %c %s %T.%t %p\n";
/// The same plus the pdu integer (`%U`), for the actions that carry one: X (the remainder's
/// sector) and U / UT (requests in the plug). `%U` reads the pdu blindly, so only these.
pub const BLKPARSE_FORMAT_PDU: &str = r"@mt %a %d %S %N %M,%m %c %s %T.%t %p %U\n";

/// The direction of an event, as the kernel's `op_stat_group` (and /proc/diskstats, and
/// mergetrace) sees it, from blkparse's RWBS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dir {
    Read,
    Write,
    Discard,
    /// `REQ_OP_FLUSH`: `FN`.
    Flush,
    /// No data and no flush (`N`): plug/unplug and anything else.
    None,
}

impl Dir {
    pub fn name(self) -> &'static str {
        match self {
            Dir::Read => "read",
            Dir::Write => "write",
            Dir::Discard => "discard",
            Dir::Flush => "flush",
            Dir::None => "none",
        }
    }
}

/// The flags of one RWBS field, e.g. "FWFS".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rwbs {
    /// Leading `F`: `REQ_PREFLUSH` (or `REQ_OP_FLUSH`).
    pub preflush: bool,
    /// The operation letter: `D`, `W`, `R` or `N`.
    pub op: char,
    /// `F` after the operation: `REQ_FUA`.
    pub fua: bool,
    pub ahead: bool,
    pub sync: bool,
    pub meta: bool,
}

impl Rwbs {
    /// Parses blkparse's RWBS; `None` when it is not one.
    pub fn parse(s: &str) -> Option<Rwbs> {
        let mut c = s.chars().peekable();
        let mut r = Rwbs::default();
        if c.peek() == Some(&'F') {
            r.preflush = true;
            c.next();
        }
        r.op = c.next().filter(|o| "DWRN".contains(*o))?;
        for f in c {
            match f {
                'F' if !r.fua => r.fua = true,
                'A' => r.ahead = true,
                'S' => r.sync = true,
                'M' => r.meta = true,
                // A secure erase is "DE" in the kernel's own rwbs; count it as a discard.
                'E' if r.op == 'D' => {}
                _ => return None,
            }
        }
        Some(r)
    }

    pub fn dir(&self) -> Dir {
        match self.op {
            'D' => Dir::Discard,
            'W' => Dir::Write,
            'R' => Dir::Read,
            _ if self.preflush => Dir::Flush,
            _ => Dir::None,
        }
    }
}

/// One event line of blkparse in [`BLKPARSE_FORMAT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// "Q", "M", "F", "G", "I", "D", "C", "R", "X", "P", "U", "UT", ...
    pub action: String,
    pub rwbs: String,
    pub flags: Rwbs,
    pub sector: u64,
    pub bytes: u64,
    pub major: u32,
    pub minor: u32,
    pub cpu: u32,
    pub seq: u64,
    pub time_ns: u64,
    pub pid: u32,
    /// X: the remainder's start sector; U / UT: requests in the plug.
    pub pdu: Option<u64>,
}

impl Event {
    pub fn dir(&self) -> Dir {
        self.flags.dir()
    }

    /// The sector after the last one this event covers.
    pub fn end(&self) -> u64 {
        self.sector + self.bytes / 512
    }
}

/// Parses one line of `blkparse -f BLKPARSE_FORMAT`; `Ok(None)` for lines that are not ours
/// (blkparse's messages, summaries), `Err` for one of ours that does not parse.
pub fn parse_line(line: &str) -> Result<Option<Event>, String> {
    let line = line.trim_end();
    let Some(rest) = line.strip_prefix("@mt ") else {
        return Ok(None);
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.len() != 9 && f.len() != 10 {
        return Err(format!("{} fields, expected 9 or 10: {line:?}", f.len()));
    }
    let num = |i: usize, what: &str| -> Result<u64, String> {
        f[i].parse::<u64>()
            .map_err(|e| format!("{what} {:?} is not a number ({e}): {line:?}", f[i]))
    };
    let flags = Rwbs::parse(f[1]).ok_or_else(|| format!("bad RWBS {:?}: {line:?}", f[1]))?;
    let (major, minor) = f[4]
        .split_once(',')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("bad device {:?}: {line:?}", f[4]))?;
    let (secs, nanos) = f[7]
        .split_once('.')
        .and_then(|(s, n)| Some((s.parse::<u64>().ok()?, n.parse::<u64>().ok()?)))
        .ok_or_else(|| format!("bad time {:?}: {line:?}", f[7]))?;
    Ok(Some(Event {
        action: f[0].to_string(),
        rwbs: f[1].to_string(),
        flags,
        sector: num(2, "sector")?,
        bytes: num(3, "bytes")?,
        major,
        minor,
        cpu: num(5, "cpu")? as u32,
        seq: num(6, "sequence")?,
        time_ns: secs * 1_000_000_000 + nanos,
        pid: num(8, "pid")? as u32,
        pdu: if f.len() == 10 {
            Some(num(9, "pdu")?)
        } else {
            None
        },
    }))
}

/// A request as blktrace shows it: created by a G (or, for a flush request, first seen at its
/// D), grown by the bios merged into it, issued at D. Identity: start sector + size on the
/// device, as blkparse itself (`-t`) tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub sector: u64,
    pub bytes: u64,
    /// RWBS of its (first) issue.
    pub rwbs: String,
    pub dir: Dir,
    /// Bios in it: the one of its G, plus every M / F that merged into it (0 for a flush
    /// request, which has no bio).
    pub bios: u64,
    /// Those bios' (sector, bytes), in the order they joined (G first).
    pub bio_extents: Vec<(u64, u64)>,
    /// The same bios in the request's chain order (`rq->bio` .. `rq->biotail`, what
    /// mergetrace's `report --lineage` lists): a back merge appends, a front merge prepends,
    /// a request merged into this one appends its chain.
    pub chain: Vec<(u64, u64)>,
    /// Times issued (more than 1 after requeues).
    pub issues: u64,
    pub requeues: u64,
    /// Completions seen (including the 0-byte one that ends a flush sequence).
    pub completions: u64,
}

/// Everything blkparse printed for one window.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub events: Vec<Event>,
    /// Lines that were not ours (blkparse notes); kept for messages.
    pub other_lines: Vec<String>,
    /// Events blktrace reported as dropped (relay buffers full); must be 0 for exact counts.
    pub dropped: Option<u64>,
}

/// Per-action, per-direction counts of a [`Trace`].
pub type Counts = BTreeMap<(String, Dir), u64>;

/// Parses blkparse's whole output.
pub fn parse_blkparse(text: &str) -> Result<Trace, String> {
    let mut t = Trace::default();
    for line in text.lines() {
        match parse_line(line)? {
            Some(e) => t.events.push(e),
            None if line.trim().is_empty() => {}
            None => t.other_lines.push(line.to_string()),
        }
    }
    Ok(t)
}

/// The dropped-events count in blktrace's closing summary ("Total: 123 events (dropped 0), 6
/// KiB data", or "You have 5 ( 0.0 MiB) dropped events").
pub fn parse_dropped(summary: &str) -> Option<u64> {
    let mut found = None;
    for line in summary.lines() {
        if let Some(i) = line.find("(dropped ") {
            let n: String = line[i + 9..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            if let Ok(n) = n.parse::<u64>() {
                found = Some(found.unwrap_or(0) + n);
            }
        }
    }
    found
}

impl Trace {
    /// Events of `dev` only (blktrace traces one device, but be sure).
    pub fn of(&self, dev: &BlockDev) -> impl Iterator<Item = &Event> + '_ {
        let (maj, min) = (dev.major, dev.minor);
        self.events
            .iter()
            .filter(move |e| e.major == maj && e.minor == min)
    }

    /// `(action, direction) → events`.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::new();
        for e in &self.events {
            *c.entry((e.action.clone(), e.dir())).or_default() += 1;
        }
        c
    }

    /// The lines of one action, in order (e.g. every D: each issue's sector, size, RWBS).
    pub fn lines<'a>(&'a self, action: &'a str) -> impl Iterator<Item = &'a Event> + 'a {
        self.events.iter().filter(move |e| e.action == action)
    }

    /// One action's events by their whole RWBS ("WS", "FWFS", "FN", ...).
    pub fn counts_by_rwbs(&self, action: &str) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for e in self.lines(action) {
            *m.entry(e.rwbs.clone()).or_default() += 1;
        }
        m
    }

    /// Events of one action matching `pred` (e.g. `|e| e.flags.fua`, `|e| e.flags.sync`).
    pub fn count_where(&self, action: &str, pred: impl Fn(&Event) -> bool) -> u64 {
        self.lines(action).filter(|e| pred(e)).count() as u64
    }

    /// Events of one action (all directions).
    pub fn count(&self, action: &str) -> u64 {
        self.events.iter().filter(|e| e.action == action).count() as u64
    }

    /// Events of one action in one direction.
    pub fn count_dir(&self, action: &str, dir: Dir) -> u64 {
        self.events
            .iter()
            .filter(|e| e.action == action && e.dir() == dir)
            .count() as u64
    }

    /// Sum of the bytes of one action in one direction.
    pub fn bytes_dir(&self, action: &str, dir: Dir) -> u64 {
        self.events
            .iter()
            .filter(|e| e.action == action && e.dir() == dir)
            .map(|e| e.bytes)
            .sum()
    }

    /// Requests created for empty write bios with PREFLUSH or FUA (an fsync's flush): the G
    /// lines `FW..` / `W.F..` of 0 bytes. The flush machinery completes them without a D.
    pub fn flush_only_getrqs(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| {
                e.action == "G"
                    && e.dir() == Dir::Write
                    && e.bytes == 0
                    && (e.flags.preflush || e.flags.fua)
            })
            .count() as u64
    }

    /// Requests that entered the flush machinery on a device with a write-back cache: a G of
    /// a write carrying PREFLUSH, or FUA where the device has no FUA (`blk_insert_flush`'s
    /// policy is more than "data only"). Each ends with a 0-byte completion.
    pub fn flush_sequence_getrqs(&self, device_fua: bool) -> u64 {
        self.events
            .iter()
            .filter(|e| {
                e.action == "G"
                    && e.dir() == Dir::Write
                    && (e.flags.preflush || (e.flags.fua && !device_fua))
            })
            .count() as u64
    }

    /// Completions of 0 bytes in the write direction: the ends of flush sequences.
    pub fn zero_byte_write_completions(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| e.action == "C" && e.dir() == Dir::Write && e.bytes == 0)
            .count() as u64
    }

    /// The unplug pdu histogram of `action` ("U" explicit, "UT" from schedule): requests in
    /// the plug → unplugs.
    pub fn unplug_depths(&self, action: &str) -> BTreeMap<u64, u64> {
        let mut h = BTreeMap::new();
        for e in self.events.iter().filter(|e| e.action == action) {
            *h.entry(e.pdu.unwrap_or(0)).or_default() += 1;
        }
        h
    }

    /// D lines that re-issue a request that was requeued (an R of the same sector + size
    /// came before and had not been re-issued yet).
    pub fn reissues(&self) -> u64 {
        let mut pending: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        let mut n = 0;
        for e in &self.events {
            match e.action.as_str() {
                "R" => *pending.entry((e.sector, e.bytes)).or_default() += 1,
                "D" => {
                    if let Some(c) = pending.get_mut(&(e.sector, e.bytes)) {
                        if *c > 0 {
                            *c -= 1;
                            n += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        n
    }

    /// First issues' bytes per direction (re-issues after a requeue not counted again), to
    /// compare with `request_bytes`.
    pub fn first_issue_bytes(&self, dir: Dir) -> u64 {
        let mut pending: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        let mut sum = 0;
        for e in &self.events {
            match e.action.as_str() {
                "R" => *pending.entry((e.sector, e.bytes)).or_default() += 1,
                "D" => {
                    let again = pending
                        .get_mut(&(e.sector, e.bytes))
                        .filter(|c| **c > 0)
                        .map(|c| *c -= 1)
                        .is_some();
                    if !again && e.dir() == dir {
                        sum += e.bytes;
                    }
                }
                _ => {}
            }
        }
        sum
    }

    /// The requests, reconstructed in event order from G / M / F / D / R / C by sector +
    /// size: a back merge M extends the waiting request that ends at the bio's sector, a front
    /// merge F the one that starts at the bio's end; a D issues the waiting request of that
    /// start and size (a flush request has no G: it is made at its D). An M that names a
    /// whole waiting request (a request merge, `block_rq_merge`) folds that request into
    /// the one that ends at its start. Returns the issued requests, in the order of their
    /// first issue, and the number of M / F / D that matched no waiting request.
    // Long (~130 lines) on purpose: one pass over the events, a state machine whose arms
    // (G, M/F, D, R, C) share the table of open requests.
    pub fn requests(&self) -> (Vec<Request>, u64) {
        #[derive(Clone)]
        struct Open {
            sector: u64,
            bytes: u64,
            dir: Dir,
            bios: u64,
            extents: Vec<(u64, u64)>,
            chain: std::collections::VecDeque<(u64, u64)>,
        }
        let mut waiting: Vec<Open> = Vec::new();
        let mut issued: Vec<Request> = Vec::new();
        // (sector, bytes) → index in `issued` of the requests issued and not yet completed.
        let mut in_flight: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
        let mut unmatched = 0;
        for e in &self.events {
            match e.action.as_str() {
                "G" => waiting.push(Open {
                    sector: e.sector,
                    bytes: e.bytes,
                    dir: e.dir(),
                    bios: 1,
                    extents: vec![(e.sector, e.bytes)],
                    chain: [(e.sector, e.bytes)].into(),
                }),
                "M" => {
                    // A whole waiting request merged away (block_rq_merge)?
                    if let Some(i) = waiting.iter().position(|w| {
                        w.sector == e.sector && w.bytes == e.bytes && w.dir == e.dir()
                    }) {
                        if let Some(j) = waiting
                            .iter()
                            .position(|w| w.dir == e.dir() && w.sector + w.bytes / 512 == e.sector)
                        {
                            let gone = waiting[i].clone();
                            waiting[j].bytes += gone.bytes;
                            waiting[j].bios += gone.bios;
                            waiting[j].extents.extend(gone.extents);
                            waiting[j].chain.extend(gone.chain);
                            waiting.remove(i);
                            continue;
                        }
                    }
                    match waiting
                        .iter_mut()
                        .find(|w| w.dir == e.dir() && w.sector + w.bytes / 512 == e.sector)
                    {
                        Some(w) => {
                            w.bytes += e.bytes;
                            w.bios += 1;
                            w.extents.push((e.sector, e.bytes));
                            w.chain.push_back((e.sector, e.bytes));
                        }
                        None => unmatched += 1,
                    }
                }
                "F" => match waiting
                    .iter_mut()
                    .find(|w| w.dir == e.dir() && w.sector == e.end())
                {
                    Some(w) => {
                        w.sector = e.sector;
                        w.bytes += e.bytes;
                        w.bios += 1;
                        w.extents.push((e.sector, e.bytes));
                        w.chain.push_front((e.sector, e.bytes));
                    }
                    None => unmatched += 1,
                },
                "D" => {
                    let key = (e.sector, e.bytes);
                    // A re-issue after a requeue: the same request again.
                    if let Some(i) = in_flight.get(&key).and_then(|v| {
                        v.iter()
                            .copied()
                            .find(|&i| issued[i].requeues >= issued[i].issues)
                    }) {
                        issued[i].issues += 1;
                        continue;
                    }
                    // Of the same direction: a flush request (FN, sector 0, 0 bytes) is not the
                    // request of an empty PREFLUSH write bio (FWS, sector 0, 0 bytes), which
                    // the flush machinery completes without a D.
                    let (bios, bio_extents, chain) = match waiting.iter().position(|w| {
                        w.sector == e.sector && w.bytes == e.bytes && w.dir == e.dir()
                    }) {
                        Some(i) => {
                            let w = waiting.remove(i);
                            (w.bios, w.extents, w.chain.into())
                        }
                        None if e.dir() == Dir::Flush => (0, Vec::new(), Vec::new()),
                        None => {
                            unmatched += 1;
                            (0, Vec::new(), Vec::new())
                        }
                    };
                    issued.push(Request {
                        sector: e.sector,
                        bytes: e.bytes,
                        rwbs: e.rwbs.clone(),
                        dir: e.dir(),
                        bios,
                        bio_extents,
                        chain,
                        issues: 1,
                        requeues: 0,
                        completions: 0,
                    });
                    in_flight.entry(key).or_default().push(issued.len() - 1);
                }
                "R" => {
                    if let Some(&i) = in_flight.get(&(e.sector, e.bytes)).and_then(|v| v.last()) {
                        issued[i].requeues += 1;
                    }
                }
                "C" => {
                    if let Some(v) = in_flight.get_mut(&(e.sector, e.bytes)) {
                        if !v.is_empty() {
                            let i = v.remove(0);
                            issued[i].completions += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        (issued, unmatched)
    }
}
