//! Counter slots. The programs count a (cgroup, disk, direction) key in a per-CPU array slot
//! when user space has given the key one (`SLOT_OF`), with an array index and a per-CPU cache
//! instead of a hash lookup per event (mergetrace-ebpf/src/emit.rs); a key without one is
//! counted in the `COUNTS` hash map. User space gives every key it finds there a slot, at most
//! `MAX_SLOTS`; at the next read, when no program counts in the key's hash entry any more,
//! what it counted there is moved to user space (the key's base) and the entry deleted, so
//! the hash map only holds keys newer than a read and those beyond `MAX_SLOTS`.
//!
//! Each slot has a generation (`SLOT_GEN`) the programs check, so that a slot can later be given
//! to another key without a stale per-CPU cache entry counting into it.
//!
//! Removed cgroups are reclaimed, so that the maps hold the living (plus those removed within
//! the grace window), however many cgroups come and go. Reclaiming a key takes two reads, so
//! that nothing is read while a program may still count into it:
//! 1. its `SLOT_OF` entry is pointed at its disk's *removed* slot (`removed_slot`) and its own
//!    slot's generation moves on: from then on the programs count it there;
//! 2. at the next read its own slot and `COUNTS` entry, idle since, are read a last time,
//!    added to the disk's removed counters, zeroed / deleted, and its `SLOT_OF` entry goes (a
//!    late event then starts a new `COUNTS` entry, reclaimed the same way).
//!
//! The removed counters are returned as the key (disk, [`REMOVED_CGROUP`], direction): every
//! count stays in exactly one key, and the sum over keys only grows.
use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues};
use mergetrace_common::{removed_slot, CountKey, Counters, SlotRef, MAX_SLOTS, REMOVED_CGROUP};

/// The generation of the removed slots: fixed, they never change hands.
const REMOVED_GEN: u32 = 1;

/// A key being reclaimed (step 1 done): what it still holds, read at the next read.
#[derive(Debug, Clone, Copy)]
struct Draining {
    key: CountKey,
    slot: Option<u32>,
}

pub struct Slots {
    hashed: PerCpuHashMap<MapData, CountKey, Counters>,
    slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
    generation: Array<MapData, u32>,
    counters: PerCpuArray<MapData, Counters>,
    /// The traced disks' `dev_t`s, by disk slot.
    devs: Vec<u32>,
    /// The keys with a slot, and the slot.
    by_key: HashMap<CountKey, SlotRef>,
    /// Slots not given yet, and each slot's generation.
    free: Vec<u32>,
    gens: Vec<u32>,
    draining: Vec<Draining>,
    /// Keys given a slot at the last read (or adopted before it), whose hash entry is moved
    /// at the next: by then no program counts in it any more.
    moving: Vec<CountKey>,
    /// Keys given a slot between reads ([`Slots::adopt`]), moved at the read after next.
    adopted: Vec<CountKey>,
    /// What keys with a slot counted in the hash map before they had it.
    base: HashMap<CountKey, Counters>,
    /// What the reclaimed keys counted in their own slots and hash entries, per (disk, dir).
    removed: HashMap<(u32, u32), Counters>,
    /// The keys the last read returned: only a key returned once may be reclaimed, so that
    /// every key is seen (and named) by at least one read.
    reported: HashSet<CountKey>,
}

impl Slots {
    pub fn new(
        hashed: PerCpuHashMap<MapData, CountKey, Counters>,
        slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
        mut generation: Array<MapData, u32>,
        counters: PerCpuArray<MapData, Counters>,
        devs: Vec<u32>,
    ) -> Result<Slots> {
        for disk in 0..devs.len() as u32 {
            for dir in 0..4 {
                generation
                    .set(removed_slot(disk, dir), REMOVED_GEN, 0)
                    .context("cannot write the SLOT_GEN map")?;
            }
        }
        Ok(Slots {
            hashed,
            slot_of,
            generation,
            counters,
            devs,
            by_key: HashMap::new(),
            free: (0..MAX_SLOTS).rev().collect(),
            gens: vec![0; MAX_SLOTS as usize],
            draining: Vec::new(),
            moving: Vec::new(),
            adopted: Vec::new(),
            base: HashMap::new(),
            removed: HashMap::new(),
            reported: HashSet::new(),
        })
    }

    /// Every key's counters so far: what the `COUNTS` hash map counted (before the key had a
    /// slot, or with none free) plus its slot's, and per disk and direction the removed
    /// cgroups' under [`REMOVED_CGROUP`]. Keys found only in the hash map are given a slot for
    /// the events to come; keys whose cgroup `reclaim` says to let go are reclaimed (their
    /// counters show under their own key this time, under the removed one from the next).
    pub fn totals(&mut self, reclaim: impl Fn(u64) -> bool) -> Result<Vec<(CountKey, Counters)>> {
        self.finish_draining()?;
        self.finish_moving();
        let mut sum: HashMap<CountKey, Counters> = HashMap::new();
        for item in self.hashed.iter() {
            let (k, per_cpu) = item.context("cannot read the COUNTS map")?;
            sum.entry(k).or_default().add(&per_cpu_sum(&per_cpu));
        }
        for (key, r) in &self.by_key {
            let c = sum.entry(*key).or_default();
            c.add(&self.read_slot(r.slot)?);
            if let Some(b) = self.base.get(key) {
                c.add(b);
            }
        }
        let mut retire = Vec::new();
        let mut assign = Vec::new();
        for k in sum.keys() {
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
        for (disk, dev) in self.devs.iter().enumerate() {
            for dir in 0..4 {
                let mut c = self.read_slot(removed_slot(disk as u32, dir))?;
                if let Some(folded) = self.removed.get(&(*dev, dir)) {
                    c.add(folded);
                }
                if c != Counters::default() {
                    let key = CountKey {
                        cgroup_id: REMOVED_CGROUP,
                        dev: *dev,
                        dir,
                    };
                    sum.insert(key, c);
                }
            }
        }
        self.reported = sum.keys().copied().collect();
        Ok(sum.into_iter().collect())
    }

    /// Gives the keys the programs count in the hash map a slot now, without reading any
    /// counters: between reads, so that a new cgroup's events take the cheap path (an array
    /// slot instead of two hash lookups) within moments, whatever the report interval. Their
    /// hash entries are moved at the read after next, when nothing counts in them any more.
    pub fn adopt(&mut self) -> Result<()> {
        if self.free.is_empty() {
            return Ok(());
        }
        let new: Vec<CountKey> = self
            .hashed
            .keys()
            .filter_map(|k| k.ok())
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

    /// Gives `key` a slot if it has none and one is free; whether it has one now.
    pub fn assign(&mut self, key: CountKey) -> Result<bool> {
        if self.by_key.contains_key(&key) {
            return Ok(true);
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

    /// Step 1 of reclaiming `key`: from now on it counts in its disk's removed slot.
    fn retire(&mut self, key: CountKey) -> Result<()> {
        let Some(disk) = self.devs.iter().position(|d| *d == key.dev) else {
            return Ok(());
        };
        let to = SlotRef {
            slot: removed_slot(disk as u32, key.dir),
            gen: REMOVED_GEN,
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
                continue; // retired since: drained with its hash entry
            }
            if let Ok(per_cpu) = self.hashed.get(&k, 0) {
                self.base.entry(k).or_default().add(&per_cpu_sum(&per_cpu));
                let _ = self.hashed.remove(&k);
            }
        }
    }

    /// Step 2 for every key retired at the last read: no program counts in what it held.
    fn finish_draining(&mut self) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        for d in std::mem::take(&mut self.draining) {
            let mut last = self.base.remove(&d.key).unwrap_or_default();
            if let Some(slot) = d.slot {
                last.add(&self.read_slot(slot)?);
                let zeros = PerCpuValues::try_from(vec![Counters::default(); cpus])?;
                self.counters
                    .set(slot, zeros, 0)
                    .context("cannot zero a COUNTERS slot")?;
                self.free.push(slot);
            }
            if let Ok(per_cpu) = self.hashed.get(&d.key, 0) {
                last.add(&per_cpu_sum(&per_cpu));
                let _ = self.hashed.remove(&d.key);
            }
            let _ = self.slot_of.remove(&d.key);
            self.removed
                .entry((d.key.dev, d.key.dir))
                .or_default()
                .add(&last);
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

    fn read_slot(&self, slot: u32) -> Result<Counters> {
        let per_cpu = self
            .counters
            .get(&slot, 0)
            .context("cannot read the COUNTERS map")?;
        Ok(per_cpu_sum(&per_cpu))
    }
}

fn per_cpu_sum(per_cpu: &PerCpuValues<Counters>) -> Counters {
    let mut sum = Counters::default();
    for c in per_cpu.iter() {
        sum.add(c);
    }
    sum
}
