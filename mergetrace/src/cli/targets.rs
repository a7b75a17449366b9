//! What a counting run (live, serve) traces, resolved from its flags before anything is loaded:
//! a device or cgroup that does not exist fails the command at once.
use anyhow::Result;

use super::args::{NamesArg, SubtreeArg, TraceArgs};
use crate::sys::{
    cgroups::Cgroups,
    device::{Device, Selection},
};

/// The traced disks, the cgroup names and the `-c` subtree (hierarchy-relative) if any.
pub struct Targets {
    pub devices: Vec<Device>,
    /// Which disks that appear during the run are traced.
    pub selection: Selection,
    pub cgroups: Cgroups,
    pub subtree: Option<String>,
}

impl Targets {
    pub fn resolve(trace: &TraceArgs, subtree: &SubtreeArg, names: &NamesArg) -> Result<Targets> {
        let (devices, selection) = Selection::resolve(&trace.devices, trace.all_disks)?;
        let mut cgroups = Cgroups::discover()?;
        if names.no_local_names {
            cgroups = cgroups.without_local_names();
        }
        let subtree = subtree
            .cgroup
            .as_deref()
            .map(|c| cgroups.normalize(c))
            .transpose()?;
        Ok(Targets {
            devices,
            selection,
            cgroups,
            subtree,
        })
    }
}
