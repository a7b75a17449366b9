//! `mergetrace check -d DEV`: what merging can and cannot do on one device, read from sysfs,
//! /proc/diskstats and the cgroup tree, and which tier mergetrace can trace it with. Traces
//! nothing. Reading the system ([`gather`], [`environment`]) is apart from judging it
//! ([`findings`], pure), so every sentence is unit-tested on constructed inputs.
pub mod environment;
pub mod findings;
pub mod gather;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

pub use environment::{tier, KernelEnv, TierCheck};
pub use findings::{findings, Finding};
pub use gather::{gather, CheckInput, ThrottledCgroup};

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
}

/// The JSON document of `check --json`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub device: &'a str,
    pub dev: String,
    pub tier: TierCheck,
    pub findings: Vec<Finding>,
    pub queue: &'a QueueSettings,
    pub diskstats: Option<&'a DiskStats>,
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
    let input = gather(device)?;
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
            .starts_with("write merges: write merge rate since boot (11.5 h): 23.6 %")
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
        assert!(T::try_parse_from(["x"]).is_err());
        assert!(T::try_parse_from(["x", "-d", "a", "-d", "b"]).is_err());
    }
}
