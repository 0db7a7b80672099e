//! A frozen AM (`SIGSTOP`: its port still accepts connections, nothing answers) is noticed within
//! the clients' deadlines and named, instead of hanging them.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{AmProcess, generate, sluice, write_spec};

/// `kill -SIG pid`.
fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn a_stopped_am_fails_a_status_call_in_time_naming_the_cause() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), 1000, 1, 500);
    let spec = write_spec(
        directory.path(),
        &format!(
            "name: frozen\ndata:\n  sources: [{{ uri: \"file://{}\", format: parquet }}]\nlauncher: {{ kind: external }}\nroles:\n  - {{ name: worker, num: 1 }}\n",
            data.display()
        ),
    );
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    signal("STOP", am.pid());
    let started = Instant::now();
    let output = sluice()
        .args(["status", "--am", &am.address])
        .env_remove("SLUICE_TOKEN")
        .output()
        .expect("run sluice status");
    let waited = started.elapsed();
    signal("CONT", am.pid());
    assert!(!output.status.success(), "a frozen AM answers nothing");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no answer in time") || stderr.contains("timed out"),
        "{stderr}"
    );
    // Bounded by the connection's and the call's deadlines (10 s and 20 s), not by the kernel.
    assert!(waited < Duration::from_secs(60), "took {waited:?}");
}
