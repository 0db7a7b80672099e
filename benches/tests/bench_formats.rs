//! `sluice-bench local-io`, `plan`, `decode` and `pipeline` with `--quick --json`, end to end: every side
//! runs for real and the JSON holds a finite, positive figure for each. Speed is not asserted.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn figure(value: &Value, path: &str) -> f64 {
    let number = value
        .as_f64()
        .unwrap_or_else(|| panic!("{path} is {value}, not a number"));
    assert!(
        number.is_finite() && number > 0.0,
        "{path} is {number}, not finite and positive"
    );
    number
}

/// Checks a `Spread` object: a median within the range of the samples.
fn spread(value: &Value, path: &str) {
    let median = figure(&value["median"], &format!("{path}.median"));
    let min = figure(&value["min"], &format!("{path}.min"));
    let max = figure(&value["max"], &format!("{path}.max"));
    assert!(min <= median && median <= max, "{path}: {value}");
    let samples = value["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}.samples is not an array"));
    assert!(!samples.is_empty(), "{path}: no samples");
}

fn bench(arguments: &[&str], cache: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(arguments)
        .args(["--quick", "--json", "--cache-dir"])
        .arg(cache)
        .output()
        .expect("run sluice-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "sluice-bench {arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "more than one line on stdout: {stdout}"
    );
    serde_json::from_str(stdout.trim()).expect("stdout is one JSON object")
}

#[test]
fn local_io_quick_json_reports_both_paths_cold_and_warm() {
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("cache dir");
    let report = bench(&["local-io"], cache.path());
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 8, "2 cache states x 4 sizes: {report}");
    for case in cases {
        let name = format!("{}/{}", case["cache"], case["range_bytes"]);
        spread(&case["uring_gbps"], &format!("{name}.uring_gbps"));
        spread(&case["pread_gbps"], &format!("{name}.pread_gbps"));
        figure(&case["ratio"], &format!("{name}.ratio"));
    }
    assert_eq!(report["file_bytes"], 64 << 20);
}

#[test]
fn plan_quick_json_plans_every_row_of_the_table() {
    common::sluice();
    sluice_testkit::require_python_modules("pyarrow");
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("cache dir");
    let report = bench(&["plan"], cache.path());
    assert_eq!(report["files"], 100);
    assert_eq!(report["rows"], 1_000_000);
    assert!(
        report["splits"]
            .as_u64()
            .is_some_and(|splits| splits >= 100)
    );
    spread(&report["sluice_seconds"], "sluice_seconds");
    spread(&report["pyarrow_seconds"], "pyarrow_seconds");
    figure(&report["speedup"], "speedup");
}

#[test]
fn decode_quick_json_compares_both_codecs_with_pyarrow() {
    common::sluice();
    sluice_testkit::require_python_modules("pyarrow");
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("cache dir");
    let report = bench(&["decode"], cache.path());
    let codecs = report["codecs"].as_array().expect("codecs");
    let names: Vec<&str> = codecs
        .iter()
        .filter_map(|codec| codec["codec"].as_str())
        .collect();
    assert_eq!(names, ["snappy", "zstd"]);
    for codec in codecs {
        let name = codec["codec"].as_str().unwrap_or_default();
        assert_eq!(codec["rows"], 175_000, "{name}");
        figure(&codec["decoded_bytes"], &format!("{name}.decoded_bytes"));
        figure(&codec["file_bytes"], &format!("{name}.file_bytes"));
        for side in [
            "sluice_one_core",
            "pyarrow_one_core",
            "sluice_two_cores",
            "side_by_side",
        ] {
            spread(&codec[side], &format!("{name}.{side}"));
        }
        figure(
            &codec["ratio_to_pyarrow"],
            &format!("{name}.ratio_to_pyarrow"),
        );
        for ratio in [
            "two_cores_over_one",
            "side_by_side_over_one",
            "two_cores_over_side_by_side",
        ] {
            figure(&codec[ratio], &format!("{name}.{ratio}"));
        }
    }
    // Both files stay in the cache for the next run, and nothing half-written is left beside them.
    let files = |directory: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(directory)
            .expect("list")
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let cached = files(cache.path());
    assert_eq!(
        cached,
        [
            "training-v1-175000rows-65536rg-snappy.parquet",
            "training-v1-175000rows-65536rg-zstd.parquet"
        ]
    );
}

#[test]
fn pipeline_quick_json_delivers_the_file_to_a_trainer_beside_pyarrow() {
    common::sluice();
    sluice_testkit::require_python_modules("pyarrow");
    let cache = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("cache dir");
    let report = bench(&["pipeline"], cache.path());
    assert_eq!(report["rows"], 175_000, "{report}");
    assert_eq!(report["rounds"], 1, "{report}");
    spread(&report["sluice"], "sluice");
    spread(&report["pyarrow"], "pyarrow");
    figure(&report["ratio_to_pyarrow"], "ratio_to_pyarrow");
}
