//! A synthetic run replayed interval by interval as the live view shows it: each interval's
//! snapshot judged knowing the intervals before it, added to a timeline, and the whole run
//! judged over them.
use std::collections::BTreeMap;

use mergetrace_common::Event;

use crate::{
    model::{
        aggregate::Aggregator,
        limits::Effective,
        snapshot::{Lookup, Options, Snapshot},
        timeline::{self, Cuts},
    },
    sys::{cgroups::CgroupName, device::Device},
};

/// The loop device the synthetic runs are on, and its `dev_t`.
pub fn loop7() -> Device {
    Device {
        name: "loop7".into(),
        major: 7,
        minor: 7,
        notes: vec![],
        bio_based: false,
    }
}
pub const LOOP7: u32 = 7 << 20 | 7;

/// Every cgroup id is `/cg<id>`; each path has the limits given.
pub struct Limited(pub BTreeMap<String, Effective>);

impl Lookup for Limited {
    fn cgroup_name(&mut self, id: u64) -> CgroupName {
        CgroupName {
            path: format!("/cg{id}"),
            gone: false,
        }
    }
    fn limits(&mut self, cgroup: &str, _dev: &Device) -> Effective {
        self.0.get(cgroup).cloned().unwrap_or_default()
    }
}

/// What the live view showed of a run: each interval, and the whole run.
pub struct Replayed {
    pub intervals: Vec<Snapshot>,
    pub total: Snapshot,
}

/// `events` (in time order) from `start_ns` to `end_ns`, cut every `every_ns`, on [`loop7`],
/// on the fentry tier or the tracepoint tier.
pub fn replay(
    events: &[Event],
    (start_ns, end_ns, every_ns): (u64, u64, u64),
    lookup: &mut dyn Lookup,
    fentry: bool,
) -> Replayed {
    let opts = Options {
        tier: if fentry { "fentry" } else { "tracepoint" },
        fentry,
        meter_units: &[],
        subtree: None,
        iocost: &BTreeMap::new(),
        wbt: &BTreeMap::new(),
        iolatency: &BTreeMap::new(),
        timeline: None,
        wants: crate::kernel::Wants::ALL,
        per_bio: false,
    };
    let mut agg = Aggregator::new(start_ns);
    let mut cuts = Cuts::new(&agg, start_ns, every_ns);
    for ev in events {
        cuts.up_to(&agg, ev.ts_ns);
        agg.apply(ev);
    }
    let windows = cuts.finish(&agg, end_ns);
    let (intervals, total) =
        timeline::judged(&windows, &agg.total(end_ns), &[loop7()], lookup, &opts);
    Replayed { intervals, total }
}
