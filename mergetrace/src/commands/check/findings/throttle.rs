//! Throttle limits on the device: which cgroups set them, what kind, whom they bind, and why
//! merging cannot help an iops limit.
use super::Finding;
use crate::{
    commands::check::gather::{CheckInput, ThrottledCgroup},
    fmt,
    model::limits::{self, LimitKind, Limits},
    sys::cgroups::Hierarchy,
};

/// One finding per throttled cgroup, or why there are none.
pub(super) fn throttle(input: &CheckInput, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    match &input.io_hierarchy {
        None => out.push(Finding::new(
            "throttle",
            "no cgroup hierarchy with the io/blkio controller is mounted: no throttle limits"
                .into(),
            None,
        )),
        Some((h, mount)) if input.throttled.is_empty() => out.push(Finding::new(
            "throttle",
            format!(
                "no cgroup limits {name} ({} hierarchy at {})",
                hierarchy_name(*h),
                mount.display()
            ),
            None,
        )),
        Some(_) => {
            for t in &input.throttled {
                out.push(throttle_finding(name, t, &input.throttled));
            }
        }
    }
}

/// io.cost on the device: what it charges and how merging changes that, or where it cannot be.
pub(super) fn iocost(input: &CheckInput, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let finding = match (&input.io_hierarchy, &input.iocost) {
        (_, Some(c)) => Finding::new(
            "io.cost",
            format!("{name}: {}", c.describe()),
            Some(
                "mergetrace shows each cgroup's charge, split into base and page costs, and \
                 what the same bios would cost unmerged (meters.iocost)"
                    .into(),
            ),
        ),
        (Some((Hierarchy::V2, mount)), None) => Finding::new(
            "io.cost",
            format!(
                "io.cost is off on {name} (no enable=1 line in {}/io.cost.qos): no \
                 cost-based meter",
                mount.display()
            ),
            None,
        ),
        _ => Finding::new(
            "io.cost",
            "io.cost (io.weight, io.cost.qos) exists only on cgroup v2: on this machine's \
             hierarchy no cost-based meter can be in force"
                .into(),
            None,
        ),
    };
    out.push(finding);
}

fn hierarchy_name(h: Hierarchy) -> &'static str {
    match h {
        Hierarchy::V1 => "cgroup v1 blkio",
        Hierarchy::V2 => "cgroup v2",
    }
}

/// On cgroup v2 the tightest limit along the path is the one in force (as the live view
/// counts it): where an ancestor's is tighter than `t`'s own, say whose binds instead.
fn held_by_ancestors(t: &ThrottledCgroup, all: &[ThrottledCgroup]) -> Vec<String> {
    if t.hierarchy != Hierarchy::V2 {
        return Vec::new();
    }
    let own = |p: &str| {
        all.iter()
            .find(|c| c.path == p)
            .map_or_else(Limits::default, |c| c.limits)
    };
    let eff = limits::effective_along(Hierarchy::V2, &t.path, own);
    LimitKind::ALL
        .iter()
        .filter_map(|k| {
            let mine = t.limits.get(*k)?;
            let in_force = eff.get(*k)?;
            (in_force.cgroup != t.path).then(|| {
                format!(
                    "its {}={} is not in force: {}'s {} binds it (v2 limits are hierarchical: \
                     the tightest along the path holds)",
                    k.name(),
                    shown_value(*k, mine),
                    in_force.cgroup,
                    shown_value(*k, in_force.limit)
                )
            })
        })
        .collect()
}

fn shown_value(k: LimitKind, v: u64) -> String {
    if k.is_iops() {
        fmt::thousands(v)
    } else {
        fmt::exact_rate(v)
    }
}

fn throttle_finding(device: &str, t: &ThrottledCgroup, all: &[ThrottledCgroup]) -> Finding {
    let set: Vec<(LimitKind, u64)> = LimitKind::ALL
        .iter()
        .filter_map(|k| t.limits.get(*k).map(|v| (*k, v)))
        .collect();
    let shown: Vec<String> = set
        .iter()
        .map(|(k, v)| {
            if k.is_iops() {
                format!("{}={} bios/s", k.name(), fmt::thousands(*v))
            } else {
                format!("{}={}", k.name(), fmt::exact_rate(*v))
            }
        })
        .collect();
    let file = match t.hierarchy {
        Hierarchy::V1 => "blkio.throttle.*_device",
        Hierarchy::V2 => "io.max",
    };
    // cgroup v2 throttling is hierarchical; v1 blk-throttle treats every group as its own
    // root ("flat hierarchy"), so a v1 limit binds that cgroup's own bios only.
    let below = match (t.hierarchy, t.path == "/") {
        (Hierarchy::V1, _) => {
            "only its own bios (cgroup v1 throttling is flat: children are not limited)"
        }
        (Hierarchy::V2, true) => "every cgroup",
        (Hierarchy::V2, false) => "it and every cgroup below it",
    };
    let mut levers = Vec::new();
    let iops: Vec<&str> = set
        .iter()
        .filter(|(k, _)| k.is_iops())
        .map(|(k, _)| k.name())
        .collect();
    let bytes: Vec<&str> = set
        .iter()
        .filter(|(k, _)| !k.is_iops())
        .map(|(k, _)| k.name())
        .collect();
    if !iops.is_empty() {
        levers.push(format!(
            "{}: iops limit counts bios before merging: submit larger bios; merging cannot raise it",
            iops.join(", ")
        ));
    }
    if !bytes.is_empty() {
        levers.push(format!(
            "{}: bps limit is blind to merging (a merged bio carries the same bytes)",
            bytes.join(", ")
        ));
    }
    let mut finding = format!(
        "cgroup {} ({} {file}) limits {device}: {} — binds {below}",
        t.path,
        hierarchy_name(t.hierarchy),
        shown.join(", ")
    );
    for held in held_by_ancestors(t, all) {
        finding.push_str("; ");
        finding.push_str(&held);
    }
    Finding::new("throttle", finding, Some(levers.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::model::limits::Limits;
    #[test]
    fn throttle_findings() {
        let mut i = sda_input();
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "throttle").finding,
            "no cgroup limits sda (cgroup v2 hierarchy at /sys/fs/cgroup)"
        );
        i.io_hierarchy = Some((Hierarchy::V1, "/sys/fs/cgroup/blkio".into()));
        i.throttled = vec![
            ThrottledCgroup {
                hierarchy: Hierarchy::V1,
                path: "/mt".into(),
                limits: Limits {
                    wiops: Some(2000),
                    ..Default::default()
                },
            },
            ThrottledCgroup {
                hierarchy: Hierarchy::V1,
                path: "/both".into(),
                limits: Limits {
                    rbps: Some(1 << 20),
                    wbps: Some(1000),
                    riops: Some(50),
                    wiops: None,
                },
            },
        ];
        let f = findings(&i);
        let t: Vec<&Finding> = f.iter().filter(|x| x.topic == "throttle").collect();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0].finding,
            "cgroup /mt (cgroup v1 blkio blkio.throttle.*_device) limits sda: wiops=2,000 bios/s — binds only its own bios (cgroup v1 throttling is flat: children are not limited)"
        );
        assert_eq!(
            t[0].lever.as_deref(),
            Some("wiops: iops limit counts bios before merging: submit larger bios; merging cannot raise it")
        );
        assert_eq!(
            t[1].finding,
            "cgroup /both (cgroup v1 blkio blkio.throttle.*_device) limits sda: rbps=1 MiB/s, wbps=1,000 B/s, riops=50 bios/s — binds only its own bios (cgroup v1 throttling is flat: children are not limited)"
        );
        assert_eq!(
            t[1].lever.as_deref(),
            Some("riops: iops limit counts bios before merging: submit larger bios; merging cannot raise it; rbps, wbps: bps limit is blind to merging (a merged bio carries the same bytes)")
        );
        // v2: a scope's 2,000 under system.slice's 500 — the live view counts 500, so does check.
        let v2 = |path: &str, wiops| ThrottledCgroup {
            hierarchy: Hierarchy::V2,
            path: path.into(),
            limits: Limits {
                wiops: Some(wiops),
                ..Default::default()
            },
        };
        i.io_hierarchy = Some((Hierarchy::V2, "/sys/fs/cgroup".into()));
        i.throttled = vec![
            v2("/system.slice", 500),
            v2("/system.slice/docker-1.scope", 2000),
        ];
        let f = findings(&i);
        let t: Vec<&Finding> = f.iter().filter(|x| x.topic == "throttle").collect();
        assert_eq!(
            t[0].finding,
            "cgroup /system.slice (cgroup v2 io.max) limits sda: wiops=500 bios/s — binds it and every cgroup below it"
        );
        assert_eq!(
            t[1].finding,
            "cgroup /system.slice/docker-1.scope (cgroup v2 io.max) limits sda: wiops=2,000 bios/s — binds it and every cgroup below it; its wiops=2,000 is not in force: /system.slice's 500 binds it (v2 limits are hierarchical: the tightest along the path holds)"
        );
        i.io_hierarchy = None;
        i.throttled.clear();
        assert!(by_topic(&findings(&i), "throttle")
            .finding
            .starts_with("no cgroup hierarchy"));
    }
}
