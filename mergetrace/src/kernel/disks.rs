//! The disks of a run as the programs see them: each disk's slot in the per-disk maps, how
//! the programs find it (the frozen list, or the `DISK_SLOTS` map where disks may also appear
//! during the run), what they are told of each, and the plug flushes counted per slot.
use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray},
    Ebpf,
};
use mergetrace_common::{
    lookup, unplug_slot, DiskConfig, TracedDevices, UnplugKey, FROZEN_DISKS, MAX_DISKS,
    UNPLUG_MAX_DEPTH,
};

use crate::sys::device::Device;

/// The plug flushes counted so far, of each disk (`devs`, by slot) by kind and depth.
pub fn read_unplugs(
    map: &PerCpuArray<MapData, u64>,
    devs: &[u32],
) -> Result<Vec<(UnplugKey, u64)>> {
    let mut out = Vec::new();
    for (slot, dev) in devs.iter().enumerate().filter(|(_, d)| **d != 0) {
        for explicit in [false, true] {
            for depth in 0..=UNPLUG_MAX_DEPTH {
                let i = unplug_slot(slot as u32, explicit, depth);
                let per_cpu = map.get(&i, 0).context("cannot read the UNPLUGS map")?;
                let n: u64 = per_cpu.iter().sum();
                if n > 0 {
                    let key = UnplugKey {
                        dev: *dev,
                        depth,
                        explicit: explicit as u32,
                        _pad: 0,
                    };
                    out.push((key, n));
                }
            }
        }
    }
    Ok(out)
}

/// The disks of a run and how the programs find them: the frozen list when it names at most
/// [`FROZEN_DISKS`] (one comparison an event for one disk), else the `DISK_SLOTS` map, which
/// user space fills in; with `every_disk`, also a slot for each disk at its first event, the
/// disks present now and not traced ignored from the start.
pub struct DiskPlan {
    pub traced: TracedDevices,
    /// `dev_t` by slot, 0 for a free one.
    pub devs: Vec<u32>,
    pub config: Vec<DiskConfig>,
}

impl DiskPlan {
    pub fn new(devices: &[Device], every_disk: bool) -> Result<DiskPlan> {
        let mut devs: Vec<u32> = devices.iter().map(|d| d.dev().0).collect();
        let mut config: Vec<DiskConfig> = devices
            .iter()
            .map(|d| DiskConfig {
                bio_based: d.bio_based as u32,
                ..DiskConfig::default()
            })
            .collect();
        if every_disk {
            for other in crate::sys::device::all_disks() {
                if !devs.contains(&other.dev().0) {
                    devs.push(other.dev().0);
                    config.push(DiskConfig {
                        ignored: 1,
                        ..DiskConfig::default()
                    });
                }
            }
        }
        let lookup = if every_disk {
            lookup::EVERY_DISK
        } else if devs.len() > FROZEN_DISKS {
            lookup::MAP
        } else {
            lookup::FROZEN
        };
        // Room for as many disks again to appear, where they may (new ones take slots past
        // the placed ones: `new_disk_slot`).
        let slots = match lookup {
            lookup::EVERY_DISK => (2 * devs.len()).max(256).next_power_of_two() as u32,
            _ => devs.len().max(1) as u32,
        };
        if slots > MAX_DISKS {
            bail!(
                "mergetrace traces at most {MAX_DISKS} disks at once ({} here): name fewer with -d",
                devs.len()
            );
        }
        let mut traced = TracedDevices {
            count: devices.len() as u32,
            lookup,
            slots,
            placed: devs.len() as u32,
            ..TracedDevices::default()
        };
        if lookup == lookup::FROZEN {
            traced.devs[..devs.len()].copy_from_slice(&devs);
        }
        devs.resize(slots as usize, 0);
        config.resize(slots as usize, DiskConfig::default());
        Ok(DiskPlan {
            traced,
            devs,
            config,
        })
    }

    /// Gives the disks their slots in `DISK_SLOTS` where the programs look there; returns the
    /// map of slot owners where disks may appear.
    pub fn register(&self, ebpf: &mut Ebpf) -> Result<Option<BpfHashMap<MapData, u32, u32>>> {
        if self.traced.lookup == lookup::FROZEN {
            return Ok(None);
        }
        let mut slots: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
            ebpf.map_mut("DISK_SLOTS")
                .context("DISK_SLOTS map missing")?,
        )?;
        for (slot, dev) in self.devs.iter().enumerate().filter(|(_, d)| **d != 0) {
            slots
                .insert(*dev, slot as u32, 0)
                .context("cannot write the DISK_SLOTS map")?;
        }
        let mut owners: BpfHashMap<_, u32, u32> = BpfHashMap::try_from(
            ebpf.take_map("SLOT_OWNERS")
                .context("SLOT_OWNERS map missing")?,
        )?;
        for (slot, dev) in self.devs.iter().enumerate().filter(|(_, d)| **d != 0) {
            owners
                .insert(slot as u32, *dev, 0)
                .context("cannot write the SLOT_OWNERS map")?;
        }
        Ok((self.traced.lookup == lookup::EVERY_DISK).then_some(owners))
    }
}

/// Tells the programs what `config` says of each traced disk, by slot.
pub fn write_disk_config(ebpf: &mut Ebpf, config: &[DiskConfig]) -> Result<()> {
    let mut map: Array<_, DiskConfig> = Array::try_from(
        ebpf.map_mut("DISK_CONFIG")
            .context("DISK_CONFIG map missing")?,
    )?;
    for (slot, c) in config.iter().enumerate() {
        map.set(slot as u32, *c, 0)
            .context("cannot write the DISK_CONFIG map")?;
    }
    Ok(())
}
