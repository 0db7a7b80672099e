//! A format-neutral document tree and a serde deserializer over it that records key paths.
//!
//! # Implementation
//! Each accepted format (YAML, TOML, JSON) is first parsed into a [`Node`] through that format's own
//! serde deserializer, so syntax errors keep the format's line and column. The typed raw structs are then
//! deserialized from the [`Node`] with [`from_node`], whose error type [`TreeError`] keeps the structure
//! that serde hands to `unknown_field`, `missing_field`, `invalid_type` and `unknown_variant`, plus the
//! key path (`failover.heartbeat_timeout_ms`, `data.sources[0].uri`) where it happened. The path is built
//! on the way out: each map or sequence level prepends its key or index to an error that passes through
//! it. One deserializer for all three formats means one set of rules and one set of messages.

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// One value of a parsed spec document, whatever format it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Keys in document order; duplicates are rejected while parsing.
    Map(Vec<(String, Node)>),
}

impl Node {
    /// Describes the value's kind for "expected X, found Y" messages.
    fn unexpected(&self) -> de::Unexpected<'_> {
        match self {
            Node::Null => de::Unexpected::Unit,
            Node::Bool(value) => de::Unexpected::Bool(*value),
            Node::Int(value) => de::Unexpected::Signed(*value),
            Node::UInt(value) => de::Unexpected::Unsigned(*value),
            Node::Float(value) => de::Unexpected::Float(*value),
            Node::Str(value) => de::Unexpected::Str(value),
            Node::Seq(_) => de::Unexpected::Seq,
            Node::Map(_) => de::Unexpected::Map,
        }
    }
}

impl<'de> de::Deserialize<'de> for Node {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a spec value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Node, E> {
        Ok(Node::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Node, E> {
        Ok(Node::Int(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Node, E> {
        Ok(Node::UInt(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Node, E> {
        Ok(Node::Float(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Node, E> {
        Ok(Node::Str(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Node, E> {
        Ok(Node::Str(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = access.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Node, A::Error> {
        let mut entries: Vec<(String, Node)> = Vec::new();
        while let Some(key) = access.next_key::<Node>()? {
            let key = match key {
                Node::Str(key) => key,
                Node::Int(key) => key.to_string(),
                Node::UInt(key) => key.to_string(),
                other => {
                    return Err(de::Error::custom(format_args!(
                        "a map key must be a string, found {}",
                        other.unexpected()
                    )));
                }
            };
            if entries.iter().any(|(existing, _)| *existing == key) {
                return Err(de::Error::custom(format_args!(
                    "key `{key}` appears twice in the same map; keep one"
                )));
            }
            let value = access.next_value::<Node>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathSegment {
    Key(String),
    Index(usize),
}

/// Renders a key path as `data.sources[0].uri`.
pub(crate) fn render_path(segments: &[PathSegment]) -> String {
    let mut rendered = String::new();
    for segment in segments {
        match segment {
            PathSegment::Key(key) => {
                if !rendered.is_empty() {
                    rendered.push('.');
                }
                rendered.push_str(key);
            }
            PathSegment::Index(index) => {
                rendered.push_str(&format!("[{index}]"));
            }
        }
    }
    rendered
}

/// What went wrong while mapping the tree onto the raw structs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TreeErrorKind {
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    MissingField {
        field: &'static str,
    },
    UnknownVariant {
        variant: String,
        expected: &'static [&'static str],
    },
    InvalidType {
        found: String,
        expected: String,
    },
    InvalidValue {
        found: String,
        expected: String,
    },
    Other(String),
}

/// A deserialization error with the key path where it happened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TreeError {
    /// Outermost segment first once the error has left [`from_node`].
    pub(crate) path: Vec<PathSegment>,
    pub(crate) kind: TreeErrorKind,
}

impl TreeError {
    fn new(kind: TreeErrorKind) -> Self {
        Self {
            path: Vec::new(),
            kind,
        }
    }

    /// Prepends one level of path; called while the error travels outwards.
    fn within(mut self, segment: PathSegment) -> Self {
        self.path.insert(0, segment);
        self
    }
}

impl fmt::Display for TreeError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: {:?}", render_path(&self.path), self.kind)
    }
}

impl std::error::Error for TreeError {}

impl de::Error for TreeError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Self::new(TreeErrorKind::Other(message.to_string()))
    }

    fn invalid_type(unexpected: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Self::new(TreeErrorKind::InvalidType {
            found: unexpected.to_string(),
            expected: expected.to_string(),
        })
    }

    fn invalid_value(unexpected: de::Unexpected<'_>, expected: &dyn de::Expected) -> Self {
        Self::new(TreeErrorKind::InvalidValue {
            found: unexpected.to_string(),
            expected: expected.to_string(),
        })
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        Self::new(TreeErrorKind::UnknownVariant {
            variant: variant.to_owned(),
            expected,
        })
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::new(TreeErrorKind::UnknownField {
            field: field.to_owned(),
            expected,
        })
    }

    fn missing_field(field: &'static str) -> Self {
        Self::new(TreeErrorKind::MissingField { field })
    }
}

/// Deserializes `T` from a tree, with errors that carry their key path.
pub(crate) fn from_node<T: de::DeserializeOwned>(node: Node) -> Result<T, TreeError> {
    T::deserialize(node)
}

impl<'de> IntoDeserializer<'de, TreeError> for Node {
    type Deserializer = Node;

    fn into_deserializer(self) -> Node {
        self
    }
}

impl<'de> de::Deserializer<'de> for Node {
    type Error = TreeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        match self {
            Node::Null => visitor.visit_unit(),
            Node::Bool(value) => visitor.visit_bool(value),
            Node::Int(value) => visitor.visit_i64(value),
            Node::UInt(value) => visitor.visit_u64(value),
            Node::Float(value) => visitor.visit_f64(value),
            Node::Str(value) => visitor.visit_string(value),
            Node::Seq(items) => visitor.visit_seq(SeqWalker {
                items: items.into_iter().enumerate(),
            }),
            Node::Map(entries) => visitor.visit_map(MapWalker {
                entries: entries.into_iter(),
                pending: None,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TreeError> {
        match self {
            Node::Null => visitor.visit_none(),
            other => visitor.visit_some(other),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TreeError> {
        match self {
            Node::Str(value) => visitor.visit_enum(value.into_deserializer()),
            other => Err(de::Error::invalid_type(other.unexpected(), &"a string")),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TreeError> {
        visitor.visit_newtype_struct(self)
    }

    /// Structs are written as maps only; serde would also accept a list of their fields in order,
    /// which hides mistakes in a spec.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TreeError> {
        match self {
            Node::Map(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(
                other.unexpected(),
                &"a map of keys",
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct SeqWalker {
    items: std::iter::Enumerate<std::vec::IntoIter<Node>>,
}

impl<'de> SeqAccess<'de> for SeqWalker {
    type Error = TreeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, TreeError> {
        match self.items.next() {
            None => Ok(None),
            Some((index, item)) => seed
                .deserialize(item)
                .map(Some)
                .map_err(|error| error.within(PathSegment::Index(index))),
        }
    }
}

struct MapWalker {
    entries: std::vec::IntoIter<(String, Node)>,
    pending: Option<(String, Node)>,
}

impl<'de> MapAccess<'de> for MapWalker {
    type Error = TreeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, TreeError> {
        match self.entries.next() {
            None => Ok(None),
            Some((key, value)) => {
                let key_deserializer: de::value::StrDeserializer<'_, TreeError> =
                    key.as_str().into_deserializer();
                let decoded = seed.deserialize(key_deserializer)?;
                self.pending = Some((key, value));
                Ok(Some(decoded))
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, TreeError> {
        match self.pending.take() {
            Some((key, value)) => seed
                .deserialize(value)
                .map_err(|error| error.within(PathSegment::Key(key))),
            None => Err(de::Error::custom(
                "a map value was asked for before its key",
            )),
        }
    }
}
