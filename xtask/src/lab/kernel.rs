//! Guest kernels for the lab: Debian's prebuilt cloud kernels, fetched with `apt-get download`
//! through the lab's own apt configuration ([`Apt`]: its own sources.list, lists, cache and
//! trusted keys under the cache directory; the host's /etc/apt sources and lists are never
//! read or changed), unpacked with `dpkg -x` into a cache (never installed on the host), and a
//! small initramfs per kernel: busybox, scripts/lab/init and the modules needed to reach the
//! host's root.
use std::{
    collections::{hash_map::DefaultHasher, HashMap, HashSet},
    ffi::OsString,
    fs,
    hash::{Hash, Hasher},
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{bail, ensure, Context, Result};

/// A kernel series the lab knows: which Debian release has it and how Debian names its
/// cloud-kernel packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// What `--kernel` takes: "5.10", "6.1", "6.12", "trixie".
    pub name: &'static str,
    /// The Debian release whose suites (`S`, `S-updates`, `S-security`) carry it.
    pub suite: &'static str,
    /// Package name = prefix + a number + infix (+ "." + a rebuild number) + suffix; the
    /// highest (number, rebuild) wins.
    prefix: &'static str,
    infix: &'static str,
    suffix: &'static str,
    /// Part of `--kernel all`.
    pub in_all: bool,
}

pub const SERIES: [Series; 4] = [
    // Debian 11: linux-image-5.10.0-46-cloud-amd64 (5.10.262-1, bullseye-security). The signed
    // package (source linux-signed-amd64: the same kernel and modules, with signatures): the
    // mirror lists bullseye's -unsigned ones but answers 404 for their files.
    Series {
        name: "5.10",
        suite: "bullseye",
        prefix: "linux-image-5.10.0-",
        infix: "",
        suffix: "-cloud-amd64",
        in_all: true,
    },
    // Debian 12: linux-image-6.1.0-57-cloud-amd64-unsigned (6.1.192)
    Series {
        name: "6.1",
        suite: "bookworm",
        prefix: "linux-image-6.1.0-",
        infix: "",
        suffix: "-cloud-amd64-unsigned",
        in_all: true,
    },
    // Debian 12: linux-image-6.12.117+deb12-cloud-amd64-unsigned
    Series {
        name: "6.12",
        suite: "bookworm",
        prefix: "linux-image-6.12.",
        infix: "+deb12",
        suffix: "-cloud-amd64-unsigned",
        in_all: true,
    },
    // Debian 13: linux-image-6.12.118+deb13-cloud-amd64-unsigned (trixie-security). The same
    // series as bookworm's 6.12 (a patch level apart, built by trixie's toolchain), so not in
    // `all`.
    Series {
        name: "trixie",
        suite: "trixie",
        prefix: "linux-image-6.12.",
        infix: "+deb13",
        suffix: "-cloud-amd64-unsigned",
        in_all: false,
    },
];

/// What `--kernel` accepts: every series, and "all".
pub const KERNEL_NAMES: [&str; 5] = ["5.10", "6.1", "6.12", "trixie", "all"];

/// Modules the initramfs loads, in this order (each after its own dependencies), when the
/// kernel has them as modules; built-in ones are skipped. mq_deadline comes before virtio_blk,
/// or the disks come up with the "none" scheduler. `loop` is for tests that make loop devices.
const MODULES: [(&str, bool); 9] = [
    ("virtio", true),
    ("virtio_ring", true),
    ("virtio_pci", true),
    ("mq_deadline", true),
    ("virtio_blk", true),
    ("fuse", true),
    ("virtiofs", true),
    ("overlay", true),
    ("loop", false),
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
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let mid = pkg.strip_prefix(self.prefix)?.strip_suffix(self.suffix)?;
        let end = mid.find(|c: char| !c.is_ascii_digit()).unwrap_or(mid.len());
        let (n, rest) = mid.split_at(end);
        let rest = rest.strip_prefix(self.infix)?;
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

/// Quietly runs `cmd`; on failure, the error carries its output.
fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The Debian archive keys (debian-archive-keyring), which cover bullseye, bookworm and trixie.
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Lists older than this are refreshed (a failed refresh keeps the old ones).
const LISTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The lab's private apt configuration, in `cache/apt`: `sources.list` (main, -updates and
/// -security of every suite in [`SERIES`], amd64 `Packages` indexes only, signed by
/// [`DEBIAN_KEYRING`]), `state/` (lists, an empty dpkg status), `cache/`, and empty trusted
/// keys (`trusted.gpg`, `trusted.gpg.d/`: the host's apt keys are not trusted either). The
/// host's apt.conf.d still applies (proxies), its sources, lists and pins do not.
pub struct Apt {
    dir: PathBuf,
    /// An update was tried in this run (one per run, even if it failed).
    tried: std::cell::Cell<bool>,
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
            s.push_str(&format!("deb {opts} {mirror} {suite}-updates main\n"));
            s.push_str(&format!("deb {opts} {security} {suite}-security main\n"));
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
    fn stale(&self) -> bool {
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

    /// `apt-get update` with the lab's configuration.
    fn update(&self) -> Result<()> {
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

    /// Cloud-kernel package names (signed and unsigned) in the lab's lists (`apt-cache search`,
    /// local; once per run unless the lists change).
    fn kernel_packages(&self) -> Result<Vec<String>> {
        if let Some(k) = self.known.borrow().as_ref() {
            return Ok(k.clone());
        }
        let out = run_quiet(Command::new("apt-cache").args(self.opts()).args([
            "search",
            "--names-only",
            "^linux-image-.*-cloud-amd64(-unsigned)?$",
        ]))?;
        let k: Vec<String> = out
            .lines()
            .filter_map(|l| l.split_once(" - ").map(|(n, _)| n.trim().to_string()))
            .collect();
        self.known.replace(Some(k.clone()));
        Ok(k)
    }

    /// `apt-get download PACKAGE` into `dir`.
    fn download(&self, package: &str, dir: &Path) -> Result<()> {
        run_quiet(
            self.apt_get()
                .args(["-q", "download", package])
                .current_dir(dir),
        )
        .map(drop)
    }
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
                "no package {}N{}{} in the lab's apt lists ({} suites), even after apt-get update, and none cached",
                series.prefix, series.infix, series.suffix, series.suite
            )
        })
}

/// Marks a fully unpacked kernel tree.
const READY: &str = ".mt-lab-ready";

/// Fetches and unpacks the newest kernel of `series` into `cache/kernels/<package>`, unless
/// it is already there.
pub fn fetch(series: Series, apt: &Apt, cache: &Path) -> Result<Kernel> {
    let package = pick_package(series, apt, cache)?;
    let tree = cache.join("kernels").join(&package);
    if !tree.join(READY).exists() {
        let debs = cache.join("debs");
        fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
        let deb = match find_deb(&debs, &package) {
            Some(d) => d,
            None => {
                eprintln!("lab: downloading {package} (apt-get download, the lab's sources)");
                apt.download(&package, &debs)
                    .with_context(|| format!("cannot download {package}"))?;
                find_deb(&debs, &package).with_context(|| {
                    format!(
                        "apt-get download left no {package}_*.deb in {}",
                        debs.display()
                    )
                })?
            }
        };
        eprintln!("lab: unpacking {} (dpkg -x, not installed)", deb.display());
        // Not tree.with_extension, which makes "linux-image-6.12.117+deb12-…" into
        // "linux-image-6.12.partial", the same for bookworm's and trixie's 6.12.
        let tmp = cache.join("kernels").join(format!("{package}.partial"));
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&tree);
        fs::create_dir_all(&tmp)?;
        run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
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
        let _ = fs::remove_file(&deb);
    }
    let release = release_of(&tree)?;
    let vmlinuz = tree.join("boot").join(format!("vmlinuz-{release}"));
    ensure!(vmlinuz.exists(), "{} is missing", vmlinuz.display());
    Ok(Kernel {
        package,
        moddir: tree.join("lib/modules").join(&release),
        release,
        vmlinuz,
    })
}

fn depmod() -> PathBuf {
    ["/usr/sbin/depmod", "/sbin/depmod"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| "depmod".into())
}

fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
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

/// "kernel/drivers/block/virtio_blk.ko.xz" -> "virtio_blk" ("-" and "_" are the same to kmod).
fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let base = base.split(".ko").next().unwrap_or(base);
    base.replace('-', "_")
}

/// The module files to load for `wanted`, dependencies first, from modules.dep; built-in
/// modules are skipped; a missing required module is an error.
fn resolve_modules(moddir: &Path, wanted: &[(&str, bool)]) -> Result<Vec<String>> {
    let dep_text = fs::read_to_string(moddir.join("modules.dep"))
        .with_context(|| format!("cannot read {}/modules.dep", moddir.display()))?;
    let builtin: HashSet<String> = fs::read_to_string(moddir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .map(module_name)
        .collect();
    // name -> (file, dependency files)
    let mut deps: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for line in dep_text.lines() {
        let Some((file, rest)) = line.split_once(':') else {
            continue;
        };
        let ds = rest.split_whitespace().map(str::to_string).collect();
        deps.insert(module_name(file), (file.to_string(), ds));
    }
    fn visit(
        name: &str,
        deps: &HashMap<String, (String, Vec<String>)>,
        seen: &mut HashSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(name.to_string()) {
            return;
        }
        if let Some((file, ds)) = deps.get(name) {
            for d in ds {
                visit(&module_name(d), deps, seen, order);
            }
            order.push(file.clone());
        }
    }
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for &(name, required) in wanted {
        if builtin.contains(name) {
            continue;
        }
        if !deps.contains_key(name) {
            ensure!(
                !required,
                "module {name} is neither built in nor in {}/modules.dep",
                moddir.display()
            );
            continue;
        }
        visit(name, &deps, &mut seen, &mut order);
    }
    Ok(order)
}

/// The initramfs for `kernel`, built into `cache/initramfs` unless an identical one is there.
pub fn initramfs(kernel: &Kernel, cache: &Path, init_script: &Path) -> Result<PathBuf> {
    let busybox = Path::new("/bin/busybox");
    let busybox_bytes = fs::read(busybox).with_context(|| {
        format!(
            "cannot read {} (scripts/setup --lab installs busybox-static)",
            busybox.display()
        )
    })?;
    ensure!(
        is_static_elf(&busybox_bytes),
        "{} is dynamically linked; the initramfs needs busybox-static (apt-get install busybox-static)",
        busybox.display()
    );
    let init =
        fs::read(init_script).with_context(|| format!("cannot read {}", init_script.display()))?;
    let modules = resolve_modules(&kernel.moddir, &MODULES)?;

    let mut h = DefaultHasher::new();
    (&init, &busybox_bytes, &modules, &kernel.package).hash(&mut h);
    let dir = cache.join("initramfs");
    fs::create_dir_all(&dir)?;
    let out = dir.join(format!("{}-{:016x}.cpio", kernel.release, h.finish()));
    if out.exists() {
        return Ok(out);
    }
    // Older initramfs of this kernel are stale now.
    for e in fs::read_dir(&dir)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&format!("{}-", kernel.release)) {
            let _ = fs::remove_file(e.path());
        }
    }

    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "lab", "tmp"] {
        cpio.dir(d);
    }
    cpio.node("dev/console", 0o020600, 5, 1);
    cpio.file("bin/busybox", 0o755, &busybox_bytes);
    cpio.file("init", 0o755, &init);
    let mut list = String::new();
    for m in &modules {
        let src = kernel.moddir.join(m);
        let bytes = if m.ends_with(".xz") {
            let out = Command::new("xz")
                .arg("-dc")
                .arg(&src)
                .output()
                .context("cannot run xz (scripts/setup --lab installs xz-utils)")?;
            ensure!(out.status.success(), "xz -dc {} failed", src.display());
            out.stdout
        } else if m.ends_with(".ko") {
            fs::read(&src).with_context(|| format!("cannot read {}", src.display()))?
        } else {
            bail!("{m}: only .ko and .ko.xz modules are supported");
        };
        let name = format!("{}.ko", module_name(m));
        cpio.file(&format!("lab/{name}"), 0o644, &bytes);
        list.push_str(&name);
        list.push('\n');
    }
    cpio.file("lab/modules", 0o644, list.as_bytes());
    let tmp = out.with_extension("partial");
    fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&cpio.finish()))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, &out)?;
    eprintln!(
        "lab: built initramfs for {} ({} modules: {})",
        kernel.release,
        modules.len(),
        list.trim().replace('\n', " ")
    );
    Ok(out)
}

/// An ELF with no PT_INTERP program header (so: statically linked).
fn is_static_elf(b: &[u8]) -> bool {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        o + 4 <= b.len() && u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) != 3
    })
}

/// A "newc" cpio archive, as the kernel unpacks for an initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170000 == 0o040000 { 2 } else { 1 },
            0, // mtime
            data.len() as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0,
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), data);
    }

    fn node(&mut self, name: &str, mode: u32, major: u32, minor: u32) {
        self.entry(name, mode, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
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
        ];
        let s510 = Series::by_name("5.10").unwrap();
        let s61 = Series::by_name("6.1").unwrap();
        let s612 = Series::by_name("6.12").unwrap();
        let trixie = Series::by_name("trixie").unwrap();
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
        assert_eq!(all, ["5.10", "6.1", "6.12"]);
    }

    #[test]
    fn sources_list_has_each_suite_once_and_only_debian_keys() {
        let s = Apt::sources_list();
        let lines: Vec<&str> = s.lines().filter(|l| l.starts_with("deb ")).collect();
        assert_eq!(lines.len(), 9, "{s}");
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

    #[test]
    fn module_names_are_normalised() {
        assert_eq!(module_name("kernel/block/mq-deadline.ko.xz"), "mq_deadline");
        assert_eq!(module_name("kernel/fs/fuse/virtiofs.ko"), "virtiofs");
    }

    #[test]
    fn modules_resolve_dependencies_first_and_skip_builtins() {
        let dir = std::env::temp_dir().join(format!("mt-lab-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("modules.dep"),
            "kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio_ring.ko.xz kernel/drivers/virtio/virtio.ko.xz\n\
             kernel/drivers/virtio/virtio_ring.ko.xz: kernel/drivers/virtio/virtio.ko.xz\n\
             kernel/drivers/virtio/virtio.ko.xz:\n\
             kernel/block/mq-deadline.ko.xz:\n",
        )
        .unwrap();
        fs::write(dir.join("modules.builtin"), "kernel/fs/fuse/fuse.ko\n").unwrap();
        let got = resolve_modules(
            &dir,
            &[
                ("mq_deadline", true),
                ("virtio_blk", true),
                ("fuse", true),
                ("loop", false),
            ],
        )
        .unwrap();
        assert_eq!(
            got,
            [
                "kernel/block/mq-deadline.ko.xz",
                "kernel/drivers/virtio/virtio.ko.xz",
                "kernel/drivers/virtio/virtio_ring.ko.xz",
                "kernel/drivers/block/virtio_blk.ko.xz",
            ]
        );
        assert!(resolve_modules(&dir, &[("overlay", true)]).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
