//! An AM whose journal was taken over steps down: two `sluice am` on one checkpoint location, the
//! second fencing the first. The first refuses the change it can no longer record (a daemon's call
//! gets `unavailable`, so it looks for the AM that took over), and every change after it, and exits
//! non-zero naming the fence, while the second serves the job.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::AmProcess;

#[test]
fn an_am_fenced_by_a_newer_one_refuses_changes_and_exits_naming_the_fence() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let data = common::generate(root, 1_000, 2, 100);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: step-down
data:
  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{}" }}
"#,
            data.display(),
            root.join("journal").display()
        ),
    );
    let first_address = common::free_address();
    let first_err = root.join("first.err");
    let mut first = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("am")
        .arg(&spec)
        .args(["--listen", &first_address])
        .env_remove("SLUICE_TOKEN")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&first_err).expect("a log"))
        .spawn()
        .expect("spawn the first sluice am");
    common::register_node(&first_address, "step-down").expect("the first AM serves");

    let second = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let refused =
        common::register_node(&first_address, "step-down").expect_err("the first AM was fenced");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("fenced by a newer writer"),
        "{refused:?}"
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = first.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the fenced AM did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&first_err).expect("the first AM's log");
    assert!(!status.success(), "the fenced AM exits non-zero: {stderr}");
    assert!(
        stderr.contains("this AM steps down") && stderr.contains("fenced by a newer writer"),
        "{stderr}"
    );
    common::register_node(&second.address, "step-down").expect("the second AM serves the job");
}
