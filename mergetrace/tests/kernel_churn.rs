//! Fleet mode under churn (issue 19): `mergetrace serve` while tens of thousands of cgroups
//! are created, write one 4 KiB block each and are removed, scraped all along; and the server
//! under scrape load, slow and malformed requests, and a scrape while it detaches.
//!
//! What must hold, against the kernel's own counters: no lost event; every short-lived
//! cgroup exported under its own name (none as "(unknown cgroup id N)", none folded into
//! "(other)"), with exactly its one bio; the in-kernel maps and the server's RSS bounded
//! (numbers below) however many cgroups came and went; every series monotonic while it exists
//! and every family's sum too; at the end the sums over all series equal the /proc/diskstats
//! deltas exactly, and the removed cgroups' counts are in cgroup="(removed)".
//!
//! Needs root, BPF, loop devices, cgroup v1 blkio (v2 works too, slower: a process per
//! cgroup) and bpftool. Missing any of them is a FAILURE, never a skip. Run:
//!   cargo xtask test --test kernel_churn
//! The long variant (100,000 cgroups by default, or MERGETRACE_CHURN_CGROUPS=N) is ignored
//! by default; run it by hand with:
//!   cargo xtask test --test kernel_churn -- --ignored churn_long
mod churn;
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use churn::*;
use support::*;

/// Cgroups in the soak test: far more than the counter maps hold (1,024 slots and 1,024 hash
/// entries).
const SOAK_CGROUPS: usize = 20_000;
/// Cgroups in the long variant, unless MERGETRACE_CHURN_CGROUPS says otherwise.
const LONG_CGROUPS: usize = 100_000;
/// Writer threads, each creating its share of a round's cgroups one after the other.
pub(crate) const WRITERS: usize = 8;
/// Cgroups per writer per round. A round's cgroups are counted at the scrape after it and
/// the next (reclaimed at the one after): three rounds hold labels at once, 3 × 144 < the
/// 500 --max-cgroups, so no cgroup has to be folded into "(other)".
pub(crate) const PER_WRITER: usize = 18;
pub(crate) const BS: usize = 4096;
/// Keys in the kernel's counter maps at any scrape during the churn: three rounds' (432) and
/// the living, far below the cgroups that came and went.
const MAP_ENTRIES_BOUND: usize = 1024;
/// Growth of the server's RSS from its peak over the first half of the rounds to its peak over
/// the second half and the end. Before reclaim, ~8 KB per removed cgroup: 80 MB over the
/// second half's 10,000; a leak of 1.6 KB per cgroup still fails. Without a leak, measured
/// with a lab guest beside it: +0.3 to +4.6 MB in most runs, and a step of 9–10 MB in one run
/// of three or four (the allocator taking another arena's pages at once, not a slope).
const RSS_GROWTH_BOUND_KB: u64 = 16 << 10;
/// A bound on one HTTP exchange or a wait for the server; never an assertion on speed.
pub(crate) const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// A loop device of `size` bytes and the parent cgroup of the churn, with a limit that never
/// binds: blk-cgroup then counts the bios each cgroup submits itself
/// (blkio.throttle.io_serviced on v1), the kernel's own word on their attribution.
fn device_and_parent(size: u64) -> (LoopDevice, Cgroup) {
    require_root();
    let lo = LoopDevice::new(size);
    udev_settle();
    let parent = Cgroup::new();
    parent.set_write_iops(&lo, 10_000_000);
    (lo, parent)
}

/// The write bios the kernel charged to the churn's parent itself (see `device_and_parent`).
/// v1's io_serviced counts a cgroup's own bios. v2's io.stat also counts its descendants'
/// (and, seen on 6.1, only some of those of removed ones), so it cannot say this: there
/// mergetrace's own count for the parent (`counted`) stands in, and the checks that remain
/// are one bio per named cgroup, their sum with it, and the device's totals against diskstats.
fn parent_own_writes(parent: &Cgroup, lo: &LoopDevice, counted: u64) -> u64 {
    match parent.version() {
        CgroupVersion::V1 => parent.io_serviced(lo).write,
        CgroupVersion::V2 => counted,
    }
}

/// The write bios of a row, 0 where the cgroup has none.
fn row_writes(row: Option<&serde_json::Value>) -> u64 {
    row.map_or(0, |r| u(&r["write"], "bios"))
}

/// The cgroup path of a row, which must be a name (not "(unknown cgroup id N)").
fn cgroup_name(row: &serde_json::Value) -> &str {
    let path = row["cgroup"].as_str().unwrap();
    assert!(!path.starts_with("(unknown"), "unnamed row {row}");
    path
}

fn churn_soak(cgroups: usize) {
    let t0 = Instant::now();
    const SIZE: u64 = 64 << 20;
    let (lo, parent) = device_and_parent(SIZE);
    let server = Server::start(
        &lo,
        &[
            "--tier",
            "tracepoint",
            "--reclaim-after",
            "1ms",
            "--label-stale-after",
            "1ms",
            // The test's scrapes are the only reads: each round is read once, right after.
            "--read-every",
            "1h",
        ],
    );
    let before = lo.diskstats();
    let dev = lo.name.clone();
    let churn = Arc::new(Churn::new(&parent, &lo, SIZE));
    let pool = Pool::new(churn.clone());
    let per_round = WRITERS * PER_WRITER;
    let rounds = cgroups.div_ceil(per_round);
    let total = rounds * per_round;
    // The server's RSS climbs for its first rounds (~33 → ~51–56 MB), then barely moves
    // (+0.5 MB over the next 120, traced round by round). How long it climbs varies: a fast
    // run was still climbing after 4,176 cgroups (42.8 MB, then 53.5 at the end; a run
    // beside other work, 55.1 then 55.9), and a bound from any one round failed with nothing
    // leaking. So the second half's peak is set against the first half's: a leak grows
    // across the second half, whatever the first did.
    let half = rounds / 2;

    let mut last = server.scrape();
    // Bios of churned cgroups the kernel charged to the parent (see below).
    let mut to_parent = 0;
    let mut named: BTreeSet<String> = BTreeSet::new();
    let (mut rss_first_half, mut rss_second_half) = (0, 0);
    let (mut max_counts, mut max_slot_of) = (0, 0);
    for r in 0..rounds {
        pool.run(r);
        let m = server.scrape();
        let ctx = format!("after round {r} ({} cgroups)", (r + 1) * per_round);
        assert_monotonic(&last, &m, &ctx);
        let lost = m.lost_events();
        assert!(lost.is_empty(), "lost events {ctx}: {lost:?}");
        for label in m.cgroup_labels() {
            assert!(
                !label.starts_with("(unknown") && label != "(other)",
                "cgroup label {label:?} {ctx}: every short-lived cgroup is named and labelled"
            );
            if label.starts_with(&format!("{}/c", churn.parent_path)) {
                let bios = m.sum(
                    "mergetrace_bios_total",
                    &[("cgroup", &label), ("direction", "write")],
                );
                assert_eq!(bios, 1, "{label} wrote one block; {ctx}");
                named.insert(label);
            }
        }
        // Each round's cgroups are all in the scrape right after it, but those whose bio
        // the kernel charged to the parent: blk-cgroup falls back to the closest ancestor
        // when it cannot allocate a new cgroup's blkg at once (GFP_NOWAIT), and counts the
        // bio there (the parent's io_serviced, its own bios only).
        let missing: Vec<String> = (r * per_round..(r + 1) * per_round)
            .map(|i| churn.path_of(i))
            .filter(|p| !named.contains(p))
            .collect();
        let parent_bios = m.sum(
            "mergetrace_bios_total",
            &[("cgroup", &churn.parent_path), ("direction", "write")],
        );
        let charged = parent_own_writes(&parent, &lo, parent_bios);
        assert_eq!(parent_bios, charged, "the parent's own bios {ctx}");
        assert_eq!(
            missing.len() as u64,
            charged - to_parent,
            "{missing:?} not exported {ctx}; the kernel charged {} bios to the parent",
            charged - to_parent
        );
        to_parent = charged;
        let rss = server.rss_kb();
        if r < half {
            rss_first_half = rss_first_half.max(rss);
        } else {
            rss_second_half = rss_second_half.max(rss);
        }
        if r % 10 == 9 || r + 1 == rounds {
            let (counts, slot_of) = (server.map_entries("COUNTS"), server.map_entries("SLOT_OF"));
            max_counts = max_counts.max(counts);
            max_slot_of = max_slot_of.max(slot_of);
            assert!(
                counts <= MAP_ENTRIES_BOUND && slot_of <= MAP_ENTRIES_BOUND,
                "kernel map entries {ctx}: COUNTS {counts}, SLOT_OF {slot_of} (bound {MAP_ENTRIES_BOUND})"
            );
        }
        last = m;
    }
    pool.finish();
    let churned = t0.elapsed();

    // A long-lived cgroup created after all that gets a label of its own.
    let long = parent.child_named("long-lived");
    {
        let churn = churn.clone();
        let long_dir = long.dir.clone();
        thread::spawn(move || {
            let tid = gettid().to_string();
            if churn.v1 {
                fs::write(long_dir.join("tasks"), &tid).unwrap();
            } else {
                panic!("the long-lived writer needs v1's per-thread tasks file");
            }
            for k in 0..8u64 {
                let n = std::os::unix::fs::FileExt::write_at(
                    &churn.dev,
                    churn.block.bytes(),
                    (churn.blocks - 1 - k) * BS as u64,
                )
                .unwrap();
                assert_eq!(n, BS);
            }
            fs::write(churn.parent.join("tasks"), &tid).unwrap();
        })
        .join()
        .expect("the long-lived cgroup's writer");
    }

    // Until every churned cgroup is reclaimed and its label recycled (a bound, not a timing
    // assertion: each scrape moves them one step on).
    let deadline = Instant::now() + HTTP_TIMEOUT;
    let churn_prefix = format!("{}/c", churn.parent_path);
    let fin = loop {
        thread::sleep(Duration::from_millis(20));
        let m = server.scrape();
        assert_monotonic(&last, &m, "draining");
        let left = m
            .cgroup_labels()
            .iter()
            .filter(|l| l.starts_with(&churn_prefix))
            .count();
        last = m;
        if left == 0 {
            break server.scrape();
        }
        assert!(
            Instant::now() < deadline,
            "{left} churned cgroups still have a label {HTTP_TIMEOUT:?} after the churn"
        );
    };
    let d = lo.diskstats().since(&before);
    let on = |dir: &'static str| [("device", dev.as_str()), ("direction", dir)];
    let ctx = format!("{total} cgroups; diskstats {d:?}");
    assert_eq!(
        named.len() as u64,
        total as u64 - to_parent,
        "every churned cgroup exported by name (but {to_parent} the kernel charged to the parent)"
    );
    assert_eq!(
        fin.sum("mergetrace_lost_events_total", &[]),
        0,
        "lost events"
    );
    // The device's sums: diskstats' counts, and every bio (the churn's and the long-lived's 8).
    for (metric, dir, want) in [
        ("mergetrace_requests_total", "write", d.writes),
        ("mergetrace_merged_total", "write", d.writes_merged),
        ("mergetrace_requests_total", "read", d.reads),
        ("mergetrace_bios_total", "write", total as u64 + 8),
    ] {
        assert_eq!(fin.sum(metric, &on(dir)), want, "{metric} {dir}; {ctx}");
    }
    let removed = [
        ("device", dev.as_str()),
        ("cgroup", "(removed)"),
        ("direction", "write"),
    ];
    assert_eq!(
        fin.sum("mergetrace_bios_total", &removed),
        total as u64 - to_parent,
        "the removed cgroups' bios are in (removed); {ctx}"
    );
    let long_to_parent = parent.io_serviced(&lo).write - to_parent;
    assert_eq!(
        fin.sum(
            "mergetrace_bios_total",
            &[("cgroup", &long.path()), ("direction", "write")]
        ),
        8 - long_to_parent,
        "the long-lived cgroup has its own label; {ctx}"
    );
    // Only the living are left in the kernel maps: the long-lived cgroup's key, and any
    // reader of the device at its creation (udev).
    let (counts_end, slot_of_end) = (server.map_entries("COUNTS"), server.map_entries("SLOT_OF"));
    assert!(
        counts_end <= 4 && slot_of_end <= 4,
        "map entries left: COUNTS {counts_end}, SLOT_OF {slot_of_end}"
    );
    let rss_end = server.rss_kb().max(rss_second_half);
    // The whole text parses as the Prometheus format.
    let (_, body) = http_get(server.addr, "/metrics").unwrap();
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("the exposition parses");
    let (status, stderr) = server.stop();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    eprintln!(
        "kernel_churn: {total} cgroups in {rounds} rounds of {per_round} ({WRITERS} writers), \
         churn {:.1}s, total {:.1}s; RSS peak {rss_first_half} KiB over the first {} cgroups -> \
         {rss_end} KiB over the rest and at the end (bound +{RSS_GROWTH_BOUND_KB} KiB); map \
         entries max COUNTS {max_counts} \
         SLOT_OF {max_slot_of} (bound {MAP_ENTRIES_BOUND}), end COUNTS {counts_end} SLOT_OF \
         {slot_of_end}; lost 0; diskstats writes {} = sum of requests_total; {to_parent} bios \
         charged to the parent by blk-cgroup's fallback",
        churned.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        half * per_round,
        d.writes
    );
    assert!(
        rss_end <= rss_first_half + RSS_GROWTH_BOUND_KB,
        "RSS grew from a peak of {rss_first_half} KiB over the first {} cgroups to {rss_end} KiB \
         over the rest (bound +{RSS_GROWTH_BOUND_KB} KiB)",
        half * per_round
    );
    drop(long);
}

/// 20,000 short-lived cgroups (more than the counters map holds), scraped after every round
/// of 144.
#[test]
fn churn_of_20000_cgroups_stays_bounded_named_and_exact() {
    churn_soak(SOAK_CGROUPS);
}

/// The long variant: 100,000 cgroups (or MERGETRACE_CHURN_CGROUPS), by hand.
#[test]
#[ignore = "long: run by hand (see the module's comment)"]
fn churn_long() {
    let n = std::env::var("MERGETRACE_CHURN_CGROUPS")
        .ok()
        .map(|v| v.parse().expect("MERGETRACE_CHURN_CGROUPS is a number"))
        .unwrap_or(LONG_CGROUPS);
    churn_soak(n);
}

// ---------------------------------------------------------------------------------------
// Scrape load

/// Raw bytes to the server, then whatever it answers (or an empty answer if it closed).
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// 16 concurrent scrapers × 40 scrapes on loopback while fio writes, with slow clients
/// (a request sent a byte at a time, and one left half-sent) and malformed requests among
/// them: every scrape answers 200 with the exposition, every malformed request a 4xx or a
/// closed connection, and the server's RSS does not grow with the number of scrapes. Then a
/// stop (SIGTERM) while scrapers run: every answer that arrives is a whole 200, none a 500,
/// and the server exits 0.
#[test]
fn scrapes_under_load_bad_requests_and_a_stop() {
    require_root();
    let lo = LoopDevice::new(16 << 20);
    udev_settle();
    let server = Server::start(&lo, &["--tier", "tracepoint"]);
    run_workload(&lo, None, &["--ios", "256", "--batch", "32"]);
    let addr = server.addr;
    // Warm-up, as concurrent as the load below: the allocator's pools and arenas of every
    // thread that serves, and the first rows. What follows must then not grow the RSS.
    let warm: Vec<_> = (0..16)
        .map(|_| {
            thread::spawn(move || {
                for _ in 0..2 {
                    let (status, _) = http_get(addr, "/metrics").expect("warm-up scrape");
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for w in warm {
        w.join().expect("a warm-up scraper failed");
    }
    let rss_before = server.rss_kb();

    // A client that sends half a request and keeps the connection open all along.
    let mut stalled = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
    stalled.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();

    const SCRAPERS: usize = 16;
    const EACH: usize = 40;
    let scrape_load = || -> Vec<thread::JoinHandle<()>> {
        (0..SCRAPERS)
            .map(|_| {
                thread::spawn(move || {
                    for i in 0..EACH {
                        let (status, body) = http_get(addr, "/metrics")
                            .unwrap_or_else(|e| panic!("scrape {i}: {e}"));
                        assert_eq!(status, 200, "{body}");
                        assert!(body.contains("# TYPE mergetrace_bios_total counter"));
                        assert!(
                            body.ends_with("# EOF\n") || body.contains("mergetrace_cgroups_folded")
                        );
                    }
                })
            })
            .collect()
    };
    let scrapers = scrape_load();
    // Meanwhile: a slow client, a byte every 5 ms, gets its answer.
    let slow = thread::spawn(move || {
        let mut s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).unwrap();
        s.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" {
            s.write_all(&[*b]).unwrap();
            thread::sleep(Duration::from_millis(5));
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200"),
            "{}",
            &out[..out.len().min(200)]
        );
    });
    let bad: [&[u8]; 7] = [
        b"GARBAGE\r\n\r\n",
        b"GET /metrics HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"\x00\xff\x13\x37 binary junk\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc",
        b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
    ];
    let long_header = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    for round in 0..5 {
        for req in bad.iter().copied().chain([long_header.as_bytes()]) {
            let answer = raw_exchange(addr, req);
            let status: Option<u16> = answer
                .strip_prefix("HTTP/1.1 ")
                .and_then(|r| r.get(..3)?.parse().ok());
            // A client error (or 505 for the unknown version), or the connection closed;
            // never the server's own failure.
            assert!(
                answer.is_empty() || status.is_some_and(|s| (400..=505).contains(&s) && s != 500),
                "round {round}: {:?} answered {:?}",
                String::from_utf8_lossy(&req[..req.len().min(60)]),
                &answer[..answer.len().min(200)]
            );
        }
    }
    for s in scrapers {
        s.join().expect("a scraper failed");
    }
    slow.join().expect("the slow client failed");
    // Still counting right after all that.
    let m = server.scrape();
    assert_eq!(
        m.sum(
            "mergetrace_bios_total",
            &[("device", lo.name.as_str()), ("direction", "write")]
        ),
        256
    );
    for _ in 0..20 {
        server.scrape();
    }
    let rss_loaded = server.rss_kb();
    // The same load again: what a leak costs grows with every round of scrapes, while what
    // many concurrent scrapes hold at their peak, and an allocator's arenas warming up (more
    // on a slow, crowded machine), does not. So up to three more rounds, until one holds
    // still: a leak of 3.2 KiB a scrape or more grows every one of them.
    let held_still = |growth: &[i64]| growth.last().is_some_and(|g| *g <= 2048);
    let mut growth = Vec::new();
    let mut rss = rss_loaded;
    for _ in 0..3 {
        for s in scrape_load() {
            s.join().expect("a scraper failed");
        }
        let now = server.rss_kb();
        growth.push(now as i64 - rss as i64);
        rss = now;
        if held_still(&growth) {
            break;
        }
    }
    eprintln!(
        "kernel_churn: {} scrapes by {SCRAPERS} scrapers, 40 bad requests, a slow and a stalled client: RSS {rss_before} -> {rss_loaded} KiB; then by {growth:?} KiB a round of {} more",
        SCRAPERS * EACH,
        SCRAPERS * EACH
    );
    assert!(
        rss_loaded <= rss_before + 8192,
        "RSS grew from {rss_before} KiB to {rss_loaded} KiB over {} scrapes",
        SCRAPERS * EACH
    );
    assert!(
        held_still(&growth),
        "RSS grew by {growth:?} KiB in three more rounds of {} scrapes each: a leak",
        SCRAPERS * EACH
    );

    // A stop while scrapers run: no error answer, whatever the moment.
    let stop_scrapers: Vec<_> = (0..4)
        .map(|_| {
            thread::spawn(move || {
                let mut ok = 0;
                loop {
                    match http_get(addr, "/metrics") {
                        Ok((200, body)) => {
                            assert!(body.contains("mergetrace_cgroups_folded"), "cut body");
                            ok += 1;
                        }
                        Ok((status, body)) => panic!("a scrape during the stop: {status} {body}"),
                        Err(_) => return ok, // refused or closed: the server is gone
                    }
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    drop(stalled);
    let (status, stderr) = server.stop();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(stderr.contains("programs detached"), "{stderr}");
    let answered: usize = stop_scrapers
        .into_iter()
        .map(|t| t.join().expect("a scraper during the stop failed"))
        .sum();
    assert!(answered > 0, "no scrape answered before the stop");
}

// ---------------------------------------------------------------------------------------
// The live view under churn

/// Every cgroup row of a live-view object (interval or total) on `dev`.
fn rows<'a>(snapshot: &'a serde_json::Value, dev: &BlockDev) -> Vec<&'a serde_json::Value> {
    snapshot["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter(|d| d["major"] == dev.major && d["minor"] == dev.minor)
        .flat_map(|d| d["cgroups"].as_array().expect("cgroups").iter())
        .collect()
}

/// A row's `--latency` count of `stage` (queue, device) in direction `dir`.
fn latency_count(row: &serde_json::Value, dir: &str, stage: &str) -> u64 {
    u(&row[dir]["latency"][stage]["all"], "count")
}

/// The live view with `--latency` (100 ms intervals, reclaim after 200 ms) while 3 rounds of
/// 144 short-lived cgroups come and go: each is named in the intervals with exactly its one
/// bio, none is "(unknown cgroup id N)", the intervals add up to the total (a reclaimed
/// cgroup's counts and latency are not new in "(removed)"), the total equals
/// /proc/diskstats, and every row's latency counts equal its requests: a reclaimed cgroup's
/// histograms follow its counters into "(removed)", slot by slot.
#[test]
fn live_view_names_short_lived_cgroups_and_intervals_add_up() {
    const SIZE: u64 = 16 << 20;
    let (lo, parent) = device_and_parent(SIZE);
    let tracer = Tracer::start(&[
        "-d",
        lo.name.as_str(),
        "--interval",
        "100ms",
        "--reclaim-after",
        "200ms",
        "--latency",
    ]);
    let before = lo.diskstats();
    let churn = Arc::new(Churn::new(&parent, &lo, SIZE));
    let pool = Pool::new(churn.clone());
    const ROUNDS: usize = 3;
    for r in 0..ROUNDS {
        pool.run(r);
        // Let intervals pass, so that reclaims happen between and during the rounds.
        thread::sleep(Duration::from_millis(500));
    }
    pool.finish();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    let to_parent = parent_own_writes(
        &parent,
        &lo,
        row_writes(out.cgroup_row(&lo, &parent.path())),
    );
    assert_eq!(out.lost_events(), 0);
    let mut bios_of: BTreeMap<String, u64> = BTreeMap::new();
    // Each churned cgroup's (queue, device) latency counts in the intervals.
    let mut timed_of: BTreeMap<String, [u64; 2]> = BTreeMap::new();
    for row in rows(&out.total, &lo) {
        cgroup_name(row);
    }
    for i in &out.intervals {
        for row in rows(i, &lo) {
            let path = cgroup_name(row);
            if path.starts_with(&format!("{}/c", churn.parent_path)) {
                *bios_of.entry(path.to_string()).or_default() += u(&row["write"], "bios");
                let timed = timed_of.entry(path.to_string()).or_default();
                timed[0] += latency_count(row, "write", "queue");
                timed[1] += latency_count(row, "write", "device");
            }
        }
    }
    let total = ROUNDS * WRITERS * PER_WRITER;
    for i in 0..total {
        let p = churn.path_of(i);
        let n = bios_of.get(&p).copied().unwrap_or(0);
        assert!(
            n == 1 || (n == 0 && to_parent > 0),
            "{p}: {n} bios in the intervals (the kernel charged {to_parent} to the parent)"
        );
        let timed = timed_of.get(&p).copied().unwrap_or_default();
        assert_eq!(timed, [n, n], "{p}: its request's queue and device latency");
    }
    assert_eq!(
        bios_of.values().sum::<u64>(),
        total as u64 - to_parent,
        "one bio per cgroup, but those the kernel charged to the parent"
    );
    let t = out.device_total(&lo);
    for field in ["bios", "requests", "merged"] {
        assert_eq!(
            out.interval_sum(&lo, "write", field),
            u(&t["write"], field),
            "intervals add up to the total ({field})"
        );
    }
    assert_eq!(u(&t["write"], "requests"), d.writes, "diskstats {d:?}");
    assert_eq!(u(&t["write"], "merged"), d.writes_merged, "diskstats {d:?}");
    assert_eq!(u(&t["write"], "bios"), total as u64);
    // The whole run keeps each reclaimed cgroup's row under its own name: its one bio, as in
    // the intervals (only what is counted after a reclaim would stay in "(removed)").
    let mut kept_bios: BTreeMap<String, u64> = BTreeMap::new();
    for row in rows(&out.total, &lo) {
        let path = cgroup_name(row);
        if path.starts_with(&format!("{}/c", churn.parent_path)) {
            let n = u(&row["write"], "bios");
            if n > 0 {
                kept_bios.insert(path.to_string(), n);
            }
        }
    }
    bios_of.retain(|_, n| *n > 0);
    assert_eq!(
        kept_bios, bios_of,
        "the total's rows of the churned cgroups"
    );
    // Each churned cgroup's request completed before its removal, so before its reclaim:
    // every row, (removed) too, holds the latency of exactly its own requests.
    for row in rows(&out.total, &lo) {
        for dir in ["read", "write"] {
            for stage in ["queue", "device"] {
                assert_eq!(
                    latency_count(row, dir, stage),
                    u(&row[dir], "requests"),
                    "{dir} latency.{stage} count == requests; {row}"
                );
            }
        }
    }
    // The intervals add up to the total: each cgroup's latency is new once, under its own
    // row, not again in (removed) when it is reclaimed.
    for stage in ["queue", "device"] {
        let in_intervals: u64 = out
            .intervals
            .iter()
            .flat_map(|i| rows(i, &lo))
            .map(|r| latency_count(r, "write", stage))
            .sum();
        let in_total: u64 = rows(&out.total, &lo)
            .into_iter()
            .map(|r| latency_count(r, "write", stage))
            .sum();
        assert_eq!(
            in_intervals, in_total,
            "write latency.{stage}: the intervals add up to the total"
        );
        assert_eq!(in_total, d.writes, "write latency.{stage}: diskstats {d:?}");
    }
    eprintln!(
        "kernel_churn: live view, {total} cgroups, {} intervals, {} kept rows, {to_parent} charged to the parent",
        out.intervals.len(),
        kept_bios.len()
    );
}

/// Churn faster than the reads (issue 46): more new cgroups between two reads than the counter
/// maps hold (1,024 slots, 1,024 hash entries; the live view's one read is at its end). No bio
/// is lost: those whose cgroup found no room count in the device's "(unattributed)" row, and
/// the rows together equal /proc/diskstats.
#[test]
fn churn_faster_than_the_reads_loses_no_bio() {
    const SIZE: u64 = 16 << 20;
    let (lo, parent) = device_and_parent(SIZE);
    let tracer = Tracer::start(&["-d", lo.name.as_str(), "--interval", "1h"]);
    let before = lo.diskstats();
    let churn = Arc::new(Churn::new(&parent, &lo, SIZE));
    let pool = Pool::new(churn.clone());
    // 1,440 cgroups: the slots go to the first keys while their hash entries stay until a
    // read moves them, so the others find both maps full.
    const ROUNDS: usize = 10;
    for r in 0..ROUNDS {
        pool.run(r);
    }
    pool.finish();
    let d = lo.diskstats().since(&before);
    let out = tracer.stop();
    assert_eq!(out.lost_events(), 0);
    let total = (ROUNDS * WRITERS * PER_WRITER) as u64;
    let t = out.device_total(&lo);
    assert_eq!(u(&t["write"], "bios"), total, "every bio counted");
    assert_eq!(u(&t["write"], "requests"), d.writes, "{d:?}");
    let unattributed = row_writes(out.cgroup_row(&lo, "(unattributed)"));
    assert!(
        unattributed > 0 && unattributed < total,
        "(unattributed) {unattributed} of {total} bios: the maps should have filled"
    );
    // The cgroups that found room have their own row, with their one bio.
    let mut named = 0;
    for row in rows(&out.total, &lo) {
        if cgroup_name(row).starts_with(&format!("{}/c", churn.parent_path)) {
            assert_eq!(u(&row["write"], "bios"), 1, "{row}");
            named += 1;
        }
    }
    assert!(named >= 1000, "{named} cgroups named");
    eprintln!(
        "kernel_churn: {total} cgroups before one read: {named} named, {unattributed} bios \
         unattributed, the rest the parent's"
    );
}

/// `serve` with its default flags (a read a second, removed cgroups reclaimed 5 s after, or at
/// once when half the slots are taken) while 17,280 cgroups come and go as fast as this
/// machine makes them, nothing scraping until the end: no bio lost, the sums equal
/// /proc/diskstats.
#[test]
fn churn_at_full_speed_with_default_flags_loses_no_bio() {
    const SIZE: u64 = 16 << 20;
    let (lo, parent) = device_and_parent(SIZE);
    let server = Server::start(&lo, &["--tier", "tracepoint"]);
    let before = lo.diskstats();
    let churn = Arc::new(Churn::new(&parent, &lo, SIZE));
    let pool = Pool::new(churn.clone());
    const ROUNDS: usize = 120;
    let t0 = Instant::now();
    for r in 0..ROUNDS {
        pool.run(r);
    }
    pool.finish();
    let secs = t0.elapsed().as_secs_f64();
    let d = lo.diskstats().since(&before);
    // Past a read (a second), so that the last cgroups are read too.
    thread::sleep(Duration::from_secs(2));
    let m = server.scrape();
    let lost = m.lost_events();
    assert!(lost.is_empty(), "lost events: {lost:?}");
    let dev = [("device", lo.name.as_str()), ("direction", "write")];
    let total = (ROUNDS * WRITERS * PER_WRITER) as u64;
    assert_eq!(
        m.sum("mergetrace_bios_total", &dev),
        total,
        "every bio counted"
    );
    assert_eq!(m.sum("mergetrace_requests_total", &dev), d.writes, "{d:?}");
    let unattributed = m.sum(
        "mergetrace_bios_total",
        &[dev[0], dev[1], ("cgroup", "(unattributed)")],
    );
    eprintln!(
        "kernel_churn: {total} cgroups in {secs:.1} s ({:.0} a second), default flags: \
         {unattributed} bios unattributed",
        total as f64 / secs
    );
    let (status, stderr) = server.stop();
    assert!(status.success(), "{stderr}");
}

/// A capture while a round of 144 short-lived cgroups comes and goes: `report` names every one
/// (from its birth report: each was gone before the interval's lookup), with its one bio.
#[test]
fn captures_name_short_lived_cgroups() {
    const SIZE: u64 = 16 << 20;
    let (lo, parent) = device_and_parent(SIZE);
    let cap = PathBuf::from(format!("/dev/shm/{}.mtcap", unique_name()));
    let rec = Recorder::start_with(&lo, &cap, &["--interval", "100ms"]);
    let churn = Arc::new(Churn::new(&parent, &lo, SIZE));
    let pool = Pool::new(churn.clone());
    pool.run(0);
    pool.finish();
    thread::sleep(Duration::from_millis(300)); // an interval or two: the names are written
    rec.stop();
    let out = mergetrace(&["report", cap.to_str().unwrap(), "--json"]);
    let _ = fs::remove_file(&cap);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one object");
    assert_eq!(report["lost_events"], 0);
    let parent_row = rows(&report, &lo)
        .into_iter()
        .find(|r| r["cgroup"] == churn.parent_path.as_str());
    let to_parent = parent_own_writes(&parent, &lo, row_writes(parent_row));
    let mut named = 0;
    for row in rows(&report, &lo) {
        let path = cgroup_name(row);
        if path.starts_with(&format!("{}/c", churn.parent_path)) {
            assert_eq!(u(&row["write"], "bios"), 1, "{row}");
            named += 1;
        }
    }
    assert_eq!(
        named,
        WRITERS * PER_WRITER - to_parent as usize,
        "every short-lived cgroup named (but {to_parent} the kernel charged to the parent)"
    );
}
