//! The embedded eBPF object, loaded for the running kernel, and its programs attached as the
//! hook table says ([`compat::hooks`]): every tracepoint-tier program a run needs, then the
//! fentry tier's where it is chosen or allowed. Programs a run may need later (once a traced
//! disk shows blk-throttle rules) are loaded at the start and attached then ([`Deferred`]).
use anyhow::{Context, Result};
use aya::{
    maps::Array,
    programs::{BtfTracePoint, FEntry, FExit, ProgramError},
    Ebpf, EbpfLoader,
};
use mergetrace_common::{
    latency::{ISSUED_AT_ENTRIES, ISSUE_SLOTS_PER_DISK},
    KernelSymbols, MeterUnits, Modes, TracedDevices, FROZEN_DISKS, MAX_SLOTS,
    UNPLUG_SLOTS_PER_DISK,
};

use super::{
    btf::Btf,
    compat::{
        self,
        hooks::{self, Attach, Hook, Needs, Program, Wants},
        Kallsyms,
    },
    rings, Tier, TierChoice, TierKind,
};

/// The eBPF object built by build.rs from mergetrace-ebpf.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mergetrace"));

/// `--stats`' empty program: its ns/run is what the kernel's statistics add to every run.
pub const STATS_FLOOR: &str = "stats_floor";

/// The object loaded (maps created, nothing attached) for this kernel, with what the programs
/// read from it: offsets from BTF, addresses from kallsyms.
pub(super) struct Loaded {
    pub ebpf: Ebpf,
    btf: Btf,
    aya_btf: aya::Btf,
    kallsyms: Kallsyms,
    /// Things the user should know (missing symbols).
    pub notes: Vec<String>,
}

/// `rings`: the event rings' plan where events are sent (`modes.emit`), else `None`;
/// `unplugs`: plug flushes are counted (`--plug-flushes`).
pub(super) fn load_object(
    modes: Modes,
    rings: Option<&rings::Plan>,
    meter_units: &MeterUnits,
    traced: &TracedDevices,
    unplugs: bool,
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
    let slots = traced.slots.max(1);
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
        .map_max_entries("LATENCY", latency_map(MAX_SLOTS))
        .map_max_entries("LATENCY_HASHED", latency_map(MAX_SLOTS))
        .map_max_entries("ISSUED_AT", latency_map(ISSUED_AT_ENTRIES))
        .map_max_entries(
            "ISSUE_SLOTS",
            latency_map(slots.min(FROZEN_DISKS as u32) * ISSUE_SLOTS_PER_DISK),
        )
        // Per disk slot.
        .map_max_entries("DISKS", slots)
        .map_max_entries("DISK_CONFIG", slots)
        .map_max_entries("DISK_SLOTS", slots)
        .map_max_entries("SLOT_OWNERS", slots)
        .map_max_entries(
            "UNPLUGS",
            if unplugs {
                slots * UNPLUG_SLOTS_PER_DISK
            } else {
                1
            },
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
    /// Loads (the verifier checks it) a tracepoint program for `hook`, without attaching it;
    /// returns its name in the object.
    fn load_tracepoint(&mut self, hook: &Hook, p: &Program) -> Result<String> {
        let (prog, tp) = (compat::program_variant(&self.btf, hook, p), hook.name);
        let t: &mut BtfTracePoint = program(&mut self.ebpf, &prog)?.try_into()?;
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
        Ok(prog)
    }

    fn attach_tracepoint(&mut self, hook: &Hook, p: &Program) -> Result<()> {
        let prog = self.load_tracepoint(hook, p)?;
        attach_loaded(&mut self.ebpf, &prog, p.attach)
            .with_context(|| format!("cannot attach program {prog} to tracepoint {}", hook.name))
    }

    /// Loads an fentry or fexit program on its function, without attaching it; returns its
    /// name in the object.
    fn load_function(&mut self, hook: &Hook, p: &Program) -> Result<String> {
        let name = compat::program_variant(&self.btf, hook, p);
        let program = program(&mut self.ebpf, &name)?;
        if p.attach == Attach::Fexit {
            let f: &mut FExit = program.try_into()?;
            f.load(hook.name, &self.aya_btf)?;
        } else {
            let f: &mut FEntry = program.try_into()?;
            f.load(hook.name, &self.aya_btf)?;
        }
        Ok(name)
    }

    /// Loads and attaches an fentry or fexit program on its function.
    fn attach_function(&mut self, hook: &Hook, p: &Program) -> Result<()> {
        let name = self.load_function(hook, p)?;
        attach_loaded(&mut self.ebpf, &name, p.attach)
    }

    /// The programs a run that wants `now` may attach later, when it wants more, up to
    /// `later` (a traced disk shows blk-throttle rules, io.cost is switched on for one): the
    /// tracepoint tier's, and the fentry tier's where `tier` is it. They are loaded here, at the start (the verifier takes its time),
    /// and listed in the order they are to attach: the hook table's, reversed, so that each
    /// program is there before those that run earlier in a bio's life (a bio seen entering
    /// is seen leaving).
    pub(super) fn load_deferred(
        &mut self,
        tier: TierKind,
        modes: Modes,
        now: Wants,
        later: Wants,
    ) -> Result<Deferred> {
        let emit = modes.emit != 0;
        let mut programs = Vec::new();
        let mut done = std::collections::BTreeSet::new();
        for (hook, p) in hooks::programs_of(TierKind::Tracepoint) {
            if self.wanted(p, modes, later)
                && !p.needs.met(emit, now)
                && self.btf.has_tracepoint(hook.name)
            {
                programs.push((self.load_tracepoint(hook, p)?, p.attach, p.needs));
            }
        }
        if tier == TierKind::Fentry {
            for (_, p) in hooks::programs_of(TierKind::Fentry) {
                if !done.insert(p.name) || !self.wanted(p, modes, later) || p.needs.met(emit, now) {
                    continue;
                }
                // A function the kernel lacks was noted when the tier was attached.
                if let Ok(hook) = hooks::function_for(&self.btf, p.name) {
                    programs.push((self.load_function(hook, p)?, p.attach, p.needs));
                }
            }
        }
        programs.reverse();
        Ok(Deferred { programs, emit })
    }

    /// The tracepoint tier: every program of its hooks this run needs. A tracepoint the
    /// kernel lacks is noted and skipped; one that cannot attach is an error.
    pub(super) fn attach_tracepoints(&mut self, modes: Modes, wants: Wants) -> Result<()> {
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
    pub(super) fn attach_stats_floor(&mut self) -> Result<()> {
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
    pub(super) fn choose_tier(
        &mut self,
        choice: TierChoice,
        modes: Modes,
        wants: Wants,
    ) -> Result<Tier> {
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

/// Programs loaded at the start and attached later ([`Loaded::load_deferred`]), when the run
/// comes to want them.
pub struct Deferred {
    /// Their names in the object, in the order they attach, with what they need.
    programs: Vec<(String, Attach, Needs)>,
    emit: bool,
}

impl Deferred {
    /// Attaches those a run that wants `wants` needs and that are not attached yet; the gate
    /// is open already, so each counts from its attach.
    pub fn attach_wanted(&mut self, ebpf: &mut Ebpf, wants: Wants) -> Result<()> {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.programs)
            .into_iter()
            .partition(|(_, _, needs)| needs.met(self.emit, wants));
        self.programs = later;
        for (name, how, _) in now {
            attach_loaded(ebpf, &name, how)
                .with_context(|| format!("cannot attach program {name}"))?;
        }
        Ok(())
    }
}

/// Attaches the loaded program `name`.
fn attach_loaded(ebpf: &mut Ebpf, name: &str, how: Attach) -> Result<()> {
    let p = program(ebpf, name)?;
    match how {
        Attach::Tracepoint => {
            let t: &mut BtfTracePoint = p.try_into()?;
            t.attach()?;
        }
        Attach::Fentry => {
            let f: &mut FEntry = p.try_into()?;
            f.attach()?;
        }
        Attach::Fexit => {
            let f: &mut FExit = p.try_into()?;
            f.attach()?;
        }
    }
    Ok(())
}

/// Reads the programs' aya-log records as they come and logs them (`log`, shown on stderr at
/// warn and above unless RUST_LOG says otherwise), until the process ends.
pub(super) fn forward_ebpf_log(ebpf: &mut Ebpf) -> Result<()> {
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

/// Sets the `GATE` map's bits (`mergetrace_common::gate`). The programs run while `OPEN` is
/// set: from when every one of the run is attached and the rings are installed (they do
/// nothing before; `read::ready` in the eBPF crate), to the run's end: all at one moment.
pub(super) fn set_gate(ebpf: &mut Ebpf, bits: u32) -> Result<()> {
    let mut gate: Array<_, u32> =
        Array::try_from(ebpf.map_mut("GATE").context("GATE map missing")?)?;
    Ok(gate.set(0, bits, 0)?)
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
    let mut loaded = match load_object(modes, None, &MeterUnits::default(), &traced, false) {
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
