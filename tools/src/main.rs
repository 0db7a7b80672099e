//! The `sluice` command.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sluice: the data plane that feeds distributed ML training.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Moves records between two processes through a shared-memory ring and checks every byte.
    Demo(cmd::demo::DemoArgs),
    /// Removes the rings under a directory whose producer, consumer and creator are all gone.
    Gc(cmd::gc::GcArgs),
    /// Benchmarks: the ring against other transports, Parquet decode against pyarrow, and more.
    Bench(cmd::bench::BenchArgs),
    /// Reads a source (Parquet, Delta, Arrow IPC, CSV, JSON lines, TFRecord) and prints its rows or stats.
    Read(cmd::read::ReadArgs),
    /// Prints the tasks (splits) a job would get from a source.
    Plan(cmd::plan::PlanArgs),
    /// Writes synthetic training data (Parquet files or a Delta table).
    Gen(cmd::r#gen::GenArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Demo(args) => cmd::demo::run(args),
        Command::Gc(args) => cmd::gc::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Read(args) => cmd::read::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Gen(args) => cmd::r#gen::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
