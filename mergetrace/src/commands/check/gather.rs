//! Reading what `check` judges from the running system: the device's queue settings, its
//! `/proc/diskstats` line, the uptime, the cgroups with throttle limits on it, and the kernel.
use std::path::{Path, PathBuf};

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
    /// `None` when the device has no line in `/proc/diskstats`.
    pub diskstats: Option<DiskStats>,
    pub uptime_secs: Option<f64>,
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

/// Reads everything `findings` needs for `device` from the running system.
pub fn gather(device: Device) -> Result<CheckInput> {
    let queue = QueueSettings::read(&device)?;
    let diskstats = std::fs::read_to_string("/proc/diskstats")
        .ok()
        .and_then(|t| find_diskstats(&t, device.major, device.minor));
    let uptime_secs = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| parse_uptime(&t));
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
        uptime_secs,
        io_hierarchy,
        throttled,
        env,
    })
}

/// Seconds since boot from `/proc/uptime`.
pub fn parse_uptime(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
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
    fn uptime() {
        assert_eq!(parse_uptime("41242.17 1720.41\n"), Some(41242.17));
        assert_eq!(parse_uptime(""), None);
    }

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
