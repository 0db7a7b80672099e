//! Following a source that grows: the Parquet files that appeared under a dataset since it was
//! planned, and the Delta commits after a version.
//!
//! # Implementation
//! A Parquet dataset is listed again as [`Dataset::open`] lists it (hidden `_` and `.` entries
//! skipped, only files of the dataset's format), and the listing is diffed by URI against the files
//! already planned. Each new file is planned on its own, so that a file whose footer cannot be read
//! yet (still being written) can be retried without holding the others back.
//!
//! A Delta table's commits after a version are read with the kernel's [`CommitRange`], which lists
//! `_delta_log` and reads each commit's JSON through the table's object store. Only appends can be
//! followed, as Spark's Delta streaming source does without `ignoreChanges`: an `add` with
//! `dataChange: true` is new data, actions with `dataChange: false` (OPTIMIZE, compaction, a
//! deletion vector purge) change no rows and are skipped, and a `remove` with `dataChange: true`
//! (DELETE, UPDATE, MERGE, OVERWRITE) is an error naming the version and the operation. The
//! splits of the added files are planned from the kernel's snapshot at the commit's version, so
//! their deletion vectors, partition values and column mapping are the table's at that version.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, BooleanArray, RecordBatch, StringArray, StructArray};
use delta_kernel::Snapshot;
use delta_kernel::commit_range::{CommitRange, DeltaAction};
use delta_kernel::engine::arrow_data::ArrowEngineData;
use delta_kernel_default_engine::DefaultEngine;
use object_store::path::Path;
use url::Url;

use crate::dataset::{DataFile, Dataset, FormatKind, OpenOptions};
use crate::error::{FormatError, Result};
use crate::plan::{ObjectIdentity, Split, cut};
use crate::store::open_location;

/// A file found under a followed dataset that was not planned before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFile {
    /// The file's URI.
    pub uri: String,
    /// Its size in bytes, as listed.
    pub size: u64,
    path: Path,
    identity: ObjectIdentity,
}

/// What one Delta commit adds to a followed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaCommit {
    /// The commit's version.
    pub version: u64,
    /// The commit timestamp, in milliseconds since the Unix epoch: the in-commit timestamp when
    /// the table has them, else the commit file's modification time.
    pub timestamp_ms: i64,
    /// The URIs of the files the commit adds with `dataChange: true`, in the commit's order.
    pub added: Vec<String>,
}

impl Dataset {
    /// Lists the dataset's location again and returns the files of its format that are not in
    /// `planned` (URIs), sorted by path.
    ///
    /// # Errors
    ///
    /// Returns an error when the listing fails, or for a Delta table, whose growth is read from
    /// its log with [`delta_commits`].
    pub async fn unplanned_files(&self, planned: &HashSet<String>) -> Result<Vec<NewFile>> {
        if self.kind == FormatKind::Delta {
            return Err(FormatError::InvalidArgument(format!(
                "{} is a Delta table: follow its commits, not its files",
                self.location.uri
            )));
        }
        let objects = crate::dataset::list_files(&self.location).await?;
        let local = self.location.root.scheme() == "file";
        Ok(objects
            .into_iter()
            .filter(|meta| FormatKind::from_extension(meta.location.as_ref()) == Some(self.kind))
            .map(|meta| NewFile {
                uri: self.location.uri_of(&meta.location),
                size: meta.size,
                identity: ObjectIdentity::listed(&meta, local),
                path: meta.location,
            })
            .filter(|file| !planned.contains(&file.uri))
            .collect())
    }

    /// Plans one file found by [`Dataset::unplanned_files`] into splits of at most `task_rows`
    /// rows. Its Hive partition values are read from its path for the dataset's partition columns.
    ///
    /// # Errors
    ///
    /// Returns an error when the file's footer (or rows, for row formats) cannot be read, as for
    /// a file still being written.
    pub async fn plan_new_file(&self, file: &NewFile, task_rows: u64) -> Result<Vec<Split>> {
        let pairs = crate::dataset::hive_pairs(&self.location.path, &file.path);
        let data_file = DataFile {
            path: file.path.clone(),
            uri: file.uri.clone(),
            size: file.size,
            identity: Some(file.identity.clone()),
            partition_values: self
                .partition_fields
                .iter()
                .map(|field| {
                    pairs
                        .iter()
                        .find(|(name, _)| name == field.name())
                        .and_then(|(_, value)| value.clone())
                })
                .collect(),
        };
        let (row_groups, layout) = self.file_row_groups(&data_file, task_rows).await?;
        let row_groups = [row_groups];
        crate::plan::check_cut(&row_groups, task_rows, |_| data_file.uri.clone())?;
        Ok(cut(&row_groups, task_rows.max(1))
            .into_iter()
            .map(|(_, first_row, row_count)| Split {
                task_id: 0,
                uri: data_file.uri.clone(),
                file_size: data_file.size,
                first_row,
                row_count,
                partition_values: self
                    .partition_fields
                    .iter()
                    .zip(&data_file.partition_values)
                    .map(|(field, value)| (field.name().clone(), value.clone()))
                    .collect(),
                delta: None,
                bytes: layout
                    .as_ref()
                    .and_then(|layout| layout.bytes_of(first_row, row_count)),
                identity: data_file.identity.clone(),
            })
            .collect())
    }
}

/// Reads the commits of the Delta table at `uri` after version `after`, up to `last` (inclusive)
/// when given, and what each adds.
///
/// # Errors
///
/// [`FormatError::FollowUnsupported`] when a commit changes rows other than by appending: it names
/// the version and the operation. [`FormatError::Delta`] when the log cannot be read.
///
/// The future owns what it uses, so that it can be spawned whatever the arguments' lifetimes.
pub fn delta_commits(
    uri: &str,
    options: &OpenOptions,
    after: u64,
    last: Option<u64>,
) -> impl Future<Output = Result<Vec<DeltaCommit>>> + Send + 'static {
    let location = open_location(uri, &options.storage_options);
    async move { delta_commits_at(location?, after, last).await }
}

async fn delta_commits_at(
    location: crate::store::Location,
    after: u64,
    last: Option<u64>,
) -> Result<Vec<DeltaCommit>> {
    let table_url = location.directory_url()?;
    let store = Arc::clone(&location.store);
    let url = table_url.clone();
    let commits = tokio::task::spawn_blocking(move || read_commits(&url, store, after, last))
        .await
        .map_err(|error| delta_error(&table_url, format!("reading commits failed: {error}")))??;
    commits
        .into_iter()
        .map(|(version, timestamp_ms, paths)| {
            let added = paths
                .iter()
                .map(|path| {
                    let file_url = table_url.join(path).map_err(|error| {
                        delta_error(
                            &table_url,
                            format!("version {version}: file {path}: {error}"),
                        )
                    })?;
                    let object = Path::from_url_path(file_url.path()).map_err(|error| {
                        delta_error(
                            &table_url,
                            format!("version {version}: file {path}: {error}"),
                        )
                    })?;
                    Ok(location.uri_of(&object))
                })
                .collect::<Result<Vec<String>>>()?;
            Ok(DeltaCommit {
                version,
                timestamp_ms,
                added,
            })
        })
        .collect()
}

fn delta_error(table: &Url, reason: impl Into<String>) -> FormatError {
    FormatError::Delta {
        table: table.to_string(),
        reason: reason.into(),
    }
}

/// One commit as read from the log: version, timestamp and the paths of its data-changing adds.
type RawCommit = (u64, i64, Vec<String>);

fn read_commits(
    table_url: &Url,
    store: Arc<dyn object_store::ObjectStore>,
    after: u64,
    last: Option<u64>,
) -> Result<Vec<RawCommit>> {
    let engine: Arc<DefaultEngine<_>> = Arc::new(DefaultEngine::builder(store).build());
    let error = |error: delta_kernel::KernelError| delta_error(table_url, error.to_string());
    let snapshot = Snapshot::builder_for(table_url.as_str())
        .build(engine.as_ref())
        .map_err(error)?;
    let latest = snapshot.version();
    let end = last.map_or(latest, |last| last.min(latest));
    if end <= after {
        return Ok(Vec::new());
    }
    let range = CommitRange::builder_from(snapshot, after + 1)
        .with_end_version(end)
        .build(engine.as_ref())
        .map_err(error)?;
    let mut commits = Vec::new();
    let actions = [
        DeltaAction::Add,
        DeltaAction::Remove,
        DeltaAction::CommitInfo,
    ];
    for commit in range
        .commits(engine.clone(), None, &actions)
        .map_err(error)?
    {
        let commit = commit.map_err(error)?;
        let version = commit.version();
        let mut added = Vec::new();
        let mut removed: Option<String> = None;
        let mut operation: Option<String> = None;
        for data in commit.get_actions(engine.as_ref()).map_err(error)? {
            let data = data.map_err(error)?;
            let batch = data
                .any_ref()
                .downcast_ref::<ArrowEngineData>()
                .map(ArrowEngineData::record_batch)
                .ok_or_else(|| {
                    delta_error(
                        table_url,
                        format!("version {version}: actions are not Arrow data"),
                    )
                })?;
            added.extend(changing_paths(batch, "add"));
            if removed.is_none() {
                removed = changing_paths(batch, "remove").into_iter().next();
            }
            if operation.is_none() {
                operation = operation_of(batch);
            }
        }
        if let Some(path) = removed {
            return Err(FormatError::FollowUnsupported {
                table: table_url.to_string(),
                version,
                operation: operation.unwrap_or_else(|| "unknown operation".to_owned()),
                path,
            });
        }
        commits.push((version, commit.timestamp(), added));
    }
    Ok(commits)
}

/// The paths of the `column` actions (`add` or `remove`) of a batch that change data.
fn changing_paths(batch: &RecordBatch, column: &str) -> Vec<String> {
    let Some(actions) = batch
        .column_by_name(column)
        .and_then(|actions| actions.as_any().downcast_ref::<StructArray>())
    else {
        return Vec::new();
    };
    let paths = actions
        .column_by_name("path")
        .and_then(|paths| paths.as_any().downcast_ref::<StringArray>());
    let data_change = actions
        .column_by_name("dataChange")
        .and_then(|flags| flags.as_any().downcast_ref::<BooleanArray>());
    let Some(paths) = paths else {
        return Vec::new();
    };
    (0..actions.len())
        .filter(|row| actions.is_valid(*row) && paths.is_valid(*row))
        // A missing dataChange is read as true: the protocol requires the field, and treating an
        // unknown change as data keeps a removal from passing unnoticed.
        .filter(|row| data_change.is_none_or(|flags| flags.is_null(*row) || flags.value(*row)))
        .map(|row| paths.value(row).to_owned())
        .collect()
}

/// The `commitInfo.operation` of a batch, if it has one.
fn operation_of(batch: &RecordBatch) -> Option<String> {
    let info = batch
        .column_by_name("commitInfo")?
        .as_any()
        .downcast_ref::<StructArray>()?;
    let operations = info
        .column_by_name("operation")?
        .as_any()
        .downcast_ref::<StringArray>()?;
    (0..info.len())
        .find(|row| info.is_valid(*row) && operations.is_valid(*row))
        .map(|row| operations.value(row).to_owned())
}
