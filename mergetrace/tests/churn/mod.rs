//! The harness of kernel_churn: the server as a child process, its scrapes parsed, and the
//! writers that create, write in and remove cgroups.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc, Arc, Barrier, Mutex},
    thread,
    time::{Duration, Instant},
};

use crate::support::*;
use crate::{BS, HTTP_TIMEOUT, PER_WRITER, WRITERS};

// ---------------------------------------------------------------------------------------
// The server as a child process

pub(crate) struct Server {
    pub(crate) child: Option<Child>,
    pub(crate) addr: SocketAddr,
    pub(crate) stderr: Arc<Mutex<String>>,
}

pub(crate) fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

impl Server {
    /// `mergetrace serve -d <dev> --listen 127.0.0.1:<port> <extra>`, once it serves.
    pub(crate) fn start(dev: &BlockDev, extra: &[&str]) -> Server {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let bin = mergetrace_bin();
        let mut child = Command::new(bin)
            .args(["serve", "-d", dev.name.as_str(), "--listen"])
            .arg(addr.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        {
            let stderr = stderr.clone();
            thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    stderr.lock().unwrap().push_str(&format!("{line}\n"));
                    let _ = tx.send(line);
                }
            });
        }
        let mut server = Server {
            child: Some(child),
            addr,
            stderr,
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("mergetrace: serving") => break,
                Ok(_) => {}
                Err(_) => {
                    if let Some(status) = server.try_wait() {
                        panic!(
                            "mergetrace serve exited ({status}) before serving; stderr:\n{}",
                            server.stderr()
                        );
                    }
                    assert!(
                        Instant::now() < deadline,
                        "mergetrace serve did not serve within {ATTACH_TIMEOUT:?}; stderr:\n{}",
                        server.stderr()
                    );
                }
            }
        }
        server
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub(crate) fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends SIGTERM and waits for the exit: its status and stderr.
    pub(crate) fn stop(mut self) -> (ExitStatus, String) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(s) = self.try_wait() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "mergetrace serve did not exit within {STOP_TIMEOUT:?}; stderr:\n{}",
                self.stderr()
            );
            thread::sleep(Duration::from_millis(50));
        };
        self.child = None;
        // The reader thread ends with the pipe; give it a moment to take the last lines.
        thread::sleep(Duration::from_millis(100));
        (status, self.stderr())
    }

    pub(crate) fn scrape(&self) -> Exposition {
        let (status, body) = http_get(self.addr, "/metrics").unwrap_or_else(|e| {
            panic!("scrape failed: {e}; stderr:\n{}", self.stderr());
        });
        assert_eq!(status, 200, "{body}");
        Exposition::parse(&body)
    }

    /// VmRSS of the server, in KiB.
    pub(crate) fn rss_kb(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Entries of the server's BPF map `name` (by the map ids its fds hold, so that other
    /// tracers running meanwhile do not count).
    pub(crate) fn map_entries(&self, name: &str) -> usize {
        let dir = format!("/proc/{}/fdinfo", self.pid());
        let mut ids = BTreeSet::new();
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let info = fs::read_to_string(e.path()).unwrap_or_default();
            ids.extend(
                info.lines()
                    .filter_map(|l| l.strip_prefix("map_id:"))
                    .filter_map(|v| v.trim().parse::<u32>().ok()),
            );
        }
        for id in ids {
            let show = bpftool(&["map", "show", "id", &id.to_string()]);
            if show["name"].as_str() != Some(name) {
                continue;
            }
            let dump = bpftool(&["map", "dump", "id", &id.to_string()]);
            return dump.as_array().map_or(0, |a| a.len());
        }
        panic!("the server holds no map {name}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn bpftool(args: &[&str]) -> serde_json::Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("bpftool runs (scripts/setup --test installs it)");
    assert!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bpftool prints JSON")
}

/// One HTTP/1.1 GET with `Connection: close`: (status, body).
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(std::io::Error::other(format!("no header end in {text:?}")));
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok((status, body.to_string()))
}

// ---------------------------------------------------------------------------------------
// The exposition: the sample lines of the counter families this test reads

/// One sample: family, labels, value.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) metric: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

pub(crate) struct Exposition {
    pub(crate) samples: Vec<Sample>,
}

impl Exposition {
    /// The sample lines (the label values here have no quotes or escapes). The whole text
    /// is checked by a Prometheus parser too, at the end.
    pub(crate) fn parse(text: &str) -> Exposition {
        let mut samples = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (head, value) = line.rsplit_once(' ').expect("a sample line has a value");
            let (metric, labels) = match head.split_once('{') {
                Some((m, rest)) => (m, rest.strip_suffix('}').expect("labels end with }")),
                None => (head, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once("=\"").expect("label=\"value\"");
                    (k.to_string(), v.trim_end_matches('"').to_string())
                })
                .collect();
            let value = match value {
                "+Inf" => f64::INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            samples.push(Sample {
                metric: metric.to_string(),
                labels,
                value,
            });
        }
        Exposition { samples }
    }

    pub(crate) fn of<'a>(&'a self, metric: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.metric == metric)
    }

    /// The kinds of lost events with a count above 0, and the count.
    pub(crate) fn lost_events(&self) -> Vec<(String, f64)> {
        self.of("mergetrace_lost_events_total")
            .filter(|s| s.value != 0.0)
            .map(|s| (s.labels["kind"].clone(), s.value))
            .collect()
    }

    /// Sum of `metric` over the samples with all of `labels`.
    pub(crate) fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> u64 {
        let v: f64 = self
            .of(metric)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum();
        assert!(v >= 0.0 && v.fract() == 0.0, "{metric} {labels:?} = {v}");
        v as u64
    }

    /// The value of each series of `metric`, by its labels.
    pub(crate) fn series(&self, metric: &str) -> BTreeMap<BTreeMap<String, String>, f64> {
        self.of(metric)
            .map(|s| (s.labels.clone(), s.value))
            .collect()
    }

    pub(crate) fn cgroup_labels(&self) -> BTreeSet<String> {
        self.of("mergetrace_bios_total")
            .filter_map(|s| s.labels.get("cgroup").cloned())
            .collect()
    }
}

/// The counter families whose series and sums must never go back.
pub(crate) const COUNTERS: [&str; 4] = [
    "mergetrace_bios_total",
    "mergetrace_requests_total",
    "mergetrace_merged_total",
    "mergetrace_bio_bytes_total",
];

/// Checks `now` against the scrape before: each series that stays, and each family's sum
/// over all series, only grow.
pub(crate) fn assert_monotonic(before: &Exposition, now: &Exposition, ctx: &str) {
    for metric in COUNTERS {
        let (b, n) = (before.series(metric), now.series(metric));
        for (labels, v) in &n {
            if let Some(old) = b.get(labels) {
                assert!(v >= old, "{metric}{labels:?} went from {old} to {v}; {ctx}");
            }
        }
        let (sb, sn): (f64, f64) = (b.values().sum(), n.values().sum());
        assert!(sn >= sb, "sum of {metric} went from {sb} to {sn}; {ctx}");
    }
}

// ---------------------------------------------------------------------------------------
// Short-lived cgroups: each made, written once from a thread moved into it, removed

/// The id of the calling thread.
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// A page-aligned 4 KiB buffer for O_DIRECT.
pub(crate) struct Block(*mut u8);
// SAFETY: the buffer is only read (written once at creation).
unsafe impl Send for Block {}
unsafe impl Sync for Block {}

impl Block {
    pub(crate) fn new() -> Block {
        let layout = std::alloc::Layout::from_size_align(BS, BS).unwrap();
        // SAFETY: a non-zero size; freed never (one per test).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!p.is_null());
        Block(p)
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: BS bytes allocated in `new`.
        unsafe { std::slice::from_raw_parts(self.0, BS) }
    }
}

/// Where the churn happens: cgroups `c<i>` under `parent`, 4 KiB direct writes to `dev`.
pub(crate) struct Churn {
    pub(crate) parent: PathBuf,
    /// The path mergetrace reports for the parent.
    pub(crate) parent_path: String,
    pub(crate) dev: fs::File,
    pub(crate) dev_path: String,
    pub(crate) blocks: u64,
    pub(crate) block: Block,
    pub(crate) v1: bool,
}

impl Churn {
    pub(crate) fn new(parent: &Cgroup, dev: &BlockDev, size: u64) -> Churn {
        // On v2 the churned cgroups made with mkdir below would otherwise charge every bio
        // to the parent, and no counter of theirs would ever be reclaimed.
        parent.enable_io_for_children();
        let dev_path = format!("/dev/{}", dev.name);
        let file = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&dev_path)
            .unwrap_or_else(|e| panic!("cannot open {dev_path} O_DIRECT: {e}"));
        Churn {
            parent: parent.dir.clone(),
            parent_path: parent.path(),
            dev: file,
            dev_path,
            blocks: size / BS as u64,
            block: Block::new(),
            v1: parent.version() == CgroupVersion::V1,
        }
    }

    pub(crate) fn path_of(&self, i: usize) -> String {
        format!("{}/c{i}", self.parent_path)
    }

    /// Cgroup `i`: created, one 4 KiB write from inside it, removed.
    pub(crate) fn one(&self, i: usize) {
        let dir = self.parent.join(format!("c{i}"));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let offset = (i as u64 % self.blocks) * BS as u64;
        if self.v1 {
            // v1 moves a single thread: this one, into the cgroup and back out.
            let tid = gettid().to_string();
            fs::write(dir.join("tasks"), &tid).expect("move the thread into the cgroup");
            let n = std::os::unix::fs::FileExt::write_at(&self.dev, self.block.bytes(), offset)
                .expect("4 KiB direct write");
            assert_eq!(n, BS);
            fs::write(self.parent.join("tasks"), &tid).expect("move the thread back");
        } else {
            let procs = dir.join("cgroup.procs");
            let script = format!(
                "echo $$ > {} && exec dd if=/dev/zero of={} bs={BS} count=1 seek={} oflag=direct status=none",
                procs.display(),
                self.dev_path,
                offset / BS as u64
            );
            let st = Command::new("sh").args(["-c", &script]).status().unwrap();
            assert!(st.success(), "{script}");
        }
        remove_dir_retrying(&dir);
    }
}

/// rmdir, retried while the kernel still counts the task that just left (EBUSY).
pub(crate) fn remove_dir_retrying(dir: &Path) {
    for _ in 0..1000 {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("rmdir {}: {e}", dir.display()),
        }
    }
    panic!("rmdir {}: still busy", dir.display());
}

/// The writer threads, started once and run round by round.
pub(crate) struct Pool {
    pub(crate) start: Arc<Barrier>,
    pub(crate) done: Arc<Barrier>,
    pub(crate) round: Arc<Mutex<Option<usize>>>,
    pub(crate) handles: Vec<thread::JoinHandle<()>>,
}

impl Pool {
    pub(crate) fn new(churn: Arc<Churn>) -> Pool {
        let start = Arc::new(Barrier::new(WRITERS + 1));
        let done = Arc::new(Barrier::new(WRITERS + 1));
        let round: Arc<Mutex<Option<usize>>> = Arc::new(Mutex::new(None));
        let handles = (0..WRITERS)
            .map(|w| {
                let (start, done, round, churn) =
                    (start.clone(), done.clone(), round.clone(), churn.clone());
                thread::spawn(move || loop {
                    start.wait();
                    let Some(r) = *round.lock().unwrap() else {
                        return;
                    };
                    for k in 0..PER_WRITER {
                        churn.one((r * WRITERS + w) * PER_WRITER + k);
                    }
                    done.wait();
                })
            })
            .collect();
        Pool {
            start,
            done,
            round,
            handles,
        }
    }

    pub(crate) fn run(&self, r: usize) {
        *self.round.lock().unwrap() = Some(r);
        self.start.wait();
        self.done.wait();
    }

    pub(crate) fn finish(self) {
        *self.round.lock().unwrap() = None;
        self.start.wait();
        for h in self.handles {
            h.join().expect("a writer thread panicked");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The soak
