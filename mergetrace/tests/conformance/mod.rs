//! The conformance harness of kernel_conformance: one workload's window measured by every
//! oracle (diskstats, blk-cgroup, blktrace, a capture) and checked against mergetrace.

mod capture;
mod cgroups;
mod checks;
mod devices;
mod relations;
mod window;

pub(crate) use self::{capture::*, cgroups::*, checks::*, devices::*, relations::*, window::*};

pub(crate) const DATA_DIRS: [&str; 3] = ["read", "write", "discard"];
pub(crate) const ALL_DIRS: [&str; 4] = ["read", "write", "discard", "flush"];
