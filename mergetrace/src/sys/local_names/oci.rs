//! What OCI runtimes keep on disk for a running container: the bundle's `config.json` (the
//! OCI runtime spec, whose annotations carry Kubernetes' names) and the runtime's own state
//! directory (runc, crun), which says which cgroup the container is in.
//!
//! - containerd writes each task's bundle to `<state>/io.containerd.runtime.v2.task/<namespace>/
//!   <id>/config.json` (containerd `runtime/v2/bundle.go`, `NewBundle`); the state dir is
//!   `/run/containerd` (`/run/k3s/containerd` under k3s). Its CRI plugin annotates Kubernetes
//!   containers with `io.kubernetes.cri.container-name`, `…sandbox-name`, `…sandbox-namespace`,
//!   `…sandbox-uid` (containerd `pkg/cri/annotations/annotations.go`). Its `metadata.db` (a
//!   bbolt database it holds open) is not read: a running task's bundle says what is needed.
//! - CRI-O writes the spec to the container's directories in containers/storage
//!   (`<graphroot>/overlay-containers/<id>/userdata/config.json` and the same under the run
//!   root; cri-o `server/container_create.go`), with the kubelet's labels as annotations:
//!   `io.kubernetes.container.name`, `io.kubernetes.pod.name`, `io.kubernetes.pod.namespace`,
//!   `io.kubernetes.pod.uid`; podman writes its spec there too, annotated
//!   `io.container.manager=libpod` (cri-o `pkg/annotations/internal.go`).
//! - runc keeps `<root>/<id>/state.json`: `cgroup_paths` (per controller on cgroup v1, `""` on
//!   v2; absolute paths) and `config.labels`, the spec's annotations as `key=value` plus
//!   `bundle=<dir>` (runc `libcontainer/container_linux.go` `State`, `libcontainer/specconv`).
//!   Its root is `/run/runc` (podman, plain `runc run`), `/run/containerd/runc/<namespace>`
//!   (containerd's runc shim), `/run/user/<uid>/runc` (rootless).
//! - crun keeps `<root>/<id>/status`: `cgroup-path` (relative to the cgroup mount) and
//!   `bundle` (crun `src/libcrun/status.c`); its root is `/run/crun`, `/run/user/<uid>/crun`.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use serde::Deserialize;

use super::kubelet::read_names;
use crate::sys::container::{Kind, ReadableName};

/// The names a bundle's annotations carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotated {
    pub container_name: Option<String>,
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// `io.container.manager`: `libpod` for podman's containers.
    pub manager: Option<String>,
}

impl Annotated {
    fn from_map(a: &HashMap<String, String>) -> Annotated {
        let first = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| a.get(*k).filter(|v| !v.is_empty()).cloned())
        };
        Annotated {
            container_name: first(&[
                "io.kubernetes.cri.container-name",
                "io.kubernetes.container.name",
            ]),
            pod_name: first(&["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"]),
            pod_namespace: first(&[
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace",
            ]),
            manager: first(&["io.container.manager"]),
        }
    }

    /// Adds its names where `n` has none.
    pub fn fill(&self, n: &mut ReadableName) {
        for (to, from) in [
            (&mut n.container_name, &self.container_name),
            (&mut n.pod_name, &self.pod_name),
            (&mut n.pod_namespace, &self.pod_namespace),
        ] {
            if to.is_none() {
                to.clone_from(from);
            }
        }
    }
}

/// The names the spec at `file` (a bundle's `config.json`) annotates, `None` if unreadable.
pub fn read_bundle(file: &Path) -> Option<Annotated> {
    read_annotations(file).map(|a| Annotated::from_map(&a))
}

fn read_annotations(file: &Path) -> Option<HashMap<String, String>> {
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        annotations: HashMap<String, String>,
    }
    let spec: Spec = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    Some(spec.annotations)
}

/// containerd's task state directories, each `<namespace>/<id>/config.json`.
const CONTAINERD_TASKS: [&str; 2] = [
    "run/containerd/io.containerd.runtime.v2.task",
    "run/k3s/containerd/io.containerd.runtime.v2.task",
];

/// The bundle of containerd's task `id`, in whichever namespace holds it.
pub fn containerd_bundle(root: &Path, id: &str) -> Option<Annotated> {
    CONTAINERD_TASKS.iter().find_map(|tasks| {
        let dir = root.join(tasks);
        read_names(&dir)
            .iter()
            .find_map(|ns| read_bundle(&dir.join(ns).join(id).join("config.json")))
    })
}

/// The namespace of a containerd bundle directory (`…/io.containerd.runtime.v2.task/<ns>/<id>`).
fn containerd_namespace(bundle: &str) -> Option<&str> {
    let (_, rest) = bundle.split_once("/io.containerd.runtime.v2.task/")?;
    rest.split('/').next().filter(|ns| !ns.is_empty())
}

/// Which runtime keeps a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Runc,
    Crun,
}

/// The runtimes' state roots; `*` stands for every entry of that directory.
const STATE_ROOTS: [(&str, Runtime); 5] = [
    ("run/runc", Runtime::Runc),
    ("run/containerd/runc/*", Runtime::Runc),
    ("run/user/*/runc", Runtime::Runc),
    ("run/crun", Runtime::Crun),
    ("run/user/*/crun", Runtime::Crun),
];

/// How often at most the state roots are looked at again (a look is a stat of each root, and a
/// read of those that changed): the lookup of every cgroup without a container (every
/// interval's rows) must stay cheap. A container started since is named from the next look on.
const RECHECK: Duration = Duration::from_millis(250);

/// One container a runtime's state directory holds.
#[derive(Debug, Clone)]
struct State {
    runtime: Runtime,
    id: String,
    bundle: Option<String>,
    annotated: Annotated,
}

/// The containers the runtimes' state directories hold, by cgroup path (relative to the
/// mount of the io hierarchy).
pub struct RuntimeStates {
    mount: PathBuf,
    /// Each state root seen, with its mtime at the last read (an entry added or removed
    /// changes it).
    roots: HashMap<PathBuf, SystemTime>,
    /// state directory → (cgroup path, the container), for the roots read.
    by_dir: HashMap<PathBuf, (String, State)>,
    by_cgroup: HashMap<String, PathBuf>,
    /// Roots with an entry that could not be read (a runtime makes the directory before it
    /// writes the state): read again at the next look, whatever their mtime.
    incomplete: HashSet<PathBuf>,
    checked: Option<Instant>,
    recheck: Duration,
}

impl RuntimeStates {
    pub fn new(mount: PathBuf) -> RuntimeStates {
        RuntimeStates {
            mount,
            roots: HashMap::new(),
            by_dir: HashMap::new(),
            by_cgroup: HashMap::new(),
            incomplete: HashSet::new(),
            checked: None,
            recheck: RECHECK,
        }
    }

    #[cfg(test)]
    pub fn recheck_every(&mut self, d: Duration) {
        self.recheck = d;
    }

    /// The container whose cgroup is `path` or its nearest ancestor that is one (a runtime may
    /// nest cgroups inside its container's), named from its runtime's state and bundle.
    pub fn container_at(&mut self, root: &Path, path: &str) -> Option<(ReadableName, Annotated)> {
        if self.checked.is_none_or(|t| t.elapsed() >= self.recheck) {
            self.refresh(root);
        }
        let state = self.find(path)?;
        Some(name_of(state))
    }

    fn find(&self, path: &str) -> Option<&State> {
        let mut p = path;
        loop {
            if let Some(dir) = self.by_cgroup.get(p) {
                return self.by_dir.get(dir).map(|(_, s)| s);
            }
            match p.rsplit_once('/') {
                Some((parent, _)) if !parent.is_empty() => p = parent,
                _ => return None,
            }
        }
    }

    /// Reads the state roots whose mtime changed: new containers in, gone ones out.
    fn refresh(&mut self, root: &Path) {
        self.checked = Some(Instant::now());
        let mut seen_roots = HashMap::new();
        for (pattern, runtime) in STATE_ROOTS {
            for dir in expand(root, pattern) {
                let Some(mtime) = mtime(&dir) else { continue };
                if self.roots.get(&dir) != Some(&mtime) || self.incomplete.contains(&dir) {
                    if self.read_root(root, &dir, runtime) {
                        self.incomplete.remove(&dir);
                    } else {
                        self.incomplete.insert(dir.clone());
                    }
                }
                seen_roots.insert(dir, mtime);
            }
        }
        // Roots gone (a rootless user logged out): their containers are gone too.
        self.by_dir
            .retain(|d, _| d.parent().is_some_and(|p| seen_roots.contains_key(p)));
        self.incomplete.retain(|d| seen_roots.contains_key(d));
        self.roots = seen_roots;
        self.by_cgroup = self
            .by_dir
            .iter()
            .map(|(dir, (cgroup, _))| (cgroup.clone(), dir.clone()))
            .collect();
    }

    /// Reads one state root; whether every entry could be read.
    fn read_root(&mut self, root: &Path, dir: &Path, runtime: Runtime) -> bool {
        // crun keeps `.empty-directory` there: no container
        let ids: Vec<String> = read_names(dir)
            .into_iter()
            .filter(|i| !i.starts_with('.'))
            .collect();
        self.by_dir.retain(|d, _| {
            d.parent() != Some(dir)
                || d.file_name()
                    .is_some_and(|f| ids.iter().any(|i| f == i.as_str()))
        });
        let mut complete = true;
        for id in ids {
            let state_dir = dir.join(&id);
            if self.by_dir.contains_key(&state_dir) {
                continue;
            }
            let read = match runtime {
                Runtime::Runc => read_runc(&state_dir, &self.mount),
                Runtime::Crun => read_crun(&state_dir, &self.mount),
            };
            if let Some((cgroup, bundle, mut annotations)) = read {
                // crun's state has none: they are in the bundle's spec
                if annotations.is_empty() {
                    if let Some(b) = &bundle {
                        let file = root.join(b.trim_start_matches('/')).join("config.json");
                        annotations = read_annotations(&file).unwrap_or_default();
                    }
                }
                let state = State {
                    runtime,
                    id,
                    bundle,
                    annotated: Annotated::from_map(&annotations),
                };
                self.by_dir.insert(state_dir, (cgroup, state));
            } else if state_dir.is_dir() {
                complete = false;
            }
        }
        complete
    }
}

/// The readable name of a container found by its runtime's state: containerd's (its bundle is
/// a containerd task's), podman's (`io.container.manager=libpod`), else plain runc's or
/// crun's; Kubernetes names from the annotations are the caller's to add.
fn name_of(s: &State) -> (ReadableName, Annotated) {
    let kind = if s.bundle.as_deref().and_then(containerd_namespace).is_some() {
        Kind::Containerd
    } else if s.annotated.manager.as_deref() == Some("libpod") {
        Kind::Podman
    } else {
        match s.runtime {
            Runtime::Runc => Kind::Runc,
            Runtime::Crun => Kind::Crun,
        }
    };
    (ReadableName::of_runtime(kind, &s.id), s.annotated.clone())
}

/// `pattern` under `root` with each `*` replaced by every entry of that directory.
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    for part in pattern.split('/') {
        dirs = dirs
            .into_iter()
            .flat_map(|d| {
                if part == "*" {
                    read_names(&d).into_iter().map(|e| d.join(e)).collect()
                } else {
                    vec![d.join(part)]
                }
            })
            .collect();
    }
    dirs
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).ok()?.modified().ok()
}

/// A cgroup path as the runtime wrote it, relative to `mount` (the io hierarchy's): absolute
/// paths under the mount, or already relative (crun).
fn relative_cgroup(path: &str, mount: &Path) -> Option<String> {
    let p = Path::new(path);
    let rel = match p.strip_prefix(mount) {
        Ok(rel) => rel,
        Err(_) if path.starts_with("/sys/fs/cgroup") => return None,
        Err(_) => p.strip_prefix("/").unwrap_or(p),
    };
    Some(format!("/{}", rel.display()))
}

/// runc's `state.json`: (cgroup path in the io hierarchy, bundle, annotations).
fn read_runc(
    dir: &Path,
    mount: &Path,
) -> Option<(String, Option<String>, HashMap<String, String>)> {
    #[derive(Deserialize)]
    struct Config {
        #[serde(default)]
        labels: Vec<String>,
    }
    #[derive(Deserialize)]
    struct State {
        #[serde(default)]
        cgroup_paths: HashMap<String, String>,
        config: Config,
    }
    let s: State = serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()?;
    // The one under the io hierarchy's mount: v1's blkio entry, v2's "".
    let cgroup = s.cgroup_paths.values().find_map(|p| {
        Path::new(p)
            .strip_prefix(mount)
            .ok()
            .map(|r| format!("/{}", r.display()))
    })?;
    let mut bundle = None;
    let mut annotations = HashMap::new();
    for l in s.config.labels {
        if let Some((k, v)) = l.split_once('=') {
            if k == "bundle" {
                bundle = Some(v.to_string());
            } else {
                annotations.insert(k.to_string(), v.to_string());
            }
        }
    }
    Some((cgroup, bundle, annotations))
}

/// crun's `status`: (cgroup path, bundle, no annotations: they are in the bundle).
fn read_crun(
    dir: &Path,
    mount: &Path,
) -> Option<(String, Option<String>, HashMap<String, String>)> {
    #[derive(Deserialize)]
    struct Status {
        #[serde(rename = "cgroup-path")]
        cgroup_path: String,
        #[serde(default)]
        bundle: Option<String>,
    }
    let s: Status = serde_json::from_slice(&std::fs::read(dir.join("status")).ok()?).ok()?;
    let cgroup = relative_cgroup(&s.cgroup_path, mount).filter(|c| c != "/")?;
    Some((cgroup, s.bundle, HashMap::new()))
}
