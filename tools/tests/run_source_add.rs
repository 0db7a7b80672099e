//! `sluice source add` on a running job: the source is planned and journaled, its rows join the
//! current epoch and every later one, each delivered once per epoch to the trainers, and an AM
//! killed after the add and started again keeps it. A source whose columns differ from the job's
//! is refused, naming the difference.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{AmProcess, sluice, status_json};

/// Rows of the source the job starts with; the added source holds ids `ROWS..ROWS + ADDED`.
const ROWS: u64 = 4000;
const ADDED: u64 = 1000;

/// Writes the added source under `root/more`: the last of five generated files over `ROWS +
/// ADDED` rows, ids `ROWS..ROWS + ADDED`, with the job's columns.
fn added_source(root: &Path) -> PathBuf {
    let staging = root.join("staging");
    let status = sluice()
        .args(["gen", "--out"])
        .arg(&staging)
        .args(["--rows", &(ROWS + ADDED).to_string(), "--files", "5"])
        .args(["--row-group-rows", "500"])
        .stdout(Stdio::null())
        .status()
        .expect("run sluice gen");
    assert!(status.success(), "sluice gen failed");
    let more = root.join("more");
    std::fs::create_dir_all(&more).expect("mkdir more");
    std::fs::rename(
        staging.join("part-00004.parquet"),
        more.join("part-00000.parquet"),
    )
    .expect("move the added file");
    more
}

/// The job's source and the source to add, under `root`.
fn sources(root: &Path) -> (PathBuf, PathBuf) {
    (common::generate(root, ROWS, 4, 500), added_source(root))
}

/// `sluice source add` of `uri` at the AM at `address`, with `extra` flags.
fn add(address: &str, uri: &str, extra: &[&str]) -> std::process::Output {
    sluice()
        .args(["source", "add", uri, "--am", address])
        .args(extra)
        .env_remove("SLUICE_TOKEN")
        .output()
        .expect("run sluice source add")
}

/// Polls the AM's status until `ready` holds, failing after 60 s (deadlock watchdog); an AM not
/// yet serving is waited for.
fn wait_for(address: &str, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    let started = Instant::now();
    loop {
        let output = sluice()
            .args(["status", "--json", "--am", address])
            .env_remove("SLUICE_TOKEN")
            .output()
            .expect("run sluice status");
        let status: Option<serde_json::Value> = output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).expect("status JSON"));
        if status.as_ref().is_some_and(&ready) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "waited 60 s for {what}; last status: {status:?} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn consumed_some(status: &serde_json::Value) -> bool {
    status["tasks"]["rows_consumed"].as_u64().unwrap_or(0) > 0
}

/// How often each id was delivered, over the ids files `paths`.
fn deliveries(paths: impl IntoIterator<Item = PathBuf>) -> BTreeMap<i64, u32> {
    let mut counts = BTreeMap::new();
    for path in paths {
        for chunk in std::fs::read(&path).unwrap_or_default().chunks_exact(8) {
            let id = i64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Checks that every id of `0..ROWS + ADDED` was delivered `epochs` times, and no other.
fn assert_delivered(counts: &BTreeMap<i64, u32>, epochs: u32) {
    let wrong: Vec<(i64, u32)> = counts
        .iter()
        .filter(|(_, count)| **count != epochs)
        .map(|(id, count)| (*id, *count))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty(),
        "ids delivered other than {epochs} times (id, times): {wrong:?}"
    );
    assert_eq!(
        counts.keys().copied().collect::<Vec<_>>(),
        (0..(ROWS + ADDED) as i64).collect::<Vec<_>>(),
        "every id of the job's source and of the added one"
    );
}

#[test]
fn a_source_added_to_a_running_job_is_delivered_once_in_this_epoch_and_the_next() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let (data, more) = sources(root);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: source-add
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  epochs: 2
  task_rows: 500
  batch_size: 100
nodes: 1
roles:
  - {{ name: worker, num: 2, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "500"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    );
    let address = common::free_address();
    let mut run = common::spawn_run(root, &spec, &address, &[]);
    wait_for(&address, "the first rows to be consumed", consumed_some);

    // A source whose columns are not the job's is refused, naming the difference.
    let refused = add(
        &address,
        &format!("file://{}", more.display()),
        &["--format", "parquet", "--columns", "id"],
    );
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{message}");
    assert!(
        message.contains("does not fit the job") && message.contains("lacks the column"),
        "{message}"
    );
    let refused = add(&address, "file:///nowhere/at/all", &["--format", "parquet"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("/nowhere/at/all"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let added = add(
        &address,
        &format!("file://{}", more.display()),
        &["--format", "parquet"],
    );
    let said = String::from_utf8_lossy(&added.stdout);
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    assert!(
        said.contains("added as source 1") && said.contains(&format!("{ADDED} rows")),
        "{said}"
    );
    let status = status_json(&address);
    assert_eq!(status["sources"][1]["planned_files"], 1, "{status}");
    assert_eq!(
        status["epoch"], 0,
        "added while the first epoch runs: {status}"
    );
    let text = sluice()
        .args(["status", "--am", &address])
        .env_remove("SLUICE_TOKEN")
        .output()
        .expect("run sluice status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("source 1: file://{}, 1 files", more.display())),
        "{text}"
    );

    assert!(
        common::bed::finish(&mut run, "sluice run", Duration::from_secs(120), root),
        "sluice run failed: {}",
        common::run_output(root)
    );
    assert_delivered(
        &deliveries((0..2).map(|rank| root.join(format!("ids-{rank}.bin")))),
        2,
    );
}

/// A trainer as torchrun starts it, reading at most 500 rows a second.
fn trainer(am: &str, rank: u32, ring_dir: &Path, ids: &Path) -> Child {
    common::torchrun_consume(am, ring_dir, ids, (rank, 2), (rank, 2))
        .args(["--max-rows-per-s", "500"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice consume")
}

#[test]
fn an_am_killed_after_a_source_was_added_takes_the_job_over_with_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let (data, more) = sources(root);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: source-add-takeover
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 500
  batch_size: 100
nodes: 1
launcher: {{ kind: external }}
roles:
  - {{ name: worker, num: 2 }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{checkpoints}" }}
"#,
            data = data.display(),
            checkpoints = root.join("ckpt").display(),
        ),
    );
    let address = common::free_address();
    let am = AmProcess::start(&spec, &address, &[]);
    let ring_dir = root.join("shm");
    let mut daemon = common::bed::Running(
        sluice()
            .args(["daemon", "--am", &address, "--node-id", "0"])
            .arg("--ring-dir")
            .arg(&ring_dir)
            .env_remove("SLUICE_TOKEN")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sluice daemon"),
    );
    let ids: Vec<PathBuf> = (0..2)
        .map(|rank| root.join(format!("ids-{rank}.bin")))
        .collect();
    let trainers: Vec<common::bed::Running> = (0..2)
        .map(|rank| common::bed::Running(trainer(&address, rank, &ring_dir, &ids[rank as usize])))
        .collect();
    wait_for(&address, "the first rows to be consumed", consumed_some);
    let added = add(
        &address,
        &format!("file://{}", more.display()),
        &["--format", "parquet"],
    );
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );

    // The add is journaled before it is answered: a new AM replays it.
    am.kill();
    let am = AmProcess::start(&spec, &address, &[]);
    let status = status_json(&am.address);
    assert_eq!(
        status["sources"][1]["uri"],
        format!("file://{}", more.display()),
        "the new AM has the added source: {status}"
    );
    assert_eq!(status["sources"][1]["planned_files"], 1, "{status}");

    for (rank, mut trainer) in trainers.into_iter().enumerate() {
        assert!(
            common::bed::finish(
                &mut trainer.0,
                &format!("trainer {rank}"),
                Duration::from_secs(120),
                root
            ),
            "trainer {rank} failed"
        );
    }
    let (succeeded, rest) = am.finish();
    assert!(succeeded, "the AM exits 0 once the job succeeded: {rest}");
    assert!(
        common::bed::finish(&mut daemon.0, "the daemon", Duration::from_secs(30), root),
        "the daemon failed"
    );
    assert_delivered(&deliveries(ids), 1);
}
