//! fio: one job, JSON output.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use serde_json::Value;

use super::*;

/// A fio run, one job, JSON output. Build with the setters, then `run()` or `spawn()`.
#[derive(Debug, Clone)]
pub struct Fio {
    name: String,
    opts: Vec<(String, String)>,
    cgroup: Option<PathBuf>,
}

/// A fio started with [`Fio::spawn`].
pub struct FioRun {
    child: Option<Child>,
    describe: String,
}

impl Fio {
    /// A job named `name` against `filename` (a device or file).
    pub fn new(name: &str, filename: &Path) -> Fio {
        Fio {
            name: name.to_string(),
            opts: vec![("filename".into(), filename.display().to_string())],
            cgroup: None,
        }
    }

    /// A job named `name` whose files fio makes in `dir` (`--directory`: with `numjobs`, one
    /// file per job).
    pub fn in_directory(name: &str, dir: &Path) -> Fio {
        Fio {
            name: name.to_string(),
            opts: vec![("directory".into(), dir.display().to_string())],
            cgroup: None,
        }
    }

    /// The merging workload: 4 KiB sequential O_DIRECT libaio, iodepth 64, submit and
    /// complete batches of `batch` (both: without the complete one fio reaps and resubmits one
    /// I/O at a time after the first fill, and almost nothing merges), `rw` = write/read.
    pub fn sequential(name: &str, dev: &BlockDev, rw: &str, size: u64, batch: u32) -> Fio {
        Fio::direct_4k(name, &dev.path, rw)
            .opt("size", &size.to_string())
            .batch(batch)
    }

    /// `seconds` of 4 KiB random O_DIRECT libaio at iodepth 64 on `dev`, `rw` =
    /// randwrite/randread: a closed loop that keeps a queue (and a throttle) busy.
    pub fn random_for(name: &str, dev: &BlockDev, rw: &str, seconds: &str) -> Fio {
        Fio::random_of(name, &dev.path, rw, seconds)
    }

    /// [`Fio::random_for`] on `target`, a device or a file.
    pub fn random_of(name: &str, target: &Path, rw: &str, seconds: &str) -> Fio {
        Fio::direct_4k(name, target, rw)
            .opt("time_based", "1")
            .opt("runtime", seconds)
    }

    /// 4 KiB O_DIRECT libaio at iodepth 64 on `target`, `rw` as fio names it.
    fn direct_4k(name: &str, target: &Path, rw: &str) -> Fio {
        Fio::new(name, target)
            .opt("rw", rw)
            .opt("bs", "4k")
            .opt("direct", "1")
            .opt("ioengine", "libaio")
            .opt("iodepth", "64")
    }

    /// Sets `--key=value` (replacing an earlier value of the same key).
    pub fn opt(mut self, key: &str, value: &str) -> Fio {
        self.opts.retain(|(k, _)| k != key);
        self.opts.push((key.to_string(), value.to_string()));
        self
    }

    /// `--readonly`: fio refuses to write, whatever the other options say (a disk not ours).
    pub fn readonly(self) -> Fio {
        self.opt("readonly", "")
    }

    /// `--iodepth_batch_submit=N --iodepth_batch_complete_min=N`.
    pub fn batch(self, n: u32) -> Fio {
        self.opt("iodepth_batch_submit", &n.to_string())
            .opt("iodepth_batch_complete_min", &n.to_string())
    }

    pub fn offset(self, bytes: u64) -> Fio {
        self.opt("offset", &bytes.to_string())
    }

    pub fn size(self, bytes: u64) -> Fio {
        self.opt("size", &bytes.to_string())
    }

    /// Runs fio inside `cg` (its pid is written to cgroup.procs before exec).
    pub fn in_cgroup(mut self, cg: &Cgroup) -> Fio {
        self.cgroup = Some(cg.dir.clone());
        self
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--name={}", self.name),
            "--output-format=json".to_string(),
        ];
        a.extend(self.opts.iter().map(|(k, v)| match v.as_str() {
            "" => format!("--{k}"),
            _ => format!("--{k}={v}"),
        }));
        a
    }

    pub fn spawn(&self) -> FioRun {
        let mut cmd = match &self.cgroup {
            None => {
                let mut c = Command::new("fio");
                c.args(self.args());
                c
            }
            Some(dir) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$0/cgroup.procs" && exec fio "$@""#)
                    .arg(dir)
                    .args(self.args());
                c
            }
        };
        // Its own process group, so a panicking test can kill fio and its job processes.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let describe = format!("{cmd:?}");
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fio ({describe}): {e}"));
        FioRun {
            child: Some(child),
            describe,
        }
    }

    /// Runs to completion and returns fio's JSON report.
    pub fn run(&self) -> Value {
        self.spawn().wait()
    }
}

impl FioRun {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Waits, requires success, returns the JSON report.
    pub fn wait(mut self) -> Value {
        let out = self
            .child
            .take()
            .expect("fio already waited for")
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for fio: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "fio failed ({}): {}\nstderr:\n{stderr}\nstdout:\n{stdout}",
            out.status,
            self.describe
        );
        // fio may print notes before the JSON document.
        let start = if stdout.starts_with('{') {
            Some(0)
        } else {
            stdout.find("\n{").map(|i| i + 1)
        }
        .unwrap_or_else(|| panic!("no JSON in fio's output: {stdout}\nstderr:\n{stderr}"));
        let v: Value = serde_json::from_str(&stdout[start..])
            .unwrap_or_else(|e| panic!("fio's JSON does not parse ({e}): {stdout}"));
        let errs = v["jobs"][0]["error"].as_u64().unwrap_or(0);
        assert_eq!(errs, 0, "fio job reported an error: {}", v["jobs"][0]);
        v
    }
}

impl FioRun {
    /// Kills fio and its job processes and waits for it.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            kill_tree(c.id());
            let _ = c.wait();
        }
    }
}

impl Drop for FioRun {
    fn drop(&mut self) {
        // Only reached without `wait()` when a test panicked: stop fio and its jobs.
        if let Some(mut c) = self.child.take() {
            kill_tree(c.id());
            let _ = c.wait();
        }
    }
}

/// `jobs[0].<dir>.total_ios` of a fio JSON report (dir = "read" / "write").
pub fn fio_total_ios(report: &Value, dir: &str) -> u64 {
    report["jobs"][0][dir]["total_ios"]
        .as_u64()
        .unwrap_or_else(|| panic!("no jobs[0].{dir}.total_ios in fio's report"))
}

/// `jobs[0].<dir>.io_bytes` of a fio JSON report.
pub fn fio_io_bytes(report: &Value, dir: &str) -> u64 {
    report["jobs"][0][dir]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no jobs[0].{dir}.io_bytes in fio's report"))
}

/// SIGKILL to `pid` and every process below it. fio's job processes start sessions of their
/// own (setsid), so a signal to fio's process group misses them: the tree is gathered first,
/// then killed (once fio dies its jobs would be re-parented out of reach).
fn kill_tree(pid: u32) {
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        tree.extend(children_of(tree[i]));
        i += 1;
    }
    for p in tree {
        unsafe {
            libc::kill(p as libc::pid_t, libc::SIGKILL);
        }
    }
}
