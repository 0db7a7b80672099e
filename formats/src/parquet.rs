//! Parquet reading through `object_store`: footers, row-range selections, projection and predicate pushdown.
//!
//! # Implementation
//!
//! A split names `[first_row, first_row + row_count)` of one file. The reader maps that range onto the row
//! groups it overlaps and gives each one a row-group-local [`RowSelection`]. Before decoding it drops what
//! the filter proves empty, in three steps, each conservative:
//!
//! 1. row groups whose column-chunk statistics (min, max, null count) exclude every match;
//! 2. row groups whose bloom filters hold none of the values of an `=` or `in` conjunct;
//! 3. pages whose page-index statistics exclude every match of a one-column conjunct, by intersecting the
//!    row selection with the pages that remain.
//!
//! The decoder ([`ParquetRecordBatchStreamBuilder`] over [`ParquetObjectReader`]) then fetches only the
//! byte ranges of the projected columns in the selected pages. The filter is always evaluated on the decoded
//! rows too, so pruning only saves work and never changes results.
//!
//! The decoder yields exactly the selected rows, in row-group order. The runs of split rows the final
//! selections keep are therefore known before decoding, and each decoded batch is given the split rows it
//! came from by counting its rows off those runs ([`Coverage`]): rows skipped by a deletion vector, a
//! pruned row group or a pruned page fall inside the coverage of the next batch, or of an empty batch at
//! the end.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::{
    AsyncFileReader, MetadataFetch, ParquetRecordBatchStreamBuilder, RowGroupSelection,
};
use parquet::basic::Type as PhysicalType;
use parquet::bloom_filter::Sbbf;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use crate::coverage::{Coverage, SplitBatch, covered_stream};
use crate::error::{FormatError, Result};
use crate::fetch::{FetchStats, Measured};
use crate::filter::{CompareOp, Expr, Literal, PruningStatistics};
use crate::identity::Planned;
use crate::local::{FileGuard, LocalFileReader};
use crate::plan::ObjectIdentity;
use crate::read::ReadPlan;
use sluice_io::{FileIdentity, LocalReader};

/// How many bytes at the end of a file are fetched at first, to read a footer in one request.
const FOOTER_PREFETCH_BYTES: usize = 64 * 1024;

/// Reads a Parquet footer through `fetch`, asking first for the last 64 KiB so that most footers come in
/// one request, with the page-index policies of `options`.
pub(crate) async fn load_metadata<F: MetadataFetch>(
    fetch: F,
    file_size: u64,
    options: Option<&ArrowReaderOptions>,
) -> parquet::errors::Result<Arc<ParquetMetaData>> {
    let mut reader = ParquetMetaDataReader::new().with_prefetch_hint(Some(FOOTER_PREFETCH_BYTES));
    if let Some(options) = options {
        reader = reader
            .with_metadata_options(Some(options.metadata_options().clone()))
            .with_column_index_policy(options.column_index_policy())
            .with_offset_index_policy(options.offset_index_policy());
    }
    Ok(Arc::new(reader.load_and_finish(fetch, file_size).await?))
}

/// An [`AsyncFileReader`] over one object: single ranges with `get_range`, several with `get_ranges`, which
/// coalesces nearby ranges into fewer requests. A pinned object ([`ObjectIdentity`]) is read with
/// `If-Match` on every request, footer and data alike, and what each read found is checked against the
/// plan.
#[derive(Debug, Clone)]
pub(crate) struct StoreReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    file_size: u64,
    /// The object's URI and identity as planned, when the plan pinned it.
    pinned: Option<(String, ObjectIdentity)>,
}

impl StoreReader {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, path: Path, file_size: u64) -> Self {
        Self {
            store,
            path,
            file_size,
            pinned: None,
        }
    }

    /// The reader of the object `uri` as planned with `identity`.
    pub(crate) fn pinned(self, uri: &str, identity: ObjectIdentity) -> Self {
        Self {
            pinned: Some((uri.to_string(), identity)),
            ..self
        }
    }

    /// Reads `range` of the pinned object `uri` as planned.
    async fn pinned_range(
        &self,
        uri: &str,
        identity: &ObjectIdentity,
        range: Range<u64>,
    ) -> Result<Bytes> {
        let planned = Planned {
            uri,
            size: self.file_size,
            identity: Some(identity),
        };
        let store = self.store.as_ref();
        let result = planned.get(store, &self.path, Some(range.clone())).await?;
        match result.bytes().await {
            Ok(bytes) => Ok(bytes),
            Err(error) => {
                let context = format!("reading bytes {}..{} of {uri}", range.start, range.end);
                Err(planned.failed(store, &self.path, context, error).await)
            }
        }
    }
}

/// An error of this layer handed to the Parquet decoder, which [`FormatError::parquet`] gives back.
fn external(error: FormatError) -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::External(Box::new(error))
}

impl StoreReader {
    /// Refuses a range the decoder asks for that runs past the end of the object: it comes from the
    /// file's own footer or page headers, and no request or buffer is sized by it.
    fn inside(&self, range: &Range<u64>) -> parquet::errors::Result<()> {
        if range.start > range.end || range.end > self.file_size {
            let uri = self
                .pinned
                .as_ref()
                .map_or_else(|| self.path.to_string(), |(uri, _)| uri.clone());
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{uri}: range {}..{} runs past the end of the file ({} bytes): the footer or a page header claims bytes the file does not hold",
                range.start, range.end, self.file_size
            )));
        }
        Ok(())
    }
}

impl AsyncFileReader for StoreReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            self.inside(&range)?;
            match &self.pinned {
                Some((uri, identity)) => self
                    .pinned_range(uri, identity, range)
                    .await
                    .map_err(external),
                None => self
                    .store
                    .get_range(&self.path, range)
                    .await
                    .map_err(|error| parquet::errors::ParquetError::External(Box::new(error))),
            }
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            for range in &ranges {
                self.inside(range)?;
            }
            match &self.pinned {
                // Coalesced as `get_ranges` coalesces them, each request pinned.
                Some((uri, identity)) => {
                    let gap = Planned {
                        uri,
                        size: self.file_size,
                        identity: Some(identity),
                    }
                    .coalesce_gap();
                    object_store::coalesce_ranges(
                        &ranges,
                        |range| self.pinned_range(uri, identity, range),
                        gap,
                    )
                    .await
                    .map_err(external)
                }
                None => self
                    .store
                    .get_ranges(&self.path, &ranges)
                    .await
                    .map_err(|error| parquet::errors::ParquetError::External(Box::new(error))),
            }
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let file_size = self.file_size;
        load_metadata(self, file_size, options).boxed()
    }
}

/// How the files of a dataset are reached: through the object store, or for local files through a
/// [`LocalReader`] (io_uring or `pread`); every fetch is added to the dataset's [`FetchStats`].
#[derive(Debug, Clone)]
pub(crate) struct FileAccess {
    route: Route,
    fetch: Arc<FetchStats>,
}

#[derive(Debug, Clone)]
enum Route {
    Store(Arc<dyn ObjectStore>),
    Local { reader: LocalReader, root: url::Url },
}

impl FileAccess {
    /// Reads through `store`.
    pub(crate) fn store(store: Arc<dyn ObjectStore>) -> FileAccess {
        FileAccess {
            route: Route::Store(store),
            fetch: Arc::default(),
        }
    }

    /// Reads the local files under `root` through `reader`.
    pub(crate) fn local(reader: LocalReader, root: url::Url) -> FileAccess {
        FileAccess {
            route: Route::Local { reader, root },
            fetch: Arc::default(),
        }
    }

    /// What the fetches through this access cost.
    pub(crate) fn fetch_stats(&self) -> &Arc<FetchStats> {
        &self.fetch
    }

    /// Opens a file for reads. Batches decoded from a local file must go through its guard's `settle`
    /// before they leave (see [`crate::local`]). With `expected`, a local file must be that version of the
    /// file (the one its footer was read from), or the open fails. With `planned.identity`, the file must
    /// be the one the plan saw: a local file when it is opened, an object on every read.
    pub(crate) async fn open(
        &self,
        path: &Path,
        planned: Planned<'_>,
        expected: Option<FileIdentity>,
    ) -> Result<OpenFile> {
        let (uri, size) = (planned.uri, planned.size);
        let mut guard = None;
        let reader: Box<dyn AsyncFileReader> = match &self.route {
            Route::Store(store) => {
                let reader = StoreReader::new(Arc::clone(store), path.clone(), size);
                Box::new(match planned.identity {
                    Some(identity) => reader.pinned(uri, identity.clone()),
                    None => reader,
                })
            }
            Route::Local { reader, root } => {
                // Each part is the file name as it is on disk: the URL escapes it, and the file path
                // unescapes it again.
                let mut url = root.clone();
                if let Ok(mut segments) = url.path_segments_mut() {
                    segments
                        .pop_if_empty()
                        .extend(path.parts().map(|part| part.as_ref().to_string()));
                }
                let file_path = url
                    .to_file_path()
                    .ok()
                    .ok_or_else(|| FormatError::SourceUri {
                        uri: uri.to_string(),
                        reason: "not a local file path".to_string(),
                    })?;
                let file = LocalFileReader::open(
                    reader.clone(),
                    file_path,
                    size,
                    uri,
                    Arc::clone(&self.fetch),
                    expected,
                )
                .await
                .map_err(|error| FormatError::io(format!("opening {uri}"), error))?;
                planned.check_open_file(&file.guard().identity())?;
                guard = Some(file.guard());
                Box::new(file)
            }
        };
        Ok(OpenFile {
            reader: Box::new(Measured::new(reader, Arc::clone(&self.fetch), size)),
            guard,
        })
    }
}

/// A file opened by [`FileAccess::open`].
pub(crate) struct OpenFile {
    pub(crate) reader: Box<dyn AsyncFileReader>,
    /// What settles the batches decoded from a local file; `None` for files read through an object store.
    pub(crate) guard: Option<FileGuard>,
}

/// The parts of the page index a read needs from a footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PageIndexNeed {
    /// Neither: whole row groups are decoded, and no filter looks at pages.
    Nothing,
    /// The offset index (where each page starts and which rows it holds), so that a split that covers
    /// part of a row group fetches and decodes only the pages of its rows.
    Offsets,
    /// The offset index and the column index (page statistics), for page pruning by a filter.
    OffsetsAndStatistics,
}

impl PageIndexNeed {
    /// Whether `metadata` holds what is needed, or holds all the file has.
    fn met_by(self, metadata: &ParquetMetaData) -> bool {
        let loaded = metadata.page_index();
        let offsets = loaded.is_some_and(|index| index.has_offset_indexes())
            || !file_has(metadata, |column| column.offset_index_offset().is_some());
        let statistics = loaded.is_some_and(|index| index.has_column_indexes())
            || !file_has(metadata, |column| column.column_index_offset().is_some());
        match self {
            Self::Nothing => true,
            Self::Offsets => offsets,
            Self::OffsetsAndStatistics => offsets && statistics,
        }
    }

    fn reader_options(self) -> ArrowReaderOptions {
        let policy = |wanted: bool| {
            if wanted {
                PageIndexPolicy::Optional
            } else {
                PageIndexPolicy::Skip
            }
        };
        ArrowReaderOptions::new()
            .with_offset_index_policy(policy(self >= Self::Offsets))
            .with_column_index_policy(policy(self == Self::OffsetsAndStatistics))
    }
}

/// A file's footer, and the version of the file it was read from.
#[derive(Debug, Clone)]
pub(crate) struct Footer {
    pub(crate) metadata: ArrowReaderMetadata,
    /// The identity of the local file the footer was read from: the file a read of it opens must still
    /// be that version. `None` for files read through an object store.
    pub(crate) identity: Option<FileIdentity>,
    /// The identity as planned that the footer's reads were held to, if any: a footer serves the reads
    /// of splits pinned to that identity (or to none).
    pub(crate) planned: Option<ObjectIdentity>,
}

/// Footers already read, by file URI: planning and reading the same dataset reads each footer once, and
/// once more at most when a read needs more of the page index than the cached footer holds.
#[derive(Debug, Default)]
pub(crate) struct FooterCache {
    entries: Mutex<HashMap<String, Footer>>,
}

impl FooterCache {
    /// Returns the footer of a file, reading it when it is not cached or lacks a part of the page index
    /// that is needed (from the version of the file the cached footer came from). A file the plan
    /// pinned (`planned.identity`) is read as planned, and a footer cached from reads held to another
    /// identity, or to none, is read again.
    pub(crate) async fn get(
        &self,
        access: &FileAccess,
        path: &Path,
        planned: Planned<'_>,
        need: PageIndexNeed,
    ) -> Result<Footer> {
        let uri = planned.uri;
        let cached = self.lookup(uri).filter(|cached| {
            planned
                .identity
                .is_none_or(|identity| cached.planned.as_ref() == Some(identity))
        });
        if let Some(cached) = &cached
            && need.met_by(cached.metadata.metadata())
        {
            return Ok(cached.clone());
        }
        let expected = cached.as_ref().and_then(|cached| cached.identity);
        let OpenFile { mut reader, guard } = access.open(path, planned, expected).await?;
        // The footer's claims are checked before anything is read or sized by them, the page
        // index included: a footer is read without its page index first.
        let plain = match cached {
            Some(cached) => cached.metadata,
            None => {
                let plain = ArrowReaderMetadata::load_async(
                    &mut reader,
                    PageIndexNeed::Nothing.reader_options(),
                )
                .await
                .map_err(|error| FormatError::parquet(uri, error))?;
                crate::footer::check(uri, planned.size, plain.metadata())?;
                plain
            }
        };
        let metadata = if need.met_by(plain.metadata()) {
            plain
        } else {
            // Only the page index is missing, so only the page index is read.
            let mut loader =
                ParquetMetaDataReader::new_with_metadata(plain.metadata().as_ref().clone())
                    .with_offset_index_policy(need.reader_options().offset_index_policy())
                    .with_column_index_policy(need.reader_options().column_index_policy());
            loader
                .load_page_index(&mut reader)
                .await
                .map_err(|error| FormatError::parquet(uri, error))?;
            let metadata = loader
                .finish()
                .map_err(|error| FormatError::parquet(uri, error))?;
            crate::footer::check_page_index(uri, &metadata)?;
            ArrowReaderMetadata::try_new(Arc::new(metadata), need.reader_options())
                .map_err(|error| FormatError::parquet(uri, error))?
        };
        let footer = Footer {
            metadata,
            identity: guard.as_ref().map(FileGuard::identity),
            planned: planned.identity.cloned(),
        };
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(uri.to_string(), footer.clone());
        }
        Ok(footer)
    }

    fn lookup(&self, uri: &str) -> Option<Footer> {
        self.entries
            .lock()
            .ok()
            .and_then(|entries| entries.get(uri).cloned())
    }
}

/// Whether any column chunk of the file satisfies `test`.
fn file_has(
    metadata: &ParquetMetaData,
    test: impl Fn(&parquet::file::metadata::ColumnChunkMetaData) -> bool,
) -> bool {
    metadata
        .row_groups()
        .iter()
        .any(|row_group| row_group.columns().iter().any(&test))
}

/// The row counts of a file's row groups, in order.
pub(crate) fn row_group_rows(metadata: &ParquetMetaData) -> Vec<u64> {
    metadata
        .row_groups()
        .iter()
        .map(|row_group| u64::try_from(row_group.num_rows()).unwrap_or(0))
        .collect()
}

/// One file-level read request.
#[derive(Debug)]
pub(crate) struct ParquetSplitRead<'a> {
    pub access: &'a FileAccess,
    pub path: &'a Path,
    pub uri: &'a str,
    pub file_size: u64,
    /// What the file was when it was planned, which the reads must find.
    pub identity: Option<&'a ObjectIdentity>,
    pub task_id: u64,
    pub first_row: u64,
    pub row_count: u64,
    pub partitions: Vec<(Field, Option<String>)>,
    /// Rows of the file (in file order) to drop, e.g. a Delta deletion vector; sorted.
    pub deleted_rows: Option<Vec<u64>>,
}

/// Row-group statistics as [`PruningStatistics`], with partition columns as constant containers.
struct RowGroupStatistics<'a> {
    metadata: &'a ParquetMetaData,
    arrow_schema: &'a Schema,
    row_groups: &'a [usize],
    partitions: &'a [(Field, Option<String>)],
}

impl RowGroupStatistics<'_> {
    fn converter(&self, column: &str) -> Option<StatisticsConverter<'_>> {
        StatisticsConverter::try_new(
            column,
            self.arrow_schema,
            self.metadata.file_metadata().schema_descr(),
        )
        .ok()
        .map(|converter| converter.with_missing_null_counts_as_zero(false))
    }

    fn partition(&self, column: &str) -> Option<&(Field, Option<String>)> {
        self.partitions
            .iter()
            .find(|(field, _)| field.name() == column)
    }

    fn partition_bound(&self, column: &str) -> Option<ArrayRef> {
        let (field, value) = self.partition(column)?;
        crate::read::partition_array(
            field,
            value.as_deref(),
            self.row_groups.len(),
            "partition statistics",
        )
        .ok()
    }

    fn row_group_metadata(
        &self,
    ) -> impl Iterator<Item = &parquet::file::metadata::RowGroupMetaData> {
        self.row_groups
            .iter()
            .map(|index| self.metadata.row_group(*index))
    }
}

impl PruningStatistics for RowGroupStatistics<'_> {
    fn num_containers(&self) -> usize {
        self.row_groups.len()
    }

    fn min_values(&self, column: &str) -> Option<ArrayRef> {
        if self.partition(column).is_some() {
            return self.partition_bound(column);
        }
        self.converter(column)?
            .row_group_mins(self.row_group_metadata())
            .ok()
    }

    fn max_values(&self, column: &str) -> Option<ArrayRef> {
        if self.partition(column).is_some() {
            return self.partition_bound(column);
        }
        self.converter(column)?
            .row_group_maxes(self.row_group_metadata())
            .ok()
    }

    fn null_counts(&self, column: &str) -> Option<UInt64Array> {
        if let Some((_, value)) = self.partition(column) {
            let rows = self.row_counts()?;
            return Some(
                rows.iter()
                    .map(|count| if value.is_none() { count } else { Some(0) })
                    .collect(),
            );
        }
        self.converter(column)?
            .row_group_null_counts(self.row_group_metadata())
            .ok()
    }

    fn row_counts(&self) -> Option<UInt64Array> {
        Some(
            self.row_group_metadata()
                .map(|row_group| u64::try_from(row_group.num_rows()).ok())
                .collect(),
        )
    }
}

/// Page statistics of one column inside one row group.
struct PageStatistics {
    column: String,
    mins: ArrayRef,
    maxes: ArrayRef,
    null_counts: UInt64Array,
    row_counts: UInt64Array,
}

impl PruningStatistics for PageStatistics {
    fn num_containers(&self) -> usize {
        self.row_counts.len()
    }
    fn min_values(&self, column: &str) -> Option<ArrayRef> {
        (column == self.column).then(|| Arc::clone(&self.mins))
    }
    fn max_values(&self, column: &str) -> Option<ArrayRef> {
        (column == self.column).then(|| Arc::clone(&self.maxes))
    }
    fn null_counts(&self, column: &str) -> Option<UInt64Array> {
        (column == self.column).then(|| self.null_counts.clone())
    }
    fn row_counts(&self) -> Option<UInt64Array> {
        Some(self.row_counts.clone())
    }
}

/// The selection of row group `row_group` that keeps only pages that may match `conjunct`, or `None` when
/// the page index cannot tell.
fn page_selection(
    metadata: &ParquetMetaData,
    arrow_schema: &Schema,
    row_group: usize,
    conjunct: &Expr,
) -> Option<RowSelection> {
    let columns = conjunct.columns();
    let [column] = columns.as_slice() else {
        return None;
    };
    let page_index = metadata.page_index()?.as_ref();
    let converter = StatisticsConverter::try_new(
        column,
        arrow_schema,
        metadata.file_metadata().schema_descr(),
    )
    .ok()?
    .with_missing_null_counts_as_zero(false);
    let row_groups = [row_group];
    let row_counts = converter
        .data_page_row_counts(page_index, metadata.row_groups(), &row_groups)
        .ok()??;
    let statistics = PageStatistics {
        column: column.clone(),
        mins: converter.data_page_mins(page_index, &row_groups).ok()?,
        maxes: converter.data_page_maxes(page_index, &row_groups).ok()?,
        null_counts: converter
            .data_page_null_counts(page_index, &row_groups)
            .ok()?,
        row_counts,
    };
    if statistics.mins.len() != statistics.row_counts.len()
        || statistics.row_counts.null_count() > 0
    {
        return None;
    }
    let keep = conjunct.prune(&statistics).ok()?;
    let selectors: Vec<RowSelector> = keep
        .iter()
        .zip(statistics.row_counts.values().iter())
        .map(|(keep, rows)| {
            let rows = usize::try_from(*rows).unwrap_or(usize::MAX);
            if *keep {
                RowSelector::select(rows)
            } else {
                RowSelector::skip(rows)
            }
        })
        .collect();
    Some(RowSelection::from(selectors))
}

/// The literal values of an `=` or `in` conjunct on one column, for bloom filter checks.
fn bloom_probe(conjunct: &Expr) -> Option<(&str, Vec<&Literal>)> {
    match conjunct {
        Expr::Compare {
            column,
            op: CompareOp::Eq,
            value,
        } => Some((column.as_str(), vec![value])),
        Expr::InList {
            column,
            values,
            negated: false,
        } => Some((column.as_str(), values.iter().collect())),
        _ => None,
    }
}

/// Whether the bloom filter may hold `literal` for a column of this physical and Arrow type; `true` when the
/// question cannot be asked.
fn bloom_may_contain(
    filter: &Sbbf,
    physical: PhysicalType,
    arrow_type: &DataType,
    literal: &Literal,
) -> bool {
    match (literal, physical, arrow_type) {
        (
            Literal::Str(text),
            PhysicalType::BYTE_ARRAY,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View,
        ) => filter.check(&text.as_str()),
        (
            Literal::Int(value),
            PhysicalType::INT32,
            DataType::Int8 | DataType::Int16 | DataType::Int32,
        ) => i32::try_from(*value).is_ok_and(|narrow| filter.check(&narrow)),
        (Literal::Int(value), PhysicalType::INT64, DataType::Int64) => filter.check(value),
        _ => true,
    }
}

/// Maps `[first_row, first_row + row_count)` onto row-group-local selections.
fn range_selections(
    row_group_rows: &[u64],
    first_row: u64,
    row_count: u64,
) -> Vec<(usize, RowSelection)> {
    let end = first_row + row_count;
    let mut selections = Vec::new();
    let mut group_start = 0u64;
    for (index, rows) in row_group_rows.iter().enumerate() {
        let group_end = group_start + rows;
        let (from, to) = (first_row.max(group_start), end.min(group_end));
        if from < to {
            let mut selectors = Vec::with_capacity(3);
            let to_usize = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
            if from > group_start {
                selectors.push(RowSelector::skip(to_usize(from - group_start)));
            }
            selectors.push(RowSelector::select(to_usize(to - from)));
            if group_end > to {
                selectors.push(RowSelector::skip(to_usize(group_end - to)));
            }
            selections.push((index, RowSelection::from(selectors)));
        }
        group_start = group_end;
    }
    selections
}

/// Whether `selection` keeps every one of a row group's `rows`.
fn selects_whole_group(selection: &RowSelection, rows: u64) -> bool {
    selection.skipped_row_count() == 0 && selection.row_count() as u64 == rows
}

/// Removes deleted file rows from a row group's selection; `deleted` holds file row numbers, sorted.
fn drop_deleted(
    selection: &RowSelection,
    group_start: u64,
    group_rows: u64,
    deleted: &[u64],
) -> RowSelection {
    let lower = deleted.partition_point(|row| *row < group_start);
    let upper = deleted.partition_point(|row| *row < group_start + group_rows);
    if lower == upper {
        return selection.clone();
    }
    let mut selectors = Vec::new();
    let mut cursor = 0u64;
    for row in &deleted[lower..upper] {
        let local = row - group_start;
        if local > cursor {
            selectors.push(RowSelector::select(
                usize::try_from(local - cursor).unwrap_or(usize::MAX),
            ));
        }
        selectors.push(RowSelector::skip(1));
        cursor = local + 1;
    }
    if group_rows > cursor {
        selectors.push(RowSelector::select(
            usize::try_from(group_rows - cursor).unwrap_or(usize::MAX),
        ));
    }
    selection.intersection(&RowSelection::from(selectors))
}

/// Reads one split of a Parquet file as a stream of finished batches (partition columns, filter,
/// projection) whose coverages tile the split.
pub(crate) async fn read_split(
    footers: &FooterCache,
    request: ParquetSplitRead<'_>,
    plan: &ReadPlan,
) -> Result<BoxStream<'static, Result<SplitBatch>>> {
    let footer_need = if plan.filter.is_some() {
        PageIndexNeed::OffsetsAndStatistics
    } else {
        PageIndexNeed::Nothing
    };
    let planned = Planned {
        uri: request.uri,
        size: request.file_size,
        identity: request.identity,
    };
    let footer = |need| footers.get(request.access, request.path, planned, need);
    let Footer {
        mut metadata,
        identity,
        ..
    } = footer(footer_need).await?;
    let group_rows = row_group_rows(metadata.metadata());
    let total: u64 = group_rows.iter().sum();
    if request
        .first_row
        .checked_add(request.row_count)
        .is_none_or(|end| end > total)
    {
        return Err(FormatError::SplitInvalid {
            task_id: request.task_id,
            uri: request.uri.to_string(),
            reason: format!(
                "rows [{}, +{}) exceed the file's {total} rows; plan the dataset again",
                request.first_row, request.row_count
            ),
        });
    }
    let mut selections = range_selections(&group_rows, request.first_row, request.row_count);
    let group_starts: Vec<u64> = group_rows
        .iter()
        .scan(0u64, |start, rows| {
            let current = *start;
            *start += rows;
            Some(current)
        })
        .collect();
    if let Some(deleted) = &request.deleted_rows {
        for (group, selection) in &mut selections {
            *selection = drop_deleted(selection, group_starts[*group], group_rows[*group], deleted);
        }
    }
    // Without the offset index, the decoder fetches and decompresses a whole column chunk even for a
    // split that wants a sliver of its row group.
    let partial = selections
        .iter()
        .any(|(group, selection)| !selects_whole_group(selection, group_rows[*group]));
    if partial && footer_need < PageIndexNeed::Offsets {
        metadata = footer(PageIndexNeed::Offsets).await?.metadata;
    }
    let parquet_metadata = Arc::clone(metadata.metadata());
    let file_schema: SchemaRef = Arc::clone(metadata.schema());

    let OpenFile { reader, guard } = request.access.open(request.path, planned, identity).await?;
    let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata.clone());

    if let Some(filter) = &plan.filter {
        let candidate_groups: Vec<usize> = selections.iter().map(|(group, _)| *group).collect();
        let statistics = RowGroupStatistics {
            metadata: &parquet_metadata,
            arrow_schema: &file_schema,
            row_groups: &candidate_groups,
            partitions: &request.partitions,
        };
        let keep = filter.prune(&statistics)?;
        let mut kept = Vec::with_capacity(selections.len());
        for ((group, selection), keep) in selections.into_iter().zip(keep) {
            if keep {
                kept.push((group, selection));
            } else {
                tracing::debug!(
                    uri = request.uri,
                    row_group = group,
                    "row group pruned by statistics"
                );
            }
        }
        selections = kept;

        let normal_form = filter.negation_normal_form();
        let conjuncts = normal_form.conjuncts();
        let schema_descr = parquet_metadata.file_metadata().schema_descr();
        let mut after_bloom = Vec::with_capacity(selections.len());
        'groups: for (group, selection) in selections {
            for conjunct in &conjuncts {
                let Some((column, literals)) = bloom_probe(conjunct) else {
                    continue;
                };
                let Ok(converter) =
                    StatisticsConverter::try_new(column, &file_schema, schema_descr)
                else {
                    continue;
                };
                let (Some(leaf), arrow_field) =
                    (converter.parquet_column_index(), converter.arrow_field())
                else {
                    continue;
                };
                if parquet_metadata
                    .row_group(group)
                    .column(leaf)
                    .bloom_filter_offset()
                    .is_none()
                {
                    continue;
                }
                let bloom = builder
                    .get_row_group_column_bloom_filter(group, leaf)
                    .await
                    .map_err(|error| FormatError::parquet(request.uri, error))?;
                if let Some(bloom) = bloom {
                    let physical = schema_descr.column(leaf).physical_type();
                    if !literals.iter().any(|literal| {
                        bloom_may_contain(&bloom, physical, arrow_field.data_type(), literal)
                    }) {
                        tracing::debug!(
                            uri = request.uri,
                            row_group = group,
                            column,
                            "row group pruned by bloom filter"
                        );
                        continue 'groups;
                    }
                }
            }
            let mut narrowed = selection;
            for conjunct in &conjuncts {
                if let Some(pages) =
                    page_selection(&parquet_metadata, &file_schema, group, conjunct)
                {
                    narrowed = narrowed.intersection(&pages);
                }
            }
            if narrowed.selects_any() {
                after_bloom.push((group, narrowed));
            }
        }
        selections = after_bloom;
    }

    let root_indices: Vec<usize> = file_schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, field)| {
            plan.needed.contains(field.name())
                && !request
                    .partitions
                    .iter()
                    .any(|(partition, _)| partition.name() == field.name())
        })
        .map(|(index, _)| index)
        .collect();
    let mask = ProjectionMask::roots(
        parquet_metadata.file_metadata().schema_descr(),
        root_indices,
    );
    let coverage = Coverage::new(
        selected_runs(&selections, &group_starts, request.first_row),
        request.row_count,
    );
    // A selection that keeps the whole row group is left out: the decoder then reads the group plainly.
    let row_group_selections: Vec<RowGroupSelection> = selections
        .into_iter()
        .map(|(group, selection)| {
            let whole = selects_whole_group(&selection, group_rows[group]);
            RowGroupSelection::new(group, (!whole).then_some(selection))
        })
        .collect();
    // `with_batch_size` caps the batch size at the footer's file row count; some writers leave that count
    // at 0 while their row groups hold rows, so such a file keeps the decoder's default batch size.
    let footer_rows = u64::try_from(parquet_metadata.file_metadata().num_rows()).unwrap_or(0);
    if footer_rows != total {
        tracing::debug!(
            uri = request.uri,
            footer_rows,
            row_group_rows = total,
            "file row count disagrees with its row groups"
        );
    }
    let builder = if footer_rows == total {
        builder.with_batch_size(plan.batch_rows)
    } else {
        builder
    };
    let stream = builder
        .with_projection(mask)
        .with_row_group_selections(row_group_selections)
        .build()
        .map_err(|error| FormatError::parquet(request.uri, error))?;
    let uri = request.uri.to_string();
    let partitions = request.partitions;
    let plan = plan.clone();
    let decoded = stream
        .map({
            let uri = uri.clone();
            move |decoded| {
                let reading = |error| FormatError::io(format!("reading parquet file {uri}"), error);
                match (decoded, &guard) {
                    (Ok(batch), Some(guard)) => guard.settle(batch).map_err(reading),
                    (Ok(batch), None) => Ok(batch),
                    // Bytes of zeros from a file that shrank, or bytes of another file, fail to decode;
                    // the shrink or the change is the cause.
                    (Err(error), guard) => Err(match guard.as_ref().map(FileGuard::check) {
                        Some(Err(cause)) => reading(cause),
                        Some(Ok(())) | None => FormatError::parquet(uri.clone(), error),
                    }),
                }
            }
        })
        .boxed();
    let output_schema = Arc::clone(&plan.output_schema);
    let context = format!("parquet file {uri}");
    let short = {
        let file = context.clone();
        let split_first_row = request.first_row;
        move |split_row: u64| short_row_group(&file, &group_rows, split_first_row + split_row)
    };
    let finish = move |covered| plan.finish(covered, &partitions, &uri);
    Ok(covered_stream(
        decoded,
        coverage,
        output_schema,
        context,
        finish,
        short,
    ))
}

/// The error of a decoder that ended before file row `file_row`, which the footer puts in one of
/// the row groups of `group_rows`: that row group's pages hold fewer rows than it claims.
fn short_row_group(file: &str, group_rows: &[u64], file_row: u64) -> FormatError {
    let mut group_start = 0u64;
    for (group, rows) in group_rows.iter().enumerate() {
        let group_end = group_start.saturating_add(*rows);
        if file_row < group_end {
            return FormatError::RowsMissing {
                file: file.to_string(),
                claim: format!(
                    "row group {group} claims {rows} rows (footer field row_groups[{group}].num_rows)"
                ),
                delivered: file_row - group_start,
            };
        }
        group_start = group_end;
    }
    FormatError::RowsMissing {
        file: file.to_string(),
        claim: format!("the row groups claim {group_start} rows"),
        delivered: file_row,
    }
}

/// The selected rows of `selections`, as runs of split rows in decoding order.
fn selected_runs(
    selections: &[(usize, RowSelection)],
    group_starts: &[u64],
    split_first_row: u64,
) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    for (group, selection) in selections {
        let mut file_row = group_starts[*group];
        for selector in selection.iter() {
            let rows = selector.row_count as u64;
            if !selector.skip {
                runs.push((file_row - split_first_row, rows));
            }
            file_row += rows;
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Expr;
    use futures::TryStreamExt;

    fn expand(selection: &RowSelection) -> Vec<bool> {
        selection
            .iter()
            .flat_map(|selector| std::iter::repeat_n(!selector.skip, selector.row_count))
            .collect()
    }

    #[test]
    fn range_maps_onto_row_groups() {
        let sut = range_selections(&[10, 10, 5], 7, 12);
        assert_eq!(sut.len(), 2);
        assert_eq!(sut[0].0, 0);
        assert_eq!(expand(&sut[0].1), [vec![false; 7], vec![true; 3]].concat());
        assert_eq!(sut[1].0, 1);
        assert_eq!(expand(&sut[1].1), [vec![true; 9], vec![false; 1]].concat());
        assert!(range_selections(&[10], 3, 0).is_empty());
    }

    /// A file as planned without an identity: held to its size.
    fn unpinned(uri: &str, size: u64) -> Planned<'_> {
        Planned {
            uri,
            size,
            identity: None,
        }
    }

    fn testdata_file(name: &str) -> std::path::PathBuf {
        sluice_testkit::testdata().join("parquet/data").join(name)
    }

    async fn footer_of(
        path: &std::path::Path,
        need: PageIndexNeed,
    ) -> (FileAccess, Path, u64, ArrowReaderMetadata) {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
        let access = FileAccess::store(store);
        let object_path = Path::from_filesystem_path(path).expect("path");
        let size = std::fs::metadata(path).expect("metadata").len();
        let footer = FooterCache::default()
            .get(
                &access,
                &object_path,
                unpinned(&path.to_string_lossy(), size),
                need,
            )
            .await
            .expect("footer")
            .metadata;
        (access, object_path, size, footer)
    }

    #[tokio::test]
    async fn bloom_filter_rejects_absent_values_that_statistics_cannot() {
        let path = testdata_file("data_index_bloom_encoding_stats.parquet");
        let (access, object_path, size, footer) = footer_of(&path, PageIndexNeed::Nothing).await;
        let reader = access
            .open(&object_path, unpinned(&path.to_string_lossy(), size), None)
            .await
            .expect("opens")
            .reader;
        let mut builder =
            ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.clone());
        let bloom = builder
            .get_row_group_column_bloom_filter(0, 0)
            .await
            .expect("reads")
            .expect("the file has a bloom filter");
        let physical = footer
            .metadata()
            .file_metadata()
            .schema_descr()
            .column(0)
            .physical_type();
        let present = [
            "Hello",
            "This is",
            "a",
            "test",
            "How",
            "are you",
            "doing ",
            "today",
            "the quick",
            "brown fox",
            "jumps",
            "over",
            "the lazy",
            "dog",
        ];
        for value in present {
            assert!(
                bloom_may_contain(
                    &bloom,
                    physical,
                    &DataType::Utf8,
                    &Literal::Str(value.to_string())
                ),
                "{value}"
            );
        }
        // Inside the statistics' range [Hello, today], so only the bloom filter can exclude them.
        for value in ["brown cat", "jumped", "over the"] {
            assert!(
                !bloom_may_contain(
                    &bloom,
                    physical,
                    &DataType::Utf8,
                    &Literal::Str(value.to_string())
                ),
                "{value}"
            );
            let expr = Expr::parse(&format!("String = '{value}'")).expect("parses");
            let groups = [0usize];
            let statistics = RowGroupStatistics {
                metadata: footer.metadata(),
                arrow_schema: footer.schema(),
                row_groups: &groups,
                partitions: &[],
            };
            assert_eq!(
                expr.prune(&statistics).expect("prunes"),
                vec![true],
                "statistics alone keep {value}"
            );
        }
    }

    #[tokio::test]
    async fn page_index_narrows_the_selection_to_matching_pages() {
        let path = testdata_file("alltypes_tiny_pages.parquet");
        let (_, _, _, footer) = footer_of(&path, PageIndexNeed::OffsetsAndStatistics).await;
        let metadata = footer.metadata();
        assert!(metadata.page_index().is_some(), "the page index was loaded");
        let rows = metadata.row_group(0).num_rows() as usize;
        let expr = Expr::parse("id = 5000").expect("parses");
        let selection =
            page_selection(metadata, footer.schema(), 0, &expr).expect("id has a page index");
        let selected = selection.row_count();
        assert!(
            selected > 0 && selected * 20 < rows,
            "{selected} of {rows} rows selected"
        );
        // id 5000 is row 5885 of the file (checked with pyarrow); its page must be selected.
        let mask = expand(&selection);
        assert!(mask[5885], "the page holding id 5000 is kept");
    }

    #[tokio::test]
    async fn row_group_statistics_prune_generated_row_groups() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("groups.parquet");
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let file = std::fs::File::create(&path).expect("create");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, crate::generate::schema(), Some(properties))
                .expect("writer");
        writer
            .write(&crate::generate::batch(3, 0, 1000).expect("batch"))
            .expect("write");
        writer.close().expect("close");
        let (_, _, _, footer) = footer_of(&path, PageIndexNeed::Nothing).await;
        let groups: Vec<usize> = (0..10).collect();
        let statistics = RowGroupStatistics {
            metadata: footer.metadata(),
            arrow_schema: footer.schema(),
            row_groups: &groups,
            partitions: &[],
        };
        let keep = Expr::parse("id >= 250 and id < 310")
            .expect("parses")
            .prune(&statistics)
            .expect("prunes");
        assert_eq!(
            keep,
            vec![
                false, false, true, true, false, false, false, false, false, false
            ]
        );
        let keep = Expr::parse("not (id < 900) or id is null")
            .expect("parses")
            .prune(&statistics)
            .expect("prunes");
        assert_eq!(keep, [vec![false; 9], vec![true]].concat());
    }

    /// Writes 3,000 generated rows in row groups of 1,000 into `directory`.
    fn three_row_groups(directory: &std::path::Path) -> std::path::PathBuf {
        let path = directory.join("groups.parquet");
        let properties = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(1000))
            .set_data_page_row_count_limit(100)
            .set_write_batch_size(100)
            .build();
        let file = std::fs::File::create(&path).expect("create");
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(file, crate::generate::schema(), Some(properties))
                .expect("writer");
        writer
            .write(&crate::generate::batch(9, 0, 3000).expect("batch"))
            .expect("write");
        writer.close().expect("close");
        path
    }

    fn loaded_indexes(footer: &ArrowReaderMetadata) -> (bool, bool) {
        footer
            .metadata()
            .page_index()
            .map_or((false, false), |index| {
                (index.has_offset_indexes(), index.has_column_indexes())
            })
    }

    #[tokio::test]
    async fn footer_cache_loads_the_parts_of_the_page_index_a_read_needs() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = three_row_groups(directory.path());
        let (access, object_path, size, plain) = footer_of(&path, PageIndexNeed::Nothing).await;
        assert_eq!(loaded_indexes(&plain), (false, false));
        let sut = FooterCache::default();
        let uri = path.to_string_lossy();
        let get = |need| {
            let footer = sut.get(&access, &object_path, unpinned(&uri, size), need);
            async move { footer.await.map(|footer| footer.metadata) }
        };
        let first = get(PageIndexNeed::Nothing).await.expect("footer");
        assert_eq!(loaded_indexes(&first), (false, false));
        let offsets = get(PageIndexNeed::Offsets).await.expect("offsets");
        assert_eq!(loaded_indexes(&offsets), (true, false));
        assert_eq!(offsets.schema(), first.schema());
        let again = get(PageIndexNeed::Nothing).await.expect("cached");
        assert!(
            Arc::ptr_eq(again.metadata(), offsets.metadata()),
            "a footer that holds more than is needed is reused"
        );
        let full = get(PageIndexNeed::OffsetsAndStatistics)
            .await
            .expect("statistics");
        assert_eq!(loaded_indexes(&full), (true, true));
    }

    #[tokio::test]
    async fn a_split_inside_a_row_group_reads_with_the_offset_index() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = three_row_groups(directory.path());
        let (access, object_path, size, plain) = footer_of(&path, PageIndexNeed::Nothing).await;
        let uri = path.to_string_lossy().into_owned();
        let sut = FooterCache::default();
        let plan = ReadPlan::raw(Arc::clone(plain.schema()), 256);
        let read = |first_row, row_count| {
            let request = ParquetSplitRead {
                access: &access,
                path: &object_path,
                uri: &uri,
                file_size: size,
                identity: None,
                task_id: 0,
                first_row,
                row_count,
                partitions: Vec::new(),
                deleted_rows: None,
            };
            let sut = &sut;
            let plan = &plan;
            async move {
                let batches: Vec<SplitBatch> = read_split(sut, request, plan)
                    .await
                    .expect("opens")
                    .try_collect()
                    .await
                    .expect("reads");
                let ids: Vec<i64> = batches
                    .iter()
                    .flat_map(|covered| {
                        covered
                            .batch
                            .column(0)
                            .as_any()
                            .downcast_ref::<arrow::array::Int64Array>()
                            .expect("ids")
                            .values()
                            .to_vec()
                    })
                    .collect();
                ids
            }
        };
        let whole = read(1000, 1000).await;
        assert_eq!(whole, (1000..2000).collect::<Vec<i64>>());
        let cached = sut
            .get(
                &access,
                &object_path,
                unpinned(&uri, size),
                PageIndexNeed::Nothing,
            )
            .await
            .expect("cached");
        assert_eq!(
            loaded_indexes(&cached.metadata),
            (false, false),
            "whole row groups need no page index"
        );
        let sliver = read(1250, 300).await;
        assert_eq!(sliver, (1250..1550).collect::<Vec<i64>>());
        let cached = sut
            .get(
                &access,
                &object_path,
                unpinned(&uri, size),
                PageIndexNeed::Nothing,
            )
            .await
            .expect("cached");
        assert_eq!(
            loaded_indexes(&cached.metadata),
            (true, false),
            "a split inside a row group loaded the offset index"
        );
        let across = read(1900, 1050).await;
        assert_eq!(across, (1900..2950).collect::<Vec<i64>>());
    }

    #[test]
    fn deleted_rows_are_skipped_inside_the_range() {
        let range = RowSelection::from(vec![RowSelector::skip(2), RowSelector::select(8)]);
        let sut = drop_deleted(&range, 100, 10, &[1, 100, 103, 109, 200]);
        assert_eq!(
            expand(&sut),
            vec![
                false, false, true, false, true, true, true, true, true, false
            ]
        );
    }
}
