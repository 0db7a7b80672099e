//! Read options and the steps every format shares after decoding: partition columns, the filter, the
//! projection.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, new_null_array};
use arrow::compute::cast;
use arrow::datatypes::{Field, Schema, SchemaRef};

use crate::coverage::SplitBatch;
use crate::error::{FormatError, Result};
use crate::filter::Expr;

/// The default number of rows per decoded batch.
pub const DEFAULT_BATCH_ROWS: usize = 8192;

/// What to read from a split: the columns, the row filter and the batch size.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// The output columns in order; `None` for all columns of the dataset.
    pub columns: Option<Vec<String>>,
    /// Rows for which this is not true are dropped.
    pub filter: Option<Expr>,
    /// Rows per decoded batch (before filtering).
    pub batch_rows: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            columns: None,
            filter: None,
            batch_rows: DEFAULT_BATCH_ROWS,
        }
    }
}

/// A resolved read: output schema and the dataset columns the decoder must produce.
#[derive(Debug, Clone)]
pub(crate) struct ReadPlan {
    pub output_schema: SchemaRef,
    /// Dataset columns needed for output and filter, in dataset order.
    pub needed: Vec<String>,
    pub filter: Option<Expr>,
    pub batch_rows: usize,
    /// Output columns missing from a decoded batch become nulls instead of an error (schema evolution).
    pub fill_missing: bool,
}

impl ReadPlan {
    /// A plan that decodes every column of `schema` as it is: no filter, no projection.
    pub(crate) fn raw(schema: SchemaRef, batch_rows: usize) -> Self {
        let needed = schema
            .fields()
            .iter()
            .map(|field| field.name().clone())
            .collect();
        Self {
            output_schema: schema,
            needed,
            filter: None,
            batch_rows,
            fill_missing: true,
        }
    }

    pub(crate) fn new(dataset_schema: &Schema, options: &ReadOptions) -> Result<Self> {
        let available = || {
            dataset_schema
                .fields()
                .iter()
                .map(|field| field.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let output_fields: Vec<Field> = match &options.columns {
            None => dataset_schema
                .fields()
                .iter()
                .map(|field| field.as_ref().clone())
                .collect(),
            Some(columns) => columns
                .iter()
                .map(|column| {
                    dataset_schema
                        .field_with_name(column)
                        .cloned()
                        .map_err(|_| FormatError::ColumnNotFound {
                            column: column.clone(),
                            available: available(),
                        })
                })
                .collect::<Result<_>>()?,
        };
        let mut wanted: Vec<String> = output_fields
            .iter()
            .map(|field| field.name().clone())
            .collect();
        if let Some(filter) = &options.filter {
            for column in filter.columns() {
                if dataset_schema.field_with_name(&column).is_err() {
                    return Err(FormatError::ColumnNotFound {
                        column,
                        available: available(),
                    });
                }
                if !wanted.contains(&column) {
                    wanted.push(column);
                }
            }
        }
        let needed = dataset_schema
            .fields()
            .iter()
            .map(|field| field.name().clone())
            .filter(|name| wanted.contains(name))
            .collect();
        if options.batch_rows == 0 {
            return Err(FormatError::InvalidArgument(
                "batch rows must be at least 1".to_string(),
            ));
        }
        Ok(Self {
            output_schema: Arc::new(Schema::new(output_fields)),
            needed,
            filter: options.filter.clone(),
            batch_rows: options.batch_rows,
            fill_missing: false,
        })
    }

    /// Applies partition columns, the filter and the projection to a decoded batch, keeping its coverage:
    /// rows the filter removes stay covered by the batch.
    ///
    /// `decoded` holds file columns; `partitions` gives each partition field and its value for this split.
    pub(crate) fn finish(
        &self,
        decoded: SplitBatch,
        partitions: &[(Field, Option<String>)],
        context: &str,
    ) -> Result<SplitBatch> {
        let rows = decoded.batch.num_rows();
        let mut fields: Vec<Field> = decoded
            .batch
            .schema()
            .fields()
            .iter()
            .map(|field| field.as_ref().clone())
            .collect();
        let mut columns: Vec<ArrayRef> = decoded.batch.columns().to_vec();
        for (field, value) in partitions {
            if !self.needed.contains(field.name()) {
                continue;
            }
            columns.push(partition_array(field, value.as_deref(), rows, context)?);
            fields.push(field.clone());
        }
        let batch =
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|error| {
                FormatError::arrow(format!("{context}: assembling partition columns"), error)
            })?;
        let mut covered = decoded.with_batch(batch)?;
        if let Some(filter) = &self.filter {
            let mask = filter.evaluate(&covered.batch)?;
            covered = covered.filter(&mask)?;
        }
        let output = self.project(&covered.batch, context)?;
        covered.with_batch(output)
    }

    /// The output columns of a batch that holds every needed column, cast to the dataset's types.
    fn project(&self, batch: &RecordBatch, context: &str) -> Result<RecordBatch> {
        let mut output = Vec::with_capacity(self.output_schema.fields().len());
        for field in self.output_schema.fields() {
            let column = match batch.column_by_name(field.name()) {
                Some(column) => column,
                None if self.fill_missing => {
                    output.push(new_null_array(field.data_type(), batch.num_rows()));
                    continue;
                }
                None => {
                    return Err(FormatError::ColumnNotFound {
                        column: field.name().clone(),
                        available: format!(
                            "{context} has {}",
                            batch
                                .schema()
                                .fields()
                                .iter()
                                .map(|field| field.name().as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            };
            let column = if column.data_type() == field.data_type() {
                Arc::clone(column)
            } else {
                cast(column, field.data_type()).map_err(|error| {
                    FormatError::arrow(
                        format!(
                            "{context}: column {:?} to the dataset type {}",
                            field.name(),
                            field.data_type()
                        ),
                        error,
                    )
                })?
            };
            output.push(column);
        }
        RecordBatch::try_new_with_options(
            Arc::clone(&self.output_schema),
            output,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )
        .map_err(|error| FormatError::arrow(format!("{context}: projecting"), error))
    }
}

/// Builds a constant column holding a partition value, typed as the partition field.
pub(crate) fn partition_array(
    field: &Field,
    value: Option<&str>,
    rows: usize,
    context: &str,
) -> Result<ArrayRef> {
    match value {
        None => Ok(new_null_array(field.data_type(), rows)),
        Some(text) => {
            let strings: ArrayRef = Arc::new(StringArray::from(vec![text; rows]));
            let options = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            arrow::compute::cast_with_options(&strings, field.data_type(), &options).map_err(
                |error| {
                    FormatError::arrow(
                        format!(
                            "{context}: partition value {text:?} of {:?} as {}",
                            field.name(),
                            field.data_type()
                        ),
                        error,
                    )
                },
            )
        }
    }
}

/// File-level statistics from partition values: one container whose partition columns are constant.
#[derive(Debug)]
pub(crate) struct PartitionStatistics<'a> {
    pub partitions: &'a [(Field, Option<String>)],
}

impl PartitionStatistics<'_> {
    fn constant(&self, column: &str) -> Option<ArrayRef> {
        let (field, value) = self
            .partitions
            .iter()
            .find(|(field, _)| field.name() == column)?;
        partition_array(field, value.as_deref(), 1, "partition statistics").ok()
    }
}

impl crate::filter::PruningStatistics for PartitionStatistics<'_> {
    fn num_containers(&self) -> usize {
        1
    }
    fn min_values(&self, column: &str) -> Option<ArrayRef> {
        self.constant(column)
    }
    fn max_values(&self, column: &str) -> Option<ArrayRef> {
        self.constant(column)
    }
    fn null_counts(&self, column: &str) -> Option<arrow::array::UInt64Array> {
        let (_, value) = self
            .partitions
            .iter()
            .find(|(field, _)| field.name() == column)?;
        // With one container of unknown size, "all rows are null" is all that can be said: 1 means some.
        Some(arrow::array::UInt64Array::from(vec![u64::from(
            value.is_none(),
        )]))
    }
    fn row_counts(&self) -> Option<arrow::array::UInt64Array> {
        None
    }
}
