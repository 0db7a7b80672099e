//! Datasets: a file, a directory tree or a glob of files of one format, or a Delta or Iceberg table, listed
//! once.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::cache::BlockCache;
use crate::coverage::SplitBatch;
use crate::delta::DeltaTable;
use crate::error::{FormatError, Result};
use crate::filter::Expr;
use crate::iceberg::{IcebergTable, is_iceberg_table};
use crate::identity::Planned;
use crate::ipc::IpcFooters;
use crate::layout::FileLayout;
use crate::parquet::{FileAccess, FooterCache, PageIndexNeed, ParquetSplitRead};
use crate::plan::{ObjectIdentity, Split, cut};
use crate::read::{PartitionStatistics, ReadOptions, ReadPlan};
use crate::store::{Location, StorageOptions, open_location};
use crate::text::{RowFile, RowFileFormat};
use sluice_io::{LocalIo, LocalReader};

/// The default task size of `sluice plan`: about a million rows.
pub const DEFAULT_TASK_ROWS: u64 = 1 << 20;

/// The most rows of a split of [`Dataset::scan`]: about a million rows, so that a read's coverage
/// of a split (a bit for each row a filter or pruning removed) stays within 128 KiB.
pub const SCAN_TASK_ROWS: u64 = 1 << 20;

/// How many footers (or row counts) the planner reads at once.
pub const PLAN_CONCURRENCY: usize = 32;

/// The format of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatKind {
    /// Apache Parquet files.
    Parquet,
    /// A Delta Lake table.
    Delta,
    /// An Apache Iceberg table (format versions 1 and 2, Parquet data files).
    Iceberg,
    /// Arrow IPC files (`.arrow`, `.feather`, `.ipc`).
    ArrowIpc,
    /// CSV files with a header row.
    Csv,
    /// JSON lines (`.jsonl`, `.ndjson`, `.json`).
    JsonLines,
    /// TFRecord files (`.tfrecord`, `.tfrecords`): one binary `record` column.
    TfRecord,
}

impl FormatKind {
    pub(crate) fn from_extension(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let extension = lower.rsplit('.').next()?;
        match extension {
            "parquet" | "parq" | "pq" => Some(Self::Parquet),
            "arrow" | "feather" | "ipc" | "arrows" => Some(Self::ArrowIpc),
            "csv" => Some(Self::Csv),
            "jsonl" | "ndjson" | "json" => Some(Self::JsonLines),
            "tfrecord" | "tfrecords" => Some(Self::TfRecord),
            _ => None,
        }
    }

    /// Parses a format name as given on the command line.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::InvalidArgument`] for an unknown name.
    pub fn parse(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "parquet" => Ok(Self::Parquet),
            "delta" => Ok(Self::Delta),
            "iceberg" => Ok(Self::Iceberg),
            "arrow" | "ipc" | "feather" => Ok(Self::ArrowIpc),
            "csv" => Ok(Self::Csv),
            "jsonl" | "json" | "ndjson" => Ok(Self::JsonLines),
            "tfrecord" => Ok(Self::TfRecord),
            other => Err(FormatError::InvalidArgument(format!(
                "unknown format {other:?}; use parquet, delta, iceberg, arrow, csv, jsonl or tfrecord"
            ))),
        }
    }
}

/// The schema of one file of a dataset of `kind`: a Parquet file's from its footer, a row format's
/// from its header or first records.
async fn file_schema_of(
    kind: FormatKind,
    location: &Location,
    access: &FileAccess,
    footers: &FooterCache,
    ipc_footers: &IpcFooters,
    file: &DataFile,
) -> Result<SchemaRef> {
    match kind {
        FormatKind::Parquet => Ok(Arc::clone(
            footers
                .get(access, &file.path, file.planned(), PageIndexNeed::Nothing)
                .await?
                .metadata
                .schema(),
        )),
        other => {
            RowFileFormat::from_kind(other)?
                .schema(&RowFile {
                    store: &location.store,
                    stats: access.fetch_stats(),
                    path: &file.path,
                    planned: file.planned(),
                    footers: ipc_footers,
                })
                .await
        }
    }
}

/// The rows a reader skips from a row that does not decode: see [`Dataset::bad_data_unit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadDataUnit {
    /// The Parquet row group the rows belong to.
    pub row_group: Option<u32>,
    /// The end of the rows skipped (exclusive), counted from the split's first row.
    pub end: u64,
}

/// How to open a dataset.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Object store settings that override the environment.
    pub storage_options: StorageOptions,
    /// The format; detected from `_delta_log`, an Iceberg `metadata/` directory or the file
    /// extensions when `None`.
    pub format: Option<FormatKind>,
    /// A Delta table version, or an Iceberg snapshot id, to read instead of the latest.
    pub version: Option<u64>,
    /// A table timestamp (RFC 3339, or milliseconds since the epoch): reads the Delta version or
    /// the Iceberg snapshot current then.
    pub timestamp: Option<String>,
    /// The source's row filter, which an Iceberg table's planning uses to leave out the data files
    /// whose partition values and column bounds prove that no row passes; reads apply the filter
    /// to every row whatever this says.
    pub filter: Option<Expr>,
    /// How local Parquet files are read (io_uring or `pread`); remote stores ignore it.
    pub local_io: LocalIo,
    /// A cache on local disk for the pinned reads of a remote store's files; local files ignore it.
    pub cache: Option<Arc<BlockCache>>,
    /// Whether a file whose footer (or, for a row format, whose records) does not decode is left
    /// out of [`Dataset::plan_leaving_out`]'s plan rather than failing it; the schema then comes
    /// from the first file that decodes (`data.on_bad_data: skip | warn`).
    pub skip_bad_files: bool,
}

/// A file left out of a plan because it does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// The file.
    pub uri: String,
    /// Why it does not decode.
    pub cause: String,
}

/// One data file of a dataset.
#[derive(Debug, Clone)]
pub(crate) struct DataFile {
    pub path: Path,
    pub uri: String,
    pub size: u64,
    /// Partition values, aligned with [`Dataset::partition_fields`].
    pub partition_values: Vec<Option<String>>,
    /// What the file was when it was listed, which its splits pin: for a Delta table's file, its size
    /// in the table's log.
    pub identity: Option<ObjectIdentity>,
}

impl DataFile {
    /// The file as its reads must find it: as it was listed.
    pub(crate) fn planned(&self) -> Planned<'_> {
        Planned {
            uri: &self.uri,
            size: self.size,
            identity: self.identity.as_ref(),
        }
    }
}

/// An opened dataset: its files, listed once, and its schema.
#[derive(Debug)]
pub struct Dataset {
    pub(crate) location: Location,
    pub(crate) kind: FormatKind,
    files: Vec<DataFile>,
    schema: SchemaRef,
    /// The columns stored in the files (physical names for Delta), without partition columns.
    file_schema: SchemaRef,
    pub(crate) partition_fields: Vec<Field>,
    footers: FooterCache,
    ipc_footers: IpcFooters,
    access: FileAccess,
    /// Whether [`Dataset::plan_leaving_out`] leaves out the files that do not decode.
    skip_bad_files: bool,
    delta: Option<Arc<DeltaTable>>,
    iceberg: Option<Arc<IcebergTable>>,
    /// Snapshots of the Delta table at other versions than the one it was opened at, for splits
    /// planned while following the table; the most recently opened last.
    other_versions: std::sync::Mutex<Vec<Arc<DeltaTable>>>,
}

/// The batches of a table's data file (`physical`, as the file holds them) turned into the
/// table's by `to_table`, then filtered and projected by `plan`; a batch of no rows becomes an
/// empty one of the output schema without a call.
fn finished_as_table(
    physical: BoxStream<'static, Result<SplitBatch>>,
    plan: ReadPlan,
    uri: String,
    to_table: impl Fn(SplitBatch) -> Result<SplitBatch> + Send + 'static,
) -> BoxStream<'static, Result<SplitBatch>> {
    physical
        .and_then(move |covered| {
            let finished = if covered.batch.num_rows() == 0 {
                Ok(SplitBatch::empty(
                    Arc::clone(&plan.output_schema),
                    covered.first_row,
                    covered.row_count,
                ))
            } else {
                to_table(covered).and_then(|table| plan.finish(table, &[], &uri))
            };
            futures::future::ready(finished)
        })
        .boxed()
}

/// How many snapshots at other versions a Delta dataset keeps open.
const OTHER_VERSIONS_KEPT: usize = 4;

/// Local files go through a [`LocalReader`]; every other store through `object_store`.
fn file_access(location: &Location, local_io: LocalIo) -> Result<FileAccess> {
    if location.root.scheme() != "file" || local_io == LocalIo::ObjectStore {
        return Ok(FileAccess::store(Arc::clone(&location.store)));
    }
    let reader = LocalReader::new(local_io).map_err(|error| {
        FormatError::io(
            format!("starting local reads ({local_io:?}) for {}", location.uri),
            error,
        )
    })?;
    Ok(FileAccess::local(reader, location.root.clone()))
}

fn is_hidden(component: &str) -> bool {
    component.starts_with('_') || component.starts_with('.')
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(value) = escaped {
            decoded.push(value);
            index += 3;
            continue;
        }
        decoded.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Hive partition pairs (`key=value` directories) between the dataset root and the file.
pub(crate) fn hive_pairs(root: &Path, file: &Path) -> Vec<(String, Option<String>)> {
    let Some(parts) = file.prefix_match(root) else {
        return Vec::new();
    };
    let parts: Vec<String> = parts.map(|part| part.as_ref().to_string()).collect();
    let directories = &parts[..parts.len().saturating_sub(1)];
    directories
        .iter()
        .filter_map(|directory| {
            // Store paths keep directory names as they are; Hive writers escape special characters as %XX.
            let decoded = percent_decode(directory);
            let (key, value) = decoded.split_once('=')?;
            let value = (value != "__HIVE_DEFAULT_PARTITION__").then(|| value.to_string());
            Some((key.to_string(), value))
        })
        .collect()
}

fn infer_partition_type(values: impl Iterator<Item = Option<String>> + Clone) -> DataType {
    let mut present = values.flatten().peekable();
    if present.peek().is_none() {
        return DataType::Utf8;
    }
    let all: Vec<String> = present.collect();
    if all.iter().all(|value| value.parse::<i64>().is_ok()) {
        DataType::Int64
    } else if all.iter().all(|value| value.parse::<f64>().is_ok()) {
        DataType::Float64
    } else if all.iter().all(|value| value == "true" || value == "false") {
        DataType::Boolean
    } else {
        DataType::Utf8
    }
}

pub(crate) async fn list_files(location: &Location) -> Result<Vec<object_store::ObjectMeta>> {
    if location.glob.is_none() && !location.path.as_ref().is_empty() {
        match location.store.head(&location.path).await {
            Ok(meta) => return Ok(vec![meta]),
            Err(object_store::Error::NotFound { .. }) => {}
            // Local directories answer `head` with an error other than NotFound; listing decides.
            Err(error) => {
                tracing::debug!(uri = %location.uri, %error, "head failed, listing instead")
            }
        }
    }
    let prefix = (!location.path.as_ref().is_empty()).then_some(&location.path);
    let mut objects: Vec<object_store::ObjectMeta> = location
        .store
        .list(prefix)
        .try_collect()
        .await
        .map_err(|error| FormatError::store(format!("listing {}", location.uri), error))?;
    objects.retain(|meta| {
        let relative: Vec<String> = meta
            .location
            .prefix_match(&location.path)
            .map(|parts| parts.map(|part| part.as_ref().to_string()).collect())
            .unwrap_or_default();
        let visible = !relative.iter().any(|part| is_hidden(part));
        let matches_glob = location
            .glob
            .as_ref()
            .is_none_or(|pattern| pattern.matches(meta.location.as_ref()));
        visible && matches_glob
    });
    objects.sort_by(|left, right| left.location.cmp(&right.location));
    Ok(objects)
}

async fn is_delta_table(location: &Location) -> bool {
    if location.glob.is_some() {
        return false;
    }
    let log = location.path.clone().join("_delta_log");
    let mut listing = location.store.list(Some(&log));
    matches!(listing.next().await, Some(Ok(_)))
}

impl Dataset {
    /// Opens a dataset: lists its files once and reads the schema.
    ///
    /// # Errors
    ///
    /// Returns an error when the URI is invalid, nothing is found, the format cannot be told, or the first
    /// file's schema cannot be read.
    pub async fn open(uri: &str, options: &OpenOptions) -> Result<Self> {
        let mut location = open_location(uri, &options.storage_options)?;
        let kind = match options.format {
            Some(kind @ (FormatKind::Delta | FormatKind::Iceberg)) => Some(kind),
            Some(_) => None,
            None if is_delta_table(&location).await => Some(FormatKind::Delta),
            None if is_iceberg_table(&location).await => Some(FormatKind::Iceberg),
            None => None,
        };
        if let Some(cache) = &options.cache
            && location.root.scheme() != "file"
        {
            let root = location.root.as_str();
            location.store = match kind {
                Some(FormatKind::Delta) => cache.wrap_table(root, location.store, "_delta_log"),
                Some(_) => cache.wrap_table(root, location.store, "metadata"),
                None => cache.wrap(root, location.store),
            };
        }
        match kind {
            Some(FormatKind::Delta) => return Self::open_delta(location, options).await,
            Some(_) => return Self::open_iceberg(location, options).await,
            None => {}
        }
        if options.version.is_some() || options.timestamp.is_some() {
            return Err(FormatError::InvalidArgument(format!(
                "source {uri}: --version and --timestamp apply to Delta and Iceberg tables only, and {uri} has neither a _delta_log nor Iceberg metadata"
            )));
        }
        let objects = list_files(&location).await?;
        let kind = match options.format {
            Some(kind) => kind,
            None => {
                let mut kinds: Vec<FormatKind> = objects
                    .iter()
                    .filter_map(|meta| FormatKind::from_extension(meta.location.as_ref()))
                    .collect();
                kinds.dedup();
                match kinds.as_slice() {
                    [] if objects.len() == 1 => FormatKind::Parquet,
                    [] => {
                        return Err(FormatError::EmptyDataset {
                            uri: uri.to_string(),
                        });
                    }
                    [kind] => *kind,
                    _ => {
                        return Err(FormatError::SourceUri {
                            uri: uri.to_string(),
                            reason: "holds files of several formats; narrow it with a glob such as dir/*.parquet".to_string(),
                        });
                    }
                }
            }
        };
        let single_file = objects.len() == 1 && objects[0].location == location.path;
        let objects: Vec<object_store::ObjectMeta> = if single_file {
            objects
        } else {
            objects
                .into_iter()
                .filter(|meta| FormatKind::from_extension(meta.location.as_ref()) == Some(kind))
                .collect()
        };
        if objects.is_empty() {
            return Err(FormatError::EmptyDataset {
                uri: uri.to_string(),
            });
        }
        let pairs: Vec<Vec<(String, Option<String>)>> = objects
            .iter()
            .map(|meta| hive_pairs(&location.path, &meta.location))
            .collect();
        let mut keys: Vec<String> = Vec::new();
        for file_pairs in &pairs {
            for (key, _) in file_pairs {
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
        }
        let local = location.root.scheme() == "file";
        let files: Vec<DataFile> = objects
            .iter()
            .zip(&pairs)
            .map(|(meta, file_pairs)| DataFile {
                path: meta.location.clone(),
                uri: location.uri_of(&meta.location),
                size: meta.size,
                identity: Some(ObjectIdentity::listed(meta, local)),
                partition_values: keys
                    .iter()
                    .map(|key| {
                        file_pairs
                            .iter()
                            .find(|(name, _)| name == key)
                            .and_then(|(_, value)| value.clone())
                    })
                    .collect(),
            })
            .collect();
        let partition_fields: Vec<Field> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                let data_type = infer_partition_type(
                    files
                        .iter()
                        .map(|file| file.partition_values[index].clone()),
                );
                Field::new(key, data_type, true)
            })
            .collect();
        let footers = FooterCache::default();
        let ipc_footers = IpcFooters::default();
        let access = file_access(&location, options.local_io)?;
        let mut found = None;
        for (index, file) in files.iter().enumerate() {
            match file_schema_of(kind, &location, &access, &footers, &ipc_footers, file).await {
                Ok(schema) => {
                    found = Some(schema);
                    break;
                }
                Err(error)
                    if options.skip_bad_files && error.is_bad_data() && index + 1 < files.len() =>
                {
                    tracing::warn!(uri = %file.uri, %error, "the schema comes from a later file: this one does not decode");
                }
                Err(error) => return Err(error),
            }
        }
        let Some(file_schema) = found else {
            return Err(FormatError::EmptyDataset {
                uri: location.uri.clone(),
            });
        };
        let mut fields: Vec<Field> = file_schema
            .fields()
            .iter()
            .filter(|field| !keys.contains(field.name()))
            .map(|field| field.as_ref().clone())
            .collect();
        let file_schema = Arc::new(Schema::new_with_metadata(
            fields.clone(),
            file_schema.metadata().clone(),
        ));
        fields.extend(partition_fields.iter().cloned());
        let schema = Arc::new(Schema::new_with_metadata(
            fields,
            file_schema.metadata().clone(),
        ));
        Ok(Self {
            location,
            kind,
            files,
            schema,
            file_schema,
            partition_fields,
            footers,
            ipc_footers,
            access,
            delta: None,
            iceberg: None,
            other_versions: std::sync::Mutex::default(),
            skip_bad_files: options.skip_bad_files,
        })
    }

    async fn open_iceberg(location: Location, options: &OpenOptions) -> Result<Self> {
        let table = IcebergTable::open(
            &location,
            options.version,
            options.timestamp.as_deref(),
            options.filter.as_ref(),
        )
        .await?;
        if table.snapshot_id().is_none() {
            return Err(FormatError::EmptyDataset {
                uri: location.uri.clone(),
            });
        }
        let schema = table.schema();
        let files = table.files();
        let access = file_access(&location, options.local_io)?;
        Ok(Self {
            location,
            kind: FormatKind::Iceberg,
            files,
            file_schema: Arc::clone(&schema),
            schema,
            partition_fields: Vec::new(),
            footers: FooterCache::default(),
            ipc_footers: IpcFooters::default(),
            access,
            delta: None,
            iceberg: Some(Arc::new(table)),
            other_versions: std::sync::Mutex::default(),
            skip_bad_files: options.skip_bad_files,
        })
    }

    async fn open_delta(location: Location, options: &OpenOptions) -> Result<Self> {
        let mut table =
            DeltaTable::open(&location, options.version, options.timestamp.as_deref()).await?;
        let schema = table.schema();
        let file_schema = table.physical_schema();
        let partition_fields = table.partition_fields();
        let files = table.files(&location);
        let access = file_access(&location, options.local_io)?;
        Ok(Self {
            location,
            kind: FormatKind::Delta,
            files,
            schema,
            file_schema,
            partition_fields,
            footers: FooterCache::default(),
            ipc_footers: IpcFooters::default(),
            access,
            delta: Some(Arc::new(table)),
            iceberg: None,
            other_versions: std::sync::Mutex::default(),
            skip_bad_files: options.skip_bad_files,
        })
    }

    /// Returns the format of the dataset.
    pub fn kind(&self) -> FormatKind {
        self.kind
    }

    /// Returns the dataset's schema: the file columns, then the partition columns.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Returns the number of data files.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Returns the URIs of the data files, in plan order.
    pub fn file_uris(&self) -> Vec<&str> {
        self.files.iter().map(|file| file.uri.as_str()).collect()
    }

    /// Returns the table version the dataset is pinned to: a Delta table's version, an Iceberg
    /// table's snapshot id (`None` for one with no snapshot yet), `None` for files.
    pub fn table_version(&self) -> Option<u64> {
        match (&self.delta, &self.iceberg) {
            (Some(delta), _) => Some(delta.version()),
            (_, Some(iceberg)) => iceberg.snapshot_id(),
            _ => None,
        }
    }

    /// Returns the schema that reading with `options` produces.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::ColumnNotFound`] for an unknown column.
    pub fn output_schema(&self, options: &ReadOptions) -> Result<SchemaRef> {
        Ok(ReadPlan::new(&self.schema, options)?.output_schema)
    }

    /// The row groups of a file, for the planner to cut into splits of at most `task_rows` rows, and
    /// for row formats, where the rows of each group lie in the file.
    pub(crate) async fn file_row_groups(
        &self,
        file: &DataFile,
        task_rows: u64,
    ) -> Result<(Vec<u64>, Option<FileLayout>)> {
        match self.kind {
            FormatKind::Parquet | FormatKind::Delta | FormatKind::Iceberg => {
                let footer = self
                    .footers
                    .get(
                        &self.access,
                        &file.path,
                        file.planned(),
                        PageIndexNeed::Nothing,
                    )
                    .await?;
                Ok((
                    crate::parquet::row_group_rows(footer.metadata.metadata()),
                    None,
                ))
            }
            other => {
                let layout = RowFileFormat::from_kind(other)?
                    .layout(&self.row_file(&file.path, file.planned()), task_rows)
                    .await?;
                Ok((layout.group_rows(), Some(layout)))
            }
        }
    }

    fn row_file<'a>(&'a self, path: &'a Path, planned: Planned<'a>) -> RowFile<'a> {
        RowFile {
            store: &self.location.store,
            stats: self.access.fetch_stats(),
            path,
            planned,
            footers: &self.ipc_footers,
        }
    }

    /// Plans the dataset into splits of at most `task_rows` rows that cover every row exactly once.
    ///
    /// Footers are read with bounded concurrency, and so are the row formats' files: a CSV, JSON lines or
    /// TFRecord file is read once to find where its records lie, and is cut into splits of exactly
    /// `task_rows` rows (the last of a file holds the rest); an Arrow IPC file's footer and batch headers
    /// are read. Splits come in file order (sorted by path) then row order, and `task_id` is the position
    /// in that order.
    ///
    /// # Errors
    ///
    /// Returns an error when a footer cannot be read.
    pub async fn plan(&self, task_rows: u64) -> Result<Vec<Split>> {
        let (splits, _) = self
            .plan_files_at(task_rows, (0..self.files.len()).collect(), false)
            .await?;
        Ok(splits)
    }

    /// Plans the dataset as [`Dataset::plan`] does; a dataset opened with
    /// [`OpenOptions::skip_bad_files`] leaves out the files that do not decode, and returns them
    /// with their causes.
    ///
    /// # Errors
    ///
    /// As [`Dataset::plan`], for a file that cannot be read (a store that fails) rather than one
    /// that does not decode.
    pub async fn plan_leaving_out(&self, task_rows: u64) -> Result<(Vec<Split>, Vec<LeftOut>)> {
        self.plan_files_at(
            task_rows,
            (0..self.files.len()).collect(),
            self.skip_bad_files,
        )
        .await
    }

    /// Plans only the files whose URIs are in `uris`, as [`Dataset::plan`] plans them: for a
    /// followed Delta table, the files a commit added, from the snapshot at that commit.
    ///
    /// # Errors
    ///
    /// As [`Dataset::plan`].
    pub async fn plan_files(
        &self,
        task_rows: u64,
        uris: &std::collections::HashSet<String>,
    ) -> Result<Vec<Split>> {
        let kept = (0..self.files.len())
            .filter(|index| uris.contains(&self.files[*index].uri))
            .collect();
        let (splits, _) = self.plan_files_at(task_rows, kept, false).await?;
        Ok(splits)
    }

    /// Plans the files at the indices `kept`, in that order; with `leave_out`, the files that do
    /// not decode are left out and returned.
    async fn plan_files_at(
        &self,
        task_rows: u64,
        kept: Vec<usize>,
        leave_out: bool,
    ) -> Result<(Vec<Split>, Vec<LeftOut>)> {
        if task_rows == 0 {
            return Err(FormatError::InvalidArgument(
                "task rows must be at least 1".to_string(),
            ));
        }
        let read = stream::iter(
            kept.iter()
                .map(|index| self.file_row_groups(&self.files[*index], task_rows)),
        )
        .buffered(PLAN_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
        let mut left_out = Vec::new();
        let mut decoded = Vec::with_capacity(kept.len());
        let mut row_groups = Vec::with_capacity(kept.len());
        let mut layouts = Vec::with_capacity(kept.len());
        for (index, file) in kept.into_iter().zip(read) {
            match file {
                Ok((groups, layout)) => {
                    decoded.push(index);
                    row_groups.push(groups);
                    layouts.push(layout);
                }
                Err(error) if leave_out && error.is_bad_data() => left_out.push(LeftOut {
                    uri: self.files[index].uri.clone(),
                    cause: error.to_string(),
                }),
                Err(error) => return Err(error),
            }
        }
        let kept = decoded;
        let delta_info = self.delta.as_ref();
        crate::plan::check_cut(&row_groups, task_rows, |index| {
            self.files[kept[index]].uri.clone()
        })?;
        let splits = cut(&row_groups, task_rows)
            .into_iter()
            .enumerate()
            .map(|(task_id, (kept_index, first_row, row_count))| {
                let file_index = kept[kept_index];
                let file = &self.files[file_index];
                Split {
                    task_id: task_id as u64,
                    uri: file.uri.clone(),
                    file_size: file.size,
                    first_row,
                    row_count,
                    partition_values: self
                        .partition_fields
                        .iter()
                        .zip(&file.partition_values)
                        .map(|(field, value)| (field.name().clone(), value.clone()))
                        .collect(),
                    delta: delta_info.map(|table| table.split_info(file_index)),
                    bytes: layouts[kept_index]
                        .as_ref()
                        .and_then(|layout| layout.bytes_of(first_row, row_count)),
                    identity: file.identity.clone(),
                }
            })
            .collect();
        Ok((splits, left_out))
    }

    fn path_of(&self, split: &Split) -> Result<Path> {
        let root = self.location.root.as_str();
        let relative = split
            .uri
            .strip_prefix(root)
            .ok_or_else(|| FormatError::SplitInvalid {
                task_id: split.task_id,
                uri: split.uri.clone(),
                reason: format!("the file is not in this dataset's store {root}"),
            })?;
        Path::parse(relative).map_err(|error| FormatError::SplitInvalid {
            task_id: split.task_id,
            uri: split.uri.clone(),
            reason: error.to_string(),
        })
    }

    fn split_partitions(&self, split: &Split) -> Vec<(Field, Option<String>)> {
        self.partition_fields
            .iter()
            .map(|field| {
                let value = split
                    .partition_values
                    .iter()
                    .find(|(name, _)| name == field.name())
                    .and_then(|(_, value)| value.clone());
                (field.clone(), value)
            })
            .collect()
    }

    /// What fetching byte ranges has cost this dataset's reads so far, planning included.
    pub fn fetch_stats(&self) -> &crate::FetchStats {
        self.access.fetch_stats()
    }

    /// Reads one split: the rows of its range that pass the filter, with the requested columns.
    ///
    /// # Errors
    ///
    /// Returns an error for an unknown column, a split that does not fit its file, or a corrupt file; errors
    /// while decoding come through the stream.
    pub async fn read_split(
        &self,
        split: &Split,
        options: &ReadOptions,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        Ok(self
            .read_split_covered(split, options)
            .await?
            .try_filter_map(|covered| {
                futures::future::ok((covered.batch.num_rows() > 0).then_some(covered.batch))
            })
            .boxed())
    }

    /// Reads one split as [`SplitBatch`]es whose row ranges tile `[0, split.row_count)`: rows removed by
    /// the filter, a deletion vector or pruning are covered by some batch, possibly an empty one.
    ///
    /// # Errors
    ///
    /// As [`Dataset::read_split`].
    pub async fn read_split_covered(
        &self,
        split: &Split,
        options: &ReadOptions,
    ) -> Result<BoxStream<'static, Result<SplitBatch>>> {
        let plan = ReadPlan::new(&self.schema, options)?;
        let path = self.path_of(split)?;
        let partitions = self.split_partitions(split);
        if let Some(filter) = &plan.filter
            && !partitions.is_empty()
            && !filter
                .prune(&PartitionStatistics {
                    partitions: &partitions,
                })?
                .first()
                .copied()
                .unwrap_or(true)
        {
            tracing::debug!(uri = %split.uri, "file pruned by partition values");
            let whole = SplitBatch::empty(plan.output_schema, 0, split.row_count);
            return Ok(stream::iter((split.row_count > 0).then_some(Ok(whole))).boxed());
        }
        let request = |partitions, deleted_rows| ParquetSplitRead {
            access: &self.access,
            path: &path,
            uri: &split.uri,
            file_size: split.file_size,
            identity: split.identity.as_ref(),
            task_id: split.task_id,
            first_row: split.first_row,
            row_count: split.row_count,
            partitions,
            deleted_rows,
        };
        match (self.kind, &self.delta) {
            (FormatKind::Delta, Some(_)) => {
                let info = split
                    .delta
                    .as_ref()
                    .ok_or_else(|| FormatError::SplitInvalid {
                        task_id: split.task_id,
                        uri: split.uri.clone(),
                        reason: "the split carries no Delta version; plan the table again"
                            .to_string(),
                    })?;
                let table = self.delta_at(info.version).await?;
                let deleted_rows = table.deleted_rows(info, &split.uri).await?;
                let physical_plan = ReadPlan::raw(table.physical_schema(), plan.batch_rows);
                let physical = crate::parquet::read_split(
                    &self.footers,
                    request(Vec::new(), deleted_rows),
                    &physical_plan,
                )
                .await?;
                let to_logical = table.logical_transform(&split.uri)?;
                Ok(finished_as_table(
                    physical,
                    plan,
                    split.uri.clone(),
                    move |covered| {
                        to_logical(&covered.batch).and_then(|logical| covered.with_batch(logical))
                    },
                ))
            }
            (FormatKind::Iceberg, _) => {
                let table = self.iceberg.as_ref().ok_or_else(|| {
                    FormatError::InvalidArgument(format!(
                        "{} was not opened as an Iceberg table",
                        self.location.uri
                    ))
                })?;
                let deleted_rows = table.deleted_rows(&split.uri).await?;
                self.read_iceberg(table, split, plan, request(Vec::new(), deleted_rows))
                    .await
            }
            (FormatKind::Parquet, _) => {
                crate::parquet::read_split(&self.footers, request(partitions, None), &plan).await
            }
            (other, _) => {
                RowFileFormat::from_kind(other)?
                    .read_split(
                        &self.row_file(&path, split.planned()),
                        split,
                        partitions,
                        &plan,
                        Arc::clone(&self.file_schema),
                    )
                    .await
            }
        }
    }

    /// Reads a split of an Iceberg table's data file: the file's columns for the snapshot's
    /// columns the read needs, found by field id, then the snapshot's columns, with the rows of the
    /// equality deletes dropped, filtered and projected.
    async fn read_iceberg(
        &self,
        table: &IcebergTable,
        split: &Split,
        plan: ReadPlan,
        request: ParquetSplitRead<'_>,
    ) -> Result<BoxStream<'static, Result<SplitBatch>>> {
        let footer = self
            .footers
            .get(
                &self.access,
                request.path,
                split.planned(),
                PageIndexNeed::Nothing,
            )
            .await?;
        let reader = table
            .reader(&split.uri, footer.metadata.schema(), &plan.needed)
            .await?;
        let physical_plan = ReadPlan::raw(Arc::clone(&reader.read_schema), plan.batch_rows);
        let physical = crate::parquet::read_split(&self.footers, request, &physical_plan).await?;
        Ok(finished_as_table(
            physical,
            plan,
            split.uri.clone(),
            move |covered| {
                let (snapshot, keep) = reader.to_snapshot(&covered.batch)?;
                let covered = covered.with_batch(snapshot)?;
                match keep {
                    Some(keep) => covered.filter(&keep),
                    None => Ok(covered),
                }
            },
        ))
    }

    /// What a reader skips when the rows of `split` do not decode from `row` on (counted from the
    /// split's first row): the rest of the Parquet row group holding `row`, or for a row format,
    /// the rest of the split (a CSV or JSON lines record that does not decode alone fails with
    /// [`FormatError::BadRecord`], and is its own unit).
    ///
    /// # Errors
    ///
    /// Returns the error of reading the file's footer.
    pub async fn bad_data_unit(&self, split: &Split, row: u64) -> Result<BadDataUnit> {
        if !matches!(
            self.kind,
            FormatKind::Parquet | FormatKind::Delta | FormatKind::Iceberg
        ) {
            return Ok(BadDataUnit {
                row_group: None,
                end: split.row_count,
            });
        }
        let path = self.path_of(split)?;
        let footer = self
            .footers
            .get(&self.access, &path, split.planned(), PageIndexNeed::Nothing)
            .await?;
        let file_row = split.first_row.saturating_add(row);
        let mut group_start = 0u64;
        for (group, rows) in crate::parquet::row_group_rows(footer.metadata.metadata())
            .into_iter()
            .enumerate()
        {
            let group_end = group_start.saturating_add(rows);
            if file_row < group_end {
                return Ok(BadDataUnit {
                    row_group: u32::try_from(group).ok(),
                    end: (group_end - split.first_row).min(split.row_count),
                });
            }
            group_start = group_end;
        }
        Ok(BadDataUnit {
            row_group: None,
            end: split.row_count,
        })
    }

    /// The Delta table at `version`: the one the dataset was opened at, or a snapshot opened for
    /// splits planned at a later version of a followed table.
    async fn delta_at(&self, version: u64) -> Result<Arc<DeltaTable>> {
        let Some(opened) = &self.delta else {
            return Err(FormatError::InvalidArgument(format!(
                "{} is not a Delta table; a split with a Delta version cannot be read from it",
                self.location.uri
            )));
        };
        if opened.version() == version {
            return Ok(Arc::clone(opened));
        }
        let kept = |versions: &std::sync::Mutex<Vec<Arc<DeltaTable>>>| {
            versions
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .iter()
                .find(|table| table.version() == version)
                .cloned()
        };
        if let Some(table) = kept(&self.other_versions) {
            return Ok(table);
        }
        let mut table = DeltaTable::open(&self.location, Some(version), None).await?;
        table.files(&self.location);
        let table = Arc::new(table);
        let mut versions = self
            .other_versions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(raced) = versions.iter().find(|kept| kept.version() == version) {
            return Ok(Arc::clone(raced));
        }
        if versions.len() == OTHER_VERSIONS_KEPT {
            versions.remove(0);
        }
        versions.push(Arc::clone(&table));
        Ok(table)
    }

    /// Reads the whole dataset in plan order, one split after another, in splits of at most
    /// [`SCAN_TASK_ROWS`] rows: what a read of a split makes for the rows it covers (the coverage of
    /// rows a filter or pruning removed) stays bounded whatever rows a file claims.
    ///
    /// # Errors
    ///
    /// Returns an error when planning fails; read errors come through the stream.
    pub async fn scan(
        self: &Arc<Self>,
        options: &ReadOptions,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        ReadPlan::new(&self.schema, options)?;
        let splits = self.plan(SCAN_TASK_ROWS).await?;
        let dataset = Arc::clone(self);
        let options = options.clone();
        let stream = stream::iter(splits)
            .then(move |split| {
                let dataset = Arc::clone(&dataset);
                let options = options.clone();
                async move { dataset.read_split(&split, &options).await }
            })
            .try_flatten()
            .boxed();
        Ok(stream)
    }

    /// Returns the store the dataset lives in.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.location.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hive_pairs_decode_and_map_the_default_partition_to_null() {
        let root = Path::from("data/t");
        // On disk `city=New%20York`: Hive escapes the space.
        let file = Path::parse("data/t/year=2024/city=New%20York/part-0.parquet").expect("path");
        assert_eq!(
            hive_pairs(&root, &file),
            vec![
                ("year".to_string(), Some("2024".to_string())),
                ("city".to_string(), Some("New York".to_string()))
            ]
        );
        let plain = Path::parse("data/t/city=San Jose/part-0.parquet").expect("path");
        assert_eq!(
            hive_pairs(&root, &plain),
            vec![("city".to_string(), Some("San Jose".to_string()))]
        );
        let null_file = Path::from("data/t/year=__HIVE_DEFAULT_PARTITION__/part-0.parquet");
        assert_eq!(
            hive_pairs(&root, &null_file),
            vec![("year".to_string(), None)]
        );
    }

    #[test]
    fn partition_types_are_inferred_from_all_values() {
        let values = |list: &[Option<&str>]| {
            list.iter()
                .map(|value| value.map(str::to_string))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            infer_partition_type(values(&[Some("1"), None, Some("-3")]).into_iter()),
            DataType::Int64
        );
        assert_eq!(
            infer_partition_type(values(&[Some("1"), Some("2.5")]).into_iter()),
            DataType::Float64
        );
        assert_eq!(
            infer_partition_type(values(&[Some("1"), Some("x")]).into_iter()),
            DataType::Utf8
        );
        assert_eq!(
            infer_partition_type(values(&[None]).into_iter()),
            DataType::Utf8
        );
    }
}
