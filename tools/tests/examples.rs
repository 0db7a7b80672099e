//! The examples of `examples/` that need data run on generated data: the S3 one against a real S3
//! server, the Delta one on a generated table.

mod common;

use std::path::PathBuf;

use common::sluice;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn the_s3_example_reads_a_dataset_from_a_local_s3_server() {
    let server = sluice_testkit::start_seaweed();
    let options = sluice_testkit::s3_options();
    common::runtime().block_on(sluice_testkit::wait_for_bucket(&server, &options));
    let endpoint = std::net::SocketAddr::from(([127, 0, 0, 1], sluice_testkit::S3_PORT));
    let mut environment = sluice_testkit::s3_environment(endpoint).to_vec();
    environment.push(("S3_BUCKET", sluice_testkit::BUCKET.to_owned()));
    let rows = 30_000;
    let generated = sluice()
        .args([
            "gen",
            "--out",
            &format!("s3://{}/train", sluice_testkit::BUCKET),
        ])
        .args(["--rows", &rows.to_string(), "--files", "3"])
        .envs(environment.iter().map(|(key, value)| (key, value)))
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "sluice gen to S3 failed: {}\n{}",
        String::from_utf8_lossy(&generated.stderr),
        server.log()
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let output = sluice()
        .arg("run")
        .arg(examples().join("s3.yaml"))
        .arg("--ring-dir")
        .arg(directory.path().join("rings"))
        .arg("--state-dir")
        .arg(directory.path().join("state"))
        .envs(environment.iter().map(|(key, value)| (key, value)))
        .output()
        .expect("sluice run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!("sluice run: {rows} rows consumed")),
        "{stdout}"
    );
    assert!(stdout.contains("job s3-train succeeded"), "{stdout}");
}

#[test]
fn the_delta_example_reads_the_pinned_version_of_a_generated_table() {
    let directory = tempfile::tempdir().expect("tempdir");
    let table = directory.path().join("table");
    let generated = sluice()
        .args([
            "gen", "--format", "delta", "--rows", "20000", "--files", "2", "--out",
        ])
        .arg(&table)
        .output()
        .expect("sluice gen");
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let counted = sluice()
        .arg("read")
        .arg(&table)
        .args(["--version", "0", "--filter", "label = 1", "--stats"])
        .output()
        .expect("sluice read --stats");
    let stats: serde_json::Value = serde_json::from_slice(&counted.stdout).expect("stats JSON");
    let rows = stats["rows"].as_u64().expect("rows");
    assert!(
        rows > 0 && rows < 20_000,
        "label = 1 keeps some rows: {stats}"
    );
    let output = sluice()
        .arg("run")
        .arg(examples().join("delta.yaml"))
        .arg("--ring-dir")
        .arg(directory.path().join("rings"))
        .arg("--state-dir")
        .arg(directory.path().join("state"))
        .env("SLUICE_DELTA", &table)
        .output()
        .expect("sluice run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each trainer ends its log with the JSON of `sluice consume`.
    let delivered: u64 = (0..4)
        .map(|rank| {
            let lines = trainer_lines(
                &directory.path().join("state"),
                &format!("trainer-worker-{rank}"),
            );
            lines
                .last()
                .and_then(|last| last["rows"].as_u64())
                .unwrap_or_else(|| panic!("rank {rank}: no rows in {lines:?}"))
        })
        .sum();
    assert_eq!(delivered, rows, "{stdout}");
}

/// The JSON lines a trainer printed to its log under `state`.
fn trainer_lines(state: &std::path::Path, executor: &str) -> Vec<serde_json::Value> {
    let log = state.join(format!("{executor}.log"));
    std::fs::read_to_string(&log)
        .unwrap_or_else(|error| panic!("{}: {error}", log.display()))
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

#[test]
fn the_torch_example_trains_checkpoints_and_resumes_exactly_after_its_checkpoint() {
    sluice_testkit::require_python_modules("torch, sluice");
    let directory = tempfile::tempdir().expect("tempdir");
    let data = common::generate(directory.path(), 20_000, 2, 4000);
    let run = |logs: &str, state: &std::path::Path, resume: Option<&str>| {
        let mut command = sluice();
        command
            .current_dir(examples().join(".."))
            .arg("run")
            .arg("examples/torch.yaml")
            .arg("--ring-dir")
            .arg(directory.path().join("rings"))
            .arg("--state-dir")
            .arg(directory.path().join(logs))
            .env("SLUICE_EXAMPLE_DATA", &data)
            .env("SLUICE_EXAMPLE_STATE", state);
        if let Some(token) = resume {
            command.args(["--resume-from", token]);
        }
        let output = command.output().expect("sluice run");
        assert!(
            output.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        trainer_lines(&directory.path().join(logs), "trainer-trainer-0")
    };
    let first_state = directory.path().join("first-state");
    let first = run("first", &first_state, None);
    let last = first.last().expect("the trainer's summary");
    assert_eq!(last["rows"], 20_000, "{first:?}");
    assert!(
        last["loss"].as_f64().is_some_and(f64::is_finite),
        "{first:?}"
    );
    let saved = first
        .iter()
        .find(|line| line["checkpoint_step"] == 20)
        .unwrap_or_else(|| panic!("no checkpoint at step 20: {first:?}"));
    let token = saved["token"].as_str().expect("token");
    let rows_before = saved["rows"].as_u64().expect("rows");
    assert!(
        first_state.join("model.pt").is_file(),
        "the model was saved"
    );
    // A new job whose state holds only that data checkpoint, and a fresh model: it is given exactly
    // the rows after step 20.
    let second_state = directory.path().join("second-state");
    let checkpoints = std::path::Path::new("am/data-checkpoints");
    std::fs::create_dir_all(second_state.join(checkpoints)).expect("checkpoint directory");
    let file = format!("{token}.json");
    std::fs::copy(
        first_state.join(checkpoints).join(&file),
        second_state.join(checkpoints).join(&file),
    )
    .expect("copy the data checkpoint");
    let second = run("second", &second_state, Some(token));
    let last = second.last().expect("the trainer's summary");
    assert_eq!(last["rows"], 20_000 - rows_before, "{second:?}");
}
