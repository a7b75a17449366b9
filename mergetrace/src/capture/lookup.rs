//! Answers the snapshot's questions (cgroup names, limits in force) from a capture's header,
//! the way the live cgroup tree answers them during a live run.
use std::collections::HashMap;

use crate::{
    model::limits::{self, Effective, Limits},
    model::meter::SplitLimits,
    model::snapshot::Lookup,
    sys::cgroups::{CgroupName, Hierarchy},
    sys::container::{self, ReadableName},
    sys::device::Device,
};

use super::header::Header;

pub struct HeaderLookup {
    hierarchy: Hierarchy,
    names: HashMap<u64, String>,
    /// cgroup path → its readable name as the recording machine read it.
    readable: HashMap<String, ReadableName>,
    /// (major, minor) → cgroup path → the limits it sets itself.
    own: HashMap<(u32, u32), HashMap<String, Limits>>,
    /// (major, minor) → the queue limits that split bios, at the start.
    split_limits: HashMap<(u32, u32), SplitLimits>,
}

impl HeaderLookup {
    pub fn new(h: &Header) -> HeaderLookup {
        let mut own: HashMap<(u32, u32), HashMap<String, Limits>> = HashMap::new();
        for l in &h.limits {
            own.entry((l.major, l.minor))
                .or_default()
                .insert(l.cgroup.clone(), l.limits());
        }
        HeaderLookup {
            hierarchy: if h.cgroup_hierarchy == "v1" {
                Hierarchy::V1
            } else {
                Hierarchy::V2
            },
            names: h.cgroups.iter().map(|c| (c.id, c.path.clone())).collect(),
            readable: h
                .cgroups
                .iter()
                .filter_map(|c| Some((c.path.clone(), c.name.clone()?)))
                .collect(),
            own,
            split_limits: h
                .devices
                .iter()
                .map(|d| ((d.major, d.minor), d.queue.split_limits()))
                .collect(),
        }
    }
}

impl Lookup for HeaderLookup {
    /// The name the recording machine read (its runtimes' files named the container), else
    /// what the path says (captures before mergetrace 0.2).
    fn readable(&mut self, path: &str) -> Option<ReadableName> {
        self.readable
            .get(path)
            .cloned()
            .or_else(|| container::readable(path))
    }

    fn split_limits(&mut self, dev: &Device) -> SplitLimits {
        self.split_limits
            .get(&(dev.major, dev.minor))
            .copied()
            .unwrap_or_default()
    }

    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        match (id, self.names.get(&id)) {
            (0, _) => CgroupName {
                path: "(none)".into(),
                gone: false,
            },
            (_, Some(p)) => CgroupName {
                path: p.clone(),
                gone: false,
            },
            // Created after the capture started: its name was not recorded.
            (_, None) => CgroupName {
                path: format!("(unknown cgroup id {id})"),
                gone: true,
            },
        }
    }

    fn limits(&mut self, cgroup: &str, dev: &Device) -> Effective {
        if !cgroup.starts_with('/') {
            return Effective::default();
        }
        let Some(own) = self.own.get(&(dev.major, dev.minor)) else {
            return Effective::default();
        };
        limits::effective_along(self.hierarchy, cgroup, |p| {
            own.get(p).copied().unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{RecordedCgroup, RecordedLimits};
    use crate::model::limits::Limit;

    #[test]
    fn capture_header_lookup_gives_the_names_the_recording_machine_read() {
        let path = format!("/libpod_parent/libpod-{}", "ad".repeat(32));
        let mut name = crate::sys::container::readable(&path).unwrap();
        name.container_name = Some("web".into());
        name.refresh_short();
        let h = Header {
            cgroups: vec![RecordedCgroup {
                id: 7,
                path: path.clone(),
                name: Some(name),
            }],
            ..Header::default()
        };
        let mut l = HeaderLookup::new(&h);
        let n = l.readable(&path).unwrap();
        assert_eq!(n.short, "podman:web (adadadadadad)");
        assert_eq!(n.container_name.as_deref(), Some("web"));
    }

    #[test]
    fn capture_header_lookup_names_and_inherited_limits() {
        let h = Header {
            cgroups: vec![RecordedCgroup {
                id: 42,
                path: "/a/b".into(),
                name: None,
            }],
            limits: vec![
                RecordedLimits {
                    cgroup: "/a".into(),
                    major: 7,
                    minor: 3,
                    wiops: Some(2000),
                    ..Default::default()
                },
                RecordedLimits {
                    cgroup: "/a/b".into(),
                    major: 7,
                    minor: 3,
                    wiops: Some(5000),
                    wbps: Some(1 << 20),
                    ..Default::default()
                },
            ],
            ..Header::default()
        };
        let mut l = HeaderLookup::new(&h);
        assert_eq!(l.cgroup_name(42).path, "/a/b");
        assert_eq!(l.readable("/a/b"), None);
        // a path of no recorded name (an older capture): read from the path
        let id = "ad".repeat(32);
        let short = l
            .readable(&format!("/libpod_parent/libpod-{id}"))
            .unwrap()
            .short;
        assert_eq!(short, "podman:adadadadadad");
        assert_eq!(l.cgroup_name(0).path, "(none)");
        assert!(l.cgroup_name(43).gone);
        let dev = Device {
            name: "loop3".into(),
            major: 7,
            minor: 3,
            notes: vec![],
            bio_based: false,
        };
        let e = l.limits("/a/b", &dev);
        assert_eq!(
            e.wiops,
            Some(Limit {
                limit: 2000,
                cgroup: "/a".into()
            })
        );
        assert_eq!(e.wbps.unwrap().limit, 1 << 20);
        assert!(l.limits("/c", &dev).is_empty());
        let other = Device { minor: 4, ..dev };
        assert!(l.limits("/a/b", &other).is_empty());
    }
}
