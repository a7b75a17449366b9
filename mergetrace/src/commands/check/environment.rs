//! The kernel features the tiers need, read from the running system (BTF, the block
//! tracepoints, tracefs, privileges, whether fentry programs may attach), and the tier they
//! allow. The fentry probe loads the embedded object as a run would ([`kernel::attach`]).
use std::path::PathBuf;

use serde::Serialize;

use crate::kernel::{self, btf::Btf, compat::hooks, privileges::Privileges};

/// The kernel features the tiers need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelEnv {
    /// `/sys/kernel/btf/vmlinux` present and parsed.
    pub btf: bool,
    /// The block tracepoints exist as BTF-enabled tracepoints (`btf_trace_block_*`).
    pub block_tracepoints: bool,
    pub tracefs: Option<PathBuf>,
    pub privileges: Privileges,
    /// `None`: not probed (no BTF or no privileges). `Some(Ok(allowed))` / `Some(Err(why))`.
    pub fentry: Option<Result<Option<&'static str>, String>>,
    /// Whether io.latency is built in (its throttle function is in BTF); `None` without BTF.
    pub iolatency: Option<bool>,
}

impl KernelEnv {
    /// This kernel, for a process whose mounts are `mountinfo`.
    pub fn read(mountinfo: &str) -> KernelEnv {
        let privileges = Privileges::current();
        let btf = Btf::from_sys_fs().ok();
        let block_tracepoints = btf
            .as_ref()
            .is_some_and(|b| hooks::required_tracepoints().all(|t| b.has_tracepoint(t)));
        let fentry = match &btf {
            Some(b) if privileges != Privileges::Missing => Some(kernel::attach::fentry_allowed(b)),
            _ => None,
        };
        KernelEnv {
            btf: btf.is_some(),
            block_tracepoints,
            tracefs: tracefs_mount(mountinfo),
            privileges,
            fentry,
            iolatency: btf
                .as_ref()
                .map(|b| b.has_function("blkcg_iolatency_throttle")),
        }
    }
}

/// Where tracefs is mounted, from `/proc/self/mountinfo`.
pub fn tracefs_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split(' ').next() == Some("tracefs"))
            .then(|| PathBuf::from(left.split(' ').nth(4).unwrap_or_default()))
    })
}

/// The tier mergetrace can run here and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierCheck {
    /// "fentry", "tracepoint", or "none" (mergetrace cannot trace here).
    pub name: &'static str,
    pub reason: String,
}

/// The tier mergetrace can run here, from what the kernel allows.
pub fn tier(env: &KernelEnv) -> TierCheck {
    let none = |reason: &str| TierCheck {
        name: "none",
        reason: reason.to_string(),
    };
    if !env.btf {
        return none("this kernel has no BTF (/sys/kernel/btf/vmlinux): mergetrace needs CONFIG_DEBUG_INFO_BTF=y");
    }
    if env.privileges == Privileges::Missing {
        return none("needs root, or CAP_BPF and CAP_PERFMON, to load eBPF programs");
    }
    if !env.block_tracepoints {
        return none("the block tracepoints are not in this kernel's BTF");
    }
    match &env.fentry {
        Some(Ok(Some(function))) => TierCheck {
            name: "fentry",
            reason: format!(
                "fentry tier available: the kernel accepted an fentry program on {function}"
            ),
        },
        Some(Ok(None)) => TierCheck {
            name: "tracepoint",
            reason: "fentry refused by this kernel's policy: tracepoint tier".into(),
        },
        Some(Err(e)) => TierCheck {
            name: "tracepoint",
            reason: format!("fentry probe failed ({e}): tracepoint tier"),
        },
        None => TierCheck {
            name: "tracepoint",
            reason: "fentry not probed: tracepoint tier".into(),
        },
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn env() -> KernelEnv {
        KernelEnv {
            btf: true,
            block_tracepoints: true,
            tracefs: None,
            privileges: Privileges::Root,
            fentry: Some(Ok(None)),
            iolatency: None,
        }
    }

    #[test]
    fn tiers() {
        let mut e = env();
        assert_eq!(
            tier(&e),
            TierCheck {
                name: "tracepoint",
                reason: "fentry refused by this kernel's policy: tracepoint tier".into()
            }
        );
        e.fentry = Some(Ok(Some("__blk_throtl_bio")));
        assert_eq!(tier(&e).name, "fentry");
        assert_eq!(
            tier(&e).reason,
            "fentry tier available: the kernel accepted an fentry program on __blk_throtl_bio"
        );
        e.fentry = Some(Err("loading ...: EINVAL".into()));
        assert_eq!(
            tier(&e).reason,
            "fentry probe failed (loading ...: EINVAL): tracepoint tier"
        );
        e.fentry = None;
        e.privileges = Privileges::Missing;
        assert_eq!(tier(&e).name, "none");
        e.privileges = Privileges::Root;
        e.btf = false;
        assert!(tier(&e).reason.contains("no BTF"));
        e.btf = true;
        e.block_tracepoints = false;
        assert_eq!(tier(&e).name, "none");
    }

    #[test]
    fn tracefs_in_mountinfo() {
        let mi = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                  50 22 0:12 / /sys/kernel/tracing rw,nosuid - tracefs tracefs rw\n";
        assert_eq!(tracefs_mount(mi), Some("/sys/kernel/tracing".into()));
        assert_eq!(tracefs_mount("31 23 0:28 / /x rw - tmpfs tmpfs rw\n"), None);
    }
}
