//! The `sluice` command.

#![forbid(unsafe_code)]

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
    ///
    /// Runs `sluice-bench`, installed beside `sluice` by `cargo build --release -p sluice-bench`.
    Bench(cmd::bench::BenchArgs),
    /// Reads a source (Parquet, Delta, Iceberg, Arrow IPC, CSV, JSON lines, TFRecord) and prints its rows or stats.
    Read(cmd::read::ReadArgs),
    /// Prints the tasks (splits) a job would get from a source.
    Plan(cmd::plan::PlanArgs),
    /// Writes synthetic training data (Parquet files or a Delta table).
    Gen(cmd::r#gen::GenArgs),
    /// Runs a job on this machine: its AM, node daemons and trainers, start to finish.
    Run(cmd::run::RunArgs),
    /// Starts a job in the background and prints its AM's address.
    Submit(cmd::run::SubmitArgs),
    /// Runs the application master of a job until the job is over.
    Am(cmd::am::AmArgs),
    /// The node daemon of a job: reads its tasks into the local trainers' rings.
    Daemon(cmd::daemon::DaemonArgs),
    /// The reference trainer: reads a ring to its end, recording the ids it saw.
    Consume(cmd::consume::ConsumeArgs),
    /// Prints the status of a running job.
    Status(cmd::am::StatusArgs),
    /// Stops a running job.
    Stop(cmd::am::StopArgs),
    /// Changes the number of trainers of a role of a running job.
    Scale(cmd::am::ScaleArgs),
    /// Adds a source to a running job.
    Source(cmd::am::SourceArgs),
    /// Prints the Kubernetes objects of a job, for `kubectl apply -f -`.
    Manifests(cmd::manifests::ManifestsArgs),
    /// Runs a command as an executor of the local launcher, recording its identity and exit code.
    #[command(hide = true)]
    Shim(cmd::shim::ShimArgs),
}

fn main() -> ExitCode {
    sluice_formats::allocator::keep_freed_buffers();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let success = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
    let result: anyhow::Result<ExitCode> = match cli.command {
        Command::Demo(args) => success(cmd::demo::run(args)),
        Command::Gc(args) => success(cmd::gc::run(args)),
        Command::Bench(args) => success(cmd::bench::run(args)),
        Command::Read(args) => success(cmd::read::run(args)),
        Command::Plan(args) => success(cmd::plan::run(args)),
        Command::Gen(args) => success(cmd::r#gen::run(args)),
        Command::Run(args) => success(cmd::run::run(args)),
        Command::Submit(args) => success(cmd::run::submit(args)),
        Command::Am(args) => success(cmd::am::run(args)),
        Command::Consume(args) => cmd::consume::run(args),
        Command::Daemon(args) => success(cmd::daemon::run(args)),
        Command::Status(args) => success(cmd::am::status(args)),
        Command::Stop(args) => success(cmd::am::stop(args)),
        Command::Scale(args) => success(cmd::am::scale(args)),
        Command::Source(args) => success(cmd::am::source(args)),
        Command::Manifests(args) => success(cmd::manifests::run(args)),
        Command::Shim(args) => cmd::shim::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
