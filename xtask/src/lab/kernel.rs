//! Guest kernels for the lab: Debian's prebuilt cloud kernels, fetched with `apt-get download`,
//! unpacked with `dpkg -x` into a cache (never installed on the host), and a small initramfs
//! per kernel: busybox, scripts/lab/init and the modules needed to reach the host's root.
use std::{
    collections::{hash_map::DefaultHasher, HashMap, HashSet},
    fs,
    hash::{Hash, Hasher},
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};

/// A kernel series the lab knows: how Debian names its cloud-kernel packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// What `--kernel` takes: "6.1", "6.12".
    pub name: &'static str,
    /// Package name = prefix + a number + suffix; the highest number wins.
    prefix: &'static str,
    suffix: &'static str,
}

pub const SERIES: [Series; 2] = [
    // linux-image-6.1.0-57-cloud-amd64-unsigned (6.1.192)
    Series {
        name: "6.1",
        prefix: "linux-image-6.1.0-",
        suffix: "-cloud-amd64-unsigned",
    },
    // linux-image-6.12.117+deb12-cloud-amd64-unsigned
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-cloud-amd64-unsigned",
    },
];

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

    /// The number in `pkg` if it is one of this series' packages.
    fn number(&self, pkg: &str) -> Option<u64> {
        let n = pkg.strip_prefix(self.prefix)?.strip_suffix(self.suffix)?;
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n.parse().ok()
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

/// Cloud-kernel package names apt knows (`apt-cache search`, local and fast).
fn apt_kernel_packages() -> Result<Vec<String>> {
    let out = run_quiet(Command::new("apt-cache").args([
        "search",
        "--names-only",
        "^linux-image-.*-cloud-amd64-unsigned$",
    ]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(" - ").map(|(n, _)| n.trim().to_string()))
        .collect())
}

/// Which package to use for `series`: the newest apt knows (after `apt-get update` if it
/// knows none), else the newest already in the cache (offline).
fn pick_package(series: Series, cache: &Path) -> Result<String> {
    let mut known = apt_kernel_packages().unwrap_or_default();
    if series.newest(known.iter().map(String::as_str)).is_none() {
        eprintln!(
            "lab: no {} cloud kernel in apt's lists; running apt-get update",
            series.name
        );
        if let Err(e) = run_quiet(Command::new("apt-get").arg("update")) {
            eprintln!("lab: apt-get update failed: {e:#}");
        }
        known = apt_kernel_packages().unwrap_or_default();
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
                "no package {}N{} in apt's lists, even after apt-get update, and none cached",
                series.prefix, series.suffix
            )
        })
}

/// Marks a fully unpacked kernel tree.
const READY: &str = ".mt-lab-ready";

/// Fetches and unpacks the newest kernel of `series` into `cache/kernels/<package>`, unless
/// it is already there.
pub fn fetch(series: Series, cache: &Path) -> Result<Kernel> {
    let package = pick_package(series, cache)?;
    let tree = cache.join("kernels").join(&package);
    if !tree.join(READY).exists() {
        let debs = cache.join("debs");
        fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
        let deb = match find_deb(&debs, &package) {
            Some(d) => d,
            None => {
                eprintln!("lab: downloading {package} (apt-get download)");
                run_quiet(
                    Command::new("apt-get")
                        .arg("download")
                        .arg(&package)
                        .current_dir(&debs),
                )
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
        let tmp = tree.with_extension("partial");
        let _ = fs::remove_dir_all(&tmp);
        let _ = fs::remove_dir_all(&tree);
        fs::create_dir_all(&tmp)?;
        run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
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
        ];
        let s61 = Series::by_name("6.1").unwrap();
        let s612 = Series::by_name("6.12").unwrap();
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
