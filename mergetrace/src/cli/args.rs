//! Command line.
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "mergetrace",
    version,
    about = "Per-cgroup view of what blk-throttle charged, what merged (and how), and what the device saw",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(flatten)]
    pub live: LiveArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record every event of a run to a capture file, for `report` and `export`.
    Record(crate::commands::record::RecordArgs),
    /// Read a capture: the same per-cgroup tables as the live view, and distributions.
    Report(crate::commands::report::ReportArgs),
    /// Convert a capture for other tools: Perfetto/Chrome trace JSON, blktrace binary
    /// (for blkparse, btt), CSV or JSON lines.
    Export(crate::commands::export::ExportArgs),
    /// The article's checklist for one device, without tracing: scheduler and what nomerges
    /// does here, merge rate and request size since boot, merge ceilings, throttled cgroups,
    /// and which tier mergetrace can run.
    Check(crate::commands::check::CheckArgs),
    /// The article's lab, built in: a loop device in /dev/shm, a built-in workload, the
    /// tables, and a self-check against /proc/diskstats. Needs root; cleans up after itself.
    Demo(crate::commands::demo::DemoArgs),
    /// The fleet view: count in the kernel continuously and serve the running totals on
    /// /metrics in the Prometheus text format (loopback by default). Needs root.
    Serve(crate::commands::serve::ServeArgs),
    /// Run the built-in O_DIRECT workload (used by `demo` and the tests; no fio needed).
    #[command(hide = true, name = "__workload")]
    Workload(WorkloadArgs),
}

#[derive(Args, Debug, Clone)]
pub struct WorkloadArgs {
    /// Block device or file.
    #[arg(long)]
    pub target: std::path::PathBuf,
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
    pub cgroup: Option<std::path::PathBuf>,
}

fn parse_offset(s: &str) -> Result<u64, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

#[derive(Args, Debug, Clone)]
pub struct LiveArgs {
    /// Block device to trace: a name (vda), /dev/NAME or MAJ:MIN. Repeatable. A partition
    /// maps to its disk.
    #[arg(short = 'd', long = "device", required = true, value_name = "DEV")]
    pub devices: Vec<String>,
    /// Refresh interval, e.g. 1s, 500ms.
    #[arg(short = 'i', long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Stop after this long (e.g. 10s); otherwise run until Ctrl-C or SIGTERM.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Print NDJSON: one object per interval, then one for the whole run.
    #[arg(long)]
    pub json: bool,
    /// Plain text even on a terminal.
    #[arg(long, conflicts_with = "json")]
    pub text: bool,
    /// Only this cgroup and its descendants (path relative to the cgroup mount, e.g. /mt).
    #[arg(short = 'c', long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Cloud-volume meter unit sizes: each device request counts ceil(size / unit), at least 1.
    /// Comma-separated, up to 4 (e.g. 256k,1m).
    #[arg(long, default_value = "256k,1m", value_name = "SIZES", value_delimiter = ',', value_parser = parse_size, num_args = 1..=4)]
    pub meter_unit: Vec<u64>,
    /// Which probes to use: fentry where the kernel allows it (auto), or force one tier.
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: crate::kernel::TierChoice,
    /// Report each eBPF program's kernel time per run at the end (BPF run-time statistics).
    #[arg(long)]
    pub stats: bool,
    /// Ring buffer size in MiB (a power of two).
    #[arg(long, default_value_t = 16, value_name = "MIB", value_parser = parse_ring_mib)]
    pub ring_mib: u32,
}

impl LiveArgs {
    pub fn meter_units(&self) -> Vec<u64> {
        self.meter_unit.clone()
    }
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
    if !n.is_power_of_two() || n > 1024 {
        return Err(format!(
            "ring size {n} MiB must be a power of two up to 1024"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_live_flags() {
        let c = Cli::try_parse_from([
            "mergetrace",
            "-d",
            "vda",
            "-d",
            "7:3",
            "-i",
            "500ms",
            "--json",
            "--duration",
            "10s",
            "-c",
            "/mt",
        ])
        .unwrap();
        assert_eq!(c.live.devices, ["vda", "7:3"]);
        assert_eq!(c.live.interval, Duration::from_millis(500));
        assert_eq!(c.live.duration, Some(Duration::from_secs(10)));
        assert!(c.live.json);
        assert_eq!(c.live.cgroup.as_deref(), Some("/mt"));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "-i", "0s"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "-i", "soon"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--json", "--text"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--ring-mib", "3"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--meter-unit", "0"]).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256k"), Ok(256 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("k").is_err());
        assert!(parse_size("12q").is_err());
        let c =
            Cli::try_parse_from(["mergetrace", "-d", "vda", "--meter-unit", "128k,1m"]).unwrap();
        assert_eq!(c.live.meter_units(), vec![128 << 10, 1 << 20]);
        let c = Cli::try_parse_from(["mergetrace", "-d", "vda"]).unwrap();
        assert_eq!(c.live.meter_units(), vec![256 << 10, 1 << 20]);
    }
}
