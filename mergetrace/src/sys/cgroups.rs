//! Cgroup ids → paths. The id the probes report is the kernfs inode of the bio's blkcg
//! directory, which lives in the hierarchy that hosts the io controller: cgroup v1 `blkio`
//! when it is mounted (hybrid hosts), the unified v2 hierarchy otherwise.
use mergetrace_common::{REMOVED_CGROUP, UNATTRIBUTED_CGROUP};
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

use super::{
    container::{self, ReadableName},
    local_names::LocalNames,
    throttle::{self, Limits},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hierarchy {
    /// cgroup v1 with the blkio controller.
    V1,
    /// The unified cgroup v2 hierarchy.
    V2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupName {
    /// Path relative to the hierarchy's mount: "/" for the root.
    pub path: String,
    /// The id no longer exists (the cgroup was removed); `path` is the last one seen.
    pub gone: bool,
}

/// Resolves and caches cgroup ids of one hierarchy.
pub struct Cgroups {
    pub hierarchy: Hierarchy,
    pub mount: PathBuf,
    by_id: HashMap<u64, String>,
    /// Ids reported removed (`cgroup_rmdir`) or found gone: their last path stays until
    /// [`Cgroups::forget_removed`] lets them go. The flag: a forget pass has seen it already.
    removed: HashMap<u64, bool>,
    /// Names from the container runtimes' files on this machine; `None` leaves them out.
    local: Option<LocalNames>,
    /// The blk-throttle limits last read for (cgroup path, disk `maj:min`), along its binding
    /// path: what a removed cgroup was limited by, once its files are gone.
    limits_seen: HashMap<(String, u32, u32), Vec<(String, Limits)>>,
}

/// The mount that hosts the io controller, from `/proc/self/mountinfo`.
pub fn io_hierarchy(mountinfo: &str) -> Option<(Hierarchy, PathBuf)> {
    let mut v2 = None;
    for line in mountinfo.lines() {
        // id parent maj:min root mountpoint opts - fstype source superopts
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mountpoint = left.split(' ').nth(4).unwrap_or_default();
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or_default();
        let superopts = r.nth(1).unwrap_or_default();
        let mountpoint = PathBuf::from(unescape(mountpoint));
        if fstype == "cgroup" && superopts.split(',').any(|o| o == "blkio") {
            return Some((Hierarchy::V1, mountpoint));
        }
        if fstype == "cgroup2" && v2.is_none() {
            v2 = Some((Hierarchy::V2, mountpoint));
        }
    }
    v2
}

/// The id of the hierarchy hosting the io controller (`blkio`), from `/proc/cgroups`: v1's
/// blkio hierarchy, or 0 for the unified v2 hierarchy.
pub fn io_hierarchy_id(proc_cgroups: &str) -> Option<u32> {
    proc_cgroups.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some("blkio")).then(|| f.next()?.parse().ok())?
    })
}

/// The path shown for the counters of removed cgroups, folded per device.
pub const REMOVED_PATH: &str = "(removed)";

/// The name of a device's counters of I/O whose cgroup found no room in the counter maps
/// (more new cgroups between two reads than they hold).
pub const UNATTRIBUTED_PATH: &str = "(unattributed)";

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Cgroups {
    pub fn discover() -> Result<Cgroups> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .context("cannot read /proc/self/mountinfo")?;
        let (hierarchy, mount) = io_hierarchy(&mountinfo)
            .context("no cgroup hierarchy with the io/blkio controller is mounted")?;
        Ok(Cgroups::at(hierarchy, mount))
    }

    pub fn at(hierarchy: Hierarchy, mount: PathBuf) -> Cgroups {
        let mut c = Cgroups {
            hierarchy,
            mount,
            by_id: HashMap::new(),
            removed: HashMap::new(),
            local: None,
            limits_seen: HashMap::new(),
        };
        c.local = Some(LocalNames::new("/", c.mount.clone()));
        c.rescan();
        c
    }

    /// Walks the hierarchy and records every directory's inode.
    pub fn rescan(&mut self) {
        for (path, dir) in dirs(&self.mount) {
            if let Ok(meta) = std::fs::metadata(&dir) {
                self.by_id.insert(meta.ino(), path);
            }
        }
    }

    fn exists(&self, id: u64, path: &str) -> bool {
        let full = self.mount.join(path.trim_start_matches('/'));
        std::fs::metadata(full).is_ok_and(|m| m.ino() == id)
    }

    /// The name of `id`: looked up, rescanned once if unknown, checked for removal.
    pub fn name(&mut self, id: u64) -> CgroupName {
        if id == 0 || id == REMOVED_CGROUP || id == UNATTRIBUTED_CGROUP {
            let path = match id {
                0 => "(none)",
                REMOVED_CGROUP => REMOVED_PATH,
                _ => UNATTRIBUTED_PATH,
            };
            return CgroupName {
                path: path.into(),
                gone: false,
            };
        }
        if self.removed.contains_key(&id) {
            if let Some(path) = self.by_id.get(&id) {
                return CgroupName {
                    path: path.clone(),
                    gone: true,
                };
            }
        }
        if let Some(path) = self.by_id.get(&id).cloned() {
            if self.exists(id, &path) {
                return CgroupName { path, gone: false };
            }
            self.rescan();
            return match self.by_id.get(&id) {
                Some(p) if self.exists(id, p) => CgroupName {
                    path: p.clone(),
                    gone: false,
                },
                _ => {
                    // Gone without a reported removal: remembered, not rescanned for again.
                    self.removed.entry(id).or_default();
                    CgroupName { path, gone: true }
                }
            };
        }
        self.rescan();
        match self.by_id.get(&id) {
            Some(p) => CgroupName {
                path: p.clone(),
                gone: false,
            },
            None => {
                let path = format!("(unknown cgroup id {id})");
                self.by_id.insert(id, path.clone());
                self.removed.entry(id).or_default();
                CgroupName { path, gone: true }
            }
        }
    }

    /// A cgroup just created (`cgroup_mkdir`), with its path when the report carried it
    /// (else it is looked up at once, which finds it unless it is gone already).
    pub fn born(&mut self, id: u64, path: Option<String>) {
        match path {
            Some(p) => {
                self.by_id.insert(id, p);
            }
            None => {
                if !self.by_id.contains_key(&id) {
                    self.rescan();
                }
            }
        }
    }

    /// A cgroup removed (`cgroup_rmdir`): its name is kept, marked gone, until forgotten.
    pub fn gone(&mut self, id: u64) {
        if self.by_id.contains_key(&id) {
            self.removed.entry(id).or_default();
        }
    }

    /// Forgets the removed cgroups `keep` does not want any more (no counters left under
    /// them), at the second pass that finds them so: a cgroup removed just after a read of the
    /// counters may have done I/O that only the next read counts. The table then holds the
    /// cgroups alive and those still counted.
    pub fn forget_removed(&mut self, keep: impl Fn(u64) -> bool) {
        let by_id = &mut self.by_id;
        let local = &mut self.local;
        self.removed.retain(|id, seen| {
            if keep(*id) {
                return true;
            }
            if !*seen {
                *seen = true;
                return true;
            }
            if let (Some(path), Some(local)) = (by_id.remove(id), local.as_mut()) {
                local.forget(&path);
            }
            false
        });
        // The limits of paths no id names any more (removed and forgotten).
        let paths: std::collections::HashSet<&String> = self.by_id.values().collect();
        self.limits_seen.retain(|(p, _, _), _| paths.contains(p));
    }

    /// What each cgroup whose blk-throttle rules bind cgroup `path` sets for disk `maj:min`
    /// ([`throttle::chain`]); for a cgroup removed since, what was read last.
    pub fn limits_chain(&mut self, path: &str, major: u32, minor: u32) -> Vec<(String, Limits)> {
        if !path.starts_with('/') {
            return Vec::new(); // "(none)" or an unknown id
        }
        let key = (path.to_string(), major, minor);
        if !self.mount.join(path.trim_start_matches('/')).is_dir() {
            return self.limits_seen.get(&key).cloned().unwrap_or_default();
        }
        let chain = throttle::chain(self.hierarchy, &self.mount, path, major, minor);
        self.limits_seen.insert(key, chain.clone());
        chain
    }

    /// Ids the table knows (alive and removed-but-kept).
    pub fn known(&self) -> usize {
        self.by_id.len()
    }

    /// Reads no runtime state: readable names come from the paths alone.
    pub fn without_local_names(mut self) -> Cgroups {
        self.local = None;
        self
    }

    /// The readable name of a path, with what the runtimes' local files add.
    pub fn readable(&mut self, path: &str) -> Option<ReadableName> {
        match &mut self.local {
            Some(local) => local.name(path),
            None => container::readable(path),
        }
    }

    /// The path of `id` as of the last scan (no rescan, no check that it still exists).
    pub fn path_of(&self, id: u64) -> Option<&str> {
        self.by_id.get(&id).map(String::as_str)
    }

    /// Every cgroup seen in the last scan: (id, path).
    pub fn all(&self) -> impl Iterator<Item = (u64, &str)> {
        self.by_id.iter().map(|(id, p)| (*id, p.as_str()))
    }

    /// Normalises a user's `-c` argument to a hierarchy-relative path and checks it exists.
    /// Accepts `/mt`, `mt`, or the full filesystem path under the mount.
    /// A word that is no directory may name a container (an id prefix of at least 6 hex
    /// digits, `docker:3f2a9c`) or a systemd unit (`nginx.service`, `nginx`) of a cgroup there.
    pub fn normalize(&mut self, user: &str) -> Result<String> {
        let p = Path::new(user);
        let rel = if let Ok(rel) = p.strip_prefix(&self.mount) {
            format!("/{}", rel.display())
        } else {
            format!("/{}", user.trim_start_matches('/'))
        };
        let rel = if rel.len() > 1 {
            rel.trim_end_matches('/').to_string()
        } else {
            rel
        };
        let full = self.mount.join(rel.trim_start_matches('/'));
        if !full.is_dir() {
            if let Some(found) = self.resolve_readable(user)? {
                return Ok(found);
            }
            bail!(
                "unknown cgroup '{user}': no directory {} (cgroup paths are relative to {}), \
                 and no container id or systemd unit of a cgroup there matches it",
                full.display(),
                self.mount.display()
            );
        }
        Ok(rel)
    }
}

impl Cgroups {
    /// A `-c` word that is no directory, as a container id prefix or a unit name: the one
    /// cgroup that matches (its descendants that match too are in its subtree). `None` when
    /// the word cannot be one (left to the caller's "unknown cgroup").
    fn resolve_readable(&mut self, word: &str) -> Result<Option<String>> {
        if word.contains('/') {
            return Ok(None);
        }
        let mut paths: Vec<String> = self.by_id.values().cloned().collect();
        paths.sort();
        let named: Vec<(String, ReadableName)> = paths
            .into_iter()
            .filter_map(|p| {
                let n = self.readable(&p)?;
                // a unit's own directory name (kubepods-burstable.slice) names it too
                let leaf = p.rsplit('/').next() == Some(word);
                (leaf || n.matches(word)).then_some((p, n))
            })
            .collect();
        pick_match(word, named)
    }
}

/// The one match among `named` (`None` for none; an error when several): a monitor (conmon)
/// only when nothing else matches, and a match inside another's subtree is that one's.
fn pick_match(word: &str, mut named: Vec<(String, ReadableName)>) -> Result<Option<String>> {
    if named.iter().any(|(_, n)| !n.conmon) {
        named.retain(|(_, n)| !n.conmon);
    }
    let tops: Vec<&String> = named
        .iter()
        .map(|(p, _)| p)
        .filter(|p| !named.iter().any(|(q, _)| q != *p && in_subtree(p, q)))
        .collect();
    match tops.as_slice() {
        [one] => Ok(Some(one.to_string())),
        [] => Ok(None),
        many => {
            bail!(
            "ambiguous cgroup '{word}': it names {} cgroups ({}{}); give a longer id or the path",
            many.len(),
            many.iter().take(3).map(|p| p.as_str()).collect::<Vec<_>>().join(", "),
            if many.len() > 3 { ", …" } else { "" }
        )
        }
    }
}

/// Every cgroup directory of the hierarchy mounted at `mount`: its path relative to the mount
/// ("/" for the root) and the directory.
pub fn dirs(mount: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![mount.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // DirEntry::file_type does not follow symlinks.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
        let path = match dir.strip_prefix(mount) {
            Ok(rel) if rel.as_os_str().is_empty() => "/".to_string(),
            Ok(rel) => format!("/{}", rel.display()),
            Err(_) => dir.display().to_string(),
        };
        out.push((path, dir));
    }
    out
}

/// Whether `path` is `subtree` or below it.
pub fn in_subtree(path: &str, subtree: &str) -> bool {
    subtree == "/"
        || path == subtree
        || path
            .strip_prefix(subtree)
            .is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_v1_blkio_over_v2() {
        let mi = "30 24 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
                  35 30 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                  40 30 0:36 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio\n";
        assert_eq!(
            io_hierarchy(mi),
            Some((Hierarchy::V1, "/sys/fs/cgroup/blkio".into()))
        );
        let v2only = "35 30 0:31 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            io_hierarchy(v2only),
            Some((Hierarchy::V2, "/sys/fs/cgroup".into()))
        );
        assert_eq!(io_hierarchy(""), None);
        assert_eq!(unescape("/a\\040b"), "/a b");
    }

    #[test]
    fn resolves_ids_and_notices_removal() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        let mut c = Cgroups::at(Hierarchy::V2, t.path().to_path_buf());
        let ino = |p: &str| std::fs::metadata(t.path().join(p)).unwrap().ino();
        let b = ino("a/b");
        assert_eq!(c.name(ino("")).path, "/");
        assert_eq!(
            c.name(b),
            CgroupName {
                path: "/a/b".into(),
                gone: false
            }
        );
        std::fs::create_dir(t.path().join("new")).unwrap();
        assert_eq!(c.name(ino("new")).path, "/new");
        std::fs::remove_dir(t.path().join("a/b")).unwrap();
        assert_eq!(
            c.name(b),
            CgroupName {
                path: "/a/b".into(),
                gone: true
            }
        );
        assert!(c.name(u64::MAX - 2).gone);
        assert_eq!(c.name(REMOVED_CGROUP).path, REMOVED_PATH);
        assert_eq!(c.name(UNATTRIBUTED_CGROUP).path, UNATTRIBUTED_PATH);
        // Named at birth, gone at once: the birth report's name stays until forgotten.
        c.born(77, Some("/brief".into()));
        c.gone(77);
        assert_eq!(
            c.name(77),
            CgroupName {
                path: "/brief".into(),
                gone: true
            }
        );
        let before = c.known();
        c.forget_removed(|id| id == 77);
        assert_eq!(c.name(77).path, "/brief", "still counted: kept");
        c.forget_removed(|_| false);
        assert_eq!(c.name(77).path, "/brief", "kept one pass more");
        c.forget_removed(|_| false);
        assert_eq!(c.known(), before - 3, "77, b and u64::MAX - 1 forgotten");
        assert_eq!(
            io_hierarchy_id("#subsys_name\thierarchy\nblkio\t7\t1\t1\n"),
            Some(7)
        );
        assert_eq!(io_hierarchy_id("cpu 1 1 1\n"), None);
        assert_eq!(c.normalize("a").unwrap(), "/a");
        assert_eq!(
            c.normalize(&t.path().join("a").display().to_string())
                .unwrap(),
            "/a"
        );
        assert!(c
            .normalize("/nope")
            .unwrap_err()
            .to_string()
            .contains("unknown cgroup"));
        assert!(in_subtree("/a/b", "/a") && in_subtree("/a", "/a") && !in_subtree("/ab", "/a"));
        assert!(in_subtree("/x", "/"));
    }

    #[test]
    fn resolves_container_ids_and_units() {
        let t = tempfile::tempdir().unwrap();
        let id = |c: char| format!("3f2a9c{}", c.to_string().repeat(58));
        for d in [
            format!("system.slice/docker-{}.scope", id('a')),
            format!("system.slice/docker-{}.scope/init.scope", id('a')),
            format!("system.slice/docker-{}.scope", id('b')),
            "system.slice/nginx.service".to_string(),
            format!("system.slice/crio-conmon-{}.scope", id('c')),
            format!("system.slice/crio-{}.scope", id('c')),
            "kubepods.slice/kubepods-burstable.slice".to_string(),
        ] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        let mut c = Cgroups::at(Hierarchy::V2, t.path().to_path_buf()).without_local_names();
        let a = format!("/system.slice/docker-{}.scope", id('a'));
        assert_eq!(
            c.normalize("3f2a9caa").unwrap(),
            a,
            "its init.scope is in its subtree"
        );
        assert_eq!(c.normalize("docker:3f2a9caaaa").unwrap(), a);
        assert_eq!(
            c.normalize("nginx.service").unwrap(),
            "/system.slice/nginx.service"
        );
        assert_eq!(
            c.normalize("svc:nginx").unwrap(),
            "/system.slice/nginx.service"
        );
        // CRI-O's monitor shares the id: the container wins
        assert_eq!(
            c.normalize("3f2a9ccc").unwrap(),
            format!("/system.slice/crio-{}.scope", id('c'))
        );
        assert_eq!(
            c.normalize("kubepods-burstable.slice").unwrap(),
            "/kubepods.slice/kubepods-burstable.slice"
        );
        let e = c.normalize("3f2a9c").unwrap_err().to_string();
        assert!(
            e.starts_with("ambiguous cgroup '3f2a9c': it names 3 cgroups"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let e = c.normalize("abcdef12").unwrap_err().to_string();
        assert!(e.contains("unknown cgroup 'abcdef12'"), "{e}");
        assert!(c.normalize("3f2a9").is_err(), "5 hex digits are too few");
    }
}
