//! `sluice-bench cache` end to end at a small scale: the real S3 server behind the delaying proxy,
//! three real `sluice run` jobs of two epochs. Speed is not asserted; what the cache is for is: the
//! second epoch with the cache reads next to nothing from S3, the runs without it read the data in
//! each epoch.

mod common;

use std::process::Command;

use serde_json::Value;

fn number(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{value} is not a number"))
}

#[test]
fn a_cached_second_epoch_reads_next_to_nothing_from_s3() {
    common::sluice();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "cache",
            "--rows",
            "400000",
            "--files",
            "4",
            "--task-rows",
            "16384",
        ])
        .args(["--delay-ms", "5", "--json"])
        .output()
        .expect("run sluice-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "sluice-bench cache failed: {stderr}"
    );
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|error| panic!("not JSON ({error}): {stdout}"));
    let data_bytes = number(&report["data_bytes"]);
    let runs = report["runs"].as_array().expect("runs");
    let run = |name: &str| {
        runs.iter()
            .find(|run| run["run"] == name)
            .unwrap_or_else(|| panic!("no run {name} in {report}"))
    };
    for name in ["s3", "s3 + cache", "local disk"] {
        for epoch in run(name)["epochs"].as_array().expect("epochs") {
            assert!(number(&epoch["rows_per_s"]) > 0.0, "{name}: {epoch}");
        }
    }
    let from_s3 = |name: &str, epoch: usize| number(&run(name)["epochs"][epoch]["bytes_from_s3"]);
    for epoch in 0..2 {
        assert!(
            from_s3("s3", epoch) >= 0.9 * data_bytes,
            "without the cache, epoch {epoch} reads the data from S3: {report}"
        );
        assert_eq!(from_s3("local disk", epoch), 0.0, "{report}");
    }
    assert!(
        from_s3("s3 + cache", 0) >= 0.9 * data_bytes,
        "the first epoch fills the cache from S3: {report}"
    );
    assert!(
        from_s3("s3 + cache", 1) <= 0.01 * data_bytes,
        "the second epoch reads the cache, not S3: {report}"
    );
}
