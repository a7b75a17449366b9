//! /proc/diskstats, read independently of mergetrace on purpose: it is the tests' oracle.

use std::fs;

/// One /proc/diskstats line, every field (Documentation/admin-guide/iostats.rst).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub major: u32,
    pub minor: u32,
    pub reads: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub ms_reading: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub ms_writing: u64,
    /// A level, not a counter.
    pub in_flight: u64,
    pub io_ticks_ms: u64,
    pub time_in_queue_ms: u64,
    pub discards: u64,
    pub discards_merged: u64,
    pub sectors_discarded: u64,
    pub ms_discarding: u64,
    pub flushes: u64,
    pub ms_flushing: u64,
}

impl DiskStats {
    /// Counter deltas `self - before` (in_flight is taken from `self`).
    pub fn since(&self, before: &DiskStats) -> DiskStats {
        let d = |a: u64, b: u64| {
            assert!(a >= b, "diskstats counter went backwards: {b} -> {a}");
            a - b
        };
        DiskStats {
            major: self.major,
            minor: self.minor,
            reads: d(self.reads, before.reads),
            reads_merged: d(self.reads_merged, before.reads_merged),
            sectors_read: d(self.sectors_read, before.sectors_read),
            ms_reading: d(self.ms_reading, before.ms_reading),
            writes: d(self.writes, before.writes),
            writes_merged: d(self.writes_merged, before.writes_merged),
            sectors_written: d(self.sectors_written, before.sectors_written),
            ms_writing: d(self.ms_writing, before.ms_writing),
            in_flight: self.in_flight,
            io_ticks_ms: d(self.io_ticks_ms, before.io_ticks_ms),
            time_in_queue_ms: d(self.time_in_queue_ms, before.time_in_queue_ms),
            discards: d(self.discards, before.discards),
            discards_merged: d(self.discards_merged, before.discards_merged),
            sectors_discarded: d(self.sectors_discarded, before.sectors_discarded),
            ms_discarding: d(self.ms_discarding, before.ms_discarding),
            flushes: d(self.flushes, before.flushes),
            ms_flushing: d(self.ms_flushing, before.ms_flushing),
        }
    }
}

/// Parses one line of /proc/diskstats (the name is the third field).
pub fn parse_diskstats_line(line: &str) -> Option<(String, DiskStats)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 14 {
        return None;
    }
    let n = |i: usize| -> u64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0) };
    Some((
        f[2].to_string(),
        DiskStats {
            major: f[0].parse().ok()?,
            minor: f[1].parse().ok()?,
            reads: n(3),
            reads_merged: n(4),
            sectors_read: n(5),
            ms_reading: n(6),
            writes: n(7),
            writes_merged: n(8),
            sectors_written: n(9),
            ms_writing: n(10),
            in_flight: n(11),
            io_ticks_ms: n(12),
            time_in_queue_ms: n(13),
            discards: n(14),
            discards_merged: n(15),
            sectors_discarded: n(16),
            ms_discarding: n(17),
            flushes: n(18),
            ms_flushing: n(19),
        },
    ))
}

/// The current /proc/diskstats line of device `name` (e.g. "loop3"). Panics if absent.
pub fn diskstats(name: &str) -> DiskStats {
    let text = fs::read_to_string("/proc/diskstats").expect("read /proc/diskstats");
    text.lines()
        .filter_map(parse_diskstats_line)
        .find(|(n, _)| n == name)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{name} is not in /proc/diskstats"))
}
