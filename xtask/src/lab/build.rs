//! Guest kernels the lab builds itself, for what no Debian kernel package is built with
//! (io.latency): Debian's kernel source package (fetched with the lab's own apt, like the
//! prebuilt kernels), configured as x86_64's defconfig + kvm_guest.config + a fragment of the
//! project's (scripts/lab/), built with `make -j<CPUs>` and installed into
//! `cache/kernels/<name>` the way an unpacked package is laid out. Built once per source
//! version and fragment; the build tree (a few GiB with debug info, which BTF needs) is
//! removed afterwards.
use std::{
    collections::hash_map::DefaultHasher,
    fs,
    hash::{Hash, Hasher},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, ensure, Context, Result};

use super::{apt::Apt, kernel::READY};
use crate::run_quiet;

/// Bumped when the recipe below changes, so that trees built by an older one are rebuilt.
const RECIPE: &str = "defconfig kvm_guest.config fragment; bzImage modules; v1";

/// Builds (unless built) `source` with scripts/lab/`fragment`; returns the installed tree.
pub fn build(source: &str, fragment: &str, apt: &Apt, cache: &Path) -> Result<PathBuf> {
    let fragment_path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts/lab")
        .join(fragment);
    let options = fs::read_to_string(&fragment_path)
        .with_context(|| format!("cannot read {}", fragment_path.display()))?;
    let mut h = DefaultHasher::new();
    (RECIPE, &options).hash(&mut h);
    let tag = format!("{:016x}", h.finish());
    let kernels = cache.join("kernels");
    let version = match apt.candidate_version(source) {
        Ok(v) => v,
        Err(e) => {
            // Offline: any tree built from this source with this fragment will do.
            if let Some(t) = built_trees(&kernels, source, &tag).pop() {
                eprintln!(
                    "lab: {e:#}; using the kernel built before in {}",
                    t.display()
                );
                return Ok(t);
            }
            return Err(e.context(format!("cannot tell which {source} to build")));
        }
    };
    let tree = kernels.join(format!("{source}_{version}-{tag}"));
    if tree.join(READY).exists() {
        return Ok(tree);
    }
    let deb = apt.fetch_deb(source, Some(&version), &cache.join("debs"))?;
    let work = cache.join("build").join(format!("{source}-{tag}"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let src = unpack_source(&deb, &work)?;
    configure(&src, &fragment_path, &options)?;
    let log = cache.join("build").join(format!("{source}-{tag}.log"));
    let _ = fs::remove_file(&log);
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    eprintln!(
        "lab: building {source} {version} with scripts/lab/{fragment} (make -j{jobs}; about \
         22 CPU-minutes; log {})",
        log.display()
    );
    make(&src, &[&format!("-j{jobs}"), "bzImage", "modules"], &log)?;
    // Trees of this source built before (another version, fragment or recipe) are stale now.
    for e in fs::read_dir(&kernels).into_iter().flatten().flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("{source}_"))
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    let tmp = kernels.join(format!("{source}_{version}-{tag}.partial"));
    fs::create_dir_all(tmp.join("boot"))?;
    let mod_path = format!("INSTALL_MOD_PATH={}", tmp.display());
    make(
        &src,
        &["modules_install", &mod_path, "INSTALL_MOD_STRIP=1"],
        &log,
    )?;
    let release = run_quiet(
        Command::new("make")
            .arg("-s")
            .arg("kernelrelease")
            .current_dir(&src),
    )?;
    fs::copy(
        src.join("arch/x86/boot/bzImage"),
        tmp.join("boot").join(format!("vmlinuz-{release}")),
    )?;
    fs::copy(
        src.join(".config"),
        tmp.join("boot").join(format!("config-{release}")),
    )?;
    // modules_install leaves links back into the build tree, which is going away.
    for l in ["build", "source"] {
        let _ = fs::remove_file(tmp.join("lib/modules").join(&release).join(l));
    }
    fs::write(tmp.join(READY), format!("{source} {version} {fragment}\n"))?;
    fs::rename(&tmp, &tree)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), tree.display()))?;
    fs::remove_dir_all(&work)?;
    let _ = fs::remove_file(&deb);
    eprintln!("lab: built {release} into {}", tree.display());
    Ok(tree)
}

/// Ready trees built from `source` with the fragment tagged `tag`.
fn built_trees(kernels: &Path, source: &str, tag: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(kernels)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("{source}_")) && n.ends_with(&format!("-{tag}"))
            }) && p.join(READY).exists()
        })
        .collect();
    v.sort();
    v
}

/// The source tree of Debian's linux-source package `deb` (its /usr/src/linux-source-X.tar.xz,
/// Debian's patches applied), unpacked under `work`.
fn unpack_source(deb: &Path, work: &Path) -> Result<PathBuf> {
    let pkg = work.join("pkg");
    run_quiet(Command::new("dpkg").arg("-x").arg(deb).arg(&pkg))?;
    let tarball = fs::read_dir(pkg.join("usr/src"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".tar.xz"))
        .with_context(|| format!("{} has no usr/src/*.tar.xz", deb.display()))?;
    run_quiet(
        Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(work),
    )?;
    fs::remove_dir_all(&pkg)?;
    let name = tarball.file_name().unwrap().to_string_lossy();
    let src = work.join(name.trim_end_matches(".tar.xz"));
    ensure!(
        src.join("Makefile").exists(),
        "no kernel tree in {}",
        src.display()
    );
    Ok(src)
}

/// defconfig + kvm_guest.config + the fragment, and every option of the fragment checked in
/// the result: an option the kernel's dependencies turned off fails the build here, not a
/// test in the guest.
fn configure(src: &Path, fragment_path: &Path, options: &str) -> Result<()> {
    run_quiet(
        Command::new("make")
            .args(["defconfig", "kvm_guest.config"])
            .current_dir(src),
    )?;
    run_quiet(
        Command::new("scripts/kconfig/merge_config.sh")
            .args(["-m", ".config"])
            .arg(fragment_path)
            .current_dir(src),
    )?;
    run_quiet(Command::new("make").arg("olddefconfig").current_dir(src))?;
    let config = fs::read_to_string(src.join(".config"))?;
    for want in options.lines().map(str::trim) {
        if want.is_empty() || want.starts_with('#') {
            continue;
        }
        let Some((name, value)) = want.split_once('=') else {
            bail!("{}: not NAME=VALUE: {want}", fragment_path.display());
        };
        let holds = if value == "n" {
            !config.lines().any(|l| l.starts_with(&format!("{name}=")))
        } else {
            config.lines().any(|l| l == want)
        };
        ensure!(
            holds,
            "the kernel's configuration did not keep {want} from {} (a dependency missing?)",
            fragment_path.display()
        );
    }
    Ok(())
}

/// `make ARGS` in `src`, its output appended to `log`; on failure, the log's end.
fn make(src: &Path, args: &[&str], log: &Path) -> Result<()> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let status = Command::new("make")
        .args(args)
        .current_dir(src)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .context("cannot start make (scripts/setup --lab installs the kernel's build tools)")?;
    if !status.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "make {} failed ({status}); the end of {}:\n{}",
            args.join(" "),
            log.display(),
            tail.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragment_is_in_the_tree_and_asks_for_io_latency() {
        let f = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lab/kernel-iolatency.config"),
        )
        .unwrap();
        assert!(f.lines().any(|l| l == "CONFIG_BLK_CGROUP_IOLATENCY=y"));
        assert!(f.lines().any(|l| l == "CONFIG_DEBUG_INFO_BTF=y"));
    }
}
