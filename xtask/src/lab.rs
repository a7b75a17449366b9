//! `cargo xtask lab`: runs the project's tests (or any shell command) inside Debian's cloud
//! kernels (11's 5.10, 12's 6.1 and 6.12, 13's 6.12 and its backports' 7.3), booted as QEMU
//! TCG guests that see the host's root read-only over virtiofs (under a tmpfs overlay), with
//! fresh scratch disks /dev/vdb (virtio, mq-deadline) and /dev/nvme0n1 (NVMe, a queue per
//! vCPU), a disk that requeues /dev/vdc (a small virtio ring without indirect descriptors)
//! and cgroup v2 with the io controller. Tests are built on the host
//! (compiling in a TCG guest is ~20× slower) and their executables run in the guest, at the
//! same paths.
//!
//! Facts this relies on: shared/docs/kvm-lab.md. Pieces: [`kernel`] (fetch, unpack),
//! [`build`] (the kernels the lab builds), [`initramfs`], [`vm`] (virtiofsd + QEMU +
//! timeout), scripts/lab/init (the guest's /init).
mod apt;
mod build;
mod initramfs;
mod kernel;
mod vm;

use std::{
    fmt::Write as _,
    fs,
    io::BufRead,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;

use kernel::Series;

#[derive(Args, Debug)]
pub struct LabArgs {
    /// Guest kernels, comma-separated, each the newest Debian cloud kernel of: 5.10 (Debian
    /// 11), 6.1 or 6.12 (Debian 12), trixie (Debian 13's 6.12), 7.3 (Debian 13's backports);
    /// or 6.1-iolatency (Debian 12's 6.1 source built by the lab with io.latency); all = 5.10,
    /// 6.1, 6.12 and 7.3.
    #[arg(long, default_value = "all", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(kernel::KERNEL_NAMES))]
    kernel: Vec<String>,
    /// Keep each run's directory (scratch disks, serial logs, guest script) and say where.
    #[arg(long)]
    keep: bool,
    /// Run this shell command in the guest (in the project directory, as root) instead of
    /// the tests; the lab's exit code is the command's.
    #[arg(long, short = 'c', value_name = "CMD")]
    shell_cmd: Option<String>,
    /// Give up on a guest after this many seconds (it is killed and the run fails).
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    timeout: u64,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 2048)]
    mem: u64,
    /// Guest CPUs (vCPUs; an NVMe disk gets one I/O queue per vCPU). Guests of 32 or more
    /// sometimes die at boot under TCG: a guest that dies before running anything is booted
    /// again, twice at most.
    #[arg(long, alias = "smp", value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    cpus: u32,
    /// QEMU's TCG threading. `single` runs the guest's CPUs in turn on one host thread: the
    /// kernel's live text patching (fentry attach/detach, static keys) is then always seen
    /// whole by the other vCPU. `multi` (one host thread per vCPU) is faster but has crashed
    /// guests mid-patch (docs/lab.md, "Emulation").
    #[arg(long, value_name = "MODE", default_value = "single", value_parser = ["single", "multi"])]
    tcg: String,
    /// The disk the kernel tests write to (`MERGETRACE_LAB_DISK` in the guest): `virtio`,
    /// /dev/vdb (virtio-blk, one queue, mq-deadline), or `nvme`, /dev/nvme0n1 (QEMU's NVMe
    /// controller: one I/O queue per vCPU, no scheduler, completions in interrupts). Both are
    /// in every guest.
    #[arg(long, value_name = "KIND", default_value = "virtio", value_parser = ["virtio", "nvme"])]
    disk: String,
    /// More kernel command-line arguments for the guest, e.g. `preempt=full`. Debian's
    /// kernels choose the preemption model at boot: voluntary by default up to 6.12; lazy on
    /// 7.3, which offers only lazy and full (BPF tracing programs run preemptibly there).
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    append: Option<String>,
    /// Size of each scratch disk, /dev/vdb and /dev/nvme0n1, in MiB (fresh sparse files per
    /// run).
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    disk_size: u64,
    /// Only this integration test target (as `cargo test --test NAME`); repeatable. Without
    /// one, the kernel tests run (every `kernel_*` target).
    #[arg(long = "test", value_name = "NAME")]
    tests: Vec<String>,
    /// Arguments for the test executables (after `--`): a test name filter, `--nocapture`,
    /// `--test-threads 1`, ... A first argument that names an integration test target
    /// (`-- kernel_pipeline`) selects that target, as `--test` does, instead of filtering.
    #[arg(last = true, value_name = "TEST-ARGS")]
    test_args: Vec<String>,
}

/// Where downloaded and unpacked kernels and the initramfs live, across runs and clones.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MERGETRACE_LAB_CACHE") {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("mergetrace-lab")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

/// An exclusive lock on `path` (created if missing), held until the file is dropped, so that
/// concurrent lab runs (CI runs guests side by side) never prepare the same kernel, initramfs
/// or apt state at once. flock: released by the kernel when the holder exits, however it
/// exits. Not reentrant: a process that holds it must not take it again.
pub(crate) fn lock(path: &Path, what: &str) -> Result<fs::File> {
    use std::os::fd::AsRawFd;
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!(
            "lab: waiting for another lab run to finish with {what} ({})",
            path.display()
        );
        loop {
            // SAFETY: as above.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
    }
    Ok(f)
}

/// Quotes `s` for sh.
fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:+,@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A test executable built on the host.
#[derive(Debug, Clone)]
struct TestExe {
    /// e.g. "mergetrace/tests/kernel_pipeline" or "mergetrace (unit)".
    label: String,
    path: PathBuf,
    /// The package directory: cargo runs tests there, with CARGO_MANIFEST_DIR.
    manifest_dir: PathBuf,
    package: String,
    /// The cargo target: its name and kind ("lib", "bin", "test").
    target: String,
    kind: String,
}

/// `cargo test --release --no-run --features mergetrace/kernel-tests` on the host; the test executables it reports.
fn build_tests() -> Result<Vec<TestExe>> {
    eprintln!("lab: building the tests on the host (cargo test --release --no-run, with the kernel tests)");
    let mut c = crate::cargo();
    c.args([
        "test",
        "--release",
        "--no-run",
        "--workspace",
        "--exclude",
        "mergetrace-ebpf",
        "--features",
        "mergetrace/kernel-tests",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let mut child = c.spawn().context("cannot start cargo test --no-run")?;
    let mut exes = Vec::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line?;
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let target = &v["target"];
        let name = target["name"].as_str().unwrap_or("?");
        let manifest = PathBuf::from(v["manifest_path"].as_str().unwrap_or_default());
        let manifest_dir = manifest
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(crate::workspace_root);
        let package = manifest_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // xtask's own tests are about the host; they have nothing to do in a guest kernel.
        if package == "xtask" {
            continue;
        }
        let kind = target["kind"][0].as_str().unwrap_or("");
        let label = match kind {
            "test" => format!("{package}/tests/{name}"),
            "lib" => format!("{package} (lib unit tests)"),
            k => format!("{package} {k} {name} (unit tests)"),
        };
        exes.push(TestExe {
            label,
            path: exe.into(),
            manifest_dir,
            package,
            target: name.to_string(),
            kind: kind.to_string(),
        });
    }
    let status = child.wait()?;
    ensure!(status.success(), "building the tests failed ({status})");
    ensure!(
        !exes.is_empty(),
        "cargo test --no-run reported no test executables"
    );
    // Unit tests first, then the integration tests.
    exes.sort_by_key(|e| (e.label.contains("/tests/"), e.label.clone()));
    Ok(exes)
}

/// The executables to run and the arguments for them: `--test NAME` targets, or a first
/// test argument that names an integration test target; otherwise the kernel tests (the
/// `kernel_*` integration targets). Unit tests are about the host's user space and need
/// nothing from the guest kernel (some cannot run there: 6.1's tmpfs has no O_DIRECT).
fn select_tests(
    exes: Vec<TestExe>,
    targets: &[String],
    test_args: &[String],
) -> Result<(Vec<TestExe>, Vec<String>)> {
    let is_target = |n: &str| exes.iter().any(|e| e.kind == "test" && e.target == n);
    let mut targets = targets.to_vec();
    let mut args = test_args.to_vec();
    if let Some(first) = args.first() {
        if is_target(first) {
            targets.push(args.remove(0));
        }
    }
    if targets.is_empty() {
        let kernel = exes
            .into_iter()
            .filter(|e| e.kind == "test" && e.target.starts_with("kernel_"))
            .collect();
        return Ok((kernel, args));
    }
    for t in &targets {
        ensure!(
            is_target(t),
            "no integration test target {t}; there are: {}",
            exes.iter()
                .filter(|e| e.kind == "test")
                .map(|e| e.target.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let chosen = exes
        .into_iter()
        .filter(|e| e.kind == "test" && targets.contains(&e.target))
        .collect();
    Ok((chosen, args))
}

/// Host environment variables the guest gets too: MERGETRACE_* (except the lab's own),
/// RUST_LOG, RUST_BACKTRACE.
fn passed_env() -> String {
    let mut s = String::new();
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| {
            (k.starts_with("MERGETRACE_") && !k.starts_with("MERGETRACE_LAB"))
                || k == "RUST_LOG"
                || k == "RUST_BACKTRACE"
        })
        .collect();
    vars.sort();
    for (k, v) in vars {
        let _ = writeln!(s, "export {k}={}", sh_quote(&v));
    }
    s
}

/// The guest's scratch virtio disk (serial mt-scratch).
const VIRTIO_DISK: &str = "/dev/vdb";
/// The guest's NVMe disk (serial mt-nvme): the only NVMe controller, its one namespace.
const NVME_DISK: &str = "/dev/nvme0n1";

/// The script the guest runs (under the host's /bin/sh, in the chroot).
fn guest_script(series: &str, disk: &str, body: &str) -> String {
    let root = crate::workspace_root();
    let test_disk = if disk == "nvme" {
        NVME_DISK
    } else {
        VIRTIO_DISK
    };
    format!(
        "# Written by `cargo xtask lab`; run by scripts/lab/init in the guest.\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root TERM=dumb LANG=C.UTF-8 RUST_BACKTRACE=1\n\
         export MERGETRACE_LAB=1 MERGETRACE_LAB_KERNEL={series} MERGETRACE_LAB_DISK={test_disk}\n\
         export MERGETRACE_LAB_REQUEUE_DISK=/dev/vdc MERGETRACE_LAB_NVME_DISK={NVME_DISK}\n\
         {}\
         cd {} || exit 125\n\
         {body}\n",
        passed_env(),
        sh_quote(&root.to_string_lossy())
    )
}

fn tests_body(exes: &[TestExe], args: &[String]) -> String {
    let args: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    let mut s = String::from("status=0\n");
    for e in exes {
        let dir = sh_quote(&e.manifest_dir.to_string_lossy());
        let _ = writeln!(
            s,
            "echo {begin}\n\
             t0=$(date +%s)\n\
             (cd {dir} && CARGO_MANIFEST_DIR={dir} CARGO_PKG_NAME={pkg} exec {exe} {args})\n\
             rc=$?\n\
             echo \"lab: end {label} ($(( $(date +%s) - t0 )) s): exit $rc\"\n\
             [ $rc -eq 0 ] || status=1",
            begin = sh_quote(&format!("lab: run {}", e.label)),
            pkg = sh_quote(&e.package),
            exe = sh_quote(&e.path.to_string_lossy()),
            args = args.join(" "),
            label = e.label.replace(['"', '$', '`', '\\'], "_"),
        );
    }
    s.push_str("exit $status");
    s
}

/// Passed and failed counts summed over libtest's "test result:" lines.
fn count_results(output: &str) -> (u64, u64) {
    let mut passed = 0;
    let mut failed = 0;
    for line in output.lines() {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            continue;
        };
        for part in rest.split(';') {
            let mut w = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (w.next(), w.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => passed += n,
                "failed" => failed += n,
                _ => {}
            }
        }
    }
    (passed, failed)
}

/// Removes run directories of lab processes that are gone (unless kept with --keep).
fn remove_stale_runs(lab: &Path) {
    let Ok(entries) = fs::read_dir(lab) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("run-")
            .and_then(|r| r.rsplit_once('-'))
            .and_then(|(_, p)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && !e.path().join(".keep").exists()
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

struct Outcome {
    line: String,
    ok: bool,
}

pub fn lab(args: LabArgs) -> Result<ExitCode> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab must run as root (virtiofsd shares the host's root); try `sudo ./mt lab`");
    }
    ensure!(
        args.shell_cmd.is_none() || args.test_args.is_empty(),
        "give either --shell-cmd or test arguments after --, not both"
    );
    let setup = crate::workspace_root().join("scripts/setup");
    let st = Command::new(&setup)
        .arg("--lab")
        .status()
        .with_context(|| format!("cannot run {}", setup.display()))?;
    ensure!(st.success(), "{} --lab failed ({st})", setup.display());

    let series = chosen_series(&args.kernel)?;
    let body = match &args.shell_cmd {
        Some(cmd) => cmd.clone(),
        None => {
            let (exes, test_args) = select_tests(build_tests()?, &args.tests, &args.test_args)?;
            tests_body(&exes, &test_args)
        }
    };

    let cache = cache_dir();
    let lab_dir = target_dir().join("lab");
    fs::create_dir_all(&lab_dir).with_context(|| format!("cannot create {}", lab_dir.display()))?;
    remove_stale_runs(&lab_dir);
    let init = crate::workspace_root().join("scripts/lab/init");
    let apt = apt::Apt::new(&cache)?;

    let mut outcomes = Vec::new();
    for s in series {
        outcomes.push(run_series(s, &args, &body, &apt, &cache, &lab_dir, &init)?);
    }
    if outcomes.len() > 1 {
        eprintln!("lab: summary");
        for o in &outcomes {
            eprintln!("{}", o.line);
        }
    }
    Ok(if outcomes.iter().all(|o| o.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The kernel series named by `--kernel` (or all), each once, in the order given.
fn chosen_series(names: &[String]) -> Result<Vec<Series>> {
    let mut series: Vec<Series> = Vec::new();
    for k in names {
        let add = match k.as_str() {
            "all" => Series::all(),
            k => vec![Series::by_name(k).with_context(|| format!("unknown kernel {k}"))?],
        };
        for s in add {
            if !series.iter().any(|have| have.name == s.name) {
                series.push(s);
            }
        }
    }
    Ok(series)
}

/// One guest: fetch its kernel, build its initramfs, boot it with the tests, judge the run.
fn run_series(
    s: Series,
    args: &LabArgs,
    body: &str,
    apt: &apt::Apt,
    cache: &Path,
    lab_dir: &Path,
    init: &Path,
) -> Result<Outcome> {
    let t0 = Instant::now();
    // One lab run at a time prepares a series (download, unpack or build, initramfs); another
    // run of the same series waits, then finds it ready. Each run then boots its own guest from
    // its own run directory (disks, logs, virtiofsd socket), so runs can go side by side.
    let prep_lock = lock(
        &cache.join("locks").join(format!("{}.lock", s.name)),
        &format!("the {} kernel", s.name),
    )?;
    let k = kernel::fetch(s, apt, cache)
        .with_context(|| format!("getting the {} guest kernel", s.name))?;
    let initramfs = initramfs::initramfs(&k, cache, init)?;
    drop(prep_lock);
    let run_dir = lab_dir.join(format!("run-{}-{}", s.name, std::process::id()));
    let _ = fs::remove_dir_all(&run_dir);
    fs::create_dir_all(&run_dir)?;
    let script = run_dir.join("guest.sh");
    fs::write(&script, guest_script(s.name, &args.disk, body))?;
    let prep = t0.elapsed();
    let cfg = vm::VmConfig {
        vmlinuz: &k.vmlinuz,
        initramfs: &initramfs,
        extra_append: format!(
            "{}mt.script={} mt.moddir={} mt.disk={}",
            args.append
                .as_deref()
                .map(|a| format!("{a} "))
                .unwrap_or_default(),
            script.display(),
            k.moddir.display(),
            args.disk
        ),
        run_dir: &run_dir,
        mem_mib: args.mem,
        smp: args.cpus,
        tcg_threads: &args.tcg,
        scratch_mib: args.disk_size,
        timeout: Duration::from_secs(args.timeout),
        echo: true,
    };
    let mut attempt = 1;
    let r = loop {
        eprintln!(
            "lab: === {} ({}): booting ({} MiB, {} CPUs, TCG thread={}, test disk {}) ===",
            s.name, k.release, args.mem, args.cpus, args.tcg, args.disk
        );
        let r = vm::run(&cfg)?;
        if !died_at_boot(&r) || attempt > BOOT_RETRIES {
            break r;
        }
        eprintln!(
            "lab: the guest died before running anything (boot {attempt} of {}); its console:\n{}",
            BOOT_RETRIES + 1,
            vm::tail(&r.console_log, 15)
        );
        attempt += 1;
    };
    if !r.output.ends_with('\n') && !r.output.is_empty() {
        println!();
    }
    let secs = |d: Duration| format!("{:.1} s", d.as_secs_f64());
    let boot = r
        .boot
        .map(|b| format!(", boot {}", secs(b)))
        .unwrap_or_default();
    let timing = format!("{}{boot}, prep {}", secs(r.elapsed), secs(prep));
    let (ok, detail) = judge(&r, args);
    if !ok && (r.timed_out || r.exit.is_none() || r.boot.is_none()) {
        eprintln!(
            "lab: last lines of the guest console ({}):\n{}",
            r.console_log.display(),
            vm::tail(&r.console_log, 25)
        );
    }
    let line = format!(
        "lab: {} ({}): {} — {detail} — {timing}",
        s.name,
        k.release,
        if ok { "PASS" } else { "FAIL" }
    );
    eprintln!("{line}");
    clean_up(&run_dir, ok, args.keep);
    Ok(Outcome { line, ok })
}

/// Boots after the first of a guest that died before /init ran anything: TCG guests of 32 or
/// more vCPUs sometimes oops at boot ("Oops: int3" in sched_clock_idle_wakeup_event), before
/// anything of the project has run (shared/docs/production-lab.md).
const BOOT_RETRIES: u32 = 2;

/// The guest ended without reaching /init's command and without /init reporting its own
/// failure (125): a kernel that died while booting. A hung boot runs into the timeout instead
/// and is not retried.
fn died_at_boot(r: &vm::VmResult) -> bool {
    !r.timed_out && r.boot.is_none() && r.exit.is_none()
}

/// Whether a guest run passed, and a line saying what it did.
fn judge(r: &vm::VmResult, args: &LabArgs) -> (bool, String) {
    if r.timed_out {
        (
            false,
            format!("guest timed out after {} s and was killed", args.timeout),
        )
    } else {
        match r.exit {
            None => (
                false,
                "the guest died without reporting an exit status".to_string(),
            ),
            Some(125) if r.boot.is_none() => {
                (false, "the guest's setup failed (exit 125)".to_string())
            }
            Some(rc) if args.shell_cmd.is_some() => (rc == 0, format!("exit {rc}")),
            Some(rc) => {
                let (p, f) = count_results(&r.output);
                let ends = r.output.matches("lab: end ").count();
                let bad = r
                    .output
                    .lines()
                    .filter(|l| l.starts_with("lab: end ") && !l.ends_with(": exit 0"))
                    .count();
                let none = if p + f == 0 { ", no test ran" } else { "" };
                (
                rc == 0,
                format!(
                    "{p} passed, {f} failed ({ends} test executable{}, {bad} failed{none}; exit {rc})",
                    if ends == 1 { "" } else { "s" }
                ),
            )
            }
        }
    }
}

/// A kept run stays; a failed one keeps its logs until the next lab run; a passed one goes.
fn clean_up(run_dir: &Path, ok: bool, keep: bool) {
    if keep {
        let _ = fs::write(run_dir.join(".keep"), "");
        eprintln!("lab: kept {}", run_dir.display());
    } else if !ok {
        // The logs stay until the next lab run; the disk images go now.
        let _ = fs::remove_file(run_dir.join("aux.img"));
        let _ = fs::remove_file(run_dir.join("scratch.img"));
        let _ = fs::remove_file(run_dir.join("requeue.img"));
        let _ = fs::remove_file(run_dir.join("nvme.img"));
        eprintln!(
            "lab: logs in {} (until the next lab run)",
            run_dir.display()
        );
    } else {
        let _ = fs::remove_dir_all(run_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_libtest_results() {
        let out = "running 3 tests\n\
                   test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; finished in 0.01s\n\
                   test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 9.00s\n";
        assert_eq!(count_results(out), (4, 2));
    }

    fn exe(target: &str, kind: &str) -> TestExe {
        TestExe {
            label: target.into(),
            path: format!("/t/{target}").into(),
            manifest_dir: "/t".into(),
            package: "p".into(),
            target: target.into(),
            kind: kind.into(),
        }
    }

    #[test]
    fn selects_test_targets() {
        let all = || {
            vec![
                exe("p", "lib"),
                exe("kernel_pipeline", "test"),
                exe("kernel_check", "test"),
            ]
        };
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let names = |v: &[TestExe]| v.iter().map(|e| e.target.clone()).collect::<Vec<_>>();

        let (e, a) = select_tests(all(), &[], &s(&["kernel_pipeline", "--nocapture"])).unwrap();
        assert_eq!(
            (names(&e), a),
            (s(&["kernel_pipeline"]), s(&["--nocapture"]))
        );
        let (e, a) = select_tests(all(), &[], &s(&["two_cgroups"])).unwrap();
        assert_eq!(
            (names(&e), a),
            (s(&["kernel_pipeline", "kernel_check"]), s(&["two_cgroups"]))
        );
        let (e, a) = select_tests(all(), &s(&["kernel_check"]), &s(&["x"])).unwrap();
        assert_eq!((names(&e), a), (s(&["kernel_check"]), s(&["x"])));
        assert!(select_tests(all(), &s(&["nope"]), &[]).is_err());
    }

    #[test]
    fn quotes_for_sh() {
        assert_eq!(sh_quote("kernel_pipeline"), "kernel_pipeline");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
    }
}
