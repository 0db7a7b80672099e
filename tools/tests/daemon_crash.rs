//! `kill -9` of node daemons in the middle of `sluice run`: the launcher starts each one again with
//! the same node id, job and ring directory, it takes its rings over from their ledgers, and the four
//! trainers, which live through it all, still see every id exactly once.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::sluice;

const ROWS: i64 = 300_000;
const KILLS: usize = 6;
/// The whole run, kills included, must end within this (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(90);

fn read_ids(path: &Path) -> Vec<i64> {
    std::fs::read(path)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|chunk| i64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect()
}

/// The pids of the live `sluice daemon` processes whose ring directory is `ring_dir`.
fn daemons(ring_dir: &Path) -> Vec<u32> {
    processes_naming(ring_dir, Some("daemon"))
}

/// The pids of the live processes with `path` among their arguments, and `subcommand` as their
/// first argument when given.
fn processes_naming(path: &Path, subcommand: Option<&str>) -> Vec<u32> {
    let path = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("list /proc")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(command_line) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let arguments: Vec<&[u8]> = command_line.split(|byte| *byte == 0).collect();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'));
            // For daemons, the daemon itself (`sluice daemon ...`), not the launcher's shim that
            // runs it.
            !zombie
                && subcommand.is_none_or(|name| arguments.get(1) == Some(&name.as_bytes()))
                && arguments
                    .iter()
                    .any(|argument| argument.starts_with(path.as_bytes()))
        })
        .collect()
}

/// The ids every trainer has written so far.
fn delivered(root: &Path) -> usize {
    (0..4)
        .map(|rank| {
            std::fs::metadata(root.join(format!("ids-{rank}.bin")))
                .map_or(0, |metadata| metadata.len() as usize / 8)
        })
        .sum()
}

/// Every log the executors left in the state directory.
fn logs(state: &Path) -> String {
    std::fs::read_dir(state)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| {
                    format!(
                        "--- {}\n{}",
                        entry.path().display(),
                        std::fs::read_to_string(entry.path()).unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for `sluice run` to end, reading its output as it comes; kills it after the watchdog.
fn finish(
    mut run: Child,
    stdout: std::thread::JoinHandle<String>,
    started: Instant,
    directories: &[&Path],
    state: &Path,
) -> (bool, String) {
    loop {
        if let Some(status) = run.try_wait().expect("try_wait") {
            return (status.success(), stdout.join().expect("stdout reader"));
        }
        if started.elapsed() > WATCHDOG {
            let _ = run.kill();
            let _ = run.wait();
            // The executors outlive `sluice run`: every one names a directory of the test.
            let executors = directories
                .iter()
                .flat_map(|directory| processes_naming(directory, None));
            for pid in executors {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            panic!(
                "sluice run did not finish within {WATCHDOG:?}: killed (deadlock watchdog)\n{}",
                logs(state)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn daemons_killed_and_restarted_lose_and_repeat_no_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let rings = tempfile::Builder::new()
        .prefix("sluice-daemon-crash")
        .tempdir_in("/dev/shm")
        .expect("ring directory in /dev/shm");
    let state: PathBuf = root.join("state");
    let data = common::generate(root, ROWS as u64, 4, 5000);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: daemon-crash
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 5000
  batch_size: 500
  shuffle: {{ seed: 3, window: 2 }}
nodes: 2
roles:
  - {{ name: worker, num: 4, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "10000"] }}
failover: {{ restart: on-failure, max_failures: 50, heartbeat_interval_ms: 100, heartbeat_timeout_ms: 20000 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    );
    let started = Instant::now();
    let mut run = sluice()
        .arg("run")
        .arg(&spec)
        .arg("--ring-dir")
        .arg(rings.path())
        .arg("--state-dir")
        .arg(&state)
        .env("SLUICE_LOG", "warn,sluice_daemon=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice run");
    let mut output = run.stdout.take().expect("stdout");
    let stdout =
        std::thread::spawn(move || std::io::read_to_string(&mut output).unwrap_or_default());

    let mut random = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    eprintln!("kill schedule seed {random}");
    let mut kills = Vec::new();
    while kills.len() < KILLS && started.elapsed() < WATCHDOG {
        random = mix(random);
        std::thread::sleep(Duration::from_millis(400 + random % 1200));
        let seen = delivered(root);
        if seen >= ROWS as usize * 9 / 10 {
            break;
        }
        let live = daemons(rings.path());
        if live.is_empty() || seen == 0 {
            continue;
        }
        let victim = live[(random >> 32) as usize % live.len()];
        let status = Command::new("kill")
            .args(["-9", &victim.to_string()])
            .status()
            .expect("run kill");
        if status.success() {
            kills.push((victim, seen));
        }
    }
    let (success, stdout) = finish(run, stdout, started, &[root, rings.path()], &state);
    eprintln!(
        "{} kills (pid, ids delivered by then): {kills:?}; run took {:?}",
        kills.len(),
        started.elapsed()
    );
    let logs = logs(&state);
    assert!(success, "sluice run failed:\n{stdout}\n{logs}");
    assert!(stdout.contains("job daemon-crash succeeded"), "{stdout}");
    assert!(
        kills.len() >= KILLS / 2,
        "only {} daemons were killed mid-run ({kills:?}): the test proves little",
        kills.len()
    );

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
        "{} ids delivered twice across {} kills {kills:?}, the first: {repeated:?}",
        total - ids.len(),
        kills.len()
    );
    let missing: Vec<i64> = (0..ROWS)
        .filter(|id| ids.binary_search(id).is_err())
        .take(10)
        .collect();
    assert!(
        missing.is_empty(),
        "{} ids never delivered across {} kills {kills:?}, the first: {missing:?}",
        ROWS as usize - ids.len(),
        kills.len()
    );
    assert!(
        logs.contains("took over a ring this node fed before it restarted"),
        "no restarted daemon took its rings over:\n{logs}"
    );
}

/// A SplitMix64 step, for the kill schedule.
fn mix(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^ (state >> 31)
}
