use super::history::{History, Sample};
use super::*;
use crate::checkpoint_store::CheckpointStore;
use crate::master::Master;
use crate::persist::Persist;
use crate::plan::JobPlan;
use crate::spec::{Format, JobSpec};
use crate::wire;
use axum::body::Body;
use axum::http::Request as HttpRequest;
use sluice_formats::Split;
use sluice_proto::NodeId;
use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use std::collections::BTreeMap;
use tower::ServiceExt;

/// One node, one trainer, tasks of 10 rows over splits of 25 and 15 rows, the second split
/// starting at row 100 of its file.
const SPEC: &str = r#"
name: web
data:
  sources: [{ uri: "file:///data/train", format: parquet }]
  task_rows: 10
nodes: 1
roles:
  - { name: worker, num: 1, command: [sluice, consume] }
failover: { heartbeat_interval_ms: 100, heartbeat_timeout_ms: 1000 }
"#;

fn master() -> Master {
    let spec = Arc::new(JobSpec::parse(SPEC, Format::Yaml).expect("valid spec"));
    let splits = [(25u64, 0u64), (15, 100)]
        .iter()
        .enumerate()
        .map(|(index, (rows, first_row))| Split {
            task_id: index as u64,
            uri: format!("file:///data/train/part-{index}.parquet"),
            file_size: 1000,
            first_row: *first_row,
            row_count: *rows,
            partition_values: Vec::new(),
            delta: None,
            bytes: None,
            identity: None,
        })
        .collect();
    let mut plan = JobPlan::default();
    plan.extend(0, splits);
    Master::new(spec, Arc::new(plan)).expect("the splits have rows")
}

/// What the daemon of the tests was handed: task id to (split uri, first row in the file, rows).
type Handed = BTreeMap<u64, (String, u64, u64)>;

/// An AM whose node 0 registered, took two tasks and reported progress on them, with stage and
/// ring statistics.
fn busy_am() -> (Arc<Am>, Handed) {
    let mut sut = master();
    sut.register(
        wire::registration(v1::RegisterRequest {
            node_by_host: false,
            node_id: 0,
            job_id: "web".into(),
            hostname: "trainer-host".into(),
            held: Vec::new(),
        }),
        1_000,
    )
    .expect("registration accepted");
    let acquired = sut.acquire(NodeId(0), 2, true, 1_010).reply;
    let commands = wire::commands(sut.plan(), sut.added_sources(), acquired);
    let handed: Handed = commands
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Assign(assign)) => Some(assign.tasks.clone()),
            _ => None,
        })
        .flatten()
        .map(|task| {
            let split = task.split.expect("an assignment carries its split");
            (
                task.task_id,
                (
                    split.uri,
                    split.first_row + task.start,
                    task.end - task.start,
                ),
            )
        })
        .collect();
    assert_eq!(handed.len(), 2, "two tasks handed out: {commands:?}");
    let progress = handed
        .keys()
        .zip([(5, 3), (4, 4)])
        .map(|(task_id, (enqueued, consumed))| v1::TaskProgress {
            task_id: *task_id,
            enqueued,
            consumed,
            bad: Vec::new(),
            sent: 0,
            dropped: Vec::new(),
        })
        .collect();
    sut.heartbeat(
        wire::heartbeat(v1::HeartbeatRequest {
            hostname: String::new(),
            node_id: 0,
            progress,
            stages: vec![v1::StageStats {
                stage: "decode".into(),
                busy_ns: 1_500_000_000,
                wait_ns: 250_000_000,
                rows: 12,
                bytes: 4096,
            }],
            rings: vec![v1::RingStats {
                rank: 0,
                used_bytes: 1024,
                capacity_bytes: 8192,
                trainer_wait_ns: 2_000_000_000,
                daemon_wait_ns: 500_000_000,
                reader_idle_ms: 0,
                reader_interval_ms: 0,
                ..v1::RingStats::default()
            }],
            keeps_finished_until_durable: false,
            tuning: Some(v1::ReadTuning {
                threads: 1,
                max_threads: 2,
                read_ahead_bytes: 8 << 20,
                max_read_ahead_bytes: 1 << 30,
                held_bytes: 4096,
            }),
        }),
        1_020,
    );
    let am = Am::new(sut, Persist::in_memory(), CheckpointStore::in_memory());
    (Arc::new(am), handed)
}

async fn get(router: Router, uri: &str, authorization: Option<&str>) -> (StatusCode, String) {
    let mut request = HttpRequest::builder().uri(uri);
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let response = router
        .oneshot(request.body(Body::empty()).expect("a valid request"))
        .await
        .expect("the router answers");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    (
        status,
        String::from_utf8(body.to_vec()).expect("utf-8 body"),
    )
}

async fn get_json(router: Router, uri: &str) -> serde_json::Value {
    let (status, body) = get(router, uri, None).await;
    assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("{uri}: {error}: {body}"))
}

#[tokio::test]
async fn api_status_is_the_status_json_with_the_history() {
    let (am, _) = busy_am();
    let state = HttpState::new(am, None);
    let sample = Sample::of(5_000, &state.am.master().status(5_000));
    state.history().record(sample);

    let sut = get_json(router(state), "/api/status").await;

    assert_eq!(sut["job"], "web");
    assert_eq!(sut["state"], "running");
    assert_eq!(sut["tasks"]["rows_total"], 40);
    assert_eq!(sut["tasks"]["rows_consumed"], 7);
    assert_eq!(sut["tasks"]["in_flight"], 2);
    assert_eq!(sut["nodes"][0]["hostname"], "trainer-host");
    assert_eq!(sut["nodes"][0]["stages"][0]["busy_ns"], 1_500_000_000u64);
    assert_eq!(sut["nodes"][0]["rings"][0]["capacity_bytes"], 8192);
    assert_eq!(
        sut["history"],
        serde_json::json!([{
            "t_ms": 5000,
            "rows_consumed": 7,
            "rows_per_second": 0.0,
            "trainer_wait_ns": 2_000_000_000u64,
            "daemon_wait_ns": 500_000_000,
            "rings": 1,
        }])
    );
}

#[tokio::test]
async fn api_tasks_lists_the_tasks_in_flight_with_their_progress() {
    let (am, handed) = busy_am();

    let sut = get_json(router(HttpState::new(am, None)), "/api/tasks").await;

    assert_eq!(
        sut["counts"],
        serde_json::json!({ "pending": 3, "in_flight": 2, "done": 0, "failed": 0 })
    );
    assert_eq!(sut["epoch"], 0);
    let expected: Vec<serde_json::Value> = handed
        .iter()
        .zip([(5, 3), (4, 4)])
        .map(
            |((task_id, (uri, first_row, rows)), (enqueued, consumed))| {
                serde_json::json!({
                    "task_id": task_id,
                    "node_id": 0,
                    "uri": uri,
                    "first_row": first_row,
                    "rows": rows,
                    "enqueued": enqueued,
                    "consumed": consumed,
                })
            },
        )
        .collect();
    assert_eq!(sut["in_flight"], serde_json::Value::Array(expected));
}

#[tokio::test]
async fn metrics_route_serves_the_openmetrics_text() {
    let (am, _) = busy_am();
    let response = router(HttpState::new(am, None))
        .oneshot(
            HttpRequest::builder()
                .uri("/metrics")
                .body(Body::empty())
                .expect("a valid request"),
        )
        .await
        .expect("the router answers");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        OPENMETRICS_CONTENT_TYPE
    );
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    assert!(
        text.contains("\nsluice_am_epoch_rows_consumed 7\n"),
        "{text}"
    );
    assert!(
        text.contains("\nsluice_am_tasks{state=\"in_flight\"} 2\n"),
        "{text}"
    );
}

#[tokio::test]
async fn the_page_is_served_whole() {
    let (am, _) = busy_am();
    let (status, body) = get(router(HttpState::new(am, None)), "/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, PAGE);
    assert!(body.contains("id=\"rate-chart\""));
}

#[tokio::test]
async fn a_token_guards_every_data_route_and_only_in_its_header() {
    let (am, _) = busy_am();
    let sut = router(HttpState::new(am, Some("s3cret".into())));
    // The page holds no data of the job; it asks for the token.
    let (status, body) = get(sut.clone(), "/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("id=\"token-form\""));
    for route in ["/api/status", "/api/tasks", "/metrics"] {
        for refused in [None, Some("Bearer wrong"), Some("s3cret")] {
            let (status, body) = get(sut.clone(), route, refused).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} with {refused:?}");
            assert!(
                body.contains("--token") && body.contains("SLUICE_TOKEN"),
                "{body}"
            );
        }
        let (status, body) = get(sut.clone(), route, Some("Bearer s3cret")).await;
        assert_eq!(status, StatusCode::OK, "{route} with the header: {body}");
        // A token in the address would end up in logs and histories.
        let (status, _) = get(sut.clone(), &format!("{route}?token=s3cret"), None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} with the query");
    }
}

/// The status of [`exposition_lists_every_figure_with_help`]: a running job in its second epoch,
/// one alive node with one stage and two rings, one lost node.
fn reported_status() -> v1::StatusReply {
    v1::StatusReply {
        job_id: "metrics".into(),
        state: v1::JobState::Running as i32,
        failure_reason: None,
        waiting: None,
        bad_data: Vec::new(),
        bad_rows: 120,
        bad_ranges: 2,
        dropped: Vec::new(),
        dropped_rows: 4,
        epoch: 1,
        epochs: 3,
        roles: Vec::new(),
        nodes: vec![
            v1::NodeStatus {
                node_id: 0,
                hostname: "host-a".into(),
                state: v1::NodeState::Alive as i32,
                since_last_heartbeat_ms: 1500,
                tasks_held: 4,
                task_failures: 0,
                stages: vec![v1::StageStats {
                    stage: "fetch".into(),
                    busy_ns: 2_500_000_000,
                    wait_ns: 750_000_000,
                    rows: 1000,
                    bytes: 65536,
                }],
                rings: vec![
                    v1::RingStats {
                        rank: 0,
                        used_bytes: 100,
                        capacity_bytes: 1 << 20,
                        trainer_wait_ns: 3_000_000_000,
                        daemon_wait_ns: 0,
                        reader_idle_ms: 0,
                        reader_interval_ms: 0,
                        ..v1::RingStats::default()
                    },
                    v1::RingStats {
                        rank: 1,
                        used_bytes: 200,
                        capacity_bytes: 1 << 20,
                        trainer_wait_ns: 0,
                        daemon_wait_ns: 4_500_000_000,
                        reader_idle_ms: 0,
                        reader_interval_ms: 0,
                        ..v1::RingStats::default()
                    },
                ],
                tuning: Some(v1::ReadTuning {
                    threads: 1,
                    max_threads: 2,
                    read_ahead_bytes: 8 << 20,
                    max_read_ahead_bytes: 1 << 30,
                    held_bytes: 4096,
                }),
            },
            v1::NodeStatus {
                node_id: 1,
                hostname: "host-b".into(),
                state: v1::NodeState::Lost as i32,
                since_last_heartbeat_ms: 60_000,
                ..v1::NodeStatus::default()
            },
        ],
        trainers: Vec::new(),
        tasks: Some(v1::TaskCounts {
            pending: 5,
            in_flight: 4,
            done: 11,
            failed: 1,
            rows_total: 2000,
            rows_consumed: 1234,
            rows_failed: 10,
        }),
        rows_per_second: 456.5,
        scaling: false,
        sources: Vec::new(),
        hangs: vec![
            v1::Hang {
                node_id: 0,
                rank: 1,
                stuck_ms: 7_500,
                bound_ms: 5_000,
                action: "warn".into(),
                kind: "trainer".into(),
                task_id: 0,
            },
            v1::Hang {
                node_id: 0,
                rank: 0,
                stuck_ms: 2_000,
                bound_ms: 1_000,
                action: "warn".into(),
                kind: "daemon".into(),
                task_id: 0,
            },
            v1::Hang {
                node_id: 0,
                rank: 1,
                stuck_ms: 3_000,
                bound_ms: 1_000,
                action: "warn".into(),
                kind: "task".into(),
                task_id: 9,
            },
        ],
    }
}

#[test]
fn exposition_lists_every_figure_with_help() {
    let text = metrics::exposition(&reported_status());
    let samples: Vec<&str> = text.lines().filter(|line| !line.starts_with('#')).collect();
    for expected in [
        "sluice_am_job_state{state=\"running\"} 1",
        "sluice_am_job_state{state=\"starting\"} 0",
        "sluice_am_job_state{state=\"failed\"} 0",
        "sluice_am_epoch 1",
        "sluice_am_epochs 3",
        "sluice_am_epoch_rows 2000",
        "sluice_am_epoch_rows_consumed 1234",
        "sluice_am_epoch_rows_failed 10",
        "sluice_am_rows_per_second 456.5",
        "sluice_am_bad_data_rows_total 120",
        "sluice_am_bad_data_skips_total 2",
        "sluice_am_tasks{state=\"pending\"} 5",
        "sluice_am_tasks{state=\"in_flight\"} 4",
        "sluice_am_tasks{state=\"done\"} 11",
        "sluice_am_tasks{state=\"failed\"} 1",
        "sluice_am_node_up{node=\"0\",hostname=\"host-a\"} 1",
        "sluice_am_node_up{node=\"1\",hostname=\"host-b\"} 0",
        "sluice_am_node_since_heartbeat_seconds{node=\"0\"} 1.5",
        "sluice_am_node_since_heartbeat_seconds{node=\"1\"} 60.0",
        "sluice_am_node_tasks_held{node=\"0\"} 4",
        "sluice_am_stage_busy_seconds_total{node=\"0\",stage=\"fetch\"} 2.5",
        "sluice_am_stage_wait_seconds_total{node=\"0\",stage=\"fetch\"} 0.75",
        "sluice_am_stage_rows_total{node=\"0\",stage=\"fetch\"} 1000",
        "sluice_am_stage_bytes_total{node=\"0\",stage=\"fetch\"} 65536",
        "sluice_am_ring_used_bytes{node=\"0\",rank=\"1\"} 200",
        "sluice_am_node_decode_threads{node=\"0\",kind=\"tuned\"} 1",
        "sluice_am_node_decode_threads{node=\"0\",kind=\"max\"} 2",
        "sluice_am_node_read_ahead_bytes{node=\"0\",kind=\"held\"} 4096",
        "sluice_am_ring_capacity_bytes{node=\"0\",rank=\"0\"} 1048576",
        "sluice_am_ring_trainer_wait_seconds_total{node=\"0\",rank=\"0\"} 3.0",
        "sluice_am_ring_daemon_wait_seconds_total{node=\"0\",rank=\"1\"} 4.5",
        "sluice_am_trainer_hang_seconds{node=\"0\",rank=\"1\"} 7.5",
        "sluice_am_daemon_hang_seconds{node=\"0\"} 2.0",
        "sluice_am_task_hang_seconds{node=\"0\",rank=\"1\"} 3.0",
    ] {
        assert!(
            samples.contains(&expected),
            "missing {expected:?} in\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    for sample in samples {
        let name = sample
            .split(['{', ' '])
            .next()
            .expect("a sample has a name");
        assert!(name.starts_with("sluice_am_"), "{sample}");
        let family = name.strip_suffix("_total").unwrap_or(name);
        for kind in ["HELP", "TYPE"] {
            assert!(
                text.contains(&format!("# {kind} {family} ")),
                "{family} has no {kind} line in\n{text}"
            );
        }
    }
}

#[test]
fn a_sample_sums_the_waits_of_every_ring() {
    let sut = Sample::of(42, &reported_status());
    assert_eq!(
        sut,
        Sample {
            t_ms: 42,
            rows_consumed: 1234,
            rows_per_second: 456.5,
            trainer_wait_ns: 3_000_000_000,
            daemon_wait_ns: 4_500_000_000,
            rings: 2,
        }
    );
}

#[test]
fn history_keeps_the_latest_samples() {
    let mut sut = History::new(3);
    let status = reported_status();
    for t_ms in 1..=5 {
        sut.record(Sample::of(t_ms, &status));
    }
    let times: Vec<u64> = sut.samples().iter().map(|sample| sample.t_ms).collect();
    assert_eq!(times, vec![3, 4, 5]);
}

async fn post(
    router: Router,
    uri: &str,
    body: &str,
    authorization: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let mut request = HttpRequest::builder()
        .method("POST")
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let response = router
        .oneshot(
            request
                .body(Body::from(body.to_owned()))
                .expect("a valid request"),
        )
        .await
        .expect("the router answers");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    let json = serde_json::from_slice(&body).unwrap_or_else(|error| {
        panic!(
            "{uri}: {status}: not JSON ({error}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

/// A rank's commit of `step` with its `(task_id, end_row)` positions, as the Python client sends it.
fn commit_body(step: u64, rank: u32, positions: &[(u64, u64)]) -> String {
    let positions: Vec<serde_json::Value> = positions
        .iter()
        .map(|(task_id, end_row)| serde_json::json!({ "task_id": task_id, "end_row": end_row }))
        .collect();
    serde_json::json!({
        "step": step,
        "rank": rank,
        "world_size": 2,
        "epoch": 0,
        "positions": positions,
    })
    .to_string()
}

#[tokio::test]
async fn a_trainer_learns_its_job_and_world_size() {
    let (am, _) = busy_am();
    let sut = checkpoints::router(am, TokenCheck::new(None));
    let (status, body) = post(sut, checkpoints::JOB_ROUTE, "{}", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["job_id"], "web");
    assert_eq!(body["world_size"], 1);
}

#[tokio::test]
async fn checkpoint_calls_require_the_token() {
    let (am, _) = busy_am();
    let sut = checkpoints::router(am, TokenCheck::new(Some("s3cret".into())));
    for route in [
        checkpoints::COMMIT_ROUTE,
        checkpoints::RESTORE_ROUTE,
        checkpoints::JOB_ROUTE,
    ] {
        for refused in [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cre"),
            Some("s3cret"),
        ] {
            let (status, body) = post(sut.clone(), route, "{}", refused).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{route} with {refused:?}");
            assert_eq!(body["code"], "unauthenticated");
            let message = body["message"].as_str().expect("a message");
            assert!(
                message.contains("--token") && message.contains("SLUICE_TOKEN"),
                "{message}"
            );
        }
    }
    let (status, body) = post(
        sut,
        checkpoints::COMMIT_ROUTE,
        &commit_body(1, 0, &[]),
        Some("Bearer s3cret"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        serde_json::json!({ "pending": { "ranks_reported": 1, "world_size": 2 } })
    );
}

#[tokio::test]
async fn a_malformed_checkpoint_request_is_a_400_naming_the_problem() {
    let (am, _) = busy_am();
    let sut = checkpoints::router(am, TokenCheck::new(None));
    for (route, body, problem) in [
        (
            checkpoints::COMMIT_ROUTE,
            "{\"step\": 3",
            "EOF while parsing",
        ),
        (
            checkpoints::COMMIT_ROUTE,
            "{\"rank\": 0}",
            "missing field `step`",
        ),
        (
            checkpoints::COMMIT_ROUTE,
            "{\"step\": -1, \"rank\": 0, \"world_size\": 1, \"epoch\": 0, \"positions\": []}",
            "invalid value: integer `-1`",
        ),
        (checkpoints::RESTORE_ROUTE, "[]", "expected struct"),
    ] {
        let (status, reply) = post(sut.clone(), route, body, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{route} {body}: {reply}");
        assert_eq!(reply["code"], "invalid_argument");
        let message = reply["message"].as_str().expect("a message");
        assert!(
            message.contains(problem) && message.contains("send {"),
            "{route} {body}: {message}"
        );
    }
    let (status, reply) = post(
        sut,
        checkpoints::COMMIT_ROUTE,
        &commit_body(1, 2, &[]),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    let message = reply["message"].as_str().expect("a message");
    assert!(
        message.contains("rank 2 is not below world size 2"),
        "the master's refusal is passed on: {message}"
    );
}

#[tokio::test]
async fn a_checkpoint_committed_by_every_rank_restores_over_json() {
    let (am, handed) = busy_am();
    let sut = checkpoints::router(am.clone(), TokenCheck::new(None));
    // Each task's consumed prefix, in split rows: the splits of `master()` start at rows 0 and 100
    // of their files, and the heartbeat of `busy_am()` reported 3 and 4 rows consumed.
    let consumed: Vec<(u64, u64)> = handed
        .iter()
        .zip([3, 4])
        .map(|((task_id, (uri, first_row, _)), rows)| {
            let split_first_row = if uri.ends_with("part-1.parquet") {
                100
            } else {
                0
            };
            (*task_id, first_row - split_first_row + rows)
        })
        .collect();

    let mut tokens = Vec::new();
    for step in [7, 8] {
        let (status, pending) = post(
            sut.clone(),
            checkpoints::COMMIT_ROUTE,
            &commit_body(step, 0, &consumed[..1]),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{pending}");
        assert_eq!(pending["pending"]["ranks_reported"], 1);
        let (status, committed) = post(
            sut.clone(),
            checkpoints::COMMIT_ROUTE,
            &commit_body(step, 1, &consumed[1..]),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{committed}");
        let token = committed["token"].as_str().expect("a token").to_owned();
        let (_, again) = post(
            sut.clone(),
            checkpoints::COMMIT_ROUTE,
            &commit_body(step, 0, &consumed[..1]),
            None,
        )
        .await;
        assert_eq!(
            again["token"],
            token.as_str(),
            "a stored step keeps its token"
        );
        tokens.push(token);
    }

    let restore = |token: &str| serde_json::json!({ "token": token }).to_string();
    let (status, restored) = post(
        sut.clone(),
        checkpoints::RESTORE_ROUTE,
        &restore(&tokens[0]),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{restored}");
    assert_eq!(
        restored,
        serde_json::json!({ "step": 7, "epoch": 0, "effect": "rings_replaced" })
    );
    let counts = am.master().status(2_000).tasks.expect("task counts");
    assert_eq!(
        counts.rows_consumed, 7,
        "the table stands at the checkpoint"
    );
    assert_eq!(counts.in_flight, 0, "every task was taken back");

    let (status, again) = post(
        sut.clone(),
        checkpoints::RESTORE_ROUTE,
        &restore(&tokens[0]),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again, restored,
        "a second restore to the same checkpoint, with no row consumed since, answers the same"
    );

    let (status, refused) = post(
        sut.clone(),
        checkpoints::RESTORE_ROUTE,
        &restore(&tokens[1]),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["code"], "failed_precondition");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|message| message.contains("loaded different checkpoints")),
        "{refused}"
    );

    let (status, unknown) = post(
        sut,
        checkpoints::RESTORE_ROUTE,
        &restore("web-step9-0"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{unknown}");
    assert_eq!(unknown["code"], "not_found");
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|message| message.contains("data checkpoint web-step9-0 is not in")),
        "{unknown}"
    );
}
