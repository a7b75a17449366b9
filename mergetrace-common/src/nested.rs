//! A cache entry in per-CPU memory that the programs of one CPU share, where one program can
//! run inside another: an interrupt's completion inside a task's issue, between any two of
//! its instructions. A plain entry (key, then value) written by the outer program and
//! rewritten by the inner one in between can pair one key with another's value, and the
//! wrong cgroup's counters would take the counts from then on.
//!
//! A sequence number makes it safe: odd while a program writes the entry. A reader takes the
//! value only if the number was even and the same before and after it read, so it saw no
//! write under way or coming in between; a writer that finds it odd (it interrupted another
//! writer) leaves the entry alone. One CPU only: programs nest there, they never run at once.
//!
//! The same code runs in the programs and in the tests below, which nest a read or a write of
//! another key at every step of each one.

/// One entry: `K` words of key, `V` words of value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheEntry<const K: usize, const V: usize> {
    seq: u64,
    key: [u64; K],
    value: [u64; V],
}

impl<const K: usize, const V: usize> Default for CacheEntry<K, V> {
    fn default() -> Self {
        CacheEntry {
            seq: 0,
            key: [0; K],
            value: [0; V],
        }
    }
}

impl<const K: usize, const V: usize> CacheEntry<K, V> {
    /// The value cached for `key`, if the entry holds it whole.
    ///
    /// # Safety
    /// `this` points at an entry only programs of this CPU (or this thread) access.
    #[inline(always)]
    pub unsafe fn get(this: *const Self, key: [u64; K]) -> Option<[u64; V]> {
        unsafe { Self::get_between(this, key, || {}) }
    }

    /// Caches `value` for `key`, unless a write this program interrupted is under way.
    ///
    /// # Safety
    /// As [`CacheEntry::get`].
    #[inline(always)]
    pub unsafe fn put(this: *mut Self, key: [u64; K], value: [u64; V]) {
        unsafe { Self::put_between(this, key, value, || {}) }
    }

    /// [`CacheEntry::get`], running `between` after each access (the tests' interrupts).
    #[inline(always)]
    unsafe fn get_between(
        this: *const Self,
        key: [u64; K],
        mut between: impl FnMut(),
    ) -> Option<[u64; V]> {
        use core::ptr::read_volatile;
        unsafe {
            let seq = read_volatile(&raw const (*this).seq);
            between();
            let mut whole = seq & 1 == 0;
            for (i, k) in key.iter().enumerate() {
                whole &= read_volatile(&raw const (*this).key[i]) == *k;
                between();
            }
            let mut value = [0; V];
            for (i, v) in value.iter_mut().enumerate() {
                *v = read_volatile(&raw const (*this).value[i]);
                between();
            }
            whole &= read_volatile(&raw const (*this).seq) == seq;
            whole.then_some(value)
        }
    }

    /// [`CacheEntry::put`], running `between` after each access (the tests' interrupts).
    #[inline(always)]
    unsafe fn put_between(
        this: *mut Self,
        key: [u64; K],
        value: [u64; V],
        mut between: impl FnMut(),
    ) {
        use core::ptr::{read_volatile, write_volatile};
        unsafe {
            let seq = read_volatile(&raw const (*this).seq);
            between();
            if seq & 1 != 0 {
                return;
            }
            write_volatile(&raw mut (*this).seq, seq.wrapping_add(1));
            between();
            for (i, k) in key.iter().enumerate() {
                write_volatile(&raw mut (*this).key[i], *k);
                between();
            }
            for (i, v) in value.iter().enumerate() {
                write_volatile(&raw mut (*this).value[i], *v);
                between();
            }
            write_volatile(&raw mut (*this).seq, seq.wrapping_add(2));
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{cell::Cell, vec::Vec};

    use super::*;

    type Entry = CacheEntry<2, 1>;

    /// Each key's value: what a hit for it must return.
    fn value_of(key: [u64; 2]) -> [u64; 1] {
        [key[0] * 1000 + key[1]]
    }

    const KEYS: [[u64; 2]; 3] = [[1, 7], [2, 7], [1, 8]];

    /// What the tests check of every read: a miss, or the value of the key asked for.
    fn check(key: [u64; 2], got: Option<[u64; 1]>) {
        if let Some(v) = got {
            assert_eq!(
                v,
                value_of(key),
                "a hit for {key:?} returned another key's value"
            );
        }
    }

    /// One access of an interrupting program: a read or a write of `key`.
    #[derive(Clone, Copy, Debug)]
    enum Op {
        Get([u64; 2]),
        Put([u64; 2]),
    }

    /// Runs `op` on `e`, with `inner` run at the `at`-th step of it (counting from 0), if it
    /// has that many.
    unsafe fn run(e: *mut Entry, op: Op, at: usize, inner: &mut dyn FnMut()) {
        let step = Cell::new(0);
        let mut between = || {
            if step.get() == at {
                inner();
            }
            step.set(step.get() + 1);
        };
        match op {
            Op::Get(k) => check(k, unsafe { Entry::get_between(e, k, &mut between) }),
            Op::Put(k) => unsafe { Entry::put_between(e, k, value_of(k), &mut between) },
        }
    }

    fn ops() -> Vec<Op> {
        KEYS.iter()
            .flat_map(|k| [Op::Get(*k), Op::Put(*k)])
            .collect()
    }

    /// Every read, with another program's read or write (and a third inside that one) at
    /// every step of every access, then every read after: a miss or the right value, never
    /// another key's. The entry starts empty or holding each key.
    #[test]
    fn nested_programs_never_pair_a_key_with_another_keys_value() {
        const STEPS: usize = 8; // more than an access has: the last runs nothing
        let mut starts: Vec<Option<[u64; 2]>> = KEYS.iter().copied().map(Some).collect();
        starts.push(None);
        let mut hits_after = 0;
        for start in starts {
            for outer in ops() {
                for at in 0..STEPS {
                    for middle in ops() {
                        for at2 in 0..STEPS {
                            for inner in ops() {
                                let mut e = Entry::default();
                                let p: *mut Entry = &mut e;
                                if let Some(k) = start {
                                    unsafe { Entry::put(p, k, value_of(k)) };
                                }
                                unsafe {
                                    run(p, outer, at, &mut || {
                                        run(p, middle, at2, &mut || {
                                            run(p, inner, usize::MAX, &mut || {})
                                        })
                                    })
                                };
                                for k in KEYS {
                                    let got = unsafe { Entry::get(p, k) };
                                    check(k, got);
                                    hits_after += got.is_some() as usize;
                                }
                                assert_eq!(e.seq & 1, 0, "an entry left half written");
                            }
                        }
                    }
                }
            }
        }
        // The cache still caches: most runs leave an entry that hits.
        assert!(hits_after > 0);
    }

    /// Without interruptions, a write is read back, and a write of another key replaces it.
    #[test]
    fn a_write_is_read_back_until_another_key_replaces_it() {
        let mut e = Entry::default();
        let p: *mut Entry = &mut e;
        unsafe {
            assert_eq!(Entry::get(p, KEYS[0]), None, "an empty entry");
            Entry::put(p, KEYS[0], value_of(KEYS[0]));
            assert_eq!(Entry::get(p, KEYS[0]), Some(value_of(KEYS[0])));
            assert_eq!(Entry::get(p, KEYS[1]), None);
            Entry::put(p, KEYS[1], value_of(KEYS[1]));
            assert_eq!(Entry::get(p, KEYS[0]), None);
            assert_eq!(Entry::get(p, KEYS[1]), Some(value_of(KEYS[1])));
        }
    }

    /// The layout the programs' map holds: the sequence word, then key and value.
    #[test]
    fn entry_is_plain_words() {
        assert_eq!(core::mem::size_of::<Entry>(), 32);
    }
}
