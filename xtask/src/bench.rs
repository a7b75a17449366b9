//! `cargo xtask bench`: what tracing costs, measured as ratios in one run on this machine.
//!
//! fio drives a loop device on a /dev/shm file as fast as it can, with three *workloads*: 4 KiB
//! random reads (every bio its own request), the merging worst case, 4 KiB sequential writes
//! submitted 32 at a time (31 of every 32 bios merge in the plug), and the reads under a
//! blk-throttle limit that never binds (a volume with io.max). Each workload runs
//! once per *arm*: no tracer (baseline), `mergetrace` live view, `mergetrace record`,
//! `bpftrace` counting on the same block tracepoints, `perf record` of them, the live view
//! with `--stats` (BPF run-time statistics: each program's cost per event), and the live
//! view, record and bpftrace profiled (`profile`: each one's whole CPU time per I/O). Each round
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
mod arms;
mod calibrate;
mod fio;
mod offline;
mod profile;
mod render;
mod stats;
mod sys;
mod targets;
mod tracers;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use arms::{order, progress, workload_order, Arm, ArmResults};
use fio::{Fio, Workload, DEVICE_BYTES};
use offline::Offline;
use render::{render, results_json, Run};
use stats::si;
use sys::{LimitCgroup, LoopDev, Tracefs, WorkDir};
use targets::{Outcome, WorkloadOutcome};
use tracers::{bpftrace_script, Ctx};

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
    /// 32 bios merged in the plug; limited: the reads under a blk-throttle limit that never
    /// binds (a volume with io.max); all: the three.
    #[arg(long, default_value = "all", value_parser = ["reads", "merging", "limited", "all"])]
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

/// The offline figures want a capture at least this big (events); a smaller one is topped up
/// by one longer record run.
const OFFLINE_MIN_EVENTS: u64 = 3_000_000;
const OFFLINE_WANT_EVENTS: f64 = 4_000_000.0;

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
    let mergetrace = build_mergetrace(args.no_build)?;

    sys::catch_signals();
    sys::remove_stale();
    let started = now_secs();
    let load_start = loadavg();
    let work = WorkDir::create()?;
    let backing = work.path.join("disk.img");
    let mut lp = LoopDev::create(&backing, DEVICE_BYTES)?;
    if chosen.contains(&Workload::Merging) {
        calibrate::prefill(&backing)?;
    }
    for w in lp.prepare_queue() {
        eprintln!("bench: warning: {w}");
    }
    let limit = if chosen.contains(&Workload::Limited) {
        Some(LimitCgroup::create(&lp.majmin).context("the limited workload's cgroup")?)
    } else {
        None
    };
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
    let unavailable = unavailable_arms(&tracefs);
    let script = work.path.join("bench.bt");
    fs::write(&script, bpftrace_script())?;
    let mut outcomes = plan_workloads(
        &args,
        &lp,
        limit.as_ref(),
        &work.path,
        &chosen,
        &unavailable,
    )?;
    let ctx = Ctx {
        mergetrace: mergetrace.clone(),
        lp: &lp,
        limit: limit.as_ref(),
        dir: &work.path,
        bpftrace_script: script,
        cpus: online_cpus(),
    };

    let mut capture = run_rounds(&ctx, &mut outcomes, &chosen, runs, seconds)?;
    if !args.smoke {
        top_up_capture(&ctx, &outcomes, &mut capture)?;
    }
    let (offline, offline_note, failure) = measure_offline(&mergetrace, capture, &work.path)?;
    let outcome = Outcome {
        workloads: outcomes,
        offline,
        offline_note,
    };
    let targets = outcome.targets();
    let run = Run {
        runs,
        seconds,
        smoke: args.smoke,
        started,
        scheduler,
        max_sectors_kb,
        cpus: ctx.cpus,
        load_start,
        load_end: loadavg(),
    };
    let header = run.header(&lp);
    print!("{}", render(&header, &outcome, &targets));

    let json = results_json(&run, &header, &lp, &outcome, &targets);
    if let Some(parent) = json_out.parent() {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    fs::write(&json_out, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("cannot write {}", json_out.display()))?;
    eprintln!("bench: results in {}", json_out.display());
    drop(ctx);
    drop(tracefs);
    drop(limit);
    drop(lp);
    drop(work);
    if let Some(why) = failure {
        eprintln!("bench: error: the offline side could not run: {why}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `cargo build --release -p mergetrace` unless told not to; the binary's path.
fn build_mergetrace(no_build: bool) -> Result<PathBuf> {
    let mergetrace = target_dir().join("release/mergetrace");
    if !no_build {
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
    Ok(mergetrace)
}

/// The arms whose tool (or tracefs) is missing here, with why.
fn unavailable_arms(tracefs: &Result<Tracefs>) -> BTreeMap<Arm, String> {
    // Each arm's tools, and whether it reads the block tracepoints through tracefs.
    let needs: [(Arm, &[&str], bool); 7] = [
        (Arm::Bpftrace, &["bpftrace"], true),
        (Arm::BpftraceProfiled, &["bpftrace", "perf"], true),
        (Arm::Perf, &["perf"], true),
        (Arm::LiveProfiled, &["perf"], false),
        (Arm::LiveHooksProfiled, &["perf"], false),
        (Arm::RecordProfiled, &["perf"], false),
        (Arm::RecordRequestsProfiled, &["perf"], false),
    ];
    let mut unavailable = BTreeMap::new();
    for (arm, tools, tracepoints) in needs {
        let why = match tools.iter().find(|t| !have(t)) {
            Some(tool) => Some(format!("{tool} is not installed (scripts/setup --bench)")),
            None if tracepoints => tracefs.as_ref().err().map(|e| format!("{e:#}")),
            None => None,
        };
        if let Some(why) = why {
            unavailable.insert(arm, why);
        }
    }
    unavailable
}

/// Each chosen workload with its fio setting (calibrated, or fixed for the smoke run) and an
/// empty result per arm.
fn plan_workloads(
    args: &BenchArgs,
    lp: &LoopDev,
    limit: Option<&LimitCgroup>,
    dir: &Path,
    chosen: &[Workload],
    unavailable: &BTreeMap<Arm, String>,
) -> Result<Vec<WorkloadOutcome>> {
    // 8 points (2 workloads × loop direct I/O on/off × 1/2 jobs) × 2 × 2 s: about 45 s. The
    // smoke run, which only checks that everything runs, takes a fixed setting instead.
    let calibrated = if args.smoke {
        eprintln!("bench: --smoke: no calibration; 2 fio jobs (or --numjobs), loop direct I/O on");
        chosen
            .iter()
            .map(|&workload| {
                let fio = Fio::new(workload, args.numjobs.parse().unwrap_or(2), true, limit);
                (fio, Vec::new())
            })
            .collect()
    } else {
        calibrate::calibrate(lp, limit, dir, chosen, &args.numjobs, 2.0, 2)?
    };
    Ok(calibrated
        .into_iter()
        .map(|(fio, calibration)| {
            eprintln!(
                "bench: {}: numjobs {} with loop direct I/O {}",
                fio.workload.key(),
                fio.numjobs,
                if fio.loop_direct_io { "on" } else { "off" }
            );
            let arms = Arm::ALL
                .iter()
                .map(|a| {
                    let results = ArmResults {
                        samples: Vec::new(),
                        unavailable: unavailable.get(a).cloned(),
                    };
                    (*a, results)
                })
                .collect();
            WorkloadOutcome {
                fio,
                calibration,
                arms,
                orders: Vec::new(),
            }
        })
        .collect())
}

/// The biggest capture a record arm wrote, kept for the offline side.
struct Capture {
    file: PathBuf,
    events: u64,
    seconds: f64,
    workload: Workload,
}

impl Capture {
    /// Keeps the capture `ctx` just wrote if it beats `best`; removes it otherwise.
    fn keep_if_bigger(
        best: &mut Option<Capture>,
        ctx: &Ctx,
        events: u64,
        seconds: f64,
        workload: Workload,
    ) -> Result<()> {
        if best.as_ref().is_some_and(|b| events <= b.events) {
            let _ = fs::remove_file(ctx.capture_path());
            return Ok(());
        }
        let file = ctx.dir.join("capture.mtr");
        fs::rename(ctx.capture_path(), &file).context("cannot keep the capture")?;
        *best = Some(Capture {
            file,
            events,
            seconds,
            workload,
        });
        Ok(())
    }
}

/// Every round: every chosen workload, every arm, in the round's rotated order.
fn run_rounds(
    ctx: &Ctx,
    outcomes: &mut [WorkloadOutcome],
    chosen: &[Workload],
    runs: usize,
    seconds: u32,
) -> Result<Option<Capture>> {
    let mut best = None;
    for round in 0..runs {
        for w in workload_order(chosen, round) {
            let wo = outcomes
                .iter_mut()
                .find(|o| o.workload() == w)
                .expect("every chosen workload was calibrated");
            wo.fio.prepare(ctx.lp, ctx.limit)?;
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
                            Capture::keep_if_bigger(&mut best, ctx, events, seconds.into(), w)?;
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
    Ok(best)
}

/// A small capture is topped up to a few million events by one longer record run.
fn top_up_capture(
    ctx: &Ctx,
    outcomes: &[WorkloadOutcome],
    best: &mut Option<Capture>,
) -> Result<()> {
    let Some(c) = best.as_ref() else {
        return Ok(());
    };
    if c.events >= OFFLINE_MIN_EVENTS || c.events == 0 {
        return Ok(());
    }
    let rate = c.events as f64 / c.seconds;
    let want = (OFFLINE_WANT_EVENTS / rate).ceil().clamp(1.0, 30.0);
    let w = c.workload;
    eprintln!(
        "bench: recording {want:.0} s more of {} for a bigger capture ({} events so far)",
        w.key(),
        si(c.events as f64)
    );
    let fio = outcomes
        .iter()
        .find(|o| o.workload() == w)
        .map(|o| o.fio.clone())
        .expect("the capture's workload ran");
    fio.prepare(ctx.lp, ctx.limit)?;
    if let Ok(s) = ctx.run(Arm::Record, &fio, want)? {
        Capture::keep_if_bigger(best, ctx, s.events.unwrap_or(0), want, w)?;
    }
    let _ = fs::remove_file(ctx.capture_path());
    Ok(())
}

/// The offline side on the kept capture: (figures, why there are none, what failed).
fn measure_offline(
    mergetrace: &Path,
    capture: Option<Capture>,
    dir: &Path,
) -> Result<(Option<Offline>, Option<String>, Option<String>)> {
    let Some(c) = capture.filter(|c| c.events > 0) else {
        return Ok((None, Some("no capture with events".to_string()), None));
    };
    eprintln!(
        "bench: timing mergetrace report on {} events of {}, pinned to CPU 0; then the \
         blktrace export and blkparse on it",
        si(c.events as f64),
        c.workload.key()
    );
    match offline::measure(
        mergetrace,
        c.workload,
        &c.file,
        c.events,
        dir,
        have("blkparse"),
    ) {
        Ok(o) => {
            let failure = o
                .export
                .as_ref()
                .err()
                .map(|why| format!("mergetrace export: {why}"));
            Ok((Some(o), None, failure))
        }
        Err(e) => {
            sys::check_interrupt()?;
            Ok((None, Some(format!("{e:#}")), Some(format!("{e:#}"))))
        }
    }
}
