//! The hook table: every kernel hook mergetrace uses, on which kernels, on which tier, and the
//! eBPF programs attached to it. Attaching (`kernel::attach`), `check`'s fentry probe and its
//! `hooks` section, and docs/hooks.md all read [`HOOKS`]; nothing else names a hook.
use std::fmt::Write as _;

use super::{kallsyms::Kallsyms, Btf};
use crate::kernel::TierKind;

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

/// How a program attaches to its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// `tp_btf` on the tracepoint.
    Tracepoint,
    Fentry,
    Fexit,
}

/// When a run attaches a program besides its tier. Every run counts bios and merges per
/// request; a per-bio program is attached only where the run wants one ([`Want`]): the
/// per-request programs run once per request, a per-bio one once per bio. A full capture
/// wants everything ([`Wants::ALL`]); `record --requests` and counting runs (live view,
/// exporter, demo) what their flags and the traced disks need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Always.
    Always,
    /// Only when events are sent to user space (captures): it feeds latency and lineage
    /// only, and runs once per request.
    Events,
    /// Runs that want it.
    Want(Want),
    /// Captures, and runs that want it.
    EventsOr(Want),
}

/// What a counting run may want beside the per-request counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Each bio as it leaves blk-throttle: what blk-throttle charged where a traced disk has
    /// rules, the bios of a bio-based disk (no requests carry them), the merge-path oracle.
    Bios,
    /// Each bio merge: io.cost's charge (its per-cgroup cursor), the merge-path oracle.
    BioMerges,
    /// blk-throttle's release work, and on the fentry tier its entry and exit: which bios
    /// waited, and how long; where a traced disk has rules.
    Throttle,
    /// fentry tier: every merge attempt, failed ones included (`--merge-attempts`).
    Attempts,
    /// Plug flushes by depth (`--plug-flushes`).
    PlugFlushes,
    /// Each request's queue and device latency (`--latency`): the completions too.
    Latency,
}

/// What one run wants ([`Want`]); a full capture wants everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wants {
    pub bios: bool,
    pub bio_merges: bool,
    pub throttle: bool,
    pub attempts: bool,
    pub plug_flushes: bool,
    pub latency: bool,
}

impl Wants {
    pub const ALL: Wants = Wants {
        bios: true,
        bio_merges: true,
        throttle: true,
        attempts: true,
        plug_flushes: true,
        latency: true,
    };

    pub fn has(self, w: Want) -> bool {
        match w {
            Want::Bios => self.bios,
            Want::BioMerges => self.bio_merges,
            Want::Throttle => self.throttle,
            Want::Attempts => self.attempts,
            Want::PlugFlushes => self.plug_flushes,
            Want::Latency => self.latency,
        }
    }
}

/// A second build of a program for an older prototype of its hook, named `<program><suffix>`
/// in the object; the loader attaches the one that fits the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    None,
    /// `_q`: the bio tracepoints took the request queue first up to 5.10
    /// (`block_bio_queue(q, bio)`).
    QueueFirst,
    /// `_4`: `blk_attempt_plug_merge` had a fourth parameter up to 5.15.
    FourParams,
    /// `_bl`: before 5.17 there is no `bpf_loop` helper; the program walks a request's bio
    /// chain as bounded loops instead, which take the verifier ~8× longer to check.
    BoundedLoops,
}

impl Variant {
    fn suffix(self) -> Option<&'static str> {
        match self {
            Variant::None => None,
            Variant::QueueFirst => Some("_q"),
            Variant::FourParams => Some("_4"),
            Variant::BoundedLoops => Some("_bl"),
        }
    }
}

/// A program of the embedded eBPF object (its name in mergetrace-ebpf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub attach: Attach,
    pub needs: Needs,
    pub variant: Variant,
    /// Attached only where kallsyms has this symbol: without it the program learns nothing.
    pub symbol: Option<&'static str>,
}

impl Needs {
    /// Whether a run with these modes and wants attaches a program with this need.
    pub fn met(self, emit: bool, wants: Wants) -> bool {
        match self {
            Needs::Always => true,
            Needs::Events => emit,
            Needs::Want(w) => wants.has(w),
            Needs::EventsOr(w) => emit || wants.has(w),
        }
    }
}

impl Program {
    /// Its name and its variant's, as in the object.
    pub fn object_names(&self) -> Vec<String> {
        let mut names = vec![self.name.to_string()];
        names.extend(self.variant.suffix().map(|s| format!("{}{s}", self.name)));
        names
    }
}

/// One hook: what it is for, how it is reached, on which kernels mergetrace expects it, and
/// what attaches to it. `check --json` shows the first six fields.
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
    /// The tier from which it is used: tracepoint = every run, fentry = the fentry tier only.
    #[serde(skip)]
    pub tier: TierKind,
    /// The programs attached to it (none for kallsyms addresses and BTF fields).
    #[serde(skip)]
    pub programs: &'static [Program],
}

const fn hook(concept: &'static str, kind: HookKind, name: &'static str) -> Hook {
    Hook {
        concept,
        kind,
        name,
        since: (5, 10),
        until: None,
        optional: None,
        tier: TierKind::Tracepoint,
        programs: &[],
    }
}

/// A tracepoint and its programs (named after it, a rule of mergetrace-ebpf).
const fn tracepoint(
    concept: &'static str,
    name: &'static str,
    programs: &'static [Program],
) -> Hook {
    Hook {
        programs,
        ..hook(concept, HookKind::Tracepoint, name)
    }
}

/// A kernel function traced on the fentry tier.
const fn function(concept: &'static str, name: &'static str, programs: &'static [Program]) -> Hook {
    Hook {
        tier: TierKind::Fentry,
        programs,
        ..hook(concept, HookKind::Fentry, name)
    }
}

const fn program(name: &'static str, attach: Attach) -> Program {
    Program {
        name,
        attach,
        needs: Needs::Always,
        variant: Variant::None,
        symbol: None,
    }
}

/// A program a counting run attaches only when it wants `w`.
const fn wanted(w: Want, p: Program) -> Program {
    Program {
        needs: Needs::Want(w),
        ..p
    }
}

const fn tp(name: &'static str) -> Program {
    program(name, Attach::Tracepoint)
}

/// A bio tracepoint's program, with its variant for the 5.10 prototype.
const fn bio_tp(name: &'static str) -> Program {
    Program {
        variant: Variant::QueueFirst,
        ..tp(name)
    }
}

/// A request tracepoint's program that walks the request's bio chain, with its variant for
/// kernels without `bpf_loop`.
const fn chain_tp(name: &'static str) -> Program {
    Program {
        variant: Variant::BoundedLoops,
        ..tp(name)
    }
}

/// A hook used from `since` on.
const fn since(since: (u32, u32), hook: Hook) -> Hook {
    Hook { since, ..hook }
}

/// A hook used up to `until` (an older kernel's name for what a later row names).
const fn until(until: (u32, u32), hook: Hook) -> Hook {
    Hook {
        until: Some(until),
        ..hook
    }
}

/// What a run without the cgroup tracepoints loses.
const CGROUP_EVENTS_LOST: &str = "a cgroup gone before a read shows as \"(unknown cgroup id N)\"; removed cgroups are reclaimed only once a read finds them gone";

/// The release context is only known with the dispatch work's address.
pub const THROTTLE_WORK: &str = "blk_throtl_dispatch_work_fn";

/// Every hook mergetrace uses, 5.10 → 6.18+. Kernel drift is expressed here and nowhere else:
/// where a kernel renamed a hook, the rows name each spelling with the kernels it is expected
/// on (the ones the lab runs bound the ranges) and carry the same programs, newest first; the
/// loader attaches each program to the first row the running kernel has.
pub const HOOKS: &[Hook] = &[
    tracepoint(
        "bio passed the throttle",
        "block_bio_queue",
        &[wanted(Want::Bios, bio_tp("block_bio_queue"))],
    ),
    tracepoint("bio split", "block_split", &[bio_tp("block_split")]),
    tracepoint(
        "bio back merge",
        "block_bio_backmerge",
        &[wanted(Want::BioMerges, bio_tp("block_bio_backmerge"))],
    ),
    tracepoint(
        "bio front merge",
        "block_bio_frontmerge",
        &[wanted(Want::BioMerges, bio_tp("block_bio_frontmerge"))],
    ),
    tracepoint("new request", "block_getrq", &[bio_tp("block_getrq")]),
    tracepoint(
        "request-request merge",
        "block_rq_merge",
        &[chain_tp("block_rq_merge")],
    ),
    tracepoint(
        "request insert",
        "block_rq_insert",
        &[chain_tp("block_rq_insert")],
    ),
    tracepoint(
        "request issue",
        "block_rq_issue",
        &[chain_tp("block_rq_issue")],
    ),
    tracepoint(
        "request requeue",
        "block_rq_requeue",
        &[tp("block_rq_requeue")],
    ),
    tracepoint(
        "request complete",
        "block_rq_complete",
        &[Program {
            needs: Needs::EventsOr(Want::Latency),
            ..tp("block_rq_complete")
        }],
    ),
    Hook {
        optional: Some("unplug depths (6.1/6.6 fast path emits none)"),
        ..tracepoint(
            "plug flush",
            "block_unplug",
            &[wanted(Want::PlugFlushes, tp("block_unplug"))],
        )
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..tracepoint(
            "throttle release context",
            "workqueue_execute_start",
            &[Program {
                symbol: Some(THROTTLE_WORK),
                ..wanted(Want::Throttle, tp("workqueue_execute_start"))
            }],
        )
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..tracepoint(
            "throttle release context",
            "workqueue_execute_end",
            &[Program {
                symbol: Some(THROTTLE_WORK),
                ..wanted(Want::Throttle, tp("workqueue_execute_end"))
            }],
        )
    },
    Hook {
        optional: Some(CGROUP_EVENTS_LOST),
        ..tracepoint(
            "cgroup created (its name)",
            "cgroup_mkdir",
            &[tp("cgroup_mkdir")],
        )
    },
    Hook {
        optional: Some(CGROUP_EVENTS_LOST),
        ..tracepoint(
            "cgroup removed (reclaim its counters)",
            "cgroup_rmdir",
            &[tp("cgroup_rmdir")],
        )
    },
    Hook {
        optional: Some("throttled bios are not told apart"),
        ..hook("throttle dispatch work", HookKind::Kallsyms, THROTTLE_WORK)
    },
    Hook {
        optional: Some(
            "merges into a plug holding several queues' requests show as path \"unknown\"",
        ),
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
        ..since(
            (6, 1),
            function(
                "throttle charge (fentry)",
                "__blk_throtl_bio",
                THROTTLE_CHARGE,
            ),
        )
    },
    Hook {
        optional: Some("fentry tier: no exact throttle delay"),
        ..until(
            (5, 10),
            function(
                "throttle charge (fentry)",
                "blk_throtl_bio",
                THROTTLE_CHARGE,
            ),
        )
    },
    Hook {
        optional: Some("fentry tier: no exact throttle delay"),
        ..since(
            (6, 1),
            function(
                "throttle release (fentry)",
                "submit_bio_noacct_nocheck",
                THROTTLE_RELEASE,
            ),
        )
    },
    Hook {
        optional: Some("fentry tier: no exact throttle delay"),
        ..until(
            (5, 10),
            function(
                "throttle release (fentry)",
                "submit_bio_noacct",
                THROTTLE_RELEASE,
            ),
        )
    },
    Hook {
        optional: Some("fentry tier: no plug attempt counts"),
        ..function(
            "plug merge attempt (fexit)",
            "blk_attempt_plug_merge",
            &[Program {
                variant: Variant::FourParams,
                ..wanted(Want::Attempts, program("plug_attempt_exit", Attach::Fexit))
            }],
        )
    },
    Hook {
        optional: Some("fentry tier: no elevator decisions"),
        ..function(
            "elevator decision (fexit)",
            "elv_merge",
            &[wanted(
                Want::Attempts,
                program("elv_merge_exit", Attach::Fexit),
            )],
        )
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
        "request in flight (--latency)",
        HookKind::Field,
        "request.tag",
    ),
    hook(
        "request in flight (--latency)",
        HookKind::Field,
        "request.internal_tag",
    ),
    hook(
        "request in flight (--latency)",
        HookKind::Field,
        "request.mq_hctx",
    ),
    hook(
        "request in flight (--latency)",
        HookKind::Field,
        "blk_mq_hw_ctx.queue_num",
    ),
    since(
        (6, 1),
        hook(
            "throttle rules",
            HookKind::Field,
            "throtl_grp.has_rules_iops",
        ),
    ),
    since(
        (6, 1),
        hook(
            "throttle rules",
            HookKind::Field,
            "throtl_grp.has_rules_bps",
        ),
    ),
    until(
        (5, 10),
        hook("throttle rules", HookKind::Field, "throtl_grp.has_rules"),
    ),
    hook(
        "throttle release context",
        HookKind::Field,
        "throtl_data.dispatch_work",
    ),
    hook(
        "throttle release context",
        HookKind::Field,
        "throtl_data.queue",
    ),
    hook("merge path: plug", HookKind::Field, "task_struct.plug"),
    until(
        (6, 12),
        hook("merge path: plug", HookKind::Field, "blk_plug.mq_list"),
    ),
    since(
        (6, 13),
        hook("merge path: plug", HookKind::Field, "blk_plug.mq_list.tail"),
    ),
    hook(
        "merge path: scheduler",
        HookKind::Field,
        "elevator_type.elevator_name",
    ),
    hook("bio's cgroup", HookKind::Field, "bio.bi_blkg"),
    since((6, 1), hook("bio's disk", HookKind::Field, "bio.bi_bdev")),
    until((5, 10), hook("bio's disk", HookKind::Field, "bio.bi_disk")),
    since(
        (6, 1),
        hook("request's disk", HookKind::Field, "request_queue.disk"),
    ),
    until(
        (5, 10),
        hook("request's disk", HookKind::Field, "request.rq_disk"),
    ),
];

/// The programs of blk-throttle's entry, 5.10's and 6.x's.
const THROTTLE_CHARGE: &[Program] = &[
    wanted(Want::Throttle, program("throtl_bio_entry", Attach::Fentry)),
    wanted(Want::Throttle, program("throtl_bio_exit", Attach::Fexit)),
];

/// Where released bios go back into the block layer.
const THROTTLE_RELEASE: &[Program] = &[wanted(
    Want::Throttle,
    program("throtl_release", Attach::Fentry),
)];

/// The programs of the hooks first used on `tier`, with their hook, in table order.
pub fn programs_of(tier: TierKind) -> impl Iterator<Item = (&'static Hook, &'static Program)> {
    HOOKS
        .iter()
        .filter(move |h| h.tier == tier)
        .flat_map(|h| h.programs.iter().map(move |p| (h, p)))
}

/// The tracepoints a run cannot do without.
pub fn required_tracepoints() -> impl Iterator<Item = &'static str> {
    HOOKS
        .iter()
        .filter(|h| h.kind == HookKind::Tracepoint && h.optional.is_none())
        .map(|h| h.name)
}

/// The function a fentry-tier program attaches to on this kernel: the first of the rows that
/// carry it (its function's spellings, newest first) that the kernel's BTF has. `Err`: every
/// spelling, joined by "or", none of them present.
pub fn function_for(btf: &Btf, program: &str) -> Result<&'static Hook, String> {
    let spellings: Vec<&'static Hook> = programs_of(TierKind::Fentry)
        .filter(|(_, p)| p.name == program)
        .map(|(h, _)| h)
        .collect();
    spellings
        .iter()
        .find(|h| btf.has_function(h.name))
        .copied()
        .ok_or_else(|| {
            let names: Vec<&str> = spellings.iter().map(|h| h.name).collect();
            names.join(" or ")
        })
}

/// What `check` loads to learn whether the kernel allows fentry: the fentry tier's first
/// fentry program, on the function a real run attaches it to ([`function_for`]). `Err`: the
/// kernel has none of its spellings, named.
pub fn fentry_probe(btf: &Btf) -> Result<(&'static Hook, &'static Program), String> {
    let (_, first) = programs_of(TierKind::Fentry)
        .find(|(_, p)| p.attach == Attach::Fentry)
        .expect("the hook table has an fentry program");
    function_for(btf, first.name)
        .map(|hook| (hook, first))
        .map_err(|names| format!("{names} is not in this kernel's BTF"))
}

/// The object's name for `p` on this kernel: its variant's where the running kernel's
/// prototype of `hook` is the older one ([`Variant`]).
pub fn program_variant(btf: &Btf, hook: &Hook, p: &Program) -> String {
    let older = match p.variant {
        Variant::None => false,
        Variant::QueueFirst => btf.tracepoint_arg(hook.name, "bio").is_some_and(|i| i > 0),
        Variant::FourParams => btf.function_arity(hook.name) == Some(4),
        Variant::BoundedLoops => !btf.has_function("bpf_loop"),
    };
    match p.variant.suffix() {
        Some(suffix) if older => format!("{}{suffix}", p.name),
        _ => p.name.to_string(),
    }
}

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

/// The object's programs that watch no block-layer hook, so are not in [`HOOKS`]:
/// `flush_staged`, run by the recorder on a CPU whose batch of events waited too long and never
/// attached (`kernel::rings::Batches`), and `stats_floor`, `--stats`' empty program.
pub const NOT_HOOKS: [&str; 2] = [
    crate::kernel::rings::FLUSH_STAGED,
    crate::kernel::STATS_FLOOR,
];

/// The table of docs/hooks.md, one row per hook, as [`HOOKS`] says it.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| concept | how | hook | programs | tier | kernels | without it |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for h in HOOKS {
        let how = match h.kind {
            HookKind::Tracepoint => "tracepoint (tp_btf)",
            HookKind::Kallsyms => "kallsyms (address or range on the stack)",
            HookKind::Fentry => "fentry/fexit",
            HookKind::Field => "BTF field",
        };
        let programs: Vec<String> = h.programs.iter().map(program_cell).collect();
        let kernels = match h.until {
            Some(u) if u == h.since => format!("{}.{}", u.0, u.1),
            Some((a, b)) => format!("{}.{}–{a}.{b}", h.since.0, h.since.1),
            None => format!("{}.{}+", h.since.0, h.since.1),
        };
        let _ = writeln!(
            out,
            "| {} | {how} | `{}` | {} | {} | {kernels} | {} |",
            h.concept,
            h.name,
            if programs.is_empty() {
                "—".to_string()
            } else {
                programs.join(", ")
            },
            h.tier.name(),
            h.optional.unwrap_or("—"),
        );
    }
    out
}

fn program_cell(p: &Program) -> String {
    let attach = match p.attach {
        Attach::Tracepoint => "",
        Attach::Fentry => " (fentry)",
        Attach::Fexit => " (fexit)",
    };
    let needs = match p.needs {
        Needs::Always => "",
        Needs::Events => ", captures only",
        Needs::Want(Want::Bios) => {
            ", captures; live where a traced disk is bio-based, or from the first request that finds blk-throttle rules on one"
        }
        Needs::Want(Want::BioMerges) => ", captures; live where a traced disk has io.cost on",
        Needs::Want(Want::Throttle) => {
            ", captures; live from the first request that finds blk-throttle rules on a traced disk"
        }
        Needs::Want(Want::Attempts) => ", captures; live with `--merge-attempts`",
        Needs::Want(Want::PlugFlushes) => ", captures; live with `--plug-flushes`",
        Needs::Want(Want::Latency) | Needs::EventsOr(Want::Latency) => {
            ", captures; live with `--latency`"
        }
        Needs::EventsOr(_) => ", captures; live when wanted",
    };
    let symbol = p
        .symbol
        .map_or(String::new(), |s| format!(", with `{s}` in kallsyms"));
    format!("`{}`{attach}{needs}{symbol}", p.name)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use aya_obj::ProgramSection;

    use super::*;

    /// The request programs that walk bio chains take their bounded-loop build exactly where
    /// the kernel has no `bpf_loop` (5.10); the other programs never do.
    #[test]
    fn chain_walkers_take_bounded_loops_only_without_bpf_loop() {
        use crate::kernel::btf::{tests::Builder, Btf};
        let without = Btf::parse(&Builder::new().build()).unwrap();
        let mut b = Builder::new();
        b.func("bpf_loop");
        let with = Btf::parse(&b.build()).unwrap();
        let mut walkers = Vec::new();
        for h in HOOKS {
            for p in h.programs {
                let (old, new) = (
                    program_variant(&without, h, p),
                    program_variant(&with, h, p),
                );
                assert_eq!(new, p.name, "{} with bpf_loop", p.name);
                if p.variant == Variant::BoundedLoops {
                    assert_eq!(old, format!("{}_bl", p.name));
                    walkers.push(p.name);
                } else if p.variant == Variant::None {
                    assert_eq!(old, p.name);
                }
            }
        }
        assert_eq!(
            walkers,
            ["block_rq_merge", "block_rq_insert", "block_rq_issue"]
        );
    }

    /// Program name → how it attaches, as the embedded object declares it (parsed, not loaded:
    /// no privileges needed).
    fn object_programs() -> BTreeMap<String, Attach> {
        let obj =
            aya_obj::Object::parse(crate::kernel::attach::OBJECT).expect("the eBPF object parses");
        obj.programs
            .iter()
            .filter(|(name, _)| !NOT_HOOKS.contains(&name.as_str()))
            .map(|(name, p)| {
                let attach = match p.section {
                    ProgramSection::BtfTracePoint => Attach::Tracepoint,
                    ProgramSection::FEntry { .. } => Attach::Fentry,
                    ProgramSection::FExit { .. } => Attach::Fexit,
                    ref other => {
                        panic!("program {name} has a section the table cannot attach: {other:?}")
                    }
                };
                (name.clone(), attach)
            })
            .collect()
    }

    /// What a run attaches, per tier and mode, from the table alone (every symbol present).
    fn attached(tier: TierKind, emit: bool) -> BTreeMap<String, Attach> {
        let mut tiers = vec![TierKind::Tracepoint];
        if tier == TierKind::Fentry {
            tiers.push(TierKind::Fentry);
        }
        tiers
            .into_iter()
            .flat_map(programs_of)
            .filter(|(_, p)| {
                let wants = if emit { Wants::ALL } else { Wants::default() };
                p.needs.met(emit, wants)
            })
            .flat_map(|(_, p)| p.object_names().into_iter().map(|n| (n, p.attach)))
            .collect()
    }

    #[test]
    fn what_is_attached_is_what_the_table_and_the_object_say() {
        let object = object_programs();
        // The fentry tier of a capture attaches everything the object has, each as declared.
        assert_eq!(attached(TierKind::Fentry, true), object);
        // The tracepoint tier: no fentry/fexit program.
        let tracepoint = attached(TierKind::Tracepoint, true);
        let fentry_only: BTreeSet<&String> = object
            .iter()
            .filter(|(_, a)| **a != Attach::Tracepoint)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            tracepoint.keys().collect::<BTreeSet<_>>(),
            object.keys().filter(|n| !fentry_only.contains(n)).collect()
        );
        // Counting in the kernel (live view, serve, demo) wanting nothing more: the request
        // programs, the bio programs that run once per request or rarely (new request,
        // split), the cgroup names; no per-bio program, no completion, no plug flush.
        let counting = attached(TierKind::Tracepoint, false);
        assert_eq!(
            counting.keys().collect::<Vec<_>>(),
            [
                "block_getrq",
                "block_getrq_q",
                "block_rq_insert",
                "block_rq_insert_bl",
                "block_rq_issue",
                "block_rq_issue_bl",
                "block_rq_merge",
                "block_rq_merge_bl",
                "block_rq_requeue",
                "block_split",
                "block_split_q",
                "cgroup_mkdir",
                "cgroup_rmdir",
            ]
        );
        // Nor on the fentry tier.
        assert_eq!(attached(TierKind::Fentry, false), counting);
        // Each program once, but for the spellings of one renamed function (same concept,
        // disjoint kernels); tracepoint programs are named after their tracepoint.
        let mut seen: BTreeMap<&str, &Hook> = BTreeMap::new();
        for h in HOOKS {
            for p in h.programs {
                if let Some(first) = seen.insert(p.name, h) {
                    assert!(
                        first.concept == h.concept
                            && h.kind == HookKind::Fentry
                            && first.until.is_none()
                            && h.until.is_some_and(|u| u < first.since),
                        "{} twice in the table",
                        p.name
                    );
                }
                match p.attach {
                    Attach::Tracepoint => {
                        assert_eq!(
                            (h.kind, h.tier, p.name),
                            (HookKind::Tracepoint, TierKind::Tracepoint, h.name)
                        )
                    }
                    Attach::Fentry | Attach::Fexit => {
                        assert_eq!(
                            (h.kind, h.tier),
                            (HookKind::Fentry, TierKind::Fentry),
                            "{}",
                            p.name
                        )
                    }
                }
            }
        }
        assert_eq!(
            programs_of(TierKind::Fentry).next().unwrap().1.name,
            "throtl_bio_entry"
        );
        assert!(required_tracepoints().any(|t| t == "block_bio_queue"));
        assert!(!required_tracepoints().any(|t| t == "block_unplug"));
    }

    /// docs/hooks.md holds the table [`markdown_table`] renders. After changing [`HOOKS`]:
    /// `MERGETRACE_WRITE_DOCS=1 cargo test -p mergetrace --lib docs_hooks_md` rewrites it.
    #[test]
    fn docs_hooks_md_is_the_table() {
        const BEGIN: &str = "<!-- BEGIN HOOKS: generated from kernel::compat::HOOKS -->\n";
        const END: &str = "<!-- END HOOKS -->";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/hooks.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let (a, b) = (
            doc.find(BEGIN).expect("BEGIN marker"),
            doc.find(END).expect("END marker"),
        );
        let want = format!("{}{BEGIN}{}{}", &doc[..a], markdown_table(), &doc[b..]);
        if std::env::var_os("MERGETRACE_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
            return;
        }
        assert!(
            doc == want,
            "docs/hooks.md is not the hook table: rerun with MERGETRACE_WRITE_DOCS=1"
        );
        assert_eq!(parse_release("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-40-cloud-amd64"), Some((6, 1)));
    }
}
