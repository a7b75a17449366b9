//! What a replay yields: requests as the device saw them, the bios in each and how each
//! joined, and how exact the reconstruction is.
use std::collections::BTreeMap;

use mergetrace_common::vocab::merge_path_name;

/// How a bio joined its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// `block_getrq`: the bio started a new request.
    NewRequest,
    /// `block_bio_backmerge` on a merge path ([`mergetrace_common::path`]).
    BackMerge(u8),
    /// `block_bio_frontmerge`.
    FrontMerge(u8),
}

impl Join {
    pub fn name(self) -> &'static str {
        match self {
            Join::NewRequest => "new_request",
            Join::BackMerge(_) => "back_merge",
            Join::FrontMerge(_) => "front_merge",
        }
    }

    pub fn merge_path(self) -> Option<u8> {
        match self {
            Join::NewRequest => None,
            Join::BackMerge(p) | Join::FrontMerge(p) => Some(p),
        }
    }

    /// "new request", "back merge (plug)", ...
    pub fn describe(self) -> String {
        match self {
            Join::NewRequest => "new request".into(),
            Join::BackMerge(p) => format!("back merge ({})", merge_path_name(p)),
            Join::FrontMerge(p) => format!("front merge ({})", merge_path_name(p)),
        }
    }
}

/// One bio (or split piece) in a request, in the request's chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BioLink {
    /// Kernel address of the bio as it joined (a split piece's own address).
    pub bio: u64,
    /// A split piece: the address of the bio it was split from (the remainder, which carries
    /// the original `bio_queue`).
    pub split_from: Option<u64>,
    pub cgroup_id: u64,
    pub op: u8,
    /// Start sector and bytes of what joined the request.
    pub sector: u64,
    pub bytes: u32,
    /// `bio_queue` time of the bio (of its parent, for a split piece); `None` when the capture
    /// has no `bio_queue` for it (queued before the capture started, or lost).
    pub queue_ts: Option<u64>,
    /// When it joined the request (the getrq or merge event).
    pub join_ts: u64,
    pub join: Join,
    /// blk-throttle queued it and released it later (`flags::THROTTLE_RELEASED`).
    pub throttled: bool,
    /// fentry tier: the time it waited in blk-throttle, measured (`throttle_release`).
    pub throttle_wait_ns: Option<u64>,
    /// Its cgroup had a blk-throttle rule for the direction: it was charged.
    pub charged: bool,
    /// It came into this request with a request that was merged into it (`rq_merge`).
    pub via_request_merge: bool,
    /// More than one pending request could have taken it (same device, op, cgroup and
    /// adjacent range): the most recently used one was chosen. Inferred, not exact.
    pub ambiguous: bool,
}

/// How a dispatched request was matched to the request the tracker built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// Its first bio (`aux64`) is the first bio of a pending request with exactly its range.
    Exact,
    /// A pending request with exactly its device and range, but another first bio (events
    /// were lost, or a merge was attributed to the wrong request).
    Range,
    /// The pending request with its first bio, but a different range.
    FirstBio,
    /// A request without data (a flush): no bios to find.
    NoBios,
    /// Nothing was pending for it: it was built before the capture started, or its events
    /// were lost. Its bios are unknown.
    Unmatched,
}

impl Match {
    pub fn name(self) -> &'static str {
        match self {
            Match::Exact => "exact",
            Match::Range => "range",
            Match::FirstBio => "first_bio",
            Match::NoBios => "no_bios",
            Match::Unmatched => "unmatched",
        }
    }
}

/// A request as the device saw it, with the bios that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Kernel address of the request.
    pub rq: u64,
    pub dev: u32,
    /// The cgroup of its first bio (requests never mix cgroups).
    pub cgroup_id: u64,
    pub op: u8,
    pub sector: u64,
    pub bytes: u32,
    /// Its first bio, as the issue probe read it.
    pub first_bio: u64,
    /// Bios chained in it, as the issue probe counted them (up to `MAX_CHAIN`).
    pub bio_count: u32,
    pub getrq_ts: Option<u64>,
    pub insert_ts: Option<u64>,
    /// The first issue.
    pub issue_ts: u64,
    /// The completion that finished it.
    pub complete_ts: Option<u64>,
    pub completed_bytes: u64,
    /// `blk_status_t` of the last completion (0 = ok).
    pub status: u8,
    pub requeues: u32,
    /// Requests merged into it (`rq_merge`).
    pub absorbed: u32,
    pub bios: Vec<BioLink>,
    pub matched: Match,
}

impl Request {
    /// The reconstruction agrees with the kernel: as many bios as it counted, and their bytes
    /// add up to the request's.
    pub fn consistent(&self) -> bool {
        self.bios.len() as u64 == self.bio_count as u64
            && self.bios.iter().map(|b| b.bytes as u64).sum::<u64>() == self.bytes as u64
    }

    pub fn bios_bytes(&self) -> u64 {
        self.bios.iter().map(|b| b.bytes as u64).sum()
    }
}

/// How well the reconstruction went, over the whole stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests issued (not counting re-issues after a requeue).
    pub requests: u64,
    /// Requests by [`Match`] name.
    pub matched: BTreeMap<&'static str, u64>,
    /// Requests whose bios agree with the kernel's count and bytes.
    pub consistent: u64,
    /// Bios placed in issued requests.
    pub bios: u64,
    /// Of those: split pieces, ambiguous choices, bios without a `bio_queue` in the capture.
    pub split_pieces: u64,
    pub ambiguous: u64,
    pub without_queue: u64,
    /// Merge events (bio or request) that found no pending request to join.
    pub orphan_merges: u64,
    /// Requests built but never issued in the capture (still pending at its end, or lost).
    pub never_issued: u64,
    /// Requests issued again, not requeued, with no completion in between: the kernel ended
    /// them without running the completion program (found when the request memory, fixed per
    /// tag, is issued again, as live `--latency`'s `completion_unseen` is).
    pub completions_unseen: u64,
    /// Requests issued and not seen completed by the capture's end: in flight as it ended, or
    /// ended without the completion program running with their tag not issued again since.
    pub never_completed: u64,
}

/// The result of a replay.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    /// In issue order.
    pub requests: Vec<Request>,
    pub stats: Stats,
}
