//! A tracer's whole CPU cost per I/O, from a profile: `perf record -a` samples every CPU's
//! clock (`cpu-clock`, every [`PERIOD_NS`] of CPU time) with its kernel call chain while fio
//! runs, and each sample is the tracer's when its process ran, or when a BPF program or the
//! kernel's way into one is on the chain.
//!
//! The kernel's BPF statistics (the `--stats` arms) time a program's run alone. They miss what
//! the hook costs around it: for `tp_btf` the dispatch into the program (`bpf_trace_run*`),
//! for a classic tracepoint (bpftrace's `tracepoint:`) the trace record the kernel fills and
//! hands on (`perf_trace_*`, `perf_tp_event`) before the program runs at all. A profile sees
//! both tools the same way, and counts CPU time rather than IOPS, which this machine's noise
//! moves by more than the goals it judges.
use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

/// CPU time between two samples on a CPU, ns: 4,000 samples a second per busy CPU.
pub const PERIOD_NS: u64 = 250_000;

/// What part of the tracer a sample was in: [`Part::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The kernel's way from a hook to a program: tp_btf's dispatch, a classic tracepoint's
    /// trace record and its perf event, fentry's trampoline.
    Dispatch,
    /// A BPF program's own instructions.
    Programs,
    /// The clock a program read (`bpf_ktime_get_ns`: the clocksource's read, `read_tsc` on
    /// x86): a capture's timestamps.
    Clock,
    /// What else a program called: helpers, map updates, the ring buffer and its wake-ups.
    Helpers,
    /// The tracer's process (user space and its system calls).
    Process,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Dispatch,
        Part::Programs,
        Part::Clock,
        Part::Helpers,
        Part::Process,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Dispatch => "hook dispatch",
            Part::Programs => "programs",
            Part::Clock => "clock",
            Part::Helpers => "helpers and maps",
            Part::Process => "process",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Part::Dispatch => "dispatch",
            Part::Programs => "programs",
            Part::Clock => "clock",
            Part::Helpers => "helpers",
            Part::Process => "process",
        }
    }
}

/// The tracer's samples of one profiled run, by [`Part`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Samples per part, in [`Part::ALL`]'s order.
    pub samples: [u64; 5],
    /// Every sample of the run, idle CPUs included.
    pub all: u64,
}

impl Profile {
    pub fn of(&self, part: Part) -> u64 {
        self.samples[part as usize]
    }

    /// The tracer's samples, all parts.
    pub fn total(&self) -> u64 {
        self.samples.iter().sum()
    }
}

/// A JIT-compiled BPF program (or one of its subprograms) in kallsyms.
fn is_program(sym: &str) -> bool {
    sym.starts_with("bpf_prog_")
}

/// Reading the time: `bpf_ktime_get_ns` and the clocksource below it (TSC or kvm-clock).
fn is_clock(sym: &str) -> bool {
    matches!(
        sym,
        "bpf_ktime_get_ns"
            | "ktime_get_mono_fast_ns"
            | "read_tsc"
            | "kvm_clock_read"
            | "kvm_clock_get_cycles"
            | "pvclock_clocksource_read"
            | "pvclock_clocksource_read_nowd"
    )
}

/// The kernel's way into a program: tp_btf's `bpf_trace_run1..12` and `__bpf_trace_*`, a
/// classic tracepoint's `perf_trace_*` and `trace_call_bpf`, fentry's trampolines, and the
/// ring buffer's deferred wake-up (`bpf_ringbuf_notify`, an irq_work a program queued).
fn is_hook(sym: &str) -> bool {
    is_program(sym)
        || sym.starts_with("bpf_trace_run")
        || sym.starts_with("__bpf_trace_")
        || sym.starts_with("perf_trace_")
        || sym == "trace_call_bpf"
        || sym.starts_with("bpf_trampoline_")
        || sym.starts_with("__bpf_prog_enter")
        || sym.starts_with("__bpf_prog_exit")
        || sym == "bpf_ringbuf_notify"
}

/// Which part of the tracer a sample is (`frames` leaf first), or `None` if it is not the
/// tracer's.
pub fn classify<'a>(
    pid: u32,
    tracer_pid: u32,
    frames: impl IntoIterator<Item = &'a str>,
) -> Option<Part> {
    if pid == tracer_pid && pid != 0 {
        return Some(Part::Process);
    }
    let (mut hooked, mut clock) = (false, false);
    for (depth, sym) in frames.into_iter().enumerate() {
        if is_program(sym) {
            return Some(match (depth, clock) {
                (0, _) => Part::Programs,
                (_, true) => Part::Clock,
                _ => Part::Helpers,
            });
        }
        hooked |= is_hook(sym);
        clock |= is_clock(sym);
    }
    // Hooked, with no program above: the hook's own work before or after the program (or
    // the ring's wake-up).
    hooked.then_some(Part::Dispatch)
}

/// Adds up `perf script -F pid,ip,sym` output: a sample is a line with its pid, then a line
/// per frame ("\tADDR SYMBOL"), then a blank line.
pub fn parse(script: &str, tracer_pid: u32) -> Profile {
    let mut p = Profile::default();
    for sample in script.split("\n\n") {
        let mut lines = sample.lines().skip_while(|l| l.trim().is_empty());
        let Some(head) = lines.next() else {
            continue;
        };
        let Ok(pid) = head.trim().parse::<u32>() else {
            continue;
        };
        p.all += 1;
        let frames = lines.filter_map(|l| {
            let mut f = l.split_whitespace();
            f.next()?; // the address
            f.next()
        });
        if let Some(part) = classify(pid, tracer_pid, frames) {
            p.samples[part as usize] += 1;
        }
    }
    p
}

/// The `perf record` command that profiles every CPU into `data`, kernel call chains only.
pub fn recorder(data: &Path) -> Command {
    let mut c = Command::new("perf");
    c.args([
        "record",
        "-a",
        "-g",
        "--kernel-callchains",
        "-e",
        "cpu-clock",
        "-c",
    ])
    .arg(PERIOD_NS.to_string())
    .arg("-o")
    .arg(data);
    c
}

/// Reads the profile `perf record` wrote to `data`, as the tracer `tracer_pid`'s samples.
pub fn read(data: &Path, tracer_pid: u32) -> Result<Profile> {
    let out = Command::new("perf")
        .args(["script", "-F", "pid,ip,sym", "-i"])
        .arg(data)
        .output()
        .context("cannot run perf script")?;
    if !out.status.success() {
        bail!(
            "perf script -i {}: {}",
            data.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let p = parse(&String::from_utf8_lossy(&out.stdout), tracer_pid);
    if p.all == 0 {
        bail!("perf script -i {}: no samples", data.display());
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_by_the_first_program_on_the_chain() {
        let c = |frames: &[&str]| classify(77, 42, frames.iter().copied());
        // In a program, in what it called, in the dispatch around it, in a classic
        // tracepoint's record, and not the tracer's at all.
        assert_eq!(
            c(&[
                "bpf_prog_072c_block_rq_issue",
                "bpf_trace_run1",
                "blk_mq_start_request"
            ]),
            Some(Part::Programs)
        );
        assert_eq!(
            c(&[
                "htab_map_hash",
                "bpf_prog_69db_block_bio_queue",
                "trace_call_bpf",
                "perf_trace_run_bpf_submit"
            ]),
            Some(Part::Helpers)
        );
        assert_eq!(
            c(&[
                "read_tsc",
                "ktime_get_mono_fast_ns",
                "bpf_prog_0909_block_rq_issue"
            ]),
            Some(Part::Clock)
        );
        assert_eq!(
            c(&["bpf_trace_run1", "blk_mq_start_request"]),
            Some(Part::Dispatch)
        );
        // The clock read by something other than a program is not the tracer's.
        assert_eq!(c(&["read_tsc", "ktime_get"]), None);
        assert_eq!(
            c(&[
                "perf_swevent_event",
                "perf_tp_event",
                "perf_trace_run_bpf_submit",
                "perf_trace_block_rq"
            ]),
            Some(Part::Dispatch)
        );
        assert_eq!(
            c(&["loop_queue_rq", "blk_mq_dispatch_queue_requests"]),
            None
        );
        assert_eq!(c(&[]), None);
        // The tracer's process, whatever it runs; idle (pid 0) never is.
        assert_eq!(classify(42, 42, ["do_syscall_64"]), Some(Part::Process));
        assert_eq!(classify(0, 0, ["pv_native_safe_halt"]), None);
    }

    #[test]
    fn parses_perf_script_samples() {
        let script = "\
    0 \n\tffffffff8224379b pv_native_safe_halt\n\tffffffff822452b5 default_idle\n\n\
14335 \n\tffffffffc002c1f8 bpf_prog_072c6731d0a27f12_block_rq_issue\n\tffffffff814cc1ae bpf_trace_run1\n\n\
 7000 \n\tffffffff814cc1ae bpf_trace_run1\n\tffffffff81b4e5bf blk_mq_start_request\n\n\
 7000 \n\tffffffff81d00000 htab_map_update_elem_in_place\n\tffffffffc0030000 bpf_prog_0f0a_block_getrq\n\n\
  512 \n\tffffffff81b3ff33 submit_bio_noacct_nocheck\n\t           938c8 [unknown]\n\n\
  512 \n\n";
        let p = parse(script, 14335);
        assert_eq!(p.all, 6);
        assert_eq!(
            p.samples,
            [1, 0, 0, 1, 1],
            "dispatch, programs, clock, helpers, process"
        );
        assert_eq!(p.total(), 3);
        // The tracer's own pid: its process, even on a program's chain.
        assert_eq!(parse(script, 7000).samples, [0, 1, 0, 0, 2]);
    }
}
