//! The largest request merging can build, what sets it, and when a task's plug is flushed.
use super::Finding;
use crate::{
    commands::check::gather::CheckInput,
    fmt,
    sys::queue::{BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES, PAGE_SIZE},
};

/// The merge ceiling and the plug flush rules (blk-mq devices only).
pub(super) fn ceilings(input: &CheckInput, out: &mut Vec<Finding>) {
    let q = &input.queue;
    let name = &input.device.name;
    let bio_based = input.bio_based();
    if !bio_based {
        let ceiling = q.merge_ceiling_bytes();
        let by_segments = q.max_segments * PAGE_SIZE;
        let rotational = if q.rotational {
            "rotational: seeks are charged per request, merging's home ground"
        } else {
            "not rotational: no seek to save, merging pays only where something counts requests"
        };
        let useful_kb = q.max_hw_sectors_kb.min(by_segments / 1024);
        let lever = (q.merge_ceiling_set_by() == "max_sectors_kb" && useful_kb > q.max_sectors_kb)
            .then(|| {
                format!(
                    "echo {useful_kb} > /sys/block/{name}/queue/max_sectors_kb raises it to {} \
                     (beyond that {} binds)",
                    fmt::kib(useful_kb * 1024),
                    if useful_kb == q.max_hw_sectors_kb {
                        "max_hw_sectors_kb"
                    } else {
                        "max_segments"
                    }
                )
            });
        out.push(Finding::new(
            "merge ceiling",
            format!(
                "the largest request merging can build is {} = min(max_sectors_kb {}, max_segments {} × 4 KiB pages = {}), set by {}; max_hw_sectors_kb {}; {rotational}",
                fmt::kib(ceiling),
                fmt::kib(q.max_sectors_kb * 1024),
                q.max_segments,
                fmt::kib(by_segments),
                q.merge_ceiling_set_by(),
                q.max_hw_sectors_kb,
            ),
            lever,
        ));
        let rule = match q.plug_flush_bytes() {
            Some(b) => format!(
                "at {} requests, or as soon as its last request has reached {}",
                q.plug_max_requests(),
                fmt::kib(b)
            ),
            None => format!(
                "at {} requests only (the 128 KiB size rule is off with nomerges=2)",
                q.plug_max_requests()
            ),
        };
        out.push(Finding::new(
            "plug flush",
            format!(
                "a task's plug list is flushed to the device {rule}; {} requests once the plug also holds requests for another device (md/dm over several disks); the hardware queue count ({}) plays no part",
                BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES, q.hw_queues,
            ),
            None,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;

    #[test]
    fn ceilings_and_plug() {
        let mut i = sda_input();
        let f = findings(&i);
        let c = by_topic(&f, "merge ceiling");
        assert_eq!(
            c.finding,
            "the largest request merging can build is 512 KiB = min(max_sectors_kb 1,280 KiB, max_segments 128 × 4 KiB pages = 512 KiB), set by max_segments; max_hw_sectors_kb 1280; not rotational: no seek to save, merging pays only where something counts requests"
        );
        assert_eq!(c.lever, None);
        let p = by_topic(&f, "plug flush");
        assert_eq!(
            p.finding,
            "a task's plug list is flushed to the device at 32 requests, or as soon as its last request has reached 128 KiB; 64 requests once the plug also holds requests for another device (md/dm over several disks); the hardware queue count (1) plays no part"
        );
        i.queue.max_sectors_kb = 256;
        i.queue.rotational = true;
        i.queue.hw_queues = 4;
        let f = findings(&i);
        let c = by_topic(&f, "merge ceiling");
        assert_starts(c, "the largest request merging can build is 256 KiB");
        assert!(
            c.finding.contains("set by max_sectors_kb") && c.finding.contains("rotational: seeks")
        );
        assert_eq!(
            c.lever.as_deref(),
            Some("echo 512 > /sys/block/sda/queue/max_sectors_kb raises it to 512 KiB (beyond that max_segments binds)")
        );
        assert!(by_topic(&f, "plug flush")
            .finding
            .ends_with("the hardware queue count (4) plays no part"));
        assert!(by_topic(&f, "device")
            .finding
            .contains("4 hardware queues, rotational"));
    }
}
