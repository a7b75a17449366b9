//! The live run: attach with in-kernel counting, read the counters every interval, show, stop
//! cleanly, show the whole run. No event crosses to user space here: the programs count in
//! per-CPU maps with the same rule the offline aggregator uses. Once attached, it keeps only the
//! privileges reading the counters needs ([`kernel::least_privilege`]).
use std::{io::IsTerminal, sync::Arc, time::Duration};

use anyhow::Result;
use clap::Args;
use mergetrace_common::Modes;
use tokio::sync::Notify;

use super::follow::Follow;
use crate::{
    cli::{
        args::{NamesArg, RunArgs, SubtreeArg, TraceArgs},
        stop::Stop,
        targets::Targets,
    },
    kernel::{self, monotonic_ns},
    model::aggregate::Window,
    model::kept::Kept,
    model::snapshot::{self, SnapshotKind},
    model::timeline::Timeline,
    sys::{cgroups::Cgroups, device::Device, iolatency},
    view::{banner, json::JsonView, text::TextView, tui::TuiView, View},
};

/// The live view's flags (the command line without a subcommand).
#[derive(Args, Debug, Clone)]
pub struct LiveArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    #[command(flatten)]
    pub run: RunArgs,
    #[command(flatten)]
    pub subtree: SubtreeArg,
    #[command(flatten)]
    pub names: NamesArg,
    /// Print NDJSON: one object per interval, then one for the whole run.
    #[arg(long)]
    pub json: bool,
    /// Plain text even on a terminal.
    #[arg(long, conflicts_with = "json")]
    pub text: bool,
    /// Report each eBPF program's kernel time per run at the end (BPF run-time statistics;
    /// `stats_floor`, an empty program, is what the statistics add to each run).
    #[arg(long)]
    pub stats: bool,
    /// For the benchmark: attach the programs but leave them shut (each returns at its first
    /// check), so that the run costs what the hooks alone cost; nothing is counted.
    #[arg(long, hide = true)]
    pub hooks_only: bool,
}

pub async fn run(args: LiveArgs) -> Result<()> {
    let mut stop = Stop::on_signals()?;
    let Targets {
        devices,
        selection,
        cgroups,
        subtree,
    } = Targets::resolve(&args.trace, &args.subtree, &args.names)?;
    let meter_units = args.trace.meter_unit.clone();
    let session = kernel::Session::start(
        &devices,
        &kernel::Options {
            hooks_only: args.hooks_only,
            every_disk: selection.follows_new_disks(),
            ..args
                .trace
                .kernel_options(Modes::COUNTING, args.run.ring_mib << 20, args.stats)
        },
    )?;
    let start = monotonic_ns();
    let tier = session.tier.clone();
    let iolatency = iolatency::targets_on(&devices, &cgroups);
    let banner = banner::lines(&devices, &session, &cgroups, &iolatency);
    // Attached, the maps open (and --stats' statistics on): from here on only what reading
    // them needs, before the banner says the run has started. Quiet, unlike serve's line:
    // the view's output is the user's.
    let dropped = kernel::least_privilege::drop_after_attach(None)?;
    log::info!("{dropped}");
    // The first line on stderr says the probes are attached (scripts and tests wait for it).
    for line in &banner {
        eprintln!("mergetrace: {line}");
    }
    if args.hooks_only {
        eprintln!(
            "mergetrace: --hooks-only: the programs are attached but return at once; nothing is counted"
        );
    }
    let quit = Arc::new(Notify::new());
    let mut view = view_for(&args, banner, &quit)?;
    let empty = Default::default();
    let opts = snapshot::Options {
        tier: tier.kind.name(),
        fentry: tier.kind == kernel::TierKind::Fentry,
        meter_units: &meter_units,
        subtree: subtree.as_deref(),
        // Each interval prices with the disks' meters of its time (`Live::meters`).
        iocost: &empty,
        wbt: &Default::default(),
        wants: session.wants,
        per_bio: session.per_bio,
        iolatency: &Default::default(),
        timeline: None,
    };
    stop.after(args.run.duration);
    let mut live = Live {
        follow: Follow::new(&devices, selection, iolatency),
        iocost_seen: session.iocost_models(),
        session,
        devices,
        cgroups,
        previous: Window {
            start_ns: start,
            end_ns: start,
            ..Window::default()
        },
        timeline: Timeline::default(),
        kept: Kept::default(),
        start,
    };
    live.intervals(&mut *view, &opts, args.run.interval, &mut stop, &quit)
        .await?;
    live.finish(&mut *view, &opts, args.stats)
}

/// NDJSON with --json, the terminal UI on a terminal (its q, Esc and Ctrl-C notify `quit`),
/// text otherwise.
fn view_for(args: &LiveArgs, banner: Vec<String>, quit: &Arc<Notify>) -> Result<Box<dyn View>> {
    Ok(if args.json {
        Box::new(JsonView::new(std::io::stdout()))
    } else if !args.text && std::io::stdout().is_terminal() {
        let quit = quit.clone();
        Box::new(TuiView::new(banner, move || quit.notify_one())?)
    } else {
        Box::new(TextView::new(std::io::stdout()))
    })
}

/// A run being traced: what is traced and since when, the totals at the last interval, and
/// what each interval showed (the whole run's verdict is judged over them).
struct Live {
    session: kernel::Session,
    devices: Vec<Device>,
    cgroups: Cgroups,
    previous: Window,
    timeline: Timeline,
    /// Removed cgroups' rows, kept for the whole run once the kernel side folded them.
    kept: Kept,
    start: u64,
    /// The disks' settings as last seen (meters switched on or off during the run).
    follow: Follow,
    /// io.cost's model of each disk it was on for at any time of the run: what the whole
    /// run is priced with.
    iocost_seen: std::collections::BTreeMap<u32, crate::model::iocost::Model>,
}

impl Live {
    /// The in-kernel counters so far, over the run. Cgroups born since the last call are
    /// named from their birth report; removed ones no longer counted are forgotten, and a
    /// counted one found gone without a report is reclaimed all the same.
    fn totals(&mut self) -> Result<Window> {
        let mut now = self.session.read_totals()?;
        // After the read: every cgroup counted in it was born before its I/O was counted.
        kernel::cgroup_events::apply(self.session.take_cgroup_changes(), &mut self.cgroups);
        now.start_ns = self.start;
        now.end_ns = monotonic_ns();
        let counted: std::collections::HashSet<u64> =
            now.counts.keys().map(|k| k.cgroup_id).collect();
        for id in &counted {
            if self.cgroups.name(*id).gone {
                self.session.mark_removed(*id);
            }
        }
        self.kept.note_folded(&self.previous, &now);
        let kept = self.kept.cgroups();
        self.cgroups
            .forget_removed(|id| counted.contains(&id) || kept.contains(&id));
        self.timeline
            .retain(|id| counted.contains(&id) || kept.contains(&id));
        Ok(now)
    }

    /// The run so far, removed cgroups under their own rows.
    fn whole_run(&self) -> Window {
        self.kept.restored(&self.previous)
    }

    /// Shows each interval until the run is stopped.
    async fn intervals(
        &mut self,
        view: &mut dyn View,
        opts: &snapshot::Options<'_>,
        every: Duration,
        stop: &mut Stop,
        quit: &Notify,
    ) -> Result<()> {
        let mut ticker = tokio::time::interval(every);
        ticker.tick().await; // the first tick is immediate
        let mut adopt = tokio::time::interval(kernel::session::ADOPT_EVERY);
        let reports = self.session.report_waker()?;
        loop {
            tokio::select! {
                _ = reports.wait() => self.session.poll_cgroups(),
                _ = ticker.tick() => {
                    let s = self.next_interval(opts)?;
                    view.changed(&s.changes)?;
                    if view.wants_run_so_far() {
                        let run = self.whole_run_snapshot(opts);
                        view.run_so_far(&run)?;
                    }
                    view.interval(&s)?;
                }
                _ = adopt.tick() => self.session.adopt_new_keys()?,
                _ = stop.wait() => return Ok(()),
                _ = quit.notified() => return Ok(()),
            }
        }
    }

    /// The interval since the last one, judged knowing the intervals before it, and added to
    /// the timeline; priced with the meters in force now, and saying what changed on the
    /// disks since the last one.
    fn next_interval(&mut self, opts: &snapshot::Options<'_>) -> Result<snapshot::Snapshot> {
        let changes = self
            .follow
            .check(&mut self.devices, &mut self.session, &self.cgroups);
        let now = self.totals()?;
        let interval = now.since(&self.previous);
        self.previous = now;
        let iocost = self.session.iocost_models();
        self.iocost_seen.extend(iocost.clone());
        let wbt = self.session.wbt.clone();
        let opts = snapshot::Options {
            timeline: Some(&self.timeline),
            iocost: &iocost,
            wbt: &wbt,
            iolatency: &self.follow.iolatency,
            ..*opts
        };
        let mut s = snapshot::build(
            &interval,
            SnapshotKind::Interval,
            &self.devices,
            &mut self.cgroups,
            &opts,
        );
        s.changes = changes;
        self.timeline.observe(&s);
        Ok(s)
    }

    /// The whole run so far, judged over its intervals, priced with every meter that was in
    /// force during it.
    fn whole_run_snapshot(&mut self, opts: &snapshot::Options<'_>) -> snapshot::Snapshot {
        let total = self.whole_run();
        let wbt = self.session.wbt.clone();
        let opts = snapshot::Options {
            timeline: Some(&self.timeline),
            iocost: &self.iocost_seen,
            wbt: &wbt,
            iolatency: &self.follow.iolatency,
            ..*opts
        };
        snapshot::build(
            &total,
            SnapshotKind::Total,
            &self.devices,
            &mut self.cgroups,
            &opts,
        )
    }

    /// Detaches first so the counters stop moving, then shows the whole run.
    fn finish(mut self, view: &mut dyn View, opts: &snapshot::Options, stats: bool) -> Result<()> {
        let program_stats = if stats {
            self.session.program_stats()
        } else {
            Vec::new()
        };
        self.session.detach();
        // The interval in progress is not shown, but the whole run is judged over it too.
        self.next_interval(opts)?;
        let mut s = self.whole_run_snapshot(opts);
        s.program_stats = program_stats;
        s.unsaid = self.session.unsaid()?;
        view.total(&s)?;
        super::print_program_stats(&s.program_stats);
        super::warn_skipped_runs(&s.unsaid);
        if s.lost_events > 0 {
            eprintln!(
                "mergetrace: warning: {} events could not be counted ({}): the counts are low",
                s.lost_events,
                s.lost_by_kind
                    .keys()
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(())
    }
}
