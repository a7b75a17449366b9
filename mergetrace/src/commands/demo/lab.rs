//! The demo's lab: a scratch loop device and cgroups it creates and removes, the workload run
//! in a child process in one of them, and each arm's counts next to the kernel's.
//!
//! The self-check compares like with like, so that other processes on the machine cannot
//! fail it: udev's blkid, `btrfs device scan` and the like read a new disk. An arm's counts
//! are its cgroup's alone, set against what its workload submitted, the cgroup's own kernel
//! counters (v2 io.stat; blk-throttle's io_serviced) and the scratch disk's write counters in
//! /proc/diskstats, which only the demo moves: it alone writes to the disk it made, and reads
//! leave them as they are. No arm is checked against the disk's read counters.
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use mergetrace_common::Modes;

use super::{check_interrupted, INTERRUPTED};
use crate::{
    fmt,
    kernel::{self, Session, TierChoice},
    model::aggregate::{self, Counts, Dir, Key},
    sys::{
        cgroups::{Cgroups, Hierarchy},
        device::{self, Device},
        diskstats::DiskStats,
    },
};

/// A loop device over a sparse file in /dev/shm; detached and deleted on drop.
pub(super) struct ScratchDisk {
    pub(super) backing: PathBuf,
    pub(super) dev: Device,
    pub(super) path: PathBuf,
    /// Queue settings the loop device had (a reused one keeps an earlier user's): put back
    /// before it is detached.
    pub(super) saved: Vec<(&'static str, String)>,
}

/// The queue settings the demo changes.
const QUEUE_ATTRS: [&str; 3] = ["scheduler", "nomerges", "max_sectors_kb"];

impl ScratchDisk {
    pub(super) fn new(bytes: u64) -> Result<ScratchDisk> {
        let backing = PathBuf::from(format!(
            "/dev/shm/mergetrace-demo-{}.img",
            std::process::id()
        ));
        let f = std::fs::File::create(&backing)
            .with_context(|| format!("cannot create {}", backing.display()))?;
        f.set_len(bytes)?;
        drop(f);
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&backing)
            .output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let _ = std::fs::remove_file(&backing);
                bail!(
                    "losetup failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            Err(e) => {
                let _ = std::fs::remove_file(&backing);
                bail!("cannot run losetup ({e}): install util-linux/mount");
            }
        };
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let dev = match device::resolve(&path.display().to_string()) {
            Ok(d) => d,
            Err(e) => {
                let _ = Command::new("losetup").arg("-d").arg(&path).status();
                let _ = std::fs::remove_file(&backing);
                return Err(e);
            }
        };
        let mut disk = ScratchDisk {
            backing,
            dev,
            path,
            saved: Vec::new(),
        };
        // From here on Drop detaches it. Start from a loop device's defaults, whatever an
        // earlier user left: the tables depend on them.
        for attr in QUEUE_ATTRS {
            let now = disk.read_queue(attr)?;
            disk.saved.push((attr, now));
        }
        let max_hw = disk.read_queue("max_hw_sectors_kb")?;
        disk.queue("max_sectors_kb", &max_hw)?;
        disk.queue("nomerges", "0")?;
        disk.queue("scheduler", "none")?;
        Ok(disk)
    }

    fn queue_file(&self, attr: &str) -> PathBuf {
        Path::new("/sys/block")
            .join(&self.dev.name)
            .join("queue")
            .join(attr)
    }

    /// A queue attribute's value; for the scheduler, the active one.
    fn read_queue(&self, attr: &str) -> Result<String> {
        let p = self.queue_file(attr);
        let v =
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
        Ok(match attr {
            "scheduler" => v
                .split_whitespace()
                .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
                .unwrap_or("none")
                .to_string(),
            _ => v.trim().to_string(),
        })
    }

    pub(super) fn queue(&self, attr: &str, value: &str) -> Result<()> {
        let p = self.queue_file(attr);
        std::fs::write(&p, value)
            .with_context(|| format!("cannot write {value} to {}", p.display()))
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        for (attr, v) in self.saved.iter().rev() {
            let _ = self.queue(attr, v);
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// A cgroup of the demo's own, `/mergetrace-demo-PID-WHAT` (with the io controller on cgroup
/// v2); removed on drop.
pub(super) struct DemoCgroup {
    pub(super) dir: PathBuf,
    pub(super) rel: String,
    pub(super) hierarchy: Hierarchy,
}

impl DemoCgroup {
    pub(super) fn new(cg: &Cgroups, what: &str) -> Result<DemoCgroup> {
        if cg.hierarchy == Hierarchy::V2 {
            // Children get io.max, io.stat and io.cost's charges with io in the root's subtree.
            let control = cg.mount.join("cgroup.subtree_control");
            let on = std::fs::read_to_string(&control).unwrap_or_default();
            if !on.split_whitespace().any(|c| c == "io") {
                std::fs::write(&control, "+io").with_context(|| {
                    format!("cannot enable the io controller in {}", control.display())
                })?;
            }
        }
        let rel = format!("/mergetrace-demo-{}-{what}", std::process::id());
        let dir = cg.mount.join(rel.trim_start_matches('/'));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create cgroup {}", dir.display()))?;
        Ok(DemoCgroup {
            dir,
            rel,
            hierarchy: cg.hierarchy,
        })
    }

    /// A write-iops limit on `dev` (v1 `blkio.throttle.write_iops_device`, v2 `io.max`).
    pub(super) fn limit_write_iops(&self, dev: &Device, wiops: u64) -> Result<()> {
        let (file, line) = match self.hierarchy {
            Hierarchy::V1 => (
                "blkio.throttle.write_iops_device",
                format!("{}:{} {wiops}", dev.major, dev.minor),
            ),
            Hierarchy::V2 => (
                "io.max",
                format!("{}:{} wiops={wiops}", dev.major, dev.minor),
            ),
        };
        std::fs::write(self.dir.join(file), &line)
            .with_context(|| format!("cannot set {line} in {}", self.dir.join(file).display()))
    }

    /// A field of `dev`'s line in v2 `io.stat` (`wios`, `cost.usage`), 0 while absent.
    pub(super) fn io_stat(&self, dev: &Device, field: &str) -> Result<u64> {
        let key = format!("{}:{} ", dev.major, dev.minor);
        let t = std::fs::read_to_string(self.dir.join("io.stat"))?;
        let prefix = format!("{field}=");
        Ok(t.lines()
            .filter(|l| l.starts_with(&key))
            .flat_map(|l| l.split_whitespace())
            .find_map(|kv| kv.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
            .unwrap_or(0))
    }

    /// The cgroup's id, as the programs key their counts: its directory's inode (kernfs).
    pub(super) fn id(&self) -> Result<u64> {
        Ok(std::fs::metadata(&self.dir)
            .with_context(|| format!("cannot read cgroup {}", self.dir.display()))?
            .ino())
    }

    /// The cgroup's own count of its bios in direction `field` (`wios`, `rios`) on `dev`,
    /// where the kernel keeps one whatever the limits: v2 io.stat (every bio and split piece).
    /// `None` on v1, whose per-cgroup counts are blk-throttle's.
    pub(super) fn own_ios(&self, dev: &Device, field: &str) -> Result<Option<u64>> {
        match self.hierarchy {
            Hierarchy::V1 => Ok(None),
            Hierarchy::V2 => self.io_stat(dev, field).map(Some),
        }
    }

    /// Bios blk-throttle saw for writes on `dev`: v1 `io_serviced` (every pass), v2 io.stat wios.
    pub(super) fn write_ios(&self, dev: &Device) -> Result<u64> {
        let key = format!("{}:{}", dev.major, dev.minor);
        match self.hierarchy {
            Hierarchy::V1 => {
                let t = std::fs::read_to_string(self.dir.join("blkio.throttle.io_serviced"))?;
                Ok(t.lines()
                    .find_map(|l| {
                        l.strip_prefix(&format!("{key} Write "))
                            .and_then(|v| v.trim().parse().ok())
                    })
                    .unwrap_or(0))
            }
            Hierarchy::V2 => self.io_stat(dev, "wios"),
        }
    }
}

impl Drop for DemoCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One run of the workload, as mergetrace counted its cgroup and as the kernel did.
pub(super) struct Arm {
    pub(super) label: String,
    /// The 4 KiB writes the workload submitted, one bio each.
    pub(super) ios: u64,
    /// mergetrace's counts of the arm's cgroup, writes on the scratch disk.
    pub(super) counts: Counts,
    /// The scratch disk's /proc/diskstats over the arm.
    pub(super) disk: DiskStats,
    pub(super) secs: f64,
    /// The cgroup's io.stat `wios` over the arm (cgroup v2).
    pub(super) cgroup_wios: Option<u64>,
    /// Throttled arms: blk-throttle's own count of write bios (io_serviced / io.stat).
    pub(super) kernel_charged: Option<u64>,
    /// io.cost arms: what io.cost charged, mergetrace's and io.stat's.
    pub(super) iocost: Option<IocostCheck>,
}

/// An io.cost arm's charge, mergetrace's against io.stat's `cost.usage`, and the bound of the
/// kernel's rounding: it floors each period's sum to whole µs, so `cost.usage` is below the
/// exact charge by less than one µs per period.
#[derive(Debug, Clone, Copy)]
pub(super) struct IocostCheck {
    pub(super) ours_us: f64,
    pub(super) kernel_us: u64,
    pub(super) periods: f64,
    /// The arm's writes per second (its last write left out).
    pub(super) iops: f64,
    /// The share of io.cost's budget the arm's writes used: device time charged per second
    /// (one cgroup alone at vrate 100 % may use a second a second). Near 100 %, io.cost held
    /// the arm; well below, the machine did.
    pub(super) busy_pct: f64,
}

impl IocostCheck {
    pub(super) fn holds(&self) -> bool {
        (0.0..self.periods.ceil() + 1.0).contains(&(self.ours_us - self.kernel_us as f64))
    }
}

impl Arm {
    pub(super) fn avg_request_kib(&self) -> f64 {
        let r = self.counts.requests();
        if r == 0 {
            0.0
        } else {
            self.counts.issue_bytes as f64 / r as f64 / 1024.0
        }
    }

    /// Mismatches between mergetrace and the kernel's counters (or the workload's own count),
    /// as sentences naming the arm, the count and both numbers.
    pub(super) fn mismatches(&self) -> Vec<String> {
        let c = &self.counts;
        let mut out = Vec::new();
        let mut cmp = |what: &str, ours: u64, source: &str, theirs: u64| {
            out.extend(mismatch(&self.label, what, ours, source, theirs));
        };
        cmp(
            "bios",
            c.bios_per_request(),
            "the workload submitted",
            self.ios,
        );
        cmp(
            "device requests",
            c.requests(),
            "/proc/diskstats writes",
            self.disk.writes,
        );
        cmp(
            "merged bios",
            c.merged_per_request(),
            "/proc/diskstats write merges",
            self.disk.writes_merged,
        );
        cmp(
            "sectors",
            c.issue_bytes / 512,
            "/proc/diskstats sectors written",
            self.disk.write_sectors,
        );
        if let Some(k) = self.cgroup_wios {
            cmp(
                "bios and split pieces",
                c.bios_per_request() + c.splits,
                "the cgroup's io.stat wios",
                k,
            );
        }
        if let Some(k) = self.kernel_charged {
            cmp("charged ios", c.charged_ios, "blk-throttle's own count", k);
        }
        if let Some(i) = self.iocost.filter(|i| !i.holds()) {
            out.push(format!(
                "{}: io.cost charge mergetrace {:.1} µs ≠ io.stat cost.usage {} µs (allowed: \
                 0 to {:.0} µs above it, one per period)",
                self.label,
                i.ours_us,
                i.kernel_us,
                i.periods.ceil() + 1.0
            ));
        }
        out
    }

    /// Adds a second run of the workload to the arm (a last write that makes io.cost flush).
    pub(super) fn add(&mut self, o: &Arm) {
        self.ios += o.ios;
        self.counts.add(&o.counts);
        self.cgroup_wios = self.cgroup_wios.zip(o.cgroup_wios).map(|(a, b)| a + b);
        self.disk.writes += o.disk.writes;
        self.disk.writes_merged += o.disk.writes_merged;
        self.disk.write_sectors += o.disk.write_sectors;
    }
}

/// "ARM: WHAT: mergetrace counted N, SOURCE M" when the two differ.
pub(super) fn mismatch(
    arm: &str,
    what: &str,
    ours: u64,
    source: &str,
    theirs: u64,
) -> Option<String> {
    (ours != theirs).then(|| {
        format!(
            "{arm}: {what}: mergetrace counted {}, {source} {}",
            fmt::thousands(ours),
            fmt::thousands(theirs)
        )
    })
}

pub(super) struct Lab {
    pub(super) session: Session,
    pub(super) disk: ScratchDisk,
    pub(super) exe: PathBuf,
    tier: TierChoice,
}

impl Lab {
    /// A scratch disk of `bytes`, traced with in-kernel counting on `tier`.
    pub(super) fn start(bytes: u64, tier: TierChoice) -> Result<Lab> {
        let disk = ScratchDisk::new(bytes)?;
        eprintln!(
            "mergetrace demo: scratch disk {} ({}:{}) on {}",
            disk.dev.name,
            disk.dev.major,
            disk.dev.minor,
            disk.backing.display()
        );
        let session = Lab::trace(&disk.dev, tier)?;
        eprintln!("mergetrace demo: tracing on the {}", session.tier);
        Ok(Lab {
            session,
            disk,
            exe: std::env::current_exe()?,
            tier,
        })
    }

    fn trace(dev: &Device, tier: TierChoice) -> Result<Session> {
        Session::start(
            std::slice::from_ref(dev),
            &kernel::Options {
                ring_bytes: 4096,
                tier,
                modes: Modes::COUNTING,
                meter_units: aggregate::meter_units(&aggregate::DEFAULT_METER_UNITS),
                stats: false,
                ebpf_log: false,
                reclaim_after: std::time::Duration::from_secs(5),
                // The throttled arm sets its limit after the start: count its charges.
                // The latency arm reads the request latency histograms.
                wants: kernel::Wants {
                    bios: true,
                    throttle: true,
                    latency: true,
                    ..Default::default()
                },
                hooks_only: false,
                every_disk: false,
            },
        )
    }

    /// Detaches the programs and loads them again: they learn the disk's io.cost state when
    /// they load.
    pub(super) fn retrace(&mut self) -> Result<()> {
        self.session.detach();
        self.session = Lab::trace(&self.disk.dev, self.tier)?;
        Ok(())
    }

    /// Runs the workload in a child process in `cgroup` (from byte `offset`); the in-kernel
    /// counters before and after it tell what it did.
    pub(super) fn run(
        &mut self,
        label: &str,
        (ios, batch, offset): (u64, usize, u64),
        cgroup: &DemoCgroup,
    ) -> Result<Arm> {
        check_interrupted()?;
        eprintln!("mergetrace demo: {label} …");
        let counted_before = self.session.read_totals()?;
        let before = DiskStats::read(self.disk.dev.major, self.disk.dev.minor)?;
        let wios_before = cgroup.own_ios(&self.disk.dev, "wios")?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("__workload")
            .arg("--target")
            .arg(&self.disk.path)
            .args(["--ios", &ios.to_string(), "--batch", &batch.to_string()])
            .args(["--offset", &offset.to_string()])
            .arg("--cgroup")
            .arg(&cgroup.dir)
            .stdout(Stdio::null());
        let started = Instant::now();
        let mut child: Child = cmd.spawn().context("cannot start the workload")?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let secs = started.elapsed().as_secs_f64();
        if !status.success() {
            bail!("the workload failed in arm {label} ({status})");
        }
        // The I/O has completed, so the programs have counted all of it.
        let w = self.session.read_totals()?.since(&counted_before);
        // A cgroup's birth or removal report lost (cgroups made elsewhere on the machine
        // while the demo runs) costs a name, never a count; a completion the kernel did not
        // run the programs for costs a device latency, which only the latency arm checks.
        let lost: u64 = w
            .lost_by_kind
            .iter()
            .filter(|(kind, _)| {
                let kind = u32::from(**kind);
                kind != mergetrace_common::LOST_CGROUP_NAMES
                    && kind != mergetrace_common::LOST_COMPLETION_UNSEEN
            })
            .map(|(_, n)| n)
            .sum();
        if lost > 0 {
            bail!("{lost} events were lost in arm {label}: the self-check cannot hold");
        }
        let key = Key {
            dev: self.disk.dev.dev().0,
            cgroup_id: cgroup.id()?,
            dir: Dir::Write,
        };
        let counts = w.counts.get(&key).copied().unwrap_or_default();
        let disk = DiskStats::read(self.disk.dev.major, self.disk.dev.minor)?.since(&before);
        let wios_after = cgroup.own_ios(&self.disk.dev, "wios")?;
        Ok(Arm {
            label: label.to_string(),
            ios,
            counts,
            disk,
            secs,
            cgroup_wios: wios_after.zip(wios_before).map(|(a, b)| a - b),
            kernel_charged: None,
            iocost: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arm as the demo's batch-32 arm counts it: 16,384 bios into 512 requests of 128 KiB,
    /// equal to the kernel's counts.
    fn batch_32() -> Arm {
        let mut counts = Counts {
            rq_bios: 16_384,
            issues: 512,
            issue_bytes: 64 << 20,
            ..Counts::default()
        };
        counts.merges_at[0] = 15_872;
        Arm {
            label: "batch 32".into(),
            ios: 16_384,
            counts,
            disk: DiskStats {
                writes: 512,
                writes_merged: 15_872,
                write_sectors: 131_072,
                ..DiskStats::default()
            },
            secs: 1.0,
            cgroup_wios: Some(16_384),
            kernel_charged: None,
            iocost: None,
        }
    }

    #[test]
    fn an_arm_equal_to_the_kernel_has_no_mismatch() {
        assert_eq!(batch_32().mismatches(), Vec::<String>::new());
    }

    #[test]
    fn a_mismatch_names_the_arm_the_count_and_both_numbers() {
        let mut arm = batch_32();
        arm.disk.writes = 513;
        arm.cgroup_wios = Some(16_385);
        arm.kernel_charged = Some(7);
        assert_eq!(
            arm.mismatches(),
            [
                "batch 32: device requests: mergetrace counted 512, /proc/diskstats writes 513",
                "batch 32: bios and split pieces: mergetrace counted 16,384, the cgroup's io.stat \
                 wios 16,385",
                "batch 32: charged ios: mergetrace counted 0, blk-throttle's own count 7",
            ]
        );
        // Reads of the disk by others change no count the arm is checked against.
        let mut arm = batch_32();
        arm.disk.reads = 4_096;
        arm.disk.reads_merged = 17;
        assert!(arm.mismatches().is_empty());
        let mut arm = batch_32();
        arm.ios = 16_383;
        assert_eq!(
            arm.mismatches(),
            ["batch 32: bios: mergetrace counted 16,384, the workload submitted 16,383"]
        );
    }
}
