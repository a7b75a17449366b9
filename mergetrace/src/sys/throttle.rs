//! blk-throttle limits as the user configured them: cgroup v1 `blkio.throttle.*_device` files
//! and cgroup v2 `io.max`, what each cgroup sets for one device, and the cgroups whose rules
//! bind a cgroup's bios (its own on v1; on v2 every level of its path). What is in force is
//! combined in [`crate::model::limits`].
use std::path::Path;

use serde::Serialize;

use super::cgroups::Hierarchy;

/// The four limits of one cgroup on one device; `None` = no limit ("max").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Limits {
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
}

/// Which limit of the four.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Rbps,
    Wbps,
    Riops,
    Wiops,
}

impl LimitKind {
    /// Every kind, in the order the files list them.
    pub const ALL: [LimitKind; 4] = [
        LimitKind::Rbps,
        LimitKind::Wbps,
        LimitKind::Riops,
        LimitKind::Wiops,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LimitKind::Rbps => "rbps",
            LimitKind::Wbps => "wbps",
            LimitKind::Riops => "riops",
            LimitKind::Wiops => "wiops",
        }
    }
    pub fn is_iops(self) -> bool {
        matches!(self, LimitKind::Riops | LimitKind::Wiops)
    }
}

impl Limits {
    pub fn get(&self, k: LimitKind) -> Option<u64> {
        match k {
            LimitKind::Rbps => self.rbps,
            LimitKind::Wbps => self.wbps,
            LimitKind::Riops => self.riops,
            LimitKind::Wiops => self.wiops,
        }
    }
    fn slot(&mut self, k: LimitKind) -> &mut Option<u64> {
        match k {
            LimitKind::Rbps => &mut self.rbps,
            LimitKind::Wbps => &mut self.wbps,
            LimitKind::Riops => &mut self.riops,
            LimitKind::Wiops => &mut self.wiops,
        }
    }
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }
}

/// Parses cgroup v2 `io.max` for device `maj:min`: `8:16 rbps=max wbps=1048576 riops=max wiops=2000`.
pub fn parse_io_max(text: &str, major: u32, minor: u32) -> Limits {
    let dev = format!("{major}:{minor}");
    let mut l = Limits::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some(dev.as_str()) {
            continue;
        }
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let kind = match k {
                "rbps" => LimitKind::Rbps,
                "wbps" => LimitKind::Wbps,
                "riops" => LimitKind::Riops,
                "wiops" => LimitKind::Wiops,
                _ => continue,
            };
            *l.slot(kind) = v.parse().ok();
        }
    }
    l
}

/// Parses one cgroup v1 `blkio.throttle.*_device` file: lines `MAJ:MIN VALUE`.
pub fn parse_v1_device_file(text: &str, major: u32, minor: u32) -> Option<u64> {
    let dev = format!("{major}:{minor}");
    text.lines().find_map(|line| {
        let (d, v) = line.split_once(char::is_whitespace)?;
        (d == dev).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The limits a single cgroup directory sets for a device.
pub fn own_limits(hierarchy: Hierarchy, dir: &Path, major: u32, minor: u32) -> Limits {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    match hierarchy {
        Hierarchy::V2 => read("io.max")
            .map(|t| parse_io_max(&t, major, minor))
            .unwrap_or_default(),
        Hierarchy::V1 => {
            let mut l = Limits::default();
            for (kind, file) in [
                (LimitKind::Rbps, "blkio.throttle.read_bps_device"),
                (LimitKind::Wbps, "blkio.throttle.write_bps_device"),
                (LimitKind::Riops, "blkio.throttle.read_iops_device"),
                (LimitKind::Wiops, "blkio.throttle.write_iops_device"),
            ] {
                *l.slot(kind) = read(file).and_then(|t| parse_v1_device_file(&t, major, minor));
            }
            l
        }
    }
}

/// Whether any cgroup of the io/blkio hierarchy sets a blk-throttle limit on any of
/// `devices`: then blk-throttle charges their bios, and a run counts each bio (its charge,
/// whether it waited). A walk of the hierarchy reading each cgroup's limit files; false where
/// there is no hierarchy.
pub fn rules_on(devices: &[crate::sys::device::Device]) -> bool {
    let Ok(cgroups) = crate::sys::cgroups::Cgroups::discover() else {
        return false;
    };
    let found = cgroups.all().any(|(_, path)| {
        let dir = cgroups.mount.join(path.trim_start_matches('/'));
        devices
            .iter()
            .any(|d| !own_limits(cgroups.hierarchy, &dir, d.major, d.minor).is_empty())
    });
    found
}

/// The cgroups whose limits bind cgroup `path`'s bios, root first. Only cgroup v2 is
/// hierarchical (every level with a rule charges the bio; the tightest binds); on v1
/// blk-throttle treats every group as a separate root ("the broken flat hierarchy",
/// blk-throttle.c), so a parent's limit does not bind its children.
pub fn binding_path(hierarchy: Hierarchy, path: &str) -> Vec<String> {
    if hierarchy == Hierarchy::V1 {
        return vec![path.to_string()];
    }
    let mut out = vec!["/".to_string()];
    let mut prefix = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        prefix.push('/');
        prefix.push_str(part);
        out.push(prefix.clone());
    }
    out
}

/// What each cgroup of [`binding_path`] sets for disk `maj:min`, from the files under `mount`.
pub fn chain(
    hierarchy: Hierarchy,
    mount: &Path,
    path: &str,
    major: u32,
    minor: u32,
) -> Vec<(String, Limits)> {
    binding_path(hierarchy, path)
        .into_iter()
        .map(|p| {
            let own = own_limits(
                hierarchy,
                &mount.join(p.trim_start_matches('/')),
                major,
                minor,
            );
            (p, own)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_max_lines() {
        let t = "8:0 rbps=max wbps=max riops=max wiops=max\n254:16 rbps=max wbps=1048576 riops=max wiops=2000\n";
        let l = parse_io_max(t, 254, 16);
        assert_eq!(
            l,
            Limits {
                rbps: None,
                wbps: Some(1 << 20),
                riops: None,
                wiops: Some(2000)
            }
        );
        assert!(parse_io_max(t, 8, 0).is_empty());
        assert!(parse_io_max("", 8, 0).is_empty());
    }

    #[test]
    fn only_v2_binds_along_the_path() {
        assert_eq!(binding_path(Hierarchy::V1, "/a/b"), ["/a/b"]);
        assert_eq!(binding_path(Hierarchy::V2, "/a/b"), ["/", "/a", "/a/b"]);
        assert_eq!(binding_path(Hierarchy::V2, "/"), ["/"]);
    }
}
