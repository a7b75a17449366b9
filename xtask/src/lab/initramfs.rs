//! The guest's initramfs: busybox, scripts/lab/init and the kernel modules needed to reach
//! the host's root over virtiofs, as a cpio archive cached per content.

use std::{
    collections::{hash_map::DefaultHasher, HashMap, HashSet},
    fs,
    hash::{Hash, Hasher},
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{bail, ensure, Context, Result};

use super::kernel::Kernel;
use std::process::Command;

/// Modules the initramfs loads, in this order (each after its own dependencies), when the
/// kernel has them as modules; built-in ones are skipped. mq_deadline comes before virtio_blk,
/// or the disks come up with the "none" scheduler. `loop` is for tests that make loop devices;
/// `nvme` for the NVMe disk (built in on 7.3).
const MODULES: [(&str, bool); 10] = [
    ("virtio", true),
    ("virtio_ring", true),
    ("virtio_pci", true),
    ("mq_deadline", true),
    ("virtio_blk", true),
    ("fuse", true),
    ("virtiofs", true),
    ("overlay", true),
    ("loop", false),
    ("nvme", false),
];

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
