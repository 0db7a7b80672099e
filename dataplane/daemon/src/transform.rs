//! The job's preprocessing steps (`data.transforms`), applied with Arrow compute kernels to every
//! batch after projection and filter: cast, fill-null, normalise and hash-bucket.
//!
//! Every step keeps the row count, so a batch keeps its coverage. A step is built once from the
//! job's data and checked against the reader's schema at start: running the steps on an empty batch
//! of that schema gives the schema the rings announce, and fails early, naming the step, for a
//! column that does not exist or a type the step cannot take.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, Scalar, StringArray};
use arrow::compute::kernels::{numeric, zip::zip};
use arrow::compute::{CastOptions, cast, cast_with_options, is_not_null};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use arrow::error::ArrowError;
use sluice_proto::v1;
use sluice_proto::v1::transform::Kind;

/// The seed of the hash-bucket hash; fixed, so that a value's bucket never changes.
const HASH_SEED: u64 = 0;

/// One preprocessing step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Cast {
        column: String,
        to: DataType,
    },
    FillNull {
        column: String,
        value: String,
    },
    Normalize {
        column: String,
        mean: f64,
        std: f64,
    },
    HashBucket {
        column: String,
        buckets: u64,
        output: String,
    },
}

/// The steps of a job, in order.
/// Why the job's transforms cannot be set up, or a step cannot run on a batch.
#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    /// A transform the AM sent has no step.
    #[error("data.transforms[{index}] has no step; the AM sent an empty transform")]
    NoStep {
        /// The transform's index in the spec.
        index: usize,
    },
    /// A cast names a type this build does not know.
    #[error(
        "data.transforms[{index}].cast.to: unknown type {name:?}; use one of {}",
        sluice_formats::types::DATA_TYPE_NAMES.join(", ")
    )]
    UnknownType {
        /// The transform's index in the spec.
        index: usize,
        /// The type's name.
        name: String,
    },
    /// A normalization whose mean or deviation cannot scale a value.
    #[error(
        "data.transforms[{index}].normalize: mean {mean} and std {std} must be finite and std positive"
    )]
    BadNormalize {
        /// The transform's index in the spec.
        index: usize,
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// A hash into no bucket.
    #[error("data.transforms[{index}].hash_bucket.buckets is 0; set it to 1 or more")]
    NoBuckets {
        /// The transform's index in the spec.
        index: usize,
    },
    /// A step failed on a batch.
    #[error("data.transforms[{index}]: {failure}")]
    Step {
        /// The transform's index in the spec.
        index: usize,
        /// Why.
        failure: StepError,
    },
}

/// Why one step cannot run on a batch.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step's column is not in the batches.
    #[error(
        "{step}: no column {column:?} in the batches, which have {columns}; fix the column name or the source's columns"
    )]
    NoColumn {
        /// The step.
        step: &'static str,
        /// The column it names.
        column: String,
        /// The batches' columns, comma-separated.
        columns: String,
    },
    /// A cast of a column's values failed.
    #[error("cast: column {column:?} from {from} to {to}: {error}")]
    Cast {
        /// The column.
        column: String,
        /// Its type.
        from: DataType,
        /// The type asked for.
        to: DataType,
        /// Why.
        error: ArrowError,
    },
    /// A fill value is not a value of the column's type.
    #[error(
        "fill_null: value {value:?} as {data_type} (the type of column {column:?}): {error}; write a value of the column's type"
    )]
    FillValue {
        /// The value.
        value: String,
        /// The column's type.
        data_type: DataType,
        /// The column.
        column: String,
        /// Why.
        error: ArrowError,
    },
    /// A normalized column is not numeric.
    #[error("normalize: column {column:?} is {data_type}, not a number; cast it first")]
    NotNumeric {
        /// The column.
        column: String,
        /// Its type.
        data_type: DataType,
    },
    /// A hashed column is of a type the hash does not take.
    #[error(
        "hash_bucket: column {column:?}: is {data_type}; hash a string, binary or integer column (cast it first)"
    )]
    NotHashable {
        /// The column.
        column: String,
        /// Its type.
        data_type: DataType,
    },
    /// An Arrow kernel failed on a column.
    #[error("{step}: column {column:?}: {error}")]
    Kernel {
        /// The step.
        step: &'static str,
        /// The column.
        column: String,
        /// Why.
        error: ArrowError,
    },
    /// The hashed buckets could not be added as their output column.
    #[error("hash_bucket: output {output:?}: {error}")]
    Output {
        /// The output column.
        output: String,
        /// Why.
        error: ArrowError,
    },
    /// The batch could not be rebuilt with a step's column.
    #[error("column {column:?}: {error}")]
    Rebuild {
        /// The column.
        column: String,
        /// Why.
        error: ArrowError,
    },
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Transforms {
    steps: Vec<Step>,
}

impl Transforms {
    /// The steps of the job's data, checked for what the wire cannot check.
    pub(crate) fn from_job(transforms: &[v1::Transform]) -> Result<Self, TransformError> {
        let steps = transforms
            .iter()
            .enumerate()
            .map(|(index, transform)| match &transform.kind {
                None => Err(TransformError::NoStep { index }),
                Some(Kind::Cast(step)) => {
                    let to =
                        sluice_formats::types::data_type_by_name(&step.to).ok_or_else(|| {
                            TransformError::UnknownType {
                                index,
                                name: step.to.clone(),
                            }
                        })?;
                    Ok(Step::Cast {
                        column: step.column.clone(),
                        to,
                    })
                }
                Some(Kind::FillNull(step)) => Ok(Step::FillNull {
                    column: step.column.clone(),
                    value: step.value.clone(),
                }),
                Some(Kind::Normalize(step)) => {
                    if !(step.std.is_finite() && step.std > 0.0 && step.mean.is_finite()) {
                        return Err(TransformError::BadNormalize {
                            index,
                            mean: step.mean,
                            std: step.std,
                        });
                    }
                    Ok(Step::Normalize {
                        column: step.column.clone(),
                        mean: step.mean,
                        std: step.std,
                    })
                }
                Some(Kind::HashBucket(step)) => {
                    if step.buckets == 0 {
                        return Err(TransformError::NoBuckets { index });
                    }
                    Ok(Step::HashBucket {
                        column: step.column.clone(),
                        buckets: step.buckets,
                        output: step.output.clone(),
                    })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { steps })
    }

    /// Whether there is nothing to do.
    pub(crate) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The schema of batches of `input` once the steps ran, or why the steps cannot run on it.
    pub(crate) fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, TransformError> {
        Ok(self
            .apply(RecordBatch::new_empty(Arc::clone(input)))?
            .schema())
    }

    /// Runs every step on `batch`, in order.
    pub(crate) fn apply(&self, mut batch: RecordBatch) -> Result<RecordBatch, TransformError> {
        for (index, step) in self.steps.iter().enumerate() {
            batch = step
                .apply(&batch)
                .map_err(|failure| TransformError::Step { index, failure })?;
        }
        Ok(batch)
    }
}

impl Step {
    fn apply(&self, batch: &RecordBatch) -> Result<RecordBatch, StepError> {
        match self {
            Step::Cast { column, to } => {
                let (index, field, values) = column_of(batch, column, "cast")?;
                let options = CastOptions {
                    safe: false,
                    ..CastOptions::default()
                };
                let cast_values =
                    cast_with_options(values, to, &options).map_err(|error| StepError::Cast {
                        column: column.clone(),
                        from: field.data_type().clone(),
                        to: to.clone(),
                        error,
                    })?;
                replace(
                    batch,
                    index,
                    field.clone().with_data_type(to.clone()),
                    cast_values,
                )
            }
            Step::FillNull { column, value } => {
                let (index, field, values) = column_of(batch, column, "fill_null")?;
                let options = CastOptions {
                    safe: false,
                    ..CastOptions::default()
                };
                let text: ArrayRef = Arc::new(StringArray::from(vec![value.as_str()]));
                let fill =
                    cast_with_options(&text, field.data_type(), &options).map_err(|error| {
                        StepError::FillValue {
                            value: value.clone(),
                            data_type: field.data_type().clone(),
                            column: column.clone(),
                            error,
                        }
                    })?;
                let field = field.clone().with_nullable(false);
                if values.null_count() == 0 {
                    return replace(batch, index, field, Arc::clone(values));
                }
                let kernel = kernel("fill_null", column);
                let present = is_not_null(values).map_err(kernel)?;
                let filled = zip(&present, values, &Scalar::new(fill)).map_err(kernel)?;
                replace(batch, index, field, filled)
            }
            Step::Normalize { column, mean, std } => {
                let (index, field, values) = column_of(batch, column, "normalize")?;
                let output_type = match field.data_type() {
                    DataType::Float16 | DataType::Float32 | DataType::Float64 => {
                        field.data_type().clone()
                    }
                    numeric_type if numeric_type.is_numeric() => DataType::Float64,
                    other => {
                        return Err(StepError::NotNumeric {
                            column: column.clone(),
                            data_type: other.clone(),
                        });
                    }
                };
                let kernel = kernel("normalize", column);
                let as_float = cast(values, &DataType::Float64).map_err(kernel)?;
                let mean_scalar = Scalar::new(arrow::array::Float64Array::from(vec![*mean]));
                let std_scalar = Scalar::new(arrow::array::Float64Array::from(vec![*std]));
                let centred = numeric::sub(&as_float, &mean_scalar).map_err(kernel)?;
                let scaled = numeric::div(&centred, &std_scalar).map_err(kernel)?;
                let output = cast(&scaled, &output_type).map_err(kernel)?;
                replace(
                    batch,
                    index,
                    field.clone().with_data_type(output_type),
                    output,
                )
            }
            Step::HashBucket {
                column,
                buckets,
                output,
            } => {
                let (_, field, values) = column_of(batch, column, "hash_bucket")?;
                let bucketed = hash_buckets(values, column, *buckets)?;
                let output_field = Field::new(output, DataType::Int64, field.is_nullable());
                match batch.schema().index_of(output) {
                    Ok(index) => replace(batch, index, output_field, Arc::new(bucketed)),
                    Err(_) => {
                        let mut fields: Vec<Field> = batch
                            .schema()
                            .fields()
                            .iter()
                            .map(|field| field.as_ref().clone())
                            .collect();
                        fields.push(output_field);
                        let mut columns = batch.columns().to_vec();
                        columns.push(Arc::new(bucketed));
                        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(
                            |error| StepError::Output {
                                output: output.clone(),
                                error,
                            },
                        )
                    }
                }
            }
        }
    }
}

/// Names a failure of an Arrow kernel in `step` on `column`.
fn kernel<'a>(step: &'static str, column: &'a str) -> impl Fn(ArrowError) -> StepError + Copy + 'a {
    move |error| StepError::Kernel {
        step,
        column: column.to_owned(),
        error,
    }
}

/// The position, field and values of `column`, or an error naming the columns there are.
fn column_of<'a>(
    batch: &'a RecordBatch,
    column: &str,
    step: &'static str,
) -> Result<(usize, Field, &'a ArrayRef), StepError> {
    let schema = batch.schema();
    let index = schema.index_of(column).map_err(|_| {
        let names: Vec<&str> = schema
            .fields()
            .iter()
            .map(|field| field.name().as_str())
            .collect();
        StepError::NoColumn {
            step,
            column: column.to_owned(),
            columns: names.join(", "),
        }
    })?;
    Ok((index, schema.field(index).clone(), batch.column(index)))
}

/// `batch` with column `index` replaced by `values` under `field`.
fn replace(
    batch: &RecordBatch,
    index: usize,
    field: Field,
    values: ArrayRef,
) -> Result<RecordBatch, StepError> {
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|field| field.as_ref().clone())
        .collect();
    let name = field.name().clone();
    fields[index] = field;
    let mut columns = batch.columns().to_vec();
    columns[index] = values;
    RecordBatch::try_new(
        Arc::new(Schema::new_with_metadata(
            fields,
            batch.schema().metadata().clone(),
        )),
        columns,
    )
    .map_err(|error| StepError::Rebuild {
        column: name,
        error,
    })
}

/// The bucket `xxhash64(value) mod buckets` of every value: the UTF-8 bytes of a string, the bytes
/// of a binary value, the little-endian 8 bytes of an integer widened to 64 bits (so a value has the
/// same bucket whatever the width of its column). Nulls have a null bucket.
fn hash_buckets(values: &ArrayRef, column: &str, buckets: u64) -> Result<Int64Array, StepError> {
    let bucket_of = |bytes: &[u8]| {
        let bucket = twox_hash::XxHash64::oneshot(HASH_SEED, bytes) % buckets;
        i64::try_from(bucket).unwrap_or(i64::MAX)
    };
    // Each family is widened to its widest type, which hashes the same bytes for every width.
    let widest = match values.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::LargeUtf8,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => DataType::LargeBinary,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => DataType::Int64,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            DataType::UInt64
        }
        other => {
            return Err(StepError::NotHashable {
                column: column.to_owned(),
                data_type: other.clone(),
            });
        }
    };
    let widened = cast(values, &widest).map_err(kernel("hash_bucket", column))?;
    Ok(match widest {
        DataType::LargeUtf8 => widened
            .as_string::<i64>()
            .iter()
            .map(|value| value.map(|text| bucket_of(text.as_bytes())))
            .collect(),
        DataType::LargeBinary => widened
            .as_binary::<i64>()
            .iter()
            .map(|value| value.map(bucket_of))
            .collect(),
        DataType::Int64 => widened
            .as_primitive::<Int64Type>()
            .iter()
            .map(|value| value.map(|value| bucket_of(&value.to_le_bytes())))
            .collect(),
        _ => widened
            .as_primitive::<UInt64Type>()
            .iter()
            .map(|value| value.map(|value| bucket_of(&value.to_le_bytes())))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, Float64Array, StringArray};
    use arrow::datatypes::Float64Type;

    fn steps(transforms: Vec<Kind>) -> Transforms {
        let wire: Vec<v1::Transform> = transforms
            .into_iter()
            .map(|kind| v1::Transform { kind: Some(kind) })
            .collect();
        Transforms::from_job(&wire).expect("valid steps")
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).expect("batch")
    }

    #[test]
    fn cast_fill_and_normalise_chain_in_order() {
        let sut = steps(vec![
            Kind::Cast(v1::CastTransform {
                column: "x".to_owned(),
                to: "float32".to_owned(),
            }),
            Kind::FillNull(v1::FillNullTransform {
                column: "x".to_owned(),
                value: "0.5".to_owned(),
            }),
            Kind::Normalize(v1::NormalizeTransform {
                column: "x".to_owned(),
                mean: 0.5,
                std: 2.0,
            }),
        ]);
        let input = batch(vec![(
            "x",
            Arc::new(Int64Array::from(vec![Some(1), None, Some(5)])) as ArrayRef,
        )]);
        let output = sut.apply(input.clone()).expect("applies");
        let x = output
            .column(0)
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("float32 after the cast");
        assert_eq!(x.values().to_vec(), vec![0.25, 0.0, 2.25]);
        assert_eq!(x.null_count(), 0);
        assert_eq!(
            sut.output_schema(&input.schema()).expect("schema"),
            output.schema(),
            "the announced schema is the batches' schema"
        );
        assert!(!output.schema().field(0).is_nullable());
    }

    #[test]
    fn nan_fills_float_nulls_and_a_batch_without_nulls_keeps_its_values() {
        let sut = steps(vec![Kind::FillNull(v1::FillNullTransform {
            column: "f".to_owned(),
            value: "NaN".to_owned(),
        })]);
        let with_nulls = sut
            .apply(batch(vec![(
                "f",
                Arc::new(Float64Array::from(vec![Some(1.5), None, Some(-2.0)])) as ArrayRef,
            )]))
            .expect("applies");
        let filled = with_nulls.column(0).as_primitive::<Float64Type>();
        assert_eq!(filled.null_count(), 0);
        assert_eq!(filled.value(0), 1.5);
        assert!(filled.value(1).is_nan(), "{:?}", filled.value(1));
        assert_eq!(filled.value(2), -2.0);
        let without_nulls = sut
            .apply(batch(vec![(
                "f",
                Arc::new(Float64Array::from(vec![0.25, 4.0])) as ArrayRef,
            )]))
            .expect("applies");
        let kept = without_nulls.column(0).as_primitive::<Float64Type>();
        assert_eq!(kept.values().to_vec(), vec![0.25, 4.0]);
        assert_eq!(
            without_nulls.schema(),
            with_nulls.schema(),
            "every batch of a ring has one schema, nulls or not"
        );
        assert!(!with_nulls.schema().field(0).is_nullable());
    }

    #[test]
    fn normalising_integers_gives_float64() {
        let sut = steps(vec![Kind::Normalize(v1::NormalizeTransform {
            column: "n".to_owned(),
            mean: 1.0,
            std: 4.0,
        })]);
        let output = sut
            .apply(batch(vec![(
                "n",
                Arc::new(Int64Array::from(vec![Some(9), None])) as ArrayRef,
            )]))
            .expect("applies");
        let n = output.column(0).as_primitive::<Float64Type>();
        assert_eq!(n.value(0), 2.0);
        assert!(n.is_null(1), "a null stays null");
    }

    #[test]
    fn hash_buckets_are_stable_and_agree_across_integer_widths() {
        let sut = steps(vec![
            Kind::HashBucket(v1::HashBucketTransform {
                column: "s".to_owned(),
                buckets: 1000,
                output: "s_bucket".to_owned(),
            }),
            Kind::HashBucket(v1::HashBucketTransform {
                column: "n".to_owned(),
                buckets: 10,
                output: "n".to_owned(),
            }),
        ]);
        let input = batch(vec![
            (
                "s",
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("a"),
                    Some("b"),
                ])) as ArrayRef,
            ),
            (
                "n",
                Arc::new(arrow::array::Int32Array::from(vec![7, 7, -3, 0])) as ArrayRef,
            ),
        ]);
        let output = sut.apply(input).expect("applies");
        assert_eq!(output.schema().field(2).name(), "s_bucket");
        let buckets = output.column(2).as_primitive::<Int64Type>();
        assert_eq!(
            buckets.value(0),
            buckets.value(2),
            "equal values, equal buckets"
        );
        assert!(buckets.is_null(1));
        assert!(
            buckets
                .values()
                .iter()
                .all(|bucket| (0..1000).contains(bucket))
        );
        // Pinned: xxhash64 with seed 0 of "a" is 0xd24ec4f1a98c6e5b; a change of hash fails here.
        assert_eq!(buckets.value(0), (0xd24e_c4f1_a98c_6e5b_u64 % 1000) as i64);
        let wide = steps(vec![Kind::HashBucket(v1::HashBucketTransform {
            column: "n".to_owned(),
            buckets: 10,
            output: "n".to_owned(),
        })])
        .apply(batch(vec![(
            "n",
            Arc::new(Int64Array::from(vec![7, 7, -3, 0])) as ArrayRef,
        )]))
        .expect("applies");
        assert_eq!(output.column(1).as_ref(), wide.column(0).as_ref());
        assert_eq!(output.schema().field(1).data_type(), &DataType::Int64);
    }

    #[test]
    fn bad_steps_fail_naming_the_step_and_the_fix() {
        let input = batch(vec![
            ("x", Arc::new(Float64Array::from(vec![1.0])) as ArrayRef),
            ("s", Arc::new(StringArray::from(vec!["300"])) as ArrayRef),
        ]);
        let error = steps(vec![Kind::Cast(v1::CastTransform {
            column: "y".to_owned(),
            to: "int64".to_owned(),
        })])
        .output_schema(&input.schema())
        .expect_err("no column y")
        .to_string();
        assert!(
            error.contains("data.transforms[0]")
                && error.contains("no column \"y\"")
                && error.contains("x, s"),
            "{error}"
        );
        let error = steps(vec![Kind::Cast(v1::CastTransform {
            column: "s".to_owned(),
            to: "int8".to_owned(),
        })])
        .apply(input.clone())
        .expect_err("300 does not fit int8")
        .to_string();
        assert!(error.contains("cast") && error.contains("\"s\""), "{error}");
        let error = steps(vec![Kind::Normalize(v1::NormalizeTransform {
            column: "s".to_owned(),
            mean: 0.0,
            std: 1.0,
        })])
        .output_schema(&input.schema())
        .expect_err("a string is not a number")
        .to_string();
        assert!(error.contains("cast it first"), "{error}");
        let error = steps(vec![Kind::FillNull(v1::FillNullTransform {
            column: "x".to_owned(),
            value: "many".to_owned(),
        })])
        .output_schema(&input.schema())
        .expect_err("not a float")
        .to_string();
        assert!(error.contains("value \"many\""), "{error}");
        let error = steps(vec![Kind::HashBucket(v1::HashBucketTransform {
            column: "x".to_owned(),
            buckets: 3,
            output: "b".to_owned(),
        })])
        .output_schema(&input.schema())
        .expect_err("floats are not hashed")
        .to_string();
        assert!(error.contains("cast it first"), "{error}");
        let unknown = Transforms::from_job(&[v1::Transform {
            kind: Some(Kind::Cast(v1::CastTransform {
                column: "x".to_owned(),
                to: "decimal".to_owned(),
            })),
        }])
        .expect_err("unknown type")
        .to_string();
        assert!(unknown.contains("float32"), "{unknown}");
    }
}
