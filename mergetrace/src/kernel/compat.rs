//! Everything that differs between kernel versions, in one place: struct offsets and enum
//! values read from BTF, kernel addresses read from kallsyms, and which hooks exist. The eBPF
//! programs take what this module resolves; nothing about one kernel's layout is compiled in.
//!
//! Which hook is used on which kernel: [`HOOKS`] (rendered in docs/hooks.md, checked by the
//! unit test `docs_hooks_md_lists_every_hook` and, on each kernel, by `mergetrace check`'s
//! `hooks` section in the kernel tests).
use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use mergetrace_common::{path, KernelOffsets, KernelSymbols, MERGE_CALLERS, NONE};

use super::btf::Btf;

/// Resolves every offset the programs read. Fails with the first missing struct or member,
/// named, so a kernel we cannot read is refused instead of traced wrongly.
pub fn resolve_offsets(btf: &Btf) -> Result<KernelOffsets> {
    let off = |s: &str, m: &str| btf.member_offset(s, m);
    // 6.0+ charges a split remainder again and marks a bio whose bytes were charged
    // (BIO_BPS_THROTTLED); before, a bio that passed blk-throttle once (BIO_THROTTLED) was
    // never throttled again, remainders included.
    let (bps_bit, remainders_charged) = match btf.enum_value("BIO_BPS_THROTTLED") {
        Some(bit) => (
            u32::try_from(bit).context("BIO_BPS_THROTTLED out of range")?,
            1,
        ),
        None => {
            btf.enum_value("BIO_THROTTLED").context(
                "neither BIO_BPS_THROTTLED (6.0+) nor BIO_THROTTLED is in this kernel's BTF",
            )?;
            (NONE, 0)
        }
    };
    let pd_count = btf
        .array_len("blkcg_gq", "pd")
        .context("blkcg_gq.pd is not an array in this kernel's BTF")?;
    // Rules per direction and kind (6.x), or per direction only (`has_rules[2]`, up to 5.x:
    // then an iops and a bytes rule come together).
    let (iops_rules, bps_rules) = match (
        off("throtl_grp", "has_rules_iops"),
        off("throtl_grp", "has_rules_bps"),
    ) {
        (Ok(i), Ok(b)) => (i, b),
        _ => {
            let both = off("throtl_grp", "has_rules")
                .context("throtl_grp has neither has_rules_iops/has_rules_bps nor has_rules")?;
            (both, both)
        }
    };
    // The programs read both rule arrays (bool[2] each) in one 8-byte read.
    ensure!(
        iops_rules.abs_diff(bps_rules) <= 6,
        "throtl_grp.has_rules_iops and has_rules_bps are {} bytes apart: mergetrace reads them \
         as one",
        iops_rules.abs_diff(bps_rules)
    );
    // A bio's disk: bi_bdev->bd_disk (5.12+) or bi_disk.
    let (bio_bi_bdev, bdev_bd_disk, bio_disk_direct) = match off("bio", "bi_bdev") {
        Ok(o) => (o, off("block_device", "bd_disk")?, 0),
        Err(_) => (
            off("bio", "bi_disk").context("struct bio has neither bi_bdev (5.12+) nor bi_disk")?,
            NONE,
            1,
        ),
    };
    // A request's disk: rq->q->disk (5.16+) or rq->rq_disk.
    let rq_rq_disk = off("request", "rq_disk").unwrap_or(NONE);
    let q_disk = off("request_queue", "disk").unwrap_or(NONE);
    ensure!(
        rq_rq_disk != NONE || q_disk != NONE,
        "neither request.rq_disk nor request_queue.disk is in this kernel's BTF"
    );
    // The request a plug merge tries first: up to 6.12 the head of `struct request *mq_list`
    // (newest first), from 6.13 the tail of `struct rq_list mq_list`; up to 5.15 the plug is a
    // `struct list_head`, walked from its newest entry (`prev`).
    let (plug_candidate, plug_list_head, rq_queuelist) =
        if let Ok(tail) = off("blk_plug", "mq_list.tail") {
            (tail, 0, 0)
        } else if let Ok(prev) = off("blk_plug", "mq_list.prev") {
            (prev, 1, off("request", "queuelist")?)
        } else {
            (off("blk_plug", "mq_list")?, 0, 0)
        };
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
        bio_bi_bdev,
        bio_bi_blkg: off("bio", "bi_blkg")?,
        bio_bi_flags: off("bio", "bi_flags")?,
        bio_bi_sector: off("bio", "bi_iter.bi_sector")?,
        bio_bi_size: off("bio", "bi_iter.bi_size")?,
        bio_bi_private: off("bio", "bi_private")?,
        bio_bi_next: off("bio", "bi_next")?,
        bdev_bd_disk,
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
        q_disk,
        work_func: off("work_struct", "func")?,
        blkg_pd: off("blkcg_gq", "pd")?,
        tg_has_rules_iops: iops_rules,
        tg_has_rules_bps: bps_rules,
        bio_bps_throttled_bit: bps_bit,
        blkg_q: off("blkcg_gq", "q")?,
        q_td: off("request_queue", "td")?,
        tg_td: off("throtl_grp", "td")?,
        blkg_pd_count: pd_count,
        req_flush_mask,
        rq_state: off("request", "state")?,
        rq_start_time_ns: off("request", "start_time_ns")?,
        task_plug: off("task_struct", "plug")?,
        plug_candidate,
        disk_queue: off("gendisk", "queue")?,
        q_elevator: off("request_queue", "elevator")?,
        elv_type: off("elevator_queue", "type")?,
        elv_type_name: off("elevator_type", "elevator_name")?,
        elv_name_is_pointer: btf.array_len("elevator_type", "elevator_name").is_err() as u32,
        bio_disk_direct,
        rq_rq_disk,
        plug_list_head,
        rq_queuelist,
        remainders_charged,
        // The helper list of this kernel, in BTF (5.11+ has it).
        current_task_btf: btf
            .enum_value("BPF_FUNC_get_current_task_btf")
            .is_some() as u32,
        _pad: 0,
    })
}

/// Which variant of a program fits the running kernel's prototype of its hook: the bio
/// tracepoints took the request queue first up to 5.10 (`block_bio_queue(q, bio)`), and
/// `blk_attempt_plug_merge` had a fourth parameter up to 5.15. A variant is the program's name
/// with a suffix (`_q`, `_4`); the eBPF object holds both, the loader attaches the one that fits.
pub fn program_variant(btf: &Btf, program: &str, hook: &str) -> String {
    let queue_first = |tp: &str| btf.tracepoint_arg(tp, "bio").is_some_and(|i| i > 0);
    match program {
        "block_bio_queue" | "block_split" | "block_bio_backmerge" | "block_bio_frontmerge"
        | "block_getrq"
            if queue_first(hook) =>
        {
            format!("{program}_q")
        }
        "plug_attempt_exit" if btf.function_arity(hook) == Some(4) => format!("{program}_4"),
        _ => program.to_string(),
    }
}

/// How a hook is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HookKind {
    /// A BTF-enabled tracepoint (`btf_trace_<name>` in BTF).
    Tracepoint,
    /// A kernel function whose address range classifies merge callers (kallsyms).
    Kallsyms,
    /// fentry/fexit on a kernel function (BTF `FUNC`), fentry tier only.
    Fentry,
    /// A struct member read through BTF (`struct.member`).
    Field,
}

/// One hook: what it is for, how it is reached, and on which kernels mergetrace expects it.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Hook {
    pub concept: &'static str,
    pub kind: HookKind,
    pub name: &'static str,
    /// First kernel (major, minor) where it is used; `until` is the last one, if any.
    pub since: (u32, u32),
    pub until: Option<(u32, u32)>,
    /// Without it the run still works; this is what is lost.
    pub optional: Option<&'static str>,
}

const fn hook(concept: &'static str, kind: HookKind, name: &'static str) -> Hook {
    Hook {
        concept,
        kind,
        name,
        since: (6, 1),
        until: None,
        optional: None,
    }
}

/// Every hook mergetrace uses, 6.1 → 6.18+. Kernel drift is expressed here and nowhere else.
pub const HOOKS: &[Hook] = &[
    hook(
        "bio passed the throttle",
        HookKind::Tracepoint,
        "block_bio_queue",
    ),
    hook("bio split", HookKind::Tracepoint, "block_split"),
    hook(
        "bio back merge",
        HookKind::Tracepoint,
        "block_bio_backmerge",
    ),
    hook(
        "bio front merge",
        HookKind::Tracepoint,
        "block_bio_frontmerge",
    ),
    hook("new request", HookKind::Tracepoint, "block_getrq"),
    hook(
        "request-request merge",
        HookKind::Tracepoint,
        "block_rq_merge",
    ),
    hook("request insert", HookKind::Tracepoint, "block_rq_insert"),
    hook("request issue", HookKind::Tracepoint, "block_rq_issue"),
    hook("request requeue", HookKind::Tracepoint, "block_rq_requeue"),
    hook(
        "request complete",
        HookKind::Tracepoint,
        "block_rq_complete",
    ),
    Hook {
        optional: Some("unplug depths (6.1/6.6 fast path emits none)"),
        ..hook("plug flush", HookKind::Tracepoint, "block_unplug")
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..hook(
            "throttle release context",
            HookKind::Tracepoint,
            "workqueue_execute_start",
        )
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..hook(
            "throttle release context",
            HookKind::Tracepoint,
            "workqueue_execute_end",
        )
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..hook(
            "throttle dispatch work",
            HookKind::Kallsyms,
            "blk_throtl_dispatch_work_fn",
        )
    },
    Hook {
        optional: Some("merges into a plug holding several queues' requests show as path \"unknown\""),
        ..hook(
            "merge path: plug",
            HookKind::Kallsyms,
            "blk_attempt_plug_merge",
        )
    },
    Hook {
        optional: Some("stack fallback: elevator merges show as path \"unknown\""),
        ..hook(
            "merge path: elevator",
            HookKind::Kallsyms,
            "blk_mq_sched_try_merge",
        )
    },
    Hook {
        optional: Some("stack fallback: software-queue merges show as path \"unknown\""),
        ..hook(
            "merge path: software queue",
            HookKind::Kallsyms,
            "blk_bio_list_merge",
        )
    },
    Hook {
        optional: Some("fentry tier: no exact throttle delay"),
        ..hook(
            "throttle charge (fentry)",
            HookKind::Fentry,
            "__blk_throtl_bio",
        )
    },
    Hook {
        optional: Some("fentry tier: no exact throttle delay"),
        ..hook(
            "throttle release (fentry)",
            HookKind::Fentry,
            "submit_bio_noacct_nocheck",
        )
    },
    Hook {
        optional: Some("fentry tier: no plug attempt counts"),
        ..hook(
            "plug merge attempt (fexit)",
            HookKind::Fentry,
            "blk_attempt_plug_merge",
        )
    },
    Hook {
        optional: Some("fentry tier: no elevator decisions"),
        ..hook("elevator decision (fexit)", HookKind::Fentry, "elv_merge")
    },
    hook(
        "requeued request issued again",
        HookKind::Field,
        "request.state",
    ),
    hook(
        "requeued request issued again",
        HookKind::Field,
        "request.start_time_ns",
    ),
    hook(
        "throttle rules",
        HookKind::Field,
        "throtl_grp.has_rules_iops",
    ),
    hook(
        "throttle rules",
        HookKind::Field,
        "throtl_grp.has_rules_bps",
    ),
    hook("merge path: plug", HookKind::Field, "task_struct.plug"),
    Hook {
        until: Some((6, 12)),
        ..hook("merge path: plug", HookKind::Field, "blk_plug.mq_list")
    },
    Hook {
        since: (6, 13),
        ..hook("merge path: plug", HookKind::Field, "blk_plug.mq_list.tail")
    },
    hook(
        "merge path: scheduler",
        HookKind::Field,
        "elevator_type.elevator_name",
    ),
    hook("bio's cgroup", HookKind::Field, "bio.bi_blkg"),
    hook("request's disk", HookKind::Field, "request_queue.disk"),
];

/// A hook as found (or not) on the running kernel.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HookStatus {
    #[serde(flatten)]
    pub hook: Hook,
    /// Whether mergetrace expects it on this kernel version.
    pub expected: bool,
    pub present: bool,
}

/// `uname -r` → (major, minor).
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Every hook of [`HOOKS`] checked against this kernel's BTF and kallsyms.
pub fn hook_status(btf: &Btf, kallsyms: &Kallsyms, version: (u32, u32)) -> Vec<HookStatus> {
    HOOKS
        .iter()
        .map(|h| {
            let present = match h.kind {
                HookKind::Tracepoint => btf.has_tracepoint(h.name),
                HookKind::Kallsyms => kallsyms.address(h.name).is_some(),
                HookKind::Fentry => btf.has_function(h.name),
                HookKind::Field => {
                    let (st, m) = h.name.split_once('.').unwrap_or((h.name, ""));
                    btf.member_offset(st, m).is_ok()
                }
            };
            let expected = version >= h.since && h.until.is_none_or(|u| version <= u);
            HookStatus {
                hook: *h,
                expected,
                present,
            }
        })
        .collect()
}

/// `/proc/kallsyms`: text and data symbols with their addresses, sorted.
pub struct Kallsyms {
    /// address → name, for symbols with a non-zero address.
    by_addr: BTreeMap<u64, String>,
}

impl Kallsyms {
    pub fn load() -> Result<Kallsyms> {
        let text =
            std::fs::read_to_string("/proc/kallsyms").context("cannot read /proc/kallsyms")?;
        Ok(Kallsyms::parse(&text))
    }

    pub fn parse(text: &str) -> Kallsyms {
        let mut by_addr = BTreeMap::new();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(addr), Some(_ty), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr != 0 && it.next().is_none() {
                // Module symbols carry a "[module]" suffix; the block layer is built in.
                by_addr.entry(addr).or_insert_with(|| name.to_string());
            }
        }
        Kallsyms { by_addr }
    }

    pub fn address(&self, name: &str) -> Option<u64> {
        self.by_addr
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(a, _)| *a)
    }

    /// `[start, end)` of a function: from its address to the next symbol's.
    pub fn range(&self, name: &str) -> Option<[u64; 2]> {
        let start = self.address(name)?;
        let end = self.by_addr.range(start + 1..).next().map(|(a, _)| *a)?;
        Some([start, end])
    }

    /// Whether addresses are visible (kptr_restrict hides them as zeros).
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }
}

/// Functions whose presence on the stack names a merge path, indexed by `path::* - 1`.
pub const MERGE_CALLER_FUNCTIONS: [(u8, &str); MERGE_CALLERS] = [
    (path::PLUG, "blk_attempt_plug_merge"),
    (path::ELEVATOR, "blk_mq_sched_try_merge"),
    (path::SW_QUEUE, "blk_bio_list_merge"),
];

/// Addresses the tracepoint tier uses for context. Missing symbols leave 0 (the feature that
/// needs them reports "unknown"), and are listed in the returned notes.
pub fn resolve_symbols(kallsyms: &Kallsyms) -> (KernelSymbols, Vec<String>) {
    let mut notes = Vec::new();
    let mut syms = KernelSymbols::default();
    let mut need = |name: &str| {
        let a = kallsyms.address(name);
        if a.is_none() {
            notes.push(format!("kernel symbol {name} not found in /proc/kallsyms"));
        }
        a.unwrap_or(0)
    };
    syms.throtl_dispatch_fn = need("blk_throtl_dispatch_work_fn");
    for (p, name) in MERGE_CALLER_FUNCTIONS {
        match kallsyms.range(name) {
            Some(r) => syms.merge_callers[p as usize - 1] = r,
            None => notes.push(format!(
                "kernel function {name} not found: merges through it show as path \"unknown\""
            )),
        }
    }
    (syms, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms_ranges_end_at_the_next_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81b01600 T __pfx_blk_bio_list_merge\n\
             ffffffff81b01610 T blk_bio_list_merge\n\
             ffffffff81b016b0 T __pfx_blk_mq_sched_try_merge\n\
             ffffffff81b016c0 T blk_mq_sched_try_merge\n\
             ffffffff81b01880 T __pfx_blk_attempt_plug_merge\n\
             ffffffff81b01890 T blk_attempt_plug_merge\n\
             ffffffff81b01a00 T next_one\n\
             ffffffffc0000000 t some_mod_fn\t[loop]\n",
        );
        assert_eq!(
            k.range("blk_bio_list_merge"),
            Some([0xffffffff81b01610, 0xffffffff81b016b0])
        );
        assert_eq!(k.range("some_mod_fn"), None);
        let (syms, notes) = resolve_symbols(&k);
        assert_eq!(
            syms.merge_callers[path::PLUG as usize - 1],
            [0xffffffff81b01890, 0xffffffff81b01a00]
        );
        assert_eq!(syms.throtl_dispatch_fn, 0);
        assert!(notes
            .iter()
            .any(|n| n.contains("blk_throtl_dispatch_work_fn")));
    }

    #[test]
    fn docs_hooks_md_lists_every_hook() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/hooks.md"))
            .unwrap();
        for h in HOOKS {
            assert!(
                doc.contains(&format!("`{}`", h.name)),
                "docs/hooks.md does not list {}",
                h.name
            );
        }
        assert_eq!(parse_release("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-40-cloud-amd64"), Some((6, 1)));
    }

    #[test]
    fn hidden_addresses_parse_as_empty() {
        let k = Kallsyms::parse("0000000000000000 T blk_attempt_plug_merge\n");
        assert!(k.is_empty());
    }
}
