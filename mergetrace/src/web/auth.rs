//! What every request passes before a handler, as in the exporter-toolkit: the rate limit
//! (429), the configured headers, and basic authentication against the bcrypt hashes of
//! `basic_auth_users` (401 with `WWW-Authenticate: Basic` for a missing or wrong password).
//!
//! bcrypt is slow on purpose (~70 ms at cost 10), and Prometheus sends the same credentials at
//! every scrape, so a verdict is cached under a SHA-256 of (user, hash, password): the hash
//! is computed once per password and configuration, and the password itself is never kept.
//! An unknown user is checked against a decoy hash of the same cost, so that the time of an
//! answer does not tell which user names exist. One bcrypt runs at a time.
use std::{collections::HashMap, sync::Arc, sync::Mutex};

use axum::{
    extract::{Request, State},
    http::{header, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine;

use super::{config::WebConfig, reload::Web};

/// Verdicts kept at most; past that the cache starts again (a client trying passwords can
/// only make it forget, not grow).
const CACHED_VERDICTS: usize = 1024;
/// The cost of the decoy hash: the toolkit's default, and htpasswd's in its documentation.
const DECOY_COST: u32 = 10;

/// The state of the request guard: the configuration and what basic authentication caches.
pub struct Guard {
    web: Arc<Web>,
    verdicts: Mutex<HashMap<[u8; 32], bool>>,
    decoy_hash: String,
    bcrypt_turn: tokio::sync::Mutex<()>,
}

impl Guard {
    pub fn new(web: Arc<Web>) -> Arc<Guard> {
        // Any password: its hash is only ever compared with to spend the time of a real one.
        let decoy_hash = bcrypt::hash_with_salt("mergetrace decoy", DECOY_COST, [7u8; 16])
            .map(|h| h.format_for_version(bcrypt::Version::TwoB))
            .unwrap_or_default();
        Arc::new(Guard {
            web,
            verdicts: Mutex::new(HashMap::new()),
            decoy_hash,
            bcrypt_turn: tokio::sync::Mutex::new(()),
        })
    }

    /// Whether `password` is `user`'s under `config`.
    async fn password_holds(&self, config: &WebConfig, user: &str, password: &str) -> bool {
        let (hash, known) = match config.users.get(user) {
            Some(hash) => (hash.clone(), true),
            None => (self.decoy_hash.clone(), false),
        };
        let key = verdict_key(user, &hash, password);
        let cached = self.lock_verdicts().get(&key).copied();
        let holds = match cached {
            Some(holds) => holds,
            None => {
                let _turn = self.bcrypt_turn.lock().await;
                let password = password.to_owned();
                let holds = tokio::task::spawn_blocking(move || {
                    bcrypt::verify(password, &hash).unwrap_or(false)
                })
                .await
                .unwrap_or(false);
                let mut verdicts = self.lock_verdicts();
                if verdicts.len() >= CACHED_VERDICTS {
                    verdicts.clear();
                }
                verdicts.insert(key, holds);
                holds
            }
        };
        holds && known
    }

    fn lock_verdicts(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], bool>> {
        self.verdicts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn verdict_key(user: &str, hash: &str, password: &str) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user, hash, password] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

/// The user and password of an `Authorization: Basic` header, if it has a well-formed one.
pub fn basic_credentials(request: &Request) -> Option<(String, String)> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// The middleware: rate limit, headers, then basic authentication where users are set.
pub async fn guard(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let config = guard.web.current();
    let mut response = if config.rate_limit.as_ref().is_some_and(|r| !r.allow()) {
        (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n").into_response()
    } else if config.users.is_empty() {
        next.run(request).await
    } else {
        let holds = match basic_credentials(&request) {
            Some((user, password)) => guard.password_holds(&config, &user, &password).await,
            None => false,
        };
        if holds {
            next.run(request).await
        } else {
            let mut r = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"mergetrace\""),
            );
            r
        }
    };
    for (name, value) in &config.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}
