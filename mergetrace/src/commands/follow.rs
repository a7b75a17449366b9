//! What changes on the traced disks while a run goes on: io.cost switched on or off or its
//! model changed, wbt switched on or off, io.latency targets set or cleared, the scheduler and
//! `nomerges`. Every interval reads them again: the programs are told of io.cost (they charge
//! its bios from then on), the views price each interval with what was in force, and each
//! change is said once, with the time it was found ("loop0: io.cost switched on (…) by
//! 12:03:04"): at most an interval after it happened.
use std::collections::{BTreeMap, BTreeSet};

use crate::{
    fmt, kernel,
    sys::{
        cgroups::Cgroups,
        device::{self, Device, Selection},
        iocost::Iocost,
        iolatency::{self, IoLatency},
        queue::QueueSettings,
        wbt::{self, Wbt},
    },
};

/// The traced disks and their settings as the run last saw them.
pub struct Follow {
    /// Which disks that appear during the run are traced (`-d` patterns, `--all-disks`).
    selection: Selection,
    /// Scheduler and `nomerges`, by `dev_t`.
    queue: BTreeMap<u32, (Option<String>, u8)>,
    /// io.latency's targets, by `dev_t` (the disks that have any).
    pub iolatency: BTreeMap<u32, IoLatency>,
    /// Traced disks that went away (their totals stay).
    gone: BTreeSet<u32>,
}

impl Follow {
    /// What the run found at its start (the session has io.cost's and wbt's).
    pub fn new(
        devices: &[Device],
        selection: Selection,
        iolatency: BTreeMap<u32, IoLatency>,
    ) -> Follow {
        Follow {
            selection,
            queue: devices.iter().map(|d| (d.dev().0, queue_of(d))).collect(),
            iolatency,
            gone: BTreeSet::new(),
        }
    }

    /// Reads the disks and their settings again: a disk that appeared and is selected joins
    /// `devices` (counted from its first bio: it took a slot then), one that went away keeps
    /// its totals; the session is told what changed, and the changes come back, one line
    /// each, as people read them.
    pub fn check(
        &mut self,
        devices: &mut Vec<Device>,
        session: &mut kernel::Session,
        cgroups: &Cgroups,
    ) -> Vec<String> {
        let at = fmt::clock(kernel::monotonic_ns());
        let mut said = self.new_disks(devices, session, &at);
        for d in devices.iter() {
            let dev = d.dev().0;
            if !d.sys_dir().exists() {
                if self.gone.insert(dev) {
                    said.push(format!(
                        "{}: the disk went away by {at}; its totals stay",
                        d.name
                    ));
                }
                continue;
            }
            self.gone.remove(&dev);
            let iocost = crate::sys::iocost::of(d);
            if let Some(line) = iocost_change(session.iocost.get(&dev), iocost.as_ref()) {
                match session.set_iocost(dev, iocost) {
                    Ok(()) => said.push(format!("{}: {line} by {at}", d.name)),
                    Err(e) => said.push(format!(
                        "{}: {line} by {at}, but the programs cannot follow it: {e:#}",
                        d.name
                    )),
                }
            }
            let w = wbt::of(d);
            if let Some(line) = wbt_change(session.wbt.get(&dev), w.as_ref()) {
                said.push(format!("{}: {line} by {at}", d.name));
                match w {
                    Some(w) => session.wbt.insert(dev, w),
                    None => session.wbt.remove(&dev),
                };
            }
            let q = queue_of(d);
            if let Some(before) = self.queue.insert(dev, q.clone()) {
                said.extend(queue_changes(&before, &q).map(|l| format!("{}: {l} by {at}", d.name)));
            }
        }
        let targets = iolatency::targets_on(devices, cgroups);
        if targets != self.iolatency {
            for d in devices.iter() {
                let (was, now) = (self.iolatency.get(&d.dev().0), targets.get(&d.dev().0));
                if was != now {
                    let line = match now {
                        Some(t) => t.describe(),
                        None => "io.latency targets cleared".to_string(),
                    };
                    said.push(format!("{}: {line} (by {at})", d.name));
                }
            }
            self.iolatency = targets;
        }
        said
    }
}

impl Follow {
    /// The disks that took a slot since the last look: traced if selected (said), else
    /// ignored from now on.
    fn new_disks(
        &mut self,
        devices: &mut Vec<Device>,
        session: &mut kernel::Session,
        at: &str,
    ) -> Vec<String> {
        let mut said = Vec::new();
        let new = match session.new_disks() {
            Ok(new) => new,
            Err(e) => return vec![format!("cannot read the disks found: {e:#}")],
        };
        for dev in new {
            let disk = device::of_dev(dev).filter(|d| self.selection.wants(d));
            let told = match &disk {
                Some(d) if !devices.iter().any(|o| o.dev() == d.dev()) => session.trace_disk(d),
                Some(_) => Ok(()),
                None => session.ignore_disk(dev),
            };
            if let Err(e) = told {
                said.push(format!("cannot follow a new disk ({dev}): {e:#}"));
                continue;
            }
            if let Some(d) = disk {
                said.push(format!(
                    "{} ({}): a new disk, traced from its first bio (found by {at})",
                    d.name,
                    d.dev()
                ));
                self.queue.insert(dev, queue_of(&d));
                devices.push(d);
            }
        }
        said
    }
}

fn queue_of(d: &Device) -> (Option<String>, u8) {
    match QueueSettings::read(d) {
        Ok(q) => (q.scheduler.map(|s| s.active), q.nomerges),
        Err(_) => (None, 0),
    }
}

/// io.cost going from `was` to `now` on a disk, said; `None` if nothing the programs or the
/// pricing use changed.
fn iocost_change(was: Option<&Iocost>, now: Option<&Iocost>) -> Option<String> {
    match (was, now) {
        (None, None) => None,
        (None, Some(c)) => Some(format!(
            "io.cost switched on (qos {}; model {})",
            c.qos, c.model_line
        )),
        (Some(_), None) => Some("io.cost switched off".to_string()),
        (Some(a), Some(b)) if a.model() != b.model() || a.rule_bits() != b.rule_bits() => {
            Some(format!("io.cost's model changed to {}", b.model_line))
        }
        (Some(_), Some(_)) => None,
    }
}

/// wbt going from `was` to `now` on a disk, said.
fn wbt_change(was: Option<&Wbt>, now: Option<&Wbt>) -> Option<String> {
    match (was, now) {
        (a, b) if a == b => None,
        (_, Some(w)) if w.on() => Some(format!("wbt switched on (latency target {})", w.target())),
        (Some(w), _) if w.on() => Some("wbt switched off".to_string()),
        _ => None,
    }
}

/// The scheduler and `nomerges` going from `was` to `now`, said.
fn queue_changes<'a>(
    was: &'a (Option<String>, u8),
    now: &'a (Option<String>, u8),
) -> impl Iterator<Item = String> + 'a {
    let sched = (was.0 != now.0).then(|| {
        format!(
            "scheduler changed from {} to {}",
            was.0.as_deref().unwrap_or("none"),
            now.0.as_deref().unwrap_or("none")
        )
    });
    let nomerges = (was.1 != now.1).then(|| {
        let what = match now.1 {
            0 => "all merges on",
            1 => "only simple merges (no hash lookups)",
            _ => "no merges",
        };
        format!("nomerges changed from {} to {}: {what}", was.1, now.1)
    });
    sched.into_iter().chain(nomerges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::wbt::WbtState;

    #[test]
    fn changes_are_said_once_and_only_when_they_happen() {
        let on = Wbt {
            min_lat_us: 2000,
            state: WbtState::On,
        };
        let off = Wbt {
            min_lat_us: 0,
            state: WbtState::Off,
        };
        assert_eq!(wbt_change(Some(&on), Some(&on)), None);
        assert_eq!(
            wbt_change(Some(&off), Some(&on)).as_deref(),
            Some("wbt switched on (latency target 2 ms)")
        );
        assert_eq!(
            wbt_change(Some(&on), Some(&off)).as_deref(),
            Some("wbt switched off")
        );
        assert_eq!(wbt_change(None, Some(&off)), None);
        let was = (Some("mq-deadline".to_string()), 0);
        let now = (Some("none".to_string()), 2);
        let said: Vec<String> = queue_changes(&was, &now).collect();
        assert_eq!(
            said,
            [
                "scheduler changed from mq-deadline to none",
                "nomerges changed from 0 to 2: no merges"
            ]
        );
        assert_eq!(queue_changes(&was, &was).count(), 0);
        assert_eq!(iocost_change(None, None), None);
    }
}
