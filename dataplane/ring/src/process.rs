//! Process identity and liveness, as stored in a ring's header.
//!
//! A pid alone is not an identity: Linux reuses pids. The ring stores a pid together with the process's
//! start time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot), packed into one `u64` so that
//! it is claimed and read with a single atomic operation:
//!
//! ```text
//!  63                                   22 21                 0
//! +---------------------------------------+--------------------+
//! |        start time (clock ticks)       |        pid         |
//! +---------------------------------------+--------------------+
//! ```
//!
//! Linux pids are below `PID_MAX_LIMIT` = 2^22; 42 bits of ticks at 100 Hz last over a thousand years.
//! The value 0 means "no process".

use std::fmt;
use std::fs;

const PID_BITS: u32 = 22;
const PID_MASK: u64 = (1 << PID_BITS) - 1;

/// The identity of a process: its pid and its start time, which together never repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The process id.
    pub pid: u32,
    /// The start time of the process, in clock ticks since boot.
    pub start_ticks: u64,
}

/// What the ring knows about the process that holds a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// No process has claimed the role, or its holder gave it up.
    Absent,
    /// The holder is running.
    Alive(ProcessId),
    /// The holder has exited or was killed without giving up the role.
    Dead(ProcessId),
}

impl ProcessId {
    /// Returns the identity of the calling process.
    pub fn current() -> std::io::Result<Self> {
        let pid = std::process::id();
        let start_ticks = start_ticks_of("self")?;
        Ok(ProcessId { pid, start_ticks })
    }

    /// Tells whether this process is still running (and not a zombie).
    pub fn is_alive(&self) -> bool {
        matches!(stat_of(&self.pid.to_string()), Ok(stat) if stat.start_ticks == self.start_ticks && stat.state != 'Z' && stat.state != 'X')
    }

    pub(crate) fn pack(&self) -> u64 {
        debug_assert!(
            u64::from(self.pid) <= PID_MASK,
            "pid {} beyond PID_MAX_LIMIT",
            self.pid
        );
        (self.start_ticks << PID_BITS) | (u64::from(self.pid) & PID_MASK)
    }

    pub(crate) fn unpack(word: u64) -> Option<Self> {
        (word != 0).then_some(ProcessId {
            pid: (word & PID_MASK) as u32,
            start_ticks: word >> PID_BITS,
        })
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "pid {}", self.pid)
    }
}

impl PeerState {
    pub(crate) fn of_word(word: u64) -> Self {
        match ProcessId::unpack(word) {
            None => PeerState::Absent,
            Some(process) if process.is_alive() => PeerState::Alive(process),
            Some(process) => PeerState::Dead(process),
        }
    }

    /// Tells whether a running process holds the role.
    pub fn is_alive(&self) -> bool {
        matches!(self, PeerState::Alive(_))
    }
}

struct Stat {
    state: char,
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
    // Fields 4..=21 lie between the state (field 3) and the start time (field 22).
    let start_ticks = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start_ticks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_command_names() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 150 0 0 0 3 1 0 0 20 0 1 0 987654 1000 10";
        let stat = parse_stat(line).expect("parses");
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.start_ticks, 987654);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) R 1 2").is_none());
    }

    #[test]
    fn current_process_is_alive_and_packs_round_trip() {
        let sut = ProcessId::current().expect("own identity");
        assert!(sut.is_alive());
        assert_eq!(ProcessId::unpack(sut.pack()), Some(sut));
        assert_eq!(ProcessId::unpack(0), None);
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
}
