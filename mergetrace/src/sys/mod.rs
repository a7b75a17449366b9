pub mod cgroups;
pub mod container;
pub mod device;
pub mod diskstats;
pub mod iocost;
pub mod iolatency;
pub mod local_names;
pub mod queue;
pub mod release;
pub mod wbt;
pub mod workload;

/// This process's CPU time so far, user and system, every thread (`getrusage`), in ns.
pub fn process_cpu_ns() -> u64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid rusage to fill; RUSAGE_SELF cannot fail.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(u.ru_utime) + ns(u.ru_stime)
}
