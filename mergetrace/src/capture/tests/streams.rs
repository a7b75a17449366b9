//! Event streams for the tests: a realistic block-layer one, and one of extreme values.
use super::*;

/// A realistic block-layer stream: writers in four cgroups each submitting batches of 32
/// sequential 4 KiB bios under a plug (bio_queue, getrq for the first, plug back merges for
/// the rest), the unplug, one 128 KiB request inserted and issued, its completion a couple of
/// batches later; now and then a single random 4 KiB read. Kernel addresses vary in their low
/// bits like slab objects and a tag set's requests do.
pub(super) fn realistic_stream(batches: usize, seed: u64) -> Vec<Event> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let ts = 1_000_000_000_000u64 + rng.below(1_000_000_000);
    let mut s = Stream {
        rng,
        ts,
        out: Vec::new(),
    };
    let cgroups = [4242u64, 4243, 5120, 6001];
    let mut cursor = [0u64, 1 << 24, 2 << 24, 3 << 24];
    let mut inflight: Vec<Event> = Vec::new();
    for b in 0..batches {
        let w = s.rng.below(4) as usize;
        let cg = cgroups[w];
        let rules = if w == 0 { flags::RULES_IOPS } else { 0 };
        let rq = if b % 8 == 7 {
            s.random_read(cg, rules)
        } else {
            cursor[w] += 256;
            s.plugged_batch(cg, rules, cursor[w] - 256)
        };
        let rq = Event {
            id: 0xffff_8881_0c40_0000u64 + (b as u64 % 64) * 0x1c0,
            ..rq
        };
        inflight.push(s.dispatch(rq));
        // The device completes requests a couple of batches after they were issued.
        while inflight.len() > 2 {
            let done = inflight.remove(0);
            let ts = s.later(500, 5_000);
            s.out.push(Event { ts_ns: ts, ..done });
        }
    }
    s.out
}

const DEV: u32 = 259 << 20;

struct Stream {
    rng: Rng,
    ts: u64,
    out: Vec<Event>,
}

impl Stream {
    /// Moves the clock by `base` plus up to `jitter` ns.
    fn later(&mut self, base: u64, jitter: u64) -> u64 {
        self.ts += base + self.rng.below(jitter);
        self.ts
    }

    fn bio_addr(&mut self) -> u64 {
        0xffff_8881_0a2b_0000u64 + (self.rng.below(1024) << 8)
    }

    /// A random 4 KiB read: its own request. Returns the request (its address left 0).
    fn random_read(&mut self, cg: u64, rules: u8) -> Event {
        let bio = self.bio_addr();
        let sector = self.rng.below(1 << 30) * 8;
        let ev = Event {
            ts_ns: self.later(2_000, 20_000),
            cgroup_id: cg,
            id: bio,
            sector,
            dev: DEV,
            bytes: 4096,
            kind: kind::BIO_QUEUE,
            op: 0,
            flags: rules,
            ..Event::default()
        };
        self.out.push(ev);
        let ts = self.later(150, 300);
        self.out.push(Event {
            ts_ns: ts,
            kind: kind::GETRQ,
            flags: 0,
            ..ev
        });
        request(cg, bio, sector, 4096, 0)
    }

    /// 32 sequential 4 KiB writes from `start` under a plug: the first a new request, the
    /// rest plug back merges. Returns the request.
    fn plugged_batch(&mut self, cg: u64, rules: u8, start: u64) -> Event {
        let mut first = 0;
        for i in 0..32u64 {
            let ts = self.later(200, 1_500);
            let bio = self.bio_addr();
            let ev = Event {
                ts_ns: ts,
                cgroup_id: cg,
                id: bio,
                sector: start + 8 * i,
                dev: DEV,
                bytes: 4096,
                kind: kind::BIO_QUEUE,
                op: 1,
                flags: rules,
                ..Event::default()
            };
            self.out.push(ev);
            let ts = self.later(100, 400);
            let joined = if i == 0 {
                first = bio;
                Event {
                    kind: kind::GETRQ,
                    ..ev
                }
            } else {
                Event {
                    kind: kind::BACK_MERGE,
                    path: path::PLUG,
                    ..ev
                }
            };
            self.out.push(Event {
                ts_ns: ts,
                flags: 0,
                ..joined
            });
        }
        request(cg, first, start, 32 * 4096, 1)
    }

    /// The unplug, then `rq` inserted and issued; returns its completion, for later.
    fn dispatch(&mut self, rq: Event) -> Event {
        let ts = self.later(300, 700);
        self.out.push(Event {
            ts_ns: ts,
            id: 0xffff_8881_0440_2000u64,
            dev: DEV,
            aux: 1,
            kind: kind::UNPLUG,
            flags: flags::UNPLUG_EXPLICIT,
            ..Event::default()
        });
        let ts = self.later(100, 300);
        self.out.push(Event {
            ts_ns: ts,
            kind: kind::RQ_INSERT,
            ..rq
        });
        let ts = self.later(200, 600);
        self.out.push(Event {
            ts_ns: ts,
            kind: kind::RQ_ISSUE,
            ..rq
        });
        Event {
            kind: kind::RQ_COMPLETE,
            aux: rq.bytes,
            ..rq
        }
    }
}

/// A request of `bytes` at `sector` whose first bio is `first_bio`.
fn request(cg: u64, first_bio: u64, sector: u64, bytes: u32, op: u8) -> Event {
    Event {
        cgroup_id: cg,
        aux64: first_bio,
        sector,
        dev: DEV,
        bytes,
        op,
        ..Event::default()
    }
}

/// Events with every field at interesting values: zeros, maxima, sign bits, kinds past the
/// known ones.
pub(super) fn extreme_events() -> Vec<Event> {
    let vals64 = [
        0,
        1,
        u64::MAX,
        u64::MAX - 1,
        1 << 63,
        (1 << 63) - 1,
        0xffff_8881_0a2b_3c00,
    ];
    let vals32 = [0, 1, u32::MAX, 1 << 31, 4096];
    let vals8 = [0u8, 1, 14, 15, 16, 0x7f, 0x80, 0xff];
    let mut out = Vec::new();
    let mut rng = Rng(0x5eed);
    for i in 0..400usize {
        let p = |r: &mut Rng| vals64[r.below(vals64.len() as u64) as usize];
        let q = |r: &mut Rng| vals32[r.below(vals32.len() as u64) as usize];
        let b = |r: &mut Rng| vals8[r.below(vals8.len() as u64) as usize];
        out.push(Event {
            ts_ns: p(&mut rng),
            cgroup_id: p(&mut rng),
            id: p(&mut rng),
            aux64: p(&mut rng),
            sector: p(&mut rng),
            dev: q(&mut rng),
            bytes: q(&mut rng),
            aux: q(&mut rng),
            kind: if i % 3 == 0 {
                b(&mut rng)
            } else {
                (i % 12) as u8
            },
            op: b(&mut rng),
            path: b(&mut rng),
            flags: b(&mut rng),
        });
    }
    out
}

/// Events from a script of (step, random): bios queued and given requests, requests issued
/// from two interleaved tag sequences (sometimes off the sequence), completed oldest first or
/// in any order, requeued, merged into; plug flushes between. `golden-v2.mtr` holds a
/// stream of it: never change what a script makes.
pub(super) fn lifecycle_stream(script: &[(u8, u64)]) -> Vec<Event> {
    let mut ts = 1_000_000u64;
    let mut out = Vec::new();
    let mut waiting: Vec<Event> = Vec::new();
    let mut in_flight: Vec<Event> = Vec::new();
    let mut tags = [0xffff_8881_0249_0000u64, 0xffff_8881_0249_6000];
    let mut push = |e: Event, ts: &mut u64, r: u64| {
        *ts += 300 + r % 5000;
        out.push(Event { ts_ns: *ts, ..e });
    };
    for &(step, r) in script {
        let cpu = (r >> 40) as usize & 1;
        match step {
            0 | 1 => {
                let bio = Event {
                    kind: kind::BIO_QUEUE,
                    id: 0xffff_8882_01ce_0000 + (r % 64) * 0x100,
                    sector: (r >> 8) % (1 << 21) * 8,
                    bytes: [4096, 8192, 65536][(r >> 50) as usize % 3],
                    cgroup_id: 1 + (r >> 60),
                    dev: 7 << 20,
                    ..Event::default()
                };
                push(bio, &mut ts, r);
                let getrq = Event {
                    kind: kind::GETRQ,
                    ..bio
                };
                push(getrq, &mut ts, r >> 3);
                waiting.push(getrq);
            }
            2 => push(
                Event {
                    kind: kind::UNPLUG,
                    id: 0xffff_8881_0248_9710,
                    aux: 1 + (r % 32) as u32,
                    dev: 7 << 20,
                    flags: flags::UNPLUG_EXPLICIT,
                    ..Event::default()
                },
                &mut ts,
                r,
            ),
            3 | 4 if !waiting.is_empty() => {
                // Oldest, newest or any waiting bio starts a request.
                let i = [0, waiting.len() - 1, (r as usize >> 4) % waiting.len()][r as usize % 3];
                let bio = waiting.remove(i);
                let id = if r >> 20 & 7 == 0 {
                    0xffff_8881_0300_0000 + (r >> 24) % 4096 * 0x40
                } else {
                    tags[cpu] += 0x180;
                    tags[cpu]
                };
                let issue = Event {
                    kind: kind::RQ_ISSUE,
                    id,
                    aux64: bio.id,
                    aux: 1,
                    path: 1,
                    bytes: bio.bytes + if r >> 33 & 3 == 0 { 4096 } else { 0 },
                    ..bio
                };
                push(issue, &mut ts, r >> 5);
                in_flight.push(issue);
            }
            5 | 6 if !in_flight.is_empty() => {
                let i = if r % 4 == 0 {
                    (r as usize >> 8) % in_flight.len()
                } else {
                    0
                };
                let rq = in_flight.remove(i);
                let k = if r >> 30 & 15 == 0 {
                    kind::RQ_REQUEUE
                } else {
                    kind::RQ_COMPLETE
                };
                push(
                    Event {
                        kind: k,
                        aux: rq.bytes,
                        path: 0,
                        ..rq
                    },
                    &mut ts,
                    r >> 7,
                );
            }
            7 if !in_flight.is_empty() => {
                let rq = in_flight[(r as usize) % in_flight.len()];
                push(
                    Event {
                        kind: kind::BACK_MERGE,
                        id: 0xffff_8882_01ce_8000 + r % 512,
                        aux64: rq.id,
                        ..rq
                    },
                    &mut ts,
                    r,
                );
            }
            _ => {}
        }
    }
    out
}
