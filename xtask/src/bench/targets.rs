//! The goals of the benchmark and how each is judged from the rounds' samples.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{
    arms::{Arm, ArmResults, RecorderStages},
    calibrate::Calibration,
    fio::{Fio, Workload},
    offline::{self, Offline},
    profile::Part,
    stats::{paired_overheads, pct, si, Summary},
};

/// Goals from the issue, each for every workload:
/// the live view's median overhead,
pub const LIVE_MAX_OVERHEAD: f64 = 0.03;
/// bpftrace's median overhead over the live view's,
pub const BPFTRACE_OVER_LIVE_MIN: f64 = 8.0;
/// record's median overhead,
pub const RECORD_MAX_OVERHEAD: f64 = 0.12;
/// The live view with `--latency` (a program per completion and two hash updates per
/// request more): an opt-in that must stay cheap enough to leave on while diagnosing.
pub const LATENCY_MAX_OVERHEAD: f64 = 0.06;
/// bpftrace's over record's (record costs at most half of bpftrace),
pub const BPFTRACE_OVER_RECORD_MIN: f64 = 2.0;
/// the BPF programs' kernel time per I/O over the CPU time of an I/O.
pub const BPF_MAX_CPU_SHARE: f64 = 0.03;
/// Offline, on the biggest capture: report's events/s on one core,
pub const REPORT_MIN_EVENTS_PER_S: f64 = 20e6;
/// the capture's bytes per event,
pub const MAX_BYTES_PER_EVENT: f64 = 24.0;
/// blkparse's best time on the blktrace export over report's best time,
pub const BLKPARSE_MIN_SLOWDOWN: f64 = 10.0;
/// the blktrace export's bytes over the capture's.
pub const BLKTRACE_MIN_SIZE_RATIO: f64 = 10.0;

/// A goal from the issue and what was measured.
pub struct Target {
    /// The workload it is measured on; None for the offline ones.
    pub workload: Option<Workload>,
    pub name: String,
    pub goal: String,
    pub measured: String,
    /// Some(yes/no), or None when it could not be told (with `measured` saying why).
    pub met: Option<bool>,
    pub value: Value,
}

impl Target {
    pub fn met_str(&self) -> &'static str {
        match self.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        }
    }
}

/// Everything one workload's arms measured.
pub struct WorkloadOutcome {
    pub fio: Fio,
    pub calibration: Vec<Calibration>,
    pub arms: BTreeMap<Arm, ArmResults>,
    pub orders: Vec<Vec<Arm>>,
}

/// The `--stats` arm's BPF time per I/O against the baseline's CPU time per I/O, in one round.
pub struct BpfShare {
    /// As the kernel's statistics report it.
    pub bpf_ns_per_io: f64,
    /// Less what the statistics add to each run (`Sample::bpf_net_ns_per_io`).
    pub net_ns_per_io: f64,
    /// The statistics' own ns per run.
    pub floor_ns: f64,
    pub cpu_ns_per_io: f64,
}

impl WorkloadOutcome {
    pub fn workload(&self) -> Workload {
        self.fio.workload
    }

    pub fn overheads(&self, arm: Arm) -> Vec<f64> {
        paired_overheads(&self.arms[&arm].iops(), &self.arms[&Arm::Baseline].iops())
    }

    /// The second no-tracer arm's overhead over the rounds: how far apart two runs with no
    /// tracer at all fall here, the width of the noise any arm's overhead carries.
    pub fn noise(&self) -> Option<Summary> {
        Summary::of(&self.overheads(Arm::Again))
    }

    /// `theirs` median overhead over `ours`: at least `min`.
    pub fn ratio_target(&self, tracer: Arm, ours: Arm, min: f64) -> Target {
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

    pub fn overhead_ratio(&self, tracer: Arm, ours: Arm) -> Ratio {
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

    pub fn overhead_target(&self, arm: Arm, max: f64) -> Target {
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

    /// Per round where both ran: the live `--stats` arm's programs' time per I/O and the
    /// baseline's CPU time per I/O.
    pub fn bpf_shares(&self) -> Vec<BpfShare> {
        self.arms[&Arm::LiveStats]
            .samples
            .iter()
            .zip(&self.arms[&Arm::Baseline].samples)
            .filter_map(|(s, b)| {
                let s = s.as_ref()?;
                let cpu = b.as_ref()?.cpu_ns_per_io?;
                (cpu > 0.0).then_some(BpfShare {
                    bpf_ns_per_io: s.bpf_ns_per_io()?,
                    net_ns_per_io: s.bpf_net_ns_per_io()?,
                    floor_ns: s.stats_floor_ns()?,
                    cpu_ns_per_io: cpu,
                })
            })
            .collect()
    }

    /// The programs' own time per I/O, against the baseline's CPU time per I/O. Own time: the
    /// kernel's statistics time each run between two clock reads, which add tens of ns a run
    /// here that a run without statistics does not pay; mergetrace's empty program measures
    /// them in the same run, and they are taken off each run (the measured share is shown too).
    pub fn bpf_cost_target(&self) -> Target {
        let v = self.bpf_shares();
        let summary = |f: fn(&BpfShare) -> f64| Summary::of(&v.iter().map(f).collect::<Vec<_>>());
        let share = summary(|s| s.net_ns_per_io / s.cpu_ns_per_io);
        let gross = summary(|s| s.bpf_ns_per_io / s.cpu_ns_per_io);
        let (net, bpf) = (summary(|s| s.net_ns_per_io), summary(|s| s.bpf_ns_per_io));
        let (floor, cpu) = (summary(|s| s.floor_ns), summary(|s| s.cpu_ns_per_io));
        let (measured, met, value) = match (share, gross, net, bpf, floor, cpu) {
            (Some(share), Some(gross), Some(net), Some(bpf), Some(floor), Some(cpu)) => (
                format!(
                    "{} ({:.0} ns/I/O of programs' own time, {:.2} µs/I/O of CPU; as measured \
                     {:.0} ns/I/O, {}, with the statistics' {:.0} ns/run)",
                    share.show(pct),
                    net.median,
                    cpu.median / 1e3,
                    bpf.median,
                    pct(gross.median),
                    floor.median
                ),
                Some(share.median <= BPF_MAX_CPU_SHARE),
                json!({
                    "share": share.json(),
                    "measured_share": gross.json(),
                    "net_ns_per_io": net.json(),
                    "bpf_ns_per_io": bpf.json(),
                    "stats_floor_ns": floor.json(),
                    "cpu_ns_per_io": cpu.json(),
                }),
            ),
            _ => (
                "not measured (no --stats program times, no stats_floor, or no /proc/stat)"
                    .to_string(),
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

    pub fn targets(&self) -> Vec<Target> {
        let lost: Vec<u64> = [Arm::Record, Arm::RecordRequests]
            .iter()
            .flat_map(|a| self.arms[a].samples.iter().flatten())
            .filter_map(|s| s.lost)
            .collect();
        vec![
            self.overhead_target(Arm::Live, LIVE_MAX_OVERHEAD),
            self.ratio_target(Arm::Bpftrace, Arm::Live, BPFTRACE_OVER_LIVE_MIN),
            self.overhead_target(Arm::Record, RECORD_MAX_OVERHEAD),
            self.ratio_target(Arm::Bpftrace, Arm::Record, BPFTRACE_OVER_RECORD_MIN),
            self.overhead_target(Arm::RecordRequests, RECORD_MAX_OVERHEAD),
            self.overhead_target(Arm::LiveLatency, LATENCY_MAX_OVERHEAD),
            // The exporter runs the live view's programs: the live view's goal.
            self.overhead_target(Arm::Serve, LIVE_MAX_OVERHEAD),
            Target {
                workload: Some(self.workload()),
                name: "mergetrace record (and --requests) lost events".into(),
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
        .into_iter()
        .chain(self.cpu_targets())
        .collect()
    }

    /// perf's overhead over live's and record's, shown without a target.
    pub fn perf_ratios(&self) -> String {
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

    /// What a full capture costs per I/O, from the `record --stats` rounds, medians: its
    /// programs' kernel time, the recording process's CPU time, and the baseline's CPU time
    /// per I/O they add to. `None` where it did not run or reported nothing.
    pub fn record_cost(&self) -> Option<RecordCost> {
        // Per round: programs as measured, recorder, baseline CPU, programs' own time.
        type Round = (f64, f64, f64, Option<f64>);
        let rounds: Vec<Round> = self.arms[&Arm::RecordStats]
            .samples
            .iter()
            .zip(&self.arms[&Arm::Baseline].samples)
            .filter_map(|(s, b)| {
                let s = s.as_ref()?;
                Some((
                    s.bpf_ns_per_io()?,
                    s.recorder_ns_per_io()?,
                    b.as_ref()?.cpu_ns_per_io.filter(|c| *c > 0.0)?,
                    s.bpf_net_ns_per_io(),
                ))
            })
            .collect();
        let med = |f: &dyn Fn(&Round) -> Option<f64>| {
            let v: Option<Vec<f64>> = rounds.iter().map(f).collect();
            Summary::of(&v?).map(|s| s.median)
        };
        // Each stage's median over the rounds that split the recorder's time.
        let stages: Vec<RecorderStages> = self.arms[&Arm::RecordStats]
            .samples
            .iter()
            .filter_map(|s| s.as_ref()?.recorder_stages_per_io())
            .collect();
        let recorder_stages = (!stages.is_empty()).then(|| {
            RecorderStages(std::array::from_fn(|i| {
                let v: Vec<f64> = stages.iter().map(|s| s.0[i]).collect();
                Summary::of(&v).map_or(0.0, |s| s.median)
            }))
        });
        Some(RecordCost {
            recorder_stages,
            bpf_ns_per_io: med(&|r| Some(r.0))?,
            recorder_ns_per_io: med(&|r| Some(r.1))?,
            cpu_ns_per_io: med(&|r| Some(r.2))?,
            share: med(&|r| Some((r.0 + r.1) / r.2))?,
            // Only where every round has the yardstick (never guessed from the measured).
            net_ns_per_io: med(&|r| r.3),
            net_share: med(&|r| Some((r.3? + r.1) / r.2)),
        })
    }

    /// A tracer's whole CPU time per I/O from its profiled arm (`profile`), medians: by part
    /// and in all, and against the baseline's CPU time per I/O of the same round. Both are
    /// CPU time taken in the run itself, so the machine's noise moves them far less than it
    /// moves IOPS. `None` where the arm or the baseline is missing.
    pub fn profiled_cost(&self, arm: Arm) -> Option<ProfiledCost> {
        // Per round: the parts, the total, the baseline's CPU per I/O.
        type Round = ([f64; 5], f64, f64);
        let rounds: Vec<Round> = self.arms[&arm]
            .samples
            .iter()
            .zip(&self.arms[&Arm::Baseline].samples)
            .filter_map(|(s, b)| {
                let s = s.as_ref()?;
                let parts = Part::ALL.map(|p| s.profiled_ns_per_io(Some(p)));
                Some((
                    parts.map(|p| p.unwrap_or(0.0)),
                    s.profiled_ns_per_io(None)?,
                    b.as_ref()?.cpu_ns_per_io.filter(|c| *c > 0.0)?,
                ))
            })
            .collect();
        let med = |f: &dyn Fn(&Round) -> f64| {
            Summary::of(&rounds.iter().map(f).collect::<Vec<_>>()).map(|s| s.median)
        };
        Some(ProfiledCost {
            parts: std::array::from_fn(|i| med(&|r| r.0[i]).unwrap_or(0.0)),
            ns_per_io: med(&|r| r.1)?,
            cpu_ns_per_io: med(&|r| r.2)?,
            share: med(&|r| r.1 / r.2)?,
        })
    }

    /// The live view against its hooks alone (`LiveHooksProfiled`), medians: the floor any
    /// tracer of these hooks pays before its programs do anything, the live view's own work
    /// above it, and what the live view's goal leaves that work. `None` without either arm.
    pub fn live_over_hooks(&self) -> Option<OverHooks> {
        let live = self.profiled_cost(Arm::LiveProfiled)?;
        let hooks = self.profiled_cost(Arm::LiveHooksProfiled)?;
        Some(OverHooks {
            hooks_ns_per_io: hooks.ns_per_io,
            hooks_share: hooks.share,
            work_ns_per_io: live.ns_per_io - hooks.ns_per_io,
            work_share: live.share - hooks.share,
            goal_leaves_ns_per_io: LIVE_MAX_OVERHEAD * live.cpu_ns_per_io - hooks.ns_per_io,
        })
    }

    /// The CPU-time goals, from the profiled arms: the live view's, a full capture's and a
    /// request-level capture's share of an I/O's CPU, and bpftrace's CPU per I/O over each
    /// (hooks and process, all measured alike).
    pub fn cpu_targets(&self) -> Vec<Target> {
        let t =
            |name: &str, goal: String, measured: String, met: Option<bool>, value: Value| Target {
                workload: Some(self.workload()),
                name: name.into(),
                goal,
                measured,
                met,
                value,
            };
        let not = || "not measured".to_string();
        let live = self.profiled_cost(Arm::LiveProfiled);
        let record = self.profiled_cost(Arm::RecordProfiled);
        let requests = self.profiled_cost(Arm::RecordRequestsProfiled);
        let bpftrace = self.profiled_cost(Arm::BpftraceProfiled);
        let share = |name: &str, max: f64, c: Option<&ProfiledCost>| {
            let goal = format!("≤ {:.0} % of the I/O's CPU time", max * 100.0);
            match c {
                Some(c) => t(
                    name,
                    goal,
                    format!("{} ({:.0} ns/I/O)", pct(c.share), c.ns_per_io),
                    Some(c.share <= max),
                    json!({"share": c.share, "ns_per_io": c.ns_per_io}),
                ),
                None => t(name, goal, not(), None, Value::Null),
            }
        };
        let over = |name: &str, min: f64, ours: Option<&ProfiledCost>| {
            let goal = format!("≥ {min:.0}×");
            match (bpftrace.as_ref(), ours) {
                (Some(b), Some(ours)) if ours.ns_per_io > 0.0 => {
                    let (theirs, ours) = (b.ns_per_io, ours.ns_per_io);
                    let r = theirs / ours;
                    t(
                        name,
                        goal,
                        format!("{r:.1}× ({theirs:.0} ns/I/O against {ours:.0})"),
                        Some(r >= min),
                        json!({"ratio": r, "bpftrace_ns_per_io": theirs, "mergetrace_ns_per_io": ours}),
                    )
                }
                _ => t(name, goal, not(), None, Value::Null),
            }
        };
        vec![
            share("live view CPU per I/O", LIVE_MAX_OVERHEAD, live.as_ref()),
            over(
                "bpftrace / live view, CPU per I/O",
                BPFTRACE_OVER_LIVE_MIN,
                live.as_ref(),
            ),
            share(
                "full capture CPU per I/O",
                RECORD_MAX_OVERHEAD,
                record.as_ref(),
            ),
            over(
                "bpftrace / full capture, CPU per I/O",
                BPFTRACE_OVER_RECORD_MIN,
                record.as_ref(),
            ),
            share(
                "request-level capture CPU per I/O",
                RECORD_MAX_OVERHEAD,
                requests.as_ref(),
            ),
            over(
                "bpftrace / request-level capture, CPU per I/O",
                BPFTRACE_OVER_RECORD_MIN,
                requests.as_ref(),
            ),
        ]
    }

    /// Per program: runs per round, runs per I/O and ns/run, over a `--stats` arm's rounds
    /// (`LiveStats`, `RecordStats`).
    pub fn program_stats(&self, stats_arm: Arm) -> Vec<ProgramStat> {
        // program → (runs, runs per I/O, ns/run), one of each per round.
        type PerRound = (Vec<f64>, Vec<f64>, Vec<f64>);
        let mut by: BTreeMap<String, PerRound> = BTreeMap::new();
        for s in self.arms[&stats_arm].samples.iter().flatten() {
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
pub enum Ratio {
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

/// A tracer's CPU time per I/O from its profiled arm (medians over the rounds), ns.
pub struct ProfiledCost {
    /// By part, in `Part::ALL`'s order.
    pub parts: [f64; 5],
    /// All parts.
    pub ns_per_io: f64,
    /// The baseline's CPU time per I/O.
    pub cpu_ns_per_io: f64,
    /// The tracer's / the baseline's CPU time per I/O, median of the rounds.
    pub share: f64,
}

/// The live view's cost split at its hooks' floor ([`WorkloadOutcome::live_over_hooks`]).
pub struct OverHooks {
    /// The hooks alone: their dispatch and programs that return at once.
    pub hooks_ns_per_io: f64,
    pub hooks_share: f64,
    /// The live view's programs' work above that floor.
    pub work_ns_per_io: f64,
    pub work_share: f64,
    /// The live view's CPU goal less the floor: what the goal leaves the programs' work
    /// (negative: the hooks alone miss it).
    pub goal_leaves_ns_per_io: f64,
}

/// A full capture's cost per I/O (medians over the `record --stats` rounds), ns.
pub struct RecordCost {
    pub bpf_ns_per_io: f64,
    /// The programs' own time: less what the statistics add to each run; `None` without
    /// `stats_floor` in the statistics.
    pub net_ns_per_io: Option<f64>,
    pub recorder_ns_per_io: f64,
    /// The recording process's time per I/O by stage, each the median of the rounds; `None`
    /// where `record --stats` did not split it.
    pub recorder_stages: Option<RecorderStages>,
    /// The baseline's CPU time per I/O.
    pub cpu_ns_per_io: f64,
    /// (programs + recorder) / the baseline's CPU time, median of the rounds.
    pub share: f64,
    /// As `share`, with the programs' own time.
    pub net_share: Option<f64>,
}

pub struct ProgramStat {
    pub program: String,
    pub runs: Summary,
    pub runs_per_io: Option<Summary>,
    pub ns_per_run: Summary,
}

pub struct Outcome {
    pub workloads: Vec<WorkloadOutcome>,
    pub offline: Option<Offline>,
    pub offline_note: Option<String>,
}

impl Outcome {
    pub fn offline_targets(&self) -> Vec<Target> {
        let Some(o) = &self.offline else {
            let why = self
                .offline_note
                .clone()
                .unwrap_or_else(|| "no capture".into());
            return OfflineGoal::ALL
                .iter()
                .map(|g| g.target(why.clone(), None, Value::Null))
                .collect();
        };
        vec![
            report_speed(o),
            capture_size(o),
            report_vs_blkparse(o),
            capture_vs_export(o),
        ]
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut v: Vec<Target> = self
            .workloads
            .iter()
            .flat_map(WorkloadOutcome::targets)
            .collect();
        v.extend(self.offline_targets());
        v
    }
}

/// The offline side's goals, each judged on the biggest capture.
#[derive(Clone, Copy)]
enum OfflineGoal {
    ReportSpeed,
    CaptureSize,
    VsBlkparse,
    VsExport,
}

impl OfflineGoal {
    const ALL: [OfflineGoal; 4] = [
        OfflineGoal::ReportSpeed,
        OfflineGoal::CaptureSize,
        OfflineGoal::VsBlkparse,
        OfflineGoal::VsExport,
    ];

    fn name(self) -> &'static str {
        match self {
            OfflineGoal::ReportSpeed => "report speed, 1 core",
            OfflineGoal::CaptureSize => "capture size",
            OfflineGoal::VsBlkparse => "report vs blkparse, 1 core",
            OfflineGoal::VsExport => "capture vs blktrace export",
        }
    }

    fn goal(self) -> String {
        match self {
            OfflineGoal::ReportSpeed => format!("≥ {:.0}M events/s", REPORT_MIN_EVENTS_PER_S / 1e6),
            OfflineGoal::CaptureSize => format!("≤ {MAX_BYTES_PER_EVENT:.0} bytes/event"),
            OfflineGoal::VsBlkparse => format!("≥ {BLKPARSE_MIN_SLOWDOWN:.0}× faster"),
            OfflineGoal::VsExport => format!("≥ {BLKTRACE_MIN_SIZE_RATIO:.0}× smaller"),
        }
    }

    fn target(self, measured: String, met: Option<bool>, value: Value) -> Target {
        Target {
            workload: None,
            name: self.name().into(),
            goal: self.goal(),
            measured,
            met,
            value,
        }
    }
}

fn report_speed(o: &Offline) -> Target {
    let rates: Vec<f64> = o
        .report_seconds
        .iter()
        .map(|s| o.events as f64 / s)
        .collect();
    let best_rate = rates.iter().copied().fold(0.0, f64::max);
    let s = Summary::of(&rates);
    OfflineGoal::ReportSpeed.target(
        format!(
            "{} events/s best of {} ({}; {} events)",
            si(best_rate),
            rates.len(),
            s.map(|s| s.show(si)).unwrap_or_default(),
            si(o.events as f64)
        ),
        Some(best_rate >= REPORT_MIN_EVENTS_PER_S),
        json!({"best": best_rate, "events_per_s": s.map(|s| s.json()), "seconds": o.report_seconds, "events": o.events}),
    )
}

fn capture_size(o: &Offline) -> Target {
    let bpe = o.file_bytes as f64 / o.events.max(1) as f64;
    OfflineGoal::CaptureSize.target(
        format!(
            "{bpe:.1} bytes/event ({} bytes, {} events)",
            o.file_bytes, o.events
        ),
        Some(bpe <= MAX_BYTES_PER_EVENT),
        json!({"bytes_per_event": bpe, "bytes": o.file_bytes, "events": o.events}),
    )
}

fn report_vs_blkparse(o: &Offline) -> Target {
    let g = OfflineGoal::VsBlkparse;
    let blkparse = match &o.blkparse_seconds {
        Ok(b) => b,
        Err(why) => {
            return g.target(
                format!("unavailable: {why}"),
                None,
                json!({"unavailable": why}),
            )
        }
    };
    let Some(ours) = offline::best(&o.report_seconds) else {
        return g.target("report not timed".into(), None, Value::Null);
    };
    let Some(theirs) = offline::best(blkparse) else {
        return g.target("blkparse not timed".into(), None, Value::Null);
    };
    let r = theirs / ours;
    g.target(
        format!(
            "{r:.1}× (report {ours:.2} s, blkparse {theirs:.2} s, best of {} each)",
            offline::TIMED_RUNS
        ),
        Some(r >= BLKPARSE_MIN_SLOWDOWN),
        json!({"ratio": r, "report_seconds": o.report_seconds, "blkparse_seconds": blkparse}),
    )
}

fn capture_vs_export(o: &Offline) -> Target {
    let g = OfflineGoal::VsExport;
    match &o.export {
        Ok(e) => {
            let r = e.bytes as f64 / o.file_bytes.max(1) as f64;
            g.target(
                format!(
                    "{r:.1}× ({:.1} MB vs {:.1} MB)",
                    o.file_bytes as f64 / 1e6,
                    e.bytes as f64 / 1e6
                ),
                Some(r >= BLKTRACE_MIN_SIZE_RATIO),
                json!({"ratio": r, "capture_bytes": o.file_bytes, "blktrace_bytes": e.bytes}),
            )
        }
        Err(why) => g.target(
            format!("export failed: {why}"),
            None,
            json!({"export_failed": why}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::arms::STATS_FLOOR;
    use crate::bench::{arms::Sample, profile::Profile};

    fn sample(iops: f64) -> Sample {
        Sample {
            iops,
            ..Sample::default()
        }
    }

    /// The baseline's CPU time per I/O, round by round.
    fn set_baseline_cpu(o: &mut WorkloadOutcome, cpu_ns_per_io: &[f64]) {
        let base = o.arms.get_mut(&Arm::Baseline).unwrap();
        for (s, cpu) in base.samples.iter_mut().zip(cpu_ns_per_io) {
            s.as_mut().unwrap().cpu_ns_per_io = Some(*cpu);
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
            fio: Fio::new(Workload::Merging, 1, true, None),
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
                "mergetrace record --requests overhead",
                "mergetrace live --latency overhead",
                "mergetrace serve overhead",
                "mergetrace record (and --requests) lost events",
                "BPF cost per I/O",
                "live view CPU per I/O",
                "bpftrace / live view, CPU per I/O",
                "full capture CPU per I/O",
                "bpftrace / full capture, CPU per I/O",
                "request-level capture CPU per I/O",
                "bpftrace / request-level capture, CPU per I/O",
            ]
        );
    }

    #[test]
    fn bpf_cost_pairs_the_stats_arm_with_the_baseline_cpu() {
        let mut o = outcome(&[100.0, 100.0], &[99.0, 99.0], None);
        set_baseline_cpu(&mut o, &[4000.0, 5000.0]);
        // Two programs, 1000 I/Os: (1000 × 50 + 2000 × 25) / 1000 = 100 ns per I/O as
        // measured; the statistics add 10 ns a run (the empty program's 1000 runs, left out
        // of the sum): (1000 × 40 + 2000 × 15) / 1000 = 70 ns of the programs' own.
        let stats = |ios| {
            Some(Sample {
                iops: 99.0,
                ios,
                programs: vec![
                    ("a".into(), 1000, 50.0),
                    ("b".into(), 2000, 25.0),
                    (STATS_FLOOR.into(), 1000, 10.0),
                ],
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
        // Own time: 70 / 4000 = 1.75 %, 70 / 5000 = 1.4 %: median 1.575 %; as measured
        // 100 / 4000 = 2.5 %, 100 / 5000 = 2 %: median 2.25 %.
        assert_eq!(t.met, Some(true), "{}", t.measured);
        let median = |k: &str| t.value[k]["median"].as_f64().unwrap();
        assert!((median("share") - 0.01575).abs() < 1e-12, "{}", t.value);
        assert!(
            (median("measured_share") - 0.0225).abs() < 1e-12,
            "{}",
            t.value
        );
        assert_eq!(median("stats_floor_ns"), 10.0);
        assert!(t.measured.contains("70 ns/I/O"), "{}", t.measured);
        assert!(t.measured.contains("measured 100 ns/I/O"), "{}", t.measured);
        assert!(t.measured.contains("4.50 µs/I/O"), "{}", t.measured);
        // No CPU figure: not told.
        let o = outcome(&[100.0], &[99.0], None);
        assert_eq!(o.bpf_cost_target().met, None);
        // No yardstick (no empty program in the statistics): not told either.
        let mut o = outcome(&[100.0], &[99.0], None);
        set_baseline_cpu(&mut o, &[4000.0]);
        o.arms.get_mut(&Arm::LiveStats).unwrap().samples = vec![Some(Sample {
            ios: 1000,
            programs: vec![("a".into(), 1000, 50.0)],
            ..Sample::default()
        })];
        assert_eq!(o.bpf_cost_target().met, None);
    }

    #[test]
    fn record_cost_adds_the_recorder_to_its_programs() {
        let mut o = outcome(&[100.0, 100.0], &[90.0, 90.0], None);
        assert!(o.record_cost().is_none(), "no record --stats rounds");
        set_baseline_cpu(&mut o, &[4000.0, 5000.0]);
        // 1000 I/Os: programs (1000 × 300 + 1000 × 100) / 1000 = 400 ns, recorder 600 ns.
        let stats = |recorder_ms: f64, order: f64| {
            Some(Sample {
                iops: 90.0,
                ios: 1000,
                programs: vec![("a".into(), 1000, 300.0), ("b".into(), 1000, 100.0)],
                recorder_cpu_ns: Some(recorder_ms * 1e6),
                // 5 events an I/O: each stage's ns per event × 5, per I/O.
                events: Some(5000),
                recorder_stages: Some(RecorderStages([10.0, order, 80.0, 20.0])),
                ..Sample::default()
            })
        };
        o.arms.get_mut(&Arm::RecordStats).unwrap().samples =
            vec![stats(0.6, 10.0), stats(0.6, 30.0)];
        let c = o.record_cost().unwrap();
        assert_eq!(c.bpf_ns_per_io, 400.0);
        // No stats_floor in these statistics: the programs' own time is not told.
        assert_eq!((c.net_ns_per_io, c.net_share), (None, None));
        assert_eq!(c.recorder_ns_per_io, 600.0);
        assert_eq!(
            c.recorder_stages,
            Some(RecorderStages([50.0, 100.0, 400.0, 100.0]))
        );
        assert_eq!(c.cpu_ns_per_io, 4500.0);
        // 1000 / 4000 = 25 %, 1000 / 5000 = 20 %: median 22.5 %.
        assert!((c.share - 0.225).abs() < 1e-12, "{}", c.share);
    }

    /// A profiled sample of 1000 I/Os whose tracer had `samples` (dispatch, programs, clock,
    /// helpers, process) of `PERIOD_NS` each.
    fn profiled(samples: [u64; 5]) -> Option<Sample> {
        Some(Sample {
            ios: 1000,
            profile: Some(Profile {
                samples,
                all: 100_000,
            }),
            ..Sample::default()
        })
    }

    #[test]
    fn profiled_cost_is_every_part_of_the_tracer_against_the_baselines_cpu() {
        let mut o = outcome(&[100.0, 100.0], &[99.0, 99.0], None);
        assert!(
            o.profiled_cost(Arm::LiveProfiled).is_none(),
            "no profiled rounds"
        );
        o.arms.get_mut(&Arm::LiveProfiled).unwrap().samples =
            vec![profiled([0, 1, 0, 0, 1]), profiled([1, 0, 1, 0, 0])];
        assert!(
            o.profiled_cost(Arm::LiveProfiled).is_none(),
            "no baseline CPU to set it against"
        );
        set_baseline_cpu(&mut o, &[10_000.0, 25_000.0]);
        let c = o.profiled_cost(Arm::LiveProfiled).unwrap();
        // Two samples of 250 µs over 1000 I/Os in each round: 500 ns an I/O.
        assert_eq!(c.ns_per_io, 500.0);
        // By part, medians: dispatch (0, 250), programs (250, 0), clock (0, 250), helpers 0,
        // process (250, 0).
        assert_eq!(c.parts, [125.0, 125.0, 125.0, 0.0, 125.0]);
        assert_eq!(c.cpu_ns_per_io, 17_500.0);
        // 500 / 10000 = 5 %, 500 / 25000 = 2 %: median 3.5 %.
        assert!((c.share - 0.035).abs() < 1e-12, "{}", c.share);
    }

    /// `arm` profiled in one round, with `samples` as in [`profiled`].
    fn set_profiled(o: &mut WorkloadOutcome, arm: Arm, samples: [u64; 5]) {
        o.arms.get_mut(&arm).unwrap().samples = vec![profiled(samples)];
    }

    #[test]
    fn the_live_view_splits_at_its_hooks_alone() {
        let mut o = outcome(&[100.0], &[99.0], None);
        set_baseline_cpu(&mut o, &[50_000.0]);
        set_profiled(&mut o, Arm::LiveProfiled, [2, 3, 0, 0, 1]);
        assert!(o.live_over_hooks().is_none(), "no hooks-alone arm");
        set_profiled(&mut o, Arm::LiveHooksProfiled, [2, 2, 0, 0, 0]);
        let s = o.live_over_hooks().unwrap();
        // 6 and 4 samples of 250 µs over 1000 I/Os: 1,500 and 1,000 ns an I/O, of 50 µs.
        assert_eq!((s.hooks_ns_per_io, s.work_ns_per_io), (1000.0, 500.0));
        assert!((s.hooks_share - 0.02).abs() < 1e-12, "{}", s.hooks_share);
        assert!((s.work_share - 0.01).abs() < 1e-12, "{}", s.work_share);
        // 3 % of 50 µs is 1,500 ns: 500 above the hooks.
        assert!((s.goal_leaves_ns_per_io - 500.0).abs() < 1e-9);
    }

    #[test]
    fn cpu_targets_set_bpftrace_against_the_live_view_and_both_captures() {
        let mut o = outcome(&[100.0], &[99.0], None);
        assert!(o.cpu_targets().iter().all(|t| t.met.is_none()));
        set_baseline_cpu(&mut o, &[5_000_000.0]);
        // The live view 2 samples (500 ns/I/O), a full capture 24 (6,000), bpftrace 40
        // (10,000), against 5 ms of CPU an I/O: 0.01 %, 20×; 0.12 % (met: ≤ 12 % is 600,000
        // ns), 1.7× (not met).
        set_profiled(&mut o, Arm::LiveProfiled, [1, 1, 0, 0, 0]);
        set_profiled(&mut o, Arm::RecordProfiled, [4, 4, 2, 4, 10]);
        set_profiled(&mut o, Arm::BpftraceProfiled, [28, 2, 0, 10, 0]);
        let t = o.cpu_targets();
        assert_eq!(t[0].met, Some(true), "{}", t[0].measured);
        assert!((t[0].value["share"].as_f64().unwrap() - 0.0001).abs() < 1e-12);
        assert_eq!(t[1].met, Some(true), "{}", t[1].measured);
        assert!(
            t[1].measured
                .starts_with("20.0× (10000 ns/I/O against 500)"),
            "{}",
            t[1].measured
        );
        assert_eq!(t[2].met, Some(true), "{}", t[2].measured);
        assert!((t[2].value["ns_per_io"].as_f64().unwrap() - 6000.0).abs() < 1e-9);
        assert_eq!(t[3].met, Some(false), "{}", t[3].measured);
        assert!(t[3].measured.starts_with("1.7×"), "{}", t[3].measured);
        // The request-level capture not profiled: its two goals say so.
        assert_eq!((t[4].met, t[5].met), (None, None));
        assert_eq!(t[4].measured, "not measured");
        // Profiled at 8 samples (2,000 ns/I/O): 0.04 %, 5.0× below bpftrace.
        set_profiled(&mut o, Arm::RecordRequestsProfiled, [2, 2, 1, 1, 2]);
        let t = o.cpu_targets();
        assert_eq!(t[4].name, "request-level capture CPU per I/O");
        assert_eq!(t[4].met, Some(true), "{}", t[4].measured);
        assert!((t[4].value["ns_per_io"].as_f64().unwrap() - 2000.0).abs() < 1e-9);
        assert_eq!(t[5].met, Some(true), "{}", t[5].measured);
        assert!(
            t[5].measured
                .starts_with("5.0× (10000 ns/I/O against 2000)"),
            "{}",
            t[5].measured
        );
        // Over the goal: the live view at 4 % of a smaller I/O.
        set_baseline_cpu(&mut o, &[12_500.0]);
        let t = o.cpu_targets();
        assert_eq!(t[0].met, Some(false), "{}", t[0].measured);
        assert!(t[0].measured.starts_with("4.0 %"), "{}", t[0].measured);
    }

    #[test]
    fn the_noise_is_the_second_untraced_arm_against_the_first() {
        let mut o = outcome(&[100.0, 100.0, 100.0], &[99.0, 99.0, 99.0], None);
        assert!(o.noise().is_none(), "the arm did not run");
        o.arms.get_mut(&Arm::Again).unwrap().samples =
            [104.0, 97.0, 90.0].map(|iops| Some(sample(iops))).to_vec();
        let n = o.noise().unwrap();
        assert!((n.median - 0.03).abs() < 1e-12, "{}", n.median);
        assert!((n.min + 0.04).abs() < 1e-12 && (n.max - 0.10).abs() < 1e-12);
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
