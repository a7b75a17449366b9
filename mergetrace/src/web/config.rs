//! The exporter-toolkit's web configuration file (`--web.config.file`): the YAML that every
//! Prometheus exporter on a node can share. Its sections: `tls_server_config` (see
//! [`super::tls_config`]), `http_server_config`, `basic_auth_users` and `rate_limit`.
//!
//! The file is read and checked whole, as the toolkit's own `--web.config.file` check does and
//! more: a field the toolkit does not know, a certificate or key that cannot be read or does not
//! parse, a bcrypt hash that is not one, each is one error naming the field and the fix, so that
//! a file that would fail at the first scrape fails at start (or, on a reload, keeps the
//! previous file in force).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::tls_config::{Tls, TlsSpec};

/// The file as written. Unknown fields are refused (the toolkit reads it strictly too).
#[derive(Deserialize, Default, Debug)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of tls_server_config, http_server_config, basic_auth_users, rate_limit"
)]
struct Spec {
    #[serde(default)]
    tls_server_config: Option<TlsSpec>,
    #[serde(default)]
    http_server_config: Option<HttpSpec>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    rate_limit: Option<RateLimitSpec>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, expecting = "a mapping of http2, headers")]
struct HttpSpec {
    /// Accepted for the file's sake: mergetrace answers HTTP/1.1 only (ALPN `http/1.1`), which
    /// every Prometheus speaks.
    #[serde(default)]
    #[allow(dead_code)]
    http2: Option<bool>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, expecting = "a mapping of interval, burst")]
struct RateLimitSpec {
    #[serde(default)]
    interval: Option<String>,
    #[serde(default)]
    burst: Option<u32>,
}

/// The headers `http_server_config.headers` may set, and the values allowed where the toolkit
/// restricts them (none listed: any value).
const SETTABLE_HEADERS: &[(&str, &[&str])] = &[
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// The lowest and highest bcrypt cost (Go's bcrypt and the bcrypt crate agree).
const BCRYPT_COSTS: std::ops::RangeInclusive<u32> = 4..=31;

/// A web configuration, checked: what serving needs at every connection and request.
#[derive(Debug)]
pub struct WebConfig {
    /// TLS, when `tls_server_config` names a certificate; plain HTTP otherwise.
    pub tls: Option<Tls>,
    /// User name → bcrypt hash (each parsed); empty: no basic authentication.
    pub users: BTreeMap<String, String>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Requests beyond it get 429.
    pub rate_limit: Option<RateLimit>,
    /// The file and every file it names: a change to any of them is a reason to reload.
    pub files: Vec<PathBuf>,
}

impl WebConfig {
    /// Reads and checks the file at `path`. Relative file names in it are relative to its
    /// directory, as the toolkit reads them.
    pub fn load(path: &Path) -> Result<WebConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow!(
                "cannot read the web config {}: {e} (give --web.config.file a readable YAML file)",
                path.display()
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut config = WebConfig::parse(&text, dir)
            .with_context(|| format!("web config {}", path.display()))?;
        config.files.insert(0, path.to_path_buf());
        Ok(config)
    }

    /// Checks the file's text; `dir` is where its relative file names start.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig> {
        // An empty file (or one of comments only) is a valid config: plain HTTP, no auth.
        let spec: Spec = if text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            Spec::default()
        } else {
            serde_norway::from_str(text).map_err(|e| {
                anyhow!("{e} (the format is the Prometheus exporter-toolkit's web configuration)")
            })?
        };
        let mut files = Vec::new();
        let tls = match spec.tls_server_config {
            Some(t) => Tls::from_spec(t, dir, &mut files).context("tls_server_config")?,
            None => None,
        };
        let users = check_users(spec.basic_auth_users.unwrap_or_default())?;
        let headers = check_headers(
            spec.http_server_config
                .and_then(|h| h.headers)
                .unwrap_or_default(),
        )?;
        let rate_limit = match spec.rate_limit {
            Some(r) => RateLimit::from_spec(r).context("rate_limit")?,
            None => None,
        };
        Ok(WebConfig {
            tls,
            users,
            headers,
            rate_limit,
            files,
        })
    }

    /// Whether a client must prove who it is (a password or a verified certificate): then
    /// listening beyond loopback exposes nothing to whoever merely reaches the port.
    pub fn authenticates(&self) -> bool {
        !self.users.is_empty() || self.tls.as_ref().is_some_and(|t| t.verifies_clients())
    }

    /// What it enforces, for the start-up line: e.g. "TLS 1.2–1.3, client certificates
    /// required and verified, basic auth (2 users)".
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        match &self.tls {
            Some(t) => parts.push(t.summary()),
            None => parts.push("plain HTTP (no tls_server_config)".to_string()),
        }
        match self.users.len() {
            0 => parts.push("no basic auth".to_string()),
            1 => parts.push("basic auth (1 user)".to_string()),
            n => parts.push(format!("basic auth ({n} users)")),
        }
        if let Some(r) = &self.rate_limit {
            parts.push(format!(
                "at most 1 request per {} (burst {})",
                humantime::format_duration(r.every),
                r.burst
            ));
        }
        parts.join(", ")
    }
}

/// Each hash must be a bcrypt hash ($2a$, $2b$, $2x$ or $2y$, cost 4 to 31): one that is not
/// would refuse its user at every request, so it is refused here.
fn check_users(users: BTreeMap<String, String>) -> Result<BTreeMap<String, String>> {
    for (user, hash) in &users {
        if user.contains(':') {
            bail!("basic_auth_users: user name {user:?} contains ':', which basic authentication cannot carry");
        }
        let parts = bcrypt::HashParts::from_str(hash).map_err(|e| {
            anyhow!(
                "basic_auth_users: the password hash of {user:?} is not a bcrypt hash ({e}): \
                 make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
            )
        })?;
        if !BCRYPT_COSTS.contains(&parts.get_cost()) {
            bail!(
                "basic_auth_users: the password hash of {user:?} has cost {}, outside bcrypt's {}..={}",
                parts.get_cost(),
                BCRYPT_COSTS.start(),
                BCRYPT_COSTS.end()
            );
        }
    }
    Ok(users)
}

fn check_headers(headers: BTreeMap<String, String>) -> Result<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::new();
    for (name, value) in headers {
        let Some((_, allowed)) = SETTABLE_HEADERS.iter().find(|(h, _)| *h == name) else {
            let names: Vec<&str> = SETTABLE_HEADERS.iter().map(|(h, _)| *h).collect();
            bail!(
                "http_server_config.headers: {name:?} cannot be set (these can: {})",
                names.join(", ")
            );
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            bail!("http_server_config.headers: {name} must be one of {allowed:?}, not {value:?}");
        }
        let value = HeaderValue::from_str(&value).map_err(|_| {
            anyhow!("http_server_config.headers: {name}: {value:?} is not a valid header value")
        })?;
        out.push((HeaderName::from_bytes(name.as_bytes())?, value));
    }
    Ok(out)
}

/// `rate_limit`: a token bucket over all requests, one token every `every`, at most `burst`
/// saved up (the toolkit's `rate.NewLimiter(rate.Every(interval), burst)`).
#[derive(Debug)]
pub struct RateLimit {
    pub every: Duration,
    pub burst: u32,
    /// Tokens saved up, and when they were counted.
    bucket: Mutex<(f64, Instant)>,
}

impl RateLimit {
    /// `None` when the interval is 0 or absent (the toolkit's "disabled").
    fn from_spec(spec: RateLimitSpec) -> Result<Option<RateLimit>> {
        let every = match spec.interval.as_deref().map(str::trim) {
            None | Some("") | Some("0") => return Ok(None),
            Some(text) => humantime::parse_duration(text).map_err(|e| {
                anyhow!("interval {text:?} is not a duration ({e}): write e.g. 1s or 500ms")
            })?,
        };
        if every.is_zero() {
            return Ok(None);
        }
        let burst = spec.burst.unwrap_or(0);
        if burst == 0 {
            bail!("burst is 0, which refuses every request: give it at least 1");
        }
        Ok(Some(RateLimit {
            every,
            burst,
            bucket: Mutex::new((burst as f64, Instant::now())),
        }))
    }

    /// Takes a token if one is there.
    pub fn allow(&self) -> bool {
        let mut bucket = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let (tokens, since) = *bucket;
        let refill = now.duration_since(since).as_secs_f64() / self.every.as_secs_f64();
        let tokens = (tokens + refill).min(self.burst as f64);
        if tokens >= 1.0 {
            *bucket = (tokens - 1.0, now);
            true
        } else {
            *bucket = (tokens, now);
            false
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
