//! mergetrace: where does your I/O meter sit — before or after merging?
//!
//! Data path: `kernel` (probes → events) → `kernel::collector` → `aggregate` (pure) →
//! `snapshot` (named rows) → `view` (TUI, text, JSON).
mod capture;
mod cli;
mod commands;
mod kernel;
mod model;
mod offline;
mod sys;
mod view;

use clap::Parser;

/// `__workload`: join the cgroup if asked, run, print what was done as JSON.
fn run_workload(a: &cli::WorkloadArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(cg) = &a.cgroup {
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
            .with_context(|| format!("cannot join cgroup {}", cg.display()))?;
    }
    let w = sys::workload::Workload {
        op: if a.op == "read" {
            sys::workload::Op::Read
        } else {
            sys::workload::Op::Write
        },
        block_bytes: a.bs as usize,
        ios: a.ios,
        batch: a.batch,
        order: if a.reverse {
            sys::workload::Order::Reverse
        } else {
            sys::workload::Order::Forward
        },
        start: a.offset,
    };
    let done = sys::workload::run(&a.target, &w)?;
    println!(
        "{{\"ios\":{},\"bytes\":{},\"submit_calls\":{}}}",
        done.ios, done.bytes, done.submit_calls
    );
    Ok(())
}

/// The error and its causes on one line. Verifier logs and other multi-line causes keep only
/// their first line (set RUST_LOG=debug for the whole chain).
fn one_line(e: &anyhow::Error) -> String {
    log::debug!("{e:?}");
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let first = text.lines().next().unwrap_or_default().trim();
        let first = first
            .split(". Verifier output:")
            .next()
            .unwrap_or(first)
            .trim()
            .to_string();
        // aya repeats its cause in its own message: skip a part already said.
        if !first.is_empty() && !parts.iter().any(|p| p.contains(&first)) {
            parts.push(first);
        }
    }
    parts.join(": ")
}

fn main() {
    let cli = cli::Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mergetrace: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => commands::live::run(cli.live).await,
            Some(cli::Command::Workload(w)) => run_workload(&w),
            Some(cli::Command::Demo(d)) => commands::demo::run(&d),
            Some(cli::Command::Check(c)) => commands::check::run(&c),
            Some(cli::Command::Record(r)) => commands::record::run(r).await,
            Some(cli::Command::Report(r)) => commands::report::run(&r),
            Some(cli::Command::Export(e)) => commands::export::run(&e),
            Some(cli::Command::Serve(s)) => commands::serve::run(s).await,
        }
    });
    if let Err(e) = result {
        eprintln!("mergetrace: error: {}", one_line(&e));
        std::process::exit(1);
    }
}
