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
//! A filter nests parentheses and `not` at most [`MAX_FILTER_DEPTH`] deep and holds at most
//! [`MAX_FILTER_TERMS`] predicates: evaluation and pruning recurse over the tree.
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
//!
//! # Implementation
//!
//! The syntax tree ([`Expr`], in `ast`) knows only its own shape: its columns, conjuncts and negation
//! normal form, and how it prints. `parse` turns text into it; `eval` applies it to a record batch with
//! Arrow's compute kernels; `prune` applies it to per-container statistics.

mod ast;
mod eval;
mod parse;
mod prune;

pub use ast::{CompareOp, Expr, Literal};

/// The deepest nesting of parentheses and `not` a filter may have.
pub const MAX_FILTER_DEPTH: usize = 64;
/// The most comparisons (`column op value`, `in`, `is null`) a filter may hold. Evaluation and
/// pruning recurse over the expression, so both bounds keep a hostile filter from overflowing a
/// reader's stack.
pub const MAX_FILTER_TERMS: usize = 1024;
pub use prune::PruningStatistics;
