//! `sluice bench` runs `sluice-bench` from beside `sluice`; where there is none, it fails saying how to
//! build it. (The forwarding itself is tested with `sluice-bench`, in `benches/tests/bench_forward.rs`.)

use std::process::Command;

#[test]
fn sluice_lists_bench_among_its_commands() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--help")
        .output()
        .expect("run sluice --help");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout
            .lines()
            .any(|line| line.trim_start().starts_with("bench ")),
        "no bench command in: {stdout}"
    );
}

#[test]
fn bench_without_sluice_bench_beside_sluice_says_how_to_build_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let sluice = directory.path().join("sluice");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &sluice).expect("copy sluice alone");
    let output = Command::new(&sluice)
        .args(["bench", "ring", "--quick"])
        .output()
        .expect("run sluice bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let missing = directory.path().join("sluice-bench");
    assert!(
        stderr.contains(&missing.display().to_string())
            && stderr.contains("cargo build --release -p sluice-bench"),
        "{stderr}"
    );
}
