//! io.cost's settings for a disk, from the cgroup v2 root's `io.cost.qos` and `io.cost.model`,
//! and how the running kernel charges an empty bio. io.cost exists only on cgroup v2.
use std::path::Path;

use mergetrace_common::iocost as rule;

use crate::capture::RecordedIocost;
use crate::model::iocost::{micros, Coefs, Linear, Model};
use crate::sys::{
    cgroups::{io_hierarchy, Hierarchy},
    device::Device,
    release,
};

/// io.cost on one disk, as the run found it when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iocost {
    /// The disk's `io.cost.qos` line without its `MAJ:MIN` ("enable=1 ctrl=user rpct=…").
    pub qos: String,
    /// The disk's `io.cost.model` line without its `MAJ:MIN` ("ctrl=user model=linear …").
    pub model_line: String,
    pub read: Linear,
    pub write: Linear,
    /// This kernel charges an empty bio (a data-less flush) a base cost and a page.
    pub empty_bios_charged: bool,
}

impl Iocost {
    /// The coefficients the snapshot charges with.
    pub fn model(&self) -> Model {
        Model {
            read: Coefs::of(self.read),
            write: Coefs::of(self.write),
        }
    }

    /// As a capture's header records it.
    pub fn recorded(&self) -> RecordedIocost {
        RecordedIocost {
            qos: self.qos.clone(),
            model: self.model_line.clone(),
            read: self.read,
            write: self.write,
        }
    }

    /// The programs' per-disk rule bits (`mergetrace_common::iocost`).
    pub fn rule_bits(&self) -> u32 {
        rule::ENABLED
            | if self.empty_bios_charged {
                rule::EMPTY_CHARGED
            } else {
                0
            }
    }

    /// One line for the banner and `check`: what io.cost charges on the disk.
    pub fn describe(&self) -> String {
        let w = self.model().write;
        let us = |v: u64| format!("{:.0} µs", micros(v));
        let random = if w.randio != w.seqio {
            format!(" ({} if random)", us(w.randio))
        } else {
            String::new()
        };
        let page = micros(w.page);
        format!(
            "io.cost is on (qos {}; model {}): a write bio that starts a request pays {}{random} \
             plus {page:.1} µs per 4 KiB, one that merges only the {page:.1} µs per 4 KiB — \
             merging saves the base cost",
            self.qos,
            self.model_line,
            us(w.seqio),
        )
    }
}

/// io.cost on `dev`, if the io hierarchy is cgroup v2 and io.cost is enabled on the disk.
pub fn of(dev: &Device) -> Option<Iocost> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (hierarchy, mount) = io_hierarchy(&mountinfo)?;
    if hierarchy != Hierarchy::V2 {
        return None;
    }
    at(&mount, dev, &release::running())
}

/// io.cost on `dev` from the root cgroup at `mount`.
pub fn at(mount: &Path, dev: &Device, release: &str) -> Option<Iocost> {
    let key = format!("{}:{}", dev.major, dev.minor);
    let line = |file: &str| {
        let text = std::fs::read_to_string(mount.join(file)).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(&key)?.strip_prefix(' ').map(str::to_string))
    };
    let qos = line("io.cost.qos")?;
    if field(&qos, "enable") != Some(1) {
        return None;
    }
    let model_line = line("io.cost.model")?;
    let linear = |p: char| -> Option<Linear> {
        Some(Linear {
            bps: field(&model_line, &format!("{p}bps"))?,
            seqiops: field(&model_line, &format!("{p}seqiops"))?,
            randiops: field(&model_line, &format!("{p}randiops"))?,
        })
    };
    Some(Iocost {
        read: linear('r')?,
        write: linear('w')?,
        qos,
        model_line,
        empty_bios_charged: empty_bios_charged(release),
    })
}

/// A cgroup's io.cost weight for disk `maj:min` from its `io.weight`: the disk's own line
/// (`MAJ:MIN 300`) over the `default` line.
pub fn parse_weight(text: &str, major: u32, minor: u32) -> Option<u64> {
    let dev = format!("{major}:{minor}");
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    };
    value(&dev).or_else(|| value("default"))
}

/// A `key=value` number of an io.cost line.
fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Before 6.6 io.cost charged an empty bio (pages = max(0, 1)) and moved the cursor to its
/// sector; 6.6 skips it ("blk-iocost: skip empty flush bio in iocost", July 2023).
pub fn empty_bios_charged(kernel: &str) -> bool {
    release::before(kernel, 6, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_disks_lines_only() {
        let dir = std::env::temp_dir().join(format!("mt-iocost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("io.cost.qos"),
            "8:0 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n\
             254:16 enable=1 ctrl=user rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=100.00 max=100.00\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("io.cost.model"),
            "254:16 ctrl=user model=linear rbps=100000000 rseqiops=1000 rrandiops=1000 wbps=100000000 wseqiops=1000 wrandiops=500\n",
        )
        .unwrap();
        let disk = |name: &str, major, minor| Device {
            name: name.into(),
            major,
            minor,
            notes: vec![],
            bio_based: false,
        };
        let vdb = disk("vdb", 254, 16);
        let c = at(&dir, &vdb, "6.1.0-57-cloud-amd64").unwrap();
        assert_eq!(c.write.randiops, 500);
        assert!(c.empty_bios_charged);
        assert_eq!(c.rule_bits(), rule::ENABLED | rule::EMPTY_CHARGED);
        assert!(c
            .describe()
            .contains("pays 959 µs (1959 µs if random) plus 41.0 µs per 4 KiB"));
        let sda = disk("sda", 8, 0);
        assert_eq!(at(&dir, &sda, "6.12.0"), None, "enable=0");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!empty_bios_charged("6.12.117+deb12-cloud-amd64"));
        assert_eq!(
            parse_weight("default 100\n254:16 300\n", 254, 16),
            Some(300)
        );
        assert_eq!(parse_weight("default 100\n254:16 300\n", 8, 0), Some(100));
        assert_eq!(parse_weight("", 8, 0), None);
        assert!(empty_bios_charged("5.10.0-35-cloud-amd64"));
    }
}
