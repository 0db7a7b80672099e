//! The feeder on real data: a stop mid-task on a filtered source or a table with a deletion vector,
//! then the rest of the task on another feeder, delivers every row once; the shuffle is seeded; the
//! interleave keeps each task's batches in order; the transforms shape what the rings get; a task
//! whose file changed after it was planned fails naming it.

use std::sync::{Arc, Mutex};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use sluice_formats::generate::{GenerateOptions, generate};
use sluice_formats::{Dataset, Expr, FormatKind, OpenOptions, ReadOptions};
use sluice_proto::v1;
use tokio::sync::{mpsc, watch};

use crate::feeder::{
    Control, EpochCount, Job, LocalFloor, Pipeline, RingFeed, Settled, StreamPoint, feed, lock,
    open_pipeline,
};
use crate::shuffle::split_order;
use crate::tune::{HostLimits, Tuning};
use crate::writer::Write;

/// One batch record the feeder handed to the writer.
#[derive(Debug, Clone)]
struct Delivered {
    task_id: u64,
    first_row: u64,
    row_count: u64,
    batch: RecordBatch,
}

impl Delivered {
    fn ids(&self, column: &str) -> Vec<i64> {
        let values = self.batch.column_by_name(column).expect("id column");
        let values = arrow::compute::cast(values, &DataType::Int64).expect("an integer column");
        values.as_primitive::<Int64Type>().values().to_vec()
    }
}

/// How a test job reads and shapes its data.
#[derive(Debug, Clone, Default)]
struct JobShape {
    filter: Option<String>,
    batch_size: u32,
    shuffle: Option<(u64, u32)>,
    fixed_batch_size: bool,
    transforms: Vec<v1::transform::Kind>,
    on_bad_data: v1::BadDataPolicy,
    even_batches: v1::EvenBatches,
    /// The daemon's caps on decode permits and read-ahead bytes; the host's when `None`.
    tuning: (Option<u32>, Option<u64>),
}

async fn pipeline(uri: &str, format: &str, shape: &JobShape) -> Arc<Pipeline> {
    let data = v1::JobData {
        sources: vec![v1::SourceData {
            uri: uri.to_owned(),
            format: format.to_owned(),
            columns: Vec::new(),
            filter: shape.filter.clone(),
            storage_options: Default::default(),
            version: None,
        }],
        batch_size: shape.batch_size,
        shuffle_seed: shape.shuffle.map_or(0, |(seed, _)| seed),
        shuffle_window: shape.shuffle.map_or(4, |(_, window)| window),
        epochs: 2,
        shuffle: shape.shuffle.is_some(),
        transforms: shape
            .transforms
            .iter()
            .cloned()
            .map(|kind| v1::Transform { kind: Some(kind) })
            .collect(),
        fixed_batch_size: shape.fixed_batch_size,
        cache: None,
        on_bad_data: shape.on_bad_data.into(),
        even_batches: shape.even_batches.into(),
        max_threads: shape.tuning.0.unwrap_or(0),
        max_read_ahead_bytes: shape.tuning.1.unwrap_or(0),
    };
    let (threads, read_ahead) = shape.tuning;
    let tuning = Arc::new(Tuning::new(HostLimits::read(), threads, read_ahead));
    Arc::new(
        open_pipeline(&data, tokio::runtime::Handle::current(), tuning, None)
            .await
            .expect("the pipeline opens"),
    )
}

/// The splits of a dataset, one per file (or per `task_rows` rows), on the wire.
async fn splits(uri: &str, task_rows: u64) -> Vec<v1::Split> {
    let dataset = Dataset::open(uri, &OpenOptions::default())
        .await
        .expect("opens");
    dataset
        .plan(task_rows)
        .await
        .expect("plans")
        .into_iter()
        .map(|split| v1::Split {
            uri: split.uri,
            file_size: split.file_size,
            first_row: split.first_row,
            row_count: split.row_count,
            partition_values: Vec::new(),
            delta: split.delta.map(|delta| v1::DeltaSplitInfo {
                version: delta.version,
                deletion_vector: delta.deletion_vector.map(|vector| v1::DeletionVector {
                    storage_type: vector.storage_type,
                    path_or_inline_dv: vector.path_or_inline_dv,
                    offset: vector.offset,
                    size_in_bytes: vector.size_in_bytes,
                    cardinality: vector.cardinality,
                }),
            }),
            source_index: 0,
            bytes: split.bytes.map(|bytes| v1::SplitBytes {
                start: bytes.start,
                end: bytes.end,
                first_row: bytes.first_row,
                rows: bytes.rows,
                crc32c: bytes.crc32c,
            }),
            identity: split.identity.map(|identity| v1::ObjectIdentity {
                e_tag: identity.e_tag,
                version: identity.version,
                modified_ns: identity.modified_ns,
            }),
        })
        .collect()
}

/// What a feeder shares with the daemon, for a job without `data.even_batches`: no count is ever
/// settled.
fn ring_feed() -> RingFeed {
    RingFeed {
        source_wait: Arc::default(),
        counted: Arc::default(),
        settled: watch::channel(Settled::default()).1,
        held: Arc::default(),
        local: None,
    }
}

fn assignment(
    task_id: u64,
    epoch: u32,
    split_index: u32,
    split: &v1::Split,
    start: u64,
    end: u64,
) -> v1::TaskAssignment {
    v1::TaskAssignment {
        task_id,
        epoch,
        split_index,
        start,
        end,
        split: Some(split.clone()),
    }
}

/// One task of epoch 0 per split, the whole split, numbered from 0.
fn whole_tasks(splits: &[v1::Split]) -> Vec<v1::TaskAssignment> {
    splits
        .iter()
        .enumerate()
        .map(|(index, split)| assignment(index as u64, 0, index as u32, split, 0, split.row_count))
        .collect()
}

/// Runs a feeder over `assignments`, every task of which must succeed, and returns what it wrote.
/// With `stop_after`, once the first batch of the first task arrives, the test asks that task to
/// stop `stop_after` rows past what the feeder had handed to the writer, as the daemon's main loop
/// does, and returns the row it stops at.
async fn run_feeder(
    pipeline: Arc<Pipeline>,
    assignments: Vec<v1::TaskAssignment>,
    stop_after: Option<u64>,
) -> (Vec<Delivered>, Option<u64>) {
    let (delivered, stopped_at, ends) = feed_tasks(pipeline, assignments, stop_after).await;
    for end in ends {
        assert_eq!(end.failed, None, "task {} failed", end.task_id);
    }
    (delivered, stopped_at)
}

/// How a task fed by [`feed_tasks`] ended: why it failed, if it did, and the rows it skipped.
#[derive(Debug)]
struct TaskEnd {
    task_id: u64,
    failed: Option<String>,
    skipped: Vec<v1::BadRange>,
}

/// Runs a feeder over `assignments` as [`run_feeder`] does, and returns besides what it wrote how
/// each task ended.
async fn feed_tasks(
    pipeline: Arc<Pipeline>,
    assignments: Vec<v1::TaskAssignment>,
    stop_after: Option<u64>,
) -> (Vec<Delivered>, Option<u64>, Vec<TaskEnd>) {
    let (jobs, queue) = mpsc::unbounded_channel();
    let (writer, mut written) = mpsc::channel(1);
    let mut controls = Vec::new();
    for assignment in assignments {
        let control = Arc::new(Mutex::new(Control {
            sent_end: assignment.start,
            ..Control::default()
        }));
        controls.push((assignment.clone(), control.clone()));
        jobs.send(Job {
            assignment,
            control,
        })
        .expect("the feeder runs");
    }
    drop(jobs);
    // Every task is queued before the feeder starts, so that the interleave, which draws among the
    // tasks open at each batch, sees the same open tasks in every run.
    let feeder = tokio::spawn(feed(queue, writer, pipeline, None, ring_feed()));
    let mut delivered = Vec::new();
    let mut stopped_at = None;
    while let Some(write) = written.recv().await {
        let Write::Batch {
            batch,
            task_id,
            first_row,
            row_count,
            ..
        } = write
        else {
            continue;
        };
        delivered.push(Delivered {
            task_id,
            first_row,
            row_count,
            batch,
        });
        if let (Some(rows), None) = (stop_after, stopped_at) {
            let (assignment, control) = &controls[0];
            let mut control = lock(control);
            let at = (control.sent_end + rows).min(assignment.end);
            control.stop = Some(at);
            stopped_at = Some(at);
        }
    }
    feeder.await.expect("the feeder ends");
    let ends = controls
        .iter()
        .map(|(assignment, control)| {
            let control = lock(control);
            TaskEnd {
                task_id: assignment.task_id,
                failed: control.failed.clone(),
                skipped: control.skipped.clone(),
            }
        })
        .collect();
    (delivered, stopped_at, ends)
}

/// Checks that a task's batches tile `[start, end)` and returns its ids in order.
fn tiled_ids(
    delivered: &[Delivered],
    task_id: u64,
    start: u64,
    end: u64,
    column: &str,
) -> Vec<i64> {
    let mut next = start;
    let mut ids = Vec::new();
    for batch in delivered.iter().filter(|batch| batch.task_id == task_id) {
        assert_eq!(
            batch.first_row, next,
            "task {task_id}: batches follow one another"
        );
        assert!(batch.row_count >= batch.batch.num_rows() as u64);
        next += batch.row_count;
        ids.extend(batch.ids(column));
    }
    assert_eq!(
        next, end,
        "task {task_id}: batches cover the task to its end"
    );
    ids
}

async fn generated(directory: &std::path::Path, rows: u64, files: u64) -> String {
    let out = directory.join("data").to_string_lossy().into_owned();
    let options = GenerateOptions {
        out: out.clone(),
        rows,
        files,
        format: FormatKind::Parquet,
        row_group_rows: 500,
        seed: 3,
        storage_options: Default::default(),
    };
    generate(&options, &|_| {}).await.expect("generates");
    out
}

/// The ids of a split that pass `filter`, in split order, read and filtered afterwards.
async fn filtered_afterwards(
    uri: &str,
    split: &v1::Split,
    filter: Option<&str>,
    column: &str,
) -> Vec<i64> {
    let dataset = Dataset::open(uri, &OpenOptions::default())
        .await
        .expect("opens");
    let plan = dataset.plan(u64::MAX).await.expect("plans");
    let read = plan
        .iter()
        .find(|candidate| candidate.uri == split.uri)
        .expect("the split's file");
    let mut ids = Vec::new();
    let mut stream = dataset
        .read_split(read, &ReadOptions::default())
        .await
        .expect("reads");
    let expression = filter.map(|text| Expr::parse(text).expect("parses"));
    let mut row = 0u64;
    while let Some(batch) = futures::StreamExt::next(&mut stream).await {
        let batch = batch.expect("decodes");
        let keep = expression
            .as_ref()
            .map(|expression| expression.evaluate(&batch).expect("evaluates"));
        let values = batch.column_by_name(column).expect("column");
        let values = values.as_primitive::<Int64Type>();
        for index in 0..batch.num_rows() {
            let in_split = (split.first_row..split.first_row + split.row_count).contains(&row);
            let kept = keep
                .as_ref()
                .is_none_or(|mask| mask.is_valid(index) && mask.value(index));
            if in_split && kept {
                ids.push(values.value(index));
            }
            row += 1;
        }
    }
    ids
}

const FILTER: &str = "(id >= 100 and id < 1400) or id >= 2500 or id = 1777";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_task_on_a_filtered_source_delivers_every_row_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 3000, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let in_file_order = filtered_afterwards(&uri, &split, Some(FILTER), "id").await;
    assert_eq!(in_file_order.len(), 1300 + 500 + 1);
    for (shuffle, fixed_batch_size) in [
        (None, false),
        (None, true),
        (Some((5, 1)), false),
        (Some((5, 1)), true),
    ] {
        let shape = JobShape {
            filter: Some(FILTER.to_owned()),
            batch_size: 64,
            shuffle,
            fixed_batch_size,
            ..JobShape::default()
        };
        let expected: Vec<i64> = match shuffle {
            None => in_file_order.clone(),
            Some((seed, _)) => split_order(3000, seed, 1, 0)
                .into_iter()
                .map(i64::from)
                .filter(|id| in_file_order.contains(id))
                .collect(),
        };
        let pipeline = pipeline(&uri, "parquet", &shape).await;
        // The rows before 150 are all filtered out: a stop lands inside what the filter removed
        // as well as among rows that pass.
        for stop_after in [37, 150, 2000] {
            let first_piece = assignment(9, 1, 0, &split, 0, 3000);
            let (delivered, stopped_at) =
                run_feeder(pipeline.clone(), vec![first_piece], Some(stop_after)).await;
            let at = stopped_at.expect("the test stopped the task");
            let mut ids = tiled_ids(&delivered, 9, 0, at, "id");
            let rest = assignment(9, 1, 0, &split, at, 3000);
            let (delivered, _) = run_feeder(pipeline.clone(), vec![rest], None).await;
            ids.extend(tiled_ids(&delivered, 9, at, 3000, "id"));
            assert_eq!(
                ids, expected,
                "shuffle {shuffle:?}, fixed batches {fixed_batch_size}, stop after {stop_after} (at {at})"
            );
            if fixed_batch_size {
                let sizes: Vec<usize> = delivered
                    .iter()
                    .map(|batch| batch.batch.num_rows())
                    .collect();
                let (_, full) = sizes.split_last().expect("batches");
                assert!(full.iter().all(|rows| *rows == 64), "{sizes:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_mid_task_on_a_table_with_a_deletion_vector_delivers_every_row_once() {
    let table = sluice_testkit::testdata().join("delta/table-with-dv-small");
    let uri = table.to_string_lossy().into_owned();
    let split = splits(&uri, u64::MAX).await.remove(0);
    // Values 0..=9, one per row; the deletion vector removes rows 0 and 9.
    for shuffle in [None, Some((11, 1))] {
        let shape = JobShape {
            filter: Some("value != 4".to_owned()),
            batch_size: 2,
            shuffle,
            ..JobShape::default()
        };
        let kept: Vec<i64> = vec![1, 2, 3, 5, 6, 7, 8];
        let expected: Vec<i64> = match shuffle {
            None => kept.clone(),
            Some((seed, _)) => split_order(10, seed, 0, 0)
                .into_iter()
                .map(i64::from)
                .filter(|value| kept.contains(value))
                .collect(),
        };
        let pipeline = pipeline(&uri, "delta", &shape).await;
        for stop_after in [0, 1, 3] {
            let (delivered, stopped_at) = run_feeder(
                pipeline.clone(),
                vec![assignment(4, 0, 0, &split, 0, 10)],
                Some(stop_after),
            )
            .await;
            let at = stopped_at.expect("stopped");
            let mut values = tiled_ids(&delivered, 4, 0, at, "value");
            let (delivered, _) = run_feeder(
                pipeline.clone(),
                vec![assignment(4, 0, 0, &split, at, 10)],
                None,
            )
            .await;
            values.extend(tiled_ids(&delivered, 4, at, 10, "value"));
            assert_eq!(values, expected, "shuffle {shuffle:?}, stop at {at}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_order_is_seeded_and_changes_with_the_epoch() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 1200, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let order_of = |seed: u64, epoch: u32| {
        let uri = uri.clone();
        let split = split.clone();
        async move {
            let shape = JobShape {
                batch_size: 100,
                shuffle: Some((seed, 1)),
                ..JobShape::default()
            };
            let pipeline = pipeline(&uri, "parquet", &shape).await;
            let (delivered, _) = run_feeder(
                pipeline,
                vec![assignment(1, epoch, 0, &split, 0, 1200)],
                None,
            )
            .await;
            tiled_ids(&delivered, 1, 0, 1200, "id")
        }
    };
    let first = order_of(21, 0).await;
    assert_eq!(
        first,
        order_of(21, 0).await,
        "same seed and epoch, same order"
    );
    assert_ne!(first, order_of(21, 1).await, "another epoch, another order");
    assert_ne!(first, order_of(22, 0).await, "another seed, another order");
    assert_ne!(
        first,
        (0..1200).collect::<Vec<i64>>(),
        "the rows are permuted"
    );
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1200).collect::<Vec<i64>>(), "every row once");
    let unshuffled = pipeline(
        &uri,
        "parquet",
        &JobShape {
            batch_size: 100,
            ..JobShape::default()
        },
    )
    .await;
    let (delivered, _) =
        run_feeder(unshuffled, vec![assignment(1, 0, 0, &split, 0, 1200)], None).await;
    assert_eq!(
        tiled_ids(&delivered, 1, 0, 1200, "id"),
        (0..1200).collect::<Vec<i64>>(),
        "without a shuffle the rows keep their order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interleave_mixes_open_tasks_and_keeps_each_in_order() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 1200, 3).await;
    let all_splits = splits(&uri, u64::MAX).await;
    assert_eq!(all_splits.len(), 3);
    let assignments = whole_tasks(&all_splits);
    let shape = JobShape {
        batch_size: 50,
        shuffle: Some((8, 3)),
        ..JobShape::default()
    };
    let pipeline = pipeline(&uri, "parquet", &shape).await;
    let (delivered, _) = run_feeder(pipeline.clone(), assignments.clone(), None).await;
    let task_sequence: Vec<u64> = delivered.iter().map(|batch| batch.task_id).collect();
    let switches = task_sequence
        .windows(2)
        .filter(|pair| pair[0] != pair[1])
        .count();
    assert!(
        switches > 3,
        "the tasks' batches are interleaved: {task_sequence:?}"
    );
    let mut all_ids = Vec::new();
    let mut first_id = 0u64;
    for (index, split) in all_splits.iter().enumerate() {
        // The generator numbers rows across its files in file order.
        let expected: Vec<i64> = split_order(split.row_count as u32, 8, 0, index as u32)
            .into_iter()
            .map(|row| (first_id + u64::from(row)) as i64)
            .collect();
        first_id += split.row_count;
        let ids = tiled_ids(&delivered, index as u64, 0, split.row_count, "id");
        assert_eq!(ids, expected, "task {index} keeps its own order");
        all_ids.extend(ids);
    }
    all_ids.sort_unstable();
    assert_eq!(all_ids, (0..1200).collect::<Vec<i64>>());
    let (again, _) = run_feeder(pipeline, assignments, None).await;
    let again_sequence: Vec<u64> = again.iter().map(|batch| batch.task_id).collect();
    assert_eq!(task_sequence, again_sequence, "the interleave is seeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tightest_tuning_reads_the_same_batches_in_the_same_order_without_waiting_for_ever() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 1200, 3).await;
    let assignments = whole_tasks(&splits(&uri, 150).await);
    let shape = JobShape {
        batch_size: 50,
        shuffle: Some((8, 3)),
        ..JobShape::default()
    };
    let (roomy, _) = run_feeder(
        pipeline(&uri, "parquet", &shape).await,
        assignments.clone(),
        None,
    )
    .await;
    // One task decoding at a time, and a read-ahead of one byte: every task read holds its one
    // batch past the limit while the feeder takes the batches of the others, as the interleave
    // draws them.
    let tight = JobShape {
        tuning: (Some(1), Some(1)),
        ..shape
    };
    let pipeline = pipeline(&uri, "parquet", &tight).await;
    let (tuned, _) = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        run_feeder(pipeline.clone(), assignments, None),
    )
    .await
    .expect("a feeder waits on a task read that waits for bytes other tasks' batches hold");
    let rows = |delivered: &[Delivered]| -> Vec<(u64, u64, Vec<i64>)> {
        delivered
            .iter()
            .map(|batch| (batch.task_id, batch.first_row, batch.ids("id")))
            .collect()
    };
    assert_eq!(rows(&tuned), rows(&roomy));
    assert_eq!(roomy.iter().map(|batch| batch.row_count).sum::<u64>(), 1200);
    let figures = pipeline.tuning.figures();
    assert_eq!((figures.threads, figures.read_ahead), (1, 1));
    assert_eq!(
        figures.read_ahead_held, 0,
        "every batch's bytes were given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transforms_shape_the_batches_and_the_announced_schema() {
    use v1::transform::Kind;
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 700, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let shape = JobShape {
        batch_size: 128,
        fixed_batch_size: true,
        filter: Some("id >= 10".to_owned()),
        transforms: vec![
            Kind::FillNull(v1::FillNullTransform {
                column: "feature_0".to_owned(),
                value: "-1".to_owned(),
            }),
            Kind::Cast(v1::CastTransform {
                column: "feature_0".to_owned(),
                to: "float64".to_owned(),
            }),
            Kind::Normalize(v1::NormalizeTransform {
                column: "feature_0".to_owned(),
                mean: 0.5,
                std: 0.25,
            }),
            Kind::HashBucket(v1::HashBucketTransform {
                column: "category".to_owned(),
                buckets: 16,
                output: "category_bucket".to_owned(),
            }),
        ],
        ..JobShape::default()
    };
    let plain = pipeline(
        &uri,
        "parquet",
        &JobShape {
            batch_size: 700,
            filter: Some("id >= 10".to_owned()),
            ..JobShape::default()
        },
    )
    .await;
    let (raw, _) = run_feeder(plain, vec![assignment(0, 0, 0, &split, 0, 700)], None).await;
    let raw = arrow::compute::concat_batches(
        &raw[0].batch.schema(),
        raw.iter().map(|delivered| &delivered.batch),
    )
    .expect("joins");
    let sut = pipeline(&uri, "parquet", &shape).await;
    let (delivered, _) =
        run_feeder(sut.clone(), vec![assignment(0, 0, 0, &split, 0, 700)], None).await;
    assert_eq!(tiled_ids(&delivered, 0, 0, 700, "id").len(), 690);
    let sizes: Vec<usize> = delivered
        .iter()
        .map(|batch| batch.batch.num_rows())
        .collect();
    assert_eq!(sizes, vec![128, 128, 128, 128, 128, 50]);
    let output = arrow::compute::concat_batches(
        &delivered[0].batch.schema(),
        delivered.iter().map(|delivered| &delivered.batch),
    )
    .expect("joins");
    assert_eq!(
        output.schema(),
        sut.schema,
        "the rings announce the batches' schema"
    );
    let feature = output.column_by_name("feature_0").expect("feature_0");
    assert_eq!(feature.data_type(), &DataType::Float64);
    assert_eq!(feature.null_count(), 0);
    let raw_feature = raw
        .column_by_name("feature_0")
        .expect("feature_0")
        .as_primitive::<arrow::datatypes::Float32Type>();
    assert!(raw_feature.null_count() > 0, "the data has nulls to fill");
    for (index, value) in feature
        .as_primitive::<Float64Type>()
        .values()
        .iter()
        .enumerate()
    {
        let original = if raw_feature.is_null(index) {
            -1.0
        } else {
            f64::from(raw_feature.value(index))
        };
        assert!(
            (value - (original - 0.5) / 0.25).abs() < 1e-9,
            "row {index}"
        );
    }
    let buckets = output
        .column_by_name("category_bucket")
        .expect("bucket column")
        .as_primitive::<Int64Type>();
    let categories = raw
        .column_by_name("category")
        .expect("category")
        .as_string::<i32>();
    let mut bucket_of = std::collections::HashMap::new();
    for index in 0..output.num_rows() {
        let bucket = buckets.value(index);
        assert!((0..16).contains(&bucket));
        let previous = bucket_of.insert(categories.value(index).to_owned(), bucket);
        assert!(
            previous.is_none_or(|previous| previous == bucket),
            "one bucket per value"
        );
    }
    assert!(
        bucket_of
            .values()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 1
    );
}

/// The bytes the pipeline's sources fetched so far, as its fetch stage reports them.
fn fetched(pipeline: &Pipeline) -> u64 {
    pipeline
        .stage_stats()
        .iter()
        .find(|stage| stage.stage == "fetch")
        .map_or(0, |stage| stage.bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_task_stopped_midway_reads_its_split_bytes_and_every_row_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let batch = sluice_formats::generate::batch(5, 0, 3000).expect("batch");
    let columns: Vec<usize> = ["id", "label"]
        .iter()
        .map(|name| batch.schema().index_of(name).expect("column"))
        .collect();
    let path = directory.path().join("rows.csv");
    let mut writer = arrow::csv::Writer::new(std::fs::File::create(&path).expect("create"));
    writer
        .write(&batch.project(&columns).expect("projects"))
        .expect("write");
    drop(writer);
    let uri = path.to_string_lossy().into_owned();
    let file_size = std::fs::metadata(&path).expect("metadata").len();
    let split = splits(&uri, 1000).await.remove(1);
    let bytes = split.bytes.expect("a csv split carries its bytes");
    assert_eq!((split.first_row, split.row_count), (1000, 1000));
    for shuffle in [None, Some((5, 1))] {
        let shape = JobShape {
            batch_size: 64,
            shuffle,
            ..JobShape::default()
        };
        let pipeline = pipeline(&uri, "csv", &shape).await;
        let before = fetched(&pipeline);
        let first_piece = assignment(4, 1, 1, &split, 0, 1000);
        let (delivered, stopped_at) =
            run_feeder(pipeline.clone(), vec![first_piece], Some(150)).await;
        let at = stopped_at.expect("the test stopped the task");
        let mut ids = tiled_ids(&delivered, 4, 0, at, "id");
        let rest = assignment(4, 1, 1, &split, at, 1000);
        let (delivered, _) = run_feeder(pipeline.clone(), vec![rest], None).await;
        ids.extend(tiled_ids(&delivered, 4, at, 1000, "id"));
        let expected: Vec<i64> = match shuffle {
            None => (1000..2000).collect(),
            Some((seed, _)) => split_order(1000, seed, 1, 1)
                .into_iter()
                .map(|row| 1000 + i64::from(row))
                .collect(),
        };
        assert_eq!(ids, expected, "shuffle {shuffle:?}, stopped at {at}");
        let read = fetched(&pipeline) - before;
        assert_eq!(
            read,
            2 * (bytes.end - bytes.start),
            "shuffle {shuffle:?}: each piece of the task reads the split's bytes, not the file's {file_size}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_file_changed_after_planning_fails_naming_it_and_writes_no_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 2000, 1).await;
    let split = splits(&uri, 1000).await.remove(1);
    assert!(split.identity.is_some(), "the split is pinned to its file");
    // Written again after planning: the same bytes, a later modification time.
    let path = split.uri.strip_prefix("file://").expect("a local file");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    let planned = file.metadata().expect("stat").modified().expect("mtime");
    file.set_modified(planned + std::time::Duration::from_secs(1))
        .expect("set mtime");
    let pipeline = pipeline(&uri, "parquet", &JobShape::default()).await;
    let (delivered, _, ends) =
        feed_tasks(pipeline, vec![assignment(7, 0, 1, &split, 0, 1000)], None).await;
    assert!(
        delivered.is_empty(),
        "no row of the changed file is written"
    );
    let [
        TaskEnd {
            task_id: 7,
            failed: Some(reason),
            ..
        },
    ] = ends.as_slice()
    else {
        panic!("the task fails: {ends:?}");
    };
    assert!(
        reason.contains(&split.uri) && reason.contains("changed since it was planned"),
        "{reason}"
    );
}

/// Feeds the one task `task` of the source `uri` in `format` shaped by `shape`, which must end without failing;
/// returns what it wrote and the rows it skipped.
async fn feed_one_that_skips(
    uri: &str,
    format: &str,
    shape: &JobShape,
    task: v1::TaskAssignment,
) -> (Vec<Delivered>, Vec<v1::BadRange>) {
    let pipeline = pipeline(uri, format, shape).await;
    let (delivered, _, ends) = feed_tasks(pipeline, vec![task], None).await;
    let [
        TaskEnd {
            failed: None,
            skipped,
            ..
        },
    ] = ends.as_slice()
    else {
        panic!("the task ends without failing: {ends:?}");
    };
    (delivered, skipped.clone())
}

/// With `data.on_bad_data: skip`, a row group that does not decode is skipped, covered by an empty
/// batch and reported, and every other row of the task arrives once, with or without a shuffle;
/// with `fail`, the task fails naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_group_that_does_not_decode_is_skipped_and_reported_or_fails_the_task() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 3000, 1).await;
    sluice_testkit::corrupt_row_group(&std::path::Path::new(&uri).join("part-00000.parquet"), 2);
    let split = splits(&uri, 3000).await.remove(0);
    let expected: Vec<i64> = (0..1000).chain(1500..3000).collect();
    for shuffle in [None, Some((5, 1))] {
        let shape = JobShape {
            batch_size: 200,
            shuffle,
            on_bad_data: v1::BadDataPolicy::Skip,
            ..JobShape::default()
        };
        let (delivered, skipped) = feed_one_that_skips(
            &uri,
            "parquet",
            &shape,
            assignment(3, 0, 0, &split, 0, 3000),
        )
        .await;
        let [range] = skipped.as_slice() else {
            panic!("one skip is reported: {skipped:?}");
        };
        assert_eq!(
            (range.row_group, range.first_row, range.row_count),
            (Some(2), 1000, 500),
            "{range:?}"
        );
        assert!(
            range.uri.ends_with("part-00000.parquet") && !range.cause.is_empty(),
            "{range:?}"
        );
        let mut ids = tiled_ids(&delivered, 3, 0, 3000, "id");
        ids.sort_unstable();
        assert_eq!(
            ids, expected,
            "shuffle {shuffle:?}: every row but the bad group's, once"
        );
    }
    let pipeline = pipeline(
        &uri,
        "parquet",
        &JobShape {
            batch_size: 200,
            ..JobShape::default()
        },
    )
    .await;
    let (_, _, ends) = feed_tasks(pipeline, vec![assignment(4, 0, 0, &split, 0, 3000)], None).await;
    let [
        TaskEnd {
            failed: Some(reason),
            skipped,
            ..
        },
    ] = ends.as_slice()
    else {
        panic!("with on_bad_data: fail the task fails: {ends:?}");
    };
    assert!(
        skipped.is_empty() && reason.contains("part-00000.parquet"),
        "{reason}"
    );
}

/// A real file whose pages do not decode (`ARROW-GH-41321.parquet`, rep and def levels fewer than
/// its page header says): skipped row group by row group, each reported with the decoder's cause,
/// and the task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_corrupt_file_is_skipped_row_group_by_row_group() {
    let file = sluice_testkit::testdata().join("parquet/bad_data/ARROW-GH-41321.parquet");
    let uri = format!("file://{}", file.display());
    let split = splits(&uri, 1000).await.remove(0);
    let shape = JobShape {
        batch_size: 64,
        on_bad_data: v1::BadDataPolicy::Warn,
        ..JobShape::default()
    };
    let rows = split.row_count;
    let (delivered, skipped) = feed_one_that_skips(
        &uri,
        "parquet",
        &shape,
        assignment(1, 0, 0, &split, 0, rows),
    )
    .await;
    assert!(!skipped.is_empty(), "the corrupt pages are reported");
    let skipped_rows: u64 = skipped.iter().map(|range| range.row_count).sum();
    let delivered_rows: u64 = delivered
        .iter()
        .map(|batch| batch.batch.num_rows() as u64)
        .sum();
    assert_eq!(skipped_rows + delivered_rows, rows, "{skipped:?}");
    for range in skipped {
        assert!(
            range.row_group.is_some() && range.cause.contains("parquet file"),
            "{range:?}"
        );
    }
}

/// With `data.on_bad_data: skip`, a CSV or JSON lines record that does not decode is skipped alone
/// and reported; the records around it arrive once, with or without a shuffle, and from a task
/// that starts after a bad record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_or_json_lines_record_that_does_not_decode_is_skipped_alone() {
    let directory = tempfile::tempdir().expect("tempdir");
    // Past the rows the schema is inferred from, which would make the column text.
    let bad = [1300_i64, 1301, 1710];
    let row = |format: &str, id: i64| match (format, bad.contains(&id)) {
        ("csv", false) => format!("{id},{}.5\n", id * 2),
        ("csv", true) => format!("{id},not-a-number\n"),
        (_, false) => format!("{{\"id\": {id}, \"score\": {}.5}}\n", id * 2),
        (_, true) => format!("{{\"id\": {id}, \"score\": \"not-a-number\"}}\n"),
    };
    for (format, name) in [("csv", "rows.csv"), ("jsonl", "rows.jsonl")] {
        let path = directory.path().join(format).join(name);
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        let header = if format == "csv" { "id,score\n" } else { "" };
        let text: String = std::iter::once(header.to_owned())
            .chain((0..2000).map(|id| row(format, id)))
            .collect();
        std::fs::write(&path, text).expect("write");
        let uri = format!("file://{}", path.display());
        let split = splits(&uri, 5000).await.remove(0);
        assert!(split.bytes.is_some(), "{format}: planned with its bytes");
        for (shuffle, start) in [(None, 0), (Some((5, 1)), 0), (None, 1500)] {
            let shape = JobShape {
                batch_size: 64,
                shuffle,
                on_bad_data: v1::BadDataPolicy::Skip,
                ..JobShape::default()
            };
            let task = assignment(3, 0, 0, &split, start, 2000);
            let (delivered, skipped) = feed_one_that_skips(&uri, format, &shape, task).await;
            let expected_skips: Vec<(u64, u64)> = bad
                .iter()
                .filter(|id| **id >= start as i64)
                .map(|id| (*id as u64, 1))
                .collect();
            let mut found: Vec<(u64, u64)> = skipped
                .iter()
                .map(|range| (range.first_row, range.row_count))
                .collect();
            found.sort_unstable();
            assert_eq!(
                found, expected_skips,
                "{format}, shuffle {shuffle:?}, from {start}"
            );
            assert!(
                skipped
                    .iter()
                    .all(|range| range.row_group.is_none()
                        && range.cause.contains("does not decode")),
                "{skipped:?}"
            );
            let mut ids = tiled_ids(&delivered, 3, start, 2000, "id");
            ids.sort_unstable();
            let expected: Vec<i64> = (start as i64..2000)
                .filter(|id| !bad.contains(id))
                .collect();
            assert_eq!(ids, expected, "{format}, shuffle {shuffle:?}, from {start}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_ends_every_epoch_it_gets_no_task_in() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 100, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let shape = JobShape {
        batch_size: 50,
        ..JobShape::default()
    };
    let pipeline = pipeline(&uri, "parquet", &shape).await;
    let (jobs, queue) = mpsc::unbounded_channel();
    let (writer, mut written) = mpsc::channel(16);
    // A ring opened empty in epoch 0 whose first task is of epoch 2, its next of epoch 5.
    for (task_id, epoch) in [(0, 2), (1, 5)] {
        jobs.send(Job {
            assignment: assignment(task_id, epoch, 0, &split, 0, 50),
            control: Arc::new(Mutex::new(Control::default())),
        })
        .expect("the feeder runs");
    }
    drop(jobs);
    let feeder = tokio::spawn(feed(queue, writer, pipeline, Some(0), ring_feed()));
    let mut seen = Vec::new();
    while let Some(write) = written.recv().await {
        match write {
            Write::Batch { task_id, .. } => seen.push(format!("task {task_id}")),
            // Tagged with its epoch, so that a daemon that takes the ring over knows where it is.
            Write::EndOfEpoch { tag } => seen.push(match StreamPoint::of_tag(tag) {
                Some(StreamPoint::Ended { epoch }) => format!("end {epoch}"),
                other => format!("an end tagged {other:?}"),
            }),
            Write::Dropped { task_id, .. } => seen.push(format!("dropped {task_id}")),
            Write::Survey => {}
        }
    }
    feeder.await.expect("the feeder ends");
    // Epochs 0 and 1 end empty before epoch 2's task; epoch 2 and the empty 3 and 4 before 5's.
    assert_eq!(
        seen,
        [
            "end 0", "end 1", "task 0", "end 2", "end 3", "end 4", "task 1"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_padding_ring_ends_its_epoch_once_settled_with_pads_of_its_last_rows() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = generated(directory.path(), 100, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let shape = JobShape {
        batch_size: 10,
        fixed_batch_size: true,
        even_batches: v1::EvenBatches::Pad,
        ..JobShape::default()
    };
    let pipeline = pipeline(&uri, "parquet", &shape).await;
    assert_eq!(
        pipeline
            .ring_schema
            .field(pipeline.ring_schema.fields().len() - 1),
        &arrow::datatypes::Field::new("_sluice_pad", DataType::Boolean, false)
    );
    let (jobs, queue) = mpsc::unbounded_channel();
    let (writer, mut written) = mpsc::channel(1);
    let (settle, settled) = watch::channel(Settled::default());
    let feed_state = RingFeed {
        settled,
        ..ring_feed()
    };
    let counted = feed_state.counted.clone();
    // Epoch 0: 25 rows, three batches; epoch 1: 20 rows, two.
    for (task_id, epoch, start, end) in [(0, 0, 0, 25), (1, 1, 25, 45)] {
        jobs.send(Job {
            assignment: assignment(task_id, epoch, 0, &split, start, end),
            control: Arc::new(Mutex::new(Control {
                sent_end: start,
                ..Control::default()
            })),
        })
        .expect("the feeder runs");
    }
    let feeder = tokio::spawn(feed(queue, writer, pipeline, None, feed_state));
    let mut seen = Vec::new();
    let mut points = Vec::new();
    let mut record = |write: Write| match write {
        Write::Batch {
            batch,
            task_id,
            row_count,
            tag,
            ..
        } => {
            points.push(StreamPoint::of_tag(tag));
            let pads = batch
                .column_by_name("_sluice_pad")
                .expect("every batch has the pad column")
                .as_boolean()
                .clone();
            let padded = pads.true_count() == batch.num_rows() && batch.num_rows() > 0;
            assert!(
                padded || pads.true_count() == 0,
                "a batch is all pad or none"
            );
            let ids = Delivered {
                task_id,
                first_row: 0,
                row_count,
                batch,
            }
            .ids("id");
            seen.push(format!(
                "{}{task_id}:{}..{}",
                if padded { "pad " } else { "" },
                ids[0],
                ids[ids.len() - 1] + 1
            ));
        }
        Write::EndOfEpoch { tag } => {
            points.push(StreamPoint::of_tag(tag));
            seen.push("end".to_owned());
        }
        Write::Dropped { task_id, .. } => seen.push(format!("dropped {task_id}")),
        Write::Survey => {}
    };
    for _ in 0..3 {
        record(written.recv().await.expect("a batch of epoch 0"));
    }
    // The next epoch's task is queued, but epoch 0 ends only once its count is settled.
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), written.recv()).await;
    assert!(
        waited.is_err(),
        "the epoch ended before its count was settled"
    );
    assert_eq!(
        counted.report(),
        vec![v1::EpochBatches {
            epoch: 0,
            batches: 3
        }]
    );
    settle.send_modify(|settled| {
        settled.merge(&v1::SettledBatches {
            epochs: vec![v1::EpochBatches {
                epoch: 0,
                batches: 5,
            }],
            current_epoch: 1,
            allowed: Vec::new(),
        });
    });
    drop(jobs);
    while let Some(write) = written.recv().await {
        record(write);
    }
    feeder.await.expect("the feeder ends");
    assert_eq!(
        seen,
        [
            "0:0..10",
            "0:10..20",
            "0:20..25",
            "pad 0:20..25",
            "pad 0:20..25",
            "end",
            "1:25..35",
            "1:35..45"
        ]
    );
    assert_eq!(
        counted.report(),
        vec![
            v1::EpochBatches {
                epoch: 0,
                batches: 5
            },
            v1::EpochBatches {
                epoch: 1,
                batches: 2
            }
        ]
    );
    // Every record is tagged with its place in the stream, which a daemon that takes the ring over
    // reads back.
    let batch = |epoch, number| Some(StreamPoint::Batch { epoch, number });
    assert_eq!(
        points,
        [
            batch(0, 1),
            batch(0, 2),
            batch(0, 3),
            batch(0, 4),
            batch(0, 5),
            Some(StreamPoint::Ended { epoch: 0 }),
            batch(1, 1),
            batch(1, 2)
        ]
    );
    let tags: Vec<u64> = points.iter().flatten().map(|point| point.tag()).collect();
    assert!(tags.is_sorted(), "tags grow along the stream: {tags:?}");
    assert_eq!(StreamPoint::of_tag(0), None, "0 is no tag");
}

/// What the AM tells a feeder of `data.even_batches`: settled counts and, with `drop`, what every
/// ring may write meanwhile.
fn told(current_epoch: u32, settled: &[(u32, u64)], allowed: &[(u32, u64)]) -> v1::SettledBatches {
    let counts = |counts: &[(u32, u64)]| {
        counts
            .iter()
            .map(|&(epoch, batches)| v1::EpochBatches { epoch, batches })
            .collect()
    };
    v1::SettledBatches {
        epochs: counts(settled),
        current_epoch,
        allowed: counts(allowed),
    }
}

/// The pipeline of a job with `data.even_batches: drop` and batches of 10 rows over 100 rows
/// generated under `directory`, and the split of those rows.
async fn dropping_pipeline(directory: &std::path::Path) -> (Arc<Pipeline>, v1::Split) {
    let uri = generated(directory, 100, 1).await;
    let split = splits(&uri, u64::MAX).await.remove(0);
    let shape = JobShape {
        batch_size: 10,
        fixed_batch_size: true,
        even_batches: v1::EvenBatches::Drop,
        ..JobShape::default()
    };
    (pipeline(&uri, "parquet", &shape).await, split)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropping_ring_writes_what_every_ring_may_have_and_drops_the_rest_once_settled() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (pipeline, split) = dropping_pipeline(directory.path()).await;
    let (jobs, queue) = mpsc::unbounded_channel();
    let (writer, mut written) = mpsc::channel(16);
    let (settle, settled) = watch::channel(Settled::default());
    let feed_state = RingFeed {
        settled,
        ..ring_feed()
    };
    let counted = feed_state.counted.clone();
    let held = feed_state.held.clone();
    // Epoch 0: 25 rows, three batches; epoch 1: 20 rows, two.
    let controls: Vec<Arc<Mutex<Control>>> = [(0, 0, 0, 25), (1, 1, 25, 45)]
        .into_iter()
        .map(|(task_id, epoch, start, end)| {
            let control = Arc::new(Mutex::new(Control {
                sent_end: start,
                ..Control::default()
            }));
            jobs.send(Job {
                assignment: assignment(task_id, epoch, 0, &split, start, end),
                control: control.clone(),
            })
            .expect("the feeder runs");
            control
        })
        .collect();
    let feeder = tokio::spawn(feed(queue, writer, pipeline, None, feed_state));
    let describe = |write: Write| match write {
        Write::Batch {
            batch,
            task_id,
            row_count,
            tag,
            ..
        } => {
            let ids = Delivered {
                task_id,
                first_row: 0,
                row_count,
                batch,
            }
            .ids("id");
            let point = match StreamPoint::of_tag(tag) {
                Some(StreamPoint::Batch { epoch, number }) => format!("{epoch}.{number}"),
                other => format!("{other:?}"),
            };
            format!("{point} {task_id}:{}..{}", ids[0], ids[ids.len() - 1] + 1)
        }
        Write::Dropped {
            task_id,
            first_row,
            row_count,
        } => format!("dropped {task_id}:{first_row}..{}", first_row + row_count),
        Write::EndOfEpoch { .. } => "end".to_owned(),
        Write::Survey => "survey".to_owned(),
    };
    let quiet = std::time::Duration::from_millis(300);
    // Nothing is allowed yet: the three batches are made and held.
    assert!(tokio::time::timeout(quiet, written.recv()).await.is_err());
    assert_eq!(counted.batches(0), 3, "held batches are counted for the AM");
    assert_eq!(held.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(lock(&controls[0]).sent_end, 25, "held rows count as handed");
    // Every ring may have one.
    settle.send_modify(|settled| {
        settled.merge(&told(0, &[], &[(0, 1)]));
    });
    let first = written.recv().await.expect("the allowed batch");
    assert_eq!(describe(first), "0.1 0:0..10");
    assert!(tokio::time::timeout(quiet, written.recv()).await.is_err());
    // Settled at two: the second is written, the third dropped, and the epoch ends.
    settle.send_modify(|settled| {
        settled.merge(&told(1, &[(0, 2)], &[]));
    });
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(describe(written.recv().await.expect("epoch 0's close")));
    }
    assert_eq!(seen, ["0.2 0:10..20", "dropped 0:20..25", "end"]);
    assert_eq!(
        lock(&controls[0]).dropped,
        [v1::RowSpan {
            first_row: 20,
            row_count: 5
        }],
        "the main loop learns of the drop"
    );
    // Epoch 1 settles at its two batches: both are written, nothing is dropped.
    settle.send_modify(|settled| {
        settled.merge(&told(2, &[(1, 2)], &[]));
    });
    drop(jobs);
    let mut seen = Vec::new();
    while let Some(write) = written.recv().await {
        seen.push(describe(write));
    }
    feeder.await.expect("the feeder ends");
    assert_eq!(seen, ["1.1 1:25..35", "1.2 1:35..45", "end"]);
    assert!(lock(&controls[1]).dropped.is_empty());
    assert_eq!(held.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropping_ring_of_a_node_with_every_rank_writes_what_the_other_rings_made_at_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (pipeline, split) = dropping_pipeline(directory.path()).await;
    let (jobs, queue) = mpsc::unbounded_channel();
    let (writer, mut written) = mpsc::channel(16);
    let (settle, settled) = watch::channel(Settled::default());
    let settle = Arc::new(settle);
    let counted: Arc<EpochCount> = Arc::default();
    let other: Arc<EpochCount> = Arc::default();
    let local = Arc::new(LocalFloor {
        counts: vec![counted.clone(), other.clone()],
        told: settle.clone(),
    });
    let feed_state = RingFeed {
        settled,
        counted: counted.clone(),
        local: Some(local.clone()),
        ..ring_feed()
    };
    jobs.send(Job {
        assignment: assignment(0, 0, 0, &split, 0, 25),
        control: Arc::new(Mutex::new(Control::default())),
    })
    .expect("the feeder runs");
    let feeder = tokio::spawn(feed(queue, writer, pipeline, None, feed_state));
    let quiet = std::time::Duration::from_millis(300);
    let number = |write: Option<Write>| match write {
        Some(Write::Batch { tag, .. }) => StreamPoint::of_tag(tag),
        other => panic!("a batch, not {other:?}"),
    };
    // The other ring made nothing: this one holds its three batches.
    assert!(tokio::time::timeout(quiet, written.recv()).await.is_err());
    assert_eq!(counted.batches(0), 3);
    // The other ring makes two, and tells: two are written, with no word from the AM.
    other.count(0);
    other.count(0);
    local.counted(0);
    for expected in 1..=2 {
        assert_eq!(
            number(written.recv().await),
            Some(StreamPoint::Batch {
                epoch: 0,
                number: expected
            })
        );
    }
    assert!(tokio::time::timeout(quiet, written.recv()).await.is_err());
    assert_eq!(settle.borrow().allowed.get(&0), Some(&2));
    settle.send_modify(|settled| {
        settled.merge(&told(1, &[(0, 2)], &[]));
    });
    let mut rest = Vec::new();
    for _ in 0..2 {
        rest.push(match written.recv().await {
            Some(Write::Dropped { first_row, .. }) => format!("dropped from {first_row}"),
            Some(Write::EndOfEpoch { .. }) => "end".to_owned(),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(rest, ["dropped from 20", "end"]);
    drop(jobs);
    feeder.await.expect("the feeder ends");
}
