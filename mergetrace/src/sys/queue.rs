//! A device's request-queue settings from `/sys/block/NAME/queue` and what they mean for
//! merging: which merge paths exist, what `nomerges` really switches off on them, the largest
//! request merging can build and when a task's plug list is flushed.
//!
//! Source facts (block/blk-mq.c, blk-merge.c, elevator.c, blk.h of 6.12, unchanged in 6.18):
//! - `blk_mq_attempt_bio_merge` tries the plug list (`blk_attempt_plug_merge`) and then
//!   `blk_mq_sched_bio_merge` (the elevator's `bio_merge`, or `blk_bio_list_merge` on the
//!   software queues for "none"), both only if `!blk_queue_nomerges(q)` (nomerges=2).
//! - nomerges=1 sets QUEUE_FLAG_NOXMERGES, which only `elv_merge` and
//!   `elv_attempt_insert_merge` read: they keep the one-hit `last_merge` try and skip the hash
//!   lookup (and the scheduler's front-merge lookup behind it). Only mq-deadline and bfq call
//!   them; kyber and "none" merge through `blk_bio_list_merge`, which ignores the flag.
//! - `blk_add_rq_to_plug` flushes the plug when it holds `blk_plug_max_rq_count` requests
//!   (BLK_MAX_REQUEST_COUNT = 32; twice that once the plug holds requests for more than one
//!   request queue, `plug->multiple_queues`) or, unless nomerges=2, when the last request has
//!   reached BLK_PLUG_FLUSH_SIZE = 128 KiB.
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::sys::device::Device;

/// `BLK_MAX_REQUEST_COUNT` (block/blk.h): plug flush at this many requests.
pub const BLK_MAX_REQUEST_COUNT: u32 = 32;
/// `blk_plug_max_rq_count` once the plug holds requests for more than one request queue.
pub const BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES: u32 = 2 * BLK_MAX_REQUEST_COUNT;
/// `BLK_PLUG_FLUSH_SIZE` (block/blk.h): plug flush once the last request is this large.
pub const BLK_PLUG_FLUSH_SIZE: u64 = 128 * 1024;
/// The page size merging's segment count is measured in (one segment per page at worst).
pub const PAGE_SIZE: u64 = 4096;

/// The I/O scheduler line: `none [mq-deadline] kyber bfq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheduler {
    /// The bracketed entry; "none" when there is no elevator.
    pub active: String,
    /// Every scheduler listed, the active one included.
    pub available: Vec<String>,
}

impl Scheduler {
    /// Whether the active scheduler merges through `elv_merge` (hash lookup, front-merge
    /// lookup, insert-time request merges): mq-deadline and bfq. kyber and "none" merge on
    /// plain request lists (`blk_bio_list_merge`).
    pub fn uses_elv_merge(&self) -> bool {
        matches!(self.active.as_str(), "mq-deadline" | "bfq")
    }
}

/// `/sys/block/NAME/queue` settings that bear on merging.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueSettings {
    /// `None` when the file is missing (bio-based devices such as zram).
    pub scheduler: Option<Scheduler>,
    /// 0 all merges, 1 no extended merges (NOXMERGES), 2 no merges (NOMERGES).
    pub nomerges: u8,
    pub max_sectors_kb: u64,
    pub max_hw_sectors_kb: u64,
    pub max_segments: u64,
    /// Scheduler queue depth; missing on bio-based devices.
    pub nr_requests: Option<u64>,
    pub rotational: bool,
    pub logical_block_size: u64,
    /// Hardware queues: directories in `/sys/block/NAME/mq`; 0 for bio-based devices.
    pub hw_queues: u32,
    /// Split limits besides `max_sectors_kb` and `max_segments` (`None`: file not readable).
    pub max_segment_size: Option<u64>,
    pub chunk_sectors: Option<u64>,
    pub discard_max_bytes: Option<u64>,
    /// The largest write-zeroes request; 0 when the device takes none (the kernel then writes
    /// zero pages, plain writes). `/proc/diskstats` counts write-zeroes requests as writes.
    pub write_zeroes_max_bytes: Option<u64>,
}

/// Parses the scheduler line. Without brackets (a bio-based device may show just "none") the
/// single entry is the active one.
pub fn parse_scheduler(text: &str) -> Option<Scheduler> {
    let mut active = None;
    let mut available = Vec::new();
    for word in text.split_whitespace() {
        let name = match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(inner) => {
                active = Some(inner.to_string());
                inner
            }
            None => word,
        };
        available.push(name.to_string());
    }
    let active = match active {
        Some(a) => a,
        None if available.len() == 1 => available[0].clone(),
        None => return None,
    };
    Some(Scheduler { active, available })
}

/// Parses `nomerges`: 0, 1 or 2.
pub fn parse_nomerges(text: &str) -> Option<u8> {
    text.trim().parse::<u8>().ok().filter(|v| *v <= 2)
}

fn parse_num(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

impl QueueSettings {
    /// Reads the settings of a resolved device.
    pub fn read(dev: &Device) -> Result<QueueSettings> {
        QueueSettings::read_dir(&dev.sys_dir())
            .with_context(|| format!("cannot read the queue settings of {}", dev.name))
    }

    /// Reads `DIR/queue/*` and counts `DIR/mq/*` (DIR = `/sys/block/NAME` normally).
    pub fn read_dir(dir: &Path) -> Result<QueueSettings> {
        let q = dir.join("queue");
        let read = |f: &str| std::fs::read_to_string(q.join(f)).ok();
        let num = |f: &str| -> Result<u64> {
            let path = q.join(f);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            parse_num(&text).with_context(|| format!("{}: not a number: {text:?}", path.display()))
        };
        let nomerges_path = q.join("nomerges");
        let nomerges_text = std::fs::read_to_string(&nomerges_path)
            .with_context(|| format!("cannot read {}", nomerges_path.display()))?;
        let nomerges = parse_nomerges(&nomerges_text).with_context(|| {
            format!(
                "{}: expected 0, 1 or 2, found {nomerges_text:?}",
                nomerges_path.display()
            )
        })?;
        let hw_queues = match std::fs::read_dir(dir.join("mq")) {
            Ok(entries) => entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .count() as u32,
            Err(_) => 0,
        };
        Ok(QueueSettings {
            scheduler: read("scheduler").and_then(|t| parse_scheduler(&t)),
            nomerges,
            max_sectors_kb: num("max_sectors_kb")?,
            max_hw_sectors_kb: num("max_hw_sectors_kb")?,
            max_segments: num("max_segments")?,
            nr_requests: read("nr_requests").and_then(|t| parse_num(&t)),
            rotational: num("rotational")? != 0,
            logical_block_size: num("logical_block_size")?,
            hw_queues,
            max_segment_size: read("max_segment_size").and_then(|t| parse_num(&t)),
            chunk_sectors: read("chunk_sectors").and_then(|t| parse_num(&t)),
            discard_max_bytes: read("discard_max_bytes").and_then(|t| parse_num(&t)),
            write_zeroes_max_bytes: read("write_zeroes_max_bytes").and_then(|t| parse_num(&t)),
        })
    }

    /// The limits that split bios, for the verdict.
    pub fn split_limits(&self) -> crate::model::meter::SplitLimits {
        crate::model::meter::SplitLimits {
            max_sectors_kb: Some(self.max_sectors_kb),
            max_hw_sectors_kb: Some(self.max_hw_sectors_kb),
            max_segments: Some(self.max_segments),
            max_segment_size: self.max_segment_size,
            chunk_sectors: self.chunk_sectors,
            discard_max_bytes: self.discard_max_bytes,
        }
    }

    /// No request queue (no `mq` directory): bios go straight to the driver, nothing merges.
    pub fn bio_based(&self) -> bool {
        self.hw_queues == 0
    }

    /// The active scheduler's name, "none" when there is none.
    pub fn scheduler_name(&self) -> &str {
        self.scheduler
            .as_ref()
            .map(|s| s.active.as_str())
            .unwrap_or("none")
    }

    /// Whether merging goes through `elv_merge` (mq-deadline, bfq) on this device.
    pub fn uses_elv_merge(&self) -> bool {
        !self.bio_based() && self.scheduler.as_ref().is_some_and(|s| s.uses_elv_merge())
    }

    /// Plug flush at this many requests for this device alone (`BLK_MAX_REQUEST_COUNT`).
    /// A plug that also holds requests for another device flushes at
    /// [`BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES`]; the number of hardware queues plays no part.
    pub fn plug_max_requests(&self) -> u32 {
        BLK_MAX_REQUEST_COUNT
    }

    /// Plug flush once the last request in it has reached this many bytes; `None` with
    /// nomerges=2 (the size rule checks `!blk_queue_nomerges`).
    pub fn plug_flush_bytes(&self) -> Option<u64> {
        (self.nomerges < 2).then_some(BLK_PLUG_FLUSH_SIZE)
    }

    /// The largest request merging can build: `max_sectors_kb`, and `max_segments` pages
    /// (one segment per page when the pages are not physically contiguous).
    pub fn merge_ceiling_bytes(&self) -> u64 {
        (self.max_sectors_kb * 1024).min(self.max_segments * PAGE_SIZE)
    }

    /// Which setting sets [`Self::merge_ceiling_bytes`]: "max_sectors_kb" or "max_segments".
    pub fn merge_ceiling_set_by(&self) -> &'static str {
        if self.max_sectors_kb * 1024 <= self.max_segments * PAGE_SIZE {
            "max_sectors_kb"
        } else {
            "max_segments"
        }
    }

    /// What nomerges does on this device's merge paths, in one sentence.
    pub fn explain_nomerges(&self) -> String {
        let sched = self.scheduler_name();
        if self.bio_based() {
            return format!(
                "nomerges={} is irrelevant: a bio-based device has no requests, so nothing merges \
                 whatever it says",
                self.nomerges
            );
        }
        match self.nomerges {
            2 => "nomerges=2 disables all bio merges (plug list, scheduler and software queues \
                  all check QUEUE_FLAG_NOMERGES) and also turns off the plug's 128 KiB flush rule"
                .to_string(),
            1 if self.uses_elv_merge() => format!(
                "nomerges=1 with {sched}: plug merges still happen; only elv_merge and \
                 elv_attempt_insert_merge consult it, keeping their one-hit last_merge try and \
                 skipping the hash lookup (and {sched}'s front-merge lookup behind it)"
            ),
            1 => format!(
                "nomerges=1 changes nothing with scheduler {sched}: only elv_merge's hash lookup \
                 and elv_attempt_insert_merge consult it, and plug merges and \
                 blk_bio_list_merge ignore it"
            ),
            _ => "nomerges=0: all merge attempts are on — but a merge needs a neighbour still \
                  waiting in the plug list or the scheduler, so one-at-a-time submission merges \
                  almost nothing"
                .to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixtures::loop_queue as loop_like;

    #[test]
    fn scheduler_lines() {
        let s = parse_scheduler("none [mq-deadline] kyber bfq \n").unwrap();
        assert_eq!(s.active, "mq-deadline");
        assert_eq!(s.available, ["none", "mq-deadline", "kyber", "bfq"]);
        assert!(s.uses_elv_merge());
        let n = parse_scheduler("[none] mq-deadline\n").unwrap();
        assert_eq!(n.active, "none");
        assert!(!n.uses_elv_merge());
        assert_eq!(parse_scheduler("none\n").unwrap().active, "none");
        assert!(!parse_scheduler("[kyber] none").unwrap().uses_elv_merge());
        assert!(parse_scheduler("[bfq] none").unwrap().uses_elv_merge());
        assert_eq!(parse_scheduler(""), None);
        assert_eq!(parse_scheduler("none mq-deadline"), None);
    }

    #[test]
    fn nomerges_values() {
        assert_eq!(parse_nomerges("0\n"), Some(0));
        assert_eq!(parse_nomerges("2"), Some(2));
        assert_eq!(parse_nomerges("3"), None);
        assert_eq!(parse_nomerges("x"), None);
    }

    #[test]
    fn ceilings_and_plug_limits() {
        let mut q = loop_like();
        assert_eq!(q.merge_ceiling_bytes(), 512 << 10, "128 segments x 4 KiB");
        assert_eq!(q.merge_ceiling_set_by(), "max_segments");
        q.max_sectors_kb = 256;
        assert_eq!(q.merge_ceiling_bytes(), 256 << 10);
        assert_eq!(q.merge_ceiling_set_by(), "max_sectors_kb");
        // A virtio disk's limits: 1280 KiB and 254 segments → 1016 KiB.
        q.max_sectors_kb = 1280;
        q.max_segments = 254;
        assert_eq!(q.merge_ceiling_bytes(), 254 * 4096);
        assert_eq!(q.plug_max_requests(), 32);
        assert_eq!(BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES, 64);
        q.hw_queues = 8;
        assert_eq!(
            q.plug_max_requests(),
            32,
            "hw queues do not change the count"
        );
        assert_eq!(q.plug_flush_bytes(), Some(128 << 10));
        q.nomerges = 1;
        assert_eq!(q.plug_flush_bytes(), Some(128 << 10));
        q.nomerges = 2;
        assert_eq!(q.plug_flush_bytes(), None);
    }

    #[test]
    fn nomerges_sentences() {
        let mut q = loop_like();
        assert!(q
            .explain_nomerges()
            .starts_with("nomerges=0: all merge attempts are on"));
        q.nomerges = 1;
        let e = q.explain_nomerges();
        assert!(
            e.starts_with("nomerges=1 changes nothing with scheduler none: only elv_merge's hash lookup and elv_attempt_insert_merge consult it"),
            "{e}"
        );
        assert!(
            e.contains("plug merges and blk_bio_list_merge ignore it"),
            "{e}"
        );
        q.scheduler = parse_scheduler("none [kyber]");
        assert!(q
            .explain_nomerges()
            .contains("changes nothing with scheduler kyber"));
        q.scheduler = parse_scheduler("none [mq-deadline]");
        let e = q.explain_nomerges();
        assert!(
            e.starts_with("nomerges=1 with mq-deadline: plug merges still happen"),
            "{e}"
        );
        assert!(e.contains("skipping the hash lookup"), "{e}");
        q.nomerges = 2;
        assert!(q
            .explain_nomerges()
            .starts_with("nomerges=2 disables all bio merges"));
        q.hw_queues = 0;
        assert!(q.explain_nomerges().contains("bio-based"));
    }

    fn write(dir: &Path, f: &str, v: &str) {
        std::fs::write(dir.join(f), v).unwrap();
    }

    #[test]
    fn reads_a_sysfs_tree() {
        let t = tempfile::tempdir().unwrap();
        let q = t.path().join("queue");
        std::fs::create_dir_all(&q).unwrap();
        for i in 0..4 {
            std::fs::create_dir_all(t.path().join(format!("mq/{i}"))).unwrap();
        }
        write(&q, "scheduler", "none [mq-deadline] kyber bfq\n");
        write(&q, "nomerges", "1\n");
        write(&q, "max_sectors_kb", "1280\n");
        write(&q, "max_hw_sectors_kb", "2147483647\n");
        write(&q, "max_segments", "254\n");
        write(&q, "nr_requests", "256\n");
        write(&q, "rotational", "1\n");
        write(&q, "logical_block_size", "512\n");
        write(&q, "max_segment_size", "4294967295\n");
        write(&q, "chunk_sectors", "0\n");
        let s = QueueSettings::read_dir(t.path()).unwrap();
        assert_eq!(
            s,
            QueueSettings {
                scheduler: Some(Scheduler {
                    active: "mq-deadline".into(),
                    available: vec![
                        "none".into(),
                        "mq-deadline".into(),
                        "kyber".into(),
                        "bfq".into()
                    ]
                }),
                nomerges: 1,
                max_sectors_kb: 1280,
                max_hw_sectors_kb: 2147483647,
                max_segments: 254,
                nr_requests: Some(256),
                rotational: true,
                logical_block_size: 512,
                hw_queues: 4,
                max_segment_size: Some(4294967295),
                chunk_sectors: Some(0),
                discard_max_bytes: None,
                write_zeroes_max_bytes: None,
            }
        );
        assert!(!s.bio_based() && s.uses_elv_merge());

        // A bio-based device (zram): no scheduler, no nr_requests, no mq directory.
        std::fs::remove_dir_all(t.path().join("mq")).unwrap();
        std::fs::remove_file(q.join("scheduler")).unwrap();
        std::fs::remove_file(q.join("nr_requests")).unwrap();
        let z = QueueSettings::read_dir(t.path()).unwrap();
        assert!(z.bio_based());
        assert_eq!(
            (z.scheduler.as_ref(), z.nr_requests, z.hw_queues),
            (None, None, 0)
        );
        assert_eq!(z.scheduler_name(), "none");
        assert!(!z.uses_elv_merge());

        write(&q, "nomerges", "7\n");
        let e = format!("{:#}", QueueSettings::read_dir(t.path()).unwrap_err());
        assert!(e.contains("expected 0, 1 or 2"), "{e}");
        std::fs::remove_file(q.join("max_segments")).unwrap();
        write(&q, "nomerges", "0\n");
        let e = format!("{:#}", QueueSettings::read_dir(t.path()).unwrap_err());
        assert!(e.contains("max_segments"), "{e}");
    }
}
