pub mod cgroups;
pub mod container;
pub mod device;
pub mod diskstats;
pub mod iocost;
pub mod iolatency;
pub mod local_names;
pub mod queue;
pub mod release;
pub mod throttle;
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

/// The calling thread's CPU time so far, user and system (`CLOCK_THREAD_CPUTIME_ID`), in ns:
/// what a stretch of work cost the thread, not counting the time it waited or was preempted.
pub fn thread_cpu_ns() -> u64 {
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid timespec to fill; this clock exists since Linux 2.6.12.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
