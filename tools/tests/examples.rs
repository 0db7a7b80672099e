//! The S3 example of `examples/` runs against a real S3 server.

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
