//! io.cost (blk-iocost) as a meter: what it charged each cgroup, from the bios that started a
//! request (a base cost, sequential or random by the cgroup's cursor, plus a cost per 4 KiB
//! page) and those that merged into one (the page cost only) — so, unlike blk-throttle's iops
//! limit, merging lowers the charge. The arithmetic of `calc_lcoefs` and
//! `calc_vtime_cost_builtin` (block/blk-iocost.c); docs/meters.md says where it sits.
use serde::{Deserialize, Serialize};

use crate::fmt;

/// blk-iocost's vtime per second (`VTIME_PER_SEC`, 2^37).
const VTIME_PER_SEC: u64 = 1 << 37;
/// vtime per µs as io.stat's `cost.usage` divides it at vrate 100 % (`VTIME_PER_USEC`, the
/// kernel's enum truncates 137,438.95).
const VTIME_PER_USEC: f64 = 137_438.0;
/// io.cost's page: 4 KiB.
const PAGE_BYTES: u64 = 4096;

/// vtime in µs as io.stat's `cost.usage` counts them at vrate 100 %.
pub fn micros(vtime: u64) -> f64 {
    vtime as f64 / VTIME_PER_USEC
}

/// One direction's linear model, as `io.cost.model` gives it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Linear {
    pub bps: u64,
    pub seqiops: u64,
    pub randiops: u64,
}

/// One direction's coefficients in vtime (`calc_lcoefs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coefs {
    pub page: u64,
    pub seqio: u64,
    pub randio: u64,
}

impl Coefs {
    /// `calc_lcoefs(bps, seqiops, randiops)`: a page costs the time to move 4 KiB at `bps`;
    /// an I/O's base cost is its time at the iops rate less one page.
    pub fn of(m: Linear) -> Coefs {
        let page = VTIME_PER_SEC.div_ceil(m.bps.div_ceil(PAGE_BYTES).max(1));
        let io = |iops: u64| VTIME_PER_SEC.div_ceil(iops.max(1)).saturating_sub(page);
        Coefs {
            page,
            seqio: io(m.seqiops),
            randio: io(m.randiops),
        }
    }
}

/// The device's model: read coefficients and write coefficients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    pub read: Coefs,
    pub write: Coefs,
}

/// The raw io.cost counts of one (cgroup, device, direction), from the counting rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub random: u64,
    pub merged: u64,
    pub pages: u64,
}

impl Counts {
    /// The io.cost counts among a (cgroup, device, direction)'s counters.
    pub fn of(c: &crate::model::aggregate::Counts) -> Counts {
        Counts {
            requests: c.iocost_requests,
            random: c.iocost_random,
            merged: c.iocost_merged,
            pages: c.iocost_pages,
        }
    }
}

/// What io.cost charged one cgroup in one direction, in µs as io.stat's `cost.usage` counts
/// them at vrate 100 %.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Charge {
    /// Bios (and split pieces) that started a request: each paid a base cost.
    pub requests: u64,
    /// Of those, random by the cursor rule (more than 16 MiB from the cgroup's last end).
    pub random: u64,
    /// Bios that merged into a request: the page cost only.
    pub merged: u64,
    /// 4 KiB pages of all of them (each bio at least one).
    pub pages: u64,
    /// The base costs of `requests`.
    pub base_us: f64,
    /// The page costs of `pages`.
    pub size_us: f64,
    /// `base_us + size_us`: what `cost.usage` rises by.
    pub cost_us: f64,
    /// A what-if: the same bios unmerged, each merged bio paying a sequential base too.
    pub unmerged_cost_us: f64,
    /// The cgroup's `io.weight` for the disk, where known (absent in a device's total and in
    /// reports of captures).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u64>,
    /// Its share of the device among the cgroups io.cost charged in the window ([`shares`]),
    /// in percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_pct: Option<f64>,
}

impl Charge {
    pub fn of(c: Counts, coefs: Coefs) -> Charge {
        let us = micros;
        let base = (c.requests - c.random.min(c.requests)) * coefs.seqio + c.random * coefs.randio;
        let size = c.pages * coefs.page;
        Charge {
            requests: c.requests,
            random: c.random,
            merged: c.merged,
            pages: c.pages,
            base_us: us(base),
            size_us: us(size),
            cost_us: us(base + size),
            unmerged_cost_us: us(base + size + c.merged * coefs.seqio),
            weight: None,
            share_pct: None,
        }
    }

    pub fn add(&mut self, o: &Charge) {
        self.requests += o.requests;
        self.random += o.random;
        self.merged += o.merged;
        self.pages += o.pages;
        self.base_us += o.base_us;
        self.size_us += o.size_us;
        self.cost_us += o.cost_us;
        self.unmerged_cost_us += o.unmerged_cost_us;
        (self.weight, self.share_pct) = (None, None);
    }

    /// One line: what io.cost charged and what merging saved.
    pub fn verdict(&self, what: &str) -> Option<String> {
        if self.requests + self.merged == 0 {
            return None;
        }
        let s = |us: f64| {
            if us >= 1e6 {
                format!("{:.2} s", us / 1e6)
            } else {
                format!("{:.1} ms", us / 1e3)
            }
        };
        let saved = if self.merged == 0 {
            "no bio merged, so merging saved nothing; submit in batches (or larger bios) to \
             pay fewer base costs"
                .to_string()
        } else {
            let share = match (self.weight, self.share_pct) {
                (Some(w), Some(p)) => format!(
                    "its io.weight {w}, a {p:.0} % share of the device among the cgroups io.cost \
                     charged here,"
                ),
                _ => "the cgroup's io.weight".to_string(),
            };
            format!(
                "the {} bios that merged paid no base cost: unmerged the same I/O would cost {} \
                 ({:.1}×), so here merging raises what {share} buys",
                fmt::thousands(self.merged),
                s(self.unmerged_cost_us),
                self.unmerged_cost_us / self.cost_us.max(f64::MIN_POSITIVE)
            )
        };
        Some(format!(
            "io.cost charged {what} {} of device time ({} bios started requests: {} base, \
             {} random; {} pages: {}); {saved}",
            s(self.cost_us),
            fmt::thousands(self.requests),
            s(self.base_us),
            fmt::thousands(self.random),
            fmt::thousands(self.pages),
            s(self.size_us),
        ))
    }
}

/// Each of the `active` cgroups' share of the device under io.cost, in percent: at each level
/// of its path, its weight over the sum of the weights of its active siblings (those with an
/// active cgroup at or below them), multiplied down from the root — io.cost's hierarchical
/// weight (`hweight`) with every active cgroup using its whole share. `weight` is a cgroup's
/// `io.weight` for the disk (100 by default).
pub fn shares(
    active: &[String],
    weight: &mut dyn FnMut(&str) -> u64,
) -> std::collections::BTreeMap<String, f64> {
    use std::collections::{BTreeMap, BTreeSet};
    let parent = |p: &str| match p.rfind('/') {
        Some(0) | None => "/".to_string(),
        Some(i) => p[..i].to_string(),
    };
    // Every cgroup at or above an active one, the root left out.
    let mut levels = BTreeSet::new();
    for p in active {
        let mut q = p.clone();
        while q != "/" && !q.is_empty() {
            levels.insert(q.clone());
            q = parent(&q);
        }
    }
    let weights: BTreeMap<String, u64> = levels
        .iter()
        .map(|c| (c.clone(), weight(c).max(1)))
        .collect();
    let mut out = BTreeMap::new();
    for p in active {
        let mut share = 1.0;
        let mut c = p.clone();
        while c != "/" && !c.is_empty() {
            let up = parent(&c);
            let siblings: u64 = weights
                .iter()
                .filter(|(s, _)| parent(s) == up)
                .map(|(_, w)| w)
                .sum();
            share *= weights[&c] as f64 / siblings as f64;
            c = up;
        }
        out.insert(p.clone(), share * 100.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_multiply_down_the_active_tree() {
        // /a (100) beside /b (300), whose /b/c (100) and /b/d (300) are both active.
        let active = ["/a", "/b/c", "/b/d"].map(String::from);
        let mut w = |p: &str| match p {
            "/b" | "/b/d" => 300,
            _ => 100,
        };
        let s = shares(&active, &mut w);
        assert_eq!(s["/a"], 25.0);
        assert_eq!(s["/b/c"], 75.0 * 0.25);
        assert_eq!(s["/b/d"], 75.0 * 0.75);
        // Alone, a cgroup has the whole device, whatever its weight.
        assert_eq!(shares(&["/x/y".to_string()], &mut w)["/x/y"], 100.0);
    }

    /// The lab's model: 100 MB/s, 1,000 iops either way.
    fn lab() -> Coefs {
        Coefs::of(Linear {
            bps: 100_000_000,
            seqiops: 1000,
            randiops: 1000,
        })
    }

    #[test]
    fn coefficients_are_the_kernels() {
        // docs/design-meters.md §2.2: page 5,629,284, seqio = randio 131,809,670 vtime.
        assert_eq!(
            lab(),
            Coefs {
                page: 5_629_284,
                seqio: 131_809_670,
                randio: 131_809_670
            }
        );
        let slow_random = Coefs::of(Linear {
            bps: 100_000_000,
            seqiops: 1000,
            randiops: 500,
        });
        assert_eq!(slow_random.randio, 269_248_623);
    }

    #[test]
    fn a_merged_bio_pays_its_pages_only() {
        // 469 requests and 14,539 merged 4 KiB writes (a 6.1 lab run): io.stat 1,064,500 µs.
        let c = Charge::of(
            Counts {
                requests: 469,
                random: 0,
                merged: 14_539,
                pages: 15_008,
            },
            lab(),
        );
        assert_eq!(c.cost_us.round(), 1_064_502.0);
        assert_eq!((c.unmerged_cost_us / 1e3).round(), 15_008.0);
        let v = c.verdict("/A write").unwrap();
        assert!(
            v.starts_with("io.cost charged /A write 1.06 s of device time"),
            "{v}"
        );
        assert!(
            v.contains("unmerged the same I/O would cost 15.01 s (14.1×)"),
            "{v}"
        );
    }
}
