//! Reading back what was durable: the latest snapshot and the records after it.
//!
//! # Implementation
//! Segment `i` holds records `first_i, first_i + 1, ...`; records from `first_{i+1}` on belong to the
//! next segment. A segment can hold frames past the next segment's first record only when a fenced
//! writer appended them after a newer writer had read the journal: those were never acknowledged and
//! are ignored. Reading a segment stops short of the next segment's first record only when it is
//! damaged or an object is missing, which is an error. In the last segment, a frame that does not
//! read, with no well-formed frame after it, is a write cut short by a crash: it was never
//! acknowledged and is discarded. That can only happen to a local file; on an object store a put is
//! all or nothing, so any bad frame is damage.
//!
//! Only the segments that can hold records from the latest snapshot on are read: segment `i` is
//! skipped when segment `i + 1` starts at or before the snapshot (compaction deletes exactly those).

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;

use super::SnapshotFormat;
use super::error::{JournalError, Result};
use super::frame::{RecordKind, SNAPSHOT_HEADER, open_snapshot, parse_segment};
use super::store::{
    JOURNAL_DIR, SNAPSHOT_DIR, Store, blocking, parse_numbered, segment_name, snapshot_name,
};

/// How many objects are read at once from an object store.
const READ_CONCURRENCY: usize = 16;
/// How many times reading starts over when another writer changed the journal meanwhile.
const ATTEMPTS: u32 = 16;
/// No journal numbers this many records (at a million a second, that takes 290,000 years), so an
/// object whose name gives a sequence at or past it was not made by a writer. Below it, a
/// sequence plus the records of a segment never overflows.
pub(super) const MAX_SEQUENCE: u64 = 1 << 63;

/// What was durable in a journal.
#[derive(Debug)]
pub(super) struct Recovery<E, S> {
    pub snapshot: Option<S>,
    pub entries: Vec<E>,
    /// The sequence of the next record.
    pub next_sequence: u64,
    /// The bytes of a torn last write that were discarded.
    pub discarded_bytes: u64,
}

/// The stored objects one replay reads.
#[derive(Debug)]
pub(super) struct Stored {
    pub snapshot: Option<StoredObject>,
    pub segments: Vec<StoredObject>,
}

/// One stored object: its sequence (a segment's first record, a snapshot's covered prefix), URI and
/// bytes.
#[derive(Debug)]
pub(super) struct StoredObject {
    pub sequence: u64,
    pub object: String,
    pub bytes: Bytes,
}

/// The sequences listed in the journal's folders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Listing {
    /// Segment first records, ascending.
    pub segments: Vec<u64>,
    /// Snapshot sequences, ascending.
    pub snapshots: Vec<u64>,
}

impl Listing {
    pub async fn read(store: &Store) -> Result<Listing> {
        let mut segments: Vec<u64> = store
            .list(JOURNAL_DIR)
            .await?
            .iter()
            .filter_map(|name| parse_numbered(name, ".log"))
            .collect();
        segments.sort_unstable();
        let mut snapshots: Vec<u64> = store
            .list(SNAPSHOT_DIR)
            .await?
            .iter()
            .filter_map(|name| parse_numbered(name, ".snap"))
            .collect();
        snapshots.sort_unstable();
        Ok(Listing {
            segments,
            snapshots,
        })
    }

    /// The segments that can hold records from `start` on: the last one, and every one whose
    /// successor starts after `start`.
    pub fn live_segments(&self, start: u64) -> Vec<u64> {
        self.segments
            .iter()
            .enumerate()
            .filter(|&(index, _)| {
                self.segments
                    .get(index + 1)
                    .is_none_or(|&next| next > start)
            })
            .map(|(_, &first)| first)
            .collect()
    }
}

/// Reads the journal back. Starts over when another writer deletes or adds objects meanwhile (a
/// fenced writer may still be compacting), and fails with [`JournalError::Contended`] if that keeps
/// happening.
pub(super) async fn recover<E, S>(store: &Store) -> Result<Recovery<E, S>>
where
    E: DeserializeOwned + Send + 'static,
    S: SnapshotFormat + Send + 'static,
{
    for _ in 0..ATTEMPTS {
        let listing = Listing::read(store).await?;
        let Some(stored) = read_objects(store, &listing).await? else {
            tracing::debug!(
                uri = store.uri(),
                "a journal object vanished while reading; reading again"
            );
            continue;
        };
        let tears_possible = store.tears_possible();
        let uri = store.uri().to_string();
        match blocking(store.uri(), move || replay(&uri, stored, tears_possible)).await {
            Err(gap @ JournalError::MissingRecords { .. }) => {
                if Listing::read(store).await? == listing {
                    return Err(gap);
                }
                tracing::debug!(
                    uri = store.uri(),
                    "the journal changed while reading; reading again"
                );
            }
            outcome => return outcome,
        }
    }
    Err(JournalError::Contended {
        uri: store.uri().to_string(),
        attempts: ATTEMPTS,
    })
}

/// Reads the latest snapshot and the live segments; `None` when one of them vanished.
async fn read_objects(store: &Store, listing: &Listing) -> Result<Option<Stored>> {
    let snapshot = match listing.snapshots.last() {
        None => None,
        Some(&sequence) => {
            let name = snapshot_name(sequence);
            let Some(bytes) = store.read(&name).await? else {
                return Ok(None);
            };
            Some(StoredObject {
                sequence,
                object: store.object_uri(&name),
                bytes,
            })
        }
    };
    let start = listing.snapshots.last().copied().unwrap_or(0);
    let segments: Vec<Option<StoredObject>> = futures::stream::iter(listing.live_segments(start))
        .map(|first| async move {
            let name = segment_name(first);
            Ok::<_, JournalError>(store.read(&name).await?.map(|bytes| StoredObject {
                sequence: first,
                object: store.object_uri(&name),
                bytes,
            }))
        })
        .buffered(READ_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(segments
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .map(|segments| Stored { snapshot, segments }))
}

/// Decodes the stored objects into the snapshot and the entries after it.
pub(super) fn replay<E, S>(
    uri: &str,
    stored: Stored,
    tears_possible: bool,
) -> Result<Recovery<E, S>>
where
    E: DeserializeOwned,
    S: SnapshotFormat,
{
    if let Some(foreign) = stored
        .snapshot
        .iter()
        .chain(&stored.segments)
        .find(|object| object.sequence >= MAX_SEQUENCE)
    {
        return Err(JournalError::Corrupt {
            object: foreign.object.clone(),
            offset: 0,
            reason: format!(
                "its name gives sequence {}, past the largest a journal reaches ({MAX_SEQUENCE}): no Sluice AM wrote it; move it out of the journal",
                foreign.sequence
            ),
        });
    }
    let (start, snapshot) = match stored.snapshot {
        None => (0, None),
        Some(snapshot) => {
            let body =
                open_snapshot(&snapshot.bytes, snapshot.sequence).map_err(|(offset, reason)| {
                    JournalError::Corrupt {
                        object: snapshot.object.clone(),
                        offset,
                        reason,
                    }
                })?;
            let value = S::decode(body).map_err(|error| JournalError::Decode {
                object: snapshot.object.clone(),
                offset: SNAPSHOT_HEADER as u64,
                reason: format!("the snapshot does not decode: {error}"),
            })?;
            (snapshot.sequence, Some(value))
        }
    };
    if let Some(first) = stored.segments.first()
        && first.sequence > start
    {
        return Err(JournalError::MissingRecords {
            uri: uri.to_string(),
            from: start,
            to: first.sequence,
            detail: match start {
                0 => format!(
                    "there is no snapshot and the first segment is {}",
                    first.object
                ),
                _ => format!(
                    "the latest snapshot covers up to {start} and the next segment is {}",
                    first.object
                ),
            },
        });
    }
    let mut entries = Vec::new();
    let mut next_sequence = start;
    let mut discarded_bytes = 0;
    for (index, segment) in stored.segments.iter().enumerate() {
        let successor = stored.segments.get(index + 1);
        let limit = successor.map(|successor| successor.sequence - segment.sequence);
        let parsed =
            parse_segment(&segment.bytes, limit).map_err(|error| JournalError::Corrupt {
                object: segment.object.clone(),
                offset: 0,
                reason: error.reason,
            })?;
        let count = parsed.frames.len() as u64;
        match (successor, parsed.bad) {
            (Some(successor), bad) if segment.sequence + count < successor.sequence => {
                return Err(match bad {
                    Some(bad) => JournalError::Corrupt {
                        object: segment.object.clone(),
                        offset: bad.offset,
                        reason: bad.reason,
                    },
                    None => JournalError::MissingRecords {
                        uri: uri.to_string(),
                        from: segment.sequence + count,
                        to: successor.sequence,
                        detail: format!(
                            "{} ends at byte {} and the next segment is {}",
                            segment.object, parsed.end, successor.object
                        ),
                    },
                });
            }
            (None, Some(bad)) => {
                if let Some(valid) = bad.valid_frame_after {
                    return Err(JournalError::Corrupt {
                        object: segment.object.clone(),
                        offset: bad.offset,
                        reason: format!(
                            "{}, yet a well-formed frame follows at byte {valid}",
                            bad.reason
                        ),
                    });
                }
                if !tears_possible {
                    return Err(JournalError::Corrupt {
                        object: segment.object.clone(),
                        offset: bad.offset,
                        reason: format!(
                            "{} (an object-store write is never cut short)",
                            bad.reason
                        ),
                    });
                }
                discarded_bytes = segment.bytes.len() as u64 - bad.offset;
                tracing::warn!(
                    object = %segment.object,
                    offset = bad.offset,
                    bytes = discarded_bytes,
                    reason = %bad.reason,
                    "discarding the torn tail of the journal: a write cut short by a crash, never acknowledged"
                );
            }
            _ => {}
        }
        for (position, frame) in parsed.frames.iter().enumerate() {
            let sequence = segment.sequence + position as u64;
            if sequence < start || frame.kind != RecordKind::Entry {
                continue;
            }
            let entry = postcard::from_bytes(frame.body).map_err(|error| JournalError::Decode {
                object: segment.object.clone(),
                offset: frame.offset,
                reason: format!("entry {sequence} does not decode: {error}"),
            })?;
            entries.push(entry);
        }
        next_sequence = segment.sequence + count;
        if successor.is_none() && next_sequence < start {
            return Err(JournalError::MissingRecords {
                uri: uri.to_string(),
                from: next_sequence,
                to: start,
                detail: format!(
                    "the latest snapshot covers up to {start} but the last segment, {}, ends at {next_sequence}",
                    segment.object
                ),
            });
        }
    }
    Ok(Recovery {
        snapshot,
        entries,
        next_sequence,
        discarded_bytes,
    })
}
