//! `sluice-bench suite --quick --python python3 --json OUT --png PNG`, end to end: every system, the
//! peers included, runs for real on the same data through the interpreter of the tests (where
//! `scripts/test.sh` installed the peers of `benches/python/requirements.txt`), every one delivers
//! every row, the JSON holds finite figures for each, and the chart is a PNG. Speed is not asserted.

mod common;

use std::process::Command;

use serde_json::Value;

/// The systems that run a trainer, with figures of their own beside rows/s.
const TRAINERS: [&str; 8] = [
    "sluice",
    "sluice_torch",
    "pytorch_dataloader",
    "pytorch_dataloader_naive",
    "torchdata",
    "pyarrow",
    "mosaic_streaming",
    "ray_data",
];
/// The physical limits, with rows/s and GB/s only.
const LIMITS: [&str; 2] = ["ring", "memcpy"];
/// The figures every trainer system has, each a finite positive number.
const TRAINER_FIGURES: [&str; 11] = [
    "rows_per_s",
    "gb_per_s",
    "rows_per_s_steady",
    "first_batch_s",
    "cpu_s_per_mrows",
    "trainer_cpu_s_per_mrows",
    "data_overhead",
    "data_overhead_half_work",
    "data_overhead_double_work",
    "peak_rss_bytes",
    "peak_pss_bytes",
];
/// The loaders run with several worker counts.
const LOADERS: [&str; 3] = ["pytorch_dataloader", "torchdata", "mosaic_streaming"];

fn positive(system: &Value, name: &str, key: &str) -> f64 {
    let number = system[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}.{key} is {}, not a number", system[key]));
    assert!(
        number.is_finite() && number > 0.0,
        "{name}.{key} is {number}, not finite and positive"
    );
    number
}

#[test]
fn suite_quick_measures_every_peer_on_the_same_rows_and_draws_the_chart() {
    common::sluice();
    sluice_testkit::require_python_modules(
        "torch, pyarrow, sluice, torchdata, streaming, ray.data",
    );
    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json_path = directory.path().join("suite.json");
    let png_path = directory.path().join("suite.png");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["suite", "--quick", "--python", "python3", "--json"])
        .arg(&json_path)
        .arg("--png")
        .arg(&png_path)
        .arg("--cache-dir")
        .arg(directory.path().join("cache"))
        .output()
        .expect("run sluice-bench suite");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "sluice-bench suite failed: {}\n{stdout}",
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
    let rows = report["rows"].as_u64().expect("rows");
    assert_eq!(rows, 120_000, "{report}");
    let systems = report["systems"].as_object().expect("systems");
    for name in LIMITS {
        let system = &systems
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {report}"));
        positive(system, name, "rows_per_s");
        positive(system, name, "gb_per_s");
    }
    for name in TRAINERS {
        let system = &systems
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {report}"));
        assert_eq!(system["rows"], rows, "{name} delivered another row count");
        for key in TRAINER_FIGURES {
            positive(system, name, key);
        }
        // The trainer computes its full share on every batch, so its epoch is never shorter than
        // its compute.
        for key in [
            "data_overhead",
            "data_overhead_half_work",
            "data_overhead_double_work",
        ] {
            let overhead = positive(system, name, key);
            assert!(overhead >= 1.0, "{name}.{key} is {overhead}, under 1");
        }
        let stall = system["stall_percent"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}.stall_percent is not a number"));
        assert!(
            stall.is_finite() && (0.0..=100.0).contains(&stall),
            "{name}.stall_percent is {stall}"
        );
        assert!(
            positive(system, name, "trainer_cpu_s_per_mrows")
                <= positive(system, name, "cpu_s_per_mrows") * 1.001,
            "{name}: the trainer's process is part of the system's processes"
        );
    }
    for name in LOADERS {
        let counts = report["by_workers"][name]
            .as_array()
            .unwrap_or_else(|| panic!("by_workers.{name} in {report}"));
        assert_eq!(counts.len(), 2, "{name} runs with 0 and 1 worker: {report}");
        let best = systems[name]["num_workers"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}.num_workers"));
        assert!(
            counts
                .iter()
                .any(|count| count["num_workers"].as_u64() == Some(best)),
            "{name}'s figure is one of its worker counts"
        );
    }
    let versions = report["versions"].as_object().expect("versions");
    for distribution in [
        "torch",
        "pyarrow",
        "numpy",
        "torchdata",
        "mosaicml-streaming",
        "ray",
    ] {
        assert!(
            versions.contains_key(distribution),
            "the version of {distribution} in {report}"
        );
    }
    assert_eq!(
        report["targets"].as_array().map(Vec::len),
        Some(5),
        "{report}"
    );

    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).expect("the PNG"),
    ));
    let reader = decoder.read_info().expect("a PNG header");
    let info = reader.info();
    assert_eq!((info.width, info.height), (1200, 600));
}
