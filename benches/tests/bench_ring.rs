//! `sluice-bench ring --quick --json` end to end: every transport runs for real, between processes
//! where it should, and the JSON holds a finite, positive figure for each. Speed is not asserted.

use std::process::Command;

use serde_json::Value;

const SIZES: [u64; 4] = [64, 4096, 65536, 1 << 20];
const BASELINES: [&str; 3] = ["unix_socket", "crossbeam", "iceoryx2"];

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

fn keys(value: &Value, path: &str) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .unwrap_or_else(|| panic!("{path} is {value}, not an object"))
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

#[test]
fn quick_json_run_reports_every_size_and_transport() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["ring", "--quick", "--json"])
        .output()
        .expect("run sluice-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "sluice-bench ring failed: {stderr}"
    );
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "more than one line on stdout: {stdout}"
    );
    let report: Value = serde_json::from_str(stdout.trim()).expect("stdout is one JSON object");

    assert_eq!(keys(&report, "report"), ["memcpy_gbps", "sizes"]);
    figure(&report["memcpy_gbps"], "memcpy_gbps");
    let sizes = report["sizes"].as_array().expect("sizes is a list");
    let bytes: Vec<u64> = sizes
        .iter()
        .map(|size| size["bytes"].as_u64().expect("bytes is an integer"))
        .collect();
    assert_eq!(bytes, SIZES);
    for size in sizes {
        let at = format!("sizes[{}]", size["bytes"]);
        assert_eq!(
            keys(size, &at),
            [
                "baselines",
                "bytes",
                "dram_ring",
                "far_behind",
                "gbps",
                "memcpy_working_set_gbps",
                "msgs_per_s",
                "ratio_to_memcpy",
                "ratio_to_memcpy_working_set",
                "ring_bytes"
            ]
        );
        let msgs_per_s = figure(&size["msgs_per_s"], &format!("{at}.msgs_per_s"));
        let gbps = figure(&size["gbps"], &format!("{at}.gbps"));
        figure(&size["ratio_to_memcpy"], &format!("{at}.ratio_to_memcpy"));
        figure(
            &size["memcpy_working_set_gbps"],
            &format!("{at}.memcpy_working_set_gbps"),
        );
        figure(
            &size["ratio_to_memcpy_working_set"],
            &format!("{at}.ratio_to_memcpy_working_set"),
        );
        // Records of 1 MiB and more also go through a ring beyond the last-level cache.
        let dram = &size["dram_ring"];
        if bytes_of(size) >= f64::from(1 << 20) {
            assert_eq!(dram["ring_bytes"], 256 << 20, "{at}.dram_ring");
            for key in [
                "msgs_per_s",
                "gbps",
                "memcpy_working_set_gbps",
                "ratio_to_memcpy_working_set",
            ] {
                figure(&dram[key], &format!("{at}.dram_ring.{key}"));
            }
        } else {
            assert!(dram.is_null(), "{at}.dram_ring is {dram}");
        }
        // And the producer writes into it far ahead of its consumer, two ways.
        let far = &size["far_behind"];
        if bytes_of(size) >= f64::from(1 << 20) {
            assert_eq!(far["ring_bytes"], 256 << 20, "{at}.far_behind");
            assert_eq!(far["backlog_bytes"], 32 << 20, "{at}.far_behind");
            let write = figure(&far["ring_write_gbps"], &format!("{at}.far_behind"));
            let plain = figure(&far["plain_copy_gbps"], &format!("{at}.far_behind"));
            let ratio = figure(&far["ratio"], &format!("{at}.far_behind"));
            assert!(
                (ratio - write / plain).abs() <= ratio * 1e-9,
                "{at}.far_behind: {far}"
            );
        } else {
            assert!(far.is_null(), "{at}.far_behind is {far}");
        }
        let implied_gbps = msgs_per_s * bytes_of(size) / 1e9;
        assert!(
            (gbps - implied_gbps).abs() <= implied_gbps * 1e-9,
            "{at}: {gbps} GB/s does not follow from {msgs_per_s} records/s"
        );
        let baselines = &size["baselines"];
        assert_eq!(keys(baselines, &format!("{at}.baselines")), {
            let mut sorted = BASELINES.to_vec();
            sorted.sort();
            sorted
        });
        for name in BASELINES {
            let baseline = &baselines[name];
            assert_eq!(keys(baseline, name), ["gbps", "msgs_per_s"]);
            figure(&baseline["msgs_per_s"], &format!("{at}.{name}.msgs_per_s"));
            figure(&baseline["gbps"], &format!("{at}.{name}.gbps"));
        }
    }
}

fn bytes_of(size: &Value) -> f64 {
    size["bytes"].as_f64().expect("bytes is a number")
}

#[test]
fn bad_sizes_are_rejected_with_the_fix() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(["ring", "--quick", "--sizes", "64,3"])
        .output()
        .expect("run sluice-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "--sizes 64,3 was accepted");
    assert!(
        stderr.contains("\"3\"") && stderr.contains("--sizes"),
        "{stderr}"
    );
}
