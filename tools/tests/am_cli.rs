//! `sluice am`, `sluice status` and `sluice stop` as processes: a real AM over generated Parquet
//! data, driven by a daemon speaking the real gRPC protocol.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::AmProcess;

use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use tonic::transport::Channel;

const ROWS: u64 = 1000;

/// Writes 1000 rows in 2 Parquet files of row groups of 100, and a job spec over them.
fn job(directory: &Path, extra: &str) -> std::path::PathBuf {
    let data = common::generate(directory, ROWS, 2, 100);
    common::write_spec(
        directory,
        &format!(
            r#"
name: cli-test
data:
  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 5000 }}
{extra}
"#,
            data.display()
        ),
    )
}

fn start(spec: &Path, extra: &[&str]) -> AmProcess {
    AmProcess::start(spec, "127.0.0.1:0", extra)
}

async fn daemon(address: &str) -> DaemonServiceClient<Channel> {
    DaemonServiceClient::connect(format!("http://{address}"))
        .await
        .expect("connect to the AM")
}

fn assignments(commands: &[v1::Command]) -> Vec<v1::TaskAssignment> {
    commands
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Assign(assign)) => Some(assign.tasks.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_daemon_pulls_every_row_once_and_the_am_exits_when_the_job_succeeds() {
    let directory = tempfile::tempdir().expect("tempdir");
    let am = start(&job(directory.path(), ""), &[]);
    common::runtime().block_on(async {
        let mut client = daemon(&am.address).await;
        let registered = client
            .register(v1::RegisterRequest {
                node_by_host: false,
                node_id: 0,
                job_id: "cli-test".into(),
                hostname: "test".into(),
                held: Vec::new(),
            })
            .await
            .expect("register")
            .into_inner();
        assert_eq!(registered.ranks, vec![0]);
        assert_eq!(registered.data.expect("job data").sources.len(), 1);

        let mut rows_by_file: Vec<(String, u64, u64)> = Vec::new();
        let mut shut_down = false;
        for _ in 0..100 {
            let commands = client
                .acquire_tasks(v1::AcquireTasksRequest {
                    node_id: 0,
                    max_tasks: 2,
                    dry: true,
                })
                .await
                .expect("acquire")
                .into_inner()
                .commands;
            let tasks = assignments(&commands);
            if tasks.is_empty() {
                shut_down = commands
                    .iter()
                    .any(|command| matches!(command.command, Some(Cmd::Shutdown(_))));
                break;
            }
            for task in &tasks {
                let split = task.split.as_ref().expect("split");
                rows_by_file.push((
                    split.uri.clone(),
                    split.first_row + task.start,
                    split.first_row + task.end,
                ));
                let rows = task.end - task.start;
                client
                    .heartbeat(v1::HeartbeatRequest {
                        node_id: 0,
                        progress: vec![v1::TaskProgress {
                            task_id: task.task_id,
                            enqueued: rows,
                            consumed: rows,
                            bad: Vec::new(),
                            sent: 0,
                            dropped: Vec::new(),
                        }],
                        ..v1::HeartbeatRequest::default()
                    })
                    .await
                    .expect("heartbeat");
            }
        }
        assert!(
            shut_down,
            "the last acquire after the job ended carries Shutdown"
        );
        rows_by_file.sort();
        let files: BTreeSet<&String> = rows_by_file.iter().map(|(uri, _, _)| uri).collect();
        assert_eq!(files.len(), 2, "both files were handed out");
        let mut total = 0;
        for window in rows_by_file.windows(2) {
            if window[0].0 == window[1].0 {
                assert_eq!(
                    window[0].2, window[1].1,
                    "ranges of one file tile it: {window:?}"
                );
            }
        }
        for (_, start, end) in &rows_by_file {
            total += end - start;
        }
        assert_eq!(total, ROWS, "every row handed out exactly once");
    });
    let (success, stdout) = am.finish();
    assert!(success, "sluice am failed: {stdout}");
    assert!(stdout.contains("job cli-test succeeded"), "{stdout}");
}

#[test]
fn status_reports_a_running_job_and_stop_ends_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let am = start(&job(directory.path(), ""), &[]);
    common::runtime().block_on(async {
        let mut client = daemon(&am.address).await;
        client
            .register(v1::RegisterRequest {
                node_id: 0,
                job_id: "cli-test".into(),
                ..v1::RegisterRequest::default()
            })
            .await
            .expect("register");
    });
    let output = common::sluice()
        .args(["status", "--json", "--am", &am.address])
        .output()
        .expect("run sluice status");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("status is one JSON object");
    assert_eq!(status["job"], "cli-test");
    assert_eq!(status["state"], "running");
    assert_eq!(status["tasks"]["rows_total"], ROWS);
    // Each 500-row file packs its 100-row groups into tasks of 200, 200 and 100 rows.
    assert_eq!(status["tasks"]["pending"], 6);
    assert_eq!(status["nodes"][0]["state"], "alive");

    let output = common::sluice()
        .args(["stop", "--am", &am.address])
        .output()
        .expect("run sluice stop");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "job stopping"
    );
    common::runtime().block_on(async {
        let mut client = daemon(&am.address).await;
        let reply = client
            .heartbeat(v1::HeartbeatRequest {
                node_id: 0,
                ..v1::HeartbeatRequest::default()
            })
            .await
            .expect("heartbeat")
            .into_inner();
        assert!(
            reply
                .commands
                .iter()
                .any(|command| matches!(command.command, Some(Cmd::Shutdown(_)))),
            "a stopping job shuts its daemons down"
        );
    });
    let (success, stdout) = am.finish();
    assert!(success, "a stopped job exits 0: {stdout}");
    assert!(stdout.contains("job cli-test stopped"), "{stdout}");
}

#[test]
fn a_token_guards_the_api() {
    let directory = tempfile::tempdir().expect("tempdir");
    let am = start(&job(directory.path(), ""), &["--token", "s3cret"]);
    let refused = common::sluice()
        .args(["status", "--am", &am.address])
        .env_remove("SLUICE_TOKEN")
        .output()
        .expect("run sluice status");
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("SLUICE_TOKEN"), "{message}");
    let accepted = common::sluice()
        .args(["status", "--am", &am.address])
        .env("SLUICE_TOKEN", "s3cret")
        .output()
        .expect("run sluice status");
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    assert!(String::from_utf8_lossy(&accepted.stdout).contains("job cli-test: starting"));
}

#[test]
fn a_bad_spec_is_refused_with_the_key_and_the_fix() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = job(directory.path(), "colour: blue");
    let output = common::sluice()
        .arg("am")
        .arg(&spec)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .expect("run sluice am");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("unknown key `colour`"), "{message}");
}

#[test]
fn a_call_larger_than_the_limit_is_refused_and_the_am_serves_on() {
    let directory = tempfile::tempdir().expect("tempdir");
    let am = start(&job(directory.path(), ""), &[]);
    common::runtime().block_on(async {
        let mut client = daemon(&am.address).await;
        let huge = v1::HeartbeatRequest {
            node_id: 0,
            hostname: "h".repeat(8 << 20),
            ..v1::HeartbeatRequest::default()
        };
        let refused = client.heartbeat(huge).await.expect_err("an 8 MiB call");
        assert!(
            refused.message().contains("message length too large"),
            "{refused:?}"
        );
        let registered = client
            .register(v1::RegisterRequest {
                node_id: 0,
                job_id: "cli-test".into(),
                hostname: "test".into(),
                ..v1::RegisterRequest::default()
            })
            .await
            .expect("the AM serves on")
            .into_inner();
        assert_eq!(registered.ranks, vec![0]);
    });
}
