//! The kernel side, as user space sees it: which hooks exist where ([`compat`]), the kernel's
//! BTF ([`btf`]), loading the object and attaching its programs from the hook table
//! ([`attach`]), a run's programs and counters ([`session`]) and its disks ([`disks`]), who may load them
//! ([`privileges`]) and what is kept once they are attached ([`least_privilege`]), the counter
//! slots the programs count in ([`slots`]), the
//! event rings ([`rings`]) and their stream in time order ([`collector`], [`time_order`]), and
//! cgroup births and removals ([`cgroup_events`]), and what a run's end leaves unsaid
//! ([`unfinished`]).
pub mod attach;
pub mod btf;
pub mod cgroup_events;
pub mod collector;
pub mod compat;
pub mod disks;
pub mod least_privilege;
pub mod privileges;
pub mod rings;
pub mod session;
pub mod slots;
pub mod time_order;
pub mod unfinished;

use std::fmt;

pub use attach::STATS_FLOOR;
pub use compat::hooks::Wants;
pub use privileges::check_privileges;
pub use session::{Options, Session};

/// How mergetrace observes the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierKind {
    /// BTF-enabled tracepoints plus kernel stacks and kallsyms for context.
    Tracepoint,
    /// fentry/fexit on block-layer functions: exact throttle delays and failed merge attempts.
    Fentry,
}

impl TierKind {
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Tracepoint => "tracepoint",
            TierKind::Fentry => "fentry",
        }
    }
}

/// The tier in use and why it was chosen.
#[derive(Debug, Clone)]
pub struct Tier {
    pub kind: TierKind,
    pub reason: String,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tier ({})", self.kind.name(), self.reason)
    }
}

/// Which tier the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TierChoice {
    /// fentry where the kernel allows it, the tracepoint tier otherwise.
    Auto,
    Tracepoint,
    Fentry,
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
