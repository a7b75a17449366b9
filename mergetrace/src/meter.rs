//! Where the meter sits: the same I/O counted per bio (what blk-throttle charges), per device
//! request, and by a cloud-volume meter that counts requests in fixed units — and the verdict
//! the article draws from them. Pure arithmetic, unit-tested.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::limits::{Effective, LimitKind};

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Meters {
    /// Units under a per-bio meter (io.max / blkio.throttle): every bio and split remainder.
    pub per_bio: u64,
    /// Units under a per-request meter: requests the device saw.
    pub per_request: u64,
    /// Units under cloud-volume meters that count each request in units of `unit_bytes`.
    pub cloud: Vec<CloudMeter>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CloudMeter {
    pub unit_bytes: u64,
    pub units: u64,
}

/// A limit in force and how much of it this cgroup used in the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitUse {
    pub limit: u64,
    /// The cgroup whose file sets the limit (this one or an ancestor).
    pub cgroup: String,
    /// This cgroup's use over the window, in percent of the limit.
    pub used_pct: f64,
}

/// Throttle limits that apply to a direction (`bio_data_dir`: discards count as writes).
pub fn kinds_for(write: bool) -> [LimitKind; 2] {
    if write {
        [LimitKind::Wiops, LimitKind::Wbps]
    } else {
        [LimitKind::Riops, LimitKind::Rbps]
    }
}

/// How much of each limit in force the window's charges used.
pub fn limit_use(
    eff: &Effective,
    write: bool,
    charged_ios: u64,
    charged_bytes: u64,
    secs: f64,
) -> BTreeMap<&'static str, LimitUse> {
    let mut out = BTreeMap::new();
    for k in kinds_for(write) {
        if let Some(l) = eff.get(k) {
            let charged = if k.is_iops() {
                charged_ios
            } else {
                charged_bytes
            };
            let used_pct = if secs > 0.0 && l.limit > 0 {
                charged as f64 / secs / l.limit as f64 * 100.0
            } else {
                0.0
            };
            out.insert(
                k.name(),
                LimitUse {
                    limit: l.limit,
                    cgroup: l.cgroup.clone(),
                    used_pct,
                },
            );
        }
    }
    out
}

/// Above this share of a limit, the limit is what binds.
pub const BINDING_PCT: f64 = 80.0;

fn human_rate(bytes_per_s: u64) -> String {
    let b = bytes_per_s as f64;
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB/s", b / 1048576.0)
    } else {
        format!("{:.0} KiB/s", b / 1024.0)
    }
}

/// The one-line verdict for a cgroup and direction, in the words of the article; `None` when
/// no limit is in force and nothing was throttled.
pub fn verdict(
    limits: &BTreeMap<&'static str, LimitUse>,
    bios: u64,
    requests: u64,
    throttled_bios: u64,
) -> Option<String> {
    let mut parts = Vec::new();
    let fewer = (requests > 0).then(|| bios as f64 / requests as f64);
    // Bios that waited mean a limit bound at some point of the window, even if the average
    // use over the window is low (the workload may have run for part of it): the most-used
    // limit is the one that held them.
    let most_used = limits
        .iter()
        .max_by(|a, b| a.1.used_pct.total_cmp(&b.1.used_pct))
        .map(|(n, _)| *n);
    for (name, u) in limits {
        let binding = u.used_pct >= BINDING_PCT || (throttled_bios > 0 && Some(*name) == most_used);
        let iops = name.ends_with("iops");
        let shown = if iops {
            u.limit.to_string()
        } else {
            human_rate(u.limit)
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
        } else if iops {
            let merging = match fewer {
                Some(x) if x >= 1.05 => format!("the device saw {x:.1}× fewer requests"),
                Some(_) => "the device saw as many requests as bios".to_string(),
                None => "the device saw no requests".to_string(),
            };
            parts.push(format!(
                "{name} {shown}{inherited} is {:.0} % used by bios; {merging}; this limit counts before merging, \
                 so merging cannot raise your IOPS — submit larger bios",
                u.used_pct
            ));
        } else {
            parts.push(format!(
                "{name} {shown}{inherited} is {:.0} % used; merging does not change bytes, so it cannot raise your throughput",
                u.used_pct
            ));
        }
    }
    if parts.is_empty() && throttled_bios > 0 {
        parts.push(format!(
            "{throttled_bios} bios waited in blk-throttle, but no limit is set now"
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Limit;

    fn eff_wiops(v: u64) -> Effective {
        Effective {
            wiops: Some(Limit {
                limit: v,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_articles_throttle_verdict() {
        // 30,048 bios in 15 s under wiops=2000, 943 device requests
        let lu = limit_use(&eff_wiops(2000), true, 30_048, 30_048 * 4096, 15.0);
        let used = lu["wiops"].used_pct;
        assert!((used - 100.16).abs() < 0.01, "{used}");
        let v = verdict(&lu, 30_048, 943, 29_000).unwrap();
        assert_eq!(
            v,
            "wiops 2000 (set on /mt) is 100 % used by bios; the device saw 31.9× fewer requests; this limit counts \
             before merging, so merging cannot raise your IOPS — submit larger bios"
        );
        // merging off: as many requests as bios
        let v = verdict(&lu, 30_048, 30_048, 29_000).unwrap();
        assert!(v.contains("as many requests as bios"), "{v}");
    }

    #[test]
    fn idle_limits_and_bps_limits() {
        let lu = limit_use(&eff_wiops(2000), true, 100, 0, 1.0);
        assert_eq!(
            verdict(&lu, 100, 100, 0).unwrap(),
            "wiops 2000 (set on /mt) is 5 % used: not binding"
        );
        // bios waited, so the limit bound for part of the window
        assert!(verdict(&lu, 100, 100, 7)
            .unwrap()
            .starts_with("wiops 2000 (set on /mt) is 5 % used by bios;"));
        assert!(
            limit_use(&eff_wiops(2000), false, 100, 0, 1.0).is_empty(),
            "a write limit does not apply to reads"
        );
        let e = Effective {
            wbps: Some(Limit {
                limit: 8 << 20,
                cgroup: "/mt".into(),
            }),
            ..Default::default()
        };
        let lu = limit_use(&e, true, 2048, 8 << 20, 1.0);
        assert!(verdict(&lu, 2048, 64, 10)
            .unwrap()
            .contains("wbps 8.0 MiB/s (set on /mt) is 100 % used; merging does not change bytes"));
        assert_eq!(verdict(&BTreeMap::new(), 1, 1, 0), None);
        assert!(verdict(&BTreeMap::new(), 1, 1, 5)
            .unwrap()
            .contains("no limit is set now"));
    }
}
