//! Formats that last: a job's journal, snapshots and plan written by an earlier release are taken
//! over by this one, and a format this build does not know is refused naming both versions.
//!
//! `data/journal-format-1/` holds what `sluice run` of the first release with a journal left under
//! its checkpoint location: a job of 20,000 rows in 10 tasks, read by two trainers and scaled to
//! three mid-run, that succeeded. Its journal holds a snapshot and the entries after it, and its plan
//! object predates the plan's format header. The job was run with its checkpoint location at
//! `/tmp/sluice-journal-format-1/checkpoint`; the tests take over a copy of it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice_am::master::calls::JobPhase;
use sluice_am::server::{AmOptions, AmServer};
use sluice_am::spec::{CacheSpec, JobSpec};

/// The rows of the recorded job.
const ROWS: u64 = 20_000;

fn recorded() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/journal-format-1")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The recorded spec with its checkpoint location moved to a copy of the recorded one in `into`.
fn recorded_job(into: &Path) -> JobSpec {
    let checkpoint = into.join("checkpoint");
    copy_tree(&recorded().join("checkpoint"), &checkpoint);
    let mut spec = JobSpec::from_path(recorded().join("spec.yaml")).expect("the recorded spec");
    spec.checkpoint
        .as_mut()
        .expect("the recorded spec has a checkpoint location")
        .uri = format!("file://{}", checkpoint.display());
    spec
}

fn options() -> AmOptions {
    AmOptions {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        token: None,
        resume_from: None,
        launch: None,
        tls: None,
        insecure: false,
        advertise: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_of_the_first_format_is_taken_over_where_it_ended() {
    let directory = tempfile::tempdir().expect("tempdir");
    let sut = AmServer::start(recorded_job(directory.path()), options())
        .await
        .expect("the AM takes the recorded job over");
    let am = sut.am();
    let master = am.master();
    assert_eq!(master.outcome(), Some(JobPhase::Succeeded));
    assert_eq!(master.rows_consumed_total(), ROWS, "every row once");
    assert_eq!(master.table().done_rows(), ROWS);
    assert_eq!(master.world_size(), 3, "the scale to three trainers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_again_with_a_local_cache_takes_its_journal_over() {
    let directory = tempfile::tempdir().expect("tempdir");
    let mut spec = recorded_job(directory.path());
    spec.data.cache = Some(CacheSpec {
        dir: directory.path().join("cache").display().to_string(),
        max_bytes: 1 << 30,
    });
    let sut = AmServer::start(spec, options())
        .await
        .expect("where the nodes cache the data is not part of the journal's identity");
    assert_eq!(sut.am().master().rows_consumed_total(), ROWS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_layout_of_a_newer_release_is_refused_naming_both() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = recorded_job(directory.path());
    let identity = directory.path().join("checkpoint/identity.json");
    let text = std::fs::read_to_string(&identity).expect("identity.json");
    std::fs::write(&identity, text.replace("\"layout\": 1", "\"layout\": 7")).expect("write");
    let error = AmServer::start(spec, options())
        .await
        .expect_err("an unknown layout is refused")
        .to_string();
    assert!(error.contains("layout 7"), "{error}");
    assert!(error.contains("reads layout 1"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_format_of_a_newer_release_is_refused_naming_both() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = recorded_job(directory.path());
    let plan = directory.path().join("checkpoint/plan.postcard");
    let body = std::fs::read(&plan).expect("plan");
    let mut newer = b"SLPLAN\0\0".to_vec();
    newer.extend_from_slice(&9_u32.to_le_bytes());
    newer.extend_from_slice(&body);
    std::fs::write(&plan, newer).expect("write");
    let error = AmServer::start(spec, options())
        .await
        .expect_err("an unknown plan format is refused")
        .to_string();
    assert!(error.contains("format 9"), "{error}");
    assert!(error.contains("reads formats 1 to 5"), "{error}");
}
