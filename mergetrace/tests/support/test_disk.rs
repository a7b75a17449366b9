//! The disk a kernel test writes to: a loop device on the host, the lab's scratch (or
//! requeue) disk in a guest, held by one test at a time with its queue settings restored.

use std::{
    fs,
    ops::Deref,
    path::Path,
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::*;

/// Tests of one binary run in parallel threads; those on the lab's one scratch disk take
/// turns, since /proc/diskstats (and a scheduler switch) is per disk.
static LAB_DISK_LOCK: Mutex<()> = Mutex::new(());

/// This test's turn on the lab's disks (the scratch disk, the requeue disk, a null_blk
/// device): held for as long as the test uses one, so the tests of one binary run there one
/// after the other.
pub fn lab_turn() -> MutexGuard<'static, ()> {
    LAB_DISK_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The disk a kernel test writes to: a fresh loop device over /dev/shm on the host; in the
/// lab the disk `MERGETRACE_LAB_DISK` names: the scratch virtio disk /dev/vdb (virtio-blk, one
/// queue, mq-deadline, 256 tags), or with `cargo xtask lab --disk nvme` the NVMe disk
/// /dev/nvme0n1 (one queue per vCPU, no scheduler); held exclusively for the test's life and
/// with its queue settings restored afterwards. Dereferences to [`BlockDev`].
pub enum TestDisk {
    Loop(LoopDevice),
    Lab(LabDisk),
}

/// The lab's scratch disk, held by one test.
pub struct LabDisk {
    dev: BlockDev,
    saved: QueueSettings,
    _turn: MutexGuard<'static, ()>,
}

impl Deref for TestDisk {
    type Target = BlockDev;
    fn deref(&self) -> &BlockDev {
        match self {
            TestDisk::Loop(l) => l,
            TestDisk::Lab(d) => &d.dev,
        }
    }
}

/// Whether this kernel's mq-deadline serves requests by I/O priority (5.14 and later:
/// `dd_dispatch_request` skips lower priorities while higher ones are pending). Before, it
/// has no priorities at all, so an idle-class writer is not held back behind reads.
pub fn mq_deadline_has_priorities() -> bool {
    kernel_version() >= (5, 14)
}

/// A test disk on which requests of `sched` wait in the scheduler while a deep writer runs
/// ([`TestDisk::hold_writes`]): [`scheduler_disk`], except in a lab guest whose mq-deadline
/// has no I/O priorities (5.10: measured 0 merges of 4,096 bios on vdb, reader or not).
/// There it is the lab's requeue disk (vdc), whose ring takes about 5 requests at a time:
/// the rest wait in mq-deadline, where the next bios merge into them, as on a busy disk.
pub fn elevator_disk(size: u64, sched: &str) -> TestDisk {
    if in_lab() && sched == "mq-deadline" && !mq_deadline_has_priorities() {
        let disk = TestDisk::lab_requeue_disk(size);
        disk.set_scheduler(sched);
        return disk;
    }
    scheduler_disk(size, sched)
}

/// A test disk that offers the I/O scheduler `sched` ("mq-deadline", "bfq", ...), for tests
/// that need an elevator: [`TestDisk::new`] — on the host a loop device (6.18's offer
/// mq-deadline), in the lab the scratch disk vdb, which offers mq-deadline on every lab
/// kernel (5.10's loop devices offer no scheduler at all). Panics naming the device and what
/// it lists when it does not offer `sched`.
pub fn scheduler_disk(size: u64, sched: &str) -> TestDisk {
    let disk = TestDisk::new(size);
    if !disk.offers_scheduler(sched) {
        // Modular schedulers are listed once loaded: setting it loads it, or names the cause.
        disk.set_scheduler(sched);
    }
    disk
}

impl TestDisk {
    /// A disk with at least `size` usable bytes from offset 0 (see [`TestDisk`]). In the lab
    /// this waits for the tests of this binary that hold the scratch disk.
    pub fn new(size: u64) -> TestDisk {
        if !in_lab() {
            return TestDisk::Loop(LoopDevice::new(size));
        }
        let turn = lab_turn();
        let path = std::env::var("MERGETRACE_LAB_DISK").unwrap_or_else(|_| "/dev/vdb".into());
        TestDisk::lab_device(&path, size, turn, "(cargo xtask lab --disk-size MIB)")
    }

    /// The lab's disk that requeues (`MERGETRACE_LAB_REQUEUE_DISK`, /dev/vdc: virtio-blk with
    /// a 16-entry ring and no indirect descriptors, mq-deadline, nr_requests 16, max_segments
    /// 14; docs/lab.md), held and restored like the scratch disk and taking
    /// turns with it. Panics outside the lab: no host device requeues.
    pub fn lab_requeue_disk(size: u64) -> TestDisk {
        assert!(
            in_lab(),
            "the requeue disk exists only in the guest-kernel lab (MERGETRACE_LAB=1)"
        );
        let turn = lab_turn();
        let path =
            std::env::var("MERGETRACE_LAB_REQUEUE_DISK").unwrap_or_else(|_| "/dev/vdc".into());
        TestDisk::lab_device(&path, size, turn, "(the lab's requeue disk)")
    }

    /// A lab disk by path (`/dev/vdb`, `/dev/nullb0`...), held for the test's life with
    /// `turn` (from [`lab_turn`]), its [`QUEUE_ATTRS`] put back on drop. Panics when it has
    /// fewer than `size` bytes (`hint` says how to get more).
    pub fn lab_device(
        path: &str,
        size: u64,
        turn: MutexGuard<'static, ()>,
        hint: &str,
    ) -> TestDisk {
        let name = Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dev = BlockDev::open(&name, size);
        let bytes: u64 = fs::read_to_string(dev.sysfs().join("size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|sectors| sectors * 512)
            .unwrap_or(0);
        assert!(
            bytes >= size,
            "the lab's disk {path} has {bytes} bytes; the test needs {size} {hint}"
        );
        let saved = QueueSettings::of(&dev);
        TestDisk::Lab(LabDisk {
            dev,
            saved,
            _turn: turn,
        })
    }

    /// Like [`TestDisk::new`], but on the host a loop device of its own that is removed after
    /// the test ([`LoopDevice::disposable`]), for tests that change queue limits which cannot
    /// be put back exactly. In the lab the scratch disk, whose settings are put back.
    pub fn new_disposable(size: u64) -> TestDisk {
        if in_lab() {
            TestDisk::new(size)
        } else {
            TestDisk::Loop(LoopDevice::disposable(size))
        }
    }

    /// A loop device of its own, removed after the test ([`TestDisk::new_disposable`]).
    pub fn is_disposable(&self) -> bool {
        matches!(self, TestDisk::Loop(l) if l.made.is_some())
    }

    /// The lab's scratch disk rather than a loop device.
    pub fn is_lab_disk(&self) -> bool {
        matches!(self, TestDisk::Lab(_))
    }
}

impl TestDisk {
    /// The whole disk's size in bytes (at least [`BlockDev::size`]).
    pub fn capacity(&self) -> u64 {
        fs::read_to_string(self.sysfs().join("size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|sectors| sectors * 512)
            .unwrap_or(self.size)
    }

    /// Makes the requests of a writer (a fio job on this disk, below [`BlockDev::size`], run
    /// with [`HeldWrites::run`]) wait in the I/O scheduler `sched`, as they do on a busy disk.
    /// Call it before a tracer starts: for kyber it writes for a while (below), and those
    /// writes must not be in the traced counts. The busy reader runs only inside `run`, so two
    /// tracers started one after the other see the same reads.
    ///
    /// On the host's loop devices they do by themselves (128 tags served by one worker
    /// thread), and `writer` runs as it is. The lab's virtio disk takes every request at once:
    /// 256 tags, and the emulated device completes faster than the emulated CPU submits
    /// (measured on 6.1 and 6.12: 0 merges of 2,048-4,096 bios at iodepth 512 with mq-deadline,
    /// bfq and kyber). There a best-effort reader keeps requests pending on another region of
    /// the disk while the writer runs (its reads are in the read direction, apart from the
    /// writes the tests check; it is stopped, its reads done, before `run` returns), and the
    /// scheduler is made to hold the writes back behind them:
    /// - mq-deadline, bfq: the writer runs in I/O priority class idle (fio `prioclass=3`).
    ///   mq-deadline does not dispatch a lower priority while a higher one is pending
    ///   (`dd_dispatch_request`: "Ignore lower priority requests if any higher priority
    ///   requests are pending"; aged ones go after `prio_aging_expire`, 10 s), and bfq serves
    ///   its idle class only when no other class has requests. (Measured on 6.12: 1,893 and
    ///   2,038 merges of 2,048 bios.)
    /// - kyber (no priorities): a read latency target of 1 µs (`iosched/read_lat_nsec`) that
    ///   every read misses, and a write target of 10 s that every write meets. kyber's timer
    ///   (`kyber_timer_fn`) then sees congestion and throttles the domains with good latencies
    ///   — the writes' token depth shrinks, so write requests wait in kyber's per-CPU lists
    ///   where the next bio merges (`blk_bio_list_merge`, the software-queue path). (Measured:
    ///   604 to 1,976 merges of 2,048 bios on 6.1 and 6.12 — and once, on 6.12, 0 of 4,096:
    ///   the depth had not shrunk before every write was done. So 2 s of writes elsewhere on
    ///   the disk come first, here.) The targets are put back after.
    /// - none: nothing (there is no scheduler to hold them; merges in the software queue need
    ///   a busy device).
    pub fn hold_writes(&self, sched: &str) -> HeldWrites<'_> {
        let mut held = HeldWrites {
            disk: self,
            busy_reader: false,
            prioclass_idle: false,
            _targets: None,
        };
        if !self.is_lab_disk() || !["mq-deadline", "bfq", "kyber"].contains(&sched) {
            return held;
        }
        held.busy_reader = true;
        held.prioclass_idle = sched != "kyber";
        if sched == "kyber" {
            held._targets = Some([
                self.set_queue_attr_restored("iosched/read_lat_nsec", "1000"),
                self.set_queue_attr_restored("iosched/write_lat_nsec", "10000000000"),
            ]);
            // kyber shrinks the write domain's depth only from a p99 of write latencies (500
            // samples, or a second of them) taken while reads are late; without writes before
            // the measured ones, all of those could be done first (seen on 6.12: 0 merges of
            // 4,096). 2 s of writes elsewhere on the disk, with the reader busy, leave the depth
            // at 1-2; it does not grow back while writes meet their 10 s target.
            let reader = self.start_busy_reader();
            Fio::new("kyber-warm-up", &self.path)
                .opt("rw", "randwrite")
                .opt("bs", "4k")
                .opt("direct", "1")
                .opt("ioengine", "libaio")
                .opt("iodepth", "64")
                .offset(self.capacity() / 4)
                .size(self.capacity() / 4)
                .opt("time_based", "1")
                .opt("runtime", "2")
                .run();
            reader.kill();
        }
        held
    }

    /// Random reads on the third quarter of the disk until killed, started once its requests
    /// are going (10 s at most) and kyber's timer (every 100 ms) has seen their latencies.
    fn start_busy_reader(&self) -> FioRun {
        let cap = self.capacity();
        assert!(
            cap >= 2 * self.size,
            "the lab disk ({cap} bytes) has no room for the reader beside {} bytes",
            self.size
        );
        let reads_before = self.diskstats().reads;
        let reader = Fio::new("busy-reader", &self.path)
            .opt("rw", "randread")
            .opt("bs", "4k")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "16")
            .offset(cap / 2)
            .size(cap / 4)
            .opt("time_based", "1")
            .opt("runtime", "3600")
            // One process: waiting for it waits for its reads.
            .opt("thread", "1")
            .spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.diskstats().reads == reads_before && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(500));
        reader
    }
}

/// What holds the writes back on the lab's disk; see [`TestDisk::hold_writes`].
pub struct HeldWrites<'a> {
    disk: &'a TestDisk,
    busy_reader: bool,
    prioclass_idle: bool,
    _targets: Option<[QueueAttrRestore; 2]>,
}

impl HeldWrites<'_> {
    /// Starts the busy reader, runs `writer` to completion (in I/O priority class idle where
    /// that holds it back), stops the reader (its reads are done when this returns).
    pub fn run(self, writer: Fio) -> Value {
        let reader = self.busy_reader.then(|| self.disk.start_busy_reader());
        let writer = if self.prioclass_idle {
            writer.opt("prioclass", "3")
        } else {
            writer
        };
        let report = writer.run();
        if let Some(r) = reader {
            r.kill();
        }
        report
    }
}

impl Drop for LabDisk {
    fn drop(&mut self) {
        // Before the turn is handed on (fields drop after this body).
        self.saved.restore();
    }
}
