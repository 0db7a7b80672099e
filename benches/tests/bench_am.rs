//! `sluice-bench am` end to end at a tiny scale: a real AM process snapshotting its journal every
//! second, real daemon processes speaking gRPC, a SIGKILL and a recovery, and the JSON holds a
//! finite, positive figure for each key. Speed is not asserted.

use std::process::Command;

use serde_json::Value;

const FIGURES: [&str; 14] = [
    "executors",
    "tasks",
    "heartbeat_p50_ms",
    "heartbeat_p99_ms",
    "heartbeat_max_ms",
    "heartbeats_per_s",
    "am_cpu_percent",
    "am_rss_bytes",
    "recovery_ms",
    "journal_bytes",
    "memory_tasks",
    "memory_rss_bytes",
    "memory_hwm_bytes",
    "memory_takeover_hwm_bytes",
];

fn figure(report: &Value, path: &str) -> f64 {
    let value = path.split('.').fold(report, |value, key| &value[key]);
    let number = value
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is {value}, not a number in {report}"));
    assert!(
        number.is_finite() && number > 0.0,
        "{path} is {number}, not finite and positive"
    );
    number
}

#[test]
fn a_tiny_json_run_reports_every_figure() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "am",
            "--executors",
            "50",
            "--tasks",
            "2000",
            "--seconds",
            "3",
            "--memory-tasks",
            "20000",
            "--snapshot-interval-s",
            "1",
            "--json",
        ])
        .output()
        .expect("run sluice-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "sluice-bench am failed: {stderr}");
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "more than one line on stdout: {stdout}"
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("stdout is one JSON object");
    for key in FIGURES {
        figure(&report, key);
    }
    for key in ["heartbeat_p50_ms", "heartbeat_p99_ms", "am_cpu_percent"] {
        figure(&report, &format!("baseline_no_journal.{key}"));
    }
    assert_eq!(report["executors"], 50);
    assert_eq!(report["tasks"], 2000);
    assert_eq!(report["memory_tasks"], 20000);
    assert_eq!(report["snapshot_interval_s"], 1);
    assert!(
        figure(&report, "heartbeat_p50_ms") <= figure(&report, "heartbeat_p99_ms"),
        "p50 above p99 in {report}"
    );
    let per_second = figure(&report, "heartbeats_per_s");
    assert!(
        per_second <= 50.0 * 1.5,
        "{per_second} heartbeats/s from 50 daemons beating once a second"
    );
}

#[test]
fn a_job_too_small_for_the_window_is_refused_with_the_fix() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "am",
            "--executors",
            "20",
            "--tasks",
            "30",
            "--seconds",
            "4",
            "--memory-tasks",
            "100",
        ])
        .output()
        .expect("run sluice-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a 30-task job outlasted the run");
    assert!(stderr.contains("raise --tasks"), "{stderr}");
}

#[test]
fn zero_executors_are_rejected_before_anything_starts() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["am", "--executors", "0"])
        .output()
        .expect("run sluice-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "--executors 0 was accepted");
    assert!(stderr.contains("--executors"), "{stderr}");
}
