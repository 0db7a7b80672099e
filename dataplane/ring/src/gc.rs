//! Reclaiming the rings of processes that are gone.
//!
//! A ring file outlives its processes on purpose (a restarted daemon reattaches to it), so nothing removes
//! it when they exit. [`collect`] removes the rings under a directory whose producer, consumer and creator
//! are all dead or absent with their ledgers, rings of another build's layout that no process maps or
//! holds open, the temporary files of creations that died half way, and job directories left empty.
//! Files that are not rings are left alone and reported.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::layout::{LAYOUT_VERSION, MAGIC};
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
            // A ring of another sluice build's layout cannot say who uses it; it is dead once no
            // process has it mapped or open.
            if other_layout(&path)? && !used_by_any_process(&path)? {
                remove_with_ledger(path, report)?;
            } else {
                report.skipped.push((path, error.to_string()));
            }
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
        remove_with_ledger(path, report)?;
    }
    Ok(())
}

/// Removes a ring with its ledger and schema file, which describe nothing any more.
fn remove_with_ledger(path: PathBuf, report: &mut GcReport) -> io::Result<()> {
    fs::remove_file(&path)?;
    report.removed.push(path.clone());
    for beside in [Ledger::path_beside(&path), crate::schema_path_beside(&path)] {
        match fs::remove_file(&beside) {
            Ok(()) => report.removed.push(beside),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Whether `path` starts like a ring of a layout version other than this build's.
fn other_layout(path: &Path) -> io::Result<bool> {
    use std::io::Read;
    let mut start = [0u8; 12];
    let mut file = fs::File::open(path)?;
    if file.read_exact(&mut start).is_err() {
        return Ok(false);
    }
    let magic = u64::from_le_bytes(start[..8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(start[8..].try_into().expect("4 bytes"));
    Ok(magic == MAGIC && version != LAYOUT_VERSION)
}

/// Whether a process has `path` mapped or open, as `/proc` tells. Processes whose `/proc` entries
/// cannot be read (another user's, or a container's init) are passed over.
fn used_by_any_process(path: &Path) -> io::Result<bool> {
    let path = fs::canonicalize(path)?;
    let shown = path.to_string_lossy();
    for entry in fs::read_dir("/proc")? {
        let entry = entry?;
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.bytes().all(|byte| byte.is_ascii_digit()))
        {
            continue;
        }
        let maps = match fs::read_to_string(entry.path().join("maps")) {
            Ok(maps) => maps,
            // Exited since the listing, or not ours to read.
            Err(_) => continue,
        };
        if maps.lines().any(|line| line.ends_with(shown.as_ref())) {
            return Ok(true);
        }
        let Ok(descriptors) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for descriptor in descriptors.flatten() {
            if fs::read_link(descriptor.path()).is_ok_and(|target| target == path) {
                return Ok(true);
            }
        }
    }
    Ok(false)
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
    #[cfg_attr(miri, ignore = "reads /proc, which Miri cannot")]
    fn a_ring_of_another_layout_goes_once_no_process_holds_it() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let mut bytes = vec![0u8; 8192];
        bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&(LAYOUT_VERSION - 1).to_le_bytes());
        fs::write(&path, &bytes).expect("write an older ring");
        let ledger = Ledger::path_beside(&path);
        fs::write(&ledger, b"old ledger").expect("write its ledger");
        let held = fs::File::open(&path).expect("hold the ring open");
        let report = collect(directory.path()).expect("collect");
        assert!(path.exists() && report.removed.is_empty(), "{report:?}");
        assert_eq!(report.skipped.len(), 1, "{report:?}");
        drop(held);
        let report = collect(directory.path()).expect("collect");
        assert_eq!(report.removed, [path.clone(), ledger], "{report:?}");
        assert!(!path.exists());
    }

    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_corrupt_ring_of_this_layout_is_left_for_a_person_to_look_at() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ring");
        let mut bytes = vec![0u8; 100];
        bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        fs::write(&path, &bytes).expect("write a truncated ring");
        let report = collect(directory.path()).expect("collect");
        assert!(path.exists());
        assert_eq!(report.skipped.len(), 1, "{report:?}");
    }

    #[test]
    fn reads_the_pid_of_temporary_names() {
        assert_eq!(temporary_owner(".3.ring.4242.tmp"), Some(4242));
        assert_eq!(temporary_owner("3.ring"), None);
        assert_eq!(temporary_owner(".x.tmp"), None);
    }
}
