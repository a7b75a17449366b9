//! A key's counter slot: the index user space gave its (cgroup, disk, direction) in the per-CPU
//! arrays by slot (`COUNTERS`, and `LATENCY` with `--latency`). One lookup per event serves
//! everything the event counts; a key without a slot counts in the hash maps instead.
use mergetrace_common::{count::dir_of_op, nested::CacheEntry, CountKey, Event, SlotRef};

use crate::maps::{SLOT_CACHE, SLOT_GEN, SLOT_OF};

/// The (cgroup, disk, direction) an event counts under.
#[inline(always)]
pub fn key_of(ev: &Event) -> CountKey {
    CountKey {
        cgroup_id: ev.cgroup_id,
        dev: ev.dev,
        dir: dir_of_op(ev.op),
    }
}

/// The key's slot, if user space gave it one: from this CPU's cache when the last key looked
/// up in the direction was the same, else from `SLOT_OF`. The cache is shared with the
/// programs that can run inside this one on the CPU (`CacheEntry`).
#[inline(always)]
pub fn of(key: &CountKey) -> Option<u32> {
    let cached = SLOT_CACHE.get_ptr_mut(key.dir & 3)?;
    let words = key.words();
    if let Some([word]) = unsafe { CacheEntry::get(cached, words) } {
        let slot = SlotRef::from_word(word);
        if current(slot) {
            return Some(slot.slot);
        }
    }
    let slot = *unsafe { SLOT_OF.get(key) }?;
    if !current(slot) {
        return None;
    }
    unsafe { CacheEntry::put(cached, words, [slot.word()]) };
    Some(slot.slot)
}

/// The slot still belongs to the key it was given for (its generation has not moved on).
#[inline(always)]
fn current(slot: SlotRef) -> bool {
    slot.gen != 0 && SLOT_GEN.get(slot.slot).is_some_and(|g| *g == slot.gen)
}
