//! A run's programs in the kernel ([`Session`]): loaded and attached for the traced disks
//! ([`super::attach`]), their counters read, cgroup births and removals followed, and every
//! program stopped at once at the end.
use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    Ebpf,
};
use mergetrace_common::{
    gate, latency::LatencyHist, Counters, DiskConfig, MeterUnits, Modes, LOST_SLOTS, MAX_SLOTS,
};

use super::{
    attach::{self, load_object, Deferred, Loaded},
    cgroup_events::{self, CgroupChange, Report},
    check_privileges,
    compat::hooks::{Want, Wants},
    disks::{read_unplugs, write_disk_config, DiskPlan},
    rings::{self, Batches, CpuRing},
    slots::{Slots, Table},
    unfinished::{self, IssueEntries},
    Tier, TierChoice,
};
use crate::{
    model::{
        aggregate::Window,
        snapshot::{ProgramStat, Unsaid},
    },
    sys::device::Device,
};

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
    /// Every disk takes a slot at its first event, so that one that appears during the run is
    /// counted from its first bio; the caller says which to trace ([`Session::new_disks`],
    /// [`Session::ignore_disk`]). The disks present now and not traced are ignored from the
    /// start.
    pub every_disk: bool,
}

/// What a run wants beside its per-request counting (see [`Want`]): what its flags ask for,
/// and what the traced disks need — where blk-throttle has `rules` on one, which bios waited
/// and how long (their charges are counted per request in every run); where one is
/// bio-based, each bio (no request carries them); each bio merge where `iocost` is on for
/// one. The
/// merge-path oracle (`MERGETRACE_MERGE_PATH_FROM_STACK`) wants each bio and each merge.
fn run_wants(devices: &[Device], asked: Wants, iocost: bool, modes: Modes, rules: bool) -> Wants {
    let oracle = modes.merge_path_from_stack != 0;
    Wants {
        bios: asked.bios || rules || oracle || devices.iter().any(|d| d.bio_based),
        bio_merges: asked.bio_merges || oracle || iocost,
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
    unplugs: Option<PerCpuArray<MapData, u64>>,
    /// The disks' `dev_t`s, by their slot in the programs' per-disk maps (0: a free slot).
    devs: Vec<u32>,
    /// Which disk owns each slot taken (`SLOT_OWNERS`): where disks found during the run are
    /// read from.
    slot_owners: Option<BpfHashMap<MapData, u32, u32>>,
    /// io.cost on the traced disks that had it on when the run started, by `dev_t`.
    pub iocost: BTreeMap<u32, crate::sys::iocost::Iocost>,
    /// wbt on the traced disks whose queue has it (on or off), by `dev_t`.
    pub wbt: BTreeMap<u32, crate::sys::wbt::Wbt>,
    /// `--latency`'s issue entries, for the requests left unfinished at the end.
    issue_entries: Option<IssueEntries>,
    /// Programs loaded to attach when the run comes to want them (rules seen on a traced
    /// disk, io.cost switched on for one).
    deferred: Deferred,
    /// What the programs are told of each traced disk, by slot (`DISK_CONFIG`).
    config: Vec<DiskConfig>,
    /// The gate's bits (`mergetrace_common::gate`).
    gate: u32,
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
        let disks = DiskPlan::new(devices, opts.every_disk)?;
        let mut iocost = BTreeMap::new();
        let mut wbt = BTreeMap::new();
        let mut config = disks.config.clone();
        for (slot, d) in devices.iter().enumerate() {
            if let Some(w) = crate::sys::wbt::of(d) {
                wbt.insert(d.dev().0, w);
            }
            if let Some(ioc) = crate::sys::iocost::of(d) {
                config[slot].iocost = ioc.rule_bits();
                iocost.insert(d.dev().0, ioc);
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
        let rules = crate::sys::throttle::rules_on(devices);
        let wants = run_wants(devices, opts.wants, !iocost.is_empty(), modes, rules);
        // What the run may want later: when a traced disk shows blk-throttle rules, or io.cost
        // is switched on for one.
        let later = run_wants(devices, opts.wants, true, modes, true);
        // Latency histograms are counted, not sent: a capture has the events for them.
        modes.latency = (wants.latency && modes.aggregate != 0) as u32;
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
        let counts_unplugs = wants.plug_flushes && modes.aggregate != 0;
        let mut loaded = load_object(
            modes,
            ring_plan.as_ref(),
            &opts.meter_units,
            &disks.traced,
            counts_unplugs,
        )?;
        loaded.attach_tracepoints(opts.modes, wants)?;
        if opts.stats {
            loaded.attach_stats_floor()?;
        }
        let tier = loaded.choose_tier(opts.tier, opts.modes, wants)?;
        let deferred = loaded.load_deferred(tier.kind, opts.modes, wants, later)?;
        let Loaded {
            mut ebpf, notes, ..
        } = loaded;
        if opts.ebpf_log {
            attach::forward_ebpf_log(&mut ebpf)?;
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
        let unplugs = if counts_unplugs {
            Some(PerCpuArray::try_from(
                ebpf.take_map("UNPLUGS").context("UNPLUGS map missing")?,
            )?)
        } else {
            None
        };
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("{name} map missing"))
        };
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
            PerCpuHashMap::try_from(take("UNATTRIBUTED")?)?,
        )?;
        let cgroup_ring = RingBuf::try_from(take("CGROUP_EVENTS")?)?;
        let slot_owners = disks.register(&mut ebpf)?;
        let issue_entries = if modes.latency != 0 {
            Some(IssueEntries::take(&mut ebpf, devices)?)
        } else {
            None
        };
        write_disk_config(&mut ebpf, &config)?;
        let gate = gate_of(&config, !opts.hooks_only);
        attach::set_gate(&mut ebpf, gate).context("cannot start the programs (GATE map)")?;
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
            devs: disks.devs,
            slot_owners,
            iocost,
            wbt,
            issue_entries,
            deferred,
            config,
            gate,
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
        // With half the slots taken, removed cgroups are reclaimed at once (once a read has
        // shown them): under churn the slots go to new cgroups rather than to the grace.
        let grace = if self.slots_under_pressure() {
            0
        } else {
            self.reclaim_after_ns
        };
        let removed = &self.removed;
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
        let unplugs = match &self.unplugs {
            Some(map) => read_unplugs(map, &self.devs)?,
            None => Vec::new(),
        };
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

    /// Half the counter slots or more are taken: removed cgroups are then reclaimed at the
    /// first read that has shown them, and `serve` reads more often.
    pub fn slots_under_pressure(&self) -> bool {
        self.slots.len().0 >= MAX_SLOTS as usize / 2
    }

    /// Gives the keys counted since the last read a counter slot, without reading counters
    /// (see `Slots::adopt`): call it often (every [`ADOPT_EVERY`]), reads as often as the
    /// views want.
    pub fn adopt_new_keys(&mut self) -> Result<()> {
        self.slots.adopt()
    }

    /// Reads what the programs reported since the last call: cgroup births and removals, and
    /// blk-throttle rules found on a traced disk for the first time — then the programs that
    /// tell which bios waited are attached.
    pub fn poll_cgroups(&mut self) {
        let now = super::monotonic_ns();
        for report in cgroup_events::drain(&mut self.cgroup_ring) {
            let c = match report {
                Report::Cgroup(c) => c,
                Report::RulesSeen { .. } => {
                    self.attach_deferred();
                    continue;
                }
            };
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

    /// Disks that took a slot since the last call (`Options::every_disk`), by `dev_t`: each is
    /// to be traced ([`Session::trace_disk`]) or ignored ([`Session::ignore_disk`]).
    pub fn new_disks(&mut self) -> Result<Vec<u32>> {
        let Some(owners) = &self.slot_owners else {
            return Ok(Vec::new());
        };
        let mut new = Vec::new();
        for item in owners.iter() {
            let (slot, dev) = item.context("cannot read the SLOT_OWNERS map")?;
            let Some(known) = self.devs.get_mut(slot as usize) else {
                continue;
            };
            if *known == 0 {
                *known = dev;
                new.push(dev);
            }
        }
        Ok(new)
    }

    /// Whether disks that appear during the run take a slot (`Options::every_disk`).
    pub fn follows_new_disks(&self) -> bool {
        self.slot_owners.is_some()
    }

    /// From now on the programs count nothing of disk `dev` (it took a slot, and the run
    /// does not trace it).
    pub fn ignore_disk(&mut self, dev: u32) -> Result<()> {
        self.configure(dev, |c| c.ignored = 1)
    }

    /// Disk `d`, found during the run, is traced: the programs are told what it is.
    pub fn trace_disk(&mut self, d: &Device) -> Result<()> {
        if let Some(w) = crate::sys::wbt::of(d) {
            self.wbt.insert(d.dev().0, w);
        }
        self.configure(d.dev().0, |c| c.bio_based = d.bio_based as u32)
    }

    /// Changes what the programs are told of disk `dev` (nothing if it has no slot).
    fn configure(&mut self, dev: u32, change: impl FnOnce(&mut DiskConfig)) -> Result<()> {
        let Some(slot) = self.devs.iter().position(|d| *d == dev) else {
            return Ok(());
        };
        change(&mut self.config[slot]);
        let Some(ebpf) = self.ebpf.as_mut() else {
            return Ok(());
        };
        write_disk_config(ebpf, &self.config)
    }

    /// A waker for the run's loop: ready when the programs reported something
    /// ([`Session::poll_cgroups`] then acts on it).
    pub fn report_waker(&self) -> Result<cgroup_events::ReportWaker> {
        cgroup_events::ReportWaker::new(&self.cgroup_ring)
            .context("cannot watch the programs' reports (CGROUP_EVENTS)")
    }

    /// Attaches the programs the run wants once blk-throttle has rules on a traced disk
    /// (which bios waited, and how long), if they are not attached yet. A failure is a note:
    /// the charges go on being counted, per request.
    fn attach_deferred(&mut self) {
        if let Err(e) = self.want(|w| w.throttle = true) {
            self.notes.push(format!(
                "blk-throttle rules appeared, but which bios waited cannot be told: {e:#}"
            ));
        }
    }

    /// The run wants more from now on (`more` sets it): the deferred programs that need it
    /// are attached.
    fn want(&mut self, more: impl FnOnce(&mut Wants)) -> Result<()> {
        let mut wants = self.wants;
        more(&mut wants);
        if wants == self.wants {
            return Ok(());
        }
        let Some(ebpf) = self.ebpf.as_mut() else {
            return Ok(());
        };
        self.deferred.attach_wanted(ebpf, wants)?;
        self.wants = wants;
        Ok(())
    }

    /// io.cost switched on (`Some`, with its settings) or off for the traced disk `dev` during
    /// the run: the programs charge its bios from now on, or stop.
    pub fn set_iocost(
        &mut self,
        dev: u32,
        iocost: Option<crate::sys::iocost::Iocost>,
    ) -> Result<()> {
        let Some(slot) = self.devs.iter().position(|d| *d == dev) else {
            return Ok(());
        };
        if iocost.is_some() {
            self.want(|w| w.bio_merges = true)?;
        }
        self.config[slot].iocost = iocost.as_ref().map_or(0, |c| c.rule_bits());
        match iocost {
            Some(c) => {
                self.iocost.insert(dev, c);
            }
            None => {
                self.iocost.remove(&dev);
            }
        }
        let Some(ebpf) = self.ebpf.as_mut() else {
            return Ok(());
        };
        write_disk_config(ebpf, &self.config)?;
        self.gate = gate_of(&self.config, self.gate & gate::OPEN != 0);
        attach::set_gate(ebpf, self.gate).context("cannot tell the programs of io.cost (GATE)")
    }

    /// Whether the programs that tell which bios waited in blk-throttle are attached (from the
    /// start, or since rules appeared on a traced disk).
    pub fn sees_throttle_waits(&self) -> bool {
        self.wants.has(Want::Throttle)
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
            let _ = attach::set_gate(&mut ebpf, 0);
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

/// The gate's bits for disks configured as `config`, open or not.
fn gate_of(config: &[DiskConfig], open: bool) -> u32 {
    let mut bits = if open { gate::OPEN } else { 0 };
    if config.iter().any(|c| c.iocost != 0) {
        bits |= gate::IOCOST;
    }
    bits
}

/// A real-time kernel (PREEMPT_RT) may preempt a tracepoint's programs.
fn preemptible_tracepoints() -> bool {
    std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|v| v.trim() == "1")
}
