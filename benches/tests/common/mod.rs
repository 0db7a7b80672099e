//! What the tests of `sluice-bench` share: the `sluice` binary it runs.

use std::path::PathBuf;

/// The `sluice` binary beside `sluice-bench` in the target directory, which the benchmarks run.
/// `cargo test --workspace` builds it before any test runs; a test run of this crate alone needs it
/// built first, and fails here, saying so, when it is not.
pub fn sluice() -> PathBuf {
    let sluice = std::path::Path::new(env!("CARGO_BIN_EXE_sluice-bench")).with_file_name("sluice");
    assert!(
        sluice.is_file(),
        "no sluice binary at {}: sluice-bench runs the sluice beside it; build it first with \
         `cargo build -p sluice-cli` (or run `cargo test --workspace`)",
        sluice.display()
    );
    sluice
}
