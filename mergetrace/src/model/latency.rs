//! Request latency per (cgroup, disk, direction) from the kernel's log2 histograms
//! (`--latency`): queue (request created → issued) and device (issued → completed), for
//! requests of one bio and requests that carried merged bios. A percentile is the upper bound
//! of the bucket that holds it: the histograms know no finer.
use mergetrace_common::latency::{lat_bucket_end_ns, LatencyHist, LAT_BUCKETS, MERGED, SINGLE};
use serde::{ser::SerializeStruct, Serialize, Serializer};

/// One row's histograms (sums over cgroups add field-wise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency(pub LatencyHist);

/// Which end of a request's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Queue,
    Device,
}

/// Which requests: of one bio, that carried merged bios, or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Single,
    Merged,
    All,
}

impl Latency {
    pub fn add(&mut self, o: &Latency) {
        self.0.add(&o.0);
    }

    /// The bucket counts of one stage and class.
    pub fn buckets(&self, stage: Stage, class: Class) -> [u64; LAT_BUCKETS] {
        let h = match stage {
            Stage::Queue => &self.0.queue,
            Stage::Device => &self.0.device,
        };
        match class {
            Class::Single => h[SINGLE],
            Class::Merged => h[MERGED],
            Class::All => std::array::from_fn(|b| h[SINGLE][b] + h[MERGED][b]),
        }
    }

    /// The sum of the latencies of one stage and class, in ns.
    pub fn sum_ns(&self, stage: Stage, class: Class) -> u64 {
        let s = match stage {
            Stage::Queue => &self.0.queue_ns,
            Stage::Device => &self.0.device_ns,
        };
        match class {
            Class::Single => s[SINGLE],
            Class::Merged => s[MERGED],
            Class::All => s[SINGLE] + s[MERGED],
        }
    }

    /// The mean of one stage and class in µs (exact: the kernel sums the latencies).
    pub fn mean_us(&self, stage: Stage, class: Class) -> Option<f64> {
        let n = self.count(stage, class);
        (n > 0).then(|| self.sum_ns(stage, class) as f64 / n as f64 / 1000.0)
    }

    /// Requests counted in one stage and class.
    pub fn count(&self, stage: Stage, class: Class) -> u64 {
        self.buckets(stage, class).iter().sum()
    }

    /// The `q` quantile (0..=1) of one stage and class in µs: the upper bound of its bucket
    /// (`None` without requests; the last, open bucket gives its lower bound).
    pub fn quantile_us(&self, stage: Stage, class: Class, q: f64) -> Option<f64> {
        let buckets = self.buckets(stage, class);
        let total: u64 = buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, n) in buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(bucket_bound_us(b));
            }
        }
        Some(bucket_bound_us(LAT_BUCKETS - 1))
    }
}

/// The bound a bucket reports in µs: its upper bound; the open last bucket, its lower bound.
pub fn bucket_bound_us(b: usize) -> f64 {
    let ns = if b + 1 >= LAT_BUCKETS {
        lat_bucket_end_ns(b - 1)
    } else {
        lat_bucket_end_ns(b)
    };
    ns as f64 / 1000.0
}

/// One stage and class in the JSON.
struct Summary<'a>(&'a Latency, Stage, Class);

impl Serialize for Summary<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Summary(l, stage, class) = *self;
        let mut st = s.serialize_struct("LatencySummary", 6)?;
        st.serialize_field("count", &l.count(stage, class))?;
        st.serialize_field("mean_us", &l.mean_us(stage, class))?;
        st.serialize_field("p50_us", &l.quantile_us(stage, class, 0.5))?;
        st.serialize_field("p90_us", &l.quantile_us(stage, class, 0.9))?;
        st.serialize_field("p99_us", &l.quantile_us(stage, class, 0.99))?;
        st.serialize_field("buckets", &l.buckets(stage, class)[..])?;
        st.end()
    }
}

/// One stage's classes in the JSON.
struct StageJson<'a>(&'a Latency, Stage);

impl Serialize for StageJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let StageJson(l, stage) = *self;
        let mut st = s.serialize_struct("LatencyStage", 3)?;
        st.serialize_field("single", &Summary(l, stage, Class::Single))?;
        st.serialize_field("merged", &Summary(l, stage, Class::Merged))?;
        st.serialize_field("all", &Summary(l, stage, Class::All))?;
        st.end()
    }
}

impl Serialize for Latency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Latency", 2)?;
        st.serialize_field("queue", &StageJson(self, Stage::Queue))?;
        st.serialize_field("device", &StageJson(self, Stage::Device))?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mergetrace_common::latency::lat_bucket;

    fn with(queue_single: &[u64], device_merged: &[u64]) -> Latency {
        let mut h = LatencyHist::default();
        for ns in queue_single {
            h.queue[SINGLE][lat_bucket(*ns)] += 1;
        }
        for ns in device_merged {
            h.device[MERGED][lat_bucket(*ns)] += 1;
        }
        Latency(h)
    }

    #[test]
    fn quantiles_are_bucket_bounds() {
        // 98 requests of 1.5 µs, 2 of 100 µs: p50 in the 1–2 µs bucket, p99 in 64–131 µs.
        let mut q = vec![1_500; 98];
        q.extend([100_000, 100_000]);
        let l = with(&q, &[]);
        assert_eq!(l.count(Stage::Queue, Class::Single), 100);
        assert_eq!(l.quantile_us(Stage::Queue, Class::Single, 0.5), Some(2.048));
        assert_eq!(
            l.quantile_us(Stage::Queue, Class::Single, 0.99),
            Some(131.072)
        );
        assert_eq!(l.quantile_us(Stage::Queue, Class::Merged, 0.5), None);
        assert_eq!(l.count(Stage::Queue, Class::All), 100);
    }

    #[test]
    fn json_has_every_stage_and_class() {
        let l = with(&[5_000], &[20_000, 30_000]);
        let v = serde_json::to_value(l).unwrap();
        assert_eq!(v["queue"]["single"]["count"], 1);
        assert_eq!(v["device"]["merged"]["count"], 2);
        assert_eq!(v["device"]["all"]["count"], 2);
        assert!(v["device"]["single"]["p50_us"].is_null());
        assert_eq!(
            v["queue"]["all"]["buckets"].as_array().unwrap().len(),
            LAT_BUCKETS
        );
    }

    #[test]
    fn the_open_bucket_reports_its_lower_bound() {
        let l = with(&[u64::MAX], &[]);
        let bound = l.quantile_us(Stage::Queue, Class::Single, 0.5).unwrap();
        assert_eq!(bound, (1u64 << 32) as f64 / 1000.0);
    }
}
