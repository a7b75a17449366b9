//! wbt (writeback throttling) on a disk: whether it is on and its latency target. wbt limits
//! how many requests of buffered writes and discards are in flight (`wbt_wait` in
//! `rq_qos_throttle`, for bios that did not merge): it counts requests, after merging, so a
//! bio that merges rides in a slot already taken.
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::sys::{device::Device, release};

/// wbt on one disk, as the run found it when it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wbt {
    /// `queue/wbt_lat_usec`: the read latency target wbt steers by (0 when off, from 6.2).
    pub min_lat_us: u64,
    pub state: WbtState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WbtState {
    On,
    Off,
    /// Before 6.2 `wbt_lat_usec` shows the target even while wbt is off (e.g. under bfq), and
    /// debugfs, which tells, is not mounted.
    Unknown,
}

impl Wbt {
    /// One line for the banner and `check`: whether wbt is on and what it counts.
    pub fn describe(&self) -> String {
        let target = self.target();
        match self.state {
            WbtState::On => format!(
                "wbt is on (latency target {target}): it limits buffered writes and discards \
                 in flight by request, after merging — a bio that merges rides in a request \
                 already let through, so merging lets more bytes through the same depth"
            ),
            WbtState::Off => "wbt is off".to_string(),
            WbtState::Unknown => format!(
                "wbt: latency target {target}, but this kernel (before 6.2) shows the target even \
                 when wbt is off; mount debugfs (mount -t debugfs none /sys/kernel/debug) to tell"
            ),
        }
    }

    /// The latency target as the verdict says it: "2 ms", "75 ms", "500 µs".
    pub fn target(&self) -> String {
        crate::fmt::latency_us(self.min_lat_us)
    }

    pub fn on(&self) -> bool {
        self.state == WbtState::On
    }
}

/// wbt on `dev`; `None` where the queue has none (no `wbt_lat_usec`: a bio-based device, or a
/// kernel built without `CONFIG_BLK_WBT`).
pub fn of(dev: &Device) -> Option<Wbt> {
    at(
        &Path::new("/sys/block").join(&dev.name),
        &Path::new("/sys/kernel/debug/block").join(&dev.name),
        &release::running(),
    )
}

/// wbt from a disk's sysfs directory and its debugfs directory.
pub fn at(sysfs: &Path, debugfs: &Path, release: &str) -> Option<Wbt> {
    let number = |p: &Path| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let min_lat_us = number(&sysfs.join("queue/wbt_lat_usec"))?;
    // debugfs `rqos/wbt/enabled` is `enable_state` (1 on by default, 2 on by hand, 3 and 4
    // off); before 6.2 wbt is also off while `wb_normal` is 0 (`rwb_enabled`).
    let rqos = debugfs.join("rqos/wbt");
    let state = match number(&rqos.join("enabled")) {
        Some(1 | 2) if number(&rqos.join("wb_normal")) != Some(0) => WbtState::On,
        Some(_) => WbtState::Off,
        None if min_lat_us == 0 => WbtState::Off,
        None if release::before(release, 6, 2) => WbtState::Unknown,
        None => WbtState::On,
    };
    Some(Wbt { min_lat_us, state })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_from_sysfs_and_debugfs() {
        let dir = std::env::temp_dir().join(format!("mt-wbt-{}", std::process::id()));
        let (sys, dbg) = (dir.join("sys"), dir.join("dbg"));
        std::fs::create_dir_all(sys.join("queue")).unwrap();
        let write = |p: &Path, v: &str| std::fs::write(p, v).unwrap();
        assert_eq!(at(&sys, &dbg, "6.12.0"), None, "no wbt_lat_usec: no wbt");
        write(&sys.join("queue/wbt_lat_usec"), "2000\n");
        let on = at(&sys, &dbg, "6.18.44").unwrap();
        assert_eq!((on.min_lat_us, on.state), (2000, WbtState::On));
        assert!(on.describe().starts_with("wbt is on (latency target 2 ms)"));
        assert_eq!(at(&sys, &dbg, "6.1.0-57").unwrap().state, WbtState::Unknown);
        write(&sys.join("queue/wbt_lat_usec"), "0\n");
        assert_eq!(at(&sys, &dbg, "6.12.0").unwrap().state, WbtState::Off);
        // debugfs decides where it is mounted.
        write(&sys.join("queue/wbt_lat_usec"), "75000\n");
        std::fs::create_dir_all(dbg.join("rqos/wbt")).unwrap();
        write(&dbg.join("rqos/wbt/enabled"), "1\n");
        write(&dbg.join("rqos/wbt/wb_normal"), "16\n");
        assert_eq!(at(&sys, &dbg, "6.1.0").unwrap().state, WbtState::On);
        write(&dbg.join("rqos/wbt/wb_normal"), "0\n");
        assert_eq!(at(&sys, &dbg, "6.1.0").unwrap().state, WbtState::Off);
        write(&dbg.join("rqos/wbt/enabled"), "3\n");
        assert_eq!(at(&sys, &dbg, "6.1.0").unwrap().state, WbtState::Off);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
