//! The real blktrace running over a window, stopped and parsed ([`Blktrace`]).

use std::{
    fs,
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::super::{unique_name, BlockDev};
use super::*;

/// Makes sure debugfs is mounted where blktrace looks (`/sys/kernel/debug`); panics (never
/// skips) with the reason when it cannot be.
pub fn require_debugfs() {
    let block = Path::new("/sys/kernel/debug/block");
    if block.is_dir() {
        return;
    }
    let out = Command::new("mount")
        .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
        .output();
    assert!(
        block.is_dir(),
        "blktrace needs debugfs at /sys/kernel/debug and it is not mounted; mounting it failed: \
         {out:?} (this host refuses debugfs; the lab's guests mount it)"
    );
}

/// `blktrace -d /dev/X` running over a window, writing per-CPU files to a temp dir. Stopped
/// (SIGINT to its pid) and its files removed on drop if [`Blktrace::stop`] was not called.
pub struct Blktrace {
    child: Option<Child>,
    dir: PathBuf,
    dev: String,
}

/// How long blktrace may take to set up its relay channels and start tracing.
const START_TIMEOUT: Duration = Duration::from_secs(60);

impl Blktrace {
    /// Starts `blktrace -d /dev/X` and returns once it traces: its per-CPU reader threads
    /// have opened the relay files (`/sys/kernel/debug/block/X/trace<cpu>`, made by
    /// BLKTRACESETUP), after which blktrace issues BLKTRACESTART straight away; a short grace
    /// period covers that step. Panics with blktrace's stderr if it exits or never gets there.
    pub fn start(dev: &BlockDev) -> Blktrace {
        require_debugfs();
        let dir = std::env::temp_dir().join(format!("{}.blktrace", unique_name()));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut cmd = Command::new("blktrace");
        cmd.arg("-d")
            .arg(&dev.path)
            .arg("-D")
            .arg(&dir)
            .args(["-o", "trace", "-b", "1024", "-n", "16"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start blktrace ({cmd:?}): {e} — is it installed (scripts/setup --test)?")
        });
        let mut bt = Blktrace {
            child: Some(child),
            dir,
            dev: dev.name.clone(),
        };
        let relay = PathBuf::from(format!("/sys/kernel/debug/block/{}", dev.name));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = bt.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let (out, err) = bt.take_output();
                panic!("blktrace exited ({status}) before tracing:\n{out}{err}");
            }
            if bt.reading_all_cpus(&relay) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "blktrace did not open its relay files in {relay:?} within {START_TIMEOUT:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(500));
        bt
    }

    /// blktrace holds every `trace<cpu>` relay file of the device open.
    fn reading_all_cpus(&self, relay: &Path) -> bool {
        let Some(pid) = self.child.as_ref().map(|c| c.id()) else {
            return false;
        };
        let files: Vec<PathBuf> = match fs::read_dir(relay) {
            Ok(d) => d
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("trace"))
                .map(|e| e.path())
                .collect(),
            Err(_) => return false,
        };
        if files.is_empty() {
            return false;
        }
        let open: Vec<PathBuf> = fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| fs::read_link(e.path()).ok())
                    .collect()
            })
            .unwrap_or_default();
        files.iter().all(|f| open.contains(f))
    }

    fn take_output(&mut self) -> (String, String) {
        let Some(c) = self.child.as_mut() else {
            return Default::default();
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = c.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = c.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        (out, err)
    }

    /// SIGINT, wait (blktrace writes out its buffers and prints its summary), then `blkparse`
    /// in our format; returns the parsed events. Panics if blktrace or blkparse fail, or if
    /// blktrace dropped events.
    pub fn stop(mut self) -> Trace {
        let mut child = self.child.take().expect("blktrace already stopped");
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().ok().flatten() {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("blktrace did not exit within 60 s of SIGINT");
            }
            thread::sleep(Duration::from_millis(50));
        };
        let mut summary = String::new();
        let mut err = String::new();
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut summary);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        assert!(
            status.success(),
            "blktrace exited with {status} after SIGINT:\n{summary}{err}"
        );
        let out = Command::new("blkparse")
            .arg("-i")
            .arg("trace")
            .arg("-D")
            .arg(&self.dir)
            .args(["-q", "-f", BLKPARSE_FORMAT])
            .args(["-F", &format!("X,{BLKPARSE_FORMAT_PDU}")])
            .args(["-F", &format!("U,{BLKPARSE_FORMAT_PDU}")])
            .output()
            .unwrap_or_else(|e| panic!("cannot run blkparse: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "blkparse failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let mut trace =
            parse_blkparse(&text).unwrap_or_else(|e| panic!("blkparse output does not parse: {e}"));
        trace.dropped = parse_dropped(&summary);
        assert_eq!(
            trace.dropped,
            Some(0),
            "blktrace on {} dropped events (or printed no summary):\n{summary}{err}",
            self.dev
        );
        trace
    }
}

impl Drop for Blktrace {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

// The parser's unit tests are in kernel_conformance.rs (`blkparse_parser`), so that they run
// once rather than in every test binary that includes this harness.
