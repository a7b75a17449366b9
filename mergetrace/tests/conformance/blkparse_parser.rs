//! The blkparse parser (no kernel needed: these run anywhere).

use crate::support::blktrace::*;
use std::collections::BTreeMap;

fn ev(line: &str) -> Event {
    parse_line(line).unwrap().unwrap()
}

#[test]
fn rwbs_flags_and_directions() {
    let r = Rwbs::parse("FWFS").unwrap();
    assert!(r.preflush && r.fua && r.sync && !r.meta);
    assert_eq!(r.dir(), Dir::Write);
    assert_eq!(Rwbs::parse("FN").unwrap().dir(), Dir::Flush);
    assert_eq!(Rwbs::parse("N").unwrap().dir(), Dir::None);
    assert_eq!(Rwbs::parse("RA").unwrap().dir(), Dir::Read);
    assert_eq!(Rwbs::parse("D").unwrap().dir(), Dir::Discard);
    assert_eq!(Rwbs::parse("DS").unwrap().dir(), Dir::Discard);
    let w = Rwbs::parse("FWS").unwrap();
    assert!(w.preflush && !w.fua);
    let m = Rwbs::parse("WSM").unwrap();
    assert!(m.meta && m.sync && !m.preflush);
    assert!(Rwbs::parse("X").is_none());
    assert!(Rwbs::parse("").is_none());
    assert!(Rwbs::parse("WQ").is_none());
}

#[test]
fn parses_our_lines_and_skips_others() {
    let e = ev("@mt Q WS 2048 4096 254,16 1 17 3.000012345 812");
    assert_eq!(e.action, "Q");
    assert_eq!((e.sector, e.bytes, e.end()), (2048, 4096, 2056));
    assert_eq!(
        (e.major, e.minor, e.cpu, e.seq, e.pid),
        (254, 16, 1, 17, 812)
    );
    assert_eq!(e.time_ns, 3_000_012_345);
    assert_eq!(e.dir(), Dir::Write);
    assert_eq!(e.pdu, None);
    let x = ev("@mt X W 0 1310720 254,16 0 5 0.5 99 2560");
    assert_eq!(x.pdu, Some(2560));
    let u = ev("@mt UT N 0 0 254,16 0 6 0.6 99 3");
    assert_eq!(
        (u.action.as_str(), u.dir(), u.pdu),
        ("UT", Dir::None, Some(3))
    );
    assert_eq!(parse_line("CPU0 (vdb):").unwrap(), None);
    assert_eq!(
        parse_line("254,16   0  1  0.000 812  m   N cfq note").unwrap(),
        None
    );
    assert!(parse_line("@mt Q WS x 4096 254,16 1 17 3.0 812").is_err());
    assert!(parse_line("@mt Q WQ 1 4096 254,16 1 17 3.0 812").is_err());
    assert!(parse_line("@mt Q WS 1 4096 254,16 1 17").is_err());
}

#[test]
fn blktrace_summary_dropped() {
    let s = "=== vdb ===\n  CPU  0:                 1200 events,       57 KiB data\n  \
             CPU  1:                   30 events,        2 KiB data\n  \
             Total:                  1230 events (dropped 0),       58 KiB data\n";
    assert_eq!(parse_dropped(s), Some(0));
    assert_eq!(
        parse_dropped("Total: 5 events (dropped 7), 1 KiB data"),
        Some(7)
    );
    assert_eq!(parse_dropped("nothing"), None);
}

/// An fsync on ext4 over a write-back-cache disk without FUA, as blkparse shows it: the
/// data write (two bios back-merged in the plug), the journal commit block (PREFLUSH|FUA,
/// a flush sequence: pre-flush, data, post-flush, a 0-byte completion at its end), and an
/// empty flush bio (G, a flush request, the 0-byte completion; no D of its own).
const FSYNC: &str = "\
@mt Q WS 8192 4096 254,16 0 1 0.000001000 500
@mt G WS 8192 4096 254,16 0 2 0.000002000 500
@mt P N 0 0 254,16 0 3 0.000003000 500
@mt Q WS 8200 4096 254,16 0 4 0.000004000 500
@mt M WS 8200 4096 254,16 0 5 0.000005000 500
@mt U N 0 0 254,16 0 6 0.000006000 500 1
@mt I WS 8192 8192 254,16 0 7 0.000007000 500
@mt D WS 8192 8192 254,16 0 8 0.000008000 500
@mt C WS 8192 8192 254,16 0 9 0.000009000 0
@mt Q FWFS 1000 4096 254,16 1 1 0.000010000 300
@mt G FWFS 1000 4096 254,16 1 2 0.000011000 300
@mt D FN 0 0 254,16 1 3 0.000012000 300
@mt C FN 0 0 254,16 1 4 0.000013000 0
@mt D WS 1000 4096 254,16 1 5 0.000014000 0
@mt C WS 1000 4096 254,16 1 6 0.000015000 0
@mt D FN 0 0 254,16 1 7 0.000016000 0
@mt C FN 0 0 254,16 1 8 0.000017000 0
@mt C WS 1008 0 254,16 1 9 0.000018000 0
@mt Q FWS 0 0 254,16 0 10 0.000019000 500
@mt G FWS 0 0 254,16 0 11 0.000020000 500
@mt D FN 0 0 254,16 0 12 0.000021000 0
@mt C FN 0 0 254,16 0 13 0.000022000 0
@mt C WS 0 0 254,16 0 14 0.000023000 0
CPU0 (vdb):
";

#[test]
fn counts_and_flush_relations_of_an_fsync() {
    let t = parse_blkparse(FSYNC).unwrap();
    assert_eq!(t.other_lines, vec!["CPU0 (vdb):".to_string()]);
    assert_eq!(t.count("Q"), 4);
    assert_eq!(t.count_dir("Q", Dir::Write), 4);
    assert_eq!(t.count("G"), 3);
    assert_eq!(t.count("M") + t.count("F"), 1);
    assert_eq!(t.count_dir("D", Dir::Flush), 3);
    assert_eq!(t.count_dir("D", Dir::Write), 2);
    assert_eq!(t.count("C"), 7);
    assert_eq!(t.bytes_dir("D", Dir::Write), 8192 + 4096);
    assert_eq!(t.flush_only_getrqs(), 1);
    // Both the commit block and the empty flush entered the flush machinery.
    assert_eq!(t.flush_sequence_getrqs(false), 2);
    assert_eq!(t.zero_byte_write_completions(), 2);
    // C - C0 = D - R
    assert_eq!(
        t.count("C") - t.zero_byte_write_completions(),
        t.count("D") - t.count("R")
    );
    assert_eq!(t.unplug_depths("U"), BTreeMap::from([(1, 1)]));
    let c = t.counts();
    assert_eq!(c[&("D".to_string(), Dir::Flush)], 3);
    assert_eq!(c[&("P".to_string(), Dir::None)], 1);
}

#[test]
fn requests_collect_their_bios() {
    let t = parse_blkparse(FSYNC).unwrap();
    let (rqs, unmatched) = t.requests();
    assert_eq!(unmatched, 0);
    let w: Vec<(u64, u64, u64)> = rqs
        .iter()
        .filter(|r| r.dir == Dir::Write)
        .map(|r| (r.sector, r.bytes, r.bios))
        .collect();
    assert_eq!(w, vec![(8192, 8192, 2), (1000, 4096, 1)]);
    assert_eq!(rqs[0].bio_extents, vec![(8192, 4096), (8200, 4096)]);
    assert_eq!(
        t.counts_by_rwbs("D"),
        BTreeMap::from([("FN".to_string(), 3), ("WS".to_string(), 2)])
    );
    assert_eq!(t.count_where("Q", |e| e.flags.fua), 1);
    assert_eq!(t.lines("C").filter(|e| e.bytes == 0).count(), 5);
    assert_eq!(rqs.iter().filter(|r| r.dir == Dir::Flush).count(), 3);
    assert!(rqs.iter().all(|r| r.completions == 1 && r.issues == 1));
    // A flush request (FN 0 0) is not the request of the empty PREFLUSH bio before it
    // (FWS 0 0, never issued): it has no bios.
    assert!(rqs
        .iter()
        .filter(|r| r.dir == Dir::Flush)
        .all(|r| r.bios == 0 && r.chain.is_empty()));
    assert_eq!(rqs[0].chain, vec![(8192, 4096), (8200, 4096)]);
}

#[test]
fn front_merges_requeues_and_request_merges() {
    let text = "\
@mt Q W 100 4096 8,0 0 1 0.1 1
@mt G W 100 4096 8,0 0 2 0.2 1
@mt Q W 92 4096 8,0 0 3 0.3 1
@mt F W 92 4096 8,0 0 4 0.4 1
@mt Q W 116 4096 8,0 0 5 0.5 1
@mt G W 116 4096 8,0 0 6 0.6 1
@mt Q W 108 4096 8,0 0 7 0.7 1
@mt M W 108 4096 8,0 0 8 0.8 1
@mt M W 116 4096 8,0 0 9 0.9 1
@mt D W 92 16384 8,0 0 10 1.0 1
@mt R W 92 16384 8,0 0 11 1.1 1
@mt D W 92 16384 8,0 0 12 1.2 1
@mt C W 92 16384 8,0 0 13 1.3 1
@mt Q D 4096 1048576 8,0 1 1 2.0 2
@mt G D 4096 1048576 8,0 1 2 2.1 2
@mt Q D 6144 1048576 8,0 1 3 2.2 2
@mt D D 4096 2097152 8,0 1 4 2.3 2
@mt C D 4096 2097152 8,0 1 5 2.4 2
";
    let t = parse_blkparse(text).unwrap();
    assert_eq!(t.reissues(), 1);
    assert_eq!(t.first_issue_bytes(Dir::Write), 16384);
    assert_eq!(t.first_issue_bytes(Dir::Discard), 2 << 20);
    let (rqs, unmatched) = t.requests();
    // A discard merge fires no tracepoint: the discard's D matches no waiting request.
    assert_eq!(unmatched, 1);
    let w = &rqs[0];
    // 100 (G), 92 (front merge), 108 (back merge), then the request at 116 merged whole.
    assert_eq!(
        (w.sector, w.bytes, w.bios, w.issues, w.requeues),
        (92, 16384, 4, 2, 1)
    );
    assert_eq!(
        w.bio_extents,
        vec![(100, 4096), (92, 4096), (108, 4096), (116, 4096)]
    );
    // In the request's chain the front merge comes first.
    assert_eq!(
        w.chain,
        vec![(92, 4096), (100, 4096), (108, 4096), (116, 4096)]
    );
    assert_eq!(w.completions, 1);
    assert_eq!(
        t.count("C") - t.zero_byte_write_completions(),
        t.count("D") - t.count("R")
    );
}
