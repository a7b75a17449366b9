//! Cgroup births and removals in the traced hierarchy, with the path the tracepoint carries:
//! user space names a cgroup that lived a few milliseconds (it may be gone before any scan
//! sees it), and reclaims the counters of removed cgroups (`kernel::slots` in user space).
use aya_ebpf::{
    helpers::bpf_probe_read_kernel_str_bytes, macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use mergetrace_common::{CgroupEvent, CGROUP_MKDIR, CGROUP_RMDIR, LOST_CGROUP_NAMES};

use crate::{
    emit::count_lost,
    maps::{frozen, off, CGROUP_EVENTS},
    read::{offsets_ready, read},
};

#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> u32 {
    report(&ctx, CGROUP_MKDIR);
    0
}

#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: BtfTracePointContext) -> u32 {
    report(&ctx, CGROUP_RMDIR);
    0
}

/// `(struct cgroup *cgrp, const char *path)`: sends the cgroup's id and path when it is in
/// the hierarchy user space asked for (`MODES.cgroup_hierarchy`).
#[inline(always)]
fn report(ctx: &BtfTracePointContext, what: u32) {
    let want = frozen!(MODES.cgroup_hierarchy);
    // Not behind the gate: its ring exists from the load, and a cgroup born while the other
    // programs attach is named only here if it is gone before user space's next scan.
    if want == 0 || !offsets_ready() {
        return;
    }
    let cgrp: u64 = ctx.arg(0);
    let root: u64 = read(cgrp, off!(cgroup_root));
    let hierarchy: i32 = read(root, off!(root_hierarchy_id));
    if (hierarchy as u32).wrapping_add(1) != want {
        return;
    }
    let Some(mut entry) = CGROUP_EVENTS.reserve::<CgroupEvent>(0) else {
        count_lost(LOST_CGROUP_NAMES);
        return;
    };
    let ev = entry.as_mut_ptr();
    let kn: u64 = read(cgrp, off!(cgroup_kn));
    let id: u64 = read(kn, off!(kn_id));
    let path: u64 = ctx.arg(1);
    unsafe {
        (*ev).id = id;
        (*ev).what = what;
        (*ev).len = match bpf_probe_read_kernel_str_bytes(path as *const u8, &mut (*ev).path) {
            Ok(s) => s.len() as u32,
            Err(_) => 0,
        };
    }
    entry.submit(0);
}
