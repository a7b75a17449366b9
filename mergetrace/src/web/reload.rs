//! The web configuration in force, and its reload: on SIGHUP, and when the file or a file it
//! names changes (checked every few seconds; a Kubernetes Secret's update swaps the files under
//! their names, and cert-manager rotates certificates that way). The toolkit reads its file at
//! every connection; reloading on change gives the same effect without reading and parsing
//! certificates per scrape.
//!
//! The rule: a reload either takes the whole new file or nothing. A file that does not check
//! (unreadable, malformed, a missing certificate, a bad hash) leaves the previous configuration
//! in force, and one line on stderr says why; so does a file that would turn TLS on or off,
//! which the listening socket cannot change (restart for that).
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use anyhow::Result;

use super::config::WebConfig;

/// How often the files are checked for changes between SIGHUPs.
pub const CHANGE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// What identifies a file's content without reading it: its inode (a swapped file is a new
/// one), size and modification time. `None` for a file that cannot be read.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The configuration every connection and request reads, and where it came from.
pub struct Web {
    path: PathBuf,
    current: RwLock<Arc<WebConfig>>,
    /// The stamps of the files of the last file read (good or not).
    stamps: Mutex<Vec<(PathBuf, Stamp)>>,
}

impl Web {
    /// Reads and checks the file: an error here stops the command.
    pub fn load(path: &Path) -> Result<Web> {
        let config = WebConfig::load(path)?;
        let stamps = config.files.iter().map(|f| (f.clone(), stamp(f))).collect();
        Ok(Web {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(config)),
            stamps: Mutex::new(stamps),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration in force now.
    pub fn current(&self) -> Arc<WebConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a file read last time has changed since (or a file it names has come or gone).
    pub fn changed(&self) -> bool {
        let stamps = self.stamps.lock().unwrap_or_else(|p| p.into_inner());
        stamps.iter().any(|(path, was)| stamp(path) != *was)
    }

    /// Reads the file again and puts it in force if it checks; says on stderr what happened,
    /// `why` naming the reason ("SIGHUP", "the file changed"). Returns whether it took it.
    pub fn reload(&self, why: &str) -> bool {
        let path = self.path.display();
        let loaded = WebConfig::load(&self.path);
        // The files to watch from now on: those of the new file when it parsed that far, else
        // the old ones plus the config itself, so that a broken file is reported once and its
        // fix is noticed.
        let watched: Vec<PathBuf> = match &loaded {
            Ok(c) => c.files.clone(),
            Err(_) => {
                let mut files = self.current().files.clone();
                if !files.contains(&self.path) {
                    files.insert(0, self.path.clone());
                }
                files
            }
        };
        *self.stamps.lock().unwrap_or_else(|p| p.into_inner()) =
            watched.iter().map(|f| (f.clone(), stamp(f))).collect();
        let new = match loaded {
            Ok(new) => new,
            Err(e) => {
                eprintln!(
                    "mergetrace: web config {path} not reloaded ({why}): {}; the previous configuration stays in force",
                    crate::cli::error_line(&e)
                );
                return false;
            }
        };
        let was_tls = self.current().tls.is_some();
        if new.tls.is_some() != was_tls {
            eprintln!(
                "mergetrace: web config {path} not reloaded ({why}): it turns TLS {}, which needs a restart; the previous configuration stays in force",
                if was_tls { "off" } else { "on" }
            );
            return false;
        }
        let summary = new.summary();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        eprintln!("mergetrace: web config {path} reloaded ({why}): {summary}");
        true
    }

    /// Reloads on SIGHUP and on changes, until the task is aborted.
    pub fn spawn_reloader(self: &Arc<Self>) -> Result<tokio::task::JoinHandle<()>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = signal(SignalKind::hangup())?;
        let web = self.clone();
        Ok(tokio::spawn(async move {
            let mut tick = tokio::time::interval(CHANGE_CHECK_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let why = tokio::select! {
                    _ = hangup.recv() => "SIGHUP",
                    _ = tick.tick() => {
                        if !web.changed() {
                            continue;
                        }
                        "a file changed"
                    }
                };
                let web = web.clone();
                // Reading certificates and checking hashes is file and CPU work: off the
                // runtime's threads.
                let _ = tokio::task::spawn_blocking(move || web.reload(why)).await;
            }
        }))
    }
}
