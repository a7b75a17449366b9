//! `mergetrace check -d DEV`: what merging can and cannot do on one device, read from sysfs,
//! /proc/diskstats and the cgroup tree, and which tier mergetrace can trace it with. Traces
//! nothing, but watches the device's counters for a moment (`--sample`). Reading the system
//! ([`gather`], [`environment`]) is apart from judging it
//! ([`findings`], pure), so every sentence is unit-tested on constructed inputs.
pub mod environment;
pub mod findings;
pub mod gather;

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

pub use environment::{tier, KernelEnv, TierCheck};
pub use findings::{findings, Finding};
pub use gather::{gather, CheckInput, Sample, ThrottledCgroup};

use crate::{
    kernel::{btf::Btf, compat},
    sys::{device, diskstats::DiskStats, queue::QueueSettings},
};

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Block device to check: a name (vda), /dev/NAME or MAJ:MIN. A partition maps to its disk.
    #[arg(short = 'd', long = "device", required = true, value_name = "DEV")]
    pub device: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Watch the device's /proc/diskstats counters this long, for what it does now beside its
    /// totals (which run from when the disk was added); 0 for the totals alone.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = parse_sample)]
    pub sample: Duration,
}

/// A duration, zero included (`0`, `0s`: no sample).
fn parse_sample(s: &str) -> Result<Duration, String> {
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration ({e}); write e.g. 1s, 500ms, 0 for none"))
}

/// The JSON document of `check --json`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub device: &'a str,
    pub dev: String,
    pub tier: TierCheck,
    pub findings: Vec<Finding>,
    pub queue: &'a QueueSettings,
    /// The counters since the disk was added, read at the end of the sample.
    pub diskstats: Option<&'a DiskStats>,
    /// Their growth over the sample (`null` without one).
    pub sample: Option<&'a Sample>,
    pub throttled: &'a [ThrottledCgroup],
    /// Every hook mergetrace uses, checked against this kernel (docs/hooks.md).
    pub hooks: Vec<compat::HookStatus>,
}

pub fn report(input: &CheckInput) -> Report<'_> {
    Report {
        device: &input.device.name,
        dev: format!("{}:{}", input.device.major, input.device.minor),
        tier: tier(&input.env),
        findings: findings(input),
        queue: &input.queue,
        diskstats: input.diskstats.as_ref(),
        sample: input.sample.as_ref(),
        throttled: &input.throttled,
        hooks: hooks_here(),
    }
}

/// The hook table checked against the running kernel (empty if BTF is unreadable).
fn hooks_here() -> Vec<compat::HookStatus> {
    let release = crate::sys::release::running();
    let (Ok(btf), Some(version)) = (Btf::from_sys_fs(), compat::parse_release(&release)) else {
        return Vec::new();
    };
    let kallsyms = compat::Kallsyms::load().unwrap_or_else(|_| compat::Kallsyms::parse(""));
    compat::hook_status(&btf, &kallsyms, version)
}

/// Text output: one line per finding.
pub fn render_text(findings: &[Finding]) -> String {
    findings.iter().map(|f| f.line() + "\n").collect()
}

pub fn run(args: &CheckArgs) -> Result<()> {
    let device = device::resolve(&args.device)?;
    let input = gather(device, args.sample)?;
    if args.json {
        println!("{}", serde_json::to_string(&report(&input))?);
    } else {
        print!("{}", render_text(&findings(&input)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::check::findings::fixtures::sda_input;
    use clap::Parser;

    #[test]
    fn text_and_json() {
        let i = sda_input();
        let f = findings(&i);
        let text = render_text(&f);
        assert_eq!(text.lines().count(), f.len());
        assert!(text.lines().any(|l| l
            .starts_with("write merges: write merge rate since sda was added: 23.6 %")
            && l.contains(" — lever: merging needs a neighbour")));
        assert!(text
            .lines()
            .any(|l| l.starts_with("plug flush: ") && !l.contains("lever")));
        let v = serde_json::to_value(report(&i)).unwrap();
        assert_eq!(v["device"], "sda");
        assert_eq!(v["dev"], "8:0");
        assert_eq!(v["tier"]["name"], "tracepoint");
        assert_eq!(
            v["tier"]["reason"],
            "fentry refused by this kernel's policy: tracepoint tier"
        );
        assert_eq!(v["findings"].as_array().unwrap().len(), f.len());
        assert_eq!(v["findings"][0]["topic"], "device");
        assert!(v["findings"][0]["lever"].is_null());
        assert_eq!(v["queue"]["max_segments"], 128);
        assert_eq!(v["diskstats"]["writes_merged"], 3282202);
        assert!(v["sample"].is_null());
        let mut i = sda_input();
        i.sample = Some(Sample {
            seconds: 1.5,
            diskstats: DiskStats {
                writes: 7,
                ..DiskStats::default()
            },
        });
        let v = serde_json::to_value(report(&i)).unwrap();
        assert_eq!(v["sample"]["seconds"], 1.5);
        assert_eq!(v["sample"]["diskstats"]["writes"], 7);
    }

    #[test]
    fn args() {
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: CheckArgs,
        }
        let t = T::try_parse_from(["x", "-d", "loop3", "--json"]).unwrap();
        assert_eq!((t.a.device.as_str(), t.a.json), ("loop3", true));
        assert_eq!(t.a.sample, Duration::from_secs(1));
        for (arg, want) in [("0", 0), ("0s", 0), ("250ms", 250), ("2s", 2000)] {
            let t = T::try_parse_from(["x", "-d", "a", "--sample", arg]).unwrap();
            assert_eq!(t.a.sample, Duration::from_millis(want), "{arg}");
        }
        let Err(e) = T::try_parse_from(["x", "-d", "a", "--sample", "soon"]) else {
            panic!("--sample soon parsed");
        };
        assert!(e.to_string().contains("'soon' is not a duration"), "{e}");
        assert!(T::try_parse_from(["x"]).is_err());
        assert!(T::try_parse_from(["x", "-d", "a", "-d", "b"]).is_err());
    }
}
