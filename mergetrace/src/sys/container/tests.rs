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
    assert_eq!(n.qos.as_deref(), Some("burstable"));
    assert_eq!(n.pod_uid.as_deref(), Some(UID));
    assert_eq!(n.container_id.as_deref(), Some(ID));
    assert_eq!(n.runtime.as_deref(), Some("containerd"));
    assert_eq!(n.short, "k8s:burstable/pod 8e1f2a3b…/ctr 3f2a9c1b7d4e");
    // guaranteed pods sit directly under kubepods.slice; CRI-O's scopes
    let n = readable(&format!(
        "/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"
    ))
    .unwrap();
    assert_eq!(
        (n.qos.as_deref(), n.runtime.as_deref()),
        (Some("guaranteed"), Some("crio"))
    );
    let n = readable(&format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{ID}.scope"
    ))
    .unwrap();
    assert_eq!((n.qos.as_deref(), n.conmon), (Some("besteffort"), true));
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
        (n.qos.as_deref(), n.pod_uid.as_deref()),
        (Some("burstable"), Some(UID))
    );
    assert_eq!(n.container_id.as_deref(), Some(ID));
    assert_eq!(n.runtime, None, "a bare id does not say which runtime");
    let n = readable(&format!("/kubepods/pod{UID}/{ID}")).unwrap();
    assert_eq!(n.qos.as_deref(), Some("guaranteed"));
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
fn systemd_nspawn_machines() {
    // machined's scope for `systemd-nspawn -M web-1`: the name escaped (`-` is `\x2d`)
    let n = readable(r"/machine.slice/machine-web\x2d1.scope").unwrap();
    assert_eq!(n.kind, Kind::Machine);
    assert_eq!(n.container_name.as_deref(), Some("web-1"));
    assert_eq!(n.unit.as_deref(), Some(r"machine-web\x2d1.scope"));
    assert_eq!(n.short, "machine:web-1");
    // `machinectl start db`: the service nspawn keeps (--keep-unit); v2's payload/supervisor
    assert_eq!(
        short("/machine.slice/systemd-nspawn@db.service/payload/system.slice/postgresql.service"),
        "machine:db"
    );
    let s = readable("/machine.slice/systemd-nspawn@db.service/supervisor").unwrap();
    assert_eq!((s.kind, s.conmon), (Kind::Machine, true));
    assert_eq!(s.short, "machine:db (supervisor)");
    assert!(s.matches("db") && s.matches("machine:db"));
    // podman's pod slice is a slice, not a machine
    assert_eq!(
        readable("/machine.slice/machine-libpod_pod_0123.slice").map(|n| n.kind),
        Some(Kind::Slice)
    );
    assert_eq!(
        readable("/machine.slice/machine-.scope").map(|n| n.kind),
        Some(Kind::SystemdScope)
    );
    assert_eq!(unescape_unit(r"a\x2db\x2"), r"a-b\x2");
}

#[test]
fn rootless_podman_names_its_user() {
    let n = readable(&format!(
        "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
    ))
    .unwrap();
    assert_eq!((n.kind, n.user), (Kind::Podman, Some(1000)));
    assert_eq!(
        readable(&format!("/libpod_parent/libpod-{ID}"))
            .unwrap()
            .user,
        None
    );
}

#[test]
fn runtimes_state_names_a_container_by_id_or_name() {
    let mut n = ReadableName::of_runtime(Kind::Runc, "web");
    n.refresh_short();
    assert_eq!(
        (n.short.as_str(), n.container_id.as_deref()),
        ("runc:web", None)
    );
    assert!(n.matches("web") && n.matches("runc:web"));
    let mut n = ReadableName::of_runtime(Kind::Crun, ID);
    n.refresh_short();
    assert_eq!(n.short, "crun:3f2a9c1b7d4e");
    n.container_name = Some("db".into());
    n.refresh_short();
    assert_eq!(n.short, "crun:db (3f2a9c1b7d4e)");
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

#[test]
fn a_recorded_name_reads_back_as_written() {
    let uid_ = UID.replace('-', "_");
    let mut n = readable(&format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-conmon-{ID}.scope"
    ))
    .unwrap();
    n.pod_name = Some("cart".into());
    n.refresh_short();
    let text = serde_json::to_string(&n).unwrap();
    let back: ReadableName = serde_json::from_str(&text).unwrap();
    assert_eq!(back, n);
    let m: ReadableName =
        serde_json::from_str(r#"{"kind":"machine","short":"machine:web"}"#).unwrap();
    assert_eq!((m.kind, m.short.as_str()), (Kind::Machine, "machine:web"));
}
