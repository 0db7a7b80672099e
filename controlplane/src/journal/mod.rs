//! The AM's journal: every change to the task table is appended here, durably, before the AM
//! acknowledges it; a new AM replays it to stand exactly where the old one stood.
//!
//! The journal is generic over its entry type `E` and snapshot type `S` (any serde type), encoded
//! with `postcard`. [`open`] fences any earlier writer and returns what was durable; [`Journal::append`]
//! queues an entry and returns a [`Durable`] that resolves once it is; [`Journal::snapshot`] writes a
//! compacted state that replaces every entry before it, encoding it in the background.
//!
//! # Implementation
//!
//! **Layout.** Under the journal's URI: `identity.json` (the job the journal belongs to),
//! `journal/<first sequence>.log` (segments of records) and `snapshot/<sequence>.snap` (snapshots,
//! each replacing the records before `sequence`). Sequences number records from 0, zero-padded to 20
//! digits in names. Besides entries, a record can mark where a writer opened the journal.
//!
//! **Group commit.** [`Journal::append`] encodes the entry into the batch being filled and returns:
//! it takes a short lock and does no IO, so it can be called while the caller holds its own lock.
//! One background task writes. While it writes a batch, appends fill the next one, so any number of
//! concurrent appenders cost one write (and one `fdatasync` locally) per round trip to storage. A
//! write interval ([`JournalConfig::write_interval`], 50 ms on object stores) bounds the writes per
//! second further, whatever the rate of appends.
//!
//! **Writes.** In a local directory the open segment file is appended to with `write` and
//! `fdatasync`. On an object store (no append) each batch is a new object named after its first
//! record and created with `PutMode::Create`. New files, local or not, appear whole: an object put is
//! atomic, and a local file is written under a temporary name, synced, and linked into place.
//!
//! **Fencing.** A writer opening the journal reads it, then claims the next sequence `N` by creating
//! `journal/<N>.log` holding an open record, create-if-absent. If that name exists, another writer
//! got there first: it reads again and retries. On an object store the claim is the fence: the old
//! writer's next batch starts at `N` too (its batches are contiguous and the new writer read all of
//! them), so its create fails and it reports [`JournalError::Fenced`]. A local writer appends to its
//! open file and never creates `N`, so local writers also take a generation first: before reading,
//! the new writer creates `writers/<g + 1>` exclusively. After each write and `fdatasync`, a writer
//! of generation `g` checks that `writers/<g + 1>` does not exist before it acknowledges. Any write
//! it acknowledges was thus complete before the new writer began to read, so the new writer sees it.
//! Writes it made after that are never acknowledged, and replay ignores them: they lie past the start
//! of the new writer's segment (see the `recover` module). So a local writer is fenced as soon as a newer one
//! starts to open, even if that one then fails to replay; an object-store writer only once a newer
//! one has replayed and claimed. Identities are compared before either, so opening another job's
//! journal by mistake fences nobody.
//!
//! **Snapshots** take their sequence when they are queued, in the appenders' order, and hold the
//! state as of that point; they are written after every record before them is durable, so any
//! snapshot of a sequence holds the state every writer would have there. A task of their own
//! encodes them (on a blocking thread) and writes them, so that appenders do not wait for the
//! encoding and batches go on meanwhile; a local writer starts a new segment with the next batch.
//! Once a snapshot is durable, the segments it covers and older snapshots are deleted.

mod error;
mod frame;
mod recover;
mod store;
mod writer;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use error::{JournalError, Result};
pub use sluice_store::StorageOptions;
pub use writer::{Durable, JournalStats, Mark};

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use frame::{RecordKind, SEGMENT_MAGIC};
use store::{Created, IDENTITY_OBJECT, OpenRecord, Store, blocking, segment_name};
use writer::{Fence, Shared, Sink};

/// How a journal reads its snapshots back: the `postcard` encoding of the type, by default. A type
/// that grew fields at its end reads the snapshots written before them too, by overriding
/// [`SnapshotFormat::decode`], so that the journal keeps its layout.
pub trait SnapshotFormat: Serialize + DeserializeOwned {
    /// Decodes the body of a snapshot.
    ///
    /// # Errors
    ///
    /// The decoder's error when `body` is no snapshot of this type or of an earlier encoding.
    fn decode(body: &[u8]) -> postcard::Result<Self> {
        postcard::from_bytes(body)
    }
}

/// How many times opening reads the journal and tries to claim its next sequence.
const CLAIM_ATTEMPTS: u32 = 16;
/// The version of the journal's layout, stored in `identity.json`: the byte format of its segments
/// and snapshots and the `postcard` encoding of the entries and snapshots the AM appends (the
/// master's `Entry` and `Snapshot`). A journal of another layout is refused, naming both, since
/// `postcard` is not self-describing. Entry variants added at the end, and snapshot fields added at
/// the end that [`SnapshotFormat::decode`] reads without, keep the layout: this build still replays
/// the journal of the first layout in `tests/data/journal-format-1` (`tests/journal_format.rs`),
/// and an older build stops at an entry it does not know with [`JournalError::Decode`]. Bump it for
/// any other change of either encoding.
const LAYOUT_VERSION: u32 = 1;

/// The least time between two writes to an object store by default: at most 20 puts per second,
/// as object stores bill per request.
const OBJECT_STORE_WRITE_INTERVAL: Duration = Duration::from_millis(50);

/// How to open a journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    identity: String,
    writer: String,
    write_interval: Option<Duration>,
}

impl JournalConfig {
    /// A config for the job named by `identity` (for example the job name and a digest of the
    /// spec's data section). Opening a journal that holds another identity fails.
    pub fn new(identity: impl Into<String>) -> JournalConfig {
        JournalConfig {
            identity: identity.into(),
            writer: "sluice am".to_string(),
            write_interval: None,
        }
    }

    /// Sets the least time between the starts of two writes; appends made meanwhile join the next
    /// write. It bounds the writes per second whatever the rate of appends, and adds up to that
    /// much to an append's latency. Defaults: zero in a local directory (a write is one
    /// `fdatasync`), 50 ms on object stores (at most 20 puts per second).
    pub fn write_interval(mut self, interval: Duration) -> JournalConfig {
        self.write_interval = Some(interval);
        self
    }

    /// Describes this writer in the journal, so that the writer it fences can say who did
    /// (for example the host and listen address). The process id is recorded too.
    pub fn writer(mut self, description: impl Into<String>) -> JournalConfig {
        self.writer = description.into();
        self
    }
}

/// What was durable when the journal was opened.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered<E, S> {
    /// The latest snapshot, if any.
    pub snapshot: Option<S>,
    /// Every entry appended after that snapshot, in order.
    pub entries: Vec<E>,
    /// Bytes of a write cut short by a crash that were discarded (it was never acknowledged).
    pub discarded_bytes: u64,
}

/// An open journal: the only writer of its URI until another one opens it.
pub struct Journal<E, S> {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<Result<()>>>,
    types: PhantomData<fn(&E, &S)>,
}

impl<E, S> fmt::Debug for Journal<E, S> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Journal")
            .field("uri", &self.shared.uri())
            .field("stats", &self.shared.stats())
            .finish()
    }
}

/// Opens (creating it if absent) the journal under `uri`, such as `file:///var/lib/sluice/<job>`,
/// a plain path, or `s3://bucket/prefix`, and fences any earlier writer.
///
/// Must be called within a tokio runtime: the journal's writer task runs on it.
///
/// # Errors
///
/// [`JournalError::IdentityMismatch`] when the journal belongs to another job;
/// [`JournalError::Corrupt`], [`JournalError::MissingRecords`] or [`JournalError::Decode`] when what
/// is stored cannot be replayed; IO and store errors.
pub async fn open<E, S>(
    uri: &str,
    options: &StorageOptions,
    config: JournalConfig,
) -> Result<(Journal<E, S>, Recovered<E, S>)>
where
    E: Serialize + DeserializeOwned + Send + 'static,
    S: SnapshotFormat + Send + 'static,
{
    open_store(Store::open(uri, options)?, config).await
}

async fn open_store<E, S>(
    store: Store,
    config: JournalConfig,
) -> Result<(Journal<E, S>, Recovered<E, S>)>
where
    E: Serialize + DeserializeOwned + Send + 'static,
    S: SnapshotFormat + Send + 'static,
{
    if let Store::Local(local) = &store {
        let local = Arc::clone(local);
        blocking(store.uri(), move || local.create_folders()).await?;
    }
    if let Store::Object(object) = &store {
        object.check_create_if_absent().await?;
    }
    check_identity(&store, &config.identity).await?;
    let write_interval = config.write_interval.unwrap_or(match store {
        Store::Local(_) => Duration::ZERO,
        Store::Object(_) => OBJECT_STORE_WRITE_INTERVAL,
    });
    let mut record = OpenRecord {
        writer: config.writer,
        pid: std::process::id(),
        opened_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis() as u64),
        generation: None,
    };
    let claimant = match &store {
        Store::Local(local) => {
            let local = Arc::clone(local);
            let opener = record.clone();
            let generation = blocking(store.uri(), {
                let local = Arc::clone(&local);
                move || {
                    let generation = local.take_generation(&opener)?;
                    local.remove_temporaries()?;
                    Ok(generation)
                }
            })
            .await?;
            record.generation = Some(generation);
            Claimant::Local { local, generation }
        }
        Store::Object(_) => Claimant::Object,
    };
    let mut claim = SEGMENT_MAGIC.to_vec();
    frame::push_frame(
        &mut claim,
        RecordKind::Open,
        &postcard::to_stdvec(&record).map_err(|error| JournalError::Encode {
            uri: store.uri().to_string(),
            what: "the open record",
            reason: error.to_string(),
        })?,
    );
    for _ in 0..CLAIM_ATTEMPTS {
        let recovery = recover::recover::<E, S>(&store).await?;
        let sequence = recovery.next_sequence;
        let Some(sink) = claim_sequence(&store, &claimant, sequence, &claim).await? else {
            tracing::debug!(
                uri = store.uri(),
                sequence,
                "another writer appended while opening; reading again"
            );
            continue;
        };
        tracing::info!(
            uri = store.uri(),
            entries = recovery.entries.len(),
            snapshot = recovery.snapshot.is_some(),
            sequence,
            "opened the journal"
        );
        let shared = Arc::new(Shared::new(store.uri(), sequence));
        let writer = tokio::spawn(writer::run(Arc::clone(&shared), sink, write_interval));
        let journal = Journal {
            shared,
            writer: Some(writer),
            types: PhantomData,
        };
        let recovered = Recovered {
            snapshot: recovery.snapshot,
            entries: recovery.entries,
            discarded_bytes: recovery.discarded_bytes,
        };
        return Ok((journal, recovered));
    }
    Err(JournalError::Contended {
        uri: store.uri().to_string(),
        attempts: CLAIM_ATTEMPTS,
    })
}

/// Who claims the journal's next sequence.
enum Claimant {
    /// A local writer, once it took its generation.
    Local {
        local: Arc<store::LocalStore>,
        generation: u64,
    },
    /// An object-store writer.
    Object,
}

/// Creates the segment at `sequence` holding the open record; `None` when that name is taken.
async fn claim_sequence(
    store: &Store,
    claimant: &Claimant,
    sequence: u64,
    claim: &[u8],
) -> Result<Option<Sink>> {
    let name = segment_name(sequence);
    match claimant {
        Claimant::Local { local, generation } => {
            let created = {
                let local = Arc::clone(local);
                let name = name.clone();
                let content = claim.to_vec();
                blocking(store.uri(), move || local.create(&name, &content)).await?
            };
            Ok(match created {
                Created::Created(file) => Some(Sink::local(
                    store.clone(),
                    Fence {
                        local: Arc::clone(local),
                        generation: *generation,
                    },
                    file,
                    name,
                )),
                Created::Exists => None,
            })
        }
        Claimant::Object => Ok(
            match store.create(&name, Bytes::copy_from_slice(claim)).await? {
                Created::Created(()) => Some(Sink::object(store.clone())),
                Created::Exists => None,
            },
        ),
    }
}

/// The content of `identity.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityFile {
    layout: u32,
    identity: String,
}

/// Stores `identity` in a new journal, or checks it against the stored one.
async fn check_identity(store: &Store, identity: &str) -> Result<()> {
    let object = store.object_uri(IDENTITY_OBJECT);
    let stored =
        match store.read(IDENTITY_OBJECT).await? {
            Some(stored) => stored,
            None => {
                let content = serde_json::to_vec_pretty(&IdentityFile {
                    layout: LAYOUT_VERSION,
                    identity: identity.to_string(),
                })
                .expect("the identity file encodes");
                match store.create(IDENTITY_OBJECT, Bytes::from(content)).await? {
                    Created::Created(()) => return Ok(()),
                    Created::Exists => store.read(IDENTITY_OBJECT).await?.ok_or_else(|| {
                        JournalError::Contended {
                            uri: store.uri().to_string(),
                            attempts: 1,
                        }
                    })?,
                }
            }
        };
    let file: IdentityFile =
        serde_json::from_slice(&stored).map_err(|error| JournalError::Corrupt {
            object: object.clone(),
            offset: 0,
            reason: format!("not a journal identity file: {error}"),
        })?;
    if file.layout != LAYOUT_VERSION {
        return Err(JournalError::Unsupported {
            uri: store.uri().to_string(),
            reason: format!(
                "{object} has layout {}, this build reads layout {LAYOUT_VERSION}: open it with the version of Sluice that wrote it",
                file.layout
            ),
        });
    }
    if file.identity != identity {
        return Err(JournalError::IdentityMismatch {
            uri: store.uri().to_string(),
            stored: file.identity,
            expected: identity.to_string(),
        });
    }
    Ok(())
}

impl<E: Serialize, S: Serialize + Send + 'static> Journal<E, S> {
    /// Queues `entry` after every earlier append and returns a handle that resolves once it is
    /// durable. Does no IO and never waits for IO: it only encodes into the pending batch.
    pub fn append(&self, entry: &E) -> Durable {
        match postcard::to_stdvec(entry) {
            Ok(body) => self.shared.append(&body),
            Err(error) => Durable::failed(JournalError::Encode {
                uri: self.shared.uri().to_string(),
                what: "an entry",
                reason: error.to_string(),
            }),
        }
    }

    /// Queues a snapshot that replaces every entry appended before it; the segments and snapshots
    /// it replaces are deleted once it is durable. Takes the sequence and returns at once:
    /// `snapshot` is encoded and written in the background, so it must hold the state as of this
    /// call and keep holding it while later entries are appended (a copy, or a copy-on-write
    /// capture). An encoding failure resolves the returned [`Durable`] with
    /// [`JournalError::Encode`], and the entries the snapshot would have replaced stay.
    pub fn snapshot(&self, snapshot: S) -> Durable {
        let uri = Arc::clone(self.shared.uri_arc());
        self.shared.snapshot(Box::new(move || {
            postcard::to_extend(&snapshot, frame::snapshot_buffer()).map_err(|error| {
                JournalError::Encode {
                    uri: uri.to_string(),
                    what: "a snapshot",
                    reason: error.to_string(),
                }
            })
        }))
    }
}

impl<E, S> Journal<E, S> {
    /// The journal's URI.
    pub fn uri(&self) -> &str {
        self.shared.uri()
    }

    /// How far the journal is written: the records appended and those durable, numbered from
    /// this writer's generation on. An entry appended before `mark` is durable once a later mark
    /// has the same generation and a `durable` of at least this mark's `appended`.
    pub fn mark(&self) -> Mark {
        self.shared.mark()
    }

    /// What the writer has made durable so far.
    pub fn stats(&self) -> JournalStats {
        self.shared.stats()
    }

    /// Why the writer stopped, once a write failed or a newer writer fenced this one: every later
    /// append fails with it, so its owner must stop acting on what it can no longer record.
    pub fn failure(&self) -> Option<JournalError> {
        self.shared.failure()
    }

    /// Makes everything queued durable, then stops the writer.
    ///
    /// # Errors
    ///
    /// The error that stopped the writer, if a write failed.
    pub async fn close(mut self) -> Result<()> {
        self.shared.close();
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        match writer.await {
            Ok(outcome) => outcome,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(JournalError::WriterStopped {
                uri: self.shared.uri().to_string(),
            }),
        }
    }
}

impl<E, S> Drop for Journal<E, S> {
    /// Lets the writer finish what is queued in the background, then stop.
    fn drop(&mut self) {
        self.shared.close();
    }
}
