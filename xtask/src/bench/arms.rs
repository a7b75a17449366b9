//! The arms of the benchmark (no tracer, the live view, with --latency, the exporter scraped
//! every second, record, record --requests, no tracer again, bpftrace, perf, live --stats,
//! record --stats, the live view, record, record --requests and bpftrace profiled, and the live
//! view's hooks alone profiled), the order they run in each round, and what one run of an arm
//! measured.

use super::{
    fio::{self, FioRun, Workload},
    profile::{Part, Profile, PERIOD_NS},
    stats::si,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arm {
    Baseline,
    Live,
    LiveLatency,
    Serve,
    Record,
    RecordRequests,
    /// The live view profiled; with the other `Arm::PROFILED`.
    LiveProfiled,
    /// The live view's hooks alone, profiled: its programs attached but shut (`--hooks-only`),
    /// each returning at its first check. The floor under the live view's cost.
    LiveHooksProfiled,
    /// No tracer, a second time in the round: its "overhead" is the noise of the machine, the
    /// spread any arm's overhead has with no cost at all.
    Again,
    Bpftrace,
    Perf,
    LiveStats,
    RecordStats,
    RecordProfiled,
    RecordRequestsProfiled,
    BpftraceProfiled,
}

impl Arm {
    /// The order of a round (rotated from round to round). `Again` sits halfway round from
    /// `Baseline`, as far from it as an arm can be.
    pub const ALL: [Arm; 16] = [
        Arm::Baseline,
        Arm::Live,
        Arm::LiveLatency,
        Arm::Serve,
        Arm::Record,
        Arm::RecordRequests,
        Arm::LiveProfiled,
        Arm::LiveHooksProfiled,
        Arm::Again,
        Arm::Bpftrace,
        Arm::Perf,
        Arm::LiveStats,
        Arm::RecordStats,
        Arm::RecordProfiled,
        Arm::RecordRequestsProfiled,
        Arm::BpftraceProfiled,
    ];

    /// The arms run with every CPU profiled while fio runs (`profile`): the live view, its
    /// hooks alone, a full capture, a request-level one and bpftrace, each one's whole CPU time
    /// per I/O, hooks and process, measured alike. In the order the profile table shows them.
    pub const PROFILED: [Arm; 5] = [
        Arm::LiveProfiled,
        Arm::LiveHooksProfiled,
        Arm::RecordProfiled,
        Arm::RecordRequestsProfiled,
        Arm::BpftraceProfiled,
    ];

    pub fn profiled(self) -> bool {
        Arm::PROFILED.contains(&self)
    }

    pub fn key(self) -> &'static str {
        match self {
            Arm::Baseline => "baseline",
            Arm::Live => "live",
            Arm::LiveLatency => "live_latency",
            Arm::Serve => "serve",
            Arm::Record => "record",
            Arm::RecordRequests => "record_requests",
            Arm::Again => "baseline_again",
            Arm::Bpftrace => "bpftrace",
            Arm::Perf => "perf",
            Arm::LiveStats => "live_stats",
            Arm::RecordStats => "record_stats",
            Arm::LiveProfiled => "live_profiled",
            Arm::LiveHooksProfiled => "live_hooks_profiled",
            Arm::RecordProfiled => "record_profiled",
            Arm::RecordRequestsProfiled => "record_requests_profiled",
            Arm::BpftraceProfiled => "bpftrace_profiled",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Arm::Baseline => "baseline (no tracer)",
            Arm::Live => "mergetrace live",
            Arm::LiveLatency => "mergetrace live --latency",
            Arm::Serve => "mergetrace serve",
            Arm::Record => "mergetrace record",
            Arm::RecordRequests => "mergetrace record --requests",
            Arm::Again => "no tracer, again (noise)",
            Arm::Bpftrace => "bpftrace",
            Arm::Perf => "perf record",
            Arm::LiveStats => "mergetrace live --stats",
            Arm::RecordStats => "mergetrace record --stats",
            Arm::LiveProfiled => "mergetrace live, profiled",
            Arm::LiveHooksProfiled => "mergetrace live, hooks alone, profiled",
            Arm::RecordProfiled => "mergetrace record, profiled",
            Arm::RecordRequestsProfiled => "mergetrace record --requests, profiled",
            Arm::BpftraceProfiled => "bpftrace, profiled",
        }
    }

    /// What the arm runs, for the JSON.
    pub fn command(self) -> &'static str {
        match self {
            Arm::Baseline | Arm::Again => "",
            Arm::Live => "mergetrace -d DEV --json -i 10s",
            Arm::LiveLatency => "mergetrace -d DEV --json -i 10s --latency",
            Arm::Serve => "mergetrace serve -d DEV --listen 127.0.0.1:0, GET /metrics every second",
            Arm::Record => "mergetrace record -d DEV -o /dev/shm/... --force",
            Arm::RecordRequests => "mergetrace record -d DEV -o /dev/shm/... --force --requests",
            Arm::Bpftrace => {
                "bpftrace -B line SCRIPT (@[probe, args->dev] = count() on the block tracepoints)"
            }
            Arm::Perf => "perf record -e block:... -a -B -N -o /dev/shm/.../perf.data",
            Arm::LiveStats => "mergetrace -d DEV --json -i 10s --stats",
            Arm::RecordStats => "mergetrace record -d DEV -o /dev/shm/... --force --stats",
            Arm::LiveProfiled => "mergetrace -d DEV --json -i 10s; perf record -a -g -e cpu-clock",
            Arm::LiveHooksProfiled => {
                "mergetrace -d DEV --json -i 10s --hooks-only; perf record -a -g -e cpu-clock"
            }
            Arm::RecordProfiled => {
                "mergetrace record -d DEV -o /dev/shm/... --force; perf record -a -g -e cpu-clock"
            }
            Arm::RecordRequestsProfiled => {
                "mergetrace record -d DEV -o /dev/shm/... --force --requests; \
                 perf record -a -g -e cpu-clock"
            }
            Arm::BpftraceProfiled => "bpftrace -B line SCRIPT; perf record -a -g -e cpu-clock",
        }
    }
}

/// Round `r`'s order of arms: every arm, rotated by `r`.
pub fn order(round: usize) -> Vec<Arm> {
    let mut v = Arm::ALL.to_vec();
    let n = v.len();
    v.rotate_left(round % n);
    v
}

/// Round `r`'s order of workloads: the chosen ones, rotated by `r`.
pub fn workload_order(chosen: &[Workload], round: usize) -> Vec<Workload> {
    let mut v = chosen.to_vec();
    if !v.is_empty() {
        let n = v.len();
        v.rotate_left(round % n);
    }
    v
}

/// What one arm saw in one round of one workload.
#[derive(Debug, Default, Clone)]
pub struct Sample {
    pub iops: f64,
    /// I/Os fio did (reads and writes).
    pub ios: u64,
    /// The machine's busy CPU time per I/O over the fio run, ns (/proc/stat, all CPUs).
    pub cpu_ns_per_io: Option<f64>,
    /// Busy, steal and all CPU time over the run, ns.
    pub cpu: Option<fio::CpuUse>,
    /// Bios per request on the device (diskstats).
    pub bios_per_request: Option<f64>,
    /// Events the tracer reported for the loop device (mergetrace record, bpftrace) or in
    /// all (perf samples).
    pub events: Option<u64>,
    pub lost: Option<u64>,
    pub bytes: Option<u64>,
    /// `--stats`: (program, runs, ns per run).
    pub programs: Vec<(String, u64, f64)>,
    /// The tracer process's CPU time while fio ran (user and system, every thread; its
    /// programs' time in the kernel is not in it), ns.
    pub tracer_cpu_ns: Option<f64>,
    /// `record --stats`: the recording process's own CPU time while it recorded, ns.
    pub recorder_cpu_ns: Option<f64>,
    /// `record --stats`: that time by stage of its data path, ns per event written.
    pub recorder_stages: Option<RecorderStages>,
    /// A profiled arm: the tracer's samples of every CPU while fio ran.
    pub profile: Option<Profile>,
    pub notes: Vec<String>,
}

impl Sample {
    pub fn of(r: &FioRun) -> Sample {
        Sample {
            iops: r.iops,
            ios: r.ios,
            cpu_ns_per_io: r.cpu_ns_per_io(),
            cpu: r.cpu,
            bios_per_request: r.bios_per_request,
            ..Sample::default()
        }
    }

    /// `--stats`: the programs' kernel time (runs × ns/run, added up) per I/O fio did, ns, as
    /// the kernel's statistics report it (mergetrace's yardstick left out).
    pub fn bpf_ns_per_io(&self) -> Option<f64> {
        self.programs_ns_per_io(0.0)
    }

    /// `--stats`: what the kernel's statistics add to each program run, ns: the ns/run of
    /// mergetrace's empty program (`stats_floor`).
    pub fn stats_floor_ns(&self) -> Option<f64> {
        self.programs
            .iter()
            .find(|(name, ..)| name == STATS_FLOOR)
            .map(|(_, _, ns)| *ns)
    }

    /// As [`Sample::bpf_ns_per_io`], each run's time less what the statistics add to it
    /// ([`Sample::stats_floor_ns`]): the programs' own time, as when statistics are off.
    pub fn bpf_net_ns_per_io(&self) -> Option<f64> {
        self.programs_ns_per_io(self.stats_floor_ns()?)
    }

    /// The programs' time per I/O, each run's time less `floor` ns (`stats_floor` left out).
    fn programs_ns_per_io(&self, floor: f64) -> Option<f64> {
        let programs = || {
            self.programs
                .iter()
                .filter(|(name, ..)| name != STATS_FLOOR)
        };
        if programs().next().is_none() || self.ios == 0 {
            return None;
        }
        let ns: f64 = programs()
            .map(|(_, runs, ns)| *runs as f64 * (ns - floor).max(0.0))
            .sum();
        Some(ns / self.ios as f64)
    }

    /// The tracer process's CPU time per I/O fio did, ns.
    pub fn tracer_ns_per_io(&self) -> Option<f64> {
        self.per_io(self.tracer_cpu_ns)
    }

    /// `record --stats`: the recording process's CPU time per I/O fio did, ns.
    pub fn recorder_ns_per_io(&self) -> Option<f64> {
        self.per_io(self.recorder_cpu_ns)
    }

    /// A profiled arm: the tracer's CPU time per I/O fio did in `part` (all parts: `None`), ns.
    pub fn profiled_ns_per_io(&self, part: Option<Part>) -> Option<f64> {
        let p = self.profile?;
        let samples = part.map_or(p.total(), |part| p.of(part));
        self.per_io(Some((samples * PERIOD_NS) as f64))
    }

    /// `ns` over the I/Os fio did; `None` without I/Os.
    fn per_io(&self, ns: Option<f64>) -> Option<f64> {
        (self.ios > 0).then(|| ns.map(|ns| ns / self.ios as f64))?
    }

    /// `record --stats`: the recording process's stages per I/O fio did, ns (each stage's
    /// ns per event times the events written per I/O).
    pub fn recorder_stages_per_io(&self) -> Option<RecorderStages> {
        let per_io = self.events? as f64 / (self.ios > 0).then_some(self.ios)? as f64;
        Some(self.recorder_stages?.scaled(per_io))
    }
}

/// The recording process's CPU by stage of its data path (`record --stats`' "per event,
/// reading the rings …" line): reading the rings, time order, encoding and writing, the rest.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RecorderStages(pub [f64; 4]);

impl RecorderStages {
    pub const NAMES: [&'static str; 4] = [
        "reading the rings",
        "time order",
        "encoding and writing",
        "the rest",
    ];

    pub fn scaled(self, by: f64) -> RecorderStages {
        RecorderStages(self.0.map(|v| v * by))
    }
}

#[derive(Debug, Default)]
pub struct ArmResults {
    pub samples: Vec<Option<Sample>>,
    pub unavailable: Option<String>,
}

impl ArmResults {
    /// One value per round (None where the arm did not run or the value is missing).
    pub fn per_round(&self, f: impl Fn(&Sample) -> Option<f64>) -> Vec<Option<f64>> {
        self.samples
            .iter()
            .map(|s| s.as_ref().and_then(&f))
            .collect()
    }

    pub fn iops(&self) -> Vec<Option<f64>> {
        self.per_round(|s| Some(s.iops))
    }

    /// The values of the rounds that have one.
    pub fn values(&self, f: impl Fn(&Sample) -> Option<f64>) -> Vec<f64> {
        self.per_round(f).into_iter().flatten().collect()
    }
}

/// mergetrace's empty program under `--stats`: its ns/run is what the statistics add to a run.
pub const STATS_FLOOR: &str = "stats_floor";

/// A line for one arm's run in one round.
pub fn progress(arm: Arm, s: &Sample) -> String {
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
        if let Some(net) = s.bpf_net_ns_per_io() {
            line += &format!(" ({net:.0} net)");
        }
    }
    if let Some(t) = s.tracer_ns_per_io() {
        line += &format!("  process {t:.0} ns/I/O");
    }
    if let Some(u) = s.recorder_ns_per_io() {
        line += &format!(", recorder {u:.0} ns/I/O");
    }
    if let Some(p) = s.profiled_ns_per_io(None) {
        line += &format!("  profiled {p:.0} ns/I/O");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fio::Workload;

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
            vec![Workload::Merging, Workload::Limited, Workload::Reads]
        );
        assert_eq!(
            workload_order(&[Workload::Merging], 3),
            vec![Workload::Merging]
        );
        assert_eq!(Workload::parse("all"), all.to_vec());
        assert_eq!(Workload::parse("reads"), vec![Workload::Reads]);
        assert_eq!(Workload::parse("merging"), vec![Workload::Merging]);
        assert_eq!(Workload::parse("limited"), vec![Workload::Limited]);
    }
}
