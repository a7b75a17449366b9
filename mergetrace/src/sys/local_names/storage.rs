//! containers/storage, the store podman and CRI-O keep containers in: podman's container
//! names, and the directory of each container where both write its spec.
//!
//! - The store's container records are `<graphroot>/<driver>-containers/containers.json` and
//!   `volatile-containers.json` (there, or under the run root with a transient store): a JSON
//!   array of `{"id": …, "names": […]}` (containers/storage `containers.go`, `Container` and
//!   `newContainerStore`). podman names its storage container after the container, also for
//!   `--rootfs` (seen with podman 4.3: `"names":["web"]`).
//! - Roots: rootful `/var/lib/containers/storage` and `/run/containers/storage`, unless
//!   `/etc/containers/storage.conf` (else `/usr/share/containers/storage.conf`) sets
//!   `graphroot`/`runroot`; rootless `~/.local/share/containers/storage` (or the user's
//!   `~/.config/containers/storage.conf`, or the system file's `rootless_storage_path`) and
//!   `/run/user/<uid>/containers`, the user found by the cgroup path's `user-<uid>.slice` and
//!   `/etc/passwd` (containers/storage `docs/containers-storage.conf.5.md`).
//!   `$XDG_DATA_HOME` and `CONTAINERS_STORAGE_CONF`, the environment of the user's session, are
//!   not seen from here.
//! - A container's spec: `<root>/<driver>-containers/<id>/userdata/config.json`, under the
//!   graph root (podman, CRI-O) and the run root (CRI-O).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde::Deserialize;

use super::{kubelet::read_names, oci};

/// The roots of one store (host paths, before the machine root is joined).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Roots {
    graph: String,
    run: String,
}

/// podman's names, read from the record files and kept while a file's mtime is unchanged.
#[derive(Default)]
pub struct Storage {
    /// uid (`None`: rootful) → its store's roots.
    roots: HashMap<Option<u32>, Option<Roots>>,
    /// record file → (mtime, id → first name).
    records: HashMap<PathBuf, (SystemTime, HashMap<String, String>)>,
}

impl Storage {
    /// podman's name of container `id`, in the rootful store or, for `user`, that user's.
    pub fn podman_name(&mut self, root: &Path, id: &str, user: Option<u32>) -> Option<String> {
        let roots = self.roots_of(root, user)?;
        let mut files = Vec::new();
        for dir in driver_dirs(root, &roots.graph) {
            files.push(dir.join("containers.json"));
            files.push(dir.join("volatile-containers.json"));
        }
        for dir in driver_dirs(root, &roots.run) {
            files.push(dir.join("volatile-containers.json"));
        }
        files.into_iter().find_map(|f| self.record(&f, id))
    }

    /// The names CRI-O's (or podman's) spec of container `id` annotates.
    pub fn bundle(&mut self, root: &Path, id: &str, user: Option<u32>) -> Option<oci::Annotated> {
        let roots = self.roots_of(root, user)?;
        let found = [&roots.run, &roots.graph].into_iter().find_map(|r| {
            driver_dirs(root, r)
                .iter()
                .find_map(|d| oci::read_bundle(&d.join(id).join("userdata/config.json")))
        });
        found
    }

    fn roots_of(&mut self, root: &Path, user: Option<u32>) -> Option<Roots> {
        self.roots
            .entry(user)
            .or_insert_with(|| match user {
                None => Some(rootful_roots(root)),
                Some(uid) => rootless_roots(root, uid),
            })
            .clone()
    }

    fn record(&mut self, file: &Path, id: &str) -> Option<String> {
        let mtime = std::fs::metadata(file).ok()?.modified().ok()?;
        if self.records.get(file).map(|(t, _)| *t) != Some(mtime) {
            self.records
                .insert(file.to_path_buf(), (mtime, read_records(file)));
        }
        self.records.get(file)?.1.get(id).cloned()
    }
}

/// id → first name of a record file.
fn read_records(file: &Path) -> HashMap<String, String> {
    #[derive(Deserialize)]
    struct Record {
        id: String,
        #[serde(default)]
        names: Vec<String>,
    }
    let records: Vec<Record> = std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    records
        .into_iter()
        .filter_map(|r| Some((r.id, r.names.into_iter().next()?)))
        .collect()
}

/// The store's per-driver container directories (`overlay-containers`, `vfs-containers`, …).
fn driver_dirs(root: &Path, store: &str) -> Vec<PathBuf> {
    let dir = root.join(store.trim_start_matches('/'));
    let mut names: Vec<String> = read_names(&dir)
        .into_iter()
        .filter(|n| n.ends_with("-containers"))
        .collect();
    names.sort();
    names.into_iter().map(|n| dir.join(n)).collect()
}

/// The system's storage.conf.
fn system_conf(root: &Path) -> String {
    [
        "etc/containers/storage.conf",
        "usr/share/containers/storage.conf",
    ]
    .iter()
    .find_map(|f| std::fs::read_to_string(root.join(f)).ok())
    .unwrap_or_default()
}

fn rootful_roots(root: &Path) -> Roots {
    let conf = system_conf(root);
    Roots {
        graph: conf_value(&conf, "graphroot")
            .unwrap_or_else(|| "/var/lib/containers/storage".into()),
        run: conf_value(&conf, "runroot").unwrap_or_else(|| "/run/containers/storage".into()),
    }
}

fn rootless_roots(root: &Path, uid: u32) -> Option<Roots> {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).ok()?;
    let home = home_of(&passwd, uid)?;
    let conf = std::fs::read_to_string(
        root.join(home.trim_start_matches('/'))
            .join(".config/containers/storage.conf"),
    )
    .unwrap_or_default();
    let expand = |v: String| {
        v.replace("${HOME}", &home)
            .replace("$HOME", &home)
            .replace("${UID}", &uid.to_string())
            .replace("$UID", &uid.to_string())
    };
    Some(Roots {
        graph: conf_value(&conf, "graphroot")
            .or_else(|| conf_value(&system_conf(root), "rootless_storage_path"))
            .map(expand)
            .unwrap_or_else(|| format!("{home}/.local/share/containers/storage")),
        run: conf_value(&conf, "runroot")
            .map(expand)
            .unwrap_or_else(|| format!("/run/user/{uid}/containers")),
    })
}

/// The home directory of `uid` in an `/etc/passwd` (`name:x:uid:gid:gecos:home:shell`).
fn home_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[2].parse() == Ok(uid) && !f[5].is_empty()).then(|| f[5].to_string())
    })
}

/// `key = "value"` in the `[storage]` table of a storage.conf (TOML; only these simple lines
/// are read: `graphroot` and `runroot` are plain strings there).
fn conf_value(conf: &str, key: &str) -> Option<String> {
    let mut in_storage = false;
    for line in conf.lines().map(str::trim) {
        if line.starts_with('[') {
            in_storage = line == "[storage]";
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if in_storage && k.trim() == key {
            let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
            return (!v.is_empty()).then(|| v.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_storage_conf_and_passwd() {
        let conf = "# comment\n[storage]\ndriver = \"overlay\"\nrunroot = \"/run/cs\"\ngraphroot = \"/srv/cs\"\n[storage.options]\ngraphroot = \"/nope\"\n";
        assert_eq!(conf_value(conf, "graphroot").as_deref(), Some("/srv/cs"));
        assert_eq!(conf_value(conf, "runroot").as_deref(), Some("/run/cs"));
        assert_eq!(
            conf_value("[other]\ngraphroot = \"/x\"\n", "graphroot"),
            None
        );
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\nana:x:1000:1000:Ana,,,:/home/ana:/bin/bash\n";
        assert_eq!(home_of(passwd, 1000).as_deref(), Some("/home/ana"));
        assert_eq!(home_of(passwd, 1001), None);
    }
}
