//! Evaluation of a filter on a record batch with Arrow's compute kernels, in SQL's three-valued logic.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Datum, Float64Array, Int64Array, RecordBatch, Scalar,
    StringArray,
};
use arrow::compute::kernels::cmp;
use arrow::compute::{
    CastOptions, and_kleene, cast_with_options, is_not_null, is_null, not, or_kleene,
};
use arrow::datatypes::DataType;

use super::ast::{CompareOp, Expr, Literal};
use crate::error::{FormatError, Result};

impl Literal {
    /// The literal as a one-element array of its own type.
    fn to_array(&self) -> ArrayRef {
        match self {
            Self::Int(value) => Arc::new(Int64Array::from(vec![*value])),
            Self::Float(value) => Arc::new(Float64Array::from(vec![*value])),
            Self::Str(value) => Arc::new(StringArray::from(vec![value.as_str()])),
            Self::Bool(value) => Arc::new(BooleanArray::from(vec![*value])),
        }
    }
}

impl Expr {
    /// Evaluates the expression on a batch with SQL three-valued logic.
    ///
    /// # Errors
    ///
    /// Returns an error when a column is missing or a literal cannot be compared with a column's type.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        match self {
            Self::And(left, right) => and_kleene(&left.evaluate(batch)?, &right.evaluate(batch)?)
                .map_err(|error| FormatError::arrow(format!("filter {self}"), error)),
            Self::Or(left, right) => or_kleene(&left.evaluate(batch)?, &right.evaluate(batch)?)
                .map_err(|error| FormatError::arrow(format!("filter {self}"), error)),
            Self::Not(inner) => not(&inner.evaluate(batch)?)
                .map_err(|error| FormatError::arrow(format!("filter {self}"), error)),
            Self::Compare { column, op, value } => {
                let values = column_of(batch, column)?;
                compare(column, &values, *op, value)
            }
            Self::InList {
                column,
                values,
                negated,
            } => {
                let array = column_of(batch, column)?;
                let mut result = BooleanArray::from(vec![false; array.len()]);
                for value in values {
                    let matches = compare(column, &array, CompareOp::Eq, value)?;
                    result = or_kleene(&result, &matches)
                        .map_err(|error| FormatError::arrow(format!("filter {self}"), error))?;
                }
                if *negated {
                    result = not(&result)
                        .map_err(|error| FormatError::arrow(format!("filter {self}"), error))?;
                }
                Ok(result)
            }
            Self::IsNull { column, negated } => {
                let array = column_of(batch, column)?;
                let result = if *negated {
                    is_not_null(&array)
                } else {
                    is_null(&array)
                };
                result.map_err(|error| FormatError::arrow(format!("filter {self}"), error))
            }
        }
    }
}

fn column_of(batch: &RecordBatch, column: &str) -> Result<ArrayRef> {
    batch
        .column_by_name(column)
        .cloned()
        .ok_or_else(|| FormatError::ColumnNotFound {
            column: column.to_string(),
            available: batch
                .schema()
                .fields()
                .iter()
                .map(|field| field.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn strict_cast() -> CastOptions<'static> {
    CastOptions {
        safe: false,
        ..CastOptions::default()
    }
}

/// Brings a column and a literal to one comparable type: (column array, literal scalar array).
pub(super) fn align(
    column: &str,
    values: &ArrayRef,
    literal: &Literal,
) -> Result<(ArrayRef, ArrayRef)> {
    let mut values = Arc::clone(values);
    if let DataType::Dictionary(_, value_type) = values.data_type() {
        let value_type = value_type.as_ref().clone();
        values = cast_with_options(&values, &value_type, &strict_cast()).map_err(|error| {
            FormatError::arrow(
                format!("filter: decoding dictionary column {column:?}"),
                error,
            )
        })?;
    }
    if matches!(literal, Literal::Float(_)) && values.data_type().is_integer() {
        values =
            cast_with_options(&values, &DataType::Float64, &strict_cast()).map_err(|error| {
                FormatError::arrow(format!("filter: column {column:?} as float64"), error)
            })?;
    }
    let target = values.data_type().clone();
    let literal_array = cast_with_options(&literal.to_array(), &target, &strict_cast()).map_err(|error| {
        FormatError::FilterApply(format!("column {column:?} has type {target}; the literal {literal} cannot be cast to it ({error})"))
    })?;
    Ok((values, literal_array))
}

fn compare(
    column: &str,
    values: &ArrayRef,
    op: CompareOp,
    literal: &Literal,
) -> Result<BooleanArray> {
    let (values, literal_array) = align(column, values, literal)?;
    let scalar = Scalar::new(literal_array);
    apply_op(&values, op, &scalar).map_err(|error| {
        FormatError::FilterApply(format!(
            "cannot compare column {column:?} of type {} with {literal} ({error})",
            values.data_type()
        ))
    })
}

pub(super) fn apply_op(
    left: &dyn Datum,
    op: CompareOp,
    right: &dyn Datum,
) -> std::result::Result<BooleanArray, arrow::error::ArrowError> {
    match op {
        CompareOp::Eq => cmp::eq(left, right),
        CompareOp::NotEq => cmp::neq(left, right),
        CompareOp::Lt => cmp::lt(left, right),
        CompareOp::LtEq => cmp::lt_eq(left, right),
        CompareOp::Gt => cmp::gt(left, right),
        CompareOp::GtEq => cmp::gt_eq(left, right),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int32Array;
    use arrow::datatypes::{Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("score", DataType::Float64, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), Some(2), None, Some(4)])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("c'd"),
                    Some("e"),
                ])),
                Arc::new(Float64Array::from(vec![
                    Some(0.5),
                    Some(1.5),
                    Some(2.5),
                    None,
                ])),
            ],
        )
        .expect("valid batch")
    }

    fn selected(text: &str) -> Vec<Option<bool>> {
        let expr = Expr::parse(text).expect("parses");
        expr.evaluate(&batch()).expect("evaluates").iter().collect()
    }

    #[test]
    fn comparisons_use_three_valued_logic() {
        assert_eq!(
            selected("id > 1"),
            vec![Some(false), Some(true), None, Some(true)]
        );
        assert_eq!(
            selected("not id > 1"),
            vec![Some(true), Some(false), None, Some(false)]
        );
        // unknown and false is false; true and unknown is unknown.
        assert_eq!(
            selected("id >= 2 and score < 2"),
            vec![Some(false), Some(true), Some(false), None]
        );
        assert_eq!(
            selected("id = 1 or name = 'e'"),
            vec![Some(true), None, None, Some(true)]
        );
        assert_eq!(selected("1 < id"), selected("id > 1"));
        assert_eq!(
            selected("name = 'c''d'"),
            vec![Some(false), None, Some(true), Some(false)]
        );
    }

    #[test]
    fn in_lists_and_null_tests() {
        assert_eq!(
            selected("id in (1, 4)"),
            vec![Some(true), Some(false), None, Some(true)]
        );
        assert_eq!(
            selected("id not in (1, 4)"),
            vec![Some(false), Some(true), None, Some(false)]
        );
        assert_eq!(
            selected("name is null"),
            vec![Some(false), Some(true), Some(false), Some(false)]
        );
        assert_eq!(
            selected("NAME IS NOT NULL".replace("NAME", "name").as_str()),
            vec![Some(true), Some(false), Some(true), Some(true)]
        );
    }

    #[test]
    fn float_literal_against_integer_column_compares_as_float() {
        assert_eq!(
            selected("id < 1.5"),
            vec![Some(true), Some(false), None, Some(false)]
        );
        assert_eq!(
            selected("score <= 1.5e0"),
            vec![Some(true), Some(true), Some(false), None]
        );
    }

    #[test]
    fn bad_literal_type_names_the_column() {
        let error = Expr::parse("id = 'abc'")
            .expect("parses")
            .evaluate(&batch())
            .expect_err("cannot cast");
        assert!(error.to_string().contains("\"id\""), "{error}");
        let missing = Expr::parse("nope = 1")
            .expect("parses")
            .evaluate(&batch())
            .expect_err("missing column");
        assert!(missing.to_string().contains("nope"), "{missing}");
    }
}
