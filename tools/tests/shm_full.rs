//! A full ring filesystem (`/dev/shm`) during a job, on a small tmpfs the test mounts (it runs as root,
//! as CI does). Rings and their ledgers reserve every byte they will ever write when they are created,
//! so a filesystem that fills up afterwards breaks nothing, not even a daemon killed then, which takes
//! its rings over without a byte more; a daemon that must create a ring where there is no room fails
//! with a message naming the ring, the sizes and the fix, and the job ends by its failure policy.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::job::{logs, processes_naming, read_ids};

const RING_SIZE: u64 = 4 << 20;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs of {bytes} bytes at {} failed ({status}): this test fills a filesystem of its own, which needs root (or CAP_SYS_ADMIN)",
            path.display()
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }

    /// Writes a file until the filesystem has no byte left, and checks it is full.
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.path.join("filler")).expect("filler");
        for chunk in [1 << 20, 4096] {
            let bytes = vec![0x5a_u8; chunk];
            while filler.write_all(&bytes).is_ok() {}
        }
        let probe = std::fs::File::create(self.path.join("probe"))
            .and_then(|mut file| file.write_all(&[1; 4096]).and_then(|()| file.sync_all()));
        assert!(probe.is_err(), "the tmpfs still takes writes after filling");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn spec(root: &Path, data: &Path, name: &str, rows_per_s: u32) -> PathBuf {
    common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: 10000
  batch_size: 500
nodes: 1
roles:
  - {{ name: worker, num: 2, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "{rows_per_s}"] }}
failover: {{ restart: on-failure, max_failures: 2, heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    )
}

fn run(spec: &Path, rings: &Path, state: &Path) -> std::process::Child {
    sluice()
        .arg("run")
        .arg(spec)
        .arg("--ring-dir")
        .arg(rings)
        .args(["--ring-size", &RING_SIZE.to_string()])
        .arg("--state-dir")
        .arg(state)
        .env("SLUICE_LOG", "warn,sluice_daemon=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice run")
}

/// Waits for `sluice run` to end; a job that outlives `limit` is a hang.
fn finish(mut child: std::process::Child, limit: Duration, directories: &[&Path]) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            for directory in directories {
                for pid in processes_naming(directory, None) {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
            panic!("the job did not end within {limit:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_ring_filesystem_filled_during_the_job_loses_nothing_even_across_a_daemon_restart() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let shm = Tmpfs::mount(&root.join("shm"), 4 * RING_SIZE);
    let state = root.join("state");
    let data = common::generate(root, 120_000, 3, 10_000);
    let spec = spec(root, &data, "shm-filled", 20_000);
    let child = run(&spec, &shm.path, &state);
    let rings = shm.path.join("shm-filled");
    let started = Instant::now();
    let delivered = || {
        (0..2)
            .map(|rank| {
                std::fs::metadata(root.join(format!("ids-{rank}.bin"))).map_or(0, |file| file.len())
            })
            .sum::<u64>()
            / 8
    };
    while !(rings.join("0.ring").exists() && rings.join("1.ring").exists() && delivered() > 0) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the trainers received nothing within 60 s\n{}",
            logs(&state)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    shm.fill();
    let daemons = processes_naming(&shm.path, Some("daemon"));
    assert_eq!(daemons.len(), 1, "one daemon runs: {daemons:?}");
    let killed = Command::new("kill")
        .args(["-9", &daemons[0].to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let before_restart = delivered();
    let output = finish(child, Duration::from_secs(120), &[root, &shm.path]);
    let text = text(&output);
    let logs = logs(&state);
    assert!(output.status.success(), "the job failed:\n{text}\n{logs}");
    assert!(
        before_restart < 120_000,
        "the daemon was killed after the last row: the test proves little"
    );
    assert!(
        logs.contains("took over a ring this node fed before it restarted"),
        "the restarted daemon did not take its rings over:\n{logs}"
    );
    let mut ids: Vec<i64> = (0..2)
        .flat_map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))))
        .collect();
    ids.sort_unstable();
    assert!(
        ids.iter().copied().eq(0..120_000),
        "{} ids, not every id once",
        ids.len()
    );
}

/// Runs a job whose daemon finds a ring filesystem of `bytes`; the job must fail, without a hang.
/// Returns what `sluice run` printed and the executors' logs.
fn run_without_room(name: &str, bytes: u64) -> (String, String) {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let shm = Tmpfs::mount(&root.join("shm"), bytes);
    let state = root.join("state");
    let data = common::generate(root, 20_000, 1, 10_000);
    let spec = spec(root, &data, name, 1_000_000);
    let output = finish(
        run(&spec, &shm.path, &state),
        Duration::from_secs(120),
        &[root, &shm.path],
    );
    let text = text(&output);
    assert!(!output.status.success(), "the job must fail:\n{text}");
    assert!(text.contains(&format!("job {name} failed")), "{text}");
    assert!(
        text.contains("daemon-0"),
        "the message names the daemon: {text}"
    );
    (text, logs(&state))
}

#[test]
fn a_ring_filesystem_without_room_for_a_ring_fails_the_job_naming_the_fix() {
    let (text, _) = run_without_room("shm-no-ring", RING_SIZE + RING_SIZE / 2);
    assert!(
        text.contains("daemon-0's last error: ring ") && text.contains("lower --ring-size"),
        "the job's error names the ring and the fix:\n{text}"
    );
}

/// Room for the first ring to the byte, none for its ledger: the ledger reserves its pages when it is
/// created, so this is an error naming it, not a `SIGBUS` at its first write.
#[test]
fn a_ring_filesystem_without_room_for_a_ledger_fails_the_job_naming_it() {
    let (text, _) = run_without_room("shm-no-ledger", RING_SIZE + 4096);
    assert!(
        text.contains("daemon-0's last error: ledger ") && text.contains("the filesystem is full"),
        "the job's error names the ledger and the fix:\n{text}"
    );
}
