//! A node daemon's stage metrics, as a real process: on its own `/metrics`, and in the AM's status
//! through its heartbeats.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{AmProcess, sluice};

const ROWS: u64 = 20_000;

/// The value of the sample `name{labels}` in Prometheus text.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
}

#[test]
fn stages_and_ring_waits_show_on_the_daemons_metrics_and_in_the_ams_status() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, ROWS, 2, 2000);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: daemon-metrics
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 2000
  batch_size: 500
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [unused] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
            data = data.display(),
        ),
    );
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let rings = root.join("rings");
    let mut daemon = sluice()
        .args([
            "daemon",
            "--am",
            &am.address,
            "--node-id",
            "0",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--ring-dir")
        .arg(&rings)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sluice daemon");
    let mut line = String::new();
    BufReader::new(daemon.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the daemon's first line");
    let url = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|url| url.starts_with("http://") && url.ends_with("/metrics"))
        .unwrap_or_else(|| panic!("the daemon prints its metrics URL first, got {line:?}"))
        .to_owned();
    // Paced, so that the daemon is still running while the test reads its figures.
    let mut trainer = sluice()
        .arg("consume")
        .arg("--ring")
        .arg(rings.join("daemon-metrics/0.ring"))
        .args(["--max-rows-per-s", "20000"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice consume");
    let runtime = common::runtime();
    let client = reqwest::Client::new();
    let started = Instant::now();
    let (text, status) = loop {
        let text = runtime
            .block_on(async { client.get(&url).send().await?.text().await })
            .unwrap_or_default();
        let status = common::status_json(&am.address);
        let written = sample(
            &text,
            r#"sluice_daemon_stage_rows_total{node="0",stage="write"}"#,
        );
        let reported = status["nodes"][0]["stages"]
            .as_array()
            .is_some_and(|stages| stages.iter().any(|stage| stage["rows"].as_u64() > Some(0)));
        if written.is_some_and(|rows| rows >= 5000.0) && reported {
            break (text, status);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no rows written and reported after 60 s; /metrics says:\n{text}\nthe AM says: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    for stage in ["fetch", "decode", "transform", "write"] {
        let busy = sample(
            &text,
            &format!(r#"sluice_daemon_stage_busy_seconds_total{{node="0",stage="{stage}"}}"#),
        )
        .unwrap_or_else(|| panic!("no busy time for {stage}:\n{text}"));
        assert!(busy > 0.0, "{stage} was never busy:\n{text}");
    }
    let fetched = sample(
        &text,
        r#"sluice_daemon_stage_bytes_total{node="0",stage="fetch"}"#,
    )
    .expect("fetched bytes");
    assert!(fetched > 0.0, "{text}");
    assert!(
        sample(
            &text,
            r#"sluice_daemon_ring_capacity_bytes{node="0",rank="0"}"#
        )
        .is_some_and(|bytes| bytes > 0.0),
        "{text}"
    );

    let node = &status["nodes"][0];
    let names: Vec<&str> = node["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .filter_map(|stage| stage["stage"].as_str())
        .collect();
    assert_eq!(names, ["fetch", "decode", "transform", "write"], "{status}");
    let ring = &node["rings"][0];
    assert_eq!(ring["rank"], 0, "{status}");
    assert!(ring["capacity_bytes"].as_u64() > Some(0), "{status}");
    assert!(trainer.wait().expect("trainer").success());
    let (succeeded, output) = am.finish();
    assert!(succeeded, "{output}");
    assert!(daemon.wait().expect("daemon").success());
}

#[test]
fn metrics_on_a_public_address_are_refused_without_insecure() {
    let output = common::sluice()
        .args(["daemon", "--am", "127.0.0.1:1", "--http", "0.0.0.0:0"])
        .output()
        .expect("run sluice daemon");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--insecure"), "{stderr}");
}
