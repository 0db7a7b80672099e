//! `sluice shim`: the supervisor the local launcher starts each executor under.

use std::path::PathBuf;

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

/// Runs the command and exits with its code.
pub fn run(args: ShimArgs) -> anyhow::Result<std::process::ExitCode> {
    let code =
        sluice_am::launcher::local::run_shim(&args.pid_file, &args.exit_file, &args.command)?;
    Ok(std::process::ExitCode::from(
        u8::try_from(code).unwrap_or(1),
    ))
}
