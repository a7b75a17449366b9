//! `cargo xtask bench`: what tracing costs, measured as ratios in one run on this machine.
//!
//! fio drives a loop device on a /dev/shm file as fast as it can, with two *workloads*: 4 KiB
//! random reads (every bio its own request) and the merging worst case, 4 KiB sequential
//! writes submitted 32 at a time (31 of every 32 bios merge in the plug). Each workload runs
//! once per *arm*: no tracer (baseline), `mergetrace` live view, `mergetrace record`,
//! `bpftrace` counting on the same block tracepoints, `perf record` of them, and the live
//! view with `--stats` (BPF run-time statistics: each program's cost per event). Each round
//! runs every arm of every workload once, in an order that rotates from round to round, so
//! that a noisy moment on the (shared, two-core) machine does not always hit the same arm;
//! an arm's overhead is 1 − its IOPS / the baseline's IOPS *of the same round and workload*,
//! summarised as median [min–max]. The `--stats` arm's kernel time per I/O is set against
//! the CPU time an I/O takes in the baseline (/proc/stat over its run). Then the offline
//! side: how fast `mergetrace report` reads the biggest capture on one core, against
//! blkparse on the same events exported in blktrace's format, and bytes on disk for both.
//!
//! A benchmark, not a test: it never fails on a number. It exits non-zero only when something
//! could not run (and says what); a tool that cannot run here (bpftrace, perf, blkparse) is
//! reported as unavailable, with the reason, and the rest goes on.
mod fio;
mod offline;
mod stats;
mod sys;

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use fio::{Fio, FioRun, Workload, DEVICE_BYTES, REGION_BYTES};
use offline::Offline;
use stats::{paired_overheads, pct, si, table, Summary};
use sys::{last_line, nap, LoopDev, Proc, Ready, Tracefs, WorkDir};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Rounds; each runs every arm of every workload once, in a rotating order.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// fio's run time per arm, workload and round, in seconds.
    #[arg(long, value_name = "S", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=600))]
    seconds: u32,
    /// One round of 1 s per arm and workload: checks that the benchmark still works (for CI);
    /// the numbers mean little.
    #[arg(long, conflicts_with_all = ["runs", "seconds"])]
    smoke: bool,
    /// reads: 4 KiB random reads; merging: 4 KiB sequential writes in batches of 32, 31 of
    /// 32 bios merged in the plug; all: both.
    #[arg(long, default_value = "all", value_parser = ["reads", "merging", "all"])]
    workload: String,
    /// Where to write the results as JSON [default: target/bench/results.json].
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// fio jobs: 1, 2, or auto (both are tried briefly, the higher baseline wins), for each
    /// workload.
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

/// The offline figures want a capture at least this big (events); a smaller one is topped up
/// by one longer record run.
const OFFLINE_MIN_EVENTS: u64 = 3_000_000;
const OFFLINE_WANT_EVENTS: f64 = 4_000_000.0;

/// Goals from the issue, each for every workload:
/// the live view's median overhead,
const LIVE_MAX_OVERHEAD: f64 = 0.03;
/// bpftrace's median overhead over the live view's,
const BPFTRACE_OVER_LIVE_MIN: f64 = 8.0;
/// record's median overhead,
const RECORD_MAX_OVERHEAD: f64 = 0.12;
/// bpftrace's over record's (record costs at most half of bpftrace),
const BPFTRACE_OVER_RECORD_MIN: f64 = 2.0;
/// the BPF programs' kernel time per I/O over the CPU time of an I/O.
const BPF_MAX_CPU_SHARE: f64 = 0.03;
/// Offline, on the biggest capture: report's events/s on one core,
const REPORT_MIN_EVENTS_PER_S: f64 = 20e6;
/// the capture's bytes per event,
const MAX_BYTES_PER_EVENT: f64 = 24.0;
/// blkparse's best time on the blktrace export over report's best time,
const BLKPARSE_MIN_SLOWDOWN: f64 = 10.0;
/// the blktrace export's bytes over the capture's.
const BLKTRACE_MIN_SIZE_RATIO: f64 = 10.0;

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

/// Round `r`'s order of arms: every arm, rotated by `r`.
fn order(round: usize) -> Vec<Arm> {
    let mut v = Arm::ALL.to_vec();
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// Round `r`'s order of workloads: the chosen ones, rotated by `r`.
fn workload_order(chosen: &[Workload], round: usize) -> Vec<Workload> {
    let mut v = chosen.to_vec();
    if !v.is_empty() {
        let n = v.len();
        v.rotate_left(round % n);
    }
    v
}

/// What one arm saw in one round of one workload.
#[derive(Debug, Default, Clone)]
struct Sample {
    iops: f64,
    /// I/Os fio did (reads and writes).
    ios: u64,
    /// The machine's busy CPU time per I/O over the fio run, ns (/proc/stat, all CPUs).
    cpu_ns_per_io: Option<f64>,
    /// Busy, steal and all CPU time over the run, ns.
    cpu: Option<fio::CpuUse>,
    /// Bios per request on the device (diskstats).
    bios_per_request: Option<f64>,
    /// Events the tracer reported for the loop device (mergetrace record, bpftrace) or in
    /// all (perf samples).
    events: Option<u64>,
    lost: Option<u64>,
    bytes: Option<u64>,
    /// `--stats`: (program, runs, ns per run).
    programs: Vec<(String, u64, f64)>,
    notes: Vec<String>,
}

impl Sample {
    fn of(r: &FioRun) -> Sample {
        Sample {
            iops: r.iops,
            ios: r.ios,
            cpu_ns_per_io: r.cpu_ns_per_io(),
            cpu: r.cpu,
            bios_per_request: r.bios_per_request,
            ..Sample::default()
        }
    }

    /// `--stats`: the programs' kernel time (runs × ns/run, added up) per I/O fio did, ns.
    fn bpf_ns_per_io(&self) -> Option<f64> {
        if self.programs.is_empty() || self.ios == 0 {
            return None;
        }
        let ns: f64 = self
            .programs
            .iter()
            .map(|(_, runs, ns)| *runs as f64 * ns)
            .sum();
        Some(ns / self.ios as f64)
    }
}

#[derive(Debug, Default)]
struct ArmResults {
    samples: Vec<Option<Sample>>,
    unavailable: Option<String>,
}

impl ArmResults {
    /// One value per round (None where the arm did not run or the value is missing).
    fn per_round(&self, f: impl Fn(&Sample) -> Option<f64>) -> Vec<Option<f64>> {
        self.samples
            .iter()
            .map(|s| s.as_ref().and_then(&f))
            .collect()
    }

    fn iops(&self) -> Vec<Option<f64>> {
        self.per_round(|s| Some(s.iops))
    }

    /// The values of the rounds that have one.
    fn values(&self, f: impl Fn(&Sample) -> Option<f64>) -> Vec<f64> {
        self.per_round(f).into_iter().flatten().collect()
    }
}

struct Ctx<'a> {
    mergetrace: PathBuf,
    lp: &'a LoopDev,
    dir: &'a Path,
    bpftrace_script: PathBuf,
    cpus: usize,
}

impl Ctx<'_> {
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
    fn run(
        &self,
        arm: Arm,
        fio: &Fio,
        seconds: f64,
    ) -> Result<std::result::Result<Sample, String>> {
        let mergetrace_arm = matches!(arm, Arm::Live | Arm::LiveStats | Arm::Record);
        let mut tracer = match self.start(arm)? {
            Ok(t) => t,
            Err(why) if mergetrace_arm => bail!("{}: {why}", arm.label()),
            Err(why) => return Ok(Err(why)),
        };
        let mut s = Sample::of(&fio::run(fio, self.lp, self.dir, seconds)?);
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
    let all = ["fio", "losetup", "taskset", "bpftrace", "perf", "blkparse"];
    if all.iter().all(|c| have(c)) {
        return Ok(());
    }
    eprintln!("bench: installing what is missing (scripts/setup --bench)");
    let st = Command::new(crate::workspace_root().join("scripts/setup"))
        .arg("--bench")
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!(
            "bench: warning: scripts/setup --bench failed; what needs the missing tools will \
             be unavailable"
        );
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

/// Writes the merging workload's region of the backing file once, so that no measured run
/// pays for allocating its pages in /dev/shm (the reads' region stays a hole, as before).
fn prefill(backing: &Path) -> Result<()> {
    let (offset, bytes) = Workload::Merging.region();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .with_context(|| format!("cannot open {}", backing.display()))?;
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(offset))?;
    let block = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        sys::check_interrupt()?;
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("cannot write {}", backing.display()))?;
        left -= n as u64;
    }
    Ok(())
}

/// One calibration point: fio's IOPS for a setting.
struct Calibration {
    fio: Fio,
    iops: Vec<f64>,
}

/// For each workload, tries loop direct I/O on/off × 1/2 fio jobs briefly (all the points
/// interleaved) and keeps the fastest. The loop device's direct I/O is set per workload, before
/// its arms run.
fn calibrate(
    lp: &LoopDev,
    dir: &Path,
    workloads: &[Workload],
    numjobs: &str,
    seconds: f64,
    repeats: usize,
) -> Result<Vec<(Fio, Vec<Calibration>)>> {
    let jobs: Vec<u32> = match numjobs {
        "1" => vec![1],
        "2" => vec![2],
        _ => vec![1, 2],
    };
    let mut points: Vec<Calibration> = Vec::new();
    for &workload in workloads {
        for dio in [true, false] {
            for &j in &jobs {
                points.push(Calibration {
                    fio: Fio {
                        workload,
                        numjobs: j,
                        loop_direct_io: dio,
                    },
                    iops: Vec::new(),
                });
            }
        }
    }
    // A first run on a fresh device is slower; it does not count.
    for &w in workloads {
        if let Some(p) = points.iter().find(|p| p.fio.workload == w) {
            let _ = lp.set_direct_io(p.fio.loop_direct_io);
            fio::run(&p.fio, lp, dir, 1.0)?;
        }
    }
    for _ in 0..repeats {
        for p in points.iter_mut() {
            if let Err(e) = lp.set_direct_io(p.fio.loop_direct_io) {
                eprintln!(
                    "bench: calibration: loop direct I/O {}: {e:#}",
                    p.fio.loop_direct_io
                );
                continue;
            }
            let r = fio::run(&p.fio, lp, dir, seconds)?;
            eprintln!(
                "bench: calibration: {} numjobs {} loop direct I/O {}: {} IOPS",
                p.fio.workload.key(),
                p.fio.numjobs,
                if p.fio.loop_direct_io { "on" } else { "off" },
                si(r.iops)
            );
            p.iops.push(r.iops);
        }
    }
    let mut out = Vec::new();
    for &w in workloads {
        let mine: Vec<Calibration> = points
            .iter()
            .filter(|p| p.fio.workload == w)
            .map(|p| Calibration {
                fio: p.fio.clone(),
                iops: p.iops.clone(),
            })
            .collect();
        let best = mine
            .iter()
            .filter_map(|p| Some((Summary::of(&p.iops)?.median, p)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, p)| p.fio.clone())
            .with_context(|| format!("fio ran in no calibration setting of {}", w.key()))?;
        out.push((best, mine));
    }
    Ok(out)
}

/// A goal from the issue and what was measured.
struct Target {
    /// The workload it is measured on; None for the offline ones.
    workload: Option<Workload>,
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

/// Everything one workload's arms measured.
struct WorkloadOutcome {
    fio: Fio,
    calibration: Vec<Calibration>,
    arms: BTreeMap<Arm, ArmResults>,
    orders: Vec<Vec<Arm>>,
}

/// The `--stats` arm's BPF time per I/O against the baseline's CPU time per I/O, in one round.
struct BpfShare {
    bpf_ns_per_io: f64,
    cpu_ns_per_io: f64,
}

impl WorkloadOutcome {
    fn workload(&self) -> Workload {
        self.fio.workload
    }

    fn overheads(&self, arm: Arm) -> Vec<f64> {
        paired_overheads(&self.arms[&arm].iops(), &self.arms[&Arm::Baseline].iops())
    }

    /// `theirs` median overhead over `ours`: at least `min`.
    fn ratio_target(&self, tracer: Arm, ours: Arm, min: f64) -> Target {
        let name = format!("{} / {} overhead", tracer.key(), ours.key());
        let goal = format!("≥ {min:.0}×");
        let t = |measured: String, met: Option<bool>, value: Value| Target {
            workload: Some(self.workload()),
            name: name.clone(),
            goal: goal.clone(),
            measured,
            met,
            value,
        };
        match self.overhead_ratio(tracer, ours) {
            Ratio::Unavailable(why) => t(
                // The reason is in the arms table above (and here in the JSON).
                format!("{} unavailable", tracer.key()),
                None,
                json!({"unavailable": why}),
            ),
            Ratio::NotPaired => t("no paired rounds".into(), None, json!(null)),
            Ratio::Unbounded {
                theirs,
                mine,
                detail,
            } => t(
                // Our overhead is within the noise (at or below zero).
                format!("∞ {detail}"),
                Some(theirs > 0.0),
                json!({"ratio": null, "tracer_overhead": theirs, "mergetrace_overhead": mine}),
            ),
            Ratio::Of {
                r,
                theirs,
                mine,
                detail,
            } => t(
                format!("{r:.1}× {detail}"),
                Some(r >= min),
                json!({"ratio": r, "tracer_overhead": theirs, "mergetrace_overhead": mine}),
            ),
        }
    }

    fn overhead_ratio(&self, tracer: Arm, ours: Arm) -> Ratio {
        if let Some(why) = &self.arms[&tracer].unavailable {
            if self.overheads(tracer).is_empty() {
                return Ratio::Unavailable(why.clone());
            }
        }
        let (Some(theirs), Some(mine)) = (
            Summary::of(&self.overheads(tracer)),
            Summary::of(&self.overheads(ours)),
        ) else {
            return Ratio::NotPaired;
        };
        let detail = format!(
            "({} {}, {} {})",
            tracer.key(),
            pct(theirs.median),
            ours.key(),
            pct(mine.median)
        );
        if mine.median <= 0.0 {
            return Ratio::Unbounded {
                theirs: theirs.median,
                mine: mine.median,
                detail,
            };
        }
        Ratio::Of {
            r: theirs.median / mine.median,
            theirs: theirs.median,
            mine: mine.median,
            detail,
        }
    }

    fn overhead_target(&self, arm: Arm, max: f64) -> Target {
        let s = Summary::of(&self.overheads(arm));
        Target {
            workload: Some(self.workload()),
            name: format!("{} overhead", arm.label()),
            goal: format!("≤ {:.0} %", max * 100.0),
            measured: s
                .map(|s| s.show(pct))
                .unwrap_or_else(|| "not measured".into()),
            met: s.map(|s| s.median <= max),
            value: s.map(|s| s.json()).unwrap_or(Value::Null),
        }
    }

    /// Per round where both ran: the `--stats` arm's programs' time per I/O and the
    /// baseline's CPU time per I/O.
    fn bpf_shares(&self) -> Vec<BpfShare> {
        self.arms[&Arm::LiveStats]
            .samples
            .iter()
            .zip(&self.arms[&Arm::Baseline].samples)
            .filter_map(|(s, b)| {
                let bpf = s.as_ref()?.bpf_ns_per_io()?;
                let cpu = b.as_ref()?.cpu_ns_per_io?;
                (cpu > 0.0).then_some(BpfShare {
                    bpf_ns_per_io: bpf,
                    cpu_ns_per_io: cpu,
                })
            })
            .collect()
    }

    fn bpf_cost_target(&self) -> Target {
        let v = self.bpf_shares();
        let share = Summary::of(
            &v.iter()
                .map(|s| s.bpf_ns_per_io / s.cpu_ns_per_io)
                .collect::<Vec<_>>(),
        );
        let bpf = Summary::of(&v.iter().map(|s| s.bpf_ns_per_io).collect::<Vec<_>>());
        let cpu = Summary::of(&v.iter().map(|s| s.cpu_ns_per_io).collect::<Vec<_>>());
        let (measured, met, value) = match (share, bpf, cpu) {
            (Some(share), Some(bpf), Some(cpu)) => (
                format!(
                    "{} ({:.0} ns/I/O of programs, {:.2} µs/I/O of CPU)",
                    share.show(pct),
                    bpf.median,
                    cpu.median / 1e3
                ),
                Some(share.median <= BPF_MAX_CPU_SHARE),
                json!({
                    "share": share.json(),
                    "bpf_ns_per_io": bpf.json(),
                    "cpu_ns_per_io": cpu.json(),
                }),
            ),
            _ => (
                "not measured (no --stats program times or no /proc/stat)".to_string(),
                None,
                Value::Null,
            ),
        };
        Target {
            workload: Some(self.workload()),
            name: "BPF cost per I/O".into(),
            goal: format!("≤ {:.0} % of the I/O's CPU time", BPF_MAX_CPU_SHARE * 100.0),
            measured,
            met,
            value,
        }
    }

    fn targets(&self) -> Vec<Target> {
        let lost: Vec<u64> = self.arms[&Arm::Record]
            .samples
            .iter()
            .flatten()
            .filter_map(|s| s.lost)
            .collect();
        vec![
            self.overhead_target(Arm::Live, LIVE_MAX_OVERHEAD),
            self.ratio_target(Arm::Bpftrace, Arm::Live, BPFTRACE_OVER_LIVE_MIN),
            self.overhead_target(Arm::Record, RECORD_MAX_OVERHEAD),
            self.ratio_target(Arm::Bpftrace, Arm::Record, BPFTRACE_OVER_RECORD_MIN),
            Target {
                workload: Some(self.workload()),
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
            },
            self.bpf_cost_target(),
        ]
    }

    /// perf's overhead over live's and record's, shown without a target.
    fn perf_ratios(&self) -> String {
        let show = |ours: Arm| match self.overhead_ratio(Arm::Perf, ours) {
            Ratio::Of { r, .. } => format!("{r:.1}× {}'s", ours.key()),
            Ratio::Unbounded { .. } => format!("∞× {}'s", ours.key()),
            Ratio::Unavailable(_) | Ratio::NotPaired => format!("n/a × {}'s", ours.key()),
        };
        format!(
            "perf record's overhead (no target): {}, {}",
            show(Arm::Live),
            show(Arm::Record)
        )
    }

    /// Per program: runs per round, runs per I/O and ns/run, over the `--stats` rounds.
    fn program_stats(&self) -> Vec<ProgramStat> {
        // program → (runs, runs per I/O, ns/run), one of each per round.
        type PerRound = (Vec<f64>, Vec<f64>, Vec<f64>);
        let mut by: BTreeMap<String, PerRound> = BTreeMap::new();
        for s in self.arms[&Arm::LiveStats].samples.iter().flatten() {
            for (p, runs, ns) in &s.programs {
                let e = by.entry(p.clone()).or_default();
                e.0.push(*runs as f64);
                if s.ios > 0 {
                    e.1.push(*runs as f64 / s.ios as f64);
                }
                e.2.push(*ns);
            }
        }
        let mut v: Vec<ProgramStat> = by
            .into_iter()
            .filter_map(|(program, (runs, per_io, ns))| {
                Some(ProgramStat {
                    program,
                    runs: Summary::of(&runs)?,
                    runs_per_io: Summary::of(&per_io),
                    ns_per_run: Summary::of(&ns)?,
                })
            })
            .collect();
        v.sort_by(|a, b| b.runs.median.total_cmp(&a.runs.median));
        v
    }
}

/// A ratio of two arms' median overheads.
enum Ratio {
    Unavailable(String),
    NotPaired,
    /// Ours at or below zero (in the noise).
    Unbounded {
        theirs: f64,
        mine: f64,
        detail: String,
    },
    Of {
        r: f64,
        theirs: f64,
        mine: f64,
        detail: String,
    },
}

struct ProgramStat {
    program: String,
    runs: Summary,
    runs_per_io: Option<Summary>,
    ns_per_run: Summary,
}

struct Outcome {
    workloads: Vec<WorkloadOutcome>,
    offline: Option<Offline>,
    offline_note: Option<String>,
}

impl Outcome {
    fn offline_targets(&self) -> Vec<Target> {
        let report_goal = format!("≥ {:.0}M events/s", REPORT_MIN_EVENTS_PER_S / 1e6);
        let size_goal = format!("≤ {MAX_BYTES_PER_EVENT:.0} bytes/event");
        let blkparse_goal = format!("≥ {BLKPARSE_MIN_SLOWDOWN:.0}× faster");
        let export_goal = format!("≥ {BLKTRACE_MIN_SIZE_RATIO:.0}× smaller");
        let t =
            |name: &str, goal: &str, measured: String, met: Option<bool>, value: Value| Target {
                workload: None,
                name: name.into(),
                goal: goal.into(),
                measured,
                met,
                value,
            };
        let Some(o) = &self.offline else {
            let why = self
                .offline_note
                .clone()
                .unwrap_or_else(|| "no capture".into());
            return [
                ("report speed, 1 core", &report_goal),
                ("capture size", &size_goal),
                ("report vs blkparse, 1 core", &blkparse_goal),
                ("capture vs blktrace export", &export_goal),
            ]
            .into_iter()
            .map(|(name, goal)| t(name, goal, why.clone(), None, Value::Null))
            .collect();
        };
        let mut v = Vec::new();
        let rates: Vec<f64> = o
            .report_seconds
            .iter()
            .map(|s| o.events as f64 / s)
            .collect();
        let best_rate = rates.iter().copied().fold(0.0, f64::max);
        let s = Summary::of(&rates);
        v.push(t(
            "report speed, 1 core",
            &report_goal,
            format!(
                "{} events/s best of {} ({}; {} events)",
                si(best_rate),
                rates.len(),
                s.map(|s| s.show(si)).unwrap_or_default(),
                si(o.events as f64)
            ),
            Some(best_rate >= REPORT_MIN_EVENTS_PER_S),
            json!({"best": best_rate, "events_per_s": s.map(|s| s.json()), "seconds": o.report_seconds, "events": o.events}),
        ));
        let bpe = o.file_bytes as f64 / o.events.max(1) as f64;
        v.push(t(
            "capture size",
            &size_goal,
            format!(
                "{bpe:.1} bytes/event ({} bytes, {} events)",
                o.file_bytes, o.events
            ),
            Some(bpe <= MAX_BYTES_PER_EVENT),
            json!({"bytes_per_event": bpe, "bytes": o.file_bytes, "events": o.events}),
        ));
        let report_best = offline::best(&o.report_seconds);
        v.push(match (&o.blkparse_seconds, report_best) {
            (Ok(b), Some(ours)) => match offline::best(b) {
                Some(theirs) => {
                    let r = theirs / ours;
                    t(
                        "report vs blkparse, 1 core",
                        &blkparse_goal,
                        format!(
                            "{r:.1}× (report {ours:.2} s, blkparse {theirs:.2} s, best of {} each)",
                            offline::TIMED_RUNS
                        ),
                        Some(r >= BLKPARSE_MIN_SLOWDOWN),
                        json!({"ratio": r, "report_seconds": o.report_seconds, "blkparse_seconds": b}),
                    )
                }
                None => t(
                    "report vs blkparse, 1 core",
                    &blkparse_goal,
                    "blkparse not timed".into(),
                    None,
                    Value::Null,
                ),
            },
            (Err(why), _) => t(
                "report vs blkparse, 1 core",
                &blkparse_goal,
                format!("unavailable: {why}"),
                None,
                json!({"unavailable": why}),
            ),
            (Ok(_), None) => t(
                "report vs blkparse, 1 core",
                &blkparse_goal,
                "report not timed".into(),
                None,
                Value::Null,
            ),
        });
        v.push(match &o.export {
            Ok(e) => {
                let r = e.bytes as f64 / o.file_bytes.max(1) as f64;
                t(
                    "capture vs blktrace export",
                    &export_goal,
                    format!(
                        "{r:.1}× ({:.1} MB vs {:.1} MB)",
                        o.file_bytes as f64 / 1e6,
                        e.bytes as f64 / 1e6
                    ),
                    Some(r >= BLKTRACE_MIN_SIZE_RATIO),
                    json!({"ratio": r, "capture_bytes": o.file_bytes, "blktrace_bytes": e.bytes}),
                )
            }
            Err(why) => t(
                "capture vs blktrace export",
                &export_goal,
                format!("export failed: {why}"),
                None,
                json!({"export_failed": why}),
            ),
        });
        v
    }

    fn targets(&self) -> Vec<Target> {
        let mut v: Vec<Target> = self
            .workloads
            .iter()
            .flat_map(WorkloadOutcome::targets)
            .collect();
        v.extend(self.offline_targets());
        v
    }
}

/// A line for one arm's run in one round.
fn progress(arm: Arm, s: &Sample) -> String {
    let mut line = format!("bench:   {:<24} {:>8} IOPS", arm.label(), si(s.iops));
    if let Some(c) = s.cpu_ns_per_io {
        line += &format!("  {:.2} µs CPU/I/O", c / 1e3);
    }
    if let Some(e) = s.events {
        line += &format!("  {} events", si(e as f64));
    }
    if let Some(l) = s.lost {
        line += &format!(", {l} lost");
    }
    if let (Some(b), Some(e)) = (s.bytes, s.events) {
        line += &format!(", {:.1} bytes/event", b as f64 / e.max(1) as f64);
    }
    if let Some(b) = s.bpf_ns_per_io() {
        line += &format!("  BPF {b:.0} ns/I/O");
    }
    line
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
    let chosen = Workload::parse(&args.workload);
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
    let backing = work.path.join("disk.img");
    let mut lp = LoopDev::create(&backing, DEVICE_BYTES)?;
    if chosen.contains(&Workload::Merging) {
        prefill(&backing)?;
    }
    for w in lp.prepare_queue() {
        eprintln!("bench: warning: {w}");
    }
    let queue = |attr: &str| lp.queue(attr).unwrap_or_else(|_| "?".into());
    let (scheduler, max_sectors_kb) = (queue("scheduler"), queue("max_sectors_kb"));
    eprintln!(
        "bench: {} ({}) on a {} MiB sparse file in /dev/shm, scheduler {scheduler}, \
         max_sectors_kb {max_sectors_kb}",
        lp.dev,
        lp.majmin,
        DEVICE_BYTES >> 20
    );

    // bpftrace and perf need tracefs; without it (or without them) their arms are unavailable.
    let tracefs = Tracefs::ensure();
    let mut unavailable: BTreeMap<Arm, String> = BTreeMap::new();
    for (arm, tool) in [(Arm::Bpftrace, "bpftrace"), (Arm::Perf, "perf")] {
        let why = if !have(tool) {
            Some(format!("{tool} is not installed (scripts/setup --bench)"))
        } else {
            tracefs.as_ref().err().map(|e| format!("{e:#}"))
        };
        if let Some(why) = why {
            unavailable.insert(arm, why);
        }
    }
    let script = work.path.join("bench.bt");
    fs::write(&script, bpftrace_script())?;

    // 8 points (2 workloads × loop direct I/O on/off × 1/2 jobs) × 2 × 2 s: about 45 s. The
    // smoke run, which only checks that everything runs, takes a fixed setting instead.
    let calibrated = if args.smoke {
        eprintln!("bench: --smoke: no calibration; 2 fio jobs (or --numjobs), loop direct I/O on");
        chosen
            .iter()
            .map(|&workload| {
                let fio = Fio {
                    workload,
                    numjobs: args.numjobs.parse().unwrap_or(2),
                    loop_direct_io: true,
                };
                (fio, Vec::new())
            })
            .collect()
    } else {
        calibrate(&lp, &work.path, &chosen, &args.numjobs, 2.0, 2)?
    };
    let mut outcomes: Vec<WorkloadOutcome> = calibrated
        .into_iter()
        .map(|(fio, calibration)| {
            eprintln!(
                "bench: {}: numjobs {} with loop direct I/O {}",
                fio.workload.key(),
                fio.numjobs,
                if fio.loop_direct_io { "on" } else { "off" }
            );
            WorkloadOutcome {
                fio,
                calibration,
                arms: Arm::ALL
                    .iter()
                    .map(|a| {
                        (
                            *a,
                            ArmResults {
                                samples: Vec::new(),
                                unavailable: unavailable.get(a).cloned(),
                            },
                        )
                    })
                    .collect(),
                orders: Vec::new(),
            }
        })
        .collect();
    let ctx = Ctx {
        mergetrace: mergetrace.clone(),
        lp: &lp,
        dir: &work.path,
        bpftrace_script: script,
        cpus: online_cpus(),
    };

    // (file, events, seconds, workload)
    let mut best_capture: Option<(PathBuf, u64, f64, Workload)> = None;
    for round in 0..runs {
        for w in workload_order(&chosen, round) {
            let wo = outcomes
                .iter_mut()
                .find(|o| o.workload() == w)
                .expect("every chosen workload was calibrated");
            lp.set_direct_io(wo.fio.loop_direct_io)?;
            let ord = order(round);
            eprintln!(
                "bench: round {}/{runs}, {}: {}",
                round + 1,
                w.key(),
                ord.iter().map(|a| a.key()).collect::<Vec<_>>().join(", ")
            );
            for &arm in &ord {
                let r = wo.arms.get_mut(&arm).unwrap();
                r.samples.push(None);
                if r.unavailable.is_some() {
                    continue;
                }
                match ctx.run(arm, &wo.fio, f64::from(seconds))? {
                    Ok(s) => {
                        eprintln!("{}", progress(arm, &s));
                        if arm == Arm::Record {
                            let events = s.events.unwrap_or(0);
                            if best_capture.as_ref().is_none_or(|b| events > b.1) {
                                let keep = work.path.join("capture.mtr");
                                fs::rename(ctx.capture_path(), &keep)
                                    .context("cannot keep the capture")?;
                                best_capture = Some((keep, events, f64::from(seconds), w));
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
            wo.orders.push(ord);
        }
    }

    // Offline: the biggest capture, topped up to a few million events if it is small.
    let mut offline_note = None;
    if !args.smoke {
        if let Some((_, events, secs, w)) = best_capture.clone() {
            if events < OFFLINE_MIN_EVENTS && events > 0 {
                let rate = events as f64 / secs;
                let want = (OFFLINE_WANT_EVENTS / rate).ceil().clamp(1.0, 30.0);
                eprintln!(
                    "bench: recording {want:.0} s more of {} for a bigger capture ({} events so far)",
                    w.key(),
                    si(events as f64)
                );
                let fio = outcomes
                    .iter()
                    .find(|o| o.workload() == w)
                    .map(|o| o.fio.clone())
                    .expect("the capture's workload ran");
                lp.set_direct_io(fio.loop_direct_io)?;
                if let Ok(s) = ctx.run(Arm::Record, &fio, want)? {
                    let e = s.events.unwrap_or(0);
                    if e > events {
                        let keep = work.path.join("capture.mtr");
                        fs::rename(ctx.capture_path(), &keep).context("cannot keep the capture")?;
                        best_capture = Some((keep, e, want, w));
                    }
                }
                let _ = fs::remove_file(ctx.capture_path());
            }
        }
    }
    let mut failure = None;
    let offline = match &best_capture {
        Some((file, events, _, w)) if *events > 0 => {
            eprintln!(
                "bench: timing mergetrace report on {} events of {}, pinned to CPU 0; then the \
                 blktrace export and blkparse on it",
                si(*events as f64),
                w.key()
            );
            match offline::measure(&mergetrace, *w, file, *events, &work.path, have("blkparse")) {
                Ok(o) => {
                    if let Err(why) = &o.export {
                        failure = Some(format!("mergetrace export: {why}"));
                    }
                    Some(o)
                }
                Err(e) => {
                    sys::check_interrupt()?;
                    offline_note = Some(format!("{e:#}"));
                    failure = Some(format!("{e:#}"));
                    None
                }
            }
        }
        _ => {
            offline_note = Some("no capture with events".to_string());
            None
        }
    };
    let load_end = loadavg();

    let outcome = Outcome {
        workloads: outcomes,
        offline,
        offline_note,
    };
    let targets = outcome.targets();
    let header = format!(
        "mergetrace bench, {}: {runs} round{} × {seconds} s per arm and workload\n\
         device: {} ({} GiB sparse /dev/shm file; scheduler {scheduler}, max_sectors_kb \
         {max_sectors_kb})\n\
         machine: {} CPUs, kernel {}, load average {} → {}",
        stats::utc_date(started),
        if runs == 1 { "" } else { "s" },
        lp.name,
        DEVICE_BYTES >> 30,
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
        &max_sectors_kb,
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
    if let Some(why) = failure {
        eprintln!("bench: error: the offline side could not run: {why}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The fio line of a workload's section.
fn workload_line(w: &WorkloadOutcome) -> String {
    let bpr = Summary::of(&w.arms[&Arm::Baseline].values(|s| s.bios_per_request));
    format!(
        "{}: {}; numjobs {}, loop direct I/O {}, on {}–{} GiB of the device{}",
        w.workload().key(),
        w.workload().describe(),
        w.fio.numjobs,
        if w.fio.loop_direct_io { "on" } else { "off" },
        w.workload().region().0 >> 30,
        (w.workload().region().0 + w.workload().region().1) >> 30,
        bpr.map(|s| format!(
            "; baseline bios per request {}",
            s.show(|x| format!("{x:.1}"))
        ))
        .unwrap_or_default()
    )
}

fn render_workload(w: &WorkloadOutcome, targets: &[&Target]) -> String {
    let mut out = format!("{}\n\n", workload_line(w));
    let mut rows = vec![vec![
        "arm".to_string(),
        "IOPS median [min–max]".into(),
        "overhead median [min–max]".into(),
        "CPU/I/O".into(),
        "events/run".into(),
        "lost".into(),
        "written/run".into(),
    ]];
    for arm in Arm::ALL {
        let r = &w.arms[&arm];
        let Some(s) = Summary::of(&r.values(|s| Some(s.iops))) else {
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
            Summary::of(&w.overheads(arm))
                .map(|s| s.show(pct))
                .unwrap_or_default()
        };
        let cpu = Summary::of(&r.values(|s| s.cpu_ns_per_io))
            .map(|s| format!("{:.2} µs", s.median / 1e3))
            .unwrap_or_default();
        let ev = Summary::of(&r.values(|s| s.events.map(|e| e as f64)))
            .map(|s| si(s.median))
            .unwrap_or_default();
        let lost: Vec<u64> = r.samples.iter().flatten().filter_map(|s| s.lost).collect();
        let lost = if lost.is_empty() {
            String::new()
        } else {
            lost.iter().sum::<u64>().to_string()
        };
        let written = Summary::of(&r.values(|s| s.bytes.map(|b| b as f64)))
            .map(|s| format!("{:.1} MB", s.median / 1e6))
            .unwrap_or_default();
        rows.push(vec![
            arm.label().into(),
            s.show(si),
            ovh,
            cpu,
            ev,
            lost,
            written,
        ]);
    }
    out += &table(&rows);
    for arm in Arm::ALL {
        if let (Some(why), true) = (
            &w.arms[&arm].unavailable,
            w.arms[&arm].samples.iter().any(Option::is_some),
        ) {
            out += &format!("note: {} stopped being available: {why}\n", arm.label());
        }
    }
    out += &w.perf_ratios();
    out += "\n\n";
    out += &targets_table(targets);
    let ps = w.program_stats();
    out += "\n";
    if ps.is_empty() {
        out += "BPF program cost: not measured (the --stats arm did not run or reported nothing)\n";
    } else {
        out +=
            "BPF program cost (mergetrace --stats, kernel BPF run-time statistics, all devices)\n";
        let mut rows = vec![vec![
            "program".to_string(),
            "runs/run".into(),
            "runs/I/O".into(),
            "ns/run median [min–max]".into(),
        ]];
        for p in &ps {
            rows.push(vec![
                p.program.clone(),
                si(p.runs.median),
                p.runs_per_io
                    .map(|s| format!("{:.2}", s.median))
                    .unwrap_or_default(),
                p.ns_per_run.show(|x| format!("{x:.0}")),
            ]);
        }
        out += &table(&rows);
    }
    out
}

fn targets_table(targets: &[&Target]) -> String {
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
    table(&rows)
}

fn render(header: &str, o: &Outcome, targets: &[Target]) -> String {
    let mut out = format!("{header}\n");
    for w in &o.workloads {
        let mine: Vec<&Target> = targets
            .iter()
            .filter(|t| t.workload == Some(w.workload()))
            .collect();
        out += "\n";
        out += &render_workload(w, &mine);
    }
    out += "\n";
    out += &match &o.offline {
        Some(off) => format!(
            "offline: the biggest capture ({} events, {} workload's record arm), read on CPU 0{}\n\n",
            si(off.events as f64),
            off.workload.key(),
            match &off.export {
                Ok(e) => format!(
                    "; blktrace export {:.1} MB{} in {:.2} s",
                    e.bytes as f64 / 1e6,
                    e.traces
                        .map(|t| format!(", {} traces", si(t as f64)))
                        .unwrap_or_default(),
                    e.seconds
                ),
                Err(_) => String::new(),
            }
        ),
        None => "offline:\n\n".to_string(),
    };
    let offline: Vec<&Target> = targets.iter().filter(|t| t.workload.is_none()).collect();
    out += &targets_table(&offline);
    out
}

fn arm_json(w: &WorkloadOutcome, arm: Arm) -> Value {
    let r = &w.arms[&arm];
    let iops = r.iops();
    let ovh = if arm == Arm::Baseline {
        Value::Null
    } else {
        json!({
            "per_round": iops.iter().zip(w.arms[&Arm::Baseline].iops()).map(|(a, b)| match (a, b) {
                (Some(a), Some(b)) => json!(1.0 - a / b),
                _ => Value::Null,
            }).collect::<Vec<_>>(),
            "summary": Summary::of(&w.overheads(arm)).map(|s| s.json()),
        })
    };
    let samples: Vec<Value> = r
        .samples
        .iter()
        .map(|s| match s {
            None => Value::Null,
            Some(s) => json!({
                "iops": s.iops,
                "ios": s.ios,
                "cpu_ns_per_io": s.cpu_ns_per_io,
                "cpu_busy_ns": s.cpu.map(|c| c.busy_ns),
                "cpu_steal_ns": s.cpu.map(|c| c.steal_ns),
                "cpu_all_ns": s.cpu.map(|c| c.all_ns),
                "bios_per_request": s.bios_per_request,
                "events": s.events,
                "lost": s.lost,
                "bytes": s.bytes,
                "programs": s.programs.iter().map(|(p, runs, ns)| json!({"program": p, "runs": runs, "ns_per_run": ns})).collect::<Vec<_>>(),
                "bpf_ns_per_io": s.bpf_ns_per_io(),
                "notes": s.notes,
            }),
        })
        .collect();
    json!({
        "label": arm.label(),
        "command": arm.command(),
        "status": match &r.unavailable {
            None => "ok".to_string(),
            Some(why) => format!("unavailable: {why}"),
        },
        "iops": Summary::of(&r.values(|s| Some(s.iops))).map(|s| s.json()),
        "iops_per_round": iops,
        "overhead": ovh,
        "cpu_ns_per_io": Summary::of(&r.values(|s| s.cpu_ns_per_io)).map(|s| s.json()),
        "rounds": samples,
    })
}

fn workload_json(w: &WorkloadOutcome, dev: &str, seconds: u32) -> Value {
    let mut arms = serde_json::Map::new();
    for arm in Arm::ALL {
        arms.insert(arm.key().into(), arm_json(w, arm));
    }
    let shares = w.bpf_shares();
    json!({
        "description": w.workload().describe(),
        "numjobs": w.fio.numjobs,
        "loop_direct_io": w.fio.loop_direct_io,
        "region": {"offset": w.workload().region().0, "bytes": w.workload().region().1},
        "fio": w.fio.args(dev, f64::from(seconds)),
        "calibration": w.calibration.iter().map(|c| json!({
            "numjobs": c.fio.numjobs,
            "loop_direct_io": c.fio.loop_direct_io,
            "iops": c.iops,
        })).collect::<Vec<_>>(),
        "orders": w.orders.iter().map(|ord| ord.iter().map(|a| a.key()).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "bios_per_request": Summary::of(&w.arms[&Arm::Baseline].values(|s| s.bios_per_request)).map(|s| s.json()),
        "arms": arms,
        "program_stats": w.program_stats().iter().map(|p| json!({
            "program": p.program,
            "runs_per_run": p.runs.json(),
            "runs_per_io": p.runs_per_io.map(|s| s.json()),
            "ns_per_run": p.ns_per_run.json(),
        })).collect::<Vec<_>>(),
        "bpf_cost_per_round": shares.iter().map(|s| json!({
            "bpf_ns_per_io": s.bpf_ns_per_io,
            "baseline_cpu_ns_per_io": s.cpu_ns_per_io,
            "share": s.bpf_ns_per_io / s.cpu_ns_per_io,
        })).collect::<Vec<_>>(),
    })
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
    max_sectors_kb: &str,
    o: &Outcome,
    targets: &[Target],
    load_start: &str,
    load_end: &str,
) -> Value {
    let mut workloads = serde_json::Map::new();
    for w in &o.workloads {
        workloads.insert(
            w.workload().key().into(),
            workload_json(w, &lp.dev, seconds),
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
            "workloads": o.workloads.iter().map(|w| w.workload().key()).collect::<Vec<_>>(),
            "device": lp.name,
            "device_bytes": DEVICE_BYTES,
            "region_bytes": REGION_BYTES,
            "scheduler": scheduler,
            "max_sectors_kb": max_sectors_kb,
            "jiffy_ns": fio::jiffy_ns(),
        },
        "host": {
            "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
            "cpus": online_cpus(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
        },
        "workloads": workloads,
        "offline": o.offline.as_ref().map(|off| json!({
            "workload": off.workload.key(),
            "events": off.events,
            "file_bytes": off.file_bytes,
            "bytes_per_event": off.file_bytes as f64 / off.events.max(1) as f64,
            "report_seconds": off.report_seconds,
            "report_command": "taskset -c 0 mergetrace report FILE --json > file",
            "export": match &off.export {
                Ok(e) => json!({"bytes": e.bytes, "traces": e.traces, "seconds": e.seconds}),
                Err(why) => json!({"failed": why}),
            },
            "export_command": "mergetrace export FILE --format blktrace -o BASE",
            "blkparse_seconds": match &off.blkparse_seconds {
                Ok(s) => json!(s),
                Err(why) => json!({"unavailable": why}),
            },
            "blkparse_command": "taskset -c 0 blkparse -i BASE -o /dev/null",
        })),
        "offline_note": o.offline_note,
        "targets": targets.iter().map(|t| json!({
            "workload": t.workload.map(Workload::key),
            "target": t.name, "goal": t.goal, "measured": t.measured,
            "met": t.met, "value": t.value,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_rotate_through_every_arm_and_workload() {
        assert_eq!(order(0), Arm::ALL.to_vec());
        assert_eq!(order(1)[0], Arm::Live);
        assert_eq!(*order(1).last().unwrap(), Arm::Baseline);
        for r in 0..7 {
            let mut o = order(r);
            o.sort();
            assert_eq!(o, Arm::ALL.to_vec());
        }
        let all = Workload::ALL;
        assert_eq!(workload_order(&all, 0), all.to_vec());
        assert_eq!(
            workload_order(&all, 1),
            vec![Workload::Merging, Workload::Reads]
        );
        assert_eq!(
            workload_order(&[Workload::Merging], 3),
            vec![Workload::Merging]
        );
        assert_eq!(Workload::parse("all"), all.to_vec());
        assert_eq!(Workload::parse("reads"), vec![Workload::Reads]);
        assert_eq!(Workload::parse("merging"), vec![Workload::Merging]);
    }

    #[test]
    fn parses_tool_output() {
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

    fn sample(iops: f64) -> Sample {
        Sample {
            iops,
            ..Sample::default()
        }
    }

    fn outcome(base: &[f64], live: &[f64], bt: Option<&[f64]>) -> WorkloadOutcome {
        let mk = |v: &[f64]| ArmResults {
            samples: v.iter().map(|&iops| Some(sample(iops))).collect(),
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
        WorkloadOutcome {
            fio: Fio {
                workload: Workload::Merging,
                numjobs: 1,
                loop_direct_io: true,
            },
            calibration: vec![],
            arms,
            orders: vec![],
        }
    }

    #[test]
    fn ratios_of_median_overheads() {
        let o = outcome(
            &[100.0, 100.0, 100.0],
            &[99.0, 98.0, 99.0],
            Some(&[90.0, 95.0, 80.0]),
        );
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live, BPFTRACE_OVER_LIVE_MIN);
        assert_eq!(t.met, Some(true));
        assert_eq!(t.workload, Some(Workload::Merging));
        assert!(
            (t.value["ratio"].as_f64().unwrap() - 10.0).abs() < 1e-9,
            "{}",
            t.measured
        );
        // 10× is not 12×.
        assert_eq!(
            o.ratio_target(Arm::Bpftrace, Arm::Live, 12.0).met,
            Some(false)
        );
        // Our overhead in the noise: unbounded ratio, met when theirs is positive.
        let o = outcome(&[100.0], &[101.0], Some(&[90.0]));
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live, BPFTRACE_OVER_LIVE_MIN);
        assert_eq!(t.met, Some(true));
        assert!(t.measured.starts_with('∞'));
        // Unavailable tracer: not told, with the reason.
        let o = outcome(&[100.0], &[99.0], None);
        let t = o.ratio_target(Arm::Bpftrace, Arm::Live, BPFTRACE_OVER_LIVE_MIN);
        assert_eq!(t.met, None);
        assert!(t.measured.contains("unavailable"));
        assert_eq!(t.value["unavailable"], "no tracefs");
        assert!(o.perf_ratios().contains("n/a"));
    }

    #[test]
    fn overhead_targets_use_the_median() {
        let o = outcome(&[100.0, 100.0, 100.0], &[99.0, 90.0, 99.5], None);
        let t = &o.targets()[0];
        assert_eq!(t.name, "mergetrace live overhead");
        assert_eq!(t.met, Some(true), "{}", t.measured);
        assert_eq!(t.measured, "1.0 % [0.5 %–10.0 %]");
        let names: Vec<String> = o.targets().into_iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "mergetrace live overhead",
                "bpftrace / live overhead",
                "mergetrace record overhead",
                "bpftrace / record overhead",
                "mergetrace record lost events",
                "BPF cost per I/O",
            ]
        );
    }

    #[test]
    fn bpf_cost_pairs_the_stats_arm_with_the_baseline_cpu() {
        let mut o = outcome(&[100.0, 100.0], &[99.0, 99.0], None);
        let base = o.arms.get_mut(&Arm::Baseline).unwrap();
        for (s, cpu) in base.samples.iter_mut().zip([4000.0, 5000.0]) {
            s.as_mut().unwrap().cpu_ns_per_io = Some(cpu);
        }
        // Two programs, 1000 I/Os: (1000 × 50 + 2000 × 25) / 1000 = 100 ns per I/O.
        let stats = |ios| {
            Some(Sample {
                iops: 99.0,
                ios,
                programs: vec![("a".into(), 1000, 50.0), ("b".into(), 2000, 25.0)],
                ..Sample::default()
            })
        };
        o.arms.get_mut(&Arm::LiveStats).unwrap().samples = vec![stats(1000), stats(1000)];
        assert_eq!(
            o.arms[&Arm::LiveStats].samples[0]
                .as_ref()
                .unwrap()
                .bpf_ns_per_io(),
            Some(100.0)
        );
        let t = o.bpf_cost_target();
        // 100 / 4000 = 2.5 %, 100 / 5000 = 2 %: median 2.25 %.
        assert_eq!(t.met, Some(true), "{}", t.measured);
        assert!(
            (t.value["share"]["median"].as_f64().unwrap() - 0.0225).abs() < 1e-12,
            "{}",
            t.value
        );
        assert!(t.measured.contains("100 ns/I/O"), "{}", t.measured);
        assert!(t.measured.contains("4.50 µs/I/O"), "{}", t.measured);
        // No CPU figure: not told.
        let o = outcome(&[100.0], &[99.0], None);
        assert_eq!(o.bpf_cost_target().met, None);
    }

    #[test]
    fn offline_targets() {
        let off = |blkparse: std::result::Result<Vec<f64>, String>| Outcome {
            workloads: vec![],
            offline: Some(Offline {
                workload: Workload::Reads,
                events: 4_000_000,
                file_bytes: 40_000_000,
                report_seconds: vec![0.25, 0.2, 0.3],
                export: Ok(offline::Export {
                    bytes: 600_000_000,
                    traces: Some(8_000_000),
                    seconds: 1.0,
                }),
                blkparse_seconds: blkparse,
            }),
            offline_note: None,
        };
        let t = off(Ok(vec![3.0, 2.5, 2.8])).offline_targets();
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "report speed, 1 core",
                "capture size",
                "report vs blkparse, 1 core",
                "capture vs blktrace export",
            ]
        );
        // 4M events in 0.2 s: 20M events/s.
        assert_eq!(t[0].met, Some(true), "{}", t[0].measured);
        assert_eq!(t[1].met, Some(true), "{}", t[1].measured);
        // 2.5 s / 0.2 s = 12.5×.
        assert_eq!(t[2].met, Some(true), "{}", t[2].measured);
        assert!(t[2].measured.starts_with("12.5×"), "{}", t[2].measured);
        // 600 MB / 40 MB = 15×.
        assert_eq!(t[3].met, Some(true), "{}", t[3].measured);
        assert!(t[3].measured.starts_with("15.0×"), "{}", t[3].measured);
        let t = off(Err("blkparse is not installed".into())).offline_targets();
        assert_eq!(t[2].met, None);
        assert!(t[2].measured.contains("unavailable"), "{}", t[2].measured);
        // The size comparison needs no blkparse.
        assert_eq!(t[3].met, Some(true));
        let none = Outcome {
            workloads: vec![],
            offline: None,
            offline_note: Some("no capture with events".into()),
        };
        let t = none.offline_targets();
        assert_eq!(t.len(), 4);
        assert!(t.iter().all(|t| t.met.is_none() && t.workload.is_none()));
    }
}
