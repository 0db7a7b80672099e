//! `sluice-bench suite --quick --json OUT --png PNG`, end to end: every system runs for real on the same
//! data, the JSON holds finite figures for each, and the chart is a PNG. Speed is not asserted.

mod common;

use std::process::Command;

use serde_json::Value;

/// The systems every run measures; `mosaic_streaming` and `ray_data` only where they are installed.
const REQUIRED: [&str; 6] = [
    "sluice",
    "sluice_torch",
    "pytorch_dataloader",
    "pyarrow",
    "ring",
    "memcpy",
];
/// The systems that run a trainer, with CPU, stall and memory figures of their own.
const TRAINERS: [&str; 4] = ["sluice", "sluice_torch", "pytorch_dataloader", "pyarrow"];

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
fn suite_quick_measures_every_system_on_the_same_rows_and_draws_the_chart() {
    common::sluice();
    sluice_testkit::require_python_modules("torch, pyarrow, sluice");
    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let json_path = directory.path().join("suite.json");
    let png_path = directory.path().join("suite.png");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["suite", "--quick", "--json"])
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
    let systems = report["systems"].as_object().expect("systems");
    for name in REQUIRED {
        let system = &systems
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {report}"));
        positive(system, name, "rows_per_s");
        positive(system, name, "gb_per_s");
    }
    let rows = report["rows"].as_u64().expect("rows");
    assert_eq!(rows, 120_000, "{report}");
    for name in TRAINERS {
        let system = &systems[name];
        positive(system, name, "cpu_s_per_mrows");
        positive(system, name, "peak_rss_bytes");
        let stall = system["stall_percent"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}.stall_percent is not a number"));
        assert!(
            stall.is_finite() && (0.0..=100.0).contains(&stall),
            "{name}.stall_percent is {stall}"
        );
        assert_eq!(system["rows"], rows, "{name} saw another row count");
    }
    // The DataLoader turns every row into a dict and collates it back, in or for the trainer's loop:
    // the trainer waits for each batch, so a stall of 0 would be a broken measurement.
    positive(
        &systems["pytorch_dataloader"],
        "pytorch_dataloader",
        "stall_percent",
    );
    let workers = systems["pytorch_dataloader"]["num_workers"]
        .as_u64()
        .expect("the best DataLoader's worker count");
    assert!(workers <= 2, "{workers}");
    assert_eq!(
        report["pytorch_dataloader_by_workers"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{report}"
    );
    for optional in ["mosaic_streaming", "ray_data"] {
        let missing = report["not_installed"]
            .as_array()
            .expect("not_installed")
            .iter()
            .any(|name| name == optional);
        assert_ne!(
            systems.contains_key(optional),
            missing,
            "{optional} is either measured or not installed: {report}"
        );
        if missing {
            assert!(
                stdout
                    .lines()
                    .any(|line| line.starts_with(optional) && line.ends_with("not installed")),
                "the table says {optional} is not installed: {stdout}"
            );
        }
    }

    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).expect("the PNG"),
    ));
    let reader = decoder.read_info().expect("a PNG header");
    let info = reader.info();
    assert_eq!((info.width, info.height), (1200, 600));
}
