//! The flags several commands take, each declared once, and the parsers of their values.
//! `live`, `record` and `serve` flatten the groups they use, so a flag means the same thing,
//! has the same default and is checked the same way (at parse time) wherever it appears.
use std::time::Duration;

use clap::Args;

use crate::kernel::TierChoice;

/// What to trace and how to count it (live, record, serve).
#[derive(Args, Debug, Clone)]
pub struct TraceArgs {
    /// Block device to trace: a name (vda), /dev/NAME or MAJ:MIN, or a pattern of disk names
    /// ('nvme*', 'vd?': disks that appear during the run and match are traced too, from
    /// their first bio). Repeatable. A partition maps to its disk.
    #[arg(
        short = 'd',
        long = "device",
        required_unless_present = "all_disks",
        value_name = "DEV"
    )]
    pub devices: Vec<String>,
    /// Trace every disk, those that appear during the run too (from their first bio).
    #[arg(long)]
    pub all_disks: bool,
    /// Which probes to use: fentry where the kernel allows it (auto), or force one tier.
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierChoice,
    /// Cloud-volume meters: each device request counts ceil(size / unit), at least 1. Unit
    /// sizes or provider presets, comma-separated, up to 4 (e.g. 256k,1m or aws-gp3,aws-st1).
    /// Presets: aws-gp2, aws-gp3, aws-io1, aws-io2 (256 KiB), aws-st1, aws-sc1 (1 MiB),
    /// azure-ultra (256 KiB).
    #[arg(long, default_value = "256k,1m", value_name = "SIZES", value_delimiter = ',', value_parser = parse_meter_unit, num_args = 1..=4)]
    pub meter_unit: Vec<u64>,
    /// Print the eBPF programs' own diagnostics on stderr (aya-log), e.g. the kernel frames of
    /// a merge whose path mergetrace cannot tell.
    #[arg(long)]
    pub ebpf_log: bool,
    /// Counters of a removed cgroup are folded into its device's cgroup "(removed)" once it
    /// has been gone this long (and a read has shown them): the kernel maps then hold the
    /// cgroups alive plus those removed within this window. I/O of a cgroup that completes
    /// later is counted under "(removed)".
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    pub reclaim_after: Duration,
    /// Also count plug flushes by depth ("unplug" in the JSON): one more program run per plug
    /// flush. Captures always have them.
    #[arg(long)]
    pub plug_flushes: bool,
    /// Also count each request's queue latency (created → issued) and device latency (issued
    /// → completed) per cgroup, apart for requests that carried merged bios ("latency" in the
    /// JSON): one more program run per completion, and at each end an update of the
    /// histograms in the cgroup's counter slot. Captures always have the events for it.
    #[arg(long)]
    pub latency: bool,
    /// fentry tier: also count every merge attempt, failed ones included ("merge_attempts" in
    /// the JSON): programs on every bio. Captures always have them.
    #[arg(long)]
    pub merge_attempts: bool,
}

impl TraceArgs {
    /// What the kernel side is loaded with for these flags: the tier, the meter units, the
    /// log forwarding; the caller picks the modes, the ring and whether to keep statistics.
    pub fn kernel_options(
        &self,
        modes: mergetrace_common::Modes,
        ring_bytes: u32,
        stats: bool,
    ) -> crate::kernel::Options {
        crate::kernel::Options {
            ring_bytes,
            tier: self.tier,
            modes,
            meter_units: crate::model::aggregate::meter_units(&self.meter_unit),
            stats,
            ebpf_log: self.ebpf_log,
            reclaim_after: self.reclaim_after,
            wants: crate::kernel::Wants {
                plug_flushes: self.plug_flushes,
                attempts: self.merge_attempts,
                latency: self.latency,
                ..Default::default()
            },
            hooks_only: false,
            every_disk: false,
        }
    }
}

/// How long a run lasts, how often it reports, and the ring its events cross (live, record).
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// How often to report: the view refreshes (live), the capture is flushed and its losses
    /// recorded (record); e.g. 1s, 500ms.
    #[arg(short = 'i', long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stop after this long (e.g. 10s); otherwise run until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// MiB of ring buffers events cross to user space in, shared by the CPUs (a ring each, of
    /// at least 64 KiB; a power of two up to 1024).
    #[arg(long, default_value_t = RING_MIB, value_name = "MIB", value_parser = parse_ring_mib)]
    pub ring_mib: u32,
}

/// The default `--ring-mib`: what a capture needs at ~1.8M events/s without losses (the
/// bench's record arm). The live view counts in the kernel and sends no events.
pub const RING_MIB: u32 = 64;
/// The largest `--ring-mib`.
pub const RING_MIB_MAX: u32 = 1024;

/// Only one subtree of the cgroup hierarchy (live, serve).
#[derive(Args, Debug, Clone)]
pub struct SubtreeArg {
    /// Only this cgroup and its descendants: a path relative to the cgroup mount (/mt), or a
    /// container id prefix of at least 6 hex digits, a container or pod name, or a systemd
    /// unit (nginx.service).
    #[arg(short = 'c', long, value_name = "PATH")]
    pub cgroup: Option<String>,
}

/// How container cgroups are named (live, serve, record).
#[derive(Args, Debug, Clone)]
pub struct NamesArg {
    /// Name containers from their cgroup paths alone: read none of the container runtimes'
    /// files (Docker's config.v2.json, podman's and CRI-O's containers/storage, containerd's
    /// task bundles, runc's and crun's state, the kubelet's /var/log/pods and
    /// /var/log/containers; docs/names.md).
    #[arg(long)]
    pub no_local_names: bool,
}

/// The part of a capture to read (report, export).
#[derive(Args, Debug, Clone)]
pub struct SpanArgs {
    /// Only events from this long after the start of the capture (e.g. 5s).
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub from: Option<Duration>,
    /// Only events up to this long after the start of the capture.
    #[arg(long, value_parser = parse_duration, value_name = "T")]
    pub to: Option<Duration>,
}

/// A byte size: 4096, 256k, 1m (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.trim_end_matches(['b', 'i']).chars().last() {
        Some('k') => (&t[..t.find('k').unwrap_or(0)], 1u64 << 10),
        Some('m') => (&t[..t.find('m').unwrap_or(0)], 1 << 20),
        Some('g') => (&t[..t.find('g').unwrap_or(0)], 1 << 30),
        _ => (t.as_str(), 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size; write e.g. 4096, 256k, 1m"))?;
    if n == 0 {
        return Err("a size must be larger than 0".into());
    }
    Ok(n * mult)
}

/// A cloud meter's unit: a size, or a provider preset's (`model::meter::CLOUD_PRESETS`).
pub fn parse_meter_unit(s: &str) -> Result<u64, String> {
    let name = s.trim().to_ascii_lowercase();
    if let Some(p) = crate::model::meter::cloud_preset(&name) {
        return Ok(p.unit_bytes);
    }
    if name.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
        let names: Vec<&str> = crate::model::meter::CLOUD_PRESETS
            .iter()
            .map(|p| p.name)
            .collect();
        return Err(format!(
            "'{s}' is neither a size nor a cloud preset; presets: {}",
            names.join(", ")
        ));
    }
    parse_size(s)
}

/// A byte offset: 0, or a size.
pub fn parse_offset(s: &str) -> Result<u64, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration ({e}); write e.g. 500ms, 1s, 2m"))?;
    if d.is_zero() {
        return Err("a duration must be longer than 0".into());
    }
    Ok(d)
}

fn parse_ring_mib(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of MiB"))?;
    if !n.is_power_of_two() || n > RING_MIB_MAX {
        return Err(format!(
            "ring size {n} MiB must be a power of two up to {RING_MIB_MAX}"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256k"), Ok(256 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("k").is_err());
        assert!(parse_size("12q").is_err());
        assert_eq!(parse_offset("0"), Ok(0));
    }

    #[test]
    fn ring_sizes_are_checked_when_parsed() {
        assert_eq!(parse_ring_mib("1"), Ok(1));
        assert_eq!(parse_ring_mib("1024"), Ok(1024));
        for bad in ["0", "3", "2048", "x"] {
            assert!(parse_ring_mib(bad).is_err(), "{bad}");
        }
    }
}
