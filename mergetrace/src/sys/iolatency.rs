//! io.latency (cgroup v2, block/blk-iolatency.c) on a disk: the latency targets cgroups set
//! for it in their `io.latency` files. io.latency sits in `rq_qos_throttle`, which runs only
//! for bios that did not merge: each new request of a cgroup below the root takes an in-flight
//! slot at every level of its path, and when a cgroup misses its target the depth of its
//! siblings with looser targets is cut, down to one. It counts requests being created, after
//! merging, not bios: a bio that merges rides in a request already let through.
use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    fmt,
    sys::{
        cgroups::{self, Hierarchy},
        device::Device,
    },
};

/// One cgroup's target for the disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Relative to the hierarchy's mount.
    pub cgroup: String,
    pub target_us: u64,
}

/// The io.latency targets set for a disk, by cgroup path (each in its own `io.latency`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLatency {
    pub targets: Vec<Target>,
}

/// io.latency on a disk as a run or `check` finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// The io controller is on cgroup v1 (blkio): io.latency is a v2 file, it cannot exist.
    V1,
    /// cgroup v2, and the kernel has no io.latency (`CONFIG_BLK_CGROUP_IOLATENCY` off).
    NotBuiltIn,
    /// cgroup v2, but no cgroup below the root has the io controller: none can be set.
    NoIoCgroups,
    /// Built in: the targets set for the disk (none: no cgroup names it).
    Targets(IoLatency),
}

/// The target a cgroup's `io.latency` sets for `maj:min`: lines `MAJ:MIN target=<µs>` (the
/// kernel prints only the disks with a target).
pub fn parse(text: &str, major: u32, minor: u32) -> Option<u64> {
    let dev = format!("{major}:{minor}");
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        if it.next() != Some(dev.as_str()) {
            return None;
        }
        it.find_map(|kv| kv.strip_prefix("target=")?.parse().ok())
    })
}

/// io.latency on `dev` in the hierarchy mounted at `mount`. `built_in`: whether the kernel has
/// it, where known otherwise (BTF); without it the files decide (a cgroup below the root with
/// the io controller has `io.max`, and `io.latency` where built in).
pub fn state(hierarchy: Hierarchy, mount: &Path, dev: &Device, built_in: Option<bool>) -> State {
    if hierarchy == Hierarchy::V1 {
        return State::V1;
    }
    if built_in == Some(false) {
        return State::NotBuiltIn;
    }
    let (mut io_cgroups, mut files, mut targets) = (false, false, Vec::new());
    for (cgroup, dir) in cgroups::dirs(mount).into_iter().filter(|(p, _)| p != "/") {
        io_cgroups |= dir.join("io.max").exists();
        let Ok(text) = std::fs::read_to_string(dir.join("io.latency")) else {
            continue;
        };
        files = true;
        if let Some(target_us) = parse(&text, dev.major, dev.minor) {
            targets.push(Target { cgroup, target_us });
        }
    }
    targets.sort_by(|a, b| a.cgroup.cmp(&b.cgroup));
    if files {
        State::Targets(IoLatency { targets })
    } else if io_cgroups {
        // Where built in, every cgroup below the root with the io controller has the file.
        State::NotBuiltIn
    } else {
        State::NoIoCgroups
    }
}

/// The targets on each of `devices` that has any, by `dev_t`: what a run counts against.
pub fn targets_on(devices: &[Device], cgroups: &cgroups::Cgroups) -> BTreeMap<u32, IoLatency> {
    devices
        .iter()
        .filter_map(|d| {
            let s = state(cgroups.hierarchy, &cgroups.mount, d, None);
            Some((d.dev().0, s.targets()?.clone()))
        })
        .collect()
}

/// What io.latency counts, for the lines that name it.
const COUNTS: &str = "it counts new requests (rq_qos_throttle, for bios that did not merge), \
                      not bios: a bio that merges rides in a request already let through";

impl IoLatency {
    /// The targets as a list: "/db 10 ms, /batch 50 ms".
    pub fn list(&self) -> String {
        self.targets
            .iter()
            .map(|t| format!("{} {}", t.cgroup, fmt::latency_us(t.target_us)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The target `cgroup` sets itself, if any.
    pub fn own(&self, cgroup: &str) -> Option<u64> {
        self.targets
            .iter()
            .find(|t| t.cgroup == cgroup)
            .map(|t| t.target_us)
    }

    /// One line for the banner and `check`, where targets are set.
    pub fn describe(&self) -> String {
        format!(
            "io.latency targets: {} — a cgroup that misses its target holds its siblings with \
             looser targets to fewer requests in flight, down to one; {COUNTS}",
            self.list()
        )
    }
}

impl State {
    /// One line for `check` on disk `name`.
    pub fn describe(&self, name: &str) -> String {
        match self {
            State::V1 => "io.latency cannot exist here: it is a cgroup v2 file, and this \
                          machine's io controller is blkio on cgroup v1"
                .to_string(),
            State::NotBuiltIn => "io.latency is not built into this kernel \
                                  (CONFIG_BLK_CGROUP_IOLATENCY): no latency-target meter"
                .to_string(),
            State::NoIoCgroups => "io.latency: no cgroup below the root has the io controller \
                                   (cgroup.subtree_control), so no target can be set"
                .to_string(),
            State::Targets(t) if t.targets.is_empty() => format!(
                "io.latency is built in, but no cgroup sets a target for {name}: it does not \
                 hold {name}'s requests; where one is set, {COUNTS}"
            ),
            State::Targets(t) => format!("{name}: {}", t.describe()),
        }
    }

    /// The targets, where any are set.
    pub fn targets(&self) -> Option<&IoLatency> {
        match self {
            State::Targets(t) if !t.targets.is_empty() => Some(t),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Device {
        Device {
            name: "vdb".into(),
            major: 254,
            minor: 16,
            notes: vec![],
            bio_based: false,
        }
    }

    #[test]
    fn targets_from_the_files() {
        assert_eq!(
            parse("254:16 target=10000\n8:0 target=75\n", 254, 16),
            Some(10_000)
        );
        assert_eq!(parse("8:0 target=75\n", 254, 16), None);
        assert_eq!(parse("", 254, 16), None);
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for d in ["db", "batch", "web/inner"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("io.max"), "").unwrap();
        }
        // Not built in: io.max below the root, no io.latency anywhere.
        assert_eq!(state(Hierarchy::V2, root, &dev(), None), State::NotBuiltIn);
        for (d, text) in [
            ("db", "254:16 target=10000\n"),
            ("batch", "254:16 target=50000\n8:0 target=1\n"),
            ("web/inner", ""),
        ] {
            std::fs::write(root.join(d).join("io.latency"), text).unwrap();
        }
        let s = state(Hierarchy::V2, root, &dev(), None);
        let targets = s.targets().unwrap();
        assert_eq!(targets.list(), "/batch 50 ms, /db 10 ms");
        assert_eq!(targets.own("/db"), Some(10_000));
        assert_eq!(targets.own("/web/inner"), None);
        assert!(s.describe("vdb").starts_with(
            "vdb: io.latency targets: /batch 50 ms, /db 10 ms — a cgroup that misses its target \
             holds its siblings"
        ));
        assert_eq!(state(Hierarchy::V1, root, &dev(), None), State::V1);
        assert_eq!(
            state(Hierarchy::V2, root, &dev(), Some(false)),
            State::NotBuiltIn
        );
        // Built in, no target for the disk.
        std::fs::write(root.join("db/io.latency"), "8:0 target=1\n").unwrap();
        std::fs::write(root.join("batch/io.latency"), "").unwrap();
        let none = state(Hierarchy::V2, root, &dev(), Some(true));
        assert_eq!(none, State::Targets(IoLatency::default()));
        assert_eq!(none.targets(), None);
        assert!(none
            .describe("vdb")
            .starts_with("io.latency is built in, but no cgroup sets a target for vdb"));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            state(Hierarchy::V2, empty.path(), &dev(), None),
            State::NoIoCgroups
        );
        assert!(State::V1
            .describe("loop1")
            .starts_with("io.latency cannot exist here"));
    }
}
