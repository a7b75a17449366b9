//! Reading what `check` judges from the running system: the device's queue settings, its
//! `/proc/diskstats` line (and how it moved over a short sample), the cgroups with throttle
//! limits on it, and the kernel.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::Serialize;

use super::environment::KernelEnv;
use crate::{
    model::limits::Limits,
    sys::{
        cgroups::{self, Hierarchy},
        device::Device,
        diskstats::{find_diskstats, DiskStats},
        iocost::{self, Iocost},
        iolatency,
        queue::QueueSettings,
        wbt::{self, Wbt},
    },
};

/// Everything `findings` judges.
#[derive(Debug, Clone)]
pub struct CheckInput {
    pub device: Device,
    pub queue: QueueSettings,
    /// `None` when the device has no line in `/proc/diskstats`. Read at the end of the sample.
    pub diskstats: Option<DiskStats>,
    /// How the line moved over the sample (`None`: no sample taken, or no line).
    pub sample: Option<Sample>,
    /// The hierarchy hosting the io controller and its mount (`None`: none mounted).
    pub io_hierarchy: Option<(Hierarchy, PathBuf)>,
    pub throttled: Vec<ThrottledCgroup>,
    /// io.cost on the device (cgroup v2 only), when enabled.
    pub iocost: Option<Iocost>,
    /// wbt on the device (`None`: the queue has none).
    pub wbt: Option<Wbt>,
    /// io.latency on the device (`None`: no io hierarchy mounted).
    pub iolatency: Option<iolatency::State>,
    pub env: KernelEnv,
}

impl CheckInput {
    /// No request queue: nothing merges, and the queue's merge settings do not apply.
    pub fn bio_based(&self) -> bool {
        self.device.bio_based || self.queue.bio_based()
    }
}

/// The device's `/proc/diskstats` counters over a short sample: what it does now, over a window
/// known to the millisecond (the counters' own start is not: [`super::findings`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The time between the two reads.
    pub seconds: f64,
    /// The counters' growth over it.
    pub diskstats: DiskStats,
}

fn read_diskstats(device: &Device) -> Option<DiskStats> {
    std::fs::read_to_string("/proc/diskstats")
        .ok()
        .and_then(|t| find_diskstats(&t, device.major, device.minor))
}

/// Reads everything `findings` needs for `device` from the running system, watching its
/// counters for `sample` (none when zero).
pub fn gather(device: Device, sample: Duration) -> Result<CheckInput> {
    let queue = QueueSettings::read(&device)?;
    let (diskstats, sample) = if sample.is_zero() {
        (read_diskstats(&device), None)
    } else {
        let start = Instant::now();
        let before = read_diskstats(&device);
        std::thread::sleep(sample);
        let after = read_diskstats(&device);
        let seconds = start.elapsed().as_secs_f64();
        let sample = match (&before, &after) {
            (Some(b), Some(a)) => Some(Sample {
                seconds,
                diskstats: a.since(b),
            }),
            _ => None,
        };
        (after, sample)
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let io_hierarchy = cgroups::io_hierarchy(&mountinfo);
    let throttled = io_hierarchy
        .as_ref()
        .map(|(h, m)| throttled_cgroups(*h, m, device.major, device.minor))
        .unwrap_or_default();
    let iocost = match &io_hierarchy {
        Some((Hierarchy::V2, mount)) => iocost::at(mount, &device, &crate::sys::release::running()),
        _ => None,
    };
    let env = KernelEnv::read(&mountinfo);
    let iolatency = io_hierarchy
        .as_ref()
        .map(|(h, m)| iolatency::state(*h, m, &device, env.iolatency));
    Ok(CheckInput {
        iocost,
        wbt: wbt::of(&device),
        iolatency,
        device,
        queue,
        diskstats,
        sample,
        io_hierarchy,
        throttled,
        env,
    })
}

/// A cgroup with its own throttle limit(s) on the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThrottledCgroup {
    pub hierarchy: Hierarchy,
    /// Relative to the hierarchy's mount, "/" for the root.
    pub path: String,
    pub limits: Limits,
}

/// Every cgroup under `mount` whose own files limit device `maj:min`, sorted by path.
pub fn throttled_cgroups(
    hierarchy: Hierarchy,
    mount: &Path,
    major: u32,
    minor: u32,
) -> Vec<ThrottledCgroup> {
    let mut out = Vec::new();
    for (path, dir) in cgroups::dirs(mount) {
        let own = crate::sys::throttle::own_limits(hierarchy, &dir, major, minor);
        if !own.is_empty() {
            out.push(ThrottledCgroup {
                hierarchy,
                path,
                limits: own,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_cgroup_trees() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("c")).unwrap();
        std::fs::write(root.join("blkio.throttle.read_bps_device"), "7:3 4096\n").unwrap();
        std::fs::write(
            root.join("a/b/blkio.throttle.write_iops_device"),
            "7:3 2000\n7:4 9\n",
        )
        .unwrap();
        std::fs::write(root.join("c/blkio.throttle.write_iops_device"), "7:4 10\n").unwrap();
        let v = throttled_cgroups(Hierarchy::V1, root, 7, 3);
        assert_eq!(
            v.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
            ["/", "/a/b"]
        );
        assert_eq!(v[1].limits.wiops, Some(2000));
        assert_eq!(v[0].limits.rbps, Some(4096));
        std::fs::write(
            root.join("c/io.max"),
            "7:3 rbps=max wbps=max riops=max wiops=300\n",
        )
        .unwrap();
        let v2 = throttled_cgroups(Hierarchy::V2, root, 7, 3);
        assert_eq!(v2.len(), 1);
        assert_eq!((v2[0].path.as_str(), v2[0].limits.wiops), ("/c", Some(300)));
        assert!(throttled_cgroups(Hierarchy::V1, &root.join("nope"), 7, 3).is_empty());
    }
}
