//! Builds the eBPF object (mergetrace-ebpf for bpfel-unknown-none) and embeds it.
//!
//! Which toolchain builds it, in order:
//! 1. `MERGETRACE_EBPF_TOOLCHAIN` (a rustup toolchain name), if set;
//! 2. `nightly` with rust-src: the usual aya route;
//! 3. `mergetrace-bpf`: Debian's rustc-web + rust-web-src linked into rustup by
//!    `scripts/setup` (a stable compiler, so `-Z build-std` needs `RUSTC_BOOTSTRAP=1`).
//!
//! Without rustup, the `cargo` on PATH is used.
use std::{path::Path, process::Command};

const DEBIAN_TOOLCHAIN: &str = "mergetrace-bpf";

fn rustup_sysroot(toolchain: &str) -> Option<String> {
    let out = Command::new("rustup")
        .args(["run", toolchain, "rustc", "--print", "sysroot"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn has_rust_src(sysroot: &str) -> bool {
    Path::new(sysroot)
        .join("lib/rustlib/src/rust/library/core")
        .is_dir()
}

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=MERGETRACE_EBPF_TOOLCHAIN");
    let have_rustup = Command::new("rustup").arg("--version").output().is_ok();
    let toolchain: String = if let Ok(t) = std::env::var("MERGETRACE_EBPF_TOOLCHAIN") {
        t
    } else if !have_rustup || rustup_sysroot("nightly").is_some_and(|s| has_rust_src(&s)) {
        "nightly".into() // without rustup aya-build ignores the name
    } else if rustup_sysroot(DEBIAN_TOOLCHAIN).is_some_and(|s| has_rust_src(&s)) {
        DEBIAN_TOOLCHAIN.into()
    } else {
        anyhow::bail!(
            "no toolchain can build the eBPF programs: need rustup's nightly with rust-src, or \
             Debian's rustc-web + rust-web-src linked as `{DEBIAN_TOOLCHAIN}`. \
             Run `./mt setup` (or `scripts/setup`) to install it."
        );
    };
    // A stable compiler (Debian's, or none via rustup) needs this for -Z build-std=core.
    let sysroot = if have_rustup {
        rustup_sysroot(&toolchain)
    } else {
        Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let is_nightly = Command::new(if have_rustup { "rustup" } else { "rustc" })
        .args(if have_rustup {
            vec!["run", toolchain.as_str(), "rustc", "-V"]
        } else {
            vec!["-V"]
        })
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("nightly"))
        .unwrap_or(false);
    if !is_nightly && sysroot.is_some_and(|s| has_rust_src(&s)) {
        // SAFETY: build scripts are single-threaded at this point.
        unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    }

    let package = aya_build::Package {
        name: "mergetrace-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../mergetrace-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&toolchain))
}
