//! Kernel tests of readable cgroup names: cgroups named like a Docker scope and a Kubernetes
//! pod's container scope (under a test cgroup of their own), fio in each on the test disk, and
//! the JSON rows carry the `name` object while the counts stay what fio did; `-c` takes a
//! container id prefix or a unit name. Exact counts only, never a time.
//!
//! Needs root, BPF, a test disk, cgroup v1 blkio or v2 io, and fio; missing any is a failure.
//!   cargo test --release -p mergetrace --test kernel_names
mod support;

use std::sync::Mutex;

use serde_json::Value;
use support::*;

const BS: u64 = 4096;
/// Two docker ids sharing their first 6 hex digits (for the ambiguity check) and a
/// Kubernetes container's.
const DOCKER_A: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
const DOCKER_B: &str = "3f2a9c77aa4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
const K8S_CTR: &str = "8c0ffee0d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8a";
const POD_UID: &str = "8e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b";

/// The tests take turns: each one's layout has the same ids, and `-c` looks at every cgroup.
static TURN: Mutex<()> = Mutex::new(());

fn size() -> u64 {
    scaled(32 << 20, 16 << 20)
}

/// `<test cgroup>/docker-A.scope`, `<test cgroup>/docker-B.scope` and
/// `<test cgroup>/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`.
/// Fields are dropped in order: the leaves first, then their parents.
struct Layout {
    docker_a: Cgroup,
    docker_b: Cgroup,
    ctr: Cgroup,
    _pod: Cgroup,
    _burstable: Cgroup,
    _kubepods: Cgroup,
    top: Cgroup,
}

impl Layout {
    fn new() -> Layout {
        let top = Cgroup::new();
        let docker_a = top.child_named(&format!("docker-{DOCKER_A}.scope"));
        let docker_b = top.child_named(&format!("docker-{DOCKER_B}.scope"));
        let kubepods = top.child_named("kubepods.slice");
        let burstable = kubepods.child_named("kubepods-burstable.slice");
        let pod = burstable.child_named(&format!(
            "kubepods-burstable-pod{}.slice",
            POD_UID.replace('-', "_")
        ));
        let ctr = pod.child_named(&format!("cri-containerd-{K8S_CTR}.scope"));
        Layout {
            docker_a,
            docker_b,
            ctr,
            _pod: pod,
            _burstable: burstable,
            _kubepods: kubepods,
            top,
        }
    }
}

/// fio in the docker-A scope (first half of the disk) and the pod's container (second half),
/// traced with `extra` flags; returns the output and each fio's write I/Os.
fn run_both(lo: &BlockDev, l: &Layout, extra: &[&str]) -> (TraceOutput, u64, u64) {
    let half = size() / 2;
    let mut args = vec!["-d", lo.name.as_str()];
    args.extend_from_slice(extra);
    let tracer = Tracer::start(&args);
    let fd = Fio::sequential("docker", lo, "write", half, 32)
        .offset(0)
        .in_cgroup(&l.docker_a)
        .spawn();
    let fk = Fio::sequential("k8s", lo, "write", half, 8)
        .offset(half)
        .in_cgroup(&l.ctr)
        .spawn();
    let (rd, rk) = (fd.wait(), fk.wait());
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0, "lost events; stderr:\n{}", out.stderr);
    let ios = (fio_total_ios(&rd, "write"), fio_total_ios(&rk, "write"));
    assert_eq!(ios, (half / BS, half / BS), "fio I/O counts");
    (out, ios.0, ios.1)
}

fn row<'a>(out: &'a TraceOutput, lo: &BlockDev, cg: &Cgroup) -> &'a Value {
    out.cgroup_row(lo, &cg.path())
        .unwrap_or_else(|| panic!("no row for {} in {}", cg.path(), out.device(lo)))
}

#[test]
fn json_rows_name_the_docker_and_kubernetes_cgroups_and_counts_are_unchanged() {
    require_root();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let lo = TestDisk::new(size());
    udev_settle();
    let l = Layout::new();
    let (out, ios_docker, ios_k8s) = run_both(&lo, &l, &[]);

    let d = row(&out, &lo, &l.docker_a);
    let name = &d["name"];
    eprintln!("docker row name: {name}");
    assert_eq!(name["kind"], "docker", "{d}");
    assert_eq!(name["container_id"], DOCKER_A);
    assert_eq!(name["short_id"], "3f2a9c1b7d4e");
    // no Docker on this host writes a config.v2.json for this id: the short form has no name
    assert_eq!(name["short"], "docker:3f2a9c1b7d4e");
    assert_eq!(
        u(&d["write"], "bios"),
        ios_docker,
        "docker bios != fio's I/Os; {d}"
    );
    assert_eq!(u(&d["write"], "bytes"), ios_docker * BS);

    let k = row(&out, &lo, &l.ctr);
    let name = &k["name"];
    eprintln!("kubernetes row name: {name}");
    assert_eq!(name["kind"], "kubernetes", "{k}");
    assert_eq!(name["qos"], "burstable");
    assert_eq!(name["pod_uid"], POD_UID);
    assert_eq!(name["container_id"], K8S_CTR);
    assert_eq!(name["runtime"], "containerd");
    assert_eq!(
        name["short"],
        "k8s:burstable/pod 8e1f2a3b…/ctr 8c0ffee0d4e5"
    );
    assert_eq!(
        u(&k["write"], "bios"),
        ios_k8s,
        "k8s bios != fio's I/Os; {k}"
    );

    // The names change no count: the device total is the two rows' sum.
    let total = &out.device_total(&lo)["write"];
    assert_eq!(u(total, "bios"), ios_docker + ios_k8s, "{total}");
    for r in [d, k] {
        let w = &r["write"];
        assert_eq!(
            u(w, "requests") + u(w, "merged") + u(w, "flush_only"),
            u(w, "bios") + u(w, "splits"),
            "{w}"
        );
    }
    // The test cgroup itself is none of the kinds (and had no I/O of its own).
    assert!(out.cgroup_row(&lo, &l.top.path()).is_none());
    let _ = &l.docker_b;
}

#[test]
fn cgroup_filter_takes_a_container_id_prefix_or_a_unit_name() {
    require_root();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let lo = TestDisk::new(size());
    udev_settle();
    let l = Layout::new();
    // 8 hex digits: docker-A only (docker-B shares 6)
    let (out, ios_docker, _) = run_both(&lo, &l, &["-c", "3f2a9c1b"]);
    let rows = out.device(&lo)["cgroups"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "only docker-A's row: {rows:?}");
    assert_eq!(rows[0]["cgroup"], l.docker_a.path());
    assert_eq!(u(&rows[0]["write"], "bios"), ios_docker);
    assert_eq!(u(&out.device_total(&lo)["write"], "bios"), ios_docker);

    // a slice's unit name: the pod's container is in its subtree
    let (out, _, ios_k8s) = run_both(&lo, &l, &["-c", "kubepods-burstable.slice"]);
    let rows = out.device(&lo)["cgroups"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "only the pod's container: {rows:?}");
    assert_eq!(rows[0]["cgroup"], l.ctr.path());
    assert_eq!(u(&rows[0]["write"], "bios"), ios_k8s);
}

#[test]
fn ambiguous_or_unknown_readable_cgroups_are_one_line_errors() {
    require_root();
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let lo = LoopDevice::new(16 << 20);
    let _l = Layout::new();
    assert_one_line_error(
        &mergetrace(&["-d", &lo.name, "-c", "3f2a9c", "--json"]),
        "ambiguous cgroup '3f2a9c': it names 2 cgroups",
    );
    assert_one_line_error(
        &mergetrace(&["-d", &lo.name, "-c", "deadbeef99", "--json"]),
        "unknown cgroup 'deadbeef99'",
    );
}
