//! `cargo xtask dist`: what a machine without a toolchain installs. One statically linked
//! binary (glibc's crt-static: no shared libraries, so one build runs on any x86-64 Linux with
//! BTF), its man pages and shell completions (generated from the CLI by `mergetrace __docs`),
//! a systemd unit for the exporter, as a tarball, a Debian package and an RPM package; and the
//! binary alone as an OCI image archive ([`oci`]). Each artefact is checked before it is called
//! done: the binary is static and runs, the pages and completions exist; the .rpm lists and
//! unpacks the tarball's files; the .deb installs them into an empty root, where its binary
//! runs and its unit verifies; the image's blobs match their digests and its one layer holds
//! the tarball's binary (see [`check_packages`]).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

use crate::{cargo, workspace_root};

mod oci;

const TARGET: &str = "x86_64-unknown-linux-gnu";

#[derive(clap::Args, Debug)]
pub struct DistArgs {
    /// Where the tarball, the .deb, the .rpm and the OCI image archive go.
    #[arg(long, default_value = "target/dist")]
    out: PathBuf,
}

/// The unit `serve` runs under: the exporter on loopback, restarted if it stops, as a user of
/// its own with the capabilities loading needs and no other (docs/serve-security.md).
const SERVICE: &str = "[Unit]
Description=mergetrace Prometheus exporter (per-cgroup bios, merges and requests)
Documentation=man:mergetrace-serve(1)
After=local-fs.target

[Service]
# Trace every disk given here; see `mergetrace serve --help` for the flags. TLS and basic
# auth: add --web.config.file /etc/mergetrace/web-config.yml (the Prometheus
# exporter-toolkit's format), reread when it changes or on
# `systemctl kill --signal=HUP mergetrace-serve`.
Environment=MERGETRACE_ARGS=\"-d vda\"
ExecStart=/usr/bin/mergetrace serve $MERGETRACE_ARGS
Restart=on-failure
# Never root: a user systemd makes for the service, with only these capabilities. Loading
# and attaching the programs needs CAP_BPF and CAP_PERFMON, reading kallsyms' addresses (the
# merge paths) CAP_SYSLOG, reading root's files (container names, the web config's key)
# CAP_DAC_READ_SEARCH. Once attached, serve keeps CAP_BPF, CAP_PERFMON and
# CAP_DAC_READ_SEARCH only, and sets no_new_privs itself too.
DynamicUser=yes
AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_SYSLOG CAP_DAC_READ_SEARCH
CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_SYSLOG CAP_DAC_READ_SEARCH
NoNewPrivileges=yes
# Kernels before 5.11 charge BPF maps to the locked-memory limit.
LimitMEMLOCK=infinity
# It only reads: the file system, /sys, /proc/sys and the cgroups stay read-only.
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelModules=yes
ProtectKernelTunables=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native

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
    fs::copy(root.join("README.md"), stage.join("README.md"))?;
    for license in LICENSES {
        fs::copy(root.join(license), stage.join(license))?;
    }
    let files = layout(&stage)?;

    let tarball = out.join(format!("{name}.tar.gz"));
    sh(Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&out)
        .arg(&name))?;
    let license = workspace_field(&root, "license")?;
    let deb = debian_package(&stage, &files, &out, &version)?;
    let rpm = rpm_package(&stage, &files, &out, &version, &package_license(&root)?)?;
    let about = oci::About {
        version: &version,
        license: &license,
        description: SUMMARY,
    };
    let image = oci::build(&stage.join("bin/mergetrace"), &out, &about)?;
    check_packages(&files, [&tarball, &deb, &rpm, &image], &out, &version)?;
    for artefact in [&tarball, &deb, &rpm, &image] {
        eprintln!("dist: {}", artefact.display());
    }
    Ok(())
}

/// The workspace's version (`[workspace.package]`, which mergetrace inherits).
fn package_version(root: &Path) -> Result<String> {
    workspace_field(root, "version")
}

/// A `key = "value"` line of the workspace's Cargo.toml (`[workspace.package]` comes first).
fn workspace_field(root: &Path, key: &str) -> Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let prefix = format!("{key} = \"");
    manifest
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_string)
        .with_context(|| format!("no {key} in the workspace's Cargo.toml"))
}

/// The license texts, at the top of the tarball and in the packages' doc directory: the binary
/// is MIT OR Apache-2.0 and embeds the eBPF object, which is GPL-2.0 (README, "License").
const LICENSES: [&str; 3] = ["LICENSE-MIT", "LICENSE-APACHE", "LICENSE-GPL2"];

/// The packages' license: the workspace's (user space) and the eBPF crate's (the object the
/// binary embeds), as one SPDX expression.
fn package_license(root: &Path) -> Result<String> {
    let ebpf = fs::read_to_string(root.join("mergetrace-ebpf/Cargo.toml"))?;
    let ebpf = ebpf
        .lines()
        .find_map(|l| l.strip_prefix("license = \""))
        .and_then(|v| v.strip_suffix('"'))
        .context("no license in mergetrace-ebpf's Cargo.toml")?;
    Ok(format!(
        "({}) AND {ebpf}",
        workspace_field(root, "license")?
    ))
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

/// Where each staged file goes: its path in the tarball's tree, in the .deb and in the .rpm
/// (absolute paths without the leading slash). The two packages hold the same files; they
/// differ only where the distributions look: Debian 12 keeps units in /lib/systemd/system and
/// zsh's packaged completions in vendor-completions, the rpm distributions in
/// /usr/lib/systemd/system and site-functions.
struct Placed {
    staged: String,
    deb: String,
    rpm: String,
    executable: bool,
}

fn layout(stage: &Path) -> Result<Vec<Placed>> {
    let both = |staged: &str, to: &str| Placed {
        staged: staged.into(),
        deb: to.into(),
        rpm: to.into(),
        executable: false,
    };
    let mut files = vec![Placed {
        executable: true,
        ..both("bin/mergetrace", "usr/bin/mergetrace")
    }];
    let mut pages: Vec<String> = fs::read_dir(stage.join("share/man/man1"))?
        .map(|e| Ok(e?.file_name().to_string_lossy().to_string()))
        .collect::<Result<_>>()?;
    pages.sort();
    for name in pages {
        files.push(both(
            &format!("share/man/man1/{name}"),
            &format!("usr/share/man/man1/{name}"),
        ));
    }
    files.push(both(
        "share/completions/mergetrace.bash",
        "usr/share/bash-completion/completions/mergetrace",
    ));
    files.push(Placed {
        deb: "usr/share/zsh/vendor-completions/_mergetrace".into(),
        rpm: "usr/share/zsh/site-functions/_mergetrace".into(),
        ..both("share/completions/_mergetrace", "")
    });
    files.push(both(
        "share/completions/mergetrace.fish",
        "usr/share/fish/vendor_completions.d/mergetrace.fish",
    ));
    files.push(Placed {
        deb: "lib/systemd/system/mergetrace-serve.service".into(),
        rpm: "usr/lib/systemd/system/mergetrace-serve.service".into(),
        ..both("share/systemd/mergetrace-serve.service", "")
    });
    for license in LICENSES {
        files.push(both(
            license,
            &format!("usr/share/doc/mergetrace/{license}"),
        ));
    }
    for f in &files {
        ensure!(
            stage.join(&f.staged).is_file(),
            "{} was not staged",
            f.staged
        );
    }
    Ok(files)
}

const SUMMARY: &str = "per-cgroup view of block-layer merging and where each I/O limit is charged";
const DESCRIPTION: &str = "eBPF tracer: the bios blk-throttle charged, the merges by path and the \
requests the\ndevice saw, per cgroup, with a verdict on what merging buys under each meter.";

/// A .deb built with dpkg-deb from the staged tree: /usr/bin, man pages, completions, the unit.
fn debian_package(stage: &Path, files: &[Placed], out: &Path, version: &str) -> Result<PathBuf> {
    let pkg = out.join("deb");
    let _ = fs::remove_dir_all(&pkg);
    for f in files {
        let dest = pkg.join(&f.deb);
        fs::create_dir_all(dest.parent().expect("a file in a directory"))?;
        fs::copy(stage.join(&f.staged), &dest)
            .with_context(|| format!("cannot copy {}", f.staged))?;
    }
    fs::create_dir_all(pkg.join("DEBIAN"))?;
    let description = DESCRIPTION.replace('\n', "\n ");
    fs::write(
        pkg.join("DEBIAN/control"),
        format!(
            "Package: mergetrace\nVersion: {version}\nArchitecture: amd64\nMaintainer: mergetrace \
             developers <mergetrace@localhost>\nSection: admin\nPriority: optional\nDescription: \
             {SUMMARY}\n {description}\n"
        ),
    )?;
    let deb = out.join(format!("mergetrace_{version}_amd64.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&pkg)
        .arg(&deb))?;
    let _ = fs::remove_dir_all(&pkg);
    Ok(deb)
}

/// An .rpm built by rpmbuild (Debian's `rpm` package, the one whose `rpm` and `rpm2cpio` check
/// it) from a spec whose %install copies the staged files: nothing is compiled, stripped or
/// compressed on the way (no debuginfo, no brp scripts, no build-id links), so every file is
/// byte for byte the tarball's. AutoReqProv is off: the binary is static and needs nothing.
fn rpm_package(
    stage: &Path,
    files: &[Placed],
    out: &Path,
    version: &str,
    license: &str,
) -> Result<PathBuf> {
    let top = out.join("rpmbuild");
    let _ = fs::remove_dir_all(&top);
    fs::create_dir_all(top.join("SPECS"))?;
    let mut install = String::new();
    let mut listed = String::new();
    for f in files {
        let mode = if f.executable { "0755" } else { "0644" };
        install.push_str(&format!(
            "install -D -m {mode} {}/{} %{{buildroot}}/{}\n",
            stage.display(),
            f.staged,
            f.rpm
        ));
        listed.push_str(&format!("/{}\n", f.rpm));
    }
    let spec = format!(
        "%global debug_package %{{nil}}
%global __os_install_post %{{nil}}
%global _build_id_links none
Name: mergetrace
Version: {version}
Release: 1
Summary: {SUMMARY}
License: {license}
BuildArch: x86_64
AutoReqProv: no

%description
{DESCRIPTION}

%install
{install}
%files
%defattr(-,root,root,-)
{listed}"
    );
    let spec_file = top.join("SPECS/mergetrace.spec");
    fs::write(&spec_file, spec)?;
    quiet(
        Command::new("rpmbuild")
            .arg("--define")
            .arg(format!("_topdir {}", top.display()))
            .arg("-bb")
            .arg(&spec_file),
        "rpmbuild (scripts/setup --dist installs Debian's rpm)",
    )?;
    let name = format!("mergetrace-{version}-1.x86_64.rpm");
    let rpm = out.join(&name);
    fs::rename(top.join("RPMS/x86_64").join(&name), &rpm)
        .with_context(|| format!("rpmbuild made no RPMS/x86_64/{name}"))?;
    let _ = fs::remove_dir_all(&top);
    Ok(rpm)
}

/// Each package checked as a user would meet it, in a scratch directory (removed after; left
/// in place when a check fails): the tarball unpacked; the .rpm listed with `rpm -qlp` and
/// unpacked with `rpm2cpio | cpio -id`; the .deb installed with `dpkg --root` into an empty
/// root (dpkg makes its database there), its status and files read back, its installed
/// binary run and its installed unit verified there, then purged; the OCI archive read back
/// blob by blob ([`oci::check`]). Every file each package holds is compared, byte for byte,
/// with the tarball's.
fn check_packages(
    files: &[Placed],
    [tarball, deb, rpm, image]: [&Path; 4],
    out: &Path,
    version: &str,
) -> Result<()> {
    let scratch = out.join("check");
    let _ = fs::remove_dir_all(&scratch);
    let tar_root = scratch.join("tar");
    fs::create_dir_all(&tar_root)?;
    sh(Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(&tar_root))?;
    let unpacked = tar_root.join(format!("mergetrace-{version}-x86_64-linux"));
    let same_as_tarball = |root: &Path, path: &str, f: &Placed, what: &str| -> Result<()> {
        let got = fs::read(root.join(path))
            .with_context(|| format!("{what} has no /{path} where it was meant to be"))?;
        let want = fs::read(unpacked.join(&f.staged))
            .with_context(|| format!("the tarball has no {}", f.staged))?;
        ensure!(
            got == want,
            "{what}'s /{path} differs from the tarball's {}",
            f.staged
        );
        Ok(())
    };

    check_rpm(rpm, files, &scratch.join("rpm"), version, &same_as_tarball)?;
    let root = scratch.join("deb-root");
    check_deb(deb, files, &root, version, &same_as_tarball)?;
    oci::check(image, &unpacked.join("bin/mergetrace"), version)?;
    fs::remove_dir_all(&scratch)?;
    eprintln!(
        "dist: checked: the .rpm lists and unpacks {n} files, the .deb installs {n} files into \
         an empty root (its binary runs, its unit verifies there) and purges cleanly, the OCI \
         image's blobs match their digests and its one layer holds the binary alone; every \
         file is the tarball's",
        n = files.len()
    );
    Ok(())
}

type SameAsTarball<'a> = dyn Fn(&Path, &str, &Placed, &str) -> Result<()> + 'a;

/// `rpm -qp` names it, `rpm -qlp` lists exactly the files, `rpm2cpio | cpio -id` unpacks them
/// as the tarball has them (the binary executable).
fn check_rpm(
    rpm: &Path,
    files: &[Placed],
    dir: &Path,
    version: &str,
    same_as_tarball: &SameAsTarball,
) -> Result<()> {
    let nvr = quiet(
        Command::new("rpm")
            .args(["-qp", "--queryformat", "%{NAME} %{VERSION} %{ARCH}"])
            .arg(rpm),
        "rpm -qp",
    )?;
    ensure!(
        nvr.trim() == format!("mergetrace {version} x86_64"),
        "rpm -qp says {nvr:?}"
    );
    let listed = quiet(Command::new("rpm").arg("-qlp").arg(rpm), "rpm -qlp")?;
    let mut listed: Vec<&str> = listed.lines().collect();
    listed.sort();
    let mut want: Vec<String> = files.iter().map(|f| format!("/{}", f.rpm)).collect();
    want.sort();
    ensure!(listed == want, "rpm -qlp lists {listed:?}, want {want:?}");
    fs::create_dir_all(dir)?;
    let mut rpm2cpio = Command::new("rpm2cpio")
        .arg(rpm)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run rpm2cpio")?;
    let archive = rpm2cpio.stdout.take().expect("piped");
    let cpio = Command::new("cpio")
        .args(["-idm", "--quiet"])
        .current_dir(dir)
        .stdin(archive)
        .status()
        .context("cannot run cpio")?;
    ensure!(
        rpm2cpio.wait()?.success() && cpio.success(),
        "rpm2cpio | cpio -idm failed"
    );
    for f in files {
        same_as_tarball(dir, &f.rpm, f, "the .rpm")?;
    }
    let n = count_files(dir)?;
    ensure!(
        n == files.len(),
        "the .rpm unpacks {n} files, want {}",
        files.len()
    );
    ensure!(
        is_executable(&dir.join("usr/bin/mergetrace"))?,
        "the .rpm's binary is not executable"
    );
    Ok(())
}

/// `dpkg --root ROOT -i` into an empty ROOT: installed (`dpkg -s`), its files listed (`dpkg -L`)
/// and intact (`dpkg --verify`), each the tarball's; the installed binary runs; the installed
/// unit passes `systemd-analyze verify --root ROOT` (ExecStart resolved inside ROOT, so
/// against the installed binary; the host's .target units are copied in for the unit's
/// dependencies); `dpkg -P` leaves none of its files behind.
fn check_deb(
    deb: &Path,
    files: &[Placed],
    root: &Path,
    version: &str,
    same_as_tarball: &SameAsTarball,
) -> Result<()> {
    fs::create_dir_all(root)?;
    let dpkg = || {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", root.display()));
        c
    };
    quiet(dpkg().arg("-i").arg(deb), "dpkg --root -i")?;
    let status = quiet(dpkg().args(["-s", "mergetrace"]), "dpkg --root -s")?;
    for want in [
        "Status: install ok installed".to_string(),
        format!("Version: {version}"),
        "Architecture: amd64".to_string(),
    ] {
        ensure!(status.contains(&want), "dpkg -s lacks {want:?}:\n{status}");
    }
    let listed = quiet(dpkg().args(["-L", "mergetrace"]), "dpkg --root -L")?;
    for f in files {
        let path = format!("/{}", f.deb);
        ensure!(
            listed.lines().any(|l| l == path),
            "dpkg -L lacks {path}:\n{listed}"
        );
        same_as_tarball(root, &f.deb, f, "the installed .deb")?;
    }
    let verify = quiet(
        dpkg().args(["--verify", "mergetrace"]),
        "dpkg --root --verify",
    )?;
    ensure!(verify.trim().is_empty(), "dpkg --verify: {verify}");

    let bin = root.join("usr/bin/mergetrace");
    ensure!(
        is_executable(&bin)?,
        "the installed binary is not executable"
    );
    let v = quiet(
        Command::new(&bin).arg("--version"),
        "the installed mergetrace --version",
    )?;
    ensure!(
        v.trim() == format!("mergetrace {version}"),
        "the installed binary says {v:?}"
    );

    let host_units = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|d| d.join("multi-user.target").is_file())
        .context("no systemd units on this machine (scripts/setup --dist installs systemd)")?;
    let units = root.join("usr/lib/systemd/system");
    fs::create_dir_all(&units)?;
    for e in fs::read_dir(host_units)? {
        let e = e?;
        if e.file_name().to_string_lossy().ends_with(".target") && e.path().is_file() {
            fs::copy(e.path(), units.join(e.file_name()))?;
        }
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .arg("/lib/systemd/system/mergetrace-serve.service")
        .output()
        .context("cannot run systemd-analyze (scripts/setup --dist installs systemd)")?;
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() && !said.contains("mergetrace-serve.service:"),
        "systemd-analyze verify rejects the installed unit: {said}"
    );

    quiet(dpkg().args(["-P", "mergetrace"]), "dpkg --root -P")?;
    for f in files {
        ensure!(
            !root.join(&f.deb).exists(),
            "/{} is still there after dpkg -P",
            f.deb
        );
    }
    Ok(())
}

fn count_files(dir: &Path) -> Result<usize> {
    let mut n = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            n += count_files(&e.path())?;
        } else {
            n += 1;
        }
    }
    Ok(n)
}

fn is_executable(path: &Path) -> Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    Ok(fs::metadata(path)?.permissions().mode() & 0o111 == 0o111)
}

/// Runs `cmd` with its output captured: its stdout; on failure, an error with `what` and
/// everything it printed.
fn quiet(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}: {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "{what} failed ({}): {cmd:?}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

fn sh(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}
