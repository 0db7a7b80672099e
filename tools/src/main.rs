//! The `sluice` command.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc serves every allocation: decoding allocates and frees buffers of megabytes for every batch, and
/// mimalloc hands freed memory out again where the system allocator maps fresh pages from the kernel, each
/// of which costs a page fault and zeroing.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (the value it has had since mimalloc 1.x as `reset_delay`); the
/// crate exports no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// How long freed memory stays with the process before mimalloc gives it back to the kernel. mimalloc's
/// default of one second returns buffers between splits that the next split allocates again, faulting in
/// and zeroing fresh pages; ten seconds keeps them through a read and still returns them when idle.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

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
    // SAFETY: mi_option_set is not thread safe; it runs first in main, before this process starts a thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
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
