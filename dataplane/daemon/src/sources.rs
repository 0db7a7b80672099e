//! The job's sources, opened through the formats layer with their columns, filter and options.

use std::sync::Arc;

use sluice_formats::{BlockCache, Dataset, Expr, OpenOptions, ReadOptions};
use sluice_proto::v1;

use crate::error::{DaemonError, Result};

/// One source of the job, opened.
#[derive(Debug)]
pub(crate) struct Source {
    /// The dataset.
    pub(crate) dataset: Dataset,
    /// How its tasks are read.
    pub(crate) options: ReadOptions,
    /// The schema of the batches the reader gives, before the transforms.
    pub(crate) schema: arrow::datatypes::SchemaRef,
}

/// Opens every source of the job.
pub(crate) async fn open_sources(
    data: &v1::JobData,
    cache: Option<&Arc<BlockCache>>,
) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    for source in &data.sources {
        sources.push(open_source(source, data, cache).await?);
    }
    Ok(sources)
}

/// Opens one source of the job whose data is `data`.
pub(crate) async fn open_source(
    source: &v1::SourceData,
    data: &v1::JobData,
    cache: Option<&Arc<BlockCache>>,
) -> Result<Source> {
    let source_error = |error| DaemonError::Source {
        uri: source.uri.clone(),
        source: error,
    };
    let format = sluice_formats::FormatKind::parse(&source.format).map_err(source_error)?;
    let open = OpenOptions {
        storage_options: source
            .storage_options
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
        format: Some(format),
        version: source.version,
        cache: cache.cloned(),
        // The AM left such files out of the plan: the schema comes from one that decodes.
        skip_bad_files: data.on_bad_data() != v1::BadDataPolicy::Fail,
        ..OpenOptions::default()
    };
    let dataset = Dataset::open(&source.uri, &open)
        .await
        .map_err(source_error)?;
    let filter = source
        .filter
        .as_deref()
        .map(Expr::parse)
        .transpose()
        .map_err(source_error)?;
    let options = ReadOptions {
        columns: (!source.columns.is_empty()).then(|| source.columns.clone()),
        filter,
        batch_rows: data.batch_size.max(1) as usize,
    };
    let schema = dataset.output_schema(&options).map_err(source_error)?;
    Ok(Source {
        dataset,
        options,
        schema,
    })
}
