//! Hang detection on the real path: `sluice run` with a node daemon and two reference trainers, one
//! of which, or the daemon, is stopped with SIGSTOP mid-run. A trainer's daemon sees it hold its
//! ring unread; a daemon stopped stops calling the AM. Once that passes the spec's `failover.hang`
//! bound, the AM acts by the spec's action: it says so in `sluice status` (warn), kills what hangs
//! so that the failover rules start it again (restart), or fails the job (fail). Every row is
//! delivered exactly once where the job succeeds.

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::job::{processes_naming, read_ids};

const ROWS: i64 = 100_000;
/// How long a run may take (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(120);

/// A `sluice run` of the test's job, killed when dropped.
struct Run {
    child: RefCell<Child>,
    root: PathBuf,
    address: String,
}

impl Drop for Run {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Run {
    /// Starts the job under `root`, its hangs handled by `action`, its daemon lost after
    /// `heartbeat_timeout_ms` of silence.
    fn start(root: &Path, action: &str, heartbeat_timeout_ms: u64) -> Run {
        let data = common::generate(root, ROWS as u64, 4, 5_000);
        let spec = common::write_spec(
            root,
            &format!(
                r#"
name: hang-{action}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: 5000
  batch_size: 500
nodes: 1
roles:
  - {{ name: worker, num: 2, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "10000"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: {heartbeat_timeout_ms}, hang: {{ after_s: 1, factor: 5, action: {action} }} }}
"#,
                data = data.display(),
                sluice = env!("CARGO_BIN_EXE_sluice"),
                root = root.display(),
            ),
        );
        let address = common::free_address();
        let output = std::fs::File::create(root.join("run.out")).expect("output file");
        let child = sluice()
            .arg("run")
            .arg(&spec)
            .args(["--listen", &address])
            .arg("--ring-dir")
            .arg(root.join("rings"))
            .args(["--ring-size", &(256 << 10).to_string()])
            .arg("--state-dir")
            .arg(root.join("state"))
            .env("NO_COLOR", "1")
            .stdout(output.try_clone().expect("output file"))
            .stderr(output)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sluice run");
        Run {
            child: RefCell::new(child),
            root: root.to_path_buf(),
            address,
        }
    }

    /// What the run printed, with the executors' logs.
    fn output(&self) -> String {
        format!(
            "{}\n{}",
            std::fs::read_to_string(self.root.join("run.out")).unwrap_or_default(),
            sluice_testkit::job::logs(&self.root.join("state"))
        )
    }

    /// Waits until `ready` holds, failing with the run's output after the watchdog or once the
    /// run has ended.
    fn wait_for(&self, what: &str, mut ready: impl FnMut() -> bool) {
        let started = Instant::now();
        while !ready() {
            let ended = self.child.borrow_mut().try_wait().expect("try_wait");
            assert!(
                ended.is_none(),
                "{what}: the run ended first ({ended:?})\n{}",
                self.output()
            );
            assert!(
                started.elapsed() < WATCHDOG,
                "{what}: not within {WATCHDOG:?}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The ids trainer `rank` read so far.
    fn ids(&self, rank: u32) -> Vec<i64> {
        read_ids(&self.root.join(format!("ids-{rank}.bin")))
    }

    /// Stops trainer 1 with SIGSTOP once it has read, and returns its pid.
    fn stop_trainer_one(&self) -> u32 {
        self.wait_for("trainer 1 reads", || self.ids(1).len() >= 1_000);
        let pids = processes_naming(&self.root.join("ids-1.bin"), Some("consume"));
        assert_eq!(pids.len(), 1, "one trainer 1: {pids:?}\n{}", self.output());
        signal(pids[0], "-STOP");
        pids[0]
    }

    /// Stops the daemon with SIGSTOP once trainer 1 has read, and returns its pid.
    fn stop_daemon(&self) -> u32 {
        self.wait_for("trainer 1 reads", || self.ids(1).len() >= 1_000);
        let pids = processes_naming(&self.root.join("rings"), Some("daemon"));
        assert_eq!(pids.len(), 1, "one daemon: {pids:?}\n{}", self.output());
        signal(pids[0], "-STOP");
        pids[0]
    }

    /// The job's hangs in `sluice status`, while the AM serves.
    fn hangs(&self) -> Vec<serde_json::Value> {
        let output = sluice()
            .args(["status", "--json", "--am", &self.address])
            .output()
            .expect("run sluice status");
        if !output.status.success() {
            return Vec::new();
        }
        let status: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("status JSON");
        status["hangs"].as_array().cloned().unwrap_or_default()
    }

    /// Waits for the run to end; returns whether it succeeded.
    fn finish(&mut self) -> bool {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.get_mut().try_wait().expect("try_wait") {
                return status.success();
            }
            assert!(
                started.elapsed() < WATCHDOG,
                "the run did not end within {WATCHDOG:?}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every row was delivered once, over both trainers.
    fn assert_every_row_once(&self) {
        let mut ids: Vec<i64> = self.ids(0).into_iter().chain(self.ids(1)).collect();
        let delivered = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), delivered, "a row was delivered twice");
        assert_eq!(ids, (0..ROWS).collect::<Vec<_>>(), "every row delivered");
    }
}

fn signal(pid: u32, which: &str) {
    let sent = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill {which} {pid}");
}

#[test]
fn a_stopped_trainer_is_shown_as_hung_and_reads_on_once_continued() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "warn", 1_000);
    let pid = run.stop_trainer_one();
    let mut hangs = Vec::new();
    run.wait_for("the AM shows the hang", || {
        hangs = run.hangs();
        !hangs.is_empty()
    });
    assert_eq!(hangs.len(), 1, "{hangs:?}");
    assert_eq!(hangs[0]["rank"], 1, "{hangs:?}");
    assert_eq!(hangs[0]["action"], "warn", "{hangs:?}");
    let stuck = hangs[0]["stuck_ms"].as_u64().expect("stuck_ms");
    let bound = hangs[0]["bound_ms"].as_u64().expect("bound_ms");
    assert!(bound >= 1_000 && stuck >= bound, "{hangs:?}");
    let text = sluice()
        .args(["status", "--am", &run.address])
        .output()
        .expect("run sluice status");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("hangs: the trainer of ring 1 on node 0 has not read"),
        "{text}"
    );

    signal(pid, "-CONT");
    run.wait_for("the hang clears once the trainer reads again", || {
        run.hangs().is_empty()
    });
    assert!(run.finish(), "the job succeeds\n{}", run.output());
    run.assert_every_row_once();
}

#[test]
fn a_stopped_trainer_is_killed_and_started_again_under_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "restart", 1_000);
    run.stop_trainer_one();
    assert!(run.finish(), "the job succeeds\n{}", run.output());
    let output = run.output();
    assert!(
        output.contains("it hangs: killing it, to be started again executor=trainer-worker-1"),
        "the AM killed the hung trainer\n{output}"
    );
    run.assert_every_row_once();
}

#[test]
fn a_stopped_trainer_fails_the_job_under_fail() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "fail", 1_000);
    run.stop_trainer_one();
    assert!(!run.finish(), "the job fails\n{}", run.output());
    let output = run.output();
    assert!(
        output.contains("the trainer of ring 1 on node 0 has not read")
            && output.contains("failover.hang"),
        "the failure names the hung trainer and the setting\n{output}"
    );
}

#[test]
fn a_stopped_daemon_is_shown_as_hung_and_serves_on_once_continued() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "warn", 60_000);
    let pid = run.stop_daemon();
    let mut hangs = Vec::new();
    run.wait_for("the AM shows the daemon's hang", || {
        hangs = run.hangs();
        hangs.iter().any(|hang| hang["kind"] == "daemon")
    });
    let hang = hangs
        .iter()
        .find(|hang| hang["kind"] == "daemon")
        .expect("the daemon's hang");
    assert_eq!(hang["node_id"], 0, "{hangs:?}");
    assert_eq!(hang["action"], "warn", "{hangs:?}");
    signal(pid, "-CONT");
    assert!(run.finish(), "the job succeeds\n{}", run.output());
    run.assert_every_row_once();
}

#[test]
fn a_stopped_daemon_is_killed_and_started_again_under_restart() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "restart", 60_000);
    run.stop_daemon();
    assert!(run.finish(), "the job succeeds\n{}", run.output());
    let output = run.output();
    assert!(
        output.contains("it hangs: killing it, to be started again executor=daemon-0"),
        "the AM killed the hung daemon\n{output}"
    );
    run.assert_every_row_once();
}

#[test]
fn a_stopped_daemon_fails_the_job_under_fail() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut run = Run::start(root.path(), "fail", 60_000);
    let pid = run.stop_daemon();
    assert!(!run.finish(), "the job fails\n{}", run.output());
    // The run may have killed the stopped daemon as it ended; if not, it is let go on to its end.
    let _ = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
    let output = run.output();
    assert!(
        output.contains("the daemon of node 0 has not called the AM")
            && output.contains("failover.hang"),
        "the failure names the hung daemon and the setting\n{output}"
    );
}
