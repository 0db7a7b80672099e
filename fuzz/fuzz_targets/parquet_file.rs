//! A Parquet file written by the real writer (row groups of several pages, dictionary and plain
//! pages, nulls, strings, lists, a page index, three codecs), its bytes then changed (anywhere, or
//! mostly in its footer) and cut to any length, is planned and read by `sluice-formats` as the
//! daemon reads it: the footer through the footer cache and its checks, each split's pages through
//! the decoder over the local file reader (a mapping of the file, or reads of it). Every step gives
//! rows or an error: never a panic, an abort, an allocation past the fuzzer's limit, or a read that
//! yields more rows than its split covers.

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use arrow::array::{ArrayRef, Int32Array, Int64Array, ListArray, RecordBatch, StringArray};
use arrow::datatypes::Float32Type;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use sluice_formats::{Dataset, Expr, LocalIo, OpenOptions, ReadOptions};

#[derive(Arbitrary, Debug)]
struct Input {
    /// Which honest file the input starts from.
    base: u8,
    /// Bytes set from the start of the footer on: (offset modulo the footer's length and its tail, value).
    footer_patches: Vec<(u16, u8)>,
    /// Bytes set anywhere: (offset modulo the file's length, value).
    patches: Vec<(u32, u8)>,
    /// The length the file is cut to, if any (modulo its length plus one).
    length: Option<u32>,
    /// The rows of a task, less one.
    task_rows: u16,
    /// Whether the read filters (and so prunes by statistics, bloom filters and the page index).
    filter: bool,
}

/// The honest files, with the offset of each one's footer.
fn bases() -> &'static [(Vec<u8>, usize)] {
    static BASES: OnceLock<Vec<(Vec<u8>, usize)>> = OnceLock::new();
    BASES.get_or_init(|| {
        let plain = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .set_data_page_row_count_limit(20)
            .set_write_batch_size(20)
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_bloom_filter_enabled(true);
        [
            plain.clone().build(),
            plain.clone().set_compression(Compression::SNAPPY).build(),
            plain
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_writer_version(WriterVersion::PARQUET_2_0)
                .set_dictionary_enabled(false)
                .build(),
        ]
        .into_iter()
        .map(|properties| {
            let mut bytes = Vec::new();
            let batch = batch(250);
            let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties))
                .expect("a writer");
            writer.write(&batch).expect("written");
            writer.close().expect("closed");
            let tail = bytes.len() - 8;
            let length = u32::from_le_bytes(bytes[tail..tail + 4].try_into().expect("four bytes"));
            let footer = tail - length as usize;
            (bytes, footer)
        })
        .collect()
    })
}

fn batch(rows: i64) -> RecordBatch {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
    let labels: ArrayRef = Arc::new(Int32Array::from_iter(
        (0..rows).map(|row| (row % 7 != 0).then_some((row % 10) as i32)),
    ));
    let names: ArrayRef = Arc::new(StringArray::from_iter(
        (0..rows).map(|row| (row % 5 != 0).then(|| format!("name-{}", row % 13))),
    ));
    let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
        (0..rows).map(|row| {
            (row % 11 != 0).then(|| {
                (0..row % 4)
                    .map(|value| Some(value as f32))
                    .collect::<Vec<_>>()
            })
        }),
    ));
    RecordBatch::try_from_iter([
        ("id", ids),
        ("label", labels),
        ("name", names),
        ("scores", lists),
    ])
    .expect("a batch")
}

/// The file of this process's own that each input is written to.
fn file_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("sluice-fuzz-{}.parquet", std::process::id()))
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// Plans the file and reads every split as the daemon does, checking that each read's batches tile
/// its split and hold no more rows than it covers.
async fn plan_and_read(uri: &str, task_rows: u64, filter: bool) {
    let options = OpenOptions {
        local_io: LocalIo::Pread,
        ..OpenOptions::default()
    };
    let Ok(dataset) = Dataset::open(uri, &options).await else {
        return;
    };
    let Ok(splits) = dataset.plan(task_rows).await else {
        return;
    };
    let read_options = ReadOptions {
        filter: filter.then(|| Expr::parse("label >= 3 and name = 'name-4'").expect("a filter")),
        batch_rows: 64,
        ..ReadOptions::default()
    };
    for split in &splits {
        assert!(
            split.row_count <= task_rows,
            "a split of more rows than a task"
        );
        let Ok(mut batches) = dataset.read_split_covered(split, &read_options).await else {
            let _ = dataset.bad_data_unit(split, 0).await;
            continue;
        };
        let mut covered_end = 0u64;
        while let Some(covered) = batches.next().await {
            match covered {
                Ok(covered) => {
                    assert_eq!(covered.first_row, covered_end, "batches tile their split");
                    assert!(covered.batch.num_rows() as u64 <= covered.row_count);
                    covered_end = covered.end();
                    assert!(covered_end <= split.row_count, "a batch past its split");
                }
                Err(_) => {
                    let _ = dataset.bad_data_unit(split, covered_end).await;
                    break;
                }
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let bases = bases();
    let (base, footer) = &bases[usize::from(input.base) % bases.len()];
    let mut bytes = base.clone();
    let footer_span = bytes.len() - footer;
    for &(offset, value) in &input.footer_patches {
        bytes[footer + usize::from(offset) % footer_span] = value;
    }
    let length = bytes.len();
    for &(offset, value) in &input.patches {
        bytes[offset as usize % length] = value;
    }
    if let Some(cut) = input.length {
        bytes.truncate(cut as usize % (length + 1));
    }
    let path = file_path();
    std::fs::write(path, &bytes).expect("the changed file");
    let uri = format!("file://{}", path.display());
    let task_rows = u64::from(input.task_rows) + 1;
    runtime().block_on(plan_and_read(&uri, task_rows, input.filter));
});
