//! `/proc/diskstats`: the kernel's own per-disk counters, the reference mergetrace's numbers
//! are checked against (Documentation/admin-guide/iostats.rst).
use anyhow::{Context, Result};
use serde::Serialize;

/// One `/proc/diskstats` line. Fields a kernel does not print (before 4.18 / 5.5) are 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DiskStats {
    pub major: u32,
    pub minor: u32,
    pub name: String,
    pub reads: u64,
    pub reads_merged: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
    pub in_flight: u64,
    pub io_ms: u64,
    pub weighted_io_ms: u64,
    pub discards: u64,
    pub discards_merged: u64,
    pub discard_sectors: u64,
    pub discard_ms: u64,
    pub flushes: u64,
    pub flush_ms: u64,
}

/// Parses one diskstats line (`MAJ MIN NAME` and 11, 15 or 17 numbers).
pub fn parse_diskstats_line(line: &str) -> Option<DiskStats> {
    let mut it = line.split_whitespace();
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let name = it.next()?.to_string();
    let nums: Vec<u64> = it.map(|w| w.parse().ok()).collect::<Option<_>>()?;
    if nums.len() < 11 {
        return None;
    }
    let f = |i: usize| nums.get(i).copied().unwrap_or(0);
    Some(DiskStats {
        major,
        minor,
        name,
        reads: f(0),
        reads_merged: f(1),
        read_sectors: f(2),
        read_ms: f(3),
        writes: f(4),
        writes_merged: f(5),
        write_sectors: f(6),
        write_ms: f(7),
        in_flight: f(8),
        io_ms: f(9),
        weighted_io_ms: f(10),
        discards: f(11),
        discards_merged: f(12),
        discard_sectors: f(13),
        discard_ms: f(14),
        flushes: f(15),
        flush_ms: f(16),
    })
}

/// The line of device `maj:min` in `/proc/diskstats` text.
pub fn find_diskstats(text: &str, major: u32, minor: u32) -> Option<DiskStats> {
    text.lines()
        .filter_map(parse_diskstats_line)
        .find(|d| d.major == major && d.minor == minor)
}

impl DiskStats {
    /// The current line of device `maj:min`.
    pub fn read(major: u32, minor: u32) -> Result<DiskStats> {
        let text =
            std::fs::read_to_string("/proc/diskstats").context("cannot read /proc/diskstats")?;
        find_diskstats(&text, major, minor)
            .with_context(|| format!("{major}:{minor} is not in /proc/diskstats"))
    }

    /// Counter deltas `self - before` (wrapping, as the kernel's counters may; `in_flight` is
    /// a level and is taken from `self`).
    pub fn since(&self, b: &DiskStats) -> DiskStats {
        DiskStats {
            major: self.major,
            minor: self.minor,
            name: self.name.clone(),
            reads: self.reads.wrapping_sub(b.reads),
            reads_merged: self.reads_merged.wrapping_sub(b.reads_merged),
            read_sectors: self.read_sectors.wrapping_sub(b.read_sectors),
            read_ms: self.read_ms.wrapping_sub(b.read_ms),
            writes: self.writes.wrapping_sub(b.writes),
            writes_merged: self.writes_merged.wrapping_sub(b.writes_merged),
            write_sectors: self.write_sectors.wrapping_sub(b.write_sectors),
            write_ms: self.write_ms.wrapping_sub(b.write_ms),
            in_flight: self.in_flight,
            io_ms: self.io_ms.wrapping_sub(b.io_ms),
            weighted_io_ms: self.weighted_io_ms.wrapping_sub(b.weighted_io_ms),
            discards: self.discards.wrapping_sub(b.discards),
            discards_merged: self.discards_merged.wrapping_sub(b.discards_merged),
            discard_sectors: self.discard_sectors.wrapping_sub(b.discard_sectors),
            discard_ms: self.discard_ms.wrapping_sub(b.discard_ms),
            flushes: self.flushes.wrapping_sub(b.flushes),
            flush_ms: self.flush_ms.wrapping_sub(b.flush_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_every_kernel() {
        /// A published sda line, with the fields it elides filled with zeros.
        const SDA_LINE: &str =
            "   8       0 sda 639705 234489 36923566 0 10636637 3282202 135302774 0 0 0 0 0 0 0 0 0 0";
        let d = parse_diskstats_line(SDA_LINE).unwrap();
        assert_eq!((d.major, d.minor, d.name.as_str()), (8, 0, "sda"));
        assert_eq!(
            (d.reads, d.reads_merged, d.read_sectors),
            (639705, 234489, 36923566)
        );
        assert_eq!(
            (d.writes, d.writes_merged, d.write_sectors),
            (10636637, 3282202, 135302774)
        );
        let full = "7 3 loop3 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
        let d = parse_diskstats_line(full).unwrap();
        assert_eq!(
            [
                d.reads,
                d.reads_merged,
                d.read_sectors,
                d.read_ms,
                d.writes,
                d.writes_merged,
                d.write_sectors,
                d.write_ms,
                d.in_flight,
                d.io_ms,
                d.weighted_io_ms,
                d.discards,
                d.discards_merged,
                d.discard_sectors,
                d.discard_ms,
                d.flushes,
                d.flush_ms
            ],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
        );
        // A pre-4.18 line (11 numbers): discards and flushes read as 0.
        let old = parse_diskstats_line("8 0 sda 1 2 3 4 5 6 7 8 9 10 11").unwrap();
        assert_eq!((old.weighted_io_ms, old.discards, old.flush_ms), (11, 0, 0));
        assert_eq!(parse_diskstats_line("8 0 sda 1 2 3"), None);
        assert_eq!(
            parse_diskstats_line("8 0 sda 1 2 x 4 5 6 7 8 9 10 11"),
            None
        );
        let text = format!("{full}\n{SDA_LINE}\n");
        assert_eq!(find_diskstats(&text, 8, 0).unwrap().name, "sda");
        assert_eq!(find_diskstats(&text, 7, 3).unwrap().name, "loop3");
        assert_eq!(find_diskstats(&text, 7, 4), None);
    }

    #[test]
    fn deltas() {
        let a = parse_diskstats_line("7 3 loop3 1 0 8 0 2 3 4 5 0 6 7 0 0 0 0 0 0").unwrap();
        let b = parse_diskstats_line("7 3 loop3 1 0 8 0 12 13 24 5 1 6 7 0 0 0 0 0 0").unwrap();
        let d = b.since(&a);
        assert_eq!(
            (d.writes, d.writes_merged, d.write_sectors, d.in_flight),
            (10, 10, 20, 1)
        );
        assert_eq!(d.name, "loop3");
    }
}
