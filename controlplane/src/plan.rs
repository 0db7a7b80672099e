//! A job's data, planned once into splits.
//!
//! The plan is made when a job first starts and is stored beside the journal, so an AM that takes
//! the job over reads the same splits even if the sources changed meanwhile (new files, new Delta
//! commits): task ids and row positions keep their meaning across restarts.

use crate::error::{AmError, Result};
use crate::spec::{JobSpec, SourceFormat, SourceSpec};
use serde::{Deserialize, Serialize};
use sluice_formats::{Dataset, FormatKind, OpenOptions, Split};

/// One split of a job, with the index of the source it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedSplit {
    /// The index of the source in the job spec's `data.sources`.
    pub source: u32,
    /// The split, as the formats layer planned it.
    pub split: Split,
}

/// Every split of a job, sources in spec order, each source's splits in plan order. A split's
/// index in `splits` is the split index carried by the job's tasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobPlan {
    /// The splits.
    pub splits: Vec<PlannedSplit>,
}

impl JobPlan {
    /// Opens every source of the spec and plans it into splits of at most `data.task_rows` rows.
    pub async fn build(spec: &JobSpec) -> Result<JobPlan> {
        let mut splits = Vec::new();
        for (index, source) in spec.data.sources.iter().enumerate() {
            let source_error = |error| AmError::Source {
                uri: source.uri.clone(),
                source: error,
            };
            let dataset = Dataset::open(&source.uri, &open_options(source))
                .await
                .map_err(source_error)?;
            let planned = dataset
                .plan(spec.data.task_rows)
                .await
                .map_err(source_error)?;
            splits.extend(planned.into_iter().map(|split| PlannedSplit {
                source: index as u32,
                split,
            }));
        }
        Ok(JobPlan { splits })
    }

    /// The row count of every split, in split order.
    pub fn split_rows(&self) -> Vec<u64> {
        self.splits
            .iter()
            .map(|planned| planned.split.row_count)
            .collect()
    }
}

/// How the formats layer opens a source of the spec.
pub fn open_options(source: &SourceSpec) -> OpenOptions {
    OpenOptions {
        storage_options: source.storage_options.clone(),
        format: Some(format_kind(source.format)),
        ..OpenOptions::default()
    }
}

/// The formats layer's name for a source format.
pub fn format_kind(format: SourceFormat) -> FormatKind {
    match format {
        SourceFormat::Parquet => FormatKind::Parquet,
        SourceFormat::Delta => FormatKind::Delta,
        SourceFormat::Ipc => FormatKind::ArrowIpc,
        SourceFormat::Csv => FormatKind::Csv,
        SourceFormat::Jsonl => FormatKind::JsonLines,
        SourceFormat::Tfrecord => FormatKind::TfRecord,
    }
}
