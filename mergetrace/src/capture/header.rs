//! What a capture records besides events: the run's context at its start (header chunk) and
//! its totals at a clean close (end chunk). Both are JSON, so they describe themselves; a
//! reader ignores fields it does not know and defaults fields that are missing.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::format::FORMAT_VERSION;
use crate::model::{iocost::Linear, limits::Limits};

/// The header chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Header {
    /// Format version of the file; the writer sets it (the preamble has the same number).
    pub format_version: u16,
    /// Version of the mergetrace that wrote the file.
    pub mergetrace_version: String,
    /// `uname -r` of the traced kernel.
    pub kernel_release: String,
    /// "tracepoint" or "fentry".
    pub tier: String,
    /// CLOCK_MONOTONIC nanoseconds at the start (the clock of the events' `ts_ns`).
    pub start_monotonic_ns: u64,
    /// Wall-clock time at the start, Unix nanoseconds.
    pub start_unix_ns: u64,
    /// The traced devices (whole disks).
    pub devices: Vec<RecordedDevice>,
    /// Hierarchy hosting the io controller: "v1" or "v2".
    pub cgroup_hierarchy: String,
    /// Its mount point, e.g. "/sys/fs/cgroup/blkio".
    pub cgroup_mount: String,
    /// Cgroup id (the events' `cgroup_id`) → path relative to the mount, at the start.
    pub cgroups: Vec<RecordedCgroup>,
    /// Throttle limits each cgroup sets itself (not inherited ones), per device, at the start.
    /// Cgroups without limits are left out.
    pub limits: Vec<RecordedLimits>,
    /// Cloud-volume meter unit sizes (bytes) the run was asked to count.
    pub meter_units: Vec<u64>,
    /// Issue events of requests issued again after a requeue carry `flags::REISSUE`
    /// (mergetrace 0.2 on). Readers of older captures flag them from the requeue events.
    pub reissues_flagged: bool,
    /// Insert, issue and request-merge events carry their request's bios and merges
    /// (`mergetrace_common::rq_aux`), counted per request. Older captures are counted from
    /// their per-bio events instead.
    pub per_request: bool,
    /// Recorded with `record --requests`: request events only (and the per-bio events only a
    /// meter in force needed); counted per request, no bio-by-bio lineage.
    pub requests_only: bool,
    /// A `record --requests` capture without plug flush events (`record --requests` without
    /// `--plug-flushes`, mergetrace 0.2 on): its report has no plug flush depths. Absent
    /// (older captures, full captures): they are in it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_plug_flushes: bool,
    /// Fields this build does not know (from a newer writer of the same format version):
    /// kept so that reading and writing a header again does not lose them.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A traced device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedDevice {
    pub name: String,
    pub major: u32,
    pub minor: u32,
    /// No request queue (zram, device-mapper, md): bios only.
    pub bio_based: bool,
    pub notes: Vec<String>,
    /// Its queue settings at the start.
    pub queue: RecordedQueue,
    /// io.cost on the disk at the start, when it was on (absent before mergetrace 0.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iocost: Option<RecordedIocost>,
    /// wbt on the disk at the start, where its queue has it (absent before mergetrace 0.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wbt: Option<crate::sys::wbt::Wbt>,
    /// io.latency's targets for the disk at the start, where any were set (absent before
    /// mergetrace 0.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iolatency: Option<crate::sys::iolatency::IoLatency>,
}

/// io.cost's settings of a disk: the lines as the kernel printed them and the model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedIocost {
    pub qos: String,
    pub model: String,
    pub read: Linear,
    pub write: Linear,
}

/// Settings from `/sys/block/NAME/queue/` at the start; `None` = the file was not readable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedQueue {
    /// The active I/O scheduler ("mq-deadline", "none", ...).
    pub scheduler: Option<String>,
    pub nomerges: Option<u64>,
    pub max_sectors_kb: Option<u64>,
    pub max_segments: Option<u64>,
    pub nr_requests: Option<u64>,
    pub rotational: Option<bool>,
    /// The other limits that split bios (absent in captures of mergetrace 0.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hw_sectors_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_segment_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chunk_sectors: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discard_max_bytes: Option<u64>,
}

impl RecordedQueue {
    /// The limits that split bios, for the verdict.
    pub fn split_limits(&self) -> crate::model::meter::SplitLimits {
        crate::model::meter::SplitLimits {
            max_sectors_kb: self.max_sectors_kb,
            max_hw_sectors_kb: self.max_hw_sectors_kb,
            max_segments: self.max_segments,
            max_segment_size: self.max_segment_size,
            chunk_sectors: self.chunk_sectors,
            discard_max_bytes: self.discard_max_bytes,
        }
    }
}

/// The payload of a `c` chunk: cgroups first seen after the header was written (created
/// during the run), named when their events arrived, with the limits they set then.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LateCgroups {
    pub cgroups: Vec<RecordedCgroup>,
    pub limits: Vec<RecordedLimits>,
}

impl Header {
    /// Adds what a `c` chunk says; ids the header already names keep their first path.
    pub fn add_late(&mut self, late: LateCgroups) {
        for c in late.cgroups {
            if !self.cgroups.iter().any(|k| k.id == c.id) {
                self.cgroups.push(c);
            }
        }
        self.limits.extend(late.limits);
    }
}

/// One cgroup id and its path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedCgroup {
    pub id: u64,
    /// Relative to the hierarchy's mount, "/" for the root.
    pub path: String,
    /// Its readable name as the recording machine read it, with what the runtimes' files
    /// there said (the container's name); absent for none of the known kinds, and in captures
    /// before mergetrace 0.2 (a report reads those from the path).
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "name_if_known"
    )]
    pub name: Option<crate::sys::container::ReadableName>,
}

/// A recorded name this build cannot read (a newer writer's kind) is no name: the report
/// reads it from the path, and the rest of the header still reads.
fn name_if_known<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::sys::container::ReadableName>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// The limits one cgroup sets on one device; `None` = no limit ("max").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordedLimits {
    pub cgroup: String,
    pub major: u32,
    pub minor: u32,
    pub rbps: Option<u64>,
    pub wbps: Option<u64>,
    pub riops: Option<u64>,
    pub wiops: Option<u64>,
}

impl RecordedDevice {
    /// The device number its events carry.
    pub fn dev(&self) -> mergetrace_common::vocab::Dev {
        mergetrace_common::vocab::Dev::new(self.major, self.minor)
    }
}

impl RecordedLimits {
    pub fn new(cgroup: &str, major: u32, minor: u32, l: &Limits) -> RecordedLimits {
        RecordedLimits {
            cgroup: cgroup.to_string(),
            major,
            minor,
            rbps: l.rbps,
            wbps: l.wbps,
            riops: l.riops,
            wiops: l.wiops,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            rbps: self.rbps,
            wbps: self.wbps,
            riops: self.riops,
            wiops: self.wiops,
        }
    }
}

impl From<&RecordedDevice> for crate::sys::device::Device {
    fn from(d: &RecordedDevice) -> Self {
        crate::sys::device::Device {
            name: d.name.clone(),
            major: d.major,
            minor: d.minor,
            notes: d.notes.clone(),
            bio_based: d.bio_based,
        }
    }
}

impl From<&crate::sys::device::Device> for RecordedDevice {
    fn from(d: &crate::sys::device::Device) -> Self {
        RecordedDevice {
            name: d.name.clone(),
            major: d.major,
            minor: d.minor,
            bio_based: d.bio_based,
            notes: d.notes.clone(),
            queue: RecordedQueue::default(),
            iocost: None,
            wbt: None,
            iolatency: None,
        }
    }
}

impl Header {
    /// A header with this host's facts filled in (versions, kernel release, start times) and
    /// everything about devices and cgroups left for the caller.
    pub fn for_this_host(tier: &str) -> Header {
        Header {
            format_version: FORMAT_VERSION,
            mergetrace_version: env!("CARGO_PKG_VERSION").to_string(),
            kernel_release: crate::sys::release::running(),
            tier: tier.to_string(),
            start_monotonic_ns: crate::kernel::monotonic_ns(),
            start_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            reissues_flagged: true,
            per_request: true,
            ..Header::default()
        }
    }
}

/// The end chunk: totals of a cleanly closed capture.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Trailer {
    /// Events in the file.
    pub events: u64,
    /// Sum of the lost-event counts in the file.
    pub lost: u64,
    /// Events and lost chunks in the file (not counting the header and end chunks).
    pub chunks: u64,
    /// Smallest and largest event timestamp, if there were events.
    pub min_ts_ns: Option<u64>,
    pub max_ts_ns: Option<u64>,
    /// CLOCK_MONOTONIC nanoseconds when the capture was closed.
    pub end_monotonic_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_header_json_round_trip_keeps_unknown_fields() {
        let mut h = Header::for_this_host("tracepoint");
        h.devices.push(RecordedDevice {
            name: "loop3".into(),
            major: 7,
            minor: 3,
            bio_based: false,
            notes: vec![],
            queue: RecordedQueue {
                scheduler: Some("mq-deadline".into()),
                nomerges: Some(0),
                ..RecordedQueue::default()
            },
            iocost: None,
            wbt: None,
            iolatency: None,
        });
        h.cgroups.push(RecordedCgroup {
            id: u64::MAX,
            path: "/a/b".into(),
            name: None,
        });
        // a name a runtime's files gave, as the recording machine read it
        let path = format!("/libpod_parent/libpod-{}", "ad".repeat(32));
        let mut name = crate::sys::container::readable(&path).unwrap();
        name.container_name = Some("web".into());
        name.refresh_short();
        h.cgroups.push(RecordedCgroup {
            id: 9,
            path,
            name: Some(name),
        });
        h.limits.push(RecordedLimits {
            cgroup: "/a".into(),
            major: 7,
            minor: 3,
            wiops: Some(500),
            ..RecordedLimits::default()
        });
        let mut v = serde_json::to_value(&h).unwrap();
        v["from_the_future"] = serde_json::json!({"x": 1});
        let back: Header = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back.extra["from_the_future"], serde_json::json!({"x": 1}));
        assert_eq!(serde_json::to_value(&back).unwrap(), v);
        let mut plain = back.clone();
        plain.extra.clear();
        assert_eq!(plain, h);
        // A name of a kind this build does not know is no name; the header still reads.
        let future: Header = serde_json::from_str(
            r#"{"cgroups":[{"id":3,"path":"/x","name":{"kind":"wasm","short":"wasm:x"}}]}"#,
        )
        .unwrap();
        assert_eq!((future.cgroups[0].id, &future.cgroups[0].name), (3, &None));
        // An old writer's header without most fields still reads.
        let old: Header = serde_json::from_str(r#"{"format_version":1,"tier":"fentry"}"#).unwrap();
        assert_eq!(old.tier, "fentry");
    }
}
