//! Before the rounds: the device filled where the merging workload writes, and fio's
//! fastest setting per workload found.

use std::{fs, io::Write, path::Path};

use anyhow::{Context, Result};

use super::{
    fio::{self, Fio, Workload},
    stats::{si, Summary},
    sys::{self, LimitCgroup, LoopDev},
};

/// Writes the merging workload's region of the backing file once, so that no measured run
/// pays for allocating its pages in /dev/shm (the reads' region stays a hole, as before).
pub fn prefill(backing: &Path) -> Result<()> {
    let (offset, bytes) = Workload::Merging.region();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .with_context(|| format!("cannot open {}", backing.display()))?;
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(offset))?;
    let block = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        sys::check_interrupt()?;
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("cannot write {}", backing.display()))?;
        left -= n as u64;
    }
    Ok(())
}

/// One calibration point: fio's IOPS for a setting.
pub struct Calibration {
    pub fio: Fio,
    pub iops: Vec<f64>,
}

/// For each workload, tries loop direct I/O on/off × 1/2 fio jobs briefly (all the points
/// interleaved) and keeps the fastest. The loop device's direct I/O is set per workload, before
/// its arms run.
pub fn calibrate(
    lp: &LoopDev,
    limit: Option<&LimitCgroup>,
    dir: &Path,
    workloads: &[Workload],
    numjobs: &str,
    seconds: f64,
    repeats: usize,
) -> Result<Vec<(Fio, Vec<Calibration>)>> {
    let jobs: Vec<u32> = match numjobs {
        "1" => vec![1],
        "2" => vec![2],
        _ => vec![1, 2],
    };
    let mut points: Vec<Calibration> = Vec::new();
    for &workload in workloads {
        for dio in [true, false] {
            for &j in &jobs {
                points.push(Calibration {
                    fio: Fio::new(workload, j, dio, limit),
                    iops: Vec::new(),
                });
            }
        }
    }
    // A first run on a fresh device is slower; it does not count.
    for &w in workloads {
        if let Some(p) = points.iter().find(|p| p.fio.workload == w) {
            p.fio.prepare(lp, limit)?;
            fio::run(&p.fio, lp, dir, 1.0)?;
        }
    }
    for _ in 0..repeats {
        for p in points.iter_mut() {
            if let Err(e) = p.fio.prepare(lp, limit) {
                eprintln!(
                    "bench: calibration: {} with loop direct I/O {}: {e:#}",
                    p.fio.workload.key(),
                    p.fio.loop_direct_io
                );
                continue;
            }
            let r = fio::run(&p.fio, lp, dir, seconds)?;
            eprintln!(
                "bench: calibration: {} numjobs {} loop direct I/O {}: {} IOPS",
                p.fio.workload.key(),
                p.fio.numjobs,
                if p.fio.loop_direct_io { "on" } else { "off" },
                si(r.iops)
            );
            p.iops.push(r.iops);
        }
    }
    let mut out = Vec::new();
    for &w in workloads {
        let mine: Vec<Calibration> = points
            .iter()
            .filter(|p| p.fio.workload == w)
            .map(|p| Calibration {
                fio: p.fio.clone(),
                iops: p.iops.clone(),
            })
            .collect();
        let best = mine
            .iter()
            .filter_map(|p| Some((Summary::of(&p.iops)?.median, p)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, p)| p.fio.clone())
            .with_context(|| format!("fio ran in no calibration setting of {}", w.key()))?;
        out.push((best, mine));
    }
    Ok(out)
}
