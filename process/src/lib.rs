//! The identity of a process, its liveness, and signals to its process group; the scheduling class
//! of background threads; the limit of open files ([`raise_open_files_limit`]); and the files and
//! directories that belong to one user ([`files`]).
//!
//! A pid alone is not an identity: Linux reuses pids. A [`ProcessId`] is a pid together with the
//! process's start time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot), which together never
//! repeat. The shared-memory ring stores one in its header for each role, and the application master
//! records one for each executor it launches, so that either can tell a live holder from a dead one
//! whose pid was given to another process.

use std::fmt;
use std::fs;

pub mod files;

/// The identity of a process: its pid and its start time, which together never repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// The start time of the process, in clock ticks since boot.
    pub start_ticks: u64,
}

impl ProcessId {
    /// Returns the identity of the calling process.
    ///
    /// # Errors
    ///
    /// Returns the error of reading `/proc/self/stat`.
    pub fn current() -> std::io::Result<Self> {
        let pid = std::process::id();
        let start_ticks = start_ticks_of("self")?;
        Ok(ProcessId { pid, start_ticks })
    }

    /// Returns the identity of the process `pid` as it is now.
    ///
    /// # Errors
    ///
    /// Returns the error of reading `/proc/<pid>/stat`: `NotFound` when no such process runs.
    pub fn of(pid: u32) -> std::io::Result<Self> {
        let start_ticks = start_ticks_of(&pid.to_string())?;
        Ok(ProcessId { pid, start_ticks })
    }

    /// The process group of this process while it runs (not a zombie), `None` once it is gone.
    pub fn group(&self) -> Option<u32> {
        match stat_of(&self.pid.to_string()) {
            Ok(stat)
                if stat.start_ticks == self.start_ticks
                    && stat.state != 'Z'
                    && stat.state != 'X' =>
            {
                Some(stat.group)
            }
            _ => None,
        }
    }

    /// Tells whether this process is still running (and not a zombie).
    pub fn is_alive(&self) -> bool {
        matches!(stat_of(&self.pid.to_string()), Ok(stat) if stat.start_ticks == self.start_ticks && stat.state != 'Z' && stat.state != 'X')
    }

    /// Sends `signal` to process group `group`, as `killpg` does.
    ///
    /// The caller checks first that a live process it knows by its identity is in the group
    /// ([`ProcessId::group`]): the kernel gives no process the id of a group that still has members,
    /// so the group is the one the caller means.
    ///
    /// # Errors
    ///
    /// Returns the OS error: `ESRCH` when no process is in the group, `EPERM` when the caller may not
    /// signal it.
    pub fn signal_group_id(group: u32, signal: libc::c_int) -> std::io::Result<()> {
        let group = libc::pid_t::try_from(group).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{group} is not a process group id"),
            )
        })?;
        // SAFETY: `killpg` takes two integers and touches no memory of this process.
        let result = unsafe { libc::killpg(group, signal) };
        if result != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `signal` to the process group whose leader is this process, as `killpg` does.
    ///
    /// The caller checks [`ProcessId::is_alive`] first: a group id is a pid, and the kernel may have given
    /// it to another process once this one and its group are gone.
    ///
    /// # Errors
    ///
    /// Returns the OS error: `ESRCH` when no process is in the group, `EPERM` when the caller may not
    /// signal it, `EINVAL` for a signal that does not exist.
    pub fn signal_group(&self, signal: libc::c_int) -> std::io::Result<()> {
        ProcessId::signal_group_id(self.pid, signal)
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "pid {}", self.pid)
    }
}

/// Makes the calling thread run only on CPU time no other thread wants (Linux's `SCHED_IDLE`), for
/// background work that must not delay the threads that answer requests: encoding a large
/// snapshot, for instance, on an AM whose requests wait for the same core.
pub fn make_current_thread_idle_priority() -> std::io::Result<()> {
    let parameters = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` reads `parameters`, a valid `sched_param` that outlives the
    // call, and with pid 0 changes the calling thread alone.
    let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &parameters) };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The limit of open files before and after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFilesLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit it has now: the hard limit, or `before` when that was already as high.
    pub after: u64,
}

/// The calling process's soft limit of open files (`RLIMIT_NOFILE`): how many descriptors it may
/// have open at once. An unlimited one is `u64::MAX`.
pub fn open_files_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// Where Linux keeps the most descriptors a process may ever have open, the bound of a hard limit
/// of "unlimited".
const NR_OPEN: &str = "/proc/sys/fs/nr_open";

/// Raises the calling process's soft limit of open files (`RLIMIT_NOFILE`) to its hard limit.
///
/// Servers that hold a descriptor per connection (the AM, a daemon with its rings and object-store
/// connections) would otherwise stop at the soft limit, often 1,024, while the hard limit allows
/// far more: the soft limit is kept low for programs that use `select`, whose sets end at 1,024
/// descriptors, and Sluice uses none. A hard limit of "unlimited" is taken as `fs.nr_open`, the
/// kernel's bound on it. The raised limit is inherited by the processes this one starts.
///
/// # Errors
///
/// Returns the error of `setrlimit`, which the caller can report and carry on from.
pub fn raise_open_files_limit() -> std::io::Result<OpenFilesLimit> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current.unwrap_or(u64::MAX);
    let hard = match limit.maximum {
        Some(hard) => hard,
        None => fs::read_to_string(NR_OPEN)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(before),
    };
    if before >= hard {
        return Ok(OpenFilesLimit {
            before,
            after: before,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        },
    )?;
    Ok(OpenFilesLimit {
        before,
        after: hard,
    })
}

struct Stat {
    state: char,
    group: u32,
    start_ticks: u64,
}

fn start_ticks_of(pid: &str) -> std::io::Result<u64> {
    stat_of(pid).map(|stat| stat.start_ticks)
}

fn stat_of(pid: &str) -> std::io::Result<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat: unexpected format"),
        )
    })
}

/// Parses the state and start time out of a `/proc/<pid>/stat` line. The command name (field 2) may
/// hold spaces and parentheses, so the fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after_command = &text[text.rfind(')')? + 1..];
    let mut fields = after_command.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 4 is the parent, field 5 the process group.
    let group = fields.nth(1)?.parse().ok()?;
    // Fields 6..=21 lie between the group and the start time (field 22).
    let start_ticks = fields.nth(16)?.parse().ok()?;
    Some(Stat {
        state,
        group,
        start_ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "calls setrlimit, which Miri cannot")]
    fn the_soft_limit_of_open_files_is_raised_to_the_hard_limit() {
        let sut = raise_open_files_limit().expect("raising the soft limit needs no privilege");
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(limit.current, Some(sut.after));
        assert_eq!(open_files_limit(), sut.after);
        assert!(sut.after >= sut.before, "{sut:?}");
        if let Some(hard) = limit.maximum {
            assert_eq!(sut.after, hard);
        }
        assert_eq!(
            raise_open_files_limit().expect("raised again"),
            OpenFilesLimit {
                before: sut.after,
                after: sut.after
            },
            "a second call finds the limit raised"
        );
    }

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 150 0 0 0 3 1 0 0 20 0 1 0 987654 1000 10";
        let stat = parse_stat(line).expect("parses");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.group, 4242);
        assert_eq!(stat.start_ticks, 987654);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) R 1 2").is_none());
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /proc, which Miri cannot")]
    fn a_live_process_tells_its_group_and_a_gone_one_none() {
        let sut = ProcessId::current().expect("own identity");
        // SAFETY: `getpgrp` takes nothing and cannot fail.
        let group = unsafe { libc::getpgrp() };
        assert_eq!(sut.group(), u32::try_from(group).ok());
        assert_eq!(ProcessId::of(sut.pid).expect("of"), sut);
        let gone = ProcessId {
            pid: sut.pid,
            start_ticks: sut.start_ticks + 1,
        };
        assert_eq!(gone.group(), None);
    }

    #[test]
    #[cfg_attr(miri, ignore = "changes the scheduling class, which Miri cannot")]
    fn a_thread_made_idle_priority_is_idle_and_its_siblings_are_not() {
        let policy = || {
            // SAFETY: `sched_getscheduler` with pid 0 reads the calling thread's policy.
            unsafe { libc::sched_getscheduler(0) }
        };
        let idle = std::thread::spawn(move || {
            make_current_thread_idle_priority().expect("SCHED_IDLE needs no privilege");
            policy()
        })
        .join()
        .expect("the thread ends");
        assert_eq!(idle, libc::SCHED_IDLE);
        assert_eq!(policy(), libc::SCHED_OTHER, "only the thread that asked");
    }

    #[test]
    fn the_current_process_is_alive_and_another_start_time_is_another_process() {
        let sut = ProcessId::current().expect("own identity");
        assert_eq!(sut.pid, std::process::id());
        assert!(sut.is_alive());
        let reused_pid = ProcessId {
            pid: sut.pid,
            start_ticks: sut.start_ticks + 1,
        };
        assert!(
            !reused_pid.is_alive(),
            "a different start time is a different process"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "spawns a process, which Miri cannot")]
    fn killed_child_is_dead_after_being_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let sut = ProcessId {
            pid: child.id(),
            start_ticks: start_ticks_of(&child.id().to_string()).expect("child stat"),
        };
        assert!(sut.is_alive());
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(!sut.is_alive());
    }

    #[test]
    #[cfg_attr(miri, ignore = "spawns a process and calls killpg, which Miri cannot")]
    fn a_signal_reaches_the_group_a_process_leads() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let sut = ProcessId {
            pid: child.id(),
            start_ticks: start_ticks_of(&child.id().to_string()).expect("child stat"),
        };
        sut.signal_group(libc::SIGKILL).expect("signals the group");
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let error = sut
            .signal_group(libc::SIGKILL)
            .expect_err("the group is gone");
        assert_eq!(error.raw_os_error(), Some(libc::ESRCH));
    }
}
