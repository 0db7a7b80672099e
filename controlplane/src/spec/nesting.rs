//! A bound on how deep a YAML spec nests its flow collections (`{...}` and `[...]`), checked before
//! the YAML parser runs: the parser refuses more than 128 levels itself, but only after it read
//! them, in a time that grows with the square of the depth (40,000 levels of `{a: ` take seconds).
//!
//! # Implementation
//! A single pass counts the open brackets. Quoted scalars are skipped, so that brackets inside
//! strings do not count, but a quote opens one only where YAML starts a scalar (at the start of a
//! line or after indentation, or after `:`, `-`, `?`, `,`, `[` or `{` and spaces): a quote inside
//! a plain word such as `it's` opens nothing, for the scanner as for the parser, so it cannot hide
//! the brackets after it. Comments are skipped from a `#` that follows a space or starts a line.

/// The deepest nesting of flow collections a YAML spec may have: the YAML parser's own limit.
pub const MAX_FLOW_DEPTH: usize = 128;

/// Checks that `text` nests flow collections at most [`MAX_FLOW_DEPTH`] deep; the error names the
/// line where it goes deeper.
pub fn check_flow_depth(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut line = 1usize;
    // The last character that is not a space or a tab; a newline at the start of a line.
    let mut last = '\n';
    // Whether a space, a tab or the start of a line came right before.
    let mut spaced = true;
    let mut chars = text.chars().peekable();
    while let Some(character) = chars.next() {
        match character {
            '\n' => {
                line += 1;
                last = '\n';
                spaced = true;
                continue;
            }
            ' ' | '\t' => {
                spaced = true;
                continue;
            }
            '#' if spaced => {
                for skipped in chars.by_ref() {
                    if skipped == '\n' {
                        line += 1;
                        break;
                    }
                }
                last = '\n';
                continue;
            }
            '"' | '\'' if starts_a_scalar(last) => {
                skip_quoted(character, &mut chars, &mut line);
            }
            '{' | '[' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(format!(
                        "line {line}: `{{...}}` and `[...]` nest more than {MAX_FLOW_DEPTH} deep; write the nested values as indented blocks, or nest them less"
                    ));
                }
            }
            '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        last = character;
        spaced = false;
    }
    Ok(())
}

/// Whether a quote after `last` opens a quoted scalar.
fn starts_a_scalar(last: char) -> bool {
    matches!(last, '\n' | ':' | '-' | '?' | ',' | '[' | '{')
}

/// Skips a quoted scalar opened by `quote`, counting the lines it spans.
fn skip_quoted(
    quote: char,
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    line: &mut usize,
) {
    while let Some(character) = chars.next() {
        match character {
            '\n' => *line += 1,
            '\\' if quote == '"' => {
                let escaped = chars.next();
                *line += usize::from(escaped == Some('\n'));
            }
            '\'' if quote == '\'' => {
                if chars.peek() == Some(&'\'') {
                    chars.next();
                } else {
                    return;
                }
            }
            '"' if quote == '"' => return,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_in_quoted_strings_and_comments_do_not_count() {
        let text = format!(
            "name: \"{open}\"\nother: '{open}''s'\ncommand: [python, -c, \"print({open})\"] # {open}\n",
            open = "{[".repeat(200)
        );
        assert_eq!(check_flow_depth(&text), Ok(()));
    }

    #[test]
    fn nesting_past_the_limit_is_refused_naming_the_line() {
        let allowed = format!("a: {}1{}\n", "[".repeat(128), "]".repeat(128));
        assert_eq!(check_flow_depth(&allowed), Ok(()));
        let deep = format!("name: x\nroles: {}\n", "{a: ".repeat(40_000));
        let error = check_flow_depth(&deep).expect_err("too deep");
        assert!(
            error.starts_with("line 2:") && error.contains("128"),
            "{error}"
        );
    }

    #[test]
    fn a_spec_nested_past_the_limit_is_refused_before_the_yaml_parser_reads_it() {
        let text = format!("name: deep\nroles: {}\n", "{a: ".repeat(40_000));
        let error =
            crate::spec::JobSpec::parse(&text, crate::spec::Format::Yaml).expect_err("too deep");
        assert!(
            error.to_string().contains("nest more than 128 deep"),
            "{error}"
        );
    }

    #[test]
    fn a_quote_inside_a_word_hides_no_bracket() {
        for text in [
            format!("name: it's\nroles: {}", "{a: ".repeat(200)),
            format!("name: a\"b\nroles: {}", "[".repeat(200)),
            format!("name: x # it's\nroles: {}", "[".repeat(200)),
            format!("name: a#b\nroles: {}", "[".repeat(200)),
        ] {
            assert!(check_flow_depth(&text).is_err(), "{text:.40}");
        }
    }

    #[test]
    fn closing_brackets_in_quotes_do_not_lower_the_depth() {
        let text = format!("a: {}\"{}\"", "[".repeat(100), "]".repeat(100));
        let deeper = format!("{text}, {}", "[".repeat(100));
        assert!(check_flow_depth(&deeper).is_err());
    }
}
