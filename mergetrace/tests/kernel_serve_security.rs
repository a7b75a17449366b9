//! `mergetrace serve` hardened as the exporters fleets trust (issue 51), and the live view's
//! least privilege:
//! - once attached, every thread of the process keeps CAP_BPF and CAP_PERFMON only (with
//!   `--user nobody`: and CAP_DAC_READ_SEARCH, uid 65534), in its effective, permitted and
//!   bounding sets, nothing inheritable or ambient, NoNewPrivs 1 (`/proc/PID/task/*/status`),
//!   and its counts stay exact against /proc/diskstats and fio while it runs so;
//! - over TLS with client certificates and basic auth (a test CA made at test time): curl
//!   without a password gets 401 with `WWW-Authenticate`, a wrong one too, a client without a
//!   certificate gets no answer, plain HTTP on the port gets Go's 400; with both, the scrapes'
//!   counter deltas equal diskstats;
//! - SIGHUP with a bad file keeps the previous configuration and says so; with a good one,
//!   the new password is the one that works;
//! - a malformed web config, a missing certificate, a bad bcrypt hash, an unknown user: one
//!   line, exit 1, before anything is loaded.
//!
//! Needs root, BPF, loop devices, cgroup v1 blkio or v2 io, fio and curl (scripts/setup
//! --test). Missing any of them is a FAILURE, never a skip. Run:
//!   cargo xtask test --test kernel_serve_security
mod support;

use std::{
    fs,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use prometheus_parse::{Scrape, Value};
use support::{serve::*, tls::*, *};

const SIZE: u64 = 32 << 20;
const BS: u64 = 4096;

const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
const CAP_PERFMON: u64 = 1 << 38;
const CAP_BPF: u64 = 1 << 39;
/// What serve and the live view keep as root.
const KEPT: u64 = CAP_BPF | CAP_PERFMON;
/// The uid of `nobody` on Debian.
const NOBODY: u32 = 65534;

// ---------------------------------------------------------------------------------------
// Privileges, thread by thread

/// The fields of one thread's status that say what it may do.
#[derive(Debug)]
struct ThreadPrivileges {
    tid: String,
    uids: Vec<u32>,
    inheritable: u64,
    permitted: u64,
    effective: u64,
    bounding: u64,
    ambient: u64,
    no_new_privs: u32,
}

/// Every thread of `pid` (a thread's capabilities are its own: /proc/PID/status shows the
/// first thread only).
fn privileges_of(pid: u32) -> Vec<ThreadPrivileges> {
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
        let tid = e.unwrap().file_name().to_string_lossy().into_owned();
        let Ok(status) = fs::read_to_string(format!("{dir}/{tid}/status")) else {
            continue; // it ended
        };
        let field = |name: &str| -> String {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or_else(|| panic!("no {name} in {dir}/{tid}/status:\n{status}"))
                .trim()
                .to_string()
        };
        let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
        out.push(ThreadPrivileges {
            uids: field("Uid")
                .split_whitespace()
                .map(|u| u.parse().unwrap())
                .collect(),
            inheritable: hex("CapInh"),
            permitted: hex("CapPrm"),
            effective: hex("CapEff"),
            bounding: hex("CapBnd"),
            ambient: hex("CapAmb"),
            no_new_privs: field("NoNewPrivs").parse().unwrap(),
            tid,
        });
    }
    assert!(out.len() >= 2, "a runtime has several threads: {out:?}");
    out
}

/// Every thread of `pid` keeps `kept` and nothing else, has NoNewPrivs, runs as `uid`.
fn assert_reduced(pid: u32, kept: u64, uid: u32) {
    let threads = privileges_of(pid);
    for t in &threads {
        let ctx = format!("pid {pid} thread {}: {t:?}", t.tid);
        assert_eq!(t.effective, kept, "CapEff; {ctx}");
        assert_eq!(t.permitted, kept, "CapPrm; {ctx}");
        assert_eq!(t.bounding, kept, "CapBnd; {ctx}");
        assert_eq!((t.inheritable, t.ambient), (0, 0), "CapInh, CapAmb; {ctx}");
        assert_eq!(t.no_new_privs, 1, "NoNewPrivs; {ctx}");
        assert!(t.uids.iter().all(|u| *u == uid), "Uid; {ctx}");
    }
    eprintln!(
        "kernel_serve_security: pid {pid}, {} threads: CapEff {kept:016x} CapPrm {kept:016x} \
         CapBnd {kept:016x} CapInh 0 CapAmb 0 NoNewPrivs 1 Uid {uid}",
        threads.len()
    );
}

// ---------------------------------------------------------------------------------------
// Scrapes

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("the exposition does not parse ({e}):\n{text}"))
}

/// The sum of `metric` over the device's write series.
fn writes(s: &Scrape, dev: &BlockDev, metric: &str) -> u64 {
    s.samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| x.labels.get("device") == Some(dev.name.as_str()))
        .filter(|x| x.labels.get("direction") == Some("write"))
        .map(|x| match x.value {
            Value::Counter(v) | Value::Untyped(v) => v as u64,
            ref other => panic!("{metric} is not a counter: {other:?}"),
        })
        .sum()
}

/// fio's batches of 32 sequential 4 KiB O_DIRECT writes between two scrapes: the counter
/// deltas must equal diskstats' and fio's.
fn check_counts_exact(dev: &BlockDev, scrape: &mut dyn FnMut() -> Scrape) {
    let cg = Cgroup::new();
    let before = scrape();
    let d0 = dev.diskstats();
    let report = Fio::sequential("security", dev, "write", SIZE, 32)
        .in_cgroup(&cg)
        .run();
    let d1 = dev.diskstats();
    let after = scrape();
    let d = d1.since(&d0);
    let ios = fio_total_ios(&report, "write");
    assert_eq!(ios, SIZE / BS, "fio wrote {ios} I/Os");
    let delta = |m: &str| writes(&after, dev, m) - writes(&before, dev, m);
    let (requests, merged, bios) = (
        delta("mergetrace_requests_total"),
        delta("mergetrace_merged_total"),
        delta("mergetrace_bios_total"),
    );
    assert_eq!(requests, d.writes, "requests vs diskstats {d:?}");
    assert_eq!(merged, d.writes_merged, "merges vs diskstats {d:?}");
    assert_eq!(bios, ios, "bios vs fio");
    assert_eq!(
        delta("mergetrace_request_bytes_total") / 512,
        d.sectors_written
    );
    assert!(
        d.writes < ios,
        "batches of 32 merge, or this compares nothing: {d:?}"
    );
    eprintln!(
        "kernel_serve_security: {}: requests {requests} = diskstats {}, merged {merged} = {}, \
         bios {bios} = fio {ios}",
        dev.name, d.writes, d.writes_merged
    );
}

/// curl's answer to GET `url` with `args`: (status code, headers and body), or `None` when
/// curl got no HTTP answer at all (a refused handshake).
fn curl(url: &str, args: &[&str]) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl is required by kernel_serve_security (scripts/setup --test installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (answer, code) = text.rsplit_once('\n')?;
    let code: u16 = code.trim().parse().ok()?;
    (out.status.success() && code != 0).then(|| (code, answer.to_string()))
}

// ---------------------------------------------------------------------------------------
// Tests

/// serve as root, plain HTTP: every thread keeps CAP_BPF and CAP_PERFMON only, NoNewPrivs 1;
/// its counts stay exact while it runs so.
#[test]
fn serve_keeps_only_what_reading_needs_and_counts_exactly() {
    require_root();
    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let server = Server::start(&lo, &[]);
    assert!(
        server.stderr().contains(
            "mergetrace: privileges dropped: kept CAP_PERFMON, CAP_BPF; no new privileges\n"
        ),
        "{}",
        server.stderr()
    );
    assert_reduced(server.pid(), KEPT, 0);
    check_counts_exact(&lo, &mut || {
        let (status, _, body) = http_get(server.addr, "/metrics");
        assert_eq!(status, 200, "{body}");
        parse(&body)
    });
    assert_reduced(server.pid(), KEPT, 0);
    let (status, stderr) = server.stop(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "{status}; stderr:\n{stderr}");
}

/// The live view drops the same way once attached, and its whole-run totals stay exact.
#[test]
fn the_live_view_keeps_only_what_reading_needs() {
    require_root();
    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let tracer = Tracer::on(&lo);
    assert_reduced(tracer.pid(), KEPT, 0);
    let d0 = lo.diskstats();
    let report = Fio::sequential("security-live", &lo, "write", SIZE, 32).run();
    let d = lo.diskstats().since(&d0);
    let out = tracer.stop();
    let total = &out.device_total(&lo)["write"];
    assert_eq!(u(total, "requests"), d.writes, "{total}");
    assert_eq!(u(total, "merged"), d.writes_merged, "{total}");
    assert_eq!(u(total, "bios"), fio_total_ios(&report, "write"), "{total}");
    assert_eq!(out.lost_events(), 0);
}

/// A web config with TLS, client certificates and basic auth.
fn web_config(user: &str, password: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
         client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n\
         http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
         basic_auth_users:\n  {user}: {}\n",
        bcrypt_hash(password)
    )
}

/// Waits until serve's stderr has a line starting with `prefix` after the first `skip`
/// such lines; returns it.
fn wait_for_line(server: &Server, prefix: &str, skip: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stderr = server.stderr();
        if let Some(line) = stderr.lines().filter(|l| l.starts_with(prefix)).nth(skip) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no line {prefix:?} within 60 s; stderr:\n{stderr}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// serve --web.config.file (TLS, client certificates, basic auth) --user nobody: only the
/// right client with the right password reads the counts, which are exact; the privileges
/// are reduced in every thread; SIGHUP reloads the file whole or not at all (the key file
/// is root's, 0600, in a 0700 directory: read again as nobody through CAP_DAC_READ_SEARCH).
#[test]
fn serve_over_tls_with_basic_auth_as_nobody() {
    require_root();
    let lo = scheduler_disk(SIZE, "mq-deadline");
    lo.set_scheduler("mq-deadline");
    lo.set_nomerges(0);
    udev_settle();
    let pki = TestPki::new();
    fs::set_permissions(
        &pki.server_key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let config = pki.path().join("web.yml");
    fs::write(&config, web_config("prometheus", "scrape me")).unwrap();
    let config_arg = config.to_str().unwrap();
    let server = Server::start(&lo, &["--web.config.file", config_arg, "--user", "nobody"]);
    assert_eq!(server.scheme, "https");
    assert!(server.stderr().contains(&format!(
        "mergetrace: web config {config_arg}: TLS 1.2–1.3, client certificates required and \
         verified, basic auth (1 user)\n"
    )));
    assert_reduced(server.pid(), KEPT | CAP_DAC_READ_SEARCH, NOBODY);

    let url = format!("https://{}/metrics", server.addr);
    let ca = pki.ca.to_str().unwrap();
    let (cert, key) = (
        pki.client_cert.to_str().unwrap(),
        pki.client_key.to_str().unwrap(),
    );
    let with_cert = ["--cacert", ca, "--cert", cert, "--key", key];
    let get = |password: Option<&str>| {
        let user = password.map(|p| format!("prometheus:{p}"));
        let mut args = with_cert.to_vec();
        if let Some(u) = &user {
            args.extend(["-u", u.as_str()]);
        }
        curl(&url, &args).unwrap_or_else(|| panic!("no HTTP answer; stderr:\n{}", server.stderr()))
    };
    for password in [None, Some("wrong")] {
        let (code, answer) = get(password);
        assert_eq!(code, 401, "{password:?}: {answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("www-authenticate: basic"), "{answer}");
        assert!(
            lower.contains("x-content-type-options: nosniff"),
            "{answer}"
        );
        assert!(!answer.contains("mergetrace_"), "{answer}");
    }
    // No client certificate, or one of another CA: no HTTP answer at all.
    for args in [
        vec!["--cacert", ca, "-u", "prometheus:scrape me"],
        vec![
            "--cacert",
            ca,
            "--cert",
            pki.stranger_cert.to_str().unwrap(),
            "--key",
            pki.stranger_key.to_str().unwrap(),
            "-u",
            "prometheus:scrape me",
        ],
    ] {
        assert_eq!(
            curl(&url, &args),
            None,
            "served without a valid certificate: {args:?}"
        );
    }
    // Plain HTTP on the TLS port: Go's 400, no data.
    let (code, answer) = curl(&format!("http://{}/metrics", server.addr), &[]).unwrap();
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer.contains("Client sent an HTTP request to an HTTPS server."),
        "{answer}"
    );

    check_counts_exact(&lo, &mut || {
        let (code, answer) = get(Some("scrape me"));
        assert_eq!(code, 200, "{answer}");
        parse(answer.split_once("\r\n\r\n").expect("headers and body").1)
    });
    assert_reduced(server.pid(), KEPT | CAP_DAC_READ_SEARCH, NOBODY);

    // A bad hash: the old file stays in force (the change may be seen before the signal).
    let reload = "mergetrace: web config ";
    fs::write(&config, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  prometheus: plain\n").unwrap();
    server.proc.signal(libc::SIGHUP);
    let line = wait_for_line(&server, &format!("{reload}{config_arg} not reloaded ("), 0);
    assert!(
        line.contains("not a bcrypt hash")
            && line.ends_with("the previous configuration stays in force"),
        "{line}"
    );
    assert_eq!(
        get(Some("scrape me")).0,
        200,
        "the old password still works"
    );
    // A good file with a new password: the old one no longer works.
    fs::write(&config, web_config("prometheus", "new password")).unwrap();
    server.proc.signal(libc::SIGHUP);
    wait_for_line(&server, &format!("{reload}{config_arg} reloaded ("), 0);
    assert_eq!(get(Some("scrape me")).0, 401);
    assert_eq!(get(Some("new password")).0, 200);

    let (status, stderr) = server.stop(libc::SIGTERM);
    assert_eq!(status.code(), Some(0), "{status}; stderr:\n{stderr}");
}

/// Each bad start is one line and exit 1, before anything is loaded (so no root, device or
/// kernel is involved: `-d` names a device that need not exist).
#[test]
fn bad_web_configs_and_users_fail_in_one_line() {
    let pki = TestPki::new();
    let file = |name: &str, text: &str| -> String {
        let path = pki.path().join(name);
        fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "-d", "nosuchdisk", "--listen", "127.0.0.1:0"];
        args.extend(extra);
        mergetrace(&args)
    };
    let malformed = file("malformed.yml", "tls_server_config: [\n  cert_file\n");
    let missing_cert = file(
        "missing.yml",
        "tls_server_config:\n  cert_file: gone.crt\n  key_file: server.key\n",
    );
    let bad_hash = file(
        "hash.yml",
        "basic_auth_users:\n  prometheus: $2y$10$short\n",
    );
    let gone = pki.path().join("nope.yml");
    let cases: [(&[&str], String); 5] = [
        (
            &["--web.config.file", &malformed],
            format!("web config {malformed}: "),
        ),
        (
            &["--web.config.file", &missing_cert],
            format!(
                "cert_file {}: cannot read it",
                pki.path().join("gone.crt").display()
            ),
        ),
        (
            &["--web.config.file", &bad_hash],
            "the password hash of \"prometheus\" is not a bcrypt hash".into(),
        ),
        (
            &["--web.config.file", gone.to_str().unwrap()],
            "cannot read the web config".into(),
        ),
        (
            &["--user", "no-such-user-here"],
            "no user \"no-such-user-here\" in /etc/passwd".into(),
        ),
    ];
    for (args, needle) in &cases {
        assert_one_line_error(&serve(args), needle);
    }
    let missing = serve(&["--web.config.file", &missing_cert]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("No such file or directory"));
    assert!(Path::new(&bad_hash).exists());
}
