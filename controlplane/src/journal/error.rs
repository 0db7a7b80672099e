//! The journal's errors: each names the journal or the object, what is wrong, and the fix.

use std::sync::Arc;

/// The journal's result type.
pub type Result<T, E = JournalError> = std::result::Result<T, E>;

/// What can go wrong opening, appending to or snapshotting a journal.
///
/// It is `Clone`: one failed write fails every append waiting on it, and every later one.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// The URI does not name a store.
    #[error("journal {uri}: {source}")]
    Location {
        /// The URI as given.
        uri: String,
        /// Why the store cannot be built.
        #[source]
        source: Arc<sluice_store::LocationError>,
    },
    /// The URI names something a journal cannot live in.
    #[error("journal {uri}: {reason}")]
    Unsupported {
        /// The URI as given.
        uri: String,
        /// What is wrong and the fix.
        reason: String,
    },
    /// The journal belongs to another job, or to another version of this job's data.
    #[error(
        "journal {uri} holds the job {stored:?}, but this job is {expected:?}: use another checkpoint URI for a new job, or the spec that wrote this journal to resume it"
    )]
    IdentityMismatch {
        /// The journal's URI.
        uri: String,
        /// The identity stored in the journal.
        stored: String,
        /// The identity this writer was opened with.
        expected: String,
    },
    /// Another writer opened the journal after this one: this writer's appends stop here.
    #[error(
        "journal {uri}: fenced by a newer writer ({by}); this writer's later appends are refused so that two writers never interleave: stop this process, the newer one has taken over"
    )]
    Fenced {
        /// The journal's URI.
        uri: String,
        /// Who fenced it, as far as the journal records.
        by: String,
    },
    /// Other writers kept appending while this one tried to open the journal.
    #[error(
        "journal {uri}: another writer appended during each of {attempts} attempts to open it; two processes share this checkpoint URI: stop the other one, or use another URI"
    )]
    Contended {
        /// The journal's URI.
        uri: String,
        /// How many times opening was tried.
        attempts: u32,
    },
    /// A stored object is damaged before the end of the journal: the journal cannot be replayed.
    #[error(
        "journal object {object}, byte {offset}: {reason}; this is damage before the journal's end, not a torn last write, so nothing after it can be trusted: restore the object from a backup, or move the checkpoint URI aside and resume from a data checkpoint"
    )]
    Corrupt {
        /// The object's URI.
        object: String,
        /// The byte offset of the damage in the object.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// Records are missing between two stored objects.
    #[error(
        "journal {uri}: records {from} to {to} are missing ({detail}); an object was deleted or lost: restore it from a backup, or move the checkpoint URI aside and resume from a data checkpoint"
    )]
    MissingRecords {
        /// The journal's URI.
        uri: String,
        /// The first missing record.
        from: u64,
        /// The record after the last missing one.
        to: u64,
        /// Which objects border the gap.
        detail: String,
    },
    /// A stored entry or snapshot does not decode as the type asked for.
    #[error(
        "journal object {object}, byte {offset}: {reason}; the journal was written by a version of Sluice with another record format: resume it with that version, or start the job on a new checkpoint URI"
    )]
    Decode {
        /// The object's URI.
        object: String,
        /// The byte offset of the record in the object.
        offset: u64,
        /// The decoder's message.
        reason: String,
    },
    /// An entry or snapshot cannot be encoded.
    #[error("journal {uri}: cannot encode {what}: {reason}")]
    Encode {
        /// The journal's URI.
        uri: String,
        /// An entry or a snapshot.
        what: &'static str,
        /// The encoder's message, or the limit exceeded.
        reason: String,
    },
    /// A local file operation failed.
    #[error("journal object {object}: {operation}: {source}")]
    Io {
        /// The file's URI.
        object: String,
        /// What was being done.
        operation: &'static str,
        /// The operating system's error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// An object store request failed.
    #[error("journal object {object}: {operation}: {source}")]
    Store {
        /// The object's URI.
        object: String,
        /// What was being done.
        operation: &'static str,
        /// The store's error.
        #[source]
        source: Arc<object_store::Error>,
    },
    /// The journal's writer stopped (its runtime shut down, or it was closed) before the write was
    /// durable.
    #[error(
        "journal {uri}: the writer stopped before this write was durable; it may or may not be in the journal: reopen the journal to find out"
    )]
    WriterStopped {
        /// The journal's URI.
        uri: String,
    },
}

impl JournalError {
    /// Whether the error comes of the process having no file descriptor left (`EMFILE`, `ENFILE`)
    /// anywhere in its causes, as when an object store's connection could not be opened: a shortage
    /// that passes, after which the same write can be tried again.
    pub fn is_descriptor_shortage(&self) -> bool {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = match self {
            JournalError::Io { source, .. } => Some(source.as_ref()),
            JournalError::Store { source, .. } => Some(source.as_ref()),
            _ => None,
        };
        while let Some(error) = cause {
            if error
                .downcast_ref::<std::io::Error>()
                .is_some_and(crate::error::is_descriptor_shortage)
            {
                return true;
            }
            cause = error.source();
        }
        false
    }

    pub(super) fn io(object: &str, operation: &'static str, source: std::io::Error) -> Self {
        JournalError::Io {
            object: object.to_string(),
            operation,
            source: Arc::new(source),
        }
    }

    pub(super) fn store(
        object: &str,
        operation: &'static str,
        source: object_store::Error,
    ) -> Self {
        JournalError::Store {
            object: object.to_string(),
            operation,
            source: Arc::new(source),
        }
    }
}
