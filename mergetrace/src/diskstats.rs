//! `/proc/diskstats`: the kernel's own per-disk counters, the reference mergetrace's numbers
//! are checked against (Documentation/admin-guide/iostats.rst).
use anyhow::{Context, Result};

/// The counters of one disk (fields 1–17 after the name; missing trailing fields are 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub reads: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub ms_reading: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub ms_writing: u64,
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
    /// Parses the part of a line after `major minor name`.
    pub fn parse_fields(fields: &str) -> DiskStats {
        let v: Vec<u64> = fields
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let g = |i: usize| v.get(i).copied().unwrap_or(0);
        DiskStats {
            reads: g(0),
            reads_merged: g(1),
            sectors_read: g(2),
            ms_reading: g(3),
            writes: g(4),
            writes_merged: g(5),
            sectors_written: g(6),
            ms_writing: g(7),
            in_flight: g(8),
            io_ticks_ms: g(9),
            time_in_queue_ms: g(10),
            discards: g(11),
            discards_merged: g(12),
            sectors_discarded: g(13),
            ms_discarding: g(14),
            flushes: g(15),
            ms_flushing: g(16),
        }
    }

    /// Finds device `name` in the text of /proc/diskstats.
    pub fn find(text: &str, name: &str) -> Option<DiskStats> {
        text.lines().find_map(|line| {
            let mut it = line.split_whitespace();
            let (_maj, _min, n) = (it.next()?, it.next()?, it.next()?);
            (n == name).then(|| DiskStats::parse_fields(&it.collect::<Vec<_>>().join(" ")))
        })
    }

    /// The current counters of device `name`.
    pub fn read(name: &str) -> Result<DiskStats> {
        let text =
            std::fs::read_to_string("/proc/diskstats").context("cannot read /proc/diskstats")?;
        DiskStats::find(&text, name).with_context(|| format!("{name} is not in /proc/diskstats"))
    }

    /// Counter deltas `self - before` (wrapping, as the kernel's counters may).
    pub fn since(&self, b: &DiskStats) -> DiskStats {
        DiskStats {
            reads: self.reads.wrapping_sub(b.reads),
            reads_merged: self.reads_merged.wrapping_sub(b.reads_merged),
            sectors_read: self.sectors_read.wrapping_sub(b.sectors_read),
            ms_reading: self.ms_reading.wrapping_sub(b.ms_reading),
            writes: self.writes.wrapping_sub(b.writes),
            writes_merged: self.writes_merged.wrapping_sub(b.writes_merged),
            sectors_written: self.sectors_written.wrapping_sub(b.sectors_written),
            ms_writing: self.ms_writing.wrapping_sub(b.ms_writing),
            in_flight: self.in_flight,
            io_ticks_ms: self.io_ticks_ms.wrapping_sub(b.io_ticks_ms),
            time_in_queue_ms: self.time_in_queue_ms.wrapping_sub(b.time_in_queue_ms),
            discards: self.discards.wrapping_sub(b.discards),
            discards_merged: self.discards_merged.wrapping_sub(b.discards_merged),
            sectors_discarded: self.sectors_discarded.wrapping_sub(b.sectors_discarded),
            ms_discarding: self.ms_discarding.wrapping_sub(b.ms_discarding),
            flushes: self.flushes.wrapping_sub(b.flushes),
            ms_flushing: self.ms_flushing.wrapping_sub(b.ms_flushing),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_articles_line() {
        let text = "   7       3 loop3 1 0 8 0 2 3 4 5 0 6 7 0 0 0 0 0 0\n   8       0 sda 639705 234489 36923566 0 10636637 3282202 135302774 0 0 0 0\n";
        let s = DiskStats::find(text, "sda").unwrap();
        assert_eq!(
            (s.writes, s.writes_merged, s.sectors_written),
            (10636637, 3282202, 135302774)
        );
        assert_eq!(s.discards, 0, "missing trailing fields are 0");
        let l = DiskStats::find(text, "loop3").unwrap();
        assert_eq!(l.since(&DiskStats::default()).writes, 2);
        assert_eq!(DiskStats::find(text, "sdb"), None);
    }
}
