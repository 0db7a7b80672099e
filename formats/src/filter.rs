//! The row filter language: parsing, evaluation with Arrow compute kernels, and pruning with statistics.
//!
//! # Grammar
//!
//! ```text
//! expr      := or
//! or        := and ( "or" and )*
//! and       := unary ( "and" unary )*
//! unary     := "not" unary | "(" expr ")" | predicate
//! predicate := column ( op literal | ["not"] "in" "(" literal ( "," literal )* ")" | "is" ["not"] "null" )?
//!            | literal op column
//! op        := "=" | "!=" | "<>" | "<" | "<=" | ">" | ">="
//! column    := identifier | "double-quoted name"
//! literal   := integer | float | 'string' | true | false
//! ```
//!
//! Keywords (`and`, `or`, `not`, `in`, `is`, `null`, `true`, `false`) are case-insensitive. Identifiers are
//! letters, digits, `_`, `.` and `$`, not starting with a digit; any other column name is written in double
//! quotes (`"c_customer_id"`, with `""` for a quote inside). Strings are single-quoted, with `''` for a quote
//! inside. Integers and floats may carry a leading `-`; floats may have an exponent (`1.5e-3`). A bare column
//! is shorthand for `column = true`.
//!
//! Examples: `label = 1 and score >= 0.5`, `country in ('FR', 'DE') or name is null`,
//! `not (id < 10)`, `"event time" > '2024-01-01T00:00:00Z'`.
//!
//! # Semantics
//!
//! Comparisons follow SQL: a comparison with a null is unknown, `not unknown` is unknown, and a row is kept
//! only when the whole expression is true. The literal is cast to the column's type (a string literal can
//! be compared with a date or a timestamp column this way); a float literal compared with an integer column
//! compares both as `float64`. A literal that cannot be cast is an error naming the column and its type.
//!
//! # Pruning
//!
//! [`Expr::prune`] decides, from per-container statistics (row groups, pages, files with partition values),
//! which containers may hold a matching row. It is conservative: a container is skipped only when the
//! statistics prove that no row in it matches.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Datum, Float64Array, Int64Array, RecordBatch, Scalar,
    StringArray, UInt64Array,
};
use arrow::compute::kernels::cmp;
use arrow::compute::{
    CastOptions, and_kleene, cast_with_options, is_not_null, is_null, not, or_kleene,
};
use arrow::datatypes::DataType;

use crate::error::{FormatError, Result};

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

    fn symbol(self) -> &'static str {
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

impl Literal {
    fn to_array(&self) -> ArrayRef {
        match self {
            Self::Int(value) => Arc::new(Int64Array::from(vec![*value])),
            Self::Float(value) => Arc::new(Float64Array::from(vec![*value])),
            Self::Str(value) => Arc::new(StringArray::from(vec![value.as_str()])),
            Self::Bool(value) => Arc::new(BooleanArray::from(vec![*value])),
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
    /// Parses a filter expression.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::FilterSyntax`] with the byte position of the first error.
    pub fn parse(text: &str) -> Result<Self> {
        Parser::new(text)?.parse_all()
    }

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
fn align(column: &str, values: &ArrayRef, literal: &Literal) -> Result<(ArrayRef, ArrayRef)> {
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

fn apply_op(
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
    let (Some(mins), Some(maxes)) = (statistics.min_values(column), statistics.max_values(column))
    else {
        return Ok(vec![true; containers]);
    };
    // Float statistics leave NaN out, while the comparison kernels order NaN above every number:
    // a bound on the high side proves nothing for floats.
    let is_float = mins.data_type().is_floating();
    if is_float && matches!(op, CompareOp::Gt | CompareOp::GtEq | CompareOp::NotEq) {
        return Ok(vec![true; containers]);
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
    let keep = match op {
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
    Ok(keep)
}

fn is_identifier_char(character: char) -> bool {
    character.is_ascii_alphanumeric() || matches!(character, '_' | '.' | '$')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keyword {
    And,
    Or,
    Not,
    In,
    Is,
    Null,
    True,
    False,
}

fn keyword(word: &str) -> Option<Keyword> {
    match word.to_ascii_lowercase().as_str() {
        "and" => Some(Keyword::And),
        "or" => Some(Keyword::Or),
        "not" => Some(Keyword::Not),
        "in" => Some(Keyword::In),
        "is" => Some(Keyword::Is),
        "null" => Some(Keyword::Null),
        "true" => Some(Keyword::True),
        "false" => Some(Keyword::False),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Keyword(Keyword),
    Literal(Literal),
    Op(CompareOp),
    LeftParen,
    RightParen,
    Comma,
    End,
}

impl Token {
    fn describe(&self) -> String {
        match self {
            Self::Ident(name) => format!("column {name:?}"),
            Self::Keyword(word) => format!("keyword {}", format!("{word:?}").to_ascii_lowercase()),
            Self::Literal(literal) => format!("literal {literal}"),
            Self::Op(op) => format!("operator {}", op.symbol()),
            Self::LeftParen => "\"(\"".to_string(),
            Self::RightParen => "\")\"".to_string(),
            Self::Comma => "\",\"".to_string(),
            Self::End => "end of expression".to_string(),
        }
    }
}

/// A recursive-descent parser over a pre-lexed token list; every token keeps its byte position.
struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(usize, Token)>,
    cursor: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Result<Self> {
        let tokens = lex(text)?;
        Ok(Self {
            text,
            tokens,
            cursor: 0,
        })
    }

    fn error(&self, position: usize, message: impl Into<String>) -> FormatError {
        FormatError::FilterSyntax {
            expression: self.text.to_string(),
            position,
            message: message.into(),
        }
    }

    fn peek(&self) -> &(usize, Token) {
        let last = self.tokens.len() - 1;
        &self.tokens[self.cursor.min(last)]
    }

    fn advance(&mut self) -> (usize, Token) {
        let token = self.peek().clone();
        if self.cursor < self.tokens.len() - 1 {
            self.cursor += 1;
        }
        token
    }

    fn eat_keyword(&mut self, word: Keyword) -> bool {
        if self.peek().1 == Token::Keyword(word) {
            self.advance();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, expected: &Token, what: &str) -> Result<()> {
        let (position, token) = self.advance();
        if &token == expected {
            Ok(())
        } else {
            Err(self.error(
                position,
                format!("expected {what}, found {}", token.describe()),
            ))
        }
    }

    fn parse_all(mut self) -> Result<Expr> {
        let expr = self.parse_or()?;
        let (position, token) = self.peek().clone();
        if token != Token::End {
            return Err(self.error(
                position,
                format!(
                    "expected \"and\", \"or\" or end of expression, found {}",
                    token.describe()
                ),
            ));
        }
        Ok(expr)
    }

    fn parse_or(&mut self) -> Result<Expr> {
        let mut left = self.parse_and()?;
        while self.eat_keyword(Keyword::Or) {
            let right = self.parse_and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn parse_and(&mut self) -> Result<Expr> {
        let mut left = self.parse_unary()?;
        while self.eat_keyword(Keyword::And) {
            let right = self.parse_unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn parse_unary(&mut self) -> Result<Expr> {
        if self.eat_keyword(Keyword::Not) {
            return Ok(Expr::Not(Box::new(self.parse_unary()?)));
        }
        if self.peek().1 == Token::LeftParen {
            self.advance();
            let inner = self.parse_or()?;
            self.expect(&Token::RightParen, "\")\"")?;
            return Ok(inner);
        }
        self.parse_predicate()
    }

    fn parse_literal(&mut self) -> Result<Literal> {
        let (position, token) = self.advance();
        match token {
            Token::Literal(literal) => Ok(literal),
            Token::Keyword(Keyword::True) => Ok(Literal::Bool(true)),
            Token::Keyword(Keyword::False) => Ok(Literal::Bool(false)),
            Token::Keyword(Keyword::Null) => Err(self.error(
                position,
                "null is not a value to compare with; write \"is null\" or \"is not null\"",
            )),
            other => Err(self.error(
                position,
                format!(
                    "expected a literal (number, 'string', true, false), found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn parse_predicate(&mut self) -> Result<Expr> {
        let (position, token) = self.advance();
        match token {
            Token::Ident(column) => self.parse_predicate_tail(column),
            Token::Literal(_) | Token::Keyword(Keyword::True | Keyword::False) => {
                self.cursor -= 1;
                let value = self.parse_literal()?;
                let (op_position, op_token) = self.advance();
                let Token::Op(op) = op_token else {
                    return Err(self.error(
                        op_position,
                        format!(
                            "expected a comparison operator after the literal, found {}",
                            op_token.describe()
                        ),
                    ));
                };
                let (column_position, column_token) = self.advance();
                let Token::Ident(column) = column_token else {
                    return Err(self.error(
                        column_position,
                        format!("expected a column name, found {}", column_token.describe()),
                    ));
                };
                Ok(Expr::Compare {
                    column,
                    op: op.flip(),
                    value,
                })
            }
            other => Err(self.error(
                position,
                format!(
                    "expected a column name, \"not\" or \"(\", found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn parse_predicate_tail(&mut self, column: String) -> Result<Expr> {
        let (position, token) = self.peek().clone();
        match token {
            Token::Op(op) => {
                self.advance();
                let value = self.parse_literal()?;
                Ok(Expr::Compare { column, op, value })
            }
            Token::Keyword(Keyword::Is) => {
                self.advance();
                let negated = self.eat_keyword(Keyword::Not);
                let (null_position, null_token) = self.advance();
                if null_token != Token::Keyword(Keyword::Null) {
                    return Err(self.error(null_position, format!("expected \"null\", found {}", null_token.describe())));
                }
                Ok(Expr::IsNull { column, negated })
            }
            Token::Keyword(Keyword::Not) => {
                self.advance();
                let (in_position, in_token) = self.advance();
                if in_token != Token::Keyword(Keyword::In) {
                    return Err(self.error(in_position, format!("expected \"in\" after \"not\", found {}", in_token.describe())));
                }
                self.parse_in_list(column, true)
            }
            Token::Keyword(Keyword::In) => {
                self.advance();
                self.parse_in_list(column, false)
            }
            Token::Keyword(Keyword::And | Keyword::Or) | Token::RightParen | Token::End => {
                Ok(Expr::Compare { column, op: CompareOp::Eq, value: Literal::Bool(true) })
            }
            other => Err(self.error(
                position,
                format!("expected a comparison operator, \"in\", \"is\", \"and\", \"or\" or end of expression, found {}", other.describe()),
            )),
        }
    }

    fn parse_in_list(&mut self, column: String, negated: bool) -> Result<Expr> {
        self.expect(&Token::LeftParen, "\"(\" after \"in\"")?;
        let mut values = vec![self.parse_literal()?];
        loop {
            let (position, token) = self.advance();
            match token {
                Token::Comma => values.push(self.parse_literal()?),
                Token::RightParen => break,
                other => {
                    return Err(self.error(
                        position,
                        format!(
                            "expected \",\" or \")\" in the list, found {}",
                            other.describe()
                        ),
                    ));
                }
            }
        }
        Ok(Expr::InList {
            column,
            values,
            negated,
        })
    }
}

fn lex(text: &str) -> Result<Vec<(usize, Token)>> {
    let error = |position: usize, message: String| FormatError::FilterSyntax {
        expression: text.to_string(),
        position,
        message,
    };
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut index = 0;
    while index < bytes.len() {
        let start = index;
        let byte = bytes[index];
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' => index += 1,
            b'(' => {
                tokens.push((start, Token::LeftParen));
                index += 1;
            }
            b')' => {
                tokens.push((start, Token::RightParen));
                index += 1;
            }
            b',' => {
                tokens.push((start, Token::Comma));
                index += 1;
            }
            b'=' => {
                tokens.push((start, Token::Op(CompareOp::Eq)));
                index += if bytes.get(index + 1) == Some(&b'=') {
                    2
                } else {
                    1
                };
            }
            b'!' => {
                if bytes.get(index + 1) == Some(&b'=') {
                    tokens.push((start, Token::Op(CompareOp::NotEq)));
                    index += 2;
                } else {
                    return Err(error(start, "expected \"!=\"".to_string()));
                }
            }
            b'<' => match bytes.get(index + 1) {
                Some(b'=') => {
                    tokens.push((start, Token::Op(CompareOp::LtEq)));
                    index += 2;
                }
                Some(b'>') => {
                    tokens.push((start, Token::Op(CompareOp::NotEq)));
                    index += 2;
                }
                _ => {
                    tokens.push((start, Token::Op(CompareOp::Lt)));
                    index += 1;
                }
            },
            b'>' => {
                if bytes.get(index + 1) == Some(&b'=') {
                    tokens.push((start, Token::Op(CompareOp::GtEq)));
                    index += 2;
                } else {
                    tokens.push((start, Token::Op(CompareOp::Gt)));
                    index += 1;
                }
            }
            b'\'' | b'"' => {
                let quote = byte;
                let mut value = String::new();
                index += 1;
                loop {
                    let Some(offset) = text[index..].find(quote as char) else {
                        let what = if quote == b'\'' {
                            "string"
                        } else {
                            "quoted column name"
                        };
                        return Err(error(start, format!("unterminated {what}")));
                    };
                    value.push_str(&text[index..index + offset]);
                    index += offset + 1;
                    if bytes.get(index) == Some(&quote) {
                        value.push(quote as char);
                        index += 1;
                    } else {
                        break;
                    }
                }
                let token = if quote == b'\'' {
                    Token::Literal(Literal::Str(value))
                } else {
                    Token::Ident(value)
                };
                tokens.push((start, token));
            }
            b'0'..=b'9' | b'-' | b'.' => {
                index += 1;
                while index < bytes.len() {
                    let next = bytes[index];
                    let exponent_sign =
                        matches!(next, b'+' | b'-') && matches!(bytes[index - 1], b'e' | b'E');
                    if next.is_ascii_digit() || matches!(next, b'.' | b'e' | b'E') || exponent_sign
                    {
                        index += 1;
                    } else {
                        break;
                    }
                }
                let number = &text[start..index];
                let literal = if let Ok(integer) = number.parse::<i64>() {
                    Literal::Int(integer)
                } else if let Ok(float) = number.parse::<f64>() {
                    Literal::Float(float)
                } else {
                    return Err(error(start, format!("invalid number {number:?}")));
                };
                tokens.push((start, Token::Literal(literal)));
            }
            _ if byte.is_ascii_alphabetic() || byte == b'_' || byte == b'$' => {
                while index < bytes.len() && is_identifier_char(bytes[index] as char) {
                    index += 1;
                }
                let word = &text[start..index];
                let token =
                    keyword(word).map_or_else(|| Token::Ident(word.to_string()), Token::Keyword);
                tokens.push((start, token));
            }
            _ => {
                let character = text[start..].chars().next().unwrap_or('?');
                return Err(error(start, format!("unexpected character {character:?}")));
            }
        }
    }
    tokens.push((text.len(), Token::End));
    Ok(tokens)
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
    fn syntax_errors_point_at_the_byte() {
        let cases = [
            ("id >", 4),
            ("id > 1 and", 10),
            ("id in (1, 2", 11),
            ("name = 'x", 7),
            ("id ! 3", 3),
            ("(id = 1", 7),
            ("id = null", 5),
            ("id = 1 name", 7),
        ];
        for (text, expected) in cases {
            match Expr::parse(text) {
                Err(FormatError::FilterSyntax { position, .. }) => {
                    assert_eq!(position, expected, "{text}")
                }
                other => panic!("{text}: expected a syntax error, got {other:?}"),
            }
        }
        let message = Expr::parse("id >").expect_err("incomplete").to_string();
        assert!(
            message.contains("byte 4") && message.contains("end of expression"),
            "{message}"
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
        let stats = Stats {
            mins: Arc::new(Int64Array::from(vec![Some(0), Some(10), None])),
            maxes: Arc::new(Int64Array::from(vec![Some(9), Some(19), None])),
            nulls: UInt64Array::from(vec![Some(0), Some(10), None]),
            rows: UInt64Array::from(vec![10, 10, 10]),
        };
        let prune = |text: &str| {
            Expr::parse(text)
                .expect("parses")
                .prune(&stats)
                .expect("prunes")
        };
        assert_eq!(prune("id = 5"), vec![true, false, true]);
        assert_eq!(prune("id > 9"), vec![false, true, true]);
        assert_eq!(prune("not id <= 9"), vec![false, true, true]);
        assert_eq!(prune("id in (3, 25)"), vec![true, false, true]);
        assert_eq!(prune("id is null"), vec![false, true, true]);
        assert_eq!(prune("id is not null"), vec![true, false, true]);
        assert_eq!(prune("id < 0 or id >= 19"), vec![false, true, true]);
        assert_eq!(prune("other = 1 and id = 15"), vec![false, true, true]);
        assert_eq!(prune("id != 5"), vec![true, true, true]);
    }
}
