//! `mergetrace serve` as a child process on a free loopback port, and one HTTP GET.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Command, ExitStatus, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::*;

/// A bound on one HTTP exchange (a scrape reads the BPF maps: fast, but the machine is small).
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Server {
    pub proc: Spawned,
    pub addr: SocketAddr,
    /// `http`, or `https` with a web config that has a `tls_server_config`.
    pub scheme: &'static str,
}

/// A port nobody listens on right now: bind :0, read the port, close.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

impl Server {
    /// `mergetrace serve -d <dev> --listen 127.0.0.1:<free port> <extra>`, returned once it
    /// printed "mergetrace: serving" (http, or https when `extra` gives a web config with TLS).
    pub fn start(dev: &BlockDev, extra: &[&str]) -> Server {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let bin = mergetrace_bin();
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "-d", dev.name.as_str(), "--listen"])
            .arg(addr.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let (proc, rx) = Spawned::new(child);
        let mut server = Server {
            proc,
            addr,
            scheme: "http",
        };
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.starts_with("mergetrace: serving") => {
                    server.scheme = ["http", "https"]
                        .into_iter()
                        .find(|s| line == format!("mergetrace: serving {s}://{addr}/metrics"))
                        .unwrap_or_else(|| panic!("the serving line names the address: {line}"));
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(status) = server.proc.try_wait() {
                        server.proc.join_stderr();
                        panic!(
                            "mergetrace serve exited ({status}) before serving; stderr:\n{}",
                            server.stderr()
                        );
                    }
                    assert!(
                        e == mpsc::RecvTimeoutError::Timeout && Instant::now() < deadline,
                        "mergetrace serve did not print the serving line within {ATTACH_TIMEOUT:?}; stderr:\n{}",
                        server.stderr()
                    );
                }
            }
        }
        let banner = server.stderr();
        assert!(
            banner.starts_with("mergetrace: tracing "),
            "the live view's banner comes first: {banner}"
        );
        assert!(
            !banner.contains("warning: listening"),
            "no exposure warning on loopback: {banner}"
        );
        server
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn stderr(&self) -> String {
        self.proc.stderr()
    }

    /// Sends `sig`, waits for the exit, returns the status and stderr.
    pub fn stop(mut self, sig: libc::c_int) -> (ExitStatus, String) {
        self.proc.signal(sig);
        let Some(status) = self.proc.wait_exit(STOP_TIMEOUT) else {
            panic!(
                "mergetrace serve did not exit within {STOP_TIMEOUT:?} of signal {sig}; stderr:\n{}",
                self.stderr()
            );
        };
        (status, self.stderr())
    }
}

/// One HTTP/1.1 GET with `Connection: close`: (status, header block, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)
        .unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(HTTP_TIMEOUT)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("reading the response from {addr}: {e}"));
    let text = String::from_utf8(raw).expect("the response is UTF-8");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header/body separator in {text:?}"));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    if let Some(len) = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("content-length:")
            .map(|v| v.trim().to_string())
    }) {
        assert_eq!(len.parse::<usize>().unwrap(), body.len(), "content-length");
    }
    (status, head.to_string(), body.to_string())
}
