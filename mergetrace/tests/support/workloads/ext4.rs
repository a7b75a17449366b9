//! A scratch ext4 on the test disk, made so that nothing writes in the background.

use std::{
    ffi::CString,
    fs,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use super::*;

/// Optional ext4 features a newer mkfs.ext4 may turn on that this kernel's ext4 cannot mount
/// (the guests run the host's e2fsprogs, 1.47, against kernels back to 5.10): those of
/// `/sys/fs/ext4/features/` it does not list (metadata_csum_seed, fast_commit), and
/// orphan_file, which ext4 does not list there at all, before 5.15 (where it came). Empty on
/// the host and the 6.x guests, so their mkfs is the default one.
pub fn ext4_features_to_turn_off() -> Vec<&'static str> {
    let listed = |f: &str| Path::new("/sys/fs/ext4/features").join(f).exists();
    assert!(
        Path::new("/sys/fs/ext4/features").is_dir(),
        "/sys/fs/ext4/features is missing: this kernel has no ext4"
    );
    let mut off: Vec<&'static str> = ["metadata_csum_seed", "fast_commit"]
        .into_iter()
        .filter(|f| !listed(f))
        .collect();
    if super::super::kernel_version() < (5, 15) {
        off.push("orphan_file");
    }
    off
}

/// A fresh ext4 on a test disk, mounted on a fresh directory. Unmounted (and the directory
/// removed) on drop if [`Ext4::unmount`] did not do it.
#[derive(Debug)]
pub struct Ext4 {
    dev: PathBuf,
    mnt: PathBuf,
    mounted: bool,
}

impl Ext4 {
    /// `mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0` over the first
    /// `min(dev.size, FS_SIZE)` bytes of `dev` (inode tables and journal zeroed now, so no
    /// `ext4lazyinit` thread writes later), mounted on a fresh directory with the defaults
    /// but `no_prefetch_block_bitmaps` (below), then synced. Call before the measured window.
    pub fn new(dev: &BlockDev) -> Ext4 {
        let mkfs = require_tool("mkfs.ext4");
        let kib = dev.size.min(FS_SIZE) / 1024;
        let mut c = cmd(
            &mkfs,
            &["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
        );
        let off = ext4_features_to_turn_off();
        if !off.is_empty() {
            let o: Vec<String> = off.iter().map(|f| format!("^{f}")).collect();
            c.arg("-O").arg(o.join(","));
        }
        c.arg(&dev.path).arg(format!("{kib}k"));
        run(c, None, None);
        let mnt = std::env::temp_dir().join(format!("{}.mnt", unique_name()));
        fs::create_dir(&mnt).unwrap_or_else(|e| panic!("cannot create {}: {e}", mnt.display()));
        let mut fs_ = Ext4 {
            dev: dev.path.clone(),
            mnt,
            mounted: false,
        };
        // no_prefetch_block_bitmaps: otherwise every mount registers an ext4lazyinit request
        // that reads the block bitmaps in the background, starting at a random moment within
        // EXT4_DEF_LI_MAX_START_DELAY (5 s) of the mount (fs/ext4/super.c,
        // ext4_register_li_request / ext4_li_request_new, 6.1 and 6.12 alike) — reads that
        // can straddle the window's start (seen in 6.12: 3 read bios before blktrace and the
        // diskstats snapshot, after mergetrace attached). With the inode tables zeroed by mkfs
        // and this option no request is registered at all.
        //
        // Kernels before the prefetch became the default (Debian 11's 5.10) do not know the
        // option ("Unrecognized mount option") and prefetch only when asked
        // (`prefetch_block_bitmaps`): there the mount without it is the same.
        let mut m = cmd("mount", &["-t", "ext4", "-o", "no_prefetch_block_bitmaps"]);
        m.arg(&fs_.dev).arg(&fs_.mnt);
        let out = Running::start(m, None, None).wait(PROGRAM_TIMEOUT);
        if !out.status.success() {
            let mut m = cmd("mount", &["-t", "ext4"]);
            m.arg(&fs_.dev).arg(&fs_.mnt);
            run(m, None, None);
            let opts = fs::read_to_string(format!(
                "/proc/fs/ext4/{}/options",
                fs_.dev.file_name().unwrap_or_default().to_string_lossy()
            ))
            .unwrap_or_default();
            fs_.mounted = true;
            assert!(
                !opts.lines().any(|o| o.trim() == "prefetch_block_bitmaps"),
                "ext4 refused no_prefetch_block_bitmaps ({}) and prefetches block bitmaps without it",
                out.stderr.trim()
            );
        }
        fs_.mounted = true;
        fs::set_permissions(&fs_.mnt, fs::Permissions::from_mode(0o755)).expect("chmod mnt");
        fs_.sync();
        fs_
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// A directory on the filesystem (created), owned by `owner` if given.
    pub fn dir(&self, name: &str, owner: Option<User>) -> PathBuf {
        let d = self.mnt.join(name);
        fs::create_dir_all(&d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        if let Some(u) = owner {
            chown(&d, u);
        }
        d
    }

    /// `sync -f` on the filesystem (syncfs: writeback, journal commit, cache flush). Not a
    /// measured workload: preparation ends with it.
    pub fn sync(&self) {
        let mut c = cmd("sync", &["-f"]);
        c.arg(&self.mnt);
        run(c, None, None);
    }

    /// Unmounts (a measured workload: umount writes back what is dirty, commits and
    /// checkpoints the journal, flushes). `umount` runs inside `cg`.
    pub fn unmount(&mut self, cg: Option<&Cgroup>) -> Did {
        let mut c = cmd("umount", &[] as &[&str]);
        c.arg(&self.mnt);
        run(c, cg, None);
        self.mounted = false;
        let _ = fs::remove_dir(&self.mnt);
        Did {
            unmounts: 1,
            ..Did::default()
        }
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            for _ in 0..50 {
                let ok = Command::new("umount")
                    .arg(&self.mnt)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    self.mounted = false;
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            if self.mounted {
                eprintln!(
                    "warning: {} still mounted; detaching it lazily",
                    self.mnt.display()
                );
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        // Not remove_dir_all: never delete through a mount that is still there.
        let _ = fs::remove_dir(&self.mnt);
    }
}

pub(super) fn chown(path: &Path, u: User) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let r = unsafe { libc::chown(c.as_ptr(), u.uid, u.gid) };
    assert_eq!(
        r,
        0,
        "chown {} {}:{}: {}",
        path.display(),
        u.uid,
        u.gid,
        std::io::Error::last_os_error()
    );
}

/// A temporary directory outside the measured disk (scripts, sockets, logs), readable by
/// everyone.
pub(super) fn scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(&format!("{}.", unique_name()))
        .tempdir()
        .expect("cannot create a scratch directory");
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).expect("chmod scratch");
    d
}
