//! Request latency histograms, counted in the kernel per (cgroup, disk, direction) when a run
//! asks for latency (`--latency`): how long each request waited before the device got it
//! (queue: created → issued) and how long the device took (issued → completed), apart for
//! requests that carried merged bios and requests of a single bio.

/// Histogram buckets: bucket 0 holds latencies under 1,024 ns; bucket `i` holds
/// `[2^(9+i), 2^(10+i))` ns; the last one everything from 2^32 ns (4.3 s) on.
pub const LAT_BUCKETS: usize = 24;

/// [`LatencyHist`] class of a request of one bio (or none: a flush request).
pub const SINGLE: usize = 0;
/// [`LatencyHist`] class of a request that carried more than one bio (merged bios).
pub const MERGED: usize = 1;

/// One key's histograms, by class ([`SINGLE`], [`MERGED`]). Only u64s, so sums and differences
/// are field-wise.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHist {
    /// Request created (`rq->start_time_ns`) → first issued; counted at the issue.
    pub queue: [[u64; LAT_BUCKETS]; 2],
    /// Last issue → completed (the final completion of the request's bytes).
    pub device: [[u64; LAT_BUCKETS]; 2],
    /// The sums of the latencies counted in `queue` and `device`, in ns, by class.
    pub queue_ns: [u64; 2],
    pub device_ns: [u64; 2],
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist {
            queue: [[0; LAT_BUCKETS]; 2],
            device: [[0; LAT_BUCKETS]; 2],
            queue_ns: [0; 2],
            device_ns: [0; 2],
        }
    }
}

impl LatencyHist {
    /// Every counter, in one order (buckets, then sums): what sums and differences go over.
    pub fn counters_mut(&mut self) -> impl Iterator<Item = &mut u64> + '_ {
        self.queue
            .iter_mut()
            .chain(self.device.iter_mut())
            .flatten()
            .chain(self.queue_ns.iter_mut())
            .chain(self.device_ns.iter_mut())
    }

    /// Each counter of `self` set to `f(it, the same counter of o)`.
    fn combine(&mut self, o: &LatencyHist, f: impl Fn(u64, u64) -> u64) {
        let mut o = *o;
        for (a, b) in self.counters_mut().zip(o.counters_mut()) {
            *a = f(*a, *b);
        }
    }

    pub fn add(&mut self, o: &LatencyHist) {
        self.combine(o, |a, b| a + b);
    }

    /// `self - earlier`, field-wise (counts only grow).
    pub fn since(&self, earlier: &LatencyHist) -> LatencyHist {
        let mut d = *self;
        d.combine(earlier, u64::saturating_sub);
        d
    }
}

/// Issue-time slots per traced disk: a request in flight is found at
/// `hardware queue × ISSUE_TAGS + tag`, its scheduler tag under an I/O scheduler, else its
/// driver tag (the kernel hands a tag to one request at a time, and a tag's request memory is
/// fixed); beyond that, in a hash map.
pub const ISSUE_QUEUES: u32 = 64;
pub const ISSUE_TAGS: u32 = 1024;
pub const ISSUE_SLOTS_PER_DISK: u32 = ISSUE_QUEUES * ISSUE_TAGS;
/// Entries of the LRU map the requests beyond those slots wait in.
pub const ISSUED_AT_ENTRIES: u32 = 16384;

/// What the issue of a request leaves for its completion: when, and its class.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IssuedAt {
    pub ts_ns: u64,
    /// The request's address: a slot's entry is only its own request's.
    pub rq: u64,
    /// The request's cgroup at its issue.
    pub cgroup_id: u64,
    pub class: u32,
    pub _pad: u32,
}

/// The bucket of a latency of `ns`: the bit length of `ns >> 10`, at most the last bucket.
/// Straight-line halving steps rather than a loop: the verifier then checks it once.
#[inline(always)]
pub fn lat_bucket(ns: u64) -> usize {
    let mut v = ns >> 10;
    let mut b = 0usize;
    if v >= 1 << 32 {
        b += 32;
        v >>= 32;
    }
    if v >= 1 << 16 {
        b += 16;
        v >>= 16;
    }
    if v >= 1 << 8 {
        b += 8;
        v >>= 8;
    }
    if v >= 1 << 4 {
        b += 4;
        v >>= 4;
    }
    if v >= 1 << 2 {
        b += 2;
        v >>= 2;
    }
    if v >= 1 << 1 {
        b += 1;
        v >>= 1;
    }
    b += v as usize;
    if b >= LAT_BUCKETS {
        LAT_BUCKETS - 1
    } else {
        b
    }
}

/// The exclusive upper bound of bucket `b` in ns (`u64::MAX` for the last, open bucket).
pub fn lat_bucket_end_ns(b: usize) -> u64 {
    if b + 1 >= LAT_BUCKETS {
        u64::MAX
    } else {
        1u64 << (10 + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_what_their_bounds_say() {
        assert_eq!(lat_bucket(0), 0);
        assert_eq!(lat_bucket(1023), 0);
        assert_eq!(lat_bucket(1024), 1);
        assert_eq!(lat_bucket(2047), 1);
        assert_eq!(lat_bucket(2048), 2);
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
        for b in 0..LAT_BUCKETS - 1 {
            let end = lat_bucket_end_ns(b);
            assert_eq!(lat_bucket(end - 1), b, "last ns of bucket {b}");
            assert_eq!(lat_bucket(end), b + 1, "first ns after bucket {b}");
        }
    }
}
