//! The syntax tree of a filter expression, and the transforms that keep to its shape.

use std::fmt;

use super::parse::{is_identifier_char, keyword};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`
    Eq,
    /// `!=` or `<>`
    NotEq,
    /// `<`
    Lt,
    /// `<=`
    LtEq,
    /// `>`
    Gt,
    /// `>=`
    GtEq,
}

impl CompareOp {
    /// Returns the operator that holds exactly when this one is false (on non-null values).
    pub fn negate(self) -> Self {
        match self {
            Self::Eq => Self::NotEq,
            Self::NotEq => Self::Eq,
            Self::Lt => Self::GtEq,
            Self::LtEq => Self::Gt,
            Self::Gt => Self::LtEq,
            Self::GtEq => Self::Lt,
        }
    }

    /// Returns the operator with its operands swapped (`a < b` is `b > a`).
    pub fn flip(self) -> Self {
        match self {
            Self::Eq => Self::Eq,
            Self::NotEq => Self::NotEq,
            Self::Lt => Self::Gt,
            Self::LtEq => Self::GtEq,
            Self::Gt => Self::Lt,
            Self::GtEq => Self::LtEq,
        }
    }

    pub(super) fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::NotEq => "!=",
            Self::Lt => "<",
            Self::LtEq => "<=",
            Self::Gt => ">",
            Self::GtEq => ">=",
        }
    }
}

/// A literal value in a filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for Literal {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(value) => write!(formatter, "{value}"),
            Self::Float(value) => write!(formatter, "{value:?}"),
            Self::Str(value) => write!(formatter, "'{}'", value.replace('\'', "''")),
            Self::Bool(value) => write!(formatter, "{value}"),
        }
    }
}

/// A parsed filter expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// Both sides hold.
    And(Box<Expr>, Box<Expr>),
    /// Either side holds.
    Or(Box<Expr>, Box<Expr>),
    /// The inner expression does not hold.
    Not(Box<Expr>),
    /// `column op value`.
    Compare {
        /// The column.
        column: String,
        /// The operator.
        op: CompareOp,
        /// The literal.
        value: Literal,
    },
    /// `column [not] in (values)`.
    InList {
        /// The column.
        column: String,
        /// The candidate values.
        values: Vec<Literal>,
        /// `not in`.
        negated: bool,
    },
    /// `column is [not] null`.
    IsNull {
        /// The column.
        column: String,
        /// `is not null`.
        negated: bool,
    },
}

fn quote_column(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && name.chars().all(is_identifier_char)
        && keyword(name).is_none();
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::And(left, right) => write!(formatter, "({left} and {right})"),
            Self::Or(left, right) => write!(formatter, "({left} or {right})"),
            Self::Not(inner) => write!(formatter, "not {inner}"),
            Self::Compare { column, op, value } => {
                write!(
                    formatter,
                    "{} {} {value}",
                    quote_column(column),
                    op.symbol()
                )
            }
            Self::InList {
                column,
                values,
                negated,
            } => {
                let list: Vec<String> = values.iter().map(ToString::to_string).collect();
                let keyword = if *negated { "not in" } else { "in" };
                write!(
                    formatter,
                    "{} {keyword} ({})",
                    quote_column(column),
                    list.join(", ")
                )
            }
            Self::IsNull { column, negated } => {
                let keyword = if *negated { "is not null" } else { "is null" };
                write!(formatter, "{} {keyword}", quote_column(column))
            }
        }
    }
}

impl Expr {
    /// Returns the columns the expression reads, in first-use order, without duplicates.
    pub fn columns(&self) -> Vec<String> {
        let mut columns = Vec::new();
        self.collect_columns(&mut columns);
        columns
    }

    fn collect_columns(&self, columns: &mut Vec<String>) {
        match self {
            Self::And(left, right) | Self::Or(left, right) => {
                left.collect_columns(columns);
                right.collect_columns(columns);
            }
            Self::Not(inner) => inner.collect_columns(columns),
            Self::Compare { column, .. }
            | Self::InList { column, .. }
            | Self::IsNull { column, .. } => {
                if !columns.contains(column) {
                    columns.push(column.clone());
                }
            }
        }
    }

    /// Returns the top-level conjuncts (`a and b and c` gives `[a, b, c]`).
    pub fn conjuncts(&self) -> Vec<&Expr> {
        match self {
            Self::And(left, right) => {
                let mut parts = left.conjuncts();
                parts.extend(right.conjuncts());
                parts
            }
            other => vec![other],
        }
    }

    /// Returns the negation normal form: `not` pushed down to the leaves and removed.
    ///
    /// On non-null values the result is equivalent; rows where the original is unknown are not kept by
    /// either form, so the two select the same rows.
    pub fn negation_normal_form(&self) -> Expr {
        self.nnf(false)
    }

    fn nnf(&self, negate: bool) -> Expr {
        match (self, negate) {
            (Self::Not(inner), _) => inner.nnf(!negate),
            (Self::And(left, right), false) => {
                Self::And(Box::new(left.nnf(false)), Box::new(right.nnf(false)))
            }
            (Self::And(left, right), true) => {
                Self::Or(Box::new(left.nnf(true)), Box::new(right.nnf(true)))
            }
            (Self::Or(left, right), false) => {
                Self::Or(Box::new(left.nnf(false)), Box::new(right.nnf(false)))
            }
            (Self::Or(left, right), true) => {
                Self::And(Box::new(left.nnf(true)), Box::new(right.nnf(true)))
            }
            (Self::Compare { column, op, value }, _) => Self::Compare {
                column: column.clone(),
                op: if negate { op.negate() } else { *op },
                value: value.clone(),
            },
            (
                Self::InList {
                    column,
                    values,
                    negated,
                },
                _,
            ) => Self::InList {
                column: column.clone(),
                values: values.clone(),
                negated: *negated != negate,
            },
            (Self::IsNull { column, negated }, _) => Self::IsNull {
                column: column.clone(),
                negated: *negated != negate,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips() {
        for text in [
            "(id > 1 and not name in ('a', 'b'))",
            "\"weird col\" is not null",
            "x = -1.5",
            "flag = true",
        ] {
            let expr = Expr::parse(text).expect("parses");
            assert_eq!(
                Expr::parse(&expr.to_string()).expect("reparses"),
                expr,
                "{text}"
            );
        }
    }
}
