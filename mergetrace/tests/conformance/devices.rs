//! The devices of the requeue, split and multi-queue tests.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::*;
use crate::support::{
    workloads::{self, Kind},
    *,
};

/// The disk of a requeue test. In the lab, the requeue disk (/dev/vdc, 256 MiB). The host
/// has no device that requeues: loop devices never do (`loop_queue_rq` hands every request
/// to its worker and returns `BLK_STS_OK`; it never returns `BLK_STS_*RESOURCE`, so
/// `block_rq_requeue` cannot fire), and it has no null_blk or scsi_debug to make one. There
/// the same workload runs on a loop device and the test requires `requeues == 0` with every
/// other exact relation: mergetrace must not invent requeues where the kernel has none, and
/// the workload (deep queues, writeback bursts) is checked on a single-queue device too.
pub(crate) fn requeue_disk() -> (TestDisk, Expect) {
    if in_lab() {
        (TestDisk::lab_requeue_disk(256 << 20), Expect::Some)
    } else {
        let disk = TestDisk::new(workloads::FS_SIZE);
        assert!(!disk.is_lab_disk());
        (disk, Expect::Zero)
    }
}

/// Requeue tests: `kind` on the requeue disk, every relation, requeues > 0 in the lab (and
/// there, from blktrace, R == requeues and D == requests + requeues) — == 0 on the host.
pub(crate) fn requeue_conformance(kind: Kind) {
    require_root();
    let (disk, requeues) = requeue_disk();
    conformance_on(&disk, kind, Opts { requeues, ..PLAIN });
}

/// Split tests: `kind` on `disk` with queue attributes `attrs` set for the window (put
/// back after, unless the disk is a loop device of its own that goes away with the test),
/// every relation, splits > 0 (and in the lab blktrace X == splits).
pub(crate) fn split_conformance(
    disk: &TestDisk,
    kind: Kind,
    attrs: &[(&str, &str)],
    lineage: bool,
) -> Measured {
    let mut _restore: Vec<QueueAttrRestore> = Vec::new();
    for (a, v) in attrs {
        if disk.is_disposable() {
            disk.set_queue_attr(a, v);
            assert_eq!(disk.queue_attr(a), *v, "{}: queue/{a}", disk.name);
        } else {
            _restore.push(disk.set_queue_attr_restored(a, v));
        }
    }
    conformance_on(
        disk,
        kind,
        Opts {
            splits: Expect::Some,
            lineage,
            ..PLAIN
        },
    )
}

/// A null_blk device made by a test (lab only), through configfs: `modprobe null_blk
/// nr_devices=0` (no device of its own), configfs mounted at /sys/kernel/config if it is not,
/// then `nullb/NAME` with size 1024 (MB), memory_backed 1, submit_queues 2, queue_mode 2
/// (blk-mq), power 1 — blk-mq with 2 submit hardware queues (6.1 and 6.12 add a poll queue),
/// scheduler none, write through (no volatile cache), max_sectors_kb 127. (configfs, not the
/// module parameters: Debian 11's 5.10 has no `memory_backed` parameter, and a null_blk that
/// keeps no data cannot hold a filesystem.) The disk is /dev/NAME (5.10: /dev/nullbINDEX).
/// Held with the lab's disk turn; on drop its queue settings are put back, the device removed
/// (rmdir), configfs unmounted if it was mounted here, and the module unloaded.
pub(crate) struct NullBlk {
    pub(crate) disk: Option<TestDisk>,
    /// The configfs directory made for the device.
    pub(crate) item: Option<std::path::PathBuf>,
    /// configfs was mounted by this test.
    pub(crate) mounted_configfs: bool,
    pub(crate) loaded: bool,
}

pub(crate) const CONFIGFS: &str = "/sys/kernel/config";

impl NullBlk {
    pub(crate) fn load() -> NullBlk {
        assert!(in_lab(), "null_blk is only loaded in the lab's guests");
        let turn = lab_turn();
        assert!(
            !Path::new("/sys/module/null_blk").exists(),
            "null_blk is already loaded (not by this test); refusing to use or unload it"
        );
        let mut nb = NullBlk {
            disk: None,
            item: None,
            mounted_configfs: false,
            loaded: false,
        };
        let st = Command::new("modprobe")
            .args(["null_blk", "nr_devices=0"])
            .status()
            .expect("cannot run modprobe");
        assert!(st.success(), "modprobe null_blk nr_devices=0 failed ({st})");
        nb.loaded = true;
        let root = Path::new(CONFIGFS).join("nullb");
        if !root.is_dir() {
            let st = Command::new("mount")
                .args(["-t", "configfs", "none", CONFIGFS])
                .status()
                .expect("cannot run mount");
            assert!(
                st.success(),
                "mount -t configfs none {CONFIGFS} failed ({st})"
            );
            nb.mounted_configfs = true;
        }
        assert!(
            root.is_dir(),
            "{} is missing with null_blk loaded",
            root.display()
        );
        let name = unique_name();
        let item = root.join(&name);
        fs::create_dir(&item).unwrap_or_else(|e| panic!("cannot create {}: {e}", item.display()));
        nb.item = Some(item.clone());
        for (attr, value) in [
            ("size", "1024"),
            ("memory_backed", "1"),
            ("submit_queues", "2"),
            ("queue_mode", "2"),
            ("power", "1"),
        ] {
            fs::write(item.join(attr), value).unwrap_or_else(|e| {
                panic!("cannot write {value} to {}/{attr}: {e}", item.display())
            });
        }
        let index = fs::read_to_string(item.join("index")).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        let disk = loop {
            let by_index = format!("nullb{}", index.trim());
            if let Some(d) = [name.as_str(), by_index.as_str()].into_iter().find(|d| {
                Path::new("/sys/block").join(d).exists() && Path::new("/dev").join(d).exists()
            }) {
                break d.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "null_blk made no disk for {} within 30 s",
                item.display()
            );
            thread::sleep(Duration::from_millis(50));
        };
        udev_settle();
        nb.disk = Some(TestDisk::lab_device(
            &format!("/dev/{disk}"),
            workloads::FS_SIZE,
            turn,
            "(null_blk size=1024)",
        ));
        nb
    }

    pub(crate) fn disk(&self) -> &TestDisk {
        self.disk.as_ref().unwrap()
    }
}

impl Drop for NullBlk {
    fn drop(&mut self) {
        // Settings back first (the disk's own drop), then the device, configfs, the module.
        drop(self.disk.take());
        if let Some(item) = self.item.take() {
            let _ = fs::write(item.join("power"), "0");
            if let Err(e) = fs::remove_dir(&item) {
                eprintln!("warning: could not remove {}: {e}", item.display());
            }
        }
        if self.mounted_configfs {
            let _ = Command::new("umount")
                .arg(CONFIGFS)
                .stderr(Stdio::null())
                .status();
        }
        if !self.loaded {
            return;
        }
        for _ in 0..100 {
            let ok = Command::new("rmmod")
                .arg("null_blk")
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !Path::new("/sys/module/null_blk").exists() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not unload null_blk");
    }
}
