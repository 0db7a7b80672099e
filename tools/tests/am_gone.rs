//! An AM gone for good (`kill -9`, never started again) while a trainer reads: the node daemon
//! gives up on it after `--am-timeout-s`, and before it exits it fences its ring, so that the
//! trainer, once it has read what the ring held, ends with an error that says its last reads may be
//! delivered again, instead of waiting for rows that never come.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{AmProcess, generate, output_within, sluice, write_spec};

const ROWS: u64 = 20_000;
/// A bound on waits for events (a deadlock watchdog), not a time the test expects.
const WATCHDOG: Duration = Duration::from_secs(120);

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
    let mut daemon = sluice();
    daemon
        .args(["daemon", "--am", &am.address, "--node-id", "0"])
        .args(["--am-timeout-s", "3"])
        .arg("--ring-dir")
        .arg(&ring_dir)
        .env_remove("SLUICE_TOKEN");
    let daemon = std::thread::spawn(move || output_within(&mut daemon, WATCHDOG));
    let ids = directory.path().join("ids.bin");
    let mut trainer = common::torchrun_consume(&am.address, &ring_dir, &ids, (0, 1), (0, 1));
    trainer.args(["--max-rows-per-s", "2000"]);
    let trainer = std::thread::spawn(move || output_within(&mut trainer, WATCHDOG));
    let started = Instant::now();
    while ids_read(&ids) == 0 {
        assert!(started.elapsed() < WATCHDOG, "the trainer never read a row");
        std::thread::sleep(Duration::from_millis(20));
    }
    am.kill();

    let daemon = daemon.join().expect("the daemon's thread");
    let said = String::from_utf8_lossy(&daemon.stderr);
    assert!(
        !daemon.status.success(),
        "a daemon whose AM is gone fails: {said}"
    );
    assert!(said.contains("no answer from the AM"), "{said}");
    let trainer = trainer.join().expect("the trainer's thread");
    let said = String::from_utf8_lossy(&trainer.stderr);
    assert!(!trainer.status.success(), "the trainer is told: {said}");
    assert!(
        said.contains("and gave up: the AM may have declared the node lost")
            && said.contains("delivered again"),
        "{said}"
    );
}
