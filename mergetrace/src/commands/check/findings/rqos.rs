//! The rq-qos meters that count requests, after merging: wbt and io.latency.
use super::{CheckInput, Finding};
use crate::sys::{iolatency::State, wbt::WbtState};

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

/// io.latency: whether it can exist here, and the targets set for the device, with what it
/// counts.
pub(super) fn iolatency(input: &CheckInput, out: &mut Vec<Finding>) {
    let Some(state) = &input.iolatency else {
        return;
    };
    let mut finding = state.describe(&input.device.name);
    if *state == State::V1 && input.env.iolatency == Some(false) {
        finding.push_str("; it is not built into this kernel either (CONFIG_BLK_CGROUP_IOLATENCY)");
    }
    let lever = state.targets().map(|_| {
        "mergetrace counts each cgroup's new requests, each of which took a slot at every level \
         of its path (meters.iolatency); the verdict adds the bios that merged and took none"
            .to_string()
    });
    out.push(Finding::new("io.latency", finding, lever));
}

#[cfg(test)]
mod tests {
    use crate::{
        commands::check::findings::fixtures::{by_topic, findings, sda_input},
        sys::iolatency::{IoLatency, State, Target},
    };

    #[test]
    fn iolatency_where_it_cannot_exist_and_where_targets_are_set() {
        let mut i = sda_input();
        i.iolatency = Some(State::V1);
        i.env.iolatency = Some(false);
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "io.latency").finding,
            "io.latency cannot exist here: it is a cgroup v2 file, and this machine's io \
             controller is blkio on cgroup v1; it is not built into this kernel either \
             (CONFIG_BLK_CGROUP_IOLATENCY)"
        );
        i.iolatency = Some(State::NotBuiltIn);
        let f = findings(&i);
        assert!(by_topic(&f, "io.latency")
            .finding
            .starts_with("io.latency is not built into this kernel"));
        i.iolatency = Some(State::Targets(IoLatency {
            targets: vec![Target {
                cgroup: "/db".into(),
                target_us: 10_000,
            }],
        }));
        let f = findings(&i);
        let l = by_topic(&f, "io.latency");
        assert!(
            l.finding.starts_with("sda: io.latency targets: /db 10 ms"),
            "{l:?}"
        );
        assert!(l.lever.as_deref().unwrap().contains("meters.iolatency"));
        i.iolatency = None;
        assert!(findings(&i).iter().all(|f| f.topic != "io.latency"));
    }
}
