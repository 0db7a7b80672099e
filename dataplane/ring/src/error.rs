//! One small error type per ring operation, each naming the ring and the fix.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::process::ProcessId;

const MIB: f64 = 1024.0 * 1024.0;

/// Why a ring could not be created.
#[derive(Debug)]
pub enum RingCreateError {
    /// A ring file already exists at the path.
    Exists { path: PathBuf },
    /// The filesystem that would hold the ring lacks the space for it.
    NoSpace {
        path: PathBuf,
        free: u64,
        needed: u64,
    },
    /// The requested capacity cannot be used.
    InvalidCapacity { capacity: u64 },
    /// A system call failed.
    Io {
        path: PathBuf,
        operation: &'static str,
        source: io::Error,
    },
    /// The ring's directory or a file in it is not this user's to use.
    Files(sluice_process::files::FileError),
}

/// Why an existing ring could not be opened.
#[derive(Debug)]
pub enum RingOpenError {
    /// The file could not be opened or mapped.
    Io {
        path: PathBuf,
        operation: &'static str,
        source: io::Error,
    },
    /// The file is shorter than a ring's header page.
    Truncated { path: PathBuf, len: u64 },
    /// The header page is not that of a ring this build can read.
    Invalid { path: PathBuf, reason: String },
}

/// The role a process takes on a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The single writer (the node daemon).
    Producer,
    /// The single reader (a trainer).
    Consumer,
}

/// Why a process could not take a role on a ring.
#[derive(Debug)]
pub enum AttachError {
    /// A live process already holds the role.
    Busy {
        path: PathBuf,
        role: Role,
        holder: ProcessId,
    },
    /// The producer closed the stream; a closed ring takes no new producer.
    Closed { path: PathBuf },
    /// The ring's records between the read and write cursors do not parse.
    Corrupt { path: PathBuf, reason: String },
    /// The calling process could not read its own identity from /proc.
    Identity { source: io::Error },
}

/// Why [`crate::Producer::fold`] or [`crate::Producer::unread`] failed.
#[derive(Debug)]
pub enum FoldError {
    /// A record between the retain and the write cursor does not parse.
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
}

/// Why [`crate::Producer::reserve`] gave up.
#[derive(Debug)]
pub enum ReserveError {
    /// The record can never fit in this ring.
    TooLarge { path: PathBuf, len: u64, max: u64 },
    /// The ring stayed full while no live consumer was attached for longer than the peer timeout.
    ConsumerGone {
        path: PathBuf,
        last_consumer: Option<ProcessId>,
        waited: Duration,
    },
    /// Folding the released records to make room failed.
    Fold(FoldError),
}

/// Why [`crate::Producer::try_reserve`] returned without a slot.
#[derive(Debug)]
pub enum TryReserveError {
    /// The ring has no room for the record now.
    Full,
    /// The record can never fit in this ring.
    TooLarge { path: PathBuf, len: u64, max: u64 },
    /// Folding the released records to make room failed.
    Fold(FoldError),
}

impl From<FoldError> for ReserveError {
    fn from(error: FoldError) -> Self {
        ReserveError::Fold(error)
    }
}

impl From<FoldError> for TryReserveError {
    fn from(error: FoldError) -> Self {
        TryReserveError::Fold(error)
    }
}

/// Why [`crate::Consumer::next`] gave up.
#[derive(Debug)]
pub enum RecvError {
    /// The ring stayed empty while no live producer was attached for longer than the peer timeout.
    ProducerGone {
        path: PathBuf,
        last_producer: Option<ProcessId>,
        waited: Duration,
    },
    /// A committed record does not parse.
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
}

/// Why [`crate::Consumer::try_next`] returned without a record.
#[derive(Debug)]
pub enum TryRecvError {
    /// No committed record is waiting now.
    Empty,
    /// The producer closed the stream and every record has been read.
    Closed,
    /// A committed record does not parse.
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
}

impl fmt::Display for RingCreateError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingCreateError::Exists { path } => write!(
                formatter,
                "ring {}: a ring file already exists; open it instead, or remove it with `sluice gc` if its processes are gone",
                path.display()
            ),
            RingCreateError::NoSpace { path, free, needed } => write!(
                formatter,
                "ring {}: the filesystem has {:.1} MiB free, the ring needs {:.1} MiB; lower --ring-size or raise the size of {}",
                path.display(),
                *free as f64 / MIB,
                *needed as f64 / MIB,
                path.parent().unwrap_or(path).display()
            ),
            RingCreateError::InvalidCapacity { capacity } => write!(
                formatter,
                "ring capacity {capacity} bytes: must be a positive multiple of 4096 below 2^62"
            ),
            RingCreateError::Io {
                path,
                operation,
                source,
            } => write!(formatter, "ring {}: {operation}: {source}", path.display()),
            RingCreateError::Files(error) => write!(formatter, "ring directory: {error}"),
        }
    }
}

impl RingOpenError {
    /// Whether no file is at the path: the ring is not created yet, which a reader waiting for its
    /// daemon retries. Any other failure is final.
    pub fn is_absent(&self) -> bool {
        matches!(self, RingOpenError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

impl fmt::Display for RingOpenError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingOpenError::Io {
                path,
                operation,
                source,
            } => write!(formatter, "ring {}: {operation}: {source}", path.display()),
            RingOpenError::Truncated { path, len } => write!(
                formatter,
                "ring {}: file is {len} bytes, shorter than the 4096-byte ring header; it is truncated or not a sluice ring",
                path.display()
            ),
            RingOpenError::Invalid { path, reason } => {
                write!(formatter, "ring {}: {reason}", path.display())
            }
        }
    }
}

impl fmt::Display for AttachError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Busy { path, role, holder } => write!(
                formatter,
                "ring {}: the {} role is held by live {holder}; stop that process first, or use another ring",
                path.display(),
                match role {
                    Role::Producer => "producer",
                    Role::Consumer => "consumer",
                }
            ),
            AttachError::Closed { path } => write!(
                formatter,
                "ring {}: the stream was closed by its producer; create a new ring for a new stream",
                path.display()
            ),
            AttachError::Corrupt { path, reason } => write!(
                formatter,
                "ring {}: {reason}; remove the ring and restart its job from its last checkpoint",
                path.display()
            ),
            AttachError::Identity { source } => {
                write!(
                    formatter,
                    "cannot read this process's identity from /proc: {source}"
                )
            }
        }
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::TooLarge { path, len, max } => write!(
                formatter,
                "ring {}: a record of {len} bytes exceeds the largest this ring holds ({max} bytes); raise --ring-size or lower the batch size",
                path.display()
            ),
            ReserveError::ConsumerGone {
                path,
                last_consumer,
                waited,
            } => write!(
                formatter,
                "ring {}: full, and no live consumer for {:.1} s (last: {}); restart the trainer or raise the peer timeout",
                path.display(),
                waited.as_secs_f64(),
                describe(last_consumer)
            ),
            ReserveError::Fold(error) => fmt::Display::fmt(error, formatter),
        }
    }
}

impl fmt::Display for FoldError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FoldError::Corrupt {
                path,
                position,
                reason,
            } => write!(
                formatter,
                "ring {}: retained record at byte {position}: {reason}; the ring is corrupt, restart the job from its last checkpoint",
                path.display()
            ),
        }
    }
}

impl fmt::Display for TryReserveError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryReserveError::Full => write!(formatter, "ring is full"),
            TryReserveError::TooLarge { path, len, max } => fmt::Display::fmt(
                &ReserveError::TooLarge {
                    path: path.clone(),
                    len: *len,
                    max: *max,
                },
                formatter,
            ),
            TryReserveError::Fold(error) => fmt::Display::fmt(error, formatter),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::ProducerGone {
                path,
                last_producer,
                waited,
            } => write!(
                formatter,
                "ring {}: empty, and no live producer for {:.1} s (last: {}); check that the node daemon is running, or raise the peer timeout",
                path.display(),
                waited.as_secs_f64(),
                describe(last_producer)
            ),
            RecvError::Corrupt {
                path,
                position,
                reason,
            } => write!(
                formatter,
                "ring {}: record at byte {position}: {reason}; the ring is corrupt, restart the job from its last checkpoint",
                path.display()
            ),
        }
    }
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => write!(formatter, "ring is empty"),
            TryRecvError::Closed => write!(formatter, "ring is closed and drained"),
            TryRecvError::Corrupt {
                path,
                position,
                reason,
            } => fmt::Display::fmt(
                &RecvError::Corrupt {
                    path: path.clone(),
                    position: *position,
                    reason: reason.clone(),
                },
                formatter,
            ),
        }
    }
}

fn describe(process: &Option<ProcessId>) -> String {
    process.map_or_else(|| "none attached".to_owned(), |process| process.to_string())
}

impl std::error::Error for RingCreateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingCreateError::Io { source, .. } => Some(source),
            RingCreateError::Files(error) => Some(error),
            _ => None,
        }
    }
}

impl std::error::Error for RingOpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingOpenError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl std::error::Error for AttachError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttachError::Identity { source } => Some(source),
            _ => None,
        }
    }
}

impl std::error::Error for FoldError {}
impl std::error::Error for ReserveError {}
impl std::error::Error for TryReserveError {}
impl std::error::Error for RecvError {}
impl std::error::Error for TryRecvError {}
