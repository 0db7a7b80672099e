//! Ctrl-C (SIGINT) or SIGTERM on `sluice run` stops the job: its daemons and trainers end, its
//! rings are removed, and nothing of it is left in the ring directory or the process table within
//! a few seconds.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::job::read_ids;

/// The processes whose command line names `needle`, but this test's own.
fn processes_naming(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|byte| byte.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let command = String::from_utf8_lossy(&raw).replace('\0', " ");
        if command.contains(needle) {
            found.push(format!("{pid}: {command}"));
        }
    }
    found
}

fn start(root: &Path, spec: &Path) -> Child {
    sluice()
        .arg("run")
        .arg(spec)
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--ring-dir")
        .arg(root.join("rings"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run")
}

#[test]
fn a_signal_on_sluice_run_stops_the_job_and_leaves_nothing_behind() {
    for signal in ["INT", "TERM"] {
        let directory = tempfile::tempdir().expect("tempdir");
        let root = directory.path();
        let data = common::generate(root, 200_000, 4, 1000);
        let spec = common::write_spec(
            root,
            &format!(
                r#"
name: interrupted
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: 2000
nodes: 2
roles:
  - {{ name: worker, num: 2, command: [sluice, consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "2000"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 10000 }}
"#,
                data = data.display(),
                root = root.display(),
            ),
        );
        let mut run = start(root, &spec);
        let started = Instant::now();
        while read_ids(&root.join("ids-0.bin")).is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the trainers read nothing within 60 s"
            );
            assert!(
                run.try_wait().expect("try_wait").is_none(),
                "sluice run ended early"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let rings = root.join("rings/interrupted");
        assert!(rings.is_dir(), "the job's rings exist while it runs");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &run.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let signalled = Instant::now();
        let output = loop {
            if run.try_wait().expect("try_wait").is_some() {
                break run.wait_with_output().expect("output");
            }
            if signalled.elapsed() > Duration::from_secs(20) {
                let _ = run.kill();
                panic!("sluice run did not end within 20 s of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let ended_in = signalled.elapsed();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("SIG{signal}: stopping the job")),
            "{stderr}"
        );
        assert!(
            stdout.contains("job interrupted stopped"),
            "{stdout}{stderr}"
        );
        let left = processes_naming(&root.display().to_string());
        assert!(left.is_empty(), "processes of the job left: {left:?}");
        assert!(
            !rings.exists(),
            "the job's rings are removed: {:?}",
            std::fs::read_dir(&rings).map(|entries| entries.count())
        );
        assert!(
            ended_in < Duration::from_secs(10),
            "SIG{signal}: ended in {ended_in:?}"
        );
        let read: usize = (0..2)
            .map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))).len())
            .sum();
        assert!(
            read < 200_000,
            "the job stopped before its end ({read} rows)"
        );
    }
}
