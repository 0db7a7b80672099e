//! Chaos across hosts: `sluice-bench chaos --hosts 2` on the multi-host test bed, small. Two node
//! hosts, each with a daemon sidecar and a trainer launched by the bench; a daemon killed, a trainer
//! killed (started again on its ids file, as torchrun restarts a rank), the AM moved to the spare AM
//! host, a node's cable pulled until the AM declares it lost and plugged back (its daemon fenced,
//! its trainer's last reads void), a trainer stopped until the AM reports the hang. The bench
//! counts the ids by the rule of a node cut off and fails when any is missing or repeated; this
//! test checks its report.
//!
//! Needs root and network namespaces: a plain `cargo test` lists it as ignored, and
//! `./scripts/test.sh` runs it with `--ignored`.

mod common;

use std::process::Command;

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn faults_across_hosts_lose_and_repeat_no_row_and_each_is_noticed() {
    let directory = tempfile::tempdir().expect("tempdir");
    common::sluice();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["chaos", "--json", "--hosts", "2", "--rows", "800000"])
        .args([
            "--daemon-kills",
            "1",
            "--trainer-kills",
            "1",
            "--am-kills",
            "1",
        ])
        .args(["--link-cuts", "1"])
        .args(["--hangs", "1", "--trainer-rows-per-s", "15000", "--dir"])
        .arg(directory.path())
        .output()
        .expect("run sluice-bench chaos --hosts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "sluice-bench chaos --hosts failed:\n{stdout}\n{stderr}\n{}",
        sluice_testkit::job::logs(directory.path())
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(report["hosts"], 2, "{report}");
    assert_eq!(report["job_succeeded"], true, "{report}");
    assert_eq!(report["duplicates"], 0, "{report}");
    assert_eq!(report["missing"], 0, "{report}");
    let kinds: Vec<&str> = report["kills"]
        .as_array()
        .expect("kills")
        .iter()
        .filter_map(|kill| kill["what"].as_str())
        .collect();
    for kind in ["daemon", "trainer", "am", "link", "hang"] {
        assert!(kinds.contains(&kind), "no {kind} fault mid-run: {report}");
    }
    let detections = report["detections"].as_array().expect("detections");
    for what in ["node lost", "trainer hang", "daemons reach the moved AM"] {
        let seconds = detections
            .iter()
            .find(|detection| detection["what"] == what)
            .and_then(|detection| detection["seconds"].as_f64());
        assert!(
            seconds.is_some_and(|seconds| seconds > 0.0 && seconds < 60.0),
            "{what}: {report}"
        );
    }
    let fenced = std::fs::read_dir(directory.path())
        .expect("the run's directory")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("trainer-"))
        .any(|entry| {
            std::fs::read_to_string(entry.path()).is_ok_and(|text| text.contains("delivered again"))
        });
    assert!(
        fenced,
        "the cut-off node's trainer was told its last reads are void: {report}"
    );
}
