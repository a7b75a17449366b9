//! Which tier mergetrace can trace this device with, the facts that decide it, and the lever
//! when it cannot trace at all.
use super::Finding;
use crate::{
    commands::check::{environment::tier, gather::CheckInput},
    kernel::privileges::Privileges,
};

/// The tier finding, always the last.
pub(super) fn tier_finding(input: &CheckInput, out: &mut Vec<Finding>) {
    let env = &input.env;
    let t = tier(env);
    let privs = match env.privileges {
        Privileges::Root => "CAP_SYS_ADMIN",
        Privileges::BpfPerfmon => "CAP_BPF+CAP_PERFMON",
        Privileges::Missing => "no CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON",
    };
    let tracefs = match &env.tracefs {
        Some(p) => format!("tracefs at {}", p.display()),
        None => "tracefs not mounted (not needed: the tracepoints attach through BTF)".into(),
    };
    let facts = format!(
        "BTF {}, block tracepoints {}, {privs}, {tracefs}",
        if env.btf { "present" } else { "missing" },
        if env.block_tracepoints {
            "in BTF"
        } else {
            "missing"
        },
    );
    let (finding, lever) = match t.name {
        "fentry" => (format!("{}; {facts}", t.reason), None),
        "tracepoint" => (
            format!(
                "{}; throttle delays are not measured and failed merge attempts are invisible; {facts}",
                t.reason
            ),
            None,
        ),
        _ => (
            format!("mergetrace cannot trace here: {}; {facts}", t.reason),
            Some(if env.privileges == Privileges::Missing {
                "run it with sudo, or grant CAP_BPF and CAP_PERFMON".to_string()
            } else if !env.btf {
                "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y".to_string()
            } else {
                "use a kernel with the block tracepoints (CONFIG_BLK_DEV_IO_TRACE / tracepoints in BTF)"
                    .to_string()
            }),
        ),
    };
    out.push(Finding::new("tier", finding, lever));
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use crate::kernel::privileges::Privileges;

    #[test]
    fn the_tier_is_the_last_finding_with_its_facts() {
        let f = findings(&sda_input());
        let t = by_topic(&f, "tier");
        assert_eq!(
            t.finding,
            "fentry refused by this kernel's policy: tracepoint tier; throttle delays are not measured and failed merge attempts are invisible; BTF present, block tracepoints in BTF, CAP_SYS_ADMIN, tracefs not mounted (not needed: the tracepoints attach through BTF)"
        );
        assert_eq!(f.last().unwrap().topic, "tier");
        let mut i = sda_input();
        i.env.fentry = None;
        i.env.privileges = Privileges::Missing;
        let t = by_topic(&findings(&i), "tier").clone();
        assert_starts(&t, "mergetrace cannot trace here: needs root");
        assert_eq!(
            t.lever.as_deref(),
            Some("run it with sudo, or grant CAP_BPF and CAP_PERFMON")
        );
    }
}
