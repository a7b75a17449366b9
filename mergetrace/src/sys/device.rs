//! Which block device the user means: `vda`, `/dev/vda`, `MAJ:MIN`. Partitions map to their
//! disk (bios and requests are per disk), bio-based devices (no request queue) are flagged.
use std::{
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use mergetrace_common::vocab::Dev;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Kernel name of the whole disk, e.g. `loop3`.
    pub name: String,
    pub major: u32,
    pub minor: u32,
    /// What the user should know about the mapping (partition → disk, bio-based device).
    pub notes: Vec<String>,
    /// No request queue (zram, device-mapper, md): bios only, no merges or requests.
    pub bio_based: bool,
}

impl Device {
    /// The device number as events carry it.
    pub fn dev(&self) -> Dev {
        Dev::new(self.major, self.minor)
    }
    pub fn sys_dir(&self) -> PathBuf {
        PathBuf::from("/sys/block").join(&self.name)
    }
    /// A loop device (`LOOP_MAJOR`, include/uapi/linux/major.h): its disk outlives the files
    /// attached to it.
    pub fn is_loop(&self) -> bool {
        self.major == 7
    }
}

fn parse_maj_min(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Resolves a user's device spec against `sysfs` (normally `/sys`).
pub fn resolve(spec: &str) -> Result<Device> {
    resolve_in(Path::new("/sys"), spec)
}

pub fn resolve_in(sysfs: &Path, spec: &str) -> Result<Device> {
    let (major, minor) = if let Some(mm) = parse_maj_min(spec) {
        mm
    } else if spec.starts_with('/') {
        let meta = std::fs::metadata(spec)
            .with_context(|| format!("unknown device {spec}: cannot stat it"))?;
        if !meta.file_type().is_block_device() {
            bail!("{spec} is not a block device");
        }
        let rdev = meta.rdev();
        (libc::major(rdev), libc::minor(rdev))
    } else {
        let dev_file = sysfs.join("class/block").join(spec).join("dev");
        let text = std::fs::read_to_string(&dev_file).map_err(|_| {
            anyhow::anyhow!(
                "unknown block device '{spec}': no {} (list devices with lsblk)",
                sysfs.join("class/block").join(spec).display()
            )
        })?;
        parse_maj_min(&text).with_context(|| format!("bad contents in {}", dev_file.display()))?
    };
    let node = sysfs.join(format!("dev/block/{major}:{minor}"));
    let real = std::fs::canonicalize(&node).map_err(|_| {
        anyhow::anyhow!(
            "unknown block device {major}:{minor} ({spec}): not in {}",
            node.display()
        )
    })?;
    let mut notes = Vec::new();
    let disk_dir = if real.join("partition").exists() {
        let disk = real
            .parent()
            .context("partition without a parent disk")?
            .to_path_buf();
        notes.push(format!(
            "{} is a partition of {}: tracing {} (bios and requests belong to the whole disk)",
            file_name(&real),
            file_name(&disk),
            file_name(&disk)
        ));
        disk
    } else {
        real
    };
    let name = file_name(&disk_dir);
    let (major, minor) =
        parse_maj_min(&std::fs::read_to_string(disk_dir.join("dev"))?).context("bad dev file")?;
    let bio_based = !disk_dir.join("mq").exists();
    if bio_based {
        notes.push(format!(
            "{name} is bio-based (no request queue): bios and throttle charges are shown; \
             it has no merges and no device requests to count"
        ));
    }
    Ok(Device {
        name,
        major,
        minor,
        notes,
        bio_based,
    })
}

/// Every whole disk of the machine now (`/sys/block`), by name.
pub fn all_disks() -> Vec<Device> {
    disks_in(Path::new("/sys"))
}

fn disks_in(sysfs: &Path) -> Vec<Device> {
    let Ok(entries) = std::fs::read_dir(sysfs.join("block")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .iter()
        .filter_map(|n| resolve_in(sysfs, n).ok())
        .collect()
}

/// The disk of `dev_t` (the kernel's encoding), from sysfs; `None` once it is gone.
pub fn of_dev(dev: u32) -> Option<Device> {
    let d = Dev(dev);
    resolve(&format!("{}:{}", d.major(), d.minor())).ok()
}

/// What `-d` names: disks, and patterns of disk names (`nvme*`, `vd?`, `loop[0-9]`: a disk
/// that appears during the run and matches is traced too), or every disk (`--all-disks`).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    patterns: Vec<glob::Pattern>,
    every: bool,
}

impl Selection {
    /// The disks `specs` name now (each once) and what they select from here on. A spec with
    /// `*`, `?` or `[` is a pattern of whole-disk names; it may match none yet.
    pub fn resolve(specs: &[String], every: bool) -> Result<(Vec<Device>, Selection)> {
        let mut out: Vec<Device> = Vec::new();
        let mut patterns = Vec::new();
        let now = all_disks();
        for spec in specs {
            if spec.contains(['*', '?', '[']) {
                let p = glob::Pattern::new(spec).map_err(|e| {
                    anyhow::anyhow!("bad disk pattern '{spec}': {e} (e.g. -d 'nvme*', -d 'vd?')")
                })?;
                out.extend(now.iter().filter(|d| p.matches(&d.name)).cloned());
                patterns.push(p);
            } else {
                out.push(resolve(spec)?);
            }
        }
        if every {
            out.extend(now);
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|d| seen.insert(d.dev()));
        Ok((out, Selection { patterns, every }))
    }

    /// Whether disks that appear later can be selected (a pattern or every disk).
    pub fn follows_new_disks(&self) -> bool {
        self.every || !self.patterns.is_empty()
    }

    /// Whether a disk found during the run is selected.
    pub fn wants(&self, d: &Device) -> bool {
        self.every || self.patterns.iter().any(|p| p.matches(&d.name))
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs with a disk `sdz` (8:240), its partition `sdz1` (8:241) and a bio-based
    /// `zram9` (252:9).
    fn fake_sysfs() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let disk = root.join("devices/virtual/block/sdz");
        std::fs::create_dir_all(disk.join("mq")).unwrap();
        std::fs::write(disk.join("dev"), "8:240\n").unwrap();
        std::fs::create_dir_all(disk.join("sdz1")).unwrap();
        std::fs::write(disk.join("sdz1/dev"), "8:241\n").unwrap();
        std::fs::write(disk.join("sdz1/partition"), "1\n").unwrap();
        let zram = root.join("devices/virtual/block/zram9");
        std::fs::create_dir_all(&zram).unwrap();
        std::fs::write(zram.join("dev"), "252:9\n").unwrap();
        std::fs::create_dir_all(root.join("class/block")).unwrap();
        std::fs::create_dir_all(root.join("dev/block")).unwrap();
        for (name, dir, mm) in [
            ("sdz", disk.clone(), "8:240"),
            ("sdz1", disk.join("sdz1"), "8:241"),
            ("zram9", zram.clone(), "252:9"),
        ] {
            std::os::unix::fs::symlink(&dir, root.join("class/block").join(name)).unwrap();
            std::os::unix::fs::symlink(&dir, root.join("dev/block").join(mm)).unwrap();
        }
        // /sys/block lists whole disks only.
        std::fs::create_dir_all(root.join("block")).unwrap();
        for (name, dir) in [("sdz", &disk), ("zram9", &zram)] {
            std::os::unix::fs::symlink(dir, root.join("block").join(name)).unwrap();
        }
        t
    }

    #[test]
    fn patterns_select_disks_now_and_later() {
        let t = fake_sysfs();
        let names: Vec<String> = disks_in(t.path()).into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["sdz", "zram9"]);
        let p = glob::Pattern::new("zram*").unwrap();
        let sel = Selection {
            patterns: vec![p],
            every: false,
        };
        let z = resolve_in(t.path(), "zram9").unwrap();
        let sdz = resolve_in(t.path(), "sdz").unwrap();
        assert!(sel.wants(&z) && !sel.wants(&sdz) && sel.follows_new_disks());
        assert!(!Selection::default().follows_new_disks());
        let e = Selection::resolve(&["sd[".to_string()], false)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("bad disk pattern 'sd['"), "{e}");
    }

    #[test]
    fn names_numbers_and_partitions() {
        let t = fake_sysfs();
        let d = resolve_in(t.path(), "sdz").unwrap();
        assert_eq!(
            (d.name.as_str(), d.major, d.minor, d.bio_based),
            ("sdz", 8, 240, false)
        );
        assert!(d.notes.is_empty());
        let p = resolve_in(t.path(), "8:241").unwrap();
        assert_eq!(p.name, "sdz");
        assert!(
            p.notes[0].contains("sdz1 is a partition of sdz"),
            "{:?}",
            p.notes
        );
        let z = resolve_in(t.path(), "zram9").unwrap();
        assert!(z.bio_based && z.notes[0].contains("bio-based"));
        let e = resolve_in(t.path(), "nosuch").unwrap_err().to_string();
        assert!(e.contains("unknown block device 'nosuch'"), "{e}");
        assert!(resolve_in(t.path(), "9:9").is_err());
        assert_eq!(d.dev(), Dev(8 << 20 | 240));
        assert_eq!((d.dev().major(), d.dev().minor()), (8, 240));
        assert_eq!(d.dev().to_string(), "8:240");
    }
}
