//! `sluice-bench suite --quick --python python3 --json OUT --png PNG`, end to end: every system, the
//! peers included, runs for real on the same data through the interpreter of the tests (where
//! `scripts/test.sh` installed the peers of `benches/python/requirements.txt`), every one delivers
//! every row, the JSON holds finite figures for each, and the chart is a PNG. Speed is not asserted.

mod common;
mod suite_run;

use serde_json::Value;
use suite_run::{LOADERS, TRAINERS};

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
        "torch, pyarrow, sluice, torchdata, spdl.pipeline, streaming, ray.data",
    );
    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let png_path = directory.path().join("suite.png");
    let (_, report) =
        suite_run::run_quick(directory.path(), &["--png".into(), png_path.clone().into()]);
    let rows = suite_run::QUICK_ROWS;
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
        "spdl",
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

#[test]
fn suite_runs_only_the_systems_named_and_refuses_a_list_it_cannot_run() {
    common::sluice();
    sluice_testkit::require_python_modules("torch, pyarrow, sluice");
    for (list, says) in [
        ("sluice,ray", "names `ray`, which the suite does not run"),
        ("pyarrow,spdl", "leaves out `sluice`"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
            .args(["suite", "--quick", "--python", "python3", "--systems", list])
            .output()
            .expect("run sluice-bench suite");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "--systems {list} ran: {stderr}");
        assert!(stderr.contains(says), "--systems {list}: {stderr}");
        assert!(
            stderr.contains("name systems from sluice, sluice_torch"),
            "{stderr}"
        );
    }

    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (stdout, report) = suite_run::run_quick(
        directory.path(),
        &["--systems".into(), "sluice,pyarrow".into()],
    );
    let mut measured: Vec<&str> = report["systems"]
        .as_object()
        .expect("systems")
        .keys()
        .map(String::as_str)
        .collect();
    measured.sort_unstable();
    assert_eq!(
        measured,
        ["memcpy", "pyarrow", "ring", "sluice"],
        "{report}"
    );
    let mut left_out: Vec<&str> = report["left_out"]
        .as_array()
        .expect("left_out")
        .iter()
        .map(|name| name.as_str().expect("a name"))
        .collect();
    left_out.sort_unstable();
    let mut expected: Vec<&str> = TRAINERS
        .into_iter()
        .filter(|name| !["sluice", "pyarrow"].contains(name))
        .collect();
    expected.sort_unstable();
    assert_eq!(left_out, expected, "{report}");
    assert!(stdout.contains("left out by --systems: "), "{stdout}");
}
