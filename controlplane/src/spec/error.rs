//! Errors of the job spec, each naming the key path and the fix.

use super::Format;
use super::tree::{PathSegment, TreeError, TreeErrorKind, render_path};
use std::path::PathBuf;

/// Why a job spec was refused. Every variant names where the problem is and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The spec file could not be read.
    #[error("job spec {path}: cannot read it: {source}; check the path and its permissions")]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file name does not say which format the spec is in.
    #[error(
        "job spec {path}: cannot tell its format from the extension; name it .yaml, .yml, .toml or .json"
    )]
    UnknownExtension {
        /// The file that was asked for.
        path: PathBuf,
    },
    /// The text is not valid in its format.
    #[error("job spec is not valid {format}: {message}; fix the syntax at the place shown")]
    Syntax {
        /// The format the text was parsed as.
        format: Format,
        /// The parser's message, with its line and column where the parser gives them.
        message: String,
    },
    /// The document has no content.
    #[error("job spec is empty; write at least `name`, `data.sources` and `roles`")]
    Empty,
    /// A key that the spec does not know.
    #[error("job spec: unknown key `{path}`; {fix}")]
    UnknownKey {
        /// The full key path of the unknown key.
        path: String,
        /// A close match, or the list of allowed keys.
        fix: String,
    },
    /// A required key is absent.
    #[error("job spec: `{path}` is missing; {fix}")]
    Missing {
        /// The full key path of the missing key.
        path: String,
        /// What to write there.
        fix: String,
    },
    /// A `${NAME}` of the spec's text cannot be replaced.
    #[error(
        "job spec: `${{{name}}}` {problem}; set it, or write the value in the spec (`$${{` writes a literal `${{`)"
    )]
    Variable {
        /// The variable's name, as written.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A value is present but not acceptable.
    #[error("job spec: `{path}` {problem}; {fix}")]
    Invalid {
        /// The full key path of the value.
        path: String,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: String,
    },
}

impl SpecError {
    /// The key path this error is about, if it is about one key.
    pub fn key_path(&self) -> Option<&str> {
        match self {
            SpecError::UnknownKey { path, .. }
            | SpecError::Missing { path, .. }
            | SpecError::Invalid { path, .. } => Some(path),
            SpecError::Read { .. }
            | SpecError::UnknownExtension { .. }
            | SpecError::Syntax { .. }
            | SpecError::Variable { .. }
            | SpecError::Empty => None,
        }
    }

    pub(crate) fn invalid(
        path: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        SpecError::Invalid {
            path: path.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}

/// Turns a tree error into a spec error with a readable path and fix.
pub(crate) fn from_tree_error(error: TreeError) -> SpecError {
    let parent = render_path(&error.path);
    let at = |leaf: &str| {
        let mut segments = error.path.clone();
        segments.push(PathSegment::Key(leaf.to_owned()));
        render_path(&segments)
    };
    match error.kind {
        TreeErrorKind::UnknownField { field, expected } => SpecError::UnknownKey {
            path: at(&field),
            fix: suggest(&field, expected),
        },
        TreeErrorKind::MissingField { field } => SpecError::Missing {
            path: at(field),
            fix: missing_fix(field).to_owned(),
        },
        TreeErrorKind::UnknownVariant { variant, expected } => SpecError::invalid(
            parent,
            format!("has unknown value `{variant}`"),
            suggest(&variant, expected),
        ),
        TreeErrorKind::InvalidType { found, expected }
        | TreeErrorKind::InvalidValue { found, expected } => {
            let wanted = plain_expected(&expected);
            if parent.is_empty() {
                SpecError::invalid(
                    "(top level)",
                    format!("is {found}, not a map of keys"),
                    "write the spec as a map with `name`, `data` and `roles`",
                )
            } else {
                SpecError::invalid(
                    parent,
                    format!("is {found}"),
                    format!("write {wanted} there"),
                )
            }
        }
        TreeErrorKind::Other(message) => SpecError::invalid(
            if parent.is_empty() {
                "(top level)".to_owned()
            } else {
                parent
            },
            message,
            "correct the value",
        ),
    }
}

/// Words for serde's type names.
fn plain_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" => "a whole number that is zero or more".to_owned(),
        "i8" | "i16" | "i32" | "i64" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a string" | "a borrowed string" => "a string".to_owned(),
        "a sequence" => "a list".to_owned(),
        "a boolean" => "true or false".to_owned(),
        other if other.starts_with("struct ") || other == "a map" => "a map of keys".to_owned(),
        other => other.to_owned(),
    }
}

/// What to write for a required key that is absent.
fn missing_fix(field: &str) -> &'static str {
    match field {
        "name" => "add the job's name, for example `name: quickstart`",
        "data" => "add a `data` map with at least `sources`",
        "sources" => {
            "add the list of data sources, for example `sources: [{ uri: file:///data/train, format: parquet }]`"
        }
        "uri" => {
            "add the location, for example `uri: file:///data/train` or `uri: s3://bucket/prefix`"
        }
        "roles" => {
            "add at least one role, for example `roles: [{ name: worker, num: 1, command: [sluice, consume] }]`"
        }
        "command" => "add the command to run, as a list, for example `command: [python, train.py]`",
        "kind" => "add the launcher kind: local, kubernetes, slurm or external",
        _ => "add it",
    }
}

/// Suggests the closest allowed word, or lists the allowed ones.
pub(crate) fn suggest(word: &str, allowed: &[&str]) -> String {
    let best = allowed
        .iter()
        .map(|candidate| (edit_distance(word, candidate), *candidate))
        .min_by_key(|(distance, _)| *distance);
    match best {
        Some((distance, candidate)) if distance <= close_enough(word) => {
            format!("did you mean `{candidate}`?")
        }
        _ if allowed.is_empty() => "remove it: nothing is allowed here".to_owned(),
        _ => format!("use one of: {}", allowed.join(", ")),
    }
}

/// How many edits still count as a typo, by the word's length.
fn close_enough(word: &str) -> usize {
    (word.chars().count() / 3).max(1)
}

/// Levenshtein distance, in characters.
fn edit_distance(left: &str, right: &str) -> usize {
    let right_chars: Vec<char> = right.chars().collect();
    let mut previous: Vec<usize> = (0..=right_chars.len()).collect();
    let mut current = vec![0; right_chars.len() + 1];
    for (left_index, left_char) in left.chars().enumerate() {
        current[0] = left_index + 1;
        for (right_index, right_char) in right_chars.iter().enumerate() {
            let substitution = previous[right_index] + usize::from(left_char != *right_char);
            let deletion = previous[right_index + 1] + 1;
            let insertion = current[right_index] + 1;
            current[right_index + 1] = substitution.min(deletion).min(insertion);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[right_chars.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn suggest_picks_a_close_word_or_lists_all() {
        assert_eq!(
            suggest("heartbeat_timout_ms", &["heartbeat_timeout_ms", "restart"]),
            "did you mean `heartbeat_timeout_ms`?"
        );
        assert_eq!(
            suggest("zzz", &["local", "slurm"]),
            "use one of: local, slurm"
        );
    }
}
