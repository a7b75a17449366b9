//! Types shared by mergetrace's eBPF programs (kernel side) and its user space.
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes it into a ring buffer
//! or reads it from read-only globals, user space reads the same bytes back. The numeric
//! values of [`kind`], [`path`] and [`flags`] are part of the capture format: append only.
#![no_std]

pub mod count;
pub mod disk;
pub mod latency;
pub mod nested;
pub use count::{CountKey, Counters, DeviceState, MeterUnits, SlotRef, UnplugKey, MAX_SLOTS};
pub use disk::{
    lookup, new_disk_slot, DiskConfig, TracedDevices, FROZEN_DISKS, MAX_DISKS, NEW_DISK_PROBES,
};
/// Names and device numbers for user space (the programs never need them).
#[cfg(feature = "user")]
pub mod vocab;

/// One block-layer event, as emitted by a probe. 56 bytes; fields not used by a kind are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Event {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    /// Inode number of the bio's blkcg cgroup directory (v1 blkio or v2); 0 = none (no blkg,
    /// or a request without bios such as a flush).
    pub cgroup_id: u64,
    /// Kernel address of the bio (bio kinds) or request (request kinds): a correlation key.
    pub id: u64,
    /// Kind-specific: for [`kind::SPLIT`] the address of the remainder bio (the parent that
    /// keeps going); for request kinds the address of the request's first bio, but for an
    /// issue after a requeue that was put back in a queue ([`flags::REISSUE`] with
    /// [`rq_aux::QUEUED`]) the bytes that joined it since.
    pub aux64: u64,
    /// Start sector (512 bytes) of the bio or request.
    pub sector: u64,
    /// Whole-disk device in the kernel's encoding: `major << 20 | minor`.
    pub dev: u32,
    /// Bytes of the bio or request (`bi_size`, `__data_len`).
    pub bytes: u32,
    /// Kind-specific: split: sector where the remainder starts; unplug: depth; insert, issue
    /// and request merge: the request's bios and merges, packed ([`rq_aux`]); complete: bytes
    /// completed; getrq: bits of [`getrq_aux`]; bio queue: bits of [`bio_aux`].
    pub aux: u32,
    /// One of [`kind`].
    pub kind: u8,
    /// `REQ_OP_*` (`opf & 0xff`).
    pub op: u8,
    /// Bio merges: one of [`path`]; insert, issue and request merge: the [`path`] of the
    /// merges the event counts ([`rq_aux`]); complete: the `blk_status_t`; getrq with
    /// [`flags::IOCOST`]: 1 if io.cost's cursor rule calls the bio random (it pays the random
    /// base cost), 0 if sequential.
    pub path: u8,
    /// Bits of [`flags`].
    pub flags: u8,
}

impl Event {
    /// How many bios the event stands for. A bio's blk-throttle charge (`BIO_QUEUE`, and the
    /// fentry tier's `THROTTLE_CHARGE`) recorded by `record --requests` can stand for a run of
    /// like charges of one CPU (capture format 3 on): `aux64` counts the bios after the first,
    /// `bytes` is all of theirs, `ts_ns` is when the run ended (when the CPU's batch was
    /// sent: ~10 ms after its first bio at most while the CPU sends events, or at user space's
    /// next 20 ms poll once it goes quiet), the other fields are the first bio's. Every other
    /// event stands for one.
    #[inline(always)]
    pub fn run_len(&self) -> u64 {
        if kind::is_charge(self.kind) {
            1 + self.aux64
        } else {
            1
        }
    }
}

/// Event kinds. Append only: the values are stored in captures.
pub mod kind {
    pub const BIO_QUEUE: u8 = 1;
    pub const SPLIT: u8 = 2;
    pub const BACK_MERGE: u8 = 3;
    pub const FRONT_MERGE: u8 = 4;
    pub const GETRQ: u8 = 5;
    pub const RQ_MERGE: u8 = 6;
    pub const RQ_INSERT: u8 = 7;
    pub const RQ_ISSUE: u8 = 8;
    pub const RQ_COMPLETE: u8 = 9;
    pub const UNPLUG: u8 = 10;
    pub const RQ_REQUEUE: u8 = 11;
    /// fentry tier: a bio passed `__blk_throtl_bio` (it was charged). `path` = 1 if it was
    /// queued (throttled), 0 if it went on at once.
    pub const THROTTLE_CHARGE: u8 = 12;
    /// fentry tier: a throttled bio left the throttle (`submit_bio_noacct_nocheck`);
    /// `aux64` = nanoseconds it waited, measured.
    pub const THROTTLE_RELEASE: u8 = 13;
    /// fentry tier: `blk_attempt_plug_merge` returned; `path` = 1 merged, 0 not merged.
    pub const PLUG_ATTEMPT: u8 = 14;
    /// fentry tier: `elv_merge` decided; `path` = `enum elv_merge` (0 no, 1 front, 2 back,
    /// 3 discard).
    pub const ELV_MERGE: u8 = 15;
    /// One past the largest kind: sizes the per-kind lost-event counters.
    pub const COUNT: u32 = 16;

    /// A bio's blk-throttle charge: the kinds `record --requests` sends in runs
    /// ([`crate::Event::run_len`]).
    #[inline(always)]
    pub fn is_charge(kind: u8) -> bool {
        kind == BIO_QUEUE || kind == THROTTLE_CHARGE
    }

    pub fn name(kind: u8) -> &'static str {
        match kind {
            BIO_QUEUE => "bio_queue",
            SPLIT => "split",
            BACK_MERGE => "back_merge",
            FRONT_MERGE => "front_merge",
            GETRQ => "getrq",
            RQ_MERGE => "rq_merge",
            RQ_INSERT => "rq_insert",
            RQ_ISSUE => "rq_issue",
            RQ_COMPLETE => "rq_complete",
            UNPLUG => "unplug",
            RQ_REQUEUE => "rq_requeue",
            THROTTLE_CHARGE => "throttle_charge",
            THROTTLE_RELEASE => "throttle_release",
            PLUG_ATTEMPT => "plug_attempt",
            ELV_MERGE => "elv_merge",
            16 => "counters_map_full",
            17 => "cgroup_names",
            18 => "latency_map_full",
            19 => "throttle_dispatch_full",
            20 => "completion_unseen",
            21 => "disk_slots_full",
            _ => "unknown",
        }
    }
}

/// Which mechanism merged a bio into an existing request ([`kind::BACK_MERGE`] and
/// [`kind::FRONT_MERGE`]). Append only.
pub mod path {
    /// The probe could not tell (no caller information).
    pub const UNKNOWN: u8 = 0;
    /// `blk_attempt_plug_merge`: the task's plug list.
    pub const PLUG: u8 = 1;
    /// `blk_mq_sched_try_merge` / `elv_merge`: the I/O scheduler (mq-deadline, bfq).
    pub const ELEVATOR: u8 = 2;
    /// `blk_bio_list_merge`: the software queue of scheduler "none" or kyber.
    pub const SW_QUEUE: u8 = 3;
    /// A discard bio joined a multi-range discard request (`bio_attempt_discard_merge`,
    /// where the queue takes more than one discard segment), in the plug or the queue alike.
    /// Only request events carry it (no tracepoint reports such a bio merge).
    pub const DISCARD: u8 = 4;
    /// How many values: sizes `Counters::merges_at`.
    pub const COUNT: usize = 5;
}

/// What a request event (insert, issue, request merge) says about the request's bios, packed
/// in its `aux`: how many it carries, how many of them merged and where. The programs count
/// it per request instead of per bio, and user space counts a capture from the same values.
///
/// Where a bio merged is where its request was then: a request still in the submitting
/// task's plug list takes plug merges only; once inserted (`block_rq_insert`: the scheduler,
/// or the software queue of scheduler "none") it takes the queue's merges only. So a request
/// leaving the plug (its insert, its issue straight from the plug, or its absorption into
/// another request before an insert) carries `bios - 1` plug merges, and what joined it later
/// is the queue's.
pub mod rq_aux {
    const BITS: u32 = 10;
    const MASK: u32 = (1 << BITS) - 1;
    /// Issue: the request holds one front piece of a split bio (`REQ_NOMERGE`, alone in its
    /// request): one more piece than bios.
    pub const SPLIT_PIECE: u32 = 1 << 30;
    /// Issue and request merge: the request had been inserted, so its plug merges were
    /// counted then and this event counts the queue's. Insert: the request is a requeued one
    /// put back: nothing left the plug.
    pub const QUEUED: u32 = 1 << 31;

    /// Bios chained in the request (up to [`crate::MAX_CHAIN`]).
    #[inline(always)]
    pub fn chain(aux: u32) -> u32 {
        aux & MASK
    }
    /// Issue and request merge of a request that was inserted: bios that merged into it in
    /// the queue (not counting those of requests it absorbed).
    #[inline(always)]
    pub fn queued_merges(aux: u32) -> u32 {
        (aux >> BITS) & MASK
    }
    /// First issue and request merge: of [`queued_merges`], the front merges (bios that
    /// joined before the request's first bio at its insert). Issue of a requeued request
    /// ([`crate::flags::REISSUE`]): bios of requests it absorbed since it was put back.
    #[inline(always)]
    pub fn third(aux: u32) -> u32 {
        (aux >> (2 * BITS)) & MASK
    }
    /// Packs the three counts (each capped at its 10 bits) and `bits`.
    #[inline(always)]
    pub fn pack(chain: u32, queued: u32, third: u32, bits: u32) -> u32 {
        let cap = |v: u32| if v > MASK { MASK } else { v };
        cap(chain) | cap(queued) << BITS | cap(third) << (2 * BITS) | bits
    }
}

/// The `aux` bits of a [`kind::BIO_QUEUE`] event.
pub mod bio_aux {
    /// The bio's disk is bio-based (zram, device-mapper, md): no request will carry it, so
    /// it counts as a bio that reached the device here.
    pub const BIO_BASED: u32 = 1 << 0;
    /// A run that charges per request, on a disk with requests: the bio is counted with its
    /// request, and charged there; this event only says it waited in blk-throttle (it left
    /// from the throttle's dispatch work).
    pub const RELEASE_ONLY: u32 = 1 << 1;
}

/// Modes of the programs, set before load (`KernelSymbols` is address data; this is policy).
/// Frozen read-only data: the verifier drops the code a mode turns off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Modes {
    /// Count events into the per-CPU `COUNTS` / `UNPLUGS` maps (live view, exporter).
    pub aggregate: u32,
    /// Send every event to the ring buffer (capture).
    pub emit: u32,
    /// Tell merge paths from the kernel stack (`bpf_get_stack` and kallsyms ranges, ~1 µs a
    /// merge) instead of from the plug list and the queue's scheduler (a few loads). For tests
    /// that check the two agree.
    pub merge_path_from_stack: u32,
    /// 1 + the id of the cgroup hierarchy whose cgroup births and removals are reported on
    /// `CGROUP_EVENTS` (the one hosting blkio/io; v2's is 0); 0 reports none.
    pub cgroup_hierarchy: u32,
    /// Count each request's queue and device latency in the `LATENCY` histograms
    /// ([`LatencyHist`]; live `--latency`).
    pub latency: u32,
    /// A capture of request events only (`record --requests`): as when counting, a read's
    /// new request (`block_getrq`) is not sent (nothing in such a capture needs it).
    pub requests_only: u32,
    /// A testing knob (`MERGETRACE_SKIP_COMPLETIONS_AT_SECTOR`): 1 + a sector whose requests'
    /// completions the completion program ignores, as the kernel sometimes does not run it
    /// (`LOST_COMPLETION_UNSEEN`); 0, always, outside the tests.
    pub skip_completions_at: u32,
    /// Events sent are first gathered in this CPU's [`Staged`] batch and go to its ring a
    /// batch at a time (one ring reservation per batch, not per event). Off where a program
    /// on a tracepoint can be preempted by another task's (PREEMPT_RT): the batch is guarded
    /// against interrupts only.
    pub staged: u32,
}

impl Modes {
    /// Counting in the kernel, no events (live view, exporter, demo).
    pub const COUNTING: Modes = Modes {
        aggregate: 1,
        emit: 0,
        merge_path_from_stack: 0,
        cgroup_hierarchy: 0,
        latency: 0,
        requests_only: 0,
        skip_completions_at: 0,
        staged: 0,
    };
    /// Every event to the ring buffer, no counting (capture).
    pub const EMITTING: Modes = Modes {
        aggregate: 0,
        emit: 1,
        merge_path_from_stack: 0,
        cgroup_hierarchy: 0,
        latency: 0,
        requests_only: 0,
        skip_completions_at: 0,
        staged: 0,
    };
}

/// Bits of the `GATE` map's one value, written by user space.
pub mod gate {
    /// The programs run: from when every program of the run is attached and the rings are in
    /// place to the run's end.
    pub const OPEN: u32 = 1 << 0;
    /// io.cost is on for a traced disk: a read's new request is then charged too.
    pub const IOCOST: u32 = 1 << 1;
}

/// The `aux` bits of a [`kind::GETRQ`] event.
pub mod getrq_aux {
    /// The bio is of the class wbt throttles (`wbt_should_throttle`): a write that is not an
    /// O_DIRECT one (`REQ_SYNC | REQ_IDLE` both set), or a discard. Where wbt is on, its new
    /// request takes one of wbt's in-flight slots.
    pub const WBT_CLASS: u32 = 1 << 0;
}

/// io.cost's charging rule as the programs follow it, per traced disk ([`TracedDevices`]).
pub mod iocost {
    /// io.cost is enabled on the disk (`io.cost.qos` `enable=1`).
    pub const ENABLED: u32 = 1 << 0;
    /// An empty bio (a data-less `REQ_PREFLUSH` write) is charged a base cost and one page,
    /// and moves the cursor to its sector (before 6.6, which skips empty bios).
    pub const EMPTY_CHARGED: u32 = 1 << 1;
    /// A bio that starts a request more than this many 4 KiB pages from its cgroup's cursor
    /// pays the random base cost (`LCOEF_RANDIO_PAGES`), else the sequential one.
    pub const RANDIO_PAGES: u64 = 4096;

    /// The pages io.cost charges for a bio of `bytes`: `max(bio_sectors >> 3, 1)`.
    #[inline(always)]
    pub fn pages(bytes: u32) -> u64 {
        let p = (bytes >> 12) as u64;
        if p == 0 {
            1
        } else {
            p
        }
    }

    /// io.cost's per-(cgroup, disk) cursor rule for a bio that starts a request at `sector`
    /// with `bytes`: whether it is random (seeks more than [`RANDIO_PAGES`] from `cursor`; a
    /// cursor of 0 seeks nowhere), and the cursor after it (the bio's end).
    #[inline(always)]
    pub fn start(cursor: u64, sector: u64, bytes: u32) -> (bool, u64) {
        let seek = if cursor == 0 {
            0
        } else if sector > cursor {
            (sector - cursor) >> 3
        } else {
            (cursor - sector) >> 3
        };
        (seek > RANDIO_PAGES, sector + (bytes >> 9) as u64)
    }

    /// The cursor after a bio back-merges at `sector` with `bytes`: io.cost moves it to the
    /// bio's end only when the request the bio joins ended at the cursor.
    #[inline(always)]
    pub fn back_merge(cursor: u64, sector: u64, bytes: u32) -> u64 {
        if cursor == sector {
            sector + (bytes >> 9) as u64
        } else {
            cursor
        }
    }
}

/// Plug flush depths counted per disk and kind (explicit or from schedule): 0 ..= this; deeper
/// flushes count as this.
pub const UNPLUG_MAX_DEPTH: u32 = 128;

/// Index of the plug flush counter of (disk slot, explicit, depth) in `UNPLUGS`.
#[inline(always)]
pub fn unplug_slot(device: u32, explicit: bool, depth: u32) -> u32 {
    let depth = if depth > UNPLUG_MAX_DEPTH {
        UNPLUG_MAX_DEPTH
    } else {
        depth
    };
    (device * 2 + explicit as u32) * (UNPLUG_MAX_DEPTH + 1) + depth
}

/// Entries of `UNPLUGS` per disk slot.
pub const UNPLUG_SLOTS_PER_DISK: u32 = 2 * (UNPLUG_MAX_DEPTH + 1);

/// Event flag bits. Append only.
pub mod flags {
    /// `block_bio_queue` fired while blk-throttle's dispatch work released the bio: it waited.
    pub const THROTTLE_RELEASED: u8 = 1 << 0;
    /// The bio's throttle group has an iops rule (own or inherited) for its direction. In a run
    /// that charges per request (counting, `record --requests`) also on an issue (the
    /// request's bios, charged there) and on a data-less flush write's getrq (charged there).
    pub const RULES_IOPS: u8 = 1 << 1;
    /// The bio's throttle group has a bps rule (own or inherited) for its direction (as
    /// [`RULES_IOPS`], on the same events).
    pub const RULES_BPS: u8 = 1 << 2;
    /// Split: the remainder was already charged for its bytes (`BIO_BPS_THROTTLED`), so a
    /// bps-only rule does not charge it again.
    pub const BPS_CHARGED: u8 = 1 << 3;
    /// Unplug: an explicit `blk_finish_plug`, not a flush from schedule.
    pub const UNPLUG_EXPLICIT: u8 = 1 << 4;
    /// Bio kinds: the bio carries `REQ_PREFLUSH` or `REQ_FUA`, so it starts a flush sequence
    /// (a data-less one is completed by the flush machinery without a write request).
    pub const FLUSH_SEQ: u8 = 1 << 5;
    /// Issue: the request was issued before and handed back by the driver (requeued); this
    /// issue is the same request again, not a new one.
    pub const REISSUE: u8 = 1 << 6;
    /// Bio merges and getrq: io.cost charges this bio (its disk has io.cost on, it reads or
    /// writes, and it has data or this kernel charges empty bios).
    pub const IOCOST: u8 = 1 << 7;
}

/// Kernel struct offsets (bytes) and enum values, resolved by user space from the running
/// kernel's BTF and written into the programs' read-only data before load. The eBPF side has
/// no CO-RE relocations, so nothing here may be compiled in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// Non-zero once user space filled the struct in; programs do nothing while it is 0.
    pub ready: u32,
    pub bio_bi_opf: u32,
    pub bio_bi_bdev: u32,
    pub bio_bi_blkg: u32,
    pub bio_bi_flags: u32,
    pub bio_bi_sector: u32,
    pub bio_bi_size: u32,
    pub bio_bi_private: u32,
    pub bio_bi_next: u32,
    pub bdev_bd_disk: u32,
    pub disk_major: u32,
    pub disk_first_minor: u32,
    pub blkg_blkcg: u32,
    /// `blkcg.css` + `cgroup_subsys_state.cgroup`.
    pub blkcg_css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kn_id: u32,
    /// `cgroup.root` and `cgroup_root.hierarchy_id`: which hierarchy a cgroup is in.
    pub cgroup_root: u32,
    pub root_hierarchy_id: u32,
    pub rq_q: u32,
    pub rq_cmd_flags: u32,
    pub rq_data_len: u32,
    pub rq_sector: u32,
    pub rq_bio: u32,
    pub q_disk: u32,
    /// `work_struct.func`.
    pub work_func: u32,
    /// `blkcg_gq.pd` (array of `struct blkg_policy_data *`).
    pub blkg_pd: u32,
    /// `throtl_grp.has_rules_iops` (bool[2]); 0 where the kernel has no such field.
    pub tg_has_rules_iops: u32,
    /// `throtl_grp.has_rules_bps` (bool[2]).
    pub tg_has_rules_bps: u32,
    /// `enum bio_flags` value of `BIO_BPS_THROTTLED` (moves between versions).
    pub bio_bps_throttled_bit: u32,
    /// `blkcg_gq.q`, `request_queue.td`, `throtl_grp.td`: blk-throttle's group of a blkg is
    /// the `pd[i]` whose `td` is the queue's `td` (the policy id is not visible to BPF).
    pub blkg_q: u32,
    pub q_td: u32,
    pub tg_td: u32,
    /// `throtl_data.dispatch_work` and `throtl_data.queue`: the queue whose held bios a
    /// dispatch work item releases.
    pub td_dispatch_work: u32,
    pub td_queue: u32,
    /// Length of `blkcg_gq.pd[]` (`BLKCG_MAX_POLS`).
    pub blkg_pd_count: u32,
    /// `(1 << __REQ_PREFLUSH) | (1 << __REQ_FUA)`: the `blk_opf_t` bits that make a bio part of
    /// a flush sequence (`op_is_flush`). The bit numbers move between versions.
    pub req_flush_mask: u32,
    /// `(1 << __REQ_SYNC) | (1 << __REQ_IDLE)`: a write with both is an O_DIRECT write, which
    /// wbt lets by (`wbt_should_throttle`); the bit numbers move between versions.
    pub req_sync_idle_mask: u32,
    /// `request.state` (`enum mq_rq_state`: 0 idle, 1 in flight, 2 complete).
    pub rq_state: u32,
    /// `request.start_time_ns` (set when the request is allocated): tells a requeued request
    /// issued again from a new one that reuses its memory.
    pub rq_start_time_ns: u32,
    /// `task_struct.plug`: the task's plug list, where plug merges happen.
    pub task_plug: u32,
    /// The request of `blk_plug.mq_list` a plug merge tries first: the list's head up to 6.12
    /// (`struct request *mq_list`, newest first), its tail from 6.13 (`struct rq_list`).
    pub plug_candidate: u32,
    /// `gendisk.queue`, `request_queue.elevator`, `elevator_queue.type`,
    /// `elevator_type.elevator_name`: which scheduler (if any) merges bios off the plug.
    pub disk_queue: u32,
    pub q_elevator: u32,
    pub elv_type: u32,
    pub elv_type_name: u32,
    /// Non-zero where `elevator_name` is a `const char *` (6.18) rather than a `char[16]`.
    pub elv_name_is_pointer: u32,
    /// Non-zero where a bio names its disk directly (`bio.bi_disk`, up to 5.11): `bio_bi_bdev`
    /// is then that member's offset and `bdev_bd_disk` is unused.
    pub bio_disk_direct: u32,
    /// `request.rq_disk` where a request names its disk (up to 5.15), else [`NONE`] (the disk
    /// is `rq->q->disk`; `q_disk` is [`NONE`] where the queue has no `disk`).
    pub rq_rq_disk: u32,
    /// Non-zero where `blk_plug.mq_list` is a `struct list_head` (up to 5.15) that a plug
    /// merge walks from its newest request; `plug_candidate` is then `mq_list.prev` and
    /// `rq_queuelist` the list's link in `struct request`.
    pub plug_list_head: u32,
    pub rq_queuelist: u32,
    /// Non-zero where blk-throttle charges a split remainder again (1 io; since 6.0, with
    /// `BIO_BPS_THROTTLED`); up to 5.19 a bio that passed once (`BIO_THROTTLED`) is not
    /// throttled again.
    pub remainders_charged: u32,
    /// Non-zero where `bpf_get_current_task_btf` exists (5.11+); else the task is read through
    /// `bpf_get_current_task` and probe reads.
    pub current_task_btf: u32,
    /// `request_queue.limits` + `queue_limits.max_discard_segments` (`unsigned short`): a queue
    /// taking more than one merges discards as ranges (`blk_discard_mergable`).
    pub q_max_discard_segments: u32,
    /// `request.tag`, `request.internal_tag`, `request.mq_hctx` and `blk_mq_hw_ctx.queue_num`:
    /// a request in flight is (hardware queue, its scheduler tag, else its driver tag), which
    /// indexes `--latency`'s issue times.
    pub rq_tag: u32,
    pub rq_internal_tag: u32,
    pub rq_mq_hctx: u32,
    pub hctx_queue_num: u32,
    /// The BTF id of `struct throtl_grp` where the programs may cast to it (the kernel has the
    /// `bpf_rdonly_cast` kfunc, 6.2+): a group's rules are then plain loads. 0: probe reads.
    pub throtl_grp_btf_id: u32,
}

/// The call number a program uses for the kernel's `bpf_rdonly_cast` kfunc. aya does not link
/// kfunc calls: user space rewrites each call of this number in the object before load, into
/// the kfunc's call where the kernel has it, else into `r0 = 0` (the call is then dead code,
/// `KernelOffsets::throtl_grp_btf_id` being 0). No helper has a number near it.
pub const RDONLY_CAST_CALL: i32 = 0x6d74_0001;

/// The longest bio chain the request probes walk (a request's bios; loop devices allow 128
/// segments, virtio 254). Longer chains count as this many. At most 1,023 ([`rq_aux`]).
pub const MAX_CHAIN: u32 = 512;

/// An offset that does not exist on this kernel.
pub const NONE: u32 = u32::MAX;

/// Kernel addresses from `/proc/kallsyms`, written into read-only data before load: where the
/// tracepoint tier learns its context (which function a merge came from, whether blk-throttle's
/// dispatch work is running). A 0 address means "unknown" and disables what depends on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelSymbols {
    /// `blk_throtl_dispatch_work_fn`: the work item that releases throttled bios.
    pub throtl_dispatch_fn: u64,
    /// `[start, end)` of the functions that call `bio_attempt_{back,front}_merge`, one per
    /// [`path`] value: index `path::PLUG - 1`, `path::ELEVATOR - 1`, `path::SW_QUEUE - 1`.
    pub merge_callers: [[u64; 2]; MERGE_CALLERS],
}

/// Number of caller ranges in [`KernelSymbols::merge_callers`].
pub const MERGE_CALLERS: usize = 3;

/// Per-CPU lost-event counter slots: one per event kind, then [`LOST_COUNTS_FULL`],
/// [`LOST_CGROUP_NAMES`], [`LOST_LATENCY_FULL`], [`LOST_DISPATCH_FULL`],
/// [`LOST_COMPLETION_UNSEEN`] and [`LOST_DISKS_FULL`].
pub const LOST_SLOTS: u32 = kind::COUNT + 6;
/// Lost slot: an event could not be counted: its key found no room in the counters map, nor
/// its (disk, direction) in the unattributed one.
pub const LOST_COUNTS_FULL: u32 = kind::COUNT;
/// Lost slot: a cgroup birth or removal could not be reported (its ring was full); user
/// space then learns the name by rescanning the hierarchy, as before.
pub const LOST_CGROUP_NAMES: u32 = kind::COUNT + 1;
/// Lost slot: a request's latency could not be counted: its key had no counter slot and the
/// latency hash map was full.
pub const LOST_LATENCY_FULL: u32 = kind::COUNT + 2;
/// Lost slot: blk-throttle's dispatch work started on a CPU already following as many items
/// as it can (the tracepoint tier's `DISPATCH_WORKERS`): the bios it released are not told
/// as throttled.
pub const LOST_DISPATCH_FULL: u32 = kind::COUNT + 3;
/// Lost slot (`--latency`): the kernel ended a request without running the completion
/// program, seen when the same request memory is issued again (its tag's, the scheduler's
/// under a scheduler) and finds its issue entry still there. Its device latency is missing
/// from the histograms. Observed on 6.18 for requests
/// completed in the block softirq on top of one particular task, while ftrace's own event for
/// the same tracepoint recorded them.
pub const LOST_COMPLETION_UNSEEN: u32 = kind::COUNT + 4;

/// Lost slot: a disk's first event found no free slot in the per-disk maps (every disk
/// traced, and more disks than slots): that disk's events are not counted.
pub const LOST_DISKS_FULL: u32 = kind::COUNT + 5;

/// The `cgroup_id` of the counters of removed cgroups, folded per disk and direction
/// (no kernfs inode is this).
pub const REMOVED_CGROUP: u64 = u64::MAX;

/// The cgroup id of a device's *unattributed* counters: events whose key found no room in the
/// counter maps (more new keys between two reads than `MAX_SLOTS`), counted per (disk,
/// direction) instead of lost.
pub const UNATTRIBUTED_CGROUP: u64 = u64::MAX - 1;

/// (disk, direction) keys the unattributed counters hold at most.
pub const UNATTRIBUTED_KEYS: u32 = 64;

/// Longest cgroup path a [`CgroupEvent`] carries (with its NUL); longer ones are cut and
/// flagged, and user space looks the name up in the hierarchy instead.
pub const CGROUP_PATH_MAX: usize = 496;

/// A cgroup created or removed in the traced hierarchy (`cgroup_mkdir`, `cgroup_rmdir`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupEvent {
    /// The kernfs inode of its directory: the `cgroup_id` of its events.
    pub id: u64,
    /// [`CGROUP_MKDIR`] or [`CGROUP_RMDIR`].
    pub what: u32,
    /// Bytes of `path` before its NUL; `CGROUP_PATH_MAX` when it was cut.
    pub len: u32,
    /// Relative to the hierarchy's root ("/a/b"), NUL-terminated.
    pub path: [u8; CGROUP_PATH_MAX],
}

/// Events a CPU gathers before it sends them to its ring in one record ([`Staged`]).
pub const STAGED_EVENTS: usize = 64;

/// A staged batch goes to the ring once its first event is this old, when the CPU sends
/// another; user space sends the batch of a CPU that sends nothing more (`flush_staged`).
pub const STAGED_MAX_AGE_NS: u64 = 10_000_000;

/// One CPU's batch of events on their way to its ring (the per-CPU `STAGING` map). A ring
/// record then holds one event or several, back to back.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Staged {
    /// `ts_ns` of the batch's first event; 0 while empty.
    pub first_ts: u64,
    /// Set while a program on this CPU writes the batch: a program that interrupts it (a
    /// completion in softirq) sends its event straight to the ring instead.
    pub busy: u32,
    /// Events in `events`.
    pub len: u32,
    pub events: [Event; STAGED_EVENTS],
    /// `record --requests`: the runs of like blk-throttle charges this CPU is gathering
    /// ([`Event::run_len`]), by [`charge_run_index`]; kind 0 when none. A run joins the batch
    /// when it ends or the batch is sent, timed then.
    pub runs: [Event; CHARGE_RUNS],
}

/// Open runs of charges a CPU keeps ([`Staged::runs`]): one per charge kind, because on the
/// fentry tier each bio's two charges (`__blk_throtl_bio`'s, then `block_bio_queue`'s)
/// alternate.
pub const CHARGE_RUNS: usize = 2;

/// The [`Staged::runs`] entry of a charge of `kind`.
#[inline(always)]
pub fn charge_run_index(kind: u8) -> usize {
    (kind == kind::THROTTLE_CHARGE) as usize
}

pub const CGROUP_MKDIR: u32 = 1;
pub const CGROUP_RMDIR: u32 = 2;
/// Not a cgroup's: a run that charges per request found blk-throttle rules on a traced disk
/// for the first time (`id` is the disk's `dev_t`). The programs that tell which bios waited
/// attach then.
pub const DISK_RULES_SEEN: u32 = 3;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] integers without padding holes that matter to the kernel.
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::KernelSymbols {}
    unsafe impl aya::Pod for super::CountKey {}
    unsafe impl aya::Pod for super::DiskConfig {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::UnplugKey {}
    unsafe impl aya::Pod for super::MeterUnits {}
    unsafe impl aya::Pod for super::Modes {}
    unsafe impl aya::Pod for super::DeviceState {}
    unsafe impl aya::Pod for super::TracedDevices {}
    unsafe impl aya::Pod for super::SlotRef {}
    unsafe impl aya::Pod for super::CgroupEvent {}
    unsafe impl aya::Pod for super::Staged {}
    unsafe impl aya::Pod for super::latency::LatencyHist {}
    unsafe impl aya::Pod for super::latency::IssuedAt {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn a_new_disk_tries_only_slots_the_placed_disks_left_free() {
        for dev in [7 << 20 | 601, 259 << 20, 8 << 20 | 16, 1] {
            let tried: std::collections::BTreeSet<u32> = (0..NEW_DISK_PROBES)
                .map(|i| new_disk_slot(dev, 200, 512, i).unwrap())
                .collect();
            assert_eq!(
                tried.len(),
                NEW_DISK_PROBES as usize,
                "{dev}: distinct slots"
            );
            assert!(tried.iter().all(|s| (200..512).contains(s)), "{tried:?}");
        }
        assert_eq!(new_disk_slot(5, 256, 256, 0), None);
    }

    #[test]
    fn event_layout_is_stable() {
        assert_eq!(core::mem::size_of::<Event>(), 56);
        assert_eq!(core::mem::align_of::<Event>(), 8);
        assert_eq!(core::mem::size_of::<KernelOffsets>() % 8, 0);
        // Counters::combine treats the struct as a u64 array.
        assert_eq!(core::mem::size_of::<Counters>() % 8, 0);
        assert_eq!(core::mem::align_of::<Counters>(), 8);
        assert_eq!(core::mem::size_of::<CountKey>(), 16);
    }

    #[test]
    fn histogram_buckets() {
        use count::{count_bucket, size_bucket, COUNT_BUCKETS, SIZE_BUCKETS};
        assert_eq!(size_bucket(512), 0);
        assert_eq!(size_bucket(4096), 3);
        assert_eq!(size_bucket(4097), 4);
        assert_eq!(size_bucket(128 << 10), 8);
        assert_eq!(size_bucket(u64::MAX), SIZE_BUCKETS - 1);
        assert_eq!(count_bucket(1), 0);
        assert_eq!(
            (count_bucket(2), count_bucket(3), count_bucket(4)),
            (1, 1, 2)
        );
        assert_eq!(count_bucket(32), 5);
        assert_eq!(count_bucket(1 << 40), COUNT_BUCKETS - 1);
    }
}
