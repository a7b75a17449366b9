//! The words user space uses for the numbers events carry, in one place: device numbers,
//! event kinds, merge paths, ops, directions and flags. The kernel side never needs them.
use core::fmt;

use crate::{count::dir, flags, kind, path};

/// A whole-disk device in the kernel's internal encoding (`MINORBITS` = 20): what
/// [`crate::Event::dev`] and the count keys carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dev(pub u32);

impl Dev {
    pub const fn new(major: u32, minor: u32) -> Dev {
        Dev(major << 20 | minor)
    }

    pub const fn major(self) -> u32 {
        self.0 >> 20
    }

    pub const fn minor(self) -> u32 {
        self.0 & 0xfffff
    }
}

/// `MAJ:MIN`, as `/proc/diskstats` and sysfs write it.
impl fmt::Display for Dev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major(), self.minor())
    }
}

/// The name of an event kind ([`crate::kind`]), "unknown" for none.
pub fn kind_name(k: u8) -> &'static str {
    kind::name(k)
}

/// The name of a bio merge path ([`crate::path`]).
pub fn merge_path_name(p: u8) -> &'static str {
    match p {
        path::PLUG => "plug",
        path::ELEVATOR => "elevator",
        path::SW_QUEUE => "sw_queue",
        _ => "unknown",
    }
}

/// The merge paths as user space counts them (the snapshot's `merged_by_path` fields and the
/// `path` label of `mergetrace_merged_total`), in that order: the elevator split by side, and
/// the two merges without a bio path.
pub const MERGE_PATH_LABELS: [&str; 7] = [
    "plug",
    "elevator_back",
    "elevator_front",
    "sw_queue",
    "discard",
    "request",
    "unknown",
];

/// The name of a `REQ_OP_*` value; `None` for one without a name here.
pub fn op_name(op: u8) -> Option<&'static str> {
    Some(match op {
        0 => "read",
        1 => "write",
        2 => "flush",
        3 => "discard",
        5 => "secure_erase",
        7 => "zone_append",
        9 => "write_zeroes",
        10 => "zone_open",
        11 => "zone_close",
        12 => "zone_finish",
        13 => "zone_reset",
        15 => "zone_reset_all",
        34 => "drv_in",
        35 => "drv_out",
        _ => return None,
    })
}

/// The name of a direction ([`crate::count::dir`]), as `/proc/diskstats` groups ops.
pub fn dir_name(code: u32) -> &'static str {
    match code {
        dir::READ => "read",
        dir::WRITE => "write",
        dir::DISCARD => "discard",
        _ => "flush",
    }
}

/// The flag bits exports name ([`crate::flags`]); others are shown as hex.
pub const FLAG_NAMES: [(u8, &str); 8] = [
    (flags::THROTTLE_RELEASED, "throttle_released"),
    (flags::RULES_IOPS, "rules_iops"),
    (flags::RULES_BPS, "rules_bps"),
    (flags::BPS_CHARGED, "bps_charged"),
    (flags::UNPLUG_EXPLICIT, "unplug_explicit"),
    (flags::FLUSH_SEQ, "flush_seq"),
    (flags::REISSUE, "reissue"),
    (flags::IOCOST, "iocost"),
];
