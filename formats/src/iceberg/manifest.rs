//! An Iceberg snapshot's manifest list and manifests (Avro): the live data and delete files, each
//! with its partition, data sequence number and column bounds.

use std::collections::HashMap;

use apache_avro::types::Value;

/// What a file of a manifest holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Content {
    /// Rows of the table.
    Data,
    /// Positions (file path, row) of deleted rows.
    PositionDeletes,
    /// Values of the equality columns of deleted rows.
    EqualityDeletes,
}

/// One manifest of a snapshot's manifest list.
#[derive(Debug, Clone)]
pub(crate) struct ManifestFile {
    pub path: String,
    pub spec_id: i32,
    /// The sequence number of the commit that added the manifest, which its added files inherit.
    pub sequence_number: i64,
}

/// One live file of a manifest.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub content: Content,
    pub path: String,
    pub format: String,
    pub spec_id: i32,
    /// The partition tuple, in the order of the spec's fields (unions unwrapped).
    pub partition: Vec<Value>,
    pub record_count: u64,
    pub size: u64,
    /// The data sequence number: which deletes apply to the file, and which files a delete file
    /// applies to.
    pub sequence_number: i64,
    pub null_counts: HashMap<i32, u64>,
    pub lower_bounds: HashMap<i32, Vec<u8>>,
    pub upper_bounds: HashMap<i32, Vec<u8>>,
    pub equality_ids: Vec<i32>,
    /// The one data file a position delete file applies to, when its writer said (format v3).
    pub referenced_data_file: Option<String>,
}

/// The value inside a union, or the value itself.
fn plain(value: &Value) -> &Value {
    match value {
        Value::Union(_, inner) => plain(inner),
        other => other,
    }
}

fn fields(value: &Value) -> Result<&[(String, Value)], String> {
    match plain(value) {
        Value::Record(fields) => Ok(fields),
        other => Err(format!("expected a record, found {other:?}")),
    }
}

fn field<'a>(record: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    record
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| plain(value))
        .filter(|value| !matches!(value, Value::Null))
}

fn long(record: &[(String, Value)], name: &str) -> Option<i64> {
    match field(record, name)? {
        Value::Long(value) => Some(*value),
        Value::Int(value) => Some(i64::from(*value)),
        _ => None,
    }
}

fn text(record: &[(String, Value)], name: &str) -> Option<String> {
    match field(record, name)? {
        Value::String(value) | Value::Enum(_, value) => Some(value.clone()),
        _ => None,
    }
}

fn required<T>(value: Option<T>, what: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("`{what}` is missing or of the wrong type"))
}

/// A field id, which the spec types `int` and some writers (pyiceberg's `equality_ids`) write as
/// `long`.
fn field_id_of(value: &Value) -> Option<i32> {
    match value {
        Value::Int(id) => Some(*id),
        Value::Long(id) => i32::try_from(*id).ok(),
        _ => None,
    }
}

/// Iceberg writes maps with int keys as arrays of `{key, value}` records.
fn int_keyed<T>(
    record: &[(String, Value)],
    name: &str,
    convert: impl Fn(&Value) -> Option<T>,
) -> HashMap<i32, T> {
    let mut map = HashMap::new();
    if let Some(Value::Array(pairs)) = field(record, name) {
        for pair in pairs {
            let Ok(pair) = fields(pair) else { continue };
            let Some(key) = field(pair, "key").and_then(field_id_of) else {
                continue;
            };
            if let Some(value) = field(pair, "value").and_then(&convert) {
                map.insert(key, value);
            }
        }
    }
    map
}

fn records(bytes: &[u8]) -> Result<Vec<Value>, String> {
    let reader = apache_avro::Reader::new(bytes).map_err(|error| error.to_string())?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())
}

/// Reads a manifest list.
pub(crate) fn read_manifest_list(bytes: &[u8]) -> Result<Vec<ManifestFile>, String> {
    records(bytes)?
        .iter()
        .map(|record| {
            let record = fields(record)?;
            Ok(ManifestFile {
                path: required(text(record, "manifest_path"), "manifest_path")?,
                spec_id: required(long(record, "partition_spec_id"), "partition_spec_id")? as i32,
                // Format version 1 has no sequence numbers: every file's is 0.
                sequence_number: long(record, "sequence_number").unwrap_or(0),
            })
        })
        .collect()
}

/// Reads the live entries of a manifest (existing and added; deleted entries dropped).
pub(crate) fn read_manifest(bytes: &[u8], manifest: &ManifestFile) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    for record in records(bytes)? {
        let record = fields(&record)?;
        let status = required(long(record, "status"), "status")?;
        if status == 2 {
            continue;
        }
        let file = fields(required(field(record, "data_file"), "data_file")?)?;
        let content = match long(file, "content").unwrap_or(0) {
            0 => Content::Data,
            1 => Content::PositionDeletes,
            2 => Content::EqualityDeletes,
            other => return Err(format!("data_file.content {other} is unknown")),
        };
        // An added file with no sequence number inherits the manifest's (the commit's).
        let sequence_number = match long(record, "sequence_number") {
            Some(number) => number,
            None if status == 1 => manifest.sequence_number,
            None => 0,
        };
        let partition = match field(file, "partition") {
            Some(Value::Record(values)) => values
                .iter()
                .map(|(_, value)| plain(value).clone())
                .collect(),
            _ => Vec::new(),
        };
        let bytes_of = |value: &Value| match value {
            Value::Bytes(bytes) | Value::Fixed(_, bytes) => Some(bytes.clone()),
            _ => None,
        };
        let count_of = |value: &Value| match value {
            Value::Long(count) => u64::try_from(*count).ok(),
            _ => None,
        };
        let equality_ids = match field(file, "equality_ids") {
            Some(Value::Array(ids)) => ids.iter().filter_map(|id| field_id_of(plain(id))).collect(),
            _ => Vec::new(),
        };
        entries.push(Entry {
            content,
            path: required(text(file, "file_path"), "data_file.file_path")?,
            format: required(text(file, "file_format"), "data_file.file_format")?,
            spec_id: manifest.spec_id,
            partition,
            record_count: u64::try_from(required(
                long(file, "record_count"),
                "data_file.record_count",
            )?)
            .map_err(|_| "data_file.record_count is negative".to_owned())?,
            size: u64::try_from(required(
                long(file, "file_size_in_bytes"),
                "data_file.file_size_in_bytes",
            )?)
            .map_err(|_| "data_file.file_size_in_bytes is negative".to_owned())?,
            sequence_number,
            null_counts: int_keyed(file, "null_value_counts", count_of),
            lower_bounds: int_keyed(file, "lower_bounds", bytes_of),
            upper_bounds: int_keyed(file, "upper_bounds", bytes_of),
            equality_ids,
            referenced_data_file: text(file, "referenced_data_file"),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::{Schema, Writer};

    const ENTRY_SCHEMA: &str = r#"{
      "type": "record", "name": "manifest_entry", "fields": [
        {"name": "status", "type": "int"},
        {"name": "snapshot_id", "type": ["null", "long"], "default": null},
        {"name": "sequence_number", "type": ["null", "long"], "default": null},
        {"name": "data_file", "type": {"type": "record", "name": "r2", "fields": [
          {"name": "content", "type": "int"},
          {"name": "file_path", "type": "string"},
          {"name": "file_format", "type": "string"},
          {"name": "partition", "type": {"type": "record", "name": "r102", "fields": [
            {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": null}]}},
          {"name": "record_count", "type": "long"},
          {"name": "file_size_in_bytes", "type": "long"},
          {"name": "null_value_counts", "type": ["null", {"type": "array", "items": {"type": "record",
            "name": "k121_v122", "fields": [{"name": "key", "type": "int"}, {"name": "value", "type": "long"}]}}],
            "default": null},
          {"name": "lower_bounds", "type": ["null", {"type": "array", "items": {"type": "record",
            "name": "k126_v127", "fields": [{"name": "key", "type": "int"}, {"name": "value", "type": "bytes"}]}}],
            "default": null},
          {"name": "equality_ids", "type": ["null", {"type": "array", "items": "int"}], "default": null}]}}]
    }"#;

    fn entry(status: i32, sequence: Option<i64>, content: i32, path: &str) -> Value {
        let optional_long = |value: Option<i64>| match value {
            Some(value) => Value::Union(1, Box::new(Value::Long(value))),
            None => Value::Union(0, Box::new(Value::Null)),
        };
        Value::Record(vec![
            ("status".into(), Value::Int(status)),
            ("snapshot_id".into(), optional_long(Some(7))),
            ("sequence_number".into(), optional_long(sequence)),
            (
                "data_file".into(),
                Value::Record(vec![
                    ("content".into(), Value::Int(content)),
                    ("file_path".into(), Value::String(path.into())),
                    ("file_format".into(), Value::String("PARQUET".into())),
                    (
                        "partition".into(),
                        Value::Record(vec![(
                            "day".into(),
                            Value::Union(1, Box::new(Value::Date(19_000))),
                        )]),
                    ),
                    ("record_count".into(), Value::Long(10)),
                    ("file_size_in_bytes".into(), Value::Long(999)),
                    (
                        "null_value_counts".into(),
                        Value::Union(
                            1,
                            Box::new(Value::Array(vec![Value::Record(vec![
                                ("key".into(), Value::Int(1)),
                                ("value".into(), Value::Long(3)),
                            ])])),
                        ),
                    ),
                    (
                        "lower_bounds".into(),
                        Value::Union(
                            1,
                            Box::new(Value::Array(vec![Value::Record(vec![
                                ("key".into(), Value::Int(1)),
                                ("value".into(), Value::Bytes(vec![5, 0, 0, 0])),
                            ])])),
                        ),
                    ),
                    (
                        "equality_ids".into(),
                        Value::Union(1, Box::new(Value::Array(vec![Value::Int(1)]))),
                    ),
                ]),
            ),
        ])
    }

    #[test]
    fn live_entries_keep_their_partition_bounds_and_inherited_sequence_numbers() {
        let schema = Schema::parse_str(ENTRY_SCHEMA).expect("schema");
        let mut writer = Writer::with_codec(
            &schema,
            Vec::new(),
            apache_avro::Codec::Deflate(apache_avro::DeflateSettings::default()),
        )
        .expect("writer");
        writer
            .append_value(entry(1, None, 0, "s3://b/t/data/added.parquet"))
            .expect("added");
        writer
            .append_value(entry(0, Some(2), 2, "s3://b/t/data/eq.parquet"))
            .expect("existing");
        writer
            .append_value(entry(2, Some(1), 0, "s3://b/t/data/gone.parquet"))
            .expect("deleted");
        let bytes = writer.into_inner().expect("flush");
        let manifest = ManifestFile {
            path: "m.avro".into(),
            spec_id: 3,
            sequence_number: 9,
        };
        let sut = read_manifest(&bytes, &manifest).expect("read");
        assert_eq!(sut.len(), 2, "the deleted entry is dropped");
        assert_eq!(sut[0].path, "s3://b/t/data/added.parquet");
        assert_eq!(sut[0].sequence_number, 9, "inherited from the manifest");
        assert_eq!(sut[0].content, Content::Data);
        assert_eq!(sut[0].spec_id, 3);
        assert_eq!(sut[0].partition, vec![Value::Date(19_000)]);
        assert_eq!(sut[0].null_counts, HashMap::from([(1, 3)]));
        assert_eq!(sut[0].lower_bounds, HashMap::from([(1, vec![5, 0, 0, 0])]));
        assert_eq!(sut[1].sequence_number, 2);
        assert_eq!(sut[1].content, Content::EqualityDeletes);
        assert_eq!(sut[1].equality_ids, vec![1]);
    }

    #[test]
    fn a_manifest_that_is_not_avro_is_an_error_not_a_panic() {
        let manifest = ManifestFile {
            path: "m.avro".into(),
            spec_id: 0,
            sequence_number: 0,
        };
        assert!(read_manifest(b"Obj\x01garbage", &manifest).is_err());
        assert!(read_manifest_list(b"not avro at all").is_err());
    }
}
