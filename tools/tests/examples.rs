//! The examples of `examples/` that need data run on generated data: the S3 one against a real S3
//! server, the Delta one on a generated table.

mod common;

use std::path::PathBuf;

use common::sluice;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}
#[test]
fn the_s3_example_reads_a_dataset_from_a_local_s3_server() {
    let Some(server) =
        sluice_testkit::start_seaweed("the_s3_example_reads_a_dataset_from_a_local_s3_server")
    else {
        return;
    };
    let options = sluice_testkit::s3_options();
    common::runtime().block_on(sluice_testkit::wait_for_bucket(&server, &options));
    let environment = [
        ("AWS_ACCESS_KEY_ID", sluice_testkit::ACCESS_KEY.to_owned()),
        (
            "AWS_SECRET_ACCESS_KEY",
            sluice_testkit::SECRET_KEY.to_owned(),
        ),
        (
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", sluice_testkit::S3_PORT),
        ),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("S3_BUCKET", sluice_testkit::BUCKET.to_owned()),
    ];
    let rows = 30_000;
    let generated = sluice()
        .args([
            "gen",
            "--out",
            &format!("s3://{}/train", sluice_testkit::BUCKET),
        ])
        .args(["--rows", &rows.to_string(), "--files", "3"])
        .envs(environment.iter().map(|(key, value)| (key, value)))
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "sluice gen to S3 failed: {}\n{}",
        String::from_utf8_lossy(&generated.stderr),
        server.log()
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let output = sluice()
        .arg("run")
        .arg(examples().join("s3.yaml"))
        .arg("--ring-dir")
        .arg(directory.path().join("rings"))
        .arg("--state-dir")
        .arg(directory.path().join("state"))
        .envs(environment.iter().map(|(key, value)| (key, value)))
        .output()
        .expect("sluice run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("sluice run: {rows} rows consumed")),
        "{stdout}"
    );
    assert!(stdout.contains("job s3-train succeeded"), "{stdout}");
}

#[test]
fn the_delta_example_reads_the_pinned_version_of_a_generated_table() {
    let directory = tempfile::tempdir().expect("tempdir");
    let table = directory.path().join("table");
    let generated = sluice()
        .args([
            "gen", "--format", "delta", "--rows", "20000", "--files", "2", "--out",
        ])
        .arg(&table)
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let counted = sluice()
        .arg("read")
        .arg(&table)
        .args(["--version", "0", "--filter", "label = 1", "--stats"])
        .output()
        .expect("sluice read --stats");
    let stats: serde_json::Value = serde_json::from_slice(&counted.stdout).expect("stats JSON");
    let rows = stats["rows"].as_u64().expect("rows");
    assert!(
        rows > 0 && rows < 20_000,
        "label = 1 keeps some rows: {stats}"
    );
    let output = sluice()
        .arg("run")
        .arg(examples().join("delta.yaml"))
        .arg("--ring-dir")
        .arg(directory.path().join("rings"))
        .arg("--state-dir")
        .arg(directory.path().join("state"))
        .env("SLUICE_DELTA", &table)
        .output()
        .expect("sluice run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each trainer ends its log with the JSON of `sluice consume`.
    let delivered: u64 = (0..4)
        .map(|rank| {
            let log = directory
                .path()
                .join(format!("state/trainer-worker-{rank}.log"));
            let text = std::fs::read_to_string(&log).expect("trainer log");
            let last = text
                .lines()
                .rev()
                .find(|line| line.starts_with('{'))
                .unwrap_or("{}");
            serde_json::from_str::<serde_json::Value>(last).expect("consume's JSON")["rows"]
                .as_u64()
                .unwrap_or_else(|| panic!("{}: no rows in {last:?}", log.display()))
        })
        .sum();
    assert_eq!(delivered, rows, "{stdout}");
}
