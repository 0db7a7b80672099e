//! Synthetic training data: Parquet files or a Delta table with a unique `id`, features and a `label`.
//!
//! Every value is a pure function of `(seed, id)`, so the same rows come out whatever the file count and
//! row-group size. Schema:
//!
//! | column | type | content |
//! |---|---|---|
//! | `id` | int64, not null | 0..rows-1, unique |
//! | `feature_0` .. `feature_3` | float32 | uniform in [0, 1), about 1 in 50 null |
//! | `embedding` | list\<float32\> | 8 values in [-1, 1) |
//! | `category` | string | `category_<n>`, n < 100 |
//! | `label` | int64, not null | 0 or 1 |

use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Builder, Int64Array, ListBuilder, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::AsyncArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::dataset::FormatKind;
use crate::error::{FormatError, Result};
use crate::store::{StorageOptions, open_location};

/// Number of float feature columns.
pub const FEATURE_COLUMNS: usize = 4;
/// Length of every `embedding` list.
pub const EMBEDDING_LENGTH: usize = 8;
/// Rows generated per batch.
const GENERATE_BATCH_ROWS: u64 = 65_536;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Where to write: a directory URI or path.
    pub out: String,
    /// Total rows.
    pub rows: u64,
    /// Number of data files (at least 1; files may be empty when there are fewer rows than files).
    pub files: u64,
    /// Parquet files, or a Delta table.
    pub format: FormatKind,
    /// Maximum rows per row group.
    pub row_group_rows: usize,
    /// Seed of the values.
    pub seed: u64,
    /// Object store settings.
    pub storage_options: StorageOptions,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerateReport {
    /// URIs of the data files, in id order.
    pub files: Vec<String>,
    /// Total rows.
    pub rows: u64,
    /// Total bytes of the data files.
    pub bytes: u64,
}

/// The schema of generated data.
pub fn schema() -> SchemaRef {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    fields.extend(
        (0..FEATURE_COLUMNS)
            .map(|index| Field::new(format!("feature_{index}"), DataType::Float32, true)),
    );
    fields.push(Field::new(
        "embedding",
        DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
        true,
    ));
    fields.push(Field::new("category", DataType::Utf8, true));
    fields.push(Field::new("label", DataType::Int64, false));
    Arc::new(Schema::new(fields))
}

/// SplitMix64: a fast, well-mixed hash of (seed, id, stream).
fn mix(seed: u64, id: u64, stream: u64) -> u64 {
    let mut value =
        seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03);
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

fn unit(bits: u64) -> f32 {
    // 24 random bits give every float32 in [0, 1) a step of 2^-24.
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

/// Builds the rows `[first_id, first_id + rows)`.
///
/// # Errors
///
/// Returns an error only if Arrow rejects the batch, which would be a bug in the schema.
pub fn batch(seed: u64, first_id: u64, rows: u64) -> Result<RecordBatch> {
    let ids: Vec<u64> = (first_id..first_id + rows).collect();
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
        ids.iter().map(|id| *id as i64),
    ))];
    for feature in 0..FEATURE_COLUMNS as u64 {
        let mut builder = Float32Builder::with_capacity(ids.len());
        for id in &ids {
            let bits = mix(seed, *id, feature);
            if bits.is_multiple_of(50) {
                builder.append_null()
            } else {
                builder.append_value(unit(bits))
            }
        }
        columns.push(Arc::new(builder.finish()));
    }
    let mut embedding = ListBuilder::with_capacity(
        Float32Builder::with_capacity(ids.len() * EMBEDDING_LENGTH),
        ids.len(),
    );
    for id in &ids {
        for slot in 0..EMBEDDING_LENGTH as u64 {
            embedding
                .values()
                .append_value(unit(mix(seed, *id, 100 + slot)) * 2.0 - 1.0);
        }
        embedding.append(true);
    }
    columns.push(Arc::new(embedding.finish()));
    let mut category = StringBuilder::with_capacity(ids.len(), ids.len() * 12);
    for id in &ids {
        category.append_value(format!("category_{}", mix(seed, *id, 200) % 100));
    }
    columns.push(Arc::new(category.finish()));
    columns.push(Arc::new(Int64Array::from_iter_values(
        ids.iter().map(|id| (mix(seed, *id, 300) % 2) as i64),
    )));
    RecordBatch::try_new(schema(), columns)
        .map_err(|error| FormatError::arrow("generating rows", error))
}

fn delta_schema_string() -> String {
    let float = |name: &str| serde_json::json!({"name": name, "type": "float", "nullable": true, "metadata": {}});
    let mut fields =
        vec![serde_json::json!({"name": "id", "type": "long", "nullable": false, "metadata": {}})];
    fields.extend((0..FEATURE_COLUMNS).map(|index| float(&format!("feature_{index}"))));
    fields.push(serde_json::json!({"name": "embedding", "type": {"type": "array", "elementType": "float", "containsNull": true}, "nullable": true, "metadata": {}}));
    fields.push(
        serde_json::json!({"name": "category", "type": "string", "nullable": true, "metadata": {}}),
    );
    fields.push(
        serde_json::json!({"name": "label", "type": "long", "nullable": false, "metadata": {}}),
    );
    serde_json::json!({"type": "struct", "fields": fields}).to_string()
}

fn table_id(seed: u64) -> String {
    let high = mix(seed, 0, 400);
    let low = mix(seed, 0, 401);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xfff,
        (low >> 48) & 0xfff,
        low & 0xffff_ffff_ffff
    )
}

/// Writes the data, calling `progress` with the number of rows written so far after each batch.
///
/// # Errors
///
/// Returns an error for bad parameters (no files, row groups of 0 rows) or a failed write.
pub async fn generate(
    options: &GenerateOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GenerateReport> {
    if options.files == 0 {
        return Err(FormatError::InvalidArgument(
            "--files must be at least 1".to_string(),
        ));
    }
    if options.row_group_rows == 0 {
        return Err(FormatError::InvalidArgument(
            "--row-group-rows must be at least 1".to_string(),
        ));
    }
    if !matches!(options.format, FormatKind::Parquet | FormatKind::Delta) {
        return Err(FormatError::InvalidArgument(format!(
            "gen writes parquet or delta, not {:?}",
            options.format
        )));
    }
    let location = open_location(&options.out, &options.storage_options)?;
    if location.glob.is_some() {
        return Err(FormatError::InvalidArgument(format!(
            "--out {}: a glob is not a place to write to",
            options.out
        )));
    }
    if location.root.scheme() == "file" {
        let directory = std::path::PathBuf::from(format!("/{}", location.path));
        std::fs::create_dir_all(&directory)
            .map_err(|error| FormatError::io(format!("creating {}", directory.display()), error))?;
    }
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(options.row_group_rows))
        .build();
    let mut report = GenerateReport {
        files: Vec::new(),
        rows: options.rows,
        bytes: 0,
    };
    let mut adds = Vec::new();
    let mut written = 0u64;
    let now_millis = chrono::Utc::now().timestamp_millis();
    for file_index in 0..options.files {
        let first_id = options.rows * file_index / options.files;
        let end_id = options.rows * (file_index + 1) / options.files;
        let name = format!("part-{file_index:05}.parquet");
        let path = location.path.clone().join(name.as_str());
        let writer = BufWriter::new(Arc::clone(&location.store), path.clone());
        let mut arrow_writer =
            AsyncArrowWriter::try_new(writer, schema(), Some(properties.clone()))
                .map_err(|error| FormatError::parquet(location.uri_of(&path), error))?;
        let mut next_id = first_id;
        while next_id < end_id {
            let rows = GENERATE_BATCH_ROWS.min(end_id - next_id);
            let rows_batch = batch(options.seed, next_id, rows)?;
            arrow_writer
                .write(&rows_batch)
                .await
                .map_err(|error| FormatError::parquet(location.uri_of(&path), error))?;
            next_id += rows;
            written += rows;
            progress(written);
        }
        arrow_writer
            .close()
            .await
            .map_err(|error| FormatError::parquet(location.uri_of(&path), error))?;
        let size = location
            .store
            .head(&path)
            .await
            .map_err(|error| {
                FormatError::store(format!("checking {}", location.uri_of(&path)), error)
            })?
            .size;
        report.bytes += size;
        report.files.push(location.uri_of(&path));
        adds.push(serde_json::json!({"add": {
            "path": name,
            "partitionValues": {},
            "size": size,
            "modificationTime": now_millis,
            "dataChange": true,
            "stats": serde_json::json!({"numRecords": end_id - first_id}).to_string(),
        }}));
    }
    if options.format == FormatKind::Delta {
        let mut lines = vec![
            serde_json::json!({"commitInfo": {"timestamp": now_millis, "operation": "WRITE", "operationParameters": {"mode": "ErrorIfExists"}}}),
            serde_json::json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
            serde_json::json!({"metaData": {
                "id": table_id(options.seed),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": delta_schema_string(),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": now_millis,
            }}),
        ];
        lines.extend(adds);
        let body: String = lines.iter().map(|line| format!("{line}\n")).collect();
        let log_path: Path = location
            .path
            .clone()
            .join("_delta_log")
            .join("00000000000000000000.json");
        if location.root.scheme() == "file" {
            let directory = std::path::PathBuf::from(format!("/{}/_delta_log", location.path));
            std::fs::create_dir_all(&directory).map_err(|error| {
                FormatError::io(format!("creating {}", directory.display()), error)
            })?;
        }
        location
            .store
            .put(&log_path, PutPayload::from(body))
            .await
            .map_err(|error| {
                FormatError::store(format!("writing {}", location.uri_of(&log_path)), error)
            })?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_depend_only_on_seed_and_id() {
        let whole = batch(7, 0, 100).expect("batch");
        let tail = batch(7, 60, 40).expect("batch");
        assert_eq!(whole.slice(60, 40), tail);
        assert_ne!(batch(8, 60, 40).expect("batch"), tail);
    }

    #[test]
    fn table_ids_look_like_uuids() {
        let id = table_id(1);
        assert_eq!(id.len(), 36);
        assert_eq!(id.matches('-').count(), 4);
    }
}
