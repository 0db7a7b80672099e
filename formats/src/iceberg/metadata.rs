//! An Iceberg table's metadata file (format versions 1 and 2): schemas, partition specs and
//! snapshots, and the Arrow schema of an Iceberg schema.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use serde::Deserialize;
use serde_json::Value as Json;

/// The Arrow field metadata key that carries an Iceberg field id, as Parquet's writers and
/// readers name it.
pub(crate) const FIELD_ID_KEY: &str = "PARQUET:field_id";

/// The parts of a table metadata file that reading a snapshot needs.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct TableMetadata {
    pub format_version: u8,
    #[serde(default)]
    pub current_schema_id: Option<i32>,
    #[serde(default)]
    pub schemas: Vec<IcebergSchema>,
    /// Format version 1's single schema, when `schemas` is absent.
    #[serde(default)]
    pub schema: Option<IcebergSchema>,
    #[serde(default)]
    pub partition_specs: Vec<PartitionSpec>,
    /// Format version 1's single spec (its fields), when `partition-specs` is absent.
    #[serde(default)]
    pub partition_spec: Option<Vec<PartitionField>>,
    #[serde(default)]
    pub current_snapshot_id: Option<i64>,
    #[serde(default)]
    pub snapshots: Vec<Snapshot>,
    #[serde(default)]
    pub snapshot_log: Vec<SnapshotLogEntry>,
}

/// One schema of the table.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct IcebergSchema {
    #[serde(default)]
    pub schema_id: i32,
    pub fields: Vec<NestedField>,
}

/// A field of a struct (a schema is a struct).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct NestedField {
    pub id: i32,
    pub name: String,
    #[serde(default)]
    pub required: bool,
    #[serde(rename = "type")]
    pub field_type: Json,
}

/// A partition spec: how data files are grouped.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct PartitionSpec {
    pub spec_id: i32,
    pub fields: Vec<PartitionField>,
}

/// One partition field: a transform of a source column.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct PartitionField {
    pub source_id: i32,
    pub transform: String,
}

/// One snapshot: the table's state after one commit.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct Snapshot {
    pub snapshot_id: i64,
    #[serde(default)]
    pub manifest_list: Option<String>,
    #[serde(default)]
    pub schema_id: Option<i32>,
}

/// When a snapshot became the table's current one.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct SnapshotLogEntry {
    pub snapshot_id: i64,
    pub timestamp_ms: i64,
}

impl TableMetadata {
    /// Parses a metadata file, refusing format versions this reader does not know.
    pub(crate) fn parse(text: &[u8]) -> Result<Self, String> {
        let metadata: Self =
            serde_json::from_slice(text).map_err(|error| format!("metadata file: {error}"))?;
        if !(1..=2).contains(&metadata.format_version) {
            return Err(format!(
                "format version {} is not supported; this reader reads Iceberg format versions 1 and 2",
                metadata.format_version
            ));
        }
        Ok(metadata)
    }

    /// The snapshot `id`, the one current at `timestamp_ms`, or the current one; `None` for a
    /// table with no snapshot yet.
    pub(crate) fn snapshot(
        &self,
        id: Option<i64>,
        timestamp_ms: Option<i64>,
    ) -> Result<Option<&Snapshot>, String> {
        let by_id = |wanted: i64| {
            self.snapshots
                .iter()
                .find(|snapshot| snapshot.snapshot_id == wanted)
        };
        if let Some(wanted) = id {
            return by_id(wanted).map(Some).ok_or_else(|| {
                format!(
                    "has no snapshot {wanted}; its snapshots are {} (an expired snapshot cannot be read)",
                    self.snapshot_ids()
                )
            });
        }
        if let Some(time) = timestamp_ms {
            // The history of the main branch: the last snapshot made current at or before `time`.
            let current = self
                .snapshot_log
                .iter()
                .filter(|entry| entry.timestamp_ms <= time)
                .max_by_key(|entry| entry.timestamp_ms);
            let Some(entry) = current else {
                return Err(format!(
                    "has no snapshot at or before {time} ms since the epoch; its first is at {}",
                    self.snapshot_log
                        .iter()
                        .map(|entry| entry.timestamp_ms)
                        .min()
                        .map_or_else(|| "none".to_owned(), |first| format!("{first} ms"))
                ));
            };
            return by_id(entry.snapshot_id).map(Some).ok_or_else(|| {
                format!(
                    "snapshot {} current at {time} ms has expired",
                    entry.snapshot_id
                )
            });
        }
        match self.current_snapshot_id {
            None | Some(-1) => Ok(None),
            Some(current) => by_id(current)
                .map(Some)
                .ok_or_else(|| format!("its current snapshot {current} is not listed")),
        }
    }

    fn snapshot_ids(&self) -> String {
        let ids: Vec<String> = self
            .snapshots
            .iter()
            .map(|snapshot| snapshot.snapshot_id.to_string())
            .collect();
        if ids.is_empty() {
            "none".to_owned()
        } else {
            ids.join(", ")
        }
    }

    /// The schema a snapshot was written with (the current one for a snapshot that does not say,
    /// or for a table with no snapshot).
    pub(crate) fn schema_of(&self, snapshot: Option<&Snapshot>) -> Result<&IcebergSchema, String> {
        let wanted = snapshot
            .and_then(|snapshot| snapshot.schema_id)
            .or(self.current_schema_id);
        if self.schemas.is_empty() {
            return self
                .schema
                .as_ref()
                .ok_or_else(|| "has neither `schemas` nor `schema`".to_owned());
        }
        match wanted {
            Some(id) => self
                .schemas
                .iter()
                .find(|schema| schema.schema_id == id)
                .ok_or_else(|| format!("has no schema {id}")),
            None => self
                .schemas
                .last()
                .ok_or_else(|| "has no schema".to_owned()),
        }
    }

    /// The partition specs by id.
    pub(crate) fn specs(&self) -> HashMap<i32, PartitionSpec> {
        if self.partition_specs.is_empty() {
            let fields = self.partition_spec.clone().unwrap_or_default();
            return HashMap::from([(0, PartitionSpec { spec_id: 0, fields })]);
        }
        self.partition_specs
            .iter()
            .map(|spec| (spec.spec_id, spec.clone()))
            .collect()
    }
}

/// The Arrow schema of an Iceberg schema; every field carries its Iceberg id in
/// [`FIELD_ID_KEY`].
pub(crate) fn arrow_schema(schema: &IcebergSchema) -> Result<Schema, String> {
    let fields = schema
        .fields
        .iter()
        .map(arrow_field)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Schema::new(fields))
}

fn with_id(field: Field, id: i32) -> Field {
    field.with_metadata(HashMap::from([(FIELD_ID_KEY.to_owned(), id.to_string())]))
}

fn arrow_field(field: &NestedField) -> Result<Field, String> {
    let data_type = arrow_type(&field.field_type)
        .map_err(|error| format!("column `{}`: {error}", field.name))?;
    Ok(with_id(
        Field::new(&field.name, data_type, !field.required),
        field.id,
    ))
}

/// The id an Arrow field carries in [`FIELD_ID_KEY`].
pub(crate) fn field_id(field: &Field) -> Option<i32> {
    field.metadata().get(FIELD_ID_KEY)?.parse().ok()
}

fn arrow_type(json: &Json) -> Result<DataType, String> {
    match json {
        Json::String(name) => primitive_type(name),
        Json::Object(object) => {
            let text = |key: &str| object.get(key).and_then(Json::as_str);
            let id = |key: &str| {
                object
                    .get(key)
                    .and_then(Json::as_i64)
                    .and_then(|id| i32::try_from(id).ok())
                    .ok_or_else(|| format!("`{key}` is missing"))
            };
            let required = |key: &str| object.get(key).and_then(Json::as_bool).unwrap_or(false);
            let child = |key: &str| object.get(key).ok_or_else(|| format!("`{key}` is missing"));
            match text("type") {
                Some("struct") => {
                    let fields: Vec<NestedField> = serde_json::from_value(child("fields")?.clone())
                        .map_err(|error| format!("struct fields: {error}"))?;
                    let fields = fields
                        .iter()
                        .map(arrow_field)
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(DataType::Struct(Fields::from(fields)))
                }
                Some("list") => {
                    let element = Field::new(
                        "element",
                        arrow_type(child("element")?)?,
                        !required("element-required"),
                    );
                    Ok(DataType::List(Arc::new(with_id(
                        element,
                        id("element-id")?,
                    ))))
                }
                Some("map") => {
                    let key = with_id(Field::new("key", arrow_type(child("key")?)?, false), {
                        id("key-id")?
                    });
                    let value = with_id(
                        Field::new(
                            "value",
                            arrow_type(child("value")?)?,
                            !required("value-required"),
                        ),
                        id("value-id")?,
                    );
                    let entries =
                        Field::new_struct("key_value", Fields::from(vec![key, value]), false);
                    Ok(DataType::Map(Arc::new(entries), false))
                }
                other => Err(format!("unknown nested type {other:?}")),
            }
        }
        other => Err(format!("unknown type {other}")),
    }
}

fn primitive_type(name: &str) -> Result<DataType, String> {
    let parameters = |prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(|c| c == ')' || c == ']'))
    };
    Ok(match name {
        "boolean" => DataType::Boolean,
        "int" => DataType::Int32,
        "long" => DataType::Int64,
        "float" => DataType::Float32,
        "double" => DataType::Float64,
        "date" => DataType::Date32,
        "time" => DataType::Time64(TimeUnit::Microsecond),
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, None),
        "timestamptz" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "timestamp_ns" => DataType::Timestamp(TimeUnit::Nanosecond, None),
        "timestamptz_ns" => DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
        "string" => DataType::Utf8,
        "uuid" => DataType::FixedSizeBinary(16),
        "binary" => DataType::Binary,
        _ => {
            if let Some(inner) = parameters("decimal(") {
                let (precision, scale) = inner
                    .split_once(',')
                    .ok_or_else(|| format!("type {name:?}: expected decimal(P, S)"))?;
                let precision: u8 = precision
                    .trim()
                    .parse()
                    .map_err(|_| format!("type {name:?}: bad precision"))?;
                let scale: i8 = scale
                    .trim()
                    .parse()
                    .map_err(|_| format!("type {name:?}: bad scale"))?;
                DataType::Decimal128(precision, scale)
            } else if let Some(length) = parameters("fixed[") {
                let length: i32 = length
                    .trim()
                    .parse()
                    .map_err(|_| format!("type {name:?}: bad length"))?;
                DataType::FixedSizeBinary(length)
            } else {
                return Err(format!(
                    "type {name:?} is not supported (format version 3 types are not read)"
                ));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const METADATA: &str = r#"{
      "format-version": 2, "table-uuid": "a", "location": "s3://bucket/t",
      "last-sequence-number": 2, "last-updated-ms": 3, "last-column-id": 7,
      "current-schema-id": 1,
      "schemas": [
        {"type": "struct", "schema-id": 0, "fields": [
          {"id": 1, "name": "id", "required": true, "type": "long"},
          {"id": 2, "name": "qty", "required": false, "type": "int"}]},
        {"type": "struct", "schema-id": 1, "fields": [
          {"id": 1, "name": "id", "required": true, "type": "long"},
          {"id": 2, "name": "qty", "required": false, "type": "long"},
          {"id": 3, "name": "price", "required": false, "type": "decimal(10, 2)"},
          {"id": 4, "name": "tags", "required": false,
           "type": {"type": "list", "element-id": 5, "element": "string", "element-required": false}},
          {"id": 6, "name": "attrs", "required": false,
           "type": {"type": "map", "key-id": 7, "key": "string", "value-id": 8, "value": "timestamptz",
                    "value-required": true}}]}],
      "default-spec-id": 0,
      "partition-specs": [{"spec-id": 0, "fields": [
          {"source-id": 2, "field-id": 1000, "name": "qty_bucket", "transform": "bucket[4]"}]}],
      "last-partition-id": 1000,
      "current-snapshot-id": 11,
      "snapshots": [
        {"snapshot-id": 10, "sequence-number": 1, "timestamp-ms": 1000, "manifest-list": "s3://bucket/t/m1.avro", "schema-id": 0},
        {"snapshot-id": 11, "parent-snapshot-id": 10, "sequence-number": 2, "timestamp-ms": 2000, "manifest-list": "s3://bucket/t/m2.avro", "schema-id": 1}],
      "snapshot-log": [{"snapshot-id": 10, "timestamp-ms": 1000}, {"snapshot-id": 11, "timestamp-ms": 2000}]
    }"#;

    #[test]
    fn snapshots_are_found_by_id_by_time_or_as_the_current_one() {
        let sut = TableMetadata::parse(METADATA.as_bytes()).expect("parse");
        let id = |snapshot: Option<&Snapshot>| snapshot.map(|snapshot| snapshot.snapshot_id);
        assert_eq!(id(sut.snapshot(None, None).expect("current")), Some(11));
        assert_eq!(id(sut.snapshot(Some(10), None).expect("by id")), Some(10));
        assert_eq!(
            id(sut.snapshot(None, Some(1999)).expect("by time")),
            Some(10)
        );
        assert_eq!(
            id(sut.snapshot(None, Some(2000)).expect("by time")),
            Some(11)
        );
        let error = sut.snapshot(None, Some(999)).expect_err("before the first");
        assert!(error.contains("its first is at 1000 ms"), "{error}");
        let error = sut.snapshot(Some(12), None).expect_err("unknown");
        assert!(error.contains("its snapshots are 10, 11"), "{error}");
    }

    #[test]
    fn a_snapshot_is_read_with_the_schema_it_was_written_with() {
        let sut = TableMetadata::parse(METADATA.as_bytes()).expect("parse");
        let old = sut.snapshot(Some(10), None).expect("by id");
        let schema = arrow_schema(sut.schema_of(old).expect("schema")).expect("arrow");
        assert_eq!(schema.fields().len(), 2);
        assert_eq!(schema.field(1).data_type(), &DataType::Int32);
        let current = sut.snapshot(None, None).expect("current");
        let schema = arrow_schema(sut.schema_of(current).expect("schema")).expect("arrow");
        assert_eq!(schema.field(1).data_type(), &DataType::Int64);
        assert_eq!(schema.field(2).data_type(), &DataType::Decimal128(10, 2));
        assert!(!schema.field(0).is_nullable());
        assert_eq!(field_id(schema.field(3)), Some(4));
        let DataType::List(element) = schema.field(3).data_type() else {
            panic!("a list: {:?}", schema.field(3));
        };
        assert_eq!(field_id(element), Some(5));
        let DataType::Map(entries, _) = schema.field(4).data_type() else {
            panic!("a map: {:?}", schema.field(4));
        };
        let DataType::Struct(pair) = entries.data_type() else {
            panic!("entries: {entries:?}");
        };
        assert_eq!(
            pair[1].data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(field_id(&pair[1]), Some(8));
    }

    #[test]
    fn format_version_3_and_its_types_are_refused_naming_them() {
        let v3 = METADATA.replace("\"format-version\": 2", "\"format-version\": 3");
        let error = TableMetadata::parse(v3.as_bytes()).expect_err("v3");
        assert!(error.contains("format version 3"), "{error}");
        let error = primitive_type("variant").expect_err("variant");
        assert!(error.contains("\"variant\" is not supported"), "{error}");
    }
}
