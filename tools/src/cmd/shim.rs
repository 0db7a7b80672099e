//! `sluice shim`: the supervisor the local launcher starts each executor under.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

/// Arguments of `sluice shim`.
#[derive(Debug, clap::Args)]
pub struct ShimArgs {
    /// Where the shim records its pid and start time.
    #[arg(long)]
    pub pid_file: PathBuf,
    /// Where the shim writes the command's exit code when it ends.
    #[arg(long)]
    pub exit_file: PathBuf,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs the command and exits with its code. A SIGTERM to the executor's process group (the AM
/// stopping a trainer) is left to the command: the shim, which would die of it, waits for the
/// command's end and records it.
pub fn run(args: ShimArgs) -> anyhow::Result<std::process::ExitCode> {
    let terminated = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&terminated))
        .context("handling SIGTERM")?;
    let code =
        sluice_am::launcher::local::run_shim(&args.pid_file, &args.exit_file, &args.command)?;
    // Relaxed: read once the command has ended; the handler only sets it.
    if terminated.load(Ordering::Relaxed) {
        eprintln!("sluice shim: SIGTERM left to the command, which exited with {code}");
    }
    Ok(std::process::ExitCode::from(
        u8::try_from(code).unwrap_or(1),
    ))
}
