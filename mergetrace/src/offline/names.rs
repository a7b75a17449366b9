//! Names for what a capture records as numbers: devices, cgroups, ops, merge paths, flags,
//! times since the capture's start. Shared by `report --lineage` and `export`.
use std::collections::HashMap;

use mergetrace_common::{
    kind,
    vocab::{self, Dev},
};

use crate::{
    capture::{Header, HeaderLookup},
    model::aggregate::Dir,
    model::snapshot::Lookup,
};

pub struct Names {
    /// CLOCK_MONOTONIC ns of the capture's start.
    pub start_ns: u64,
    devices: HashMap<u32, String>,
    cgroups: HashMap<u64, String>,
    lookup: HeaderLookup,
}

impl Names {
    pub fn new(h: &Header) -> Names {
        Names {
            start_ns: h.start_monotonic_ns,
            devices: h
                .devices
                .iter()
                .map(|d| (d.dev().0, d.name.clone()))
                .collect(),
            cgroups: HashMap::new(),
            lookup: HeaderLookup::new(h),
        }
    }

    /// The device's name, or "MAJ:MIN" if the header does not know it.
    pub fn device(&self, dev: u32) -> String {
        self.devices
            .get(&dev)
            .cloned()
            .unwrap_or_else(|| maj_min(dev))
    }

    /// The cgroup's path as the snapshot names it ("(none)", "(unknown cgroup id N)").
    pub fn cgroup(&mut self, id: u64) -> &str {
        let lookup = &mut self.lookup;
        self.cgroups
            .entry(id)
            .or_insert_with(|| lookup.cgroup_name(id).path)
    }

    /// Seconds since the capture's start.
    pub fn secs(&self, ts_ns: u64) -> f64 {
        ts_ns as f64 / 1e9 - self.start_ns as f64 / 1e9
    }

    /// Nanoseconds since the capture's start (0 for events before it).
    pub fn rel_ns(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.start_ns)
    }
}

/// "7:2"
pub fn maj_min(dev: u32) -> String {
    Dev(dev).to_string()
}

/// The name of a `REQ_OP_*` value ("op200" for one without a name).
pub fn op_name(op: u8) -> String {
    vocab::op_name(op).map_or_else(|| format!("op{op}"), str::to_string)
}

/// The diskstats direction of an op: read, write, discard, flush.
pub fn dir_name(op: u8) -> &'static str {
    Dir::of_op(op).name()
}

/// Names of the set bits of an event's flags, joined by '|' ("" for none); bits without a
/// name as hex.
pub fn flag_names(f: u8) -> String {
    let mut s = String::new();
    let mut rest = f;
    for (bit, name) in vocab::FLAG_NAMES {
        if f & bit != 0 {
            if !s.is_empty() {
                s.push('|');
            }
            s.push_str(name);
            rest &= !bit;
        }
    }
    if rest != 0 {
        if !s.is_empty() {
            s.push('|');
        }
        s.push_str(&format!("0x{rest:02x}"));
    }
    s
}

/// The merge path of a bio merge event ("plug", "elevator", "sw_queue", "unknown"); `None`
/// for other kinds.
pub fn merge_path(ev_kind: u8, path: u8) -> Option<&'static str> {
    matches!(ev_kind, kind::BACK_MERGE | kind::FRONT_MERGE).then(|| vocab::merge_path_name(path))
}

/// A kernel address as "0x…" (JSON numbers lose precision above 2^53).
pub fn addr(a: u64) -> String {
    format!("{a:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_numbers() {
        assert_eq!(op_name(1), "write");
        assert_eq!(op_name(200), "op200");
        assert_eq!(dir_name(9), "write");
        assert_eq!(flag_names(0), "");
        assert_eq!(
            flag_names(
                mergetrace_common::flags::THROTTLE_RELEASED | mergetrace_common::flags::RULES_IOPS
            ),
            "throttle_released|rules_iops"
        );
        assert_eq!(flag_names(0x80), "iocost");
        assert_eq!(merge_path(kind::BACK_MERGE, 1), Some("plug"));
        assert_eq!(merge_path(kind::GETRQ, 1), None);
        assert_eq!(maj_min(7 << 20 | 2), "7:2");
        assert_eq!(addr(0xffff_8880_0000_0100), "0xffff888000000100");
        let h = Header {
            start_monotonic_ns: 1_000_000_000,
            cgroups: vec![crate::capture::RecordedCgroup {
                id: 5,
                path: "/a".into(),
                name: None,
            }],
            ..Header::default()
        };
        let mut n = Names::new(&h);
        assert_eq!(n.cgroup(5), "/a");
        assert_eq!(n.cgroup(0), "(none)");
        assert_eq!(n.cgroup(9), "(unknown cgroup id 9)");
        assert_eq!(n.device(7 << 20 | 2), "7:2");
        assert_eq!(n.secs(1_500_000_000), 0.5);
    }
}
