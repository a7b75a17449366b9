//! A disk already busy when a tracer starts, and still busy when it stops: what a user who
//! starts mergetrace on a loaded machine sees at either end of the run.

use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::*;

/// A 256 MiB loop device (scheduler none) kept busy by 4 KiB random O_DIRECT reads (fio,
/// iodepth 64) in cgroup `busy`, and cgroup `counted`, whose read limit never binds, for I/O
/// counted exactly against `io_serviced` beside the load. The load stops on drop (or
/// [`BusyDisk::stop_load`]).
pub struct BusyDisk {
    // Dropped in this order: the load, then its cgroups, then the device.
    load: Option<FioRun>,
    pub busy: Cgroup,
    pub counted: Cgroup,
    pub lo: LoopDevice,
}

impl BusyDisk {
    /// Returns once the load has completed 2,000 reads.
    pub fn start() -> BusyDisk {
        let lo = LoopDevice::new(256 << 20);
        lo.set_scheduler("none");
        let (busy, counted) = (Cgroup::new(), Cgroup::new());
        counted.set_read_iops(&lo, 10_000_000);
        let load = Fio::random_for("busy", &lo, "randread", "600")
            .in_cgroup(&busy)
            .spawn();
        wait_for_reads(&lo.name, 2000);
        BusyDisk {
            load: Some(load),
            busy,
            counted,
            lo,
        }
    }

    /// 16 MiB of sequential reads in `counted` (batches of 32).
    pub fn counted_reads(&self) -> CountedReads {
        let before = self.counted.throttle_stats(&self.lo);
        let fio = Fio::sequential("counted", &self.lo, "read", 16 << 20, 32)
            .in_cgroup(&self.counted)
            .run();
        let (ios, bytes) = self.counted.throttle_stats(&self.lo).read_since(&before);
        CountedReads { fio, ios, bytes }
    }

    pub fn stop_load(&mut self) {
        if let Some(load) = self.load.take() {
            load.kill();
        }
    }
}

/// [`BusyDisk::counted_reads`]: fio's report and what blk-throttle charged for them.
pub struct CountedReads {
    pub fio: Value,
    /// `io_serviced` and `io_service_bytes`, reads.
    pub ios: u64,
    pub bytes: u64,
}

impl CountedReads {
    /// `row` (the reads of `counted` in a live view or report) counts them exactly: its bios
    /// are fio's, its charges blk-throttle's.
    pub fn check(&self, row: &Value) {
        assert_eq!(
            u(row, "bios"),
            fio_total_ios(&self.fio, "read"),
            "bios vs fio; {row}"
        );
        assert_eq!(u(row, "charged_ios"), self.ios, "vs io_serviced; {row}");
        assert_eq!(
            u(row, "charged_bytes"),
            self.bytes,
            "vs io_service_bytes; {row}"
        );
    }
}

/// Waits until device `name` has completed `n` more reads than it had: a workload started in
/// the background is running. Panics after 60 s.
fn wait_for_reads(name: &str, n: u64) {
    let before = diskstats(name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while diskstats(name).since(&before).reads < n {
        assert!(
            Instant::now() < deadline,
            "{name}: {n} reads did not complete in 60 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
