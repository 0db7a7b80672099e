//! Files that lie about their sizes and row counts: each is bad data, a clean error naming the file
//! and the field (or a file a skipping plan leaves out), through the real plan and read paths;
//! never an abort, an allocation sized by the lie, or rows that do not exist.

mod common;

use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use sluice_formats::{Dataset, FormatError, OpenOptions, ReadOptions, SplitBatch};
use sluice_testkit::lying::{
    Step, claim_rows, column_field, column_path, honest_parquet, row_group_field, row_group_path,
    set_footer_i64,
};

/// 1,000 rows in row groups of 250.
const ROWS: i64 = 1000;
const GROUP_ROWS: i64 = 250;

fn honest(directory: &Path, name: &str) -> std::path::PathBuf {
    let path = directory.join(name);
    honest_parquet(&path, ROWS, GROUP_ROWS);
    path
}

fn uri_of(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Opens the file and plans it in tasks of `task_rows` rows.
async fn plan(path: &Path, task_rows: u64) -> sluice_formats::Result<Vec<sluice_formats::Split>> {
    Dataset::open(&uri_of(path), &OpenOptions::default())
        .await?
        .plan(task_rows)
        .await
}

/// Reads the file whole, as `sluice read` does.
async fn read(path: &Path) -> sluice_formats::Result<u64> {
    let batches = common::read_all(
        &uri_of(path),
        &OpenOptions::default(),
        &ReadOptions::default(),
    )
    .await?;
    Ok(batches.iter().map(|batch| batch.num_rows() as u64).sum())
}

/// Asserts that `error` is bad data naming `path` and every one of `words`.
fn assert_names(error: &FormatError, path: &Path, words: &[&str]) {
    let message = error.to_string();
    assert!(error.is_bad_data(), "a lying file is bad data: {message}");
    assert!(
        message.contains(&path.display().to_string()),
        "the error names the file: {message}"
    );
    for word in words {
        assert!(message.contains(word), "the error names {word}: {message}");
    }
}

/// Plans a dataset of the lying file and an honest one, leaving out what does not decode: the
/// lying file is left out with its cause, and the honest one's rows are all planned.
async fn left_out_beside_an_honest_file(directory: &Path, liar: &Path, words: &[&str]) {
    honest(directory, "honest.parquet");
    let options = OpenOptions {
        skip_bad_files: true,
        ..OpenOptions::default()
    };
    let dataset = Dataset::open(&uri_of(directory), &options)
        .await
        .expect("the dataset opens with its honest file's schema");
    let (splits, left_out) = dataset.plan_leaving_out(300).await.expect("plans");
    assert_eq!(left_out.len(), 1, "{left_out:?}");
    assert!(
        left_out[0].uri.ends_with(
            &liar
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        )
    );
    for word in words {
        assert!(left_out[0].cause.contains(word), "{}", left_out[0].cause);
    }
    assert_eq!(
        splits.iter().map(|split| split.row_count).sum::<u64>(),
        ROWS as u64,
        "every row of the honest file is planned"
    );
}

#[tokio::test]
async fn a_footer_claiming_two_to_the_62_rows_is_refused_naming_the_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "huge.parquet");
    claim_rows(&path, 0, 1 << 62, None);
    for error in [
        plan(&path, 1000)
            .await
            .expect_err("the plan refuses the file"),
        read(&path).await.expect_err("the read refuses the file"),
    ] {
        assert_names(
            &error,
            &path,
            &[
                "row_groups[0].num_rows",
                "4611686018427387904",
                "num_values",
            ],
        );
    }
    left_out_beside_an_honest_file(directory.path(), &path, &["row_groups[0].num_rows"]).await;
}

/// The footer agrees with itself: the column chunks claim as many values as the row group claims
/// rows, more than chunks of their size can hold.
#[tokio::test]
async fn a_footer_whose_values_claim_two_to_the_62_too_is_refused_naming_the_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "huge-values.parquet");
    claim_rows(&path, 0, 1 << 62, Some(1 << 62));
    let error = plan(&path, 1000)
        .await
        .expect_err("the plan refuses the file");
    assert_names(
        &error,
        &path,
        &["row_groups[0].columns[0].meta_data.num_values", "can hold"],
    );
}

#[tokio::test]
async fn negative_row_counts_are_refused_naming_the_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "negative.parquet");
    set_footer_i64(&path, &[(vec![Step::Field(3)], -5)]);
    let error = plan(&path, 1000)
        .await
        .expect_err("the plan refuses the file");
    assert_names(&error, &path, &["footer field num_rows is -5", "negative"]);
    let error = read(&path).await.expect_err("the read refuses the file");
    assert_names(&error, &path, &["num_rows is -5"]);

    let group = honest(directory.path(), "negative-group.parquet");
    set_footer_i64(
        &group,
        &[(row_group_path(2, row_group_field::NUM_ROWS), -5)],
    );
    let error = plan(&group, 1000)
        .await
        .expect_err("the plan refuses the file");
    assert_names(
        &error,
        &group,
        &["row_groups[2].num_rows is -5", "negative"],
    );
}

#[tokio::test]
async fn a_column_chunk_claiming_more_bytes_than_its_file_holds_is_refused_naming_the_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "wide.parquet");
    set_footer_i64(
        &path,
        &[(
            column_path(1, 0, column_field::TOTAL_COMPRESSED_SIZE),
            1 << 45,
        )],
    );
    for error in [
        plan(&path, 1000)
            .await
            .expect_err("the plan refuses the file"),
        read(&path).await.expect_err("the read refuses the file"),
    ] {
        assert_names(
            &error,
            &path,
            &[
                "row_groups[1].columns[0].meta_data.total_compressed_size is 35184372088832",
                "past the file",
            ],
        );
    }
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let offset = honest(elsewhere.path(), "far.parquet");
    set_footer_i64(
        &offset,
        &[(column_path(3, 1, column_field::DATA_PAGE_OFFSET), 1 << 45)],
    );
    let error = plan(&offset, 1000)
        .await
        .expect_err("the plan refuses the file");
    assert_names(
        &error,
        &offset,
        &[
            "row_groups[3].columns[1].meta_data.data_page_offset",
            "past the file",
        ],
    );
    left_out_beside_an_honest_file(directory.path(), &path, &["total_compressed_size"]).await;
}

/// Row group 1 claims 2^31 rows and holds 250, its column chunks claiming 250 values: the footer
/// contradicts itself, and the plan makes no split of the claimed rows.
#[tokio::test]
async fn a_row_group_claiming_more_rows_than_its_columns_hold_values_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "long.parquet");
    claim_rows(&path, 1, 1 << 31, None);
    let error = plan(&path, 1000)
        .await
        .expect_err("the plan refuses the file");
    assert_names(
        &error,
        &path,
        &[
            "row_groups[1].num_rows is 2147483648",
            "its num_values is 250",
        ],
    );
    let error = read(&path).await.expect_err("the read refuses the file");
    assert_names(&error, &path, &["row_groups[1].num_rows"]);
}

/// Row group 1 claims 2^31 rows and its column chunks 2^31 values, but its pages hold 250: the
/// footer agrees with itself, so the plan believes it, and the reads find the lie. Every split of
/// the claimed rows past the 250 fails as bad data whose unit is the rest of the row group, and
/// none yields a row that is not in the file.
#[tokio::test]
async fn a_row_group_whose_pages_hold_fewer_rows_than_claimed_is_bad_data_covering_the_claim() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = honest(directory.path(), "short.parquet");
    claim_rows(&path, 1, 1 << 31, Some(1 << 31));
    let task_rows = 1 << 26;
    let splits = plan(&path, task_rows)
        .await
        .expect("the footer agrees with itself");
    let claimed: u64 = splits.iter().map(|split| split.row_count).sum();
    assert_eq!(claimed, (1 << 31) + 750);
    let dataset = Arc::new(
        Dataset::open(&uri_of(&path), &OpenOptions::default())
            .await
            .expect("opens"),
    );
    let group_end = 250 + (1u64 << 31);
    let mut rows = 0u64;
    let mut failed = 0;
    for split in &splits {
        let read: sluice_formats::Result<Vec<SplitBatch>> = async {
            dataset
                .read_split_covered(split, &ReadOptions::default())
                .await?
                .try_collect()
                .await
        }
        .await;
        match read {
            Ok(batches) => {
                rows += batches
                    .iter()
                    .map(|covered| covered.batch.num_rows() as u64)
                    .sum::<u64>()
            }
            Err(error) => {
                failed += 1;
                assert!(error.is_bad_data(), "{error}");
                assert!(
                    error.to_string().contains(&path.display().to_string()),
                    "{error}"
                );
                let first = split.first_row;
                assert!(
                    first < group_end && first + split.row_count > 250,
                    "split {} fails: {error}",
                    split.task_id
                );
                let in_group = 250u64.saturating_sub(first);
                let unit = dataset
                    .bad_data_unit(split, in_group)
                    .await
                    .expect("a unit");
                assert_eq!(unit.row_group, Some(1), "the unit is the lying row group");
                assert_eq!(
                    first + unit.end,
                    group_end.min(first + split.row_count),
                    "the unit runs to the row group's claimed end"
                );
                if first == 250 {
                    assert!(
                        error.to_string().contains("row group 1 claims 2147483648 rows (footer field row_groups[1].num_rows)"),
                        "{error}"
                    );
                }
            }
        }
    }
    assert!(
        rows <= ROWS as u64,
        "no read yields rows that are not in the file: {rows}"
    );
    assert_eq!(
        failed,
        splits
            .iter()
            .filter(|split| split.first_row < group_end && split.first_row + split.row_count > 250)
            .count()
    );
    let error = read(&path)
        .await
        .expect_err("a read of the whole file fails");
    assert_names(&error, &path, &[]);
}
