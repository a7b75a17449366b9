//! The mergetrace binary as a child: `mergetrace --json` attached to a device
//! ([`Tracer`]), its NDJSON output, and one-shot runs of the binary.

use std::{
    io::Read,
    process::{Command, Output, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::*;

/// `mergetrace --json` running as a child; started only once its probes are attached.
pub struct Tracer {
    proc: Spawned,
    stdout: Option<thread::JoinHandle<String>>,
}

/// What a tracer printed over its run.
#[derive(Debug, Clone)]
pub struct TraceOutput {
    /// The final `"type": "total"` object.
    pub total: Value,
    /// Every `"type": "interval"` object, in order.
    pub intervals: Vec<Value>,
    pub stderr: String,
}

impl Tracer {
    /// Starts `mergetrace --json <args>` and returns once it printed "mergetrace: tracing"
    /// on stderr. Panics with its stderr if it exits first or does not attach in time.
    ///
    /// Adds `--tier $MERGETRACE_TEST_TIER` when that is set and `args` choose no tier.
    pub fn start<S: AsRef<str>>(args: &[S]) -> Tracer {
        Tracer::start_with_env(args, &[])
    }

    /// [`Tracer::start`] with extra environment variables for the tracer.
    pub fn start_with_env<S: AsRef<str>>(args: &[S], env: &[(&str, &str)]) -> Tracer {
        let bin = mergetrace_bin();
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().copied());
        let args: Vec<&str> = args.iter().map(|a| a.as_ref()).collect();
        cmd.arg("--json").args(&args);
        if let Some(tier) = test_tier() {
            if !args
                .iter()
                .any(|a| *a == "--tier" || a.starts_with("--tier="))
            {
                cmd.args(["--tier", &tier]);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let mut out = child.stdout.take().unwrap();
        let stdout = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let (proc, rx) = Spawned::new(child);
        let mut tracer = Tracer {
            proc,
            stdout: Some(stdout),
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let first = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(line) => break line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = tracer.proc.try_wait() {
                        tracer.proc.join_stderr();
                        panic!(
                            "mergetrace exited ({status}) before attaching; args {:?}; stderr:\n{}",
                            cmd.get_args().collect::<Vec<_>>(),
                            tracer.stderr()
                        );
                    }
                    if left.is_zero() {
                        panic!(
                            "mergetrace did not report its probes attached within {ATTACH_TIMEOUT:?}; stderr:\n{}",
                            tracer.stderr()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = tracer.proc.wait();
                    panic!(
                        "mergetrace closed stderr ({status:?}) before attaching; args {:?}; stderr:\n{}",
                        cmd.get_args().collect::<Vec<_>>(),
                        tracer.stderr()
                    );
                }
            }
        };
        if !first.starts_with("mergetrace: tracing") {
            // Most likely an error: give it a moment to exit so the report is complete.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut status = None;
            while status.is_none() && Instant::now() < deadline {
                status = tracer.proc.try_wait();
                thread::sleep(Duration::from_millis(50));
            }
            if status.is_some() {
                tracer.proc.join_stderr();
            }
            panic!(
                "mergetrace's first stderr line is not the attach banner: {first:?} \
                 (exit status: {status:?}); args {:?}; stderr:\n{}",
                cmd.get_args().collect::<Vec<_>>(),
                tracer.stderr()
            );
        }
        tracer
    }

    /// `mergetrace --json -d <device>`.
    pub fn on(dev: &BlockDev) -> Tracer {
        Tracer::start(&["-d", dev.name.as_str()])
    }

    /// `mergetrace --json -d <device> --tier <tier> --merge-attempts`, whatever
    /// `MERGETRACE_TEST_TIER` says: all a tier can count (the attempts are the fentry tier's).
    pub fn on_tier(dev: &BlockDev, tier: &str) -> Tracer {
        Tracer::start(&["-d", dev.name.as_str(), "--tier", tier, "--merge-attempts"])
    }

    /// The attach banner ("mergetrace: tracing loop3 (7:3) on the fentry tier (...)").
    pub fn banner(&self) -> String {
        self.stderr()
            .lines()
            .find(|l| l.starts_with("mergetrace: tracing"))
            .unwrap_or_default()
            .to_string()
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Everything on stderr so far.
    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// SIGINT, wait, require exit code 0, and parse the NDJSON it printed.
    pub fn stop(mut self) -> TraceOutput {
        self.proc.signal(libc::SIGINT);
        let Some(status) = self.proc.wait_exit(STOP_TIMEOUT) else {
            self.proc.signal(libc::SIGKILL);
            panic!(
                "mergetrace did not exit within {STOP_TIMEOUT:?} of SIGINT; stderr:\n{}",
                self.stderr()
            );
        };
        let stdout = self.stdout.take().unwrap().join().unwrap_or_default();
        let stderr = self.stderr();
        assert!(
            status.success(),
            "mergetrace exited with {status} after SIGINT; stderr:\n{stderr}\nstdout:\n{stdout}"
        );
        parse_ndjson(&stdout, stderr)
    }
}

/// Splits mergetrace's NDJSON into interval objects and the final total.
pub fn parse_ndjson(stdout: &str, stderr: String) -> TraceOutput {
    let mut intervals = Vec::new();
    let mut total = None;
    for (i, line) in stdout
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line {} is not JSON ({e}): {line}", i + 1));
        assert!(total.is_none(), "a line follows the total object: {line}");
        match v["type"].as_str() {
            Some("interval") => intervals.push(v),
            Some("total") => total = Some(v),
            other => panic!("unexpected object type {other:?}: {line}"),
        }
    }
    let total = total.unwrap_or_else(|| {
        panic!("mergetrace printed no total object; stdout:\n{stdout}\nstderr:\n{stderr}")
    });
    // Runs the kernel skipped may leave counts short (issue 44): say so beside whatever a
    // failing test then reports (libtest shows a failing test's output).
    if let Some(skipped) = total.get("kernel_skipped_runs") {
        eprintln!("mergetrace's kernel_skipped_runs in this run: {skipped}");
    }
    TraceOutput {
        total,
        intervals,
        stderr,
    }
}

impl TraceOutput {
    /// The `devices[]` entry of `dev` in the total object.
    pub fn device(&self, dev: &BlockDev) -> &Value {
        device_in(&self.total, dev)
    }

    /// The device's `total` (sum of its cgroup rows), e.g. `t.device_total(&lo)["write"]`.
    pub fn device_total(&self, dev: &BlockDev) -> &Value {
        &self.device(dev)["total"]
    }

    /// The row of cgroup `path` (e.g. "/mt-test-1-2") on `dev`, if it had any activity.
    pub fn cgroup_row(&self, dev: &BlockDev, path: &str) -> Option<&Value> {
        row_in(&self.total, dev, path)
    }

    pub fn lost_events(&self) -> u64 {
        u(&self.total, "lost_events")
    }

    /// Requests the kernel ended without running the completion program (`--latency`'s lost
    /// `completion_unseen`), 0 where none.
    pub fn completion_unseen(&self) -> u64 {
        self.total["lost_by_kind"]["completion_unseen"]
            .as_u64()
            .unwrap_or(0)
    }

    /// `--latency`'s requests issued whose completion no program saw by the run's end
    /// (`unfinished_requests`); panics where the run did not count them.
    pub fn unfinished_requests(&self) -> u64 {
        u(&self.total, "unfinished_requests")
    }

    /// The row of cgroup `path` on `dev` in each interval object, `None` where it had no
    /// activity.
    pub fn interval_rows(&self, dev: &BlockDev, path: &str) -> Vec<Option<&Value>> {
        self.intervals
            .iter()
            .map(|i| row_in(i, dev, path))
            .collect()
    }

    /// Sum of one numeric field of one direction over all interval objects for `dev`.
    pub fn interval_sum(&self, dev: &BlockDev, dir: &str, field: &str) -> u64 {
        self.intervals
            .iter()
            .map(|i| u(&device_in(i, dev)["total"][dir], field))
            .sum()
    }
}

/// The row of cgroup `path` on `dev` in a snapshot object, if it had any activity.
fn row_in<'a>(snapshot: &'a Value, dev: &BlockDev, path: &str) -> Option<&'a Value> {
    device_in(snapshot, dev)["cgroups"]
        .as_array()
        .expect("cgroups is an array")
        .iter()
        .find(|r| r["cgroup"] == path)
}

fn device_in<'a>(snapshot: &'a Value, dev: &BlockDev) -> &'a Value {
    snapshot["devices"]
        .as_array()
        .expect("devices is an array")
        .iter()
        .find(|d| d["major"] == dev.major && d["minor"] == dev.minor)
        .unwrap_or_else(|| panic!("{} ({}) is not in {snapshot}", dev.name, dev.maj_min()))
}

/// A direction's requests that carried more than one bio: its `bios_per_request` buckets
/// above 1 (what `latency.*.merged.count` counts). Panics when the histogram is missing or
/// holds anything but counts.
pub fn requests_of_several_bios(dir_stats: &Value) -> u64 {
    let h = &dir_stats["histograms"]["bios_per_request"];
    h.as_object()
        .unwrap_or_else(|| panic!("no bios_per_request histogram in {dir_stats}"))
        .iter()
        .filter(|(bound, _)| bound.as_str() != "1")
        .map(|(_, n)| n.as_u64().unwrap_or_else(|| panic!("not a count in {h}")))
        .sum()
}

/// Whether `name`, a loaded program's as `--stats` names it, is a build of `program`: the
/// program itself or one of the hook table's variants (`Variant` in
/// mergetrace/src/kernel/compat/hooks.rs: `block_bio_queue_q` up to 5.10, `_4`,
/// `block_rq_issue_bl` before 5.17).
pub fn is_build_of(name: &str, program: &str) -> bool {
    name.strip_prefix(program)
        .is_some_and(|variant| ["", "_q", "_4", "_bl"].contains(&variant))
}

/// A non-negative integer field; panics with the object when missing.
pub fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("field {field:?} missing or not an integer in {v}"))
}

/// Runs the built-in workload: `mergetrace __workload --target <dev> <args>`, optionally
/// inside `cg`, and returns what it printed ({"ios", "bytes", "submit_calls"}).
pub fn run_workload(dev: &BlockDev, cg: Option<&Cgroup>, args: &[&str]) -> Value {
    run_workload_with(Command::new(mergetrace_bin()), dev, cg, args)
}

/// The testing knob that stands in for a kernel ending requests without running the
/// completion program: it ignores the completions at this sector (see [`unseen_completions`]).
pub const SKIP_COMPLETIONS: (&str, &str) = ("MERGETRACE_SKIP_COMPLETIONS_AT_SECTOR", "8");

/// Three writes at the sector [`SKIP_COMPLETIONS`] names, each followed by 600 more writes
/// elsewhere, all on CPU 0: more than the disk has tags and scheduler requests, so each tag
/// comes round and finds what its unseen request left. 1,803 write requests in all.
pub fn unseen_completions(dev: &BlockDev) {
    for _ in 0..3 {
        unseen_completion(dev);
        run_workload_on(
            0,
            dev,
            None,
            &["--ios", "600", "--batch", "1", "--offset", "1048576"],
        );
    }
}

/// One write at the sector [`SKIP_COMPLETIONS`] names, on CPU 0. Last in a run, no later
/// issue of its tag finds it: the run's end has to.
pub fn unseen_completion(dev: &BlockDev) {
    run_workload_on(
        0,
        dev,
        None,
        &["--ios", "1", "--batch", "1", "--offset", "4096"],
    );
}

/// As [`run_workload`], the process bound to one CPU (`sched_setaffinity`).
pub fn run_workload_on(cpu: usize, dev: &BlockDev, cg: Option<&Cgroup>, args: &[&str]) -> Value {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(mergetrace_bin());
    // SAFETY: only an async-signal-safe syscall between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    run_workload_with(cmd, dev, cg, args)
}

fn run_workload_with(
    mut cmd: Command,
    dev: &BlockDev,
    cg: Option<&Cgroup>,
    args: &[&str],
) -> Value {
    cmd.arg("__workload")
        .arg("--target")
        .arg(&dev.path)
        .args(args);
    if let Some(cg) = cg {
        cmd.arg("--cgroup").arg(&cg.dir);
    }
    let out = run_ok(&mut cmd);
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("__workload printed no JSON ({e}): {out}"))
}

/// Runs the mergetrace binary with `args` to completion (stdin closed): what it did.
pub fn mergetrace(args: &[&str]) -> Output {
    Command::new(mergetrace_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run mergetrace")
}

/// The run succeeded without a panic: (stdout, stderr); else panics naming `what`.
pub fn succeeded(out: Output, what: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}): {stderr}\n{}",
        out.status,
        &stdout[..stdout.len().min(2000)]
    );
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    (stdout, stderr)
}

/// The run failed as bad input must: exit code 1 and exactly one stderr line, a
/// "mergetrace: error: " line containing `needle`, and no panic.
pub fn assert_one_line_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one line, got: {stderr}");
    assert!(lines[0].starts_with("mergetrace: error: "), "{stderr}");
    assert!(lines[0].contains(needle), "want {needle:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The sum of every `merged_by_path` field of a direction object.
/// The counts of a direction object that every tier, and a capture's report, give as the live
/// run did (each caller adds the fields it compares besides these).
pub const DIR_COUNTS: [&str; 6] = [
    "bios",
    "bytes",
    "merged",
    "requests",
    "request_bytes",
    "splits",
];

/// The `merged_by_path` fields of a direction object (mergetrace's own vocabulary).
pub const MERGE_PATHS: [&str; 7] = mergetrace_common::vocab::MERGE_PATH_LABELS;

/// The checks every run shares: no lost events, no merge of unknown path, the merge paths
/// add up to `merged`, and every bio or split remainder became a request or merged.
pub fn assert_consistent(out: &TraceOutput, w: &Value, ctx: &str) {
    assert_eq!(
        out.lost_events(),
        0,
        "lost events; {ctx}; stderr:\n{}",
        out.stderr
    );
    let by_path: u64 = MERGE_PATHS.iter().map(|p| path_count(w, p)).sum();
    assert_eq!(
        by_path,
        u(w, "merged"),
        "merge paths do not add up; {ctx}; {w}"
    );
    assert_eq!(
        path_count(w, "unknown"),
        0,
        "unknown merge path; {ctx}; {w}"
    );
    assert_identity(w, ctx);
}

/// The identity of a direction object: every bio or split remainder became a request or
/// merged, or was a flush-only bio (requests + merged + flush_only == bios + splits).
pub fn assert_identity(m: &Value, ctx: &str) {
    assert_eq!(
        u(m, "requests") + u(m, "merged") + u(m, "flush_only"),
        u(m, "bios") + u(m, "splits"),
        "requests + merged + flush_only != bios + splits; {ctx}; {m}"
    );
}

/// `merged_by_path.<path>` of a direction object.
pub fn path_count(dir: &Value, path: &str) -> u64 {
    u(&dir["merged_by_path"], path)
}
