//! A disk that completes requests in its interrupt handler, and the CPU that takes it: a
//! virtio-blk disk (as NVMe disks and cloud volumes do). There, the completion program runs on
//! the CPU the interrupt is bound to, inside whichever program was running on it (an issue,
//! a bio), between any two of its instructions. Loop devices complete in a worker thread and
//! never show that.
//!
//! On the host the disk of the machine's own filesystem (vda here; its node cannot be opened,
//! and it is never written raw): a file of this test's on it, written once and read back
//! with O_DIRECT, removed on drop. In a lab guest the scratch virtio disk itself, held like
//! [`TestDisk`].

use std::{
    fs,
    io::Write,
    ops::Deref,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::*;

pub struct InterruptDisk {
    disk: Held,
    /// The CPU its request queue's interrupt is delivered to.
    pub irq_cpu: usize,
    /// What to read: the disk itself, or the host's file on it.
    pub target: PathBuf,
}

enum Held {
    /// The host's own disk and this test's file on it (removed on drop).
    Host(BlockDev, PathBuf),
    Lab(TestDisk),
}

impl Deref for InterruptDisk {
    type Target = BlockDev;
    fn deref(&self) -> &BlockDev {
        self.disk.dev()
    }
}

impl Held {
    fn dev(&self) -> &BlockDev {
        match self {
            Held::Host(d, _) => d,
            Held::Lab(d) => d,
        }
    }
}

impl Drop for InterruptDisk {
    fn drop(&mut self) {
        if let Held::Host(_, file) = &self.disk {
            let _ = fs::remove_file(file);
        }
    }
}

/// Where the host's file goes: a directory on the machine's own disk.
const HOST_DIR: &str = "/var/tmp";

impl InterruptDisk {
    /// The disk, with `size` bytes to read. Panics, saying why, where there is none (a host
    /// whose /var/tmp is not on a virtio disk).
    pub fn new(size: u64) -> InterruptDisk {
        let (disk, target) = if in_lab() {
            let d = TestDisk::new(size);
            let path = d.path.clone();
            (Held::Lab(d), path)
        } else {
            let name = disk_of(Path::new(HOST_DIR));
            assert!(
                virtio_device(&name).is_some(),
                "{HOST_DIR} is on {name}, not a virtio-blk disk: this test needs a disk that \
                 completes requests in its interrupt"
            );
            let file = PathBuf::from(format!("{HOST_DIR}/mt-test-{}.data", std::process::id()));
            write_file(&file, size);
            (Held::Host(BlockDev::open(&name, size), file.clone()), file)
        };
        let irq_cpu = request_irq_cpu(disk.dev());
        InterruptDisk {
            disk,
            irq_cpu,
            target,
        }
    }
}

/// The whole disk a directory's filesystem is on (its partition's parent, if a partition).
fn disk_of(dir: &Path) -> String {
    let dev = fs::metadata(dir)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", dir.display()))
        .dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).unwrap_or_else(|e| {
        panic!(
            "{} is on {major}:{minor}, not a block device: {e}",
            dir.display()
        )
    });
    let disk = if sys.join("partition").exists() {
        sys.parent().expect("a partition's disk").to_path_buf()
    } else {
        sys
    };
    disk.file_name().unwrap().to_string_lossy().into_owned()
}

/// Writes `size` bytes (not zeros: blocks on disk, read back from it) to `file`, synced.
fn write_file(file: &Path, size: u64) {
    let mut f =
        fs::File::create(file).unwrap_or_else(|e| panic!("cannot create {}: {e}", file.display()));
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for _ in 0..size.div_ceil(chunk.len() as u64) {
        f.write_all(&chunk)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
    }
    f.sync_all()
        .unwrap_or_else(|e| panic!("cannot sync {}: {e}", file.display()));
}

/// The virtio device behind a disk ("virtio1"), from its sysfs `device` link.
fn virtio_device(disk: &str) -> Option<String> {
    let link = fs::read_link(format!("/sys/block/{disk}/device")).ok()?;
    let dev = link.file_name()?.to_string_lossy().into_owned();
    dev.starts_with("virtio").then_some(dev)
}

/// The CPU that takes the interrupt of `disk`'s first request queue (`virtioN-req.0` in
/// /proc/interrupts, its `effective_affinity_list`).
fn request_irq_cpu(disk: &BlockDev) -> usize {
    let virtio =
        virtio_device(&disk.name).unwrap_or_else(|| panic!("{} is not a virtio disk", disk.name));
    let table = fs::read_to_string("/proc/interrupts").expect("/proc/interrupts");
    let irq = irq_named(&table, &format!("{virtio}-req.0")).unwrap_or_else(|| {
        panic!(
            "no interrupt named {virtio}-req.0 in /proc/interrupts (the disk's queue must \
             have an interrupt of its own, MSI-X):\n{table}"
        )
    });
    let path = format!("/proc/irq/{irq}/effective_affinity_list");
    let cpus = fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    first_cpu(&cpus).unwrap_or_else(|| panic!("{path} names no CPU: {cpus:?}"))
}

/// The number of the interrupt whose line in a /proc/interrupts `table` ends with `name`.
fn irq_named(table: &str, name: &str) -> Option<u32> {
    table
        .lines()
        .find(|l| l.split_whitespace().last() == Some(name))
        .and_then(|l| l.split(':').next()?.trim().parse().ok())
}

/// The first CPU of a kernel CPU list ("1", "0-3,8").
fn first_cpu(list: &str) -> Option<usize> {
    list.trim()
        .split([',', '-'])
        .next()
        .and_then(|c| c.parse().ok())
}
