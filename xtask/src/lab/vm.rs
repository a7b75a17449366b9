//! One guest boot: virtiofsd sharing the host's root, QEMU (TCG) with the kernel, the lab's
//! initramfs and four fresh sparse disks (three virtio, one NVMe), the command's output followed live from ttyS1, a
//! wall-clock timeout. Only the processes started here are ever killed, by their PIDs.
use std::{
    fs,
    io::{Read, Seek, SeekFrom, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

/// Debian 12's qemu-system-common 7.2 ships the C virtiofsd here.
pub const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";
pub const QEMU: &str = "qemu-system-x86_64";

pub struct VmConfig<'a> {
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// Extra kernel arguments (mt.script=..., mt.moddir=...).
    pub extra_append: String,
    pub run_dir: &'a Path,
    pub mem_mib: u64,
    pub smp: u32,
    /// TCG threading: "single" or "multi".
    pub tcg_threads: &'a str,
    /// Size of each scratch disk, /dev/vdb and /dev/nvme0n1.
    pub scratch_mib: u64,
    pub timeout: Duration,
    /// Copy the command's output to our stdout as it arrives.
    pub echo: bool,
}

#[derive(Debug)]
pub struct VmResult {
    /// The command's exit status as /init reported it on ttyS2 (125: the lab's own setup
    /// failed); None if the guest never reported one (crash, hang).
    pub exit: Option<i32>,
    /// From starting QEMU until /init was about to run the command.
    pub boot: Option<Duration>,
    pub elapsed: Duration,
    pub timed_out: bool,
    /// Everything the command wrote (stdout and stderr, ttyS1).
    pub output: String,
    pub console_log: PathBuf,
}

/// Kills the child at drop (by its PID, SIGKILL) unless it has already been reaped.
struct Reaped(Option<Child>);

impl Reaped {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child present")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Our children die with us (PR_SET_PDEATHSIG), so a killed xtask leaves no QEMU behind.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// Size of /dev/vdc, the requeue disk.
const REQUEUE_DISK_MIB: u64 = 256;

/// /dev/vdc: a virtio-blk disk whose driver runs out of ring space before it runs out of tags,
/// so queue_rq returns BLK_STS_DEV_RESOURCE (virtblk_add_req: -ENOSPC) and the block layer
/// requeues (`block:block_rq_requeue`) whenever a 6th one-segment request (or fewer larger
/// ones) is dispatched while the others are in flight. Without indirect descriptors virtio_blk
/// allots ring/2 = 8 tags to the 16-entry ring, but each request takes 2 + segments
/// descriptors, so 5 one-segment requests fill it. One queue, so mq-deadline is the default
/// scheduler (nr_requests 16, max_segments 14 = queue-size - 2). A queue-depth-1 workload
/// (dd O_DIRECT of blocks up to max_sectors_kb) never requeues; fio at iodepth 32, or
/// buffered writes and a sync, do.
const REQUEUE_DEVICE: &str =
    "virtio-blk-pci,drive=d2,num-queues=1,queue-size=16,indirect_desc=off,serial=mt-requeue";

/// /dev/nvme0n1: QEMU's emulated NVMe controller with one namespace. The guest's driver
/// makes one I/O queue per vCPU (the controller offers 64), so the scheduler is `none`, and
/// completes requests in the queue's interrupt handler, on the CPU that submitted them (one
/// vector per queue). QEMU's nvme does no request merging of its own.
const NVME_DEVICE: &str = "nvme,drive=nv0,serial=mt-nvme";

fn sparse_file(path: &Path, mib: u64) -> Result<()> {
    let f = fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.set_len(mib << 20)
        .with_context(|| format!("cannot size {}", path.display()))?;
    Ok(())
}

/// The last `n` lines of a file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn check_path(p: &Path) -> Result<String> {
    let s = p
        .to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))?
        .to_string();
    ensure!(
        !s.contains(',') && !s.chars().any(char::is_whitespace),
        "the lab cannot use a path with commas or spaces: {s}"
    );
    Ok(s)
}

pub fn run(cfg: &VmConfig) -> Result<VmResult> {
    let dir = cfg.run_dir;
    let disks = Disks {
        aux: dir.join("aux.img"),
        scratch: dir.join("scratch.img"),
        requeue: dir.join("requeue.img"),
        nvme: dir.join("nvme.img"),
    };
    sparse_file(&disks.aux, 64)?;
    sparse_file(&disks.scratch, cfg.scratch_mib)?;
    sparse_file(&disks.requeue, REQUEUE_DISK_MIB)?;
    sparse_file(&disks.nvme, cfg.scratch_mib)?;
    let logs = Logs {
        console: dir.join("console.log"),
        out: dir.join("out.log"),
        rc: dir.join("rc.log"),
    };
    for f in [&logs.console, &logs.out, &logs.rc] {
        fs::File::create(f).with_context(|| format!("cannot create {}", f.display()))?;
    }
    let sock = dir.join("virtiofs.sock");
    let virtiofsd = start_virtiofsd(&sock, &dir.join("virtiofsd.log"))?;

    let mut q = qemu_command(cfg, &disks, &logs, &check_path(&sock)?)?;
    let qemu_log = dir.join("qemu.log");
    q.stdin(Stdio::null())
        .stdout(fs::File::create(&qemu_log)?)
        .stderr(fs::File::create(&qemu_log)?.try_clone()?);
    die_with_parent(&mut q);
    let start = Instant::now();
    let qemu = Reaped(Some(q.spawn().with_context(|| {
        format!("cannot start {QEMU} (scripts/setup --lab installs qemu-system-x86)")
    })?));
    let watched = watch(cfg, qemu, &logs, start)?;
    stop_virtiofsd(virtiofsd, &sock)?;

    let rc_text = fs::read_to_string(&logs.rc).unwrap_or_default();
    let exit = rc_text
        .lines()
        .rev()
        .find_map(|l| l.trim().parse::<i32>().ok());
    if let Some(st) = watched.status {
        if exit.is_none() && !st.success() {
            eprintln!("lab: qemu exited with {st}:\n{}", tail(&qemu_log, 20));
        }
    }
    Ok(VmResult {
        exit,
        boot: watched.boot,
        elapsed: watched.elapsed,
        timed_out: watched.timed_out,
        output: String::from_utf8_lossy(&watched.output).into_owned(),
        console_log: logs.console,
    })
}

/// The guest's four disks: vda (aux), vdb (scratch), vdc (requeue), nvme0n1 (NVMe scratch).
struct Disks {
    aux: PathBuf,
    scratch: PathBuf,
    requeue: PathBuf,
    nvme: PathBuf,
}

/// The guest's serial ports: the console, the test output, the exit code.
struct Logs {
    console: PathBuf,
    out: PathBuf,
    rc: PathBuf,
}

/// virtiofsd serving the host's / on `sock`, once it listens.
fn start_virtiofsd(sock: &Path, log: &Path) -> Result<Reaped> {
    let sock_s = check_path(sock)?;
    ensure!(
        sock_s.len() < 100,
        "the virtiofs socket path is too long for a unix socket: {sock_s}"
    );
    let _ = fs::remove_file(sock);
    // The C virtiofsd, chroot sandbox (the namespace one fails with pivot_root EBUSY).
    let mut vcmd = Command::new(VIRTIOFSD);
    vcmd.arg(format!("--socket-path={sock_s}"))
        .args([
            "-o",
            "source=/",
            "-o",
            "sandbox=chroot",
            "-o",
            "cache=always",
        ])
        .stdin(Stdio::null())
        .stdout(fs::File::create(log)?)
        .stderr(fs::File::create(log)?.try_clone()?);
    die_with_parent(&mut vcmd);
    let mut virtiofsd = Reaped(Some(vcmd.spawn().with_context(|| {
        format!("cannot start {VIRTIOFSD} (scripts/setup --lab installs qemu-system-common)")
    })?));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !sock.exists() {
        if let Some(st) = virtiofsd.child().try_wait()? {
            bail!(
                "virtiofsd exited ({st}) before listening:\n{}",
                tail(log, 20)
            );
        }
        ensure!(
            Instant::now() < deadline,
            "virtiofsd did not create {sock_s} within 15 s:\n{}",
            tail(log, 20)
        );
        thread::sleep(Duration::from_millis(20));
    }
    Ok(virtiofsd)
}

/// virtiofsd exits when QEMU goes away; give it a moment, then stop it.
fn stop_virtiofsd(mut virtiofsd: Reaped, sock: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3);
    while virtiofsd.child().try_wait()?.is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    drop(virtiofsd);
    let _ = fs::remove_file(sock);
    Ok(())
}

/// QEMU's virtio-blk merges adjacent guest requests into one host write of up to IOV_MAX
/// (1,024) vectors. QEMU 7.2 (Debian 12's) then pads one that is not aligned to the host file's
/// O_DIRECT alignment (4 KiB; a guest ext4 of 1 KiB blocks writes at 1 KiB boundaries) with a
/// head and a tail vector, 1,026 in all, and the host refuses it with EINVAL: the guest sees an
/// I/O error (seen on 6.12: `sync -f` after 8 MiB of buffered writes on vdb failed 3 to 14 times
/// in 30; QEMU traced 7 requests merged, 4 MiB = 1,024 pages at offset 11,527,168, completed
/// with -22). QEMU 8.1 collapses such vectors ("block: Collapse padded I/O vecs exceeding
/// IOV_MAX"). Without host-side merging, one guest request is at most 254 vectors (the
/// disk's seg_max) and never reaches the limit: 0 failures in 90. The guest sees the same
/// requests either way. (The requeue disk keeps it: its ring holds at most 14 vectors.)
const NO_HOST_MERGING: &str = "request-merging=off";

/// The QEMU command line: TCG, the kernel and initramfs, the serial logs, the host's / over
/// virtiofs and the four disks.
fn qemu_command(cfg: &VmConfig, disks: &Disks, logs: &Logs, sock_s: &str) -> Result<Command> {
    // `no_timer_check`: at boot the kernel waits a few emulated ticks for the IO-APIC timer
    // and panics ("IO-APIC + timer doesn't work!") if none arrive. A TCG guest on a busy host
    // can miss that window: CI's 6.1-iolatency boot, started beside both guest lanes, died so
    // in 2.6 s. The timer works; the check only measures host load.
    let append = format!(
        "console=ttyS0 panic=-1 oops=panic tsc=reliable no_timer_check rdinit=/init {}",
        cfg.extra_append
    );
    let mem = cfg.mem_mib;
    let drive = |p: &Path, id: &str| -> Result<String> {
        Ok(format!(
            "file={},if=none,id={id},format=raw,cache=none,aio=native",
            check_path(p)?
        ))
    };
    let mut q = Command::new(QEMU);
    q.args([
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ])
    .args([
        "-accel",
        &format!("tcg,thread={}", cfg.tcg_threads),
        "-cpu",
        "max",
    ])
    .args(["-smp", &cfg.smp.to_string(), "-m", &format!("{mem}M")])
    .args([
        "-object",
        &format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
        "-machine",
        "pc,memory-backend=mem",
    ])
    .arg("-kernel")
    .arg(cfg.vmlinuz)
    .arg("-initrd")
    .arg(cfg.initramfs)
    .args(["-append", &append])
    .args(["-serial", &format!("file:{}", check_path(&logs.console)?)])
    .args(["-serial", &format!("file:{}", check_path(&logs.out)?)])
    .args(["-serial", &format!("file:{}", check_path(&logs.rc)?)])
    .args(["-chardev", &format!("socket,id=vfs,path={sock_s}")])
    .args(["-device", "vhost-user-fs-pci,chardev=vfs,tag=host"])
    // vda: a small extra disk, so that the scratch disk is vdb (the second disk, as a cloud VM's
    // data volume usually is).
    .args(["-drive", &drive(&disks.aux, "d0")?])
    .args([
        "-device",
        &format!("virtio-blk-pci,drive=d0,num-queues=1,{NO_HOST_MERGING},serial=mt-aux"),
    ])
    // vdb: the scratch disk; one queue, so mq-deadline is the default scheduler.
    .args(["-drive", &drive(&disks.scratch, "d1")?])
    .args([
        "-device",
        &format!("virtio-blk-pci,drive=d1,num-queues=1,{NO_HOST_MERGING},serial=mt-scratch"),
    ])
    // vdc: the requeue disk (after vda and vdb, which the tests rely on).
    .args(["-drive", &drive(&disks.requeue, "d2")?])
    .args(["-device", REQUEUE_DEVICE])
    // nvme0n1: the NVMe scratch disk, as production disks are.
    .args(["-drive", &drive(&disks.nvme, "nv0")?])
    .args(["-device", NVME_DEVICE]);
    Ok(q)
}

/// What watching the guest saw.
struct Watched {
    status: Option<std::process::ExitStatus>,
    boot: Option<Duration>,
    elapsed: Duration,
    timed_out: bool,
    output: Vec<u8>,
}

/// Follows the guest's output (echoing it when asked) until QEMU exits or the timeout.
fn watch(cfg: &VmConfig, mut qemu: Reaped, logs: &Logs, start: Instant) -> Result<Watched> {
    let mut out = fs::File::open(&logs.out)?;
    let mut output = Vec::new();
    let mut boot = None;
    let mut timed_out = false;
    let stdout = std::io::stdout();
    let mut follow = |output: &mut Vec<u8>| -> Result<()> {
        let mut chunk = Vec::new();
        // QEMU truncates the file when it opens it; never read past its end.
        let len = out.metadata()?.len();
        if len < output.len() as u64 {
            out.seek(SeekFrom::Start(len))?;
        }
        out.read_to_end(&mut chunk)?;
        if !chunk.is_empty() {
            if cfg.echo {
                let mut o = stdout.lock();
                o.write_all(&chunk)?;
                o.flush()?;
            }
            output.extend_from_slice(&chunk);
        }
        Ok(())
    };
    let status = loop {
        follow(&mut output)?;
        if boot.is_none() && fs::read_to_string(&logs.rc).is_ok_and(|s| s.starts_with("ready")) {
            boot = Some(start.elapsed());
        }
        if let Some(st) = qemu.child().try_wait()? {
            break Some(st);
        }
        if start.elapsed() > cfg.timeout {
            timed_out = true;
            // Ours, by PID: the Reaped guard kills and reaps it.
            let _ = qemu.child().kill();
            let _ = qemu.child().wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    follow(&mut output)?;
    drop(qemu);
    Ok(Watched {
        status,
        boot,
        elapsed,
        timed_out,
        output,
    })
}
