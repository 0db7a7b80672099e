//! Parquet files whose footers lie, through the real `sluice` binary: `sluice plan` and `sluice read`
//! under an address-space limit (so that an allocation sized by a lie aborts rather than swaps)
//! exit non-zero naming the file and the field, and a job under `data.on_bad_data: skip` leaves
//! them out, counts them and delivers every row of the honest file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{output_within, sluice};
use sluice_testkit::lying::{
    Step, claim_rows, column_field, column_path, honest_parquet, set_footer_i64,
};

/// The address space each `sluice plan` and `sluice read` gets: far less than any allocation sized
/// by one of the lies (2^45 bytes, or a bit per row of 2^62 rows), more than the command needs.
const ADDRESS_SPACE: &str = "--as=4294967296";

/// How long one command may take (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(120);

/// `sluice ARGS` under the address-space limit.
fn limited(args: &[&str]) -> Output {
    sluice_testkit::require_program("prlimit", "install util-linux");
    output_within(
        Command::new("prlimit")
            .arg(ADDRESS_SPACE)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .env("NO_COLOR", "1"),
        WATCHDOG,
    )
}

/// The three lying files of the tests, each made from an honest file of 1,000 rows in row groups
/// of 250, under `directory`: the file and the field its error names.
fn liars(directory: &Path) -> Vec<(PathBuf, &'static str)> {
    let huge = directory.join("huge-rows.parquet");
    honest_parquet(&huge, 1000, 250);
    claim_rows(&huge, 0, 1 << 62, None);
    let negative = directory.join("negative-rows.parquet");
    honest_parquet(&negative, 1000, 250);
    set_footer_i64(&negative, &[(vec![Step::Field(3)], -5)]);
    let wide = directory.join("wide-chunk.parquet");
    honest_parquet(&wide, 1000, 250);
    set_footer_i64(
        &wide,
        &[(
            column_path(1, 0, column_field::TOTAL_COMPRESSED_SIZE),
            1 << 45,
        )],
    );
    let long = directory.join("long-group.parquet");
    honest_parquet(&long, 1000, 250);
    claim_rows(&long, 1, 1 << 31, None);
    vec![
        (huge, "row_groups[0].num_rows is 4611686018427387904"),
        (negative, "footer field num_rows is -5"),
        (
            wide,
            "row_groups[1].columns[0].meta_data.total_compressed_size is 35184372088832",
        ),
        (long, "row_groups[1].num_rows is 2147483648"),
    ]
}

#[test]
fn plan_and_read_of_a_lying_footer_exit_non_zero_naming_the_file_and_the_field() {
    let directory = tempfile::tempdir().expect("tempdir");
    for (path, field) in liars(directory.path()) {
        let file = path.to_string_lossy().into_owned();
        for args in [
            vec!["plan", file.as_str(), "--task-rows", "1000"],
            vec!["read", file.as_str()],
        ] {
            let output = limited(&args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success(),
                "sluice {args:?} fails: {stderr}{}",
                String::from_utf8_lossy(&output.stdout)
            );
            assert_eq!(
                output.status.code(),
                Some(1),
                "sluice {args:?} exits with an error, not a signal or an abort: {stderr}"
            );
            assert!(
                stderr.contains(&file)
                    && stderr.contains(field)
                    && stderr.contains("write it again"),
                "sluice {args:?} names the file, the field and the fix: {stderr}"
            );
            assert!(output.stdout.is_empty(), "sluice {args:?} prints no rows");
        }
    }
}

/// A job over an honest file and the four lying ones: under `on_bad_data: skip` it succeeds,
/// names each lying file as left out and delivers every row of the honest file once; under the
/// default policy it does not start, naming the first lying file.
#[test]
fn a_job_leaves_lying_files_out_and_counts_them_or_refuses_to_start() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = root.join("data");
    std::fs::create_dir(&data).expect("data directory");
    let liars = liars(&data);
    honest_parquet(&data.join("a-honest.parquet"), 1000, 250);
    let spec_with = |name: &str, policy: &str| {
        common::write_spec(
            root,
            &format!(
                r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet }}]
  task_rows: 300
  batch_size: 100
{policy}
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume, --ids-out, "{root}/ids-{name}.bin"] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 10000 }}
"#,
                data = data.display(),
                sluice = env!("CARGO_BIN_EXE_sluice"),
                root = root.display(),
            ),
        )
    };
    let run = |spec: &Path, state: &str| {
        output_within(
            sluice()
                .arg("run")
                .arg(spec)
                .arg("--ring-dir")
                .arg(root.join("rings"))
                .arg("--state-dir")
                .arg(root.join(state))
                .env("NO_COLOR", "1"),
            WATCHDOG,
        )
    };
    let skipping = spec_with("lying-skip", "  on_bad_data: skip\n  max_bad_fraction: 0.9");
    let output = run(&skipping, "state-skip");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "bad data: 0 rows skipped in {} skips",
            liars.len()
        )),
        "the summary counts each lying file: {stdout}"
    );
    for (path, field) in &liars {
        assert!(
            stdout.contains(&format!("{}: 0 rows: parquet file", path.display()))
                && stdout.contains(field),
            "the summary names {} and {field}: {stdout}",
            path.display()
        );
    }
    let mut ids = sluice_testkit::job::read_ids(&root.join("ids-lying-skip.bin"));
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..1000).collect::<Vec<i64>>(),
        "every honest row once"
    );

    let failing = spec_with("lying-fail", "");
    let output = run(&failing, "state-fail");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "the job does not start: {text}");
    let (first, field) = liars
        .iter()
        .min_by_key(|(path, _)| path.clone())
        .expect("liars");
    assert!(
        text.contains(&first.display().to_string()) && text.contains(field),
        "the error names the first lying file and its field: {text}"
    );
}
