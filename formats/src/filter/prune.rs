//! Pruning: which containers (row groups, pages, files) may hold a row a filter keeps, from their
//! statistics.

use arrow::array::{Array, ArrayRef, BooleanArray, Datum, Scalar, UInt64Array};

use super::ast::{CompareOp, Expr, Literal};
use super::eval::{align, apply_op};
use crate::error::{FormatError, Result};

/// Per-container statistics for [`Expr::prune`]: containers are row groups, pages or files.
///
/// Every array has one entry per container; a null entry, or `None` for a whole column, means unknown.
pub trait PruningStatistics {
    /// The number of containers.
    fn num_containers(&self) -> usize;
    /// The minimum value of `column` in each container.
    fn min_values(&self, column: &str) -> Option<ArrayRef>;
    /// The maximum value of `column` in each container.
    fn max_values(&self, column: &str) -> Option<ArrayRef>;
    /// The number of nulls of `column` in each container.
    fn null_counts(&self, column: &str) -> Option<UInt64Array>;
    /// The number of rows in each container.
    fn row_counts(&self) -> Option<UInt64Array>;
}

impl Expr {
    /// Returns, for each container of `statistics`, whether it may hold a row for which the expression is
    /// true. `false` is a proof that no row in that container matches.
    ///
    /// # Errors
    ///
    /// Returns an error when a literal cannot be cast to the statistics' type of its column.
    pub fn prune(&self, statistics: &dyn PruningStatistics) -> Result<Vec<bool>> {
        self.negation_normal_form().prune_nnf(statistics)
    }

    fn prune_nnf(&self, statistics: &dyn PruningStatistics) -> Result<Vec<bool>> {
        let containers = statistics.num_containers();
        let all = || vec![true; containers];
        match self {
            Self::And(left, right) => {
                let (left, right) = (left.prune_nnf(statistics)?, right.prune_nnf(statistics)?);
                Ok(left.iter().zip(&right).map(|(a, b)| *a && *b).collect())
            }
            Self::Or(left, right) => {
                let (left, right) = (left.prune_nnf(statistics)?, right.prune_nnf(statistics)?);
                Ok(left.iter().zip(&right).map(|(a, b)| *a || *b).collect())
            }
            Self::Not(_) => Ok(all()),
            Self::Compare { column, op, value } => prune_compare(statistics, column, *op, value),
            Self::InList {
                column,
                values,
                negated: false,
            } => {
                let mut keep = vec![false; containers];
                for value in values {
                    let matches = prune_compare(statistics, column, CompareOp::Eq, value)?;
                    keep.iter_mut()
                        .zip(matches)
                        .for_each(|(slot, may)| *slot |= may);
                }
                Ok(keep)
            }
            Self::InList { negated: true, .. } => Ok(all()),
            Self::IsNull { column, negated } => {
                let Some(null_counts) = statistics.null_counts(column) else {
                    return Ok(all());
                };
                let row_counts = statistics.row_counts();
                Ok((0..containers)
                    .map(|index| {
                        if null_counts.is_null(index) {
                            return true;
                        }
                        let nulls = null_counts.value(index);
                        if *negated {
                            match &row_counts {
                                Some(rows) if rows.is_valid(index) => nulls < rows.value(index),
                                _ => true,
                            }
                        } else {
                            nulls > 0
                        }
                    })
                    .collect())
            }
        }
    }
}

/// Unknown (null) kernel results mean "may match".
fn maybe(result: &BooleanArray) -> Vec<bool> {
    (0..result.len())
        .map(|index| result.is_null(index) || result.value(index))
        .collect()
}

fn prune_compare(
    statistics: &dyn PruningStatistics,
    column: &str,
    op: CompareOp,
    literal: &Literal,
) -> Result<Vec<bool>> {
    let containers = statistics.num_containers();
    // A comparison with null is never true: a container whose values are all null holds no match.
    let some_value: Vec<bool> = match (statistics.null_counts(column), statistics.row_counts()) {
        (Some(nulls), Some(rows)) => (0..containers)
            .map(|index| {
                !(nulls.is_valid(index)
                    && rows.is_valid(index)
                    && rows.value(index) > 0
                    && nulls.value(index) == rows.value(index))
            })
            .collect(),
        _ => vec![true; containers],
    };
    let (Some(mins), Some(maxes)) = (statistics.min_values(column), statistics.max_values(column))
    else {
        return Ok(some_value);
    };
    // Float statistics leave NaN out, while the comparison kernels order NaN above every number:
    // a bound on the high side proves nothing for floats.
    let is_float = mins.data_type().is_floating();
    if is_float && matches!(op, CompareOp::Gt | CompareOp::GtEq | CompareOp::NotEq) {
        return Ok(some_value);
    }
    let (mins, literal_array) = match align(column, &mins, literal) {
        Ok(aligned) => aligned,
        // Statistics of a type the literal does not cast to cannot prune; the evaluation reports the error.
        Err(_) => return Ok(vec![true; containers]),
    };
    let (maxes, _) = align(column, &maxes, literal)?;
    let scalar = Scalar::new(literal_array);
    let context = || format!("pruning with {column} {} {literal}", op.symbol());
    let run = |left: &dyn Datum, op: CompareOp, right: &dyn Datum| {
        apply_op(left, op, right).map_err(|error| FormatError::arrow(context(), error))
    };
    let keep: Vec<bool> = match op {
        CompareOp::Eq => {
            let low = run(&mins, CompareOp::LtEq, &scalar)?;
            let high = run(&maxes, CompareOp::GtEq, &scalar)?;
            maybe(&low)
                .into_iter()
                .zip(maybe(&high))
                .map(|(a, b)| a && b)
                .collect()
        }
        CompareOp::NotEq => {
            let low = run(&mins, CompareOp::Eq, &scalar)?;
            let high = run(&maxes, CompareOp::Eq, &scalar)?;
            (0..containers)
                .map(|index| {
                    let all_equal = low.is_valid(index)
                        && low.value(index)
                        && high.is_valid(index)
                        && high.value(index);
                    !all_equal
                })
                .collect()
        }
        CompareOp::Lt | CompareOp::LtEq => maybe(&run(&mins, op, &scalar)?),
        CompareOp::Gt | CompareOp::GtEq => maybe(&run(&maxes, op, &scalar)?),
    };
    Ok(keep
        .into_iter()
        .zip(some_value)
        .map(|(keep, some)| keep && some)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::array::Int64Array;

    struct Stats {
        mins: ArrayRef,
        maxes: ArrayRef,
        nulls: UInt64Array,
        rows: UInt64Array,
    }

    impl PruningStatistics for Stats {
        fn num_containers(&self) -> usize {
            self.rows.len()
        }
        fn min_values(&self, column: &str) -> Option<ArrayRef> {
            (column == "id").then(|| Arc::clone(&self.mins))
        }
        fn max_values(&self, column: &str) -> Option<ArrayRef> {
            (column == "id").then(|| Arc::clone(&self.maxes))
        }
        fn null_counts(&self, column: &str) -> Option<UInt64Array> {
            (column == "id").then(|| self.nulls.clone())
        }
        fn row_counts(&self) -> Option<UInt64Array> {
            Some(self.rows.clone())
        }
    }

    #[test]
    fn pruning_skips_only_provably_empty_containers() {
        // Rows 0..=9; 10..=19 with 3 nulls; unknown; all null.
        let stats = Stats {
            mins: Arc::new(Int64Array::from(vec![Some(0), Some(10), None, None])),
            maxes: Arc::new(Int64Array::from(vec![Some(9), Some(19), None, None])),
            nulls: UInt64Array::from(vec![Some(0), Some(3), None, Some(10)]),
            rows: UInt64Array::from(vec![10, 10, 10, 10]),
        };
        let prune = |text: &str| {
            Expr::parse(text)
                .expect("parses")
                .prune(&stats)
                .expect("prunes")
        };
        assert_eq!(prune("id = 5"), vec![true, false, true, false]);
        assert_eq!(prune("id > 9"), vec![false, true, true, false]);
        assert_eq!(prune("not id <= 9"), vec![false, true, true, false]);
        assert_eq!(prune("id in (3, 25)"), vec![true, false, true, false]);
        assert_eq!(prune("id is null"), vec![false, true, true, true]);
        assert_eq!(prune("id is not null"), vec![true, true, true, false]);
        assert_eq!(prune("id < 0 or id >= 19"), vec![false, true, true, false]);
        assert_eq!(
            prune("other = 1 and id = 15"),
            vec![false, true, true, false]
        );
        assert_eq!(prune("id != 5"), vec![true, true, true, false]);
    }
}
