//! A job's data, planned once into splits.
//!
//! The plan is made when a job first starts and is stored beside the journal, so an AM that takes
//! the job over reads the same splits even if the sources changed meanwhile (new files, new Delta
//! commits): task ids and row positions keep their meaning across restarts.

use crate::error::{AmError, Result};
use crate::spec::{BadDataPolicy, JobSpec, SourceFormat, SourceSpec};
use arrow::datatypes::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use sluice_formats::{
    Dataset, DeltaSplitInfo, Expr, FormatKind, ObjectIdentity, OpenOptions, ReadOptions, Split,
    SplitBytes,
};

/// One data file of a job, with what is needed to read its rows exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFile {
    /// The index of the file's source in the job spec's `data.sources`.
    pub source: u32,
    /// The file's URI.
    pub uri: String,
    /// The file's size in bytes.
    pub file_size: u64,
    /// Hive or Delta partition values: column name and value as text (`None` for null).
    pub partition_values: Vec<(String, Option<String>)>,
    /// The pinned table version and deletion vector, for a Delta file.
    pub delta: Option<DeltaSplitInfo>,
}

/// One split: a row range of one file. 24 bytes, so that a plan of ten million splits stays small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedSplit {
    /// The index of the file in [`JobPlan::files`].
    pub file: u32,
    /// The first row of the range, counted from the start of the file.
    pub first_row: u64,
    /// The number of rows in the range.
    pub row_count: u64,
}

/// Where the rows of one split of a row format (CSV, JSON lines, TFRecord, Arrow IPC) lie in its
/// file, so that its daemon reads those bytes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedBytes {
    /// The index of the split in [`JobPlan::splits`].
    pub split: u32,
    /// The split's bytes.
    pub bytes: SplitBytes,
}

/// What one file of the plan was when it was planned (entity tag, version, a local file's
/// modification time), which every read of its splits must find again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedIdentity {
    /// The index of the file in [`JobPlan::files`].
    pub file: u32,
    /// The file's identity.
    pub identity: ObjectIdentity,
}

/// Every split of a job: sources in spec order, each source's splits in plan order. A split's
/// index in `splits` is the split index carried by the job's tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    /// The files the splits read, each once.
    pub files: Vec<PlannedFile>,
    /// The splits.
    pub splits: Vec<PlannedSplit>,
    /// The Delta version each source of the spec was planned at (`None` for other formats).
    pub versions: Vec<Option<u64>>,
    /// The bytes of the splits of row formats, sorted by split: one entry per such split, none for
    /// Parquet and Delta splits, which find their rows in their files' footers. A plan stored before
    /// splits carried their bytes has none, and its row-format splits read their whole files.
    pub bytes: Vec<PlannedBytes>,
    /// The identities of the files, sorted by file: one entry per file, taken when the file was
    /// planned, when the job was or when a followed source added it (a Delta table's files pinned by
    /// their size in the table's log). A plan stored before files carried their identities has none,
    /// and its files are read as they are.
    pub identities: Vec<PlannedIdentity>,
    /// The files left out of the plan because they do not decode (`data.on_bad_data: skip |
    /// warn`), in source order. A plan stored before files were left out has none.
    pub left_out: Vec<LeftOutFile>,
}

/// A file left out of a job's plan because it does not decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftOutFile {
    /// The index of the file's source in the job spec's `data.sources`.
    pub source: u32,
    /// The file's URI.
    pub uri: String,
    /// Why it does not decode.
    pub cause: String,
}

impl JobPlan {
    /// Opens every source of the spec and plans it into splits of at most `data.task_rows` rows.
    pub async fn build(spec: &JobSpec) -> Result<JobPlan> {
        let mut plan = JobPlan::default();
        for (index, source) in spec.data.sources.iter().enumerate() {
            let (block, _) = plan_source(spec, index as u32, source).await?;
            plan.append(&block);
            plan.versions.extend(block.versions);
            plan.left_out.extend(block.left_out);
        }
        Ok(plan)
    }

    /// Plans `source`, to be added to the running job of `spec` (`sluice source add`): its files
    /// and splits counted from 0, as [`JobPlan::append`] takes them, and the Delta version it was
    /// planned at. Refused when its columns, after projection, are not those of the job's first
    /// source (names and types, in order): every ring of the job carries one schema.
    pub async fn for_added_source(
        spec: &JobSpec,
        index: u32,
        source: &SourceSpec,
    ) -> Result<(JobPlan, Option<u64>)> {
        let first = spec.data.sources.first().ok_or_else(|| {
            AmError::FailedPrecondition("the job has no source to match".to_owned())
        })?;
        let expected = output_schema(spec, first).await?;
        let (block, dataset) = plan_source(spec, index, source).await?;
        let found = dataset
            .output_schema(&read_options(spec, source)?)
            .map_err(|error| source_error(source, error))?;
        if let Some(difference) = schema_difference(&expected, &found) {
            return Err(AmError::InvalidRequest(format!(
                "source {} does not fit the job: {difference}; the job's first source, {}, gives {}. Choose its columns (`columns`, or `--columns` of `sluice source add`), or add a source of the same schema",
                source.uri,
                first.uri,
                describe_fields(&expected)
            )));
        }
        Ok((block, dataset.table_version()))
    }

    /// A plan of `splits` alone, of source `source`: the files and splits a followed source
    /// adds, with file indices counted from 0 until [`JobPlan::append`] places them.
    pub fn of_splits(source: u32, splits: Vec<Split>) -> JobPlan {
        let mut block = JobPlan::default();
        block.extend(source, splits);
        block
    }

    /// Appends the files, splits, split bytes and file identities of `block` (as made by
    /// [`JobPlan::of_splits`], its indices counted from its own first file and split) after this
    /// plan's; returns the index of the first appended split.
    pub fn append(&mut self, block: &JobPlan) -> usize {
        let first_file = self.files.len() as u32;
        let first_split = self.splits.len();
        self.files.extend_from_slice(&block.files);
        self.splits
            .extend(block.splits.iter().map(|split| PlannedSplit {
                file: first_file + split.file,
                ..*split
            }));
        self.bytes
            .extend(block.bytes.iter().map(|planned| PlannedBytes {
                split: first_split as u32 + planned.split,
                ..*planned
            }));
        self.identities
            .extend(block.identities.iter().map(|planned| PlannedIdentity {
                file: first_file + planned.file,
                identity: planned.identity.clone(),
            }));
        first_split
    }

    /// Keeps the first `files` files and `splits` splits, with their bytes and identities: undoes
    /// [`JobPlan::append`]s made after the plan had that many.
    pub fn truncate(&mut self, files: usize, splits: usize) {
        self.files.truncate(files);
        self.splits.truncate(splits);
        self.bytes
            .retain(|planned| (planned.split as usize) < splits);
        self.identities
            .retain(|planned| (planned.file as usize) < files);
    }

    /// Appends the splits of source `source`, keeping each file once with its identity, and the
    /// bytes of the splits that carry them.
    pub fn extend(&mut self, source: u32, splits: Vec<Split>) {
        let mut last_uri: Option<String> = None;
        for split in splits {
            if last_uri.as_deref() != Some(split.uri.as_str()) {
                last_uri = Some(split.uri.clone());
                if let Some(identity) = split.identity {
                    self.identities.push(PlannedIdentity {
                        file: self.files.len() as u32,
                        identity,
                    });
                }
                self.files.push(PlannedFile {
                    source,
                    uri: split.uri,
                    file_size: split.file_size,
                    partition_values: split.partition_values,
                    delta: split.delta,
                });
            }
            if let Some(bytes) = split.bytes {
                self.bytes.push(PlannedBytes {
                    split: self.splits.len() as u32,
                    bytes,
                });
            }
            self.splits.push(PlannedSplit {
                file: (self.files.len() - 1) as u32,
                first_row: split.first_row,
                row_count: split.row_count,
            });
        }
    }

    /// Where the rows of split `split` lie in its file, when the plan knows.
    pub fn bytes_of(&self, split: u32) -> Option<SplitBytes> {
        self.bytes
            .binary_search_by_key(&split, |planned| planned.split)
            .ok()
            .map(|index| self.bytes[index].bytes)
    }

    /// What file `file` was when it was planned, when the plan pinned it.
    pub fn identity_of(&self, file: u32) -> Option<&ObjectIdentity> {
        self.identities
            .binary_search_by_key(&file, |planned| planned.file)
            .ok()
            .map(|index| &self.identities[index].identity)
    }

    /// The row count of every split, in split order.
    pub fn split_rows(&self) -> Vec<u64> {
        self.splits.iter().map(|split| split.row_count).collect()
    }
}

/// Opens `source`, the `index`th of the job of `spec`, and plans it: its files and splits counted
/// from 0, its Delta version, the files left out because they do not decode (refused past
/// `data.max_bad_fraction`); with the dataset it opened.
async fn plan_source(
    spec: &JobSpec,
    index: u32,
    source: &SourceSpec,
) -> Result<(JobPlan, Dataset)> {
    let bad_data = spec.data.bad_data;
    let dataset = Dataset::open(&source.uri, &open_options(source, bad_data.policy))
        .await
        .map_err(|error| source_error(source, error))?;
    let (splits, left_out) = dataset
        .plan_leaving_out(spec.data.task_rows)
        .await
        .map_err(|error| source_error(source, error))?;
    let mut block = JobPlan::of_splits(index, splits);
    block.versions.push(dataset.table_version());
    if let Some(first) = left_out.first() {
        let files = block.files.len() + left_out.len();
        if left_out.len() as f64 > bad_data.max_fraction * files as f64 {
            return Err(AmError::FailedPrecondition(format!(
                "source {}: {} of its {files} files do not decode, past data.max_bad_fraction ({}); the first: {}: {}",
                source.uri,
                left_out.len(),
                bad_data.max_fraction,
                first.uri,
                first.cause
            )));
        }
    }
    for file in left_out {
        tracing::warn!(uri = %file.uri, cause = %file.cause, "file left out of the plan: it does not decode (data.on_bad_data)");
        block.left_out.push(LeftOutFile {
            source: index,
            uri: file.uri,
            cause: file.cause,
        });
    }
    Ok((block, dataset))
}

/// How the daemons read `source`'s batches: its columns and filter.
fn read_options(spec: &JobSpec, source: &SourceSpec) -> Result<ReadOptions> {
    let filter = source
        .filter
        .as_deref()
        .map(Expr::parse)
        .transpose()
        .map_err(|error| source_error(source, error))?;
    Ok(ReadOptions {
        columns: source.columns.clone(),
        filter,
        batch_rows: spec.data.batch_size.max(1) as usize,
    })
}

/// The schema of the batches `source` gives, before the transforms.
async fn output_schema(spec: &JobSpec, source: &SourceSpec) -> Result<SchemaRef> {
    let dataset = Dataset::open(
        &source.uri,
        &open_options(source, spec.data.bad_data.policy),
    )
    .await
    .map_err(|error| source_error(source, error))?;
    dataset
        .output_schema(&read_options(spec, source)?)
        .map_err(|error| source_error(source, error))
}

/// A formats error of `source`.
fn source_error(source: &SourceSpec, error: sluice_formats::FormatError) -> AmError {
    AmError::Source {
        uri: source.uri.clone(),
        source: error,
    }
}

/// How `found` differs from `expected` in its fields' names and types, in order, if it does.
fn schema_difference(expected: &Schema, found: &Schema) -> Option<String> {
    for (position, (want, got)) in expected.fields().iter().zip(found.fields()).enumerate() {
        if want.name() != got.name() {
            return Some(format!(
                "its column {position} is `{}`, where the job has `{}`",
                got.name(),
                want.name()
            ));
        }
        if want.data_type() != got.data_type() {
            return Some(format!(
                "its column `{}` is {}, where the job has {}",
                got.name(),
                got.data_type(),
                want.data_type()
            ));
        }
    }
    match found.fields().len().cmp(&expected.fields().len()) {
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Less => Some(format!(
            "it lacks the column `{}`",
            expected.field(found.fields().len()).name()
        )),
        std::cmp::Ordering::Greater => Some(format!(
            "it has the column `{}`, which the job does not",
            found.field(expected.fields().len()).name()
        )),
    }
}

/// Fields as `name: type, ...`.
fn describe_fields(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|field| format!("{}: {}", field.name(), field.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How the formats layer opens a source of the spec.
pub fn open_options(source: &SourceSpec, bad_data: BadDataPolicy) -> OpenOptions {
    OpenOptions {
        storage_options: source.storage_options.clone(),
        format: Some(format_kind(source.format)),
        version: source.version,
        timestamp: source.timestamp.clone(),
        // A filter that does not parse fails the plan where the read options are made.
        filter: source
            .filter
            .as_deref()
            .and_then(|filter| Expr::parse(filter).ok()),
        skip_bad_files: bad_data != BadDataPolicy::Fail,
        ..OpenOptions::default()
    }
}

/// The formats layer's name for a source format.
pub fn format_kind(format: SourceFormat) -> FormatKind {
    match format {
        SourceFormat::Parquet => FormatKind::Parquet,
        SourceFormat::Delta => FormatKind::Delta,
        SourceFormat::Iceberg => FormatKind::Iceberg,
        SourceFormat::Ipc => FormatKind::ArrowIpc,
        SourceFormat::Csv => FormatKind::Csv,
        SourceFormat::Jsonl => FormatKind::JsonLines,
        SourceFormat::Tfrecord => FormatKind::TfRecord,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(uri: &str, first_row: u64, row_count: u64) -> Split {
        Split {
            task_id: 0,
            uri: uri.to_owned(),
            file_size: 10,
            first_row,
            row_count,
            partition_values: vec![("day".to_owned(), Some(uri.to_owned()))],
            delta: None,
            bytes: None,
            identity: None,
        }
    }

    fn identity(e_tag: &str) -> ObjectIdentity {
        ObjectIdentity {
            e_tag: Some(e_tag.to_owned()),
            version: None,
            modified_ns: None,
        }
    }

    fn bytes(start: u64, end: u64) -> SplitBytes {
        SplitBytes {
            start,
            end,
            first_row: start,
            rows: end - start,
            crc32c: Some(7),
        }
    }

    #[test]
    fn a_plan_keeps_the_bytes_of_the_splits_that_carry_them() {
        let mut sut = JobPlan::default();
        sut.extend(0, vec![split("a.parquet", 0, 5)]);
        sut.extend(
            1,
            vec![
                Split {
                    bytes: Some(bytes(0, 3)),
                    ..split("b.csv", 0, 3)
                },
                Split {
                    bytes: Some(bytes(3, 5)),
                    ..split("b.csv", 3, 2)
                },
            ],
        );
        assert_eq!(sut.bytes_of(0), None);
        assert_eq!(sut.bytes_of(1), Some(bytes(0, 3)));
        assert_eq!(sut.bytes_of(2), Some(bytes(3, 5)));
        assert_eq!(sut.bytes_of(3), None);
    }

    #[test]
    fn a_plan_keeps_the_identity_of_each_file_that_carries_one() {
        let mut sut = JobPlan::default();
        let pinned = |uri, first_row, e_tag| Split {
            identity: Some(identity(e_tag)),
            ..split(uri, first_row, 5)
        };
        sut.extend(0, vec![pinned("a", 0, "\"1\""), pinned("a", 5, "\"1\"")]);
        sut.extend(1, vec![split("delta", 0, 5)]);
        sut.extend(2, vec![pinned("b", 0, "\"2\"")]);
        assert_eq!(sut.files.len(), 3);
        assert_eq!(sut.identity_of(0), Some(&identity("\"1\"")));
        assert_eq!(sut.identity_of(1), None, "a file without one is not pinned");
        assert_eq!(sut.identity_of(2), Some(&identity("\"2\"")));
        assert_eq!(sut.identity_of(3), None);
    }

    #[test]
    fn a_plan_keeps_each_file_once_and_its_splits_in_order() {
        let mut sut = JobPlan::default();
        sut.extend(
            0,
            vec![split("a", 0, 5), split("a", 5, 3), split("b", 0, 4)],
        );
        sut.extend(1, vec![split("a", 0, 2)]);
        let files: Vec<(u32, &str)> = sut
            .files
            .iter()
            .map(|file| (file.source, file.uri.as_str()))
            .collect();
        assert_eq!(files, vec![(0, "a"), (0, "b"), (1, "a")]);
        let splits: Vec<(u32, u64, u64)> = sut
            .splits
            .iter()
            .map(|split| (split.file, split.first_row, split.row_count))
            .collect();
        assert_eq!(splits, vec![(0, 0, 5), (0, 5, 3), (1, 0, 4), (2, 0, 2)]);
        assert_eq!(sut.split_rows(), vec![5, 3, 4, 2]);
        assert_eq!(sut.files[1].partition_values[0].1.as_deref(), Some("b"));
    }
}
