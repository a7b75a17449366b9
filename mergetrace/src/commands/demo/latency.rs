//! The demo's latency arm: what merging costs the requests beside it. A sequential writer
//! whose 4 KiB bios merge (batches of 32) and an "interactive" reader (4 KiB reads, one at a
//! time) share the scratch disk under mq-deadline, in two cgroups of the demo's own, with
//! nomerges 0, 1 and 2; each arm shows the reader's queue and device latency next to the
//! writer's requests (`--latency`'s histograms). Self-check: each cgroup's bios equal what it
//! submitted (and, on cgroup v2, its io.stat), its latency counts equal its requests, and the
//! writer's requests equal the scratch disk's writes in /proc/diskstats. The disk's reads are
//! no check: other processes (udev's blkid, `btrfs device scan`) read a new disk.
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use mergetrace_common::LOST_COMPLETION_UNSEEN;

use super::{
    check_interrupted,
    lab::{mismatch, DemoCgroup, Lab},
};
use crate::{
    fmt,
    model::{
        aggregate::{Counts, Dir, Key, Window},
        latency::{Class, Latency, Stage},
    },
    sys::{cgroups::Cgroups, diskstats::DiskStats},
};

/// One nomerges level: each cgroup's counts and latency, and the disk's.
pub(super) struct LatencyArm {
    pub(super) nomerges: u32,
    pub(super) writer: (Counts, Latency),
    pub(super) reader: (Counts, Latency),
    /// The bios each submitted.
    pub(super) submitted: (u64, u64),
    /// Each cgroup's io.stat `wios` / `rios` over the arm (cgroup v2).
    pub(super) own_ios: (Option<u64>, Option<u64>),
    pub(super) disk: DiskStats,
    /// Requests the kernel ended without running the completion program, as far as seen in
    /// the arm (lost `completion_unseen`: found when their tag is issued again).
    pub(super) unseen: u64,
}

impl LatencyArm {
    /// Mismatches against the kernel's counters, as sentences.
    pub(super) fn mismatches(&self) -> Vec<String> {
        let label = format!("latency arm nomerges={}", self.nomerges);
        let differs =
            |what: &str, ours, source: &str, theirs| mismatch(&label, what, ours, source, theirs);
        let mut out: Vec<String> = differs(
            "writer's device requests",
            self.writer.0.requests(),
            "/proc/diskstats writes",
            self.disk.writes,
        )
        .into_iter()
        .collect();
        let each = [
            (
                "writer",
                &self.writer,
                self.submitted.0,
                self.own_ios.0,
                "wios",
            ),
            (
                "reader",
                &self.reader,
                self.submitted.1,
                self.own_ios.1,
                "rios",
            ),
        ];
        for (who, (c, l), submitted, own, field) in each {
            let bios = c.bios_per_request();
            out.extend(differs(
                &format!("{who}'s bios"),
                bios,
                "it submitted",
                submitted,
            ));
            if let Some(own) = own {
                out.extend(differs(
                    &format!("{who}'s bios and split pieces"),
                    bios + c.splits,
                    &format!("its io.stat {field}"),
                    own,
                ));
            }
            let requests = c.requests();
            let queue = l.count(Stage::Queue, Class::All);
            let device = l.count(Stage::Device, Class::All);
            out.extend(differs(
                &format!("{who}'s queue latency count"),
                queue,
                "its requests",
                requests,
            ));
            if device < requests && queue == requests {
                // Each issued and counted, some never seen to end: say it as what it is.
                out.push(format!(
                    "{label}: {who}'s device latency count: mergetrace counted {device}, its \
                     requests {requests}: {} {UNSEEN} ({} found so far as lost \
                     completion_unseen)",
                    requests - device,
                    self.unseen
                ));
            } else {
                out.extend(differs(
                    &format!("{who}'s device latency count"),
                    device,
                    "its requests",
                    requests,
                ));
            }
        }
        out
    }
}

/// How a mismatch of completions the programs never saw ends its sentence (the test tells
/// them from other mismatches by it).
const UNSEEN: &str = "requests ended without the kernel running mergetrace's completion program";

/// The three arms: `writes` 4 KiB writes in batches of 32 from offset 0, `reads` 4 KiB reads
/// one at a time from the second half of the disk, at once.
pub(super) fn arms(lab: &mut Lab, writes: u64, reads: u64) -> Result<Vec<LatencyArm>> {
    let cgroups = Cgroups::discover()?;
    let writer = DemoCgroup::new(&cgroups, "writer")?;
    let reader = DemoCgroup::new(&cgroups, "reader")?;
    lab.disk.queue("scheduler", "mq-deadline")?;
    let mut arms = Vec::new();
    for nomerges in [0u32, 1, 2] {
        check_interrupted()?;
        eprintln!("mergetrace demo: latency arm, nomerges={nomerges} …");
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        let counted_before = lab.session.read_totals()?;
        let before = DiskStats::read(lab.disk.dev.major, lab.disk.dev.minor)?;
        let own_before = (
            writer.own_ios(&lab.disk.dev, "wios")?,
            reader.own_ios(&lab.disk.dev, "rios")?,
        );
        let w = spawn(
            lab,
            &writer,
            &["--ios", &writes.to_string(), "--batch", "32"],
        )?;
        let offset = (writes * 4096).to_string();
        let r = spawn(
            lab,
            &reader,
            &[
                "--op",
                "read",
                "--ios",
                &reads.to_string(),
                "--batch",
                "1",
                "--offset",
                &offset,
            ],
        )?;
        for (mut child, who) in [(w, "writer"), (r, "reader")] {
            let status = child.wait()?;
            if !status.success() {
                bail!("the latency arm's {who} failed ({status})");
            }
        }
        let window = lab.session.read_totals()?.since(&counted_before);
        let disk = DiskStats::read(lab.disk.dev.major, lab.disk.dev.minor)?.since(&before);
        let since = |after: Option<u64>, before: Option<u64>| after.zip(before).map(|(a, b)| a - b);
        let own_ios = (
            since(writer.own_ios(&lab.disk.dev, "wios")?, own_before.0),
            since(reader.own_ios(&lab.disk.dev, "rios")?, own_before.1),
        );
        let dev = lab.disk.dev.dev().0;
        let unseen = u8::try_from(LOST_COMPLETION_UNSEEN)
            .ok()
            .and_then(|k| window.lost_by_kind.get(&k))
            .copied()
            .unwrap_or(0);
        arms.push(LatencyArm {
            nomerges,
            writer: of(&window, dev, &writer, Dir::Write)?,
            reader: of(&window, dev, &reader, Dir::Read)?,
            submitted: (writes, reads),
            own_ios,
            disk,
            unseen,
        });
    }
    lab.disk.queue("nomerges", "0")?;
    lab.disk.queue("scheduler", "none")?;
    Ok(arms)
}

/// The built-in workload in `cg`, started.
fn spawn(lab: &Lab, cg: &DemoCgroup, args: &[&str]) -> Result<std::process::Child> {
    Command::new(&lab.exe)
        .arg("__workload")
        .arg("--target")
        .arg(&lab.disk.path)
        .args(args)
        .arg("--cgroup")
        .arg(&cg.dir)
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start the workload")
}

/// A cgroup's counts and latency in one direction of the window.
fn of(w: &Window, dev: u32, cg: &DemoCgroup, dir: Dir) -> Result<(Counts, Latency)> {
    let key = Key {
        dev,
        cgroup_id: cg.id()?,
        dir,
    };
    Ok((
        w.counts.get(&key).copied().unwrap_or_default(),
        Latency(w.latency.get(&key).copied().unwrap_or_default()),
    ))
}

/// Table 5: the reader's latency as merging is turned off.
pub(super) fn print(arms: &[LatencyArm], writes: u64, reads: u64) {
    let mib = (writes * 4096) >> 20;
    println!(
        "\n5. What merging costs the requests beside it: a writer ({mib} MiB, batches of 32) and \
         a reader ({} 4 KiB reads, one at a time) at once, mq-deadline",
        fmt::thousands(reads)
    );
    println!(
        "| nomerges | Writer's requests | Reader's queue p50 / p99 | Reader's device p50 / p99 \
         | Reader's mean (queue + device) | check |"
    );
    println!("|---|---|---|---|---|---|");
    for a in arms {
        let l = &a.reader.1;
        let p = |stage, q| {
            l.quantile_us(stage, Class::All, q)
                .map_or("-".into(), fmt::latency_bound)
        };
        let mean = l.mean_us(Stage::Queue, Class::All).unwrap_or(0.0)
            + l.mean_us(Stage::Device, Class::All).unwrap_or(0.0);
        println!(
            "| {} | {} | {} / {} | {} / {} | {} µs | {} |",
            a.nomerges,
            fmt::thousands(a.writer.0.requests()),
            p(Stage::Queue, 0.5),
            p(Stage::Queue, 0.99),
            p(Stage::Device, 0.5),
            p(Stage::Device, 0.99),
            fmt::micros(mean),
            if a.mismatches().is_empty() {
                "="
            } else {
                "≠"
            }
        );
    }
    println!(
        "Percentiles are log2 bucket bounds (\"at most\"); the means are exact. On a loop \
         device the device side is a memory copy: a real disk's seek and queue depth make \
         the writer's merged requests weigh more."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup's counts: `bios` in `requests`, each request's latency counted.
    fn side(bios: u64, requests: u64) -> (Counts, Latency) {
        let counts = Counts {
            rq_bios: bios,
            issues: requests,
            ..Counts::default()
        };
        let mut l = Latency::default();
        l.0.queue[0][3] = requests;
        l.0.device[0][5] = requests;
        (counts, l)
    }

    /// nomerges=0: the writer's 8,192 bios in 256 requests, the reader's 512 alone.
    fn arm() -> LatencyArm {
        LatencyArm {
            nomerges: 0,
            writer: side(8_192, 256),
            reader: side(512, 512),
            submitted: (8_192, 512),
            own_ios: (Some(8_192), Some(512)),
            disk: DiskStats {
                writes: 256,
                reads: 512,
                ..DiskStats::default()
            },
            unseen: 0,
        }
    }

    #[test]
    fn another_process_reading_the_disk_fails_nothing() {
        assert!(arm().mismatches().is_empty());
        // udev's blkid read the disk 56 times during the arm: the disk's reads are no check.
        let mut a = arm();
        a.disk.reads += 56;
        assert!(a.mismatches().is_empty(), "{:?}", a.mismatches());
    }

    #[test]
    fn a_mismatch_names_the_arm_the_count_and_both_numbers() {
        let mut a = arm();
        a.disk.writes = 257;
        a.reader.0.rq_bios = 511;
        a.own_ios.1 = Some(513);
        assert_eq!(
            a.mismatches(),
            [
                "latency arm nomerges=0: writer's device requests: mergetrace counted 256, \
                 /proc/diskstats writes 257",
                "latency arm nomerges=0: reader's bios: mergetrace counted 511, it submitted 512",
                "latency arm nomerges=0: reader's bios and split pieces: mergetrace counted 511, \
                 its io.stat rios 513",
            ]
        );
        let mut a = arm();
        a.writer.1 .0.device[0][5] = 250;
        a.unseen = 4;
        assert_eq!(
            a.mismatches(),
            [format!(
                "latency arm nomerges=0: writer's device latency count: mergetrace counted 250, \
                 its requests 256: 6 {UNSEEN} (4 found so far as lost completion_unseen)"
            )]
        );
    }
}
