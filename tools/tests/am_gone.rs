//! An AM gone for good (`kill -9`, never started again) while a trainer reads: the node daemon
//! gives up on it after `--am-timeout-s`, and before it exits it fences its ring, so that the
//! trainer, once it has read what the ring held, ends with an error that says its last reads may be
//! delivered again, instead of waiting for rows that never come.

mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{AmProcess, generate, sluice, write_spec};

const ROWS: u64 = 20_000;
/// A bound on waits for events (a deadlock watchdog), not a time the test expects.
const WATCHDOG: Duration = Duration::from_secs(120);

/// Waits for `child` to exit, failing after the watchdog; returns whether it succeeded, and what
/// it wrote to `log`.
fn exit_of(child: &mut Child, what: &str, log: &Path) -> (bool, String) {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            return (status.success(), said);
        }
        if started.elapsed() > WATCHDOG {
            let _ = child.kill();
            panic!("{what} did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ids_read(ids: &Path) -> u64 {
    std::fs::metadata(ids).map_or(0, |file| file.len() / 8)
}

#[test]
fn a_daemon_that_gives_up_on_its_am_tells_its_trainer_that_its_last_reads_may_be_void() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), ROWS, 2, 1000);
    let spec = write_spec(
        directory.path(),
        &format!(
            "name: orphaned\n\
             data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 1000\n  batch_size: 250\n\
             nodes: 1\n\
             launcher: {{ kind: external }}\n\
             roles:\n  - {{ name: worker, num: 1 }}\n\
             failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 3000 }}\n",
            data.display()
        ),
    );
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let ring_dir = directory.path().join("shm");
    let daemon_log = directory.path().join("daemon.log");
    let trainer_log = directory.path().join("trainer.log");
    let mut daemon = sluice()
        .args(["daemon", "--am", &am.address, "--node-id", "0"])
        .args(["--am-timeout-s", "3"])
        .arg("--ring-dir")
        .arg(&ring_dir)
        .env_remove("SLUICE_TOKEN")
        .stdout(Stdio::null())
        .stderr(File::create(&daemon_log).expect("the daemon's log"))
        .spawn()
        .expect("spawn sluice daemon");
    let ids = directory.path().join("ids.bin");
    let mut trainer = common::torchrun_consume(&am.address, &ring_dir, &ids, (0, 1), (0, 1))
        .args(["--max-rows-per-s", "2000"])
        .stdout(Stdio::null())
        .stderr(File::create(&trainer_log).expect("the trainer's log"))
        .spawn()
        .expect("spawn sluice consume");
    let started = Instant::now();
    while ids_read(&ids) == 0 {
        assert!(started.elapsed() < WATCHDOG, "the trainer never read a row");
        std::thread::sleep(Duration::from_millis(20));
    }
    am.kill();

    let (succeeded, said) = exit_of(&mut daemon, "the daemon", &daemon_log);
    assert!(!succeeded, "a daemon whose AM is gone fails: {said}");
    assert!(said.contains("no answer from the AM"), "{said}");
    let (succeeded, said) = exit_of(&mut trainer, "the trainer", &trainer_log);
    assert!(!succeeded, "the trainer is told: {said}");
    assert!(
        said.contains("and gave up: the AM may have declared the node lost")
            && said.contains("delivered again"),
        "{said}"
    );
}
