//! Parquet files whose footers lie, made from honest ones: the footer (Thrift's compact protocol) is
//! decoded into a tree of Thrift values, a field is set, and the tree is encoded back in place of the
//! old footer, with the footer's length after it. The pages are left as they were, so a file says
//! one thing in its footer and holds another in its pages.
//!
//! The field ids are Parquet's (`parquet.thrift`): [`file_field`], [`row_group_field`] and
//! [`column_field`] name the ones the tests set.

use std::path::Path;

/// Ids of `FileMetaData`'s fields.
pub mod file_field {
    /// `num_rows: i64`.
    pub const NUM_ROWS: i16 = 3;
    /// `row_groups: list<RowGroup>`.
    pub const ROW_GROUPS: i16 = 4;
}

/// Ids of `RowGroup`'s fields.
pub mod row_group_field {
    /// `columns: list<ColumnChunk>`.
    pub const COLUMNS: i16 = 1;
    /// `num_rows: i64`.
    pub const NUM_ROWS: i16 = 3;
}

/// Ids of `ColumnChunk`'s and `ColumnMetaData`'s fields.
pub mod column_field {
    /// `ColumnChunk.meta_data: ColumnMetaData`.
    pub const META_DATA: i16 = 3;
    /// `ColumnMetaData.num_values: i64`.
    pub const NUM_VALUES: i16 = 5;
    /// `ColumnMetaData.total_compressed_size: i64`.
    pub const TOTAL_COMPRESSED_SIZE: i16 = 7;
    /// `ColumnMetaData.data_page_offset: i64`.
    pub const DATA_PAGE_OFFSET: i16 = 9;
}

/// One value of Thrift's compact protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A boolean field, or a boolean element of a collection (its byte as written).
    Bool(bool),
    /// `byte`.
    Byte(i8),
    /// `i16`.
    I16(i16),
    /// `i32`.
    I32(i32),
    /// `i64`.
    I64(i64),
    /// `double`, as its bits.
    Double(u64),
    /// `binary` and `string`.
    Binary(Vec<u8>),
    /// `list` (or `set`, with `set` true): the element type and the elements.
    List {
        /// Whether the collection is a set.
        set: bool,
        /// The compact type of the elements.
        element_type: u8,
        /// The elements.
        elements: Vec<Value>,
    },
    /// `map`: the key and value types and the entries.
    Map {
        /// The compact types of the keys and of the values.
        types: (u8, u8),
        /// The entries.
        entries: Vec<(Value, Value)>,
    },
    /// A struct: its fields, by id, in the order written.
    Struct(Vec<(i16, Value)>),
}

impl Value {
    /// The field `id` of a struct.
    pub fn field_mut(&mut self, id: i16) -> Option<&mut Value> {
        match self {
            Value::Struct(fields) => fields
                .iter_mut()
                .find(|(field, _)| *field == id)
                .map(|(_, value)| value),
            _ => None,
        }
    }

    /// The element `index` of a list.
    pub fn element_mut(&mut self, index: usize) -> Option<&mut Value> {
        match self {
            Value::List { elements, .. } => elements.get_mut(index),
            _ => None,
        }
    }

    /// The value at `path` from this struct: field ids, and after a list field the index of an
    /// element.
    ///
    /// # Panics
    ///
    /// Panics when the path leads nowhere, naming where it stopped.
    pub fn at(&mut self, path: &[Step]) -> &mut Value {
        let mut value = self;
        for (depth, step) in path.iter().enumerate() {
            let next = match step {
                Step::Field(id) => value.field_mut(*id),
                Step::Element(index) => value.element_mut(*index),
            };
            value = next.unwrap_or_else(|| panic!("the footer has no {:?}", &path[..=depth]));
        }
        value
    }
}

/// One step of a path into a footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A field of a struct, by id.
    Field(i16),
    /// An element of a list, by index.
    Element(usize),
}

/// The path of a row group's field in a `FileMetaData`.
pub fn row_group_path(group: usize, field: i16) -> Vec<Step> {
    vec![
        Step::Field(file_field::ROW_GROUPS),
        Step::Element(group),
        Step::Field(field),
    ]
}

/// The path of a `ColumnMetaData` field of a column chunk in a `FileMetaData`.
pub fn column_path(group: usize, column: usize, field: i16) -> Vec<Step> {
    vec![
        Step::Field(file_field::ROW_GROUPS),
        Step::Element(group),
        Step::Field(row_group_field::COLUMNS),
        Step::Element(column),
        Step::Field(column_field::META_DATA),
        Step::Field(field),
    ]
}

/// Rewrites the footer of the Parquet file at `path` with `edit`, leaving its pages as they are.
///
/// # Panics
///
/// Panics when the file is not a Parquet file with a plain footer, or cannot be rewritten.
pub fn rewrite_footer(path: &Path, edit: impl FnOnce(&mut Value)) {
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let rewritten = rewritten_footer(&bytes, edit)
        .unwrap_or_else(|error| panic!("{} is not a plain Parquet file: {error}", path.display()));
    std::fs::write(path, rewritten).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
}

/// Sets the `i64` fields at `paths` to their values in the footer of the Parquet file at `path`.
///
/// # Panics
///
/// As [`rewrite_footer`], and when a path does not lead to an `i64`.
pub fn set_footer_i64(path: &Path, fields: &[(Vec<Step>, i64)]) {
    rewrite_footer(path, |footer| {
        for (at, value) in fields {
            match footer.at(at) {
                Value::I64(old) => *old = *value,
                other => panic!("{at:?} holds {other:?}, not an i64"),
            }
        }
    });
}

/// Writes an honest Parquet file at `path`: `rows` rows in row groups of `group_rows`, with the
/// columns `id` (0 on, `int64`) and `label` (the id modulo 10, `int64`), uncompressed.
///
/// # Panics
///
/// Panics when the file cannot be written.
pub fn honest_parquet(path: &Path, rows: i64, group_rows: i64) {
    use parquet::data_type::Int64Type;
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    let schema = std::sync::Arc::new(
        parse_message_type("message lying { required int64 id; required int64 label; }")
            .expect("a schema"),
    );
    let properties = std::sync::Arc::new(WriterProperties::builder().build());
    let file = std::fs::File::create(path)
        .unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
    let mut writer = SerializedFileWriter::new(file, schema, properties).expect("a writer");
    let mut first = 0i64;
    while first < rows {
        let ids: Vec<i64> = (first..rows.min(first + group_rows)).collect();
        let labels: Vec<i64> = ids.iter().map(|id| id % 10).collect();
        let mut group = writer.next_row_group().expect("a row group");
        for values in [&ids, &labels] {
            let mut column = group.next_column().expect("a column").expect("two columns");
            column
                .typed::<Int64Type>()
                .write_batch(values, None, None)
                .expect("values written");
            column.close().expect("column closed");
        }
        group.close().expect("row group closed");
        first += group_rows;
    }
    writer.close().expect("file closed");
}

/// Makes row group `group` of the Parquet file at `path` claim `rows` rows, and the file the sum
/// of its row groups' rows; with `values`, makes each of the group's column chunks claim that many
/// values too, so that the footer agrees with itself and only the pages tell the truth.
///
/// # Panics
///
/// As [`rewrite_footer`].
pub fn claim_rows(path: &Path, group: usize, rows: i64, values: Option<i64>) {
    rewrite_footer(path, |footer| {
        match footer.at(&row_group_path(group, row_group_field::NUM_ROWS)) {
            Value::I64(claimed) => *claimed = rows,
            other => panic!("num_rows holds {other:?}"),
        }
        let mut total = 0i64;
        let mut columns = 0;
        if let Some(Value::List { elements, .. }) = footer.field_mut(file_field::ROW_GROUPS) {
            for row_group in elements.iter_mut() {
                if let Some(Value::I64(group_rows)) = row_group.field_mut(row_group_field::NUM_ROWS)
                {
                    total = total.saturating_add(*group_rows);
                }
            }
            if let Some(Value::List { elements, .. }) = elements
                .get_mut(group)
                .and_then(|row_group| row_group.field_mut(row_group_field::COLUMNS))
            {
                columns = elements.len();
            }
        }
        match footer.at(&[Step::Field(file_field::NUM_ROWS)]) {
            Value::I64(file_rows) => *file_rows = total,
            other => panic!("num_rows holds {other:?}"),
        }
        if let Some(values) = values {
            for column in 0..columns {
                match footer.at(&column_path(group, column, column_field::NUM_VALUES)) {
                    Value::I64(claimed) => *claimed = values,
                    other => panic!("num_values holds {other:?}"),
                }
            }
        }
    });
}

/// The file's bytes with its footer decoded, edited by `edit` and encoded again.
///
/// # Errors
///
/// Returns what is wrong with the file's framing or its footer's encoding.
pub fn rewritten_footer(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Result<Vec<u8>, String> {
    let tail = bytes
        .len()
        .checked_sub(8)
        .filter(|_| bytes.ends_with(b"PAR1"))
        .ok_or("no PAR1 at its end")?;
    let length = u32::from_le_bytes(bytes[tail..tail + 4].try_into().map_err(|_| "short")?);
    let start = tail
        .checked_sub(length as usize)
        .ok_or("a footer longer than the file")?;
    let mut reader = Reader {
        bytes: &bytes[start..tail],
        at: 0,
    };
    let mut footer = reader.structure()?;
    edit(&mut footer);
    let mut encoded = Vec::new();
    write_value(&mut encoded, &footer);
    let mut out = bytes[..start].to_vec();
    out.extend_from_slice(&encoded);
    let length = u32::try_from(encoded.len()).map_err(|_| "a footer over 4 GiB")?;
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(b"PAR1");
    Ok(out)
}

const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| format!("the footer ends at byte {}", self.at))?;
        self.at += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("a varint longer than 10 bytes at byte {}", self.at))
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let raw = self.varint()?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    fn value(&mut self, kind: u8) -> Result<Value, String> {
        Ok(match kind {
            BOOL_TRUE | BOOL_FALSE => Value::Bool(self.byte()? == BOOL_TRUE),
            BYTE => Value::Byte(self.byte()? as i8),
            I16 => Value::I16(self.zigzag()? as i16),
            I32 => Value::I32(self.zigzag()? as i32),
            I64 => Value::I64(self.zigzag()?),
            DOUBLE => {
                let mut bits = [0u8; 8];
                for byte in &mut bits {
                    *byte = self.byte()?;
                }
                Value::Double(u64::from_le_bytes(bits))
            }
            BINARY => {
                let length = self.varint()? as usize;
                let end = self
                    .at
                    .checked_add(length)
                    .filter(|end| *end <= self.bytes.len());
                let end = end.ok_or_else(|| format!("a binary past the footer at {}", self.at))?;
                let value = self.bytes[self.at..end].to_vec();
                self.at = end;
                Value::Binary(value)
            }
            LIST | SET => {
                let header = self.byte()?;
                let element_type = header & 0x0f;
                let size = match header >> 4 {
                    15 => self.varint()? as usize,
                    small => usize::from(small),
                };
                let elements = (0..size)
                    .map(|_| self.value(element_type))
                    .collect::<Result<_, _>>()?;
                Value::List {
                    set: kind == SET,
                    element_type,
                    elements,
                }
            }
            MAP => {
                let size = self.varint()? as usize;
                let types = if size == 0 {
                    (0, 0)
                } else {
                    let header = self.byte()?;
                    (header >> 4, header & 0x0f)
                };
                let entries = (0..size)
                    .map(|_| Ok((self.value(types.0)?, self.value(types.1)?)))
                    .collect::<Result<_, String>>()?;
                Value::Map { types, entries }
            }
            STRUCT => self.structure()?,
            other => return Err(format!("compact type {other} at byte {}", self.at)),
        })
    }

    fn structure(&mut self) -> Result<Value, String> {
        let mut fields = Vec::new();
        let mut last_id = 0i16;
        loop {
            let header = self.byte()?;
            if header == 0 {
                return Ok(Value::Struct(fields));
            }
            let kind = header & 0x0f;
            let id = match header >> 4 {
                0 => self.zigzag()? as i16,
                delta => last_id + i16::from(delta),
            };
            last_id = id;
            let value = match kind {
                BOOL_TRUE => Value::Bool(true),
                BOOL_FALSE => Value::Bool(false),
                other => self.value(other)?,
            };
            fields.push((id, value));
        }
    }
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn write_zigzag(out: &mut Vec<u8>, value: i64) {
    write_varint(out, ((value << 1) ^ (value >> 63)) as u64);
}

fn kind_of(value: &Value) -> u8 {
    match value {
        Value::Bool(true) => BOOL_TRUE,
        Value::Bool(false) => BOOL_FALSE,
        Value::Byte(_) => BYTE,
        Value::I16(_) => I16,
        Value::I32(_) => I32,
        Value::I64(_) => I64,
        Value::Double(_) => DOUBLE,
        Value::Binary(_) => BINARY,
        Value::List { set: false, .. } => LIST,
        Value::List { set: true, .. } => SET,
        Value::Map { .. } => MAP,
        Value::Struct(_) => STRUCT,
    }
}

/// Writes `value` as an element or a map entry (a struct field's header is written by the struct).
fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(flag) => out.push(if *flag { BOOL_TRUE } else { BOOL_FALSE }),
        Value::Byte(byte) => out.push(*byte as u8),
        Value::I16(number) => write_zigzag(out, i64::from(*number)),
        Value::I32(number) => write_zigzag(out, i64::from(*number)),
        Value::I64(number) => write_zigzag(out, *number),
        Value::Double(bits) => out.extend_from_slice(&bits.to_le_bytes()),
        Value::Binary(bytes) => {
            write_varint(out, bytes.len() as u64);
            out.extend_from_slice(bytes);
        }
        Value::List {
            element_type,
            elements,
            ..
        } => {
            match u8::try_from(elements.len()) {
                Ok(small) if small < 15 => out.push((small << 4) | element_type),
                _ => {
                    out.push(0xf0 | element_type);
                    write_varint(out, elements.len() as u64);
                }
            }
            for element in elements {
                write_value(out, element);
            }
        }
        Value::Map { types, entries } => {
            write_varint(out, entries.len() as u64);
            if !entries.is_empty() {
                out.push((types.0 << 4) | types.1);
            }
            for (key, entry) in entries {
                write_value(out, key);
                write_value(out, entry);
            }
        }
        Value::Struct(fields) => {
            let mut last_id = 0i16;
            for (id, field) in fields {
                let kind = kind_of(field);
                match id.checked_sub(last_id) {
                    Some(delta @ 1..=15) => out.push(((delta as u8) << 4) | kind),
                    _ => {
                        out.push(kind);
                        write_zigzag(out, i64::from(*id));
                    }
                }
                last_id = *id;
                if !matches!(field, Value::Bool(_)) {
                    write_value(out, field);
                }
            }
            out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_footer_decodes_and_encodes_back_to_a_file_that_reads_as_before() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("honest.parquet");
        honest_file(&path);
        let before = std::fs::read(&path).expect("read");
        let after = rewritten_footer(&before, |_| {}).expect("rewrites");
        assert_eq!(after, before, "an unedited footer encodes to its own bytes");
        set_footer_i64(&path, &[(vec![Step::Field(file_field::NUM_ROWS)], 7)]);
        let reader = SerializedFileReader::new(std::fs::File::open(&path).expect("open"))
            .expect("still a parquet file");
        assert_eq!(reader.metadata().file_metadata().num_rows(), 7);
        assert_eq!(reader.metadata().row_group(0).num_rows(), 3);
    }

    fn honest_file(path: &Path) {
        use parquet::data_type::Int64Type;
        use parquet::file::writer::SerializedFileWriter;
        use parquet::schema::parser::parse_message_type;
        let schema = std::sync::Arc::new(
            parse_message_type("message test { required int64 id; }").expect("schema"),
        );
        let file = std::fs::File::create(path).expect("create");
        let mut writer =
            SerializedFileWriter::new(file, schema, Default::default()).expect("writer");
        let mut group = writer.next_row_group().expect("row group");
        let mut column = group.next_column().expect("column").expect("a column");
        column
            .typed::<Int64Type>()
            .write_batch(&[1, 2, 3], None, None)
            .expect("write");
        column.close().expect("close column");
        group.close().expect("close row group");
        writer.close().expect("close");
    }
}
