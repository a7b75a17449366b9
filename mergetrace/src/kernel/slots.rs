//! Counter slots. The programs count a (cgroup, disk, direction) key in a per-CPU array slot
//! when user space has given the key one (`SLOT_OF`), with an array index and a per-CPU cache
//! instead of a hash lookup per event (mergetrace-ebpf/src/emit.rs); a key without one is
//! counted in the `COUNTS` hash map. User space gives every key it finds there a slot, at most
//! `MAX_SLOTS`; what the hash map counted before stays there and is added to the slot's.
//!
//! Each slot has a generation (`SLOT_GEN`) the programs check, so that a slot can later be given
//! to another key (a removed cgroup's) without a stale per-CPU cache entry counting into it.
use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray};
use mergetrace_common::{CountKey, Counters, SlotRef, MAX_SLOTS};

pub struct Slots {
    slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
    generation: Array<MapData, u32>,
    counters: PerCpuArray<MapData, Counters>,
    /// The keys with a slot, and the slot.
    by_key: HashMap<CountKey, SlotRef>,
    /// Slots not given yet, and each slot's generation.
    free: Vec<u32>,
    gens: Vec<u32>,
}

impl Slots {
    pub fn new(
        slot_of: BpfHashMap<MapData, CountKey, SlotRef>,
        generation: Array<MapData, u32>,
        counters: PerCpuArray<MapData, Counters>,
    ) -> Slots {
        Slots {
            slot_of,
            generation,
            counters,
            by_key: HashMap::new(),
            free: (0..MAX_SLOTS).rev().collect(),
            gens: vec![0; MAX_SLOTS as usize],
        }
    }

    /// Every key's counters so far: what the `COUNTS` hash map counted (before the key had a
    /// slot, or with none free) plus its slot's. Keys found only in the hash map are given a
    /// slot for the events to come.
    pub fn totals(
        &mut self,
        hashed: impl IntoIterator<Item = (CountKey, Counters)>,
    ) -> Result<Vec<(CountKey, Counters)>> {
        let mut sum: HashMap<CountKey, Counters> = HashMap::new();
        for (k, c) in hashed {
            sum.entry(k).or_default().add(&c);
        }
        for (k, c) in self.read()? {
            sum.entry(k).or_default().add(&c);
        }
        for k in sum.keys() {
            if !self.assign(*k)? {
                break;
            }
        }
        Ok(sum.into_iter().collect())
    }

    /// Gives `key` a slot if it has none and one is free; whether it has one now.
    pub fn assign(&mut self, key: CountKey) -> Result<bool> {
        if self.by_key.contains_key(&key) {
            return Ok(true);
        }
        let Some(slot) = self.free.pop() else {
            return Ok(false);
        };
        // Generations start at 1: 0 marks an empty per-CPU cache entry.
        let gen = self.gens[slot as usize].wrapping_add(1).max(1);
        self.gens[slot as usize] = gen;
        self.generation
            .set(slot, gen, 0)
            .context("cannot write the SLOT_GEN map")?;
        let r = SlotRef { slot, gen };
        self.slot_of
            .insert(key, r, 0)
            .context("cannot write the SLOT_OF map")?;
        self.by_key.insert(key, r);
        Ok(true)
    }

    /// The counters of every key with a slot, summed over CPUs.
    pub fn read(&self) -> Result<Vec<(CountKey, Counters)>> {
        let mut out = Vec::with_capacity(self.by_key.len());
        for (key, r) in &self.by_key {
            out.push((*key, self.read_slot(r.slot)?));
        }
        Ok(out)
    }

    fn read_slot(&self, slot: u32) -> Result<Counters> {
        let per_cpu = self
            .counters
            .get(&slot, 0)
            .context("cannot read the COUNTERS map")?;
        let mut sum = Counters::default();
        for c in per_cpu.iter() {
            sum.add(c);
        }
        Ok(sum)
    }
}
