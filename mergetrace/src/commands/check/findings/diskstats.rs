//! `/proc/diskstats`: the merge rate and average request size of writes, reads and discards,
//! over two windows.
//!
//! - The counters' whole life, said to run "since NAME was added": they start at zero when the
//!   disk is added and are never reset — a loop device's not when a file is attached (measured:
//!   100 writes stayed through `losetup -d` and a new attach of loop1). Nothing tells when a
//!   disk was added: sysfs stamps a directory when it is first looked up, not when it is made
//!   (/sys/block/loop1 read boot + 15 s), and devtmpfs nodes carry the wall clock of early boot.
//!   So the totals carry no time and no per-second rate.
//! - The sample (`check --sample`, 1 s by default): the counters' growth between two reads, a
//!   window known exactly, so it has rates per second. It is what the device does now.
//!
//! Operations as the kernel groups them (`op_stat_group`, block/blk.h): discards have fields
//! of their own; write-zeroes (and secure erase) requests are counted as writes, with their
//! sectors, so no diskstats field tells them from data writes.
use super::Finding;
use crate::{
    commands::check::gather::{CheckInput, Sample},
    fmt,
    sys::diskstats::DiskStats,
};

/// One diskstats group's counters.
#[derive(Clone, Copy)]
struct Counts {
    requests: u64,
    merged: u64,
    sectors: u64,
}

impl Counts {
    /// Bios that reached the device: each request's first bio, and each merged one.
    fn bios(&self) -> u64 {
        self.requests + self.merged
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Read,
    Discard,
}

impl Op {
    fn word(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Discard => "discard",
        }
    }
    fn merges_topic(self) -> &'static str {
        match self {
            Op::Write => "write merges",
            Op::Read => "read merges",
            Op::Discard => "discard merges",
        }
    }
    fn size_topic(self) -> &'static str {
        match self {
            Op::Write => "write request size",
            Op::Read => "read request size",
            Op::Discard => "discard request size",
        }
    }
    fn of(self, s: &DiskStats) -> Counts {
        match self {
            Op::Write => Counts {
                requests: s.writes,
                merged: s.writes_merged,
                sectors: s.write_sectors,
            },
            Op::Read => Counts {
                requests: s.reads,
                merged: s.reads_merged,
                sectors: s.read_sectors,
            },
            Op::Discard => Counts {
                requests: s.discards,
                merged: s.discards_merged,
                sectors: s.discard_sectors,
            },
        }
    }
}

/// A queue limit to one decimal in its largest unit: "4.0 GiB" (a loop device's
/// 4,294,966,784 bytes), "1.0 MiB", "512.0 KiB".
fn limit_size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        fmt::size(bytes)
    }
}

/// "1 request", "2 requests", grouped: "10,636,637 requests".
fn count(n: u64, noun: &str) -> String {
    format!(
        "{} {noun}{}",
        fmt::thousands(n),
        if n == 1 { "" } else { "s" }
    )
}

/// What the sample says of one operation, as a clause after the totals: "; last 1.0 s: …".
struct Recent<'a> {
    sample: &'a Sample,
    counts: Counts,
}

impl Recent<'_> {
    fn head(&self) -> String {
        format!("; last {:.1} s: ", self.sample.seconds)
    }
    fn bios_per_s(&self) -> String {
        let per_s = self.counts.bios() as f64 / self.sample.seconds.max(f64::EPSILON);
        format!("{} bios/s", fmt::thousands(per_s.round() as u64))
    }
    /// "; last 1.0 s: 96.9 % (6,200 of 6,400 bios, 6,400 bios/s)" or "; last 1.0 s: no writes".
    fn merge_rate(&self, op: Op) -> String {
        let c = self.counts;
        if c.bios() == 0 {
            return format!("{}no {}s", self.head(), op.word());
        }
        format!(
            "{}{:.1} % ({} of {} bios, {})",
            self.head(),
            100.0 * c.merged as f64 / c.bios() as f64,
            fmt::thousands(c.merged),
            fmt::thousands(c.bios()),
            self.bios_per_s()
        )
    }
    /// "; last 1.0 s: 114.29 KiB" (nothing when no request reached the device).
    fn average(&self) -> String {
        if self.counts.requests == 0 {
            return String::new();
        }
        format!(
            "{}{}",
            self.head(),
            fmt::kib_per(self.counts.sectors, self.counts.requests)
        )
    }
}

fn operation(input: &CheckInput, totals: &DiskStats, op: Op, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let life = op.of(totals);
    let recent = input.sample.as_ref().map(|sample| Recent {
        sample,
        counts: op.of(&sample.diskstats),
    });
    let since = format!("since {name} was added");
    if life.bios() == 0 {
        // A device that never discarded gets no discard lines: most never do.
        if op != Op::Discard {
            out.push(Finding::new(
                op.merges_topic(),
                format!("no {}s {since}", op.word()),
                None,
            ));
        }
        return;
    }
    let average = |unit: &str| {
        format!(
            "{} ({} sectors over {})",
            fmt::kib_per(life.sectors, life.requests),
            fmt::thousands(life.sectors),
            count(life.requests, unit)
        )
    };
    if input.bio_based() {
        let now = recent
            .as_ref()
            .map(|r| format!("{}{}", r.head(), r.bios_per_s()))
            .unwrap_or_default();
        out.push(Finding::new(
            op.merges_topic(),
            format!(
                "{name} is bio-based: 0 merges by construction; {} {since}{now}",
                count(life.bios(), &format!("{} bio", op.word())),
            ),
            None,
        ));
        out.push(Finding::new(
            op.size_topic(),
            format!("average {} bio {}", op.word(), average("bio")),
            None,
        ));
        return;
    }
    let lever = (op != Op::Discard).then(|| {
        "merging needs a neighbour still waiting in the plug list or the scheduler: submit in \
         batches (io_uring/libaio batch submission, fio iodepth_batch_submit, buffered \
         writeback); one-at-a-time submission merges almost nothing"
            .to_string()
    });
    out.push(Finding::new(
        op.merges_topic(),
        format!(
            "{} merge rate {since}: {:.1} % ({} of {} merged into {}){}; diskstats' merged also \
             counts request-request merges",
            op.word(),
            100.0 * life.merged as f64 / life.bios() as f64,
            fmt::thousands(life.merged),
            count(life.bios(), &format!("{} bio", op.word())),
            count(life.requests, "device request"),
            recent
                .as_ref()
                .map(|r| r.merge_rate(op))
                .unwrap_or_default(),
        ),
        lever,
    ));
    let now = recent.as_ref().map(Recent::average).unwrap_or_default();
    let q = &input.queue;
    let (limit, lever) = match op {
        Op::Discard => (
            q.discard_max_bytes
                .filter(|b| *b > 0)
                .map(|b| format!("; {name} takes up to {} a discard", limit_size(b)))
                .unwrap_or_default(),
            None,
        ),
        Op::Read | Op::Write => (
            format!(
                "; merging can build up to {}{}",
                fmt::kib(q.merge_ceiling_bytes()),
                above_data_writes(input, op, life, recent.as_ref())
            ),
            Some(
                "only a meter that counts after merging (a cloud volume counting requests in \
                 units such as 256 KiB) is paid per request of this size: larger bios or batched \
                 submission lower its count; blk-throttle counts bios, not requests"
                    .into(),
            ),
        ),
    };
    out.push(Finding::new(
        op.size_topic(),
        format!(
            "average {} request reaching the device {since}: {}{now}{limit}",
            op.word(),
            average("request")
        ),
        lever,
    ));
}

/// Why a write average can exceed `max_sectors_kb`, the most a data request carries: requests
/// of another kind are counted as writes. Empty when neither window's average is above it.
fn above_data_writes(input: &CheckInput, op: Op, life: Counts, recent: Option<&Recent>) -> String {
    let max = input.queue.max_sectors_kb * 2; // in sectors
    let above = |c: Counts| c.requests > 0 && c.sectors > max * c.requests;
    if op != Op::Write || !(above(life) || recent.is_some_and(|r| above(r.counts))) {
        return String::new();
    }
    let which = if input.queue.write_zeroes_max_bytes.unwrap_or(0) > 0 {
        "write-zeroes requests, counted as writes, are in it (write-zeroes, below)"
    } else {
        "requests of another kind counted as writes (secure erase) are in it"
    };
    format!(
        ", and this average is above max_sectors_kb ({}), the most a data write carries: {which}",
        fmt::kib(input.queue.max_sectors_kb * 1024)
    )
}

/// Where the device takes write-zeroes requests and wrote anything: they cannot be told apart.
fn write_zeroes(input: &CheckInput, totals: &DiskStats, out: &mut Vec<Finding>) {
    let max = input.queue.write_zeroes_max_bytes.unwrap_or(0);
    if max == 0 || input.bio_based() || Op::Write.of(totals).bios() == 0 {
        return;
    }
    out.push(Finding::new(
        "write-zeroes",
        format!(
            "{} takes write-zeroes requests of up to {}; /proc/diskstats counts them as writes \
             and has no field of their own, so the write numbers above include any and cannot \
             be split from data writes",
            input.device.name,
            limit_size(max)
        ),
        Some(
            "a capture names each request's operation: mergetrace record, then export --format \
             csv (its op column says write_zeroes)"
                .into(),
        ),
    ));
}

/// A loop device's counters outlive the files attached to it.
fn loop_counters(input: &CheckInput, out: &mut Vec<Finding>) {
    if !input.device.is_loop() {
        return;
    }
    let now = input
        .sample
        .as_ref()
        .map(|s| format!("; the last {:.1} s are this file's alone", s.seconds))
        .unwrap_or_default();
    out.push(Finding::new(
        "counters",
        format!(
            "{0}'s /proc/diskstats counters run from when {0} was added, not from when its file \
             was attached (attaching resets nothing): they may hold earlier files' I/O{now}",
            input.device.name
        ),
        None,
    ));
}

/// Writes, reads and discards, or why there is nothing to read.
pub(super) fn diskstats(input: &CheckInput, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let Some(totals) = &input.diskstats else {
        out.push(Finding::new(
            "diskstats",
            format!("{name} has no line in /proc/diskstats: no merge counters to read"),
            None,
        ));
        return;
    };
    loop_counters(input, out);
    for op in [Op::Write, Op::Read, Op::Discard] {
        operation(input, totals, op, out);
    }
    write_zeroes(input, totals, out);
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::sys::diskstats::parse_diskstats_line;

    /// A 1.0 s sample with these counts of one line (fields as in /proc/diskstats).
    fn sample(line: &str) -> Option<Sample> {
        Some(Sample {
            seconds: 1.0,
            diskstats: parse_diskstats_line(line).unwrap(),
        })
    }

    #[test]
    fn sda_arithmetic() {
        let f = findings(&sda_input());
        let w = by_topic(&f, "write merges");
        assert_eq!(w.finding, "write merge rate since sda was added: 23.6 % (3,282,202 of 13,918,839 write bios merged into 10,636,637 device requests); diskstats' merged also counts request-request merges");
        assert!(w.lever.as_deref().unwrap().contains("submit in batches"));
        let s = by_topic(&f, "write request size");
        assert_eq!(s.finding, "average write request reaching the device since sda was added: 6.36 KiB (135,302,774 sectors over 10,636,637 requests); merging can build up to 512 KiB");
        let r = by_topic(&f, "read merges");
        // 234489 / (639705 + 234489) = 26.8 %
        assert_starts(r, "read merge rate since sda was added: 26.8 % (234,489 of 874,194 read bios merged into 639,705 device requests)");
        let rs = by_topic(&f, "read request size");
        // 36923566 / 639705 / 2 = 28.86 KiB
        assert!(rs.finding.contains(": 28.86 KiB ("), "{}", rs.finding);
        assert!(
            f.iter()
                .filter(|x| x.topic.ends_with("merges") || x.topic.ends_with("size"))
                .all(|x| !x.finding.contains("boot")),
            "no window is said to start at boot: {f:#?}"
        );
        // sda is no loop device, and never discarded.
        assert!(f
            .iter()
            .all(|x| x.topic != "counters" && !x.topic.starts_with("discard")));
    }

    #[test]
    fn the_sample_is_what_the_device_does_now() {
        let mut i = sda_input();
        // 6,400 write bios into 200 requests of 128 KiB, no reads, in the last second.
        i.sample = sample("8 0 sda 0 0 0 0 200 6200 51200 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        assert!(by_topic(&f, "write merges").finding.ends_with("device requests); last 1.0 s: 96.9 % (6,200 of 6,400 bios, 6,400 bios/s); diskstats' merged also counts request-request merges"));
        assert!(by_topic(&f, "read merges")
            .finding
            .contains("device requests); last 1.0 s: no reads; diskstats'"));
        assert!(by_topic(&f, "write request size").finding.ends_with(
            "10,636,637 requests); last 1.0 s: 128.00 KiB; merging can build up to 512 KiB"
        ));
        assert!(by_topic(&f, "read request size")
            .finding
            .ends_with("639,705 requests); merging can build up to 512 KiB"));
    }

    #[test]
    fn a_loop_devices_counters_outlive_its_files() {
        let mut i = sda_input();
        i.device.name = "loop1".into();
        i.device.major = 7;
        i.device.minor = 1;
        i.sample = sample("7 1 loop1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        assert_eq!(by_topic(&f, "counters").finding, "loop1's /proc/diskstats counters run from when loop1 was added, not from when its file was attached (attaching resets nothing): they may hold earlier files' I/O; the last 1.0 s are this file's alone");
        assert_starts(
            by_topic(&f, "write merges"),
            "write merge rate since loop1 was added: 23.6 %",
        );
        i.sample = None;
        assert!(by_topic(&findings(&i), "counters")
            .finding
            .ends_with("they may hold earlier files' I/O"));
    }

    #[test]
    fn discards_apart_from_writes() {
        let mut i = sda_input();
        // 3 discard requests of 1 MiB from 4 discard bios (1 merged); 1,000 writes of 4 KiB.
        i.diskstats = parse_diskstats_line("8 0 sda 0 0 0 0 1000 0 8000 0 0 0 0 3 1 6144 0 0 0");
        let f = findings(&i);
        assert_eq!(by_topic(&f, "discard merges").finding, "discard merge rate since sda was added: 25.0 % (1 of 4 discard bios merged into 3 device requests); diskstats' merged also counts request-request merges");
        assert!(by_topic(&f, "discard merges").lever.is_none());
        assert_eq!(by_topic(&f, "discard request size").finding, "average discard request reaching the device since sda was added: 1024.00 KiB (6,144 sectors over 3 requests); sda takes up to 4.0 GiB a discard");
        assert!(by_topic(&f, "write request size")
            .finding
            .contains(": 4.00 KiB (8,000 sectors over 1,000 requests)"));
        // One request: singular.
        i.diskstats = parse_diskstats_line("8 0 sda 0 0 0 0 1 0 8 0 0 0 0 1 0 2048 0 0 0");
        let f = findings(&i);
        assert!(by_topic(&f, "discard request size")
            .finding
            .contains("(2,048 sectors over 1 request);"));
        assert!(by_topic(&f, "write merges")
            .finding
            .contains("(0 of 1 write bio merged into 1 device request)"));
    }

    #[test]
    fn write_zeroes_cannot_be_split_from_writes() {
        let mut i = sda_input();
        // 2 write requests of 1,151 KiB average (write-zeroes among them) on a loop queue:
        // max_sectors_kb 1,280 holds it, so no claim about their kind, only the note.
        i.diskstats = parse_diskstats_line("8 0 sda 0 0 0 0 2 0 4604 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        let s = by_topic(&f, "write request size");
        assert_eq!(s.finding, "average write request reaching the device since sda was added: 1151.00 KiB (4,604 sectors over 2 requests); merging can build up to 512 KiB");
        let wz = by_topic(&f, "write-zeroes");
        assert_eq!(wz.finding, "sda takes write-zeroes requests of up to 4.0 GiB; /proc/diskstats counts them as writes and has no field of their own, so the write numbers above include any and cannot be split from data writes");
        assert!(wz.lever.as_deref().unwrap().contains("export --format csv"));
        // 2 requests of 16 MiB average: above max_sectors_kb, which no data write exceeds.
        i.diskstats = parse_diskstats_line("8 0 sda 0 0 0 0 2 0 65536 0 0 0 0 0 0 0 0 0 0");
        let s = by_topic(&findings(&i), "write request size")
            .finding
            .clone();
        assert!(s.ends_with("merging can build up to 512 KiB, and this average is above max_sectors_kb (1,280 KiB), the most a data write carries: write-zeroes requests, counted as writes, are in it (write-zeroes, below)"), "{s}");
        // The same in the sample alone.
        i.diskstats = parse_diskstats_line(SDA_LINE);
        i.sample = sample("8 0 sda 0 0 0 0 2 0 65536 0 0 0 0 0 0 0 0 0 0");
        let s = by_topic(&findings(&i), "write request size")
            .finding
            .clone();
        assert!(s.contains("last 1.0 s: 16384.00 KiB; merging can build up to 512 KiB, and this average is above max_sectors_kb"), "{s}");
        // A queue without write-zeroes: no note, and another kind is named.
        i.queue.write_zeroes_max_bytes = Some(0);
        let f = findings(&i);
        assert!(f.iter().all(|x| x.topic != "write-zeroes"));
        assert!(by_topic(&f, "write request size")
            .finding
            .ends_with("requests of another kind counted as writes (secure erase) are in it"));
    }

    #[test]
    fn queue_limits_read_as_people_say_them() {
        assert_eq!(limit_size(4294966784), "4.0 GiB");
        assert_eq!(limit_size(1 << 20), "1.0 MiB");
        assert_eq!(limit_size(512 << 10), "512.0 KiB");
    }

    #[test]
    fn nothing_written_and_no_line() {
        let mut i = sda_input();
        i.diskstats = parse_diskstats_line("7 3 loop3 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "write merges").finding,
            "no writes since sda was added"
        );
        assert!(f
            .iter()
            .all(|x| x.topic != "write request size" && x.topic != "write-zeroes"));
        let r = by_topic(&f, "read merges");
        assert_starts(r, "read merge rate since sda was added: 0.0 % (0 of 10 read bios merged into 10 device requests); diskstats'");
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
