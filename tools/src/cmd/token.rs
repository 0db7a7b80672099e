//! The token `sluice run` makes for a job when none is given, and where the user's own commands
//! find it.
//!
//! The token is 32 random bytes, hex-encoded, made once per job and kept in the job's state
//! directory (`token`, mode 0600), so that an AM started again for the job (taking it over from its
//! journal) has the token its running executors hold. `sluice run` hands it to every executor it
//! launches (`SLUICE_TOKEN`) and writes it, while the AM serves, to a file of the user's own: under
//! `$XDG_RUNTIME_DIR/sluice/tokens/`, or `~/.cache/sluice/tokens/`, named after the AM's address
//! (a directory of mode 0700, a file of mode 0600 created anew, never through a link). `sluice
//! status`, `stop`, `scale` and `consume` given no token read it there for the address they call.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use anyhow::Context;

/// A fresh token: 32 bytes from the kernel's random source, hex-encoded.
pub fn generate() -> anyhow::Result<String> {
    sluice_am::service::new_token().context("reading /dev/urandom for the job's token")
}

/// The token of the job whose state directory is `state_dir`: the one an earlier AM of the job
/// made, or a new one, kept there.
pub fn for_job(state_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = state_dir.join("token");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    }
    let token = generate()?;
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    write_private(&path, &token)?;
    Ok(token)
}

/// Writes `token` to a new file at `path` that only its user reads, never through a link; a file
/// already there is replaced.
fn write_private(path: &std::path::Path, token: &str) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("removing {}", path.display())),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{token}").with_context(|| format!("writing {}", path.display()))
}

/// The directory of the user's token files.
fn directory() -> Option<PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|dir| !dir.is_empty()) {
        Some(runtime) => Some(PathBuf::from(runtime).join("sluice/tokens")),
        None => std::env::var_os("HOME")
            .filter(|home| !home.is_empty())
            .map(|home| PathBuf::from(home).join(".cache/sluice/tokens")),
    }
}

/// The file of the AM at `address` (`host:port`, with or without a scheme).
fn file_of(address: &str) -> Option<PathBuf> {
    let bare = address
        .split_once("://")
        .map_or(address, |(_, rest)| rest)
        .trim_end_matches('/');
    let name: String = bare
        .chars()
        .map(|character| {
            if character.is_ascii_alphanumeric() || character == '.' || character == '-' {
                character
            } else {
                '_'
            }
        })
        .collect();
    Some(directory()?.join(name))
}

/// The token file of a serving AM, removed when dropped.
#[derive(Debug)]
pub struct Published {
    path: PathBuf,
}

impl Published {
    /// Writes `token` for the AM at `address`.
    pub fn write(address: &str, token: &str) -> anyhow::Result<Published> {
        let path = file_of(address)
            .context("neither XDG_RUNTIME_DIR nor HOME is set: pass --token to sluice run")?;
        let parent = path.parent().expect("a token file has a directory");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        // A file left by an AM killed on the same address is replaced.
        write_private(&path, token)?;
        Ok(Published { path })
    }

    /// Where the token is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Published {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("removing {}: {error}", self.path.display());
        }
    }
}

/// The token `sluice run` published for the AM at `address`, if any.
pub fn lookup(address: &str) -> Option<String> {
    let text = std::fs::read_to_string(file_of(address)?).ok()?;
    Some(text.trim().to_owned()).filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_hex_and_unlike() {
        let first = generate().expect("token");
        let second = generate().expect("token");
        assert_eq!(first.len(), 64);
        assert!(first.chars().all(|character| character.is_ascii_hexdigit()));
        assert_ne!(first, second);
    }

    #[test]
    fn an_address_names_one_file_with_or_without_its_scheme() {
        assert_eq!(file_of("127.0.0.1:7070"), file_of("http://127.0.0.1:7070/"));
        assert_ne!(file_of("127.0.0.1:7070"), file_of("127.0.0.1:7071"));
        let name = file_of("https://[::1]:7070").expect("a file");
        let name = name.file_name().expect("a name").to_string_lossy();
        assert!(!name.contains('/') && !name.contains(':'), "{name}");
    }
}
