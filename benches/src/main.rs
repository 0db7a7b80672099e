//! The `sluice-bench` command: the benchmark suite, a binary of its own so that `sluice` links none of
//! the benchmarks' dependencies. Build it with `cargo build --release -p sluice-bench`; it lands beside
//! `sluice`, whose `sluice bench ...` runs it, and runs that `sluice` for what it measures.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    sluice_formats::allocator::keep_freed_buffers();
    let cli = cli::Cli::parse();
    // The AM that `am-server` serves logs as `sluice am` does: SLUICE_LOG, warnings by default.
    let filter = EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
