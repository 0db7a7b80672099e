//! Delta Lake tables through `delta_kernel`: snapshots at a version or a timestamp, the scan's file list with
//! partition values and deletion vectors, and the physical-to-logical transform (partition columns, column
//! mapping).
//!
//! # Implementation
//!
//! The kernel replays the log (JSON commits, classic and v2 checkpoints) once at open, at the pinned version,
//! and lists the live files. Data files are then read by this crate's Parquet reader, so a Delta split is a
//! row range of one file like any other. The reader drops the rows of the file's deletion vector inside the
//! range, then applies the kernel's per-file transform, which adds partition values and renames physical
//! (column-mapped) columns to their logical names. A table feature the kernel cannot read fails at open with
//! the kernel's error, which names the feature.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, StructArray};
use arrow::compute::cast;
use arrow::datatypes::{Field, Schema, SchemaRef};
use delta_kernel::engine::arrow_conversion::TryIntoArrow;
use delta_kernel::engine::arrow_data::ArrowEngineData;
use delta_kernel::scan::state::{DvInfo, ScanFile, transform_to_logical};
use delta_kernel::{Engine, ExpressionRef, Snapshot};
use delta_kernel_default_engine::DefaultEngine;
use delta_kernel_default_engine::executor::tokio::TokioBackgroundExecutor;
use object_store::path::Path;
use url::Url;

use crate::dataset::DataFile;
use crate::error::{FormatError, Result};
use crate::plan::{DeletionVector, DeltaSplitInfo, ObjectIdentity};
use crate::store::Location;

/// One live file of the snapshot.
#[derive(Debug)]
struct DeltaFile {
    path: Path,
    uri: String,
    size: u64,
    dv_info: DvInfo,
    deletion_vector: Option<DeletionVector>,
    transform: Option<ExpressionRef>,
    /// Raw partition values keyed by logical column name.
    partition_values: HashMap<String, String>,
}

/// A Delta table pinned at one version.
pub(crate) struct DeltaTable {
    table_url: Url,
    version: u64,
    engine: Arc<DefaultEngine<TokioBackgroundExecutor>>,
    logical_kernel: delta_kernel::schema::SchemaRef,
    physical_kernel: delta_kernel::schema::SchemaRef,
    logical_schema: SchemaRef,
    physical_schema: SchemaRef,
    partition_columns: Vec<String>,
    files: Vec<DeltaFile>,
}

impl std::fmt::Debug for DeltaTable {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DeltaTable")
            .field("table_url", &self.table_url.as_str())
            .field("version", &self.version)
            .field("files", &self.files.len())
            .finish_non_exhaustive()
    }
}

fn delta_error(table: &Url, error: impl std::fmt::Display) -> FormatError {
    FormatError::Delta {
        table: table.to_string(),
        reason: error.to_string(),
    }
}

/// Parses `--timestamp`: RFC 3339 (`2024-05-01T12:00:00Z`) or milliseconds since the epoch.
pub fn parse_timestamp_millis(text: &str) -> Result<i64> {
    if let Ok(millis) = text.parse::<i64>() {
        return Ok(millis);
    }
    chrono::DateTime::parse_from_rfc3339(text).map(|time| time.timestamp_millis()).map_err(|error| {
        FormatError::InvalidArgument(format!(
            "timestamp {text:?}: {error}; write RFC 3339 such as 2024-05-01T12:00:00Z, or milliseconds since the epoch"
        ))
    })
}

/// The descriptor columns of each selected scan row, by file path, read from the scan metadata batch.
fn deletion_vectors_of(batch: &RecordBatch, selection: &[bool]) -> HashMap<String, DeletionVector> {
    let mut vectors = HashMap::new();
    let Some(paths) = batch
        .column_by_name("path")
        .and_then(|column| column.as_any().downcast_ref::<StringArray>())
    else {
        return vectors;
    };
    let Some(descriptors) = batch
        .column_by_name("deletionVector")
        .and_then(|column| column.as_any().downcast_ref::<StructArray>())
    else {
        return vectors;
    };
    let text = |name: &str| {
        descriptors
            .column_by_name(name)
            .and_then(|column| cast(column, &arrow::datatypes::DataType::Utf8).ok())
    };
    let number = |name: &str| {
        descriptors
            .column_by_name(name)
            .and_then(|column| cast(column, &arrow::datatypes::DataType::Int64).ok())
    };
    let (Some(storage), Some(inline), Some(offset), Some(size), Some(cardinality)) = (
        text("storageType"),
        text("pathOrInlineDv"),
        number("offset"),
        number("sizeInBytes"),
        number("cardinality"),
    ) else {
        return vectors;
    };
    let as_strings = |array: &ArrayRef| array.as_any().downcast_ref::<StringArray>().cloned();
    let as_ints = |array: &ArrayRef| {
        array
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .cloned()
    };
    let (Some(storage), Some(inline), Some(offset), Some(size), Some(cardinality)) = (
        as_strings(&storage),
        as_strings(&inline),
        as_ints(&offset),
        as_ints(&size),
        as_ints(&cardinality),
    ) else {
        return vectors;
    };
    for row in 0..batch.num_rows() {
        let selected = selection.get(row).copied().unwrap_or(true);
        if !selected || descriptors.is_null(row) || paths.is_null(row) || storage.is_null(row) {
            continue;
        }
        vectors.insert(
            paths.value(row).to_string(),
            DeletionVector {
                storage_type: storage.value(row).to_string(),
                path_or_inline_dv: inline.value(row).to_string(),
                offset: offset
                    .is_valid(row)
                    .then(|| i32::try_from(offset.value(row)).unwrap_or(i32::MAX)),
                size_in_bytes: i32::try_from(size.value(row)).unwrap_or(i32::MAX),
                cardinality: cardinality.value(row),
            },
        );
    }
    vectors
}

fn physical_name(field: &delta_kernel::schema::StructField) -> String {
    match field
        .get_config_value(&delta_kernel::schema::ColumnMetadataKey::ColumnMappingPhysicalName)
    {
        Some(delta_kernel::schema::MetadataValue::String(name)) => name.clone(),
        _ => field.name().clone(),
    }
}

impl DeltaTable {
    /// Opens the table at `version`, at the version current at `timestamp`, or at its latest version.
    pub(crate) async fn open(
        location: &Location,
        version: Option<u64>,
        timestamp: Option<&str>,
    ) -> Result<Self> {
        let table_url = location.directory_url()?;
        let timestamp_millis = timestamp.map(parse_timestamp_millis).transpose()?;
        let store = Arc::clone(&location.store);
        let url = table_url.clone();
        tokio::task::spawn_blocking(move || {
            Self::open_blocking(url, store, version, timestamp_millis)
        })
        .await
        .map_err(|error| delta_error(&table_url, format!("opening task failed: {error}")))?
    }

    fn open_blocking(
        table_url: Url,
        store: Arc<dyn object_store::ObjectStore>,
        version: Option<u64>,
        timestamp_millis: Option<i64>,
    ) -> Result<Self> {
        let engine = Arc::new(DefaultEngine::builder(store).build());
        let error = |error| delta_error(&table_url, error);
        let mut builder = Snapshot::builder_for(table_url.as_str());
        if let Some(version) = version {
            builder = builder.at_version(version);
        }
        let mut snapshot = builder.build(engine.as_ref()).map_err(error)?;
        if let Some(millis) = timestamp_millis {
            let commit = delta_kernel::history_manager::latest_version_as_of(
                &snapshot,
                engine.as_ref(),
                millis,
                delta_kernel::history_manager::HistoryCommitType::Recreatable,
            )
            .map_err(error)?;
            snapshot = Snapshot::builder_for(table_url.as_str())
                .at_version(commit.version)
                .build(engine.as_ref())
                .map_err(error)?;
        }
        let version = snapshot.version();
        let scan = Arc::clone(&snapshot)
            .scan_builder()
            .build()
            .map_err(error)?;
        let logical_kernel = Arc::clone(scan.logical_schema());
        let physical_kernel = Arc::clone(scan.physical_schema());
        let logical_schema: Schema = logical_kernel
            .as_ref()
            .try_into_arrow()
            .map_err(|arrow_error| delta_error(&table_url, arrow_error))?;
        let physical_schema: Schema = physical_kernel
            .as_ref()
            .try_into_arrow()
            .map_err(|arrow_error| delta_error(&table_url, arrow_error))?;

        let logical_by_physical: HashMap<String, String> = logical_kernel
            .fields()
            .map(|field| (physical_name(field), field.name().clone()))
            .collect();
        let mut scan_files: Vec<ScanFile> = Vec::new();
        let mut vectors: HashMap<String, DeletionVector> = HashMap::new();
        for metadata in scan.scan_metadata(engine.as_ref()).map_err(error)? {
            let metadata = metadata.map_err(error)?;
            if let Some(arrow_data) = metadata
                .scan_files
                .data()
                .any_ref()
                .downcast_ref::<ArrowEngineData>()
            {
                vectors.extend(deletion_vectors_of(
                    arrow_data.record_batch(),
                    metadata.scan_files.selection_vector(),
                ));
            }
            scan_files = metadata
                .visit_scan_files(scan_files, |files: &mut Vec<ScanFile>, file: ScanFile| {
                    files.push(file)
                })
                .map_err(error)?;
        }
        let mut partition_columns: Vec<String> = Vec::new();
        let mut files = Vec::with_capacity(scan_files.len());
        for scan_file in scan_files {
            let file_url = table_url.join(&scan_file.path).map_err(|url_error| {
                delta_error(
                    &table_url,
                    format!("file path {}: {url_error}", scan_file.path),
                )
            })?;
            let path = Path::from_url_path(file_url.path())
                .map_err(|path_error| delta_error(&table_url, path_error))?;
            let partition_values: HashMap<String, String> = scan_file
                .partition_values
                .iter()
                .map(|(key, value)| {
                    (
                        logical_by_physical
                            .get(key)
                            .cloned()
                            .unwrap_or_else(|| key.clone()),
                        value.clone(),
                    )
                })
                .collect();
            for key in partition_values.keys() {
                if !partition_columns.contains(key) {
                    partition_columns.push(key.clone());
                }
            }
            if scan_file.dv_info.has_vector() && !vectors.contains_key(&scan_file.path) {
                return Err(delta_error(
                    &table_url,
                    format!(
                        "file {}: deletion vector descriptor missing from the scan",
                        scan_file.path
                    ),
                ));
            }
            files.push(DeltaFile {
                uri: String::new(),
                path,
                size: u64::try_from(scan_file.size).unwrap_or(0),
                deletion_vector: vectors.get(&scan_file.path).cloned(),
                dv_info: scan_file.dv_info,
                transform: scan_file.transform,
                partition_values,
            });
        }
        files.sort_by(|left, right| left.path.cmp(&right.path));
        partition_columns.sort_by_key(|name| logical_schema.index_of(name).unwrap_or(usize::MAX));
        tracing::debug!(table = %table_url, version, files = files.len(), "delta snapshot opened");
        Ok(Self {
            table_url,
            version,
            engine,
            logical_kernel,
            physical_kernel,
            logical_schema: Arc::new(logical_schema),
            physical_schema: Arc::new(physical_schema),
            partition_columns,
            files,
        })
    }

    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.logical_schema)
    }

    pub(crate) fn physical_schema(&self) -> SchemaRef {
        Arc::clone(&self.physical_schema)
    }

    pub(crate) fn partition_fields(&self) -> Vec<Field> {
        self.partition_columns
            .iter()
            .filter_map(|name| self.logical_schema.field_with_name(name).ok().cloned())
            .collect()
    }

    /// The data files, aligned with [`Self::partition_fields`], with their URIs in `location`'s store.
    pub(crate) fn files(&mut self, location: &Location) -> Vec<DataFile> {
        let partition_fields = self.partition_fields();
        self.files
            .iter_mut()
            .map(|file| {
                file.uri = location.uri_of(&file.path);
                DataFile {
                    path: file.path.clone(),
                    uri: file.uri.clone(),
                    size: file.size,
                    // The table's version pins the table; its log gives the file's size, which
                    // pins the file.
                    identity: Some(ObjectIdentity::default()),
                    partition_values: partition_fields
                        .iter()
                        .map(|field| file.partition_values.get(field.name()).cloned())
                        .collect(),
                }
            })
            .collect()
    }

    pub(crate) fn split_info(&self, file_index: usize) -> DeltaSplitInfo {
        DeltaSplitInfo {
            version: self.version,
            deletion_vector: self
                .files
                .get(file_index)
                .and_then(|file| file.deletion_vector.clone()),
        }
    }

    fn file_by_uri(&self, uri: &str) -> Option<&DeltaFile> {
        self.files.iter().find(|file| file.uri == uri)
    }

    /// The sorted file rows the deletion vector removes, for a split of this table.
    pub(crate) async fn deleted_rows(
        &self,
        info: &DeltaSplitInfo,
        uri: &str,
    ) -> Result<Option<Vec<u64>>> {
        if info.version != self.version {
            return Err(delta_error(
                &self.table_url,
                format!(
                    "split was planned at version {} but the table is open at {}; open it at the split's version",
                    info.version, self.version
                ),
            ));
        }
        let file = self.file_by_uri(uri).ok_or_else(|| {
            delta_error(
                &self.table_url,
                format!("file {uri} is not live at version {}", self.version),
            )
        })?;
        if file.deletion_vector != info.deletion_vector {
            return Err(delta_error(
                &self.table_url,
                format!(
                    "file {uri}: the split's deletion vector differs from the table's at version {}",
                    self.version
                ),
            ));
        }
        if !file.dv_info.has_vector() {
            return Ok(None);
        }
        let dv_info = file.dv_info.clone();
        let engine = Arc::clone(&self.engine);
        let table_url = self.table_url.clone();
        let rows = tokio::task::spawn_blocking(move || {
            dv_info.get_row_indexes(engine.as_ref(), &table_url)
        })
        .await
        .map_err(|error| {
            delta_error(
                &self.table_url,
                format!("deletion vector task failed: {error}"),
            )
        })?
        .map_err(|error| {
            delta_error(
                &self.table_url,
                format!("file {uri}: reading the deletion vector: {error}"),
            )
        })?;
        Ok(rows.map(|mut rows| {
            rows.sort_unstable();
            rows
        }))
    }

    /// The function that turns physical batches of the file at `uri` into logical batches of the full
    /// table schema.
    pub(crate) fn logical_transform(
        &self,
        uri: &str,
    ) -> Result<impl Fn(&RecordBatch) -> Result<RecordBatch> + Send + Sync + 'static> {
        let file = self.file_by_uri(uri).ok_or_else(|| {
            delta_error(
                &self.table_url,
                format!("file {uri} is not live at version {}", self.version),
            )
        })?;
        let transform = file.transform.clone();
        let engine: Arc<dyn Engine> = Arc::clone(&self.engine) as Arc<dyn Engine>;
        let physical_kernel = Arc::clone(&self.physical_kernel);
        let logical_kernel = Arc::clone(&self.logical_kernel);
        let logical_schema = Arc::clone(&self.logical_schema);
        let table = self.table_url.to_string();
        let uri = uri.to_string();
        Ok(move |batch: &RecordBatch| {
            let data = Box::new(ArrowEngineData::new(batch.clone()));
            let logical = transform_to_logical(
                engine.as_ref(),
                data,
                &physical_kernel,
                &logical_kernel,
                transform.clone(),
            )
            .and_then(ArrowEngineData::try_from_engine_data)
            .map_err(|error| FormatError::Delta {
                table: table.clone(),
                reason: format!("file {uri}: physical to logical: {error}"),
            })?;
            rename_to(&logical_schema, logical.record_batch(), &uri)
        })
    }
}

/// Gives a transformed batch the logical field names and types, column by column.
fn rename_to(schema: &SchemaRef, batch: &RecordBatch, uri: &str) -> Result<RecordBatch> {
    if batch.num_columns() != schema.fields().len() {
        return Err(FormatError::InvalidArgument(format!(
            "file {uri}: {} columns after the transform, the table schema has {}",
            batch.num_columns(),
            schema.fields().len()
        )));
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| {
            if column.data_type() == field.data_type() {
                Ok(Arc::clone(column))
            } else {
                cast(column, field.data_type()).map_err(|error| {
                    FormatError::arrow(format!("file {uri}: column {:?}", field.name()), error)
                })
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns)
        .map_err(|error| FormatError::arrow(format!("file {uri}: logical batch"), error))
}
