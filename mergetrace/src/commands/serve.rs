//! `mergetrace serve`: the fleet view. Counts in the kernel like the live view and, on every
//! scrape of `/metrics`, renders the running totals through [`crate::view::prometheus`]'s model
//! (bounded, monotonic). Binds before loading the programs; drops the privileges it no longer
//! needs once they are attached ([`kernel::least_privilege`]); serves over TLS with basic auth
//! when a `--web.config.file` says so ([`crate::web`]); stops cleanly on SIGTERM/SIGINT.
use std::{
    collections::HashSet,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use mergetrace_common::Modes;
use prometheus_client::encoding::prometheus_text;

use super::follow::Follow;
use crate::{
    cli::{
        args::{NamesArg, SubtreeArg, TraceArgs},
        stop::Stop,
        targets::Targets,
    },
    kernel::{self, least_privilege, monotonic_ns},
    model::snapshot::{self, SnapshotKind},
    sys::{cgroups::Cgroups, device::Device},
    view::{banner, prometheus::Model},
    web::{auth, config::WebConfig, listener::TlsListener, Web},
};

/// How long in-flight responses may take after SIGTERM/SIGINT before the server closes them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Address to serve /metrics on. Loopback by default; any other address is an explicit
    /// choice (a warning says so), e.g. 0.0.0.0:9435 for a Prometheus on another host.
    #[arg(long, default_value = "127.0.0.1:9435", value_name = "ADDR")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub subtree: SubtreeArg,
    #[command(flatten)]
    pub names: NamesArg,
    /// At most this many distinct cgroup labels; cgroups seen while they are taken are
    /// summed into cgroup="(other)". A label is kept while its cgroup path is counted, and
    /// recycled --label-stale-after after the last one was removed and reclaimed.
    #[arg(long, default_value_t = 500, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_cgroups: u32,
    /// Recycle the label of a cgroup path that has not been counted for this long (its
    /// cgroups removed and reclaimed): its series end, what they counted moves to
    /// cgroup="(removed)", and the label is free for a cgroup that exists.
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = crate::cli::args::parse_duration)]
    pub label_stale_after: Duration,
    /// Read the kernel counters this often between scrapes too: gives new cgroups their
    /// counter slot and series, and reclaims removed ones, however rarely Prometheus scrapes.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::cli::args::parse_duration)]
    pub read_every: Duration,
    /// TLS, client certificates, basic auth (bcrypt hashes) and response headers from a
    /// Prometheus exporter-toolkit web configuration file (YAML, as node_exporter's). Checked
    /// at start; read again on SIGHUP and when it or a file it names changes (a file that does
    /// not check keeps the previous one in force).
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Once the programs are attached, run as this user (NAME, UID, NAME:GROUP or UID:GID),
    /// keeping CAP_DAC_READ_SEARCH besides the capabilities serving needs.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
}

/// How often the cgroup births and removals are read between reads of the counters, so
/// that their ring cannot fill.
const CGROUP_POLL: Duration = Duration::from_millis(250);

struct Exporter {
    session: kernel::Session,
    /// Cgroup names: learnt at birth, kept while the cgroup is counted (see `learn_names`).
    names: Cgroups,
    devices: Vec<Device>,
    start_ns: u64,
    fentry: bool,
    meter_units: Vec<u64>,
    subtree: Option<String>,
    model: Model,
    /// io.cost's model of the traced disks it was on for at any time.
    iocost: std::collections::BTreeMap<u32, crate::model::iocost::Model>,
    /// The disks' settings as last seen (meters switched on or off while serving).
    follow: Follow,
}

impl Exporter {
    /// Takes the cgroup births and removals the programs reported into the name table.
    fn learn_names(&mut self) {
        kernel::cgroup_events::apply(self.session.take_cgroup_changes(), &mut self.names);
    }

    /// A scrape: the counters read into the model, rendered.
    fn scrape(&mut self) -> Result<String> {
        self.update()?;
        Ok(self.model.render())
    }

    /// Reads the kernel counters into the model: what a scrape does, and what is done every
    /// --read-every between scrapes, so that every cgroup with I/O gets its series (for
    /// --label-stale-after at least) and removed cgroups are reclaimed however rarely
    /// Prometheus scrapes.
    fn update(&mut self) -> Result<()> {
        for c in self
            .follow
            .check(&mut self.devices, &mut self.session, &self.names)
        {
            eprintln!("mergetrace: changed: {c}");
        }
        // A disk io.cost was on for keeps its model: its charges so far are priced with it.
        self.iocost.extend(self.session.iocost_models());
        let mut total = self.session.read_totals()?;
        // After the read: every cgroup counted in it was born before its I/O was counted.
        self.learn_names();
        total.start_ns = self.start_ns;
        total.end_ns = monotonic_ns();
        let opts = snapshot::Options {
            tier: &self.model.tier,
            fentry: self.fentry,
            meter_units: &self.meter_units,
            subtree: self.subtree.as_deref(),
            iocost: &self.iocost,
            wbt: &self.session.wbt,
            wants: self.session.wants,
            per_bio: self.session.per_bio,
            iolatency: &self.follow.iolatency,
            timeline: None,
        };
        let mut s = snapshot::build(
            &total,
            SnapshotKind::Total,
            &self.devices,
            &mut self.names,
            &opts,
        );
        s.unsaid.skipped_runs = self.session.skipped_runs();
        // `opts` borrows the tier string of the model: update after.
        self.model.update(&s);
        // A cgroup found gone whose removal was not reported is reclaimed all the same; the
        // names of removed cgroups no longer counted are forgotten.
        for cg in s.devices.iter().flat_map(|d| &d.cgroups) {
            if cg.gone {
                self.session.mark_removed(cg.cgroup_id);
            }
        }
        let counted: HashSet<u64> = total.counts.keys().map(|k| k.cgroup_id).collect();
        self.names.forget_removed(|id| counted.contains(&id));
        Ok(())
    }
}

type Shared = Arc<Mutex<Exporter>>;

/// Scrapes run one at a time: they hold the exporter's lock throughout, so more at once would
/// only park blocking-pool threads on it, each with an allocator arena of its own that keeps
/// what a scrape allocated (16 concurrent scrapers once grew the RSS by 2.4 MiB a round).
static SCRAPING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

async fn metrics(State(ex): State<Shared>) -> Response {
    // Never closed, so the permit always comes.
    let _turn = SCRAPING.acquire().await;
    let result = tokio::task::spawn_blocking(move || {
        let mut ex = ex.lock().unwrap_or_else(|p| p.into_inner());
        ex.scrape()
    })
    .await;
    match result {
        Ok(Ok(body)) => (
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("mergetrace: cannot read the counters: {e:#}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("mergetrace: scrape failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn index() -> &'static str {
    "mergetrace exporter: metrics at /metrics\n"
}

/// The one-line warning for an address other than loopback, if any: when clients need not
/// authenticate (a password or a verified certificate), or when their passwords would cross
/// the network in clear.
pub fn exposure_warning(addr: &SocketAddr, web: Option<&WebConfig>) -> Option<String> {
    if addr.ip().is_loopback() {
        return None;
    }
    match web {
        Some(c) if c.authenticates() && c.tls.is_none() => Some(format!(
            "mergetrace: warning: listening on {addr} without TLS: basic auth passwords cross the network in clear (add a tls_server_config to the web config)"
        )),
        Some(c) if c.authenticates() => None,
        _ => Some(format!(
            "mergetrace: warning: listening on {addr}, which is not a loopback address: anyone who can reach it can read device names and cgroup paths"
        )),
    }
}

pub async fn run(args: ServeArgs) -> Result<()> {
    // A signal during start-up stops the server cleanly too: it is then served for no time,
    // and the programs are detached as usual.
    let mut stop = Stop::on_signals()?;
    // What can be refused without the kernel is refused first.
    let web = match &args.web_config_file {
        Some(path) => Some(Arc::new(Web::load(path)?)),
        None => None,
    };
    let user = args
        .user
        .as_deref()
        .map(least_privilege::User::resolve)
        .transpose()?;
    let targets = Targets::resolve(&args.trace, &args.subtree, &args.names)?;
    // Bind before loading the programs: a taken port fails at once, not after verification.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let config = web.as_ref().map(|w| w.current());
    if let Some(w) = exposure_warning(&addr, config.as_deref()) {
        eprintln!("{w}");
    }
    let session = kernel::Session::start(
        &targets.devices,
        &kernel::Options {
            every_disk: targets.selection.follows_new_disks(),
            ..args.trace.kernel_options(Modes::COUNTING, 4096, false)
        },
    )?;
    let start_ns = monotonic_ns();
    let iolatency = crate::sys::iolatency::targets_on(&targets.devices, &targets.cgroups);
    for line in banner::lines(&targets.devices, &session, &targets.cgroups, &iolatency) {
        eprintln!("mergetrace: {line}");
    }
    // Attached, the maps open: from here on only what reading them needs.
    let dropped = least_privilege::drop_after_attach(user)?;
    eprintln!("mergetrace: {dropped}");
    let tier = session.tier.kind;
    let iocost = session.iocost_models();
    let follow = Follow::new(&targets.devices, targets.selection.clone(), iolatency);
    let exporter: Shared = Arc::new(Mutex::new(Exporter {
        session,
        names: targets.cgroups,
        devices: targets.devices,
        start_ns,
        fentry: tier == kernel::TierKind::Fentry,
        meter_units: args.trace.meter_unit.clone(),
        subtree: targets.subtree,
        model: Model::with_staleness(
            args.max_cgroups as usize,
            tier.name(),
            args.label_stale_after,
        ),
        iocost,
        follow,
    }));
    let reports = exporter
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .session
        .report_waker()?;
    let poller = spawn_poller(exporter.clone(), args.read_every, reports);
    let mut app = Router::new()
        .route("/metrics", get(metrics))
        .route("/", get(index))
        .with_state(exporter.clone());
    let mut reloader = None;
    if let Some(web) = &web {
        eprintln!(
            "mergetrace: web config {}: {}",
            web.path().display(),
            web.current().summary()
        );
        app = app.layer(axum::middleware::from_fn_with_state(
            auth::Guard::new(web.clone()),
            auth::guard,
        ));
        reloader = Some(web.spawn_reloader()?);
    }

    let stopping = Arc::new(tokio::sync::Notify::new());
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            stop.wait().await;
            stopping.notify_one();
        }
    };
    // TLS is on or off for the life of the process: a reload cannot change it.
    let tls = web.filter(|w| w.current().tls.is_some());
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("mergetrace: serving {scheme}://{addr}/metrics");
    match tls {
        Some(web) => {
            let listener = TlsListener::new(listener, web);
            serve_until_stopped(listener, app, shutdown, &stopping).await?
        }
        None => serve_until_stopped(listener, app, shutdown, &stopping).await?,
    }
    // No scrape runs any more (or it finishes with the lock held): detach the programs.
    poller.abort();
    if let Some(r) = reloader {
        r.abort();
    }
    let mut ex = exporter.lock().unwrap_or_else(|p| p.into_inner());
    ex.session.detach();
    super::warn_skipped_runs(&ex.session.unsaid()?);
    eprintln!("mergetrace: stopped; programs detached");
    Ok(())
}

/// Serves until `shutdown` resolves, then lets in-flight responses finish for at most
/// [`SHUTDOWN_GRACE`] after the signal (`stopping`).
async fn serve_until_stopped<L>(
    listener: L,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    stopping: &tokio::sync::Notify,
) -> Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let server = std::future::IntoFuture::into_future(server);
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r.context("the HTTP server failed")?,
        _ = async {
            stopping.notified().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            eprintln!("mergetrace: connections still open {SHUTDOWN_GRACE:?} after the signal: closing them");
        }
    }
    Ok(())
}

/// Between scrapes: the cgroup births and removals (at once when the programs report one:
/// rules found on a disk attach the throttle-wait programs), and every `every` the counters
/// (skipped while a scrape, which does both, holds the exporter).
fn spawn_poller(
    ex: Shared,
    every: Duration,
    reports: kernel::cgroup_events::ReportWaker,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CGROUP_POLL.min(every));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_read = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = reports.wait() => {}
            }
            let ex = ex.clone();
            let since = last_read.elapsed();
            let read = tokio::task::spawn_blocking(move || {
                let Ok(mut ex) = ex.try_lock() else {
                    return false;
                };
                // Under churn the slots are freed by reads: then one every poll.
                let read =
                    since >= every || (since >= CGROUP_POLL && ex.session.slots_under_pressure());
                if read {
                    if let Err(e) = ex.update() {
                        eprintln!("mergetrace: cannot read the counters: {e:#}");
                    }
                } else {
                    ex.learn_names();
                    // New cgroups' counters into their slots (no counters read).
                    if let Err(e) = ex.session.adopt_new_keys() {
                        eprintln!("mergetrace: cannot give new cgroups their counters: {e:#}");
                    }
                }
                read
            })
            .await
            .unwrap_or(false);
            if read {
                last_read = tokio::time::Instant::now();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_quiet_anything_else_warns() {
        use crate::testing::tls::{bcrypt_hash, TestPki};
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert!(exposure_warning(&at("127.0.0.1:9435"), None).is_none());
        assert!(exposure_warning(&at("[::1]:9435"), None).is_none());
        let w = exposure_warning(&at("0.0.0.0:9435"), None).unwrap();
        assert!(w.starts_with("mergetrace: warning:") && !w.contains('\n'));
        assert!(w.contains("anyone who can reach it"), "{w}");
        assert!(exposure_warning(&at("10.1.2.3:9435"), None).is_some());
        // Clients that must authenticate read nothing by merely reaching the port; a
        // password without TLS is in clear on the network.
        let pki = TestPki::new();
        let web = |text: &str| WebConfig::parse(text, pki.path()).unwrap();
        let tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
        let users = format!("basic_auth_users:\n  p: {}\n", bcrypt_hash("x"));
        let verified = format!(
            "{tls}  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n"
        );
        assert!(
            exposure_warning(&at("10.1.2.3:9435"), Some(&web(&format!("{tls}{users}")))).is_none()
        );
        assert!(exposure_warning(&at("10.1.2.3:9435"), Some(&web(&verified))).is_none());
        let w = exposure_warning(&at("10.1.2.3:9435"), Some(&web(tls))).unwrap();
        assert!(w.contains("anyone who can reach it"), "{w}");
        let w = exposure_warning(&at("10.1.2.3:9435"), Some(&web(&users))).unwrap();
        assert!(w.contains("without TLS"), "{w}");
    }

    #[test]
    fn flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            s: ServeArgs,
        }
        let t = T::try_parse_from(["t", "-d", "loop3"]).unwrap();
        assert_eq!(t.s.listen, "127.0.0.1:9435".parse().unwrap());
        assert_eq!(t.s.max_cgroups, 500);
        assert_eq!(t.s.label_stale_after, Duration::from_secs(300));
        assert_eq!(t.s.read_every, Duration::from_secs(1));
        assert_eq!(t.s.trace.reclaim_after, Duration::from_secs(5));
        assert_eq!(t.s.trace.meter_unit, vec![256 << 10, 1 << 20]);
        let t = T::try_parse_from([
            "t",
            "-d",
            "loop3",
            "--listen",
            "[::1]:9000",
            "--max-cgroups",
            "3",
            "-c",
            "/mt",
        ])
        .unwrap();
        assert_eq!(t.s.listen.port(), 9000);
        assert_eq!(t.s.max_cgroups, 3);
        assert!(T::try_parse_from(["t", "-d", "loop3", "--max-cgroups", "0"]).is_err());
        assert!(T::try_parse_from(["t", "-d", "loop3", "--listen", "nowhere"]).is_err());
        assert!(T::try_parse_from(["t"]).is_err());
    }
}
