//! Reclaiming the rings of processes that are gone.
//!
//! A ring file outlives its processes on purpose (a restarted daemon reattaches to it), so nothing removes
//! it when they exit. [`collect`] removes the rings under a directory whose producer, consumer and creator
//! are all dead or absent with their ledgers, the temporary files of creations that died half way, and job
//! directories left empty. Files that are not rings are left alone and reported.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::ledger::Ledger;
use crate::process::PeerState;
use crate::{RING_EXTENSION, Ring};

/// What [`collect`] did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Ring files, their ledgers, and stale temporary files removed.
    pub removed: Vec<PathBuf>,
    /// Rings kept because a process using them is alive.
    pub kept: Vec<PathBuf>,
    /// Files with the ring extension that could not be opened as rings, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
    /// Directories removed because they were left empty.
    pub removed_directories: Vec<PathBuf>,
}

/// Removes the dead rings under `directory`, recursively. A missing directory has nothing to collect.
pub fn collect(directory: &Path) -> io::Result<GcReport> {
    let mut report = GcReport::default();
    if !directory.exists() {
        return Ok(report);
    }
    visit(directory, &mut report)?;
    Ok(report)
}

fn visit(directory: &Path, report: &mut GcReport) -> io::Result<()> {
    let mut entries = fs::read_dir(directory)?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<io::Result<Vec<_>>>()?;
    entries.sort();
    for path in entries {
        let file_type = match fs::symlink_metadata(&path) {
            Ok(metadata) => metadata.file_type(),
            // Removed since the listing: a ledger goes with its ring.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error),
        };
        if file_type.is_dir() {
            visit(&path, report)?;
            if fs::read_dir(&path)?.next().is_none() {
                fs::remove_dir(&path)?;
                report.removed_directories.push(path);
            }
        } else if file_type.is_file() {
            collect_file(path, report)?;
        }
    }
    Ok(())
}

fn collect_file(path: PathBuf, report: &mut GcReport) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(pid) = temporary_owner(&name) {
        // A creation in progress lives for microseconds; its file is stale once its process is gone.
        if !Path::new(&format!("/proc/{pid}")).exists() {
            fs::remove_file(&path)?;
            report.removed.push(path);
        }
        return Ok(());
    }
    if path.extension().and_then(|extension| extension.to_str()) != Some(RING_EXTENSION) {
        return Ok(());
    }
    let ring = match Ring::open(&path) {
        Ok(ring) => ring,
        Err(error) => {
            report.skipped.push((path, error.to_string()));
            return Ok(());
        }
    };
    let in_use = [
        ring.producer_state(),
        ring.consumer_state(),
        ring.creator_state(),
    ]
    .iter()
    .any(PeerState::is_alive);
    drop(ring);
    if in_use {
        report.kept.push(path);
    } else {
        fs::remove_file(&path)?;
        report.removed.push(path.clone());
        // The ledger of a removed ring describes nothing any more.
        let ledger = Ledger::path_beside(&path);
        match fs::remove_file(&ledger) {
            Ok(()) => report.removed.push(ledger),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Returns the pid in a temporary ring file name, `.<name>.<pid>.tmp`.
fn temporary_owner(name: &str) -> Option<u32> {
    let stem = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    stem.rsplit('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pid_of_temporary_names() {
        assert_eq!(temporary_owner(".3.ring.4242.tmp"), Some(4242));
        assert_eq!(temporary_owner("3.ring"), None);
        assert_eq!(temporary_owner(".x.tmp"), None);
    }
}
