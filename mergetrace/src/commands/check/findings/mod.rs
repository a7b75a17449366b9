//! Judging: what the user should know about merging on the device, topic by topic, in the
//! checklist's order. Pure (every sentence is unit-tested on constructed inputs).
mod ceilings;
mod device;
mod diskstats;
mod rqos;
mod throttle;
mod tier;

use serde::Serialize;

use super::gather::CheckInput;

/// One thing the user should know, and what they can do about it (if anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub topic: &'static str,
    pub finding: String,
    pub lever: Option<String>,
}

impl Finding {
    fn new(topic: &'static str, finding: String, lever: Option<String>) -> Finding {
        Finding {
            topic,
            finding,
            lever,
        }
    }

    /// `topic: finding — lever: …`
    pub fn line(&self) -> String {
        match &self.lever {
            Some(l) => format!("{}: {} — lever: {}", self.topic, self.finding, l),
            None => format!("{}: {}", self.topic, self.finding),
        }
    }
}

/// What the user should know about merging on this device, in checklist order.
pub fn findings(input: &CheckInput) -> Vec<Finding> {
    let mut out = Vec::new();
    device::device(input, &mut out);
    device::scheduler(input, &mut out);
    diskstats::diskstats(input, &mut out);
    ceilings::ceilings(input, &mut out);
    throttle::throttle(input, &mut out);
    throttle::iocost(input, &mut out);
    rqos::wbt(input, &mut out);
    rqos::iolatency(input, &mut out);
    tier::tier_finding(input, &mut out);
    out
}

/// Inputs the topics' tests start from: a published sda on a loop device's queue.
#[cfg(test)]
pub(super) mod fixtures {
    pub use super::{findings, Finding};
    pub use crate::commands::check::{environment::tests::env, gather::CheckInput};
    use crate::sys::{cgroups::Hierarchy, device::Device, diskstats::find_diskstats};
    pub use crate::testing::fixtures::loop_queue;

    /// A published sda line, with the fields it elides filled with zeros.
    pub const SDA_LINE: &str =
        "   8       0 sda 639705 234489 36923566 0 10636637 3282202 135302774 0 0 0 0 0 0 0 0 0 0";

    pub fn sda() -> Device {
        Device {
            name: "sda".into(),
            major: 8,
            minor: 0,
            notes: vec![],
            bio_based: false,
        }
    }

    pub fn sda_input() -> CheckInput {
        CheckInput {
            device: sda(),
            queue: loop_queue(),
            diskstats: find_diskstats(SDA_LINE, 8, 0),
            sample: None,
            io_hierarchy: Some((Hierarchy::V2, "/sys/fs/cgroup".into())),
            throttled: vec![],
            iocost: None,
            wbt: None,
            iolatency: None,
            env: env(),
        }
    }

    pub fn by_topic<'a>(f: &'a [Finding], topic: &str) -> &'a Finding {
        f.iter()
            .find(|x| x.topic == topic)
            .unwrap_or_else(|| panic!("no finding {topic} in {f:#?}"))
    }

    /// The finding's text starts with `prefix` (the rest carries numbers of the moment).
    #[track_caller]
    pub fn assert_starts(f: &Finding, prefix: &str) {
        assert!(
            f.finding.starts_with(prefix),
            "{:?} does not start with {prefix:?}",
            f.finding
        );
    }
}
