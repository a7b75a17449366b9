//! `--format blktrace`: the binary trace format of blktrace (version 7, `struct blk_io_trace`
//! of include/uapi/linux/blktrace_api.h), one file per device, as blkparse and btt read it.
//!
//! Each record is 48 bytes (native byte order, here little-endian; blkparse detects the order
//! from the magic) followed by `pdu_len` bytes of payload:
//!
//! ```text
//! u32 magic     0x65617407 (BLK_IO_TRACE_MAGIC | version 7)
//! u32 sequence  per file, from 1
//! u64 time      ns since the capture's start
//! u64 sector
//! u32 bytes
//! u32 action    __BLK_TA_* | category bits << 16 (BLK_TC_*)
//! u32 pid       0: the capture does not record processes
//! u32 device    the kernel's dev_t (major << 20 | minor), as blktrace writes it
//! u32 cpu       0: the capture does not record CPUs
//! u16 error
//! u16 pdu_len
//! ```
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use mergetrace_common::{kind, Event};

use crate::capture::Header;

pub const MAGIC: u32 = 0x6561_7400 | 0x07;
pub const RECORD_LEN: usize = 48;

// enum blktrace_act
pub const TA_QUEUE: u32 = 1;
pub const TA_BACKMERGE: u32 = 2;
pub const TA_FRONTMERGE: u32 = 3;
pub const TA_GETRQ: u32 = 4;
pub const TA_REQUEUE: u32 = 6;
pub const TA_ISSUE: u32 = 7;
pub const TA_COMPLETE: u32 = 8;
pub const TA_UNPLUG_IO: u32 = 10;
pub const TA_UNPLUG_TIMER: u32 = 11;
pub const TA_INSERT: u32 = 12;
pub const TA_SPLIT: u32 = 13;

// enum blktrace_cat, shifted by BLK_TC_SHIFT (16) in `action`
const TC_READ: u32 = 1 << 0;
const TC_WRITE: u32 = 1 << 1;
const TC_FLUSH: u32 = 1 << 2;
const TC_QUEUE: u32 = 1 << 4;
const TC_REQUEUE: u32 = 1 << 5;
const TC_ISSUE: u32 = 1 << 6;
const TC_COMPLETE: u32 = 1 << 7;
const TC_FS: u32 = 1 << 8;
const TC_DISCARD: u32 = 1 << 13;

const fn act(cat: u32) -> u32 {
    cat << 16
}

/// The action word of an event as the kernel's blktrace would write it, or `None` for
/// kinds blktrace has no action for (the fentry tier's kinds).
pub fn action(ev: &Event) -> Option<u32> {
    // __blk_add_trace: direction from op_is_write(), discard and flush ops flagged.
    let mut cats = if ev.op & 1 == 1 { TC_WRITE } else { TC_READ };
    match ev.op {
        3 | 5 => cats |= TC_DISCARD,
        2 => cats |= TC_FLUSH,
        _ => {}
    }
    // Request events carry BLK_TC_FS (blk_add_trace_rq, not passthrough).
    let (ta, cat) = match ev.kind {
        kind::BIO_QUEUE => (TA_QUEUE, TC_QUEUE),
        kind::BACK_MERGE => (TA_BACKMERGE, TC_QUEUE),
        kind::FRONT_MERGE => (TA_FRONTMERGE, TC_QUEUE),
        kind::GETRQ => (TA_GETRQ, TC_QUEUE),
        kind::SPLIT => (TA_SPLIT, 0),
        // blk_add_trace_rq_merge reports the absorbed request as a back merge.
        kind::RQ_MERGE => (TA_BACKMERGE, TC_QUEUE | TC_FS),
        kind::RQ_INSERT => (TA_INSERT, TC_QUEUE | TC_FS),
        kind::RQ_ISSUE => (TA_ISSUE, TC_ISSUE | TC_FS),
        kind::RQ_REQUEUE => (TA_REQUEUE, TC_REQUEUE | TC_FS),
        kind::RQ_COMPLETE => (TA_COMPLETE, TC_COMPLETE | TC_FS),
        kind::UNPLUG => {
            // no direction: blk_add_trace_unplug passes op 0 and no flags
            let ta = if ev.flags & mergetrace_common::flags::UNPLUG_EXPLICIT != 0 {
                TA_UNPLUG_IO
            } else {
                TA_UNPLUG_TIMER
            };
            return Some(ta | act(TC_QUEUE));
        }
        _ => return None,
    };
    Some(ta | act(cat | cats))
}

/// `blk_status_to_errno()`, negated and truncated to u16 as blktrace stores it.
fn errno_of(status: u8) -> u16 {
    let e: i32 = match status {
        0 => 0,
        1 => 95,  // BLK_STS_NOTSUPP: EOPNOTSUPP
        2 => 110, // TIMEOUT: ETIMEDOUT
        3 => 28,  // NOSPC: ENOSPC
        4 => 67,  // TRANSPORT: ENOLINK
        5 => 121, // TARGET: EREMOTEIO
        6 => 52,  // RESV_CONFLICT: EBADE
        7 => 61,  // MEDIUM: ENODATA
        8 => 84,  // PROTECTION: EILSEQ
        9 => 12,  // RESOURCE: ENOMEM
        11 => 11, // AGAIN: EAGAIN
        _ => 5,   // IOERR and anything newer: EIO
    };
    (-e) as u16
}

/// One record (header + payload) of `ev`, or `None` if blktrace has no action for it.
pub fn record(ev: &Event, sequence: u32, start_ns: u64) -> Option<Vec<u8>> {
    let action = action(ev)?;
    let (sector, bytes, error, pdu): (u64, u32, u16, Vec<u8>) = match ev.kind {
        // the new sector of the remainder, big-endian u64 (blk_add_trace_split)
        kind::SPLIT => (
            ev.sector,
            ev.bytes,
            0,
            (ev.aux as u64).to_be_bytes().to_vec(),
        ),
        // the depth, big-endian u64 (blk_add_trace_unplug)
        kind::UNPLUG => (0, 0, 0, (ev.aux as u64).to_be_bytes().to_vec()),
        // bytes completed this time
        kind::RQ_COMPLETE => (ev.sector, ev.aux, errno_of(ev.path), Vec::new()),
        _ => (ev.sector, ev.bytes, 0, Vec::new()),
    };
    let mut r = Vec::with_capacity(RECORD_LEN + pdu.len());
    r.extend_from_slice(&MAGIC.to_le_bytes());
    r.extend_from_slice(&sequence.to_le_bytes());
    r.extend_from_slice(&ev.ts_ns.saturating_sub(start_ns).to_le_bytes());
    r.extend_from_slice(&sector.to_le_bytes());
    r.extend_from_slice(&bytes.to_le_bytes());
    r.extend_from_slice(&action.to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes()); // pid
    r.extend_from_slice(&ev.dev.to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes()); // cpu
    r.extend_from_slice(&error.to_le_bytes());
    r.extend_from_slice(&(pdu.len() as u16).to_le_bytes());
    r.extend_from_slice(&pdu);
    Some(r)
}

/// blktrace's notify record naming process `pid` (`BLK_TN_PROCESS`, as `trace_note_tsk`
/// writes it: the 16-byte comm as payload), so blkparse prints "[unknown]" for pid 0.
pub fn process_note(dev: u32, pid: u32, comm: &str, sequence: u32) -> Vec<u8> {
    const TC_NOTIFY: u32 = 1 << 10;
    let mut name = [0u8; 16];
    let n = comm.len().min(15);
    name[..n].copy_from_slice(&comm.as_bytes()[..n]);
    let mut r = Vec::with_capacity(RECORD_LEN + 16);
    r.extend_from_slice(&MAGIC.to_le_bytes());
    r.extend_from_slice(&sequence.to_le_bytes());
    r.extend_from_slice(&0u64.to_le_bytes()); // time
    r.extend_from_slice(&0u64.to_le_bytes()); // sector
    r.extend_from_slice(&0u32.to_le_bytes()); // bytes
    r.extend_from_slice(&act(TC_NOTIFY).to_le_bytes()); // BLK_TN_PROCESS = 0
    r.extend_from_slice(&pid.to_le_bytes());
    r.extend_from_slice(&dev.to_le_bytes());
    r.extend_from_slice(&0u32.to_le_bytes()); // cpu
    r.extend_from_slice(&0u16.to_le_bytes()); // error
    r.extend_from_slice(&16u16.to_le_bytes());
    r.extend_from_slice(&name);
    r
}

/// Writes the records of one device's events (in time order, stable) to `out`, after a note
/// naming pid 0 "unknown"; returns how many event records were written.
pub fn write_device(
    out: &mut dyn Write,
    dev: u32,
    events: &[&Event],
    start_ns: u64,
) -> Result<u64> {
    let mut sorted: Vec<&Event> = events.to_vec();
    sorted.sort_by_key(|e| e.ts_ns);
    out.write_all(&process_note(dev, 0, "unknown", 1))?;
    let mut seq = 1u32;
    for ev in sorted {
        if let Some(r) = record(ev, seq.wrapping_add(1), start_ns) {
            seq = seq.wrapping_add(1);
            out.write_all(&r)?;
        }
    }
    Ok(seq as u64 - 1)
}

/// A file written.
pub struct Written {
    pub device: String,
    pub path: PathBuf,
    /// What to give `blkparse -i`.
    pub input: PathBuf,
    pub traces: u64,
}

/// `BASE.blktrace.0` for a single device, `BASE.NAME.blktrace.0` for each of several.
pub fn write_files(base: &Path, events: &[Event], h: &Header) -> Result<Vec<Written>> {
    let mut out = Vec::new();
    let several = h.devices.len() > 1;
    for d in &h.devices {
        let dev = d.dev().0;
        let mine: Vec<&Event> = events.iter().filter(|e| e.dev == dev).collect();
        let input = if several {
            PathBuf::from(format!("{}.{}", base.display(), d.name))
        } else {
            base.to_path_buf()
        };
        let path = PathBuf::from(format!("{}.blktrace.0", input.display()));
        let f = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = BufWriter::new(f);
        let traces = write_device(&mut w, dev, &mine, h.start_monotonic_ns)?;
        w.flush()
            .with_context(|| format!("cannot write {}", path.display()))?;
        out.push(Written {
            device: d.name.clone(),
            path,
            input,
            traces,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::synth::{Synth, START_NS};
    use mergetrace_common::path;

    fn field_u32(r: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(r[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn export_blktrace_records_have_the_kernel_layout() {
        let mut s = Synth::new();
        s.batch(7 << 20 | 2, 1, 0, 2, 4096, false, path::PLUG);
        s.split(7 << 20 | 2, 1, 0xabc, 16, 4096);
        let q = record(&s.events[0], 1, START_NS).unwrap();
        assert_eq!(q.len(), RECORD_LEN);
        assert_eq!(field_u32(&q, 0), 0x6561_7407);
        assert_eq!(field_u32(&q, 4), 1);
        assert_eq!(u64::from_le_bytes(q[8..16].try_into().unwrap()), 1000);
        assert_eq!(u64::from_le_bytes(q[16..24].try_into().unwrap()), 0);
        assert_eq!(field_u32(&q, 24), 4096);
        // BLK_TA_QUEUE | (BLK_TC_QUEUE | BLK_TC_WRITE) << 16
        assert_eq!(field_u32(&q, 28), 1 | ((1 << 4 | 1 << 1) << 16));
        assert_eq!(field_u32(&q, 36), 7 << 20 | 2);
        let kinds: Vec<u32> = s
            .events
            .iter()
            .map(|e| action(e).unwrap() & 0xffff)
            .collect();
        // Q G Q M U D C X
        assert_eq!(
            kinds,
            [
                TA_QUEUE,
                TA_GETRQ,
                TA_QUEUE,
                TA_BACKMERGE,
                TA_UNPLUG_IO,
                TA_ISSUE,
                TA_COMPLETE,
                TA_SPLIT
            ]
        );
        let u = record(&s.events[4], 5, START_NS).unwrap();
        assert_eq!(u.len(), RECORD_LEN + 8);
        assert_eq!(u16::from_le_bytes(u[46..48].try_into().unwrap()), 8);
        assert_eq!(
            u64::from_be_bytes(u[48..56].try_into().unwrap()),
            1,
            "depth"
        );
        let x = record(s.events.last().unwrap(), 8, START_NS).unwrap();
        assert_eq!(u64::from_be_bytes(x[48..56].try_into().unwrap()), 24);
        let d = record(&s.events[5], 6, START_NS).unwrap();
        assert_ne!(field_u32(&d, 28) & act(TC_FS), 0);
        assert_eq!(errno_of(10), (-5i32) as u16);
        // fentry kinds have no blktrace action
        let mut f = s.events[0];
        f.kind = kind::THROTTLE_CHARGE;
        assert!(record(&f, 1, START_NS).is_none());
    }

    #[test]
    fn export_blktrace_sequence_is_contiguous_in_time_order() {
        let mut s = Synth::new();
        s.batch(7 << 20 | 2, 1, 0, 3, 4096, false, path::PLUG);
        let mut evs: Vec<&Event> = s.events.iter().collect();
        evs.swap(0, 2); // out of order in the stream
        let mut buf = Vec::new();
        let n = write_device(&mut buf, 7 << 20 | 2, &evs, START_NS).unwrap();
        assert_eq!(n, s.events.len() as u64);
        // the process note first: notify category, pid 0, "unknown"
        assert_eq!(field_u32(&buf, 28), 1 << 26);
        assert_eq!(&buf[48..55], b"unknown");
        let mut at = RECORD_LEN + 16;
        let mut last_t = 0;
        for i in 2..=n + 1 {
            assert_eq!(field_u32(&buf[at..], 4), i as u32);
            let t = u64::from_le_bytes(buf[at + 8..at + 16].try_into().unwrap());
            assert!(t >= last_t);
            last_t = t;
            let pdu = u16::from_le_bytes(buf[at + 46..at + 48].try_into().unwrap()) as usize;
            at += RECORD_LEN + pdu;
        }
        assert_eq!(at, buf.len());
    }
}
