//! Everything that differs between kernel versions, in one place: struct offsets and enum
//! values read from BTF, kernel addresses read from kallsyms, and which hooks exist. The eBPF
//! programs take what this module resolves; nothing about one kernel's layout is compiled in.
//!
//! Which hook is used on which kernel, tier and program: [`hooks::HOOKS`] (docs/hooks.md is
//! its rendering; on each kernel `mergetrace check`'s `hooks` section checks it). Addresses:
//! [`kallsyms`].
pub mod hooks;
pub mod kallsyms;

use anyhow::{Context, Result};
use mergetrace_common::KernelOffsets;

use super::btf::Btf;
pub use hooks::{hook_status, parse_release, HookStatus, HOOKS};
pub use kallsyms::{resolve_symbols, Kallsyms};

/// Resolves every offset the programs read. Fails with the first missing struct or member,
/// named, so a kernel we cannot read is refused instead of traced wrongly.
pub fn resolve_offsets(btf: &Btf) -> Result<KernelOffsets> {
    let off = |s: &str, m: &str| btf.member_offset(s, m);
    let bps_bit = btf
        .enum_value("BIO_BPS_THROTTLED")
        .context("enum value BIO_BPS_THROTTLED is not in this kernel's BTF")?;
    let pd_count = btf
        .array_len("blkcg_gq", "pd")
        .context("blkcg_gq.pd is not an array in this kernel's BTF")?;
    let flag_bit = |name: &str| -> Result<u32> {
        let bit = btf
            .enum_value(name)
            .with_context(|| format!("enum value {name} is not in this kernel's BTF"))?;
        u32::try_from(bit)
            .ok()
            .filter(|b| *b < 32)
            .with_context(|| format!("{name} = {bit} is not a bit of a 32-bit blk_opf_t"))
    };
    let req_flush_mask = (1 << flag_bit("__REQ_PREFLUSH")?) | (1 << flag_bit("__REQ_FUA")?);
    Ok(KernelOffsets {
        ready: 1,
        bio_bi_opf: off("bio", "bi_opf")?,
        bio_bi_bdev: off("bio", "bi_bdev")?,
        bio_bi_blkg: off("bio", "bi_blkg")?,
        bio_bi_flags: off("bio", "bi_flags")?,
        bio_bi_sector: off("bio", "bi_iter.bi_sector")?,
        bio_bi_size: off("bio", "bi_iter.bi_size")?,
        bio_bi_private: off("bio", "bi_private")?,
        bio_bi_next: off("bio", "bi_next")?,
        bdev_bd_disk: off("block_device", "bd_disk")?,
        disk_major: off("gendisk", "major")?,
        disk_first_minor: off("gendisk", "first_minor")?,
        blkg_blkcg: off("blkcg_gq", "blkcg")?,
        blkcg_css_cgroup: off("blkcg", "css")? + off("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: off("cgroup", "kn")?,
        kn_id: off("kernfs_node", "id")?,
        rq_q: off("request", "q")?,
        rq_cmd_flags: off("request", "cmd_flags")?,
        rq_data_len: off("request", "__data_len")?,
        rq_sector: off("request", "__sector")?,
        rq_bio: off("request", "bio")?,
        q_disk: off("request_queue", "disk")?,
        work_func: off("work_struct", "func")?,
        blkg_pd: off("blkcg_gq", "pd")?,
        tg_has_rules_iops: off("throtl_grp", "has_rules_iops")?,
        tg_has_rules_bps: off("throtl_grp", "has_rules_bps")?,
        bio_bps_throttled_bit: u32::try_from(bps_bit).context("BIO_BPS_THROTTLED out of range")?,
        blkg_q: off("blkcg_gq", "q")?,
        q_td: off("request_queue", "td")?,
        tg_td: off("throtl_grp", "td")?,
        blkg_pd_count: pd_count,
        req_flush_mask,
        rq_state: off("request", "state")?,
        rq_start_time_ns: off("request", "start_time_ns")?,
    })
}
