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

/// A limit in force and how much of it this cgroup used in the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// How much of each limit in force the window's charges used.
pub fn limit_use(
    eff: &Effective,
    write: bool,
    charged: Charged,
    secs: f64,
) -> BTreeMap<&'static str, LimitUse> {
    let pct = |n: u64, limit: u64| {
        if secs > 0.0 && limit > 0 {
            n as f64 / secs / limit as f64 * 100.0
        } else {
            0.0
        }
    };
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
                },
            );
        }
    }
    out
}

/// Above this share of a limit, the limit is what binds.
pub const BINDING_PCT: f64 = 80.0;

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

/// What one cgroup and direction did, as the verdict needs it.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    /// Bios submitted, flush-only writes left out (they never reach a request).
    pub bios: u64,
    /// Split remainders: each a piece of its own.
    pub splits: u64,
    pub requests: u64,
    pub charged_ios: u64,
    pub throttled_bios: u64,
    /// The time they waited in all, where measured (fentry tier).
    pub throttle_delay_ns: Option<u64>,
    /// Why bios were split, when they were ([`split_cause`]).
    pub split_cause: Option<String>,
}

/// The limit's use in the window. Above 100 % the window was charged for bios that had waited
/// before it (a bio is charged as it is released), which is a sign of binding, not an error.
fn use_phrase(u: &LimitUse) -> String {
    if u.used_pct > 105.0 {
        format!(
            "was charged {:.0} % of its rate (bios held back earlier are charged as they are \
             released)",
            u.used_pct
        )
    } else {
        format!("is {:.0} % used", u.used_pct)
    }
}

/// What waited in the window, when bios did: ", 640 of them waited (11.3 s in all)".
fn held_phrase(a: &Activity, of_them: bool) -> String {
    if a.throttled_bios == 0 {
        return String::new();
    }
    let n = fmt::thousands(a.throttled_bios);
    let waited = if of_them {
        format!(", {n} of them waited")
    } else {
        format!(", {n} bios waited")
    };
    match a.throttle_delay_ns {
        Some(ns) if ns > 0 => format!("{waited} ({} in all)", fmt::span(ns as f64 / 1e9)),
        _ => waited,
    }
}

/// How the device's requests compare with the bios: merged, split, or one for one.
fn requests_vs_bios(a: &Activity) -> String {
    if a.requests == 0 {
        return "the device saw no requests".to_string();
    }
    let per_bio = a.requests as f64 / a.bios.max(1) as f64;
    if a.splits > 0 && per_bio >= 1.05 {
        return format!(
            "bios are split: the device saw {per_bio:.1}× more requests than bios ({})",
            a.split_cause.as_deref().unwrap_or("the queue's limits")
        );
    }
    let fewer = a.bios as f64 / a.requests as f64;
    if fewer >= 1.05 {
        format!("the device saw {fewer:.1}× fewer requests")
    } else {
        "the device saw as many requests as bios".to_string()
    }
}

/// Where merging compressed the charge: what a merge-aware limit would have used (a
/// what-if; no kernel counts this way).
fn merge_aware_what_if(u: &LimitUse) -> String {
    match u.used_pct_merge_aware {
        Some(m) if m < u.used_pct * 0.9 => format!(
            " (a limit counting the requests bios merged into, as proposed for blk-throttle in \
             2025 and in no kernel, would be {m:.0} % used)"
        ),
        _ => String::new(),
    }
}

/// The limits that held the cgroup back in the window, by name (`wiops`): those used at
/// [`BINDING_PCT`] or more, and where bios waited, the most used one — waiting means a limit
/// bound at some point of the window even if the average use is low (the workload may have
/// run for part of it).
pub fn binding(
    limits: &BTreeMap<&'static str, LimitUse>,
    throttled_bios: u64,
) -> Vec<&'static str> {
    let most_used = limits
        .iter()
        .max_by(|a, b| a.1.used_pct.total_cmp(&b.1.used_pct))
        .map(|(n, _)| *n);
    limits
        .iter()
        .filter(|(n, u)| {
            u.used_pct >= BINDING_PCT || (throttled_bios > 0 && Some(**n) == most_used)
        })
        .map(|(n, _)| *n)
        .collect()
}

/// The one-line verdict for a cgroup and direction; `None` when no limit is in force and
/// nothing was throttled.
pub fn verdict(limits: &BTreeMap<&'static str, LimitUse>, a: &Activity) -> Option<String> {
    let mut parts = Vec::new();
    let binds = binding(limits, a.throttled_bios);
    for (name, u) in limits {
        let binding = binds.contains(name);
        let iops = name.ends_with("iops");
        let shown = if iops {
            u.limit.to_string()
        } else {
            fmt::rate(u.limit)
        };
        let inherited = if u.cgroup.is_empty() {
            String::new()
        } else {
            format!(" (set on {})", u.cgroup)
        };
        if !binding {
            parts.push(format!(
                "{name} {shown}{inherited} is {:.0} % used: not binding",
                u.used_pct
            ));
        } else if iops && a.splits > 0 && a.requests > a.bios && a.charged_ios <= a.bios {
            // Kernels before 6.0 charge a bio once, before it is split (its pieces carry
            // BIO_THROTTLED): splitting costs nothing here, larger bios cost fewer ios.
            parts.push(format!(
                "{name} {shown}{inherited} {} by bios{}; {}; split pieces are not \
                 charged (this kernel charges a bio once, before splitting it), so the limit \
                 counts the bios you submit — submit larger bios",
                use_phrase(u),
                held_phrase(a, true),
                requests_vs_bios(a)
            ));
        } else if iops && a.splits > 0 && a.requests > a.bios {
            // Each charged io beyond the bios submitted is a split piece charged again (6.0+).
            let pieces = a.charged_ios.saturating_sub(a.bios);
            let share = pieces as f64 / a.charged_ios.max(1) as f64 * 100.0;
            parts.push(format!(
                "{name} {shown}{inherited} {} by bios and their split pieces{}; {}; \
                 {share:.0} % of the {} ios charged were split pieces (each piece costs one io, \
                 and a larger bio is only split further)",
                use_phrase(u),
                held_phrase(a, true),
                requests_vs_bios(a),
                a.charged_ios
            ));
        } else if iops {
            parts.push(format!(
                "{name} {shown}{inherited} {} by bios{}; {}; this limit counts before merging, \
                 so merging cannot raise your IOPS — submit larger bios{}",
                use_phrase(u),
                held_phrase(a, true),
                requests_vs_bios(a),
                merge_aware_what_if(u)
            ));
        } else {
            parts.push(format!(
                "{name} {shown}{inherited} {}{}; merging does not change bytes, so it cannot raise your throughput",
                use_phrase(u),
                held_phrase(a, false)
            ));
        }
    }
    if parts.is_empty() && a.throttled_bios > 0 {
        parts.push(format!(
            "{} bios waited in blk-throttle, but no limit is set now",
            a.throttled_bios
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::limits::Limit;

    fn eff_wiops(v: u64) -> Effective {
        Effective {
            wiops: Some(Limit {
                limit: v,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        }
    }

    /// Charged ios and bytes, each bio its own request (no merge).
    fn ch(ios: u64, bytes: u64) -> Charged {
        Charged {
            ios,
            bytes,
            requests_created: ios,
        }
    }

    #[test]
    fn throttle_verdict_for_merged_batches() {
        // 30,048 bios in 15 s under wiops=2000, 943 device requests
        let lu = limit_use(&eff_wiops(2000), true, ch(30_048, 30_048 * 4096), 15.0);
        let used = lu["wiops"].used_pct;
        assert!((used - 100.16).abs() < 0.01, "{used}");
        let act = |bios, requests| Activity {
            bios,
            requests,
            charged_ios: bios,
            throttled_bios: 29_000,
            ..Activity::default()
        };
        let v = verdict(&lu, &act(30_048, 943)).unwrap();
        assert_eq!(
            v,
            "wiops 2000 (set on /mt) is 100 % used by bios, 29,000 of them waited; the device saw 31.9× \
             fewer requests; this limit counts before merging, so merging cannot raise your IOPS — \
             submit larger bios"
        );
        // merging off: as many requests as bios
        let v = verdict(&lu, &act(30_048, 30_048)).unwrap();
        assert!(v.contains("as many requests as bios"), "{v}");
        // The merge-aware what-if: the 943 requests the bios made would use 3 % of the limit.
        let merge_aware = Charged {
            requests_created: 943,
            ..ch(30_048, 30_048 * 4096)
        };
        let lu = limit_use(&eff_wiops(2000), true, merge_aware, 15.0);
        let m = lu["wiops"].used_pct_merge_aware.unwrap();
        // 943 requests in 15 s against 2000/s.
        assert!((m - 943.0 / 15.0 / 2000.0 * 100.0).abs() < 1e-9, "{m}");
        let v = verdict(&lu, &act(30_048, 943)).unwrap();
        assert!(
            v.ends_with(
                "submit larger bios (a limit counting the requests bios merged into, as proposed \
                 for blk-throttle in 2025 and in no kernel, would be 3 % used)"
            ),
            "{v}"
        );
    }

    #[test]
    fn idle_limits_and_bps_limits() {
        let lu = limit_use(&eff_wiops(2000), true, ch(100, 0), 1.0);
        let act = |bios, requests, throttled_bios| Activity {
            bios,
            requests,
            charged_ios: bios,
            throttled_bios,
            ..Activity::default()
        };
        assert_eq!(
            verdict(&lu, &act(100, 100, 0)).unwrap(),
            "wiops 2000 (set on /mt) is 5 % used: not binding"
        );
        // bios waited, so the limit bound for part of the window
        assert!(verdict(&lu, &act(100, 100, 7))
            .unwrap()
            .starts_with("wiops 2000 (set on /mt) is 5 % used by bios, 7 of them waited;"));
        // A window charged for bios that waited before it, with the wait measured (fentry).
        let over = limit_use(&eff_wiops(2000), true, ch(8000, 0), 1.0);
        let v = verdict(
            &over,
            &Activity {
                throttle_delay_ns: Some(11_300_000_000),
                ..act(8000, 250, 8000)
            },
        )
        .unwrap();
        assert!(
            v.starts_with(
                "wiops 2000 (set on /mt) was charged 400 % of its rate (bios held back earlier are \
                 charged as they are released) by bios, 8,000 of them waited (11 s in all);"
            ),
            "{v}"
        );
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
        assert!(verdict(&lu, &act(2048, 64, 10))
            .unwrap()
            .contains("wbps 8.0 MiB/s (set on /mt) is 100 % used, 10 bios waited; merging does not change bytes"));
        assert_eq!(verdict(&BTreeMap::new(), &act(1, 1, 0)), None);
        assert!(verdict(&BTreeMap::new(), &act(1, 1, 5))
            .unwrap()
            .contains("no limit is set now"));
    }

    #[test]
    fn split_bios_under_an_iops_limit() {
        // max_sectors_kb 8, 64 KiB direct writes, wiops 1000: 512 bios, 3,584 split pieces,
        // 4,096 requests of 8 KiB, 4,096 ios charged.
        let lu = limit_use(&eff_wiops(1000), true, ch(4096, 512 * 65536), 4.096);
        let limits = SplitLimits {
            max_sectors_kb: Some(8),
            max_hw_sectors_kb: Some(1280),
            max_segments: Some(128),
            max_segment_size: Some(65536),
            chunk_sectors: Some(0),
            discard_max_bytes: Some(0),
        };
        let a = Activity {
            bios: 512,
            splits: 3584,
            requests: 4096,
            charged_ios: 4096,
            throttled_bios: 3000,
            throttle_delay_ns: None,
            split_cause: Some(split_cause(&limits, false, 8192.0)),
        };
        let v = verdict(&lu, &a).unwrap();
        assert_eq!(
            v,
            "wiops 1000 (set on /mt) is 100 % used by bios and their split pieces, 3,000 of them \
             waited; bios are split: \
             the device saw 8.0× more requests than bios (max_sectors_kb (8 KiB) caps each request; \
             raise max_sectors_kb (the device allows up to 1280 KiB), or submit bios of at most 8 KiB); \
             88 % of the 4096 ios charged were split pieces (each piece costs one io, and a larger \
             bio is only split further)"
        );
        assert!(!v.contains("as many requests as bios"));
        // 5.10 charges the 512 bios once each, before splitting: the pieces cost nothing.
        let lu510 = limit_use(&eff_wiops(1000), true, ch(512, 512 * 65536), 4.096);
        let v = verdict(
            &lu510,
            &Activity {
                charged_ios: 512,
                ..a.clone()
            },
        )
        .unwrap();
        assert!(
            v.contains("bios are split: the device saw 8.0× more requests than bios")
                && v.contains("split pieces are not charged")
                && v.ends_with("submit larger bios")
                && !v.contains("were split pieces"),
            "{v}"
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
