//! `sluice bench ARGS...` is `sluice-bench ARGS...`: the `sluice` beside `sluice-bench` hands over its
//! arguments, and what `sluice-bench` prints and its exit code come back unchanged.

mod common;

use std::process::{Command, Output};

fn sluice_bench(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice-bench"))
        .args(arguments)
        .output()
        .expect("run sluice-bench")
}

fn sluice_bench_through_sluice(arguments: &[&str]) -> Output {
    Command::new(common::sluice())
        .arg("bench")
        .args(arguments)
        .output()
        .expect("run sluice bench")
}

#[test]
fn sluice_bench_help_is_the_help_of_sluice_bench() {
    let direct = sluice_bench(&["--help"]);
    let forwarded = sluice_bench_through_sluice(&["--help"]);
    assert!(direct.status.success(), "{direct:?}");
    assert_eq!(forwarded.status.code(), direct.status.code());
    let help = String::from_utf8_lossy(&forwarded.stdout);
    assert_eq!(help, String::from_utf8_lossy(&direct.stdout));
    for command in [
        "ring", "decode", "pipeline", "suite", "local-io", "chaos", "plan", "am",
    ] {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "{command} missing from: {help}"
        );
    }
}

#[test]
fn a_failure_of_sluice_bench_comes_back_through_sluice_unchanged() {
    let arguments = ["ring", "--quick", "--sizes", "64,3"];
    let direct = sluice_bench(&arguments);
    let forwarded = sluice_bench_through_sluice(&arguments);
    assert_eq!(direct.status.code(), Some(1), "{direct:?}");
    assert_eq!(forwarded.status.code(), Some(1), "{forwarded:?}");
    let stderr = String::from_utf8_lossy(&forwarded.stderr);
    assert!(
        stderr.contains("\"3\"") && stderr.contains("--sizes"),
        "{stderr}"
    );
    assert_eq!(stderr, String::from_utf8_lossy(&direct.stderr));
    let unknown = sluice_bench_through_sluice(&["no-such-benchmark"]);
    assert_eq!(
        unknown.status.code(),
        sluice_bench(&["no-such-benchmark"]).status.code()
    );
    assert_eq!(unknown.status.code(), Some(2), "clap's usage error");
}
