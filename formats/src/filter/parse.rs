//! The lexer and the recursive-descent parser of the filter language (see the grammar in the module
//! [`crate::filter`]).

use super::ast::{CompareOp, Expr, Literal};
use super::{MAX_FILTER_DEPTH, MAX_FILTER_TERMS};
use crate::error::{FormatError, Result};

impl Expr {
    /// Parses a filter expression.
    ///
    /// # Errors
    ///
    /// Returns [`FormatError::FilterSyntax`] with the byte position of the first error.
    pub fn parse(text: &str) -> Result<Self> {
        Parser::new(text)?.parse_all()
    }
}

pub(super) fn is_identifier_char(character: char) -> bool {
    character.is_ascii_alphanumeric() || matches!(character, '_' | '.' | '$')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keyword {
    And,
    Or,
    Not,
    In,
    Is,
    Null,
    True,
    False,
}

pub(super) fn keyword(word: &str) -> Option<Keyword> {
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
    /// Parentheses and `not`s open around the cursor.
    depth: usize,
    /// Comparisons parsed so far.
    terms: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Result<Self> {
        let tokens = lex(text)?;
        Ok(Self {
            text,
            tokens,
            cursor: 0,
            depth: 0,
            terms: 0,
        })
    }

    /// Opens one more level of parentheses or `not`.
    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_FILTER_DEPTH {
            return Err(FormatError::FilterTooLarge {
                what: format!("nests parentheses and `not` more than {MAX_FILTER_DEPTH} deep"),
                fix: "write it with fewer levels (`not (a and b)` is `not a or not b`)".to_owned(),
            });
        }
        Ok(())
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
            self.enter()?;
            let inner = self.parse_unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        if self.peek().1 == Token::LeftParen {
            self.advance();
            self.enter()?;
            let inner = self.parse_or()?;
            self.depth -= 1;
            self.expect(&Token::RightParen, "\")\"")?;
            return Ok(inner);
        }
        self.terms += 1;
        if self.terms > MAX_FILTER_TERMS {
            return Err(FormatError::FilterTooLarge {
                what: format!("holds more than {MAX_FILTER_TERMS} comparisons"),
                fix: "compare a column with a list of values as `column in (v1, v2, ...)`, or filter the data before the job".to_owned(),
            });
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
                } else {
                    match number.parse::<f64>() {
                        Ok(float) if float.is_finite() => Literal::Float(float),
                        Ok(_) => {
                            return Err(error(
                                start,
                                format!(
                                    "number {number} is beyond the range of a 64-bit float (about 1.8e308); write a smaller one"
                                ),
                            ));
                        }
                        Err(_) => return Err(error(start, format!("invalid number {number:?}"))),
                    }
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
    use proptest::prelude::*;

    #[test]
    fn a_filter_too_deep_or_too_long_is_refused_naming_the_limit() {
        let deep = format!("{}id = 1{}", "(".repeat(200_000), ")".repeat(200_000));
        let nots = format!("{}id = 1", "not ".repeat(200_000));
        let chain = vec!["id = 1"; 100_000].join(" and ");
        for (text, limit) in [
            (&deep, "64 deep"),
            (&nots, "64 deep"),
            (&chain, "1024 comparisons"),
        ] {
            let message = Expr::parse(text).expect_err("too large").to_string();
            assert!(message.contains(limit), "{message}");
            assert!(
                message.len() < 300,
                "the message does not repeat the filter: {message}"
            );
        }
        let deepest = format!("{}id = 1{}", "(".repeat(64), ")".repeat(64));
        Expr::parse(&deepest).expect("64 levels parse");
        let longest = vec!["id = 1"; 1024].join(" or ");
        Expr::parse(&longest).expect("1024 comparisons parse");
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
    fn a_number_beyond_the_float_range_is_an_error_naming_it() {
        for text in ["x < 1e999", "x < -4371159928937E296", "x in (1, 1e309)"] {
            match Expr::parse(text) {
                Err(FormatError::FilterSyntax {
                    position, message, ..
                }) => {
                    assert!(message.contains("beyond the range"), "{text}: {message}");
                    assert!(
                        text[position..].starts_with(['1', '-']),
                        "{text}: {position}"
                    );
                }
                other => panic!("{text}: expected a syntax error, got {other:?}"),
            }
        }
    }

    fn any_column() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_][a-z0-9_.$]{0,6}",
            "\\PC{0,6}",
            Just("AND".to_string()),
            Just("\"".to_string()),
        ]
    }

    fn any_literal() -> impl Strategy<Value = Literal> {
        use proptest::num::f64::{NEGATIVE, NORMAL, POSITIVE, SUBNORMAL, ZERO};
        prop_oneof![
            any::<i64>().prop_map(Literal::Int),
            (POSITIVE | NEGATIVE | NORMAL | SUBNORMAL | ZERO).prop_map(Literal::Float),
            "\\PC{0,6}".prop_map(Literal::Str),
            Just(Literal::Str("it's".to_string())),
            any::<bool>().prop_map(Literal::Bool),
        ]
    }

    fn any_op() -> impl Strategy<Value = CompareOp> {
        prop_oneof![
            Just(CompareOp::Eq),
            Just(CompareOp::NotEq),
            Just(CompareOp::Lt),
            Just(CompareOp::LtEq),
            Just(CompareOp::Gt),
            Just(CompareOp::GtEq),
        ]
    }

    /// Filters within the limits: at most 8 levels deep.
    fn any_expr() -> impl Strategy<Value = Expr> {
        let predicate =
            prop_oneof![
                (any_column(), any_op(), any_literal())
                    .prop_map(|(column, op, value)| Expr::Compare { column, op, value }),
                (
                    any_column(),
                    proptest::collection::vec(any_literal(), 1..4),
                    any::<bool>()
                )
                    .prop_map(|(column, values, negated)| Expr::InList {
                        column,
                        values,
                        negated
                    }),
                (any_column(), any::<bool>())
                    .prop_map(|(column, negated)| Expr::IsNull { column, negated }),
            ];
        predicate.prop_recursive(8, 48, 2, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone())
                    .prop_map(|(left, right)| Expr::And(Box::new(left), Box::new(right))),
                (inner.clone(), inner.clone())
                    .prop_map(|(left, right)| Expr::Or(Box::new(left), Box::new(right))),
                inner.prop_map(|inner| Expr::Not(Box::new(inner))),
            ]
        })
    }

    /// Text made of the language's tokens and a few bytes outside it, so that most inputs get past
    /// the lexer and into the parser.
    fn any_token_text() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            proptest::sample::select(vec![
                "(",
                ")",
                ",",
                "=",
                "==",
                "!=",
                "<>",
                "<",
                "<=",
                ">",
                ">=",
                "!",
                " and ",
                " or ",
                "not ",
                " in ",
                " is ",
                "null",
                "true",
                "FALSE",
                "'",
                "\"",
                "''",
                "-",
                ".",
                "e",
                "1e",
                "-9223372036854775808",
                "9223372036854775808",
                "1.5e-3",
                "0x1",
                "id",
                "é",
                " ",
                "\t",
                "$x",
            ])
            .prop_map(str::to_string),
            "\\PC{0,3}",
        ];
        proptest::collection::vec(token, 0..48).prop_map(|tokens| tokens.concat())
    }

    /// Asserts that parsing `text` gives a filter that prints back to one that parses to itself,
    /// or an error of the filter language pointing inside the text.
    fn parses_or_fails_cleanly(text: &str) -> std::result::Result<(), TestCaseError> {
        match Expr::parse(text) {
            Ok(expr) => {
                let printed = expr.to_string();
                prop_assert_eq!(
                    Expr::parse(&printed).ok(),
                    Some(expr),
                    "printed as {}",
                    printed
                );
            }
            Err(FormatError::FilterSyntax {
                position,
                expression,
                ..
            }) => {
                prop_assert!(
                    position <= text.len(),
                    "position {} in {:?}",
                    position,
                    text
                );
                prop_assert_eq!(expression, text);
            }
            Err(FormatError::FilterTooLarge { .. }) => {}
            Err(other) => prop_assert!(false, "another error: {}", other),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// A filter prints as text that parses back to the same filter.
        #[test]
        fn printed_filters_parse_back_to_themselves(sut in any_expr()) {
            let printed = sut.to_string();
            prop_assert_eq!(Expr::parse(&printed).ok(), Some(sut), "printed as {}", printed);
        }

        /// A printed filter with characters deleted, inserted or swapped parses to a filter that
        /// round-trips or fails with an error of the filter language.
        #[test]
        fn edited_filters_parse_or_fail_cleanly(
            expr in any_expr(),
            edits in proptest::collection::vec(
                (any::<proptest::sample::Index>(), 0u8..3, proptest::char::any()),
                1..6,
            ),
        ) {
            let mut characters: Vec<char> = expr.to_string().chars().collect();
            for (at, edit, character) in edits {
                let index = at.index(characters.len() + 1);
                match edit {
                    0 if index < characters.len() => {
                        characters.remove(index);
                    }
                    1 if index < characters.len() => characters[index] = character,
                    _ => characters.insert(index, character),
                }
            }
            let text: String = characters.into_iter().collect();
            parses_or_fails_cleanly(&text)?;
        }

        /// Any text, of the language's tokens or not, parses or fails with an error of the filter
        /// language.
        #[test]
        fn any_text_parses_or_fails_cleanly(
            text in prop_oneof![any_token_text(), "\\PC{0,64}", ".{0,64}"],
        ) {
            parses_or_fails_cleanly(&text)?;
        }
    }
}
