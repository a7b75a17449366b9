//! `cargo xtask bench`: what tracing costs, measured as ratios in one run on this machine.
//!
//! fio reads 4 KiB blocks at random from a loop device on a /dev/shm file, as fast as it can,
//! once per *arm*: no tracer (baseline), `mergetrace` live view, `mergetrace record`,
//! `bpftrace` counting on the same block tracepoints, `perf record` of them, and the live
//! view with `--stats` (BPF run-time statistics: each program's cost per event). Each round
//! runs every arm once, in an order that rotates from round to round, so that a noisy moment
//! on the (shared, two-core) machine does not always hit the same arm; an arm's overhead is
//! 1 − its IOPS / the baseline's IOPS *of the same round*, summarised as median [min–max].
//! Then the offline side: how fast `mergetrace report` reads the biggest capture on one core,
//! and how many bytes an event takes on disk.
//!
//! A benchmark, not a test: it never fails on a number. It exits non-zero only when something
//! could not run (and says what); a tracer that cannot run here (bpftrace, perf) is reported
//! as unavailable, with the reason, and the rest goes on.
mod stats;
mod sys;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use stats::{paired_overheads, pct, si, table, Summary};
use sys::{last_line, nap, LoopDev, Proc, Ready, Tracefs, WorkDir};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Rounds; each runs every arm once, in a rotating order.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// fio's run time per arm and round, in seconds.
    #[arg(long, value_name = "S", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=600))]
    seconds: u32,
    /// One round of 1 s per arm: checks that the benchmark still works (for CI); the numbers
    /// mean little.
    #[arg(long, conflicts_with_all = ["runs", "seconds"])]
    smoke: bool,
    /// Where to write the results as JSON [default: target/bench/results.json].
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// fio jobs: 1, 2, or auto (both are tried briefly, the higher baseline wins).
    #[arg(long, default_value = "auto", value_parser = ["auto", "1", "2"])]
    numjobs: String,
    /// Use target/release/mergetrace as it is, without `cargo build --release` first.
    #[arg(long)]
    no_build: bool,
}

/// The block tracepoints mergetrace attaches (mergetrace/src/kernel/mod.rs), which the
/// bpftrace and perf arms attach too.
const BLOCK_TRACEPOINTS: [&str; 11] = [
    "block_bio_queue",
    "block_split",
    "block_bio_backmerge",
    "block_bio_frontmerge",
    "block_getrq",
    "block_rq_merge",
    "block_rq_insert",
    "block_rq_issue",
    "block_rq_requeue",
    "block_rq_complete",
    "block_unplug",
];

/// Size of the sparse backing file.
const DISK_BYTES: u64 = 1 << 30;
/// The offline figures want a capture at least this big (events); a smaller one is topped up
/// by one longer record run.
const OFFLINE_MIN_EVENTS: u64 = 3_000_000;
const OFFLINE_WANT_EVENTS: f64 = 4_000_000.0;

/// Goals from the issue.
const LIVE_MAX_OVERHEAD: f64 = 0.02;
const RECORD_MAX_OVERHEAD: f64 = 0.05;
const MIN_RATIO: f64 = 3.0;
const REPORT_MIN_EVENTS_PER_S: f64 = 20e6;
const MAX_BYTES_PER_EVENT: f64 = 24.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Baseline,
    Live,
    Record,
    Bpftrace,
    Perf,
    LiveStats,
}

impl Arm {
    const ALL: [Arm; 6] = [
        Arm::Baseline,
        Arm::Live,
        Arm::Record,
        Arm::Bpftrace,
        Arm::Perf,
        Arm::LiveStats,
    ];

    fn key(self) -> &'static str {
        match self {
            Arm::Baseline => "baseline",
            Arm::Live => "live",
            Arm::Record => "record",
            Arm::Bpftrace => "bpftrace",
            Arm::Perf => "perf",
            Arm::LiveStats => "live_stats",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Arm::Baseline => "baseline (no tracer)",
            Arm::Live => "mergetrace live",
            Arm::Record => "mergetrace record",
            Arm::Bpftrace => "bpftrace",
            Arm::Perf => "perf record",
            Arm::LiveStats => "mergetrace live --stats",
        }
    }

    /// What the arm runs, for the JSON.
    fn command(self) -> &'static str {
        match self {
            Arm::Baseline => "",
            Arm::Live => "mergetrace -d DEV --json -i 10s",
            Arm::Record => "mergetrace record -d DEV -o /dev/shm/... --force",
            Arm::Bpftrace => {
                "bpftrace -B line SCRIPT (@[probe, args->dev] = count() on the block tracepoints)"
            }
            Arm::Perf => "perf record -e block:... -a -B -N -o /dev/shm/.../perf.data",
            Arm::LiveStats => "mergetrace -d DEV --json -i 10s --stats",
        }
    }
}

/// Round `r`'s order: every arm, rotated by `r`.
fn order(round: usize) -> Vec<Arm> {
    let mut v = Arm::ALL.to_vec();
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// The fio command every arm runs.
#[derive(Debug, Clone)]
struct Fio {
    numjobs: u32,
    loop_direct_io: bool,
}

impl Fio {
    fn args(&self, dev: &str, seconds: f64) -> Vec<String> {
        [
            "--name=bench",
            &format!("--filename={dev}"),
            "--rw=randread",
            "--bs=4k",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=32",
            &format!("--numjobs={}", self.numjobs),
            "--thread",
            "--group_reporting",
            "--norandommap",
            "--randrepeat=0",
            "--time_based",
            &format!("--runtime={seconds}s"),
            "--output-format=json",
        ]
        .map(String::from)
        .to_vec()
    }
}

/// What one arm saw in one round.
#[derive(Debug, Default, Clone)]
struct Sample {
    iops: f64,
    /// Events the tracer reported for the loop device (mergetrace record, bpftrace) or in
    /// all (perf samples).
    events: Option<u64>,
    lost: Option<u64>,
    bytes: Option<u64>,
    /// `--stats`: (program, runs, ns per run).
    programs: Vec<(String, u64, f64)>,
    notes: Vec<String>,
}

#[derive(Debug, Default)]
struct ArmResults {
    samples: Vec<Option<Sample>>,
    unavailable: Option<String>,
}

impl ArmResults {
    fn iops(&self) -> Vec<Option<f64>> {
        self.samples
            .iter()
            .map(|s| s.as_ref().map(|s| s.iops))
            .collect()
    }
}

struct Ctx<'a> {
    mergetrace: PathBuf,
    lp: &'a LoopDev,
    dir: &'a Path,
    fio: Fio,
    bpftrace_script: PathBuf,
    cpus: usize,
}

impl Ctx<'_> {
    fn fio(&self, seconds: f64) -> Result<f64> {
        run_fio(&self.fio, &self.lp.dev, self.dir, seconds)
    }

    fn capture_path(&self) -> PathBuf {
        self.dir.join("record.mtr")
    }

    /// Starts the arm's tracer, if it has one, and waits until it is attached.
    fn start(&self, arm: Arm) -> Result<std::result::Result<Option<Proc>, String>> {
        let dev = self.lp.name.as_str();
        let (cmd, timeout): (Command, u64) = match arm {
            Arm::Baseline => return Ok(Ok(None)),
            Arm::Live | Arm::LiveStats => {
                let mut c = Command::new(&self.mergetrace);
                c.args(["-d", dev, "--json", "-i", "10s"]);
                if arm == Arm::LiveStats {
                    c.arg("--stats");
                }
                (c, 60)
            }
            Arm::Record => {
                let mut c = Command::new(&self.mergetrace);
                c.args(["record", "-d", dev, "--force", "-o"])
                    .arg(self.capture_path());
                (c, 60)
            }
            Arm::Bpftrace => {
                let mut c = Command::new("bpftrace");
                c.args(["-B", "line"]).arg(&self.bpftrace_script);
                (c, 120) // it compiles the script first
            }
            Arm::Perf => {
                let events: Vec<String> = BLOCK_TRACEPOINTS
                    .iter()
                    .map(|t| format!("block:{t}"))
                    .collect();
                let mut c = Command::new("perf");
                c.args(["record", "-e", &events.join(","), "-a", "-B", "-N", "-o"])
                    .arg(self.dir.join("perf.data"));
                (c, 60)
            }
        };
        let mut p = Proc::spawn(arm.label(), cmd, self.dir, arm.key())?;
        let perf_fds = BLOCK_TRACEPOINTS.len() * self.cpus;
        let ready = p.wait_ready(Duration::from_secs(timeout), |p| match arm {
            Arm::Live | Arm::LiveStats => p.stderr().contains("mergetrace: tracing"),
            Arm::Record => p.stderr().contains("mergetrace: recording to"),
            Arm::Bpftrace => p.stdout().contains("bench: attached"),
            Arm::Perf => sys::perf_event_fds(p.pid()) >= perf_fds,
            Arm::Baseline => true,
        })?;
        match ready {
            Ready::Yes => {}
            Ready::Exited(why) => return Ok(Err(why)),
            Ready::TimedOut => {
                p.stop(Duration::from_secs(5));
                return Ok(Err(format!("not attached after {timeout} s")));
            }
        }
        if arm == Arm::Perf {
            // The event fds are open; perf enables them right after mmap-ing their buffers.
            nap(Duration::from_millis(300))?;
        }
        Ok(Ok(Some(p)))
    }

    /// Runs one arm: tracer up, fio, tracer down. `Err` for something that must stop the
    /// bench; `Ok(Err(why))` for a tracer that cannot run here.
    fn run(&self, arm: Arm, seconds: f64) -> Result<std::result::Result<Sample, String>> {
        let mergetrace_arm = matches!(arm, Arm::Live | Arm::LiveStats | Arm::Record);
        let mut tracer = match self.start(arm)? {
            Ok(t) => t,
            Err(why) if mergetrace_arm => bail!("{}: {why}", arm.label()),
            Err(why) => return Ok(Err(why)),
        };
        let iops = self.fio(seconds)?;
        let mut s = Sample {
            iops,
            ..Sample::default()
        };
        let Some(p) = tracer.as_mut() else {
            return Ok(Ok(s));
        };
        let grace = Duration::from_secs(if arm == Arm::Perf { 120 } else { 30 });
        let f = p.stop(grace);
        sys::check_interrupt()?;
        let by_sigint = {
            use std::os::unix::process::ExitStatusExt;
            f.status.signal() == Some(libc::SIGINT)
        };
        if f.killed || !(f.status.success() || (arm == Arm::Perf && by_sigint)) {
            let why = format!(
                "{} after SIGINT: {}",
                if f.killed {
                    format!("did not exit within {} s", grace.as_secs())
                } else {
                    format!("exited with {}", f.status)
                },
                last_line(&f.stderr).unwrap_or("no message")
            );
            if mergetrace_arm {
                bail!("{}: {why}", arm.label());
            }
            return Ok(Err(why));
        }
        match arm {
            Arm::Baseline => {}
            Arm::Live | Arm::LiveStats => {
                let total = last_json(&f.stdout)
                    .with_context(|| format!("{}: no final JSON object on stdout", arm.label()))?;
                s.lost = total["lost_events"].as_u64();
                if arm == Arm::LiveStats {
                    s.programs = parse_program_stats(&total);
                    if s.programs.is_empty() {
                        s.notes.push("no program_stats in the final object".into());
                    }
                }
            }
            Arm::Record => {
                let (events, lost, bytes) = parse_record_summary(&f.stderr).with_context(|| {
                    format!(
                        "mergetrace record: no \"wrote N events (L lost) in B bytes\" line: {}",
                        last_line(&f.stderr).unwrap_or("no output")
                    )
                })?;
                s.events = Some(events);
                s.lost = Some(lost);
                s.bytes = Some(bytes);
            }
            Arm::Bpftrace => {
                s.events = Some(parse_bpftrace_counts(&f.stdout, self.lp.dev_t()));
            }
            Arm::Perf => {
                // perf prints a sample count only when it post-processes (not with -B -N);
                // the file size says how much it wrote.
                s.events = parse_perf_samples(&f.stderr);
                s.bytes = fs::metadata(self.dir.join("perf.data"))
                    .ok()
                    .map(|m| m.len());
                s.notes.extend(
                    f.stderr
                        .lines()
                        .filter(|l| l.to_ascii_lowercase().contains("lost"))
                        .map(|l| l.trim().to_string()),
                );
                let _ = fs::remove_file(self.dir.join("perf.data"));
            }
        }
        Ok(Ok(s))
    }
}

/// Runs fio once; its read IOPS.
fn run_fio(fio: &Fio, dev: &str, dir: &Path, seconds: f64) -> Result<f64> {
    let mut c = Command::new("fio");
    c.args(fio.args(dev, seconds));
    let mut p = Proc::spawn("fio", c, dir, "fio")?;
    let f = p.wait_exit(Duration::from_secs_f64(seconds + 60.0))?;
    if !f.status.success() {
        bail!(
            "fio failed ({}): {}",
            f.status,
            last_line(&f.stderr).unwrap_or("no message")
        );
    }
    parse_fio_iops(&f.stdout)
}

fn parse_fio_iops(stdout: &str) -> Result<f64> {
    // fio may print notes before its JSON.
    let start = stdout.find('{').context("fio printed no JSON")?;
    let v: Value = serde_json::from_str(&stdout[start..]).context("cannot parse fio's JSON")?;
    let jobs = v["jobs"].as_array().context("fio's JSON has no jobs")?;
    let iops: f64 = jobs.iter().filter_map(|j| j["read"]["iops"].as_f64()).sum();
    if iops <= 0.0 {
        bail!("fio reports no read IOPS");
    }
    Ok(iops)
}

/// The last line of NDJSON output that parses.
fn last_json(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
}

fn parse_program_stats(total: &Value) -> Vec<(String, u64, f64)> {
    total["program_stats"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    Some((
                        p["program"].as_str()?.to_string(),
                        p["runs"].as_u64()?,
                        p["ns_per_run"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// "mergetrace: wrote N events (L lost) in B bytes to FILE (...)" → (N, L, B).
fn parse_record_summary(stderr: &str) -> Option<(u64, u64, u64)> {
    let line = stderr.lines().find(|l| l.contains("mergetrace: wrote "))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|x| *x == "wrote")?;
    let events = w.get(i + 1)?.parse().ok()?;
    let lost = w.get(i + 3)?.trim_start_matches('(').parse().ok()?;
    let bytes = w.get(i + 6)?.parse().ok()?;
    Some((events, lost, bytes))
}

/// bpftrace's map dump: "@[tracepoint:block:block_getrq, 7340036]: 123" → the sum of counts
/// whose key ends with our dev_t.
fn parse_bpftrace_counts(stdout: &str, dev_t: u64) -> u64 {
    let suffix = format!(", {dev_t}]");
    stdout
        .lines()
        .filter_map(|l| {
            let (key, n) = l.trim().rsplit_once(": ")?;
            key.ends_with(&suffix)
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// "[ perf record: Captured and wrote 12.3 MB /path (123456 samples) ]" → 123456.
fn parse_perf_samples(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains("Captured and wrote"))?;
    let open = line.rfind('(')?;
    line[open + 1..].split_whitespace().next()?.parse().ok()
}

fn bpftrace_script() -> String {
    let with_dev: Vec<String> = BLOCK_TRACEPOINTS
        .iter()
        .filter(|t| **t != "block_unplug")
        .map(|t| format!("tracepoint:block:{t}"))
        .collect();
    format!(
        "// Written by cargo xtask bench: count the block tracepoints mergetrace uses, per device.\n\
         BEGIN {{ printf(\"bench: attached\\n\"); }}\n\
         {} {{ @[probe, args->dev] = count(); }}\n\
         tracepoint:block:block_unplug {{ @[probe, 0] = count(); }}\n",
        with_dev.join(",\n")
    )
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The tools it drives, installed by `scripts/setup --bench` when missing.
fn ensure_tools() -> Result<()> {
    let all = ["fio", "losetup", "taskset", "bpftrace", "perf"];
    if all.iter().all(|c| have(c)) {
        return Ok(());
    }
    eprintln!("bench: installing what is missing (scripts/setup --bench)");
    let st = Command::new(crate::workspace_root().join("scripts/setup"))
        .arg("--bench")
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("bench: warning: scripts/setup --bench failed; arms whose tools are missing will be unavailable");
    }
    for c in ["fio", "losetup", "taskset"] {
        if !have(c) {
            bail!("{c} is not installed and scripts/setup --bench could not install it");
        }
    }
    Ok(())
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// One calibration point: fio's IOPS for a setting.
struct Calibration {
    fio: Fio,
    iops: Vec<f64>,
}

/// Tries loop direct I/O on/off × 1/2 fio jobs briefly (interleaved) and keeps the fastest.
fn calibrate(
    lp: &LoopDev,
    dir: &Path,
    numjobs: &str,
    seconds: f64,
    repeats: usize,
) -> Result<(Fio, Vec<Calibration>)> {
    let jobs: Vec<u32> = match numjobs {
        "1" => vec![1],
        "2" => vec![2],
        _ => vec![1, 2],
    };
    let mut points: Vec<Calibration> = Vec::new();
    for dio in [true, false] {
        for &j in &jobs {
            points.push(Calibration {
                fio: Fio {
                    numjobs: j,
                    loop_direct_io: dio,
                },
                iops: Vec::new(),
            });
        }
    }
    // A first run on a fresh device is slower; it does not count.
    run_fio(&points[0].fio, &lp.dev, dir, 1.0)?;
    for _ in 0..repeats {
        for p in points.iter_mut() {
            if let Err(e) = lp.set_direct_io(p.fio.loop_direct_io) {
                eprintln!(
                    "bench: calibration: loop direct I/O {}: {e:#}",
                    p.fio.loop_direct_io
                );
                continue;
            }
            let iops = run_fio(&p.fio, &lp.dev, dir, seconds)?;
            eprintln!(
                "bench: calibration: numjobs {} loop direct I/O {}: {} IOPS",
                p.fio.numjobs,
                if p.fio.loop_direct_io { "on" } else { "off" },
                si(iops)
            );
            p.iops.push(iops);
        }
    }
    let best = points
        .iter()
        .filter_map(|p| Some((Summary::of(&p.iops)?.median, p)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p.fio.clone())
        .context("fio ran in no calibration setting")?;
    lp.set_direct_io(best.loop_direct_io)?;
    Ok((best, points))
}

/// The offline figures: `mergetrace report FILE --json` pinned to CPU 0.
struct Offline {
    events: u64,
    file_bytes: u64,
    seconds: Vec<f64>,
}

fn time_report(mergetrace: &Path, capture: &Path, events: u64, dir: &Path) -> Result<Offline> {
    let file_bytes = fs::metadata(capture)
        .with_context(|| format!("cannot stat {}", capture.display()))?
        .len();
    let mut seconds = Vec::new();
    for _ in 0..3 {
        sys::check_interrupt()?;
        let mut c = Command::new("taskset");
        c.args(["-c", "0"])
            .arg(mergetrace)
            .arg("report")
            .arg(capture)
            .arg("--json");
        let t = Instant::now();
        let mut p = Proc::spawn("mergetrace report", c, dir, "report")?;
        let f = p.wait_exit(Duration::from_secs(600))?;
        let dt = t.elapsed().as_secs_f64();
        if !f.status.success() {
            bail!(
                "mergetrace report failed ({}): {}",
                f.status,
                last_line(&f.stderr).unwrap_or("no message")
            );
        }
        let _ = fs::remove_file(dir.join("report.out"));
        seconds.push(dt);
    }
    Ok(Offline {
        events,
        file_bytes,
        seconds,
    })
}

/// A goal from the issue and what was measured.
struct Target {
    name: String,
    goal: String,
    measured: String,
    /// Some(yes/no), or None when it could not be told (with `measured` saying why).
    met: Option<bool>,
    value: Value,
}

impl Target {
    fn met_str(&self) -> &'static str {
        match self.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        }
    }
}

struct Outcome {
    arms: BTreeMap<Arm, ArmResults>,
    orders: Vec<Vec<Arm>>,
    offline: Option<Offline>,
    offline_note: Option<String>,
}

impl Outcome {
    fn overheads(&self, arm: Arm) -> Vec<f64> {
        paired_overheads(&self.arms[&arm].iops(), &self.arms[&Arm::Baseline].iops())
    }

    fn ratio_target(&self, tracer: Arm, ours: Arm) -> Target {
        let name = format!("{} / {} overhead", tracer.key(), ours.key());
        let goal = format!("≥ {MIN_RATIO:.0}×");
        let t = |measured: String, met: Option<bool>, value: Value| Target {
            name: name.clone(),
            goal: goal.clone(),
            measured,
            met,
            value,
        };
        if let Some(why) = &self.arms[&tracer].unavailable {
            if self.overheads(tracer).is_empty() {
                // The reason is in the arms table above (and here in the JSON).
                return t(
                    format!("{} unavailable", tracer.key()),
                    None,
                    json!({"unavailable": why}),
                );
            }
        }
        let (Some(theirs), Some(mine)) = (
            Summary::of(&self.overheads(tracer)),
            Summary::of(&self.overheads(ours)),
        ) else {
            return t("no paired rounds".into(), None, json!(null));
        };
        let detail = format!(
            "({} {}, {} {})",
            tracer.key(),
            pct(theirs.median),
            ours.key(),
            pct(mine.median)
        );
        if mine.median <= 0.0 {
            // Our overhead is within the noise (at or below zero): the ratio is unbounded.
            let met = theirs.median > 0.0;
            return t(
                format!("∞ {detail}"),
                Some(met),
                json!({"ratio": null, "tracer_overhead": theirs.median, "mergetrace_overhead": mine.median}),
            );
        }
        let r = theirs.median / mine.median;
        t(
            format!("{r:.1}× {detail}"),
            Some(r >= MIN_RATIO),
            json!({"ratio": r, "tracer_overhead": theirs.median, "mergetrace_overhead": mine.median}),
        )
    }

    fn targets(&self) -> Vec<Target> {
        let mut v = Vec::new();
        for (arm, max) in [
            (Arm::Live, LIVE_MAX_OVERHEAD),
            (Arm::Record, RECORD_MAX_OVERHEAD),
        ] {
            let s = Summary::of(&self.overheads(arm));
            v.push(Target {
                name: format!("{} overhead", arm.label()),
                goal: format!("≤ {:.0} %", max * 100.0),
                measured: s
                    .map(|s| s.show(pct))
                    .unwrap_or_else(|| "not measured".into()),
                met: s.map(|s| s.median <= max),
                value: s.map(|s| s.json()).unwrap_or(Value::Null),
            });
        }
        let lost: Vec<u64> = self.arms[&Arm::Record]
            .samples
            .iter()
            .flatten()
            .filter_map(|s| s.lost)
            .collect();
        v.push(Target {
            name: "mergetrace record lost events".into(),
            goal: "0".into(),
            measured: if lost.is_empty() {
                "not measured".into()
            } else {
                format!(
                    "{} in {} runs (max {} per run)",
                    lost.iter().sum::<u64>(),
                    lost.len(),
                    lost.iter().max().unwrap_or(&0)
                )
            },
            met: (!lost.is_empty()).then(|| lost.iter().all(|&l| l == 0)),
            value: json!(lost),
        });
        for tracer in [Arm::Bpftrace, Arm::Perf] {
            for ours in [Arm::Live, Arm::Record] {
                v.push(self.ratio_target(tracer, ours));
            }
        }
        match &self.offline {
            Some(o) => {
                let rates: Vec<f64> = o.seconds.iter().map(|s| o.events as f64 / s).collect();
                let best = rates.iter().copied().fold(0.0, f64::max);
                let s = Summary::of(&rates);
                v.push(Target {
                    name: "report speed, 1 core".into(),
                    goal: format!("≥ {:.0}M events/s", REPORT_MIN_EVENTS_PER_S / 1e6),
                    measured: format!(
                        "{} events/s best of {} ({}; {} events)",
                        si(best),
                        rates.len(),
                        s.map(|s| s.show(si)).unwrap_or_default(),
                        si(o.events as f64)
                    ),
                    met: Some(best >= REPORT_MIN_EVENTS_PER_S),
                    value: json!({"best": best, "events_per_s": s.map(|s| s.json()), "seconds": o.seconds, "events": o.events}),
                });
                let bpe = o.file_bytes as f64 / o.events.max(1) as f64;
                v.push(Target {
                    name: "capture size".into(),
                    goal: format!("≤ {MAX_BYTES_PER_EVENT:.0} bytes/event"),
                    measured: format!(
                        "{bpe:.1} bytes/event ({} bytes, {} events)",
                        o.file_bytes, o.events
                    ),
                    met: Some(bpe <= MAX_BYTES_PER_EVENT),
                    value: json!({"bytes_per_event": bpe, "bytes": o.file_bytes, "events": o.events}),
                });
            }
            None => {
                let why = self
                    .offline_note
                    .clone()
                    .unwrap_or_else(|| "no capture".into());
                for (name, goal) in [
                    (
                        "report speed, 1 core",
                        format!("≥ {:.0}M events/s", REPORT_MIN_EVENTS_PER_S / 1e6),
                    ),
                    (
                        "capture size",
                        format!("≤ {MAX_BYTES_PER_EVENT:.0} bytes/event"),
                    ),
                ] {
                    v.push(Target {
                        name: name.into(),
                        goal,
                        measured: why.clone(),
                        met: None,
                        value: Value::Null,
                    });
                }
            }
        }
        v
    }

    /// Per program: runs per round and ns/run, over the `--stats` rounds.
    fn program_stats(&self) -> Vec<(String, Summary, Summary)> {
        let mut by: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for s in self.arms[&Arm::LiveStats].samples.iter().flatten() {
            for (p, runs, ns) in &s.programs {
                let e = by.entry(p.clone()).or_default();
                e.0.push(*runs as f64);
                e.1.push(*ns);
            }
        }
        let mut v: Vec<(String, Summary, Summary)> = by
            .into_iter()
            .filter_map(|(p, (runs, ns))| Some((p, Summary::of(&runs)?, Summary::of(&ns)?)))
            .collect();
        v.sort_by(|a, b| b.1.median.total_cmp(&a.1.median));
        v
    }
}

pub fn bench(args: BenchArgs) -> Result<ExitCode> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "cargo xtask bench must run as root (loop devices, eBPF, perf); try `sudo ./mt bench`"
        );
    }
    let (runs, seconds) = if args.smoke {
        (1, 1)
    } else {
        (args.runs as usize, args.seconds)
    };
    let json_out = args
        .json
        .clone()
        .unwrap_or_else(|| target_dir().join("bench/results.json"));
    ensure_tools()?;
    let mergetrace = target_dir().join("release/mergetrace");
    if !args.no_build {
        eprintln!("bench: cargo build --release -p mergetrace");
        let mut c = crate::cargo();
        c.args(["build", "--release", "-p", "mergetrace"]);
        let st = c.status().context("cannot start cargo build")?;
        if !st.success() {
            bail!("cannot build mergetrace (cargo build --release -p mergetrace: {st})");
        }
    }
    if !mergetrace.is_file() {
        bail!(
            "{} is missing (build it, or drop --no-build)",
            mergetrace.display()
        );
    }

    sys::catch_signals();
    sys::remove_stale();
    let started = now_secs();
    let load_start = loadavg();
    let work = WorkDir::create()?;
    let lp = LoopDev::create(&work.path.join("disk.img"), DISK_BYTES)?;
    let mut scheduler = "none".to_string();
    if let Err(e) = lp.set_scheduler("none") {
        eprintln!("bench: warning: {e:#}");
        scheduler = fs::read_to_string(format!("/sys/block/{}/queue/scheduler", lp.name))
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    eprintln!(
        "bench: {} ({}) on a {} MiB sparse file in /dev/shm, scheduler {scheduler}",
        lp.dev,
        lp.majmin,
        DISK_BYTES >> 20
    );

    // bpftrace and perf need tracefs; without it (or without them) their arms are unavailable.
    let tracefs = Tracefs::ensure();
    let mut arms: BTreeMap<Arm, ArmResults> = Arm::ALL
        .iter()
        .map(|a| (*a, ArmResults::default()))
        .collect();
    for (arm, tool) in [(Arm::Bpftrace, "bpftrace"), (Arm::Perf, "perf")] {
        let why = if !have(tool) {
            Some(format!("{tool} is not installed (scripts/setup --bench)"))
        } else {
            tracefs.as_ref().err().map(|e| format!("{e:#}"))
        };
        arms.get_mut(&arm).unwrap().unavailable = why;
    }
    let script = work.path.join("bench.bt");
    fs::write(&script, bpftrace_script())?;

    let cal_seconds = if args.smoke {
        1.0
    } else {
        f64::from(seconds.min(3))
    };
    let (fio, calibration) = calibrate(
        &lp,
        &work.path,
        &args.numjobs,
        cal_seconds,
        if args.smoke { 1 } else { 2 },
    )?;
    eprintln!(
        "bench: using numjobs {} with loop direct I/O {}",
        fio.numjobs,
        if fio.loop_direct_io { "on" } else { "off" }
    );
    let ctx = Ctx {
        mergetrace: mergetrace.clone(),
        lp: &lp,
        dir: &work.path,
        fio: fio.clone(),
        bpftrace_script: script,
        cpus: online_cpus(),
    };

    let mut orders = Vec::new();
    let mut best_capture: Option<(PathBuf, u64, f64)> = None; // (file, events, seconds)
    for round in 0..runs {
        let ord = order(round);
        eprintln!(
            "bench: round {}/{runs}: {}",
            round + 1,
            ord.iter().map(|a| a.key()).collect::<Vec<_>>().join(", ")
        );
        for &arm in &ord {
            let r = arms.get_mut(&arm).unwrap();
            r.samples.push(None);
            if r.unavailable.is_some() {
                continue;
            }
            match ctx.run(arm, f64::from(seconds))? {
                Ok(s) => {
                    let mut line = format!("bench:   {:<24} {:>8} IOPS", arm.label(), si(s.iops));
                    if let Some(e) = s.events {
                        line += &format!("  {} events", si(e as f64));
                    }
                    if let Some(l) = s.lost {
                        line += &format!(", {l} lost");
                    }
                    if let (Some(b), Some(e)) = (s.bytes, s.events) {
                        line += &format!(", {:.1} bytes/event", b as f64 / e.max(1) as f64);
                    }
                    eprintln!("{line}");
                    if arm == Arm::Record {
                        let events = s.events.unwrap_or(0);
                        if best_capture.as_ref().is_none_or(|b| events > b.1) {
                            let keep = work.path.join("capture.mtr");
                            fs::rename(ctx.capture_path(), &keep)
                                .context("cannot keep the capture")?;
                            best_capture = Some((keep, events, f64::from(seconds)));
                        } else {
                            let _ = fs::remove_file(ctx.capture_path());
                        }
                    }
                    *r.samples.last_mut().unwrap() = Some(s);
                }
                Err(why) => {
                    eprintln!("bench:   {:<24} unavailable: {why}", arm.label());
                    r.unavailable = Some(why);
                }
            }
        }
        orders.push(ord);
    }

    // Offline: the biggest capture, topped up to a few million events if it is small.
    let mut offline_note = None;
    if !args.smoke {
        if let Some((_, events, secs)) = best_capture.clone() {
            if events < OFFLINE_MIN_EVENTS && events > 0 {
                let rate = events as f64 / secs;
                let want = (OFFLINE_WANT_EVENTS / rate).ceil().clamp(1.0, 30.0);
                eprintln!(
                    "bench: recording {want:.0} s more for a bigger capture ({} events so far)",
                    si(events as f64)
                );
                if let Ok(s) = ctx.run(Arm::Record, want)? {
                    let e = s.events.unwrap_or(0);
                    if e > events {
                        let keep = work.path.join("capture.mtr");
                        fs::rename(ctx.capture_path(), &keep).context("cannot keep the capture")?;
                        best_capture = Some((keep, e, want));
                    }
                }
            }
        }
    }
    let offline = match &best_capture {
        Some((file, events, _)) if *events > 0 => {
            eprintln!(
                "bench: timing mergetrace report on {} events, pinned to CPU 0",
                si(*events as f64)
            );
            Some(time_report(&mergetrace, file, *events, &work.path)?)
        }
        _ => {
            offline_note = Some("no capture with events".to_string());
            None
        }
    };
    let load_end = loadavg();

    let outcome = Outcome {
        arms,
        orders,
        offline,
        offline_note,
    };
    let targets = outcome.targets();
    let header = format!(
        "mergetrace bench, {}: {runs} round{} × {seconds} s per arm\n\
         fio: 4 KiB random reads, io_uring, O_DIRECT, iodepth 32, numjobs {}, on {} \
         (/dev/shm file, loop direct I/O {}, scheduler {scheduler})\n\
         machine: {} CPUs, kernel {}, load average {} → {}",
        stats::utc_date(started),
        if runs == 1 { "" } else { "s" },
        fio.numjobs,
        lp.name,
        if fio.loop_direct_io { "on" } else { "off" },
        ctx.cpus,
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        load_start,
        load_end,
    );
    let text = render(&header, &outcome, &targets);
    print!("{text}");

    let json = results_json(
        &args,
        runs,
        seconds,
        started,
        &header,
        &lp,
        &scheduler,
        &fio,
        &calibration,
        &outcome,
        &targets,
        &load_start,
        &load_end,
    );
    if let Some(parent) = json_out.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    fs::write(&json_out, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("cannot write {}", json_out.display()))?;
    eprintln!("bench: results in {}", json_out.display());
    drop(ctx);
    drop(tracefs);
    drop(lp);
    drop(work);
    Ok(ExitCode::SUCCESS)
}

fn render(header: &str, o: &Outcome, targets: &[Target]) -> String {
    let mut out = format!("{header}\n\n");
    let mut rows = vec![vec![
        "arm".to_string(),
        "IOPS median [min–max]".into(),
        "overhead median [min–max]".into(),
        "events/run".into(),
        "lost".into(),
        "written/run".into(),
    ]];
    for arm in Arm::ALL {
        let r = &o.arms[&arm];
        let iops: Vec<f64> = r.iops().into_iter().flatten().collect();
        let Some(s) = Summary::of(&iops) else {
            rows.push(vec![
                arm.label().into(),
                format!(
                    "unavailable: {}",
                    r.unavailable.as_deref().unwrap_or("did not run")
                ),
            ]);
            continue;
        };
        let ovh = if arm == Arm::Baseline {
            "—".to_string()
        } else {
            Summary::of(&o.overheads(arm))
                .map(|s| s.show(pct))
                .unwrap_or_default()
        };
        let events: Vec<f64> = r
            .samples
            .iter()
            .flatten()
            .filter_map(|s| s.events.map(|e| e as f64))
            .collect();
        let ev = Summary::of(&events)
            .map(|s| si(s.median))
            .unwrap_or_default();
        let lost: Vec<u64> = r.samples.iter().flatten().filter_map(|s| s.lost).collect();
        let lost = if lost.is_empty() {
            String::new()
        } else {
            lost.iter().sum::<u64>().to_string()
        };
        let bytes: Vec<f64> = r
            .samples
            .iter()
            .flatten()
            .filter_map(|s| s.bytes.map(|b| b as f64))
            .collect();
        let written = Summary::of(&bytes)
            .map(|s| format!("{:.1} MB", s.median / 1e6))
            .unwrap_or_default();
        rows.push(vec![arm.label().into(), s.show(si), ovh, ev, lost, written]);
    }
    out += &table(&rows);
    for arm in Arm::ALL {
        if let (Some(why), true) = (
            &o.arms[&arm].unavailable,
            o.arms[&arm].samples.iter().any(Option::is_some),
        ) {
            out += &format!("note: {} stopped being available: {why}\n", arm.label());
        }
    }
    out += "\n";
    let mut rows = vec![vec![
        "target".to_string(),
        "goal".into(),
        "measured median [min–max]".into(),
        "met".into(),
    ]];
    for t in targets {
        rows.push(vec![
            t.name.clone(),
            t.goal.clone(),
            t.measured.clone(),
            t.met_str().into(),
        ]);
    }
    out += &table(&rows);
    let ps = o.program_stats();
    out += "\n";
    if ps.is_empty() {
        out += "BPF program cost: not measured (the --stats arm did not run or reported nothing)\n";
    } else {
        out +=
            "BPF program cost (mergetrace --stats, kernel BPF run-time statistics, all devices)\n";
        let mut rows = vec![vec![
            "program".to_string(),
            "runs/run".into(),
            "ns/run median [min–max]".into(),
        ]];
        for (p, runs, ns) in &ps {
            rows.push(vec![
                p.clone(),
                si(runs.median),
                ns.show(|x| format!("{x:.0}")),
            ]);
        }
        out += &table(&rows);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn results_json(
    args: &BenchArgs,
    runs: usize,
    seconds: u32,
    started: u64,
    header: &str,
    lp: &LoopDev,
    scheduler: &str,
    fio: &Fio,
    calibration: &[Calibration],
    o: &Outcome,
    targets: &[Target],
    load_start: &str,
    load_end: &str,
) -> Value {
    let mut arms = serde_json::Map::new();
    for arm in Arm::ALL {
        let r = &o.arms[&arm];
        let iops = r.iops();
        let ovh = if arm == Arm::Baseline {
            Value::Null
        } else {
            json!({
                "per_round": iops.iter().zip(o.arms[&Arm::Baseline].iops()).map(|(a, b)| match (a, b) {
                    (Some(a), Some(b)) => json!(1.0 - a / b),
                    _ => Value::Null,
                }).collect::<Vec<_>>(),
                "summary": Summary::of(&o.overheads(arm)).map(|s| s.json()),
            })
        };
        let samples: Vec<Value> = r
            .samples
            .iter()
            .map(|s| match s {
                None => Value::Null,
                Some(s) => json!({
                    "iops": s.iops,
                    "events": s.events,
                    "lost": s.lost,
                    "bytes": s.bytes,
                    "programs": s.programs.iter().map(|(p, runs, ns)| json!({"program": p, "runs": runs, "ns_per_run": ns})).collect::<Vec<_>>(),
                    "notes": s.notes,
                }),
            })
            .collect();
        let all: Vec<f64> = iops.iter().flatten().copied().collect();
        arms.insert(
            arm.key().into(),
            json!({
                "label": arm.label(),
                "command": arm.command(),
                "status": match &r.unavailable {
                    None => "ok".to_string(),
                    Some(why) => format!("unavailable: {why}"),
                },
                "iops": Summary::of(&all).map(|s| s.json()),
                "iops_per_round": iops,
                "overhead": ovh,
                "rounds": samples,
            }),
        );
    }
    json!({
        "date": stats::utc_date(started),
        "unix_time": started,
        "summary": header.lines().collect::<Vec<_>>(),
        "config": {
            "runs": runs,
            "seconds": seconds,
            "smoke": args.smoke,
            "device": lp.name,
            "scheduler": scheduler,
            "loop_direct_io": fio.loop_direct_io,
            "fio": fio.args(&lp.dev, f64::from(seconds)),
            "calibration": calibration.iter().map(|c| json!({
                "numjobs": c.fio.numjobs,
                "loop_direct_io": c.fio.loop_direct_io,
                "iops": c.iops,
            })).collect::<Vec<_>>(),
        },
        "host": {
            "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "cpus": online_cpus(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
        },
        "orders": o.orders.iter().map(|ord| ord.iter().map(|a| a.key()).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "arms": arms,
        "program_stats": o.program_stats().iter().map(|(p, runs, ns)| json!({
            "program": p, "runs_per_run": runs.json(), "ns_per_run": ns.json(),
        })).collect::<Vec<_>>(),
        "offline": o.offline.as_ref().map(|off| json!({
            "events": off.events,
            "file_bytes": off.file_bytes,
            "bytes_per_event": off.file_bytes as f64 / off.events.max(1) as f64,
            "report_seconds": off.seconds,
            "command": "taskset -c 0 mergetrace report FILE --json > file",
        })),
        "targets": targets.iter().map(|t| json!({
            "target": t.name, "goal": t.goal, "measured": t.measured,
            "met": t.met, "value": t.value,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_rotate_through_every_arm() {
        assert_eq!(order(0), Arm::ALL.to_vec());
        assert_eq!(order(1)[0], Arm::Live);
        assert_eq!(*order(1).last().unwrap(), Arm::Baseline);
        for r in 0..7 {
            let mut o = order(r);
            o.sort();
            assert_eq!(o, Arm::ALL.to_vec());
        }
    }

    #[test]
    fn parses_tool_output() {
        let fio = "note: something\n{\"jobs\": [{\"read\": {\"iops\": 1000.5}}, {\"read\": {\"iops\": 10}}]}";
        assert_eq!(parse_fio_iops(fio).unwrap(), 1010.5);
        assert!(parse_fio_iops("{\"jobs\": []}").is_err());
        let rec = "mergetrace: tracing loop4 (7:4)\nmergetrace: wrote 4123456 events (7 lost) in 80000000 bytes to /dev/shm/x.mtr (19.4 bytes/event)\n";
        assert_eq!(parse_record_summary(rec), Some((4_123_456, 7, 80_000_000)));
        assert_eq!(parse_record_summary("nothing"), None);
        let bt = "Attaching 12 probes...\nbench: attached\n\n\n@[tracepoint:block:block_getrq, 7340036]: 100\n@[tracepoint:block:block_bio_queue, 266338304]: 5\n@[tracepoint:block:block_rq_issue, 7340036]: 23\n@[tracepoint:block:block_unplug, 0]: 4\n";
        assert_eq!(parse_bpftrace_counts(bt, 7 << 20 | 4), 123);
        let perf = "[ perf record: Woken up 1 times to write data ]\n[ perf record: Captured and wrote 12.072 MB /dev/shm/perf.data (123456 samples) ]\n";
        assert_eq!(parse_perf_samples(perf), Some(123_456));
        let total = serde_json::json!({"program_stats": [{"program": "block_getrq", "runs": 10, "run_time_ns": 1000, "ns_per_run": 100.0}]});
        assert_eq!(
            parse_program_stats(&total),
            vec![("block_getrq".to_string(), 10, 100.0)]
        );
        assert_eq!(
            last_json("{\"kind\":\"interval\"}\n{\"kind\":\"total\"}\n").unwrap()["kind"],
            "total"
        );
    }

    #[test]
    fn bpftrace_script_covers_the_tracepoints() {
        let s = bpftrace_script();
        for t in BLOCK_TRACEPOINTS {
            assert!(s.contains(&format!("tracepoint:block:{t}")), "{t}");
        }
        assert!(s.contains("BEGIN"));
    }

    #[test]
    fn fio_runs_time_based_4k_random_reads() {
        let a = Fio {
            numjobs: 2,
            loop_direct_io: true,
        }
        .args("/dev/loop9", 5.0);
        for want in [
            "--filename=/dev/loop9",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=32",
            "--numjobs=2",
            "--time_based",
            "--runtime=5s",
            "--output-format=json",
        ] {
            assert!(a.iter().any(|x| x == want), "{want}");
        }
    }

    fn outcome(base: &[f64], live: &[f64], bt: Option<&[f64]>) -> Outcome {
        let mk = |v: &[f64]| ArmResults {
            samples: v
                .iter()
                .map(|&iops| {
                    Some(Sample {
                        iops,
                        ..Sample::default()
                    })
                })
                .collect(),
            unavailable: None,
        };
        let mut arms: BTreeMap<Arm, ArmResults> = Arm::ALL
            .iter()
            .map(|a| (*a, ArmResults::default()))
            .collect();
        arms.insert(Arm::Baseline, mk(base));
        arms.insert(Arm::Live, mk(live));
        arms.insert(Arm::Record, mk(live));
        match bt {
            Some(v) => {
                arms.insert(Arm::Bpftrace, mk(v));
            }
            None => arms.get_mut(&Arm::Bpftrace).unwrap().unavailable = Some("no tracefs".into()),
        }
        Outcome {
            arms,
            orders: vec![],
            offline: None,
            offline_note: None,
        }
    }

    #[test]
    fn ratios_of_median_overheads() {
        let o = outcome(
            &[100.0, 100.0, 100.0],
            &[99.0, 98.0, 99.0],
            Some(&[90.0, 95.0, 80.0]),
        );
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live);
        assert_eq!(t.met, Some(true));
        assert!(
            (t.value["ratio"].as_f64().unwrap() - 10.0).abs() < 1e-9,
            "{}",
            t.measured
        );
        // Our overhead in the noise: unbounded ratio, met when theirs is positive.
        let o = outcome(&[100.0], &[101.0], Some(&[90.0]));
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live);
        assert_eq!(t.met, Some(true));
        assert!(t.measured.starts_with('∞'));
        // Unavailable tracer: not told, with the reason.
        let o = outcome(&[100.0], &[99.0], None);
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live);
        assert_eq!(t.met, None);
        assert!(t.measured.contains("unavailable"));
        assert_eq!(t.value["unavailable"], "no tracefs");
    }

    #[test]
    fn overhead_targets_use_the_median() {
        let o = outcome(&[100.0, 100.0, 100.0], &[99.0, 90.0, 99.5], None);
        let t = &o.targets()[0];
        assert_eq!(t.met, Some(true), "{}", t.measured);
        assert_eq!(t.measured, "1.0 % [0.5 %–10.0 %]");
    }
}
