//! `${NAME}` in a spec's text: replaced by the environment variable `NAME` before parsing, so one
//! spec serves several machines (`file://${HOME}/data`). `$${` writes a literal `${`.

use super::error::SpecError;

/// Replaces every `${NAME}` of `text` with `lookup(NAME)`.
pub(crate) fn expand(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, SpecError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(literal) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(reference) = tail.strip_prefix("${") {
            let end = reference.find('}').ok_or_else(|| SpecError::Variable {
                name: reference.chars().take(20).collect(),
                problem: "has no closing `}`".to_owned(),
            })?;
            let name = &reference[..end];
            let valid = name
                .chars()
                .next()
                .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
                && name
                    .chars()
                    .all(|char| char.is_ascii_alphanumeric() || char == '_');
            if !valid {
                return Err(SpecError::Variable {
                    name: name.to_owned(),
                    problem: "is not a variable name (letters, digits and `_`)".to_owned(),
                });
            }
            let value = lookup(name).ok_or_else(|| SpecError::Variable {
                name: name.to_owned(),
                problem: "is not set in the environment".to_owned(),
            })?;
            out.push_str(&value);
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<String> {
        (name == "HOME").then(|| "/home/ada".to_owned())
    }

    #[test]
    fn variables_are_replaced_and_other_dollars_kept() {
        assert_eq!(
            expand("uri: file://${HOME}/data # costs $5, $$x, $${HOME}", lookup).expect("expands"),
            "uri: file:///home/ada/data # costs $5, $$x, ${HOME}"
        );
    }

    #[test]
    fn an_unset_unclosed_or_malformed_variable_is_named() {
        let message = |text| expand(text, lookup).expect_err("refused").to_string();
        assert_eq!(
            message("a: ${DATA_DIR}/x"),
            "job spec: `${DATA_DIR}` is not set in the environment; set it, or write the value in the spec (`$${` writes a literal `${`)"
        );
        assert!(message("a: ${HOME").contains("`${HOME}` has no closing `}`"));
        assert!(message("a: ${1X}").contains("is not a variable name"));
    }
}
