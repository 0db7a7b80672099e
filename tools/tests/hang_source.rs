//! A task whose source read makes no progress in a live daemon: `sluice run` over a dataset on a
//! real S3 server reached through the test kit's delaying proxy, each request held for seconds. The
//! ring's feeder waits for the task's next batch past the spec's `failover.hang.after_s`; the daemon
//! says so in its heartbeats, and the AM shows the task as hung (warn) in `sluice status`, its JSON
//! and `/metrics`. The job still delivers every row exactly once.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::DelayProxy;
use sluice_testkit::job::read_ids;

const ROWS: i64 = 4_000;
/// Added to every chunk the proxy forwards, each way: a request takes twice this at least.
const DELAY: Duration = Duration::from_millis(1_500);
const WATCHDOG: Duration = Duration::from_secs(180);

#[test]
fn a_source_read_that_makes_no_progress_shows_as_a_hung_task() {
    let server = sluice_testkit::start_seaweed();
    let options = sluice_testkit::s3_options();
    common::runtime().block_on(sluice_testkit::wait_for_bucket(&server, &options));
    let upstream = SocketAddr::from(([127, 0, 0, 1], sluice_testkit::S3_PORT));
    let proxy = DelayProxy::start(
        "127.0.0.1:0".parse().expect("an address"),
        upstream,
        DELAY,
        None,
    );
    let data = format!("s3://{}/slow-source", sluice_testkit::BUCKET);
    let generated = sluice()
        .args([
            "gen",
            "--out",
            &data,
            "--rows",
            &ROWS.to_string(),
            "--files",
            "1",
        ])
        .args(["--row-group-rows", "1000"])
        .envs(sluice_testkit::s3_environment(upstream))
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "sluice gen to S3: {}\n{}",
        String::from_utf8_lossy(&generated.stderr),
        server.log()
    );

    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let ids = root.join("ids.bin");
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: slow-source
data:
  sources: [{{ uri: "{data}", format: parquet, columns: [id] }}]
  task_rows: 2000
  batch_size: 500
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume, --ids-out, "{ids}"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 60000, hang: {{ after_s: 1, action: warn }} }}
"#,
            sluice = env!("CARGO_BIN_EXE_sluice"),
            ids = ids.display(),
        ),
    );
    let address = common::free_address();
    let mut run = common::spawn_run(
        root,
        &spec,
        &address,
        &sluice_testkit::s3_environment(proxy.address()),
    );
    let printed = || common::run_output(root);

    let started = Instant::now();
    let hang = loop {
        let status = sluice()
            .args(["status", "--json", "--am", &address])
            .output()
            .expect("run sluice status");
        let hang = serde_json::from_slice::<serde_json::Value>(&status.stdout)
            .ok()
            .and_then(|status| {
                status["hangs"]
                    .as_array()?
                    .iter()
                    .find(|hang| hang["kind"] == "task")
                    .cloned()
            });
        if let Some(hang) = hang {
            break hang;
        }
        let ended = run.try_wait().expect("try_wait");
        assert!(
            ended.is_none() && started.elapsed() < WATCHDOG,
            "no task hang shown ({ended:?})\n{}",
            printed()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(hang["action"], "warn", "{hang}");
    assert_eq!(hang["node_id"], 0, "{hang}");
    assert!(
        hang["task_id"].as_u64().is_some_and(|task| task < 2),
        "{hang}"
    );
    let stuck = hang["stuck_ms"].as_u64().expect("stuck_ms");
    assert!(hang["bound_ms"] == 1_000 && stuck >= 1_000, "{hang}");

    while run.try_wait().expect("try_wait").is_none() {
        assert!(
            started.elapsed() < WATCHDOG,
            "the run did not end within {WATCHDOG:?}\n{}",
            printed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let printed = printed();
    assert!(
        printed.contains("has not given its ring a batch from its source for"),
        "the AM's log names the hung task\n{printed}"
    );
    assert!(printed.contains("job slow-source succeeded"), "{printed}");
    let mut delivered = read_ids(&ids);
    delivered.sort_unstable();
    assert_eq!(delivered, (0..ROWS).collect::<Vec<_>>(), "every row once");
}
