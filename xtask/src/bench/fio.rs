//! The workloads, the fio command of each, and what one fio run measured: IOPS, I/Os, the
//! machine's CPU time over the run (/proc/stat, all CPUs) and how many bios went into each
//! request (the device's diskstats).
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::sys::{last_line, LimitCgroup, LoopDev, Proc};

/// What fio does to the loop device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// 4 KiB random reads: every bio its own request, the most requests per second.
    Reads,
    /// 4 KiB sequential writes submitted 32 at a time: 31 of every 32 bios merge in the plug,
    /// the most merge events per I/O (the worst case for a tracer of merges).
    Merging,
    /// The reads, by fio in a cgroup with a blk-throttle read limit on the device that never
    /// binds: a volume with io.max, where the live view also attaches the programs that see
    /// what the throttle charges (`block_bio_queue`, the throttle's dispatch work).
    Limited,
}

/// The device is two regions of this size: the reads use the first (a sparse hole, as
/// reads of a fresh /dev/shm file always were), the writes the second (written once before
/// the first run, so that no run pays for allocating the pages).
pub const REGION_BYTES: u64 = 1 << 30;
pub const DEVICE_BYTES: u64 = 2 * REGION_BYTES;

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Reads, Workload::Merging, Workload::Limited];

    pub fn key(self) -> &'static str {
        match self {
            Workload::Reads => "reads",
            Workload::Merging => "merging",
            Workload::Limited => "limited",
        }
    }

    pub fn parse(s: &str) -> Vec<Workload> {
        match s {
            "reads" => vec![Workload::Reads],
            "merging" => vec![Workload::Merging],
            "limited" => vec![Workload::Limited],
            _ => Workload::ALL.to_vec(),
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Workload::Reads => "4 KiB random reads, io_uring, O_DIRECT, iodepth 32",
            Workload::Merging => {
                "4 KiB sequential writes submitted 32 at a time (31 of 32 bios merge in the \
                 plug), libaio, O_DIRECT, iodepth 32"
            }
            Workload::Limited => {
                "the reads, in a cgroup whose blk-throttle read limit on the device \
                 (1,000,000,000 IOPS) never binds"
            }
        }
    }

    /// Where on the device its I/O goes: (offset, bytes).
    pub fn region(self) -> (u64, u64) {
        match self {
            Workload::Reads | Workload::Limited => (0, REGION_BYTES),
            Workload::Merging => (REGION_BYTES, REGION_BYTES),
        }
    }
}

/// The fio command every arm of a workload runs, and the loop device setting it wants.
#[derive(Debug, Clone)]
pub struct Fio {
    pub workload: Workload,
    pub numjobs: u32,
    pub loop_direct_io: bool,
    /// The cgroup fio runs in (the limited workload's), else the bench's own.
    pub cgroup: Option<PathBuf>,
}

impl Fio {
    /// The workload's fio setting; the limited workload's fio runs in `limit`'s cgroup.
    pub fn new(
        workload: Workload,
        numjobs: u32,
        loop_direct_io: bool,
        limit: Option<&LimitCgroup>,
    ) -> Fio {
        Fio {
            workload,
            numjobs,
            loop_direct_io,
            cgroup: limit
                .filter(|_| workload == Workload::Limited)
                .map(|l| l.dir.clone()),
        }
    }

    /// Sets the device up for this workload's runs: the loop driver's direct I/O, and the
    /// read limit on for the limited workload only (before any tracer starts: the live view
    /// attaches its throttle programs where it finds a limit).
    pub fn prepare(&self, lp: &LoopDev, limit: Option<&LimitCgroup>) -> Result<()> {
        lp.set_direct_io(self.loop_direct_io)?;
        if let Some(l) = limit {
            l.set(self.workload == Workload::Limited)?;
        }
        Ok(())
    }

    pub fn args(&self, dev: &str, seconds: f64) -> Vec<String> {
        let (offset, bytes) = self.workload.region();
        let mut a: Vec<String> = [
            "--name=bench".to_string(),
            format!("--filename={dev}"),
            "--bs=4k".into(),
            "--direct=1".into(),
            "--iodepth=32".into(),
            format!("--numjobs={}", self.numjobs),
            "--thread".into(),
            "--group_reporting".into(),
            "--time_based".into(),
            // In ms: fio reads "1.5s" as 1 s.
            format!("--runtime={}ms", (seconds * 1000.0).round() as u64),
            "--output-format=json".into(),
            format!("--offset={offset}"),
        ]
        .to_vec();
        match self.workload {
            Workload::Reads | Workload::Limited => a.extend(
                [
                    "--rw=randread".to_string(),
                    "--ioengine=io_uring".into(),
                    "--norandommap".into(),
                    "--randrepeat=0".into(),
                    format!("--size={bytes}"),
                ]
                .to_vec(),
            ),
            Workload::Merging => {
                // Each job writes its own stretch of the region, from its start to its end
                // and round again.
                let per_job = bytes / u64::from(self.numjobs.max(1));
                a.extend(
                    [
                        "--rw=write".to_string(),
                        "--ioengine=libaio".into(),
                        "--iodepth_batch_submit=32".into(),
                        "--iodepth_batch_complete_min=32".into(),
                        format!("--size={per_job}"),
                        format!("--offset_increment={per_job}"),
                    ]
                    .to_vec(),
                )
            }
        }
        a
    }
}

/// What one fio run measured.
#[derive(Debug, Clone, Copy)]
pub struct FioRun {
    /// Reads and writes per second, over all jobs.
    pub iops: f64,
    /// I/Os done (fio's total_ios, reads and writes).
    pub ios: u64,
    /// The machine's CPU time from fio's start to its exit, all CPUs (None: no /proc/stat).
    pub cpu: Option<CpuUse>,
    /// Bios per request on the device over the run (diskstats: (I/Os + merges) / I/Os).
    pub bios_per_request: Option<f64>,
}

impl FioRun {
    /// CPU time per I/O, in ns.
    pub fn cpu_ns_per_io(&self) -> Option<f64> {
        let c = self.cpu?;
        (self.ios > 0).then(|| c.busy_ns / self.ios as f64)
    }
}

/// Runs fio once on the loop device.
pub fn run(fio: &Fio, lp: &LoopDev, dir: &Path, seconds: f64) -> Result<FioRun> {
    let mut c = match &fio.cgroup {
        // The shell moves itself into the cgroup, then becomes fio there.
        Some(cg) => {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                "echo $$ > \"$1/cgroup.procs\" || exit 1; shift; exec fio \"$@\"",
            ])
            .arg("sh")
            .arg(cg);
            c
        }
        None => Command::new("fio"),
    };
    c.args(fio.args(&lp.dev, seconds));
    let disk0 = lp.stat();
    let cpu0 = read_cpu_stat();
    let mut p = Proc::spawn("fio", c, dir, "fio")?;
    let f = p.wait_exit(Duration::from_secs_f64(seconds + 60.0))?;
    let cpu1 = read_cpu_stat();
    let disk1 = lp.stat();
    if !f.status.success() {
        bail!(
            "fio failed ({}): {}",
            f.status,
            last_line(&f.stderr).unwrap_or("no message")
        );
    }
    let (iops, ios) = parse_fio(&f.stdout)?;
    let cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some(b.since(&a)),
        _ => None,
    };
    let bios_per_request = match (disk0, disk1) {
        (Some(a), Some(b)) => bios_per_request(fio.workload, &a, &b),
        _ => None,
    };
    Ok(FioRun {
        iops,
        ios,
        cpu,
        bios_per_request,
    })
}

/// fio's JSON → (IOPS, I/Os), reads and writes of every job.
pub fn parse_fio(stdout: &str) -> Result<(f64, u64)> {
    // fio may print notes before its JSON.
    let start = stdout.find('{').context("fio printed no JSON")?;
    let v: Value = serde_json::from_str(&stdout[start..]).context("cannot parse fio's JSON")?;
    let jobs = v["jobs"].as_array().context("fio's JSON has no jobs")?;
    let mut iops = 0.0;
    let mut ios = 0;
    for j in jobs {
        for dir in ["read", "write"] {
            iops += j[dir]["iops"].as_f64().unwrap_or(0.0);
            ios += j[dir]["total_ios"].as_u64().unwrap_or(0);
        }
    }
    if iops <= 0.0 {
        bail!("fio reports no IOPS");
    }
    Ok((iops, ios))
}

/// The first line of /proc/stat, in jiffies (USER_HZ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuStat {
    /// user + nice + system + irq + softirq: time the CPUs spent running something.
    pub busy: u64,
    /// Time the hypervisor ran something else while a CPU wanted to run: not ours, not
    /// counted as busy.
    pub steal: u64,
    /// All eight first fields (idle and iowait included).
    pub all: u64,
}

/// CPU time between two /proc/stat readings, in ns (all CPUs added up).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    pub busy_ns: f64,
    pub steal_ns: f64,
    pub all_ns: f64,
}

impl CpuStat {
    pub fn since(&self, earlier: &CpuStat) -> CpuUse {
        let ns = jiffy_ns();
        CpuUse {
            busy_ns: self.busy.saturating_sub(earlier.busy) as f64 * ns,
            steal_ns: self.steal.saturating_sub(earlier.steal) as f64 * ns,
            all_ns: self.all.saturating_sub(earlier.all) as f64 * ns,
        }
    }
}

/// "cpu  user nice system idle iowait irq softirq steal guest guest_nice" (guest time is
/// already in user and nice).
pub fn parse_cpu_stat(s: &str) -> Option<CpuStat> {
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if f.len() < 8 {
        return None;
    }
    Some(CpuStat {
        busy: f[0] + f[1] + f[2] + f[5] + f[6],
        steal: f[7],
        all: f[..8].iter().sum(),
    })
}

pub fn read_cpu_stat() -> Option<CpuStat> {
    parse_cpu_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The length of a /proc/stat jiffy (1 / USER_HZ), in ns.
pub fn jiffy_ns() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1e9 / if hz > 0 { hz as f64 } else { 100.0 }
}

/// The counters of /sys/block/NAME/stat that say how much merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStat {
    pub reads: u64,
    pub read_merges: u64,
    pub writes: u64,
    pub write_merges: u64,
}

pub fn parse_disk_stat(s: &str) -> Option<DiskStat> {
    let f: Vec<u64> = s
        .split_whitespace()
        .take(6)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 6).then(|| DiskStat {
        reads: f[0],
        read_merges: f[1],
        writes: f[4],
        write_merges: f[5],
    })
}

/// (requests + bios merged into them) / requests over a run, in the workload's direction.
pub fn bios_per_request(w: Workload, a: &DiskStat, b: &DiskStat) -> Option<f64> {
    let (rq, merges) = match w {
        Workload::Reads | Workload::Limited => (b.reads - a.reads, b.read_merges - a.read_merges),
        Workload::Merging => (b.writes - a.writes, b.write_merges - a.write_merges),
    };
    (rq > 0).then(|| (rq + merges) as f64 / rq as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_reads_and_writes() {
        let fio = "note: something\n{\"jobs\": [{\"read\": {\"iops\": 1000.5, \"total_ios\": 5000}, \"write\": {\"iops\": 0, \"total_ios\": 0}}, {\"read\": {\"iops\": 10, \"total_ios\": 50}}]}";
        assert_eq!(parse_fio(fio).unwrap(), (1010.5, 5050));
        let w = "{\"jobs\": [{\"read\": {\"iops\": 0.0, \"total_ios\": 0}, \"write\": {\"iops\": 2000.0, \"total_ios\": 8000}}]}";
        assert_eq!(parse_fio(w).unwrap(), (2000.0, 8000));
        assert!(parse_fio("{\"jobs\": []}").is_err());
        assert!(parse_fio("nothing").is_err());
    }

    /// The limited workload is the reads (in its cgroup).
    #[test]
    fn reads_run_time_based_4k_random_reads_in_the_first_region() {
        let reads = Fio::new(Workload::Reads, 2, true, None).args("/dev/loop9", 5.0);
        let limited = Fio::new(Workload::Limited, 2, true, None).args("/dev/loop9", 5.0);
        assert_eq!(reads, limited);
        let a = reads;
        for want in [
            "--filename=/dev/loop9",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=io_uring",
            "--direct=1",
            "--iodepth=32",
            "--numjobs=2",
            "--time_based",
            "--runtime=5000ms",
            "--output-format=json",
            "--offset=0",
            &format!("--size={REGION_BYTES}"),
        ] {
            assert!(a.iter().any(|x| x == want), "{want}: {a:?}");
        }
    }

    #[test]
    fn merging_writes_batches_of_32_in_the_second_region() {
        let a = Fio::new(Workload::Merging, 2, false, None).args("/dev/loop9", 4.0);
        for want in [
            "--rw=write",
            "--bs=4k",
            "--ioengine=libaio",
            "--direct=1",
            "--iodepth=32",
            "--iodepth_batch_submit=32",
            "--iodepth_batch_complete_min=32",
            "--time_based",
            "--runtime=4000ms",
            &format!("--offset={REGION_BYTES}"),
            &format!("--size={}", REGION_BYTES / 2),
            &format!("--offset_increment={}", REGION_BYTES / 2),
        ] {
            assert!(a.iter().any(|x| x == want), "{want}: {a:?}");
        }
        // The jobs' stretches stay inside the device.
        assert_eq!(Workload::Merging.region().0 + REGION_BYTES, DEVICE_BYTES);
    }

    #[test]
    fn cpu_and_disk_stats() {
        let s = "cpu  100 10 50 1000 20 5 7 3 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let c = parse_cpu_stat(s).unwrap();
        assert_eq!(
            c,
            CpuStat {
                busy: 172,
                steal: 3,
                all: 1195
            }
        );
        assert!(parse_cpu_stat("cpu  1 2 3\n").is_none());
        let later = CpuStat {
            busy: 272,
            steal: 3,
            all: 1395,
        };
        let u = later.since(&c);
        assert!((u.busy_ns - 100.0 * jiffy_ns()).abs() < 1e-6);
        assert_eq!(u.steal_ns, 0.0);
        let a = parse_disk_stat("  100  0 800 5  1000  31000 0 0 0 0 0").unwrap();
        let b = parse_disk_stat("  200  0 800 5  2000  62000 0 0 0 0 0").unwrap();
        assert_eq!(bios_per_request(Workload::Merging, &a, &b), Some(32.0));
        assert_eq!(bios_per_request(Workload::Reads, &a, &b), Some(1.0));
        assert_eq!(bios_per_request(Workload::Reads, &a, &a), None);
        assert!(parse_disk_stat("1 2").is_none());
    }
}
