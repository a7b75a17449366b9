//! The HTTP side of `serve`, hardened as the Prometheus exporter-toolkit hardens node_exporter
//! and its kin, from the same `--web.config.file`: the file ([`config`], its TLS section in
//! [`tls_config`]), TLS connections ([`listener`]), what each request passes (rate limit,
//! headers, basic auth: [`auth`]), and the configuration in force with its reload
//! ([`reload`]).
pub mod auth;
pub mod config;
pub mod listener;
pub mod reload;
pub mod tls_config;

pub use reload::Web;

#[cfg(test)]
mod tests;
