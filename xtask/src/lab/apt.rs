//! The lab's own apt configuration: Debian's suites, lists and keys under the lab's cache,
//! never the host's sources or lists.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{ensure, Context, Result};

use super::kernel::SERIES;
use crate::run_quiet;

/// The Debian archive keys (debian-archive-keyring), which cover bullseye, bookworm and trixie
/// (and trixie-backports).
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Lists older than this are refreshed (a failed refresh keeps the old ones).
const LISTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The lab's private apt configuration, in `cache/apt`: `sources.list` (main, -updates and
/// -security of every release in [`SERIES`], main of its backports suites, amd64 `Packages` indexes only, signed by
/// [`DEBIAN_KEYRING`]), `state/` (lists, an empty dpkg status), `cache/`, and empty trusted
/// keys (`trusted.gpg`, `trusted.gpg.d/`: the host's apt keys are not trusted either). The
/// host's apt.conf.d still applies (proxies), its sources, lists and pins do not.
pub struct Apt {
    dir: PathBuf,
    /// An update was tried in this run (one per run, even if it failed).
    pub(super) tried: std::cell::Cell<bool>,
    /// [`Apt::kernel_packages`] since the last update.
    known: std::cell::RefCell<Option<Vec<String>>>,
}

impl Apt {
    /// Mirrors: `MERGETRACE_LAB_MIRROR` (default http://deb.debian.org/debian) and
    /// `MERGETRACE_LAB_SECURITY_MIRROR` (default http://deb.debian.org/debian-security).
    fn sources_list() -> String {
        let env = |k: &str, d: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| d.to_string())
        };
        let mirror = env("MERGETRACE_LAB_MIRROR", "http://deb.debian.org/debian");
        let security = env(
            "MERGETRACE_LAB_SECURITY_MIRROR",
            "http://deb.debian.org/debian-security",
        );
        let mut suites: Vec<&str> = Vec::new();
        for s in SERIES {
            if !suites.contains(&s.suite) {
                suites.push(s.suite);
            }
        }
        let opts = format!("[arch=amd64 signed-by={DEBIAN_KEYRING} target=Packages]");
        let mut s = String::from(
            "# The lab's own apt sources (xtask/src/lab/kernel.rs writes them), not the host's.\n",
        );
        for suite in suites {
            s.push_str(&format!("deb {opts} {mirror} {suite} main\n"));
            // A backports suite has no -updates or -security of its own.
            if !suite.ends_with("-backports") {
                s.push_str(&format!("deb {opts} {mirror} {suite}-updates main\n"));
                s.push_str(&format!("deb {opts} {security} {suite}-security main\n"));
            }
        }
        s
    }

    /// Creates the directories and (re)writes sources.list.
    pub fn new(cache: &Path) -> Result<Apt> {
        let dir = cache.join("apt");
        for d in [
            "state/lists/partial",
            "cache/archives/partial",
            "trusted.gpg.d",
        ] {
            fs::create_dir_all(dir.join(d))
                .with_context(|| format!("cannot create {}", dir.join(d).display()))?;
        }
        let status = dir.join("state/status");
        if !status.exists() {
            fs::write(&status, "")?;
        }
        let list = dir.join("sources.list");
        let text = Self::sources_list();
        if fs::read_to_string(&list).ok().as_deref() != Some(text.as_str()) {
            let tmp = dir.join(format!("sources.list.{}", std::process::id()));
            fs::write(&tmp, &text)?;
            fs::rename(&tmp, &list)?;
        }
        Ok(Apt {
            dir,
            tried: Default::default(),
            known: Default::default(),
        })
    }

    /// The `-o` options that point apt-get and apt-cache at this configuration only.
    fn opts(&self) -> Vec<OsString> {
        let d = |p: &str| self.dir.join(p).into_os_string();
        let mut v = Vec::new();
        for (k, val) in [
            ("Dir::Etc::sourcelist", d("sources.list")),
            ("Dir::Etc::sourceparts", "/dev/null".into()),
            ("Dir::Etc::trusted", d("trusted.gpg")),
            ("Dir::Etc::trustedparts", d("trusted.gpg.d")),
            ("Dir::Etc::preferences", "/dev/null".into()),
            ("Dir::Etc::preferencesparts", "/dev/null".into()),
            ("Dir::State", d("state")),
            ("Dir::State::status", d("state/status")),
            ("Dir::Cache", d("cache")),
            // The host's apt.conf.d may turn the binary cache off (Docker images do); without
            // it every apt-cache call parses all nine lists again (~6 s, 0.7 s with it).
            ("Dir::Cache::pkgcache", "pkgcache.bin".into()),
            ("Dir::Cache::srcpkgcache", "".into()),
            ("Acquire::Languages", "none".into()),
        ] {
            let mut o = OsString::from(format!("{k}="));
            o.push(val);
            v.push("-o".into());
            v.push(o);
        }
        v
    }

    fn apt_get(&self) -> Command {
        let mut c = Command::new("apt-get");
        c.args(self.opts());
        c
    }

    /// Whether the lists should be fetched: never fetched for this sources.list, or older than
    /// [`LISTS_MAX_AGE`]; and no update was tried yet in this run.
    pub(super) fn stale(&self) -> bool {
        if self.tried.get() {
            return false;
        }
        let stamp = self.dir.join("state/updated");
        let same = fs::read_to_string(&stamp).ok()
            == fs::read_to_string(self.dir.join("sources.list")).ok();
        let age = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        !same || age.is_none_or(|a| a > LISTS_MAX_AGE)
    }

    /// The lock on the lab's apt state, held around every apt-get and apt-cache call: two lab
    /// runs at once (CI's side-by-side guests) would otherwise update the same lists, or
    /// rebuild the same package cache, together (apt's own lock makes the second update fail).
    fn lock(&self) -> Result<fs::File> {
        super::lock(&self.dir.join("lab.lock"), "the lab's apt state")
    }

    /// `apt-get update` with the lab's configuration.
    pub(super) fn update(&self) -> Result<()> {
        let _lock = self.lock()?;
        self.update_locked()
    }

    fn update_locked(&self) -> Result<()> {
        self.tried.set(true);
        ensure!(
            Path::new(DEBIAN_KEYRING).exists(),
            "{DEBIAN_KEYRING} is missing (apt-get install debian-archive-keyring)"
        );
        eprintln!(
            "lab: apt-get update with the lab's own sources ({})",
            self.dir.join("sources.list").display()
        );
        self.known.replace(None);
        run_quiet(self.apt_get().args(["-q", "update"]))?;
        fs::copy(
            self.dir.join("sources.list"),
            self.dir.join("state/updated"),
        )?;
        Ok(())
    }

    /// Cloud-kernel package names (signed and unsigned images, and the kernel-only
    /// `linux-binary-unsigned-…` packages of 6.19 and later) in the lab's lists (`apt-cache
    /// search`, local; once per run unless the lists change).
    pub(super) fn kernel_packages(&self) -> Result<Vec<String>> {
        if let Some(k) = self.known.borrow().as_ref() {
            return Ok(k.clone());
        }
        let _lock = self.lock()?;
        let out = run_quiet(Command::new("apt-cache").args(self.opts()).args([
            "search",
            "--names-only",
            "^(linux-image-.*-cloud-amd64(-unsigned)?|linux-binary-unsigned-.*-cloud-amd64)$",
        ]))?;
        let k: Vec<String> = out
            .lines()
            .filter_map(|l| l.split_once(" - ").map(|(n, _)| n.trim().to_string()))
            .collect();
        self.known.replace(Some(k.clone()));
        Ok(k)
    }

    /// The version of `package` that `apt-get download` would fetch (after an update when
    /// the lists are stale).
    pub(super) fn candidate_version(&self, package: &str) -> Result<String> {
        let _lock = self.lock()?;
        if self.stale() {
            if let Err(e) = self.update_locked() {
                eprintln!("lab: apt-get update failed: {e:#}");
            }
        }
        let out = run_quiet(Command::new("apt-cache").args(self.opts()).args([
            "show",
            "--no-all-versions",
            package,
        ]))?;
        out.lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .map(str::to_string)
            .with_context(|| format!("no {package} in the lab's apt lists"))
    }

    /// `apt-get download PACKAGE` into `dir`.
    fn download(&self, package: &str, dir: &Path) -> Result<()> {
        let _lock = self.lock()?;
        run_quiet(
            self.apt_get()
                .args(["-q", "download", package])
                .current_dir(dir),
        )
        .map(drop)
    }

    /// The .deb of `package` in `dir` (of `version` when given), downloaded there first when
    /// it is not.
    pub(super) fn fetch_deb(
        &self,
        package: &str,
        version: Option<&str>,
        dir: &Path,
    ) -> Result<PathBuf> {
        let cached = || {
            find_debs(dir, package)
                .into_iter()
                .find(|d| version.is_none() || deb_version(d) == version)
        };
        if let Some(d) = cached() {
            return Ok(d);
        }
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let what = version.map_or(package.to_string(), |v| format!("{package} {v}"));
        eprintln!("lab: downloading {what} (apt-get download, the lab's sources)");
        self.download(package, dir)
            .with_context(|| format!("cannot download {package}"))?;
        cached()
            .with_context(|| format!("apt-get download left no {what} .deb in {}", dir.display()))
    }
}

/// The .debs of `package` in `dir`.
fn find_debs(dir: &Path, package: &str) -> Vec<PathBuf> {
    let prefix = format!("{package}_");
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .collect()
}

/// The version in a .deb's name (`PACKAGE_VERSION_ARCH.deb`).
fn deb_version(deb: &Path) -> Option<&str> {
    deb.file_name()?.to_str()?.split('_').nth(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_versions_from_deb_names() {
        assert_eq!(
            deb_version(Path::new("/c/linux-source-6.1_6.1.192-3_all.deb")),
            Some("6.1.192-3")
        );
    }

    #[test]
    fn sources_list_has_each_suite_once_and_only_debian_keys() {
        let s = Apt::sources_list();
        let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("deb ")).collect();
        assert_eq!(lines.len(), 10, "{s}");
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.contains(" trixie-backports"))
                .count(),
            1,
            "{s}"
        );
        for suite in ["bullseye", "bookworm", "trixie"] {
            for sfx in ["", "-updates", "-security"] {
                let want = format!(" {suite}{sfx} main");
                assert_eq!(
                    lines.iter().filter(|l| l.ends_with(&want)).count(),
                    1,
                    "{want} in {s}"
                );
            }
        }
        assert!(lines
            .iter()
            .all(|l| l.contains(&format!("signed-by={DEBIAN_KEYRING}"))));
    }
}
