//! `--stats`' yardstick: a program that does nothing, attached beside the others. The
//! kernel's run-time statistics time each run between two clock reads, and those reads are
//! part of what it reports (tens of ns in a virtual machine); this program's ns/run is that
//! part alone, to be taken off each program's.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

/// On `block_rq_issue` (once per request, as the programs it is compared with); its
/// arguments, which differ between kernels, are not read.
#[btf_tracepoint(function = "block_rq_issue")]
pub fn stats_floor(_ctx: BtfTracePointContext) -> u32 {
    0
}
