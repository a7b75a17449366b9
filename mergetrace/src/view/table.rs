//! The rows both the text view and the TUI show: one per (device, cgroup, direction) with
//! activity, then a device total per direction.
use crate::{
    fmt,
    model::aggregate::Dir,
    model::snapshot::{DirStats, Snapshot},
};

pub const HEADER: [&str; 12] = [
    "DEVICE",
    "CGROUP",
    "DIR",
    "BIOS",
    "MiB",
    "CHARGED",
    "THROTTLED",
    "MERGED",
    "REQS",
    "REQ MiB",
    "BIOS/REQ",
    "AVG REQ",
];

/// Right-aligned columns (numbers).
pub fn right_aligned(col: usize) -> bool {
    col >= 3
}

pub struct Row {
    pub cells: Vec<String>,
    pub is_total: bool,
}

fn cells(device: &str, cgroup: &str, dir: Dir, s: &DirStats) -> Vec<String> {
    vec![
        device.to_string(),
        cgroup.to_string(),
        dir.name().to_string(),
        s.bios.to_string(),
        fmt::mib(s.bytes),
        s.charged_ios.to_string(),
        s.throttled.bios.to_string(),
        s.merged.to_string(),
        s.requests.to_string(),
        fmt::mib(s.request_bytes),
        s.bios_per_request()
            .map_or("-".into(), |r| format!("{r:.1}")),
        s.avg_request_bytes().map_or("-".into(), fmt::avg_size),
    ]
}

/// The lines under the table: a `verdict:` per cgroup and direction that has one ("loop3 /mt
/// write: wiops 2000 is …"), and a `note:` where flush-only writes or requeues make the
/// table's columns differ from what /proc/diskstats shows.
pub fn remarks(s: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for d in &s.devices {
        for c in &d.cgroups {
            for dir in Dir::ALL {
                let st = c.dirs.get(dir);
                let at = format!("{} {} {}", d.device, c.cgroup, dir.name());
                if let Some(v) = &st.verdict {
                    out.push(format!("verdict: {at}: {v}"));
                }
                if st.flush_only > 0 {
                    out.push(format!(
                        "note: {at}: {} of the bios were flush-only writes (fsync, journal \
                         commits): the kernel sent flush requests instead of write requests; \
                         /proc/diskstats counts them as writes",
                        st.flush_only
                    ));
                }
                if st.requeues > 0 {
                    out.push(format!(
                        "note: {at}: the driver handed back {} requests to be issued again (each \
                         counted once)",
                        st.requeues
                    ));
                }
            }
        }
    }
    out
}

pub fn rows(s: &Snapshot) -> Vec<Row> {
    let mut out = Vec::new();
    for d in &s.devices {
        for c in &d.cgroups {
            let name = if c.gone {
                format!("{} (gone)", c.cgroup)
            } else {
                c.cgroup.clone()
            };
            for dir in Dir::ALL {
                let st = c.dirs.get(dir);
                if !st.is_empty() {
                    out.push(Row {
                        cells: cells(&d.device, &name, dir, st),
                        is_total: false,
                    });
                }
            }
        }
        let mut any = false;
        for dir in Dir::ALL {
            let st = d.total.get(dir);
            if !st.is_empty() {
                any = true;
                out.push(Row {
                    cells: cells(&d.device, "(total)", dir, st),
                    is_total: true,
                });
            }
        }
        if !any {
            out.push(Row {
                cells: vec![d.device.clone(), "(total)".into(), "-".into(), "0".into()],
                is_total: true,
            });
        }
    }
    out
}

/// Column-aligned plain text of `rows` under [`HEADER`].
pub fn render_text(rows: &[Row]) -> String {
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.cells.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            if right_aligned(i) {
                s.push_str(&format!("{c:>w$}", w = widths[i]));
            } else {
                s.push_str(&format!("{c:<w$}", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&HEADER.map(String::from));
    out.push('\n');
    for r in rows {
        out.push_str(&line(&r.cells));
        out.push('\n');
    }
    out
}
