//! The error type of the benchmark drivers.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::transport::Transport;

/// A boxed error from a transport's own crate (the ring, iceoryx2).
pub type TransportSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a benchmark could not run or could not be trusted.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A `--sizes` entry is not a record size the benchmark can use.
    #[error(
        "record size {given:?}: {reason}; give sizes in bytes, e.g. --sizes 64,4096,64KiB,1MiB"
    )]
    InvalidSize {
        /// The entry as written.
        given: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The hidden peer subcommand was given an argument it cannot use.
    #[error("bench peer: {reason}")]
    InvalidPeerArgs {
        /// What is wrong with the arguments.
        reason: String,
    },
    /// A system call or socket operation failed.
    #[error("{transport}: {operation}: {source}")]
    Io {
        /// The transport under test.
        transport: Transport,
        /// What was being done.
        operation: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The transport's own crate reported an error.
    #[error("{transport}: {operation}: {source}")]
    Transport {
        /// The transport under test.
        transport: Transport,
        /// What was being done.
        operation: String,
        /// The transport's error.
        source: TransportSource,
    },
    /// The consumer received something other than the record it expected.
    #[error(
        "{transport}: record {expected_sequence} of {size} bytes arrived as {found}; the transport lost, \
         reordered or corrupted records"
    )]
    Corrupt {
        /// The transport under test.
        transport: Transport,
        /// The record size of the run.
        size: usize,
        /// The sequence number the consumer expected.
        expected_sequence: u64,
        /// What arrived instead.
        found: String,
    },
    /// The stream ended before every record arrived.
    #[error("{transport}: the stream ended after {received} of {expected} records")]
    ShortStream {
        /// The transport under test.
        transport: Transport,
        /// The records sent.
        expected: u64,
        /// The records received.
        received: u64,
    },
    /// The producer process could not be started.
    #[error("{transport}: starting the producer process {program}: {source}")]
    PeerSpawn {
        /// The transport under test.
        transport: Transport,
        /// The executable that was run.
        program: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The producer process exited with a failure.
    #[error("{transport}: the producer process failed ({status}); its stderr: {stderr}")]
    PeerFailed {
        /// The transport under test.
        transport: Transport,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The producer process did not finish in time and was killed.
    #[error(
        "{transport}: the {size}-byte run did not finish within {timeout:?}; the producer process was \
         killed; its stderr: {stderr}"
    )]
    PeerTimeout {
        /// The transport under test.
        transport: Transport,
        /// The record size of the run.
        size: usize,
        /// The bound that was exceeded.
        timeout: Duration,
        /// What the producer printed on stderr.
        stderr: String,
    },
    /// The producer process printed something other than its report.
    #[error("{transport}: the producer process printed {stdout:?}, not its start time as JSON")]
    PeerReport {
        /// The transport under test.
        transport: Transport,
        /// What it printed.
        stdout: String,
    },
    /// A benchmark thread panicked.
    #[error("{transport}: the {role} thread panicked")]
    ThreadPanicked {
        /// The transport under test.
        transport: Transport,
        /// Which thread.
        role: &'static str,
    },
    /// `sluice-bench am` or one of its hidden processes was given arguments it cannot use.
    #[error("bench am: {reason}")]
    InvalidAmArgs {
        /// What is wrong with the arguments, and the fix.
        reason: String,
    },
    /// A run of the cache benchmark failed or could not be measured.
    #[error("bench cache: {reason}")]
    Cache {
        /// What went wrong, and where to look.
        reason: String,
    },
    /// A system call of the AM benchmark failed.
    #[error("bench am: {operation}: {source}")]
    AmIo {
        /// What was being done.
        operation: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Preparing a benchmark (its files, its scratch space, its runtime) failed.
    #[error("{operation}: {source}")]
    Setup {
        /// What was being done.
        operation: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing or reading a benchmark's Parquet file failed.
    #[error("{operation}: {source}")]
    Parquet {
        /// What was being done.
        operation: String,
        /// The parquet crate's error.
        source: parquet::errors::ParquetError,
    },
    /// Building benchmark data failed.
    #[error("{operation}: {source}")]
    Arrow {
        /// What was being done.
        operation: String,
        /// The arrow crate's error.
        source: arrow::error::ArrowError,
    },
    /// The formats layer failed.
    #[error("{operation}: {source}")]
    Format {
        /// What was being done.
        operation: String,
        /// The formats layer's error.
        source: sluice_formats::FormatError,
    },
    /// A program a benchmark compares against, or runs under, is not installed.
    /// A chaos run could not go on.
    #[error("bench chaos: {reason}\nthe executors' logs:\n{logs}")]
    Chaos {
        /// What went wrong.
        reason: String,
        /// Every log the executors left.
        logs: String,
    },
    /// The `sluice` binary the drivers run is not beside `sluice-bench`.
    #[error(
        "no sluice binary at {}: sluice-bench runs the sluice beside it; build it with \
         `cargo build --release -p sluice-cli` (`cargo build -p sluice-cli` beside a debug sluice-bench)",
        path.display()
    )]
    SluiceMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    #[error("{program} is needed for {purpose} and did not run ({reason}); {fix}")]
    ToolMissing {
        /// The program.
        program: String,
        /// What it is needed for.
        purpose: String,
        /// How it failed.
        reason: String,
        /// How to install it.
        fix: String,
    },
    /// A program the benchmark ran exited with a failure.
    #[error("`{command}` failed ({status}); its stderr: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The trainer of a Sluice job failed; what the job's node daemon and AM printed tells why.
    #[error("{trainer}\n--- the node daemon: {daemon}\n--- the AM: {am}")]
    JobFailed {
        /// The trainer's failure.
        trainer: Box<BenchError>,
        /// What the daemon printed.
        daemon: String,
        /// What the AM printed.
        am: String,
    },
    /// A program the benchmark ran did not finish in time and was killed.
    #[error("`{command}` did not finish within {timeout:?} and was killed; its stderr: {stderr}")]
    CommandTimeout {
        /// The command line.
        command: String,
        /// The bound that was exceeded.
        timeout: Duration,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A program the benchmark ran printed something it cannot use.
    #[error("`{command}` printed {stdout:?}: {reason}")]
    CommandOutput {
        /// The command line.
        command: String,
        /// What it printed.
        stdout: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The two sides of a comparison produced different results, so their timings cannot be compared.
    #[error("{what}: the sides disagree: {detail}")]
    Disagree {
        /// What was compared.
        what: String,
        /// How they differ.
        detail: String,
    },
    /// A benchmark option has a value it cannot use.
    #[error("{option}: {reason}")]
    InvalidOption {
        /// The option, as on the command line.
        option: String,
        /// What is wrong with it and what to give instead.
        reason: String,
    },
    /// The chart of `sluice-bench suite --png` could not be drawn.
    #[error("chart: {reason}")]
    Chart {
        /// What went wrong, and the fix.
        reason: String,
    },
    /// The AM benchmark could not set up or drive the AM.
    #[error("bench am: {operation}: {reason}")]
    AmSetup {
        /// What was being done.
        operation: String,
        /// Why it failed.
        reason: String,
    },
    /// A process of the AM benchmark (the AM or a client) failed or did not answer in time.
    #[error("bench am: the {role} process {problem}; its stderr ends with: {stderr}")]
    AmProcess {
        /// Which process: `AM` or `client N`.
        role: String,
        /// What went wrong.
        problem: String,
        /// The end of what it printed on stderr.
        stderr: String,
    },
}

/// The result type of the benchmark drivers.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
