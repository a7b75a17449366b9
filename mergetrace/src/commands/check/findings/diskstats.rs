//! `/proc/diskstats` since boot: the merge rate and average request size per direction.
use super::Finding;
use crate::{commands::check::gather::CheckInput, fmt};

struct Direction {
    word: &'static str,
    merges_topic: &'static str,
    size_topic: &'static str,
    requests: u64,
    merged: u64,
    sectors: u64,
}

impl Direction {
    /// The average size of what reached the device, and what it averages ("N sectors over M
    /// `unit`s"): a bio-based disk is sent bios, any other requests.
    fn average(&self, unit: &str) -> (String, String) {
        (
            fmt::kib_per(self.sectors, self.requests),
            format!(
                "{} sectors over {} {unit}s",
                fmt::thousands(self.sectors),
                fmt::thousands(self.requests)
            ),
        )
    }
}

fn direction(input: &CheckInput, d: &Direction, bio_based: bool, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let bios = d.requests + d.merged;
    let since = input
        .uptime_secs
        .map(|u| format!(" ({})", fmt::span(u)))
        .unwrap_or_default();
    if bios == 0 {
        out.push(Finding::new(
            d.merges_topic,
            format!("no {}s since boot", d.word),
            None,
        ));
        return;
    }
    let per_sec = input
        .uptime_secs
        .filter(|u| *u > 0.0)
        .map(|u| format!("; {:.0} {} bios/s on average", bios as f64 / u, d.word))
        .unwrap_or_default();
    if bio_based {
        out.push(Finding::new(
            d.merges_topic,
            format!(
                "{name} is bio-based: 0 merges by construction; {} {} bios since boot{since}{per_sec}",
                fmt::thousands(bios),
                d.word
            ),
            None,
        ));
        let (size, over) = d.average("bio");
        out.push(Finding::new(
            d.size_topic,
            format!("average {} bio {size} ({over})", d.word),
            None,
        ));
        return;
    }
    let rate = 100.0 * d.merged as f64 / bios as f64;
    out.push(Finding::new(
        d.merges_topic,
        format!(
            "{} merge rate since boot{since}: {rate:.1} % ({} of {} {} bios merged into {} device requests{per_sec}; diskstats' merged also counts request-request merges)",
            d.word,
            fmt::thousands(d.merged),
            fmt::thousands(bios),
            d.word,
            fmt::thousands(d.requests),
        ),
        Some(
            "merging needs a neighbour still waiting in the plug list or the scheduler: submit \
             in batches (io_uring/libaio batch submission, fio iodepth_batch_submit, buffered \
             writeback); one-at-a-time submission merges almost nothing"
                .into(),
        ),
    ));
    let (size, over) = d.average("request");
    out.push(Finding::new(
        d.size_topic,
        format!(
            "average {} request reaching the device: {size} ({over}; merging can build up to {})",
            d.word,
            fmt::kib(input.queue.merge_ceiling_bytes()),
        ),
        Some(
            "only a meter that counts after merging (a cloud volume counting requests in \
             units such as 256 KiB) is paid per request of this size: larger bios or batched \
             submission lower its count; blk-throttle counts bios, not requests"
                .into(),
        ),
    ));
}

/// Both directions, or why there is nothing to read.
pub(super) fn diskstats(input: &CheckInput, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let bio_based = input.bio_based();
    match &input.diskstats {
        None => out.push(Finding::new(
            "diskstats",
            format!("{name} has no line in /proc/diskstats: no merge counters to read"),
            None,
        )),
        Some(s) => {
            for d in [
                Direction {
                    word: "write",
                    merges_topic: "write merges",
                    size_topic: "write request size",
                    requests: s.writes,
                    merged: s.writes_merged,
                    sectors: s.write_sectors,
                },
                Direction {
                    word: "read",
                    merges_topic: "read merges",
                    size_topic: "read request size",
                    requests: s.reads,
                    merged: s.reads_merged,
                    sectors: s.read_sectors,
                },
            ] {
                direction(input, &d, bio_based, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::sys::diskstats::parse_diskstats_line;
    #[test]
    fn sda_arithmetic() {
        let f = findings(&sda_input());
        let w = by_topic(&f, "write merges");
        assert_starts(w, "write merge rate since boot (11.5 h): 23.6 % (3,282,202 of 13,918,839 write bios merged into 10,636,637 device requests; 337 write bios/s on average; diskstats' merged also counts request-request merges)");
        assert!(w.lever.as_deref().unwrap().contains("submit in batches"));
        let s = by_topic(&f, "write request size");
        assert_starts(s, "average write request reaching the device: 6.36 KiB (135,302,774 sectors over 10,636,637 requests; merging can build up to 512 KiB)");
        let r = by_topic(&f, "read merges");
        // 234489 / (639705 + 234489) = 26.8 %
        assert_starts(r, "read merge rate since boot (11.5 h): 26.8 % (234,489 of 874,194 read bios merged into 639,705 device requests");
        let rs = by_topic(&f, "read request size");
        // 36923566 / 639705 / 2 = 28.86 KiB
        assert!(rs.finding.contains("28.86 KiB"), "{}", rs.finding);
    }
    #[test]
    fn no_writes_since_boot() {
        let mut i = sda_input();
        i.diskstats = parse_diskstats_line("7 3 loop3 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0");
        i.uptime_secs = None;
        let f = findings(&i);
        assert_eq!(by_topic(&f, "write merges").finding, "no writes since boot");
        assert!(f.iter().all(|x| x.topic != "write request size"));
        let r = by_topic(&f, "read merges");
        assert_starts(r, "read merge rate since boot: 0.0 % (0 of 10 read bios merged into 10 device requests; diskstats'");
        assert!(by_topic(&f, "read request size")
            .finding
            .contains(": 4.00 KiB (80 sectors over 10 requests"));
        i.diskstats = None;
        let f = findings(&i);
        assert!(by_topic(&f, "diskstats")
            .finding
            .contains("no line in /proc/diskstats"));
    }
}
