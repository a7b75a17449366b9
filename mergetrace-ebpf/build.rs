//! Rebuild the programs when bpf-linker changes (an undeclared dependency of the link step).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
