//! blk-throttle limits as the user configured them: cgroup v1 `blkio.throttle.*_device` files
//! and cgroup v2 `io.max`, for one device, with the limits a cgroup inherits from its
//! ancestors (a bio is limited at every level that has a rule: the tightest one binds).
use std::path::Path;

use serde::Serialize;

use crate::sys::cgroups::Hierarchy;

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

/// One limit in force on a cgroup: its value and the cgroup that set it (itself or an ancestor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub limit: u64,
    /// Cgroup path (relative to the mount) whose file sets it.
    pub cgroup: String,
}

/// The limits in force for a cgroup: the tightest of its own and its ancestors', each with
/// where it comes from. A limit not in force is absent from the JSON.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Effective {
    pub rbps: Option<Limit>,
    pub wbps: Option<Limit>,
    pub riops: Option<Limit>,
    pub wiops: Option<Limit>,
}

impl Effective {
    pub fn get(&self, k: LimitKind) -> Option<&Limit> {
        match k {
            LimitKind::Rbps => self.rbps.as_ref(),
            LimitKind::Wbps => self.wbps.as_ref(),
            LimitKind::Riops => self.riops.as_ref(),
            LimitKind::Wiops => self.wiops.as_ref(),
        }
    }
    fn slot(&mut self, k: LimitKind) -> &mut Option<Limit> {
        match k {
            LimitKind::Rbps => &mut self.rbps,
            LimitKind::Wbps => &mut self.wbps,
            LimitKind::Riops => &mut self.riops,
            LimitKind::Wiops => &mut self.wiops,
        }
    }
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        *self == Effective::default()
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

/// Combines a chain of (cgroup path, own limits), root first, into the limits in force for the
/// last one: per limit, the smallest value along the chain (the tightest binds first).
pub fn effective(chain: &[(String, Limits)]) -> Effective {
    let mut e = Effective::default();
    for (path, own) in chain {
        for k in LimitKind::ALL {
            if let Some(v) = own.get(k) {
                let slot = e.slot(k);
                if slot.as_ref().is_none_or(|cur| v < cur.limit) {
                    *slot = Some(Limit {
                        limit: v,
                        cgroup: path.clone(),
                    });
                }
            }
        }
    }
    e
}

/// Limits in force for cgroup `path`, given what each cgroup sets itself (`own(path)`). Only
/// cgroup v2 is hierarchical (the tightest limit along the path binds); on v1 blk-throttle
/// treats every group as a separate root ("the broken flat hierarchy", blk-throttle.c), so a
/// parent's limit does not bind its children.
pub fn effective_along(
    hierarchy: Hierarchy,
    path: &str,
    own: impl Fn(&str) -> Limits,
) -> Effective {
    if hierarchy == Hierarchy::V1 {
        return effective(&[(path.to_string(), own(path))]);
    }
    let mut chain = vec![("/".to_string(), own("/"))];
    let mut prefix = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        prefix.push('/');
        prefix.push_str(part);
        chain.push((prefix.clone(), own(&prefix)));
    }
    effective(&chain)
}

/// Limits in force for cgroup `path` (relative to `mount`) on device `maj:min`, from the files.
pub fn effective_for(
    hierarchy: Hierarchy,
    mount: &Path,
    path: &str,
    major: u32,
    minor: u32,
) -> Effective {
    effective_along(hierarchy, path, |p| {
        own_limits(
            hierarchy,
            &mount.join(p.trim_start_matches('/')),
            major,
            minor,
        )
    })
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
    fn v1_files_and_inheritance() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(
            root.join("a/blkio.throttle.write_iops_device"),
            "7:3 2000\n",
        )
        .unwrap();
        std::fs::write(
            root.join("a/b/blkio.throttle.write_iops_device"),
            "7:3 5000\n",
        )
        .unwrap();
        std::fs::write(
            root.join("a/b/blkio.throttle.write_bps_device"),
            "7:3 8388608\n7:4 1\n",
        )
        .unwrap();
        let e = effective_for(Hierarchy::V1, root, "/a/b", 7, 3);
        // v1 is flat: the parent's tighter wiops does not bind the child
        assert_eq!(
            e.wiops,
            Some(Limit {
                limit: 5000,
                cgroup: "/a/b".into()
            })
        );
        assert_eq!(
            e.wbps,
            Some(Limit {
                limit: 8 << 20,
                cgroup: "/a/b".into()
            })
        );
        assert_eq!(
            effective_for(Hierarchy::V1, root, "/a", 7, 3)
                .wiops
                .unwrap()
                .limit,
            2000
        );
        assert_eq!(e.riops, None);
        assert!(effective_for(Hierarchy::V1, root, "/a/b", 7, 5).is_empty());
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["wiops"]["limit"], 5000);
        assert!(v.get("riops").is_none());
    }

    #[test]
    fn v2_inheritance() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("x/y")).unwrap();
        std::fs::write(
            t.path().join("x/io.max"),
            "254:16 rbps=max wbps=max riops=100 wiops=max\n",
        )
        .unwrap();
        let e = effective_for(Hierarchy::V2, t.path(), "/x/y", 254, 16);
        assert_eq!(
            e.riops,
            Some(Limit {
                limit: 100,
                cgroup: "/x".into()
            })
        );
        assert_eq!(e.wiops, None);
    }
}
