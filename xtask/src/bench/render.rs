//! The results: the text table on standard output and the JSON file.

use std::fs;

use serde_json::{json, Value};

use super::{
    arms::{Arm, RecorderStages},
    fio::{self, Workload, DEVICE_BYTES, REGION_BYTES},
    profile::{Part, PERIOD_NS},
    stats::{self, pct, si, table, Summary},
    sys::LoopDev,
    targets::{Outcome, ProfiledCost, Target, WorkloadOutcome, LIVE_MAX_OVERHEAD},
};

/// The fio line of a workload's section.
pub fn workload_line(w: &WorkloadOutcome) -> String {
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

pub fn render_workload(w: &WorkloadOutcome, targets: &[&Target]) -> String {
    let mut out = format!("{}\n\n", workload_line(w));
    let mut rows = vec![vec![
        "arm".to_string(),
        "IOPS median [min–max]".into(),
        "overhead median [min–max]".into(),
        "CPU/I/O".into(),
        "tracer process/I/O".into(),
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
        let process = Summary::of(&r.values(|s| s.tracer_ns_per_io()))
            .map(|s| format!("{:.0} ns", s.median))
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
            process,
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
    out += &match w.noise() {
        Some(n) => format!(
            "noise: no tracer, run twice a round: {} apart; an overhead that close to its goal \
             is not a clear pass or miss\n",
            n.show(pct)
        ),
        None => "noise: not measured (the second no-tracer arm did not run)\n".into(),
    };
    out += "\n";
    out += &profile_table(w);
    if let Some(o) = w.live_over_hooks() {
        out += &format!(
            "the live view's hooks alone (its programs attached but returning at once): {:.0} \
             ns/I/O, {}; its programs' work above them: {:.0} ns/I/O, {}; the {:.0} % goal \
             leaves that work {:.0} ns/I/O\n",
            o.hooks_ns_per_io,
            pct(o.hooks_share),
            o.work_ns_per_io,
            pct(o.work_share),
            LIVE_MAX_OVERHEAD * 100.0,
            o.goal_leaves_ns_per_io,
        );
    }
    out += "\n";
    out += &program_table(
        w,
        Arm::LiveStats,
        "BPF program cost (mergetrace --stats, kernel BPF run-time statistics, all devices)",
    );
    out += "\n";
    out += &program_table(
        w,
        Arm::RecordStats,
        "A full capture's cost (mergetrace record --stats: its programs, as above)",
    );
    out += &match w.record_cost() {
        Some(c) => {
            // The programs' own time beside each measured figure, where it was measured.
            let net = c.net_ns_per_io.zip(c.net_share);
            let mut line = format!("record per I/O: programs {:.0} ns", c.bpf_ns_per_io);
            if let Some((net, _)) = net {
                line += &format!(" ({net:.0} ns of their own time)");
            }
            line += &format!(
                " + recording process {:.0} ns = {:.0} ns",
                c.recorder_ns_per_io,
                c.bpf_ns_per_io + c.recorder_ns_per_io
            );
            if let Some((net, _)) = net {
                line += &format!(" ({:.0} ns)", net + c.recorder_ns_per_io);
            }
            line += &format!(", {}", pct(c.share));
            if let Some((_, share)) = net {
                line += &format!(" ({})", pct(share));
            }
            line += &format!(
                " of the baseline's {:.2} µs of CPU per I/O\n",
                c.cpu_ns_per_io / 1e3
            );
            if let Some(s) = c.recorder_stages {
                let stages: Vec<String> = RecorderStages::NAMES
                    .iter()
                    .zip(s.0)
                    .map(|(name, ns)| format!("{name} {ns:.0} ns"))
                    .collect();
                line += &format!("  the recording process per I/O: {}\n", stages.join(", "));
            }
            line
        }
        None => "record per I/O: not measured\n".to_string(),
    };
    out
}

/// A `--stats` arm's programs, one row each.
fn program_table(w: &WorkloadOutcome, arm: Arm, title: &str) -> String {
    let ps = w.program_stats(arm);
    if ps.is_empty() {
        return format!("{title}: not measured (the arm did not run or reported nothing)\n");
    }
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
    format!("{title}\n{}", table(&rows))
}

pub fn targets_table(targets: &[&Target]) -> String {
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

pub fn render(header: &str, o: &Outcome, targets: &[Target]) -> String {
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

pub fn arm_json(w: &WorkloadOutcome, arm: Arm) -> Value {
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
                "tracer_cpu_ns": s.tracer_cpu_ns,
                "tracer_ns_per_io": s.tracer_ns_per_io(),
                "cpu_busy_ns": s.cpu.map(|c| c.busy_ns),
                "cpu_steal_ns": s.cpu.map(|c| c.steal_ns),
                "cpu_all_ns": s.cpu.map(|c| c.all_ns),
                "bios_per_request": s.bios_per_request,
                "events": s.events,
                "lost": s.lost,
                "bytes": s.bytes,
                "programs": s.programs.iter().map(|(p, runs, ns)| json!({"program": p, "runs": runs, "ns_per_run": ns})).collect::<Vec<_>>(),
                "bpf_ns_per_io": s.bpf_ns_per_io(),
                "bpf_net_ns_per_io": s.bpf_net_ns_per_io(),
                "profile": s.profile.map(|p| json!({
                    "period_ns": PERIOD_NS,
                    "samples": p.all,
                    "tracer_samples": Part::ALL.iter().map(|part| (part.key().to_string(), json!(p.of(*part)))).collect::<serde_json::Map<_, _>>(),
                    "tracer_ns_per_io": s.profiled_ns_per_io(None),
                })),
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

/// Each profiled tracer's CPU per I/O, by part, as a table.
fn profile_table(w: &WorkloadOutcome) -> String {
    let mut rows = vec![["tracer".to_string()]
        .into_iter()
        .chain(Part::ALL.map(|p| p.name().to_string()))
        .chain(["total".into(), "of an I/O's CPU".into()])
        .collect::<Vec<_>>()];
    for arm in Arm::PROFILED {
        let mut row = vec![arm.label().to_string()];
        match w.profiled_cost(arm) {
            Some(c) => {
                row.extend(c.parts.map(|ns| format!("{ns:.0} ns")));
                row.push(format!("{:.0} ns", c.ns_per_io));
                row.push(pct(c.share));
            }
            None => row.push("not measured".into()),
        }
        rows.push(row);
    }
    format!(
        "CPU per I/O, profiled (perf record -a, every CPU sampled each {} µs of its CPU time, \
         kernel call chains; a sample is the tracer's in its process, or with a BPF program or \
         the kernel's way into one on its chain), medians:\n{}",
        PERIOD_NS / 1000,
        table(&rows)
    )
}

fn profiled_cost_json(c: &ProfiledCost) -> Value {
    let parts: serde_json::Map<_, _> = Part::ALL
        .iter()
        .zip(c.parts)
        .map(|(p, ns)| (p.key().to_string(), json!(ns)))
        .collect();
    json!({
        "ns_per_io": c.ns_per_io,
        "parts_ns_per_io": parts,
        "baseline_cpu_ns_per_io": c.cpu_ns_per_io,
        "share": c.share,
    })
}

pub fn workload_json(w: &WorkloadOutcome, dev: &str, seconds: u32) -> Value {
    let mut arms = serde_json::Map::new();
    for arm in Arm::ALL {
        arms.insert(arm.key().into(), arm_json(w, arm));
    }
    let shares = w.bpf_shares();
    let stats_json = |arm| {
        w.program_stats(arm)
            .iter()
            .map(|p| {
                json!({
                    "program": p.program,
                    "runs_per_run": p.runs.json(),
                    "runs_per_io": p.runs_per_io.map(|s| s.json()),
                    "ns_per_run": p.ns_per_run.json(),
                })
            })
            .collect::<Vec<_>>()
    };
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
        "program_stats": stats_json(Arm::LiveStats),
        "record_program_stats": stats_json(Arm::RecordStats),
        "noise": w.noise().map(|n| n.json()),
        "profiled_cost": Arm::PROFILED.iter().map(|&arm| {
            (arm.key().to_string(), json!(w.profiled_cost(arm).map(|c| profiled_cost_json(&c))))
        }).collect::<serde_json::Map<_, _>>(),
        "live_over_hooks": w.live_over_hooks().map(|o| json!({
            "hooks_ns_per_io": o.hooks_ns_per_io,
            "hooks_share": o.hooks_share,
            "work_ns_per_io": o.work_ns_per_io,
            "work_share": o.work_share,
            "goal_leaves_ns_per_io": o.goal_leaves_ns_per_io,
        })),
        "record_cost": w.record_cost().map(|c| json!({
            "bpf_ns_per_io": c.bpf_ns_per_io,
            "bpf_net_ns_per_io": c.net_ns_per_io,
            "recorder_ns_per_io": c.recorder_ns_per_io,
            "recorder_stages_ns_per_io": c.recorder_stages.map(|s| {
                RecorderStages::NAMES.iter().zip(s.0).map(|(n, v)| (n.to_string(), json!(v)))
                    .collect::<serde_json::Map<_, _>>()
            }),
            "baseline_cpu_ns_per_io": c.cpu_ns_per_io,
            "share": c.share,
            "net_share": c.net_share,
        })),
        "bpf_cost_per_round": shares.iter().map(|s| json!({
            "bpf_ns_per_io": s.bpf_ns_per_io,
            "net_ns_per_io": s.net_ns_per_io,
            "stats_floor_ns": s.floor_ns,
            "baseline_cpu_ns_per_io": s.cpu_ns_per_io,
            "share": s.net_ns_per_io / s.cpu_ns_per_io,
            "measured_share": s.bpf_ns_per_io / s.cpu_ns_per_io,
        })).collect::<Vec<_>>(),
    })
}

/// How the bench ran, for the header and the JSON.
pub struct Run {
    pub runs: usize,
    pub seconds: u32,
    pub smoke: bool,
    pub started: u64,
    pub scheduler: String,
    pub max_sectors_kb: String,
    pub cpus: usize,
    pub load_start: String,
    pub load_end: String,
}

impl Run {
    /// The lines above the tables (and in the JSON's `summary`).
    pub fn header(&self, lp: &LoopDev) -> String {
        format!(
            "mergetrace bench, {}: {} round{} × {} s per arm and workload\n\
             device: {} ({} GiB sparse /dev/shm file; scheduler {}, max_sectors_kb {})\n\
             machine: {} CPUs, kernel {}, load average {} → {}",
            stats::utc_date(self.started),
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            self.seconds,
            lp.name,
            DEVICE_BYTES >> 30,
            self.scheduler,
            self.max_sectors_kb,
            self.cpus,
            kernel_release(),
            self.load_start,
            self.load_end,
        )
    }
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub fn results_json(
    run: &Run,
    header: &str,
    lp: &LoopDev,
    o: &Outcome,
    targets: &[Target],
) -> Value {
    let Run {
        runs,
        seconds,
        smoke,
        started,
        ref scheduler,
        ref max_sectors_kb,
        cpus,
        ref load_start,
        ref load_end,
    } = *run;
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
            "smoke": smoke,
            "workloads": o.workloads.iter().map(|w| w.workload().key()).collect::<Vec<_>>(),
            "device": lp.name,
            "device_bytes": DEVICE_BYTES,
            "region_bytes": REGION_BYTES,
            "scheduler": scheduler,
            "max_sectors_kb": max_sectors_kb,
            "jiffy_ns": fio::jiffy_ns(),
        },
        "host": {
            "kernel": kernel_release(),
            "cpus": cpus,
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
