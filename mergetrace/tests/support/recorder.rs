//! `mergetrace record` as a child process.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use super::*;

/// `mergetrace record -d DEV -o FILE` running as a child, started once it said it records.
/// Killed on drop if not stopped.
pub struct Recorder {
    pub child: Option<std::process::Child>,
    pub stderr: Option<thread::JoinHandle<String>>,
}

impl Recorder {
    /// With `tier`, `--tier TIER` (else mergetrace's default).
    pub fn start(dev: &BlockDev, out: &Path, tier: Option<&str>) -> Recorder {
        match tier {
            Some(tier) => Recorder::start_with(dev, out, &["--tier", tier]),
            None => Recorder::start_with(dev, out, &[]),
        }
    }

    /// `mergetrace record -d DEV -o FILE EXTRA...`.
    pub fn start_with(dev: &BlockDev, out: &Path, extra: &[&str]) -> Recorder {
        Recorder::start_with_env(dev, out, extra, &[])
    }

    /// [`Recorder::start_with`] with extra environment variables for the recorder.
    pub fn start_with_env(
        dev: &BlockDev,
        out: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Recorder {
        let mut child = Command::new(mergetrace_bin())
            .envs(env.iter().copied())
            .args(["record", "-d", &dev.name, "-o"])
            .arg(out)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start mergetrace record");
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let stderr = thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        let mut rec = Recorder {
            child: Some(child),
            stderr: Some(stderr),
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("mergetrace: recording to") => break,
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(s) = rec.child.as_mut().unwrap().try_wait().unwrap() {
                        panic!("mergetrace record exited ({s}) before recording");
                    }
                    assert!(
                        Instant::now() < deadline,
                        "mergetrace record did not start within {ATTACH_TIMEOUT:?}"
                    );
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let s = rec.child.as_mut().unwrap().wait();
                    panic!("mergetrace record closed stderr ({s:?}) before recording");
                }
            }
        }
        rec
    }

    /// SIGINT, wait for a clean exit; returns its stderr.
    pub fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mergetrace record did not stop within {STOP_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(50));
        };
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        assert!(
            status.success(),
            "mergetrace record exited with {status}: {stderr}"
        );
        stderr
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
