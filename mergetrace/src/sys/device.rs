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

/// Resolves every spec, each disk once (two partitions of one disk trace it once).
pub fn resolve_all(specs: &[String]) -> Result<Vec<Device>> {
    let mut out: Vec<Device> = Vec::new();
    for spec in specs {
        let d = resolve(spec)?;
        if !out.iter().any(|o| o.dev() == d.dev()) {
            out.push(d);
        }
    }
    Ok(out)
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
        t
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
