//! Where the meter sits: the same I/O counted per bio (what blk-throttle charges), per device
//! request, and by a cloud-volume meter that counts requests in fixed units — and the verdict
//! drawn from them. Pure arithmetic, unit-tested.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    fmt,
    model::limits::{Effective, LimitKind},
};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Meters {
    /// Units under a per-bio meter (io.max / blkio.throttle): every bio and split remainder.
    pub per_bio: u64,
    /// Units under a per-request meter: requests the device saw.
    pub per_request: u64,
    /// Units under a merge-aware iops limit, a what-if: the requests bios created (issued ones,
    /// those a request-request merge absorbed later, flush-only writes), i.e. bios + splits
    /// minus the bios that merged into a request. A 2025 blk-throttle patch ("support io merge
    /// over iops_limit", not merged) proposed refunding a merged bio's io like this.
    pub per_request_created: u64,
    /// Units under cloud-volume meters that count each request in units of `unit_bytes`.
    pub cloud: Vec<CloudMeter>,
    /// What io.cost charged, where the disk has io.cost on (reads and writes of cgroups other
    /// than the root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iocost: Option<crate::model::iocost::Charge>,
    /// What wbt counted, where the disk has wbt on (writes and discards).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wbt: Option<crate::model::wbt::WbtCount>,
    /// What io.latency counted, where the disk has io.latency targets (reads, writes and
    /// discards of cgroups other than the root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iolatency: Option<crate::model::iolatency::IolatencyCount>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudMeter {
    pub unit_bytes: u64,
    pub units: u64,
}

/// A cloud provider's documented way of counting a volume's I/O operations, as a meter unit:
/// each request counts ceil(size / unit), at least 1 (docs/meters.md gives each source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloudPreset {
    pub name: &'static str,
    pub unit_bytes: u64,
    pub rule: &'static str,
}

const EBS_SSD: &str = "EBS SSD volumes count an I/O of up to 256 KiB as one operation and larger \
                       ones in 256 KiB units";
const EBS_HDD: &str = "EBS HDD volumes count sequential I/O in 1 MiB units and each random I/O \
                       as one";

/// The presets `--meter-unit` takes by name.
pub const CLOUD_PRESETS: &[CloudPreset] = &[
    CloudPreset {
        name: "aws-gp2",
        unit_bytes: 256 << 10,
        rule: EBS_SSD,
    },
    CloudPreset {
        name: "aws-gp3",
        unit_bytes: 256 << 10,
        rule: EBS_SSD,
    },
    CloudPreset {
        name: "aws-io1",
        unit_bytes: 256 << 10,
        rule: EBS_SSD,
    },
    CloudPreset {
        name: "aws-io2",
        unit_bytes: 256 << 10,
        rule: EBS_SSD,
    },
    CloudPreset {
        name: "aws-st1",
        unit_bytes: 1 << 20,
        rule: EBS_HDD,
    },
    CloudPreset {
        name: "aws-sc1",
        unit_bytes: 1 << 20,
        rule: EBS_HDD,
    },
    CloudPreset {
        name: "azure-ultra",
        unit_bytes: 256 << 10,
        rule: "Azure Ultra Disk: one operation transfers 4 KiB to 256 KiB",
    },
];

/// The preset of this name (lower case), if any.
pub fn cloud_preset(name: &str) -> Option<&'static CloudPreset> {
    CLOUD_PRESETS.iter().find(|p| p.name == name)
}

/// A limit in force, how much of it this cgroup used in the window, and whether it held the
/// cgroup back.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LimitUse {
    pub limit: u64,
    /// The cgroup whose file sets the limit (this one or an ancestor).
    pub cgroup: String,
    /// This cgroup's use over the window, in percent of the limit.
    pub used_pct: f64,
    /// iops limits: the use had the limit counted `Meters::per_request_created` instead of
    /// bios (the merge-aware what-if).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_pct_merge_aware: Option<f64>,
    /// It held the cgroup back in the window: bios of the direction waited in blk-throttle and
    /// this limit was the most used of the direction's (in a whole run with intervals: it did
    /// so in at least one interval, `intervals_held`).
    pub held: bool,
    /// The live view's total: the use over the intervals in which the cgroup did I/O in the
    /// direction (`over_time.active_secs`), not over the whole run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_pct_active: Option<f64>,
    /// The live view's total: the intervals in which this limit held the cgroup back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intervals_held: Option<u64>,
    /// The live view's total, where the limit changed while the cgroup did I/O (or was
    /// removed while it went on): each value it had, oldest first. `limit` and `cgroup` are
    /// then those of the value in force longest; the use and the intervals held are over
    /// all of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<LimitSpan>>,
    /// With `changes`: the seconds it was in force while the cgroup did I/O (what
    /// `used_pct_active` divides by).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_force_secs: Option<f64>,
    /// It was removed while the cgroup did I/O: in an interval, after some of the window's
    /// bios were charged under it; in a whole run, before the cgroup's last I/O.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// One blk-throttle limit as it stood over the intervals in which a cgroup did I/O in a
/// direction, until it changed or went (JSON `limits.*.changes`, where it changed).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LimitSpan {
    pub limit: u64,
    /// The cgroup whose file set it (this one or an ancestor).
    pub cgroup: String,
    /// From the start of the first interval it was seen in to the end of the last
    /// (CLOCK_MONOTONIC ns).
    pub from_ns: u64,
    pub to_ns: u64,
    /// The intervals with I/O it was seen in, and in how many of them it held the cgroup back.
    pub intervals: u64,
    pub intervals_held: u64,
    /// The seconds of those intervals, and its use summed over them (percent × seconds): the
    /// use over the time it was in force while the cgroup did I/O is their ratio.
    #[serde(skip)]
    pub active_secs: f64,
    #[serde(skip)]
    pub used_pct_secs: f64,
    #[serde(skip)]
    pub merge_aware_pct_secs: Option<f64>,
    /// Seen in the last interval with I/O (a span not seen then is over).
    #[serde(skip)]
    open: bool,
}

impl LimitSpan {
    /// A span that starts with limit `u` at `from_ns`.
    pub fn starting(u: &LimitUse, from_ns: u64) -> LimitSpan {
        LimitSpan {
            limit: u.limit,
            cgroup: u.cgroup.clone(),
            from_ns,
            open: true,
            ..LimitSpan::default()
        }
    }

    /// Whether limit `u`, in force now, is this span going on (it was in force in the last
    /// interval with I/O, with the same value, set on the same cgroup).
    pub fn continues(&self, u: &LimitUse) -> bool {
        self.open && self.limit == u.limit && self.cgroup == u.cgroup
    }

    pub fn end(&mut self) {
        self.open = false;
    }

    /// Adds an interval with I/O that ended at `to_ns`, `secs` long, in which it was in force
    /// with use `u`, and held the cgroup back or not.
    pub fn add(&mut self, u: &LimitUse, (to_ns, secs): (u64, f64), held: bool) {
        self.to_ns = to_ns;
        self.intervals += 1;
        self.intervals_held += held as u64;
        self.active_secs += secs;
        self.used_pct_secs += u.used_pct * secs;
        self.merge_aware_pct_secs = u
            .used_pct_merge_aware
            .map(|m| self.merge_aware_pct_secs.unwrap_or(0.0) + m * secs);
    }

    /// Its use over the seconds it was in force while the cgroup did I/O.
    pub fn used_pct_active(&self) -> f64 {
        if self.active_secs > 0.0 {
            self.used_pct_secs / self.active_secs
        } else {
            0.0
        }
    }
}

/// Throttle limits that apply to a direction (`bio_data_dir`: discards count as writes).
pub fn kinds_for(write: bool) -> [LimitKind; 2] {
    if write {
        [LimitKind::Wiops, LimitKind::Wbps]
    } else {
        [LimitKind::Riops, LimitKind::Rbps]
    }
}

/// What a window charged: blk-throttle's ios and bytes, and the requests its bios created
/// (what a merge-aware iops limit would have charged).
#[derive(Debug, Clone, Copy, Default)]
pub struct Charged {
    pub ios: u64,
    pub bytes: u64,
    pub requests_created: u64,
}

/// `n` charged over `secs` in percent of a `limit` per second.
pub fn pct(n: u64, limit: u64, secs: f64) -> f64 {
    if secs > 0.0 && limit > 0 {
        n as f64 / secs / limit as f64 * 100.0
    } else {
        0.0
    }
}

/// How much of each limit in force the window's charges used.
pub fn limit_use(
    eff: &Effective,
    write: bool,
    charged: Charged,
    secs: f64,
) -> BTreeMap<&'static str, LimitUse> {
    let pct = |n, limit| pct(n, limit, secs);
    let mut out = BTreeMap::new();
    for k in kinds_for(write) {
        if let Some(l) = eff.get(k) {
            let (used_pct, used_pct_merge_aware) = if k.is_iops() {
                (
                    pct(charged.ios, l.limit),
                    Some(pct(charged.requests_created, l.limit)),
                )
            } else {
                (pct(charged.bytes, l.limit), None)
            };
            out.insert(
                k.name(),
                LimitUse {
                    limit: l.limit,
                    cgroup: l.cgroup.clone(),
                    used_pct,
                    used_pct_merge_aware,
                    ..LimitUse::default()
                },
            );
        }
    }
    out
}

/// Queue limits that split bios (`/sys/block/NAME/queue`); `None` where unknown (a capture
/// from an older mergetrace, a file that could not be read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SplitLimits {
    pub max_sectors_kb: Option<u64>,
    pub max_hw_sectors_kb: Option<u64>,
    pub max_segments: Option<u64>,
    pub max_segment_size: Option<u64>,
    /// 0: no chunk boundary.
    pub chunk_sectors: Option<u64>,
    pub discard_max_bytes: Option<u64>,
}

/// Why bios were split, from the sizes of the pieces and the queue's limits.
pub fn split_cause(limits: &SplitLimits, discard: bool, avg_request_bytes: f64) -> String {
    if discard {
        return match limits.discard_max_bytes {
            Some(b) => format!(
                "discard_max_bytes ({}) caps each discard",
                fmt::exact_size(b)
            ),
            None => "the discard size limit (discard_max_bytes)".to_string(),
        };
    }
    if let Some(kb) = limits.max_sectors_kb {
        // Pieces of max_sectors_kb each, the last one shorter: the average is close to it.
        if avg_request_bytes >= 0.75 * (kb * 1024) as f64 {
            let lever = match limits.max_hw_sectors_kb {
                // Loop devices on 5.10 report UINT_MAX sectors: no limit worth quoting.
                Some(hw) if hw >= 1 << 30 => format!(
                    "raise max_sectors_kb (the device sets no practical limit), or submit bios of at most {kb} KiB"
                ),
                Some(hw) if hw > kb => format!(
                    "raise max_sectors_kb (the device allows up to {hw} KiB), or submit bios of at most {kb} KiB"
                ),
                _ => format!("{kb} KiB is the device's own limit: submit bios of at most {kb} KiB"),
            };
            return format!("max_sectors_kb ({kb} KiB) caps each request; {lever}");
        }
    }
    if let Some(c) = limits.chunk_sectors.filter(|c| *c > 0) {
        return format!(
            "I/O crossing a chunk boundary (chunk_sectors {} KiB) is split: align I/O to the chunk",
            c / 2
        );
    }
    match (limits.max_segments, limits.max_segment_size) {
        (Some(n), Some(sz)) => format!(
            "bios with more than {n} segments (or segments over {}) are split: use fewer, larger, \
             page-aligned buffers",
            fmt::exact_size(sz)
        ),
        _ => "the queue's size or segment limits".to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::limits::Limit;

    pub(crate) fn eff_wiops(v: u64) -> Effective {
        Effective {
            wiops: Some(Limit {
                limit: v,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        }
    }

    /// Charged ios and bytes, each bio its own request (no merge).
    pub(crate) fn ch(ios: u64, bytes: u64) -> Charged {
        Charged {
            ios,
            bytes,
            requests_created: ios,
        }
    }

    #[test]
    fn use_of_each_limit_and_the_merge_aware_what_if() {
        // 30,048 bios in 15 s under wiops=2000, 943 device requests
        let lu = limit_use(&eff_wiops(2000), true, ch(30_048, 30_048 * 4096), 15.0);
        let used = lu["wiops"].used_pct;
        assert!((used - 100.16).abs() < 0.01, "{used}");
        assert!(!lu["wiops"].held, "held is the verdict's to judge");
        // The merge-aware what-if: the 943 requests the bios made would use 3 % of the limit.
        let merge_aware = Charged {
            requests_created: 943,
            ..ch(30_048, 30_048 * 4096)
        };
        let lu = limit_use(&eff_wiops(2000), true, merge_aware, 15.0);
        let m = lu["wiops"].used_pct_merge_aware.unwrap();
        // 943 requests in 15 s against 2000/s.
        assert!((m - 943.0 / 15.0 / 2000.0 * 100.0).abs() < 1e-9, "{m}");
        assert!(
            limit_use(&eff_wiops(2000), false, ch(100, 0), 1.0).is_empty(),
            "a write limit does not apply to reads"
        );
        let e = Effective {
            wbps: Some(Limit {
                limit: 8 << 20,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        };
        let lu = limit_use(&e, true, ch(2048, 8 << 20), 1.0);
        assert_eq!(lu["wbps"].used_pct, 100.0);
        assert_eq!(lu["wbps"].used_pct_merge_aware, None);
    }

    /// A loop device's queue with max_sectors_kb lowered to 8.
    pub(crate) fn max_sectors_8() -> SplitLimits {
        SplitLimits {
            max_sectors_kb: Some(8),
            max_hw_sectors_kb: Some(1280),
            max_segments: Some(128),
            max_segment_size: Some(65536),
            chunk_sectors: Some(0),
            discard_max_bytes: Some(0),
        }
    }

    #[test]
    fn why_bios_were_split() {
        let limits = max_sectors_8();
        assert_eq!(
            split_cause(&limits, false, 8192.0),
            "max_sectors_kb (8 KiB) caps each request; raise max_sectors_kb (the device allows \
             up to 1280 KiB), or submit bios of at most 8 KiB"
        );
        // At the hardware limit the lever is the bio size.
        let hw = SplitLimits {
            max_hw_sectors_kb: Some(8),
            ..limits
        };
        assert!(split_cause(&hw, false, 8192.0).contains("the device's own limit"));
        // Pieces well below max_sectors_kb: the segment limits split them.
        assert!(split_cause(&limits, false, 4096.0).starts_with("bios with more than 128 segments"));
        let chunked = SplitLimits {
            chunk_sectors: Some(256),
            max_sectors_kb: Some(1280),
            ..limits
        };
        assert!(split_cause(&chunked, false, 4096.0).contains("chunk_sectors 128 KiB"));
        let discard = SplitLimits {
            discard_max_bytes: Some(4 << 20),
            ..limits
        };
        assert!(split_cause(&discard, true, 0.0).starts_with("discard_max_bytes (4 MiB)"));
    }
}
