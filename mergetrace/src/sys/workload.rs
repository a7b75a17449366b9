//! A built-in I/O workload, so `demo` and the tests need no fio: sequential O_DIRECT I/O of a
//! fixed block size, submitted in batches with one `io_submit` call each (Linux native AIO,
//! straight syscalls). A batch submitted in one call is submitted under one plug — the
//! condition for plug merging — and the whole batch is reaped before the next one, like fio's
//! `iodepth_batch_submit=N` with `iodepth_batch_complete_min=N`.
use std::{fs::OpenOptions, os::fd::AsRawFd, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::{anyhow, bail, Context, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Ascending offsets within each batch: back merges.
    Forward,
    /// Descending offsets within each batch: front merges.
    Reverse,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub op: Op,
    pub block_bytes: usize,
    /// Number of I/Os in all.
    pub ios: u64,
    /// I/Os per `io_submit` call (and reaped together).
    pub batch: usize,
    pub order: Order,
    /// Byte offset where the sequential range starts.
    pub start: u64,
}

/// What the workload did, for checking against the kernel's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Done {
    pub ios: u64,
    pub bytes: u64,
    pub submit_calls: u64,
}

// Linux AIO ABI (include/uapi/linux/aio_abi.h), x86_64 little-endian layout.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Iocb {
    aio_data: u64,
    aio_key: u32,
    aio_rw_flags: i32,
    aio_lio_opcode: u16,
    aio_reqprio: i16,
    aio_fildes: u32,
    aio_buf: u64,
    aio_nbytes: u64,
    aio_offset: i64,
    aio_reserved2: u64,
    aio_flags: u32,
    aio_resfd: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;

/// An AIO context, destroyed on drop.
struct AioContext(libc::c_ulong);

impl AioContext {
    fn new(depth: usize) -> Result<AioContext> {
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes the context id into `ctx`.
        let r = unsafe { libc::syscall(libc::SYS_io_setup, depth as libc::c_long, &mut ctx) };
        if r != 0 {
            bail!(
                "io_setup({depth}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(AioContext(ctx))
    }

    /// One `io_submit` of `iocbs`; how many the kernel took.
    fn submit(&self, iocbs: &mut [*mut Iocb]) -> std::io::Result<usize> {
        // SAFETY: the iocbs are live and their buffers outlive the I/O (the caller reaps it).
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                self.0,
                iocbs.len() as libc::c_long,
                iocbs.as_mut_ptr(),
            )
        };
        Self::count(r)
    }

    /// One `io_getevents` that waits for all of `events` to be filled in; how many were.
    fn reap(&self, events: &mut [IoEvent]) -> std::io::Result<usize> {
        let n = events.len() as libc::c_long;
        // SAFETY: events has room for n entries.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_getevents,
                self.0,
                n,
                n,
                events.as_mut_ptr(),
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        Self::count(r)
    }

    /// A syscall's count, or the error it set.
    fn count(r: libc::c_long) -> std::io::Result<usize> {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

impl Drop for AioContext {
    fn drop(&mut self) {
        // SAFETY: the context was created by io_setup and is destroyed once.
        unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
    }
}

/// A page-aligned buffer for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096)?;
        // SAFETY: non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("cannot allocate {len} bytes");
        }
        Ok(AlignedBuf { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Runs `w` on `path` (a block device or file) and returns what it did.
pub fn run(path: &Path, w: &Workload) -> Result<Done> {
    if w.batch == 0 || w.block_bytes == 0 || !w.block_bytes.is_multiple_of(512) {
        bail!("workload needs a batch ≥ 1 and a block size that is a multiple of 512");
    }
    let file = OpenOptions::new()
        .read(true)
        .write(w.op == Op::Write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("cannot open {} for O_DIRECT I/O", path.display()))?;
    let fd = file.as_raw_fd();
    let ctx = AioContext::new(w.batch)?;
    // One buffer per slot of a batch: the data is irrelevant, the sizes and offsets matter.
    let buf = AlignedBuf::new(w.block_bytes * w.batch)?;
    let mut iocbs = vec![Iocb::default(); w.batch];
    let mut events = vec![IoEvent::default(); w.batch];
    let mut done = Done::default();
    let mut next = 0u64;
    while next < w.ios {
        let n = (w.ios - next).min(w.batch as u64) as usize;
        for (i, cb) in iocbs.iter_mut().take(n).enumerate() {
            let slot = match w.order {
                Order::Forward => i as u64,
                Order::Reverse => (n - 1 - i) as u64,
            };
            *cb = Iocb {
                aio_data: i as u64,
                aio_lio_opcode: if w.op == Op::Write {
                    IOCB_CMD_PWRITE
                } else {
                    IOCB_CMD_PREAD
                },
                aio_fildes: fd as u32,
                // SAFETY: slot < batch, inside the buffer.
                aio_buf: unsafe { buf.ptr.add(i * w.block_bytes) } as u64,
                aio_nbytes: w.block_bytes as u64,
                aio_offset: (w.start + (next + slot) * w.block_bytes as u64) as i64,
                ..Iocb::default()
            };
        }
        let mut ptrs: Vec<*mut Iocb> = iocbs.iter_mut().take(n).map(|c| c as *mut Iocb).collect();
        let mut submitted = 0usize;
        while submitted < n {
            submitted += ctx
                .submit(&mut ptrs[submitted..])
                .map_err(|e| anyhow!("io_submit failed: {e}"))?;
            done.submit_calls += 1;
        }
        let mut reaped = 0usize;
        while reaped < n {
            let r = match ctx.reap(&mut events[reaped..n]) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => bail!("io_getevents failed: {e}"),
            };
            for ev in &events[reaped..reaped + r] {
                if ev.res < 0 {
                    bail!(
                        "I/O failed: {}",
                        std::io::Error::from_raw_os_error(-ev.res as i32)
                    );
                }
                done.bytes += ev.res as u64;
            }
            reaped += r;
        }
        done.ios += n as u64;
        next += n as u64;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes() {
        assert_eq!(std::mem::size_of::<Iocb>(), 64);
        assert_eq!(std::mem::size_of::<IoEvent>(), 32);
    }

    #[test]
    fn writes_and_reads_a_file() {
        // tmpfs supports O_DIRECT since Linux 6.6; mergetrace's loop devices live there too.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("w");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let w = Workload {
            op: Op::Write,
            block_bytes: 4096,
            ios: 100,
            batch: 32,
            order: Order::Reverse,
            start: 0,
        };
        assert_eq!(
            run(&path, &w).unwrap(),
            Done {
                ios: 100,
                bytes: 409600,
                submit_calls: 4
            }
        );
        let r = Workload {
            op: Op::Read,
            ..w.clone()
        };
        assert_eq!(run(&path, &r).unwrap().ios, 100);
        assert!(run(&path, &Workload { batch: 0, ..w }).is_err());
    }
}
