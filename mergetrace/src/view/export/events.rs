//! `--format csv` and `--format jsonl`: one line per event, in capture order, with named
//! columns. The columns are in [`COLUMNS`] and documented in docs/export.md.
use std::io::Write;

use anyhow::Result;
use mergetrace_common::{kind, vocab, Event};

use crate::offline::names::{addr, dir_name, flag_names, maj_min, merge_path, op_name, Names};

/// Column names, in order (CSV header; JSONL keys).
pub const COLUMNS: [&str; 20] = [
    "ts_ns",
    "time_s",
    "kind",
    "device",
    "dev",
    "cgroup_id",
    "cgroup",
    "op",
    "dir",
    "id",
    "aux64",
    "sector",
    "bytes",
    "aux",
    "path",
    "merge_path",
    "flags",
    "flag_names",
    "kind_code",
    "run",
];

/// One event's values, as strings for CSV and typed for JSON.
enum Val {
    U(u64),
    F(f64),
    S(String),
    Null,
}

fn values(ev: &Event, names: &mut Names) -> [Val; 20] {
    use Val::*;
    let request_or_bio = ev.kind != kind::UNPLUG;
    [
        U(ev.ts_ns),
        F(names.secs(ev.ts_ns)),
        S(vocab::kind_name(ev.kind).to_string()),
        S(names.device(ev.dev)),
        S(maj_min(ev.dev)),
        U(ev.cgroup_id),
        if request_or_bio {
            S(names.cgroup(ev.cgroup_id).to_string())
        } else {
            Null
        },
        S(op_name(ev.op)),
        S(dir_name(ev.op).to_string()),
        S(addr(ev.id)),
        S(addr(ev.aux64)),
        U(ev.sector),
        U(ev.bytes as u64),
        U(ev.aux as u64),
        U(ev.path as u64),
        merge_path(ev.kind, ev.path).map_or(Null, |p| S(p.to_string())),
        U(ev.flags as u64),
        S(flag_names(ev.flags)),
        U(ev.kind as u64),
        U(ev.run_len()),
    ]
}

/// RFC 4180 quoting where needed.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub fn write_csv(out: &mut dyn Write, events: &[Event], names: &mut Names) -> Result<()> {
    writeln!(out, "{}", COLUMNS.join(","))?;
    let mut line = String::with_capacity(256);
    for ev in events {
        line.clear();
        for (i, v) in values(ev, names).iter().enumerate() {
            if i > 0 {
                line.push(',');
            }
            match v {
                Val::U(n) => line.push_str(&n.to_string()),
                Val::F(f) => line.push_str(&format!("{f:.9}")),
                Val::S(s) => line.push_str(&csv_field(s)),
                Val::Null => {}
            }
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

pub fn write_jsonl(out: &mut dyn Write, events: &[Event], names: &mut Names) -> Result<()> {
    let mut line = String::with_capacity(512);
    for ev in events {
        // keys in column order (a serde_json map would sort them)
        line.clear();
        line.push('{');
        for (i, (k, v)) in COLUMNS.iter().zip(values(ev, names)).enumerate() {
            if i > 0 {
                line.push(',');
            }
            line.push('"');
            line.push_str(k);
            line.push_str("\":");
            match v {
                Val::U(n) => line.push_str(&n.to_string()),
                Val::F(f) => {
                    line.push_str(&serde_json::Value::from((f * 1e9).round() / 1e9).to_string())
                }
                Val::S(s) => line.push_str(&serde_json::Value::from(s).to_string()),
                Val::Null => line.push_str("null"),
            }
        }
        line.push_str("}\n");
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        capture::{Header, RecordedCgroup, RecordedDevice},
        testing::synth::{Synth, START_NS},
    };
    use mergetrace_common::path;

    pub fn header() -> Header {
        Header {
            start_monotonic_ns: START_NS,
            devices: vec![RecordedDevice {
                name: "loop2".into(),
                major: 7,
                minor: 2,
                ..Default::default()
            }],
            cgroups: vec![RecordedCgroup {
                id: 100,
                path: "/a,\"b\"".into(),
                name: None,
            }],
            ..Header::default()
        }
    }

    #[test]
    fn export_csv_and_jsonl_one_line_per_event() {
        let mut s = Synth::new();
        s.batch(7 << 20 | 2, 100, 0, 4, 4096, false, path::PLUG);
        let h = header();
        let mut csv = Vec::new();
        write_csv(&mut csv, &s.events, &mut Names::new(&h)).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), s.events.len() + 1);
        assert_eq!(lines[0], COLUMNS.join(","));
        // bio_queue of the first bio: quoted cgroup path with a comma and quotes
        assert!(
            lines[1].starts_with(&format!(
                "{},0.000001000,bio_queue,loop2,7:2,100,\"/a,\"\"b\"\"\",write,write,0x",
                START_NS + 1000
            )),
            "{}",
            lines[1]
        );
        let mut jl = Vec::new();
        write_jsonl(&mut jl, &s.events, &mut Names::new(&h)).unwrap();
        let jl = String::from_utf8(jl).unwrap();
        let objs: Vec<serde_json::Value> = jl
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(objs.len(), s.events.len());
        let merge = objs.iter().find(|o| o["kind"] == "back_merge").unwrap();
        assert_eq!(merge["merge_path"], "plug");
        assert_eq!(merge["cgroup"], "/a,\"b\"");
        assert_eq!(merge["bytes"], 4096);
        let unplug = objs.iter().find(|o| o["kind"] == "unplug").unwrap();
        assert_eq!(unplug["flag_names"], "unplug_explicit");
        assert!(unplug["cgroup"].is_null());
        assert_eq!(objs[0]["time_s"], 0.000001);
        for o in &objs {
            assert_eq!(o.as_object().unwrap().len(), COLUMNS.len());
        }
        // keys in column order
        let first = jl.lines().next().unwrap();
        let mut at = 0;
        for c in COLUMNS {
            let i = first[at..].find(&format!("\"{c}\":")).expect(c);
            at += i;
        }
    }
}
