//! Container and pod names from the runtimes' own files on this machine, to put beside what
//! `sys::container` parsed from a cgroup path. Only local files, never a socket or a network
//! API; each id is looked up once and remembered (a missing file is a remembered "unknown").
//!
//! What is read, and why that:
//! - Docker: `/var/lib/docker/containers/<id>/config.v2.json`, its `"Name"` (`"/web"`).
//! - Kubernetes (any runtime): the kubelet's log directories, which it names after the pod
//!   and container for log shippers: `/var/log/pods/<namespace>_<pod>_<uid>/` and the
//!   symlinks `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`.
//!   `/var/lib/kubelet/pods/<uid>/` is not used: it holds volumes, `etc-hosts` (whose name is
//!   the pod's hostname, which `spec.hostname` can change) and `containers/<name>/` (the
//!   container names, without their ids), so it cannot say which container a cgroup is.
//! - podman, CRI-O outside Kubernetes, containerd outside Kubernetes: their names live in
//!   databases (bolt, sqlite) or behind their sockets; left out. LXC's name is in the path.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use super::container::{Kind, ReadableName};

/// The names found so far, by container id and pod uid.
pub struct LocalNames {
    /// `/` on the host; a scratch directory in tests.
    root: PathBuf,
    docker: HashMap<String, Option<String>>,
    /// pod uid → (namespace, name)
    pods: HashMap<String, Option<(String, String)>>,
    /// container id → container name (Kubernetes)
    k8s_containers: HashMap<String, Option<String>>,
}

impl LocalNames {
    pub fn new(root: impl Into<PathBuf>) -> LocalNames {
        LocalNames {
            root: root.into(),
            docker: HashMap::new(),
            pods: HashMap::new(),
            k8s_containers: HashMap::new(),
        }
    }

    fn at(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// Adds what this machine's runtime state knows about `n`, and refreshes its short form.
    pub fn enrich(&mut self, n: &mut ReadableName) {
        match n.kind {
            Kind::Docker => {
                if let Some(id) = n.container_id.clone() {
                    n.container_name = self.docker_name(&id);
                }
            }
            Kind::Kubernetes => {
                if let Some(uid) = n.pod_uid.clone() {
                    if let Some((ns, name)) = self.pod(&uid) {
                        n.pod_namespace = Some(ns);
                        n.pod_name = Some(name);
                    }
                }
                if let Some(id) = n.container_id.clone() {
                    n.container_name = self.k8s_container(&id);
                }
            }
            _ => return,
        }
        n.refresh_short();
    }

    fn docker_name(&mut self, id: &str) -> Option<String> {
        if let Some(known) = self.docker.get(id) {
            return known.clone();
        }
        let file = self.at(&format!("var/lib/docker/containers/{id}/config.v2.json"));
        let name = read_docker_name(&file);
        self.docker.insert(id.to_string(), name.clone());
        name
    }

    fn pod(&mut self, uid: &str) -> Option<(String, String)> {
        if !self.pods.contains_key(uid) {
            // One directory read learns every pod there; an unknown uid is remembered.
            for entry in read_names(&self.at("var/log/pods")) {
                if let Some((ns, name, u)) = split_pod_dir(&entry) {
                    self.pods
                        .insert(u.to_string(), Some((ns.into(), name.into())));
                }
            }
            self.pods.entry(uid.to_string()).or_insert(None);
        }
        self.pods[uid].clone()
    }

    fn k8s_container(&mut self, id: &str) -> Option<String> {
        if !self.k8s_containers.contains_key(id) {
            for entry in read_names(&self.at("var/log/containers")) {
                if let Some((ctr, cid)) = split_container_log(&entry) {
                    self.k8s_containers
                        .insert(cid.to_string(), Some(ctr.to_string()));
                }
            }
            self.k8s_containers.entry(id.to_string()).or_insert(None);
        }
        self.k8s_containers[id].clone()
    }
}

fn read_docker_name(file: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(rename = "Name")]
        name: String,
    }
    let text = std::fs::read_to_string(file).ok()?;
    let c: Config = serde_json::from_str(&text).ok()?;
    let name = c.name.trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_string())
}

fn read_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `<namespace>_<pod>_<uid>`: namespaces and pod names are DNS labels (no `_`).
fn split_pod_dir(s: &str) -> Option<(&str, &str, &str)> {
    let mut it = s.splitn(3, '_');
    let (ns, name, uid) = (it.next()?, it.next()?, it.next()?);
    (!ns.is_empty() && !name.is_empty() && !uid.is_empty()).then_some((ns, name, uid))
}

/// `<pod>_<namespace>_<container>-<64 hex id>.log` → (container, id).
fn split_container_log(s: &str) -> Option<(&str, &str)> {
    let stem = s.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    let ctr = rest.rsplit('_').next()?;
    (id.len() == 64 && !ctr.is_empty()).then_some((ctr, id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::container::readable;

    const ID: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
    const UID: &str = "8e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn docker_and_kubelet_state() {
        let t = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| {
            let p = t.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w(
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            r#"{"ID":"x","Name":"/web","State":{"Running":true}}"#,
        );
        w(&format!("var/log/pods/shop_cart-7d4f9_{UID}/app/0.log"), "");
        w(
            &format!("var/log/containers/cart-7d4f9_shop_app-{ID}.log"),
            "",
        );
        let mut local = LocalNames::new(t.path());

        let mut d = readable(&format!("/system.slice/docker-{ID}.scope")).unwrap();
        local.enrich(&mut d);
        assert_eq!(d.container_name.as_deref(), Some("web"));
        assert_eq!(d.short, "docker:web (3f2a9c1b7d4e)");

        let uid_ = UID.replace('-', "_");
        let mut k = readable(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
        ))
        .unwrap();
        local.enrich(&mut k);
        assert_eq!(k.pod_namespace.as_deref(), Some("shop"));
        assert_eq!(k.pod_name.as_deref(), Some("cart-7d4f9"));
        assert_eq!(k.container_name.as_deref(), Some("app"));
        assert_eq!(k.short, "k8s:burstable/pod shop/cart-7d4f9/ctr app");

        // Missing files are no names, and remembered: a file that appears later is not read.
        let other = ID.replace('3', "4");
        let mut d2 = readable(&format!("/docker/{other}")).unwrap();
        local.enrich(&mut d2);
        assert_eq!(d2.container_name, None);
        assert_eq!(d2.short, "docker:4f2a9c1b7d4e");
        w(
            &format!("var/lib/docker/containers/{other}/config.v2.json"),
            r#"{"Name":"/late"}"#,
        );
        local.enrich(&mut d2);
        assert_eq!(d2.container_name, None);
        // Unreadable JSON is no name either.
        assert_eq!(read_docker_name(&t.path().join("nope")), None);
    }

    #[test]
    fn splits_kubelet_names() {
        assert_eq!(
            split_pod_dir(&format!("kube-system_kube-proxy-6xsx9_{UID}")),
            Some(("kube-system", "kube-proxy-6xsx9", UID))
        );
        assert_eq!(split_pod_dir("nounderscore"), None);
        assert_eq!(
            split_container_log(&format!("kube-proxy-6xsx9_kube-system_kube-proxy-{ID}.log")),
            Some(("kube-proxy", ID))
        );
        assert_eq!(split_container_log("x_y_z-short.log"), None);
    }
}
