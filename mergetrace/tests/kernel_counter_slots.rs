//! Counter slots: the programs count a (cgroup, disk, direction) key in a hash map until user
//! space gives it a slot in a per-CPU array (at the first read after the key appears), then
//! in the slot. The counts must stay exact across that hand-over: nothing counted twice,
//! nothing lost, and each interval the difference of two totals.
mod support;
use std::{thread, time::Duration};

use serde_json::Value;
use support::*;

const MIB: u64 = 1 << 20;

/// The keys the tracer gave a slot, from the kernel's own view of its `SLOT_OF` map.
fn slotted_keys() -> usize {
    // bpftool: scripts/setup --test installs it.
    let out = run_cmd(
        std::process::Command::new("bpftool").args(["-j", "map", "dump", "name", "SLOT_OF"]),
    );
    let v: Value = serde_json::from_str(&out).expect("bpftool prints JSON");
    v.as_array().map_or(0, |a| a.len())
}

/// Three bursts of 4 KiB direct writes from one cgroup, with reads of the counters (100 ms
/// intervals) between them: the first burst is counted in the hash map, the next ones in
/// the key's slot. Totals equal diskstats and blk-cgroup's count; the intervals add up to
/// the total.
#[test]
fn counts_stay_exact_when_a_key_moves_to_its_slot() {
    require_root();
    let disk = TestDisk::new(64 * MIB);
    disk.set_scheduler("none");
    disk.set_nomerges(0);
    udev_settle();
    let cg = Cgroup::new();
    // A limit that never binds turns blk-throttle on, so blk-cgroup counts the bios on v1.
    cg.set_write_iops(&disk, 10_000_000);
    let tracer = Tracer::start(&["-d", disk.name.as_str(), "--interval", "100ms"]);
    let before = disk.diskstats();
    let tb = cg.throttle_stats(&disk);
    let burst = scaled(8, 2) * MIB;
    let mut ios = 0;
    let mut slotted = Vec::new();
    for i in 0..3u64 {
        let report = Fio::sequential("slots", &disk, "write", burst, 8)
            .offset(i * burst)
            .in_cgroup(&cg)
            .run();
        ios += fio_total_ios(&report, "write");
        // Two intervals pass: the tracer has read the counters and given the key a slot.
        thread::sleep(Duration::from_millis(300));
        slotted.push(slotted_keys());
    }
    let d = disk.diskstats().since(&before);
    let (serviced, _) = cg.throttle_stats(&disk).write_since(&tb);
    let out = tracer.stop();
    let ctx = format!("3 bursts of {burst} bytes, 100 ms intervals");
    assert_eq!(out.lost_events(), 0, "{ctx}");
    assert!(
        slotted.iter().all(|n| *n >= 1),
        "the tracer gave no key a slot after a burst ({slotted:?}); {ctx}"
    );
    let w = &out
        .cgroup_row(&disk, &cg.path())
        .unwrap_or_else(|| panic!("no row for {}; {ctx}", cg.path()))["write"];
    eprintln!("{ctx}: fio {ios}, diskstats {d:?}, io_serviced {serviced}, slots {slotted:?}; {w}");
    assert_eq!(u(w, "bios"), ios, "{ctx}; {w}");
    assert_eq!(u(w, "bios"), serviced, "blk-cgroup's count; {ctx}; {w}");
    let total = out.device_total(&disk);
    assert_eq!(u(&total["write"], "requests"), d.writes, "{ctx}; {total}");
    assert_eq!(
        u(&total["write"], "merged"),
        d.writes_merged,
        "{ctx}; {total}"
    );
    assert_identity(w, &ctx);
    for field in ["bios", "requests", "merged"] {
        assert_eq!(
            out.interval_sum(&disk, "write", field),
            u(&total["write"], field),
            "intervals do not add up to the total ({field}); {ctx}"
        );
    }
}
