//! `sluice gc`: removes the rings whose processes are all gone.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Arguments of `sluice gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// The directory that holds the rings, one subdirectory per job (default: /dev/shm/sluice-<uid>).
    #[arg(long, default_value_os_t = sluice_ring::default_ring_dir())]
    dir: PathBuf,
}

/// Removes dead rings under `--dir` and prints one line per file removed, kept or skipped.
pub fn run(args: GcArgs) -> anyhow::Result<()> {
    let report = sluice_ring::gc::collect(&args.dir)
        .with_context(|| format!("collecting rings under {}", args.dir.display()))?;
    for path in &report.removed {
        println!("removed {}", path.display());
    }
    for path in &report.removed_directories {
        println!("removed {}/", path.display());
    }
    for path in &report.kept {
        println!("kept {} (in use)", path.display());
    }
    for (path, reason) in &report.skipped {
        println!("skipped {}: {reason}", path.display());
    }
    println!(
        "{} removed, {} kept, {} skipped",
        report.removed.len(),
        report.kept.len(),
        report.skipped.len()
    );
    Ok(())
}
