//! The offline side: how fast `mergetrace report` reads a capture on one core, and how that
//! compares with blkparse reading the same events exported in blktrace's format (time, and
//! bytes on disk).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    fio::Workload,
    sys::{self, last_line, Proc},
};

/// Each reader's runs: the best of them counts.
pub const TIMED_RUNS: usize = 3;

/// What was measured on the biggest capture.
pub struct Offline {
    /// The workload whose record arm wrote it.
    pub workload: Workload,
    pub events: u64,
    pub file_bytes: u64,
    /// `taskset -c 0 mergetrace report FILE --json`, wall seconds per run.
    pub report_seconds: Vec<f64>,
    /// `mergetrace export FILE --format blktrace -o BASE`, or how it failed (mergetrace's
    /// failure: the bench exits non-zero after printing what it has).
    pub export: std::result::Result<Export, String>,
    /// `taskset -c 0 blkparse -i BASE -o /dev/null`, wall seconds per run, or why not.
    pub blkparse_seconds: std::result::Result<Vec<f64>, String>,
}

pub struct Export {
    /// The export's files (BASE.blktrace.0 for the one device) on disk.
    pub bytes: u64,
    /// Traces it wrote (its "wrote N traces" line).
    pub traces: Option<u64>,
    pub seconds: f64,
}

/// The shortest of some times.
pub fn best(seconds: &[f64]) -> Option<f64> {
    seconds
        .iter()
        .copied()
        .filter(|s| *s > 0.0)
        .reduce(f64::min)
}

/// Runs `program ARGS` pinned to CPU 0 `TIMED_RUNS` times; wall seconds, process start
/// included.
fn time_pinned(
    what: &str,
    program: &Path,
    args: &[&std::ffi::OsStr],
    dir: &Path,
) -> Result<Vec<f64>> {
    let mut seconds = Vec::new();
    for _ in 0..TIMED_RUNS {
        sys::check_interrupt()?;
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(program).args(args);
        let t = Instant::now();
        let mut p = Proc::spawn(what, c, dir, "offline")?;
        let f = p.wait_exit(Duration::from_secs(600))?;
        let dt = t.elapsed().as_secs_f64();
        let _ = fs::remove_file(dir.join("offline.out"));
        if !f.status.success() {
            bail!(
                "{what} failed ({}): {}",
                f.status,
                last_line(&f.stderr).unwrap_or("no message")
            );
        }
        seconds.push(dt);
    }
    Ok(seconds)
}

/// Times `mergetrace report`, exports the capture in blktrace's format once and times
/// blkparse on that. `Err` when the report fails (or on a signal); an export that fails is in
/// `export`, blkparse that is missing or fails in `blkparse_seconds`.
pub fn measure(
    mergetrace: &Path,
    workload: Workload,
    capture: &Path,
    events: u64,
    dir: &Path,
    have_blkparse: bool,
) -> Result<Offline> {
    let file_bytes = fs::metadata(capture)
        .with_context(|| format!("cannot stat {}", capture.display()))?
        .len();
    let report_seconds = time_pinned(
        "mergetrace report",
        mergetrace,
        &["report".as_ref(), capture.as_os_str(), "--json".as_ref()],
        dir,
    )?;
    let out = dir.join("export");
    let (export, blkparse_seconds) = match export(mergetrace, capture, &out, dir) {
        Err(e) => {
            sys::check_interrupt()?;
            (
                Err(format!("{e:#}")),
                Err("no blktrace export to read".to_string()),
            )
        }
        Ok((base, ex)) => {
            let b = if have_blkparse {
                time_pinned(
                    "blkparse",
                    Path::new("blkparse"),
                    &[
                        "-i".as_ref(),
                        base.as_os_str(),
                        "-o".as_ref(),
                        "/dev/null".as_ref(),
                    ],
                    dir,
                )
                .map_err(|e| format!("{e:#}"))
            } else {
                Err("blkparse is not installed (blktrace; scripts/setup --bench)".to_string())
            };
            sys::check_interrupt()?;
            (Ok(ex), b)
        }
    };
    let _ = fs::remove_dir_all(&out);
    Ok(Offline {
        workload,
        events,
        file_bytes,
        report_seconds,
        export,
        blkparse_seconds,
    })
}

/// `mergetrace export FILE --format blktrace -o OUT/capture` → (the base name for
/// `blkparse -i`, what it wrote).
fn export(mergetrace: &Path, capture: &Path, out: &Path, dir: &Path) -> Result<(PathBuf, Export)> {
    let _ = fs::remove_dir_all(out);
    fs::create_dir(out).with_context(|| format!("cannot create {}", out.display()))?;
    let base = out.join("capture");
    let mut c = Command::new(mergetrace);
    c.arg("export")
        .arg(capture)
        .args(["--format", "blktrace", "-o"])
        .arg(&base);
    let t = Instant::now();
    let mut p = Proc::spawn("mergetrace export", c, dir, "export")?;
    let f = p.wait_exit(Duration::from_secs(600))?;
    let seconds = t.elapsed().as_secs_f64();
    if !f.status.success() {
        bail!(
            "mergetrace export --format blktrace failed ({}): {}",
            f.status,
            last_line(&f.stderr).unwrap_or("no message")
        );
    }
    let mut bytes = 0;
    let mut files = 0;
    for e in fs::read_dir(out)?.flatten() {
        if e.file_name().to_string_lossy().contains(".blktrace.") {
            bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            files += 1;
        }
    }
    match files {
        1 => {}
        0 => bail!("mergetrace export --format blktrace wrote no BASE.blktrace.0"),
        // The record arm traces one device; several files would need one -i each.
        n => bail!("mergetrace export --format blktrace wrote {n} files for one device"),
    }
    Ok((
        base,
        Export {
            bytes,
            traces: parse_export_traces(&f.stderr),
            seconds,
        },
    ))
}

/// "mergetrace: wrote N traces of loop1 to PATH (blkparse -i BASE)" lines → the Ns added up.
pub fn parse_export_traces(stderr: &str) -> Option<u64> {
    let mut sum = None;
    for l in stderr.lines() {
        let Some(rest) = l.split("mergetrace: wrote ").nth(1) else {
            continue;
        };
        if !rest.contains(" traces of ") {
            continue;
        }
        let n: u64 = rest.split_whitespace().next()?.parse().ok()?;
        *sum.get_or_insert(0) += n;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_lines_and_best_times() {
        let e = "mergetrace: wrote 123 traces of loop1 to /x/capture.blktrace.0 (blkparse -i /x/capture)\n";
        assert_eq!(parse_export_traces(e), Some(123));
        assert_eq!(parse_export_traces("mergetrace: wrote 5 events to x"), None);
        assert_eq!(best(&[0.3, 0.2, 0.25]), Some(0.2));
        assert_eq!(best(&[]), None);
    }
}
