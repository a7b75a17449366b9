//! Faults around captures: a stalled reader overflows the ring buffer (counted, recorded, the
//! run goes on), the disk fills up (clear error, what was written stays readable), kill -9
//! (readable to the last chunk, kernel clean, a quiet CPU's last events in it), bad output
//! paths, files from a newer mergetrace.
//! Real kernel and loop devices; needs root (fails, never skips, without it).
mod support;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use support::*;

fn bin() -> &'static str {
    mergetrace_bin()
}

fn workload(dev: &LoopDevice, ios: u64, batch: u32) {
    run_workload(
        dev,
        None,
        &["--ios", &ios.to_string(), "--batch", &batch.to_string()],
    );
}

/// `mergetrace record` started and waited for until it records.
fn start_record(dev: &LoopDevice, out: &Path, extra: &[&str]) -> Child {
    let mut child = Command::new(bin())
        .args(["record", "-d", &dev.name, "-o", out.to_str().unwrap()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !out.exists() {
        if let Ok(Some(s)) = child.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("record exited early ({s}): {err}");
        }
        assert!(Instant::now() < deadline, "record did not start");
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(200));
    child
}

fn stop(mut child: Child, sig: i32) -> Output {
    unsafe { libc::kill(child.id() as i32, sig) };
    let _ = child.try_wait();
    child.wait_with_output().unwrap()
}

fn report_json(file: &Path) -> (serde_json::Value, String, Option<i32>) {
    let out = Command::new(bin())
        .arg("report")
        .arg(file)
        .arg("--json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (v, stderr, out.status.code())
}

struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn capture_path(tag: &str) -> (PathBuf, Cleanup) {
    let p = PathBuf::from(format!("/dev/shm/{}-{tag}.mtr", unique_name()));
    (p.clone(), Cleanup(p))
}

#[test]
fn a_stalled_reader_loses_events_counted_and_the_run_goes_on() {
    require_root();
    let dev = LoopDevice::new(512 << 20);
    let (file, _c) = capture_path("overflow");
    // A 1 MiB ring holds ~18,000 events; stop the reader and make ~140,000.
    let rec = start_record(&dev, &file, &["--ring-mib", "1"]);
    unsafe { libc::kill(rec.id() as i32, libc::SIGSTOP) };
    workload(&dev, 65_536, 32);
    unsafe { libc::kill(rec.id() as i32, libc::SIGCONT) };
    // The run goes on after the overflow: more I/O is recorded.
    thread::sleep(Duration::from_millis(300));
    workload(&dev, 4096, 32);
    thread::sleep(Duration::from_millis(300));
    let out = stop(rec, libc::SIGINT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("events were lost (ring buffer full)"),
        "{stderr}"
    );
    let (v, rstderr, code) = report_json(&file);
    assert_eq!(code, Some(0), "{rstderr}");
    let lost = v["lost_events"].as_u64().unwrap();
    assert!(lost > 0, "the overflow must be counted: {v}");
    assert!(
        v["lost_by_kind"].as_object().is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    // What was recorded plus what was lost accounts for every bio of the second workload
    // (it ran after the reader caught up).
    let bios = v["devices"][0]["total"]["write"]["bios"].as_u64().unwrap();
    assert!(
        bios >= 4096,
        "the run went on after the overflow: {bios} bios"
    );
}

#[test]
fn a_full_disk_stops_the_recording_with_a_clear_error_and_the_file_stays_readable() {
    require_root();
    let dev = LoopDevice::new(512 << 20);
    let dir = PathBuf::from(format!("/dev/shm/{}-full", unique_name()));
    fs::create_dir(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(
        mounted.success(),
        "cannot mount a small tmpfs at {}",
        dir.display()
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = fs::remove_dir(&self.0);
        }
    }
    let _u = Unmount(dir.clone());
    let file = dir.join("run.mtr");
    let rec = start_record(&dev, &file, &["-i", "100ms"]);
    workload(&dev, 65_536, 32);
    workload(&dev, 32_768, 1);
    // The recorder stops by itself on the write error.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rec = rec;
    let status = loop {
        if let Some(s) = rec.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "record did not stop on a full disk"
        );
        thread::sleep(Duration::from_millis(100));
    };
    let out = rec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("mergetrace: error: "), "{stderr}");
    assert!(
        last.contains("No space left on device")
            && last.contains("readable up to the last complete chunk"),
        "{last}"
    );
    let (v, rstderr, code) = report_json(&file);
    assert_eq!(code, Some(0), "report of the cut file: {rstderr}");
    assert!(rstderr.contains("warning"), "{rstderr}");
    assert!(
        v["devices"][0]["total"]["write"]["bios"].as_u64().unwrap() > 0,
        "{v}"
    );
}

#[test]
fn kill_9_leaves_a_readable_capture() {
    require_root();
    let dev = LoopDevice::new(64 << 20);
    let (file, _c) = capture_path("kill9");
    let rec = start_record(&dev, &file, &["-i", "100ms"]);
    workload(&dev, 8192, 32);
    thread::sleep(Duration::from_millis(500)); // a flush or two
    let out = stop(rec, libc::SIGKILL);
    assert!(!out.status.success());
    let (v, stderr, code) = report_json(&file);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("cut short") || stderr.contains("warning"),
        "{stderr}"
    );
    assert_eq!(
        v["devices"][0]["total"]["write"]["bios"].as_u64(),
        Some(8192),
        "{v}"
    );
}

/// The programs gather a CPU's events in a batch of 64 before they send them. A CPU that goes
/// quiet with a batch not full must not keep it until the run ends: user space sends it
/// during the run, so a capture cut short by kill -9 still holds it. Ten writes from one CPU
/// make ~50 events, fewer than a batch, in a few milliseconds.
#[test]
fn a_quiet_cpus_last_events_reach_the_capture_during_the_run() {
    require_root();
    let dev = LoopDevice::new(64 << 20);
    let (file, _c) = capture_path("quiet");
    let rec = start_record(&dev, &file, &["-i", "100ms"]);
    let before = dev.diskstats();
    run_workload_on(1, &dev, None, &["--ios", "10", "--batch", "1"]);
    let writes = dev.diskstats().since(&before).writes;
    thread::sleep(Duration::from_millis(600)); // several of the capture's flushes
    let out = stop(rec, libc::SIGKILL);
    assert!(!out.status.success());
    let jsonl = file.with_extension("jsonl");
    let export = Command::new(bin())
        .args(["export", file.to_str().unwrap(), "--format", "jsonl", "-o"])
        .arg(&jsonl)
        .output()
        .unwrap();
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let text = fs::read_to_string(&jsonl).unwrap();
    let _ = fs::remove_file(&jsonl);
    let count = |kind: &str| {
        text.lines()
            .filter(|l| {
                let e: serde_json::Value = serde_json::from_str(l).unwrap();
                e["kind"] == kind && e["dir"] == "write"
            })
            .count() as u64
    };
    assert_eq!(writes, 10, "the workload's writes, in /proc/diskstats");
    for kind in ["bio_queue", "rq_issue", "rq_complete"] {
        assert_eq!(count(kind), writes, "{kind} events in the capture");
    }
}

#[test]
fn output_paths_and_permissions() {
    require_root();
    let dev = LoopDevice::new(16 << 20);
    let (file, _c) = capture_path("perm");
    let record_1s = |path: &str| {
        Command::new(bin())
            .args(["record", "-d", &dev.name, "-o", path, "--duration", "1s"])
            .output()
            .unwrap()
    };
    let out = record_1s("/proc/no/such.mtr");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/proc/no/such.mtr"), "{err}");

    let out = record_1s(file.to_str().unwrap());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Never overwritten unasked.
    let out = record_1s(file.to_str().unwrap());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exists"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A capture from a newer format version: one clear line.
    let mut bytes = fs::read(&file).unwrap();
    bytes[8] = 0xff;
    bytes[9] = 0x7f;
    let (newer, _c2) = capture_path("newer");
    fs::write(&newer, &bytes).unwrap();
    let (_, stderr, code) = report_json(&newer);
    assert_eq!(code, Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("is newer than this mergetrace supports"),
        "{stderr}"
    );
    // Not a capture at all.
    let (junk, _c3) = capture_path("junk");
    fs::write(&junk, b"hello, this is not a capture").unwrap();
    let (_, stderr, code) = report_json(&junk);
    assert_eq!(code, Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
