//! One suite of source operations (list, ranged reads, globs, Parquet datasets, Delta tables with deletion
//! vectors) run against the local file system and against a real S3 server (SeaweedFS) on 127.0.0.1.

mod common;

use std::path::Path;

use arrow::array::{Array, Int64Array, RecordBatch};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::store::open_location;
use sluice_formats::{Dataset, Expr, FormatKind, OpenOptions, ReadOptions, StorageOptions};
use sluice_testkit::{BUCKET, s3_options, start_seaweed, wait_for_bucket};

fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|batch| {
            batch
                .column_by_name("id")
                .expect("id")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .values()
                .to_vec()
        })
        .collect()
}

/// Copies a local directory tree into the store under `root`.
async fn upload(local: &Path, root: &str, options: &StorageOptions) {
    let location = open_location(root, options).expect("location");
    let mut pending = vec![local.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for entry in std::fs::read_dir(&directory).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path
                .strip_prefix(local)
                .expect("inside")
                .to_string_lossy()
                .into_owned();
            let mut target = location.path.clone();
            for part in relative.split('/') {
                target = target.join(part);
            }
            let bytes = std::fs::read(&path).expect("read file");
            location
                .store
                .put(&target, PutPayload::from(bytes))
                .await
                .expect("upload");
        }
    }
}

async fn suite(root: &str, options: StorageOptions, testdata: &Path) {
    let open = OpenOptions {
        storage_options: options.clone(),
        ..OpenOptions::default()
    };
    for format in [FormatKind::Parquet, FormatKind::Delta] {
        let out = format!("{root}/gen_{format:?}");
        let generate_options = GenerateOptions {
            out: out.clone(),
            rows: 1000,
            files: 3,
            format,
            row_group_rows: 128,
            seed: 9,
            storage_options: options.clone(),
        };
        generate(&generate_options, &|_| {})
            .await
            .expect("generates");
        let dataset = Dataset::open(&out, &open).await.expect("opens");
        assert_eq!(dataset.kind(), format, "{out}");
        assert_eq!(
            dataset.file_count(),
            3,
            "{out}: listing finds the data files"
        );
        let splits = dataset.plan(100).await.expect("plans");
        let mut seen = Vec::new();
        for split in &splits {
            let batches: Vec<RecordBatch> = dataset
                .read_split(split, &ReadOptions::default())
                .await
                .expect("ranged read")
                .try_collect()
                .await
                .expect("decode");
            assert_eq!(common::row_count(&batches) as u64, split.row_count);
            seen.extend(ids(&batches));
        }
        assert_eq!(
            seen,
            (0..1000).collect::<Vec<i64>>(),
            "{out}: every id exactly once"
        );
        let filtered = ReadOptions {
            filter: Some(Expr::parse("id >= 500 and id < 520").expect("parses")),
            ..ReadOptions::default()
        };
        let batches = common::read_all(&out, &open, &filtered)
            .await
            .expect("filtered read");
        assert_eq!(ids(&batches), (500..520).collect::<Vec<i64>>());
    }
    let glob = format!("{root}/gen_Parquet/part-0000[02].parquet");
    let globbed = Dataset::open(&glob, &open).await.expect("glob");
    assert_eq!(globbed.file_count(), 2, "{glob}");
    let missing = Dataset::open(&format!("{root}/nothing-here"), &open)
        .await
        .expect_err("empty prefix");
    assert!(missing.to_string().contains("nothing-here"), "{missing}");

    let table = format!("{root}/table-with-dv-small");
    upload(
        &testdata.join("delta/table-with-dv-small"),
        &table,
        &options,
    )
    .await;
    let latest = common::read_all(&table, &open, &ReadOptions::default())
        .await
        .expect("delta latest");
    assert_eq!(
        common::row_count(&latest),
        8,
        "the deletion vector applies in {table}"
    );
    let first = OpenOptions {
        version: Some(0),
        ..open.clone()
    };
    let at_zero = common::read_all(&table, &first, &ReadOptions::default())
        .await
        .expect("delta version 0");
    assert_eq!(common::row_count(&at_zero), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_suite_on_the_local_file_system() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = format!("file://{}", directory.path().display());
    suite(&root, StorageOptions::new(), &sluice_testkit::testdata()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_suite_on_s3() {
    let server = start_seaweed();
    let options = s3_options();
    wait_for_bucket(&server, &options).await;
    suite(
        &format!("s3://{BUCKET}/suite"),
        options.clone(),
        &sluice_testkit::testdata(),
    )
    .await;

    let mut wrong = options;
    wrong.insert(
        "aws_secret_access_key".to_string(),
        "not-the-secret".to_string(),
    );
    let open = OpenOptions {
        storage_options: wrong,
        ..OpenOptions::default()
    };
    let error = Dataset::open(&format!("s3://{BUCKET}/suite/gen_Parquet"), &open)
        .await
        .expect_err("bad credentials");
    assert!(
        error
            .to_string()
            .contains("s3://sluice-test/suite/gen_Parquet"),
        "{error}"
    );
}
