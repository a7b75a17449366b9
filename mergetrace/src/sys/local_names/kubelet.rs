//! Pod and container names from the kubelet's log directories, which it names after the pod
//! and container for log shippers, whatever the runtime (kubernetes `pkg/kubelet/kuberuntime`):
//! - `/var/log/pods/<namespace>_<pod>_<uid>/` (`BuildPodLogsDirectory`, helpers.go)
//! - `/var/log/containers/<pod>_<namespace>_<container>-<id>.log`, symlinks
//!   (`legacyLogSymlink`, legacy.go)
//!
//! `/var/lib/kubelet/pods/<uid>/` is not used: it holds volumes, `etc-hosts` (whose name is the
//! pod's hostname, which `spec.hostname` can change) and `containers/<name>/` (the container
//! names without their ids), so it cannot say which container a cgroup is.
use std::{collections::HashMap, path::Path};

/// What the directories said at their last read; a uid or id not there reads them again.
#[derive(Default)]
pub struct Kubelet {
    /// pod uid → (namespace, name)
    pods: HashMap<String, (String, String)>,
    /// container id → container name
    containers: HashMap<String, String>,
}

impl Kubelet {
    /// The pod's (namespace, name).
    pub fn pod(&mut self, root: &Path, uid: &str) -> Option<(String, String)> {
        if !self.pods.contains_key(uid) {
            // One directory read learns every pod there (and forgets those gone).
            self.pods = read_names(&root.join("var/log/pods"))
                .iter()
                .filter_map(|e| split_pod_dir(e))
                .map(|(ns, name, uid)| (uid.to_string(), (ns.to_string(), name.to_string())))
                .collect();
        }
        self.pods.get(uid).cloned()
    }

    /// The container's name in its pod.
    pub fn container(&mut self, root: &Path, id: &str) -> Option<String> {
        if !self.containers.contains_key(id) {
            self.containers = read_names(&root.join("var/log/containers"))
                .iter()
                .filter_map(|e| split_container_log(e))
                .map(|(ctr, id)| (id.to_string(), ctr.to_string()))
                .collect();
        }
        self.containers.get(id).cloned()
    }
}

pub(super) fn read_names(dir: &Path) -> Vec<String> {
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

    const ID: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
    const UID: &str = "8e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";

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

    #[test]
    fn a_pod_that_appears_later_is_found() {
        let t = tempfile::tempdir().unwrap();
        let mut k = Kubelet::default();
        assert_eq!(k.pod(t.path(), UID), None);
        std::fs::create_dir_all(t.path().join(format!("var/log/pods/shop_cart_{UID}"))).unwrap();
        assert_eq!(k.pod(t.path(), UID), Some(("shop".into(), "cart".into())));
    }
}
