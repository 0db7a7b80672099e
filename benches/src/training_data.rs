//! A training-like Parquet file for the decode benchmark, written once and then reused from a cache
//! directory.
//!
//! Every row holds what a recommendation or ranking model reads:
//!
//! | column | type | content |
//! |---|---|---|
//! | `id` | int64, not null | 0..rows-1 |
//! | `feature_0` .. `feature_7` | float32 | uniform in [0, 1), about 1 in 50 null |
//! | `embedding` | fixed_size_list\<float32, 64\>, not null | uniform in [-1, 1) |
//! | `category` | string | one of 1,000 names such as `category_417` |
//! | `history` | list\<int64\> | 0 to 16 item ids below 10 million |
//!
//! That is about 380 bytes per row once decoded into Arrow, so 2.8 million rows make about 1 GiB. The
//! floats carry random mantissas, as real features and embeddings do, so they barely compress.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Float32Builder, Int64Array, Int64Builder,
    ListBuilder, RecordBatch, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{BenchError, Result};

/// Float32 feature columns.
pub const FEATURE_COLUMNS: usize = 8;
/// Values in every `embedding`.
pub const EMBEDDING_LENGTH: i32 = 64;
/// Distinct `category` values.
const CATEGORIES: u32 = 1_000;
/// The longest `history` list.
const MAX_HISTORY: usize = 16;
/// Rows generated and written per batch.
const WRITE_BATCH_ROWS: usize = 65_536;
/// Bump when the content or layout changes, so that cached files of the old layout are not reused.
const LAYOUT_VERSION: u32 = 1;

/// The compression codecs the benchmark writes its file with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Snappy: fast, light compression.
    Snappy,
    /// Zstandard at level 1, the writers' usual default.
    Zstd,
}

impl Codec {
    /// Both codecs, in the order the benchmark runs them.
    pub const ALL: [Codec; 2] = [Codec::Snappy, Codec::Zstd];

    /// The codec's name in file names and output.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Snappy => "snappy",
            Codec::Zstd => "zstd",
        }
    }

    fn compression(self) -> Result<Compression> {
        match self {
            Codec::Snappy => Ok(Compression::SNAPPY),
            Codec::Zstd => ZstdLevel::try_new(1)
                .map(Compression::ZSTD)
                .map_err(|source| BenchError::Parquet {
                    operation: "choosing zstd level 1".to_owned(),
                    source,
                }),
        }
    }
}

/// The file of a full run: 2.8 million rows, about 1 GiB decoded.
pub const FULL_FILE: TrainingFile = TrainingFile {
    rows: 2_800_000,
    row_group_rows: 1 << 20,
};
/// The file of a quick run: a sixteenth of the full one.
pub const QUICK_FILE: TrainingFile = TrainingFile {
    rows: 175_000,
    row_group_rows: 1 << 16,
};

/// What a benchmark of Sluice against pyarrow on the training file runs (`sluice-bench decode` and
/// `sluice-bench pipeline`).
#[derive(Debug, Clone)]
pub struct PyarrowComparison {
    /// The `sluice` executable under test.
    pub sluice: PathBuf,
    /// The Python interpreter that has pyarrow.
    pub python: OsString,
    /// Where the Parquet files are written and reused from.
    pub cache_dir: PathBuf,
    /// A sixteenth of the rows and one round, for CI.
    pub quick: bool,
    /// Rounds of the sides, which take turns (at least 1).
    pub rounds: usize,
}

impl PyarrowComparison {
    /// The file the run reads.
    pub fn file(&self) -> TrainingFile {
        if self.quick { QUICK_FILE } else { FULL_FILE }
    }
}

/// The shape of a training file: its row count and row-group size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainingFile {
    /// Rows in the file.
    pub rows: u64,
    /// Rows per row group (the last one may hold fewer).
    pub row_group_rows: usize,
}

impl TrainingFile {
    /// The path of this file with `codec` in `directory`; the name carries every parameter of the content.
    pub fn path_in(&self, directory: &Path, codec: Codec) -> PathBuf {
        directory.join(format!(
            "training-v{LAYOUT_VERSION}-{}rows-{}rg-{}.parquet",
            self.rows,
            self.row_group_rows,
            codec.name()
        ))
    }

    /// Returns the file with `codec` in `directory`, writing it first unless a complete copy is there.
    ///
    /// A file is reused when its footer reads and holds the expected row count; anything else there (a
    /// partial write, a corrupt file) is replaced. Files are written under a temporary name and renamed
    /// into place, so a run that is interrupted never leaves a half-written file under the real name.
    pub fn ensure(&self, directory: &Path, codec: Codec) -> Result<PathBuf> {
        let path = self.path_in(directory, codec);
        if self.is_complete(&path) {
            return Ok(path);
        }
        std::fs::create_dir_all(directory).map_err(|source| BenchError::Setup {
            operation: format!("creating the cache directory {}", directory.display()),
            source,
        })?;
        let partial = path.with_extension(format!("partial-{}", std::process::id()));
        self.write(&partial, codec)?;
        std::fs::rename(&partial, &path).map_err(|source| BenchError::Setup {
            operation: format!("moving {} into place", partial.display()),
            source,
        })?;
        Ok(path)
    }

    fn is_complete(&self, path: &Path) -> bool {
        let Ok(file) = File::open(path) else {
            return false;
        };
        ParquetRecordBatchReaderBuilder::try_new(file).is_ok_and(|builder| {
            u64::try_from(builder.metadata().file_metadata().num_rows()) == Ok(self.rows)
        })
    }

    fn write(&self, path: &Path, codec: Codec) -> Result<()> {
        let parquet_error = |source| BenchError::Parquet {
            operation: format!("writing {}", path.display()),
            source,
        };
        let file = File::create(path).map_err(|source| BenchError::Setup {
            operation: format!("creating {}", path.display()),
            source,
        })?;
        let properties = WriterProperties::builder()
            .set_compression(codec.compression()?)
            .set_max_row_group_row_count(Some(self.row_group_rows))
            .build();
        let mut writer =
            ArrowWriter::try_new(file, schema(), Some(properties)).map_err(parquet_error)?;
        // One seed for every codec: the two files hold the same rows.
        let mut rng = SmallRng::seed_from_u64(0x5eed);
        let mut first_id = 0u64;
        while first_id < self.rows {
            let rows = usize::try_from(self.rows - first_id)
                .unwrap_or(usize::MAX)
                .min(WRITE_BATCH_ROWS);
            writer
                .write(&batch(&mut rng, first_id, rows)?)
                .map_err(parquet_error)?;
            first_id += rows as u64;
        }
        writer.close().map_err(parquet_error)?;
        Ok(())
    }
}

/// The schema of the training file.
pub fn schema() -> SchemaRef {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    fields.extend(
        (0..FEATURE_COLUMNS)
            .map(|index| Field::new(format!("feature_{index}"), DataType::Float32, true)),
    );
    fields.push(Field::new(
        "embedding",
        DataType::FixedSizeList(
            Arc::new(Field::new("item", DataType::Float32, false)),
            EMBEDDING_LENGTH,
        ),
        false,
    ));
    fields.push(Field::new("category", DataType::Utf8, true));
    fields.push(Field::new(
        "history",
        DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
        true,
    ));
    Arc::new(Schema::new(fields))
}

/// Rows `[first_id, first_id + rows)`, drawing every value from `rng`.
pub fn batch(rng: &mut SmallRng, first_id: u64, rows: usize) -> Result<RecordBatch> {
    let ids = (first_id..first_id + rows as u64).map(|id| i64::try_from(id).unwrap_or(i64::MAX));
    let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(ids))];
    for _ in 0..FEATURE_COLUMNS {
        let mut builder = Float32Builder::with_capacity(rows);
        for _ in 0..rows {
            if rng.random_ratio(1, 50) {
                builder.append_null();
            } else {
                builder.append_value(rng.random::<f32>());
            }
        }
        columns.push(Arc::new(builder.finish()));
    }
    let embedding_values: Float32Array = (0..rows * EMBEDDING_LENGTH as usize)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    columns.push(Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        EMBEDDING_LENGTH,
        Arc::new(embedding_values),
        None,
    )));
    let mut category = StringBuilder::with_capacity(rows, rows * 12);
    for _ in 0..rows {
        category.append_value(format!("category_{}", rng.random_range(0..CATEGORIES)));
    }
    columns.push(Arc::new(category.finish()));
    let mut history =
        ListBuilder::with_capacity(Int64Builder::with_capacity(rows * MAX_HISTORY / 2), rows);
    for _ in 0..rows {
        for _ in 0..rng.random_range(0..=MAX_HISTORY) {
            history
                .values()
                .append_value(rng.random_range(0..10_000_000));
        }
        history.append(true);
    }
    columns.push(Arc::new(history.finish()));
    RecordBatch::try_new(schema(), columns).map_err(|source| BenchError::Arrow {
        operation: "building a batch of training rows".to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_is_reused_and_a_damaged_one_replaced() {
        let directory = tempfile::tempdir().expect("tempdir");
        let sut = TrainingFile {
            rows: 3_000,
            row_group_rows: 1_000,
        };
        let path = sut.ensure(directory.path(), Codec::Zstd).expect("written");
        let metadata = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).expect("open"))
            .expect("footer")
            .metadata()
            .clone();
        assert_eq!(metadata.file_metadata().num_rows(), 3_000);
        assert_eq!(metadata.num_row_groups(), 3);
        let written = std::fs::metadata(&path)
            .expect("stat")
            .modified()
            .expect("mtime");
        assert_eq!(
            sut.ensure(directory.path(), Codec::Zstd).expect("reused"),
            path
        );
        assert_eq!(
            std::fs::metadata(&path)
                .expect("stat")
                .modified()
                .expect("mtime"),
            written,
            "a complete file is not written again"
        );
        std::fs::write(&path, b"PAR1 not a parquet file").expect("damage");
        sut.ensure(directory.path(), Codec::Zstd)
            .expect("rewritten");
        assert!(sut.is_complete(&path), "the damaged file was replaced");
        let leftovers: Vec<_> = std::fs::read_dir(directory.path())
            .expect("list")
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().contains("partial"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn rows_have_the_documented_shape() {
        let mut rng = SmallRng::seed_from_u64(1);
        let sut = batch(&mut rng, 10, 500).expect("batch");
        assert_eq!(sut.num_rows(), 500);
        assert_eq!(sut.schema(), schema());
        let ids = sut
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("ids");
        assert_eq!(ids.value(0), 10);
        assert_eq!(ids.value(499), 509);
        let embedding = sut
            .column(1 + FEATURE_COLUMNS)
            .as_any()
            .downcast_ref::<FixedSizeListArray>()
            .expect("embedding");
        assert_eq!(embedding.values().len(), 500 * 64);
        let feature_nulls: usize = (1..=FEATURE_COLUMNS)
            .map(|column| sut.column(column).null_count())
            .sum();
        assert!(
            feature_nulls > 0 && feature_nulls < 500,
            "{feature_nulls} nulls in 4000 feature values"
        );
    }
}
