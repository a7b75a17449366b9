//! The rows both the text view and the TUI show: one per (device, cgroup, direction) with
//! activity, then a device total per direction.
use crate::{
    fmt,
    model::aggregate::Dir,
    model::latency::{Class, Stage},
    model::snapshot::{DirStats, Snapshot},
};

pub const HEADER: [&str; 15] = [
    "DEVICE",
    "CGROUP",
    "NAME",
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
    "Q p99",
    "DEV p99",
];

/// Column indices into [`HEADER`].
pub mod col {
    pub const DEVICE: usize = 0;
    pub const CGROUP: usize = 1;
    pub const NAME: usize = 2;
    pub const DIR: usize = 3;
    pub const BIOS: usize = 4;
    pub const MIB: usize = 5;
    pub const CHARGED: usize = 6;
    pub const THROTTLED: usize = 7;
    pub const MERGED: usize = 8;
    pub const REQS: usize = 9;
    pub const REQ_MIB: usize = 10;
    pub const BIOS_PER_REQ: usize = 11;
    pub const AVG_REQ: usize = 12;
    /// `--latency` only: queue and device latency p99 of the requests.
    pub const QUEUE_P99: usize = 13;
    pub const DEVICE_P99: usize = 14;
}

/// The columns `rows` have: every column but the latency ones, which only a `--latency` run
/// fills.
pub fn shown_columns(rows: &[Row]) -> Vec<usize> {
    (0..HEADER.len())
        .filter(|&i| {
            i < col::QUEUE_P99
                || rows
                    .iter()
                    .any(|r| r.cells.get(i).is_some_and(|c| !c.is_empty()))
        })
        .collect()
}

/// Right-aligned columns (numbers).
pub fn right_aligned(col: usize) -> bool {
    col >= col::BIOS
}

/// The widest a CGROUP cell gets: a kubepods path of ~200 characters would widen every row
/// (the JSON has the whole path, and NAME says what it is).
pub const PATH_WIDTH: usize = 40;
/// The widest a NAME cell gets (`k8s:burstable/pod 8e1f2a3b…/ctr 3f2a9c1b7d4e` fits).
pub const NAME_WIDTH: usize = 44;

/// `s` cut to `max` characters by an ellipsis in the middle, keeping both ends. The cut never
/// leaves part of a number: a run of digits it would split is left out whole.
pub fn shorten_middle(s: &str, max: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= max || max < 3 {
        return s.to_string();
    }
    let keep = max - 1; // the ellipsis takes one
    let mut head = keep.div_ceil(2);
    let mut tail = chars.len() - keep / 2; // index of the first kept tail character
    let digit = |i: usize| chars[i].is_ascii_digit();
    while head > 0 && digit(head - 1) && digit(head) {
        head -= 1;
    }
    while tail < chars.len() && digit(tail) && digit(tail - 1) {
        tail += 1;
    }
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[tail..]);
    out
}

pub struct Row {
    pub cells: Vec<String>,
    pub is_total: bool,
    /// Where the row's numbers come from in its snapshot (for sorting and the TUI's detail).
    pub at: RowAt,
}

/// A row's place in its snapshot: `devices[device]`, its `cgroups[cgroup]` (`None`: the
/// disk's total), the direction (`None`: the line of a disk without I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    pub device: usize,
    pub cgroup: Option<usize>,
    pub dir: Option<Dir>,
}

impl RowAt {
    /// The row's counts in `s`, where it has any.
    pub fn stats<'a>(&self, s: &'a Snapshot) -> Option<&'a DirStats> {
        let d = s.devices.get(self.device)?;
        let dirs = match self.cgroup {
            Some(c) => &d.cgroups.get(c)?.dirs,
            None => &d.total,
        };
        Some(dirs.get(self.dir?))
    }
}

/// The number a numeric column shows, unrounded, to sort by (`None` for text columns and
/// for ratios without requests).
pub fn sort_value(column: usize, s: &DirStats) -> Option<f64> {
    Some(match column {
        col::BIOS => s.bios as f64,
        col::MIB => s.bytes as f64,
        col::CHARGED => s.charged_ios as f64,
        col::THROTTLED => s.throttled.bios as f64,
        col::MERGED => s.merged as f64,
        col::REQS => s.requests as f64,
        col::REQ_MIB => s.request_bytes as f64,
        col::BIOS_PER_REQ => s.bios_per_request()?,
        col::AVG_REQ => s.avg_request_bytes()?,
        col::QUEUE_P99 => p99_us(s, Stage::Queue)?,
        col::DEVICE_P99 => p99_us(s, Stage::Device)?,
        _ => return None,
    })
}

/// The p99 latency of a row's requests at one stage, in µs, where counted and any.
fn p99_us(s: &DirStats, stage: Stage) -> Option<f64> {
    s.latency?.quantile_us(stage, Class::All, 0.99)
}

/// A latency cell: empty where not counted, "-" without requests.
fn latency_cell(s: &DirStats, stage: Stage) -> String {
    match s.latency {
        None => String::new(),
        Some(_) => p99_us(s, stage).map_or("-".into(), fmt::latency_bound),
    }
}

fn cells(device: &str, cgroup: &str, name: &str, dir: Dir, s: &DirStats) -> Vec<String> {
    vec![
        device.to_string(),
        cgroup.to_string(),
        name.to_string(),
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
        latency_cell(s, Stage::Queue),
        latency_cell(s, Stage::Device),
    ]
}

/// The lines under the table: a `verdict:` per cgroup and direction that has one ("loop3 /mt
/// write: wiops 2000 is …"), and a `note:` where flush-only writes or requeues make the
/// table's columns differ from what /proc/diskstats shows.
pub fn remarks(s: &Snapshot) -> Vec<String> {
    remark_lines(s, true)
}

/// The `note:` lines alone (the terminal UI shows verdicts in its detail pane).
pub fn notes(s: &Snapshot) -> Vec<String> {
    remark_lines(s, false)
}

fn remark_lines(s: &Snapshot, verdicts: bool) -> Vec<String> {
    let mut out = Vec::new();
    for d in &s.devices {
        for c in &d.cgroups {
            for dir in Dir::ALL {
                let st = c.dirs.get(dir);
                let at = match &c.name {
                    Some(n) => format!("{} {} ({}) {}", d.device, c.cgroup, n.short, dir.name()),
                    None => format!("{} {} {}", d.device, c.cgroup, dir.name()),
                };
                if let Some(v) = st.verdict.as_ref().filter(|_| verdicts) {
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
    for (di, d) in s.devices.iter().enumerate() {
        for (ci, c) in d.cgroups.iter().enumerate() {
            let path = shorten_middle(&c.cgroup, PATH_WIDTH);
            let path = if c.gone {
                format!("{path} (gone)")
            } else {
                path
            };
            let name = c
                .name
                .as_ref()
                .map_or("-".to_string(), |n| shorten_middle(&n.short, NAME_WIDTH));
            for dir in Dir::ALL {
                let st = c.dirs.get(dir);
                if !st.is_empty() {
                    out.push(Row {
                        cells: cells(&d.device, &path, &name, dir, st),
                        is_total: false,
                        at: RowAt {
                            device: di,
                            cgroup: Some(ci),
                            dir: Some(dir),
                        },
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
                    cells: cells(&d.device, "(total)", "", dir, st),
                    is_total: true,
                    at: RowAt {
                        device: di,
                        cgroup: None,
                        dir: Some(dir),
                    },
                });
            }
        }
        if !any {
            out.push(Row {
                cells: vec![
                    d.device.clone(),
                    "(total)".into(),
                    String::new(),
                    "-".into(),
                    "0".into(),
                ],
                is_total: true,
                at: RowAt {
                    device: di,
                    cgroup: None,
                    dir: None,
                },
            });
        }
    }
    out
}

/// Which columns go first when the terminal is narrow: a higher number stays longer. The
/// cgroup is never dropped (it is shortened in the middle instead), nor are the counts the
/// verdict rests on (bios, merged, requests).
const KEEP_PRIORITY: [u8; 15] = [
    4,  // DEVICE (named in the banner too)
    13, // CGROUP
    5,  // NAME (the JSON and the whole-run table keep it)
    12, // DIR
    11, // BIOS
    2,  // MiB
    7,  // CHARGED
    6,  // THROTTLED
    10, // MERGED
    9,  // REQS
    1,  // REQ MiB
    8,  // BIOS/REQ
    3,  // AVG REQ
    2,  // Q p99
    3,  // DEV p99
];

/// The narrowest a shortened cgroup column gets before columns are dropped instead.
const MIN_CGROUP_WIDTH: usize = 16;
use col::CGROUP;

/// The table as it fits a width: the columns kept (indices into [`HEADER`]), their widths, and
/// the rows' cells of those columns. A number is shown whole or not at all; only the cgroup
/// column is shortened, in the middle, so names that differ at the end stay apart.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The columns the rows have ([`shown_columns`]).
    pub offered: Vec<usize>,
    pub columns: Vec<usize>,
    pub widths: Vec<usize>,
    pub rows: Vec<Vec<String>>,
}

/// Fits `rows` to `width` characters with `spacing` between columns.
pub fn fit(rows: &[Row], width: usize, spacing: usize) -> Fitted {
    let natural: Vec<usize> = (0..HEADER.len())
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.cells.get(i))
                .map(|c| c.chars().count())
                .chain(std::iter::once(HEADER[i].len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let offered = shown_columns(rows);
    let mut columns = offered.clone();
    let total = |cols: &[usize], cgroup_w: usize| -> usize {
        cols.iter()
            .map(|&i| if i == CGROUP { cgroup_w } else { natural[i] })
            .sum::<usize>()
            + spacing * cols.len().saturating_sub(1)
    };
    let mut cgroup_w = natural[CGROUP];
    loop {
        let over = total(&columns, cgroup_w).saturating_sub(width);
        if over == 0 {
            break;
        }
        let floor = MIN_CGROUP_WIDTH.min(natural[CGROUP]);
        if cgroup_w > floor {
            cgroup_w = cgroup_w.saturating_sub(over).max(floor);
            continue;
        }
        let Some(pos) = columns
            .iter()
            .enumerate()
            .filter(|(_, &i)| i != CGROUP)
            .min_by_key(|(_, &i)| KEEP_PRIORITY[i])
            .map(|(p, _)| p)
            .filter(|_| columns.len() > 2)
        else {
            break;
        };
        columns.remove(pos);
        // With room again, give the cgroup back what it lost.
        let spare = width.saturating_sub(total(&columns, cgroup_w));
        cgroup_w = (cgroup_w + spare).min(natural[CGROUP]);
    }
    let widths = columns
        .iter()
        .map(|&i| if i == CGROUP { cgroup_w } else { natural[i] })
        .collect();
    let rows = rows
        .iter()
        .map(|r| {
            columns
                .iter()
                .map(|&i| {
                    let c = r.cells.get(i).cloned().unwrap_or_default();
                    if i == CGROUP {
                        shorten_middle(&c, cgroup_w)
                    } else {
                        c
                    }
                })
                .collect()
        })
        .collect();
    Fitted {
        offered,
        columns,
        widths,
        rows,
    }
}

/// Column-aligned plain text of a fitted table (the columns that fit a terminal).
pub fn render_fitted(f: &Fitted) -> String {
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (n, (c, (&i, w))) in cells.zip(f.columns.iter().zip(&f.widths)).enumerate() {
            if n > 0 {
                s.push_str("  ");
            }
            if right_aligned(i) {
                s.push_str(&format!("{c:>w$}"));
            } else {
                s.push_str(&format!("{c:<w$}"));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&mut f.columns.iter().map(|&i| HEADER[i]));
    out.push('\n');
    for r in &f.rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

/// The columns a fitted table left out, by header ("MiB, REQ MiB"), or `None`.
pub fn hidden(f: &Fitted) -> Option<String> {
    let gone: Vec<&str> = f
        .offered
        .iter()
        .copied()
        .filter(|i| !f.columns.contains(i))
        .map(|i| HEADER[i])
        .collect();
    (!gone.is_empty()).then(|| gone.join(", "))
}

/// Column-aligned plain text of `rows` under [`HEADER`] (the columns they have).
pub fn render_text(rows: &[Row]) -> String {
    let shown = shown_columns(rows);
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.cells.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &dyn Fn(usize) -> String| {
        let mut s = String::new();
        for (n, &i) in shown.iter().enumerate() {
            if n > 0 {
                s.push_str("  ");
            }
            let c = cells(i);
            if right_aligned(i) {
                s.push_str(&format!("{c:>w$}", w = widths[i]));
            } else {
                s.push_str(&format!("{c:<w$}", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&|i| HEADER[i].to_string());
    out.push('\n');
    for r in rows {
        out.push_str(&line(&|i| r.cells.get(i).cloned().unwrap_or_default()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cgroup: &str, nums: [&str; 9]) -> Row {
        let mut cells = vec![
            "loop3".to_string(),
            cgroup.to_string(),
            "-".to_string(),
            "write".to_string(),
        ];
        cells.extend(nums.iter().map(|n| n.to_string()));
        Row {
            cells,
            is_total: false,
            at: RowAt {
                device: 0,
                cgroup: Some(0),
                dir: Some(Dir::Write),
            },
        }
    }

    fn sample() -> Vec<Row> {
        vec![
            row(
                "/system.slice/mt-test-4242-app-a",
                [
                    "3100032", "12109.5", "3100032", "0", "3003031", "97001", "12109.5", "32.0",
                    "128 KiB",
                ],
            ),
            row(
                "/system.slice/mt-test-4242-app-b",
                ["8", "0.0", "8", "0", "0", "8", "0.0", "1.0", "4 KiB"],
            ),
        ]
    }

    #[test]
    fn narrow_terminals_drop_columns_and_never_cut_a_number() {
        let rows = sample();
        for width in [80, 100, 160] {
            let f = fit(&rows, width, 2);
            let used: usize = f.widths.iter().sum::<usize>() + 2 * (f.widths.len() - 1);
            assert!(used <= width, "{width}: {used} columns used; {f:?}");
            for (r, cells) in rows.iter().zip(&f.rows) {
                for (&i, c) in f.columns.iter().zip(cells) {
                    if i != CGROUP {
                        assert_eq!(c, &r.cells[i], "{width}: column {} cut", HEADER[i]);
                    }
                }
            }
            for (&i, w) in f.columns.iter().zip(&f.widths) {
                assert!(*w >= HEADER[i].len(), "{width}: header {} cut", HEADER[i]);
            }
            // The two cgroups differ only at the end: they stay apart.
            let cg = f.columns.iter().position(|&i| i == CGROUP).unwrap();
            assert_ne!(f.rows[0][cg], f.rows[1][cg], "{width}: {f:?}");
            assert!(
                f.rows[0][cg].ends_with("app-a"),
                "{width}: {}",
                f.rows[0][cg]
            );
            for must in ["CGROUP", "DIR", "BIOS", "MERGED", "REQS"] {
                let i = HEADER.iter().position(|h| *h == must).unwrap();
                assert!(f.columns.contains(&i), "{width}: {must} dropped; {f:?}");
            }
        }
        // Wide enough: everything, nothing shortened; the latency columns only where counted.
        let f = fit(&rows, 200, 2);
        assert_eq!(f.columns.len(), HEADER.len() - 2);
        assert_eq!(f.rows[0][1], "/system.slice/mt-test-4242-app-a");
        assert_eq!(hidden(&f), None, "{f:?}");
        let mut timed = sample();
        for r in &mut timed {
            r.cells
                .extend(["≤33 µs".to_string(), "≤262 µs".to_string()]);
        }
        let f = fit(&timed, 220, 2);
        assert_eq!(f.columns.len(), HEADER.len());
        let f = fit(&timed, 80, 2);
        assert_eq!(
            hidden(&f).map(|h| h.contains("Q p99")),
            Some(true),
            "latency goes before the counts at 80: {f:?}"
        );
        // At 80 the least needed go first: request MiB before bios.
        let f = fit(&rows, 80, 2);
        assert!(!f.columns.contains(&10), "REQ MiB kept at 80: {f:?}");
    }

    #[test]
    fn paths_shorten_in_the_middle() {
        assert_eq!(shorten_middle("/app-a", 16), "/app-a");
        assert_eq!(
            shorten_middle("/kubepods.slice/pod1234/ctr-abcdef", 16),
            "/kubepod…-abcdef"
        );
        assert_eq!(
            shorten_middle("/kubepods.slice/pod1234/ctr-abcdef", 16)
                .chars()
                .count(),
            16
        );
    }

    use crate::view::prometheus::tests::{snapshot, write_stats};

    const ID: &str = "3f2a9c1b7d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";

    #[test]
    fn names_beside_paths_and_long_paths_shortened() {
        let k8s = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8e1f2a3b_4c5d_4e6f_8a9b_0c1d2e3f4a5b.slice/cri-containerd-{ID}.scope"
        );
        let s = snapshot(&[
            (&k8s, write_stats(32, 1)),
            ("/mt", write_stats(8, 2)),
            ("/system.slice/nginx.service", write_stats(4, 4)),
        ]);
        let text = render_text(&rows(&s));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("DEVICE  CGROUP") && lines[0].contains("  NAME  "),
            "{text}"
        );
        let k = lines.iter().find(|l| l.contains("k8s:")).expect(&text);
        assert!(
            k.contains("k8s:burstable/pod 8e1f2a3b…/ctr 3f2a9c1b7d4e"),
            "{text}"
        );
        let cgroup_cell = k.split_whitespace().nth(1).unwrap();
        // at most PATH_WIDTH: the digits of a number the cut would split are left out whole
        assert!(cgroup_cell.chars().count() <= PATH_WIDTH, "{cgroup_cell}");
        assert!(
            cgroup_cell.chars().count() >= PATH_WIDTH - 8,
            "{cgroup_cell}"
        );
        assert!(cgroup_cell.starts_with("/kubepods.slice/kube") && cgroup_cell.ends_with(".scope"));
        // the counts are whole, the columns still line up
        assert!(k.split_whitespace().any(|w| w == "32"), "{k}");
        assert!(lines
            .iter()
            .any(|l| l.contains("/system.slice/nginx.service") && l.contains("svc:nginx")));
        let mt = lines.iter().find(|l| l.contains("/mt ")).unwrap();
        assert_eq!(mt.split_whitespace().nth(2), Some("-"), "no name: a dash");
        let widths: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w <= widths[0] + 4), "{text}");
        // a verdict line names the cgroup with its name
        let mut s = s;
        s.devices[0].cgroups[2].dirs.write.verdict = Some("x".into());
        assert!(remarks(&s)
            .iter()
            .any(|r| r.contains("/system.slice/nginx.service (svc:nginx) write: x")));
    }

    /// Every run of digits in `short` is a whole run of `long`.
    fn numbers_whole(long: &str, short: &str) -> bool {
        let runs = |s: &str| -> Vec<String> {
            s.split(|c: char| !c.is_ascii_digit())
                .filter(|r| !r.is_empty())
                .map(String::from)
                .collect()
        };
        let all = runs(long);
        runs(short).iter().all(|r| all.contains(r))
    }

    #[test]
    fn shorten_middle_keeps_both_ends_and_numbers_whole() {
        assert_eq!(shorten_middle("abc", 10), "abc");
        assert_eq!(shorten_middle("abcdefghij", 5), "ab…ij");
        assert_eq!(shorten_middle("aa123456789bb", 8), "aa…bb");
        for (s, max) in [
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope",
                20,
            ),
            (
                "k8s:burstable/pod shop/cart-7d4f9-12345/ctr app-20240101",
                30,
            ),
            ("/a/1234567890/b/9876543210/c", 12),
        ] {
            let out = shorten_middle(s, max);
            assert!(out.chars().count() <= max, "{out}");
            assert!(out.contains('…'), "{out}");
            assert!(numbers_whole(s, &out), "{s} → {out}");
        }
    }
}
