//! The demo's tables as it prints them, each row with its check mark, and the
//! verdicts of the throttled arms.
use super::lab::{Arm, Lab};
use crate::{
    fmt,
    model::{
        limits::{Effective, Limit},
        meter, verdict,
    },
};

fn check_mark(arm: &Arm) -> &'static str {
    if arm.mismatches().is_empty() {
        "="
    } else {
        "≠"
    }
}

/// The title, and tables 1 (nomerges) and 2 (batch sizes).
pub(super) fn print(lab: &Lab, mib: u64, nomerges: &[Arm], batch: &[Arm]) {
    println!(
        "mergetrace demo — {} KiB sequential O_DIRECT writes on {} (loop on /dev/shm), {} tier",
        4,
        lab.disk.dev.name,
        lab.session.tier.kind.name()
    );
    println!("\"=\": mergetrace's count equals /proc/diskstats (and blk-throttle's own counter)\n");
    println!("1. Merging is the reward for how you submit ({mib} MiB per arm, mq-deadline)");
    println!("| Arm | Device requests | Merged bios | Average request | check |");
    println!("|---|---|---|---|---|");
    for a in nomerges {
        println!(
            "| {} | {} | {} | {:.1} KiB | {} |",
            a.label,
            fmt::thousands(a.counts.requests()),
            fmt::thousands(a.counts.merged_per_request()),
            a.avg_request_kib(),
            check_mark(a)
        );
    }
    println!("\n2. How far does the batch go? (nomerges=0)");
    println!("| Submission batch | Device requests | Bios per request | Average request | check |");
    println!("|---|---|---|---|---|");
    for a in batch {
        let r = a.counts.requests().max(1);
        println!(
            "| {} | {} | {:.1} | {:.1} KiB | {} |",
            a.label.trim_start_matches("batch "),
            fmt::thousands(a.counts.requests()),
            a.counts.bios_per_request() as f64 / r as f64,
            a.avg_request_kib(),
            check_mark(a)
        );
    }
}

/// Table 3 (under an IOPS limit set on cgroup `limited`), the verdicts, and where the meter sits.
pub(super) fn print_throttled(arms: &[Arm], wiops: u64, throttle_secs: u64, limited: &str) {
    println!("\n3. Under an IOPS limit (wiops={wiops}, {throttle_secs} s of bios at the limit)");
    println!(
        "| Arm | Device requests | Merged | Total bios | Charged | Throttled | IOPS | check |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for a in arms {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            a.label,
            fmt::thousands(a.counts.requests()),
            fmt::thousands(a.counts.merged_per_request()),
            fmt::thousands(a.counts.bios_per_request()),
            fmt::thousands(a.counts.charged_ios),
            fmt::thousands(a.counts.throttled_bios),
            a.counts.bios_per_request() as f64 / a.secs,
            check_mark(a)
        );
    }
    let eff = Effective {
        wiops: Some(Limit {
            limit: wiops,
            cgroup: limited.to_string(),
        }),
        ..Default::default()
    };
    println!();
    for a in arms {
        let charged = meter::Charged {
            ios: a.counts.charged_ios,
            bytes: a.counts.charged_bytes,
            requests_created: a.counts.requests_created(),
        };
        let mut lu = meter::limit_use(&eff, true, charged, a.secs);
        verdict::mark_held(&mut lu, a.counts.throttled_bios > 0);
        if let Some(v) = verdict::verdict(
            &lu,
            &verdict::Activity {
                bios: a.counts.rq_bios,
                splits: a.counts.splits,
                requests: a.counts.requests(),
                charged_ios: a.counts.charged_ios,
                throttled_bios: a.counts.throttled_bios,
                ..verdict::Activity::default()
            },
        ) {
            println!("verdict, {}: {v}", a.label);
        }
    }
    let merged_on = &arms[0];
    let units = merged_on.counts.meter_units[0];
    println!(
        "\nWhere the meter sits: the limit counted {} bios; the device saw {} requests; a cloud volume \
         counting requests in 256 KiB units would count {} — merging helps only a meter that counts after it.",
        fmt::thousands(merged_on.counts.charged_ios),
        fmt::thousands(merged_on.counts.requests()),
        fmt::thousands(units)
    );
}

/// Table 4: under io.cost, merging is what raises the IOPS (or, where io.cost cannot be on,
/// one line saying why).
pub(super) fn print_iocost(arms: &Result<Vec<Arm>, &str>, mib: u64) {
    let arms = match arms {
        Err(why) => {
            println!("\n4. Under io.cost: skipped — {why}");
            return;
        }
        Ok(arms) => arms,
    };
    println!(
        "\n4. Under io.cost (cgroup v2; {}; {mib} MiB per arm)",
        super::iocost::MODEL_WORDS
    );
    println!(
        "\"=\": mergetrace's io.cost charge equals io.stat cost.usage, less than 1 µs per period \
         above it (the kernel floors each period's sum); io.cost busy: device time charged per \
         second of the arm — one cgroup alone may use about a second a second (a little more at \
         first: an idle cgroup starts with some budget)"
    );
    println!(
        "| Arm | Device requests | Merged bios | IOPS | io.cost busy | io.cost charged \
         (mergetrace) | io.stat cost.usage | check |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for a in arms {
        let Some(i) = a.iocost else { continue };
        println!(
            "| {} | {} | {} | {:.0} | {:.0} % | {} µs | {} µs | {} |",
            a.label,
            fmt::thousands(a.counts.requests()),
            fmt::thousands(a.counts.merged_per_request()),
            i.iops,
            i.busy_pct,
            fmt::thousands(i.ours_us.round() as u64),
            fmt::thousands(i.kernel_us),
            check_mark(a)
        );
    }
    let (Some(on), Some(off)) = (
        arms.first().and_then(|a| a.iocost),
        arms.get(1).and_then(|a| a.iocost),
    ) else {
        return;
    };
    let cost_ratio = off.ours_us / on.ours_us.max(1.0);
    let bought = on.iops / off.iops.max(1e-9);
    // Below ~90 % busy the merged arm did not reach io.cost's budget: the machine held it.
    let held_by = if on.busy_pct < 90.0 {
        format!(
            " — the merged arm kept io.cost {:.0} % busy, so this machine, not io.cost, held \
             it; io.cost alone would allow {cost_ratio:.1}×",
            on.busy_pct
        )
    } else {
        String::new()
    };
    println!(
        "\nWhere the meter sits: io.cost charges a bio that starts a request a base cost and one \
         that merges its pages only, so the same {mib} MiB cost {} µs of device time merged and \
         {} µs unmerged ({cost_ratio:.1}×): under io.cost the meter sits after merging, and \
         merging bought {bought:.1}× the IOPS here{held_by}.",
        fmt::thousands(on.ours_us.round() as u64),
        fmt::thousands(off.ours_us.round() as u64),
    );
}
