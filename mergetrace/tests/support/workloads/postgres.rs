//! A PostgreSQL server of its own on the scratch ext4, and pgbench.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use super::*;

/// A PostgreSQL cluster on the scratch filesystem, owned by and run as [`NOBODY`], listening
/// only on a unix socket in a temp dir (`listen_addresses=''`). Autovacuum is off and
/// wal_level minimal (either would write on its own schedule: autovacuum, and the background
/// writer's standby snapshots every 15 s); everything else is the default durability: fsync on,
/// synchronous_commit on, full_page_writes on. Dropping it stops the server (SIGQUIT, then
/// SIGKILL to the postmaster and every backend, by pid).
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    sock: tempfile::TempDir,
    server: Option<Running>,
}

impl Postgres {
    /// `initdb -N` (no fsync: the caller syncs the filesystem before its window) into
    /// `<fs>/pgdata`.
    pub fn init(fs: &Ext4) -> Postgres {
        let bin = postgres_bindir();
        let data = fs.dir("pgdata", Some(NOBODY));
        fs::set_permissions(&data, fs::Permissions::from_mode(0o700)).expect("chmod pgdata");
        let sock = scratch();
        chown(sock.path(), NOBODY);
        let mut c = cmd(
            bin.join("initdb"),
            &[
                "-N",
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "-D",
            ],
        );
        c.arg(&data);
        run(c, None, Some(NOBODY));
        Postgres {
            bin,
            data,
            sock,
            server: None,
        }
    }

    /// Starts the server (inside `cg`: its backends, WAL writer, checkpointer and background
    /// writer inherit it) and waits until it accepts connections.
    pub fn start(&mut self, cg: Option<&Cgroup>) {
        let mut c = cmd(self.bin.join("postgres"), &["-D"]);
        c.arg(&self.data)
            .args(["-c", "listen_addresses=", "-k"])
            .arg(self.sock.path())
            .args([
                "-c",
                "autovacuum=off",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_wal_size=64MB",
                "-c",
                "logging_collector=off",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                // No standby snapshot: with wal_level replica (the default) the background
                // writer logs the running transactions every 15 s (LOG_SNAPSHOT_INTERVAL_MS)
                // and the WAL writer writes and fdatasyncs it, whenever that falls — seen in
                // 6.12 between the tracer's attach and the window's first snapshot (1 write,
                // 1 flush-only write and 1 flush more in mergetrace and blktrace than in the
                // diskstats and io.stat deltas). wal_level=minimal logs none.
                "-c",
                "wal_level=minimal",
                "-c",
                "max_wal_senders=0",
            ]);
        self.server = Some(Running::start(c, cg, Some(NOBODY)));
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let mut r = cmd(self.bin.join("pg_isready"), &["-q", "-U", "postgres", "-h"]);
            r.arg(self.sock.path());
            if r.status().is_ok_and(|s| s.success()) {
                return;
            }
            let s = self.server.as_mut().unwrap();
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let out = self.server.take().unwrap().wait(Duration::from_secs(5));
                panic!(
                    "postgres exited ({st}) before accepting connections:\n{}{}",
                    out.stdout, out.stderr
                );
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within 300 s"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn client(&self, tool: &str) -> Command {
        let mut c = cmd(self.bin.join(tool), &["-U", "postgres", "-h"]);
        c.arg(self.sock.path());
        c
    }

    /// Runs SQL with psql (as nobody: the socket directory is nobody's).
    pub fn psql(&self, sql: &str, cg: Option<&Cgroup>) -> String {
        let mut c = self.client("psql");
        c.args(["-q", "-X", "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres"]);
        run(c, cg, Some(NOBODY))
    }

    /// `pgbench -n -c CLIENTS -t TX` with a one-INSERT script: each transaction a commit the
    /// server makes durable (WAL written and fdatasync'ed) before it answers.
    pub fn pgbench_inserts(&self, cg: Option<&Cgroup>, clients: u64, tx: u64) -> Did {
        let tmp = scratch();
        let script = tmp.path().join("insert.sql");
        fs::write(
            &script,
            "INSERT INTO conformance(v) VALUES ('client ' || :client_id || ' of the conformance workload');\n",
        )
        .expect("write the pgbench script");
        let mut c = self.client("pgbench");
        c.args([
            "-n",
            "-c",
            &clients.to_string(),
            "-t",
            &tx.to_string(),
            "-f",
        ])
        .arg(&script)
        .arg("postgres");
        let out = run(c, cg, Some(NOBODY));
        let done: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|r| r.split('/').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no transaction count in pgbench's output:\n{out}"));
        assert_eq!(
            done,
            clients * tx,
            "pgbench did not finish every transaction:\n{out}"
        );
        Did {
            transactions: done,
            ..Did::default()
        }
    }

    /// `pg_ctl stop -m fast` (a shutdown checkpoint: dirty buffers written and fsynced),
    /// then waits for the postmaster to exit.
    pub fn stop(&mut self, cg: Option<&Cgroup>) {
        let mut c = cmd(
            self.bin.join("pg_ctl"),
            &["stop", "-m", "fast", "-t", "300", "-D"],
        );
        c.arg(&self.data);
        run(c, cg, Some(NOBODY));
        if let Some(s) = self.server.take() {
            let out = s.wait(Duration::from_secs(60));
            assert!(
                out.status.success(),
                "postgres exited with {}:\n{}",
                out.status,
                out.stderr
            );
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let pid = server.pid();
        // Backends are session leaders of their own: find them before their parent goes.
        let kids = children_of(pid);
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && server
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_none())
        {
            thread::sleep(Duration::from_millis(50));
        }
        for k in kids {
            unsafe {
                libc::kill(k as libc::pid_t, libc::SIGKILL);
            }
        }
        server.kill();
    }
}
