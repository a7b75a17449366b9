//! `cargo xtask dist`: what a machine without a toolchain installs. One statically linked
//! binary (glibc's crt-static: no shared libraries, so one build runs on any x86-64 Linux with
//! BTF), its man pages and shell completions (generated from the CLI by `mergetrace __docs`),
//! a systemd unit for the exporter, as a tarball and a Debian package. Each artefact is checked
//! before it is called done: the binary is static and runs, the pages and completions exist,
//! the package lists what it installs.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{cargo, workspace_root};

const TARGET: &str = "x86_64-unknown-linux-gnu";

#[derive(clap::Args, Debug)]
pub struct DistArgs {
    /// Where the tarball and the .deb go.
    #[arg(long, default_value = "target/dist")]
    out: PathBuf,
}

/// The unit `serve` runs under: the exporter on loopback, restarted if it stops.
const SERVICE: &str = "[Unit]
Description=mergetrace Prometheus exporter (per-cgroup bios, merges and requests)
Documentation=man:mergetrace-serve(1)
After=local-fs.target

[Service]
# Trace every disk given here; see `mergetrace serve --help` for the flags.
Environment=MERGETRACE_ARGS=\"-d vda\"
ExecStart=/usr/bin/mergetrace serve $MERGETRACE_ARGS
Restart=on-failure
# Loading eBPF programs needs CAP_BPF and CAP_PERFMON (or root); reading cgroups and sysfs
# needs nothing more.
AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_SYS_RESOURCE
CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYS_RESOURCE CAP_SYS_ADMIN
NoNewPrivileges=yes
# It only reads: the file system, /sys and /proc stay read-only or hidden.
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
LockPersonality=yes

[Install]
WantedBy=multi-user.target
";

pub fn run(args: &DistArgs) -> Result<()> {
    let root = workspace_root();
    let version = package_version(&root)?;
    let out = root.join(&args.out);
    let bin = build_static(&root)?;
    check_static(&bin)?;

    let name = format!("mergetrace-{version}-x86_64-linux");
    let stage = out.join(&name);
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(stage.join("bin"))?;
    fs::copy(&bin, stage.join("bin/mergetrace")).context("cannot stage the binary")?;
    let share = stage.join("share");
    let docs = Command::new(&bin)
        .arg("__docs")
        .arg("--out")
        .arg(&share)
        .status()
        .context("cannot run mergetrace __docs")?;
    ensure!(docs.success(), "mergetrace __docs failed");
    for page in ["mergetrace.1", "mergetrace-check.1", "mergetrace-serve.1"] {
        ensure!(
            share.join("man/man1").join(page).is_file(),
            "man page {page} was not generated"
        );
    }
    fs::create_dir_all(share.join("systemd"))?;
    let unit = share.join("systemd/mergetrace-serve.service");
    fs::write(&unit, SERVICE)?;
    verify_unit(&unit, &stage.join("bin/mergetrace"))?;
    fs::copy(root.join("README.md"), stage.join("README.md"))?;

    let tarball = out.join(format!("{name}.tar.gz"));
    sh(Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&out)
        .arg(&name))?;
    let deb = debian_package(&stage, &out, &version)?;
    eprintln!("dist: {}", tarball.display());
    eprintln!("dist: {}", deb.display());
    Ok(())
}

/// The workspace's version (`[workspace.package]`, which mergetrace inherits).
fn package_version(root: &Path) -> Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_string)
        .context("no version in the workspace's Cargo.toml")
}

/// `cargo build --release` with glibc linked in statically.
fn build_static(root: &Path) -> Result<PathBuf> {
    let mut c = cargo();
    c.args(["build", "--release", "-p", "mergetrace", "--target", TARGET])
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        );
    sh(&mut c)?;
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(dir.join(TARGET).join("release/mergetrace"))
}

/// The binary needs no shared library and runs.
fn check_static(bin: &Path) -> Result<()> {
    let ldd = Command::new("ldd")
        .arg(bin)
        .output()
        .context("cannot run ldd")?;
    let said =
        String::from_utf8_lossy(&ldd.stdout).to_string() + &String::from_utf8_lossy(&ldd.stderr);
    if !said.contains("not a dynamic executable") && !said.contains("statically linked") {
        bail!("{} is not static; ldd says: {said}", bin.display());
    }
    let v = Command::new(bin).arg("--version").output()?;
    ensure!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).starts_with("mergetrace "),
        "the static binary does not run: {}",
        String::from_utf8_lossy(&v.stderr)
    );
    Ok(())
}

/// `systemd-analyze verify` on the unit, with ExecStart pointed at the staged binary (the
/// installed path does not exist here). Skipped with a note where systemd is not installed.
fn verify_unit(unit: &Path, bin: &Path) -> Result<()> {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("dist: systemd-analyze is not installed: the unit file is not verified");
        return Ok(());
    }
    let dir = unit
        .parent()
        .expect("the unit is in a directory")
        .join("verify");
    fs::create_dir_all(&dir)?;
    let copy = dir.join("mergetrace-serve.service");
    let text = SERVICE.replace("/usr/bin/mergetrace", &bin.display().to_string());
    fs::write(&copy, text)?;
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .context("cannot run systemd-analyze")?;
    let _ = fs::remove_dir_all(&dir);
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && !said.contains("mergetrace-serve.service:"),
        "systemd-analyze verify rejects the unit: {said}"
    );
    Ok(())
}

/// A .deb built with dpkg-deb from the staged tree: /usr/bin, man pages, completions, the unit.
fn debian_package(stage: &Path, out: &Path, version: &str) -> Result<PathBuf> {
    let pkg = out.join("deb");
    let _ = fs::remove_dir_all(&pkg);
    let copy = |from: &str, to: &str| -> Result<()> {
        let dest = pkg.join(to);
        fs::create_dir_all(dest.parent().expect("a file in a directory"))?;
        fs::copy(stage.join(from), &dest).with_context(|| format!("cannot copy {from}"))?;
        Ok(())
    };
    copy("bin/mergetrace", "usr/bin/mergetrace")?;
    for entry in fs::read_dir(stage.join("share/man/man1"))? {
        let name = entry?.file_name().to_string_lossy().to_string();
        copy(
            &format!("share/man/man1/{name}"),
            &format!("usr/share/man/man1/{name}"),
        )?;
    }
    copy(
        "share/completions/mergetrace.bash",
        "usr/share/bash-completion/completions/mergetrace",
    )?;
    copy(
        "share/completions/_mergetrace",
        "usr/share/zsh/vendor-completions/_mergetrace",
    )?;
    copy(
        "share/completions/mergetrace.fish",
        "usr/share/fish/vendor_completions.d/mergetrace.fish",
    )?;
    copy(
        "share/systemd/mergetrace-serve.service",
        "lib/systemd/system/mergetrace-serve.service",
    )?;
    fs::create_dir_all(pkg.join("DEBIAN"))?;
    fs::write(
        pkg.join("DEBIAN/control"),
        format!(
            "Package: mergetrace\nVersion: {version}\nArchitecture: amd64\nMaintainer: mergetrace \
             developers <mergetrace@localhost>\nSection: admin\nPriority: optional\nDescription: \
             per-cgroup view of block-layer merging and where each I/O limit is charged\n \
             eBPF tracer: the bios blk-throttle charged, the merges by path and the requests the\n \
             device saw, per cgroup, with a verdict on what merging buys under each meter.\n"
        ),
    )?;
    let deb = out.join(format!("mergetrace_{version}_amd64.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(&deb))?;
    let listing = Command::new("dpkg-deb")
        .arg("--contents")
        .arg(&deb)
        .output()?;
    let listing = String::from_utf8_lossy(&listing.stdout);
    for want in [
        "./usr/bin/mergetrace",
        "./usr/share/man/man1/mergetrace.1",
        "./lib/systemd/system/mergetrace-serve.service",
    ] {
        ensure!(listing.contains(want), "the .deb lacks {want}:\n{listing}");
    }
    Ok(deb)
}

fn sh(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}
