//! Readable names for cgroup paths: which container runtime, Kubernetes pod or systemd unit a
//! cgroup belongs to, parsed from the path alone (the names each runtime gives its cgroups,
//! on cgroup v1 and v2, systemd and cgroupfs drivers). Pure: no file is read here; names that
//! only the runtime's own state knows are added by `sys::local_names` (docs/names.md).
use serde::{Deserialize, Serialize};

/// What kind of thing a cgroup is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Docker,
    Containerd,
    Crio,
    Kubernetes,
    SystemdService,
    SystemdScope,
    Slice,
    Podman,
    Lxc,
    /// A machine systemd-machined registered: a systemd-nspawn container (or a VM).
    Machine,
    /// A container runc or crun started outside the runtimes above (found by its state
    /// directory, `sys::local_names`; its path names no runtime).
    Runc,
    Crun,
}

/// A cgroup path, understood. Every field but `kind` and `short` is absent from the JSON when
/// unknown. Captures record it as the run saw it (`capture::RecordedCgroup::name`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadableName {
    pub kind: Kind,
    /// The short form the tables show (`docker:3f2a9c1b7d4e`, `svc:nginx`).
    pub short: String,
    /// The full container id (64 hex digits).
    pub container_id: Option<String>,
    /// Its first 12 hex digits, as `docker ps` shows it.
    pub short_id: Option<String>,
    /// Kubernetes: the runtime whose scope holds the container (containerd, crio, docker).
    pub runtime: Option<String>,
    /// The runtime's monitor process (CRI-O's and podman's conmon, LXC's monitor,
    /// systemd-nspawn's supervisor), not the container itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conmon: bool,
    /// Kubernetes QoS class: guaranteed, burstable or besteffort.
    pub qos: Option<String>,
    /// Kubernetes pod uid, with `-` (the systemd driver writes `_`).
    pub pod_uid: Option<String>,
    /// From the runtime's local state, where it could be read.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// The container's name: from the runtime's local state (Docker, podman, Kubernetes,
    /// runc, crun, containerd) or the path itself (LXC, systemd-nspawn).
    pub container_name: Option<String>,
    /// systemd: the unit (`nginx.service`, `session-3.scope`, `system.slice`).
    pub unit: Option<String>,
    /// systemd, rootless podman: the user whose `user-UID.slice` holds the cgroup.
    pub user: Option<u32>,
}

impl ReadableName {
    pub(crate) fn new(kind: Kind) -> ReadableName {
        ReadableName {
            kind,
            short: String::new(),
            container_id: None,
            short_id: None,
            runtime: None,
            conmon: false,
            qos: None,
            pod_uid: None,
            pod_name: None,
            pod_namespace: None,
            container_name: None,
            unit: None,
            user: None,
        }
    }

    fn with_id(mut self, id: &str) -> ReadableName {
        self.container_id = Some(id.to_string());
        self.short_id = Some(id[..12].to_string());
        self
    }

    /// A container that a runtime's state names, whose cgroup path does not: its id is the
    /// container id when it is one (64 hex digits), else the name the user gave it (`runc run
    /// web`, `ctr run IMAGE web`).
    pub(crate) fn of_runtime(kind: Kind, id: &str) -> ReadableName {
        if is_id(id) {
            ReadableName::new(kind).with_id(id)
        } else {
            let mut n = ReadableName::new(kind);
            n.container_name = Some(id.to_string());
            n
        }
    }

    /// Recomputes `short` from the fields (after a local-state lookup added names).
    pub fn refresh_short(&mut self) {
        self.short = self.render_short();
    }

    fn render_short(&self) -> String {
        let id = self.short_id.as_deref().unwrap_or("?");
        let ctr = || match (&self.container_name, &self.short_id) {
            (Some(n), Some(_)) => format!("{n} ({id})"),
            (Some(n), None) => n.clone(),
            (None, _) => id.to_string(),
        };
        let conmon = if self.conmon { "-conmon" } else { "" };
        let unit = self.unit.as_deref().unwrap_or("?");
        let unit_stem = |suffix: &str| unit.strip_suffix(suffix).unwrap_or(unit).to_string();
        match self.kind {
            Kind::Docker => format!("docker:{}", ctr()),
            Kind::Containerd => format!("containerd:{}", ctr()),
            Kind::Crio => format!("crio{conmon}:{}", ctr()),
            Kind::Podman => format!("podman{conmon}:{}", ctr()),
            Kind::Runc => format!("runc:{}", ctr()),
            Kind::Crun => format!("crun:{}", ctr()),
            Kind::Lxc => format!(
                "lxc:{}{}",
                self.container_name.as_deref().unwrap_or("?"),
                if self.conmon { " (monitor)" } else { "" }
            ),
            Kind::Machine => format!(
                "machine:{}{}",
                self.container_name.as_deref().unwrap_or("?"),
                if self.conmon { " (supervisor)" } else { "" }
            ),
            Kind::SystemdService => format!("svc:{}", unit_stem(".service")),
            Kind::SystemdScope => format!("scope:{}", unit_stem(".scope")),
            Kind::Slice => format!("slice:{}", unit_stem(".slice")),
            Kind::Kubernetes => {
                let mut s = format!("k8s:{}", self.qos.as_deref().unwrap_or("kubepods"));
                match (&self.pod_namespace, &self.pod_name, &self.pod_uid) {
                    (Some(ns), Some(name), _) => s.push_str(&format!("/pod {ns}/{name}")),
                    (_, _, Some(uid)) => s.push_str(&format!("/pod {}…", &uid[..8.min(uid.len())])),
                    _ => {}
                }
                if self.short_id.is_some() {
                    let what = if self.conmon { "conmon" } else { "ctr" };
                    match &self.container_name {
                        Some(n) => s.push_str(&format!("/{what} {n}")),
                        None => s.push_str(&format!("/{what} {id}")),
                    }
                }
                s
            }
        }
    }

    /// Whether a user's `-c` word names this cgroup: a container id prefix (≥ 6 hex digits,
    /// optionally after `docker:` and the like), a systemd unit (`nginx.service`, `nginx`,
    /// `svc:nginx`), a container or pod name, or the short form itself.
    pub fn matches(&self, word: &str) -> bool {
        if word == self.short {
            return true;
        }
        let bare = word.split_once(':').map_or(word, |(_, rest)| rest);
        if bare.len() >= 6 && bare.bytes().all(|b| b.is_ascii_hexdigit()) {
            let bare = bare.to_ascii_lowercase();
            if self
                .container_id
                .as_deref()
                .is_some_and(|id| id.starts_with(&bare))
            {
                return true;
            }
        }
        if let Some(unit) = &self.unit {
            let stem = unit.rsplit_once('.').map_or(unit.as_str(), |(s, _)| s);
            if bare == unit || (bare == stem && self.kind == Kind::SystemdService) {
                return true;
            }
        }
        self.container_name.as_deref() == Some(bare) || self.pod_name.as_deref() == Some(bare)
    }
}

/// Container ids are 64 lowercase hex digits in every runtime named here.
fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A container scope's segment: (kind, id, conmon). `parent` decides what a bare id is
/// (cgroupfs drivers name the directory by the id alone).
fn container_segment(seg: &str, parent: Option<&str>) -> Option<(Kind, String, bool)> {
    let stem = seg.strip_suffix(".scope").unwrap_or(seg);
    const PREFIXES: [(&str, Kind, bool); 6] = [
        ("docker-", Kind::Docker, false),
        ("cri-containerd-", Kind::Containerd, false),
        ("crio-conmon-", Kind::Crio, true),
        ("crio-", Kind::Crio, false),
        ("libpod-conmon-", Kind::Podman, true),
        ("libpod-", Kind::Podman, false),
    ];
    for (prefix, kind, conmon) in PREFIXES {
        if let Some(id) = stem.strip_prefix(prefix).filter(|id| is_id(id)) {
            return Some((kind, id.to_string(), conmon));
        }
    }
    if is_id(seg) {
        let kind = match parent {
            Some("docker") => Kind::Docker,
            Some("libpod_parent") => Kind::Podman,
            // under a Kubernetes pod the runtime is not in the path; the caller knows
            _ => Kind::Containerd,
        };
        return Some((kind, seg.to_string(), false));
    }
    None
}

fn qos_of(seg: &str) -> Option<String> {
    let stem = seg.strip_suffix(".slice").unwrap_or(seg);
    ["burstable", "besteffort", "guaranteed"]
        .into_iter()
        .find(|q| stem == *q || stem.ends_with(&format!("-{q}")))
        .map(str::to_string)
}

/// `pod<uid>` (cgroupfs) or `kubepods-burstable-pod<uid with _>.slice` (systemd).
fn pod_uid_of(seg: &str) -> Option<String> {
    let stem = seg.strip_suffix(".slice").unwrap_or(seg);
    let uid = stem
        .strip_prefix("pod")
        .or_else(|| stem.rfind("-pod").map(|i| &stem[i + 4..]))?;
    // 36-character UUIDs, or the 32 hex digits of a static pod's config hash
    let ok = uid.len() >= 32
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_');
    ok.then(|| uid.replace('_', "-"))
}

/// Kubernetes, from the first segment that names `kubepods` (also `kubelet-kubepods.slice`
/// when the kubelet runs nested, as in kind).
fn kubernetes(segs: &[&str]) -> Option<ReadableName> {
    let start = segs.iter().position(|s| {
        let stem = s.strip_suffix(".slice").unwrap_or(s);
        stem.split('-').any(|w| w == "kubepods")
    })?;
    let mut n = ReadableName::new(Kind::Kubernetes);
    for (i, seg) in segs.iter().enumerate().skip(start) {
        if let Some(uid) = pod_uid_of(seg) {
            n.pod_uid = Some(uid);
        } else if let Some((kind, id, conmon)) = container_segment(seg, None) {
            if n.pod_uid.is_some() && n.container_id.is_none() {
                n = n.with_id(&id);
                n.conmon = conmon;
                // a bare id (cgroupfs driver) does not say whose it is
                n.runtime = match kind {
                    Kind::Docker => Some("docker".into()),
                    Kind::Crio => Some("crio".into()),
                    _ if seg.starts_with("cri-containerd-") => Some("containerd".into()),
                    _ => None,
                };
            }
        } else if i == start || n.pod_uid.is_none() {
            n.qos = qos_of(seg).or(n.qos.take());
        }
    }
    // A pod directly under kubepods is of the guaranteed class.
    if n.pod_uid.is_some() && n.qos.is_none() {
        n.qos = Some("guaranteed".into());
    }
    Some(n)
}

/// The readable name of a hierarchy-relative cgroup path, or `None` for paths that are none
/// of the known kinds (`/`, `/mt`, `(none)`).
pub fn readable(path: &str) -> Option<ReadableName> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut n = readable_segments(&segs)?;
    n.refresh_short();
    Some(n)
}

fn readable_segments(segs: &[&str]) -> Option<ReadableName> {
    if let Some(n) = kubernetes(segs) {
        return Some(n);
    }
    // The deepest container wins: a systemd inside a container is still that container's.
    for i in (0..segs.len()).rev() {
        let parent = i.checked_sub(1).map(|p| segs[p]);
        if let Some((kind, id, conmon)) = container_segment(segs[i], parent) {
            // a bare id elsewhere than under docker/ or libpod_parent/ is not known to be one
            if is_id(segs[i]) && !matches!(parent, Some("docker" | "libpod_parent")) {
                continue;
            }
            let mut n = ReadableName::new(kind).with_id(&id);
            n.conmon = conmon;
            if kind == Kind::Podman {
                // rootless podman: the user's systemd holds it
                n.user = user_of(segs);
            }
            return Some(n);
        }
        if let Some(lxc) = lxc(segs[i], parent) {
            return Some(lxc);
        }
        if let Some(machine) = machine(segs, i) {
            return Some(machine);
        }
    }
    systemd(segs)
}

/// The uid of the first `user-UID.slice` or `user@UID.service` on the path.
fn user_of(segs: &[&str]) -> Option<u32> {
    segs.iter().find_map(|s| {
        s.strip_prefix("user-")
            .and_then(|r| r.strip_suffix(".slice"))
            .or_else(|| s.strip_prefix("user@")?.strip_suffix(".service"))?
            .parse()
            .ok()
    })
}

/// A machine systemd-machined registered (systemd src/machine/machine.c): the transient scope
/// `machine-<escaped name>.scope` it makes for `systemd-nspawn` (and for VMs), or the unit
/// `systemd-nspawn@<escaped name>.service` of `machinectl start` (nspawn's `--keep-unit`).
/// Below it, nspawn keeps itself in `supervisor` and the container in `payload` (cgroup v2;
/// systemd src/nspawn/nspawn-cgroup.c, `create_subcgroup`).
fn machine(segs: &[&str], i: usize) -> Option<ReadableName> {
    let seg = segs[i];
    let escaped = seg
        .strip_prefix("machine-")
        .and_then(|r| r.strip_suffix(".scope"))
        .or_else(|| {
            seg.strip_prefix("systemd-nspawn@")?
                .strip_suffix(".service")
        })?;
    let name = unescape_unit(escaped);
    if name.is_empty() {
        return None;
    }
    let mut n = ReadableName::new(Kind::Machine);
    n.container_name = Some(name);
    n.unit = Some(seg.to_string());
    n.conmon = segs.get(i + 1) == Some(&"supervisor");
    Some(n)
}

/// systemd's unit name escaping undone: `\xNN` is the byte NN (`unit_name_escape` writes `-`
/// as `\x2d`).
fn unescape_unit(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 2..i + 4)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (
            b[i],
            b.get(i + 1),
            hex.and_then(|h| u8::from_str_radix(h, 16).ok()),
        ) {
            (b'\\', Some(b'x'), Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/lxc/NAME` (older LXC, cgroup v1), `lxc.payload.NAME` and `lxc.monitor.NAME` (LXC 4+).
fn lxc(seg: &str, parent: Option<&str>) -> Option<ReadableName> {
    let (name, monitor) = if let Some(name) = seg.strip_prefix("lxc.payload.") {
        (name, false)
    } else if let Some(name) = seg.strip_prefix("lxc.monitor.") {
        (name, true)
    } else if parent == Some("lxc") {
        (seg, false)
    } else {
        return None;
    };
    if name.is_empty() {
        return None;
    }
    let mut n = ReadableName::new(Kind::Lxc);
    n.container_name = Some(name.to_string());
    n.conmon = monitor;
    Some(n)
}

/// The deepest systemd unit on the path, and the user whose slice holds it.
fn systemd(segs: &[&str]) -> Option<ReadableName> {
    let (kind, unit) = segs.iter().rev().find_map(|s| {
        let kind = if s.ends_with(".service") {
            Kind::SystemdService
        } else if s.ends_with(".scope") {
            Kind::SystemdScope
        } else if s.ends_with(".slice") {
            Kind::Slice
        } else {
            return None;
        };
        let stem_len = s.rfind('.').unwrap_or(0);
        (stem_len > 0).then_some((kind, *s))
    })?;
    let mut n = ReadableName::new(kind);
    n.unit = Some(unit.to_string());
    n.user = segs.iter().find_map(|s| {
        s.strip_prefix("user-")?
            .strip_suffix(".slice")?
            .parse()
            .ok()
    });
    Some(n)
}

#[cfg(test)]
mod tests;
