//! Heavy chaos across hosts: `sluice-bench chaos --hosts 3 --heavy` on the multi-host test bed, a
//! few seeded runs in a row. The faults overlap: a node's cable is pulled while its daemon is
//! killed and started again cut off (fenced at its registration once the link is back, with its
//! rings still holding rows the AM queued again) or while the AM moves; daemons and trainers are
//! killed. Every run must deliver every id exactly once, counted by the rule of a node cut off.
//!
//! Needs root and network namespaces: a plain `cargo test` lists it as ignored, and
//! `./scripts/test.sh` runs it with `--ignored`.

mod common;

use std::process::Command;

/// Seeded runs, one after another; each seed picks another schedule of overlapping faults.
const RUNS: usize = 3;

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn overlapping_faults_across_hosts_deliver_every_id_exactly_once_in_every_run() {
    let directory = tempfile::tempdir().expect("tempdir");
    common::sluice();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args([
            "chaos", "--json", "--hosts", "3", "--heavy", "--rows", "600000",
        ])
        .args(["--runs", &RUNS.to_string(), "--seed", "44"])
        .args([
            "--daemon-kills",
            "2",
            "--trainer-kills",
            "2",
            "--am-kills",
            "1",
        ])
        .args(["--link-cuts", "3", "--hangs", "0"])
        .args(["--trainer-rows-per-s", "20000", "--dir"])
        .arg(directory.path())
        .output()
        .expect("run sluice-bench chaos --hosts --heavy");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "sluice-bench chaos --hosts --heavy failed:\n{stdout}\n{stderr}\n{}",
        sluice_testkit::job::logs(directory.path())
    );
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per run"))
        .collect();
    assert_eq!(reports.len(), RUNS, "{stdout}");
    let mut kinds = Vec::new();
    for report in &reports {
        assert_eq!(report["job_succeeded"], true, "{report}");
        assert_eq!(report["duplicates"], 0, "{report}");
        assert_eq!(report["missing"], 0, "{report}");
        kinds.extend(
            report["kills"]
                .as_array()
                .expect("kills")
                .iter()
                .filter_map(|kill| kill["what"].as_str().map(str::to_owned)),
        );
    }
    for kind in ["link+daemon", "link+am"] {
        assert!(
            kinds.iter().any(|seen| seen == kind),
            "no {kind} fault in {RUNS} runs: {kinds:?}"
        );
    }
}
