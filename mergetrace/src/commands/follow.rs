//! What changes on the traced disks while a run goes on: io.cost switched on or off or its
//! model changed, wbt switched on or off, io.latency targets set or cleared, the scheduler and
//! `nomerges`. Every interval reads them again: the programs are told of io.cost (they charge
//! its bios from then on), the views price each interval with what was in force, and each
//! change is said once, with the time it was found ("loop0: io.cost switched on (…) by
//! 12:03:04"): at most an interval after it happened.
use std::collections::BTreeMap;

use crate::{
    fmt, kernel,
    sys::{
        cgroups::Cgroups,
        device::Device,
        iocost::Iocost,
        iolatency::{self, IoLatency},
        queue::QueueSettings,
        wbt::{self, Wbt},
    },
};

/// The settings of the traced disks as the run last saw them.
pub struct Follow {
    /// Scheduler and `nomerges`, by `dev_t`.
    queue: BTreeMap<u32, (Option<String>, u8)>,
    /// io.latency's targets, by `dev_t` (the disks that have any).
    pub iolatency: BTreeMap<u32, IoLatency>,
}

impl Follow {
    /// What the run found at its start (the session has io.cost's and wbt's).
    pub fn new(devices: &[Device], iolatency: BTreeMap<u32, IoLatency>) -> Follow {
        Follow {
            queue: devices.iter().map(|d| (d.dev().0, queue_of(d))).collect(),
            iolatency,
        }
    }

    /// Reads the settings again: the session is told what changed, and the changes come
    /// back, one line each, as people read them.
    pub fn check(
        &mut self,
        devices: &[Device],
        session: &mut kernel::Session,
        cgroups: &Cgroups,
    ) -> Vec<String> {
        let at = fmt::clock(kernel::monotonic_ns());
        let mut said = Vec::new();
        for d in devices {
            let dev = d.dev().0;
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
            for d in devices {
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
