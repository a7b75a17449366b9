//! Processes of a workload: each in its own process group, optionally in a cgroup and as
//! another user; killed by pid and process group on drop.

use std::{
    ffi::CString,
    io::Read,
    os::unix::{ffi::OsStrExt, process::CommandExt},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::*;

/// A user to run a program as (postgres refuses to run as root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// `nobody` (65534:65534), present on every Debian system and in the lab's guests (they see
/// the host's /etc/passwd).
pub const NOBODY: User = User {
    uid: 65534,
    gid: 65534,
};

/// Makes `cmd` start in its own process group, inside `cg` (its pid written to
/// `cgroup.procs` by the child itself, before exec, so its first I/O is already the cgroup's)
/// and as `user` (after joining the cgroup: the cgroup files are root's).
pub fn confine(cmd: &mut Command, cg: Option<&Cgroup>, user: Option<User>) {
    let procs = cg.map(|c| CString::new(c.procs_file().as_os_str().as_bytes()).unwrap());
    cmd.process_group(0);
    // SAFETY: only async-signal-safe calls (open, write, close, setgroups, setgid, setuid)
    // on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // "0": the writing process itself (cgroup v1 and v2).
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n != 1 {
                    return Err(err);
                }
            }
            if let Some(u) = user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(u.gid) != 0
                    || libc::setuid(u.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A program a driver started. Dropping it before [`Running::wait`] kills it: SIGKILL to
/// its process group and to its pid.
pub struct Running {
    pub(super) child: Option<Child>,
    what: String,
    stdout: Option<thread::JoinHandle<String>>,
    stderr: Option<thread::JoinHandle<String>>,
}

/// What a finished program printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Running {
    /// Starts `cmd` (stdin from /dev/null unless set, stdout and stderr captured) confined as
    /// [`confine`] says.
    pub fn start(mut cmd: Command, cg: Option<&Cgroup>, user: Option<User>) -> Running {
        confine(&mut cmd, cg, user);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let what = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let reader = |s: Option<Box<dyn Read + Send>>| {
            s.map(|mut s| {
                thread::spawn(move || {
                    let mut v = Vec::new();
                    let _ = s.read_to_end(&mut v);
                    String::from_utf8_lossy(&v).into_owned()
                })
            })
        };
        let stdout = reader(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let stderr = reader(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        Running {
            child: Some(child),
            what,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Waits up to `timeout` (then kills it and panics).
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            let c = self.child.as_mut().expect("waited for twice");
            if let Some(s) = c.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("{} did not finish within {timeout:?}", self.what);
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.child = None;
        let join = |h: Option<thread::JoinHandle<String>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Output {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }

    /// Waits, requires exit status 0, returns stdout.
    pub fn wait_ok(self) -> String {
        let what = self.what.clone();
        let out = self.wait(PROGRAM_TIMEOUT);
        assert!(
            out.status.success(),
            "{what} failed ({}):\n{}{}\n{}",
            out.status,
            out.stdout,
            out.stderr,
            kernel_log_tail(30)
        );
        out.stdout
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe {
                libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` to completion (confined), requiring success; returns its stdout.
pub fn run(cmd: Command, cg: Option<&Cgroup>, user: Option<User>) -> String {
    Running::start(cmd, cg, user).wait_ok()
}

/// The kernel log's last `lines` lines, titled, for a failure message: an I/O error a program
/// reports (EIO from `sync`, say) is explained there, by the driver or the filesystem.
pub fn kernel_log_tail(lines: usize) -> String {
    match std::process::Command::new("dmesg").output() {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            format!(
                "the kernel log's last {} lines:\n{}",
                tail.len(),
                tail.join("\n")
            )
        }
        Ok(o) => format!(
            "(dmesg failed: {})",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("(cannot run dmesg: {e})"),
    }
}

/// `Command::new(program).args(args)`, with a C locale (no locale warnings from postgres).
pub fn cmd<S: AsRef<std::ffi::OsStr>>(program: impl AsRef<std::ffi::OsStr>, args: &[S]) -> Command {
    let mut c = Command::new(program);
    c.args(args).env("LC_ALL", "C").stdin(Stdio::null());
    c
}

/// A shell command line.
pub fn sh(script: &str) -> Command {
    cmd("sh", &["-c", script])
}
