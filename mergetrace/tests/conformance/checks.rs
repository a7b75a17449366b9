//! Collected checks: every relation that failed for one workload, reported together.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::blktrace::{self};

/// Every relation that failed for one workload, reported together at the end.
pub(crate) struct Checks {
    pub(crate) ctx: String,
    pub(crate) failures: BTreeSet<String>,
    pub(crate) missing: BTreeSet<String>,
}

impl Checks {
    pub(crate) fn new(ctx: &str) -> Checks {
        Checks {
            ctx: ctx.to_string(),
            failures: BTreeSet::new(),
            missing: BTreeSet::new(),
        }
    }

    pub(crate) fn fail(&mut self, msg: String) {
        self.failures.insert(msg);
    }

    pub(crate) fn eq(&mut self, what: &str, left: u64, right: u64) {
        if left != right {
            self.fail(format!("{what}: {left} != {right}"));
        }
    }

    pub(crate) fn le(&mut self, what: &str, left: u64, right: u64) {
        if left > right {
            self.fail(format!("{what}: {left} > {right}"));
        }
    }

    /// `v[field]`, or 0 and a "missing field" failure.
    pub(crate) fn get(&mut self, v: &Value, field: &str) -> u64 {
        match v[field].as_u64() {
            Some(n) => n,
            None => {
                self.missing.insert(field.to_string());
                0
            }
        }
    }

    pub(crate) fn finish(self) {
        let mut all: Vec<String> = self
            .missing
            .iter()
            .map(|f| {
                format!("field `{f}` missing from the JSON (counted as 0 in the relations below)")
            })
            .collect();
        all.extend(self.failures);
        if !all.is_empty() {
            panic!(
                "{}: {} failed check(s):\n  {}",
                self.ctx,
                all.len(),
                all.join("\n  ")
            );
        }
    }
}

pub(crate) fn dir_of(name: &str) -> blktrace::Dir {
    match name {
        "read" => blktrace::Dir::Read,
        "write" => blktrace::Dir::Write,
        "discard" => blktrace::Dir::Discard,
        _ => blktrace::Dir::Flush,
    }
}
