//! Every job spec under `examples/` is valid. The only test of its binary, so that setting the
//! variables the specs name cannot race another test's reads of the environment.

use std::path::PathBuf;

use sluice_am::spec::JobSpec;

#[test]
fn every_example_is_a_valid_job_spec() {
    // SAFETY: this is the binary's only test, so no other thread reads the environment.
    unsafe {
        std::env::set_var("S3_BUCKET", "bucket");
        std::env::set_var("SLUICE_DELTA", "/data/table");
        std::env::set_var("SLUICE_ICEBERG", "/data/warehouse/db/events");
        std::env::set_var("SLUICE_EXAMPLE_DATA", "/data/train");
        std::env::set_var("SLUICE_EXAMPLE_STATE", "/data/state");
    }
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).expect("examples/") {
        let path = entry.expect("entry").path();
        if path
            .extension()
            .is_some_and(|extension| extension == "yaml")
        {
            JobSpec::from_path(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} examples found");
}
