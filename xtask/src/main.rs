//! Developer tasks: `cargo xtask <task>` (an alias in .cargo/config.toml).
//!
//! Each task is a variant of [`Task`]; new ones (bench, lab, ...) go there.
use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod dist;
// Checked by its unit tests only: the links of README.md and docs/, and the README's limits.
#[cfg(test)]
mod doclinks;
mod lab;

#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "mergetrace's developer tasks"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    /// Run every test in the workspace, release build (the one `./mt run` uses). Needs root:
    /// the kernel tests load eBPF programs and set up block devices.
    Test {
        /// Passed on to `cargo test` as they are: a test name filter, `--no-run`, and after
        /// `--` arguments for the test binaries (e.g. `-- --nocapture`).
        #[arg(
            allow_hyphen_values = true,
            trailing_var_arg = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
    /// Build mergetrace (release; the eBPF programs are built and embedded by its build.rs).
    Build {
        /// More arguments for `cargo build`.
        #[arg(allow_hyphen_values = true, trailing_var_arg = true)]
        cargo_args: Vec<String>,
    },
    /// Run the tests (built on the host) or a shell command in Debian's 6.1 and 6.12 cloud
    /// kernels, booted as QEMU guests that share the host's root read-only. Needs root.
    Lab(lab::LabArgs),
    /// Measure what tracing costs: fio IOPS on a /dev/shm loop device with no tracer, the
    /// live view, record, bpftrace and perf (interleaved rounds), BPF cost per event, and the
    /// offline report speed and capture size. Prints a table, writes JSON. Needs root.
    Bench(bench::BenchArgs),
    /// Build what a machine without a toolchain installs: a static binary, man pages, shell
    /// completions and a systemd unit, as a tarball and a .deb (target/dist).
    Dist(dist::DistArgs),
}

/// The workspace root: xtask lives one level below it.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// The cargo that runs us (so `cargo +toolchain xtask` keeps its toolchain), else `cargo`.
fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Runs `cmd`; its exit status becomes ours.
/// Runs a short helper command (losetup, mount, apt-get, dpkg) quietly: its standard output,
/// trimmed; on failure, an error with the command and what it printed.
fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let printed: Vec<&str> = [stdout.as_str(), stderr.trim()]
            .into_iter()
            .filter(|t| !t.is_empty())
            .collect();
        bail!("{cmd:?} failed ({}): {}", out.status, printed.join("\n"));
    }
    Ok(stdout)
}

fn run(mut cmd: Command) -> Result<ExitCode> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(n) => ExitCode::from(u8::try_from(n).unwrap_or(1)),
        None => ExitCode::FAILURE, // killed by a signal
    })
}

fn test(args: &[String]) -> Result<ExitCode> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("cargo xtask test: must run as root (the kernel tests load eBPF programs and set up block devices); try `sudo ./mt test`");
        return Ok(ExitCode::FAILURE);
    }
    let mut c = cargo();
    // mergetrace-ebpf only builds for bpfel-unknown-none; mergetrace's build.rs builds it.
    c.args([
        "test",
        "--workspace",
        "--exclude",
        "mergetrace-ebpf",
        "--release",
        "--features",
        "mergetrace/kernel-tests",
    ]);
    c.args(args);
    run(c)
}

fn build(cargo_args: &[String]) -> Result<ExitCode> {
    let mut c = cargo();
    c.args(["build", "--release", "-p", "mergetrace"])
        .args(cargo_args);
    run(c)
}

/// clap takes a `--` right after the subcommand as its own separator and drops it; put it back
/// so that `cargo xtask test -- --nocapture` means what `cargo test -- --nocapture` means.
fn restore_separator(raw: &[String], mut args: Vec<String>) -> Vec<String> {
    if raw.get(2).is_some_and(|a| a == "--") {
        args.insert(0, "--".into());
    }
    args
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().collect();
    let cli = Cli::parse_from(&raw);
    let result = match cli.task {
        Task::Test { args } => test(&restore_separator(&raw, args)),
        Task::Build { cargo_args } => build(&restore_separator(&raw, cargo_args)),
        Task::Lab(args) => lab::lab(args),
        Task::Bench(args) => bench::bench(args),
        Task::Dist(args) => dist::run(&args).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| {
        eprintln!("cargo xtask: error: {e:#}");
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    fn test_args(argv: &[&str]) -> Vec<String> {
        let raw: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        match Cli::try_parse_from(&raw).unwrap().task {
            Task::Test { args } => restore_separator(&raw, args),
            t => panic!("parsed as {t:?}"),
        }
    }

    #[test]
    fn test_args_reach_cargo_test_as_given() {
        for argv in [
            &["xtask", "test"][..],
            &[
                "xtask",
                "test",
                "cli",
                "--no-fail-fast",
                "--",
                "--nocapture",
            ],
            &["xtask", "test", "--", "--nocapture"],
            &["xtask", "test", "--no-run"],
        ] {
            assert_eq!(test_args(argv), argv[2..], "{argv:?}");
        }
    }
}
