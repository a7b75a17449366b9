//! blk-cgroup's per-cgroup counts, every cgroup of the hierarchy.

use std::{collections::BTreeMap, fs, path::Path};

use crate::support::*;

/// Bios and bytes per direction blk-cgroup counted for one cgroup on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ios {
    pub(crate) read: u64,
    pub(crate) write: u64,
    pub(crate) discard: u64,
    pub(crate) rbytes: u64,
    pub(crate) wbytes: u64,
    pub(crate) dbytes: u64,
}

impl Ios {
    pub(crate) fn get(&self, dir: &str) -> u64 {
        match dir {
            "read" => self.read,
            "write" => self.write,
            "discard" => self.discard,
            _ => 0,
        }
    }

    pub(crate) fn bytes(&self, dir: &str) -> u64 {
        match dir {
            "read" => self.rbytes,
            "write" => self.wbytes,
            "discard" => self.dbytes,
            _ => 0,
        }
    }
}

/// The counts of every cgroup that has them for `dev`, by the path mergetrace reports:
/// v1 `blkio.throttle.io_serviced` and `io_service_bytes` (the root included), v2 `io.stat`
/// rios/wios/dios and rbytes/wbytes/dbytes (no root). Both count a bio's bytes once, when it
/// first passes (`BIO_CGROUP_ACCT`): a split remainder adds an io but no bytes.
pub(crate) fn cgroup_ios(dev: &BlockDev) -> BTreeMap<String, Ios> {
    let (version, root) = cgroup_hierarchy();
    let mm = dev.maj_min();
    let mut map = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        if let Ok(rd) = fs::read_dir(&dir) {
            stack.extend(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.path()));
        }
        let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
        let path = format!("/{}", rel.display());
        let ios = match version {
            CgroupVersion::V1 => {
                let Ok(t) = fs::read_to_string(dir.join("blkio.throttle.io_serviced")) else {
                    continue;
                };
                let b = fs::read_to_string(dir.join("blkio.throttle.io_service_bytes"))
                    .unwrap_or_default();
                let (n, b) = (parse_blkio_stat(&t, &mm), parse_blkio_stat(&b, &mm));
                Ios {
                    read: n.read,
                    write: n.write,
                    discard: n.discard,
                    rbytes: b.read,
                    wbytes: b.write,
                    dbytes: b.discard,
                }
            }
            CgroupVersion::V2 => {
                if dir == *root {
                    continue;
                }
                let Ok(t) = fs::read_to_string(dir.join("io.stat")) else {
                    continue;
                };
                let st = parse_io_stat(&t, &mm);
                let n = |k: &str| st.get(k).copied().unwrap_or(0);
                Ios {
                    read: n("rios"),
                    write: n("wios"),
                    discard: n("dios"),
                    rbytes: n("rbytes"),
                    wbytes: n("wbytes"),
                    dbytes: n("dbytes"),
                }
            }
        };
        map.insert(path, ios);
    }
    map
}
