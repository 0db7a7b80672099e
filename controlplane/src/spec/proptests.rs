//! Property tests of the spec loader: the example specs with lines and values changed, and any
//! text in each format, load or fail with a [`SpecError`], and never panic.

use proptest::prelude::*;

use super::*;

/// The example specs, with their `${NAME}` references written literally, so that loading them does
/// not depend on the environment.
fn examples() -> Vec<String> {
    [
        include_str!("../../../examples/quickstart.yaml"),
        include_str!("../../../examples/s3.yaml"),
        include_str!("../../../examples/delta.yaml"),
        include_str!("../../../examples/torch.yaml"),
        include_str!("../../../examples/kubernetes.yaml"),
    ]
    .iter()
    .map(|text| text.replace("${", "$${"))
    .collect()
}

/// Values that YAML, the tree and the validation each read in their own way.
const VALUES: &[&str] = &[
    "",
    "-1",
    "0",
    "1e400",
    "18446744073709551616",
    "4294967296",
    "null",
    "~",
    "[]",
    "{}",
    "&anchor x",
    "*anchor",
    "!!binary aGk=",
    "!custom 1",
    "'",
    "\"",
    "${SLUICE_UNSET_VARIABLE}",
    "$${",
    "true",
    "0x10",
    ".inf",
    "-.nan",
    "[[[[",
    "|",
    ">-",
    "? complex",
    "\t",
    "id > 1 and (",
];

/// A change to one line of a spec.
#[derive(Debug, Clone)]
enum LineEdit {
    Delete,
    Duplicate,
    SwapWithNext,
    Indent,
    Outdent,
    /// The text after the line's first `: ` (or the whole line) replaced.
    Value(&'static str),
    /// A character inserted.
    Insert(prop::sample::Index, char),
}

fn any_line_edit() -> impl Strategy<Value = LineEdit> {
    prop_oneof![
        Just(LineEdit::Delete),
        Just(LineEdit::Duplicate),
        Just(LineEdit::SwapWithNext),
        Just(LineEdit::Indent),
        Just(LineEdit::Outdent),
        prop::sample::select(VALUES).prop_map(LineEdit::Value),
        (any::<prop::sample::Index>(), any::<char>())
            .prop_map(|(at, character)| LineEdit::Insert(at, character)),
    ]
}

fn edit_lines(text: &str, edits: &[(prop::sample::Index, LineEdit)]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (at, edit) in edits {
        if lines.is_empty() {
            break;
        }
        let index = at.index(lines.len());
        match edit {
            LineEdit::Delete => {
                lines.remove(index);
            }
            LineEdit::Duplicate => lines.insert(index, lines[index].clone()),
            LineEdit::SwapWithNext if index + 1 < lines.len() => lines.swap(index, index + 1),
            LineEdit::SwapWithNext => {}
            LineEdit::Indent => lines[index].insert_str(0, "  "),
            LineEdit::Outdent => {
                let line = &lines[index];
                lines[index] = line.strip_prefix("  ").unwrap_or(line).to_string();
            }
            LineEdit::Value(value) => {
                let line = &mut lines[index];
                let start = line.find(": ").map_or(0, |colon| colon + 2);
                line.replace_range(start.., value);
            }
            LineEdit::Insert(at, character) => {
                let line = &mut lines[index];
                let boundaries: Vec<usize> = line
                    .char_indices()
                    .map(|(offset, _)| offset)
                    .chain([line.len()])
                    .collect();
                line.insert(boundaries[at.index(boundaries.len())], *character);
            }
        }
    }
    lines.join("\n")
}

/// Loads `text`: a spec or a [`SpecError`] with a message.
fn loads_or_fails_cleanly(text: &str, format: Format) -> std::result::Result<(), TestCaseError> {
    if let Err(error) = JobSpec::parse(text, format) {
        prop_assert!(!error.to_string().is_empty());
    }
    Ok(())
}

#[test]
fn the_examples_load() {
    for (index, text) in examples().iter().enumerate() {
        JobSpec::parse(text, Format::Yaml)
            .unwrap_or_else(|error| panic!("example {index}: {error}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// An example spec with lines deleted, repeated, moved, indented or given other values loads
    /// or fails with a spec error.
    #[test]
    fn an_edited_example_loads_or_fails_cleanly(
        example in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any_line_edit()), 1..6),
    ) {
        let examples = examples();
        let text = edit_lines(&examples[example.index(examples.len())], &edits);
        loads_or_fails_cleanly(&text, Format::Yaml)?;
    }

    /// An example spec as JSON, with characters changed, loads or fails with a spec error.
    #[test]
    fn an_edited_json_example_loads_or_fails_cleanly(
        example in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..6),
    ) {
        let examples = examples();
        let document: serde_json::Value =
            serde_norway::from_str(&examples[example.index(examples.len())]).expect("yaml");
        let mut characters: Vec<char> = document.to_string().chars().collect();
        for (at, character) in edits {
            let index = at.index(characters.len());
            characters[index] = character;
        }
        loads_or_fails_cleanly(&characters.into_iter().collect::<String>(), Format::Json)?;
    }

    /// Any text, and deeply nested text, in each format loads or fails with a spec error.
    #[test]
    fn any_text_loads_or_fails_cleanly(
        text in prop_oneof![
            "\\PC{0,200}",
            prop::collection::vec(prop::sample::select(VALUES), 0..24).prop_map(|values| values.join("\n")),
            (0usize..2_000, prop::sample::select(vec!["[", "{a: ", "- ", "a = [", "{\"a\":"]))
                .prop_map(|(depth, opening)| opening.repeat(depth)),
        ],
        format in prop_oneof![Just(Format::Yaml), Just(Format::Toml), Just(Format::Json)],
    ) {
        loads_or_fails_cleanly(&text, format)?;
    }
}
