//! The device and its scheduler: blk-mq or bio-based, which merge paths the scheduler has,
//! and what `nomerges` really switches off on them.
use super::Finding;
use crate::commands::check::gather::CheckInput;

/// What the device is: blk-mq with its hardware queues, or bio-based (never merges).
pub(super) fn device(input: &CheckInput, out: &mut Vec<Finding>) {
    let dev = &input.device;
    let q = &input.queue;
    let name = &dev.name;
    let bio_based = input.bio_based();
    let extra_notes: Vec<&String> = dev
        .notes
        .iter()
        .filter(|n| !n.contains("is bio-based"))
        .collect();
    let notes = if extra_notes.is_empty() {
        String::new()
    } else {
        format!(
            "; {}",
            extra_notes
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    if bio_based {
        out.push(Finding::new(
            "device",
            format!(
                "{name} ({}:{}) is bio-based: no scheduler and no request queue, so it never merges; \
                 nomerges, max_sectors_kb and the plug limits do not apply{notes}",
                dev.major, dev.minor
            ),
            None,
        ));
    } else {
        out.push(Finding::new(
            "device",
            format!(
                "{name} ({}:{}): blk-mq device, {} hardware queue{}, {}, {}-byte logical blocks{notes}",
                dev.major,
                dev.minor,
                q.hw_queues,
                if q.hw_queues == 1 { "" } else { "s" },
                if q.rotational { "rotational" } else { "not rotational" },
                q.logical_block_size
            ),
            None,
        ));
    }
}

/// The scheduler, the merge paths it has, and what nomerges does on them.
pub(super) fn scheduler(input: &CheckInput, out: &mut Vec<Finding>) {
    let dev = &input.device;
    let q = &input.queue;
    let name = &dev.name;
    let bio_based = input.bio_based();
    let nomerges_file = format!("/sys/block/{name}/queue/nomerges");
    if bio_based {
        out.push(Finding::new(
            "scheduler",
            format!("none: {name} is bio-based, bios go straight to the driver with no merge path"),
            None,
        ));
        out.push(Finding::new("nomerges", q.explain_nomerges(), None));
    } else {
        let sched = q.scheduler_name();
        let others: Vec<&str> = q
            .scheduler
            .as_ref()
            .map(|s| {
                s.available
                    .iter()
                    .map(|a| a.as_str())
                    .filter(|a| *a != sched)
                    .collect()
            })
            .unwrap_or_default();
        let available = if others.is_empty() {
            String::new()
        } else {
            format!(", also available: {}", others.join(", "))
        };
        let paths = match sched {
            "none" => "no elevator: bios merge in the task's plug list, then on the software \
                       queues (blk_bio_list_merge)"
                .to_string(),
            "mq-deadline" | "bfq" => format!(
                "bios merge in the task's plug list, then in {sched} through elv_merge (one-hit \
                 last_merge, hash back-merge lookup, front-merge lookup), and requests merge \
                 again at insert (elv_attempt_insert_merge)"
            ),
            "kyber" => "bios merge in the task's plug list, then on kyber's per-domain lists \
                        (blk_bio_list_merge); no hash lookup"
                .to_string(),
            other => {
                format!("bios merge in the task's plug list, then through {other}'s bio_merge")
            }
        };
        let nr = q
            .nr_requests
            .map(|n| format!("; nr_requests={n}"))
            .unwrap_or_default();
        out.push(Finding::new(
            "scheduler",
            format!("{sched}{available}: {paths}{nr}"),
            None,
        ));
        let lever = match q.nomerges {
            0 if q.uses_elv_merge() => format!(
                "echo 2 > {nomerges_file} turns every merge off; 1 only drops {sched}'s hash and \
                 front-merge lookups"
            ),
            0 => format!(
                "echo 2 > {nomerges_file} turns every merge off; 1 would change nothing here"
            ),
            1 if q.uses_elv_merge() => format!(
                "echo 2 > {nomerges_file} to turn every merge off; echo 0 to restore the hash lookup"
            ),
            1 => format!(
                "echo 2 > {nomerges_file} if you meant to turn merging off: 1 is the same as 0 on this path"
            ),
            _ => format!("echo 0 > {nomerges_file} turns merging back on"),
        };
        out.push(Finding::new("nomerges", q.explain_nomerges(), Some(lever)));
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::sys::diskstats::parse_diskstats_line;
    use crate::sys::{device::Device, queue::parse_scheduler};
    #[test]
    fn scheduler_and_nomerges_per_setting() {
        let mut i = sda_input();
        let f = findings(&i);
        let s = by_topic(&f, "scheduler");
        assert_eq!(
            s.finding,
            "none, also available: mq-deadline, kyber, bfq: no elevator: bios merge in the task's plug list, then on the software queues (blk_bio_list_merge); nr_requests=128"
        );
        let n = by_topic(&f, "nomerges");
        assert_starts(n, "nomerges=0: all merge attempts are on");
        assert_eq!(
            n.lever.as_deref(),
            Some("echo 2 > /sys/block/sda/queue/nomerges turns every merge off; 1 would change nothing here")
        );
        i.queue.nomerges = 1;
        let f = findings(&i);
        let n = by_topic(&f, "nomerges");
        assert_starts(n, "nomerges=1 changes nothing with scheduler none");
        assert!(n
            .lever
            .as_deref()
            .unwrap()
            .contains("1 is the same as 0 on this path"));
        i.queue.scheduler = parse_scheduler("none [mq-deadline] kyber bfq");
        let f = findings(&i);
        assert!(by_topic(&f, "scheduler").finding.starts_with("mq-deadline, also available: none, kyber, bfq: bios merge in the task's plug list, then in mq-deadline through elv_merge"));
        let n = by_topic(&f, "nomerges");
        assert_starts(n, "nomerges=1 with mq-deadline: plug merges still happen");
        assert!(n
            .lever
            .as_deref()
            .unwrap()
            .contains("echo 0 to restore the hash lookup"));
        i.queue.nomerges = 0;
        assert!(by_topic(&findings(&i), "nomerges")
            .lever
            .as_deref()
            .unwrap()
            .contains("1 only drops mq-deadline's hash and front-merge lookups"));
        i.queue.nomerges = 2;
        let f = findings(&i);
        let n = by_topic(&f, "nomerges");
        assert_starts(n, "nomerges=2 disables all bio merges");
        assert_eq!(
            n.lever.as_deref(),
            Some("echo 0 > /sys/block/sda/queue/nomerges turns merging back on")
        );
        let p = by_topic(&f, "plug flush");
        assert_starts(p, "a task's plug list is flushed to the device at 32 requests only (the 128 KiB size rule is off with nomerges=2); 64 requests");
        i.queue.scheduler = parse_scheduler("none [kyber]");
        assert!(by_topic(&findings(&i), "scheduler")
            .finding
            .contains("kyber's per-domain lists"));
    }
    #[test]
    fn bio_based_device() {
        let mut i = sda_input();
        i.device = Device {
            name: "zram0".into(),
            major: 252,
            minor: 0,
            notes: vec!["zram0 is bio-based (no request queue): bios ...".into()],
            bio_based: true,
        };
        i.queue.scheduler = None;
        i.queue.nr_requests = None;
        i.queue.hw_queues = 0;
        i.diskstats = parse_diskstats_line("252 0 zram0 100 0 800 0 50 0 400 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "device").finding,
            "zram0 (252:0) is bio-based: no scheduler and no request queue, so it never merges; nomerges, max_sectors_kb and the plug limits do not apply"
        );
        assert!(by_topic(&f, "scheduler")
            .finding
            .starts_with("none: zram0 is bio-based"));
        assert!(by_topic(&f, "nomerges").finding.contains("bio-based"));
        assert!(by_topic(&f, "write merges").finding.starts_with(
            "zram0 is bio-based: 0 merges by construction; 50 write bios since zram0 was added"
        ));
        assert!(by_topic(&f, "write request size")
            .finding
            .starts_with("average write bio 4.00 KiB"));
        assert!(f
            .iter()
            .all(|x| x.topic != "merge ceiling" && x.topic != "plug flush"));
    }
    #[test]
    fn partition_note_is_kept() {
        let mut i = sda_input();
        i.device.notes = vec!["sda1 is a partition of sda: tracing sda".into()];
        assert!(by_topic(&findings(&i), "device")
            .finding
            .ends_with("; sda1 is a partition of sda: tracing sda"));
    }
}
