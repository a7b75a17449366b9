//! Cgroup births and removals as the programs report them (`CGROUP_EVENTS`, from the
//! `cgroup_mkdir` / `cgroup_rmdir` tracepoints): a cgroup's name from the moment it exists,
//! and the moment it is gone, when its counters may be reclaimed ([`super::slots`]). The same
//! ring says when blk-throttle rules are first found on a traced disk.
use aya::maps::{MapData, RingBuf};
use mergetrace_common::{
    CgroupEvent, CGROUP_MKDIR, CGROUP_PATH_MAX, CGROUP_RMDIR, DISK_RULES_SEEN,
};

/// One birth or removal in the traced hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupChange {
    /// Created with this path (relative to the hierarchy's mount); `None` when the path did
    /// not fit the event or could not be read (the name table looks it up instead).
    Born {
        id: u64,
        path: Option<String>,
    },
    Removed {
        id: u64,
    },
}

/// One record of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Cgroup(CgroupChange),
    /// blk-throttle rules found on the traced disk `dev` (`dev_t`) for the first time.
    RulesSeen {
        dev: u32,
    },
}

/// Decodes one ring record; `None` for a record of the wrong size or kind.
pub fn decode(bytes: &[u8]) -> Option<Report> {
    if bytes.len() < std::mem::size_of::<CgroupEvent>() {
        return None;
    }
    // SAFETY: CgroupEvent is plain old data of this size; read_unaligned has no alignment needs.
    let ev = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const CgroupEvent) };
    match ev.what {
        CGROUP_MKDIR => {
            // `len` counts the NUL the helper copied; a full buffer means the path was cut.
            let len = (ev.len as usize).min(CGROUP_PATH_MAX);
            let raw = &ev.path[..len];
            let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
            let path = (len > 1 && len < CGROUP_PATH_MAX && raw.first() == Some(&b'/'))
                .then(|| String::from_utf8_lossy(raw).into_owned());
            Some(Report::Cgroup(CgroupChange::Born { id: ev.id, path }))
        }
        CGROUP_RMDIR => Some(Report::Cgroup(CgroupChange::Removed { id: ev.id })),
        DISK_RULES_SEEN => Some(Report::RulesSeen { dev: ev.id as u32 }),
        _ => None,
    }
}

/// Tells the name table: names at birth, removals marked gone.
pub fn apply(changes: Vec<CgroupChange>, names: &mut crate::sys::cgroups::Cgroups) {
    for c in changes {
        match c {
            CgroupChange::Born { id, path } => names.born(id, path),
            CgroupChange::Removed { id } => names.gone(id),
        }
    }
}

/// Wakes a run's loop when the programs report something (a cgroup born or removed, rules
/// seen on a disk), so that it is acted on at once rather than at the next interval.
pub struct ReportWaker(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>);

impl ReportWaker {
    /// Watches `ring` (a copy of its descriptor: the ring stays the session's). Needs the
    /// tokio runtime.
    pub fn new(ring: &RingBuf<MapData>) -> std::io::Result<ReportWaker> {
        use std::os::fd::AsFd;
        let fd = ring.as_fd().try_clone_to_owned()?;
        // SAFETY: the AsyncFd owns the descriptor, so it stays open while registered.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }?;
        Ok(ReportWaker(fd))
    }

    /// Until the ring has records (the caller then drains it).
    pub async fn wait(&self) {
        if let Ok(mut ready) = self.0.readable().await {
            ready.clear_ready();
        }
    }
}

/// Everything waiting in the ring.
pub fn drain(ring: &mut RingBuf<MapData>) -> Vec<Report> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        out.extend(decode(&item));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(what: u32, id: u64, path: &[u8], len: u32) -> Vec<u8> {
        let mut ev = CgroupEvent {
            id,
            what,
            len,
            path: [0; CGROUP_PATH_MAX],
        };
        ev.path[..path.len()].copy_from_slice(path);
        // SAFETY: plain old data.
        unsafe {
            std::slice::from_raw_parts(
                &ev as *const CgroupEvent as *const u8,
                std::mem::size_of::<CgroupEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn births_carry_their_path_removals_their_id_and_rules_their_disk() {
        assert_eq!(
            decode(&record(CGROUP_MKDIR, 42, b"/mt/a\0", 6)),
            Some(Report::Cgroup(CgroupChange::Born {
                id: 42,
                path: Some("/mt/a".into())
            }))
        );
        assert_eq!(
            decode(&record(CGROUP_RMDIR, 42, b"/mt/a\0", 6)),
            Some(Report::Cgroup(CgroupChange::Removed { id: 42 }))
        );
        assert_eq!(
            decode(&record(DISK_RULES_SEEN, 7 << 20 | 3, b"", 0)),
            Some(Report::RulesSeen { dev: 7 << 20 | 3 })
        );
        // Cut, unreadable or relative paths are no name: the table looks them up.
        let long = vec![b'x'; CGROUP_PATH_MAX];
        for (path, len) in [
            (&long[..], CGROUP_PATH_MAX as u32),
            (&b""[..], 0),
            (b"a\0", 2),
        ] {
            assert_eq!(
                decode(&record(CGROUP_MKDIR, 7, path, len)),
                Some(Report::Cgroup(CgroupChange::Born { id: 7, path: None }))
            );
        }
        assert_eq!(decode(&record(9, 1, b"", 0)), None);
        assert_eq!(decode(&[0u8; 8]), None);
    }
}
