//! The error type of the formats layer.

/// The result type of the formats layer.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Everything that can go wrong while locating, planning or reading a source.
///
/// Each message names the thing that failed (URI, file, column, byte position) and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The source URI could not be parsed or names an unsupported scheme.
    #[error("source {uri}: {reason}")]
    SourceUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// A storage option key or value was rejected by the object store builder.
    #[error("source {uri}: storage option {key}: {reason}")]
    StorageOption {
        /// The URI whose store was being built.
        uri: String,
        /// The option key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The object store failed (listing, reading or writing).
    #[error("{context}: {cause}")]
    ObjectStore {
        /// What was being done, naming the object.
        context: String,
        /// The store's error (in the message, so it is not repeated as a source).
        cause: object_store::Error,
    },
    /// A dataset resolved to no data files.
    #[error("source {uri}: no data files found; check the path, the glob or the file extension")]
    EmptyDataset {
        /// The URI that matched nothing.
        uri: String,
    },
    /// A Parquet file is corrupt or uses a feature this reader does not support.
    #[error("parquet file {file}: {cause}")]
    Parquet {
        /// The file.
        file: String,
        /// The decoder's error, which names the unsupported feature or the corruption.
        cause: parquet::errors::ParquetError,
    },
    /// A Parquet footer claims what the file's bytes cannot back: a negative count, a column chunk
    /// or an index past the end of the file, more values than a chunk's bytes can hold, more rows
    /// than a column holds values.
    #[error(
        "parquet file {file}: footer field {field} is {value}: {reason}; the file is corrupt or was written wrongly: write it again (a job leaves it out under data.on_bad_data: skip)"
    )]
    ParquetFooter {
        /// The file.
        file: String,
        /// The footer field, by its name in `parquet.thrift`, with the row group and column it is in.
        field: String,
        /// The value the field holds.
        value: i64,
        /// Why the file cannot hold it.
        reason: String,
    },
    /// A file's pages end before the rows its footer claims: the claimed rows that are not there
    /// do not decode.
    #[error(
        "{file}: {claim}, but its pages end after {delivered} of them; the file is corrupt or was cut short: write it again (under data.on_bad_data: skip a job skips the rows it claims)"
    )]
    RowsMissing {
        /// The file, with its format.
        file: String,
        /// What the footer claims, naming the field.
        claim: String,
        /// The rows the pages held of the claim.
        delivered: u64,
    },
    /// An Arrow operation failed (cast, filter, encoding, a malformed IPC/CSV/JSON file).
    #[error("{context}: {cause}")]
    Arrow {
        /// What was being done, naming the file or column.
        context: String,
        /// Arrow's error.
        cause: arrow::error::ArrowError,
    },
    /// A filter expression nests deeper, or compares more often, than a reader evaluates.
    #[error("the filter {what}; {fix}")]
    FilterTooLarge {
        /// What is too large, with the limit.
        what: String,
        /// How to write it within the limit.
        fix: String,
    },
    /// A filter expression failed to parse.
    #[error("filter syntax error at byte {position}: {message}\n  {expression}\n  {caret:>width$}", caret = "^", width = position + 1)]
    FilterSyntax {
        /// The whole expression.
        expression: String,
        /// The byte offset of the error.
        position: usize,
        /// What was expected.
        message: String,
    },
    /// A filter expression is well formed but cannot be applied to this data.
    #[error("filter: {0}")]
    FilterApply(String),
    /// A column named in a projection or a filter does not exist.
    #[error("column {column:?} not found; available columns: {available}")]
    ColumnNotFound {
        /// The missing column.
        column: String,
        /// The columns there are, comma-separated.
        available: String,
    },
    /// Cutting the files' rows into splits of `task_rows` rows would make more splits than a job
    /// runs ([`crate::plan::MAX_PLAN_SPLITS`]); refused before any split is made.
    #[error(
        "the plan would make {splits} splits of at most {task_rows} rows, more than the {max} a job runs; {largest} claims the most rows ({largest_rows}): raise the task rows (data.task_rows, --task-rows) to about {fitting_task_rows}, or, if that file does not hold that many rows, its footer lies: write it again or remove it",
        max = crate::plan::MAX_PLAN_SPLITS
    )]
    PlanTooLarge {
        /// The splits the plan would make.
        splits: u64,
        /// The task rows asked for.
        task_rows: u64,
        /// The task rows with which the plan would fit.
        fitting_task_rows: u64,
        /// The file that claims the most rows.
        largest: String,
        /// The rows it claims.
        largest_rows: u64,
    },
    /// A split does not fit the file it names (row range out of bounds).
    #[error("split {task_id} on {uri}: {reason}")]
    SplitInvalid {
        /// The task id of the split.
        task_id: u64,
        /// The file.
        uri: String,
        /// What is wrong.
        reason: String,
    },
    /// A Delta table could not be read, or uses a table feature this reader cannot honour.
    #[error("delta table {table}: {reason}")]
    Delta {
        /// The table URI.
        table: String,
        /// The kernel's error, which names the feature when one is unsupported.
        reason: String,
    },
    /// An Iceberg table could not be read, or uses a feature this reader cannot honour.
    #[error("iceberg table {table}: {reason}")]
    Iceberg {
        /// The table URI.
        table: String,
        /// What is wrong, naming the file and the fix.
        reason: String,
    },
    /// A commit of a followed Delta table changes rows other than by appending.
    #[error(
        "delta table {table}: version {version} ({operation}) removes data file {path}: following supports appends only; end following before this version (follow.until_version: {last}) or plan the job again",
        last = version.saturating_sub(1)
    )]
    FollowUnsupported {
        /// The table URI.
        table: String,
        /// The commit's version.
        version: u64,
        /// The commit's operation, as its writer recorded it.
        operation: String,
        /// A file the commit removes.
        path: String,
    },
    /// A TFRecord file is corrupt.
    #[error("tfrecord file {file}: record at byte {offset}: {reason}")]
    TfRecord {
        /// The file.
        file: String,
        /// Byte offset of the record's start.
        offset: u64,
        /// What is wrong (length or data CRC mismatch, truncation).
        reason: String,
    },
    /// A record of a CSV, JSON lines or Arrow IPC file cannot be found or read.
    #[error("{format} file {file}: record at byte {offset}: {reason}")]
    Record {
        /// The format, as its files are called (`csv`, `json lines`, `arrow ipc`).
        format: &'static str,
        /// The file.
        file: String,
        /// Byte offset of the record's start.
        offset: u64,
        /// What is wrong, and the fix.
        reason: String,
    },
    /// One record of a CSV or JSON lines split does not decode; the records around it do.
    #[error("{format} file {file}: record {record} of its split does not decode: {cause}")]
    BadRecord {
        /// The format, as its files are called (`csv`, `json lines`).
        format: &'static str,
        /// The file.
        file: String,
        /// The record, counted from the first record of the split's bytes.
        record: u64,
        /// Why it does not decode.
        cause: String,
    },
    /// A file is not as it was when it was planned: it was overwritten or changed since, so its
    /// splits' rows are no longer the planned ones.
    #[error(
        "{uri}: {what}: the file changed since it was planned; restore it, or plan again (a job plans again when run without a checkpoint location or under a new one)"
    )]
    FileChanged {
        /// The file.
        uri: String,
        /// What differs from the plan.
        what: String,
    },
    /// A bad argument from the caller (options, generator parameters).
    #[error("{0}")]
    InvalidArgument(String),
    /// A local I/O operation failed.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        cause: std::io::Error,
    },
}

impl From<sluice_store::LocationError> for FormatError {
    fn from(error: sluice_store::LocationError) -> Self {
        match error {
            sluice_store::LocationError::SourceUri { uri, reason } => {
                Self::SourceUri { uri, reason }
            }
            sluice_store::LocationError::StorageOption { uri, key, reason } => {
                Self::StorageOption { uri, key, reason }
            }
        }
    }
}

impl FormatError {
    /// Whether the error is about the bytes of the data: a file, row group or record that does not
    /// decode, which reading again cannot mend. Not a store that fails, a file that changed since it
    /// was planned, or a plan that does not fit the file.
    pub fn is_bad_data(&self) -> bool {
        match self {
            Self::Parquet { cause, .. } => {
                !matches!(cause, parquet::errors::ParquetError::External(_))
            }
            Self::TfRecord { .. }
            | Self::Record { .. }
            | Self::BadRecord { .. }
            | Self::ParquetFooter { .. }
            | Self::RowsMissing { .. } => true,
            Self::Arrow { cause, .. } => matches!(
                cause,
                arrow::error::ArrowError::CsvError(_)
                    | arrow::error::ArrowError::JsonError(_)
                    | arrow::error::ArrowError::ParseError(_)
                    | arrow::error::ArrowError::IpcError(_)
            ),
            _ => false,
        }
    }

    /// Whether the error is one record's that does not decode ([`FormatError::BadRecord`]): the
    /// rows after it decode, so a reader skips that record alone.
    pub fn is_one_record(&self) -> bool {
        matches!(self, Self::BadRecord { .. })
    }

    /// Wraps an object store error with what was being done.
    pub fn store(context: impl Into<String>, source: object_store::Error) -> Self {
        Self::ObjectStore {
            context: context.into(),
            cause: source,
        }
    }

    /// Wraps an Arrow error with what was being done.
    pub fn arrow(context: impl Into<String>, source: arrow::error::ArrowError) -> Self {
        Self::Arrow {
            context: context.into(),
            cause: source,
        }
    }

    /// Wraps a Parquet error with the file it came from. An error of this layer that a read handed
    /// the decoder (a file that changed since it was planned) comes back as it was.
    pub fn parquet(file: impl Into<String>, source: parquet::errors::ParquetError) -> Self {
        let cause = match source {
            parquet::errors::ParquetError::External(external) => {
                match external.downcast::<FormatError>() {
                    Ok(error) => return *error,
                    Err(external) => parquet::errors::ParquetError::External(external),
                }
            }
            other => other,
        };
        Self::Parquet {
            file: file.into(),
            cause,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            cause: source,
        }
    }
}
