//! The rq-qos meters that count requests, after merging: wbt and io.latency.
use super::{CheckInput, Finding};
use crate::sys::{cgroups::Hierarchy, wbt::WbtState};

/// wbt on the device: on or off, its target, and that it counts requests.
pub(super) fn wbt(input: &CheckInput, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let finding = match &input.wbt {
        None => return,
        Some(w) if w.state == WbtState::Off => Finding::new(
            "wbt",
            format!("{name}: wbt is off: buffered writeback is not held to a depth"),
            None,
        ),
        Some(w) => Finding::new(
            "wbt",
            format!("{name}: {}", w.describe()),
            Some(
                "mergetrace counts the new requests that took a wbt slot and those wbt let by \
                 (meters.wbt); the verdict adds the bios that merged and rode along"
                    .into(),
            ),
        ),
    };
    out.push(finding);
}

/// io.latency: built into this kernel or not, and what it counts where it is.
pub(super) fn iolatency(input: &CheckInput, out: &mut Vec<Finding>) {
    let finding = match (input.env.iolatency, &input.io_hierarchy) {
        (None, _) => return,
        (Some(false), _) => "io.latency is not built into this kernel \
                             (CONFIG_BLK_CGROUP_IOLATENCY): no latency-target meter"
            .to_string(),
        (Some(true), Some((Hierarchy::V2, _))) => "io.latency is built into this kernel: a \
             cgroup's io.latency target throttles its siblings by request, after merging \
             (blkcg_iolatency_throttle in rq_qos_throttle); mergetrace does not read the targets"
            .to_string(),
        (Some(true), _) => "io.latency is built into this kernel, but exists only on cgroup \
             v2: no latency-target meter on this machine's hierarchy"
            .to_string(),
    };
    out.push(Finding::new("io.latency", finding, None));
}
