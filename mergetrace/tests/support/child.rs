//! A child process of the tests whose stderr is read as it comes (into a buffer, and line by
//! line to a channel, so a caller can wait for a line such as the attach banner); killed on
//! drop unless it exited.

use std::{
    io::{BufRead, BufReader},
    process::{Child, ExitStatus},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

pub struct Spawned {
    child: Option<Child>,
    stderr: Arc<Mutex<String>>,
    stderr_thread: Option<thread::JoinHandle<()>>,
}

impl Spawned {
    /// Takes over `child`, whose stderr is piped; its stderr lines come on the receiver.
    pub fn new(mut child: Child) -> (Spawned, mpsc::Receiver<String>) {
        let err = child.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        let all = stderr.clone();
        let stderr_thread = thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                all.lock().unwrap().push_str(&line);
                all.lock().unwrap().push('\n');
                let _ = tx.send(line);
            }
        });
        let spawned = Spawned {
            child: Some(child),
            stderr,
            stderr_thread: Some(stderr_thread),
        };
        (spawned, rx)
    }

    /// Its pid; 0 once it exited.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Everything on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Its exit status if it exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Blocks until it exits.
    pub fn wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.wait().ok())
    }

    /// Waits until stderr is read to its end (after the exit).
    pub fn join_stderr(&mut self) {
        if let Some(t) = self.stderr_thread.take() {
            let _ = t.join();
        }
    }

    /// Sends `sig` (while it runs).
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(c) = &self.child {
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
        }
    }

    /// Waits up to `timeout` for the exit: its status, with stderr read to the end; `None`
    /// (still running) past it.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                self.child = None;
                self.join_stderr();
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // Only reached while it runs when a test panicked: do not leave it running.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The pids whose parent is `pid` (from /proc/*/stat).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            v.push(p);
        }
    }
    v
}
