//! Guest kernels for the lab: Debian's prebuilt cloud kernels, fetched with `apt-get download`
//! through the lab's own apt configuration ([`Apt`]: its own sources.list, lists, cache and
//! trusted keys under the cache directory; the host's /etc/apt sources and lists are never
//! read or changed), unpacked with `dpkg -x` into a cache (never installed on the host); each
//! gets its initramfs from [`super::initramfs`].
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Context, Result};

use super::apt::Apt;
use crate::run_quiet;

/// A kernel series the lab knows: which Debian release has it and where its kernel comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// What `--kernel` takes: "5.10", "6.1", "6.12", "trixie", "7.3", "6.1-iolatency".
    pub name: &'static str,
    /// The Debian suite that carries it: a release (its `S`, `S-updates` and `S-security`
    /// suites are searched) or a `…-backports` suite (searched alone).
    pub suite: &'static str,
    pub origin: Origin,
    /// Part of `--kernel all`.
    pub in_all: bool,
}

/// Where a series' kernel comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Debian's prebuilt cloud kernel. Package name = prefix + a number + infix (+ "." + a
    /// rebuild number) + suffix; the highest (number, rebuild) wins.
    Prebuilt {
        prefix: &'static str,
        infix: &'static str,
        suffix: &'static str,
        /// Where the package carries the kernel alone (Debian from 6.19 on:
        /// `linux-binary-unsigned-…`; `linux-image-…` is then a meta package): the prefixes
        /// that replace `prefix` in the names of the packages with the rest, of the same
        /// version (`linux-modules-…`: the modules; `linux-base-…`: modules.builtin,
        /// modules.order, the config). All are unpacked into one tree.
        companions: &'static [&'static str],
    },
    /// Built by the lab ([`super::build`]) from Debian's kernel source package `source`, with
    /// the options in scripts/lab/`fragment` on top of x86_64's defconfig and kvm_guest.config.
    Built {
        source: &'static str,
        fragment: &'static str,
    },
}

pub const SERIES: [Series; 6] = [
    // Debian 11: linux-image-5.10.0-46-cloud-amd64 (5.10.262-1, bullseye-security). The signed
    // package (source linux-signed-amd64: the same kernel and modules, with signatures): the
    // mirror lists bullseye's -unsigned ones but answers 404 for their files.
    Series {
        name: "5.10",
        suite: "bullseye",
        origin: Origin::Prebuilt {
            prefix: "linux-image-5.10.0-",
            infix: "",
            suffix: "-cloud-amd64",
            companions: &[],
        },
        in_all: true,
    },
    // Debian 12: linux-image-6.1.0-57-cloud-amd64-unsigned (6.1.192)
    Series {
        name: "6.1",
        suite: "bookworm",
        origin: Origin::Prebuilt {
            prefix: "linux-image-6.1.0-",
            infix: "",
            suffix: "-cloud-amd64-unsigned",
            companions: &[],
        },
        in_all: true,
    },
    // Debian 12: linux-image-6.12.117+deb12-cloud-amd64-unsigned
    Series {
        name: "6.12",
        suite: "bookworm",
        origin: Origin::Prebuilt {
            prefix: "linux-image-6.12.",
            infix: "+deb12",
            suffix: "-cloud-amd64-unsigned",
            companions: &[],
        },
        in_all: true,
    },
    // Debian 13: linux-image-6.12.118+deb13-cloud-amd64-unsigned (trixie-security). The same
    // series as bookworm's 6.12 (a patch level apart, built by trixie's toolchain), so not in
    // `all`.
    Series {
        name: "trixie",
        suite: "trixie",
        origin: Origin::Prebuilt {
            prefix: "linux-image-6.12.",
            infix: "+deb13",
            suffix: "-cloud-amd64-unsigned",
            companions: &[],
        },
        in_all: false,
    },
    // Debian 13's backports: linux-binary-unsigned-7.3.4+deb13-cloud-amd64 (the kernel, at
    // usr/lib/modules/<release>/vmlinuz.unsigned), linux-modules-7.3.4+deb13-cloud-amd64 (its
    // modules, without modules.dep) and linux-base-7.3.4+deb13-cloud-amd64 (modules.builtin). The newest kernel Debian builds: blk-throttle reworked (6.16), the
    // plug no longer opened by __submit_bio (7.2).
    Series {
        name: "7.3",
        suite: "trixie-backports",
        origin: Origin::Prebuilt {
            prefix: "linux-binary-unsigned-7.3.",
            infix: "+deb13",
            suffix: "-cloud-amd64",
            companions: &["linux-modules-7.3.", "linux-base-7.3."],
        },
        in_all: true,
    },
    // Debian 12's 6.1 source, built with io.latency (CONFIG_BLK_CGROUP_IOLATENCY), which no
    // Debian (nor Ubuntu) kernel package has: the one meter the others cannot show. A small
    // build (defconfig, no distribution drivers), for the tests of that meter; not in `all`.
    Series {
        name: "6.1-iolatency",
        suite: "bookworm",
        origin: Origin::Built {
            source: "linux-source-6.1",
            fragment: "kernel-iolatency.config",
        },
        in_all: false,
    },
];

/// What `--kernel` accepts: every series, and "all".
pub const KERNEL_NAMES: [&str; 7] = [
    "5.10",
    "6.1",
    "6.12",
    "trixie",
    "7.3",
    "6.1-iolatency",
    "all",
];

impl Series {
    pub fn by_name(name: &str) -> Option<Series> {
        SERIES.iter().copied().find(|s| s.name == name)
    }

    /// The series `--kernel all` means.
    pub fn all() -> Vec<Series> {
        SERIES.iter().copied().filter(|s| s.in_all).collect()
    }

    /// (number, rebuild) in `pkg` if it is one of this series' packages: "…-57-…" is
    /// (57, 0), "…6.12.115+deb13.1-…" (115, 1).
    fn number(&self, pkg: &str) -> Option<(u64, u64)> {
        let Origin::Prebuilt {
            prefix,
            infix,
            suffix,
            ..
        } = self.origin
        else {
            return None;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let mid = pkg.strip_prefix(prefix)?.strip_suffix(suffix)?;
        let end = mid.find(|c: char| !c.is_ascii_digit()).unwrap_or(mid.len());
        let (n, rest) = mid.split_at(end);
        let rest = rest.strip_prefix(infix)?;
        let rebuild = match rest {
            "" => 0,
            r => {
                let r = r.strip_prefix('.')?;
                if !digits(r) {
                    return None;
                }
                r.parse().ok()?
            }
        };
        if !digits(n) {
            return None;
        }
        Some((n.parse().ok()?, rebuild))
    }

    /// Its package names, with N for the number.
    fn pattern(&self) -> String {
        match self.origin {
            Origin::Prebuilt {
                prefix,
                infix,
                suffix,
                ..
            } => format!("{prefix}N{infix}{suffix}"),
            Origin::Built { source, .. } => source.to_string(),
        }
    }

    /// The packages that complete `image` (a package of this series) where it carries the
    /// kernel alone; none otherwise.
    fn companions(&self, image: &str) -> Vec<String> {
        let Origin::Prebuilt {
            prefix, companions, ..
        } = self.origin
        else {
            return Vec::new();
        };
        let Some(rest) = image.strip_prefix(prefix) else {
            return Vec::new();
        };
        companions.iter().map(|c| format!("{c}{rest}")).collect()
    }

    /// The newest of `pkgs` in this series.
    fn newest<'a>(&self, pkgs: impl IntoIterator<Item = &'a str>) -> Option<String> {
        pkgs.into_iter()
            .filter_map(|p| self.number(p).map(|n| (n, p)))
            .max()
            .map(|(_, p)| p.to_string())
    }
}

/// An unpacked guest kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    /// `uname -r` in the guest, e.g. "6.1.0-57-cloud-amd64".
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` in the unpacked tree (modules.dep made by depmod -b).
    pub moddir: PathBuf,
}

/// Which package to use for `series`: the newest the lab's apt lists know (after an
/// `apt-get update` when they are stale or know none of the series), else the newest already
/// in the cache (offline).
fn pick_package(series: Series, apt: &Apt, cache: &Path) -> Result<String> {
    let mut known = apt.kernel_packages().unwrap_or_default();
    let none = series.newest(known.iter().map(String::as_str)).is_none();
    if (none && !apt.tried.get()) || apt.stale() {
        if none {
            eprintln!(
                "lab: no {} cloud kernel in the lab's apt lists",
                series.name
            );
        }
        match apt.update() {
            Ok(()) => known = apt.kernel_packages().unwrap_or_default(),
            Err(e) => eprintln!("lab: apt-get update failed: {e:#}"),
        }
    }
    if let Some(p) = series.newest(known.iter().map(String::as_str)) {
        return Ok(p);
    }
    let cached: Vec<String> = fs::read_dir(cache.join("kernels"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(READY).exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    series
        .newest(cached.iter().map(String::as_str))
        .with_context(|| {
            format!(
                "no package {} in the lab's apt lists ({} suites), even after apt-get update, and none cached",
                series.pattern(),
                series.suite
            )
        })
}

/// Marks a fully unpacked (or built and installed) kernel tree.
pub(super) const READY: &str = ".mt-lab-ready";

/// The kernel of `series`: Debian's newest package of it, fetched and unpacked into
/// `cache/kernels/<package>`, or built there from source ([`super::build`]), unless it is
/// already there.
pub fn fetch(series: Series, apt: &Apt, cache: &Path) -> Result<Kernel> {
    if let Origin::Built { source, fragment } = series.origin {
        let tree = super::build::build(source, fragment, apt, cache)?;
        return installed(
            &tree,
            tree.file_name().unwrap().to_string_lossy().into_owned(),
        );
    }
    let package = pick_package(series, apt, cache)?;
    let tree = cache.join("kernels").join(&package);
    if !tree.join(READY).exists() {
        let mut debs = vec![apt.fetch_deb(&package, None, &cache.join("debs"))?];
        for companion in series.companions(&package) {
            debs.push(apt.fetch_deb(&companion, None, &cache.join("debs"))?);
        }
        // Not tree.with_extension, which makes "linux-image-6.12.117+deb12-…" into
        // "linux-image-6.12.partial", the same for bookworm's and trixie's 6.12.
        let tmp = cache.join("kernels").join(format!("{package}.partial"));
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&tree);
        fs::create_dir_all(&tmp)?;
        for deb in &debs {
            eprintln!("lab: unpacking {} (dpkg -x, not installed)", deb.display());
            run_quiet(Command::new("dpkg").arg("-x").arg(deb).arg(&tmp))?;
        }
        // Trixie's packages ship merged-/usr trees (usr/lib/modules); give them the lib ->
        // usr/lib link a merged-/usr system has, for depmod -b and the paths below.
        if !tmp.join("lib").exists() && tmp.join("usr/lib/modules").is_dir() {
            std::os::unix::fs::symlink("usr/lib", tmp.join("lib"))
                .context("cannot link lib to usr/lib in the unpacked kernel")?;
        }
        let release = release_of(&tmp)?;
        if !tmp
            .join("lib/modules")
            .join(&release)
            .join("modules.dep")
            .exists()
        {
            // Debian's packages leave modules.dep to depmod at install time; make it here.
            run_quiet(Command::new(depmod()).arg("-b").arg(&tmp).arg(&release))
                .context("depmod -b on the unpacked kernel")?;
        }
        fs::write(tmp.join(READY), &package)?;
        fs::rename(&tmp, &tree)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), tree.display()))?;
        for deb in &debs {
            let _ = fs::remove_file(deb);
        }
    }
    installed(&tree, package)
}

/// The kernel unpacked or installed in `tree`.
fn installed(tree: &Path, package: String) -> Result<Kernel> {
    let release = release_of(tree)?;
    let moddir = tree.join("lib/modules").join(&release);
    // boot/vmlinuz-RELEASE, or (Debian's split packages from 6.19 on) beside the modules:
    // vmlinuz.unsigned in linux-binary-unsigned-…, vmlinuz in the signed linux-binary-….
    let vmlinuz = [
        tree.join("boot").join(format!("vmlinuz-{release}")),
        moddir.join("vmlinuz.unsigned"),
        moddir.join("vmlinuz"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .with_context(|| {
        format!(
            "no kernel in {}: no boot/vmlinuz-{release}, nor lib/modules/{release}/vmlinuz.unsigned or vmlinuz",
            tree.display()
        )
    })?;
    Ok(Kernel {
        package,
        moddir,
        release,
        vmlinuz,
    })
}

pub(super) fn depmod() -> PathBuf {
    ["/usr/sbin/depmod", "/sbin/depmod"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| "depmod".into())
}

/// The one `lib/modules/<release>` in an unpacked tree.
fn release_of(tree: &Path) -> Result<String> {
    let dir = tree.join("lib/modules");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ensure!(
        names.len() == 1,
        "expected one kernel in {}, found {names:?}",
        dir.display()
    );
    Ok(names.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn picks_the_newest_package_of_each_series() {
        let pkgs = [
            "linux-image-6.1.0-47-cloud-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64-unsigned",
            "linux-image-6.1.0-9-cloud-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64-dbg",
            "linux-image-6.12.107+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.99+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.118+deb13-cloud-amd64-unsigned",
            "linux-image-6.12.116+deb13.2-cloud-amd64-unsigned",
            "linux-image-6.1.0-0.deb11.52-cloud-amd64-unsigned",
            "linux-image-5.10.0-47-cloud-amd64-unsigned",
            "linux-image-5.10.0-46-cloud-amd64",
            "linux-image-5.10.0-9-cloud-amd64",
            "linux-image-6.1.0-58-cloud-amd64",
            "linux-binary-unsigned-7.3.4+deb13-cloud-amd64",
            "linux-binary-unsigned-7.3.12+deb13-cloud-amd64",
            "linux-binary-unsigned-7.3.9+deb13-cloud-amd64",
            "linux-binary-unsigned-7.2.8+deb13-cloud-amd64",
            "linux-binary-unsigned-7.3.12+deb13-cloud-amd64-dbg",
            "linux-modules-7.3.13+deb13-cloud-amd64",
            "linux-image-7.3.13+deb13-cloud-amd64",
        ];
        let s510 = Series::by_name("5.10").unwrap();
        let s61 = Series::by_name("6.1").unwrap();
        let s612 = Series::by_name("6.12").unwrap();
        let trixie = Series::by_name("trixie").unwrap();
        let s73 = Series::by_name("7.3").unwrap();
        assert_eq!(
            s73.newest(pkgs).as_deref(),
            Some("linux-binary-unsigned-7.3.12+deb13-cloud-amd64")
        );
        assert_eq!(
            s73.companions("linux-binary-unsigned-7.3.12+deb13-cloud-amd64"),
            [
                "linux-modules-7.3.12+deb13-cloud-amd64",
                "linux-base-7.3.12+deb13-cloud-amd64"
            ]
        );
        assert!(s612
            .companions("linux-image-6.12.117+deb12-cloud-amd64-unsigned")
            .is_empty());
        assert_eq!(
            s510.newest(pkgs).as_deref(),
            Some("linux-image-5.10.0-46-cloud-amd64")
        );
        assert_eq!(
            trixie.newest(pkgs).as_deref(),
            Some("linux-image-6.12.118+deb13-cloud-amd64-unsigned")
        );
        assert_eq!(
            trixie.number("linux-image-6.12.115+deb13.1-cloud-amd64-unsigned"),
            Some((115, 1))
        );
        assert_eq!(
            trixie.number("linux-image-6.12.115+deb13x-cloud-amd64-unsigned"),
            None
        );
        assert_eq!(
            s61.number("linux-image-6.1.0-0.deb11.52-cloud-amd64-unsigned"),
            None
        );
        assert_eq!(
            s61.newest(pkgs).as_deref(),
            Some("linux-image-6.1.0-57-cloud-amd64-unsigned")
        );
        assert_eq!(
            s612.newest(pkgs).as_deref(),
            Some("linux-image-6.12.117+deb12-cloud-amd64-unsigned")
        );
    }

    #[test]
    fn kernel_names_and_all() {
        let mut names: Vec<&str> = SERIES.iter().map(|s| s.name).collect();
        names.push("all");
        assert_eq!(names, KERNEL_NAMES);
        let all: Vec<&str> = Series::all().iter().map(|s| s.name).collect();
        assert_eq!(all, ["5.10", "6.1", "6.12", "7.3"]);
    }
}
