//! The blk-throttle limits in force for a cgroup on one device: its own and those it inherits
//! from its ancestors (a bio is limited at every level that has a rule: the tightest one
//! binds). What each cgroup's files set is read in [`crate::sys::throttle`].
use serde::Serialize;

use crate::sys::cgroups::Hierarchy;
pub use crate::sys::throttle::{LimitKind, Limits};

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

/// Limits in force for cgroup `path`, given what each cgroup sets itself (`own(path)`): along
/// [`crate::sys::throttle::binding_path`].
pub fn effective_along(
    hierarchy: Hierarchy,
    path: &str,
    own: impl Fn(&str) -> Limits,
) -> Effective {
    let chain: Vec<(String, Limits)> = crate::sys::throttle::binding_path(hierarchy, path)
        .into_iter()
        .map(|p| {
            let l = own(&p);
            (p, l)
        })
        .collect();
    effective(&chain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Limits in force for cgroup `path` from the files under `mount`.
    fn effective_for(h: Hierarchy, mount: &Path, path: &str, major: u32, minor: u32) -> Effective {
        effective(&crate::sys::throttle::chain(h, mount, path, major, minor))
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
