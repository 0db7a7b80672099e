//! The local disk cache of remote sources on the real path: `sluice run` over Parquet files on a
//! real S3 server reached through the test kit's delaying proxy, with `data.cache` in the spec.
//!
//! - A job of two epochs reads its files from S3 once: the proxy forwards about one epoch's bytes
//!   in all, and next to none once the second epoch has begun; every row of each epoch reaches
//!   the trainer once.
//! - A file overwritten after a job cached it is read anew by the next job over the same cache:
//!   the trainer gets the rows of the overwrite, never the cached rows of the file it replaced.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Int64Array, RecordBatch};
use common::sluice;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use sluice_testkit::DelayProxy;
use sluice_testkit::job::read_ids;

/// Rows of the two-epoch job's dataset.
const ROWS: i64 = 40_000;
/// Rows of the file that is overwritten.
const OVERWRITTEN_ROWS: i64 = 2_000;
/// What the proxy adds to each chunk, each way, as a remote store's latency would.
const DELAY: Duration = Duration::from_millis(20);
/// The proxy's bandwidth, each way.
const BANDWIDTH_BYTES_PER_S: u64 = 64 << 20;
/// How long a job may run (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(240);

/// The spec of a job named `name` over `data` (a Parquet directory, or a Delta table when `data`
/// ends in `delta`) with the cache in `cache`, one trainer writing its ids to `ids` at no more than
/// `rows_per_s`.
fn spec(name: &str, data: &str, epochs: u32, cache: &Path, ids: &Path, rows_per_s: u32) -> String {
    let format = if data.ends_with("delta") {
        "delta"
    } else {
        "parquet"
    };
    format!(
        r#"
name: {name}
data:
  sources: [{{ uri: "{data}", format: {format} }}]
  task_rows: 5000
  batch_size: 500
  epochs: {epochs}
  cache: {{ dir: "{cache}", max_bytes: 1073741824 }}
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume, --ids-out, "{ids}", --max-rows-per-s, "{rows_per_s}"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 60000 }}
"#,
        cache = cache.display(),
        ids = ids.display(),
        sluice = env!("CARGO_BIN_EXE_sluice"),
    )
}

/// What a job run left: whether it succeeded, its output and logs, and the proxy's byte count when
/// its status first showed a later epoch than the first it showed.
struct Ran {
    succeeded: bool,
    printed: String,
    bytes_at_next_epoch: Option<u64>,
}

/// Runs `spec` in `root` with `sluice run`, reaching S3 through `proxy`.
fn run_job(root: &Path, spec: &str, proxy: &DelayProxy) -> Ran {
    std::fs::create_dir_all(root).expect("job directory");
    let spec = common::write_spec(root, spec);
    let address = common::free_address();
    let mut run = common::spawn_run(
        root,
        &spec,
        &address,
        &sluice_testkit::s3_environment(proxy.address()),
    );
    let printed = || common::run_output(root);
    let started = Instant::now();
    let mut first_epoch = None;
    let mut bytes_at_next_epoch = None;
    let status = loop {
        if let Some(status) = run.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < WATCHDOG,
            "the job did not end within {WATCHDOG:?}\n{}",
            printed()
        );
        let bytes = proxy.bytes_to_client();
        let epoch = sluice()
            .args(["status", "--json", "--am", &address])
            .output()
            .ok()
            .and_then(|status| serde_json::from_slice::<serde_json::Value>(&status.stdout).ok())
            .and_then(|status| status["epoch"].as_u64());
        if let Some(epoch) = epoch {
            let first = *first_epoch.get_or_insert(epoch);
            if epoch > first && bytes_at_next_epoch.is_none() {
                bytes_at_next_epoch = Some(bytes);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        succeeded: status.success(),
        printed: printed(),
        bytes_at_next_epoch,
    }
}

/// The rows `first_id..first_id + OVERWRITTEN_ROWS` as a Parquet file whose size depends on its
/// row count alone.
fn parquet_of_ids(first_id: i64) -> Vec<u8> {
    let ids = Int64Array::from_iter_values(first_id..first_id + OVERWRITTEN_ROWS);
    let batch = RecordBatch::try_from_iter([("id", Arc::new(ids) as ArrayRef)]).expect("batch");
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
        .build();
    let mut bytes = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut bytes, batch.schema(), Some(properties)).expect("writer");
    writer.write(&batch).expect("write parquet");
    writer.close().expect("close parquet");
    bytes
}

/// What a test of this file reaches S3 with.
struct Bed<'a> {
    runtime: &'a tokio::runtime::Runtime,
    store: &'a dyn ObjectStore,
    proxy: &'a DelayProxy,
    upstream: SocketAddr,
    server: &'a sluice_testkit::SeaweedServer,
}

/// Writes `ROWS` rows as `format` (parquet or delta) to `s3://BUCKET/cached-FORMAT` and runs a job
/// of two epochs over them with the cache in `cache`: every row reaches the trainer once in each
/// epoch, the job reads about the data's bytes from S3 in all, and next to none in its second
/// epoch.
fn two_epochs(bed: &Bed<'_>, format: &str, root: &Path, cache: &Path) {
    let prefix = format!("cached-{format}");
    let data = format!("s3://{}/{prefix}", sluice_testkit::BUCKET);
    let generated = sluice()
        .args(["gen", "--out", &data, "--rows", &ROWS.to_string()])
        .args([
            "--files",
            "4",
            "--row-group-rows",
            "5000",
            "--format",
            format,
        ])
        .envs(sluice_testkit::s3_environment(bed.upstream))
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "sluice gen to S3: {}\n{}",
        String::from_utf8_lossy(&generated.stderr),
        bed.server.log()
    );
    // The table's log counts too: it is read at every start.
    let data_bytes: u64 = bed
        .runtime
        .block_on(
            bed.store
                .list(Some(&ObjectPath::from(prefix.as_str())))
                .try_collect::<Vec<_>>(),
        )
        .expect("list")
        .iter()
        .map(|meta| meta.size)
        .sum();
    let ids = root.join("ids.bin");
    let before = bed.proxy.bytes_to_client();
    let ran = run_job(
        root,
        &spec(
            &format!("two-epochs-{format}"),
            &data,
            2,
            cache,
            &ids,
            40_000,
        ),
        bed.proxy,
    );
    assert!(ran.succeeded, "{format}: {}", ran.printed);
    let job_bytes = bed.proxy.bytes_to_client() - before;
    let mut delivered = read_ids(&ids);
    delivered.sort_unstable();
    let expected: Vec<i64> = (0..ROWS).flat_map(|id| [id, id]).collect();
    assert!(
        delivered == expected,
        "{format}: every row once in each epoch: {} ids delivered\n{}",
        delivered.len(),
        ran.printed
    );
    assert!(
        job_bytes <= data_bytes + data_bytes / 10 + (256 << 10),
        "{format}: two epochs read {job_bytes} bytes from S3; the data is {data_bytes} bytes\n{}",
        ran.printed
    );
    let at_second_epoch = ran
        .bytes_at_next_epoch
        .expect("the status showed the second epoch");
    let second_epoch_bytes = bed.proxy.bytes_to_client() - at_second_epoch;
    assert!(
        second_epoch_bytes <= data_bytes / 100,
        "{format}: the second epoch read {second_epoch_bytes} of {data_bytes} bytes from S3\n{}",
        ran.printed
    );
}

#[test]
fn a_second_epoch_reads_from_the_cache_and_an_overwritten_file_is_read_anew() {
    let server = sluice_testkit::start_seaweed();
    let options = sluice_testkit::s3_options();
    let runtime = common::runtime();
    runtime.block_on(sluice_testkit::wait_for_bucket(&server, &options));
    let upstream = SocketAddr::from(([127, 0, 0, 1], sluice_testkit::S3_PORT));
    let proxy = DelayProxy::start(
        "127.0.0.1:0".parse().expect("an address"),
        upstream,
        DELAY,
        std::num::NonZeroU64::new(BANDWIDTH_BYTES_PER_S),
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let cache = root.join("cache");
    let store = sluice_testkit::s3_store(&options);
    let bed = Bed {
        runtime: &runtime,
        store: &store,
        proxy: &proxy,
        upstream,
        server: &server,
    };
    // Two epochs: the second reads what the first cached, of Parquet files pinned by their entity
    // tags, and of a Delta table's files, pinned by the table's log.
    two_epochs(&bed, "parquet", &root.join("parquet"), &cache);
    two_epochs(&bed, "delta", &root.join("delta"), &cache);

    let mode = std::fs::metadata(&cache)
        .expect("cache")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "the cache is this user's alone");

    // A file cached by one job and overwritten before the next.
    let file = ObjectPath::from("overwritten/part-0.parquet");
    let uri = format!("s3://{}/overwritten", sluice_testkit::BUCKET);
    let old = parquet_of_ids(0);
    let new = parquet_of_ids(1_000_000);
    assert_eq!(old.len(), new.len(), "the overwrite keeps the size");
    runtime
        .block_on(store.put(&file, PutPayload::from(old)))
        .expect("put");
    let first_ids = root.join("first/ids.bin");
    let ran = run_job(
        &root.join("first"),
        &spec("first", &uri, 1, &cache, &first_ids, 1_000_000),
        &proxy,
    );
    assert!(ran.succeeded, "{}", ran.printed);
    let mut delivered = read_ids(&first_ids);
    delivered.sort_unstable();
    assert_eq!(delivered, (0..OVERWRITTEN_ROWS).collect::<Vec<_>>());

    let file_bytes = new.len() as u64;
    runtime
        .block_on(store.put(&file, PutPayload::from(new)))
        .expect("overwrite");
    let second_ids = root.join("second/ids.bin");
    let before = proxy.bytes_to_client();
    let ran = run_job(
        &root.join("second"),
        &spec("second", &uri, 1, &cache, &second_ids, 1_000_000),
        &proxy,
    );
    assert!(ran.succeeded, "{}", ran.printed);
    let mut delivered = read_ids(&second_ids);
    delivered.sort_unstable();
    assert!(
        delivered == (1_000_000..1_000_000 + OVERWRITTEN_ROWS).collect::<Vec<_>>(),
        "the overwrite's rows, not the cached ones: {:?}..",
        delivered.first()
    );
    assert!(
        proxy.bytes_to_client() - before >= file_bytes,
        "the overwritten file is fetched from S3 again"
    );
}
