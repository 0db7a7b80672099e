//! Process identity and liveness, as stored in a ring's header.
//!
//! A role's holder is a [`ProcessId`] (pid plus start time, from the `sluice-process` crate), packed into
//! one `u64` so that it is claimed and read with a single atomic operation:
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

pub use sluice_process::ProcessId;

const PID_BITS: u32 = 22;
const PID_MASK: u64 = (1 << PID_BITS) - 1;

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

/// The word a ring header stores for `process`.
pub(crate) fn pack(process: &ProcessId) -> u64 {
    debug_assert!(
        u64::from(process.pid) <= PID_MASK,
        "pid {} beyond PID_MAX_LIMIT",
        process.pid
    );
    (process.start_ticks << PID_BITS) | (u64::from(process.pid) & PID_MASK)
}

/// The process a ring header's word names; `None` for 0.
pub(crate) fn unpack(word: u64) -> Option<ProcessId> {
    (word != 0).then_some(ProcessId {
        pid: (word & PID_MASK) as u32,
        start_ticks: word >> PID_BITS,
    })
}

impl PeerState {
    pub(crate) fn of_word(word: u64) -> Self {
        match unpack(word) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_identity_packs_into_one_word_and_back() {
        let sut = ProcessId::current().expect("own identity");
        assert_eq!(unpack(pack(&sut)), Some(sut));
        assert_eq!(unpack(0), None, "zero is no holder");
    }
}
