//! Running one arm: its tracer up and attached, fio, the tracer down, and what the tracer
//! printed parsed into a [`Sample`].

use std::{
    fs,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    arms::{Arm, RecorderStages, Sample},
    fio::{self, Fio},
    profile::{self, Profile},
    sys::{self, last_line, nap, LimitCgroup, LoopDev, Proc, Ready},
};

/// The block tracepoints mergetrace attaches (the hook table, mergetrace/src/kernel/compat/hooks.rs),
/// which the bpftrace and perf arms attach too.
pub const BLOCK_TRACEPOINTS: [&str; 11] = [
    "block_bio_queue",
    "block_split",
    "block_bio_backmerge",
    "block_bio_frontmerge",
    "block_getrq",
    "block_rq_merge",
    "block_rq_insert",
    "block_rq_issue",
    "block_rq_requeue",
    "block_rq_complete",
    "block_unplug",
];

pub struct Ctx<'a> {
    pub mergetrace: PathBuf,
    pub lp: &'a LoopDev,
    /// The limited workload's cgroup, when it runs.
    pub limit: Option<&'a LimitCgroup>,
    pub dir: &'a Path,
    pub bpftrace_script: PathBuf,
    pub cpus: usize,
}

impl Ctx<'_> {
    pub fn capture_path(&self) -> PathBuf {
        self.dir.join("record.mtr")
    }

    /// Starts the arm's tracer, if it has one, and waits until it is attached.
    pub fn start(&self, arm: Arm) -> Result<std::result::Result<Option<Proc>, String>> {
        let dev = self.lp.name.as_str();
        let (cmd, timeout): (Command, u64) = match arm {
            Arm::Baseline | Arm::Again => return Ok(Ok(None)),
            Arm::Live
            | Arm::LiveLatency
            | Arm::LiveStats
            | Arm::LiveProfiled
            | Arm::LiveHooksProfiled => {
                let mut c = Command::new(&self.mergetrace);
                c.args(["-d", dev, "--json", "-i", "10s"]);
                if arm == Arm::LiveStats {
                    c.arg("--stats");
                }
                if arm == Arm::LiveLatency {
                    c.arg("--latency");
                }
                if arm == Arm::LiveHooksProfiled {
                    c.arg("--hooks-only");
                }
                (c, 60)
            }
            Arm::Serve => {
                let mut c = Command::new(&self.mergetrace);
                c.args(["serve", "-d", dev, "--listen", "127.0.0.1:0"]);
                (c, 60)
            }
            Arm::Record
            | Arm::RecordRequests
            | Arm::RecordStats
            | Arm::RecordProfiled
            | Arm::RecordRequestsProfiled => {
                let mut c = Command::new(&self.mergetrace);
                c.args(["record", "-d", dev, "--force", "-o"])
                    .arg(self.capture_path());
                if matches!(arm, Arm::RecordRequests | Arm::RecordRequestsProfiled) {
                    c.arg("--requests");
                }
                if arm == Arm::RecordStats {
                    c.arg("--stats");
                }
                (c, 60)
            }
            Arm::Bpftrace | Arm::BpftraceProfiled => {
                let mut c = Command::new("bpftrace");
                c.args(["-B", "line"]).arg(&self.bpftrace_script);
                (c, 120) // it compiles the script first
            }
            Arm::Perf => {
                let events: Vec<String> = BLOCK_TRACEPOINTS
                    .iter()
                    .map(|t| format!("block:{t}"))
                    .collect();
                let mut c = Command::new("perf");
                c.args(["record", "-e", &events.join(","), "-a", "-B", "-N", "-o"])
                    .arg(self.dir.join("perf.data"));
                (c, 60)
            }
        };
        let mut p = Proc::spawn(arm.label(), cmd, self.dir, arm.key())?;
        let perf_fds = BLOCK_TRACEPOINTS.len() * self.cpus;
        let attached = attach(&mut p, timeout, |p| match arm {
            Arm::Live
            | Arm::LiveLatency
            | Arm::LiveStats
            | Arm::LiveProfiled
            | Arm::LiveHooksProfiled => p.stderr().contains("mergetrace: tracing"),
            Arm::Record
            | Arm::RecordRequests
            | Arm::RecordStats
            | Arm::RecordProfiled
            | Arm::RecordRequestsProfiled => p.stderr().contains("mergetrace: recording to"),
            Arm::Serve => serving_at(&p.stderr()).is_some(),
            Arm::Bpftrace | Arm::BpftraceProfiled => p.stdout().contains("bench: attached"),
            Arm::Perf => sys::perf_event_fds(p.pid()) >= perf_fds,
            Arm::Baseline | Arm::Again => true,
        })?;
        if let Err(why) = attached {
            return Ok(Err(why));
        }
        if arm == Arm::Perf {
            perf_enabling()?;
        }
        Ok(Ok(Some(p)))
    }

    fn profile_path(&self) -> PathBuf {
        self.dir.join("profile.data")
    }

    /// Starts `perf record` sampling every CPU for a profiled arm, and waits until its events
    /// are open. `Ok(Err(why))` where perf cannot profile here.
    fn start_profiler(&self) -> Result<std::result::Result<Proc, String>> {
        let data = self.profile_path();
        let mut p = Proc::spawn(
            "perf record (profile)",
            profile::recorder(&data),
            self.dir,
            "profile",
        )?;
        if let Err(why) = attach(&mut p, 60, |p| sys::perf_event_fds(p.pid()) >= self.cpus)? {
            return Ok(Err(format!("perf record (profile): {why}")));
        }
        perf_enabling()?;
        Ok(Ok(p))
    }

    /// Stops the profiler and reads its samples as those of the tracer `tracer_pid`.
    fn stop_profiler(&self, p: &mut Proc, tracer_pid: u32) -> Result<Profile> {
        let f = p.stop(Duration::from_secs(60));
        if f.killed {
            bail!("perf record (profile) did not exit within 60 s of SIGINT");
        }
        let data = self.profile_path();
        let profile = profile::read(&data, tracer_pid);
        let _ = fs::remove_file(&data);
        profile
    }

    /// Runs one arm: tracer up, fio, tracer down. `Err` for something that must stop the
    /// bench; `Ok(Err(why))` for a tracer that cannot run here.
    pub fn run(
        &self,
        arm: Arm,
        fio: &Fio,
        seconds: f64,
    ) -> Result<std::result::Result<Sample, String>> {
        let mergetrace_arm = matches!(
            arm,
            Arm::Live
                | Arm::LiveLatency
                | Arm::LiveStats
                | Arm::LiveProfiled
                | Arm::LiveHooksProfiled
                | Arm::Serve
                | Arm::Record
                | Arm::RecordRequests
                | Arm::RecordStats
                | Arm::RecordProfiled
                | Arm::RecordRequestsProfiled
        );
        let mut tracer = match self.start(arm)? {
            Ok(t) => t,
            Err(why) if mergetrace_arm => bail!("{}: {why}", arm.label()),
            Err(why) => return Ok(Err(why)),
        };
        // The exporter is scraped every second while fio runs (Prometheus' default is 15 s).
        let scraper = match (arm, &tracer) {
            (Arm::Serve, Some(p)) => Some(Scraper::start(
                serving_at(&p.stderr()).context("mergetrace serve: no address")?,
            )),
            _ => None,
        };
        // The tracer's own CPU while fio runs (not its start-up, nor its summary at the end).
        let tracer_cpu = || tracer.as_ref().and_then(|p| sys::process_cpu_ns(p.pid()));
        // A profile perf cannot take or read: the arm is unavailable, as for a tool that cannot
        // run here, and says why (its tracer stopped as at the end of a run).
        let unavailable = |tracer: &mut Option<Proc>, why: String| {
            if let Some(t) = tracer.as_mut() {
                t.stop(Duration::from_secs(30));
            }
            Ok(Err(why))
        };
        let mut profiler = None;
        if arm.profiled() {
            match self.start_profiler()? {
                Ok(p) => profiler = Some(p),
                Err(why) => return unavailable(&mut tracer, why),
            }
        }
        let cpu0 = tracer_cpu();
        let run = fio::run(fio, self.lp, self.dir, seconds);
        let cpu1 = tracer_cpu();
        let tracer_pid = tracer.as_ref().map_or(0, |t| t.pid());
        let profile = profiler.as_mut().map(|p| self.stop_profiler(p, tracer_pid));
        let scrapes = scraper.map(Scraper::stop);
        let mut s = Sample::of(&run?);
        s.tracer_cpu_ns = cpu0.zip(cpu1).map(|(a, b)| (b - a).max(0.0));
        match profile {
            Some(Ok(p)) => s.profile = Some(p),
            Some(Err(e)) => return unavailable(&mut tracer, format!("{e:#}")),
            None => {}
        }
        let Some(p) = tracer.as_mut() else {
            return Ok(Ok(s));
        };
        let grace = Duration::from_secs(if arm == Arm::Perf { 120 } else { 30 });
        let f = p.stop(grace);
        sys::check_interrupt()?;
        let by_sigint = {
            use std::os::unix::process::ExitStatusExt;
            f.status.signal() == Some(libc::SIGINT)
        };
        if f.killed || !(f.status.success() || (arm == Arm::Perf && by_sigint)) {
            let why = format!(
                "{} after SIGINT: {}",
                if f.killed {
                    format!("did not exit within {} s", grace.as_secs())
                } else {
                    format!("exited with {}", f.status)
                },
                last_line(&f.stderr).unwrap_or("no message")
            );
            if mergetrace_arm {
                bail!("{}: {why}", arm.label());
            }
            return Ok(Err(why));
        }
        match arm {
            Arm::Baseline | Arm::Again => {}
            Arm::Live
            | Arm::LiveLatency
            | Arm::LiveStats
            | Arm::LiveProfiled
            | Arm::LiveHooksProfiled => {
                let total = last_json(&f.stdout)
                    .with_context(|| format!("{}: no final JSON object on stdout", arm.label()))?;
                s.lost = total["lost_events"].as_u64();
                if arm == Arm::LiveStats {
                    s.programs = parse_program_stats(&total);
                    if s.programs.is_empty() {
                        s.notes.push("no program_stats in the final object".into());
                    }
                }
            }
            Arm::Serve => {
                let scrapes = scrapes.expect("the serve arm scrapes");
                if scrapes.ok == 0 || scrapes.failed > 0 {
                    bail!(
                        "mergetrace serve: {} of {} scrapes of /metrics failed{}",
                        scrapes.failed,
                        scrapes.ok + scrapes.failed,
                        scrapes.error.map(|e| format!(": {e}")).unwrap_or_default()
                    );
                }
                s.lost = Some(parse_lost_metric(&scrapes.last));
                s.notes.push(format!("{} scrapes", scrapes.ok));
            }
            Arm::Record
            | Arm::RecordRequests
            | Arm::RecordStats
            | Arm::RecordProfiled
            | Arm::RecordRequestsProfiled => {
                let (events, lost, bytes) = parse_record_summary(&f.stderr).with_context(|| {
                    format!(
                        "mergetrace record: no \"wrote N events (L lost) in B bytes\" line: {}",
                        last_line(&f.stderr).unwrap_or("no output")
                    )
                })?;
                s.events = Some(events);
                s.lost = Some(lost);
                s.bytes = Some(bytes);
                if arm == Arm::RecordStats {
                    s.programs = parse_record_program_stats(&f.stderr);
                    s.recorder_cpu_ns = parse_recorder_cpu_ns(&f.stderr);
                    s.recorder_stages = parse_recorder_stages(&f.stderr);
                    if s.programs.is_empty()
                        || s.recorder_cpu_ns.is_none()
                        || s.recorder_stages.is_none()
                    {
                        s.notes
                            .push("no \"mergetrace: stats:\" lines on stderr".into());
                    }
                }
            }
            Arm::Bpftrace | Arm::BpftraceProfiled => {
                s.events = Some(parse_bpftrace_counts(&f.stdout, self.lp.dev_t()));
            }
            Arm::Perf => {
                // perf prints a sample count only when it post-processes (not with -B -N);
                // the file size says how much it wrote.
                s.events = parse_perf_samples(&f.stderr);
                s.bytes = fs::metadata(self.dir.join("perf.data"))
                    .ok()
                    .map(|m| m.len());
                s.notes.extend(
                    f.stderr
                        .lines()
                        .filter(|l| l.to_ascii_lowercase().contains("lost"))
                        .map(|l| l.trim().to_string()),
                );
                let _ = fs::remove_file(self.dir.join("perf.data"));
            }
        }
        Ok(Ok(s))
    }
}

/// Waits up to `timeout` s for `p` to be ready (`ready`); `Ok(Err(why))` where it exited first
/// or did not get there (then it is stopped).
fn attach(
    p: &mut Proc,
    timeout: u64,
    ready: impl FnMut(&Proc) -> bool,
) -> Result<std::result::Result<(), String>> {
    Ok(match p.wait_ready(Duration::from_secs(timeout), ready)? {
        Ready::Yes => Ok(()),
        Ready::Exited(why) => Err(why),
        Ready::TimedOut => {
            p.stop(Duration::from_secs(5));
            Err(format!("not attached after {timeout} s"))
        }
    })
}

/// perf's event descriptors are open; it enables them right after mmap-ing their buffers.
fn perf_enabling() -> Result<()> {
    nap(Duration::from_millis(300))
}

/// Where `mergetrace serve` listens, from its "serving http://ADDR/metrics" line.
fn serving_at(stderr: &str) -> Option<SocketAddr> {
    stderr.lines().find_map(|l| {
        l.strip_prefix("mergetrace: serving http://")?
            .strip_suffix("/metrics")?
            .parse()
            .ok()
    })
}

/// The sum of `mergetrace_lost_events_total` in an exposition.
pub fn parse_lost_metric(body: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with("mergetrace_lost_events_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// GETs /metrics every second on a thread until stopped.
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Scrapes>,
}

/// What the scrapes got: how many answered 200, how many did not (and the first error), the
/// last body.
#[derive(Default)]
struct Scrapes {
    ok: u64,
    failed: u64,
    error: Option<String>,
    last: String,
}

impl Scraper {
    fn start(addr: SocketAddr) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut got = Scrapes::default();
            loop {
                match scrape(addr) {
                    Ok(body) => {
                        got.ok += 1;
                        got.last = body;
                    }
                    Err(e) => {
                        got.failed += 1;
                        got.error.get_or_insert(format!("{e:#}"));
                    }
                }
                // Sleep a second in short naps, so that a stop does not wait for it.
                for _ in 0..10 {
                    if flag.load(Ordering::Relaxed) {
                        return got;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        });
        Scraper { stop, thread }
    }

    /// Stops the scrapes (the last one is at most a second old) and returns what they got.
    fn stop(self) -> Scrapes {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// One `GET /metrics`: the body of a 200 answer.
fn scrape(addr: SocketAddr) -> Result<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut answer = String::new();
    c.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("no end of the HTTP header")?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200 ") {
        bail!("GET /metrics: {status}");
    }
    Ok(body.to_string())
}

/// The last line of NDJSON output that parses.
pub fn last_json(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
}

/// `record --stats`' program lines: "mergetrace: stats: NAME  RUNS runs  NS ns/run".
pub fn parse_record_program_stats(stderr: &str) -> Vec<(String, u64, f64)> {
    stderr
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l
                .strip_prefix("mergetrace: stats: ")?
                .split_whitespace()
                .collect();
            match w[..] {
                [name, runs, "runs", ns, "ns/run"] => {
                    Some((name.to_string(), runs.parse().ok()?, ns.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

/// `record --stats`' "recording took N ms of this process's CPU" line, in ns.
pub fn parse_recorder_cpu_ns(stderr: &str) -> Option<f64> {
    stderr.lines().find_map(|l| {
        let ms = l
            .strip_prefix("mergetrace: stats: recording took ")?
            .split_once(" ms of this process's CPU")?
            .0;
        Some(ms.parse::<f64>().ok()? * 1e6)
    })
}

/// `record --stats`' "per event, reading the rings N ns, time order N ns, encoding and
/// writing N ns, the rest N ns" line, in its order ([`RecorderStages::NAMES`]).
pub fn parse_recorder_stages(stderr: &str) -> Option<RecorderStages> {
    stderr.lines().find_map(|l| {
        let mut rest = l.strip_prefix("mergetrace: stats: per event, ")?;
        let mut stages = [0.0; 4];
        for (v, name) in stages.iter_mut().zip(RecorderStages::NAMES) {
            let (ns, after) = rest
                .trim_start_matches(", ")
                .strip_prefix(name)?
                .trim_start()
                .split_once(" ns")?;
            *v = ns.parse().ok()?;
            rest = after;
        }
        Some(RecorderStages(stages))
    })
}

pub fn parse_program_stats(total: &Value) -> Vec<(String, u64, f64)> {
    total["program_stats"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    Some((
                        p["program"].as_str()?.to_string(),
                        p["runs"].as_u64()?,
                        p["ns_per_run"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// "mergetrace: wrote N events (L lost) in B bytes to FILE (...)" → (N, L, B).
pub fn parse_record_summary(stderr: &str) -> Option<(u64, u64, u64)> {
    let line = stderr.lines().find(|l| l.contains("mergetrace: wrote "))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let i = w.iter().position(|x| *x == "wrote")?;
    let events = w.get(i + 1)?.parse().ok()?;
    let lost = w.get(i + 3)?.trim_start_matches('(').parse().ok()?;
    let bytes = w.get(i + 6)?.parse().ok()?;
    Some((events, lost, bytes))
}

/// bpftrace's map dump: "@[tracepoint:block:block_getrq, 7340036]: 123" → the sum of counts
/// whose key ends with our dev_t.
pub fn parse_bpftrace_counts(stdout: &str, dev_t: u64) -> u64 {
    let suffix = format!(", {dev_t}]");
    stdout
        .lines()
        .filter_map(|l| {
            let (key, n) = l.trim().rsplit_once(": ")?;
            key.ends_with(&suffix)
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// "[ perf record: Captured and wrote 12.3 MB /path (123456 samples) ]" → 123456.
pub fn parse_perf_samples(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains("Captured and wrote"))?;
    let open = line.rfind('(')?;
    line[open + 1..].split_whitespace().next()?.parse().ok()
}

pub fn bpftrace_script() -> String {
    let with_dev: Vec<String> = BLOCK_TRACEPOINTS
        .iter()
        .filter(|t| **t != "block_unplug")
        .map(|t| format!("tracepoint:block:{t}"))
        .collect();
    format!(
        "// Written by cargo xtask bench: count the block tracepoints mergetrace uses, per device.\n\
         BEGIN {{ printf(\"bench: attached\\n\"); }}\n\
         {} {{ @[probe, args->dev] = count(); }}\n\
         tracepoint:block:block_unplug {{ @[probe, 0] = count(); }}\n",
        with_dev.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_output() {
        let rec = "mergetrace: tracing loop4 (7:4)\nmergetrace: wrote 4123456 events (7 lost) in 80000000 bytes to /dev/shm/x.mtr (19.4 bytes/event)\n";
        assert_eq!(parse_record_summary(rec), Some((4_123_456, 7, 80_000_000)));
        assert_eq!(parse_record_summary("nothing"), None);
        let bt = "Attaching 12 probes...\nbench: attached\n\n\n@[tracepoint:block:block_getrq, 7340036]: 100\n@[tracepoint:block:block_bio_queue, 266338304]: 5\n@[tracepoint:block:block_rq_issue, 7340036]: 23\n@[tracepoint:block:block_unplug, 0]: 4\n";
        assert_eq!(parse_bpftrace_counts(bt, 7 << 20 | 4), 123);
        let perf = "[ perf record: Woken up 1 times to write data ]\n[ perf record: Captured and wrote 12.072 MB /dev/shm/perf.data (123456 samples) ]\n";
        assert_eq!(parse_perf_samples(perf), Some(123_456));
        let total = serde_json::json!({"program_stats": [{"program": "block_getrq", "runs": 10, "run_time_ns": 1000, "ns_per_run": 100.0}]});
        assert_eq!(
            parse_program_stats(&total),
            vec![("block_getrq".to_string(), 10, 100.0)]
        );
        // What `record --stats` prints (mergetrace/src/commands/record.rs), one line each.
        let rec = "mergetrace: wrote 10 events (0 lost) in 40 bytes to /x (4.0 bytes/event)\n\
                   mergetrace: stats: block_bio_queue                828978 runs      445 ns/run\n\
                   mergetrace: stats: workqueue_execute_end          226503 runs       80 ns/run\n\
                   mergetrace: stats: recording took 802 ms of this process's CPU, 145 ns per event\n\
                   mergetrace: stats: per event, reading the rings 7 ns, time order 10 ns, \
                   encoding and writing 55 ns, the rest 73 ns (polls, wake-ups, flushes)\n";
        assert_eq!(
            parse_record_program_stats(rec),
            vec![
                ("block_bio_queue".to_string(), 828_978, 445.0),
                ("workqueue_execute_end".to_string(), 226_503, 80.0)
            ]
        );
        assert_eq!(parse_recorder_cpu_ns(rec), Some(802e6));
        assert_eq!(
            parse_recorder_stages(rec),
            Some(RecorderStages([7.0, 10.0, 55.0, 73.0]))
        );
        assert_eq!(
            parse_recorder_stages("mergetrace: stats: per event, x 1 ns"),
            None
        );
        assert_eq!(
            parse_recorder_cpu_ns("mergetrace: stats: x 1 runs 2 ns/run"),
            None
        );
        assert_eq!(
            last_json("{\"kind\":\"interval\"}\n{\"kind\":\"total\"}\n").unwrap()["kind"],
            "total"
        );
        let serve =
            "mergetrace: tracing loop4\nmergetrace: serving http://127.0.0.1:40123/metrics\n";
        assert_eq!(serving_at(serve), Some("127.0.0.1:40123".parse().unwrap()));
        assert_eq!(serving_at("mergetrace: tracing loop4\n"), None);
        let metrics = "# TYPE mergetrace_lost_events counter\nmergetrace_lost_events_total{kind=\"rq_issue\"} 3\nmergetrace_lost_events_total{kind=\"counters_map_full\"} 2\nmergetrace_bios_total{device=\"loop4\"} 9\n";
        assert_eq!(parse_lost_metric(metrics), 5);
    }

    #[test]
    fn bpftrace_script_covers_the_tracepoints() {
        let s = bpftrace_script();
        for t in BLOCK_TRACEPOINTS {
            assert!(s.contains(&format!("tracepoint:block:{t}")), "{t}");
        }
        assert!(s.contains("BEGIN"));
    }
}
