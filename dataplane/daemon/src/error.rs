//! Why the daemon stops ([`DaemonError`]) and why it fails a task ([`FeedError`]), each message
//! naming the thing and the fix.
//!
//! The errors a variant wraps are written into its message and are not its [`source`], so that a
//! caller printing the whole chain (`{error:#}`) shows every cause once.
//!
//! [`source`]: std::error::Error::source

use std::net::SocketAddr;
use std::path::PathBuf;

use arrow::error::ArrowError;
use sluice_formats::FormatError;
use sluice_proto::connect::ConnectError;
use sluice_proto::{NodeId, TaskId};
use sluice_ring::ledger::LedgerError;
use sluice_ring::{RingCreateError, RingOpenError};

use crate::transform::TransformError;
use crate::writer::WriterError;

/// The daemon's results.
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The AM's address or TLS settings cannot be used.
    #[error(transparent)]
    AmAddress(ConnectError),
    /// The AM could not be reached for longer than the timeout.
    #[error("no answer from the AM at {am} for {seconds} s: {cause}")]
    Unreachable {
        /// The address.
        am: String,
        /// How long the daemon tried.
        seconds: u64,
        /// The last error, with its fix.
        cause: String,
    },
    /// The AM answered a call with an error.
    #[error("the AM refused this daemon: {}", .status.message())]
    Refused {
        /// The AM's answer.
        status: tonic::Status,
    },
    /// A job name from the AM or the command line cannot name the job's ring directory.
    #[error("{from} names the job {name:?}, which {problem}: {fix}")]
    JobName {
        /// Where the name came from.
        from: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// A daemon started without a node id found the rings of several nodes on its host.
    #[error(
        "{dir} holds the rings of {}, more than one node: start this daemon with --node-id to say which node it serves",
        .nodes.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and ")
    )]
    SeveralNodes {
        /// The job's ring directory.
        dir: PathBuf,
        /// The nodes whose rings it holds.
        nodes: Vec<NodeId>,
    },
    /// The AM declared this daemon lost while it served.
    #[error(
        "the AM refused this daemon: the AM declared this daemon lost; start it again to rejoin the job"
    )]
    Fenced,
    /// The job names no source to read.
    #[error("the AM refused this daemon: the job has no sources")]
    NoSources,
    /// The job pads with a column its data already has.
    #[error(
        "the job's data.even_batches: pad marks pad rows in the column `_sluice_pad`, and the batches of {uri} already have a column of that name: rename it with the source's `columns` or a transform, or set data.even_batches to off"
    )]
    PadColumnTaken {
        /// The first source.
        uri: String,
    },
    /// The AM gave this daemon tasks while it feeds no ring.
    #[error(
        "the AM refused this daemon: {node} feeds no trainer rank; raise the roles' `num` or lower `nodes`"
    )]
    NoRanks {
        /// This node.
        node: NodeId,
    },
    /// The AM gave back a task that a ring taken over holds otherwise.
    #[error(
        "the AM refused this daemon: the AM gives back {task_id} as rows {start}..{end}, but ring {rank} holds it from row {bound_start} with rows up to {enqueued_end} enqueued; the ring and the AM disagree"
    )]
    Disagreement {
        /// The task.
        task_id: TaskId,
        /// The first row the AM gives.
        start: u64,
        /// The end the AM gives.
        end: u64,
        /// The rank of the ring that holds the task.
        rank: u32,
        /// The first row the ring's ledger holds.
        bound_start: u64,
        /// The end of the rows the ring's ledger counts as enqueued.
        enqueued_end: u64,
    },
    /// The rings of earlier runs could not be collected.
    #[error("collecting dead rings in {}: {error}", .dir.display())]
    CollectRings {
        /// The job's ring directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The job's ring directory could not be created, or is not this user's.
    #[error("ring directory {}: {error}; check --ring-dir", .dir.display())]
    CreateRingDir {
        /// The job's ring directory.
        dir: PathBuf,
        /// Why.
        error: sluice_ring::files::FileError,
    },
    /// A ring or ledger left in the job's ring directory is not this user's: it is not taken over.
    #[error("not taking over a ring left in the ring directory: {0}")]
    Untrusted(sluice_ring::files::FileError),
    /// The trainers' announcements could not be read.
    #[error("reading the trainers' announcements in {}: {error}; check --ring-dir and its permissions", .dir.display())]
    Announcements {
        /// The job's ring directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The job's ring directory could not be listed.
    #[error("listing ring directory {}: {error}", .dir.display())]
    ListRingDir {
        /// The job's ring directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// An entry of the job's ring directory could not be read.
    #[error("listing {}: {error}", .dir.display())]
    ListRingEntry {
        /// The job's ring directory.
        dir: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// A ring could not be created.
    #[error("{0}")]
    RingCreate(RingCreateError),
    /// A ring could not be opened.
    #[error("{0}")]
    RingOpen(RingOpenError),
    /// A ring's ledger could not be created, opened, read or written.
    #[error("{0}")]
    Ledger(LedgerError),
    /// A ring's writer could not take the ring over, or failed writing it.
    #[error("{0}")]
    Writer(WriterError),
    /// The thread that waited for a ring's writer to end failed.
    #[error("rank {rank}: {error}")]
    WriterJoin {
        /// The ring's rank.
        rank: u32,
        /// Why.
        error: tokio::task::JoinError,
    },
    /// A ring's writer panicked.
    #[error("the writer of rank {rank} panicked")]
    WriterPanicked {
        /// The ring's rank.
        rank: u32,
    },
    /// A ring or ledger given back could not be removed.
    #[error("removing {} to give the ring back: {error}", .file.display())]
    RemoveRing {
        /// The file.
        file: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The job's transforms cannot run on its sources' batches.
    #[error("the job's data.transforms: {0}")]
    Transform(TransformError),
    /// The threads that read and decode tasks could not be started.
    #[error("starting the decode threads: {0}; check the process's thread limit (ulimit -u)")]
    Threads(std::io::Error),
    /// The metrics endpoint's address could not be bound.
    #[error(
        "serving the daemon's metrics: binding {address}: {error}; choose another --http address"
    )]
    MetricsBind {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The local disk cache cannot be opened.
    #[error("{0}")]
    Cache(sluice_formats::CacheOpenError),
    /// Opening the local disk cache stopped on a panic.
    #[error("opening the cache of remote sources stopped: {0}")]
    CacheOpenPanicked(String),
    /// The metrics endpoint's bound address could not be read.
    #[error("serving the daemon's metrics: {0}")]
    MetricsAddress(std::io::Error),
    /// A source of the job could not be opened.
    #[error("opening source {uri}: {source}")]
    Source {
        /// The source.
        uri: String,
        /// The formats layer's error.
        source: sluice_formats::FormatError,
    },
}

/// Why a task's rows cannot be fed to its ring; the daemon reports the task failed for it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FeedError {
    /// A transform failed on the task's batches.
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// Reading or decoding the task's split failed.
    #[error(transparent)]
    Read(#[from] FormatError),
    /// The AM assigned a task without its split.
    #[error("task {task_id} came without its split")]
    NoSplit {
        /// The task.
        task_id: u64,
    },
    /// The AM assigned a task of a source the job does not have.
    #[error("task {task_id} names unknown source {source_index}")]
    UnknownSource {
        /// The task.
        task_id: u64,
        /// The source's index.
        source_index: u32,
    },
    /// A source added to the running job cannot be read here.
    #[error(
        "task {task_id}: source {source_index} ({uri}), added to the running job, cannot be read by this daemon: {reason}"
    )]
    AddedSource {
        /// The task.
        task_id: u64,
        /// The source's index.
        source_index: u32,
        /// The source.
        uri: String,
        /// Why.
        reason: String,
    },
    /// The AM assigned rows outside the task's split.
    #[error("task {task_id} has rows [{start}, {end}) of a split of {rows} rows")]
    RowsOutsideSplit {
        /// The task.
        task_id: u64,
        /// The first row.
        start: u64,
        /// The end row.
        end: u64,
        /// The split's rows.
        rows: u64,
    },
    /// A split too large for the shuffle's row numbers.
    #[error(
        "task {task_id}: a split of {rows} rows is too large to shuffle within; lower data.task_rows"
    )]
    TooLargeToShuffle {
        /// The task.
        task_id: u64,
        /// The split's rows.
        rows: u64,
    },
    /// The reader returned a row outside the split.
    #[error("the read returned split row {row} of a split of {rows} rows")]
    RowOutsideSplit {
        /// The row.
        row: u64,
        /// The split's rows.
        rows: usize,
    },
    /// The split's batches could not be joined for the shuffle.
    #[error("joining the split's batches: {0}")]
    Join(ArrowError),
    /// The split's rows could not be put in their shuffled order.
    #[error("ordering the split's rows: {0}")]
    Order(ArrowError),
    /// The ring's writer ended before the task did.
    #[error("the ring writer stopped")]
    WriterStopped,
    /// A batch could not take the pad column of `data.even_batches: pad`.
    #[error("task {task_id}: adding the column _sluice_pad of data.even_batches: pad: {error}")]
    PadColumn {
        /// The task.
        task_id: u64,
        /// Why.
        error: ArrowError,
    },
}
