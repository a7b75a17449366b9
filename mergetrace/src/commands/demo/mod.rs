//! `mergetrace demo`: a merging lab, built in. A loop device on a file in /dev/shm, the
//! built-in O_DIRECT workload in cgroups of the demo's own, mergetrace's own probes, and the
//! tables of what merging does — each number checked against what the workload submitted, the
//! scratch disk's write counters in /proc/diskstats and the cgroup's own counters (io.stat,
//! blk-throttle's), never against what other processes may add ([`lab`]).
mod iocost;
mod lab;
mod latency;
mod tables;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Result};
use clap::Args;

use crate::{
    kernel::{self, TierChoice},
    sys::cgroups::Cgroups,
};
use lab::{Arm, DemoCgroup, Lab};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// A smaller set that runs in well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Probes to use (auto: fentry where allowed).
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierChoice,
}

/// Set by SIGINT/SIGTERM: the demo stops between steps and cleans up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// The write-iops limit of the throttled arms.
const WIOPS: u64 = 2000;

pub fn run(args: &DemoArgs) -> Result<()> {
    kernel::check_privileges()?;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let (ios, throttle_secs, iocost_ios) = if args.quick {
        (16_384u64, 3u64, 4096u64)
    } else {
        (65_536, 10, 16_384)
    };
    let mib = (ios * 4096) >> 20;
    let mut lab = Lab::start((mib + 16) << 20, args.tier)?;
    let cgroups = Cgroups::discover()?;
    let workload = DemoCgroup::new(&cgroups, "workload")?;
    let nomerges = nomerges_arms(&mut lab, ios, &workload)?;
    let batches: &[usize] = if args.quick {
        &[1, 32, 128]
    } else {
        &[1, 8, 32, 64, 128, 256]
    };
    let batch = batch_arms(&mut lab, ios, batches, &workload)?;
    let limited = DemoCgroup::new(&cgroups, "limited")?;
    limited.limit_write_iops(&lab.disk.dev, WIOPS)?;
    let throttled = throttled_arms(&mut lab, WIOPS * throttle_secs, &limited)?;
    let under_iocost = match iocost::unavailable(&cgroups) {
        None => Ok(iocost::arms(&mut lab, iocost_ios, &cgroups)?),
        Some(why) => Err(why),
    };
    tables::print(&lab, mib, &nomerges, &batch);
    tables::print_throttled(&throttled, WIOPS, throttle_secs, &limited.rel);
    tables::print_iocost(&under_iocost, (iocost_ios * 4096) >> 20);
    let (writes, reads) = (ios / 2, ios / 32);
    let beside = latency::arms(&mut lab, writes, reads)?;
    latency::print(&beside, writes, reads);
    let all: Vec<Arm> = nomerges
        .into_iter()
        .chain(batch)
        .chain(throttled)
        .chain(under_iocost.unwrap_or_default())
        .collect();
    let problems: Vec<String> = all
        .iter()
        .flat_map(|a| a.mismatches())
        .chain(beside.iter().flat_map(|a| a.mismatches()))
        .collect();
    drop(limited);
    drop(workload);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("mergetrace demo: MISMATCH {p}");
        }
        bail!(
            "{} {} from the kernel's or the workload's: {}",
            problems.len(),
            if problems.len() == 1 {
                "count differs"
            } else {
                "counts differ"
            },
            problems.join("; ")
        );
    }
    println!(
        "\nself-check: all {} arms equal the kernel's counters",
        all.len() + beside.len()
    );
    Ok(())
}

/// Table 1: the three levels of nomerges, batched and one at a time.
fn nomerges_arms(lab: &mut Lab, ios: u64, cgroup: &DemoCgroup) -> Result<Vec<Arm>> {
    lab.disk.queue("scheduler", "mq-deadline")?;
    let mut arms = Vec::new();
    for (nomerges, batch) in [(0, 32), (1, 32), (2, 32), (0, 1)] {
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        let how = if batch == 1 {
            "one at a time (1)".to_string()
        } else {
            format!("batched ({batch})")
        };
        arms.push(lab.run(
            &format!("nomerges={nomerges}, {how}"),
            (ios, batch, 0),
            cgroup,
        )?);
    }
    lab.disk.queue("nomerges", "0")?;
    Ok(arms)
}

/// Table 2: the submission batch is the lever.
fn batch_arms(lab: &mut Lab, ios: u64, batches: &[usize], cgroup: &DemoCgroup) -> Result<Vec<Arm>> {
    let mut arms = Vec::new();
    for &b in batches {
        arms.push(lab.run(&format!("batch {b}"), (ios, b, 0), cgroup)?);
    }
    Ok(arms)
}

/// Table 3: under an IOPS limit, merging buys nothing.
fn throttled_arms(lab: &mut Lab, ios: u64, limited: &DemoCgroup) -> Result<Vec<Arm>> {
    let mut arms = Vec::new();
    for (nomerges, label) in [
        (0, "nomerges=0 (merging on)"),
        (2, "nomerges=2 (merging off)"),
    ] {
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        let before = limited.write_ios(&lab.disk.dev)?;
        let mut arm = lab.run(label, (ios, 32, 0), limited)?;
        arm.kernel_charged = Some(limited.write_ios(&lab.disk.dev)? - before);
        arms.push(arm);
    }
    lab.disk.queue("nomerges", "0")?;
    Ok(arms)
}
