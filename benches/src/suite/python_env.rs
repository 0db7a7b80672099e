//! The suite's own Python environment: a venv under the cache directory with the peers pinned in
//! `benches/python/requirements.txt`, made once by `python3 -m venv --system-site-packages` and `pip
//! install`, so that every peer runs on a machine that had none of them.
//!
//! The venv sees the system's site packages: an installed torch (a 5 GB wheel) and the `sluice`
//! package built from this tree are used as they are, and pip installs only what they do not satisfy.
//! The directory's name carries a hash of the requirements, so that changing a pin makes a new venv;
//! a `_SUCCESS` marker written after pip succeeded tells a complete venv from a partial one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::command::run_timed;
use crate::error::{BenchError, Result};

/// The pinned peers, embedded so that the `sluice-bench` binary prepares them from anywhere.
pub const REQUIREMENTS: &str = include_str!("../../python/requirements.txt");
/// The interpreter the venv is made from.
const BASE_PYTHON: &str = "python3";
/// How long creating the venv and installing the peers may take.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(1800);
const SUCCESS_MARKER: &str = "_SUCCESS";

/// The venv's directory in `cache_dir`.
pub fn directory_in(cache_dir: &Path) -> PathBuf {
    cache_dir.join(format!("python-{:016x}", fnv1a(REQUIREMENTS.as_bytes())))
}

/// Returns the venv's interpreter, making the venv first unless a complete one is there.
///
/// # Errors
///
/// Returns an error when `python3` cannot make a venv or pip cannot install the requirements.
pub fn prepare(cache_dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let directory = directory_in(cache_dir);
    let python = directory.join("bin").join("python");
    if directory.join(SUCCESS_MARKER).exists() {
        return Ok(python);
    }
    let setup = |operation: String| {
        move |source| BenchError::Setup {
            operation: operation.clone(),
            source,
        }
    };
    progress(&format!(
        "preparing the suite's Python environment in {} (once)",
        directory.display()
    ));
    if directory.exists() {
        std::fs::remove_dir_all(&directory).map_err(setup(format!(
            "removing the partial environment {}",
            directory.display()
        )))?;
    }
    let mut venv = Command::new(BASE_PYTHON);
    venv.args(["-m", "venv", "--system-site-packages"])
        .arg(&directory);
    run_timed(&mut venv, INSTALL_TIMEOUT)?;
    let requirements = directory.join("requirements.txt");
    std::fs::write(&requirements, REQUIREMENTS)
        .map_err(setup(format!("writing {}", requirements.display())))?;
    let mut install = Command::new(&python);
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements);
    run_timed(&mut install, INSTALL_TIMEOUT)?;
    let marker = directory.join(SUCCESS_MARKER);
    std::fs::write(&marker, b"").map_err(setup(format!("writing {}", marker.display())))?;
    Ok(python)
}

/// FNV-1a, 64 bits: a hash that stays the same from one build to the next.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_pin_names_another_venv() {
        assert_ne!(fnv1a(b"ray[data]==2.60.0"), fnv1a(b"ray[data]==2.59.0"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        let directory = directory_in(Path::new("/cache"));
        assert!(directory.starts_with("/cache"), "{}", directory.display());
    }

    #[test]
    fn every_peer_is_pinned() {
        for package in [
            "torchdata==",
            "spdl==",
            "spdl-core==",
            "mosaicml-streaming==",
            "ray[data]==",
            "numpy==",
            "pyarrow==",
        ] {
            assert!(REQUIREMENTS.contains(package), "{package} is not pinned");
        }
    }
}
