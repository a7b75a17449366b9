//! Fixtures of the system's state, shared by the unit tests of several modules.
use crate::sys::queue::{parse_scheduler, QueueSettings};

/// A loop device's queue as 6.x sets it up: no scheduler, 1280 KiB requests, 128 segments.
pub fn loop_queue() -> QueueSettings {
    QueueSettings {
        scheduler: parse_scheduler("[none] mq-deadline kyber bfq"),
        nomerges: 0,
        max_sectors_kb: 1280,
        max_hw_sectors_kb: 1280,
        max_segments: 128,
        nr_requests: Some(128),
        rotational: false,
        logical_block_size: 512,
        hw_queues: 1,
        max_segment_size: Some(65536),
        chunk_sectors: Some(0),
        discard_max_bytes: Some(4 << 30),
        write_zeroes_max_bytes: Some(4 << 30),
    }
}
