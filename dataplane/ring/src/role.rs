//! Claiming and giving up the producer and consumer roles.

use std::path::Path;

use crate::error::{AttachError, Role};
use crate::process::{self, PeerState, ProcessId};
use crate::sync::{AtomicU64, Ordering};

/// Claims the role whose holder is stored in `holder`, for the calling process.
///
/// Succeeds when the role is free or its holder is dead; returns the packed identity now stored.
pub(crate) fn claim(holder: &AtomicU64, role: Role, path: &Path) -> Result<u64, AttachError> {
    let me =
        process::pack(&ProcessId::current().map_err(|source| AttachError::Identity { source })?);
    let mut current = holder.load(Ordering::Acquire);
    loop {
        if let PeerState::Alive(process) = PeerState::of_word(current) {
            return Err(AttachError::Busy {
                path: path.to_path_buf(),
                role,
                holder: process,
            });
        }
        // AcqRel: Acquire pairs with the Release of the previous holder's `give_up`, so the new holder
        // sees every cursor the old one published; Release publishes the claim to `PeerState` readers.
        match holder.compare_exchange(current, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(me),
            Err(actual) => current = actual,
        }
    }
}

/// Gives up the role if the calling process still holds it.
pub(crate) fn give_up(holder: &AtomicU64, me: u64) {
    // Release pairs with the Acquire of the next `claim`. A failure means another process took over the
    // role after declaring this one dead; it is theirs now.
    let _ = holder.compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
}
