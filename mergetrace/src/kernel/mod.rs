//! The kernel side, as user space sees it: check privileges, resolve offsets and symbols for
//! the running kernel, load and attach the programs, and hand out the event stream.
pub mod btf;
pub mod collector;
pub mod compat;

use std::fmt;

use anyhow::{bail, Context, Result};
use aya::{
    maps::{MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit},
    Ebpf, EbpfLoader,
};
use mergetrace_common::{
    unplug_slot, CountKey, Counters, MeterUnits, Modes, TracedDevices, UnplugKey, LOST_SLOTS,
    MAX_DEVICES, UNPLUG_MAX_DEPTH,
};

use crate::aggregate::Window;

use crate::device::Device;

/// The eBPF object built by build.rs from mergetrace-ebpf.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mergetrace"));

/// How mergetrace observes the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierKind {
    /// BTF-enabled tracepoints plus kernel stacks and kallsyms for context.
    Tracepoint,
    /// fentry/fexit on block-layer functions: exact throttle delays and failed merge attempts.
    Fentry,
}

impl TierKind {
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Tracepoint => "tracepoint",
            TierKind::Fentry => "fentry",
        }
    }
}

/// The tier in use and why it was chosen.
#[derive(Debug, Clone)]
pub struct Tier {
    pub kind: TierKind,
    pub reason: String,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tier ({})", self.kind.name(), self.reason)
    }
}

/// Tracepoints of the tracepoint tier: (program name, tracepoint).
const TRACEPOINTS: &[(&str, &str)] = &[
    ("block_bio_queue", "block_bio_queue"),
    ("block_split", "block_split"),
    ("block_bio_backmerge", "block_bio_backmerge"),
    ("block_bio_frontmerge", "block_bio_frontmerge"),
    ("block_getrq", "block_getrq"),
    ("block_rq_merge", "block_rq_merge"),
    ("block_rq_insert", "block_rq_insert"),
    ("block_rq_issue", "block_rq_issue"),
    ("block_rq_requeue", "block_rq_requeue"),
    ("block_rq_complete", "block_rq_complete"),
    ("block_unplug", "block_unplug"),
];

/// Tracepoints that tell the tracepoint tier when blk-throttle releases bios.
const THROTTLE_CONTEXT: &[(&str, &str)] = &[
    ("workqueue_execute_start", "workqueue_execute_start"),
    ("workqueue_execute_end", "workqueue_execute_end"),
];

/// fentry/fexit programs of the fentry tier: (program name, kernel functions — the first the
/// kernel has —, is fexit). Up to 5.x blk-throttle's entry is `blk_throtl_bio` and released
/// bios go back through `submit_bio_noacct`.
const FENTRY_PROGRAMS: &[(&str, &[&str], bool)] = &[
    (
        "throtl_bio_entry",
        &["__blk_throtl_bio", "blk_throtl_bio"],
        false,
    ),
    ("throtl_bio_exit", &["__blk_throtl_bio", "blk_throtl_bio"], true),
    (
        "throtl_release",
        &["submit_bio_noacct_nocheck", "submit_bio_noacct"],
        false,
    ),
    ("plug_attempt_exit", &["blk_attempt_plug_merge"], true),
    ("elv_merge_exit", &["elv_merge"], true),
];

/// Which tier the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TierChoice {
    /// fentry where the kernel allows it, the tracepoint tier otherwise.
    Auto,
    Tracepoint,
    Fentry,
}

pub struct Options {
    /// Ring buffer size in bytes (a power of two, at least one page). Only used when
    /// `modes.emit` is set.
    pub ring_bytes: u32,
    pub tier: TierChoice,
    /// Count in the kernel (live view), send events (capture, demo), or both.
    pub modes: Modes,
    /// Turn on the kernel's per-program run time and count (`BPF_ENABLE_STATS`) for the run.
    pub stats: bool,
    pub meter_units: MeterUnits,
}

/// Loads and attaches every fentry-tier program; the first failure is returned (and the
/// caller falls back or reports it). Functions missing from BTF are skipped with a note.
fn attach_fentry(
    ebpf: &mut Ebpf,
    btf: &btf::Btf,
    aya_btf: &aya::Btf,
    notes: &mut Vec<String>,
) -> Result<()> {
    for (prog, funcs, exit) in FENTRY_PROGRAMS {
        let Some(func) = funcs.iter().find(|f| btf.has_function(f)) else {
            notes.push(format!(
                "kernel function {} is not traceable here (inlined or renamed): {prog} not attached",
                funcs.join(" or ")
            ));
            continue;
        };
        let prog = &compat::program_variant(btf, prog, func);
        let p = ebpf
            .program_mut(prog)
            .with_context(|| format!("program {prog} missing from the eBPF object"))?;
        let what = if *exit { "fexit" } else { "fentry" };
        let result: Result<()> = if *exit {
            let p: &mut FExit = p.try_into()?;
            p.load(func, aya_btf)
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(p.attach().map(|_| ())?))
        } else {
            let p: &mut FEntry = p.try_into()?;
            p.load(func, aya_btf)
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(p.attach().map(|_| ())?))
        };
        result.with_context(|| format!("cannot load/attach {what} program {prog} on {func}"))?;
    }
    Ok(())
}

/// Unloads whatever fentry-tier programs did load (after a failed attempt).
fn unload_fentry(ebpf: &mut Ebpf) {
    let variants = FENTRY_PROGRAMS
        .iter()
        .flat_map(|(p, _, _)| [p.to_string(), format!("{p}_4")]);
    for prog in variants {
        match ebpf.program_mut(&prog) {
            Some(aya::programs::Program::FEntry(p)) => {
                let _ = p.unload();
            }
            Some(aya::programs::Program::FExit(p)) => {
                let _ = p.unload();
            }
            _ => {}
        }
    }
}

/// Why the fentry tier could not run, in one line (no multi-line verifier log).
fn short_reason(e: &anyhow::Error) -> String {
    let root = e.root_cause().to_string();
    let first = root.lines().next().unwrap_or_default().to_string();
    if first.contains("Permission denied") || first.contains("Operation not permitted") {
        "fentry refused".to_string()
    } else {
        format!("fentry unavailable: {first}")
    }
}

/// Programs loaded and attached; dropping it detaches everything.
pub struct Session {
    ebpf: Option<Ebpf>,
    pub tier: Tier,
    /// Things the user should know (missing symbols, fallbacks).
    pub notes: Vec<String>,
    ring: Option<RingBuf<MapData>>,
    lost: PerCpuArray<MapData, u64>,
    lost_seen: [u64; LOST_SLOTS as usize],
    counts: PerCpuHashMap<MapData, CountKey, Counters>,
    /// Plug flushes by `mergetrace_common::unplug_slot`.
    unplugs: PerCpuArray<MapData, u64>,
    /// The traced disks' `dev_t`s, by their slot in the programs' per-disk maps.
    devs: Vec<u32>,
    /// Held while BPF run-time statistics are on (closing it turns them off).
    _stats: Option<std::os::fd::OwnedFd>,
}

/// Refuses early, in one line, when the process cannot use BPF.
pub fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u64 = 21;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let has = |c: u64| cap_eff & (1 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        bail!("mergetrace needs root, or CAP_BPF and CAP_PERFMON, to load its eBPF programs: run it with sudo");
    }
    Ok(())
}

impl Session {
    /// Loads the programs for `devices` and attaches them.
    pub fn start(devices: &[Device], opts: &Options) -> Result<Session> {
        check_privileges()?;
        let stats = if opts.stats {
            Some(
                aya::sys::enable_stats(aya::sys::Stats::RunTime)
                    .context("cannot enable BPF run-time statistics")?,
            )
        } else {
            None
        };
        let btf = btf::Btf::from_sys_fs()?;
        let offsets = compat::resolve_offsets(&btf)
            .context("this kernel's block layer does not have the layout mergetrace reads")?;
        let kallsyms = compat::Kallsyms::load()?;
        let (symbols, mut notes) = if kallsyms.is_empty() {
            (
                Default::default(),
                vec!["kernel addresses are hidden (kptr_restrict): merge paths and throttle releases show as unknown".to_string()],
            )
        } else {
            compat::resolve_symbols(&kallsyms)
        };
        let aya_btf = aya::Btf::parse_file(btf::Btf::kernel_path(), aya::Endianness::default())
            .context("cannot read the kernel's BTF")?;
        if devices.len() > MAX_DEVICES {
            bail!(
                "mergetrace traces at most {MAX_DEVICES} disks at once ({} given): trace fewer with -d",
                devices.len()
            );
        }
        let mut traced = TracedDevices {
            count: devices.len() as u32,
            ..TracedDevices::default()
        };
        for (slot, d) in traced.devs.iter_mut().zip(devices) {
            *slot = d.kernel_dev();
        }
        let mut modes = opts.modes;
        // A testing knob: tell merge paths from the kernel stack, as before the plug check.
        modes.merge_path_from_stack =
            std::env::var("MERGETRACE_MERGE_PATH_FROM_STACK").is_ok_and(|v| v == "1") as u32;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .override_global("OFFSETS", &offsets, true)
            .override_global("SYMBOLS", &symbols, true)
            .override_global("MODES", &modes, true)
            .override_global("METER_UNITS", &opts.meter_units, true)
            .override_global("TRACED", &traced, true)
            // Without events to send, the ring buffer only needs its minimum size.
            .map_max_entries(
                "EVENTS",
                if opts.modes.emit != 0 {
                    opts.ring_bytes
                } else {
                    4096
                },
            )
            .load(PROGRAMS)
            .context("cannot load mergetrace's eBPF object")?;

        let mut attach = |prog: &str, tp: &str| -> Result<()> {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(prog)
                .with_context(|| format!("program {prog} missing from the eBPF object"))?
                .try_into()?;
            p.load(tp, &aya_btf)
                .with_context(|| format!("cannot load program {prog} for tracepoint {tp}"))?;
            p.attach()
                .with_context(|| format!("cannot attach program {prog} to tracepoint {tp}"))?;
            Ok(())
        };
        for (prog, tp) in TRACEPOINTS {
            // Completions only matter to captures (latency, lineage): counting alone skips the
            // probe, which runs once per request.
            if *prog == "block_rq_complete" && opts.modes.emit == 0 {
                continue;
            }
            if !btf.has_tracepoint(tp) {
                notes.push(format!("tracepoint {tp} does not exist on this kernel"));
                continue;
            }
            attach(&compat::program_variant(&btf, prog, tp), tp)?;
        }
        if symbols.throtl_dispatch_fn != 0 {
            for (prog, tp) in THROTTLE_CONTEXT {
                attach(prog, tp)?;
            }
        }

        let tier = match opts.tier {
            TierChoice::Tracepoint => Tier {
                kind: TierKind::Tracepoint,
                reason: "chosen with --tier tracepoint".into(),
            },
            TierChoice::Fentry => {
                attach_fentry(&mut ebpf, &btf, &aya_btf, &mut notes)
                    .context("the fentry tier was forced with --tier fentry")?;
                Tier {
                    kind: TierKind::Fentry,
                    reason: "chosen with --tier fentry".into(),
                }
            }
            TierChoice::Auto => match attach_fentry(&mut ebpf, &btf, &aya_btf, &mut notes) {
                Ok(()) => Tier {
                    kind: TierKind::Fentry,
                    reason: "fentry allowed".into(),
                },
                Err(e) => {
                    unload_fentry(&mut ebpf);
                    Tier {
                        kind: TierKind::Tracepoint,
                        reason: short_reason(&e),
                    }
                }
            },
        };

        let ring = RingBuf::try_from(ebpf.take_map("EVENTS").context("EVENTS map missing")?)?;
        let lost = PerCpuArray::try_from(ebpf.take_map("LOST").context("LOST map missing")?)?;
        let counts =
            PerCpuHashMap::try_from(ebpf.take_map("COUNTS").context("COUNTS map missing")?)?;
        let unplugs =
            PerCpuArray::try_from(ebpf.take_map("UNPLUGS").context("UNPLUGS map missing")?)?;
        Ok(Session {
            ebpf: Some(ebpf),
            tier,
            notes,
            ring: Some(ring),
            lost,
            lost_seen: [0; LOST_SLOTS as usize],
            counts,
            unplugs,
            devs: devices.iter().map(|d| d.kernel_dev()).collect(),
            _stats: stats,
        })
    }

    /// The event ring buffer (once).
    pub fn take_ring(&mut self) -> Option<RingBuf<MapData>> {
        self.ring.take()
    }

    /// The in-kernel counters so far (summed over CPUs) and every loss so far: a running
    /// total of the whole run; `Window::since` gives intervals. Readable after `detach`.
    pub fn read_totals(&self) -> Result<Window> {
        let mut counts = Vec::new();
        for item in self.counts.iter() {
            let (k, per_cpu) = item.context("cannot read the COUNTS map")?;
            let mut sum = Counters::default();
            for c in per_cpu.iter() {
                sum.add(c);
            }
            counts.push((k, sum));
        }
        let mut unplugs = Vec::new();
        for (slot, dev) in self.devs.iter().enumerate() {
            for explicit in [false, true] {
                for depth in 0..=UNPLUG_MAX_DEPTH {
                    let i = unplug_slot(slot as u32, explicit, depth);
                    let per_cpu = self
                        .unplugs
                        .get(&i, 0)
                        .context("cannot read the UNPLUGS map")?;
                    let n: u64 = per_cpu.iter().sum();
                    if n > 0 {
                        let key = UnplugKey {
                            dev: *dev,
                            depth,
                            explicit: explicit as u32,
                            _pad: 0,
                        };
                        unplugs.push((key, n));
                    }
                }
            }
        }
        let mut w = Window::from_kernel(counts, unplugs);
        for k in 0..LOST_SLOTS {
            if let Ok(per_cpu) = self.lost.get(&k, 0) {
                let n: u64 = per_cpu.iter().sum();
                if n > 0 {
                    w.lost_by_kind.insert(k as u8, n);
                }
            }
        }
        Ok(w)
    }

    /// Events dropped since the last call, per kind (only kinds with new losses).
    pub fn new_losses(&mut self) -> Vec<(u8, u64)> {
        let mut out = Vec::new();
        for k in 0..LOST_SLOTS {
            let Ok(per_cpu) = self.lost.get(&k, 0) else {
                continue;
            };
            let total: u64 = per_cpu.iter().sum();
            let new = total.saturating_sub(self.lost_seen[k as usize]);
            if new > 0 {
                self.lost_seen[k as usize] = total;
                out.push((k as u8, new));
            }
        }
        out
    }

    /// Runs and kernel time of every loaded program so far (meaningful with `Options::stats`).
    pub fn program_stats(&self) -> Vec<crate::snapshot::ProgramStat> {
        let Some(ebpf) = &self.ebpf else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, prog) in ebpf.programs() {
            let Ok(info) = prog.info() else { continue };
            let runs = info.run_count();
            let ns = info.run_time().as_nanos() as u64;
            if runs > 0 {
                out.push(crate::snapshot::ProgramStat {
                    program: name.to_string(),
                    runs,
                    run_time_ns: ns,
                    ns_per_run: ns as f64 / runs as f64,
                });
            }
        }
        out.sort_by(|a, b| b.run_time_ns.cmp(&a.run_time_ns));
        out
    }

    /// Detaches and unloads every program. Maps stay readable (the ring can be drained).
    pub fn detach(&mut self) {
        self.ebpf.take();
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
