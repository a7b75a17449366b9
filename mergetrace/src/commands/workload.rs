//! `mergetrace __workload` (hidden): the built-in O_DIRECT workload as a process of its own, so
//! that `demo` and the tests can put it in a cgroup. Prints what it did as one JSON object.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::{
    cli::args::{parse_offset, parse_size},
    sys::workload::{self, Op, Order, Workload},
};

#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Block device or file.
    #[arg(long)]
    pub target: PathBuf,
    #[arg(long, default_value = "write", value_parser = ["read", "write"])]
    pub op: String,
    #[arg(long, default_value = "4k", value_parser = parse_size)]
    pub bs: u64,
    /// Total I/Os.
    #[arg(long)]
    pub ios: u64,
    /// I/Os per io_submit call.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Submit each batch in descending offset order (front merges).
    #[arg(long)]
    pub reverse: bool,
    /// Start offset in bytes.
    #[arg(long, default_value = "0", value_parser = parse_offset)]
    pub offset: u64,
    /// Join this cgroup directory (writes our pid to its cgroup.procs) before any I/O.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// Joins the cgroup if asked, runs, prints what was done.
pub fn run(a: &WorkloadArgs) -> Result<()> {
    if let Some(cg) = &a.cgroup {
        std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
            .with_context(|| format!("cannot join cgroup {}", cg.display()))?;
    }
    let w = Workload {
        op: if a.op == "read" { Op::Read } else { Op::Write },
        block_bytes: a.bs as usize,
        ios: a.ios,
        batch: a.batch,
        order: if a.reverse {
            Order::Reverse
        } else {
            Order::Forward
        },
        start: a.offset,
    };
    let done = workload::run(&a.target, &w)?;
    println!(
        "{{\"ios\":{},\"bytes\":{},\"submit_calls\":{}}}",
        done.ios, done.bytes, done.submit_calls
    );
    Ok(())
}
