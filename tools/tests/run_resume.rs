//! `sluice run --resume-from TOKEN` on a job that ran to its end: the trainers run again and get
//! exactly the rows after the data checkpoint the token names.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::sluice;
use sluice_proto::v1::checkpoint_service_client::CheckpointServiceClient;
use sluice_proto::{BearerToken, v1};
use sluice_testkit::job::read_ids;

const ROWS: i64 = 20_000;
const TASK_ROWS: u64 = 5000;
/// Each `sluice run` must end within this (deadlock watchdog).
/// The job's token, given to `sluice run`, which hands it to its trainer, and presented by the
/// test where it plays a trainer.
const TOKEN: &str = "resume-test-token";
const WATCHDOG: Duration = Duration::from_secs(120);

/// One file, no shuffle: task `k` is the split of rows `[k * 5000, (k + 1) * 5000)` of the file,
/// whose ids are its row numbers, and its rows are counted from the split's start. The trainer
/// writes its ids to `ids`.
fn write_spec(root: &Path, ids: &Path) -> std::path::PathBuf {
    common::write_spec(
        root,
        &format!(
            r#"
name: resume-finished-{pid}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: {TASK_ROWS}
  batch_size: 500
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume, --ids-out, "{ids}", --max-rows-per-s, "20000"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{root}/journal" }}
"#,
            pid = std::process::id(),
            data = root.join("data").display(),
            ids = ids.display(),
            root = root.display(),
        ),
    )
}

/// Starts `sluice run SPEC ARGS` and returns it with the AM's address.
fn start_run(spec: &Path, root: &Path, arguments: &[&str]) -> (Child, String) {
    let mut run = sluice()
        .arg("run")
        .arg(spec)
        .args(["--listen", "127.0.0.1:0", "--ring-dir"])
        .arg(root.join("rings"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .args(arguments)
        .env("SLUICE_TOKEN", TOKEN)
        .env("SLUICE_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(am_log(root))
        .spawn()
        .expect("spawn sluice run");
    let mut stdout = BufReader::new(run.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("a line of sluice run");
    assert!(line.contains(" serving on "), "{line:?}");
    let address = line.trim().rsplit(' ').next().expect("address").to_owned();
    // The rest of the output is drained, so the run never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    (run, address)
}

/// The AM's log: the one of every `sluice run`, one after the other.
fn am_log(root: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("am.log"))
        .expect("the AM's log")
}

/// The AM's log and every log the executors left in the state directory.
fn logs(root: &Path) -> String {
    let am = std::fs::read_to_string(root.join("am.log")).unwrap_or_default();
    format!(
        "--- the AM's log\n{am}{}",
        sluice_testkit::job::logs(&root.join("state"))
    )
}

fn finish(mut run: Child, root: &Path) -> bool {
    let started = Instant::now();
    loop {
        if let Some(status) = run.try_wait().expect("try_wait") {
            return status.success();
        }
        if started.elapsed() > WATCHDOG {
            let _ = run.kill();
            panic!(
                "sluice run did not end within {WATCHDOG:?} (deadlock watchdog)\n{}",
                logs(root)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn resuming_a_finished_job_runs_its_trainer_again_over_exactly_the_rows_after_the_token() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    common::generate(root, ROWS as u64, 1, 2500);
    let first_ids = root.join("first.bin");
    let spec = write_spec(root, &first_ids);
    let (run, address) = start_run(&spec, root, &[]);

    // The trainer's data checkpoint at step 3: task 0 read to its end, task 1 up to file row 7500.
    let token = common::runtime().block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
            .expect("an address")
            .connect()
            .await
            .expect("connect to the AM");
        let mut client =
            CheckpointServiceClient::with_interceptor(channel, BearerToken(Some(TOKEN.to_owned())));
        let reply = client
            .commit_data_checkpoint(v1::CommitDataCheckpointRequest {
                step: 3,
                rank: 0,
                world_size: 1,
                epoch: 0,
                positions: vec![
                    v1::TaskPosition {
                        task_id: 0,
                        end_row: TASK_ROWS,
                    },
                    v1::TaskPosition {
                        task_id: 1,
                        end_row: 2500,
                    },
                ],
            })
            .await
            .expect("commit");
        match reply.into_inner().state {
            Some(v1::commit_data_checkpoint_reply::State::Token(token)) => token,
            other => panic!("a one-rank checkpoint is stored at once: {other:?}"),
        }
    });
    assert!(finish(run, root), "the first run fails\n{}", logs(root));
    let mut first = read_ids(&first_ids);
    first.sort_unstable();
    assert_eq!(first, (0..ROWS).collect::<Vec<_>>(), "the first run");

    let resumed_ids = root.join("resumed.bin");
    let spec = write_spec(root, &resumed_ids);
    let (run, _) = start_run(&spec, root, &["--resume-from", &token]);
    assert!(finish(run, root), "the resumed run fails\n{}", logs(root));
    let mut resumed = read_ids(&resumed_ids);
    resumed.sort_unstable();
    let after_token: Vec<i64> = (2500 + TASK_ROWS as i64..2 * TASK_ROWS as i64)
        .chain(2 * TASK_ROWS as i64..ROWS)
        .collect();
    assert_eq!(
        resumed.len(),
        after_token.len(),
        "the resumed trainer reads the {} rows after the token",
        after_token.len()
    );
    assert_eq!(resumed, after_token);
}
