//! The demo's io.cost arm, where cgroup v2 has io.cost: the same 4 KiB sequential O_DIRECT
//! writes in batches of 32, in a cgroup of the demo's own, with io.cost on for the scratch
//! disk (a linear model, vrate pinned at 100 %), merging on and off. io.cost charges a bio
//! that starts a request a base cost and one that merges its pages only, so here merging is
//! what raises the cgroup's IOPS — the opposite of the throttled arms. Each arm's charge is
//! checked against io.stat's `cost.usage`.
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::lab::{Arm, DemoCgroup, IocostCheck, Lab};
use crate::{
    model::iocost::{Charge, Counts},
    sys::{
        cgroups::{Cgroups, Hierarchy},
        device::Device,
    },
};

/// 100 MB/s and 1,000 IOPS both ways: a 4 KiB page costs 41 µs, a request's base 959 µs.
const MODEL: &str = "ctrl=user model=linear rbps=100000000 rseqiops=1000 rrandiops=1000 \
                     wbps=100000000 wseqiops=1000 wrandiops=1000";
/// vrate pinned at 100 %: io.stat's µs are the model's.
const QOS: &str = "enable=1 ctrl=user rpct=0 rlat=250000 wpct=0 wlat=250000 min=100.00 max=100.00";
/// io.cost's period with this qos: 2 × max(rlat, wlat).
const PERIOD: Duration = Duration::from_millis(500);
/// The model, as the table's title says it.
pub(super) const MODEL_WORDS: &str = "linear model 100 MB/s and 1,000 IOPS, vrate pinned at 100 %";

/// Why io.cost cannot be turned on here, if it cannot.
pub(super) fn unavailable(cg: &Cgroups) -> Option<&'static str> {
    match cg.hierarchy {
        Hierarchy::V1 => Some(
            "io.cost is a cgroup v2 controller, and this machine's io controller is blkio on \
             cgroup v1",
        ),
        Hierarchy::V2 if !cg.mount.join("io.cost.qos").exists() => {
            Some("this kernel has no io.cost (CONFIG_BLK_CGROUP_IOCOST)")
        }
        Hierarchy::V2 => None,
    }
}

/// io.cost on for a disk with [`MODEL`] and [`QOS`]; off again, its model back to the
/// kernel's, when dropped.
struct IocostOn {
    root: PathBuf,
    maj_min: String,
}

impl IocostOn {
    fn new(root: PathBuf, dev: &Device) -> Result<IocostOn> {
        let on = IocostOn {
            root,
            maj_min: format!("{}:{}", dev.major, dev.minor),
        };
        on.write("io.cost.model", MODEL)?;
        on.write("io.cost.qos", QOS)?;
        Ok(on)
    }

    fn write(&self, file: &str, settings: &str) -> Result<()> {
        let line = format!("{} {settings}", self.maj_min);
        std::fs::write(self.root.join(file), &line)
            .with_context(|| format!("cannot write {line:?} to {file}"))
    }
}

impl Drop for IocostOn {
    fn drop(&mut self) {
        let _ = self.write("io.cost.qos", "enable=0");
        let _ = self.write("io.cost.model", "ctrl=auto");
    }
}

/// The two arms, merging on and off, `ios` writes each, under io.cost.
pub(super) fn arms(lab: &mut Lab, ios: u64, cg: &Cgroups) -> Result<Vec<Arm>> {
    let dev = lab.disk.dev.clone();
    let _on = IocostOn::new(cg.mount.clone(), &dev)?;
    // The programs learn which disks have io.cost on when they load.
    lab.retrace()?;
    let Some(model) = lab.session.iocost_models().get(&dev.dev().0).copied() else {
        bail!(
            "io.cost is on for {}, but the programs do not see it",
            dev.name
        );
    };
    let cgroup = DemoCgroup::new(cg, "iocost")?;
    let mut arms = Vec::new();
    for (nomerges, label) in [
        (0, "nomerges=0 (merging on)"),
        (2, "nomerges=2 (merging off)"),
    ] {
        lab.disk.queue("nomerges", &nomerges.to_string())?;
        let started = Instant::now();
        let before = cgroup.io_stat(&dev, "cost.usage")?;
        let mut arm = lab.run(label, (ios, 32, 0), &cgroup)?;
        let iops = arm.ios as f64 / arm.secs;
        let busy_pct = Charge::of(Counts::of(&arm.counts), model.write).cost_us / arm.secs / 1e4;
        // io.stat shows what was flushed at each period's end; a charge after the last flush
        // of a cgroup that goes idle is flushed only when it is active again: one more write
        // makes it active, and two periods later its charge is all in cost.usage.
        let last = lab.run(
            &format!("{label}, a last write"),
            (1, 1, ios * 4096),
            &cgroup,
        )?;
        arm.add(&last);
        std::thread::sleep(2 * PERIOD + Duration::from_millis(100));
        let kernel_us = cgroup.io_stat(&dev, "cost.usage")? - before;
        let charge = Charge::of(Counts::of(&arm.counts), model.write);
        arm.iocost = Some(IocostCheck {
            ours_us: charge.cost_us,
            kernel_us,
            periods: started.elapsed().as_secs_f64() / PERIOD.as_secs_f64(),
            iops,
            busy_pct,
        });
        arms.push(arm);
    }
    lab.disk.queue("nomerges", "0")?;
    Ok(arms)
}
