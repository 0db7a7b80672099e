//! Chaos: `sluice-bench chaos` at its default size, two million rows with two node daemons and four
//! trainers, three daemons, two daemons' supervisors (`sluice shim`), two trainers and two AMs killed
//! with `kill -9` at random moments, every kind once before any twice. The launcher starts each
//! daemon again (a daemon whose shim died, once it has stopped it), which takes its rings over from
//! their ledgers, and each trainer again with its rank, which reads on from its ring; the AM is
//! started again as an operator would, replays its journal and adopts the executors. The trainers'
//! ids files still hold every id exactly once: the bench checks it, and so does this test, from the
//! ids files the bench leaves in its directory.

mod common;

use std::process::Command;

use sluice_testkit::job::{logs, read_ids};

const ROWS: i64 = 2_000_000;

#[test]
fn daemons_their_shims_trainers_and_the_am_killed_at_random_moments_lose_and_repeat_no_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    common::sluice();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["chaos", "--json", "--rows", &ROWS.to_string()])
        .args([
            "--daemon-kills",
            "3",
            "--am-kills",
            "2",
            "--shim-kills",
            "2",
            "--trainer-kills",
            "2",
            "--dir",
        ])
        .arg(root)
        .output()
        .expect("run sluice-bench chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "sluice-bench chaos failed:\n{stdout}\n{stderr}\n{}",
        logs(&root.join("state"))
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let kills = report["kills"].as_array().expect("kills");
    let count = |what: &str| kills.iter().filter(|kill| kill["what"] == what).count();
    assert!(
        ["daemon", "am", "shim", "trainer"]
            .iter()
            .all(|kind| count(kind) >= 1)
            && kills.len() >= 6,
        "too few kills mid-run ({kills:?}): the run proves little"
    );
    assert!(
        report["takeovers"].as_u64().is_some_and(|count| count > 0),
        "no restarted daemon took its rings over: {report}"
    );
    assert_eq!(report["job_succeeded"], true, "{report}");
    assert_eq!(report["duplicates"], 0, "{report}");
    assert_eq!(report["missing"], 0, "{report}");
    let mut ids: Vec<i64> = (0..4)
        .flat_map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))))
        .collect();
    ids.sort_unstable();
    assert!(
        ids.iter().copied().eq(0..ROWS),
        "the ids files do not hold every id once: {} ids, the first {:?}",
        ids.len(),
        &ids[..ids.len().min(5)]
    );
}
