//! The conformance workloads ([`Kind`]), prepared and run, and the claims each makes about
//! the disk's counters.

use std::path::PathBuf;

use super::*;

/// The conformance workloads. See each driver for what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`buffered_then_sync`], then umount.
    BufferedSync,
    /// [`fsync_per_write`], then umount.
    FsyncPerWrite,
    /// [`fdatasync_per_write`] (overwrites), then umount.
    FdatasyncPerWrite,
    /// [`o_dsync_writes`], then umount.
    ODsync,
    /// [`small_files`], then umount.
    SmallFiles,
    /// [`fstrim`], then umount.
    Fstrim,
    /// [`write_zeroes`] on the raw device (no filesystem).
    WriteZeroes,
    /// [`dd`] and a few small files, nothing synced: umount writes it all.
    Umount,
    /// [`sqlite`] with journal_mode=WAL, then umount.
    SqliteWal,
    /// [`sqlite`] with journal_mode=DELETE, then umount.
    SqliteDelete,
    /// [`Postgres::pgbench_inserts`], the server stopped, then umount.
    Postgres,
    /// [`copy_tree`], then umount.
    CopyTree,
    /// [`randwrite_direct`] on the raw device: 4 KiB O_DIRECT random writes, iodepth 32.
    RandWriteDirect,
    /// [`sqlite_bulk`]: one big transaction (WAL, synchronous=FULL), then umount.
    SqliteBulk,
    /// On the raw device, [`direct_64k_writes`] (64 KiB O_DIRECT writes, one at a time), then
    /// [`blkdiscard`] of one large range after them: a write and a discard workload, told
    /// apart by direction.
    Direct64kAndBlkdiscard,
    /// [`pwritev_scattered`] on the raw device: one O_DIRECT pwritev of many separate 4 KiB
    /// buffers per call, more of them than the device's max_segments.
    PwritevScattered,
    /// [`two_jobs_on_ext4`]: two fio jobs on two CPUs, O_DIRECT at iodepth 32 each, into
    /// files of their own on ext4, fsync'ed, then umount.
    TwoJobsOnExt4,
}

/// A workload ready to run: its filesystem mounted, its files and server in place.
pub struct Prepared {
    pub kind: Kind,
    /// Where the raw-device workloads write (the test disk's node).
    dev: PathBuf,
    dev_info: BlockDev,
    pub fs: Option<Ext4>,
    pub pg: Option<Postgres>,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::BufferedSync => "buffered writes + sync",
            Kind::FsyncPerWrite => "write + fsync",
            Kind::FdatasyncPerWrite => "overwrite + fdatasync",
            Kind::ODsync => "O_DSYNC writes",
            Kind::SmallFiles => "small files + syncfs",
            Kind::Fstrim => "fstrim",
            Kind::WriteZeroes => "write zeroes",
            Kind::Umount => "umount of dirty data",
            Kind::SqliteWal => "sqlite WAL",
            Kind::SqliteDelete => "sqlite DELETE journal",
            Kind::Postgres => "postgres pgbench inserts",
            Kind::CopyTree => "cp -a + sync",
            Kind::RandWriteDirect => "fio 4k randwrite O_DIRECT iodepth 32",
            Kind::SqliteBulk => "sqlite bulk insert, one transaction",
            Kind::Direct64kAndBlkdiscard => "64 KiB O_DIRECT writes, then blkdiscard of one range",
            Kind::PwritevScattered => "O_DIRECT pwritev of scattered 4 KiB buffers",
            Kind::TwoJobsOnExt4 => "fio 2 jobs on 2 CPUs, O_DIRECT iodepth 32, files on ext4",
        }
    }

    /// Whether the workload runs on the raw device (no filesystem made or mounted).
    pub fn raw(self) -> bool {
        matches!(
            self,
            Kind::WriteZeroes
                | Kind::RandWriteDirect
                | Kind::Direct64kAndBlkdiscard
                | Kind::PwritevScattered
        )
    }

    /// Sizes: a few seconds on the host, smaller in the ~10x slower lab guests.
    fn count(self) -> u64 {
        match self {
            Kind::BufferedSync => scaled(64 << 20, 16 << 20),
            Kind::FsyncPerWrite | Kind::FdatasyncPerWrite | Kind::ODsync => scaled(200, 50),
            Kind::SmallFiles => scaled(2000, 300),
            Kind::WriteZeroes => scaled(64 << 20, 16 << 20),
            Kind::Umount => scaled(32 << 20, 8 << 20),
            Kind::SqliteWal | Kind::SqliteDelete => scaled(300, 50),
            Kind::Postgres => scaled(200, 25),
            Kind::CopyTree => scaled(3000, 300),
            Kind::Fstrim => 0,
            // 4 KiB I/Os (per job for TwoJobsOnExt4).
            // (Lab: 500 still requeues hundreds of times on vdc; the tracer's attach, not
            // the workload, is most of a window there.)
            Kind::RandWriteDirect => scaled(4096, 500),
            Kind::TwoJobsOnExt4 => scaled(4096, 500),
            // Rows of 1000 random bytes.
            Kind::SqliteBulk => scaled(16384, 4096),
            // 64 KiB writes; the discard is 4 times their bytes (below).
            Kind::Direct64kAndBlkdiscard => scaled(1024, 64),
            // pwritev calls.
            Kind::PwritevScattered => scaled(64, 16),
        }
    }

    /// Everything before the measured window. Ends with the disk quiet.
    pub fn prepare(self, dev: &BlockDev, cg: Option<&Cgroup>) -> Prepared {
        let mut p = Prepared {
            kind: self,
            dev: dev.path.clone(),
            dev_info: BlockDev {
                name: dev.name.clone(),
                path: dev.path.clone(),
                major: dev.major,
                minor: dev.minor,
                size: dev.size,
            },
            fs: None,
            pg: None,
        };
        match self {
            Kind::WriteZeroes => {
                require_write_zeroes(dev);
                require_tool("fallocate");
            }
            Kind::PwritevScattered => {
                python3();
            }
            Kind::Direct64kAndBlkdiscard => {
                require_discard(dev);
                require_tool("blkdiscard");
            }
            _ if self.raw() => {}
            _ => {
                let fs = Ext4::new(dev);
                match self {
                    Kind::FdatasyncPerWrite => prepare_overwrite(&fs, self.count()),
                    Kind::Fstrim => prepare_fstrim(&fs, dev),
                    Kind::SqliteWal | Kind::SqliteDelete | Kind::SqliteBulk => {
                        require_tool("sqlite3");
                    }
                    Kind::Postgres => {
                        let mut pg = Postgres::init(&fs);
                        fs.sync();
                        pg.start(cg);
                        pg.psql(
                            "CREATE TABLE conformance(id serial PRIMARY KEY, v text); CHECKPOINT;",
                            cg,
                        );
                        p.pg = Some(pg);
                    }
                    _ => {}
                }
                fs.sync();
                p.fs = Some(fs);
            }
        }
        quiesce(dev);
        p
    }
}

impl Prepared {
    /// The measured part: the workload, then (filesystem workloads) the unmount.
    pub fn run(&mut self, cg: Option<&Cgroup>) -> Did {
        let n = self.kind.count();
        let dev = &self.dev_info;
        match self.kind {
            Kind::WriteZeroes => return write_zeroes(dev, cg, n),
            Kind::RandWriteDirect => return randwrite_direct(dev, cg, n),
            Kind::Direct64kAndBlkdiscard => {
                let w = direct_64k_writes(dev, cg, n);
                // After the writes, on a 1 MiB boundary.
                let at = (n << 16).next_multiple_of(1 << 20);
                return w + blkdiscard(dev, cg, at, n << 18);
            }
            Kind::PwritevScattered => return pwritev_scattered(dev, cg, n),
            _ => {}
        }
        let fs = self
            .fs
            .as_ref()
            .expect("a filesystem workload has a filesystem");
        let did = match self.kind {
            Kind::BufferedSync => buffered_then_sync(fs, cg, n),
            Kind::FsyncPerWrite => fsync_per_write(fs, cg, n),
            Kind::FdatasyncPerWrite => fdatasync_per_write(fs, cg, n),
            Kind::ODsync => o_dsync_writes(fs, cg, n),
            Kind::SmallFiles => small_files(fs, cg, n),
            Kind::Fstrim => fstrim(fs, cg),
            Kind::Umount => {
                let d = dd(fs, cg, "dirty", n);
                let files = small_files_unsynced(fs, cg, scaled(200, 50));
                d + files
            }
            Kind::SqliteWal => sqlite(fs, cg, "WAL", n),
            Kind::SqliteDelete => sqlite(fs, cg, "DELETE", n),
            Kind::Postgres => {
                let pg = self.pg.as_mut().expect("prepared with a server");
                let did = pg.pgbench_inserts(cg, 2, n);
                pg.stop(cg);
                did
            }
            Kind::CopyTree => copy_tree(fs, cg, n),
            Kind::SqliteBulk => sqlite_bulk(fs, cg, n),
            Kind::TwoJobsOnExt4 => two_jobs_on_ext4(fs, cg, n),
            _ => unreachable!("{} runs on the raw device", self.kind.name()),
        };
        did + self.fs.as_mut().unwrap().unmount(cg)
    }

    /// What the workload claims it made the disk do, checked against the /proc/diskstats
    /// deltas of its window; the failures, empty when it did what it says.
    // Long (~180 lines) on purpose: one arm per [`Kind`], the claims table itself.
    pub fn check_claims(&self, did: &Did, d: &DiskStats) -> Vec<String> {
        let mut bad = Vec::new();
        let mut claim = |ok: bool, what: &str| {
            if !ok {
                bad.push(format!(
                    "{}: {what}; did {did}; diskstats {d:?}",
                    self.kind.name()
                ));
            }
        };
        let written = d.sectors_written * 512;
        // A disk without a volatile cache (write through: null_blk, a loop device switched
        // to it) gets no flushes at all: submit_bio_noacct drops PREFLUSH/FUA and ends an
        // empty flush bio before it is queued. The flush claims below are for write back.
        let write_back = self.dev_info.queue_attr("write_cache") == "write back";
        if !write_back {
            claim(d.flushes == 0, "flush requests on a write-through disk");
        }
        match self.kind {
            Kind::BufferedSync | Kind::Umount | Kind::CopyTree => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the files hold",
                );
            }
            Kind::FsyncPerWrite | Kind::ODsync if !write_back => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
            }
            Kind::FsyncPerWrite | Kind::ODsync => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
                claim(
                    d.flushes >= did.syncs,
                    "fewer flushes than syncs (each commits the journal)",
                );
            }
            Kind::FdatasyncPerWrite => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the writes",
                );
                claim(d.flushes >= did.syncs, "fewer flushes than fdatasyncs");
                // Every fdatasync sent data + an empty flush: more completed writes than the
                // 4 KiB writes could make as requests alone (they do not merge: one per sync).
                claim(d.writes > did.writes, "no flush-only writes counted");
            }
            Kind::SmallFiles => {
                claim(
                    written >= did.files * 4096,
                    "less than a block per file written",
                );
                claim(d.flushes >= 1, "syncfs sent no flush");
            }
            Kind::Fstrim => {
                claim(did.trimmed > 0, "fstrim trimmed nothing");
                claim(
                    d.sectors_discarded * 512 == did.trimmed,
                    "discarded sectors != the bytes fstrim reports",
                );
            }
            Kind::WriteZeroes => {
                claim(written == did.zeroed, "sectors written != the bytes zeroed");
                // Zero pages would take at least zeroed / max_sectors_kb requests; write zeroes
                // take zeroed / write_zeroes_max_bytes (+ an empty flush).
                let max_wz: u64 = self
                    .dev_info
                    .queue_attr("write_zeroes_max_bytes")
                    .parse()
                    .unwrap_or(1);
                claim(
                    d.writes <= did.zeroed.div_ceil(max_wz.max(1)) + 2,
                    "too many write requests for write zeroes (zero pages written instead?)",
                );
            }
            Kind::SqliteWal | Kind::SqliteDelete => {
                claim(
                    d.flushes >= did.transactions,
                    "fewer flushes than commits (synchronous=FULL)",
                );
            }
            Kind::Postgres => {
                claim(d.flushes >= 1, "no flush");
                claim(written > 0, "nothing written");
            }
            Kind::SqliteBulk => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the rows hold",
                );
                if self.dev_info.queue_attr("write_cache") == "write back" {
                    claim(
                        d.flushes >= 1,
                        "no flush (synchronous=FULL fsyncs at the commit)",
                    );
                }
            }
            // O_DIRECT on the raw device, nothing else writing: every byte once.
            Kind::RandWriteDirect => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes fio wrote",
                );
            }
            Kind::TwoJobsOnExt4 => {
                claim(
                    written >= did.bytes_written,
                    "fewer bytes written than the two jobs wrote",
                );
                if write_back {
                    claim(
                        d.flushes >= 1,
                        "no flush (each job fsyncs its file at the end)",
                    );
                }
            }
            Kind::Direct64kAndBlkdiscard => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes fio wrote",
                );
                // Each 64 KiB bio is split into max_sectors_kb pieces, each a request of the
                // largest size allowed, so none can merge with another.
                let max_kb: u64 = self
                    .dev_info
                    .queue_attr("max_sectors_kb")
                    .parse()
                    .unwrap_or(0);
                let pieces = (64u64).div_ceil(max_kb.max(1));
                claim(
                    d.writes == did.writes * pieces,
                    &format!(
                        "write requests != {} writes x {pieces} pieces (max_sectors_kb {max_kb})",
                        did.writes
                    ),
                );
                claim(d.writes_merged == 0, "pieces of the largest size merged");
                claim(
                    d.sectors_discarded * 512 == did.discarded,
                    "discarded sectors != the range blkdiscard discarded",
                );
                // One bio (the block layer makes bios of up to 4 GiB), split into pieces of
                // discard_max_bytes: each piece became a request or merged into one.
                let max: u64 = self
                    .dev_info
                    .queue_attr("discard_max_bytes")
                    .parse()
                    .unwrap_or(0);
                let pieces = did.discarded.div_ceil(max.max(1));
                claim(
                    d.discards + d.discards_merged == pieces,
                    &format!(
                        "discard requests + merges != {pieces} pieces of discard_max_bytes {max}"
                    ),
                );
            }
            Kind::PwritevScattered => {
                claim(
                    written == did.bytes_written,
                    "sectors written != the bytes pwritev wrote",
                );
                claim(
                    d.writes >= 2 * did.writes,
                    "fewer than 2 write requests per pwritev: its bio was not split by max_segments",
                );
            }
        }
        claim(
            d.in_flight == 0,
            "I/O still in flight at the end of the window",
        );
        bad
    }
}

/// `n` 512-byte files, not synced.
fn small_files_unsynced(fs: &Ext4, cg: Option<&Cgroup>, n: u64) -> Did {
    let d = fs.dir("unsynced", None);
    let script = format!(
        "cd '{}' && i=0 && while [ $i -lt {n} ]; do i=$((i+1)); printf '%0512d' $i > f$i; done",
        d.display()
    );
    run(sh(&script), cg, None);
    Did {
        writes: n,
        bytes_written: n * 512,
        files: n,
        ..Did::default()
    }
}

/// Whether these workloads run in the lab (the guests are slower: sizes are smaller).
pub fn in_guest() -> bool {
    in_lab()
}
