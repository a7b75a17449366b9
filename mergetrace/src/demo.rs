//! `mergetrace demo`: the article's lab, built in. A loop device on a file in /dev/shm, the
//! built-in O_DIRECT workload, mergetrace's own probes, and the article's tables — each number
//! checked against /proc/diskstats (and blk-throttle's counter for the throttled arms).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use mergetrace_common::Modes;

use crate::{
    aggregate::{self, Counts, Dir, Key},
    cgroups::{Cgroups, Hierarchy},
    device::{self, Device},
    diskstats::DiskStats,
    kernel::{self, Session, TierChoice},
    limits::{Effective, Limit},
    meter,
};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// A smaller set that runs in well under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Probes to use (auto: fentry where allowed).
    #[arg(long, value_enum, default_value = "auto")]
    pub tier: TierChoice,
}

/// Set by SIGINT/SIGTERM: the demo stops between steps and cleans up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A loop device over a sparse file in /dev/shm; detached and deleted on drop.
struct ScratchDisk {
    backing: PathBuf,
    dev: Device,
    path: PathBuf,
    /// Queue settings the loop device had (a reused one keeps an earlier user's): put back
    /// before it is detached.
    saved: Vec<(&'static str, String)>,
}

/// The queue settings the demo changes.
const QUEUE_ATTRS: [&str; 3] = ["scheduler", "nomerges", "max_sectors_kb"];

impl ScratchDisk {
    fn new(bytes: u64) -> Result<ScratchDisk> {
        let backing = PathBuf::from(format!(
            "/dev/shm/mergetrace-demo-{}.img",
            std::process::id()
        ));
        let f = std::fs::File::create(&backing)
            .with_context(|| format!("cannot create {}", backing.display()))?;
        f.set_len(bytes)?;
        drop(f);
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&backing)
            .output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let _ = std::fs::remove_file(&backing);
                bail!(
                    "losetup failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            Err(e) => {
                let _ = std::fs::remove_file(&backing);
                bail!("cannot run losetup ({e}): install util-linux/mount");
            }
        };
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let dev = match device::resolve(&path.display().to_string()) {
            Ok(d) => d,
            Err(e) => {
                let _ = Command::new("losetup").arg("-d").arg(&path).status();
                let _ = std::fs::remove_file(&backing);
                return Err(e);
            }
        };
        let mut disk = ScratchDisk {
            backing,
            dev,
            path,
            saved: Vec::new(),
        };
        // From here on Drop detaches it. Start from a loop device's defaults, whatever an
        // earlier user left: the tables depend on them.
        for attr in QUEUE_ATTRS {
            let now = disk.read_queue(attr)?;
            disk.saved.push((attr, now));
        }
        let max_hw = disk.read_queue("max_hw_sectors_kb")?;
        disk.queue("max_sectors_kb", &max_hw)?;
        disk.queue("nomerges", "0")?;
        disk.queue("scheduler", "none")?;
        Ok(disk)
    }

    fn queue_file(&self, attr: &str) -> PathBuf {
        Path::new("/sys/block")
            .join(&self.dev.name)
            .join("queue")
            .join(attr)
    }

    /// A queue attribute's value; for the scheduler, the active one.
    fn read_queue(&self, attr: &str) -> Result<String> {
        let p = self.queue_file(attr);
        let v =
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
        Ok(match attr {
            "scheduler" => v
                .split_whitespace()
                .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
                .unwrap_or("none")
                .to_string(),
            _ => v.trim().to_string(),
        })
    }

    fn queue(&self, attr: &str, value: &str) -> Result<()> {
        let p = self.queue_file(attr);
        std::fs::write(&p, value)
            .with_context(|| format!("cannot write {value} to {}", p.display()))
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        for (attr, v) in self.saved.iter().rev() {
            let _ = self.queue(attr, v);
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
        let _ = std::fs::remove_file(&self.backing);
    }
}

/// A cgroup of the demo's own with a write-iops limit on the scratch disk; removed on drop.
struct LimitedCgroup {
    dir: PathBuf,
    rel: String,
    hierarchy: Hierarchy,
}

impl LimitedCgroup {
    fn new(cg: &Cgroups, dev: &Device, wiops: u64) -> Result<LimitedCgroup> {
        let rel = format!("/mergetrace-demo-{}", std::process::id());
        let dir = cg.mount.join(rel.trim_start_matches('/'));
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create cgroup {}", dir.display()))?;
        let me = LimitedCgroup {
            dir,
            rel,
            hierarchy: cg.hierarchy,
        };
        let (file, line) = match me.hierarchy {
            Hierarchy::V1 => (
                "blkio.throttle.write_iops_device",
                format!("{}:{} {wiops}", dev.major, dev.minor),
            ),
            Hierarchy::V2 => (
                "io.max",
                format!("{}:{} wiops={wiops}", dev.major, dev.minor),
            ),
        };
        std::fs::write(me.dir.join(file), &line)
            .with_context(|| format!("cannot set {line} in {}", me.dir.join(file).display()))?;
        Ok(me)
    }

    /// Bios blk-throttle saw for writes on `dev`: v1 `io_serviced` (every pass), v2 io.stat wios.
    fn kernel_write_ios(&self, dev: &Device) -> Result<u64> {
        let key = format!("{}:{}", dev.major, dev.minor);
        match self.hierarchy {
            Hierarchy::V1 => {
                let t = std::fs::read_to_string(self.dir.join("blkio.throttle.io_serviced"))?;
                Ok(t.lines()
                    .find_map(|l| {
                        l.strip_prefix(&format!("{key} Write "))
                            .and_then(|v| v.trim().parse().ok())
                    })
                    .unwrap_or(0))
            }
            Hierarchy::V2 => {
                let t = std::fs::read_to_string(self.dir.join("io.stat"))?;
                Ok(t.lines()
                    .filter(|l| l.starts_with(&format!("{key} ")))
                    .flat_map(|l| l.split_whitespace())
                    .find_map(|kv| kv.strip_prefix("wios=").and_then(|v| v.parse().ok()))
                    .unwrap_or(0))
            }
        }
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One run of the workload, as mergetrace and the kernel counted it.
struct Arm {
    label: String,
    ios: u64,
    counts: Counts,
    disk: DiskStats,
    secs: f64,
    /// Throttled arms: blk-throttle's own count of write bios (io_serviced / io.stat).
    kernel_charged: Option<u64>,
}

impl Arm {
    fn avg_request_kib(&self) -> f64 {
        let r = self.counts.requests();
        if r == 0 {
            0.0
        } else {
            self.counts.issue_bytes as f64 / r as f64 / 1024.0
        }
    }

    /// Mismatches between mergetrace and the kernel's counters, as sentences.
    fn mismatches(&self) -> Vec<String> {
        let c = &self.counts;
        let mut out = Vec::new();
        let mut cmp = |what: &str, ours: u64, kernel: u64| {
            if ours != kernel {
                out.push(format!(
                    "{}: {what} mergetrace {ours} ≠ kernel {kernel}",
                    self.label
                ));
            }
        };
        cmp("device requests", c.requests(), self.disk.writes);
        cmp(
            "merged",
            c.merged(Dir::Write.code()),
            self.disk.writes_merged,
        );
        cmp("sectors", c.issue_bytes / 512, self.disk.write_sectors);
        cmp("bios", c.bios, self.ios);
        if let Some(k) = self.kernel_charged {
            cmp("charged ios", c.charged_ios, k);
        }
        out
    }
}

struct Lab {
    session: Session,
    disk: ScratchDisk,
    exe: PathBuf,
}

impl Lab {
    /// Runs the workload in a child process (in `cgroup` if given); the in-kernel counters
    /// before and after it tell what it did.
    fn run(
        &mut self,
        label: &str,
        ios: u64,
        batch: usize,
        cgroup: Option<&LimitedCgroup>,
    ) -> Result<Arm> {
        check_interrupted()?;
        eprintln!("mergetrace demo: {label} …");
        let counted_before = self.session.read_totals()?;
        let before = DiskStats::read(self.disk.dev.major, self.disk.dev.minor)?;
        let charged_before = cgroup
            .map(|c| c.kernel_write_ios(&self.disk.dev))
            .transpose()?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("__workload")
            .arg("--target")
            .arg(&self.disk.path)
            .args(["--ios", &ios.to_string(), "--batch", &batch.to_string()])
            .stdout(Stdio::null());
        if let Some(cg) = cgroup {
            cmd.arg("--cgroup").arg(&cg.dir);
        }
        let started = Instant::now();
        let mut child: Child = cmd.spawn().context("cannot start the workload")?;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if INTERRUPTED.load(Ordering::SeqCst) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("interrupted");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let secs = started.elapsed().as_secs_f64();
        if !status.success() {
            bail!("the workload failed in arm {label} ({status})");
        }
        // The I/O has completed, so the programs have counted all of it.
        let w = self.session.read_totals()?.since(&counted_before);
        if w.lost_events() > 0 {
            bail!(
                "{} events were lost in arm {label}: the self-check cannot hold",
                w.lost_events()
            );
        }
        let dev = self.disk.dev.kernel_dev();
        let mut counts = Counts::default();
        for (k, c) in &w.counts {
            if *k
                == (Key {
                    dev,
                    cgroup_id: k.cgroup_id,
                    dir: Dir::Write,
                })
            {
                counts.add(c);
            }
        }
        let disk = DiskStats::read(self.disk.dev.major, self.disk.dev.minor)?.since(&before);
        let kernel_charged = match (cgroup, charged_before) {
            (Some(c), Some(b)) => Some(c.kernel_write_ios(&self.disk.dev)? - b),
            _ => None,
        };
        Ok(Arm {
            label: label.to_string(),
            ios,
            counts,
            disk,
            secs,
            kernel_charged,
        })
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn check_mark(arm: &Arm) -> &'static str {
    if arm.mismatches().is_empty() {
        "="
    } else {
        "≠"
    }
}

pub fn run(args: &DemoArgs) -> Result<()> {
    kernel::check_privileges()?;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let (ios, throttle_secs) = if args.quick {
        (16_384u64, 3u64)
    } else {
        (65_536, 10)
    };
    let mib = ios * 4096 >> 20;
    let disk = ScratchDisk::new((mib + 16) << 20)?;
    eprintln!(
        "mergetrace demo: scratch disk {} ({}:{}) on {}",
        disk.dev.name,
        disk.dev.major,
        disk.dev.minor,
        disk.backing.display()
    );
    let session = Session::start(
        std::slice::from_ref(&disk.dev),
        &kernel::Options {
            ring_bytes: 4096,
            tier: args.tier,
            modes: Modes {
                aggregate: 1,
                emit: 0,
                ..Modes::default()
            },
            meter_units: aggregate::meter_units(&aggregate::DEFAULT_METER_UNITS),
            stats: false,
        },
    )?;
    eprintln!("mergetrace demo: tracing on the {}", session.tier);
    let tier = session.tier.clone();
    let mut lab = Lab {
        session,
        disk,
        exe: std::env::current_exe()?,
    };
    let mut all: Vec<Arm> = Vec::new();

    // Table 1: the three levels of nomerges, batched and one at a time.
    lab.disk.queue("scheduler", "mq-deadline")?;
    let mut table1 = Vec::new();
    for (nomerges, batch) in [(0, 32), (1, 32), (2, 32), (0, 1)] {
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        let how = if batch == 1 {
            "one at a time (1)".to_string()
        } else {
            format!("batched ({batch})")
        };
        table1.push(lab.run(&format!("nomerges={nomerges}, {how}"), ios, batch, None)?);
    }
    lab.disk.queue("nomerges", "0")?;

    // Table 2: the submission batch is the lever.
    let batches: &[usize] = if args.quick {
        &[1, 32, 128]
    } else {
        &[1, 8, 32, 64, 128, 256]
    };
    let mut table2 = Vec::new();
    for &b in batches {
        table2.push(lab.run(&format!("batch {b}"), ios, b, None)?);
    }

    // Table 3: under an IOPS limit, merging buys nothing.
    let cgroups = Cgroups::discover()?;
    let wiops = 2000u64;
    let limited = LimitedCgroup::new(&cgroups, &lab.disk.dev, wiops)?;
    let mut table3 = Vec::new();
    for (nomerges, label) in [
        (0, "nomerges=0 (merging on)"),
        (2, "nomerges=2 (merging off)"),
    ] {
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        table3.push(lab.run(label, wiops * throttle_secs, 32, Some(&limited))?);
    }
    lab.disk.queue("nomerges", "0")?;

    println!(
        "mergetrace demo — {} KiB sequential O_DIRECT writes on {} (loop on /dev/shm), {} tier",
        4,
        lab.disk.dev.name,
        tier.kind.name()
    );
    println!("\"=\": mergetrace's count equals /proc/diskstats (and blk-throttle's own counter)\n");
    println!("1. Merging is the reward for how you submit ({mib} MiB per arm, mq-deadline)");
    println!("| Arm | Device requests | Merged bios | Average request | check |");
    println!("|---|---|---|---|---|");
    for a in &table1 {
        println!(
            "| {} | {} | {} | {:.1} KiB | {} |",
            a.label,
            thousands(a.counts.requests()),
            thousands(a.counts.merged(Dir::Write.code())),
            a.avg_request_kib(),
            check_mark(a)
        );
    }
    println!("\n2. How far does the batch go? (nomerges=0)");
    println!("| Submission batch | Device requests | Bios per request | Average request | check |");
    println!("|---|---|---|---|---|");
    for a in &table2 {
        let r = a.counts.requests().max(1);
        println!(
            "| {} | {} | {:.1} | {:.1} KiB | {} |",
            a.label.trim_start_matches("batch "),
            thousands(a.counts.requests()),
            a.counts.bios as f64 / r as f64,
            a.avg_request_kib(),
            check_mark(a)
        );
    }
    println!("\n3. Under an IOPS limit (wiops={wiops}, {throttle_secs} s of bios at the limit)");
    println!(
        "| Arm | Device requests | Merged | Total bios | Charged | Throttled | IOPS | check |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for a in &table3 {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            a.label,
            thousands(a.counts.requests()),
            thousands(a.counts.merged(Dir::Write.code())),
            thousands(a.counts.bios),
            thousands(a.counts.charged_ios),
            thousands(a.counts.throttled_bios),
            a.counts.bios as f64 / a.secs,
            check_mark(a)
        );
    }
    let eff = Effective {
        wiops: Some(Limit {
            limit: wiops,
            cgroup: limited.rel.clone(),
        }),
        ..Default::default()
    };
    println!();
    for a in &table3 {
        let lu = meter::limit_use(
            &eff,
            true,
            a.counts.charged_ios,
            a.counts.charged_bytes,
            a.secs,
        );
        if let Some(v) = meter::verdict(
            &lu,
            &meter::Activity {
                bios: a.counts.bios - a.counts.flush_only.min(a.counts.bios),
                splits: a.counts.splits,
                requests: a.counts.requests(),
                charged_ios: a.counts.charged_ios,
                throttled_bios: a.counts.throttled_bios,
                split_cause: None,
            },
        ) {
            println!("verdict, {}: {v}", a.label);
        }
    }
    let merged_on = &table3[0];
    let units = merged_on.counts.meter_units[0];
    println!(
        "\nWhere the meter sits: the limit counted {} bios; the device saw {} requests; a cloud volume \
         counting requests in 256 KiB units would count {} — merging helps only a meter that counts after it.",
        thousands(merged_on.counts.charged_ios),
        thousands(merged_on.counts.requests()),
        thousands(units)
    );

    all.extend(table1);
    all.extend(table2);
    all.extend(table3);
    let problems: Vec<String> = all.iter().flat_map(|a| a.mismatches()).collect();
    drop(limited);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("mergetrace demo: MISMATCH {p}");
        }
        bail!(
            "{} of mergetrace's counts differ from the kernel's",
            problems.len()
        );
    }
    println!(
        "\nself-check: all {} arms equal the kernel's counters",
        all.len()
    );
    Ok(())
}
