//! What the kernel side leaves unsaid at the end of a run: `--latency`'s requests issued and
//! never seen completed, and the program runs the kernel itself skipped.
//!
//! A request's issue waits for its completion in `ISSUE_SLOTS` (or `ISSUED_AT`). A completion
//! the kernel ended without running the program is found when the request's tag is issued
//! again (`completion_unseen`); one whose tag is not reused before the run ends would go
//! unsaid. So at the end the entries still held are counted: requests in flight as the run
//! ended, or ended unseen.
//!
//! Beside them, the kernel's own count of each program's skipped runs (`recursion_misses`,
//! 5.12+: the program was already running on that CPU when an interrupt reached the same
//! hook; tracepoint programs are checked from 6.2). The unseen completions above are not
//! among them: the kernel leaves those runs out without counting them.
use std::{
    collections::BTreeMap,
    os::fd::{AsFd, AsRawFd},
    path::Path,
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    Ebpf,
};
use mergetrace_common::latency::{IssuedAt, ISSUE_QUEUES, ISSUE_SLOTS_PER_DISK, ISSUE_TAGS};

use crate::sys::device::Device;

/// The issue entries of a `--latency` run, and where each traced disk's are.
pub struct IssueEntries {
    slots: Array<MapData, IssuedAt>,
    hashed: BpfHashMap<MapData, u64, IssuedAt>,
    /// The traced disks' sysfs directories, by their slot; `None` for a bio-based device
    /// (no requests, so no entries).
    disks: Vec<Option<std::path::PathBuf>>,
}

impl IssueEntries {
    pub fn take(ebpf: &mut Ebpf, devices: &[Device]) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("{name} map missing"))
        };
        Ok(IssueEntries {
            slots: Array::try_from(take("ISSUE_SLOTS")?)?,
            hashed: BpfHashMap::try_from(take("ISSUED_AT")?)?,
            // Only the first disks' requests have array entries (the others', the hash map's).
            disks: (devices.iter().take(mergetrace_common::FROZEN_DISKS))
                .map(|d| (!d.bio_based).then(|| d.sys_dir()))
                .collect(),
        })
    }

    /// Requests issued in the run whose completion no program saw: the entries still held.
    /// Only the queues and tags each disk has are read (a few hundred lookups, not 65,536),
    /// and none of a bio-based device's.
    pub fn unfinished(&self) -> Result<u64> {
        let mut n = 0;
        for (slot, dir) in self.disks.iter().enumerate() {
            let Some(dir) = dir else { continue };
            let (queues, tags) = tag_space(dir).unwrap_or((ISSUE_QUEUES, ISSUE_TAGS));
            let base = slot as u32 * ISSUE_SLOTS_PER_DISK;
            for q in 0..queues.min(ISSUE_QUEUES) {
                for t in 0..tags.min(ISSUE_TAGS) {
                    let at = self
                        .slots
                        .get(&(base + q * ISSUE_TAGS + t), 0)
                        .context("cannot read the ISSUE_SLOTS map")?;
                    n += (at.rq != 0) as u64;
                }
            }
        }
        for entry in self.hashed.iter() {
            let (_, at) = entry.context("cannot read the ISSUED_AT map")?;
            n += (at.rq != 0) as u64;
        }
        Ok(n)
    }
}

/// A disk's hardware queues and the most tags one of them gives out, driver's or scheduler's
/// (`mq/*/nr_tags`, `queue/nr_requests`), read now: `nr_requests` may have grown in the run.
/// `None` where sysfs does not say.
fn tag_space(disk: &Path) -> Option<(u32, u32)> {
    let read = |p: &Path| -> Option<u32> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let (mut queues, mut tags) = (0, read(&disk.join("queue/nr_requests"))?);
    for e in std::fs::read_dir(disk.join("mq")).ok()? {
        let e = e.ok()?;
        let index: u32 = e.file_name().to_str()?.parse().ok()?;
        queues = queues.max(index + 1);
        tags = tags.max(read(&e.path().join("nr_tags"))?);
    }
    (queues > 0).then_some((queues, tags))
}

/// The runs the kernel skipped of each loaded program that it skipped any of, by program
/// name (`recursion_misses` in the program's fdinfo; absent before 5.12, where it is 0).
pub fn skipped_runs(ebpf: &Ebpf) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (name, prog) in ebpf.programs() {
        let Ok(fd) = prog.fd() else { continue };
        let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
        if let Some(n) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| recursion_misses(&t))
            .filter(|n| *n > 0)
        {
            out.insert(name.to_string(), n);
        }
    }
    out
}

/// The `recursion_misses:` line of a program's fdinfo.
fn recursion_misses(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("recursion_misses:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recursion_misses_is_read_from_the_fdinfo() {
        let fdinfo = "prog_type:\t26\nprog_jited:\t1\nrun_time_ns:\t0\nrun_cnt:\t0\n\
                      recursion_misses:\t3\nverified_insns:\t812\n";
        assert_eq!(recursion_misses(fdinfo), Some(3));
        assert_eq!(recursion_misses("prog_type:\t26\nrun_cnt:\t0\n"), None);
    }

    #[test]
    fn the_tag_space_is_the_most_queues_and_tags_sysfs_gives() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("queue")).unwrap();
        std::fs::write(d.path().join("queue/nr_requests"), "256\n").unwrap();
        assert_eq!(tag_space(d.path()), None, "no mq directory");
        for (q, tags) in [(0, "128\n"), (1, "1024\n"), (2, "64\n")] {
            let hctx = d.path().join(format!("mq/{q}"));
            std::fs::create_dir_all(&hctx).unwrap();
            std::fs::write(hctx.join("nr_tags"), tags).unwrap();
        }
        assert_eq!(tag_space(d.path()), Some((3, 1024)));
        std::fs::write(d.path().join("queue/nr_requests"), "2048\n").unwrap();
        assert_eq!(tag_space(d.path()), Some((3, 2048)));
    }
}
