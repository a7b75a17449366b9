//! One module per subcommand. Each is a leaf: it imports the library and [`crate::cli::args`],
//! never another command.
pub mod check;
pub mod demo;
pub mod docs;
pub mod export;
pub mod follow;
pub mod live;
pub mod record;
pub mod report;
pub mod serve;
pub mod workload;

/// A warning when the kernel skipped runs of the programs (never silent: the counts or
/// events those runs would have made may be missing; the kernel does not say on which disk).
pub fn warn_skipped_runs(unsaid: &crate::model::snapshot::Unsaid) {
    if unsaid.skipped_runs.is_empty() {
        return;
    }
    let runs: Vec<String> = (unsaid.skipped_runs.iter())
        .map(|(program, n)| format!("{n} of {program}"))
        .collect();
    eprintln!(
        "mergetrace: warning: the kernel skipped runs of the programs ({}): each was already \
         running on its CPU when an interrupt, or a task that preempted it, reached the same hook; \
         what those runs would have counted on the traced disks may be missing",
        runs.join(", ")
    );
}

/// `--stats` (live view, record): each program's runs and kernel time per run on stderr, one
/// line each (the bench reads these lines).
pub fn print_program_stats(programs: &[crate::model::snapshot::ProgramStat]) {
    for p in programs {
        eprintln!(
            "mergetrace: stats: {:<24} {:>12} runs {:>8.0} ns/run",
            p.program, p.runs, p.ns_per_run
        );
    }
    if let Some(floor) = programs
        .iter()
        .find(|p| p.program == crate::kernel::STATS_FLOOR)
    {
        eprintln!(
            "mergetrace: stats: {} does nothing: its {:.0} ns/run is what the kernel's \
             statistics add to every program's run; the others' own time is their ns/run less that",
            floor.program, floor.ns_per_run
        );
    }
}
