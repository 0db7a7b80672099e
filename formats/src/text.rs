//! Row formats without a row index in a footer: Arrow IPC files, CSV, JSON lines and TFRecord.
//!
//! The planner finds where each file's rows lie once ([`crate::layout`]): CSV, JSON lines and TFRecord
//! files are streamed through a scanner of their records, and an Arrow IPC file's footer lists its
//! record batches. A split then carries its bytes ([`SplitBytes`]), and a reader fetches only those, by
//! one ranged read (plus the footer and the dictionaries of an Arrow IPC file), checks them against the
//! plan, and decodes them on a blocking thread. A split planned without its bytes reads its whole file.
//!
//! Local files and object stores are read the same way, through `object_store`'s ranged reads, each of
//! the file as planned (see [`crate::identity`]).

use std::io::{Cursor, Read};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{BinaryBuilder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{GetResult, ObjectStore};

use crate::coverage::SplitBatch;
use crate::dataset::FormatKind;
use crate::error::{FormatError, Result};
use crate::fetch::FetchStats;
use crate::identity::Planned;
use crate::ipc::IpcFooters;
use crate::layout::{CsvScanner, FileLayout, JsonScanner, Scanner, TfRecordScanner};
use crate::plan::{Split, SplitBytes};
use crate::read::ReadPlan;

/// How many rows of a CSV or JSON lines file are read to infer its schema.
const INFER_ROWS: usize = 1000;

/// The name of the one column a TFRecord dataset has.
pub const TFRECORD_COLUMN: &str = "record";

/// A row format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowFileFormat {
    ArrowIpc,
    Csv,
    JsonLines,
    TfRecord,
}

/// One file of a row-format dataset, as planned: its bytes are read through `store`, and what the reads
/// cost goes to `stats`. Every read is of the file as planned ([`Planned`]): pinned with `If-Match`
/// when the plan pinned the file, and checked against the plan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowFile<'a> {
    pub store: &'a Arc<dyn ObjectStore>,
    pub stats: &'a Arc<FetchStats>,
    pub path: &'a Path,
    /// The file's URI, size and identity when it was planned.
    pub planned: Planned<'a>,
    /// The Arrow IPC footers the dataset keeps.
    pub footers: &'a IpcFooters,
}

impl RowFile<'_> {
    /// The file's URI.
    pub(crate) fn uri(&self) -> &str {
        self.planned.uri
    }

    /// The file's size when it was planned.
    pub(crate) fn size(&self) -> u64 {
        self.planned.size
    }

    /// Starts a read of `range` (the whole file with `None`) of the file as planned: a file of
    /// another size, or not the object the plan pinned, has changed.
    async fn get(&self, range: Option<Range<u64>>) -> Result<GetResult> {
        self.planned
            .get(self.store.as_ref(), self.path, range)
            .await
    }

    /// The error of a read of the file that failed while doing `context`.
    async fn failed(&self, context: String, error: object_store::Error) -> FormatError {
        self.planned
            .failed(self.store.as_ref(), self.path, context, error)
            .await
    }

    /// Reads the bytes `range`, which must be the file's as planned.
    pub(crate) async fn range(&self, range: Range<u64>) -> Result<Bytes> {
        let started = Instant::now();
        let result = self.get(Some(range.clone())).await?;
        let bytes = match result.bytes().await {
            Ok(bytes) => bytes,
            Err(error) => {
                let context = format!(
                    "reading bytes {}..{} of {}",
                    range.start,
                    range.end,
                    self.uri()
                );
                return Err(self.failed(context, error).await);
            }
        };
        self.stats.record(started, bytes.len() as u64);
        if bytes.len() as u64 != range.end - range.start {
            return Err(FormatError::FileChanged {
                uri: self.uri().to_string(),
                what: format!(
                    "bytes {}..{} came back as {} bytes",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// Reads several byte ranges, nearby ones of an object store in one request as `get_ranges`
    /// fetches them.
    pub(crate) async fn ranges(&self, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        object_store::coalesce_ranges(
            ranges,
            |range| self.range(range),
            self.planned.coalesce_gap(),
        )
        .await
    }

    /// Starts reading the whole file, chunk by chunk, for a blocking thread.
    async fn stream(&self) -> Result<BlockingObject> {
        let result = self.get(None).await?;
        Ok(BlockingObject {
            chunks: result.into_stream(),
            runtime: tokio::runtime::Handle::current(),
            stats: Arc::clone(self.stats),
            uri: self.uri().to_string(),
            unread: Bytes::new(),
        })
    }

    /// Reads the whole file.
    async fn whole(&self) -> Result<Bytes> {
        let started = Instant::now();
        let result = self.get(None).await?;
        let bytes = match result.bytes().await {
            Ok(bytes) => bytes,
            Err(error) => {
                return Err(self.failed(format!("reading {}", self.uri()), error).await);
            }
        };
        self.stats.record(started, bytes.len() as u64);
        Ok(bytes)
    }
}

/// An object's bytes for a blocking thread, one chunk of its stream at a time, so that a file of any
/// size is scanned in bounded memory.
struct BlockingObject {
    chunks: BoxStream<'static, object_store::Result<Bytes>>,
    runtime: tokio::runtime::Handle,
    stats: Arc<FetchStats>,
    uri: String,
    /// What [`Read::read`] has not handed out yet of the last chunk.
    unread: Bytes,
}

impl BlockingObject {
    /// The next chunk of the object, `None` at its end. Waits on the runtime: call it from a blocking
    /// thread only.
    fn next_chunk(&mut self) -> Result<Option<Bytes>> {
        let started = Instant::now();
        match self.runtime.block_on(self.chunks.next()) {
            None => Ok(None),
            Some(Ok(chunk)) => {
                self.stats.record(started, chunk.len() as u64);
                Ok(Some(chunk))
            }
            Some(Err(error)) => Err(FormatError::store(format!("reading {}", self.uri), error)),
        }
    }
}

impl Read for BlockingObject {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        while self.unread.is_empty() {
            match self.next_chunk().map_err(std::io::Error::other)? {
                None => return Ok(0),
                Some(chunk) => self.unread = chunk,
            }
        }
        let length = buffer.len().min(self.unread.len());
        buffer[..length].copy_from_slice(&self.unread[..length]);
        self.unread = self.unread.slice(length..);
        Ok(length)
    }
}

/// Whether a CSV's bytes start with its header row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Header {
    /// The bytes are the whole file, header first.
    First,
    /// The bytes are records of the file's data only.
    Absent,
}

impl RowFileFormat {
    pub(crate) fn from_kind(kind: FormatKind) -> Result<Self> {
        match kind {
            FormatKind::ArrowIpc => Ok(Self::ArrowIpc),
            FormatKind::Csv => Ok(Self::Csv),
            FormatKind::JsonLines => Ok(Self::JsonLines),
            FormatKind::TfRecord => Ok(Self::TfRecord),
            FormatKind::Parquet | FormatKind::Delta | FormatKind::Iceberg => {
                Err(FormatError::InvalidArgument(format!(
                    "{kind:?} is not a row format; it is read through its footer"
                )))
            }
        }
    }

    /// Infers or reads the schema of one file: from the footer of an Arrow IPC file, from the first
    /// rows of a CSV or JSON lines file, which are all that is read of it.
    pub(crate) async fn schema(self, file: &RowFile<'_>) -> Result<SchemaRef> {
        let (object, uri) = match self {
            Self::TfRecord => return Ok(tfrecord_schema()),
            Self::ArrowIpc => return Ok(Arc::clone(&file.footers.get(file).await?.schema)),
            Self::Csv | Self::JsonLines => (file.stream().await?, file.uri().to_string()),
        };
        blocking(move || {
            let reader = std::io::BufReader::new(object);
            if self == Self::Csv {
                let format = arrow::csv::reader::Format::default().with_header(true);
                let (schema, _) =
                    format
                        .infer_schema(reader, Some(INFER_ROWS))
                        .map_err(|error| {
                            FormatError::arrow(
                                format!("csv file {uri}: inferring the schema"),
                                error,
                            )
                        })?;
                return Ok(Arc::new(schema));
            }
            let (schema, _) = arrow::json::reader::infer_json_schema(reader, Some(INFER_ROWS))
                .map_err(|error| {
                    FormatError::arrow(
                        format!("json lines file {uri}: inferring the schema"),
                        error,
                    )
                })?;
            Ok(Arc::new(schema))
        })
        .await
    }

    /// Finds where the rows of one file lie, cut into groups of at most `task_rows` rows: CSV, JSON
    /// lines and TFRecord files are read once, in chunks; an Arrow IPC file's footer and batch headers
    /// are read.
    pub(crate) async fn layout(self, file: &RowFile<'_>, task_rows: u64) -> Result<FileLayout> {
        let scanner = match self {
            Self::ArrowIpc => return crate::ipc::layout(file).await,
            Self::Csv => Scanner::Csv(Box::new(CsvScanner::new())),
            Self::JsonLines => Scanner::JsonLines(JsonScanner::new()),
            Self::TfRecord => Scanner::TfRecord(TfRecordScanner::new()),
        };
        let mut object = file.stream().await?;
        let (uri, size) = (file.uri().to_string(), file.size());
        blocking(move || {
            crate::layout::scan(scanner, || object.next_chunk(), task_rows, &uri, size)
        })
        .await
    }

    /// Reads one split of one file; the batches' coverages tile the split.
    pub(crate) async fn read_split(
        self,
        file: &RowFile<'_>,
        split: &Split,
        partitions: Vec<(Field, Option<String>)>,
        plan: &ReadPlan,
        file_schema: SchemaRef,
    ) -> Result<BoxStream<'static, Result<SplitBatch>>> {
        let uri = split.uri.clone();
        let (task_id, row_count) = (split.task_id, split.row_count);
        let (decoded, skip) = match &split.bytes {
            None => {
                let bytes = file.whole().await?;
                let uri = uri.clone();
                let batches =
                    blocking(move || decode(self, bytes, &file_schema, &uri, Header::First))
                        .await?;
                (Decoded::Whole(batches), split.first_row)
            }
            Some(range) => {
                let skip = rows_within(split, range)?;
                let decoded = if self == Self::ArrowIpc {
                    Decoded::Whole(crate::ipc::read_range(file, range).await?)
                } else {
                    self.read_records(file, split, range, file_schema).await?
                };
                (decoded, skip)
            }
        };
        let plan = plan.clone();
        let finished = blocking(move || {
            let total = decoded.rows();
            // Records that do not decode end the read at the first of them the split holds: the
            // reader skips it and reads on after it (`Dataset::bad_data_unit`).
            let (batches, first_row, bad) = decoded.rows_after(skip);
            if skip.checked_add(row_count).is_none_or(|end| end > total) {
                return Err(FormatError::SplitInvalid {
                    task_id,
                    uri: uri.clone(),
                    reason: format!("rows [{skip}, +{row_count}) of what it reads exceed the {total} rows there; plan the dataset again"),
                });
            }
            let mut output = Vec::new();
            let mut batch_start = first_row;
            let end = skip + row_count;
            for batch in batches {
                let batch_end = batch_start + batch.num_rows() as u64;
                let (from, to) = (skip.max(batch_start), end.min(batch_end));
                if from < to {
                    let offset = usize::try_from(from - batch_start).unwrap_or(usize::MAX);
                    let length = usize::try_from(to - from).unwrap_or(usize::MAX);
                    let mut sliced = batch.slice(offset, length);
                    let mut piece_start = from - skip;
                    while sliced.num_rows() > 0 {
                        let take = sliced.num_rows().min(plan.batch_rows);
                        let piece = sliced.slice(0, take);
                        sliced = sliced.slice(take, sliced.num_rows() - take);
                        let covered = SplitBatch::new(piece, piece_start, take as u64, None)?;
                        piece_start += take as u64;
                        output.push(plan.finish(covered, &partitions, &uri)?);
                    }
                }
                batch_start = batch_end;
            }
            let mut output: Vec<Result<SplitBatch>> = output.into_iter().map(Ok).collect();
            if let Some((row, error)) = bad
                && row < end
            {
                output.push(Err(error));
            }
            Ok(output)
        })
        .await?;
        Ok(stream::iter(finished).boxed())
    }

    /// Reads the records a split's bytes hold: one ranged read, checked against the CRC32C the planner
    /// took of them, then decoded.
    async fn read_records(
        self,
        file: &RowFile<'_>,
        split: &Split,
        range: &SplitBytes,
        file_schema: SchemaRef,
    ) -> Result<Decoded> {
        let bytes = file.range(range.start..range.end).await?;
        let (uri, task_id, planned) = (split.uri.clone(), split.task_id, *range);
        blocking(move || {
            let found = crc32c::crc32c(&bytes);
            if let Some(expected) = planned.crc32c
                && found != expected
            {
                return Err(FormatError::FileChanged {
                    uri,
                    what: format!(
                        "split {task_id}: bytes {}..{} have CRC32C {found:08x}, {expected:08x} when planned",
                        planned.start, planned.end
                    ),
                });
            }
            let batches = match decode(self, bytes.clone(), &file_schema, &uri, Header::Absent) {
                Ok(batches) => batches,
                Err(error) if error.is_bad_data() => {
                    // Record by record, when the records are the planned ones; otherwise the
                    // split does not decode as a whole.
                    return match decode_each(self, &bytes, &file_schema, &uri) {
                        Some(records) if records.len() as u64 == planned.rows => {
                            Ok(Decoded::Each(records))
                        }
                        _ => Err(error),
                    };
                }
                Err(error) => return Err(error),
            };
            let rows: u64 = batches.iter().map(|batch| batch.num_rows() as u64).sum();
            if rows != planned.rows {
                return Err(FormatError::SplitInvalid {
                    task_id,
                    uri,
                    reason: format!(
                        "bytes {}..{} hold {rows} rows, and its plan {}: the file changed since it was planned, or was planned by another release; plan the dataset again",
                        planned.start, planned.end, planned.rows
                    ),
                });
            }
            Ok(Decoded::Whole(batches))
        })
        .await
    }
}

/// The rows of a row format's bytes: decoded all at once, or, when that failed on a record of a
/// CSV or JSON lines file, record by record, each record its row or why it does not decode.
enum Decoded {
    Whole(Vec<RecordBatch>),
    Each(Vec<Result<RecordBatch>>),
}

impl Decoded {
    /// The rows, the ones that do not decode included.
    fn rows(&self) -> u64 {
        match self {
            Decoded::Whole(batches) => batches.iter().map(|batch| batch.num_rows() as u64).sum(),
            Decoded::Each(records) => records.len() as u64,
        }
    }

    /// The rows to read from row `from` on: the batches (from row 0, or from `from` when decoded
    /// record by record) and the row they start at, up to the first row at or after `from` that
    /// does not decode, with that row and why, if there is one. The rows before `from` that do not
    /// decode were skipped before.
    fn rows_after(self, from: u64) -> (Vec<RecordBatch>, u64, Option<(u64, FormatError)>) {
        let records = match self {
            Decoded::Whole(batches) => return (batches, 0, None),
            Decoded::Each(records) => records,
        };
        let mut rows = Vec::new();
        let mut bad = None;
        for (row, record) in records.into_iter().enumerate().skip(from as usize) {
            match record {
                Ok(batch) => rows.push(batch),
                Err(error) => {
                    bad = Some((row as u64, error));
                    break;
                }
            }
        }
        // One batch of the rows of one record each, as a whole decode would give them.
        let joined = match rows.first() {
            Some(first) => match arrow::compute::concat_batches(&first.schema(), &rows) {
                Ok(batch) => vec![batch],
                Err(_) => rows,
            },
            None => rows,
        };
        (joined, from, bad)
    }
}

/// The records of a split's bytes of a CSV or JSON lines file decoded one by one, each its row or
/// why it does not decode ([`FormatError::BadRecord`], counted from the bytes' first record);
/// `None` for the formats whose records are not decoded alone (Arrow IPC, TFRecord).
fn decode_each(
    format: RowFileFormat,
    bytes: &Bytes,
    schema: &SchemaRef,
    uri: &str,
) -> Option<Vec<Result<RecordBatch>>> {
    let bad = |format: &'static str, record: usize, cause: String| FormatError::BadRecord {
        format,
        file: uri.to_owned(),
        record: record as u64,
        cause,
    };
    match format {
        RowFileFormat::Csv => {
            let reader = arrow::csv::ReaderBuilder::new(Arc::clone(schema))
                .with_header(false)
                .with_batch_size(1)
                .build(Cursor::new(bytes.clone()))
                .ok()?;
            // The CSV reader reads on after a record it could not decode.
            Some(
                reader
                    .enumerate()
                    .map(|(index, record)| {
                        record.map_err(|error| bad("csv", index, error.to_string()))
                    })
                    .collect(),
            )
        }
        RowFileFormat::JsonLines => Some(
            bytes
                .split(|byte| *byte == b'\n')
                .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
                .enumerate()
                .map(|(index, line)| {
                    let bad = |cause: String| bad("json lines", index, cause);
                    // A reader of one line: the JSON reader repeats an error rather than read on.
                    let mut reader = arrow::json::ReaderBuilder::new(Arc::clone(schema))
                        .with_batch_size(1)
                        .build(Cursor::new(line))
                        .map_err(|error| bad(error.to_string()))?;
                    match reader.next() {
                        Some(Ok(batch)) if batch.num_rows() == 1 => Ok(batch),
                        Some(Err(error)) => Err(bad(error.to_string())),
                        _ => Err(bad("the line is not one record".to_owned())),
                    }
                })
                .collect(),
        ),
        RowFileFormat::ArrowIpc | RowFileFormat::TfRecord => None,
    }
}

/// Where a split's rows start among the rows its bytes hold; an error when they do not all lie there.
fn rows_within(split: &Split, range: &SplitBytes) -> Result<u64> {
    let skip = split.first_row.checked_sub(range.first_row);
    let fits = skip.is_some_and(|skip| {
        skip.checked_add(split.row_count)
            .is_some_and(|end| end <= range.rows)
    });
    match skip {
        Some(skip) if fits && !range.is_empty() => Ok(skip),
        _ => Err(FormatError::SplitInvalid {
            task_id: split.task_id,
            uri: split.uri.clone(),
            reason: format!(
                "rows [{}, +{}) do not lie in its bytes {}..{}, which hold rows [{}, +{}); plan the dataset again",
                split.first_row,
                split.row_count,
                range.start,
                range.end,
                range.first_row,
                range.rows
            ),
        }),
    }
}

fn tfrecord_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        TFRECORD_COLUMN,
        DataType::Binary,
        false,
    )]))
}

/// Runs decoding work on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| FormatError::InvalidArgument(format!("decoding task failed: {error}")))?
}

fn decode(
    format: RowFileFormat,
    bytes: Bytes,
    schema: &SchemaRef,
    uri: &str,
    header: Header,
) -> Result<Vec<RecordBatch>> {
    match format {
        RowFileFormat::ArrowIpc => {
            let reader = arrow::ipc::reader::FileReader::try_new(Cursor::new(bytes), None)
                .map_err(|error| FormatError::arrow(format!("arrow ipc file {uri}"), error))?;
            reader
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|error| FormatError::arrow(format!("arrow ipc file {uri}"), error))
        }
        RowFileFormat::Csv => {
            let reader = arrow::csv::ReaderBuilder::new(Arc::clone(schema))
                .with_header(header == Header::First)
                .build(Cursor::new(bytes))
                .map_err(|error| FormatError::arrow(format!("csv file {uri}"), error))?;
            reader
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|error| FormatError::arrow(format!("csv file {uri}"), error))
        }
        RowFileFormat::JsonLines => {
            let reader = arrow::json::ReaderBuilder::new(Arc::clone(schema))
                .build(Cursor::new(bytes))
                .map_err(|error| FormatError::arrow(format!("json lines file {uri}"), error))?;
            reader
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|error| FormatError::arrow(format!("json lines file {uri}"), error))
        }
        RowFileFormat::TfRecord => {
            let records = tfrecord_records(&bytes, uri)?;
            let mut builder = BinaryBuilder::with_capacity(records.len(), bytes.len());
            for record in records {
                builder.append_value(record);
            }
            let batch =
                RecordBatch::try_new(tfrecord_schema(), vec![Arc::new(builder.finish())])
                    .map_err(|error| FormatError::arrow(format!("tfrecord file {uri}"), error))?;
            Ok(vec![batch])
        }
    }
}

/// The CRC mask TFRecord applies to CRC32C values.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Splits a TFRecord file into its record payloads, checking both CRCs of every record.
///
/// The framing of each record is: length (u64 little-endian), masked CRC32C of the length bytes (u32),
/// payload, masked CRC32C of the payload (u32).
///
/// # Errors
///
/// Returns [`FormatError::TfRecord`] naming the record's offset on a truncated record or a CRC mismatch.
pub fn tfrecord_records<'a>(bytes: &'a [u8], uri: &str) -> Result<Vec<&'a [u8]>> {
    let mut records = Vec::new();
    let mut offset = 0usize;
    let error = |offset: usize, reason: String| FormatError::TfRecord {
        file: uri.to_string(),
        offset: offset as u64,
        reason,
    };
    while offset < bytes.len() {
        let header = bytes.get(offset..offset + 12).ok_or_else(|| {
            error(
                offset,
                format!(
                    "truncated header: {} bytes left, 12 needed",
                    bytes.len() - offset
                ),
            )
        })?;
        let (length_bytes, crc_bytes) = header.split_at(8);
        let stored_length_crc =
            u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        if masked_crc32c(length_bytes) != stored_length_crc {
            return Err(error(
                offset,
                "length CRC mismatch: the file is corrupt or not a TFRecord file".to_string(),
            ));
        }
        let mut length_array = [0u8; 8];
        length_array.copy_from_slice(length_bytes);
        let length = u64::from_le_bytes(length_array);
        let payload_start = offset + 12;
        let payload_end = usize::try_from(length)
            .ok()
            .and_then(|length| payload_start.checked_add(length));
        let payload = payload_end
            .and_then(|end| bytes.get(payload_start..end))
            .ok_or_else(|| {
                error(
                    offset,
                    format!("truncated record: length {length} runs past the end of the file"),
                )
            })?;
        let crc_start = payload_start + payload.len();
        let data_crc = bytes.get(crc_start..crc_start + 4).ok_or_else(|| {
            error(
                offset,
                "truncated record: the data CRC is missing".to_string(),
            )
        })?;
        let stored_data_crc =
            u32::from_le_bytes([data_crc[0], data_crc[1], data_crc[2], data_crc[3]]);
        if masked_crc32c(payload) != stored_data_crc {
            return Err(error(
                offset,
                "data CRC mismatch: the record is corrupt".to_string(),
            ));
        }
        records.push(payload);
        offset = crc_start + 4;
    }
    Ok(records)
}

/// Frames payloads as a TFRecord file.
pub fn tfrecord_encode<'a>(payloads: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut output = Vec::new();
    for payload in payloads {
        let length = (payload.len() as u64).to_le_bytes();
        output.extend_from_slice(&length);
        output.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
        output.extend_from_slice(payload);
        output.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn masked_crc_of_the_standard_check_input() {
        // CRC32C("123456789") is 0xE3069283 (the standard check value); masking rotates right by 15 and
        // adds 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn tfrecord_round_trip_and_corruption() {
        let payloads: Vec<&[u8]> = vec![b"first", b"", b"third record"];
        let encoded = tfrecord_encode(payloads.iter().copied());
        let sut = tfrecord_records(&encoded, "mem").expect("valid");
        assert_eq!(sut, payloads);

        let mut corrupt = encoded.clone();
        corrupt[12 + 2] ^= 0xff;
        let error = tfrecord_records(&corrupt, "mem").expect_err("data crc");
        assert!(
            error.to_string().contains("data CRC mismatch") && error.to_string().contains("byte 0"),
            "{error}"
        );

        let truncated = &encoded[..encoded.len() - 3];
        let error = tfrecord_records(truncated, "mem").expect_err("truncated");
        assert!(error.to_string().contains("truncated"), "{error}");
    }

    /// The offset of each record of a framed file, and the file's length after them.
    fn record_offsets(payloads: &[Vec<u8>]) -> Vec<usize> {
        let mut offsets = vec![0];
        for payload in payloads {
            offsets.push(offsets.last().expect("an offset") + 16 + payload.len());
        }
        offsets
    }

    /// The offset of the record holding byte `index` of the file.
    fn record_holding(offsets: &[usize], index: usize) -> usize {
        offsets[offsets.partition_point(|&offset| offset <= index) - 1]
    }

    /// The offset a TFRecord error names, failing the case on any other error.
    fn error_offset(outcome: Result<Vec<&[u8]>>) -> std::result::Result<u64, TestCaseError> {
        match outcome {
            Err(FormatError::TfRecord { file, offset, .. }) => {
                prop_assert_eq!(file, "mem");
                Ok(offset)
            }
            other => Err(TestCaseError::fail(format!(
                "expected a tfrecord error, got {other:?}"
            ))),
        }
    }

    fn any_payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Payloads framed as a TFRecord file split back into the same payloads.
        #[test]
        fn framed_payloads_split_back(payloads in any_payloads()) {
            let encoded = tfrecord_encode(payloads.iter().map(Vec::as_slice));
            let sut = tfrecord_records(&encoded, "mem").expect("a framed file");
            prop_assert_eq!(sut, payloads.iter().map(Vec::as_slice).collect::<Vec<_>>());
        }

        /// Any bytes split into records or fail with an error naming an offset inside them, and
        /// the records they split into frame back into the same bytes.
        #[test]
        fn any_bytes_split_or_fail_within_the_file(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..512),
                // A header with a valid length CRC, so that the length checks are reached.
                (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(
                    |(length, rest)| {
                        let length = length.to_le_bytes();
                        let mut bytes = length.to_vec();
                        bytes.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
                        bytes.extend_from_slice(&rest);
                        bytes
                    }
                ),
            ],
        ) {
            match tfrecord_records(&bytes, "mem") {
                Ok(records) => prop_assert_eq!(tfrecord_encode(records), bytes),
                outcome => prop_assert!(error_offset(outcome)? < bytes.len() as u64),
            }
        }

        /// A framed file with one byte changed fails at the record that holds the byte: both CRCs
        /// catch any change within 32 bits.
        #[test]
        fn a_changed_byte_fails_at_its_record(
            payloads in any_payloads().prop_filter("some bytes", |payloads| !payloads.is_empty()),
            at in any::<proptest::sample::Index>(),
            flip in 1..=u8::MAX,
        ) {
            let mut encoded = tfrecord_encode(payloads.iter().map(Vec::as_slice));
            let index = at.index(encoded.len());
            encoded[index] ^= flip;
            let expected = record_holding(&record_offsets(&payloads), index) as u64;
            prop_assert_eq!(error_offset(tfrecord_records(&encoded, "mem"))?, expected);
        }

        /// A framed file cut short splits into the records before the cut when it falls between
        /// records, and fails at the cut record otherwise.
        #[test]
        fn a_cut_file_keeps_the_whole_records_or_fails_at_the_cut_one(
            payloads in any_payloads(),
            at in any::<proptest::sample::Index>(),
        ) {
            let encoded = tfrecord_encode(payloads.iter().map(Vec::as_slice));
            let cut = at.index(encoded.len() + 1);
            let offsets = record_offsets(&payloads);
            let outcome = tfrecord_records(&encoded[..cut], "mem");
            match offsets.iter().position(|&offset| offset == cut) {
                Some(whole) => prop_assert_eq!(
                    outcome.expect("whole records"),
                    payloads[..whole].iter().map(Vec::as_slice).collect::<Vec<_>>()
                ),
                None => {
                    prop_assert_eq!(error_offset(outcome)?, record_holding(&offsets, cut) as u64)
                }
            }
        }

        /// A record whose length is changed and its length CRC computed again passes the length
        /// CRC and fails at that record: its length runs past the file or its data CRC is wrong.
        #[test]
        fn a_resealed_length_fails_at_its_record(
            payloads in any_payloads().prop_filter("a record", |payloads| !payloads.is_empty()),
            target in any::<proptest::sample::Index>(),
            length in prop_oneof![0u64..2048, any::<u64>()],
        ) {
            let mut encoded = tfrecord_encode(payloads.iter().map(Vec::as_slice));
            let changed = target.index(payloads.len());
            prop_assume!(length != payloads[changed].len() as u64);
            let offset = record_offsets(&payloads)[changed];
            let length_bytes = length.to_le_bytes();
            encoded[offset..offset + 8].copy_from_slice(&length_bytes);
            encoded[offset + 8..offset + 12]
                .copy_from_slice(&masked_crc32c(&length_bytes).to_le_bytes());
            prop_assert_eq!(error_offset(tfrecord_records(&encoded, "mem"))?, offset as u64);
        }
    }
}
