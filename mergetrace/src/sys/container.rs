//! Readable names for cgroup paths: which container runtime, Kubernetes pod or systemd unit a
//! cgroup belongs to, parsed from the path alone (the names each runtime gives its cgroups,
//! on cgroup v1 and v2, systemd and cgroupfs drivers). Pure: no file is read here; names that
//! only the runtime's own state knows are added by `sys::local_names`.
use serde::Serialize;

/// What kind of thing a cgroup is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
}

/// A cgroup path, understood. Every field but `kind` and `short` is absent from the JSON when
/// unknown.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadableName {
    pub kind: Kind,
    /// The short form the tables show (`docker:3f2a9c1b7d4e`, `svc:nginx`).
    pub short: String,
    /// The full container id (64 hex digits).
    pub container_id: Option<String>,
    /// Its first 12 hex digits, as `docker ps` shows it.
    pub short_id: Option<String>,
    /// Kubernetes: the runtime whose scope holds the container (containerd, crio, docker).
    pub runtime: Option<&'static str>,
    /// The runtime's monitor process (CRI-O's and podman's conmon), not the container itself.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub conmon: bool,
    /// Kubernetes QoS class: guaranteed, burstable or besteffort.
    pub qos: Option<&'static str>,
    /// Kubernetes pod uid, with `-` (the systemd driver writes `_`).
    pub pod_uid: Option<String>,
    /// From the runtime's local state, where it could be read.
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// The container's name: from the runtime's local state (Docker, Kubernetes) or the path
    /// itself (LXC).
    pub container_name: Option<String>,
    /// systemd: the unit (`nginx.service`, `session-3.scope`, `system.slice`).
    pub unit: Option<String>,
    /// systemd: the user whose `user-UID.slice` holds the unit.
    pub user: Option<u32>,
}

impl ReadableName {
    fn new(kind: Kind) -> ReadableName {
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

    /// Recomputes `short` from the fields (after a local-state lookup added names).
    pub fn refresh_short(&mut self) {
        self.short = self.render_short();
    }

    fn render_short(&self) -> String {
        let id = self.short_id.as_deref().unwrap_or("?");
        let ctr = || match &self.container_name {
            Some(n) => format!("{n} ({id})"),
            None => id.to_string(),
        };
        let conmon = if self.conmon { "-conmon" } else { "" };
        let unit = self.unit.as_deref().unwrap_or("?");
        let unit_stem = |suffix: &str| unit.strip_suffix(suffix).unwrap_or(unit).to_string();
        match self.kind {
            Kind::Docker => format!("docker:{}", ctr()),
            Kind::Containerd => format!("containerd:{}", ctr()),
            Kind::Crio => format!("crio{conmon}:{}", ctr()),
            Kind::Podman => format!("podman{conmon}:{}", ctr()),
            Kind::Lxc => format!(
                "lxc:{}{}",
                self.container_name.as_deref().unwrap_or("?"),
                if self.conmon { " (monitor)" } else { "" }
            ),
            Kind::SystemdService => format!("svc:{}", unit_stem(".service")),
            Kind::SystemdScope => format!("scope:{}", unit_stem(".scope")),
            Kind::Slice => format!("slice:{}", unit_stem(".slice")),
            Kind::Kubernetes => {
                let mut s = format!("k8s:{}", self.qos.unwrap_or("kubepods"));
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

fn qos_of(seg: &str) -> Option<&'static str> {
    let stem = seg.strip_suffix(".slice").unwrap_or(seg);
    ["burstable", "besteffort", "guaranteed"]
        .into_iter()
        .find(|q| stem == *q || stem.ends_with(&format!("-{q}")))
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
                    Kind::Docker => Some("docker"),
                    Kind::Crio => Some("crio"),
                    _ if seg.starts_with("cri-containerd-") => Some("containerd"),
                    _ => None,
                };
            }
        } else if i == start || n.pod_uid.is_none() {
            n.qos = qos_of(seg).or(n.qos);
        }
    }
    // A pod directly under kubepods is of the guaranteed class.
    if n.pod_uid.is_some() && n.qos.is_none() {
        n.qos = Some("guaranteed");
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
            return Some(n);
        }
        if let Some(lxc) = lxc(segs[i], parent) {
            return Some(lxc);
        }
    }
    systemd(segs)
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
mod tests {
    use super::*;

    const ID: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
    const UID: &str = "8e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";

    fn short(path: &str) -> String {
        readable(path).map(|n| n.short).unwrap_or_default()
    }

    #[test]
    fn docker_v2_systemd_and_v1_cgroupfs() {
        for path in [
            format!("/system.slice/docker-{ID}.scope"),
            format!("/docker/{ID}"),
            format!("/docker/{ID}/system.slice/nginx.service"),
        ] {
            let n = readable(&path).unwrap();
            assert_eq!(n.kind, Kind::Docker, "{path}");
            assert_eq!(n.container_id.as_deref(), Some(ID));
            assert_eq!(n.short_id.as_deref(), Some("3f2a9c1b7d4e"));
            assert_eq!(n.short, "docker:3f2a9c1b7d4e");
        }
    }

    #[test]
    fn containerd_crio_podman() {
        assert_eq!(
            short(&format!("/system.slice/cri-containerd-{ID}.scope")),
            "containerd:3f2a9c1b7d4e"
        );
        assert_eq!(
            short(&format!("/system.slice/crio-{ID}.scope")),
            "crio:3f2a9c1b7d4e"
        );
        let conmon = readable(&format!("/system.slice/crio-conmon-{ID}.scope")).unwrap();
        assert_eq!((conmon.kind, conmon.conmon), (Kind::Crio, true));
        assert_eq!(conmon.short, "crio-conmon:3f2a9c1b7d4e");
        assert_eq!(
            short(&format!("/machine.slice/libpod-{ID}.scope")),
            "podman:3f2a9c1b7d4e"
        );
        assert_eq!(
            short(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            "podman-conmon:3f2a9c1b7d4e"
        );
        // rootless podman, under the user's systemd
        assert_eq!(
            short(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
            )),
            "podman:3f2a9c1b7d4e"
        );
        assert_eq!(
            short(&format!("/libpod_parent/{ID}")),
            "podman:3f2a9c1b7d4e"
        );
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let uid_ = UID.replace('-', "_");
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        );
        let n = readable(&path).unwrap();
        assert_eq!(n.kind, Kind::Kubernetes);
        assert_eq!(n.qos, Some("burstable"));
        assert_eq!(n.pod_uid.as_deref(), Some(UID));
        assert_eq!(n.container_id.as_deref(), Some(ID));
        assert_eq!(n.runtime, Some("containerd"));
        assert_eq!(n.short, "k8s:burstable/pod 8e1f2a3b…/ctr 3f2a9c1b7d4e");
        // guaranteed pods sit directly under kubepods.slice; CRI-O's scopes
        let n = readable(&format!(
            "/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"
        ))
        .unwrap();
        assert_eq!((n.qos, n.runtime), (Some("guaranteed"), Some("crio")));
        let n = readable(&format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{ID}.scope"
        ))
        .unwrap();
        assert_eq!((n.qos, n.conmon), (Some("besteffort"), true));
        assert_eq!(n.short, "k8s:besteffort/pod 8e1f2a3b…/conmon 3f2a9c1b7d4e");
        // the pod's own cgroup, the QoS slice, kubepods itself
        assert_eq!(
            short(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
            )),
            "k8s:burstable/pod 8e1f2a3b…"
        );
        assert_eq!(
            short("/kubepods.slice/kubepods-burstable.slice"),
            "k8s:burstable"
        );
        assert_eq!(short("/kubepods.slice"), "k8s:kubepods");
        // a nested kubelet (kind)
        assert_eq!(
            short(&format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope")),
            "k8s:besteffort/pod 8e1f2a3b…/ctr 3f2a9c1b7d4e"
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver_v1() {
        let n = readable(&format!("/kubepods/burstable/pod{UID}/{ID}")).unwrap();
        assert_eq!(n.kind, Kind::Kubernetes);
        assert_eq!(
            (n.qos, n.pod_uid.as_deref()),
            (Some("burstable"), Some(UID))
        );
        assert_eq!(n.container_id.as_deref(), Some(ID));
        assert_eq!(n.runtime, None, "a bare id does not say which runtime");
        let n = readable(&format!("/kubepods/pod{UID}/{ID}")).unwrap();
        assert_eq!(n.qos, Some("guaranteed"));
        assert_eq!(
            short(&format!("/kubepods/besteffort/pod{UID}")),
            "k8s:besteffort/pod 8e1f2a3b…"
        );
        // a static pod's uid is its config hash
        let n = readable("/kubepods/burstable/pod33d556edd3ae8ef21980288cef77ae8b").unwrap();
        assert_eq!(
            n.pod_uid.as_deref(),
            Some("33d556edd3ae8ef21980288cef77ae8b")
        );
    }

    #[test]
    fn systemd_units_and_slices() {
        let n = readable("/system.slice/nginx.service").unwrap();
        assert_eq!(
            (n.kind, n.unit.as_deref()),
            (Kind::SystemdService, Some("nginx.service"))
        );
        assert_eq!(n.short, "svc:nginx");
        assert_eq!(short("/system.slice/getty@tty1.service"), "svc:getty@tty1");
        let n = readable("/user.slice/user-1000.slice/session-3.scope").unwrap();
        assert_eq!((n.kind, n.user), (Kind::SystemdScope, Some(1000)));
        assert_eq!(n.short, "scope:session-3");
        assert_eq!(
            short("/user.slice/user-1000.slice/user@1000.service"),
            "svc:user@1000"
        );
        let n = readable("/system.slice").unwrap();
        assert_eq!((n.kind, n.short.as_str()), (Kind::Slice, "slice:system"));
        assert_eq!(short("/user.slice/user-1000.slice"), "slice:user-1000");
        assert_eq!(short("/init.scope"), "scope:init");
    }

    #[test]
    fn lxc_old_and_new() {
        assert_eq!(short("/lxc/web1"), "lxc:web1");
        assert_eq!(short("/lxc/web1/system.slice/nginx.service"), "lxc:web1");
        assert_eq!(short("/lxc.payload.web1"), "lxc:web1");
        assert_eq!(short("/lxc.payload.web1/init.scope"), "lxc:web1");
        assert_eq!(short("/lxc.monitor.web1"), "lxc:web1 (monitor)");
    }

    #[test]
    fn an_id_too_short_is_a_plain_scope() {
        let n = readable("/system.slice/docker-3f2a9c.scope").unwrap();
        assert_eq!((n.kind, n.container_id), (Kind::SystemdScope, None));
    }

    #[test]
    fn none_of_them() {
        for path in [
            "/",
            "",
            "(none)",
            "(unknown cgroup id 7)",
            "/mt",
            "/mt-names-123",
            "/docker",
            "/docker/notanid",
            &format!("/mt/{ID}"), // a bare id outside docker/ or kubepods
            "/lxc",
            "/.slice",
        ] {
            assert_eq!(readable(path), None, "{path}");
        }
    }

    #[test]
    fn matches_user_words() {
        let n = readable(&format!("/system.slice/docker-{ID}.scope")).unwrap();
        assert!(n.matches("3f2a9c") && n.matches("docker:3f2a9c1b") && n.matches("3F2A9C"));
        assert!(!n.matches("3f2a9") && !n.matches("3f2a9d"));
        let s = readable("/system.slice/nginx.service").unwrap();
        assert!(s.matches("nginx") && s.matches("nginx.service") && s.matches("svc:nginx"));
        assert!(!s.matches("nginx.scope"));
        let sc = readable("/user.slice/user-1000.slice/session-3.scope").unwrap();
        assert!(sc.matches("session-3.scope") && sc.matches("scope:session-3"));
    }

    #[test]
    fn json_fields() {
        let uid_ = UID.replace('-', "_");
        let n = readable(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        ))
        .unwrap();
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["kind"], "kubernetes");
        assert_eq!(v["qos"], "burstable");
        assert_eq!(v["pod_uid"], UID);
        assert_eq!(v["container_id"], ID);
        assert_eq!(v["short_id"], "3f2a9c1b7d4e");
        assert_eq!(v["runtime"], "containerd");
        assert!(v.get("conmon").is_none() && v.get("unit").is_none());
        let v = serde_json::to_value(readable("/system.slice/nginx.service").unwrap()).unwrap();
        assert_eq!(v["kind"], "systemd-service");
        assert_eq!(v["unit"], "nginx.service");
    }
}
