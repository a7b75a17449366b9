//! Each runtime's files laid out under a scratch root as the runtime lays them out (the
//! podman record and runc state are as podman 4.3 and runc 1.1.5 wrote them on this machine).
use super::*;

const ID: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
const ID2: &str = "ad4635c6507a5e3030eb2108987487c390cfd2d3b061489d61e289634f6d7b2a";
const UID: &str = "8e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";
const V1_MOUNT: &str = "/sys/fs/cgroup/blkio";

struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new() -> Machine {
        Machine {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn names(&self, mount: &str) -> LocalNames {
        let mut n = LocalNames::new(self.dir.path(), mount);
        n.states.recheck_every(std::time::Duration::ZERO);
        n
    }

    fn remove(&self, rel: &str) {
        std::fs::remove_dir_all(self.dir.path().join(rel.trim_start_matches('/'))).unwrap();
    }
}

fn short(names: &mut LocalNames, path: &str) -> String {
    names.name(path).map(|n| n.short).unwrap_or_default()
}

/// A runc `state.json` (the keys runc 1.1 writes) of a container in `cgroup` (absolute per
/// controller) with these spec annotations and bundle.
fn runc_state(id: &str, cgroups: &[(&str, &str)], labels: &[&str]) -> String {
    let paths: serde_json::Map<String, serde_json::Value> = cgroups
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({
        "id": id, "init_process_pid": 4242, "init_process_start": 99, "created": "2026-12-07T13:20:50Z",
        "config": {"labels": labels, "cgroups": {"path": "", "resources": {}}},
        "rootless": false, "cgroup_paths": paths, "namespace_paths": {},
        "external_descriptors": ["/dev/null"], "intel_rdt_path": ""
    })
    .to_string()
}

#[test]
fn docker_and_kubelet_state() {
    let m = Machine::new();
    m.write(
        &format!("var/lib/docker/containers/{ID}/config.v2.json"),
        r#"{"ID":"x","Name":"/web","State":{"Running":true}}"#,
    );
    m.write(&format!("var/log/pods/shop_cart-7d4f9_{UID}/app/0.log"), "");
    m.write(
        &format!("var/log/containers/cart-7d4f9_shop_app-{ID}.log"),
        "",
    );
    let mut local = m.names(V1_MOUNT);
    assert_eq!(
        short(&mut local, &format!("/system.slice/docker-{ID}.scope")),
        "docker:web (3f2a9c1b7d4e)"
    );
    let uid_ = UID.replace('-', "_");
    let k = local
        .name(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        ))
        .unwrap();
    assert_eq!(k.pod_namespace.as_deref(), Some("shop"));
    assert_eq!(k.pod_name.as_deref(), Some("cart-7d4f9"));
    assert_eq!(k.container_name.as_deref(), Some("app"));
    assert_eq!(k.short, "k8s:burstable/pod shop/cart-7d4f9/ctr app");
    // the pod's own cgroup
    assert_eq!(
        short(&mut local, &format!("/kubepods/burstable/pod{UID}")),
        "k8s:burstable/pod shop/cart-7d4f9"
    );
    // Unreadable JSON is no name.
    m.write(
        &format!("var/lib/docker/containers/{ID2}/config.v2.json"),
        "{",
    );
    assert_eq!(
        short(&mut local, &format!("/docker/{ID2}")),
        "docker:ad4635c6507a"
    );
}

#[test]
fn podman_rootful_on_cgroup_v1_and_v2() {
    let m = Machine::new();
    // As podman 4.3 wrote it for `podman run --name names-exp1 --rootfs DIR …`.
    m.write(
        "var/lib/containers/storage/overlay-containers/containers.json",
        &format!(
            r#"[{{"id":"{ID2}","names":["names-exp1"],"image":"","layer":"7f83","metadata":"{{\"image-name\":\"\",\"image-id\":\"\",\"name\":\"names-exp1\",\"created-at\":1796649650}}","created":"2026-12-07T13:20:50.086613106Z","flags":{{"MountLabel":"","ProcessLabel":""}}}}]"#
        ),
    );
    let mut local = m.names(V1_MOUNT);
    // cgroupfs (v1 and v2), systemd (v2), crun's nested `container` cgroup, conmon
    for path in [
        format!("/libpod_parent/libpod-{ID2}"),
        format!("/machine.slice/libpod-{ID2}.scope"),
        format!("/machine.slice/libpod-{ID2}.scope/container"),
    ] {
        let n = local.name(&path).unwrap();
        assert_eq!(n.container_name.as_deref(), Some("names-exp1"), "{path}");
        assert_eq!(n.short, "podman:names-exp1 (ad4635c6507a)");
        assert!(n.matches("names-exp1") && n.matches("podman:names-exp1"));
    }
    assert_eq!(
        short(
            &mut local,
            &format!("/machine.slice/libpod-conmon-{ID2}.scope")
        ),
        "podman-conmon:names-exp1 (ad4635c6507a)"
    );
    // A container not in the store: its id only.
    assert_eq!(
        short(&mut local, &format!("/libpod_parent/libpod-{ID}")),
        "podman:3f2a9c1b7d4e"
    );
}

#[test]
fn podman_in_a_store_storage_conf_moves() {
    let m = Machine::new();
    m.write(
        "etc/containers/storage.conf",
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"/srv/containers\"\nrunroot = \"/run/cs\"\n",
    );
    m.write(
        "srv/containers/vfs-containers/containers.json",
        &format!(r#"[{{"id":"{ID2}","names":["db"]}}]"#),
    );
    // a transient store's records are under the run root
    m.write(
        "run/cs/vfs-containers/volatile-containers.json",
        &format!(r#"[{{"id":"{ID}","names":["cache"]}}]"#),
    );
    let mut local = m.names(V1_MOUNT);
    assert_eq!(
        short(&mut local, &format!("/libpod_parent/libpod-{ID2}")),
        "podman:db (ad4635c6507a)"
    );
    assert_eq!(
        short(&mut local, &format!("/libpod_parent/libpod-{ID}")),
        "podman:cache (3f2a9c1b7d4e)"
    );
}

#[test]
fn podman_rootless_from_the_users_home() {
    let m = Machine::new();
    m.write(
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\nana:x:1000:1000:Ana,,,:/home/ana:/bin/bash\n",
    );
    m.write(
        "home/ana/.local/share/containers/storage/overlay-containers/containers.json",
        &format!(r#"[{{"id":"{ID2}","names":["notes"]}}]"#),
    );
    let mut local = m.names("/sys/fs/cgroup");
    let n = local
        .name(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID2}.scope/container"
        ))
        .unwrap();
    assert_eq!(
        (n.user, n.container_name.as_deref()),
        (Some(1000), Some("notes"))
    );
    // the rootful store does not have it
    assert_eq!(
        short(&mut local, &format!("/machine.slice/libpod-{ID2}.scope")),
        "podman:ad4635c6507a"
    );
}

#[test]
fn kubernetes_names_from_containerd_and_crio_specs() {
    let m = Machine::new();
    // containerd's CRI plugin: the task's bundle in the k8s.io namespace
    m.write(
        &format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/config.json"),
        &format!(
            r#"{{"ociVersion":"1.1.0","annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.container-name":"app","io.kubernetes.cri.sandbox-name":"cart-7d4f9","io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.sandbox-uid":"{UID}"}},"linux":{{"cgroupsPath":"kubepods-burstable-pod.slice:cri-containerd:{ID}"}}}}"#
        ),
    );
    // CRI-O: the spec in the container's run directory, the kubelet's labels as annotations
    m.write(
        &format!("run/containers/storage/overlay-containers/{ID2}/userdata/config.json"),
        r#"{"annotations":{"io.container.manager":"cri-o","io.kubernetes.container.name":"db","io.kubernetes.pod.name":"pg-0","io.kubernetes.pod.namespace":"data","io.kubernetes.cri-o.ContainerType":"container"}}"#,
    );
    let mut local = m.names("/sys/fs/cgroup");
    let uid_ = UID.replace('-', "_");
    assert_eq!(
        short(&mut local, &format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        )),
        "k8s:burstable/pod shop/cart-7d4f9/ctr app"
    );
    assert_eq!(
        short(
            &mut local,
            &format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID2}.scope")
        ),
        "k8s:guaranteed/pod data/pg-0/ctr db"
    );
    // cgroupfs driver: a bare id, either runtime's
    assert_eq!(
        short(&mut local, &format!("/kubepods/besteffort/pod{UID}/{ID2}")),
        "k8s:besteffort/pod data/pg-0/ctr db"
    );
    // CRI-O's scope outside kubepods
    let n = local
        .name(&format!("/system.slice/crio-{ID2}.scope"))
        .unwrap();
    assert_eq!(
        (n.kind, n.container_name.as_deref()),
        (Kind::Crio, Some("db"))
    );
}

#[test]
fn plain_ctr_runc_and_crun_by_their_state() {
    let m = Machine::new();
    // `ctr run IMAGE web`: cgroupfs path /<namespace>/<id>, containerd's runc shim state
    m.write(
        "run/containerd/io.containerd.runtime.v2.task/default/web/config.json",
        r#"{"annotations":{},"linux":{"cgroupsPath":"/default/web"}}"#,
    );
    m.write(
        "run/containerd/runc/default/web/state.json",
        &runc_state(
            "web",
            &[
                ("blkio", "/sys/fs/cgroup/blkio/default/web"),
                ("memory", "/sys/fs/cgroup/memory/default/web"),
            ],
            &["bundle=/run/containerd/io.containerd.runtime.v2.task/default/web"],
        ),
    );
    // `runc --systemd-cgroup run api` on cgroup v1: the scope systemd made
    m.write(
        "run/runc/api/state.json",
        &runc_state(
            "api",
            &[("blkio", "/sys/fs/cgroup/blkio/system.slice/runc-api.scope")],
            &["bundle=/srv/api"],
        ),
    );
    // `crun run db`: crun's status (cgroup path relative), annotations in the bundle
    m.write(
        "run/crun/db/status",
        r#"{"pid":77,"process-start-time":1,"cgroup-path":"/db","scope":"","rootfs":"/srv/db/rootfs","systemd-cgroup":false,"bundle":"/srv/db","created":"2026-12-07T13:20:50Z","owner":"root","detached":true,"external_descriptors":"[]"}"#,
    );
    m.write(
        "srv/db/config.json",
        r#"{"annotations":{"org.example":"x"}}"#,
    );
    let mut local = m.names(V1_MOUNT);
    let n = local.name("/default/web").unwrap();
    assert_eq!(
        (
            n.kind,
            n.container_name.as_deref(),
            n.container_id.as_deref()
        ),
        (Kind::Containerd, Some("web"), None)
    );
    assert_eq!(n.short, "containerd:web");
    assert_eq!(short(&mut local, "/default/web/nested"), "containerd:web");
    assert_eq!(
        short(&mut local, "/system.slice/runc-api.scope"),
        "runc:api"
    );
    assert_eq!(short(&mut local, "/db"), "crun:db");
    // No container: the path's own reading.
    assert_eq!(
        short(&mut local, "/system.slice/nginx.service"),
        "svc:nginx"
    );
    assert_eq!(local.name("/default"), None);
    assert_eq!(local.name("/mt-test-1-2"), None);
}

#[test]
fn names_outlive_the_files_until_forgotten_and_late_files_are_read() {
    let m = Machine::new();
    let mut local = m.names(V1_MOUNT);
    let path = format!("/libpod_parent/libpod-{ID2}");
    // looked up before podman wrote its record: no name, and not remembered
    assert_eq!(short(&mut local, &path), "podman:ad4635c6507a");
    assert_eq!(local.name("/web"), None);
    m.write(
        "var/lib/containers/storage/overlay-containers/containers.json",
        &format!(r#"[{{"id":"{ID2}","names":["late"]}}]"#),
    );
    m.write(
        "run/runc/web/state.json",
        &runc_state("web", &[("blkio", "/sys/fs/cgroup/blkio/web")], &[]),
    );
    assert_eq!(short(&mut local, &path), "podman:late (ad4635c6507a)");
    assert_eq!(short(&mut local, "/web"), "runc:web");
    // the containers exit: their runtimes remove their files; the names stay
    m.write(
        "var/lib/containers/storage/overlay-containers/containers.json",
        "[]",
    );
    m.remove("run/runc/web");
    assert_eq!(short(&mut local, &path), "podman:late (ad4635c6507a)");
    assert_eq!(short(&mut local, "/web"), "runc:web");
    // until the cgroup table lets the paths go
    local.forget(&path);
    local.forget("/web");
    assert_eq!(short(&mut local, &path), "podman:ad4635c6507a");
    assert_eq!(local.name("/web"), None);
}

#[test]
fn a_kubernetes_container_is_kept_only_once_its_own_name_is_found() {
    let m = Machine::new();
    m.write(&format!("var/log/pods/shop_cart_{UID}/app/0.log"), "");
    let mut local = m.names(V1_MOUNT);
    let path = format!("/kubepods/burstable/pod{UID}/{ID}");
    // the pod is known, the container's log link not yet
    assert_eq!(
        short(&mut local, &path),
        "k8s:burstable/pod shop/cart/ctr 3f2a9c1b7d4e"
    );
    m.write(&format!("var/log/containers/cart_shop_app-{ID}.log"), "");
    assert_eq!(
        short(&mut local, &path),
        "k8s:burstable/pod shop/cart/ctr app"
    );
}

#[test]
fn lxc_and_nspawn_need_no_file() {
    let m = Machine::new();
    let mut local = m.names("/sys/fs/cgroup");
    assert_eq!(short(&mut local, "/lxc.payload.web1"), "lxc:web1");
    assert_eq!(
        short(&mut local, r"/machine.slice/machine-web\x2d1.scope/payload"),
        "machine:web-1"
    );
}
