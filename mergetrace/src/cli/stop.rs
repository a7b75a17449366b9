//! What ends a run: SIGINT (Ctrl-C), SIGTERM, or the `--duration` deadline. The signal
//! handlers are installed before anything is attached, so a signal during start-up stops the
//! run cleanly too.
use std::time::Duration;

use anyhow::Result;
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    time::Instant,
};

pub struct Stop {
    sigint: Signal,
    sigterm: Signal,
    deadline: Option<Instant>,
}

impl Stop {
    /// Catches SIGINT and SIGTERM from now on.
    pub fn on_signals() -> Result<Stop> {
        Ok(Stop {
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
            deadline: None,
        })
    }

    /// Also stop this long from now, if a duration is given.
    pub fn after(&mut self, duration: Option<Duration>) {
        self.deadline = duration.map(|d| Instant::now() + d);
    }

    /// Resolves once the run should end. Cancel-safe: a `select!` may drop it and call again.
    pub async fn wait(&mut self) {
        let deadline = self.deadline;
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.sigint.recv() => {}
            _ = self.sigterm.recv() => {}
            _ = until_deadline => {}
        }
    }
}
