//! The AM's errors, one enum for the crate, mapped onto a few gRPC status codes at the edge.

use crate::decide::{PlanError, RestoreError};
use crate::spec::SpecError;

/// What went wrong in the application master. Every message names the thing and the fix.
#[derive(Debug, thiserror::Error)]
pub enum AmError {
    /// The job spec was refused.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A source could not be opened or planned.
    #[error("planning source {uri}: {source}")]
    Source {
        /// The source's URI from the job spec.
        uri: String,
        /// The formats layer's error.
        source: sluice_formats::FormatError,
    },
    /// The splits could not be cut into tasks.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A saved data position does not fit the job.
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// A request was malformed or does not fit the job.
    #[error("{0}")]
    InvalidRequest(String),
    /// The request names something the AM does not have.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be served in the job's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The AM's journal can record nothing more, so the AM stops acting and exits.
    #[error(
        "this AM steps down: {cause}. It leaves the executors running for the AM that took the job over; if none did, free the journal's storage and start the AM again, which takes the job over from its journal"
    )]
    SteppedDown {
        /// Why the journal stopped.
        cause: String,
    },
    /// The journal could not be opened, read or written.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// The listen address could not be bound or the server failed.
    #[error(
        "serving on {address}: {source}; choose another --listen address or stop the process using it"
    )]
    Serve {
        /// The address.
        address: String,
        /// The transport's error.
        source: std::io::Error,
    },
    /// The status page's address could not be bound or its server failed.
    #[error(
        "serving the status page on {address}: {cause}; choose another --http address or stop the process using it"
    )]
    Http {
        /// The address.
        address: String,
        /// The transport's error, in the message rather than as a source so that it is printed
        /// once, before the fix.
        cause: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T, E = AmError> = std::result::Result<T, E>;

impl From<AmError> for tonic::Status {
    fn from(error: AmError) -> tonic::Status {
        let message = error.to_string();
        match error {
            AmError::InvalidRequest(_) | AmError::Spec(_) => {
                tonic::Status::invalid_argument(message)
            }
            AmError::NotFound(_) => tonic::Status::not_found(message),
            AmError::FailedPrecondition(_) | AmError::Restore(_) => {
                tonic::Status::failed_precondition(message)
            }
            // Unavailable: a daemon calls again, and looks for the AM that took the job over.
            AmError::Journal(_) | AmError::SteppedDown { .. } => {
                tonic::Status::unavailable(message)
            }
            AmError::Source { .. }
            | AmError::Plan(_)
            | AmError::Serve { .. }
            | AmError::Http { .. } => tonic::Status::internal(message),
        }
    }
}

/// Whether `error` says the process or the system is out of file descriptors (`EMFILE`, `ENFILE`):
/// a shortage that passes once descriptors are closed, not a fault of what was being done.
pub fn is_descriptor_shortage(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}
