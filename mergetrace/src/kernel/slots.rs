//! Counter slots. The programs count a (cgroup, disk, direction) key in a per-CPU array slot
//! when user space has given the key one (`SLOT_OF`), with an array index and a per-CPU cache
//! instead of a hash lookup per event (mergetrace-ebpf/src/slot.rs); a key without one is
//! counted in a hash map. What a key holds is its counters (`COUNTERS` by slot, `COUNTS`
//! hashed) and with `--latency` its latency histograms (`LATENCY`, `LATENCY_HASHED`): each
//! kind is a [`Table`], and both go through every step below together. User space gives every key it finds hashed a
//! slot, at most `MAX_SLOTS`; at the next read, when no program counts in the key's hash
//! entries any more, what they hold is moved to user space (the key's base) and the entries
//! deleted, so the hash maps only hold keys newer than a read and those beyond `MAX_SLOTS`.
//!
//! Each slot has a generation (`SLOT_GEN`) the programs check, so that a slot can later be given
//! to another key without a stale per-CPU cache entry counting into it.
//!
//! Removed cgroups are reclaimed, so that the maps hold the living (plus those removed within
//! the grace window), however many cgroups come and go. Reclaiming a key takes two reads, so
//! that nothing is read while a program may still count into it:
//! 1. its `SLOT_OF` entry is pointed at its disk's *removed* slot for the direction (a slot of
//!    the same pool, taken the first time the disk and direction need one) and its own slot's
//!    generation moves on: from then on the programs count it there;
//! 2. at the next read its own slot and hash entries, idle since, are read a last time, added
//!    to the disk's removed counters, zeroed / deleted, and its `SLOT_OF` entry goes (a late
//!    event then starts a new hash entry, reclaimed the same way).
//!
//! The removed counters are returned as the key (disk, [`REMOVED_CGROUP`], direction): every
//! count stays in exactly one key, and the sum over keys only grows.
use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues},
    Pod,
};
use mergetrace_common::{
    latency::LatencyHist, CountKey, Counters, SlotRef, MAX_SLOTS, REMOVED_CGROUP,
};

/// Free slots new keys never take: a disk's removed slot comes from them, so that reclaiming
/// (which frees slots) can always start, however many keys took the others.
const REMOVED_RESERVE: usize = 16;

/// A value the programs keep per key, summed field by field.
pub trait Tally: Pod + Default + PartialEq {
    fn add(&mut self, o: &Self);
}

impl Tally for Counters {
    fn add(&mut self, o: &Self) {
        Counters::add(self, o);
    }
}

impl Tally for LatencyHist {
    fn add(&mut self, o: &Self) {
        LatencyHist::add(self, o);
    }
}

/// One kind of value: its two maps (per CPU, by slot and, for keys without one, hashed) and
/// what user space has taken out of them.
pub struct Table<T: Pod> {
    hashed: PerCpuHashMap<MapData, CountKey, T>,
    by_slot: PerCpuArray<MapData, T>,
    /// The maps' names, for errors.
    names: [&'static str; 2],
    /// What keys with a slot held in the hash map before they had it.
    base: HashMap<CountKey, T>,
    /// What the reclaimed keys held in their own slots and hash entries, per (disk, dir).
    removed: HashMap<(u32, u32), T>,
}

impl<T: Tally> Table<T> {
    pub fn new(
        hashed: PerCpuHashMap<MapData, CountKey, T>,
        by_slot: PerCpuArray<MapData, T>,
        names: [&'static str; 2],
    ) -> Table<T> {
        Table {
            hashed,
            by_slot,
            names,
            base: HashMap::new(),
            removed: HashMap::new(),
        }
    }

    /// Every key's value so far: hashed, and for the keys with a slot its slot's and base;
    /// then per disk and direction the removed keys' under [`REMOVED_CGROUP`] (`removed`: the
    /// removed slot of each). Zeros left out.
    fn totals(
        &self,
        by_key: &HashMap<CountKey, SlotRef>,
        removed: &HashMap<(u32, u32), SlotRef>,
    ) -> Result<Vec<(CountKey, T)>> {
        let mut sum: HashMap<CountKey, T> = HashMap::new();
        for item in self.hashed.iter() {
            let (k, per_cpu) =
                item.with_context(|| format!("cannot read the {} map", self.names[0]))?;
            sum.entry(k).or_default().add(&per_cpu_sum(&per_cpu));
        }
        for (key, r) in by_key {
            let v = sum.entry(*key).or_default();
            v.add(&self.read_slot(r.slot)?);
            if let Some(b) = self.base.get(key) {
                v.add(b);
            }
        }
        for ((dev, dir), r) in removed {
            let mut v = self.read_slot(r.slot)?;
            if let Some(folded) = self.removed.get(&(*dev, *dir)) {
                v.add(folded);
            }
            let key = CountKey {
                cgroup_id: REMOVED_CGROUP,
                dev: *dev,
                dir: *dir,
            };
            sum.insert(key, v);
        }
        Ok(sum
            .into_iter()
            .filter(|(_, v)| *v != T::default())
            .collect())
    }

    fn hashed_keys(&self) -> impl Iterator<Item = CountKey> + '_ {
        self.hashed.keys().filter_map(|k| k.ok())
    }

    /// Moves the key's hash entry, if any, to its base.
    fn move_to_base(&mut self, key: &CountKey) {
        if let Ok(per_cpu) = self.hashed.get(key, 0) {
            self.base
                .entry(*key)
                .or_default()
                .add(&per_cpu_sum(&per_cpu));
            let _ = self.hashed.remove(key);
        }
    }

    /// Step 2 of reclaiming `d.key`: what it held (base, own slot, hash entry) to its disk's
    /// removed value; the slot zeroed, the hash entry deleted.
    fn drain(&mut self, d: &Draining, cpus: usize) -> Result<()> {
        let mut last = self.base.remove(&d.key).unwrap_or_default();
        if let Some(slot) = d.slot {
            last.add(&self.read_slot(slot)?);
            let zeros = PerCpuValues::try_from(vec![T::default(); cpus])?;
            self.by_slot
                .set(slot, zeros, 0)
                .with_context(|| format!("cannot zero a {} slot", self.names[1]))?;
        }
        if let Ok(per_cpu) = self.hashed.get(&d.key, 0) {
            last.add(&per_cpu_sum(&per_cpu));
            let _ = self.hashed.remove(&d.key);
        }
        self.removed
            .entry((d.key.dev, d.key.dir))
            .or_default()
            .add(&last);
        Ok(())
    }

    fn read_slot(&self, slot: u32) -> Result<T> {
        let per_cpu = self
            .by_slot
            .get(&slot, 0)
            .with_context(|| format!("cannot read the {} map", self.names[1]))?;
        Ok(per_cpu_sum(&per_cpu))
    }
}

fn per_cpu_sum<T: Tally>(per_cpu: &PerCpuValues<T>) -> T {
    let mut sum = T::default();
    for v in per_cpu.iter() {
        sum.add(v);
    }
    sum
}

/// What every key holds so far (see [`Slots::totals`]).
pub struct Totals {
    pub counts: Vec<(CountKey, Counters)>,
    /// Empty without `--latency`.
    pub latency: Vec<(CountKey, LatencyHist)>,
}

/// A key being reclaimed (step 1 done): what it still holds, read at the next read.
#[derive(Debug, Clone, Copy)]
struct Draining {
    key: CountKey,
    slot: Option<u32>,
}

pub struct Slots {
    counters: Table<Counters>,
    /// `--latency`'s histograms, kept by the same slots.
    latency: Option<Table<LatencyHist>>,
    slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
    generation: Array<MapData, u32>,
    /// Per (disk, `UNATTRIBUTED_CGROUP`, direction): what the programs counted when a new
    /// key found no room (`UNATTRIBUTED`). Never reclaimed: a running total like the others.
    unattributed: PerCpuHashMap<MapData, CountKey, Counters>,
    /// The keys with a slot, and the slot.
    by_key: HashMap<CountKey, SlotRef>,
    /// The removed slot of each (disk, direction) that has needed one: where the keys of its
    /// removed cgroups count. It never changes hands.
    removed: HashMap<(u32, u32), SlotRef>,
    /// Slots not given yet, and each slot's generation.
    free: Vec<u32>,
    gens: Vec<u32>,
    draining: Vec<Draining>,
    /// Keys given a slot at the last read (or adopted before it), whose hash entries are
    /// moved at the next: by then no program counts in them any more.
    moving: Vec<CountKey>,
    /// Keys given a slot between reads ([`Slots::adopt`]), moved at the read after next.
    adopted: Vec<CountKey>,
    /// The keys the last read returned: only a key returned once may be reclaimed, so that
    /// every key is seen (and named) by at least one read.
    reported: HashSet<CountKey>,
}

impl Slots {
    pub fn new(
        counters: Table<Counters>,
        latency: Option<Table<LatencyHist>>,
        slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
        generation: Array<MapData, u32>,
        unattributed: PerCpuHashMap<MapData, CountKey, Counters>,
    ) -> Result<Slots> {
        Ok(Slots {
            counters,
            latency,
            slot_of,
            generation,
            unattributed,
            by_key: HashMap::new(),
            removed: HashMap::new(),
            free: (0..MAX_SLOTS).rev().collect(),
            gens: vec![0; MAX_SLOTS as usize],
            draining: Vec::new(),
            moving: Vec::new(),
            adopted: Vec::new(),
            reported: HashSet::new(),
        })
    }

    /// What every key holds so far: what the hash maps counted (before the key had a slot,
    /// or with none free) plus its slot's, and per disk and direction the removed cgroups'
    /// under [`REMOVED_CGROUP`]. Keys found only in the hash maps are given a slot for the
    /// events to come; keys whose cgroup `reclaim` says to let go are reclaimed (what they
    /// hold shows under their own key this time, under the removed one from the next).
    pub fn totals(&mut self, reclaim: impl Fn(u64) -> bool) -> Result<Totals> {
        self.finish_draining()?;
        self.finish_moving();
        let mut t = Totals {
            counts: self.counters.totals(&self.by_key, &self.removed)?,
            latency: match &self.latency {
                Some(l) => l.totals(&self.by_key, &self.removed)?,
                None => Vec::new(),
            },
        };
        let keys: HashSet<CountKey> = t
            .counts
            .iter()
            .map(|(k, _)| *k)
            .chain(t.latency.iter().map(|(k, _)| *k))
            .collect();
        for entry in self.unattributed.iter() {
            let (key, per_cpu) = entry.context("cannot read the UNATTRIBUTED map")?;
            t.counts.push((key, per_cpu_sum(&per_cpu)));
        }
        let mut retire = Vec::new();
        let mut assign = Vec::new();
        for k in &keys {
            if k.cgroup_id == REMOVED_CGROUP {
                continue;
            }
            if reclaim(k.cgroup_id) && self.reported.contains(k) {
                retire.push(*k);
            } else if !self.by_key.contains_key(k) {
                assign.push(*k);
            }
        }
        // SLOT_OF holds 2 × MAX_SLOTS: the keys with a slot and at most as many draining.
        retire.truncate(MAX_SLOTS as usize);
        for k in retire {
            self.retire(k)?;
        }
        // Adopted since the last read, or given a slot now: moved at the next read.
        self.moving = std::mem::take(&mut self.adopted);
        for k in assign {
            if !self.assign(k)? {
                break;
            }
            self.moving.push(k);
        }
        self.reported = keys;
        Ok(t)
    }

    /// Gives the keys the programs count in the hash maps a slot now, without reading what
    /// they hold: between reads, so that a new cgroup's events take the cheap path (an array
    /// slot instead of two hash lookups) within moments, whatever the report interval. Their
    /// hash entries are moved at the read after next, when nothing counts in them any more.
    pub fn adopt(&mut self) -> Result<()> {
        if self.free.len() <= REMOVED_RESERVE {
            return Ok(());
        }
        let mut hashed: Vec<CountKey> = self.counters.hashed_keys().collect();
        if let Some(l) = &self.latency {
            hashed.extend(l.hashed_keys());
        }
        hashed.sort();
        hashed.dedup();
        let new: Vec<CountKey> = hashed
            .into_iter()
            .filter(|k| !self.by_key.contains_key(k))
            .filter(|k| !self.draining.iter().any(|d| d.key == *k))
            .filter(|k| !self.moving.contains(k))
            .collect();
        for k in new {
            if !self.assign(k)? {
                break;
            }
            self.adopted.push(k);
        }
        Ok(())
    }

    /// Gives `key` a slot if it has none and one is free beyond the [`REMOVED_RESERVE`];
    /// whether it has one now.
    pub fn assign(&mut self, key: CountKey) -> Result<bool> {
        if self.by_key.contains_key(&key) {
            return Ok(true);
        }
        if self.free.len() <= REMOVED_RESERVE {
            return Ok(false);
        }
        let Some(slot) = self.free.pop() else {
            return Ok(false);
        };
        let gen = self.next_gen(slot)?;
        let r = SlotRef { slot, gen };
        self.slot_of
            .insert(key, r, 0)
            .context("cannot write the SLOT_OF map")?;
        self.by_key.insert(key, r);
        Ok(true)
    }

    /// Keys with a slot, and keys being reclaimed: the entries of `SLOT_OF`.
    pub fn len(&self) -> (usize, usize) {
        (self.by_key.len(), self.draining.len())
    }

    /// The removed slot of (disk `dev`, `dir`), taken from the free ones the first time; None
    /// while none is free.
    fn removed_slot(&mut self, dev: u32, dir: u32) -> Result<Option<SlotRef>> {
        if let Some(r) = self.removed.get(&(dev, dir)) {
            return Ok(Some(*r));
        }
        let Some(slot) = self.free.pop() else {
            return Ok(None);
        };
        let r = SlotRef {
            slot,
            gen: self.next_gen(slot)?,
        };
        self.removed.insert((dev, dir), r);
        Ok(Some(r))
    }

    /// Step 1 of reclaiming `key`: from now on it counts in its disk's removed slot.
    fn retire(&mut self, key: CountKey) -> Result<()> {
        let Some(to) = self.removed_slot(key.dev, key.dir)? else {
            return Ok(()); // no slot free: the next read tries again
        };
        if self.slot_of.insert(key, to, 0).is_err() {
            return Ok(()); // SLOT_OF is full: the next read tries again
        }
        let slot = match self.by_key.remove(&key) {
            Some(r) => {
                // A per-CPU cache entry still naming the slot no longer matches.
                self.next_gen(r.slot)?;
                Some(r.slot)
            }
            None => None,
        };
        self.draining.push(Draining { key, slot });
        Ok(())
    }

    /// Moves the hash entries of the keys given a slot at the last read to their base.
    fn finish_moving(&mut self) {
        for k in std::mem::take(&mut self.moving) {
            if !self.by_key.contains_key(&k) {
                continue; // retired since: drained with its hash entries
            }
            self.counters.move_to_base(&k);
            if let Some(l) = &mut self.latency {
                l.move_to_base(&k);
            }
        }
    }

    /// Step 2 for every key retired at the last read: no program counts in what it held.
    fn finish_draining(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        for d in std::mem::take(&mut self.draining) {
            self.counters.drain(&d, cpus)?;
            if let Some(l) = &mut self.latency {
                l.drain(&d, cpus)?;
            }
            if let Some(slot) = d.slot {
                self.free.push(slot);
            }
            let _ = self.slot_of.remove(&d.key);
        }
        Ok(())
    }

    /// Moves `slot`'s generation on (never 0: it marks an empty per-CPU cache entry).
    fn next_gen(&mut self, slot: u32) -> Result<u32> {
        let gen = self.gens[slot as usize].wrapping_add(1).max(1);
        self.gens[slot as usize] = gen;
        self.generation
            .set(slot, gen, 0)
            .context("cannot write the SLOT_GEN map")?;
        Ok(gen)
    }
}
