//! mergetrace: where does your I/O meter sit — before or after merging?
//!
//! The data path, in the order the modules are used:
//!
//! - [`kernel`]: the probes as user space sees them — hooks by kernel version, BTF, loading
//!   and attaching, the event ring;
//! - [`sys`]: what the system says — devices, cgroups, `/proc/diskstats`, queue settings;
//! - [`model`]: counts → windows (the aggregator, the same rule as the kernel's), named
//!   per-cgroup snapshots, limits in force, meters and the verdict;
//! - [`capture`]: the capture file format; [`offline`]: a capture read back (loading, names,
//!   request lineage, distributions);
//! - [`view`]: how results are shown — terminal UI, text, NDJSON, HTML, Prometheus, exports;
//! - [`web`]: `serve`'s HTTP hardened as the Prometheus exporter-toolkit's: TLS, basic auth
//!   and headers from a `--web.config.file`, reloaded on SIGHUP;
//! - [`commands`]: one module per subcommand, built from the above; [`cli`]: the flags they
//!   share; [`fmt`]: how numbers read to people. The binary (main.rs) only parses and
//!   dispatches.
pub mod capture;
pub mod cli;
pub mod commands;
pub mod fmt;
pub mod kernel;
pub mod model;
pub mod offline;
pub mod sys;
#[cfg(test)]
mod testing;
pub mod view;
pub mod web;
