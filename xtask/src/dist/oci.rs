//! The OCI image of `cargo xtask dist`: `mergetrace-VERSION-oci.tar`, an OCI image archive
//! (what podman, skopeo and buildah call `oci-archive`: an OCI image layout in one tar), written
//! here rather than by a container tool. Its one layer holds the static binary at
//! /usr/bin/mergetrace and the two directories above it: no shell, no libraries, nothing
//! else (the binary is static and embeds its eBPF programs). Entrypoint the binary, default
//! command `serve` (see [`DEFAULT_CMD`]).
//!
//! Reproducible: every time in it is the source's (`SOURCE_DATE_EPOCH`, else the commit time of
//! HEAD), the tars' owners are 0, gzip carries no name and no time, JSON keys are sorted. The
//! same binary gives the same archive, byte for byte.
//!
//! [`check`] reads an archive back on its own terms (blobs found by digest, each digest and
//! size recomputed) and compares its binary with the tarball's.
use std::{
    collections::BTreeMap,
    fs,
    io::{Read, Write},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};
use flate2::{read::GzDecoder, Compression, GzBuilder};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Where the binary is in the image (as in the .deb and the .rpm).
pub const BINARY: &str = "usr/bin/mergetrace";
/// The directories above it, parents first.
const DIRS: [&str; 2] = ["usr/", "usr/bin/"];
/// The port `serve` listens on in the default command.
const PORT: u16 = 9435;
/// `serve` on the host's first virtio disk, on every address of the container's network
/// (its own namespace, or the node's with host networking: a Prometheus elsewhere scrapes it).
/// Any arguments given to `podman run` / a pod's `args` replace all of it.
const DEFAULT_CMD: [&str; 5] = ["serve", "-d", "vda", "--listen", "0.0.0.0:9435"];

/// What the image says about itself (its config's labels; the manifest repeats them as
/// annotations).
pub struct About<'a> {
    pub version: &'a str,
    pub license: &'a str,
    pub description: &'a str,
}

/// Writes `out/mergetrace-VERSION-oci.tar` with `bin` as its binary; returns its path.
pub fn build(bin: &Path, out: &Path, about: &About) -> Result<PathBuf> {
    let epoch = source_epoch()?;
    let created = rfc3339(epoch);
    let binary = fs::read(bin).with_context(|| format!("cannot read {}", bin.display()))?;

    let mut layer_tar = tar::Builder::new(Vec::new());
    for dir in DIRS {
        append(
            &mut layer_tar,
            dir,
            &[],
            0o755,
            epoch,
            tar::EntryType::Directory,
        )?;
    }
    append(
        &mut layer_tar,
        BINARY,
        &binary,
        0o755,
        epoch,
        tar::EntryType::Regular,
    )?;
    let layer_tar = layer_tar.into_inner()?;
    let mut gz = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    gz.write_all(&layer_tar)?;
    let layer = gz.finish()?;

    let labels = labels(about, &created, &revision());
    let config = to_json(&json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [format!("/{BINARY}")],
            "Cmd": DEFAULT_CMD,
            "Env": ["PATH=/usr/bin"],
            "ExposedPorts": { format!("{PORT}/tcp"): {} },
            "Labels": labels,
        },
        "rootfs": { "type": "layers", "diff_ids": [digest(&layer_tar)] },
        "history": [{
            "created": created,
            "created_by": format!("cargo xtask dist: the static binary as /{BINARY}"),
        }],
    }))?;
    let manifest = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(CONFIG, &config),
        "layers": [descriptor(LAYER, &layer)],
        "annotations": labels,
    }))?;
    let mut manifest_ref = descriptor(MANIFEST, &manifest);
    manifest_ref["annotations"] = json!({
        "org.opencontainers.image.ref.name": format!("mergetrace:{}", about.version),
    });
    let index = to_json(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [manifest_ref],
    }))?;

    let mut archive = tar::Builder::new(Vec::new());
    for dir in ["blobs/", "blobs/sha256/"] {
        append(
            &mut archive,
            dir,
            &[],
            0o755,
            epoch,
            tar::EntryType::Directory,
        )?;
    }
    for blob in [&config, &layer, &manifest] {
        let name = format!("blobs/sha256/{}", hex(blob));
        append(
            &mut archive,
            &name,
            blob,
            0o644,
            epoch,
            tar::EntryType::Regular,
        )?;
    }
    let layout = to_json(&json!({ "imageLayoutVersion": "1.0.0" }))?;
    append(
        &mut archive,
        "oci-layout",
        &layout,
        0o644,
        epoch,
        tar::EntryType::Regular,
    )?;
    append(
        &mut archive,
        "index.json",
        &index,
        0o644,
        epoch,
        tar::EntryType::Regular,
    )?;
    let path = out.join(format!("mergetrace-{}-oci.tar", about.version));
    fs::write(&path, archive.into_inner()?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The org.opencontainers.image.* labels (the image-spec's pre-defined annotation keys).
fn labels(about: &About, created: &str, revision: &Option<String>) -> Value {
    let mut l = json!({
        "org.opencontainers.image.title": "mergetrace",
        "org.opencontainers.image.description": about.description,
        "org.opencontainers.image.version": about.version,
        "org.opencontainers.image.licenses": about.license,
        "org.opencontainers.image.created": created,
    });
    if let Some(rev) = revision {
        l["org.opencontainers.image.revision"] = json!(rev);
    }
    l
}

/// One tar entry owned by root, with the source's time.
fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    data: &[u8],
    mode: u32,
    mtime: u64,
    kind: tar::EntryType,
) -> Result<()> {
    let mut h = tar::Header::new_ustar();
    h.set_path(path)?;
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_cksum();
    tar.append(&h, data)?;
    Ok(())
}

/// A descriptor of `blob`: its media type, digest and size.
fn descriptor(media_type: &str, blob: &[u8]) -> Value {
    json!({ "mediaType": media_type, "digest": digest(blob), "size": blob.len() })
}

/// serde_json's objects are sorted maps (no `preserve_order`), so the bytes are stable.
fn to_json(v: &Value) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(v)?)
}

fn hex(blob: &[u8]) -> String {
    format!("{:x}", Sha256::digest(blob))
}

fn digest(blob: &[u8]) -> String {
    format!("sha256:{}", hex(blob))
}

/// The time everything in the image carries: `SOURCE_DATE_EPOCH` (the reproducible-builds
/// convention), else the commit time of HEAD, else 0 (a source tree outside git).
fn source_epoch() -> Result<u64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"));
    }
    Ok(git(&["log", "-1", "--format=%ct"])
        .and_then(|t| t.parse().ok())
        .unwrap_or(0))
}

/// The commit the image was built from, if this is a git checkout.
fn revision() -> Option<String> {
    git(&["rev-parse", "HEAD"])
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(crate::workspace_root())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Unix seconds as RFC 3339 in UTC (`2024-05-01T12:00:00Z`), by the days-to-civil rule of
/// the proleptic Gregorian calendar.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------
// The check

/// Reads `archive` back as a runtime would: `oci-layout`, `index.json` naming one manifest,
/// the manifest naming the config and one gzip layer, every blob's digest and size
/// recomputed; the config's platform, entrypoint, command and labels; the layer's
/// uncompressed digest against the config's diff_id; the layer holding only /usr and
/// /usr/bin and the binary, executable and byte for byte `binary` (the tarball's).
pub fn check(archive: &Path, binary: &Path, version: &str) -> Result<()> {
    let what = archive.display();
    let files = tar_files(&fs::read(archive)?).with_context(|| format!("reading {what}"))?;
    let file = |name: &str| {
        files
            .get(name)
            .map(|(_, data)| data)
            .with_context(|| format!("{what} has no {name}"))
    };
    let json_of = |name: &str| -> Result<Value> {
        serde_json::from_slice(file(name)?).with_context(|| format!("{what}: {name} is not JSON"))
    };
    // A descriptor's blob, its digest and size checked, and its media type.
    let blob = |d: &Value, media_type: &str| -> Result<&Vec<u8>> {
        ensure!(
            d["mediaType"] == media_type,
            "{what}: a descriptor has media type {}, want {media_type}",
            d["mediaType"]
        );
        let digest = d["digest"]
            .as_str()
            .context("a descriptor without a digest")?;
        let hex_digest = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("{what}: digest {digest} is not sha256"))?;
        let data = file(&format!("blobs/sha256/{hex_digest}"))?;
        ensure!(
            hex(data) == hex_digest,
            "{what}: blob {digest} does not hash to its name"
        );
        ensure!(
            d["size"].as_u64() == Some(data.len() as u64),
            "{what}: blob {digest} is {} bytes, its descriptor says {}",
            data.len(),
            d["size"]
        );
        Ok(data)
    };

    ensure!(
        json_of("oci-layout")?["imageLayoutVersion"] == "1.0.0",
        "{what}: oci-layout is not version 1.0.0"
    );
    let index = json_of("index.json")?;
    ensure!(
        index["schemaVersion"] == 2,
        "{what}: index.json schemaVersion"
    );
    let manifests = index["manifests"]
        .as_array()
        .context("index.json has no manifests")?;
    ensure!(
        manifests.len() == 1,
        "{what}: {} manifests, want 1",
        manifests.len()
    );
    let ref_name = &manifests[0]["annotations"]["org.opencontainers.image.ref.name"];
    ensure!(
        *ref_name == format!("mergetrace:{version}"),
        "{what}: index.json names the image {ref_name}"
    );
    let manifest: Value = serde_json::from_slice(blob(&manifests[0], MANIFEST)?)?;
    ensure!(
        manifest["schemaVersion"] == 2,
        "{what}: manifest schemaVersion"
    );
    let config: Value = serde_json::from_slice(blob(&manifest["config"], CONFIG)?)?;
    let layers = manifest["layers"]
        .as_array()
        .context("a manifest without layers")?;
    ensure!(layers.len() == 1, "{what}: {} layers, want 1", layers.len());
    let mut layer_tar = Vec::new();
    GzDecoder::new(&blob(&layers[0], LAYER)?[..])
        .read_to_end(&mut layer_tar)
        .with_context(|| format!("{what}: the layer is not gzip"))?;

    ensure!(
        config["architecture"] == "amd64" && config["os"] == "linux",
        "{what}: the config's platform is {}/{}",
        config["os"],
        config["architecture"]
    );
    let run = &config["config"];
    ensure!(
        run["Entrypoint"] == json!([format!("/{BINARY}")]) && run["Cmd"] == json!(DEFAULT_CMD),
        "{what}: entrypoint {} and command {}",
        run["Entrypoint"],
        run["Cmd"]
    );
    ensure!(
        run["Labels"]["org.opencontainers.image.version"] == version,
        "{what}: the version label is {}",
        run["Labels"]["org.opencontainers.image.version"]
    );
    ensure!(
        config["rootfs"]["diff_ids"] == json!([digest(&layer_tar)]),
        "{what}: the config's diff_ids are not the layer's uncompressed digest"
    );

    let entries = tar_files(&layer_tar).with_context(|| format!("{what}: the layer"))?;
    let mut want: Vec<&str> = DIRS.to_vec();
    want.push(BINARY);
    let names: Vec<&str> = entries.keys().map(String::as_str).collect();
    ensure!(
        names == want,
        "{what}: the layer holds {names:?}, want only {want:?}"
    );
    let (mode, data) = &entries[BINARY];
    ensure!(mode & 0o111 == 0o111, "{what}: /{BINARY} is not executable");
    let tarball_bin = fs::read(binary)?;
    ensure!(
        *data == tarball_bin,
        "{what}: /{BINARY} differs from the tarball's binary"
    );
    Ok(())
}

/// Every entry of a tar: its path (directories with their trailing slash) → (mode, content).
/// Anything but files and directories (links, devices) is refused.
fn tar_files(tar: &[u8]) -> Result<BTreeMap<String, (u32, Vec<u8>)>> {
    let mut out = BTreeMap::new();
    for entry in tar::Archive::new(tar).entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        let mut path = entry.path()?.to_string_lossy().to_string();
        match kind {
            tar::EntryType::Directory if !path.ends_with('/') => path.push('/'),
            tar::EntryType::Directory | tar::EntryType::Regular => {}
            other => bail!("{path} is a {other:?}, not a file or a directory"),
        }
        let mode = entry.header().mode()?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        ensure!(
            out.insert(path.clone(), (mode, data)).is_none(),
            "{path} is in it twice"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_735_689_599), "2024-12-31T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    /// An archive reads back; built again it is the same bytes; the check sees another
    /// binary, another version and a changed blob.
    #[test]
    fn archive_reads_back_and_changes_are_seen() {
        let dir = std::env::temp_dir().join(format!("mt-oci-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("mergetrace");
        fs::write(&bin, b"\x7fELF, as far as this test cares").unwrap();
        let about = About {
            version: "9.9.9",
            license: "MIT",
            description: "a test",
        };
        let archive = build(&bin, &dir, &about).unwrap();
        check(&archive, &bin, "9.9.9").unwrap();
        let first = fs::read(&archive).unwrap();
        build(&bin, &dir, &about).unwrap();
        assert!(
            fs::read(&archive).unwrap() == first,
            "built twice, not the same bytes"
        );

        let other = dir.join("other");
        fs::write(&other, b"another binary").unwrap();
        let err = check(&archive, &other, "9.9.9").unwrap_err().to_string();
        assert!(err.contains("differs from the tarball's binary"), "{err}");
        let err = format!("{:#}", check(&archive, &bin, "1.0.0").unwrap_err());
        assert!(err.contains("names the image"), "{err}");

        // "amd64" in the config blob made "amd65": the blob no longer hashes to its name.
        let at = first.windows(5).position(|w| w == b"amd64").unwrap();
        let mut changed = first.clone();
        changed[at + 4] = b'5';
        fs::write(&archive, changed).unwrap();
        let err = check(&archive, &bin, "9.9.9").unwrap_err().to_string();
        assert!(err.contains("does not hash to its name"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
