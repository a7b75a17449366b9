//! Container and pod names from the runtimes' own files on this machine, to put beside what
//! `sys::container` parsed from a cgroup path (docs/names.md has the table). Only files, never
//! a socket or an API:
//! - Docker: `/var/lib/docker/containers/<id>/config.v2.json`, its `"Name"` (`"/web"`).
//! - podman (rootful and rootless): its store's records (`storage`).
//! - Kubernetes: the annotations of the container's spec, as containerd or CRI-O wrote it
//!   (`oci`), else the kubelet's log directories (`kubelet`).
//! - containerd, CRI-O outside Kubernetes: their specs' annotations (`oci`).
//! - A container whose cgroup path names no runtime (plain `runc run`, crun, `ctr run`):
//!   found by the cgroup path in runc's or crun's state directory (`oci`).
//! - LXC and systemd-nspawn name their cgroups after the container: nothing to read.
//!
//! A name found is kept for the cgroup's path while the cgroup table knows it, so a container
//! keeps its name after it exited and its runtime removed its files. A lookup that finds
//! nothing is not remembered: files that appear later are read then.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use super::container::{self, Kind, ReadableName};

mod kubelet;
mod oci;
mod storage;

pub struct LocalNames {
    /// `/` on the host; a scratch directory in tests.
    root: PathBuf,
    /// cgroup path → the name found for it.
    found: HashMap<String, ReadableName>,
    kubelet: kubelet::Kubelet,
    storage: storage::Storage,
    states: oci::RuntimeStates,
}

impl LocalNames {
    /// `mount`: the io hierarchy's mount (runtimes write absolute cgroup paths).
    pub fn new(root: impl Into<PathBuf>, mount: impl Into<PathBuf>) -> LocalNames {
        LocalNames {
            root: root.into(),
            found: HashMap::new(),
            kubelet: kubelet::Kubelet::default(),
            storage: storage::Storage::default(),
            states: oci::RuntimeStates::new(mount.into()),
        }
    }

    /// The readable name of the cgroup at `path`: what the path says, with what this
    /// machine's runtime files add.
    pub fn name(&mut self, path: &str) -> Option<ReadableName> {
        if let Some(n) = self.found.get(path) {
            return Some(n.clone());
        }
        let parsed = container::readable(path);
        let (mut n, keep) = match parsed {
            Some(mut n) if n.container_id.is_some() || n.kind == Kind::Kubernetes => {
                self.add_by_id(&mut n);
                // kept once the name that says which one it is was found
                let named = match n.container_id {
                    Some(_) => n.container_name.is_some(),
                    None => n.pod_name.is_some(),
                };
                (n, named)
            }
            // their paths carry the name
            Some(n) if matches!(n.kind, Kind::Lxc | Kind::Machine) => return Some(n),
            other => match self.states.container_at(&self.root, path) {
                Some((mut n, annotated)) => {
                    annotated.fill(&mut n);
                    if n.kind == Kind::Podman {
                        self.add_by_id(&mut n);
                    }
                    (n, true)
                }
                None => return other,
            },
        };
        n.refresh_short();
        if keep {
            self.found.insert(path.to_string(), n.clone());
        }
        Some(n)
    }

    /// Forgets the name kept for `path` (the cgroup table let it go).
    pub fn forget(&mut self, path: &str) {
        self.found.remove(path);
    }

    /// Adds the names the runtime of `n`'s container (by its id) or the kubelet keep.
    fn add_by_id(&mut self, n: &mut ReadableName) {
        let root = self.root.clone();
        let Some(id) = n.container_id.clone() else {
            // a pod's own cgroup
            return self.add_pod(n);
        };
        let spec = match (n.kind, n.runtime.as_deref()) {
            (Kind::Docker, _) => {
                n.container_name = docker_name(&root, &id);
                None
            }
            (Kind::Podman, _) if n.container_name.is_none() => {
                n.container_name = self.storage.podman_name(&root, &id, n.user);
                None
            }
            (Kind::Containerd, _) | (Kind::Kubernetes, Some("containerd")) => {
                oci::containerd_bundle(&root, &id)
            }
            (Kind::Crio, _) | (Kind::Kubernetes, Some("crio")) => {
                self.storage.bundle(&root, &id, None)
            }
            // the cgroupfs driver's bare id does not say whose it is
            (Kind::Kubernetes, _) => {
                oci::containerd_bundle(&root, &id).or_else(|| self.storage.bundle(&root, &id, None))
            }
            _ => None,
        };
        if let Some(spec) = spec {
            spec.fill(n);
        }
        if n.kind == Kind::Kubernetes {
            if n.container_name.is_none() {
                n.container_name = self.kubelet.container(&root, &id);
            }
            self.add_pod(n);
        }
    }

    /// A Kubernetes pod's names from the kubelet's log directories, where none came so far.
    fn add_pod(&mut self, n: &mut ReadableName) {
        if n.pod_name.is_some() {
            return;
        }
        if let Some((ns, name)) = n
            .pod_uid
            .clone()
            .and_then(|uid| self.kubelet.pod(&self.root, &uid))
        {
            n.pod_namespace = Some(ns);
            n.pod_name = Some(name);
        }
    }
}

fn docker_name(root: &Path, id: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(rename = "Name")]
        name: String,
    }
    let file = root.join(format!("var/lib/docker/containers/{id}/config.v2.json"));
    let c: Config = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    let name = c.name.trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests;
