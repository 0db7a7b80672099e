//! What the tests of `sluice-bench suite` share: the systems a quick run measures, and the run
//! itself with the checks every quick run passes.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The systems that run a trainer.
pub const TRAINERS: [&str; 9] = [
    "sluice",
    "sluice_torch",
    "pytorch_dataloader",
    "pytorch_dataloader_naive",
    "torchdata",
    "pyarrow",
    "spdl",
    "mosaic_streaming",
    "ray_data",
];
/// The loaders run with several worker counts.
pub const LOADERS: [&str; 3] = ["pytorch_dataloader", "torchdata", "mosaic_streaming"];
/// The rows of a quick run's data.
pub const QUICK_ROWS: u64 = 120_000;

/// Runs `sluice-bench suite --quick --python python3` with `arguments`, its cache in `directory`
/// and its JSON report written there, and checks what every quick run must show: it succeeded,
/// printed its targets, ran every peer, and measured the quick data's rows. Returns its standard
/// output and its report.
pub fn run_quick(directory: &Path, arguments: &[OsString]) -> (String, Value) {
    let json_path = directory.join("suite.json");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["suite", "--quick", "--python", "python3"])
        .args(arguments)
        .arg("--json")
        .arg(&json_path)
        .arg("--cache-dir")
        .arg(directory.join("cache"))
        .output()
        .expect("run sluice-bench suite");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "sluice-bench suite {arguments:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("targets: "), "no targets line: {stdout}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("the JSON report"))
            .expect("the report is JSON");
    assert_eq!(
        report["not_installed"]
            .as_object()
            .map(serde_json::Map::len),
        Some(0),
        "every peer runs where the tests run: {}",
        report["not_installed"]
    );
    assert_eq!(report["rows"].as_u64(), Some(QUICK_ROWS), "{report}");
    (stdout, report)
}
