//! `sluice am --http`: the status page, its JSON API and `/metrics` of a real AM over generated
//! Parquet data, driven by a daemon speaking the real gRPC protocol, read over HTTP and rendered
//! by headless Chromium.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::AmProcess;

use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use tonic::transport::Channel;

const ROWS: u64 = 1000;
const JOB: &str = "http-test";
const TOKEN: &str = "s3cret";
const HOSTNAME: &str = "daemon-host-7";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Writes 1000 rows in 2 Parquet files of row groups of 100, and a job spec over them.
fn job(directory: &Path) -> std::path::PathBuf {
    let data = common::generate(directory, ROWS, 2, 100);
    common::write_spec(
        directory,
        &format!(
            r#"
name: {JOB}
data:
  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 60000 }}
"#,
            data.display()
        ),
    )
}

/// Starts `sluice am` with its status page; returns it with the page's base URL.
fn start(spec: &Path, extra: &[&str]) -> (AmProcess, String) {
    let mut arguments = vec!["--http", "127.0.0.1:0"];
    arguments.extend_from_slice(extra);
    let am = AmProcess::start(spec, "127.0.0.1:0", &arguments);
    let base = format!(
        "http://{}",
        am.http.as_deref().expect("started with --http")
    );
    (am, base)
}

/// What the daemon reported, to check every figure against.
#[derive(Debug)]
struct Reported {
    /// (task id, split uri, first row in the file, rows, enqueued, consumed)
    tasks: Vec<(u64, String, u64, u64, u64, u64)>,
    consumed: u64,
}

const DECODE_BUSY_NS: u64 = 1_250_000_000;
const DECODE_WAIT_NS: u64 = 500_000_000;
const DECODE_ROWS: u64 = 321;
const DECODE_BYTES: u64 = 654_321;
const RING_USED: u64 = 4096;
const RING_CAPACITY: u64 = 1 << 20;
/// The trainer waits on its empty ring for a quarter of each heartbeat interval.
const TRAINER_WAIT_PER_HEARTBEAT_NS: u64 = 25_000_000;
const DAEMON_WAIT_NS: u64 = 3_000_000_000;

fn heartbeat(progress: &[v1::TaskProgress], beat: u64) -> v1::HeartbeatRequest {
    v1::HeartbeatRequest {
        hostname: String::new(),
        node_id: 0,
        progress: progress.to_vec(),
        stages: vec![v1::StageStats {
            stage: "decode".into(),
            busy_ns: DECODE_BUSY_NS,
            wait_ns: DECODE_WAIT_NS,
            rows: DECODE_ROWS,
            bytes: DECODE_BYTES,
        }],
        rings: vec![v1::RingStats {
            rank: 0,
            used_bytes: RING_USED,
            capacity_bytes: RING_CAPACITY,
            trainer_wait_ns: TRAINER_WAIT_PER_HEARTBEAT_NS * beat,
            daemon_wait_ns: DAEMON_WAIT_NS,
            ..v1::RingStats::default()
        }],
        keeps_finished_until_durable: false,
        tuning: None,
    }
}

/// Registers node 0, takes two tasks and reports part of each consumed, with stage and ring
/// statistics; keeps heartbeating for `beats` intervals of 100 ms so the AM's history has
/// samples with growing ring waits.
async fn run_daemon(address: &str, token: Option<&str>, beats: u64) -> Reported {
    let channel = Channel::from_shared(format!("http://{address}"))
        .expect("a valid address")
        .connect()
        .await
        .expect("connect to the AM");
    let authorization: Option<tonic::metadata::MetadataValue<_>> = token.map(|token| {
        format!("Bearer {token}")
            .parse()
            .expect("a printable token")
    });
    let mut client =
        DaemonServiceClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            if let Some(value) = &authorization {
                request
                    .metadata_mut()
                    .insert("authorization", value.clone());
            }
            Ok(request)
        });
    client
        .register(v1::RegisterRequest {
            node_by_host: false,
            node_id: 0,
            job_id: JOB.into(),
            hostname: HOSTNAME.into(),
            held: Vec::new(),
        })
        .await
        .expect("register");
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
    let assigned: Vec<v1::TaskAssignment> = commands
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Assign(assign)) => Some(assign.tasks.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(assigned.len(), 2, "two tasks handed out: {commands:?}");
    // Consume 61 and 76 rows, 137 together: figures no other count of the job equals.
    let mut tasks = Vec::new();
    for (task, consumed) in assigned.iter().zip([61, 76]) {
        let split = task
            .split
            .as_ref()
            .expect("an assignment carries its split");
        let rows = task.end - task.start;
        assert!(rows > 90, "tasks of at least 100 rows: {task:?}");
        tasks.push((
            task.task_id,
            split.uri.clone(),
            split.first_row + task.start,
            rows,
            consumed + 10,
            consumed,
        ));
    }
    let progress: Vec<v1::TaskProgress> = tasks
        .iter()
        .map(|(task_id, _, _, _, enqueued, consumed)| v1::TaskProgress {
            task_id: *task_id,
            enqueued: *enqueued,
            consumed: *consumed,
            bad: Vec::new(),
            sent: 0,
            dropped: Vec::new(),
        })
        .collect();
    for beat in 1..=beats {
        client
            .heartbeat(heartbeat(&progress, beat))
            .await
            .expect("heartbeat");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Reported {
        consumed: tasks.iter().map(|task| task.5).sum(),
        tasks,
    }
}

/// An HTTP client that never goes through a proxy: the AM is on this machine.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client")
}

async fn fetch(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> (reqwest::StatusCode, String) {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|error| panic!("GET {url}: {error}"));
    let status = response.status();
    let body = response.text().await.expect("a text body");
    (status, body)
}

async fn fetch_json(client: &reqwest::Client, url: &str, token: Option<&str>) -> serde_json::Value {
    let (status, body) = fetch(client, url, token).await;
    assert_eq!(status, reqwest::StatusCode::OK, "GET {url}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|error| panic!("GET {url}: {error}: {body}"))
}

/// Waits until the history of `/api/status` satisfies `ready`, and returns the status.
async fn status_when(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    what: &str,
    ready: impl Fn(&[serde_json::Value]) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = fetch_json(client, &format!("{base}/api/status"), token).await;
        if ready(status["history"].as_array().expect("history is an array")) {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no history with {what} within 20 s (deadlock watchdog): {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of the sample line `series` (name and labels) of a metrics text.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
        .parse()
        .unwrap_or_else(|error| panic!("sample {series}: {error}"))
}

#[test]
fn the_json_api_and_metrics_show_what_the_daemon_reported() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (am, base) = start(&job(directory.path()), &[]);
    common::runtime().block_on(async {
        let reported = run_daemon(&am.address, None, 3).await;
        assert_eq!(reported.consumed, 137);
        let client = http_client();

        let status = status_when(&client, &base, None, "the last heartbeat", |history| {
            history.last().is_some_and(|sample| {
                sample["rows_consumed"] == reported.consumed
                    && sample["trainer_wait_ns"] == TRAINER_WAIT_PER_HEARTBEAT_NS * 3
            })
        })
        .await;
        assert_eq!(status["job"], JOB);
        assert_eq!(status["state"], "running");
        assert_eq!(status["tasks"]["rows_total"], ROWS);
        assert_eq!(status["tasks"]["rows_consumed"], reported.consumed);
        assert_eq!(status["tasks"]["in_flight"], 2);
        let node = &status["nodes"][0];
        assert_eq!(node["hostname"], HOSTNAME);
        assert_eq!(node["state"], "alive");
        assert_eq!(node["tasks_held"], 2);
        assert_eq!(node["stages"][0]["rows"], DECODE_ROWS);
        assert_eq!(node["rings"][0]["daemon_wait_ns"], DAEMON_WAIT_NS);
        let latest = status["history"]
            .as_array()
            .expect("history")
            .last()
            .cloned();
        let latest = latest.expect("a sample");
        assert_eq!(latest["rings"], 1);
        assert_eq!(latest["daemon_wait_ns"], DAEMON_WAIT_NS);
        assert_eq!(latest["trainer_wait_ns"], TRAINER_WAIT_PER_HEARTBEAT_NS * 3);

        let tasks = fetch_json(&client, &format!("{base}/api/tasks"), None).await;
        // Each 500-row file packs its 100-row groups into tasks of 200, 200 and 100 rows.
        assert_eq!(
            tasks["counts"],
            serde_json::json!({ "pending": 4, "in_flight": 2, "done": 0, "failed": 0 })
        );
        let mut expected: Vec<serde_json::Value> = reported
            .tasks
            .iter()
            .map(|(task_id, uri, first_row, rows, enqueued, consumed)| {
                serde_json::json!({
                    "task_id": task_id, "node_id": 0, "uri": uri, "first_row": first_row,
                    "rows": rows, "enqueued": enqueued, "consumed": consumed,
                })
            })
            .collect();
        expected.sort_by_key(|task| task["task_id"].as_u64());
        assert_eq!(tasks["in_flight"], serde_json::Value::Array(expected));

        let (code, text) = fetch(&client, &format!("{base}/metrics"), None).await;
        assert_eq!(code, reqwest::StatusCode::OK, "{text}");
        for (series, value) in [
            ("sluice_am_job_state{state=\"running\"}", 1.0),
            ("sluice_am_epoch_rows", ROWS as f64),
            ("sluice_am_epoch_rows_consumed", reported.consumed as f64),
            ("sluice_am_tasks{state=\"in_flight\"}", 2.0),
            ("sluice_am_tasks{state=\"pending\"}", 4.0),
            (
                &format!("sluice_am_node_up{{node=\"0\",hostname=\"{HOSTNAME}\"}}"),
                1.0,
            ),
            ("sluice_am_node_tasks_held{node=\"0\"}", 2.0),
            (
                "sluice_am_stage_busy_seconds_total{node=\"0\",stage=\"decode\"}",
                1.25,
            ),
            (
                "sluice_am_stage_wait_seconds_total{node=\"0\",stage=\"decode\"}",
                0.5,
            ),
            (
                "sluice_am_stage_rows_total{node=\"0\",stage=\"decode\"}",
                DECODE_ROWS as f64,
            ),
            (
                "sluice_am_stage_bytes_total{node=\"0\",stage=\"decode\"}",
                DECODE_BYTES as f64,
            ),
            (
                "sluice_am_ring_used_bytes{node=\"0\",rank=\"0\"}",
                RING_USED as f64,
            ),
            (
                "sluice_am_ring_capacity_bytes{node=\"0\",rank=\"0\"}",
                RING_CAPACITY as f64,
            ),
            (
                "sluice_am_ring_trainer_wait_seconds_total{node=\"0\",rank=\"0\"}",
                0.075,
            ),
            (
                "sluice_am_ring_daemon_wait_seconds_total{node=\"0\",rank=\"0\"}",
                3.0,
            ),
        ] {
            assert_eq!(metric(&text, series), value, "{series} in\n{text}");
        }
        let since_heartbeat = metric(&text, "sluice_am_node_since_heartbeat_seconds{node=\"0\"}");
        assert!(
            (0.0..60.0).contains(&since_heartbeat),
            "a live node was heard from within its timeout: {since_heartbeat}"
        );
    });
}

#[test]
fn a_token_guards_every_route() {
    let directory = tempfile::tempdir().expect("tempdir");
    // The binding keeps the AM running until the test ends.
    let (_am, base) = start(&job(directory.path()), &["--token", TOKEN]);
    common::runtime().block_on(async {
        let client = http_client();
        // The page holds no data of the job: it asks for the token.
        let (code, page) = fetch(&client, &format!("{base}/"), None).await;
        assert_eq!(code, reqwest::StatusCode::OK);
        assert!(page.contains("id=\"token-form\""), "{page}");
        for route in ["/api/status", "/api/tasks", "/metrics"] {
            let url = format!("{base}{route}");
            for token in [None, Some("wrong")] {
                let (code, body) = fetch(&client, &url, token).await;
                assert_eq!(code, reqwest::StatusCode::UNAUTHORIZED, "{route}: {body}");
                assert!(
                    body.contains("--token") && body.contains("SLUICE_TOKEN"),
                    "{route}: {body}"
                );
            }
            let (code, body) = fetch(&client, &url, Some(TOKEN)).await;
            assert_eq!(code, reqwest::StatusCode::OK, "{route}: {body}");
            // A token in the address ends up in logs and histories: it is not accepted.
            let (code, body) = fetch(&client, &format!("{url}?token={TOKEN}"), None).await;
            assert_eq!(
                code,
                reqwest::StatusCode::UNAUTHORIZED,
                "{route}?token: {body}"
            );
        }
    });
}

/// The `<svg id=...>` element of a dumped DOM, up to its end tag.
fn svg_element<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no <svg id={id:?}> in the page:\n{dom}"));
    let length = dom[start..]
        .find("</svg>")
        .expect("an svg element is closed");
    &dom[start..start + length]
}

/// The point count of the first polyline of an svg element.
fn polyline_points(svg: &str) -> usize {
    let start = svg
        .find("<polyline")
        .unwrap_or_else(|| panic!("no polyline in {svg}"));
    let points = svg[start..]
        .split("points=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a polyline without points in {svg}"));
    points.split_whitespace().count()
}

#[test]
fn the_status_page_renders_the_job_in_headless_chromium() {
    sluice_testkit::require_program(
        CHROMIUM,
        "./scripts/test.sh installs it (apt-get install chromium)",
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let (am, base) = start(&job(directory.path()), &["--token", TOKEN]);
    common::runtime().block_on(async {
        let reported = run_daemon(&am.address, Some(TOKEN), 25).await;
        // Three samples with the ring make at least two points of the throughput chart, and
        // span the second the stall chart needs for a point.
        status_when(
            &http_client(),
            &base,
            Some(TOKEN),
            "3 ring samples",
            |history| {
                let with_ring = history.iter().filter(|sample| sample["rings"] == 1);
                with_ring.count() >= 3
                    && history
                        .last()
                        .is_some_and(|sample| sample["rows_consumed"] == reported.consumed)
            },
        )
        .await;
    });
    let profile = tempfile::tempdir().expect("tempdir");
    let output = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(["--virtual-time-budget=5000", "--dump-dom"])
        .arg(format!("{base}/#token={TOKEN}"))
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "chromium failed: {}\n{dom}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        dom.contains("<p id=\"error\" role=\"alert\" hidden=\"\"></p>"),
        "the page read the API without an error:\n{dom}"
    );
    assert!(
        dom.contains(&format!("<span id=\"job\">{JOB}</span>")),
        "{dom}"
    );
    assert!(
        dom.contains("<span id=\"rows-consumed\">137</span>"),
        "{dom}"
    );
    assert!(
        dom.contains("<span id=\"rows-total\">1,000</span>"),
        "{dom}"
    );
    assert!(
        dom.contains(&format!("<td>node-0</td><td>{HOSTNAME}</td><td>alive</td>")),
        "the executors table lists the node:\n{dom}"
    );
    assert!(dom.contains("2 in flight"), "{dom}");
    // Seconds to a tenth, halves rounded up as the page's `toFixed` does.
    let tenths = |nanos: u64| format!("{:.1}", (nanos as f64 / 1e8).round() / 10.0);
    let stages = format!(
        "<td>decode {} s / {} s</td>",
        tenths(DECODE_BUSY_NS),
        tenths(DECODE_WAIT_NS)
    );
    assert!(
        dom.contains(&stages),
        "the executors table shows the daemon's stages as {stages}:\n{dom}"
    );
    assert!(
        polyline_points(svg_element(&dom, "rate-chart")) >= 2,
        "{dom}"
    );
    let stall = svg_element(&dom, "stall-chart");
    assert!(
        stall.contains("class=\"trainer\"") && stall.contains("class=\"daemon\""),
        "the stall chart draws both waits: {stall}"
    );
}
