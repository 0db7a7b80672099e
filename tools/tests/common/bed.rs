//! Pieces shared by the tests on the multi-host test bed: processes on hosts killed on drop, waits
//! with a deadlock watchdog, and logs gathered in one directory.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::Host;

/// A process on a host, killed and reaped when dropped.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` to exit, failing after `limit` with every log under `logs`; returns whether it
/// succeeded.
pub fn finish(child: &mut Child, what: &str, limit: Duration, logs: &Path) -> bool {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.success();
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "{what} did not finish within {limit:?} (deadlock watchdog)\n{}",
                every_log(logs)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every log under `logs`, whole.
pub fn every_log(logs: &Path) -> String {
    let mut entries: Vec<_> = std::fs::read_dir(logs)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).unwrap_or_default();
            format!(
                "--- {}\n{}",
                path.display(),
                String::from_utf8_lossy(&bytes)
            )
        })
        .collect()
}

/// The log file `name` under `logs`, for a process's output.
pub fn log(logs: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(logs.join(name)).expect("a log file")
}

/// `sluice daemon` of node `node` on `host` (without `--node-id` when `None`: the node of the
/// host's name), reaching the AM at `am`, with `extra` arguments and `envs`, logging at info level
/// into `daemon-<host>.log` and `.err` under `logs`.
pub fn daemon_on(
    host: &Host,
    am: &str,
    node: Option<usize>,
    extra: &[std::ffi::OsString],
    envs: &[(&str, &str)],
    logs: &Path,
) -> Running {
    Running(
        host.command(env!("CARGO_BIN_EXE_sluice"))
            .args(["daemon", "--am", am])
            .args(node.map(|node| format!("--node-id={node}")))
            .args(extra)
            .envs(envs.iter().copied())
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(log(logs, &format!("daemon-{}.log", host.name())))
            .stderr(log(logs, &format!("daemon-{}.err", host.name())))
            .spawn()
            .expect("spawn sluice daemon"),
    )
}

/// Waits until `ready` holds, failing with every log under `logs` after `limit`.
pub fn wait_for(what: &str, limit: Duration, logs: &Path, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?}\n{}",
            every_log(logs)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `sluice consume` trainer of job `job` on `host`, global rank `rank` of `world_size`, the only
/// one of its host, reading at most `rows_per_s` and writing its ids to `<shared>/ids-<host>.bin`.
/// It was launched by someone else: its rank and job come from the environment.
pub fn consume_on(
    host: &Host,
    job: &str,
    (rank, world_size): (u32, u32),
    rows_per_s: u32,
    shared: &Path,
    logs: &Path,
) -> Running {
    Running(
        host.command(env!("CARGO_BIN_EXE_sluice"))
            .arg("consume")
            .arg("--ids-out")
            .arg(shared.join(format!("ids-{}.bin", host.name())))
            .args(["--max-rows-per-s", &rows_per_s.to_string()])
            .env("SLUICE_RANK", rank.to_string())
            .env("SLUICE_WORLD_SIZE", world_size.to_string())
            .env("SLUICE_LOCAL_RANK", "0")
            .env("SLUICE_LOCAL_WORLD_SIZE", "1")
            .env("SLUICE_JOB", job)
            .env_remove("SLUICE_RING")
            .env_remove("SLUICE_RING_DIR")
            .stdin(Stdio::null())
            .stdout(log(logs, &format!("trainer-{}.log", host.name())))
            .stderr(log(logs, &format!("trainer-{}.err", host.name())))
            .spawn()
            .expect("spawn sluice consume"),
    )
}
