//! `mergetrace check -d DEV`: what merging can and cannot do on one device, read from sysfs,
//! /proc/diskstats and the cgroup tree, and which tier mergetrace can trace it with. Traces
//! nothing. Gathering (`gather`) is separate from judging (`findings`, pure) so every sentence
//! is unit-tested on constructed inputs.
use std::{
    io,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::sys::diskstats::{find_diskstats, DiskStats};
use crate::{
    fmt,
    kernel::btf::{Btf, KIND_FUNC},
    model::limits::{self, LimitKind, Limits},
    sys::cgroups::{self, Hierarchy},
    sys::device::{self, Device},
    sys::queue::{QueueSettings, BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES, PAGE_SIZE},
};

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Block device to check: a name (vda), /dev/NAME or MAJ:MIN. A partition maps to its disk.
    #[arg(short = 'd', long = "device", required = true, value_name = "DEV")]
    pub device: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One thing the user should know, and what they can do about it (if anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub topic: &'static str,
    pub finding: String,
    pub lever: Option<String>,
}

impl Finding {
    fn new(topic: &'static str, finding: String, lever: Option<String>) -> Finding {
        Finding {
            topic,
            finding,
            lever,
        }
    }

    /// `topic: finding — lever: …`
    pub fn line(&self) -> String {
        match &self.lever {
            Some(l) => format!("{}: {} — lever: {}", self.topic, self.finding, l),
            None => format!("{}: {}", self.topic, self.finding),
        }
    }
}

/// Seconds since boot from `/proc/uptime`.
pub fn parse_uptime(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

/// A cgroup with its own throttle limit(s) on the device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThrottledCgroup {
    pub hierarchy: Hierarchy,
    /// Relative to the hierarchy's mount, "/" for the root.
    pub path: String,
    pub limits: Limits,
}

/// Every cgroup under `mount` whose own files limit device `maj:min`, sorted by path.
pub fn throttled_cgroups(
    hierarchy: Hierarchy,
    mount: &Path,
    major: u32,
    minor: u32,
) -> Vec<ThrottledCgroup> {
    let mut out = Vec::new();
    let mut stack = vec![mount.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let own = limits::own_limits(hierarchy, &dir, major, minor);
        if !own.is_empty() {
            let path = match dir.strip_prefix(mount) {
                Ok(rel) if rel.as_os_str().is_empty() => "/".to_string(),
                Ok(rel) => format!("/{}", rel.display()),
                Err(_) => dir.display().to_string(),
            };
            out.push(ThrottledCgroup {
                hierarchy,
                path,
                limits: own,
            });
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // DirEntry::file_type does not follow symlinks.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// How the process may use BPF, from `CapEff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Privileges {
    /// CAP_SYS_ADMIN (root).
    Root,
    /// CAP_BPF and CAP_PERFMON without CAP_SYS_ADMIN.
    BpfPerfmon,
    Missing,
}

/// `CapEff` from `/proc/self/status`.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

pub fn privileges(cap_eff: u64) -> Privileges {
    const CAP_SYS_ADMIN: u64 = 21;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let has = |c: u64| cap_eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) {
        Privileges::Root
    } else if has(CAP_BPF) && has(CAP_PERFMON) {
        Privileges::BpfPerfmon
    } else {
        Privileges::Missing
    }
}

/// Where tracefs is mounted, from `/proc/self/mountinfo`.
pub fn tracefs_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split(' ').next() == Some("tracefs"))
            .then(|| PathBuf::from(left.split(' ').nth(4).unwrap_or_default()))
    })
}

/// The kernel features the tiers need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelEnv {
    /// `/sys/kernel/btf/vmlinux` present and parsed.
    pub btf: bool,
    /// The block tracepoints exist as BTF-enabled tracepoints (`btf_trace_block_*`).
    pub block_tracepoints: bool,
    pub tracefs: Option<PathBuf>,
    pub privileges: Privileges,
    /// `None`: not probed (no BTF or no privileges). `Some(Ok(allowed))` / `Some(Err(why))`.
    pub fentry: Option<Result<bool, String>>,
}

/// The tier mergetrace can run here and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierCheck {
    /// "fentry", "tracepoint", or "none" (mergetrace cannot trace here).
    pub name: &'static str,
    pub reason: String,
}

/// The function the fentry probe attaches to.
pub const FENTRY_PROBE_TARGET: &str = "blk_mq_submit_bio";
const BLOCK_TRACEPOINTS: [&str; 4] = [
    "block_bio_queue",
    "block_getrq",
    "block_bio_backmerge",
    "block_rq_issue",
];

pub fn tier(env: &KernelEnv) -> TierCheck {
    let none = |reason: &str| TierCheck {
        name: "none",
        reason: reason.to_string(),
    };
    if !env.btf {
        return none("this kernel has no BTF (/sys/kernel/btf/vmlinux): mergetrace needs CONFIG_DEBUG_INFO_BTF=y");
    }
    if env.privileges == Privileges::Missing {
        return none("needs root, or CAP_BPF and CAP_PERFMON, to load eBPF programs");
    }
    if !env.block_tracepoints {
        return none("the block tracepoints are not in this kernel's BTF");
    }
    match &env.fentry {
        Some(Ok(true)) => TierCheck {
            name: "fentry",
            reason: format!(
                "fentry tier available: the kernel accepted an fentry program on {FENTRY_PROBE_TARGET}"
            ),
        },
        Some(Ok(false)) => TierCheck {
            name: "tracepoint",
            reason: "fentry refused by this kernel's policy: tracepoint tier".into(),
        },
        Some(Err(e)) => TierCheck {
            name: "tracepoint",
            reason: format!("fentry probe failed ({e}): tracepoint tier"),
        },
        None => TierCheck {
            name: "tracepoint",
            reason: "fentry not probed: tracepoint tier".into(),
        },
    }
}

/// Everything `findings` judges.
#[derive(Debug, Clone)]
pub struct CheckInput {
    pub device: Device,
    pub queue: QueueSettings,
    /// `None` when the device has no line in `/proc/diskstats`.
    pub diskstats: Option<DiskStats>,
    pub uptime_secs: Option<f64>,
    /// The hierarchy hosting the io controller and its mount (`None`: none mounted).
    pub io_hierarchy: Option<(Hierarchy, PathBuf)>,
    pub throttled: Vec<ThrottledCgroup>,
    pub env: KernelEnv,
}

struct Direction {
    word: &'static str,
    merges_topic: &'static str,
    size_topic: &'static str,
    requests: u64,
    merged: u64,
    sectors: u64,
}

fn direction_findings(input: &CheckInput, d: &Direction, bio_based: bool, out: &mut Vec<Finding>) {
    let name = &input.device.name;
    let bios = d.requests + d.merged;
    let since = input
        .uptime_secs
        .map(|u| format!(" ({})", fmt::span(u)))
        .unwrap_or_default();
    if bios == 0 {
        out.push(Finding::new(
            d.merges_topic,
            format!("no {}s since boot", d.word),
            None,
        ));
        return;
    }
    let per_sec = input
        .uptime_secs
        .filter(|u| *u > 0.0)
        .map(|u| format!("; {:.0} {} bios/s on average", bios as f64 / u, d.word))
        .unwrap_or_default();
    if bio_based {
        out.push(Finding::new(
            d.merges_topic,
            format!(
                "{name} is bio-based: 0 merges by construction; {} {} bios since boot{since}{per_sec}",
                fmt::thousands(bios),
                d.word
            ),
            None,
        ));
        out.push(Finding::new(
            d.size_topic,
            format!(
                "average {} bio {} ({} sectors over {} bios)",
                d.word,
                fmt::kib_per(d.sectors, d.requests),
                fmt::thousands(d.sectors),
                fmt::thousands(d.requests)
            ),
            None,
        ));
        return;
    }
    let rate = 100.0 * d.merged as f64 / bios as f64;
    out.push(Finding::new(
        d.merges_topic,
        format!(
            "{} merge rate since boot{since}: {rate:.1} % ({} of {} {} bios merged into {} device requests{per_sec}; diskstats' merged also counts request-request merges)",
            d.word,
            fmt::thousands(d.merged),
            fmt::thousands(bios),
            d.word,
            fmt::thousands(d.requests),
        ),
        Some(
            "merging needs a neighbour still waiting in the plug list or the scheduler: submit \
             in batches (io_uring/libaio batch submission, fio iodepth_batch_submit, buffered \
             writeback); one-at-a-time submission merges almost nothing"
                .into(),
        ),
    ));
    out.push(Finding::new(
        d.size_topic,
        format!(
            "average {} request reaching the device: {} ({} sectors over {} requests; merging can build up to {})",
            d.word,
            fmt::kib_per(d.sectors, d.requests),
            fmt::thousands(d.sectors),
            fmt::thousands(d.requests),
            fmt::kib(input.queue.merge_ceiling_bytes()),
        ),
        Some(
            "only a meter that counts after merging (a cloud volume counting requests in \
             units such as 256 KiB) is paid per request of this size: larger bios or batched \
             submission lower its count; blk-throttle counts bios, not requests"
                .into(),
        ),
    ));
}

/// What the user should know about merging on this device, in checklist order.
pub fn findings(input: &CheckInput) -> Vec<Finding> {
    let mut out = Vec::new();
    let dev = &input.device;
    let q = &input.queue;
    let name = &dev.name;
    let bio_based = dev.bio_based || q.bio_based();
    let nomerges_file = format!("/sys/block/{name}/queue/nomerges");
    let extra_notes: Vec<&String> = dev
        .notes
        .iter()
        .filter(|n| !n.contains("is bio-based"))
        .collect();
    let notes = if extra_notes.is_empty() {
        String::new()
    } else {
        format!(
            "; {}",
            extra_notes
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        )
    };

    // Device.
    if bio_based {
        out.push(Finding::new(
            "device",
            format!(
                "{name} ({}:{}) is bio-based: no scheduler and no request queue, so it never merges; \
                 nomerges, max_sectors_kb and the plug limits do not apply{notes}",
                dev.major, dev.minor
            ),
            None,
        ));
    } else {
        out.push(Finding::new(
            "device",
            format!(
                "{name} ({}:{}): blk-mq device, {} hardware queue{}, {}, {}-byte logical blocks{notes}",
                dev.major,
                dev.minor,
                q.hw_queues,
                if q.hw_queues == 1 { "" } else { "s" },
                if q.rotational { "rotational" } else { "not rotational" },
                q.logical_block_size
            ),
            None,
        ));
    }

    // Scheduler and nomerges.
    if bio_based {
        out.push(Finding::new(
            "scheduler",
            format!("none: {name} is bio-based, bios go straight to the driver with no merge path"),
            None,
        ));
        out.push(Finding::new("nomerges", q.explain_nomerges(), None));
    } else {
        let sched = q.scheduler_name();
        let others: Vec<&str> = q
            .scheduler
            .as_ref()
            .map(|s| {
                s.available
                    .iter()
                    .map(|a| a.as_str())
                    .filter(|a| *a != sched)
                    .collect()
            })
            .unwrap_or_default();
        let available = if others.is_empty() {
            String::new()
        } else {
            format!(", also available: {}", others.join(", "))
        };
        let paths = match sched {
            "none" => "no elevator: bios merge in the task's plug list, then on the software \
                       queues (blk_bio_list_merge)"
                .to_string(),
            "mq-deadline" | "bfq" => format!(
                "bios merge in the task's plug list, then in {sched} through elv_merge (one-hit \
                 last_merge, hash back-merge lookup, front-merge lookup), and requests merge \
                 again at insert (elv_attempt_insert_merge)"
            ),
            "kyber" => "bios merge in the task's plug list, then on kyber's per-domain lists \
                        (blk_bio_list_merge); no hash lookup"
                .to_string(),
            other => {
                format!("bios merge in the task's plug list, then through {other}'s bio_merge")
            }
        };
        let nr = q
            .nr_requests
            .map(|n| format!("; nr_requests={n}"))
            .unwrap_or_default();
        out.push(Finding::new(
            "scheduler",
            format!("{sched}{available}: {paths}{nr}"),
            None,
        ));
        let lever = match q.nomerges {
            0 if q.uses_elv_merge() => format!(
                "echo 2 > {nomerges_file} turns every merge off; 1 only drops {sched}'s hash and \
                 front-merge lookups"
            ),
            0 => format!(
                "echo 2 > {nomerges_file} turns every merge off; 1 would change nothing here"
            ),
            1 if q.uses_elv_merge() => format!(
                "echo 2 > {nomerges_file} to turn every merge off; echo 0 to restore the hash lookup"
            ),
            1 => format!(
                "echo 2 > {nomerges_file} if you meant to turn merging off: 1 is the same as 0 on this path"
            ),
            _ => format!("echo 0 > {nomerges_file} turns merging back on"),
        };
        out.push(Finding::new("nomerges", q.explain_nomerges(), Some(lever)));
    }

    // /proc/diskstats.
    match &input.diskstats {
        None => out.push(Finding::new(
            "diskstats",
            format!("{name} has no line in /proc/diskstats: no merge counters to read"),
            None,
        )),
        Some(s) => {
            for d in [
                Direction {
                    word: "write",
                    merges_topic: "write merges",
                    size_topic: "write request size",
                    requests: s.writes,
                    merged: s.writes_merged,
                    sectors: s.write_sectors,
                },
                Direction {
                    word: "read",
                    merges_topic: "read merges",
                    size_topic: "read request size",
                    requests: s.reads,
                    merged: s.reads_merged,
                    sectors: s.read_sectors,
                },
            ] {
                direction_findings(input, &d, bio_based, &mut out);
            }
        }
    }

    // Merge ceiling and plug flush.
    if !bio_based {
        let ceiling = q.merge_ceiling_bytes();
        let by_segments = q.max_segments * PAGE_SIZE;
        let rotational = if q.rotational {
            "rotational: seeks are charged per request, merging's home ground"
        } else {
            "not rotational: no seek to save, merging pays only where something counts requests"
        };
        let useful_kb = q.max_hw_sectors_kb.min(by_segments / 1024);
        let lever = (q.merge_ceiling_set_by() == "max_sectors_kb" && useful_kb > q.max_sectors_kb)
            .then(|| {
                format!(
                    "echo {useful_kb} > /sys/block/{name}/queue/max_sectors_kb raises it to {} \
                     (beyond that {} binds)",
                    fmt::kib(useful_kb * 1024),
                    if useful_kb == q.max_hw_sectors_kb {
                        "max_hw_sectors_kb"
                    } else {
                        "max_segments"
                    }
                )
            });
        out.push(Finding::new(
            "merge ceiling",
            format!(
                "the largest request merging can build is {} = min(max_sectors_kb {}, max_segments {} × 4 KiB pages = {}), set by {}; max_hw_sectors_kb {}; {rotational}",
                fmt::kib(ceiling),
                fmt::kib(q.max_sectors_kb * 1024),
                q.max_segments,
                fmt::kib(by_segments),
                q.merge_ceiling_set_by(),
                q.max_hw_sectors_kb,
            ),
            lever,
        ));
        let rule = match q.plug_flush_bytes() {
            Some(b) => format!(
                "at {} requests, or as soon as its last request has reached {}",
                q.plug_max_requests(),
                fmt::kib(b)
            ),
            None => format!(
                "at {} requests only (the 128 KiB size rule is off with nomerges=2)",
                q.plug_max_requests()
            ),
        };
        out.push(Finding::new(
            "plug flush",
            format!(
                "a task's plug list is flushed to the device {rule}; {} requests once the plug also holds requests for another device (md/dm over several disks); the hardware queue count ({}) plays no part",
                BLK_MAX_REQUEST_COUNT_MULTIPLE_QUEUES, q.hw_queues,
            ),
            None,
        ));
    }

    // Throttle limits.
    match &input.io_hierarchy {
        None => out.push(Finding::new(
            "throttle",
            "no cgroup hierarchy with the io/blkio controller is mounted: no throttle limits"
                .into(),
            None,
        )),
        Some((h, mount)) if input.throttled.is_empty() => out.push(Finding::new(
            "throttle",
            format!(
                "no cgroup limits {name} ({} hierarchy at {})",
                hierarchy_name(*h),
                mount.display()
            ),
            None,
        )),
        Some(_) => {
            for t in &input.throttled {
                out.push(throttle_finding(name, t));
            }
        }
    }

    // Tier.
    let env = &input.env;
    let t = tier(env);
    let privs = match env.privileges {
        Privileges::Root => "CAP_SYS_ADMIN",
        Privileges::BpfPerfmon => "CAP_BPF+CAP_PERFMON",
        Privileges::Missing => "no CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON",
    };
    let tracefs = match &env.tracefs {
        Some(p) => format!("tracefs at {}", p.display()),
        None => "tracefs not mounted (not needed: the tracepoints attach through BTF)".into(),
    };
    let facts = format!(
        "BTF {}, block tracepoints {}, {privs}, {tracefs}",
        if env.btf { "present" } else { "missing" },
        if env.block_tracepoints {
            "in BTF"
        } else {
            "missing"
        },
    );
    let (finding, lever) = match t.name {
        "fentry" => (format!("{}; {facts}", t.reason), None),
        "tracepoint" => (
            format!(
                "{}; throttle delays are not measured and failed merge attempts are invisible; {facts}",
                t.reason
            ),
            None,
        ),
        _ => (
            format!("mergetrace cannot trace here: {}; {facts}", t.reason),
            Some(if env.privileges == Privileges::Missing {
                "run it with sudo, or grant CAP_BPF and CAP_PERFMON".to_string()
            } else if !env.btf {
                "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y".to_string()
            } else {
                "use a kernel with the block tracepoints (CONFIG_BLK_DEV_IO_TRACE / tracepoints in BTF)"
                    .to_string()
            }),
        ),
    };
    out.push(Finding::new("tier", finding, lever));
    out
}

fn hierarchy_name(h: Hierarchy) -> &'static str {
    match h {
        Hierarchy::V1 => "cgroup v1 blkio",
        Hierarchy::V2 => "cgroup v2",
    }
}

fn throttle_finding(device: &str, t: &ThrottledCgroup) -> Finding {
    let kinds = [
        LimitKind::Rbps,
        LimitKind::Wbps,
        LimitKind::Riops,
        LimitKind::Wiops,
    ];
    let set: Vec<(LimitKind, u64)> = kinds
        .iter()
        .filter_map(|k| t.limits.get(*k).map(|v| (*k, v)))
        .collect();
    let shown: Vec<String> = set
        .iter()
        .map(|(k, v)| {
            if k.is_iops() {
                format!("{}={} bios/s", k.name(), fmt::thousands(*v))
            } else {
                format!("{}={}", k.name(), fmt::exact_rate(*v))
            }
        })
        .collect();
    let file = match t.hierarchy {
        Hierarchy::V1 => "blkio.throttle.*_device",
        Hierarchy::V2 => "io.max",
    };
    // cgroup v2 throttling is hierarchical; v1 blk-throttle treats every group as its own
    // root ("flat hierarchy"), so a v1 limit binds that cgroup's own bios only.
    let below = match (t.hierarchy, t.path == "/") {
        (Hierarchy::V1, _) => {
            "only its own bios (cgroup v1 throttling is flat: children are not limited)"
        }
        (Hierarchy::V2, true) => "every cgroup",
        (Hierarchy::V2, false) => "it and every cgroup below it",
    };
    let mut levers = Vec::new();
    let iops: Vec<&str> = set
        .iter()
        .filter(|(k, _)| k.is_iops())
        .map(|(k, _)| k.name())
        .collect();
    let bytes: Vec<&str> = set
        .iter()
        .filter(|(k, _)| !k.is_iops())
        .map(|(k, _)| k.name())
        .collect();
    if !iops.is_empty() {
        levers.push(format!(
            "{}: iops limit counts bios before merging: submit larger bios; merging cannot raise it",
            iops.join(", ")
        ));
    }
    if !bytes.is_empty() {
        levers.push(format!(
            "{}: bps limit is blind to merging (a merged bio carries the same bytes)",
            bytes.join(", ")
        ));
    }
    Finding::new(
        "throttle",
        format!(
            "cgroup {} ({} {file}) limits {device}: {} — binds {below}",
            t.path,
            hierarchy_name(t.hierarchy),
            shown.join(", ")
        ),
        Some(levers.join("; ")),
    )
}

/// The JSON document of `check --json`.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub device: &'a str,
    pub dev: String,
    pub tier: TierCheck,
    pub findings: Vec<Finding>,
    pub queue: &'a QueueSettings,
    pub diskstats: Option<&'a DiskStats>,
    pub throttled: &'a [ThrottledCgroup],
    /// Every hook mergetrace uses, checked against this kernel (docs/hooks.md).
    pub hooks: Vec<crate::kernel::compat::HookStatus>,
}

pub fn report(input: &CheckInput) -> Report<'_> {
    Report {
        device: &input.device.name,
        dev: format!("{}:{}", input.device.major, input.device.minor),
        tier: tier(&input.env),
        findings: findings(input),
        queue: &input.queue,
        diskstats: input.diskstats.as_ref(),
        throttled: &input.throttled,
        hooks: hooks_here(),
    }
}

/// The hook table checked against the running kernel (empty if BTF is unreadable).
fn hooks_here() -> Vec<crate::kernel::compat::HookStatus> {
    use crate::kernel::compat;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let (Ok(btf), Some(version)) = (Btf::from_sys_fs(), compat::parse_release(release.trim()))
    else {
        return Vec::new();
    };
    let kallsyms = compat::Kallsyms::load().unwrap_or_else(|_| compat::Kallsyms::parse(""));
    compat::hook_status(&btf, &kallsyms, version)
}

/// Text output: one line per finding.
pub fn render_text(findings: &[Finding]) -> String {
    findings.iter().map(|f| f.line() + "\n").collect()
}

/// Reads everything `findings` needs for `device` from the running system.
pub fn gather(device: Device) -> Result<CheckInput> {
    let queue = QueueSettings::read(&device)?;
    let diskstats = std::fs::read_to_string("/proc/diskstats")
        .ok()
        .and_then(|t| find_diskstats(&t, device.major, device.minor));
    let uptime_secs = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| parse_uptime(&t));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .context("cannot read /proc/self/mountinfo")?;
    let io_hierarchy = cgroups::io_hierarchy(&mountinfo);
    let throttled = io_hierarchy
        .as_ref()
        .map(|(h, m)| throttled_cgroups(*h, m, device.major, device.minor))
        .unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let privs = privileges(parse_cap_eff(&status).unwrap_or(0));
    let btf = Btf::from_sys_fs().ok();
    let block_tracepoints = btf
        .as_ref()
        .is_some_and(|b| BLOCK_TRACEPOINTS.iter().all(|t| b.has_tracepoint(t)));
    let fentry = match &btf {
        Some(b) if privs != Privileges::Missing => Some(fentry_allowed(b)),
        _ => None,
    };
    Ok(CheckInput {
        device,
        queue,
        diskstats,
        uptime_secs,
        io_hierarchy,
        throttled,
        env: KernelEnv {
            btf: btf.is_some(),
            block_tracepoints,
            tracefs: tracefs_mount(&mountinfo),
            privileges: privs,
            fentry,
        },
    })
}

pub fn run(args: &CheckArgs) -> Result<()> {
    let device = device::resolve(&args.device)?;
    let input = gather(device)?;
    if args.json {
        println!("{}", serde_json::to_string(&report(&input))?);
    } else {
        print!("{}", render_text(&findings(&input)));
    }
    Ok(())
}

// ---- fentry probe ------------------------------------------------------------------------

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;

/// `union bpf_attr` for BPF_PROG_LOAD, up to `attach_btf_obj_fd` (offsets as in uapi bpf.h).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,            // 0
    insn_cnt: u32,             // 4
    insns: u64,                // 8
    license: u64,              // 16
    log_level: u32,            // 24
    log_size: u32,             // 28
    log_buf: u64,              // 32
    kern_version: u32,         // 40
    prog_flags: u32,           // 44
    prog_name: [u8; 16],       // 48
    prog_ifindex: u32,         // 64
    expected_attach_type: u32, // 68
    prog_btf_fd: u32,          // 72
    func_info_rec_size: u32,   // 76
    func_info: u64,            // 80
    func_info_cnt: u32,        // 88
    line_info_rec_size: u32,   // 92
    line_info: u64,            // 96
    line_info_cnt: u32,        // 104
    attach_btf_id: u32,        // 108
    attach_btf_obj_fd: u32,    // 112
    _pad: u32,                 // 116
}

/// `union bpf_attr` for BPF_RAW_TRACEPOINT_OPEN.
#[repr(C)]
#[derive(Default)]
struct RawTpOpenAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a valid, initialised bpf_attr prefix of the size passed; the kernel
    // only reads/writes within it (and the buffers it points to, which outlive the call).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as libc::c_int)
    }
}

struct Fd(libc::c_int);
impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::ENOENT) => "ENOENT".into(),
        Some(524) => "ENOTSUPP".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        Some(libc::ESRCH) => "ESRCH".into(),
        Some(libc::E2BIG) => "E2BIG".into(),
        _ => e.to_string(),
    }
}

/// Whether this kernel lets us attach fentry programs: loads `r0 = 0; exit` as a
/// BPF_PROG_TYPE_TRACING / BPF_TRACE_FENTRY program for `blk_mq_submit_bio` (resolved in
/// `btf`, the running kernel's vmlinux BTF) and attaches it for an instant, then closes both.
/// `Ok(false)`: the kernel refused with EPERM (a policy such as lockdown or a BPF LSM — call
/// this only with CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON, or EPERM means just that).
/// `Err`: any other failure, with the errno and the verifier's first line.
pub fn fentry_allowed(btf: &Btf) -> Result<bool, String> {
    let btf_id = btf
        .find(KIND_FUNC, FENTRY_PROBE_TARGET)
        .ok_or_else(|| format!("{FENTRY_PROBE_TARGET} is not in this kernel's BTF"))?;
    // mov64 r0, 0 ; exit
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..8].copy_from_slice(b"mt_probe");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_TRACING,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        expected_attach_type: BPF_TRACE_FENTRY,
        attach_btf_id: btf_id,
        ..Default::default()
    };
    let prog = match sys_bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Fd(fd),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Ok(false),
        Err(e) => {
            let end = log.iter().position(|&c| c == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            return Err(if first.is_empty() {
                format!(
                    "loading an fentry program on {FENTRY_PROBE_TARGET}: {}",
                    errno_name(&e)
                )
            } else {
                format!(
                    "loading an fentry program on {FENTRY_PROBE_TARGET}: {} ({first})",
                    errno_name(&e)
                )
            });
        }
    };
    let mut open = RawTpOpenAttr {
        name: 0,
        prog_fd: prog.0 as u32,
        _pad: 0,
    };
    match sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open) {
        Ok(link) => {
            drop(Fd(link));
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
        Err(e) => Err(format!(
            "attaching an fentry program to {FENTRY_PROBE_TARGET}: {}",
            errno_name(&e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::diskstats::parse_diskstats_line;
    use crate::sys::queue::parse_scheduler;
    use clap::Parser;

    /// The article's line, with the fields it elides filled with zeros.
    const ARTICLE: &str =
        "   8       0 sda 639705 234489 36923566 0 10636637 3282202 135302774 0 0 0 0 0 0 0 0 0 0";

    fn sda() -> Device {
        Device {
            name: "sda".into(),
            major: 8,
            minor: 0,
            notes: vec![],
            bio_based: false,
        }
    }

    fn loop_queue() -> QueueSettings {
        QueueSettings {
            scheduler: parse_scheduler("[none] mq-deadline kyber bfq"),
            nomerges: 0,
            max_sectors_kb: 1280,
            max_hw_sectors_kb: 1280,
            max_segments: 128,
            nr_requests: Some(128),
            rotational: false,
            logical_block_size: 512,
            hw_queues: 1,
            max_segment_size: Some(65536),
            chunk_sectors: Some(0),
            discard_max_bytes: Some(4 << 30),
        }
    }

    fn env() -> KernelEnv {
        KernelEnv {
            btf: true,
            block_tracepoints: true,
            tracefs: None,
            privileges: Privileges::Root,
            fentry: Some(Ok(false)),
        }
    }

    fn article_input() -> CheckInput {
        CheckInput {
            device: sda(),
            queue: loop_queue(),
            diskstats: find_diskstats(ARTICLE, 8, 0),
            uptime_secs: Some(41242.0),
            io_hierarchy: Some((Hierarchy::V2, "/sys/fs/cgroup".into())),
            throttled: vec![],
            env: env(),
        }
    }

    fn by_topic<'a>(f: &'a [Finding], topic: &str) -> &'a Finding {
        f.iter()
            .find(|x| x.topic == topic)
            .unwrap_or_else(|| panic!("no finding {topic} in {f:#?}"))
    }

    #[test]
    fn diskstats_lines() {
        let d = parse_diskstats_line(ARTICLE).unwrap();
        assert_eq!((d.major, d.minor, d.name.as_str()), (8, 0, "sda"));
        assert_eq!(
            (d.reads, d.reads_merged, d.read_sectors),
            (639705, 234489, 36923566)
        );
        assert_eq!(
            (d.writes, d.writes_merged, d.write_sectors),
            (10636637, 3282202, 135302774)
        );
        let full = "7 3 loop3 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17";
        let d = parse_diskstats_line(full).unwrap();
        assert_eq!(
            [
                d.reads,
                d.reads_merged,
                d.read_sectors,
                d.read_ms,
                d.writes,
                d.writes_merged,
                d.write_sectors,
                d.write_ms,
                d.in_flight,
                d.io_ms,
                d.weighted_io_ms,
                d.discards,
                d.discards_merged,
                d.discard_sectors,
                d.discard_ms,
                d.flushes,
                d.flush_ms
            ],
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
        );
        // A pre-4.18 line (11 numbers): discards and flushes read as 0.
        let old = parse_diskstats_line("8 0 sda 1 2 3 4 5 6 7 8 9 10 11").unwrap();
        assert_eq!((old.weighted_io_ms, old.discards, old.flush_ms), (11, 0, 0));
        assert_eq!(parse_diskstats_line("8 0 sda 1 2 3"), None);
        assert_eq!(
            parse_diskstats_line("8 0 sda 1 2 x 4 5 6 7 8 9 10 11"),
            None
        );
        let text = format!("{full}\n{ARTICLE}\n");
        assert_eq!(find_diskstats(&text, 8, 0).unwrap().name, "sda");
        assert_eq!(find_diskstats(&text, 7, 3).unwrap().name, "loop3");
        assert_eq!(find_diskstats(&text, 7, 4), None);
        assert_eq!(parse_uptime("41242.17 1720.41\n"), Some(41242.17));
        assert_eq!(parse_uptime(""), None);
    }

    #[test]
    fn article_arithmetic() {
        let f = findings(&article_input());
        let w = by_topic(&f, "write merges");
        assert!(
            w.finding.starts_with(
                "write merge rate since boot (11.5 h): 23.6 % (3,282,202 of 13,918,839 write bios merged into 10,636,637 device requests; 337 write bios/s on average; diskstats' merged also counts request-request merges)"
            ),
            "{}",
            w.finding
        );
        assert!(w.lever.as_deref().unwrap().contains("submit in batches"));
        let s = by_topic(&f, "write request size");
        assert!(
            s.finding.starts_with(
                "average write request reaching the device: 6.36 KiB (135,302,774 sectors over 10,636,637 requests; merging can build up to 512 KiB)"
            ),
            "{}",
            s.finding
        );
        let r = by_topic(&f, "read merges");
        // 234489 / (639705 + 234489) = 26.8 %
        assert!(
            r.finding.starts_with(
                "read merge rate since boot (11.5 h): 26.8 % (234,489 of 874,194 read bios merged into 639,705 device requests"
            ),
            "{}",
            r.finding
        );
        let rs = by_topic(&f, "read request size");
        // 36923566 / 639705 / 2 = 28.86 KiB
        assert!(rs.finding.contains("28.86 KiB"), "{}", rs.finding);
    }

    #[test]
    fn no_writes_since_boot() {
        let mut i = article_input();
        i.diskstats = parse_diskstats_line("7 3 loop3 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0");
        i.uptime_secs = None;
        let f = findings(&i);
        assert_eq!(by_topic(&f, "write merges").finding, "no writes since boot");
        assert!(f.iter().all(|x| x.topic != "write request size"));
        let r = by_topic(&f, "read merges");
        assert!(r.finding.starts_with("read merge rate since boot: 0.0 % (0 of 10 read bios merged into 10 device requests; diskstats'"), "{}", r.finding);
        assert!(by_topic(&f, "read request size")
            .finding
            .contains(": 4.00 KiB (80 sectors over 10 requests"));
        i.diskstats = None;
        let f = findings(&i);
        assert!(by_topic(&f, "diskstats")
            .finding
            .contains("no line in /proc/diskstats"));
    }

    #[test]
    fn scheduler_and_nomerges_per_setting() {
        let mut i = article_input();
        let f = findings(&i);
        let s = by_topic(&f, "scheduler");
        assert_eq!(
            s.finding,
            "none, also available: mq-deadline, kyber, bfq: no elevator: bios merge in the task's plug list, then on the software queues (blk_bio_list_merge); nr_requests=128"
        );
        let n = by_topic(&f, "nomerges");
        assert!(n
            .finding
            .starts_with("nomerges=0: all merge attempts are on"));
        assert_eq!(
            n.lever.as_deref(),
            Some("echo 2 > /sys/block/sda/queue/nomerges turns every merge off; 1 would change nothing here")
        );
        i.queue.nomerges = 1;
        let f = findings(&i);
        let n = by_topic(&f, "nomerges");
        assert!(
            n.finding
                .starts_with("nomerges=1 changes nothing with scheduler none"),
            "{}",
            n.finding
        );
        assert!(n
            .lever
            .as_deref()
            .unwrap()
            .contains("1 is the same as 0 on this path"));
        i.queue.scheduler = parse_scheduler("none [mq-deadline] kyber bfq");
        let f = findings(&i);
        assert!(by_topic(&f, "scheduler").finding.starts_with("mq-deadline, also available: none, kyber, bfq: bios merge in the task's plug list, then in mq-deadline through elv_merge"));
        let n = by_topic(&f, "nomerges");
        assert!(
            n.finding
                .starts_with("nomerges=1 with mq-deadline: plug merges still happen"),
            "{}",
            n.finding
        );
        assert!(n
            .lever
            .as_deref()
            .unwrap()
            .contains("echo 0 to restore the hash lookup"));
        i.queue.nomerges = 0;
        assert!(by_topic(&findings(&i), "nomerges")
            .lever
            .as_deref()
            .unwrap()
            .contains("1 only drops mq-deadline's hash and front-merge lookups"));
        i.queue.nomerges = 2;
        let f = findings(&i);
        let n = by_topic(&f, "nomerges");
        assert!(n.finding.starts_with("nomerges=2 disables all bio merges"));
        assert_eq!(
            n.lever.as_deref(),
            Some("echo 0 > /sys/block/sda/queue/nomerges turns merging back on")
        );
        let p = by_topic(&f, "plug flush");
        assert!(
            p.finding.starts_with(
                "a task's plug list is flushed to the device at 32 requests only (the 128 KiB size rule is off with nomerges=2); 64 requests"
            ),
            "{}",
            p.finding
        );
        i.queue.scheduler = parse_scheduler("none [kyber]");
        assert!(by_topic(&findings(&i), "scheduler")
            .finding
            .contains("kyber's per-domain lists"));
    }

    #[test]
    fn ceilings_and_plug() {
        let mut i = article_input();
        let f = findings(&i);
        let c = by_topic(&f, "merge ceiling");
        assert_eq!(
            c.finding,
            "the largest request merging can build is 512 KiB = min(max_sectors_kb 1,280 KiB, max_segments 128 × 4 KiB pages = 512 KiB), set by max_segments; max_hw_sectors_kb 1280; not rotational: no seek to save, merging pays only where something counts requests"
        );
        assert_eq!(c.lever, None);
        let p = by_topic(&f, "plug flush");
        assert_eq!(
            p.finding,
            "a task's plug list is flushed to the device at 32 requests, or as soon as its last request has reached 128 KiB; 64 requests once the plug also holds requests for another device (md/dm over several disks); the hardware queue count (1) plays no part"
        );
        i.queue.max_sectors_kb = 256;
        i.queue.rotational = true;
        i.queue.hw_queues = 4;
        let f = findings(&i);
        let c = by_topic(&f, "merge ceiling");
        assert!(
            c.finding
                .starts_with("the largest request merging can build is 256 KiB"),
            "{}",
            c.finding
        );
        assert!(
            c.finding.contains("set by max_sectors_kb") && c.finding.contains("rotational: seeks")
        );
        assert_eq!(
            c.lever.as_deref(),
            Some("echo 512 > /sys/block/sda/queue/max_sectors_kb raises it to 512 KiB (beyond that max_segments binds)")
        );
        assert!(by_topic(&f, "plug flush")
            .finding
            .ends_with("the hardware queue count (4) plays no part"));
        assert!(by_topic(&f, "device")
            .finding
            .contains("4 hardware queues, rotational"));
    }

    #[test]
    fn bio_based_device() {
        let mut i = article_input();
        i.device = Device {
            name: "zram0".into(),
            major: 252,
            minor: 0,
            notes: vec!["zram0 is bio-based (no request queue): bios ...".into()],
            bio_based: true,
        };
        i.queue.scheduler = None;
        i.queue.nr_requests = None;
        i.queue.hw_queues = 0;
        i.diskstats = parse_diskstats_line("252 0 zram0 100 0 800 0 50 0 400 0 0 0 0 0 0 0 0 0 0");
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "device").finding,
            "zram0 (252:0) is bio-based: no scheduler and no request queue, so it never merges; nomerges, max_sectors_kb and the plug limits do not apply"
        );
        assert!(by_topic(&f, "scheduler")
            .finding
            .starts_with("none: zram0 is bio-based"));
        assert!(by_topic(&f, "nomerges").finding.contains("bio-based"));
        assert!(by_topic(&f, "write merges")
            .finding
            .starts_with("zram0 is bio-based: 0 merges by construction; 50 write bios since boot (11.5 h); 0 write bios/s on average"));
        assert!(by_topic(&f, "write request size")
            .finding
            .starts_with("average write bio 4.00 KiB"));
        assert!(f
            .iter()
            .all(|x| x.topic != "merge ceiling" && x.topic != "plug flush"));
    }

    #[test]
    fn partition_note_is_kept() {
        let mut i = article_input();
        i.device.notes = vec!["sda1 is a partition of sda: tracing sda".into()];
        assert!(by_topic(&findings(&i), "device")
            .finding
            .ends_with("; sda1 is a partition of sda: tracing sda"));
    }

    #[test]
    fn throttle_findings() {
        let mut i = article_input();
        let f = findings(&i);
        assert_eq!(
            by_topic(&f, "throttle").finding,
            "no cgroup limits sda (cgroup v2 hierarchy at /sys/fs/cgroup)"
        );
        i.io_hierarchy = Some((Hierarchy::V1, "/sys/fs/cgroup/blkio".into()));
        i.throttled = vec![
            ThrottledCgroup {
                hierarchy: Hierarchy::V1,
                path: "/mt".into(),
                limits: Limits {
                    wiops: Some(2000),
                    ..Default::default()
                },
            },
            ThrottledCgroup {
                hierarchy: Hierarchy::V1,
                path: "/both".into(),
                limits: Limits {
                    rbps: Some(1 << 20),
                    wbps: Some(1000),
                    riops: Some(50),
                    wiops: None,
                },
            },
        ];
        let f = findings(&i);
        let t: Vec<&Finding> = f.iter().filter(|x| x.topic == "throttle").collect();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0].finding,
            "cgroup /mt (cgroup v1 blkio blkio.throttle.*_device) limits sda: wiops=2,000 bios/s — binds only its own bios (cgroup v1 throttling is flat: children are not limited)"
        );
        assert_eq!(
            t[0].lever.as_deref(),
            Some("wiops: iops limit counts bios before merging: submit larger bios; merging cannot raise it")
        );
        assert_eq!(
            t[1].finding,
            "cgroup /both (cgroup v1 blkio blkio.throttle.*_device) limits sda: rbps=1 MiB/s, wbps=1,000 B/s, riops=50 bios/s — binds only its own bios (cgroup v1 throttling is flat: children are not limited)"
        );
        assert_eq!(
            t[1].lever.as_deref(),
            Some("riops: iops limit counts bios before merging: submit larger bios; merging cannot raise it; rbps, wbps: bps limit is blind to merging (a merged bio carries the same bytes)")
        );
        i.io_hierarchy = None;
        i.throttled.clear();
        assert!(by_topic(&findings(&i), "throttle")
            .finding
            .starts_with("no cgroup hierarchy"));
    }

    #[test]
    fn walks_cgroup_trees() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("c")).unwrap();
        std::fs::write(root.join("blkio.throttle.read_bps_device"), "7:3 4096\n").unwrap();
        std::fs::write(
            root.join("a/b/blkio.throttle.write_iops_device"),
            "7:3 2000\n7:4 9\n",
        )
        .unwrap();
        std::fs::write(root.join("c/blkio.throttle.write_iops_device"), "7:4 10\n").unwrap();
        let v = throttled_cgroups(Hierarchy::V1, root, 7, 3);
        assert_eq!(
            v.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
            ["/", "/a/b"]
        );
        assert_eq!(v[1].limits.wiops, Some(2000));
        assert_eq!(v[0].limits.rbps, Some(4096));
        std::fs::write(
            root.join("c/io.max"),
            "7:3 rbps=max wbps=max riops=max wiops=300\n",
        )
        .unwrap();
        let v2 = throttled_cgroups(Hierarchy::V2, root, 7, 3);
        assert_eq!(v2.len(), 1);
        assert_eq!((v2[0].path.as_str(), v2[0].limits.wiops), ("/c", Some(300)));
        assert!(throttled_cgroups(Hierarchy::V1, &root.join("nope"), 7, 3).is_empty());
    }

    #[test]
    fn capabilities_and_tiers() {
        let status = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1fffeffffff));
        assert_eq!(privileges(0x1fffeffffff), Privileges::Root);
        assert_eq!(privileges((1 << 39) | (1 << 38)), Privileges::BpfPerfmon);
        assert_eq!(privileges(1 << 39), Privileges::Missing);
        assert_eq!(parse_cap_eff("Name: x\n"), None);

        let mut e = env();
        assert_eq!(
            tier(&e),
            TierCheck {
                name: "tracepoint",
                reason: "fentry refused by this kernel's policy: tracepoint tier".into()
            }
        );
        e.fentry = Some(Ok(true));
        assert_eq!(tier(&e).name, "fentry");
        assert_eq!(
            tier(&e).reason,
            "fentry tier available: the kernel accepted an fentry program on blk_mq_submit_bio"
        );
        e.fentry = Some(Err("loading ...: EINVAL".into()));
        assert_eq!(
            tier(&e).reason,
            "fentry probe failed (loading ...: EINVAL): tracepoint tier"
        );
        e.fentry = None;
        e.privileges = Privileges::Missing;
        assert_eq!(tier(&e).name, "none");
        let mut i = article_input();
        i.env = e.clone();
        let t = by_topic(&findings(&i), "tier").clone();
        assert!(
            t.finding
                .starts_with("mergetrace cannot trace here: needs root"),
            "{}",
            t.finding
        );
        assert_eq!(
            t.lever.as_deref(),
            Some("run it with sudo, or grant CAP_BPF and CAP_PERFMON")
        );
        e.privileges = Privileges::Root;
        e.btf = false;
        assert!(tier(&e).reason.contains("no BTF"));
        e.btf = true;
        e.block_tracepoints = false;
        assert_eq!(tier(&e).name, "none");

        let f = findings(&article_input());
        let t = by_topic(&f, "tier");
        assert_eq!(
            t.finding,
            "fentry refused by this kernel's policy: tracepoint tier; throttle delays are not measured and failed merge attempts are invisible; BTF present, block tracepoints in BTF, CAP_SYS_ADMIN, tracefs not mounted (not needed: the tracepoints attach through BTF)"
        );
        assert_eq!(f.last().unwrap().topic, "tier");
    }

    #[test]
    fn tracefs_in_mountinfo() {
        let mi = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                  50 22 0:12 / /sys/kernel/tracing rw,nosuid - tracefs tracefs rw\n";
        assert_eq!(tracefs_mount(mi), Some("/sys/kernel/tracing".into()));
        assert_eq!(tracefs_mount("31 23 0:28 / /x rw - tmpfs tmpfs rw\n"), None);
    }

    #[test]
    fn text_and_json() {
        let i = article_input();
        let f = findings(&i);
        let text = render_text(&f);
        assert_eq!(text.lines().count(), f.len());
        assert!(text.lines().any(|l| l
            .starts_with("write merges: write merge rate since boot (11.5 h): 23.6 %")
            && l.contains(" — lever: merging needs a neighbour")));
        assert!(text
            .lines()
            .any(|l| l.starts_with("plug flush: ") && !l.contains("lever")));
        let v = serde_json::to_value(report(&i)).unwrap();
        assert_eq!(v["device"], "sda");
        assert_eq!(v["dev"], "8:0");
        assert_eq!(v["tier"]["name"], "tracepoint");
        assert_eq!(
            v["tier"]["reason"],
            "fentry refused by this kernel's policy: tracepoint tier"
        );
        assert_eq!(v["findings"].as_array().unwrap().len(), f.len());
        assert_eq!(v["findings"][0]["topic"], "device");
        assert!(v["findings"][0]["lever"].is_null());
        assert_eq!(v["queue"]["max_segments"], 128);
        assert_eq!(v["diskstats"]["writes_merged"], 3282202);
    }

    #[test]
    fn args() {
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: CheckArgs,
        }
        let t = T::try_parse_from(["x", "-d", "loop3", "--json"]).unwrap();
        assert_eq!((t.a.device.as_str(), t.a.json), ("loop3", true));
        assert!(T::try_parse_from(["x"]).is_err());
        assert!(T::try_parse_from(["x", "-d", "a", "-d", "b"]).is_err());
    }

    #[test]
    fn fentry_probe_needs_the_target_in_btf() {
        use crate::kernel::btf::tests::Builder;
        let mut b = Builder::new();
        b.int("int", 4);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(
            fentry_allowed(&btf),
            Err("blk_mq_submit_bio is not in this kernel's BTF".into())
        );
    }
}
