//! Who may load eBPF programs: root (CAP_SYS_ADMIN), or CAP_BPF with CAP_PERFMON, read from
//! the process's effective capabilities.
use anyhow::{bail, Result};

/// How the process may use BPF, from `CapEff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Privileges {
    /// CAP_SYS_ADMIN (root).
    Root,
    /// CAP_BPF and CAP_PERFMON without CAP_SYS_ADMIN.
    BpfPerfmon,
    Missing,
}

impl Privileges {
    pub fn from_cap_eff(cap_eff: u64) -> Privileges {
        const CAP_SYS_ADMIN: u64 = 21;
        const CAP_PERFMON: u64 = 38;
        const CAP_BPF: u64 = 39;
        let has = |c: u64| cap_eff & (1 << c) != 0;
        if has(CAP_SYS_ADMIN) {
            Privileges::Root
        } else if has(CAP_BPF) && has(CAP_PERFMON) {
            Privileges::BpfPerfmon
        } else {
            Privileges::Missing
        }
    }

    /// This process's.
    pub fn current() -> Privileges {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Privileges::from_cap_eff(parse_cap_eff(&status).unwrap_or(0))
    }
}

/// `CapEff` from `/proc/self/status`.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Refuses early, in one line, when the process cannot use BPF.
pub fn check_privileges() -> Result<()> {
    if Privileges::current() == Privileges::Missing {
        bail!("mergetrace needs root, or CAP_BPF and CAP_PERFMON, to load its eBPF programs: run it with sudo");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities() {
        let status = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1fffeffffff));
        assert_eq!(Privileges::from_cap_eff(0x1fffeffffff), Privileges::Root);
        assert_eq!(
            Privileges::from_cap_eff((1 << 39) | (1 << 38)),
            Privileges::BpfPerfmon
        );
        assert_eq!(Privileges::from_cap_eff(1 << 39), Privileges::Missing);
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }
}
