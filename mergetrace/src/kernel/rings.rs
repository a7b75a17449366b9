//! The event rings: one BPF ring buffer per CPU, created here and put at the CPU's index of
//! the programs' `EVENTS` array. A ring per CPU means the CPUs that submit I/O and those that
//! complete it take no common lock and write no common cache line for each event; the price,
//! merging the rings back into time order, is paid in user space ([`super::time_order`]).
//! The programs gather a CPU's events in a batch ([`Staged`]) and send the batch as one ring
//! record; [`Batches`] sends the batches of CPUs that stopped sending.
use anyhow::{bail, Context, Result};
use aya::{
    maps::{ArrayOfMaps, Map, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun},
    Ebpf,
};
use mergetrace_common::{Event, Staged, STAGED_MAX_AGE_NS};

/// The smallest ring a CPU gets, whatever `--ring-mib` and the CPU count.
const MIN_RING_BYTES: u32 = 64 << 10;
/// Wake the reader at most this late: a quarter of a ring, or this much waiting.
const MAX_WAKE_BYTES: u32 = 256 << 10;

/// One CPU's ring.
pub struct CpuRing {
    pub cpu: u32,
    pub ring: RingBuf<MapData>,
    pub ring_bytes: u32,
}

/// The rings of a run, read from the machine once: what loading the programs and creating
/// the rings both follow.
pub struct Plan {
    /// The length of the programs' `EVENTS` array: one more than the highest possible CPU.
    pub slots: u32,
    /// The CPUs online now, each with a ring of [`Plan::bytes`].
    pub online: Vec<u32>,
    /// Each online CPU's share of the total asked for (`bytes_per_cpu`).
    pub bytes: u32,
}

impl Plan {
    /// The rings for `total` bytes (`--ring-mib`) on this machine.
    pub fn for_this_machine(total: u32) -> Result<Plan> {
        let online = aya::util::online_cpus()
            .map_err(|(path, e)| anyhow::anyhow!("cannot read {path}: {e}"))?;
        let slots = possible_cpus()?;
        if let Some(cpu) = online.iter().find(|c| **c >= slots) {
            bail!("CPU {cpu} is online but not among the kernel's possible CPUs");
        }
        Ok(Plan {
            slots,
            bytes: bytes_per_cpu(total, online.len() as u32),
            online,
        })
    }

    /// When a CPU's program wakes the reader: with this many bytes waiting in its ring (a
    /// quarter of an online CPU's ring, at most `MAX_WAKE_BYTES`).
    pub fn wake_bytes(&self) -> u64 {
        (self.bytes / 4).min(MAX_WAKE_BYTES) as u64
    }
}

/// How the `total` bytes asked for (`--ring-mib`) are shared by `cpus` CPUs: each a power of
/// two of at least [`MIN_RING_BYTES`].
fn bytes_per_cpu(total: u32, cpus: u32) -> u32 {
    let share = total / cpus.max(1);
    if share <= MIN_RING_BYTES {
        MIN_RING_BYTES
    } else {
        1 << (31 - share.leading_zeros()) // the power of two at or below the share
    }
}

/// One more than the highest CPU id the kernel may run on
/// (`/sys/devices/system/cpu/possible`, e.g. `0-3,8-11`).
fn possible_cpus() -> Result<u32> {
    const POSSIBLE: &str = "/sys/devices/system/cpu/possible";
    let text =
        std::fs::read_to_string(POSSIBLE).with_context(|| format!("cannot read {POSSIBLE}"))?;
    cpu_slots(&text).with_context(|| format!("cannot parse {POSSIBLE}: {:?}", text.trim()))
}

/// One more than the highest CPU of a kernel CPU list (`0-3,8-11` → 12).
fn cpu_slots(list: &str) -> Option<u32> {
    list.trim()
        .split(',')
        .map(|r| r.rsplit('-').next()?.parse::<u32>().ok())
        .try_fold(0, |max, last| Some(max.max(last? + 1)))
        .filter(|n| *n > 0)
}

/// Creates a ring for each CPU the kernel may run on and puts it in the loaded object's
/// `EVENTS` array (of `plan.slots`): `plan.bytes` for the CPUs online now, `MIN_RING_BYTES`
/// for the others (a CPU brought online during the run sends on a small ring rather than
/// losing everything).
pub fn install(ebpf: &mut Ebpf, plan: &Plan) -> Result<Vec<CpuRing>> {
    let mut array: ArrayOfMaps<MapData, RingBuf<MapData>> =
        ArrayOfMaps::try_from(ebpf.take_map("EVENTS").context("EVENTS map missing")?)?;
    let mut rings = Vec::with_capacity(plan.slots as usize);
    for cpu in 0..plan.slots {
        let bytes = if plan.online.contains(&cpu) {
            plan.bytes
        } else {
            MIN_RING_BYTES
        };
        let def = aya_obj::Map::new_from_params(
            aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_RINGBUF as u32,
            0,
            0,
            bytes,
            0,
        );
        let data = MapData::create(def, "mt_events", None)
            .with_context(|| format!("cannot create the event ring of CPU {cpu}"))?;
        let ring = RingBuf::try_from(Map::RingBuf(data))?;
        array
            .set(cpu, &ring, 0)
            .with_context(|| format!("cannot hand CPU {cpu}'s event ring to the programs"))?;
        rings.push(CpuRing {
            cpu,
            ring,
            ring_bytes: bytes,
        });
    }
    Ok(rings)
}

/// Splits a ring record into its events: one, or a batch of them back to back. `None` for a
/// record that is not a whole number of events.
pub fn decode(record: &[u8]) -> Option<impl Iterator<Item = Event> + '_> {
    const SIZE: usize = std::mem::size_of::<Event>();
    (!record.is_empty() && record.len().is_multiple_of(SIZE)).then(|| {
        record.chunks_exact(SIZE).map(|bytes| {
            // SAFETY: Event is plain old data of SIZE bytes; read_unaligned has no alignment
            // needs.
            unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Event) }
        })
    })
}

/// The program that sends a CPU's batch ([`Batches`]).
pub const FLUSH_STAGED: &str = "flush_staged";

/// The CPUs' batches of events not in their rings yet (the programs' `STAGING`), and the
/// program that sends the batch of the CPU it runs on (`flush_staged`, run, never attached).
/// A CPU that sends no more events (idle, or done with its I/O) would keep its last batch:
/// user space looks at the batches' ages and sends the old ones.
pub struct Batches {
    staging: PerCpuArray<MapData, Staged>,
    /// Per CPU, its batch's first `ts_ns` (0: empty): what a poll reads.
    since: PerCpuArray<MapData, u64>,
    /// A handle of its own on the loaded program: it outlives the object's (`detach`).
    flush: RawTracePoint,
}

impl Batches {
    /// The batches of the loaded object, with its flush program loaded.
    pub fn take(ebpf: &mut Ebpf) -> Result<Batches> {
        let program: &mut RawTracePoint = ebpf
            .program_mut(FLUSH_STAGED)
            .with_context(|| format!("program {FLUSH_STAGED} missing from the eBPF object"))?
            .try_into()?;
        program
            .load()
            .with_context(|| format!("cannot load program {FLUSH_STAGED}"))?;
        let flush = RawTracePoint::from_program_info(program.info()?, FLUSH_STAGED.into())
            .with_context(|| format!("cannot hold program {FLUSH_STAGED}"))?;
        let staging =
            PerCpuArray::try_from(ebpf.take_map("STAGING").context("STAGING map missing")?)?;
        let since = PerCpuArray::try_from(
            ebpf.take_map("STAGED_SINCE")
                .context("STAGED_SINCE map missing")?,
        )?;
        Ok(Batches {
            staging,
            since,
            flush,
        })
    }

    /// Sends the batches whose first event is older than the programs would let it be on a
    /// CPU that still sends ([`STAGED_MAX_AGE_NS`]) at `now` (CLOCK_MONOTONIC ns); all
    /// that hold events when `now` is `u64::MAX`. A batch a program is writing just then,
    /// or an offline CPU's, stays for the next call or [`Batches::take_left`].
    pub fn send_old(&self, now: u64) -> Result<()> {
        let since = self
            .since
            .get(&0, 0)
            .context("cannot read the event batches' ages (STAGED_SINCE)")?;
        for (cpu, &first_ts) in since.iter().enumerate() {
            if first_ts != 0 && now.saturating_sub(first_ts) >= STAGED_MAX_AGE_NS {
                self.run_on(cpu as u32);
            }
        }
        Ok(())
    }

    /// What is left in the batches, per CPU: to be called once the programs are detached
    /// and nothing writes the batches any more. Runs of charges still open
    /// (`record --requests`) end now, after the batch's events.
    pub fn take_left(&self) -> Result<Vec<(usize, Vec<Event>)>> {
        let now = super::monotonic_ns();
        Ok(self
            .staging
            .get(&0, 0)
            .context("cannot read the event batches (STAGING)")?
            .iter()
            .enumerate()
            .map(|(cpu, b)| {
                let mut left = b.events[..(b.len as usize).min(b.events.len())].to_vec();
                let open = b.runs.iter().filter(|r| r.kind != 0);
                left.extend(open.map(|r| Event { ts_ns: now, ..*r }));
                (cpu, left)
            })
            .filter(|(_, left)| !left.is_empty())
            .collect())
    }

    /// Runs the flush program on `cpu` (`BPF_PROG_TEST_RUN` with `BPF_F_TEST_RUN_ON_CPU`,
    /// an interrupt there); the kernel refuses an offline CPU, whose batch waits for
    /// [`Batches::take_left`].
    fn run_on(&self, cpu: u32) {
        let _ = self.flush.test_run(RawTracePointRunOptions {
            cpu: Some(cpu),
            ..RawTracePointRunOptions::new()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_hold_one_event_or_a_batch() {
        let ev = |ts_ns| Event {
            ts_ns,
            kind: 1,
            ..Event::default()
        };
        let bytes = |evs: &[Event]| -> Vec<u8> {
            evs.iter()
                .flat_map(|e| {
                    // SAFETY: Event is plain old data.
                    unsafe {
                        std::slice::from_raw_parts(
                            e as *const Event as *const u8,
                            std::mem::size_of::<Event>(),
                        )
                    }
                    .to_vec()
                })
                .collect()
        };
        let one = bytes(&[ev(5)]);
        assert_eq!(decode(&one).unwrap().collect::<Vec<_>>(), [ev(5)]);
        let batch = bytes(&[ev(1), ev(2), ev(3)]);
        assert_eq!(
            decode(&batch).unwrap().collect::<Vec<_>>(),
            [ev(1), ev(2), ev(3)]
        );
        assert!(decode(&batch[..batch.len() - 1]).is_none());
        assert!(decode(&[]).is_none());
    }

    #[test]
    fn cpu_lists_give_one_slot_past_the_highest_cpu() {
        assert_eq!(cpu_slots("0-1\n"), Some(2));
        assert_eq!(cpu_slots("0"), Some(1));
        assert_eq!(cpu_slots("0-3,8-11"), Some(12));
        assert_eq!(cpu_slots(""), None);
        assert_eq!(cpu_slots("0-x"), None);
    }

    #[test]
    fn rings_share_the_total_in_powers_of_two() {
        assert_eq!(bytes_per_cpu(64 << 20, 2), 32 << 20);
        assert_eq!(bytes_per_cpu(64 << 20, 3), 16 << 20);
        assert_eq!(bytes_per_cpu(64 << 20, 96), 512 << 10);
        assert_eq!(bytes_per_cpu(1 << 20, 64), MIN_RING_BYTES);
        assert_eq!(bytes_per_cpu(1 << 20, 0), 1 << 20);
        let plan = |bytes| Plan {
            slots: 2,
            online: vec![0, 1],
            bytes,
        };
        assert_eq!(plan(32 << 20).wake_bytes(), 256 << 10);
        assert_eq!(plan(MIN_RING_BYTES).wake_bytes(), 16 << 10);
    }
}
