//! `sluice submit` as a process: the job runs in the background, `sluice status --json` follows it,
//! `sluice scale` changes its number of trainers while it runs, and `sluice stop` ends it.
//!
//! A scale stops every trainer (SIGTERM: `sluice consume` releases the batch it holds and ends), the
//! daemons give their rings back with each task's final consumed count, and the trainers start
//! again over the new ranks. A trainer of a rank that runs again appends to the same ids file, and
//! each file holds only released batches, so every id must appear exactly once across the files.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::job::read_ids;

/// The whole of a test's job must end within this (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(240);

/// The ring size the jobs are submitted with, smaller than the default.
const RING_SIZE: u64 = 8 << 20;

/// A job started with `sluice submit`, its state and executors under `root`, its rings in a
/// directory of its own.
struct Submitted {
    name: String,
    root: PathBuf,
    address: String,
}

impl Submitted {
    /// Submits the job of `spec` named `name`, with `--state-dir` under `root`, `--ring-dir` and
    /// `--ring-size`, which `sluice submit` passes on to the job.
    fn start(root: &Path, spec: &Path, name: &str) -> Submitted {
        let output = sluice()
            .arg("submit")
            .arg(spec)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(root.join("state"))
            .arg("--ring-dir")
            .arg(ring_dir(name))
            .args(["--ring-size", &RING_SIZE.to_string()])
            .env("TMPDIR", root)
            .env_remove("SLUICE_TOKEN")
            .output()
            .expect("run sluice submit");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "sluice submit failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = stdout
            .lines()
            .find(|line| line.starts_with("sluice submit: job ") && line.contains(" serving on "))
            .unwrap_or_else(|| panic!("sluice submit prints the AM's address: {stdout:?}"));
        let address = line
            .rsplit(' ')
            .next()
            .expect("the address ends the line")
            .to_owned();
        Submitted {
            name: name.to_owned(),
            root: root.to_path_buf(),
            address,
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.root.join("state")
    }

    /// The sizes of the ring files the job's daemons created.
    fn ring_file_sizes(&self) -> Vec<u64> {
        let rings = ring_dir(&self.name).join(&self.name);
        std::fs::read_dir(&rings)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "ring"))
                    .filter_map(|entry| entry.metadata().ok())
                    .map(|metadata| metadata.len())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `sluice ARGS --am ADDRESS`.
    fn control(&self, arguments: &[&str]) -> Output {
        sluice()
            .args(arguments)
            .args(["--am", &self.address])
            .env_remove("SLUICE_TOKEN")
            .output()
            .expect("run a control command")
    }

    /// `sluice status --json`, or `None` once the AM has exited.
    fn status(&self) -> Option<serde_json::Value> {
        let output = self.control(&["status", "--json"]);
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).expect("status JSON"))
    }

    /// Every log the AM and the executors left.
    fn logs(&self) -> String {
        sluice_testkit::job::logs(&self.state_dir())
    }

    /// Polls `sluice status --json` until `done` holds of it; panics past the watchdog.
    fn wait_for(&self, what: &str, started: Instant, done: impl Fn(&serde_json::Value) -> bool) {
        loop {
            let status = self.status();
            if status.as_ref().is_some_and(&done) {
                return;
            }
            assert!(
                status.is_some(),
                "the AM exited while waiting for {what}\n{}",
                self.logs()
            );
            assert!(
                started.elapsed() < WATCHDOG,
                "no {what} within {WATCHDOG:?}: {status:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Follows the job with `sluice status --json` until its AM exits; returns the final state
    /// from the last status seen, or from the AM's log when it exited between two looks.
    fn wait_for_end(&self, started: Instant) -> String {
        let mut last_state = String::new();
        while let Some(status) = self.status() {
            last_state = status["state"].as_str().unwrap_or_default().to_owned();
            assert!(
                started.elapsed() < WATCHDOG,
                "job {} not over within {WATCHDOG:?}: {status}\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self.state_dir().join("am.log")).unwrap_or_default();
        let prefix = format!("sluice run: job {} ", self.name);
        log.lines()
            .rev()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(last_state, str::to_owned)
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(ring_dir(&self.name));
    }
}

fn ids_delivered(root: &Path) -> usize {
    (0..4)
        .map(|rank| {
            std::fs::metadata(root.join(format!("ids-{rank}.bin")))
                .map_or(0, |metadata| metadata.len() as usize / 8)
        })
        .sum()
}

/// Asserts that the ids files of ranks 0 to 3 hold every id below `rows` exactly once.
fn assert_every_id_once(root: &Path, rows: i64, logs: &str) {
    let mut ids: Vec<i64> = (0..4)
        .flat_map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))))
        .collect();
    let total = ids.len();
    ids.sort_unstable();
    let repeated: Vec<i64> = ids
        .windows(2)
        .filter(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
        .take(10)
        .collect();
    ids.dedup();
    assert!(
        repeated.is_empty(),
        "{} ids delivered twice, the first: {repeated:?}\n{logs}",
        total - ids.len()
    );
    let missing: Vec<i64> = (0..rows)
        .filter(|id| ids.binary_search(id).is_err())
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids never delivered, the first: {missing:?}\n{logs}",
        rows as usize - ids.len()
    );
}

/// A job of two daemons and two paced trainers over `rows` generated rows.
fn paced_job(root: &Path, name: &str, rows: u64, rows_per_s: u64) -> PathBuf {
    let data = common::generate(root, rows, 4, 10_000);
    common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: 5000
  batch_size: 500
  shuffle: {{ seed: 5, window: 2 }}
nodes: 2
roles:
  - {{ name: worker, num: 2, command: [sluice, consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "{rows_per_s}"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
"#,
            data = data.display(),
            root = root.display(),
        ),
    )
}

/// The ring directory of the job named `name`, on /dev/shm.
fn ring_dir(name: &str) -> PathBuf {
    Path::new("/dev/shm").join(format!("sluice-{name}"))
}

/// A job name no other run of the test shares.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

fn role_is(num: u64) -> impl Fn(&serde_json::Value) -> bool {
    move |status| {
        let role = &status["roles"][0];
        status["scaling"] == false && role["num"] == num && role["running"] == num
    }
}

#[test]
fn a_submitted_job_scaled_to_four_trainers_then_one_delivers_every_row_once() {
    const ROWS: u64 = 120_000;
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let name = unique("scale");
    let spec = paced_job(root, &name, ROWS, 6000);
    let started = Instant::now();
    let job = Submitted::start(root, &spec, &name);

    let refused = job.control(&["scale", "reader", "3"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains(r#"name one of ["worker"]"#),
        "{message}"
    );
    let refused = job.control(&["scale", "worker", "0"]);
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && message.contains("at least one"),
        "{message}"
    );

    let mut at_scale = Vec::new();
    for (num, share) in [(4u64, 5), (1, 2)] {
        while ids_delivered(root) < ROWS as usize / share {
            assert!(
                started.elapsed() < WATCHDOG,
                "only {} ids within {WATCHDOG:?}\n{}",
                ids_delivered(root),
                job.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        at_scale.push(ids_delivered(root));
        let scaled = job.control(&["scale", "worker", &num.to_string()]);
        assert!(
            scaled.status.success(),
            "{}",
            String::from_utf8_lossy(&scaled.stderr)
        );
        let stdout = String::from_utf8_lossy(&scaled.stdout);
        assert!(stdout.contains(&format!("-> {num} trainers")), "{stdout}");
        job.wait_for(&format!("{num} trainers running"), started, role_is(num));
    }
    let state = job.wait_for_end(started);
    let logs = job.logs();
    eprintln!(
        "ids delivered at each scale: {at_scale:?}; job took {:?}",
        started.elapsed()
    );
    assert_eq!(state, "succeeded", "{logs}");
    assert!(
        at_scale[1] < ROWS as usize,
        "the job ended before its last scale: the test proves little"
    );
    for rank in [2, 3] {
        assert!(
            !read_ids(&root.join(format!("ids-{rank}.bin"))).is_empty(),
            "rank {rank} exists only while the role has four trainers, and read nothing\n{logs}"
        );
    }
    assert!(
        logs.contains("stopped by SIGTERM"),
        "no trainer was stopped by the scale\n{logs}"
    );
    assert_every_id_once(root, ROWS as i64, &logs);
}

#[test]
fn a_submitted_job_runs_to_its_end_and_another_stops_on_sluice_stop() {
    const ROWS: u64 = 40_000;
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let name = unique("submit");
    let spec = paced_job(root, &name, ROWS, 50_000);
    let started = Instant::now();
    let job = Submitted::start(root, &spec, &name);
    let state = job.wait_for_end(started);
    assert_eq!(state, "succeeded", "{}", job.logs());
    assert_every_id_once(root, ROWS as i64, &job.logs());
    let rings = ring_dir(&name).join(&name);
    let ended = Instant::now();
    while rings.exists() {
        assert!(
            ended.elapsed() < Duration::from_secs(10),
            "the job's rings are removed once it is over: {:?}",
            std::fs::read_dir(&rings).map(|entries| entries
                .flatten()
                .map(|entry| entry.path())
                .collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !root.join("sluice").join(&name).exists(),
        "state went to the temp dir, not to --state-dir"
    );

    let slow_root = root.join("slow");
    std::fs::create_dir_all(&slow_root).expect("mkdir");
    let slow_name = unique("stop");
    let slow_spec = paced_job(&slow_root, &slow_name, ROWS, 500);
    let slow = Submitted::start(&slow_root, &slow_spec, &slow_name);
    slow.wait_for("rows consumed", started, |status| {
        status["tasks"]["rows_consumed"].as_u64() > Some(0)
    });
    let sizes = slow.ring_file_sizes();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|size| *size == RING_SIZE + 4096),
        "rings of --ring-size {RING_SIZE} under --ring-dir: {sizes:?}"
    );
    // The job got a token of its own: the CLI finds it (every call above went without one), a
    // wrong one is refused, and it sits in a file only its user reads.
    let refused = slow.control(&["status", "--token", "wrong"]);
    assert!(!refused.status.success(), "a wrong token is refused");
    let log = std::fs::read_to_string(slow.state_dir().join("am.log")).expect("the AM's log");
    let published = log
        .lines()
        .find_map(|line| {
            line.split_once("the job's token is in ")?
                .1
                .split(" (")
                .next()
        })
        .unwrap_or_else(|| panic!("sluice run says where the token is: {log}"));
    let metadata = std::fs::metadata(published).expect("the token file");
    assert_eq!(metadata.permissions().mode() & 0o777, 0o600, "{published}");
    let parent = Path::new(published).parent().expect("a directory");
    let directory_mode = std::fs::metadata(parent)
        .expect("its directory")
        .permissions()
        .mode();
    assert_eq!(directory_mode & 0o777, 0o700);
    let stopped = slow.control(&["stop", "--reason", "test over"]);
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&stopped.stdout).trim(),
        "job stopping"
    );
    assert_eq!(slow.wait_for_end(started), "stopped", "{}", slow.logs());
    assert!(
        ids_delivered(&slow_root) < ROWS as usize,
        "the slow job was stopped before its end"
    );
}
