//! Least privilege once attached. Loading and attaching the programs needs root's powers
//! (CAP_BPF, CAP_PERFMON, CAP_SYSLOG for kallsyms' addresses, CAP_SYS_ADMIN for `--stats`);
//! what runs after needs far less. [`drop_after_attach`] keeps the capabilities in [`KEPT`]
//! (and [`KEPT_AS_USER`] with `--user`), drops every other one from the effective, permitted,
//! inheritable, ambient and (given CAP_SETPCAP) bounding sets, optionally switches to another
//! user, and sets no_new_privs, in every thread of the process.
//!
//! Measured with a probe of each operation after the drop (the lab's guests and this host,
//! all with `kernel.unprivileged_bpf_disabled=2`):
//!
//! | after the drop, with no capability | 5.10 | 6.1, 6.12, 6.18 |
//! |---|---|---|
//! | map lookup, update, next key on a held fd; a program's info | EPERM: needs CAP_BPF | yes |
//! | attach a loaded tp_btf, raw_tracepoint or fentry program | EPERM: needs CAP_BPF | yes |
//! | load a new tp_btf or fentry program | needs CAP_BPF + CAP_PERFMON | the same |
//! | create a map | needs CAP_BPF | the same |
//!
//! Capabilities are a thread's, not a process's: `capset()` and `prctl()` change the calling
//! thread only, and the runtime's threads all exist by the time the programs are attached. So
//! the drop runs in each thread, as glibc's setuid() does: every other thread is sent a signal
//! whose handler applies the same plan (raw system calls only), one thread at a time, then the
//! calling thread applies it, and every thread's `/proc/self/task/TID/status` is checked.
use std::{
    collections::BTreeSet,
    fmt,
    sync::{
        atomic::{AtomicI32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use capctl::{Cap, CapSet, CapState};

/// The capabilities kept once attached, and what each is for.
pub const KEPT: &[(Cap, &str)] = &[
    (
        Cap::BPF,
        "the bpf() system call where the kernel refuses it without (5.10 with \
         kernel.unprivileged_bpf_disabled set: every read of the counters); loading or \
         attaching a program mid-run, when a limit appears on a traced disk",
    ),
    (
        Cap::PERFMON,
        "loading a tracing program (tp_btf, fentry) mid-run, with CAP_BPF; attaching one loaded \
         at start needs neither from 6.1 on",
    ),
];

/// Kept as well when the process runs as a user other than root (`--user`, or started so,
/// e.g. by a systemd unit with `DynamicUser=yes`), for files only root may read.
pub const KEPT_AS_USER: &[(Cap, &str)] = &[(
    Cap::DAC_READ_SEARCH,
    "as a user other than root: reading what only root may read, such as Docker's container \
     names (/var/lib/docker/containers/*/config.v2.json, mode 0600) and the web config's key \
     file on a reload",
)];

/// Where a kernel has no CAP_BPF or CAP_PERFMON in the process's permitted set but
/// CAP_SYS_ADMIN, that stands in for both (the kernel's bpf_capable() and perfmon_capable()).
const STAND_IN: Cap = Cap::SYS_ADMIN;

/// How long a thread may take to answer the signal that makes it drop its privileges.
const THREAD_ANSWER: Duration = Duration::from_secs(5);

/// A user to run as: `NAME`, `UID`, `NAME:GROUP` or `UID:GID`, names from /etc/passwd and
/// /etc/group (read as files: a static binary has no NSS modules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl User {
    pub fn resolve(spec: &str) -> Result<User> {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        User::resolve_in(spec, &passwd, &group)
    }

    /// As [`User::resolve`], with the files' text given.
    pub fn resolve_in(spec: &str, passwd: &str, group: &str) -> Result<User> {
        // name:x:id:... in both files: a user's third field is its uid and the fourth its
        // primary gid, a group's third its gid.
        let entries = |text: &'_ str| -> Vec<(String, Option<u32>, Option<u32>)> {
            let number = |f: Option<&str>| f.and_then(|v| v.parse().ok());
            text.lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .filter(|f| f.len() >= 3)
                .map(|f| {
                    (
                        f[0].to_string(),
                        number(Some(f[2])),
                        number(f.get(3).copied()),
                    )
                })
                .collect()
        };
        let (users, groups) = (entries(passwd), entries(group));
        let (user_part, group_part) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let (name, uid, primary_gid) = match user_part.parse::<u32>() {
            Ok(uid) => users
                .iter()
                .find(|(_, id, _)| *id == Some(uid))
                .map(|(name, _, gid)| (name.clone(), uid, gid.unwrap_or(uid)))
                .unwrap_or((uid.to_string(), uid, uid)),
            Err(_) => users
                .iter()
                .find_map(|(name, uid, gid)| {
                    (name == user_part).then_some((name.clone(), (*uid)?, (*gid)?))
                })
                .ok_or_else(|| {
                    anyhow!(
                        "--user {spec}: no user {user_part:?} in /etc/passwd (give an existing \
                         user, or a number: UID or UID:GID)"
                    )
                })?,
        };
        let gid = match group_part {
            None => primary_gid,
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => groups
                    .iter()
                    .find_map(|(name, gid, _)| if name == g { *gid } else { None })
                    .ok_or_else(|| {
                        anyhow!("--user {spec}: no group {g:?} in /etc/group (give an existing group or a GID)")
                    })?,
            },
        };
        Ok(User { name, uid, gid })
    }
}

/// What the process kept, for the line that says so.
#[derive(Debug)]
pub struct Dropped {
    pub kept: Vec<Cap>,
    pub bounding_dropped: bool,
    pub user: Option<User>,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept: Vec<String> = self.kept.iter().map(|c| c.to_string()).collect();
        write!(
            f,
            "privileges dropped: kept {}",
            if kept.is_empty() {
                "no capability".to_string()
            } else {
                kept.join(", ")
            }
        )?;
        if !self.bounding_dropped {
            write!(
                f,
                " (the bounding set stays as given: no CAP_SETPCAP to narrow it)"
            )?;
        }
        write!(f, "; no new privileges")?;
        if let Some(u) = &self.user {
            write!(f, "; running as {} (uid {}, gid {})", u.name, u.uid, u.gid)?;
        }
        Ok(())
    }
}

/// The state every thread is brought to. Plain data: the signal handler reads it.
#[derive(Debug, Clone, Copy)]
struct Plan {
    keep: CapSet,
    drop_bounding: bool,
    ids: Option<(u32, u32)>,
}

/// Keeps [`KEPT`] (and [`KEPT_AS_USER`] as a user other than root) of what the process is
/// permitted, drops the rest in every thread, switches to `user` if given, sets
/// no_new_privs. Call it once the programs are attached and the maps open.
pub fn drop_after_attach(user: Option<User>) -> Result<Dropped> {
    let permitted = CapState::get_current()
        .map_err(|e| anyhow!("cannot read this process's capabilities: {e}"))?
        .permitted;
    let mut keep = CapSet::empty();
    // SAFETY: geteuid cannot fail.
    let not_root = user
        .as_ref()
        .map_or(unsafe { libc::geteuid() } != 0, |u| u.uid != 0);
    let wanted = KEPT.iter().chain(if not_root { KEPT_AS_USER } else { &[] });
    for (cap, _) in wanted {
        if permitted.has(*cap) {
            keep.add(*cap);
        } else if matches!(cap, Cap::BPF | Cap::PERFMON) && permitted.has(STAND_IN) {
            keep.add(STAND_IN);
        }
    }
    if user.is_some() && !(permitted.has(Cap::SETUID) && permitted.has(Cap::SETGID)) {
        bail!("--user needs CAP_SETUID and CAP_SETGID to switch users: run serve as root");
    }
    let plan = Plan {
        keep,
        drop_bounding: permitted.has(Cap::SETPCAP),
        ids: user.as_ref().map(|u| (u.uid, u.gid)),
    };
    on_every_thread(plan)?;
    check_every_thread(&plan)?;
    Ok(Dropped {
        kept: keep.iter().collect(),
        bounding_dropped: plan.drop_bounding,
        user,
    })
}

/// The drop, in the calling thread. Raw system calls only (capctl's wrappers): it runs in a
/// signal handler too.
fn apply(plan: &Plan) -> capctl::Result<()> {
    // Everything permitted made effective for the steps below (CAP_SETPCAP for the bounding
    // set); the last step narrows both sets to what is kept.
    let mut state = CapState::get_current()?;
    state.effective = state.permitted;
    state.set_current()?;
    if plan.drop_bounding {
        for cap in Cap::iter() {
            if !plan.keep.has(cap) && capctl::bounding::read(cap) == Some(true) {
                capctl::bounding::drop(cap)?;
            }
        }
    }
    capctl::ambient::clear()?;
    if let Some((uid, gid)) = plan.ids {
        // Keeps the permitted set across the change of user (PR_SET_KEEPCAPS).
        capctl::cap_set_ids(Some(uid), Some(gid), Some(&[gid]))?;
    }
    CapState {
        effective: plan.keep,
        permitted: plan.keep,
        inheritable: CapSet::empty(),
    }
    .set_current()?;
    capctl::prctl::set_no_new_privs()
}

static PLAN: OnceLock<Plan> = OnceLock::new();
/// The thread asked to apply the plan now, and its answer (`PENDING`, 0 or an errno).
static TARGET: AtomicI32 = AtomicI32::new(0);
static ANSWER: AtomicI32 = AtomicI32::new(PENDING);
const PENDING: i32 = -1;

fn gettid() -> i32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

extern "C" fn on_signal(_: libc::c_int) {
    // SAFETY: errno is this thread's; it is restored for the code the signal interrupted.
    let errno = unsafe { *libc::__errno_location() };
    if gettid() == TARGET.load(Ordering::SeqCst) {
        let answer = match PLAN.get() {
            Some(plan) => apply(plan).map_or_else(|e| e.code().max(1), |()| 0),
            None => libc::EINVAL,
        };
        ANSWER.store(answer, Ordering::SeqCst);
    }
    unsafe { *libc::__errno_location() = errno };
}

/// This process's threads now.
fn threads() -> Result<BTreeSet<i32>> {
    let dir = std::fs::read_dir("/proc/self/task").context("cannot list /proc/self/task")?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Applies `plan` in every thread: the others by a signal each, one at a time, until no
/// thread is left that has not (a thread started meanwhile by one that had not is found by
/// the next listing), then the calling thread.
fn on_every_thread(plan: Plan) -> Result<()> {
    PLAN.set(plan)
        .map_err(|_| anyhow!("the privileges were already dropped"))?;
    let sig = libc::SIGRTMAX() - 1;
    // SAFETY: a zeroed sigaction is a valid value; the handler only makes raw system calls
    // and touches atomics.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(sig, &action, &mut old) != 0 {
            bail!(
                "cannot install the privilege-drop signal handler: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let result = signal_each_thread(sig);
    // SAFETY: restores the action saved above.
    unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
    result?;
    apply(&plan).map_err(|e| anyhow!("cannot drop privileges: {e}"))
}

fn signal_each_thread(sig: libc::c_int) -> Result<()> {
    let (pid, me) = (std::process::id() as i32, gettid());
    let mut done = BTreeSet::from([me]);
    loop {
        let pending: Vec<i32> = threads()?.difference(&done).copied().collect();
        if pending.is_empty() {
            return Ok(());
        }
        for tid in pending {
            ANSWER.store(PENDING, Ordering::SeqCst);
            TARGET.store(tid, Ordering::SeqCst);
            // SAFETY: tgkill with this process's id and one of its thread ids.
            if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ESRCH) {
                    done.insert(tid); // it ended meanwhile
                    continue;
                }
                bail!("cannot signal thread {tid} to drop its privileges: {e}");
            }
            let asked = Instant::now();
            let answer = loop {
                let a = ANSWER.load(Ordering::SeqCst);
                if a != PENDING {
                    break Some(a);
                }
                if !std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
                    break None; // it ended before it could answer
                }
                if asked.elapsed() > THREAD_ANSWER {
                    bail!("thread {tid} did not drop its privileges within {THREAD_ANSWER:?}");
                }
                std::thread::sleep(Duration::from_micros(200));
            };
            if let Some(errno) = answer.filter(|a| *a != 0) {
                bail!(
                    "thread {tid} cannot drop its privileges: {}",
                    std::io::Error::from_raw_os_error(errno)
                );
            }
            done.insert(tid);
        }
    }
}

/// Every thread's `/proc/self/task/TID/status` must show the plan: the kept set effective and
/// permitted, nothing inheritable or ambient, the bounding set narrowed (where it could be),
/// no_new_privs, the user.
fn check_every_thread(plan: &Plan) -> Result<()> {
    let keep = bits(plan.keep);
    for tid in threads()? {
        let path = format!("/proc/self/task/{tid}/status");
        let Ok(status) = std::fs::read_to_string(&path) else {
            continue; // it ended
        };
        let field = |name: &str| -> Option<&str> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let hex = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok());
        let mut wrong = Vec::new();
        for (name, want) in [
            ("CapEff", keep),
            ("CapPrm", keep),
            ("CapInh", 0),
            ("CapAmb", 0),
        ] {
            if hex(name) != Some(want) {
                wrong.push(format!("{name} {:?}", field(name)));
            }
        }
        if plan.drop_bounding && hex("CapBnd") != Some(keep) {
            wrong.push(format!("CapBnd {:?}", field("CapBnd")));
        }
        if field("NoNewPrivs") != Some("1") {
            wrong.push("NoNewPrivs not 1".to_string());
        }
        if let Some((uid, _)) = plan.ids {
            let uids: Vec<&str> = field("Uid").unwrap_or("").split_whitespace().collect();
            if uids.iter().any(|u| *u != uid.to_string()) {
                wrong.push(format!("Uid {uids:?}"));
            }
        }
        if !wrong.is_empty() {
            bail!(
                "thread {tid} kept privileges it should have dropped: {} (want CapEff {keep:016x})",
                wrong.join(", ")
            );
        }
    }
    Ok(())
}

/// A capability set as the kernel's bit mask (as `/proc/PID/status` shows it).
pub fn bits(set: CapSet) -> u64 {
    set.iter().fold(0, |b, c| b | 1 << (c as u8))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                          prom:x:998:997::/home/prom:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nnogroup:x:65534:\nprom:x:997:\nadm:x:4:syslog\n";

    #[test]
    fn users_by_name_number_and_group() {
        let u = |s| User::resolve_in(s, PASSWD, GROUP);
        let user = |name: &str, uid, gid| User {
            name: name.to_string(),
            uid,
            gid,
        };
        assert_eq!(u("nobody").unwrap(), user("nobody", 65534, 65534));
        assert_eq!(u("prom").unwrap(), user("prom", 998, 997));
        assert_eq!(u("998").unwrap(), user("prom", 998, 997));
        assert_eq!(u("prom:adm").unwrap(), user("prom", 998, 4));
        assert_eq!(u("prom:5").unwrap(), user("prom", 998, 5));
        // A number no file names is taken as given, its group the same number.
        assert_eq!(u("4242").unwrap(), user("4242", 4242, 4242));
        assert_eq!(u("4242:4243").unwrap(), user("4242", 4242, 4243));
        for bad in ["nosuch", "prom:nogroupx", ""] {
            let e = u(bad).unwrap_err().to_string();
            assert!(e.starts_with("--user ") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn kept_capabilities_are_documented_and_distinct() {
        let all: Vec<Cap> = KEPT.iter().chain(KEPT_AS_USER).map(|(c, _)| *c).collect();
        let distinct: BTreeSet<u8> = all.iter().map(|c| *c as u8).collect();
        assert_eq!(distinct.len(), all.len());
        assert!(KEPT
            .iter()
            .chain(KEPT_AS_USER)
            .all(|(_, why)| why.len() > 20));
        let mut set = CapSet::empty();
        set.add(Cap::BPF);
        set.add(Cap::PERFMON);
        assert_eq!(bits(set), 0xc0_0000_0000);
    }

    #[test]
    fn the_line_says_what_was_kept() {
        let d = Dropped {
            kept: vec![Cap::PERFMON, Cap::BPF],
            bounding_dropped: true,
            user: Some(User {
                name: "nobody".into(),
                uid: 65534,
                gid: 65534,
            }),
        };
        assert_eq!(
            d.to_string(),
            "privileges dropped: kept CAP_PERFMON, CAP_BPF; no new privileges; running as nobody (uid 65534, gid 65534)"
        );
    }
}
