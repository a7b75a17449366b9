//! Struct offsets and enum values the programs read, from the running kernel's BTF, with the
//! layout drift between 5.10 and 6.18 resolved here (the programs branch on flags, never on a
//! kernel version).
use anyhow::{ensure, Context, Result};
use mergetrace_common::{KernelOffsets, NONE};

use super::{kfuncs, Btf, Kfuncs};

/// A [`KernelOffsets`] literal: each `"kernel_struct" { field: "member.path", ... }` group
/// sets its fields to those members' offsets (failing on the first missing one), and the
/// fields after the groups are given as in any struct literal. A macro so that the compiler
/// still insists on every field.
macro_rules! kernel_offsets {
    ($btf:expr; $($s:literal { $($field:ident: $m:literal),+ $(,)? })+ ; $($rest:tt)*) => {
        KernelOffsets {
            $($($field: $btf.member_offset($s, $m)?,)+)+
            $($rest)*
        }
    };
}

/// Resolves every offset the programs read. Fails with the first missing struct or member,
/// named, so a kernel we cannot read is refused instead of traced wrongly. Each layout that
/// differs between kernels is resolved in its own function below. `kfuncs`: what the
/// programs may call on this kernel (and the object is linked for).
pub fn resolve_offsets(btf: &Btf, kfuncs: &Kfuncs) -> Result<KernelOffsets> {
    let off = |s: &str, m: &str| btf.member_offset(s, m);
    let (bps_bit, remainders_charged) = throttled_flag(btf)?;
    let pd_count = btf
        .array_len("blkcg_gq", "pd")
        .context("blkcg_gq.pd is not an array in this kernel's BTF")?;
    let (iops_rules, bps_rules) = throttle_rules(btf)?;
    let (bio_bi_bdev, bdev_bd_disk, bio_disk_direct) = bio_disk(btf)?;
    let (rq_rq_disk, q_disk) = request_disk(btf)?;
    let (plug_candidate, plug_list_head, rq_queuelist) = plug_list(btf)?;
    let req_flush_mask =
        (1 << flag_bit(btf, "__REQ_PREFLUSH")?) | (1 << flag_bit(btf, "__REQ_FUA")?);
    let req_sync_idle_mask =
        (1 << flag_bit(btf, "__REQ_SYNC")?) | (1 << flag_bit(btf, "__REQ_IDLE")?);
    let blkcg_css_cgroup = off("blkcg", "css")? + off("cgroup_subsys_state", "cgroup")?;
    // The members read the same way on every kernel, by kernel struct.
    Ok(kernel_offsets! { btf;
        "bio" {
            bio_bi_opf: "bi_opf", bio_bi_blkg: "bi_blkg", bio_bi_flags: "bi_flags",
            bio_bi_sector: "bi_iter.bi_sector", bio_bi_size: "bi_iter.bi_size",
            bio_bi_private: "bi_private", bio_bi_next: "bi_next",
        }
        "gendisk" { disk_major: "major", disk_first_minor: "first_minor", disk_queue: "queue" }
        "blkcg_gq" { blkg_blkcg: "blkcg", blkg_pd: "pd", blkg_q: "q" }
        "cgroup" { cgroup_kn: "kn", cgroup_root: "root" }
        "kernfs_node" { kn_id: "id" }
        "cgroup_root" { root_hierarchy_id: "hierarchy_id" }
        "request" {
            rq_q: "q", rq_cmd_flags: "cmd_flags", rq_data_len: "__data_len",
            rq_sector: "__sector", rq_bio: "bio", rq_state: "state",
            rq_start_time_ns: "start_time_ns", rq_tag: "tag",
            rq_internal_tag: "internal_tag", rq_mq_hctx: "mq_hctx",
        }
        "blk_mq_hw_ctx" { hctx_queue_num: "queue_num" }
        "work_struct" { work_func: "func" }
        "request_queue" {
            q_td: "td", q_elevator: "elevator",
            q_max_discard_segments: "limits.max_discard_segments",
        }
        "throtl_grp" { tg_td: "td" }
        "throtl_data" { td_dispatch_work: "dispatch_work", td_queue: "queue" }
        "task_struct" { task_plug: "plug" }
        "elevator_queue" { elv_type: "type" }
        "elevator_type" { elv_type_name: "elevator_name" };
        // Resolved above: what differs between kernels, and what is more than one member.
        ready: 1,
        bio_bi_bdev,
        bdev_bd_disk,
        blkcg_css_cgroup,
        q_disk,
        tg_has_rules_iops: iops_rules,
        tg_has_rules_bps: bps_rules,
        bio_bps_throttled_bit: bps_bit,
        blkg_pd_count: pd_count,
        req_flush_mask,
        req_sync_idle_mask,
        plug_candidate,
        elv_name_is_pointer: btf.array_len("elevator_type", "elevator_name").is_err() as u32,
        bio_disk_direct,
        rq_rq_disk,
        plug_list_head,
        rq_queuelist,
        remainders_charged,
        // The helper list of this kernel, in BTF (5.11+ has it).
        current_task_btf: btf.enum_value("BPF_FUNC_get_current_task_btf").is_some() as u32,
        throtl_grp_btf_id: kfuncs::throtl_grp_btf_id(btf, kfuncs),
    })
}

/// 6.0+ charges a split remainder again and marks a bio whose bytes were charged
/// (BIO_BPS_THROTTLED); before, a bio that passed blk-throttle once (BIO_THROTTLED) was never
/// throttled again, remainders included. (the BIO_BPS_THROTTLED bit or NONE, remainders charged)
fn throttled_flag(btf: &Btf) -> Result<(u32, u32)> {
    match btf.enum_value("BIO_BPS_THROTTLED") {
        Some(bit) => Ok((
            u32::try_from(bit).context("BIO_BPS_THROTTLED out of range")?,
            1,
        )),
        None => {
            btf.enum_value("BIO_THROTTLED").context(
                "neither BIO_BPS_THROTTLED (6.0+) nor BIO_THROTTLED is in this kernel's BTF",
            )?;
            Ok((NONE, 0))
        }
    }
}

/// Rules per direction and kind (6.x), or per direction only (`has_rules[2]`, up to 5.x: then
/// an iops and a bytes rule come together). (iops rules, bytes rules)
fn throttle_rules(btf: &Btf) -> Result<(u32, u32)> {
    let off = |m: &str| btf.member_offset("throtl_grp", m);
    let (iops, bps) = match (off("has_rules_iops"), off("has_rules_bps")) {
        (Ok(i), Ok(b)) => (i, b),
        _ => {
            let both = off("has_rules")
                .context("throtl_grp has neither has_rules_iops/has_rules_bps nor has_rules")?;
            (both, both)
        }
    };
    // The programs read both rule arrays (bool[2] each) in one 8-byte read.
    ensure!(
        iops.abs_diff(bps) <= 6,
        "throtl_grp.has_rules_iops and has_rules_bps are {} bytes apart: mergetrace reads them \
         as one",
        iops.abs_diff(bps)
    );
    Ok((iops, bps))
}

/// A bio's disk: bi_bdev->bd_disk (5.12+) or bi_disk. (bi_bdev or bi_disk, bd_disk or NONE,
/// 1 when the bio points at the disk itself)
fn bio_disk(btf: &Btf) -> Result<(u32, u32, u32)> {
    let off = |s: &str, m: &str| btf.member_offset(s, m);
    Ok(match off("bio", "bi_bdev") {
        Ok(o) => (o, off("block_device", "bd_disk")?, 0),
        Err(_) => (
            off("bio", "bi_disk").context("struct bio has neither bi_bdev (5.12+) nor bi_disk")?,
            NONE,
            1,
        ),
    })
}

/// A request's disk: rq->q->disk (5.16+) or rq->rq_disk. (rq_disk or NONE, q->disk or NONE)
fn request_disk(btf: &Btf) -> Result<(u32, u32)> {
    let rq_rq_disk = btf.member_offset("request", "rq_disk").unwrap_or(NONE);
    let q_disk = btf.member_offset("request_queue", "disk").unwrap_or(NONE);
    ensure!(
        rq_rq_disk != NONE || q_disk != NONE,
        "neither request.rq_disk nor request_queue.disk is in this kernel's BTF"
    );
    Ok((rq_rq_disk, q_disk))
}

/// The request a plug merge tries first: up to 6.12 the head of `struct request *mq_list`
/// (newest first), from 6.13 the tail of `struct rq_list mq_list`; up to 5.15 the plug is a
/// `struct list_head`, walked from its newest entry (`prev`). (where the candidate is, 1 for a
/// list_head, request.queuelist for a list_head)
fn plug_list(btf: &Btf) -> Result<(u32, u32, u32)> {
    let off = |s: &str, m: &str| btf.member_offset(s, m);
    Ok(if let Ok(tail) = off("blk_plug", "mq_list.tail") {
        (tail, 0, 0)
    } else if let Ok(prev) = off("blk_plug", "mq_list.prev") {
        (prev, 1, off("request", "queuelist")?)
    } else {
        (off("blk_plug", "mq_list")?, 0, 0)
    })
}

/// The bit of a `req_flag_bits` value in a 32-bit blk_opf_t.
fn flag_bit(btf: &Btf, name: &str) -> Result<u32> {
    let bit = btf
        .enum_value(name)
        .with_context(|| format!("enum value {name} is not in this kernel's BTF"))?;
    u32::try_from(bit)
        .ok()
        .filter(|b| *b < 32)
        .with_context(|| format!("{name} = {bit} is not a bit of a 32-bit blk_opf_t"))
}
