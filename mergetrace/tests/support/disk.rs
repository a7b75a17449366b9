//! Block devices: the common identity ([`BlockDev`]), loop devices over /dev/shm, and
//! guards that put a device's queue attributes back.

use std::{
    fs,
    ops::Deref,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::*;

/// A block device the tests drive: its name, node, numbers, and the bytes the test may use
/// (from offset 0). [`LoopDevice`] and [`TestDisk`] dereference to it, so everything that
/// takes a `&BlockDev` takes either.
#[derive(Debug)]
pub struct BlockDev {
    /// e.g. "loop3", "vdb"
    pub name: String,
    /// e.g. "/dev/loop3"
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Bytes the test may use, from offset 0 (a loop device's whole size; on the lab's scratch
    /// disk the region asked for, which may be smaller than the disk).
    pub size: u64,
}

impl BlockDev {
    /// The device behind `/dev/<name>`, its numbers from sysfs.
    pub(super) fn open(name: &str, size: u64) -> BlockDev {
        let devno = fs::read_to_string(format!("/sys/block/{name}/dev"))
            .unwrap_or_else(|e| panic!("cannot read /sys/block/{name}/dev: {e}"));
        let (maj, min) = devno.trim().split_once(':').expect("MAJ:MIN in sysfs dev");
        BlockDev {
            name: name.to_string(),
            path: PathBuf::from(format!("/dev/{name}")),
            major: maj.parse().unwrap(),
            minor: min.parse().unwrap(),
            size,
        }
    }

    pub fn sysfs(&self) -> PathBuf {
        PathBuf::from(format!("/sys/block/{}", self.name))
    }

    pub fn queue(&self, attr: &str) -> PathBuf {
        self.sysfs().join("queue").join(attr)
    }

    /// "7:3"
    pub fn maj_min(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    /// The schedulers the device offers (`queue/scheduler`'s entries, brackets removed).
    pub fn schedulers(&self) -> Vec<String> {
        let s = fs::read_to_string(self.queue("scheduler"))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", self.queue("scheduler").display()));
        s.split_whitespace()
            .map(|w| w.trim_start_matches('[').trim_end_matches(']').to_string())
            .collect()
    }

    /// Whether the device offers `sched` ("none" always counts).
    pub fn offers_scheduler(&self, sched: &str) -> bool {
        sched == "none" || self.schedulers().iter().any(|s| s == sched)
    }

    /// Writes `sched` to the device's scheduler, which the kernel refuses for a scheduler it
    /// does not have: the error of the write, `None` if it was taken.
    pub fn refuses_scheduler(&self, sched: &str) -> Option<std::io::Error> {
        fs::write(self.queue("scheduler"), sched).err()
    }

    /// Sets the I/O scheduler ("none", "mq-deadline", ...) and checks it took. Panics naming
    /// the cause when the device does not offer it at all (5.10's loop devices list only
    /// "[none]", and writing another name there is silently ignored): use a disk that offers
    /// one ([`scheduler_disk`]).
    pub fn set_scheduler(&self, sched: &str) {
        // A modular scheduler (bfq, kyber, 6.12's mq_deadline) is listed only once loaded,
        // which the kernel's own request_module does on this write.
        let wrote = fs::write(self.queue("scheduler"), sched);
        let now = self.scheduler();
        if now == sched {
            return;
        }
        assert!(
            self.offers_scheduler(sched),
            "{}: the device offers no {sched} scheduler (queue/scheduler lists {:?}; writing it \
             gave {wrote:?}): a queue without elevator support, as 5.10's loop devices are, \
             offers none and ignores the write — run this on a disk that offers it \
             (support::scheduler_disk)",
            self.name,
            self.schedulers()
        );
        panic!(
            "{}: scheduler is {now} after writing {sched} ({wrote:?})",
            self.name
        );
    }

    /// The active scheduler (the bracketed entry).
    pub fn scheduler(&self) -> String {
        let s = fs::read_to_string(self.queue("scheduler")).expect("read scheduler");
        s.split_whitespace()
            .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
            .unwrap_or("none")
            .to_string()
    }

    /// 0 = all merges, 1 = no extended merges, 2 = no merges. Checked after writing.
    pub fn set_nomerges(&self, level: u32) {
        write_sysfs(&self.queue("nomerges"), &level.to_string());
        let now: u32 = fs::read_to_string(self.queue("nomerges"))
            .expect("read nomerges")
            .trim()
            .parse()
            .expect("nomerges is a number");
        assert_eq!(now, level, "{}: nomerges", self.name);
    }

    pub fn set_queue_attr(&self, attr: &str, value: &str) {
        write_sysfs(&self.queue(attr), value);
    }

    pub fn diskstats(&self) -> DiskStats {
        diskstats(&self.name)
    }
}

/// A loop device over a fresh sparse file in /dev/shm. Detached and deleted on drop.
#[derive(Debug)]
pub struct LoopDevice {
    dev: BlockDev,
    pub backing: PathBuf,
    /// The settings it had when attached (a reused loop device keeps an earlier user's).
    saved: QueueSettings,
    /// The index of a device [`LoopDevice::disposable`] made with LOOP_CTL_ADD, removed
    /// (LOOP_CTL_REMOVE) on drop.
    pub(super) made: Option<u32>,
}

impl Deref for LoopDevice {
    type Target = BlockDev;
    fn deref(&self) -> &BlockDev {
        &self.dev
    }
}

impl LoopDevice {
    /// A loop device of `size` bytes, udev settled, with a loop device's default queue
    /// settings (scheduler none, nomerges 0, max_sectors_kb the hardware's), whatever an
    /// earlier user of the device left; those are put back on drop.
    pub fn new(size: u64) -> LoopDevice {
        let backing = PathBuf::from(format!("/dev/shm/{}.img", unique_name()));
        {
            let f = fs::File::create(&backing)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", backing.display()));
            f.set_len(size).expect("cannot size the backing file");
        }
        let mut last_err = String::new();
        let mut dev = None;
        for _ in 0..10 {
            let out = {
                let _guard = LOSETUP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
                Command::new("losetup")
                    .args(["-f", "--show"])
                    .arg(&backing)
                    .output()
                    .expect("cannot run losetup")
            };
            if out.status.success() {
                dev = Some(String::from_utf8_lossy(&out.stdout).trim().to_string());
                break;
            }
            // Another process may have taken the same free device: try again.
            last_err = String::from_utf8_lossy(&out.stderr).into_owned();
            thread::sleep(Duration::from_millis(200));
        }
        let Some(dev) = dev else {
            let _ = fs::remove_file(&backing);
            panic!("losetup -f --show {} failed: {last_err}", backing.display());
        };
        LoopDevice::attached(&dev, backing, size, None)
    }

    /// A loop device of its own, which no later user gets: a new /dev/loopN made with
    /// LOOP_CTL_ADD (from index 512 up, above the ones `losetup -f` hands out), attached to a
    /// fresh file like [`LoopDevice::new`], and removed with LOOP_CTL_REMOVE on drop. For tests
    /// that change a queue limit sysfs cannot put back as it was: 6.18's discard_max_bytes
    /// store takes only multiples of the discard granularity up to UINT_MAX bytes, and a loop
    /// device's default (4294966784, granularity 4096) is neither, while a reused loop device
    /// keeps its queue limits after `losetup -d`.
    pub fn disposable(size: u64) -> LoopDevice {
        const LOOP_CTL_ADD: libc::c_ulong = 0x4C80;
        let backing = PathBuf::from(format!("/dev/shm/{}.img", unique_name()));
        {
            let f = fs::File::create(&backing)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", backing.display()));
            f.set_len(size).expect("cannot size the backing file");
        }
        let ctl = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .unwrap_or_else(|e| panic!("cannot open /dev/loop-control: {e}"));
        let _guard = LOSETUP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let made = (512..1024u32).find(|i| {
            // SAFETY: LOOP_CTL_ADD takes the index as its argument; nothing is written back.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&ctl),
                    LOOP_CTL_ADD as _,
                    *i as libc::c_ulong,
                ) >= 0
            }
        });
        let Some(index) = made else {
            let _ = fs::remove_file(&backing);
            panic!("LOOP_CTL_ADD made no loop device with an index from 512 to 1023");
        };
        let dev = format!("/dev/loop{index}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&dev).exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let out = Command::new("losetup").arg(&dev).arg(&backing).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            remove_loop(index);
            let _ = fs::remove_file(&backing);
            panic!("losetup {dev} {} failed: {out:?}", backing.display());
        }
        LoopDevice::attached(&dev, backing, size, Some(index))
    }

    /// The rest of making a [`LoopDevice`] once `dev` is bound to `backing`.
    fn attached(dev: &str, backing: PathBuf, size: u64, made: Option<u32>) -> LoopDevice {
        let path = PathBuf::from(dev);
        let name = path
            .file_name()
            .expect("losetup printed a device path")
            .to_string_lossy()
            .into_owned();
        // From here on Drop cleans up, even if a step below panics.
        let mut lo = LoopDevice {
            dev: BlockDev {
                name,
                path,
                major: 0,
                minor: 0,
                size,
            },
            backing,
            saved: QueueSettings::default(),
            made,
        };
        udev_settle();
        let opened = BlockDev::open(&lo.dev.name, size);
        lo.dev.major = opened.major;
        lo.dev.minor = opened.minor;
        lo.saved = QueueSettings::of(&lo.dev);
        let max_hw = fs::read_to_string(lo.queue("max_hw_sectors_kb")).expect("max_hw_sectors_kb");
        lo.set_scheduler("none");
        lo.set_nomerges(0);
        lo.set_queue_attr("max_sectors_kb", max_hw.trim());
        lo
    }

    /// The device is still bound to our backing file.
    fn still_ours(&self) -> bool {
        fs::read_to_string(self.sysfs().join("loop/backing_file"))
            .is_ok_and(|f| Path::new(f.trim()) == self.backing)
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        self.saved.restore();
        // Detaching can briefly fail while something (udev's probe) still holds it open.
        for _ in 0..50 {
            let ok = Command::new("losetup")
                .arg("-d")
                .arg(&self.path)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !self.still_ours() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        if self.still_ours() {
            eprintln!(
                "warning: could not detach {} ({})",
                self.path.display(),
                self.backing.display()
            );
        }
        let _ = fs::remove_file(&self.backing);
        if let Some(index) = self.made {
            remove_loop(index);
        }
    }
}

/// LOOP_CTL_REMOVE of a loop device [`LoopDevice::disposable`] made (retried while it is
/// still busy, e.g. its detach not yet finished).
fn remove_loop(index: u32) {
    const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;
    let Ok(ctl) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    else {
        eprintln!("warning: cannot open /dev/loop-control to remove loop{index}");
        return;
    };
    for _ in 0..50 {
        // SAFETY: LOOP_CTL_REMOVE takes the index as its argument.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ctl),
                LOOP_CTL_REMOVE as _,
                index as libc::c_ulong,
            )
        };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENODEV) {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "warning: could not remove loop{index}: {}",
        std::io::Error::last_os_error()
    );
}

/// Queue attributes a test may change; put back when it is done.
const QUEUE_ATTRS: [&str; 3] = ["scheduler", "nomerges", "max_sectors_kb"];

/// A device's [`QUEUE_ATTRS`] as they were, to put back (loop devices are reused and keep
/// their queue settings after a detach; the lab's disk is shared by the tests).
#[derive(Debug, Default)]
pub(super) struct QueueSettings(Vec<(PathBuf, String)>);

impl QueueSettings {
    pub(super) fn of(dev: &BlockDev) -> QueueSettings {
        QueueSettings(
            QUEUE_ATTRS
                .iter()
                .map(|a| {
                    let p = dev.queue(a);
                    let v = if *a == "scheduler" {
                        dev.scheduler()
                    } else {
                        fs::read_to_string(&p)
                            .unwrap_or_default()
                            .trim()
                            .to_string()
                    };
                    (p, v)
                })
                .collect(),
        )
    }

    pub(super) fn restore(&self) {
        for (p, v) in self.0.iter().rev() {
            if let Err(e) = fs::write(p, v) {
                eprintln!("warning: could not restore {} to {v}: {e}", p.display());
            }
        }
    }
}

/// Restores one queue attribute of a loop device to the value it had, on drop. Loop devices
/// are reused and keep their queue settings (max_sectors_kb, nomerges, scheduler) across
/// `losetup -d`, so a test that changes a limit the other tests do not set must put it back.
/// Declare it after the `LoopDevice` so it drops first.
#[derive(Debug)]
pub struct QueueAttrRestore {
    path: PathBuf,
    old: String,
}

impl BlockDev {
    /// Sets `queue/<attr>` to `value` and returns a guard that writes the old value back.
    pub fn set_queue_attr_restored(&self, attr: &str, value: &str) -> QueueAttrRestore {
        let path = self.queue(attr);
        let old = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .trim()
            .to_string();
        write_sysfs(&path, value);
        let now = fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            now.trim(),
            value,
            "{}: wrote {value}, reads {now}",
            path.display()
        );
        QueueAttrRestore { path, old }
    }

    /// The current value of `queue/<attr>`, trimmed.
    pub fn queue_attr(&self, attr: &str) -> String {
        fs::read_to_string(self.queue(attr))
            .unwrap_or_else(|e| panic!("cannot read queue/{attr} of {}: {e}", self.name))
            .trim()
            .to_string()
    }
}

impl Drop for QueueAttrRestore {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.path, &self.old) {
            eprintln!(
                "warning: could not restore {} to {}: {e}",
                self.path.display(),
                self.old
            );
        }
    }
}

/// A device-mapper `linear` target over a whole disk (`dm-N`), removed on drop. dmsetup runs
/// without udev (the lab's guests have none): the device is found by its name in sysfs.
pub struct DmLinear {
    pub dev: BlockDev,
    name: String,
}

impl DmLinear {
    /// Whether this kernel has device-mapper (loading `dm_mod` if it is a module).
    fn available() -> bool {
        let _ = Command::new("modprobe").arg("dm_mod").status();
        Path::new("/sys/module/dm_mod").exists()
    }

    /// As [`DmLinear::available`]; where it is not, asserts what must then hold (this is not
    /// the lab, whose guests have it as a module, and there is no `/dev/mapper/control`) and
    /// says so: a test over a target has nothing else to check on such a kernel.
    pub fn available_or_asserted_absent() -> bool {
        if DmLinear::available() {
            return true;
        }
        assert!(
            !in_lab(),
            "the lab's guests have device-mapper as a module: modprobe dm_mod failed"
        );
        assert!(!Path::new("/dev/mapper/control").exists());
        eprintln!("this kernel has no device-mapper: no target stacks on a disk here");
        false
    }

    /// A linear target mapping all of `disk`.
    pub fn over(disk: &BlockDev) -> DmLinear {
        let name = unique_name();
        let sectors = disk.size / 512;
        let table = format!("0 {sectors} linear {} 0", disk.path.display());
        let out = Command::new("dmsetup")
            .args(["create", &name, "--noudevsync", "--table", &table])
            .output()
            .unwrap_or_else(|e| panic!("cannot run dmsetup (apt install dmsetup): {e}"));
        assert!(
            out.status.success(),
            "dmsetup create {name} --table '{table}': {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let kernel_name = fs::read_dir("/sys/block")
            .expect("/sys/block")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| {
                fs::read_to_string(format!("/sys/block/{n}/dm/name"))
                    .is_ok_and(|s| s.trim() == name)
            })
            .unwrap_or_else(|| panic!("dm target {name} is not in /sys/block/*/dm/name"));
        DmLinear {
            dev: BlockDev::open(&kernel_name, disk.size),
            name,
        }
    }
}

impl Drop for DmLinear {
    fn drop(&mut self) {
        let ok = Command::new("dmsetup")
            .args(["remove", "--noudevsync", &self.name])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("warning: could not remove dm target {}", self.name);
        }
    }
}
