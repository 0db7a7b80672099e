//! `sluice bench`: runs the benchmark suite, `sluice-bench`, installed beside `sluice`.
//!
//! The suite is a binary of its own so that `sluice` links none of the benchmarks' dependencies;
//! `sluice bench ARGS...` replaces this process with `sluice-bench ARGS...`, which so gets the
//! arguments, stdin, stdout and stderr, and whose exit code is the one the caller sees.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::Args;

/// Arguments of `sluice bench`: all of them are `sluice-bench`'s, `--help` too.
#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct BenchArgs {
    /// The benchmark and its flags, e.g. `ring --quick` (`sluice bench --help` lists them).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<OsString>,
}

/// Runs `sluice-bench` from beside the running `sluice` in place of this process; returns only
/// when it cannot.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let sluice = std::env::current_exe().context("locating the running sluice")?;
    let bench = bench_beside(&sluice)?;
    let error = Command::new(&bench).args(&args.args).exec();
    Err(error).with_context(|| format!("running {}", bench.display()))
}

/// The `sluice-bench` binary in the directory of `sluice`, or an error that says how to build it.
fn bench_beside(sluice: &Path) -> anyhow::Result<PathBuf> {
    let bench = sluice.with_file_name("sluice-bench");
    anyhow::ensure!(
        bench.is_file(),
        "sluice bench runs the benchmark suite, sluice-bench, which is not installed beside sluice \
         (no {}): build it with `cargo build --release -p sluice-bench`, which puts it beside the \
         release sluice (`cargo build -p sluice-bench` beside a debug one)",
        bench.display()
    );
    Ok(bench)
}
