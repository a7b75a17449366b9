//! `mergetrace export run.mtr --format perfetto|blktrace|csv|jsonl -o OUT`: a capture in
//! formats other tools read. docs/export.md describes each output.
use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use mergetrace_common::Event;

use crate::{
    cli::args::SpanArgs,
    offline::load::load,
    offline::names::Names,
    view::{
        export::{blktrace, events, perfetto},
        quiet_pipe,
    },
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Chrome trace-event JSON for ui.perfetto.dev: a process per device, tracks per
    /// cgroup, bios, merges, requests, and flows from each bio to its request.
    Perfetto,
    /// blktrace's binary format, one file per device (OUT.blktrace.0), for blkparse/btt.
    Blktrace,
    /// One line per event, named columns.
    Csv,
    /// One JSON object per line per event.
    Jsonl,
}

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A capture written by `mergetrace record`.
    pub file: PathBuf,
    #[arg(short = 'f', long, value_enum)]
    pub format: Format,
    /// Where to write: a file ("-" = standard output) for perfetto, csv and jsonl; for
    /// blktrace the base name: OUT.blktrace.0 (one device) or OUT.DEVICE.blktrace.0 (several),
    /// read with `blkparse -i OUT`.
    #[arg(short = 'o', long, value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub span: SpanArgs,
}

/// A file, or standard output for "-".
pub fn create(path: &Path) -> Result<Box<dyn Write>> {
    if path == Path::new("-") {
        return Ok(Box::new(BufWriter::new(std::io::stdout().lock())));
    }
    let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(Box::new(BufWriter::with_capacity(1 << 20, f)))
}

/// What an export says of a `record --requests` capture whose bio charges came in runs
/// (`Event::run_len`): each run is one line, record or instant of the export.
fn runs_warning(events: &[Event]) -> Option<String> {
    let (runs, bios) = events
        .iter()
        .filter(|e| e.run_len() > 1)
        .fold((0u64, 0u64), |(r, b), e| (r + 1, b + e.run_len()));
    (runs > 0).then(|| {
        format!(
            "{bios} bios' blk-throttle charges are recorded as {runs} runs (record --requests): \
             each run is one line with its bios in `run` (csv, jsonl), one Q record (blktrace) \
             or one instant (perfetto), with all its bytes"
        )
    })
}

pub fn run(args: &ExportArgs) -> Result<()> {
    quiet_pipe(export(args))
}

fn export(args: &ExportArgs) -> Result<()> {
    let mut events: Vec<Event> = Vec::new();
    let loaded = load(&args.file, args.span.from, args.span.to, |ev| {
        events.push(*ev)
    })?;
    if let Some(w) = &loaded.warning {
        eprintln!("mergetrace: warning: {w}");
    }
    let lost = loaded.window.lost_events();
    if lost > 0 {
        eprintln!(
            "mergetrace: warning: the capture lost {lost} events (ring buffer full); the export \
             has what was recorded"
        );
    }
    if let Some(w) = runs_warning(&events) {
        eprintln!("mergetrace: warning: {w}");
    }
    let h = &loaded.header;
    let mut names = Names::new(h);
    match args.format {
        Format::Csv | Format::Jsonl => {
            let mut out = create(&args.output)?;
            if args.format == Format::Csv {
                events::write_csv(&mut out, &events, &mut names)?;
            } else {
                events::write_jsonl(&mut out, &events, &mut names)?;
            }
            out.flush()
                .with_context(|| format!("cannot write {}", args.output.display()))?;
            eprintln!(
                "mergetrace: wrote {} events to {}",
                events.len(),
                args.output.display()
            );
        }
        Format::Blktrace => {
            for f in blktrace::write_files(&args.output, &events, h)? {
                eprintln!(
                    "mergetrace: wrote {} traces of {} to {} (blkparse -i {})",
                    f.traces,
                    f.device,
                    f.path.display(),
                    f.input.display()
                );
            }
        }
        Format::Perfetto => {
            let mut out = create(&args.output)?;
            let s = perfetto::write(&mut out, &events, h, &args.file, &mut names)?;
            out.flush()
                .with_context(|| format!("cannot write {}", args.output.display()))?;
            eprintln!(
                "mergetrace: wrote {} trace events ({} flows) to {}; open it in ui.perfetto.dev",
                s.trace_events,
                s.flows,
                args.output.display()
            );
        }
    }
    Ok(())
}
