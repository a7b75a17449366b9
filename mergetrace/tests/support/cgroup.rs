//! cgroups: v1 blkio (this host) or v2 io (the lab), their limits and blk-cgroup's counters.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
    thread,
    time::Duration,
};

use super::*;

/// Which cgroup hierarchy carries blk-throttle here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The v1 blkio hierarchy: `blkio.throttle.*_device` limits and counters.
    V1,
    /// The unified hierarchy with the io controller: `io.max` limits, `io.stat` counters.
    V2,
}

/// The hierarchy the tests use and its mount, chosen as mergetrace chooses it
/// (`cgroups::io_hierarchy`): the v1 blkio mount if there is one, otherwise the first cgroup2
/// mount. Panics (never skips) when there is neither.
pub fn cgroup_hierarchy() -> &'static (CgroupVersion, PathBuf) {
    detect_cgroup_hierarchy().as_ref().unwrap_or_else(|| {
        panic!("no cgroup v1 blkio or cgroup v2 hierarchy is mounted (these tests need one)")
    })
}

pub(super) fn detect_cgroup_hierarchy() -> &'static Option<(CgroupVersion, PathBuf)> {
    static H: OnceLock<Option<(CgroupVersion, PathBuf)>> = OnceLock::new();
    H.get_or_init(|| {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
        let mut v2 = None;
        for line in mountinfo.lines() {
            // id parent maj:min root mountpoint opts - fstype source superopts
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mountpoint = PathBuf::from(left.split(' ').nth(4).unwrap_or_default());
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or_default();
            let superopts = r.nth(1).unwrap_or_default();
            if fstype == "cgroup" && superopts.split(',').any(|o| o == "blkio") {
                return Some((CgroupVersion::V1, mountpoint));
            }
            if fstype == "cgroup2" && v2.is_none() {
                v2 = Some(mountpoint);
            }
        }
        v2.map(|root| (CgroupVersion::V2, root))
    })
}

/// A cgroup of its own under the blk-throttle hierarchy's root (v1 blkio or v2, see
/// [`cgroup_hierarchy`]). Removed on drop, after moving any remaining tasks to the root.
///
/// Limits and counters, per version:
/// - limits: v1 `blkio.throttle.{read,write}_{iops,bps}_device` "MAJ:MIN N"; v2 `io.max`
///   "MAJ:MIN riops=N wiops=N rbps=N wbps=N" (the `set_*` methods write either).
/// - [`Cgroup::io_serviced`] / [`Cgroup::io_service_bytes`] are blk-cgroup's own per-cgroup
///   counts of the bios it submitted to a device, and they are not the same counter on v1 and v2:
///   - v1 `blkio.throttle.io_serviced` is counted in `blk_should_throtl` (6.12;
///     `blk_throtl_bio` before): on every pass of a bio through blk-throttle, *before* it waits,
///     on a device where throttling is active (a rule on any group of that device), whether
///     or not this group has a rule. A split remainder passes again: +1 io, +0 bytes.
///   - v2 `io.stat` `rios`/`wios`/`dios` (bytes `rbytes`/`wbytes`/`dbytes`) is counted in
///     `blk_cgroup_bio_start`, from `submit_bio_noacct_nocheck`: *after* blk-throttle let the
///     bio through, on every device, throttled or not; not for the root cgroup. A split
///     remainder is resubmitted through `submit_bio_noacct` and counted again as an io (its
///     bytes not: `BIO_CGROUP_ACCT`), on 6.1 and 6.12 alike (block/blk-cgroup.c,
///     block/blk-merge.c) — so once all I/O has drained, both count bios + split remainders.
///
///   While bios still wait in the throttle, v1 has counted them and v2 has not yet: compare
///   deltas only after the workload finished.
#[derive(Debug)]
pub struct Cgroup {
    /// e.g. "mt-test-123-4", "mt-test-123-4/mt-test-123-5"
    pub name: String,
    pub dir: PathBuf,
}

/// Per-direction counts of one cgroup and device: v1 `blkio.throttle.io_serviced` /
/// `io_service_bytes`, or the matching v2 `io.stat` fields (`sync`, `async_` and `total` stay
/// 0 on v2 except `total` = read + write + discard).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlkioStat {
    pub read: u64,
    pub write: u64,
    pub sync: u64,
    pub async_: u64,
    pub discard: u64,
    pub total: u64,
}

impl Cgroup {
    pub fn new() -> Cgroup {
        let (version, root) = cgroup_hierarchy();
        match version {
            CgroupVersion::V1 => assert!(
                root.join("cgroup.procs").exists(),
                "{} is not a cgroup v1 blkio hierarchy (these tests need it)",
                root.display()
            ),
            CgroupVersion::V2 => enable_io_controller(root),
        }
        let name = unique_name();
        let dir = root.join(&name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Cgroup { name, dir }
    }

    pub fn version(&self) -> CgroupVersion {
        cgroup_hierarchy().0
    }

    /// The path mergetrace reports: relative to the hierarchy's mount, e.g. "/mt-test-123-4".
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    pub fn add_pid(&self, pid: u32) {
        write_sysfs(&self.procs_file(), &pid.to_string());
    }

    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sets one limit, named by its v1 file (`blkio.throttle.write_iops_device`, ...): on v1
    /// writes `"MAJ:MIN value"` to that file, on v2 `"MAJ:MIN wiops=value"` (the matching
    /// key) to `io.max`.
    pub fn set_device_limit(&self, file: &str, dev: &BlockDev, value: u64) {
        match self.version() {
            CgroupVersion::V1 => {
                write_sysfs(&self.dir.join(file), &format!("{} {value}", dev.maj_min()))
            }
            CgroupVersion::V2 => {
                let key = match file.trim_start_matches("blkio.throttle.") {
                    "read_iops_device" => "riops",
                    "write_iops_device" => "wiops",
                    "read_bps_device" => "rbps",
                    "write_bps_device" => "wbps",
                    other => panic!("no io.max key for the v1 limit file {other}"),
                };
                self.set_io_max(dev, &format!("{key}={value}"));
            }
        }
    }

    /// cgroup v2 only: writes `"MAJ:MIN <limits>"` to `io.max`, e.g. `"wiops=2000 wbps=max"`.
    pub fn set_io_max(&self, dev: &BlockDev, limits: &str) {
        assert_eq!(self.version(), CgroupVersion::V2, "io.max is cgroup v2");
        write_sysfs(
            &self.dir.join("io.max"),
            &format!("{} {limits}", dev.maj_min()),
        );
    }

    pub fn set_write_iops(&self, dev: &BlockDev, iops: u64) {
        self.set_device_limit("blkio.throttle.write_iops_device", dev, iops)
    }
    /// Removes the write IOPS limit (v1: 0; v2: `wiops=max`).
    pub fn clear_write_iops(&self, dev: &BlockDev) {
        match self.version() {
            CgroupVersion::V1 => self.set_write_iops(dev, 0),
            CgroupVersion::V2 => self.set_io_max(dev, "wiops=max"),
        }
    }
    pub fn set_read_iops(&self, dev: &BlockDev, iops: u64) {
        self.set_device_limit("blkio.throttle.read_iops_device", dev, iops)
    }
    pub fn set_write_bps(&self, dev: &BlockDev, bps: u64) {
        self.set_device_limit("blkio.throttle.write_bps_device", dev, bps)
    }
    pub fn set_read_bps(&self, dev: &BlockDev, bps: u64) {
        self.set_device_limit("blkio.throttle.read_bps_device", dev, bps)
    }

    /// v1: parses a `MAJ:MIN Op N` stat file for one device (all zero when the device is
    /// absent).
    pub fn read_stat(&self, file: &str, dev: &BlockDev) -> BlkioStat {
        let text = fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("cannot read {file} of {}: {e}", self.name));
        parse_blkio_stat(&text, &dev.maj_min())
    }

    /// v2: the `io.stat` line of one device as key → value (empty when the device is absent,
    /// e.g. before the cgroup's first bio on it).
    pub fn io_stat(&self, dev: &BlockDev) -> std::collections::BTreeMap<String, u64> {
        let text = fs::read_to_string(self.dir.join("io.stat"))
            .unwrap_or_else(|e| panic!("cannot read io.stat of {}: {e}", self.name));
        parse_io_stat(&text, &dev.maj_min())
    }

    fn io_stat_dirs(&self, dev: &BlockDev, r: &str, w: &str, d: &str) -> BlkioStat {
        let st = self.io_stat(dev);
        let g = |k: &str| st.get(k).copied().unwrap_or(0);
        BlkioStat {
            read: g(r),
            write: g(w),
            discard: g(d),
            total: g(r) + g(w) + g(d),
            ..Default::default()
        }
    }

    /// Bios per direction blk-cgroup counted for this cgroup on `dev`: v1
    /// `blkio.throttle.io_serviced`, v2 `io.stat` rios/wios/dios. See [`Cgroup`] for where
    /// each is counted (they agree once the I/O drained).
    pub fn io_serviced(&self, dev: &BlockDev) -> BlkioStat {
        match self.version() {
            CgroupVersion::V1 => self.read_stat("blkio.throttle.io_serviced", dev),
            CgroupVersion::V2 => self.io_stat_dirs(dev, "rios", "wios", "dios"),
        }
    }

    /// Bytes per direction: v1 `blkio.throttle.io_service_bytes`, v2 `io.stat`
    /// rbytes/wbytes/dbytes (a bio's bytes once, split or not).
    pub fn io_service_bytes(&self, dev: &BlockDev) -> BlkioStat {
        match self.version() {
            CgroupVersion::V1 => self.read_stat("blkio.throttle.io_service_bytes", dev),
            CgroupVersion::V2 => self.io_stat_dirs(dev, "rbytes", "wbytes", "dbytes"),
        }
    }
}

/// v1: one device's (`MAJ:MIN`) lines of a `MAJ:MIN Op N` stat file (all zero when absent).
pub fn parse_blkio_stat(text: &str, mm: &str) -> BlkioStat {
    let mut s = BlkioStat::default();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 3 || f[0] != mm {
            continue;
        }
        let v: u64 = f[2].parse().unwrap_or(0);
        match f[1] {
            "Read" => s.read = v,
            "Write" => s.write = v,
            "Sync" => s.sync = v,
            "Async" => s.async_ = v,
            "Discard" => s.discard = v,
            "Total" => s.total = v,
            _ => {}
        }
    }
    s
}

/// v2: one device's (`MAJ:MIN`) `io.stat` line as key → value (empty when absent).
pub fn parse_io_stat(text: &str, mm: &str) -> std::collections::BTreeMap<String, u64> {
    text.lines()
        .filter(|l| l.split_whitespace().next() == Some(mm))
        .flat_map(|l| l.split_whitespace().skip(1))
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// cgroup v2: a child of `parent` has io.max / io.stat only while `io` is in the parent's
/// `cgroup.subtree_control`; turn it on if it is not (the lab's /init does it for the root).
fn enable_io_controller(parent: &Path) {
    let control = parent.join("cgroup.subtree_control");
    let on = |p: &Path| {
        fs::read_to_string(p)
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "io")
    };
    if on(&control) {
        return;
    }
    let available = fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    assert!(
        available.split_whitespace().any(|c| c == "io"),
        "the io controller is not available in {} (cgroup.controllers: {available:?}); the \
         throttle tests need cgroup v2 io (or v1 blkio)",
        parent.display()
    );
    // Racing tests may enable it at the same time: only the end state matters.
    let _ = fs::write(&control, "+io");
    assert!(
        on(&control),
        "cannot enable the io controller in {}",
        control.display()
    );
}

pub(super) fn remove_cgroup_dir(dir: &Path) -> std::io::Result<()> {
    let root_procs = cgroup_hierarchy().1.join("cgroup.procs");
    let mut last = Ok(());
    for _ in 0..50 {
        // Move anything still inside out first (a cgroup with tasks cannot be removed).
        if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().map(str::trim).filter(|p| !p.is_empty()) {
                let _ = fs::write(&root_procs, pid);
            }
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Err(e),
        }
        thread::sleep(Duration::from_millis(100));
    }
    last
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = remove_cgroup_dir(&self.dir) {
            eprintln!(
                "warning: could not remove cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

impl Cgroup {
    /// A child cgroup inside this one (`<parent>/<unique name>`). Declare it after the
    /// parent so it is dropped (removed) first.
    pub fn child(&self) -> Cgroup {
        self.child_named(&unique_name())
    }

    /// v2: turns the io controller on for this cgroup's children, which otherwise charge
    /// their I/O to this one (v1: nothing to do, every cgroup has blkio).
    pub fn enable_io_for_children(&self) {
        if self.version() == CgroupVersion::V2 {
            enable_io_controller(&self.dir);
        }
    }

    /// A child cgroup named `leaf` (`docker-<id>.scope`); removed first like [`Cgroup::child`].
    pub fn child_named(&self, leaf: &str) -> Cgroup {
        self.enable_io_for_children();
        let dir = self.dir.join(leaf);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Cgroup {
            name: format!("{}/{leaf}", self.name),
            dir,
        }
    }
}

/// `blkio.throttle.io_serviced` and `io_service_bytes` of one cgroup and device, so a test
/// can take the delta over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThrottleStats {
    pub ios: BlkioStat,
    pub bytes: BlkioStat,
}

impl Cgroup {
    pub fn throttle_stats(&self, dev: &BlockDev) -> ThrottleStats {
        ThrottleStats {
            ios: self.io_serviced(dev),
            bytes: self.io_service_bytes(dev),
        }
    }
}

impl ThrottleStats {
    /// Write deltas `self - before`: (ios, bytes).
    pub fn write_since(&self, before: &ThrottleStats) -> (u64, u64) {
        self.since(before, |s| s.write)
    }

    /// Read deltas `self - before`: (ios, bytes).
    pub fn read_since(&self, before: &ThrottleStats) -> (u64, u64) {
        self.since(before, |s| s.read)
    }

    fn since(&self, before: &ThrottleStats, dir: impl Fn(&BlkioStat) -> u64) -> (u64, u64) {
        (
            dir(&self.ios)
                .checked_sub(dir(&before.ios))
                .expect("io_serviced went backwards"),
            dir(&self.bytes)
                .checked_sub(dir(&before.bytes))
                .expect("io_service_bytes went backwards"),
        )
    }
}
