//! A bound on the flow collections (`{...}` and `[...]`) of a YAML spec, checked before the YAML
//! parser runs: the parser refuses more than 128 levels of nesting itself, but only after it read
//! them, in a time that grows with the square of the depth (40,000 levels of `{a: ` take seconds).
//!
//! # Implementation
//! Every `{` and `[` of the text is counted, in quoted strings and comments too. A collection nests
//! inside another only by opening with one of them, so the count bounds the depth whatever the text
//! holds, and no quoting can hide brackets from it, as a scanner that tried to follow YAML's rules
//! for quotes could be led to. The bound is far above what a spec writes: flow collections are
//! short, and a large spec writes its lists and maps as indented blocks.

/// The most `{` and `[` a YAML spec may hold, so that it nests no deeper: the YAML parser reads
/// this depth in a fraction of a second.
pub const MAX_FLOW_OPENINGS: usize = 4_096;

/// Checks that `text` holds at most [`MAX_FLOW_OPENINGS`] `{` and `[`; the error names the line of
/// the first past the bound.
pub fn check_flow_openings(text: &str) -> Result<(), String> {
    let mut openings = 0usize;
    for (index, line) in text.lines().enumerate() {
        openings += line
            .bytes()
            .filter(|byte| matches!(byte, b'{' | b'['))
            .count();
        if openings > MAX_FLOW_OPENINGS {
            return Err(format!(
                "line {}: the spec holds more than {MAX_FLOW_OPENINGS} `{{` and `[`, which bounds how deep `{{...}}` and `[...]` can nest; write lists and maps as indented blocks",
                index + 1
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_past_the_bound_are_refused_naming_the_line() {
        let allowed = format!(
            "a: {}1{}\n",
            "[".repeat(MAX_FLOW_OPENINGS),
            "]".repeat(MAX_FLOW_OPENINGS)
        );
        assert_eq!(check_flow_openings(&allowed), Ok(()));
        let many = format!(
            "name: x\nsources:\n{}",
            "  - { uri: a }\n".repeat(MAX_FLOW_OPENINGS + 1)
        );
        let error = check_flow_openings(&many).expect_err("too many");
        assert!(
            error.starts_with(&format!("line {}:", MAX_FLOW_OPENINGS + 3))
                && error.contains("4096"),
            "{error}"
        );
    }

    #[test]
    fn no_quote_or_comment_hides_an_opening() {
        for prefix in [
            "name: it's\n",
            "name: a,'b\n",
            "name: a-'b\n",
            "name: \"b\n",
            "# it's \"\n",
        ] {
            let text = format!("{prefix}roles: {}\n", "{a: ".repeat(MAX_FLOW_OPENINGS + 1));
            assert!(check_flow_openings(&text).is_err(), "{prefix:?}");
        }
    }

    #[test]
    fn a_spec_nested_deeper_than_the_bound_is_refused_before_the_yaml_parser_reads_it() {
        let text = format!("name: deep\nroles: {}\n", "{a: ".repeat(40_000));
        let error =
            crate::spec::JobSpec::parse(&text, crate::spec::Format::Yaml).expect_err("too deep");
        assert!(
            error.to_string().contains("more than 4096 `{` and `[`"),
            "{error}"
        );
    }
}
