//! Loading the embedded eBPF object for the running kernel and attaching its programs as the
//! hook table says ([`compat::hooks`]): every tracepoint-tier program, then the fentry tier's
//! where it is chosen or allowed. A [`Session`] holds them; dropping it detaches everything.
use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::bail;
use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit, ProgramError},
    Ebpf, EbpfLoader,
};
use mergetrace_common::{
    latency::{LatencyHist, ISSUED_AT_ENTRIES, ISSUE_SLOTS_PER_DISK},
    unplug_slot, Counters, KernelSymbols, MeterUnits, Modes, TracedDevices, UnplugKey, LOST_SLOTS,
    MAX_DEVICES, MAX_SLOTS, REMOVED_SLOTS, UNPLUG_MAX_DEPTH,
};

use super::{
    btf::Btf,
    cgroup_events::{self, CgroupChange},
    check_privileges,
    compat::{
        self,
        hooks::{self, Attach, Hook, Program, Wants},
        Kallsyms,
    },
    rings::{self, Batches, CpuRing},
    slots::{Slots, Table},
    unfinished::{self, IssueEntries},
    Tier, TierChoice, TierKind,
};
use crate::{
    model::{
        aggregate::Window,
        snapshot::{ProgramStat, Unsaid},
    },
    sys::device::Device,
};

/// The eBPF object built by build.rs from mergetrace-ebpf.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mergetrace"));

/// `--stats`' empty program: its ns/run is what the kernel's statistics add to every run.
pub const STATS_FLOOR: &str = "stats_floor";

/// How often a counting run gives new (cgroup, disk, direction) keys their counter slot
/// ([`Session::adopt_new_keys`]): until then their events take two hash lookups each.
pub const ADOPT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Births and removals kept for a caller that does not take them, at most.
const MAX_PENDING_CHANGES: usize = 1 << 16;

pub struct Options {
    /// Bytes of event rings in all (a power of two), shared by the online CPUs (a ring each,
    /// [`rings::Plan`]). Only used when `modes.emit` is set.
    pub ring_bytes: u32,
    pub tier: TierChoice,
    /// Count in the kernel (live view), send events (capture, demo), or both.
    pub modes: Modes,
    /// Turn on the kernel's per-program run time and count (`BPF_ENABLE_STATS`) for the run.
    pub stats: bool,
    pub meter_units: MeterUnits,
    /// Forward the programs' aya-log records to the `log` crate (`--ebpf-log`).
    pub ebpf_log: bool,
    /// How long a removed cgroup's counters stay its own before they are folded into the
    /// device's removed counters (`--reclaim-after`).
    pub reclaim_after: std::time::Duration,
    /// What the run asks for beside its per-request counting (its flags; a full capture:
    /// [`Wants::ALL`]); the traced disks may add more ([`Session::wants`]).
    pub wants: Wants,
    /// Attach the run's programs but leave the gate shut: each returns at its first check and
    /// nothing is counted. What the hooks alone cost (`--hooks-only`, the benchmark's floor).
    pub hooks_only: bool,
}

/// The object loaded (maps created, nothing attached) for this kernel, with what the programs
/// read from it: offsets from BTF, addresses from kallsyms.
struct Loaded {
    ebpf: Ebpf,
    btf: Btf,
    aya_btf: aya::Btf,
    kallsyms: Kallsyms,
    /// Things the user should know (missing symbols).
    notes: Vec<String>,
}

/// `rings`: the event rings' plan where events are sent (`modes.emit`), else `None`.
fn load_object(
    modes: Modes,
    rings: Option<&rings::Plan>,
    meter_units: &MeterUnits,
    traced: &TracedDevices,
) -> Result<Loaded> {
    let btf = Btf::from_sys_fs()?;
    let kfuncs = compat::Kfuncs::of_kernel(&btf);
    let object = compat::kfuncs::link(OBJECT, &kfuncs)?;
    let offsets = compat::resolve_offsets(&btf, &kfuncs)
        .context("this kernel's block layer does not have the layout mergetrace reads")?;
    let kallsyms = Kallsyms::load()?;
    let (symbols, notes): (KernelSymbols, _) = if kallsyms.is_empty() {
        (
            Default::default(),
            vec!["kernel addresses are hidden (kptr_restrict): merge paths and throttle releases show as unknown".to_string()],
        )
    } else {
        compat::resolve_symbols(&kallsyms)
    };
    let aya_btf = aya::Btf::parse_file(Btf::kernel_path(), aya::Endianness::default())
        .context("cannot read the kernel's BTF")?;
    // A ring per CPU where events are sent; else the array only has to exist.
    let (ring_slots, wake_bytes) = rings.map_or((1, 0), |p| (p.slots, p.wake_bytes()));
    // The latency maps get one entry each where no latency is counted: their memory only
    // where it is.
    let latency_map = |entries: u32| if modes.latency != 0 { entries } else { 1 };
    let mut loader = EbpfLoader::new();
    if let Some(level) = verifier_log_level() {
        loader.verifier_log_level(level);
    }
    let ebpf = loader
        .btf(Some(&aya_btf))
        .override_global("OFFSETS", &offsets, true)
        .override_global("SYMBOLS", &symbols, true)
        .override_global("MODES", &modes, true)
        .override_global("METER_UNITS", meter_units, true)
        .override_global("TRACED", traced, true)
        .override_global("RING_WAKE_BYTES", &wake_bytes, true)
        .map_max_entries("EVENTS", ring_slots)
        .map_max_entries("LATENCY", latency_map(MAX_SLOTS + REMOVED_SLOTS))
        .map_max_entries("LATENCY_HASHED", latency_map(MAX_SLOTS))
        .map_max_entries("ISSUED_AT", latency_map(ISSUED_AT_ENTRIES))
        .map_max_entries(
            "ISSUE_SLOTS",
            latency_map(traced.count.max(1) * ISSUE_SLOTS_PER_DISK),
        )
        .load(object.bytes())
        .context("cannot load mergetrace's eBPF object")?;
    Ok(Loaded {
        ebpf,
        btf,
        aya_btf,
        kallsyms,
        notes,
    })
}

impl Loaded {
    fn attach_tracepoint(&mut self, hook: &Hook, p: &Program) -> Result<()> {
        let (prog, tp) = (&compat::program_variant(&self.btf, hook, p), hook.name);
        let t: &mut BtfTracePoint = program(&mut self.ebpf, prog)?.try_into()?;
        let started = std::time::Instant::now();
        if let Err(e) = t.load(tp, &self.aya_btf) {
            if let (true, ProgramError::LoadError { verifier_log, .. }) = (verifier_log(), &e) {
                eprintln!("mergetrace: the verifier's log of {prog}:\n{verifier_log}");
            }
            return Err(e)
                .with_context(|| format!("cannot load program {prog} for tracepoint {tp}"));
        }
        if verifier_log() {
            match t.info().ok().and_then(|i| i.verified_instruction_count()) {
                Some(n) => eprintln!("mergetrace: {prog}: the verifier went through {n} instructions ({} ms)", ms(started)),
                None => eprintln!("mergetrace: {prog}: loaded in {} ms (this kernel does not report how many instructions the verifier went through)", ms(started)),
            }
        }
        t.attach()
            .with_context(|| format!("cannot attach program {prog} to tracepoint {tp}"))?;
        Ok(())
    }

    /// Loads and attaches an fentry or fexit program on its function.
    fn attach_function(&mut self, hook: &Hook, p: &Program) -> Result<()> {
        let name = compat::program_variant(&self.btf, hook, p);
        let program = program(&mut self.ebpf, &name)?;
        if p.attach == Attach::Fexit {
            let f: &mut FExit = program.try_into()?;
            f.load(hook.name, &self.aya_btf)?;
            f.attach()?;
        } else {
            let f: &mut FEntry = program.try_into()?;
            f.load(hook.name, &self.aya_btf)?;
            f.attach()?;
        }
        Ok(())
    }

    /// The tracepoint tier: every program of its hooks this run needs. A tracepoint the
    /// kernel lacks is noted and skipped; one that cannot attach is an error.
    fn attach_tracepoints(&mut self, modes: Modes, wants: Wants) -> Result<()> {
        for (hook, p) in hooks::programs_of(TierKind::Tracepoint) {
            if !self.wanted(p, modes, wants) {
                continue;
            }
            if !self.btf.has_tracepoint(hook.name) {
                self.notes.push(format!(
                    "tracepoint {} does not exist on this kernel",
                    hook.name
                ));
                continue;
            }
            self.attach_tracepoint(hook, p)?;
        }
        Ok(())
    }

    /// `--stats`' empty program on `block_rq_issue` (outside the hook table: it watches the
    /// statistics, not the block layer), so that its ns/run tells what the statistics add.
    fn attach_stats_floor(&mut self) -> Result<()> {
        let t: &mut BtfTracePoint = program(&mut self.ebpf, STATS_FLOOR)?.try_into()?;
        t.load("block_rq_issue", &self.aya_btf)
            .and_then(|()| t.attach().map(drop))
            .with_context(|| format!("cannot attach program {STATS_FLOOR} to block_rq_issue"))
    }

    /// Whether this run attaches `p`: its need met ([`Needs::met`]) and its symbol known.
    fn wanted(&self, p: &Program, modes: Modes, wants: Wants) -> bool {
        p.needs.met(modes.emit != 0, wants)
            && p.symbol.is_none_or(|s| self.kallsyms.address(s).is_some())
    }

    /// The fentry tier's programs this run wants; the first failure is returned (and the
    /// caller falls back or reports it). Functions missing from BTF are skipped with a note.
    /// Wanting none, it still learns whether the kernel allows fentry: the tier's first
    /// program is attached for an instant.
    fn attach_fentry(&mut self, modes: Modes, wants: Wants) -> Result<()> {
        let mut done = std::collections::BTreeSet::new();
        let mut attached = 0;
        for (_, p) in hooks::programs_of(TierKind::Fentry) {
            if !done.insert(p.name) || !self.wanted(p, modes, wants) {
                continue;
            }
            attached += 1;
            let hook = match hooks::function_for(&self.btf, p.name) {
                Ok(hook) => hook,
                Err(names) => {
                    self.notes.push(format!(
                        "kernel function {names} is not traceable here (inlined or renamed): {} not attached",
                        p.name
                    ));
                    continue;
                }
            };
            let what = if p.attach == Attach::Fexit {
                "fexit"
            } else {
                "fentry"
            };
            self.attach_function(hook, p).with_context(|| {
                format!(
                    "cannot load/attach {what} program {} on {}",
                    p.name, hook.name
                )
            })?;
        }
        if attached == 0 {
            let (hook, p) = hooks::fentry_probe(&self.btf).map_err(anyhow::Error::msg)?;
            self.attach_function(hook, p).with_context(|| {
                format!(
                    "cannot load/attach fentry program {} on {}",
                    p.name, hook.name
                )
            })?;
            self.unload_fentry();
        }
        Ok(())
    }

    /// Unloads whatever fentry-tier programs did load (after a failed attempt).
    fn unload_fentry(&mut self) {
        let names = hooks::programs_of(TierKind::Fentry).flat_map(|(_, p)| p.object_names());
        for name in names {
            match self.ebpf.program_mut(&name) {
                Some(aya::programs::Program::FEntry(f)) => {
                    let _ = f.unload();
                }
                Some(aya::programs::Program::FExit(f)) => {
                    let _ = f.unload();
                }
                _ => {}
            }
        }
    }

    /// Attaches the fentry tier as asked: forced, or tried and given up on with the reason.
    fn choose_tier(&mut self, choice: TierChoice, modes: Modes, wants: Wants) -> Result<Tier> {
        let tier = |kind, reason: &str| Tier {
            kind,
            reason: reason.to_string(),
        };
        Ok(match choice {
            TierChoice::Tracepoint => tier(TierKind::Tracepoint, "chosen with --tier tracepoint"),
            TierChoice::Fentry => {
                self.attach_fentry(modes, wants)
                    .context("the fentry tier was forced with --tier fentry")?;
                tier(TierKind::Fentry, "chosen with --tier fentry")
            }
            TierChoice::Auto => match self.attach_fentry(modes, wants) {
                Ok(()) => tier(TierKind::Fentry, "fentry allowed"),
                Err(e) => {
                    self.unload_fentry();
                    tier(TierKind::Tracepoint, &short_reason(&e))
                }
            },
        })
    }
}

/// Reads the programs' aya-log records as they come and logs them (`log`, shown on stderr at
/// warn and above unless RUST_LOG says otherwise), until the process ends.
fn forward_ebpf_log(ebpf: &mut Ebpf) -> Result<()> {
    use tokio::io::{unix::AsyncFd, Interest};
    let logger = aya_log::EbpfLogger::init(ebpf).context("cannot read the programs' log")?;
    let runtime = tokio::runtime::Handle::try_current()
        .context("--ebpf-log needs the tokio runtime of a live, record or serve run")?;
    let _guard = runtime.enter();
    // SAFETY: the AsyncFd owns the logger and its ring buffer, so the fd stays open while
    // registered.
    let mut logger = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("cannot wait on the programs' log")?;
    runtime.spawn(async move {
        while let Ok(mut ready) = logger.readable_mut().await {
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    });
    Ok(())
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} missing from the eBPF object"))
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

/// `MERGETRACE_VERIFIER_LOG=1`: the verifier's statistics for each tracepoint program it
/// accepts (instructions it went through: the programs' loops must stay well under its
/// limit on every kernel; and the load's time) and its log for one it refuses.
fn verifier_log() -> bool {
    verifier_log_level().is_some()
}

/// `MERGETRACE_VERIFIER_LOG=1`: the statistics; `=2`: every instruction the verifier
/// followed too, for a program it refuses (where it stopped, and the registers it knew).
fn verifier_log_level() -> Option<aya::VerifierLogLevel> {
    match std::env::var_os("MERGETRACE_VERIFIER_LOG")?.to_str()? {
        "1" => Some(aya::VerifierLogLevel::STATS),
        "2" => Some(aya::VerifierLogLevel::VERBOSE | aya::VerifierLogLevel::STATS),
        _ => None,
    }
}

/// Milliseconds since `t` (the log's load times: what a start costs, program by program).
fn ms(t: std::time::Instant) -> u128 {
    t.elapsed().as_millis()
}

/// What a run wants beside its per-request counting (see [`hooks::Want`]): what its flags ask
/// for, and what the traced disks need — each bio where blk-throttle has rules on one (its
/// charges, who waited) or one is bio-based, each bio merge where io.cost is on. The
/// merge-path oracle (`MERGETRACE_MERGE_PATH_FROM_STACK`) wants each bio and each merge.
fn run_wants(
    devices: &[Device],
    asked: Wants,
    iocost: &BTreeMap<u32, crate::sys::iocost::Iocost>,
    modes: Modes,
) -> Wants {
    let rules = crate::model::limits::rules_on(devices);
    let oracle = modes.merge_path_from_stack != 0;
    Wants {
        bios: asked.bios || rules || oracle || devices.iter().any(|d| d.bio_based),
        bio_merges: asked.bio_merges || oracle || !iocost.is_empty(),
        throttle: asked.throttle || rules,
        ..asked
    }
}

/// Programs loaded and attached; dropping it detaches everything.
pub struct Session {
    ebpf: Option<Ebpf>,
    pub tier: Tier,
    /// What the run attached beside its per-request counting (a full capture: everything).
    pub wants: Wants,
    /// The merge-path oracle runs (`MERGETRACE_MERGE_PATH_FROM_STACK`): bios and merge paths
    /// are to be shown from the per-bio events.
    pub per_bio: bool,
    /// Things the user should know (missing symbols, fallbacks).
    pub notes: Vec<String>,
    /// The event rings, a ring per possible CPU (where events are sent).
    rings: Vec<CpuRing>,
    /// The programs' batches on the way to the rings (where events are sent in batches).
    batches: Option<Batches>,
    lost: PerCpuArray<MapData, u64>,
    lost_seen: [u64; LOST_SLOTS as usize],
    /// The in-kernel counters and `--latency` histograms: slots, the hash maps of keys
    /// without one, removed cgroups'.
    slots: Slots,
    /// Cgroup births and removals in the traced hierarchy.
    cgroup_ring: RingBuf<MapData>,
    /// Removed cgroups whose counters are not reclaimed yet: when the removal was seen.
    removed: HashMap<u64, u64>,
    reclaim_after_ns: u64,
    /// Births and removals the name table has not taken yet ([`Session::take_cgroup_changes`]).
    changes: Vec<CgroupChange>,
    /// Plug flushes by `mergetrace_common::unplug_slot`.
    unplugs: PerCpuArray<MapData, u64>,
    /// The traced disks' `dev_t`s, by their slot in the programs' per-disk maps.
    devs: Vec<u32>,
    /// io.cost on the traced disks that had it on when the run started, by `dev_t`.
    pub iocost: BTreeMap<u32, crate::sys::iocost::Iocost>,
    /// wbt on the traced disks whose queue has it (on or off), by `dev_t`.
    pub wbt: BTreeMap<u32, crate::sys::wbt::Wbt>,
    /// `--latency`'s issue entries, for the requests left unfinished at the end.
    issue_entries: Option<IssueEntries>,
    /// The runs the kernel skipped, by program, as [`Session::detach`] found them.
    skipped: BTreeMap<String, u64>,
    /// Held while BPF run-time statistics are on (closing it turns them off).
    _stats: Option<std::os::fd::OwnedFd>,
}

impl Session {
    /// The charge model of each disk with io.cost on, by `dev_t` (what a snapshot prices).
    pub fn iocost_models(&self) -> BTreeMap<u32, crate::model::iocost::Model> {
        self.iocost
            .iter()
            .map(|(dev, c)| (*dev, c.model()))
            .collect()
    }

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
        let mut iocost = BTreeMap::new();
        let mut wbt = BTreeMap::new();
        for (slot, d) in devices.iter().enumerate() {
            if let Some(w) = crate::sys::wbt::of(d) {
                wbt.insert(d.dev().0, w);
            }
            traced.devs[slot] = d.dev().0;
            traced.bio_based[slot] = d.bio_based as u32;
            if let Some(c) = crate::sys::iocost::of(d) {
                traced.iocost[slot] = c.rule_bits();
                iocost.insert(d.dev().0, c);
            }
        }
        let mut modes = opts.modes;
        // A testing knob: tell each bio merge's path from the kernel stack, per bio (the
        // oracle the per-request paths are tested against).
        modes.merge_path_from_stack =
            std::env::var("MERGETRACE_MERGE_PATH_FROM_STACK").is_ok_and(|v| v == "1") as u32;
        // Another: the completions of requests at this sector go unseen, as the kernel
        // sometimes lets them (what `completion_unseen` is tested with).
        modes.skip_completions_at = std::env::var("MERGETRACE_SKIP_COMPLETIONS_AT_SECTOR")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(0, |s| s.saturating_add(1));
        let wants = run_wants(devices, opts.wants, &iocost, modes);
        // Latency histograms are counted, not sent: a capture has the events for them.
        modes.latency = (wants.latency && modes.aggregate != 0) as u32;
        traced.any_iocost = !iocost.is_empty() as u32;
        modes.cgroup_hierarchy = std::fs::read_to_string("/proc/cgroups")
            .ok()
            .and_then(|t| crate::sys::cgroups::io_hierarchy_id(&t))
            .map_or(0, |h| h + 1);
        // Batches are guarded against interrupts, not against a program preempted by another
        // task's on the same CPU, which a real-time kernel allows.
        modes.staged = (modes.emit != 0 && !preemptible_tracepoints()) as u32;
        let ring_plan = if modes.emit != 0 {
            Some(rings::Plan::for_this_machine(opts.ring_bytes)?)
        } else {
            None
        };
        let mut loaded = load_object(modes, ring_plan.as_ref(), &opts.meter_units, &traced)?;
        loaded.attach_tracepoints(opts.modes, wants)?;
        if opts.stats {
            loaded.attach_stats_floor()?;
        }
        let tier = loaded.choose_tier(opts.tier, opts.modes, wants)?;
        let Loaded {
            mut ebpf, notes, ..
        } = loaded;
        if opts.ebpf_log {
            forward_ebpf_log(&mut ebpf)?;
        }
        // Loaded before the rings are installed: it refers to the rings' array, whose
        // descriptor the installation closes.
        let batches = if modes.staged != 0 {
            Some(Batches::take(&mut ebpf)?)
        } else {
            None
        };
        let rings = match &ring_plan {
            Some(plan) => rings::install(&mut ebpf, plan)?,
            None => Vec::new(),
        };
        let lost = PerCpuArray::try_from(ebpf.take_map("LOST").context("LOST map missing")?)?;
        let unplugs =
            PerCpuArray::try_from(ebpf.take_map("UNPLUGS").context("UNPLUGS map missing")?)?;
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("{name} map missing"))
        };
        let devs: Vec<u32> = devices.iter().map(|d| d.dev().0).collect();
        let counters = Table::<Counters>::new(
            PerCpuHashMap::try_from(take("COUNTS")?)?,
            PerCpuArray::try_from(take("COUNTERS")?)?,
            ["COUNTS", "COUNTERS"],
        );
        let latency = if modes.latency != 0 {
            Some(Table::<LatencyHist>::new(
                PerCpuHashMap::try_from(take("LATENCY_HASHED")?)?,
                PerCpuArray::try_from(take("LATENCY")?)?,
                ["LATENCY_HASHED", "LATENCY"],
            ))
        } else {
            None
        };
        let slots = Slots::new(
            counters,
            latency,
            BpfHashMap::try_from(take("SLOT_OF")?)?,
            Array::try_from(take("SLOT_GEN")?)?,
            devs.clone(),
        )?;
        let cgroup_ring = RingBuf::try_from(take("CGROUP_EVENTS")?)?;
        let issue_entries = if modes.latency != 0 {
            Some(IssueEntries::take(&mut ebpf, devices)?)
        } else {
            None
        };
        if !opts.hooks_only {
            open_gate(&mut ebpf)?;
        }
        Ok(Session {
            ebpf: Some(ebpf),
            tier,
            wants,
            per_bio: modes.merge_path_from_stack != 0,
            notes,
            rings,
            batches,
            lost,
            lost_seen: [0; LOST_SLOTS as usize],
            slots,
            cgroup_ring,
            removed: HashMap::new(),
            reclaim_after_ns: opts.reclaim_after.as_nanos() as u64,
            changes: Vec::new(),
            unplugs,
            devs,
            iocost,
            wbt,
            issue_entries,
            skipped: BTreeMap::new(),
            _stats: stats,
        })
    }

    /// The event rings and the programs' batches on their way there (once; empty where no
    /// events are sent).
    pub fn take_rings(&mut self) -> (Vec<CpuRing>, Option<Batches>) {
        (std::mem::take(&mut self.rings), self.batches.take())
    }

    /// The in-kernel counters so far (summed over CPUs) and every loss so far: a running
    /// total of the whole run; `Window::since` gives intervals. Readable after `detach`.
    /// Each call also gives the keys counted so far in the hash map a slot (the programs
    /// then count them in an array, without a hash lookup per event), and reclaims the
    /// counters of cgroups removed `reclaim_after` ago or more: from the next call on they
    /// are part of the device's `REMOVED_CGROUP` key (see [`Window::since`]). Take the cgroup
    /// births ([`Session::take_cgroup_changes`]) after it, so that they name every cgroup it
    /// counted.
    pub fn read_totals(&mut self) -> Result<Window> {
        self.poll_cgroups();
        let now = super::monotonic_ns();
        let (removed, grace) = (&self.removed, self.reclaim_after_ns);
        let totals = self.slots.totals(|id| {
            removed
                .get(&id)
                .is_some_and(|t| now.saturating_sub(*t) >= grace)
        })?;
        // Removals whose cgroup holds nothing (any more) need not be remembered.
        let counted: HashSet<u64> = (totals.counts.iter().map(|(k, _)| k.cgroup_id))
            .chain(totals.latency.iter().map(|(k, _)| k.cgroup_id))
            .collect();
        self.removed
            .retain(|id, t| counted.contains(id) || now.saturating_sub(*t) < grace);
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
        let mut w = Window::from_kernel(totals.counts, unplugs);
        w.latency = (totals.latency.iter())
            .map(|(k, h)| (Window::key_of(k), *h))
            .collect();
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

    /// Gives the keys counted since the last read a counter slot, without reading counters
    /// (see `Slots::adopt`): call it often (every [`ADOPT_EVERY`]), reads as often as the
    /// views want.
    pub fn adopt_new_keys(&mut self) -> Result<()> {
        self.slots.adopt()
    }

    /// Reads the cgroup births and removals the programs reported since the last call.
    pub fn poll_cgroups(&mut self) {
        let now = super::monotonic_ns();
        for c in cgroup_events::drain(&mut self.cgroup_ring) {
            if let CgroupChange::Removed { id } = c {
                self.removed.entry(id).or_insert(now);
            }
            self.changes.push(c);
        }
        // A caller that never takes them (no names to keep) must not make this grow.
        if self.changes.len() > MAX_PENDING_CHANGES {
            self.changes.drain(..MAX_PENDING_CHANGES / 2);
        }
    }

    /// The births and removals since the last call, oldest first, for the name table.
    pub fn take_cgroup_changes(&mut self) -> Vec<CgroupChange> {
        self.poll_cgroups();
        std::mem::take(&mut self.changes)
    }

    /// Notes that cgroup `id` no longer exists although no removal was reported (it was
    /// removed before the run, or its report was lost): its counters are reclaimed as if.
    pub fn mark_removed(&mut self, id: u64) {
        self.removed.entry(id).or_insert_with(super::monotonic_ns);
    }

    /// Entries of `SLOT_OF`: keys with a slot of their own, and keys being reclaimed.
    pub fn slot_entries(&self) -> (usize, usize) {
        self.slots.len()
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
    pub fn program_stats(&self) -> Vec<ProgramStat> {
        let Some(ebpf) = &self.ebpf else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, prog) in ebpf.programs() {
            let Ok(info) = prog.info() else { continue };
            let runs = info.run_count();
            let ns = info.run_time().as_nanos() as u64;
            if runs > 0 {
                out.push(ProgramStat {
                    program: name.to_string(),
                    runs,
                    run_time_ns: ns,
                    ns_per_run: ns as f64 / runs as f64,
                });
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.run_time_ns));
        out
    }

    /// Detaches and unloads every program. Maps stay readable (the ring can be drained).
    pub fn detach(&mut self) {
        if let Some(mut ebpf) = self.ebpf.take() {
            // All stop at one moment, as they started (the programs then detach one by one).
            // Should it fail, detaching still stops them.
            let _ = set_gate(&mut ebpf, 0);
            self.skipped = unfinished::skipped_runs(&ebpf);
        }
    }

    /// The runs the kernel skipped so far, by program, of the programs it skipped any of
    /// (after [`Session::detach`], as it found them).
    pub fn skipped_runs(&self) -> BTreeMap<String, u64> {
        match &self.ebpf {
            Some(ebpf) => unfinished::skipped_runs(ebpf),
            None => self.skipped.clone(),
        }
    }

    /// What the run's end leaves unsaid (call after [`Session::detach`]): the runs the
    /// kernel skipped, by program, and with `--latency` the requests issued whose completion
    /// no program saw.
    pub fn unsaid(&self) -> Result<Unsaid> {
        let unfinished_requests = match &self.issue_entries {
            Some(e) => Some(e.unfinished()?),
            None => None,
        };
        Ok(Unsaid {
            skipped_runs: self.skipped_runs(),
            unfinished_requests,
        })
    }
}

/// A real-time kernel (PREEMPT_RT) may preempt a tracepoint's programs.
fn preemptible_tracepoints() -> bool {
    std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|v| v.trim() == "1")
}

/// Lets the programs start, all at one moment: every one of the run is attached and the rings
/// are installed (the programs do nothing before; `read::ready` in the eBPF crate).
fn open_gate(ebpf: &mut Ebpf) -> Result<()> {
    set_gate(ebpf, 1).context("cannot start the programs (GATE map)")
}

/// `GATE` = `open`: 1, the programs run; 0, they return at once.
fn set_gate(ebpf: &mut Ebpf, open: u32) -> Result<()> {
    let mut gate: Array<_, u32> =
        Array::try_from(ebpf.map_mut("GATE").context("GATE map missing")?)?;
    Ok(gate.set(0, open, 0)?)
}

/// Whether this kernel lets mergetrace attach fentry programs: loads the object as a counting
/// run would and attaches [`hooks::fentry_probe`]'s program for an instant. `Ok(Some(f))`: it
/// attached to function `f`. `Ok(None)`: the
/// kernel refused with EPERM (a policy such as lockdown or a BPF LSM — call this only with
/// privileges, or EPERM means just that). `Err`: any other failure, with the errno and the
/// verifier's first line.
pub fn fentry_allowed(btf: &Btf) -> Result<Option<&'static str>, String> {
    let (hook, p) = hooks::fentry_probe(btf)?;
    let modes = Modes::COUNTING;
    let refused = |e: &anyhow::Error| errno(e) == Some(libc::EPERM);
    let traced = TracedDevices::default();
    let mut loaded = match load_object(modes, None, &MeterUnits::default(), &traced) {
        Ok(l) => l,
        Err(e) if refused(&e) => return Ok(None),
        Err(e) => return Err(format!("{e:#}")),
    };
    let f: &mut FEntry = program(&mut loaded.ebpf, p.name)
        .and_then(|prog| Ok(prog.try_into()?))
        .map_err(|e| format!("{e:#}"))?;
    if let Err(e) = f.load(hook.name, &loaded.aya_btf) {
        let e = anyhow::Error::from(e);
        if refused(&e) {
            return Ok(None);
        }
        return Err(format!(
            "loading an fentry program on {}: {}",
            hook.name,
            probe_failure(&e)
        ));
    }
    match f.attach() {
        Ok(_) => Ok(Some(hook.name)),
        Err(e) => {
            let e = anyhow::Error::from(e);
            if refused(&e) {
                return Ok(None);
            }
            Err(format!(
                "attaching an fentry program to {}: {}",
                hook.name,
                probe_failure(&e)
            ))
        }
    }
}

/// The errno somewhere in an error's causes.
fn errno(e: &anyhow::Error) -> Option<i32> {
    e.chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
}

/// "EINVAL", with the verifier's first line where it said something: "EACCES (R1 ...)".
fn probe_failure(e: &anyhow::Error) -> String {
    let name = match errno(e) {
        Some(libc::EACCES) => "EACCES".to_string(),
        Some(libc::EINVAL) => "EINVAL".to_string(),
        Some(libc::ENOENT) => "ENOENT".to_string(),
        Some(524) => "ENOTSUPP".to_string(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".to_string(),
        Some(libc::ESRCH) => "ESRCH".to_string(),
        Some(libc::E2BIG) => "E2BIG".to_string(),
        _ => e.root_cause().to_string(),
    };
    let verifier = e
        .chain()
        .find_map(|c| match c.downcast_ref::<ProgramError>() {
            Some(ProgramError::LoadError { verifier_log, .. }) => verifier_log
                .to_string()
                .lines()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string),
            _ => None,
        });
    match verifier {
        Some(first) => format!("{name} ({first})"),
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fentry_probe_needs_the_target_in_btf() {
        use crate::kernel::btf::tests::Builder;
        let mut b = Builder::new();
        b.int("int", 4);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(
            fentry_allowed(&btf),
            Err("__blk_throtl_bio or blk_throtl_bio is not in this kernel's BTF".into())
        );
    }
}
