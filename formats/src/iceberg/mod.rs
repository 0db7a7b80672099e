//! Apache Iceberg tables (format versions 1 and 2): a snapshot by id, by time or the current one,
//! its live data files with files pruned by partition values and column bounds, position and
//! equality delete files applied, and schema evolution by field id.
//!
//! # Implementation
//!
//! The table is read directly: the newest metadata file (JSON) of the table's `metadata/`
//! directory, or the metadata file the URI names; the snapshot's manifest list and manifests
//! (Avro, through `apache-avro`). The `iceberg` crate would plan scans too, but it pins another
//! Arrow and Parquet than this workspace's, and building it costs about ten times what the Avro
//! reader does; planning needs only the metadata, which is small and specified.
//!
//! A data file is a Parquet file read by this crate's reader, so an Iceberg split is a row range of
//! one file like any other. Its columns are found by Iceberg field id (the `PARQUET:field_id` of
//! each column), so renamed, reordered, added and promoted columns read as the snapshot's schema
//! says: a column the file does not hold is null, or its identity partition value. The rows of the
//! position delete files that apply to the file (same partition or an unpartitioned delete, data
//! sequence number at least the file's) are dropped inside the range, as a Delta deletion vector's
//! are; the equality delete files that apply (a sequence number greater than the file's) drop the
//! rows whose equality columns match one of their rows.

mod bounds;
mod manifest;
mod metadata;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, ListArray, MapArray, StringArray, StructArray,
    UInt32Array, new_null_array,
};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use tokio::sync::OnceCell;
use url::Url;

use crate::dataset::DataFile;
use crate::error::{FormatError, Result};
use crate::filter::{Expr, PruningStatistics};
use crate::plan::ObjectIdentity;
use crate::store::Location;
use manifest::{Content, Entry};
use metadata::{PartitionSpec, TableMetadata, field_id};

/// The field ids of a position delete file's columns, reserved by the Iceberg spec.
const DELETE_FILE_PATH_ID: i32 = 2_147_483_546;
const DELETE_POS_ID: i32 = 2_147_483_545;

/// How many manifests are read at once.
const MANIFEST_CONCURRENCY: usize = 16;

/// One live data file of the snapshot.
#[derive(Debug)]
struct IcebergFile {
    entry: Entry,
    path: Path,
    uri: String,
    /// The delete files (indices into [`IcebergTable::deletes`]) that apply to it.
    deletes: Vec<usize>,
}

/// One live delete file of the snapshot.
#[derive(Debug)]
struct DeleteFile {
    entry: Entry,
    path: Path,
}

/// The rows a delete file removes, read once.
#[derive(Debug)]
enum LoadedDeletes {
    /// Deleted positions by data file path, each list sorted.
    Positions(HashMap<String, Vec<u64>>),
    /// The encoded rows of the equality columns (snapshot column names, in order).
    Equality {
        columns: Vec<String>,
        converter: RowConverter,
        rows: HashSet<Box<[u8]>>,
    },
}

/// An Iceberg table pinned at one snapshot.
pub(crate) struct IcebergTable {
    table: String,
    snapshot_id: Option<u64>,
    schema: SchemaRef,
    specs: HashMap<i32, PartitionSpec>,
    files: Vec<IcebergFile>,
    by_uri: HashMap<String, usize>,
    deletes: Vec<DeleteFile>,
    /// The rows each delete file removes, read once, by the first read that needs them.
    loaded: Vec<OnceCell<Arc<LoadedDeletes>>>,
    store: Arc<dyn object_store::ObjectStore>,
}

impl std::fmt::Debug for IcebergTable {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("IcebergTable")
            .field("table", &self.table)
            .field("snapshot_id", &self.snapshot_id)
            .field("files", &self.files.len())
            .field("deletes", &self.deletes.len())
            .finish_non_exhaustive()
    }
}

fn iceberg_error(table: &str, reason: impl std::fmt::Display) -> FormatError {
    FormatError::Iceberg {
        table: table.to_owned(),
        reason: reason.to_string(),
    }
}

/// Whether `location` is an Iceberg table: a `.metadata.json` file, or a directory whose
/// `metadata/` holds one.
pub(crate) async fn is_iceberg_table(location: &Location) -> bool {
    if location.glob.is_some() {
        return false;
    }
    if location.path.as_ref().ends_with(".metadata.json") {
        return true;
    }
    let directory = location.path.clone().join("metadata");
    let mut listing = location.store.list(Some(&directory));
    while let Some(Ok(meta)) = listing.next().await {
        if meta.location.as_ref().ends_with(".metadata.json") {
            return true;
        }
    }
    false
}

/// The version a metadata file's name gives: `00003-<uuid>.metadata.json` and
/// `v3.metadata.json` are 3.
fn metadata_version(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".metadata.json")?;
    let digits: String = stem
        .trim_start_matches('v')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The store path of a file the table's metadata names by URI (`s3://bucket/key`,
/// `file:///path`, or a plain absolute path).
fn store_path(location: &Location, uri: &str) -> std::result::Result<Path, String> {
    let url = if uri.starts_with('/') {
        Url::from_file_path(uri).map_err(|()| format!("{uri} is not an absolute path"))?
    } else {
        Url::parse(uri).map_err(|error| format!("{uri}: {error}"))?
    };
    let scheme = match url.scheme() {
        "s3a" | "s3n" => "s3",
        other => other,
    };
    let root = &location.root;
    if scheme != root.scheme() || url.host_str() != root.host_str() {
        return Err(format!(
            "{uri} is outside the table's store {root}; a table whose files span stores cannot be read"
        ));
    }
    Path::from_url_path(url.path()).map_err(|error| format!("{uri}: {error}"))
}

impl IcebergTable {
    /// Opens the table at snapshot `snapshot`, at the snapshot current at `timestamp`, or at its
    /// current snapshot; with `filter`, the data files whose partition values and column bounds
    /// prove that no row passes are left out.
    pub(crate) async fn open(
        location: &Location,
        snapshot: Option<u64>,
        timestamp: Option<&str>,
        filter: Option<&Expr>,
    ) -> Result<Self> {
        let table = location.uri.clone();
        let error = |reason: String| iceberg_error(&table, reason);
        let timestamp_ms = timestamp
            .map(crate::delta::parse_timestamp_millis)
            .transpose()?;
        let snapshot = snapshot
            .map(|id| {
                i64::try_from(id).map_err(|_| error(format!("snapshot id {id} is out of range")))
            })
            .transpose()?;
        let metadata_path = Self::metadata_path(location).await?;
        let metadata_uri = location.uri_of(&metadata_path);
        let text = read(location.store.as_ref(), &metadata_path, &metadata_uri).await?;
        let metadata = TableMetadata::parse(&text)
            .map_err(|reason| error(format!("{metadata_uri}: {reason}")))?;
        let pinned = metadata.snapshot(snapshot, timestamp_ms).map_err(&error)?;
        let schema = metadata::arrow_schema(metadata.schema_of(pinned).map_err(&error)?)
            .map_err(|reason| error(format!("schema: {reason}")))?;
        let specs = metadata.specs();
        let snapshot_id = pinned
            .map(|snapshot| {
                u64::try_from(snapshot.snapshot_id).map_err(|_| {
                    error(format!(
                        "snapshot id {} is negative, which a job cannot pin",
                        snapshot.snapshot_id
                    ))
                })
            })
            .transpose()?;
        let mut sut = Self {
            table: table.clone(),
            snapshot_id,
            schema: Arc::new(schema),
            specs,
            files: Vec::new(),
            by_uri: HashMap::new(),
            deletes: Vec::new(),
            loaded: Vec::new(),
            store: Arc::clone(&location.store),
        };
        let Some(pinned) = pinned else {
            return Ok(sut);
        };
        let Some(list) = &pinned.manifest_list else {
            return Err(error(format!(
                "snapshot {} lists its manifests inline (format version 1 without a manifest list), which this reader does not read; rewrite the table's metadata with a current Iceberg writer",
                pinned.snapshot_id
            )));
        };
        let list_path = store_path(location, list).map_err(&error)?;
        let manifests =
            manifest::read_manifest_list(&read(location.store.as_ref(), &list_path, list).await?)
                .map_err(|reason| error(format!("manifest list {list}: {reason}")))?;
        // Each read owns what it needs: a stream of futures that borrow is not provably `Send`.
        let reads = manifests.into_iter().map(|manifest| {
            let path = store_path(location, &manifest.path);
            let store = Arc::clone(&location.store);
            let table = table.clone();
            async move {
                let path = path.map_err(|reason| iceberg_error(&table, reason))?;
                let bytes = read(store.as_ref(), &path, &manifest.path).await?;
                manifest::read_manifest(&bytes, &manifest).map_err(|reason| {
                    iceberg_error(&table, format!("manifest {}: {reason}", manifest.path))
                })
            }
        });
        let entries: Vec<Vec<Entry>> = stream::iter(reads)
            .buffered(MANIFEST_CONCURRENCY)
            .try_collect()
            .await?;
        for entry in entries.into_iter().flatten() {
            if !entry.format.eq_ignore_ascii_case("parquet") {
                return Err(error(format!(
                    "file {} is {}; this reader reads Parquet data and delete files",
                    entry.path, entry.format
                )));
            }
            let path = store_path(location, &entry.path).map_err(&error)?;
            match entry.content {
                Content::Data => sut.files.push(IcebergFile {
                    uri: location.uri_of(&path),
                    path,
                    entry,
                    deletes: Vec::new(),
                }),
                Content::PositionDeletes | Content::EqualityDeletes => {
                    sut.deletes.push(DeleteFile { entry, path });
                }
            }
        }
        sut.loaded = sut.deletes.iter().map(|_| OnceCell::new()).collect();
        sut.files.sort_by(|left, right| left.path.cmp(&right.path));
        if let Some(filter) = filter {
            sut.prune(filter)?;
        }
        for file in &mut sut.files {
            file.deletes = (0..sut.deletes.len())
                .filter(|index| applies(&sut.specs, &sut.deletes[*index].entry, &file.entry))
                .collect();
        }
        sut.by_uri = sut
            .files
            .iter()
            .enumerate()
            .map(|(index, file)| (file.uri.clone(), index))
            .collect();
        tracing::debug!(
            table = %sut.table,
            snapshot = ?sut.snapshot_id,
            files = sut.files.len(),
            deletes = sut.deletes.len(),
            "iceberg snapshot opened"
        );
        Ok(sut)
    }

    /// The metadata file: the one the location names, or the newest of its `metadata/`.
    async fn metadata_path(location: &Location) -> Result<Path> {
        if location.path.as_ref().ends_with(".metadata.json") {
            return Ok(location.path.clone());
        }
        let directory = location.path.clone().join("metadata");
        let listed: Vec<object_store::ObjectMeta> = location
            .store
            .list(Some(&directory))
            .try_collect()
            .await
            .map_err(|error| FormatError::store(format!("listing {directory}"), error))?;
        listed
            .into_iter()
            .filter_map(|meta| {
                let version = metadata_version(meta.location.filename()?)?;
                Some((version, meta.location))
            })
            .max_by(|left, right| left.0.cmp(&right.0).then_with(|| left.1.cmp(&right.1)))
            .map(|(_, path)| path)
            .ok_or_else(|| {
                iceberg_error(
                    &location.uri,
                    format!("{directory} holds no NNNNN-<uuid>.metadata.json or vN.metadata.json; give the URI of the table's current metadata file"),
                )
            })
    }

    /// Leaves out the data files that `filter` proves hold no row it keeps.
    fn prune(&mut self, filter: &Expr) -> Result<()> {
        let statistics = FileStatistics {
            schema: &self.schema,
            specs: &self.specs,
            files: &self.files,
        };
        let keep = filter.prune(&statistics)?;
        let before = self.files.len();
        let mut keep = keep.into_iter();
        self.files.retain(|_| keep.next().unwrap_or(true));
        tracing::debug!(table = %self.table, pruned = before - self.files.len(), "iceberg files pruned by partition values and column bounds");
        Ok(())
    }

    /// The snapshot the table is pinned to; `None` for a table with no snapshot yet.
    pub(crate) fn snapshot_id(&self) -> Option<u64> {
        self.snapshot_id
    }

    /// The snapshot's schema; every field carries its Iceberg field id.
    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The data files, pinned by their size in the manifests.
    pub(crate) fn files(&self) -> Vec<DataFile> {
        self.files
            .iter()
            .map(|file| DataFile {
                path: file.path.clone(),
                uri: file.uri.clone(),
                size: file.entry.size,
                partition_values: Vec::new(),
                identity: Some(ObjectIdentity::default()),
            })
            .collect()
    }

    fn file(&self, uri: &str) -> Result<&IcebergFile> {
        self.by_uri
            .get(uri)
            .map(|index| &self.files[*index])
            .ok_or_else(|| {
                iceberg_error(
                    &self.table,
                    format!(
                        "file {uri} is not live at snapshot {}; plan the table again",
                        self.snapshot_label()
                    ),
                )
            })
    }

    fn snapshot_label(&self) -> String {
        self.snapshot_id
            .map_or_else(|| "none".to_owned(), |id| id.to_string())
    }

    async fn loaded(&self, index: usize) -> Result<Arc<LoadedDeletes>> {
        self.loaded[index]
            .get_or_try_init(|| self.load(index))
            .await
            .cloned()
    }

    async fn load(&self, index: usize) -> Result<Arc<LoadedDeletes>> {
        let delete = &self.deletes[index];
        let bytes = read(self.store.as_ref(), &delete.path, &delete.entry.path).await?;
        let batches = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|builder| builder.build())
            .map_err(|error| FormatError::parquet(&delete.entry.path, error))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|error| {
                FormatError::arrow(format!("delete file {}", delete.entry.path), error)
            })?;
        let loaded = match delete.entry.content {
            Content::PositionDeletes => self.positions(&delete.entry.path, &batches)?,
            _ => self.equality(delete, &batches)?,
        };
        Ok(Arc::new(loaded))
    }

    fn positions(&self, uri: &str, batches: &[RecordBatch]) -> Result<LoadedDeletes> {
        let mut positions: HashMap<String, Vec<u64>> = HashMap::new();
        for batch in batches {
            let column = |id: i32, name: &str, data_type: &DataType| {
                let index = column_of(batch.schema_ref(), id, name).ok_or_else(|| {
                    iceberg_error(
                        &self.table,
                        format!("position delete file {uri} has no column {name} (field id {id})"),
                    )
                })?;
                cast(batch.column(index), data_type).map_err(|error| {
                    FormatError::arrow(format!("position delete file {uri}: {name}"), error)
                })
            };
            let paths = column(DELETE_FILE_PATH_ID, "file_path", &DataType::Utf8)?;
            let rows = column(DELETE_POS_ID, "pos", &DataType::Int64)?;
            let (Some(paths), Some(rows)) = (
                paths.as_any().downcast_ref::<StringArray>(),
                rows.as_any().downcast_ref::<Int64Array>(),
            ) else {
                continue;
            };
            for (path, row) in paths.iter().zip(rows.iter()) {
                if let (Some(path), Some(row)) = (path, row.and_then(|row| u64::try_from(row).ok()))
                {
                    positions.entry(path.to_owned()).or_default().push(row);
                }
            }
        }
        for rows in positions.values_mut() {
            rows.sort_unstable();
            rows.dedup();
        }
        Ok(LoadedDeletes::Positions(positions))
    }

    fn equality(&self, delete: &DeleteFile, batches: &[RecordBatch]) -> Result<LoadedDeletes> {
        let uri = &delete.entry.path;
        let mut fields = Vec::new();
        for id in &delete.entry.equality_ids {
            let field = self
                .schema
                .fields()
                .iter()
                .find(|field| field_id(field) == Some(*id))
                .ok_or_else(|| {
                    iceberg_error(
                        &self.table,
                        format!(
                            "equality delete file {uri} deletes by field id {id}, which snapshot {}'s schema does not have",
                            self.snapshot_label()
                        ),
                    )
                })?;
            fields.push(Arc::clone(field));
        }
        let converter = RowConverter::new(
            fields
                .iter()
                .map(|field| SortField::new(field.data_type().clone()))
                .collect(),
        )
        .map_err(|error| FormatError::arrow(format!("equality delete file {uri}"), error))?;
        let mut rows = HashSet::new();
        for batch in batches {
            let columns = fields
                .iter()
                .map(|field| {
                    let index = column_of(
                        batch.schema_ref(),
                        field_id(field).unwrap_or_default(),
                        field.name(),
                    )
                    .ok_or_else(|| {
                        iceberg_error(
                            &self.table,
                            format!("equality delete file {uri} has no column {}", field.name()),
                        )
                    })?;
                    conform(batch.column(index), field)
                })
                .collect::<Result<Vec<_>>>()?;
            let encoded = converter.convert_columns(&columns).map_err(|error| {
                FormatError::arrow(format!("equality delete file {uri}"), error)
            })?;
            rows.extend(encoded.iter().map(|row| Box::<[u8]>::from(row.as_ref())));
        }
        Ok(LoadedDeletes::Equality {
            columns: fields.iter().map(|field| field.name().clone()).collect(),
            converter,
            rows,
        })
    }

    /// The sorted rows of the file at `uri` that its position delete files remove.
    pub(crate) async fn deleted_rows(&self, uri: &str) -> Result<Option<Vec<u64>>> {
        let file = self.file(uri)?;
        let mut rows: Vec<u64> = Vec::new();
        for index in &file.deletes {
            if self.deletes[*index].entry.content != Content::PositionDeletes {
                continue;
            }
            if let LoadedDeletes::Positions(positions) = self.loaded(*index).await?.as_ref()
                && let Some(deleted) = positions.get(&file.entry.path)
            {
                rows.extend_from_slice(deleted);
            }
        }
        rows.sort_unstable();
        rows.dedup();
        Ok((!rows.is_empty()).then_some(rows))
    }

    /// How batches of the file at `uri` become the snapshot's: the file columns to read for the
    /// snapshot columns `needed`, and the function from such a batch to the snapshot's columns,
    /// with the rows of its equality deletes dropped (a mask to apply).
    pub(crate) async fn reader(
        &self,
        uri: &str,
        file_schema: &Schema,
        needed: &[String],
    ) -> Result<FileReader> {
        let file = self.file(uri)?;
        let mut equality = Vec::new();
        for index in &file.deletes {
            if self.deletes[*index].entry.content == Content::EqualityDeletes {
                equality.push(self.loaded(*index).await?);
            }
        }
        let mut wanted: Vec<FieldRef> = Vec::new();
        for field in self.schema.fields() {
            let by_equality = equality.iter().any(|loaded| {
                matches!(loaded.as_ref(), LoadedDeletes::Equality { columns, .. } if columns.contains(field.name()))
            });
            if needed.contains(field.name()) || by_equality {
                wanted.push(Arc::clone(field));
            }
        }
        let has_ids = file_schema
            .fields()
            .iter()
            .any(|field| field_id(field).is_some());
        let mut read = Vec::new();
        let mut sources = Vec::with_capacity(wanted.len());
        for field in &wanted {
            let found = file_schema.fields().iter().position(|candidate| {
                if has_ids {
                    field_id(candidate) == field_id(field)
                } else {
                    candidate.name() == field.name()
                }
            });
            sources.push(match found {
                Some(index) => {
                    read.push(index);
                    Source::Column(read.len() - 1)
                }
                None => Source::Constant(self.identity_value(file, field)),
            });
        }
        let read_schema = Arc::new(file_schema.project(&read).map_err(|error| {
            FormatError::arrow(format!("file {uri}: choosing its columns"), error)
        })?);
        Ok(FileReader {
            read_schema,
            output: Arc::new(Schema::new(wanted)),
            sources,
            equality,
            uri: uri.to_owned(),
        })
    }

    /// The value an identity partition of `file` gives column `field`, for a file without it.
    fn identity_value(&self, file: &IcebergFile, field: &Field) -> Option<ArrayRef> {
        let spec = self.specs.get(&file.entry.spec_id)?;
        let id = field_id(field)?;
        let position = spec
            .fields
            .iter()
            .position(|partition| partition.source_id == id && partition.transform == "identity")?;
        bounds::value(file.entry.partition.get(position)?, field.data_type())
    }
}

/// Where a snapshot column of a file's batches comes from.
#[derive(Debug)]
enum Source {
    /// The read batch's column at this index.
    Column(usize),
    /// A value for every row (an identity partition's), or null.
    Constant(Option<ArrayRef>),
}

/// How one data file's batches become the snapshot's: see [`IcebergTable::reader`].
#[derive(Debug)]
pub(crate) struct FileReader {
    /// The file's columns to read, as the file names them.
    pub read_schema: SchemaRef,
    output: SchemaRef,
    sources: Vec<Source>,
    equality: Vec<Arc<LoadedDeletes>>,
    uri: String,
}

impl FileReader {
    /// A batch of the file's columns ([`FileReader::read_schema`]) as the snapshot's, and the
    /// rows the equality deletes keep (`None`: all of them).
    pub(crate) fn to_snapshot(
        &self,
        batch: &RecordBatch,
    ) -> Result<(RecordBatch, Option<BooleanArray>)> {
        let rows = batch.num_rows();
        let columns = self
            .output
            .fields()
            .iter()
            .zip(&self.sources)
            .map(|(field, source)| match source {
                Source::Column(index) => conform(batch.column(*index), field),
                Source::Constant(Some(value)) => {
                    let zeros = UInt32Array::from(vec![0u32; rows]);
                    arrow::compute::take(value.as_ref(), &zeros, None).map_err(|error| {
                        FormatError::arrow(format!("file {}: {}", self.uri, field.name()), error)
                    })
                }
                Source::Constant(None) => Ok(new_null_array(field.data_type(), rows)),
            })
            .collect::<Result<Vec<_>>>()?;
        let snapshot =
            RecordBatch::try_new(Arc::clone(&self.output), columns).map_err(|error| {
                FormatError::arrow(
                    format!("file {}: as the snapshot's schema", self.uri),
                    error,
                )
            })?;
        let mut keep: Option<Vec<bool>> = None;
        for loaded in &self.equality {
            let LoadedDeletes::Equality {
                columns,
                converter,
                rows: deleted,
            } = loaded.as_ref()
            else {
                continue;
            };
            let keys = columns
                .iter()
                .map(|name| {
                    snapshot.column_by_name(name).cloned().ok_or_else(|| {
                        iceberg_error(&self.uri, format!("equality column {name} is missing"))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let encoded = converter.convert_columns(&keys).map_err(|error| {
                FormatError::arrow(format!("file {}: equality deletes", self.uri), error)
            })?;
            let kept = keep.get_or_insert_with(|| vec![true; rows]);
            for (row, key) in encoded.iter().enumerate() {
                if deleted.contains(key.as_ref()) {
                    kept[row] = false;
                }
            }
        }
        Ok((snapshot, keep.map(BooleanArray::from)))
    }
}

/// The index of the column of `schema` with field id `id`, or named `name` in a file without
/// field ids.
fn column_of(schema: &Schema, id: i32, name: &str) -> Option<usize> {
    let fields = schema.fields();
    fields
        .iter()
        .position(|field| field_id(field) == Some(id))
        .or_else(|| {
            fields
                .iter()
                .all(|field| field_id(field).is_none())
                .then(|| fields.iter().position(|field| field.name() == name))
                .flatten()
        })
}

/// `array`, read from a file, as the snapshot's `field`: nested fields matched by field id (or by
/// name where the file has none), missing ones null, types promoted.
fn conform(array: &ArrayRef, field: &Field) -> Result<ArrayRef> {
    let context = || format!("column {}", field.name());
    if array.data_type() == field.data_type() {
        return Ok(Arc::clone(array));
    }
    match (array.data_type(), field.data_type()) {
        (DataType::Struct(_), DataType::Struct(wanted)) => {
            let Some(found) = array.as_any().downcast_ref::<StructArray>() else {
                return Err(iceberg_error(&context(), "not a struct"));
            };
            let children = conform_children(found.fields(), found.columns(), wanted, found.len())?;
            StructArray::try_new(wanted.clone(), children, found.nulls().cloned())
                .map(|array| Arc::new(array) as ArrayRef)
                .map_err(|error| FormatError::arrow(context(), error))
        }
        (DataType::List(_) | DataType::LargeList(_), DataType::List(element)) => {
            let list = if matches!(array.data_type(), DataType::LargeList(_)) {
                cast(array, &DataType::List(Arc::clone(element)))
                    .map_err(|error| FormatError::arrow(context(), error))?
            } else {
                Arc::clone(array)
            };
            let Some(list) = list.as_any().downcast_ref::<ListArray>() else {
                return Err(iceberg_error(&context(), "not a list"));
            };
            let values = conform(list.values(), element)?;
            ListArray::try_new(
                Arc::clone(element),
                list.offsets().clone(),
                values,
                list.nulls().cloned(),
            )
            .map(|array| Arc::new(array) as ArrayRef)
            .map_err(|error| FormatError::arrow(context(), error))
        }
        (DataType::Map(..), DataType::Map(entries, sorted)) => {
            let (Some(map), DataType::Struct(wanted)) = (
                array.as_any().downcast_ref::<MapArray>(),
                entries.data_type(),
            ) else {
                return Err(iceberg_error(&context(), "not a map"));
            };
            let found = map.entries();
            let children = conform_children(found.fields(), found.columns(), wanted, found.len())?;
            let entries_array = StructArray::try_new(wanted.clone(), children, None)
                .map_err(|error| FormatError::arrow(context(), error))?;
            MapArray::try_new(
                Arc::clone(entries),
                map.offsets().clone(),
                entries_array,
                map.nulls().cloned(),
                *sorted,
            )
            .map(|array| Arc::new(array) as ArrayRef)
            .map_err(|error| FormatError::arrow(context(), error))
        }
        _ => cast(array, field.data_type()).map_err(|error| FormatError::arrow(context(), error)),
    }
}

fn conform_children(
    found: &Fields,
    columns: &[ArrayRef],
    wanted: &Fields,
    rows: usize,
) -> Result<Vec<ArrayRef>> {
    let has_ids = found.iter().any(|field| field_id(field).is_some());
    wanted
        .iter()
        .map(|field| {
            let position = found.iter().position(|candidate| {
                if has_ids {
                    field_id(candidate) == field_id(field)
                } else {
                    candidate.name() == field.name()
                }
            });
            match position {
                Some(index) => conform(&columns[index], field),
                None => Ok(new_null_array(field.data_type(), rows)),
            }
        })
        .collect()
}

/// Whether delete file `delete` applies to data file `data`, by the Iceberg spec's rules: the
/// same partition (spec and values) or an unpartitioned delete; for position deletes a data
/// sequence number at least the file's, and a path range holding the file's; for equality deletes
/// a greater one.
fn applies(specs: &HashMap<i32, PartitionSpec>, delete: &Entry, data: &Entry) -> bool {
    let global = specs
        .get(&delete.spec_id)
        .is_none_or(|spec| spec.fields.is_empty());
    if !global && (delete.spec_id != data.spec_id || delete.partition != data.partition) {
        return false;
    }
    match delete.content {
        Content::PositionDeletes => {
            let path = data.path.as_bytes();
            delete.sequence_number >= data.sequence_number
                && delete
                    .referenced_data_file
                    .as_ref()
                    .is_none_or(|referenced| referenced == &data.path)
                && delete
                    .lower_bounds
                    .get(&DELETE_FILE_PATH_ID)
                    .is_none_or(|lower| lower.as_slice() <= path)
                && delete
                    .upper_bounds
                    .get(&DELETE_FILE_PATH_ID)
                    .is_none_or(|upper| path <= upper.as_slice())
        }
        Content::EqualityDeletes => delete.sequence_number > data.sequence_number,
        Content::Data => false,
    }
}

/// The manifests' statistics of a snapshot's data files, one container per file: column bounds,
/// or the range a partition value pins where a file has no bounds for the column.
struct FileStatistics<'a> {
    schema: &'a Schema,
    specs: &'a HashMap<i32, PartitionSpec>,
    files: &'a [IcebergFile],
}

impl FileStatistics<'_> {
    fn per_file(&self, column: &str, lower: bool) -> Option<ArrayRef> {
        let field = self.schema.field_with_name(column).ok()?;
        let id = field_id(field)?;
        let data_type = field.data_type();
        if matches!(
            data_type,
            DataType::Float16 | DataType::Float32 | DataType::Float64
        ) {
            return None;
        }
        let values: Vec<ArrayRef> = self
            .files
            .iter()
            .map(|file| {
                let bounds = if lower {
                    &file.entry.lower_bounds
                } else {
                    &file.entry.upper_bounds
                };
                bounds
                    .get(&id)
                    .and_then(|bytes| bounds::bound(bytes, data_type))
                    .or_else(|| self.partition_end(file, id, data_type, lower))
                    .unwrap_or_else(|| new_null_array(data_type, 1))
            })
            .collect();
        let values: Vec<&dyn Array> = values.iter().map(AsRef::as_ref).collect();
        arrow::compute::concat(&values).ok()
    }

    fn partition_end(
        &self,
        file: &IcebergFile,
        id: i32,
        data_type: &DataType,
        lower: bool,
    ) -> Option<ArrayRef> {
        let spec = self.specs.get(&file.entry.spec_id)?;
        spec.fields
            .iter()
            .zip(&file.entry.partition)
            .filter(|(partition, _)| partition.source_id == id)
            .find_map(|(partition, value)| {
                let (first, last) = bounds::partition_range(&partition.transform, value, data_type);
                if lower { first } else { last }
            })
    }
}

impl PruningStatistics for FileStatistics<'_> {
    fn num_containers(&self) -> usize {
        self.files.len()
    }

    fn min_values(&self, column: &str) -> Option<ArrayRef> {
        self.per_file(column, true)
    }

    fn max_values(&self, column: &str) -> Option<ArrayRef> {
        self.per_file(column, false)
    }

    fn null_counts(&self, column: &str) -> Option<arrow::array::UInt64Array> {
        let id = field_id(self.schema.field_with_name(column).ok()?)?;
        Some(
            self.files
                .iter()
                .map(|file| {
                    file.entry.null_counts.get(&id).copied().or_else(|| {
                        // A null identity partition value: every row's value is null.
                        self.specs
                            .get(&file.entry.spec_id)?
                            .fields
                            .iter()
                            .zip(&file.entry.partition)
                            .any(|(partition, value)| {
                                partition.source_id == id
                                    && partition.transform == "identity"
                                    && matches!(value, apache_avro::types::Value::Null)
                            })
                            .then_some(file.entry.record_count)
                    })
                })
                .collect(),
        )
    }

    fn row_counts(&self) -> Option<arrow::array::UInt64Array> {
        Some(
            self.files
                .iter()
                .map(|file| Some(file.entry.record_count))
                .collect(),
        )
    }
}

/// The bytes of the file at `path` of `store`, named `uri` in errors.
async fn read(
    store: &dyn object_store::ObjectStore,
    path: &Path,
    uri: &str,
) -> Result<bytes::Bytes> {
    let context = || format!("reading {uri}");
    store
        .get(path)
        .await
        .map_err(|error| FormatError::store(context(), error))?
        .bytes()
        .await
        .map_err(|error| FormatError::store(context(), error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;
    use metadata::PartitionField;

    fn partition(values: &[i32]) -> Vec<Value> {
        values.iter().map(|value| Value::Int(*value)).collect()
    }

    fn entry(content: Content, spec_id: i32, values: &[i32], sequence_number: i64) -> Entry {
        Entry {
            content,
            path: "s3://b/t/data/a.parquet".into(),
            format: "PARQUET".into(),
            spec_id,
            partition: partition(values),
            record_count: 10,
            size: 100,
            sequence_number,
            null_counts: HashMap::new(),
            lower_bounds: HashMap::new(),
            upper_bounds: HashMap::new(),
            equality_ids: vec![1],
            referenced_data_file: None,
        }
    }

    fn specs() -> HashMap<i32, PartitionSpec> {
        HashMap::from([
            (
                0,
                PartitionSpec {
                    spec_id: 0,
                    fields: Vec::new(),
                },
            ),
            (
                1,
                PartitionSpec {
                    spec_id: 1,
                    fields: vec![PartitionField {
                        source_id: 2,
                        transform: "day".into(),
                    }],
                },
            ),
        ])
    }

    #[test]
    fn deletes_apply_by_sequence_number_and_partition() {
        let specs = specs();
        let data = entry(Content::Data, 1, &[5], 3);
        let position = |spec, values: &[i32], sequence| {
            applies(
                &specs,
                &entry(Content::PositionDeletes, spec, values, sequence),
                &data,
            )
        };
        let equality = |spec, values: &[i32], sequence| {
            applies(
                &specs,
                &entry(Content::EqualityDeletes, spec, values, sequence),
                &data,
            )
        };
        assert!(
            position(1, &[5], 3),
            "a position delete of the same commit applies"
        );
        assert!(!position(1, &[5], 2), "an older position delete does not");
        assert!(!position(1, &[6], 4), "another partition's does not");
        assert!(
            position(0, &[], 4),
            "an unpartitioned one applies everywhere"
        );
        assert!(
            !equality(1, &[5], 3),
            "an equality delete of the same commit does not"
        );
        assert!(equality(1, &[5], 4));
        assert!(equality(0, &[], 4));
        assert!(!equality(1, &[6], 4));
    }

    #[test]
    fn a_position_delete_applies_only_within_its_path_bounds_and_referenced_file() {
        let specs = specs();
        let data = entry(Content::Data, 1, &[5], 1);
        let mut delete = entry(Content::PositionDeletes, 0, &[], 2);
        delete
            .lower_bounds
            .insert(DELETE_FILE_PATH_ID, b"s3://b/t/data/b".to_vec());
        assert!(
            !applies(&specs, &delete, &data),
            "a.parquet sorts before the lower bound"
        );
        delete
            .lower_bounds
            .insert(DELETE_FILE_PATH_ID, b"s3://b/t/data/a".to_vec());
        delete
            .upper_bounds
            .insert(DELETE_FILE_PATH_ID, b"s3://b/t/data/z".to_vec());
        assert!(applies(&specs, &delete, &data));
        delete.referenced_data_file = Some("s3://b/t/data/other.parquet".into());
        assert!(!applies(&specs, &delete, &data));
    }

    #[test]
    fn metadata_files_are_ordered_by_their_version() {
        assert_eq!(metadata_version("00012-1f1e2d3c.metadata.json"), Some(12));
        assert_eq!(metadata_version("v3.metadata.json"), Some(3));
        assert_eq!(metadata_version("snap-1.avro"), None);
        assert_eq!(metadata_version("version-hint.text"), None);
    }

    #[test]
    fn files_are_found_in_the_tables_store_or_refused() {
        let location = crate::store::open_location("/tmp/t", &Default::default()).expect("local");
        assert_eq!(
            store_path(&location, "file:///tmp/t/data/a%20b.parquet")
                .expect("file")
                .as_ref(),
            "tmp/t/data/a b.parquet"
        );
        assert_eq!(
            store_path(&location, "/tmp/t/data/x.parquet")
                .expect("plain")
                .as_ref(),
            "tmp/t/data/x.parquet"
        );
        let error = store_path(&location, "s3://bucket/t/data/x.parquet").expect_err("s3");
        assert!(error.contains("outside the table's store"), "{error}");
    }

    #[test]
    fn file_columns_are_found_by_field_id_and_promoted() {
        let with_id = |name: &str, data_type: DataType, id: i32| {
            Field::new(name, data_type, true).with_metadata(HashMap::from([(
                metadata::FIELD_ID_KEY.to_owned(),
                id.to_string(),
            )]))
        };
        let inner_file = Fields::from(vec![with_id("old_name", DataType::Int32, 5)]);
        let inner_table = Fields::from(vec![
            with_id("x", DataType::Int64, 6),
            with_id("new_name", DataType::Int64, 5),
        ]);
        let file_struct: ArrayRef = Arc::new(StructArray::new(
            inner_file,
            vec![Arc::new(arrow::array::Int32Array::from(vec![1, 2]))],
            None,
        ));
        let table_field = with_id("s", DataType::Struct(inner_table), 4);
        let sut = conform(&file_struct, &table_field).expect("conform");
        let sut = sut.as_any().downcast_ref::<StructArray>().expect("struct");
        assert_eq!(
            sut.column(0).null_count(),
            2,
            "a field the file lacks is null"
        );
        let renamed = sut
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("promoted to long");
        assert_eq!(renamed.values(), &[1, 2]);
    }
}
