//! The running kernel's release, and version comparisons on it: where a kernel's behaviour
//! changed at a version and nothing else tells (sysfs output, what a meter charges).

/// `uname -r` of the running kernel ("" if unreadable).
pub fn running() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether `release` ("6.1.0-57-cloud-amd64") is older than `major.minor`. An unreadable
/// release counts as old.
pub fn before(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    };
    (next(), next()) < (major, minor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn compares_major_and_minor() {
        assert!(super::before("6.1.0-57-cloud-amd64", 6, 2));
        assert!(!super::before("6.12.117+deb12-cloud-amd64", 6, 6));
        assert!(super::before("5.10.0-35-cloud-amd64", 6, 6));
        assert!(!super::before("6.18.44-fc-v857", 6, 18));
        assert!(super::before("", 5, 0));
    }
}
