//! The lines a tracing command prints on standard error before it starts: what is traced, on
//! which tier, how each device is configured for merging, and notes the user should read.
use crate::{
    kernel,
    model::limits::LimitKind,
    sys::{
        cgroups::{Cgroups, Hierarchy},
        device::Device,
        iolatency::IoLatency,
        queue::QueueSettings,
    },
};
use std::collections::BTreeMap;

/// The banner: what is traced, on which tier, every meter in force on each device, and notes
/// the user should read. `iolatency`: io.latency's targets on the devices that have any.
pub fn lines(
    devices: &[Device],
    session: &kernel::Session,
    cgroups: &Cgroups,
    iolatency: &BTreeMap<u32, IoLatency>,
) -> Vec<String> {
    let names: Vec<String> = devices
        .iter()
        .map(|d| format!("{} ({}:{})", d.name, d.major, d.minor))
        .collect();
    let which = match (names.is_empty(), session.follows_new_disks()) {
        (true, _) => "no disk yet".to_string(),
        (false, _) => names.join(", "),
    };
    let later = if session.follows_new_disks() {
        ", and the disks that appear and are selected, from their first bio,"
    } else {
        ""
    };
    let mut lines = vec![format!("tracing {which}{later} on the {}", session.tier)];
    for d in devices {
        lines.extend(d.notes.iter().cloned());
        if let Ok(q) = QueueSettings::read(d) {
            lines.push(configuration_line(&d.name, &q));
        }
        lines.extend(v1_writeback_note(d, cgroups));
        if let Some(c) = session.iocost.get(&d.dev().0) {
            lines.push(format!("{}: {}", d.name, c.describe()));
        }
        if let Some(w) = session.wbt.get(&d.dev().0) {
            lines.push(format!("{}: {}", d.name, w.describe()));
        }
        if let Some(t) = iolatency.get(&d.dev().0) {
            lines.push(format!("{}: {}", d.name, t.describe()));
        }
    }
    lines.extend(session.notes.iter().cloned());
    lines
}

/// On cgroup v1, write limits never see buffered writes: say so when a cgroup has one.
pub fn v1_writeback_note(d: &Device, cgroups: &Cgroups) -> Option<String> {
    if cgroups.hierarchy != Hierarchy::V1 {
        return None;
    }
    let mut limited: Vec<&str> = cgroups
        .all()
        .map(|(_, path)| path)
        .filter(|path| {
            let dir = cgroups.mount.join(path.trim_start_matches('/'));
            let own = crate::sys::throttle::own_limits(Hierarchy::V1, &dir, d.major, d.minor);
            own.get(LimitKind::Wiops).is_some() || own.get(LimitKind::Wbps).is_some()
        })
        .collect();
    if limited.is_empty() {
        return None;
    }
    limited.sort_unstable();
    let more = limited.len().saturating_sub(3);
    limited.truncate(3);
    Some(format!(
        "{}: cgroup v1 has no writeback attribution: buffered writes are submitted by the \
         kernel's flusher as the root cgroup, so the write limits of {}{} count only direct and \
         synchronous writes, and the writeback shows in the / row",
        d.name,
        limited.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// The per-device configuration line: scheduler, what nomerges
/// does on this path, the merge ceiling, and when the plug flushes.
pub fn configuration_line(name: &str, q: &QueueSettings) -> String {
    if q.bio_based() {
        return format!("{name}: {}", q.explain_nomerges());
    }
    let flush = match q.plug_flush_bytes() {
        Some(b) => format!(
            "{} requests or a {} KiB request",
            q.plug_max_requests(),
            b >> 10
        ),
        None => format!("{} requests", q.plug_max_requests()),
    };
    format!(
        "{name}: scheduler {}; {}; requests merge up to {} KiB (set by {}); the plug flushes at {flush}",
        q.scheduler_name(),
        q.explain_nomerges(),
        q.merge_ceiling_bytes() >> 10,
        q.merge_ceiling_set_by(),
    )
}
