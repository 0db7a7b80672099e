//! Chaos: `kill -9` of node daemons and of the AM at random moments of a job of two million rows.
//! The launcher starts each daemon again with the same node id, job and ring directory, and it takes
//! its rings over from their ledgers; the AM is started again as an operator would, with the same
//! spec, address and state, replays its journal and adopts the executors. The four trainers, which
//! live through it all, still see every id exactly once.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::sluice;

const ROWS: i64 = 2_000_000;
/// Daemon kills, then AM kills, in a random order.
const DAEMON_KILLS: usize = 3;
const AM_KILLS: usize = 2;
/// The whole run, kills included, must end within this (deadlock watchdog).
const WATCHDOG: Duration = Duration::from_secs(240);

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

/// A free port on 127.0.0.1 for the AM, which every `sluice run` of the test listens on.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// `sluice run` of `spec`, its stdout read by a thread.
fn start_run(
    spec: &Path,
    listen: &str,
    rings: &Path,
    state: &Path,
) -> (Child, std::thread::JoinHandle<String>) {
    let mut run = sluice()
        .arg("run")
        .arg(spec)
        .args(["--listen", listen])
        .arg("--ring-dir")
        .arg(rings)
        .arg("--state-dir")
        .arg(state)
        .env("SLUICE_LOG", "warn,sluice_daemon=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sluice run");
    let mut output = run.stdout.take().expect("stdout");
    let stdout =
        std::thread::spawn(move || std::io::read_to_string(&mut output).unwrap_or_default());
    (run, stdout)
}

#[test]
fn daemons_and_the_am_killed_at_random_moments_lose_and_repeat_no_row() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let rings = tempfile::Builder::new()
        .prefix("sluice-chaos")
        .tempdir_in("/dev/shm")
        .expect("ring directory in /dev/shm");
    let state: PathBuf = root.join("state");
    let data = common::generate(root, ROWS as u64, 8, 50_000);
    let spec = common::write_spec(
        root,
        &format!(
            r#"
name: chaos
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 50000
  batch_size: 1000
  shuffle: {{ seed: 3, window: 2 }}
nodes: 2
roles:
  - {{ name: worker, num: 4, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "25000"] }}
failover: {{ restart: on-failure, max_failures: 50, heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{root}/journal" }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
            root = root.display(),
        ),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let (mut run, mut stdout) = start_run(&spec, &listen, rings.path(), &state);

    let mut random = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    eprintln!("kill schedule seed {random}");
    let mut victims: Vec<&str> = [["daemon"; DAEMON_KILLS].as_slice(), &["am"; AM_KILLS]].concat();
    for index in (1..victims.len()).rev() {
        random = mix(random);
        victims.swap(index, random as usize % (index + 1));
    }
    let mut kills = Vec::new();
    let mut last_seen = 0;
    for victim in victims {
        loop {
            random = mix(random);
            std::thread::sleep(Duration::from_millis(1000 + random % 2000));
            let seen = delivered(root);
            assert!(
                started.elapsed() < WATCHDOG,
                "only {} kills within {WATCHDOG:?} ({kills:?})\n{}",
                kills.len(),
                logs(&state)
            );
            // Each kill lands once the job moved on since the last one.
            if seen > last_seen && seen < ROWS as usize * 9 / 10 {
                last_seen = seen;
                break;
            }
            if seen >= ROWS as usize * 9 / 10 {
                break;
            }
        }
        if last_seen >= ROWS as usize * 9 / 10 {
            break;
        }
        if victim == "am" {
            run.kill().expect("kill -9 the AM");
            run.wait().expect("reap the AM");
            let _ = stdout.join();
            (run, stdout) = start_run(&spec, &listen, rings.path(), &state);
            kills.push(("am", last_seen));
        } else {
            let live = daemons(rings.path());
            if let Some(pid) = live.get((random >> 32) as usize % live.len().max(1)) {
                let status = Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .expect("run kill");
                if status.success() {
                    kills.push(("daemon", last_seen));
                }
            }
        }
    }
    let (success, stdout) = finish(run, stdout, started, &[root, rings.path()], &state);
    eprintln!(
        "{} kills (what, ids delivered by then): {kills:?}; run took {:?}",
        kills.len(),
        started.elapsed()
    );
    let logs = logs(&state);
    assert!(success, "sluice run failed:\n{stdout}\n{logs}");
    assert!(stdout.contains("job chaos succeeded"), "{stdout}");
    assert!(
        kills.iter().filter(|(what, _)| *what == "am").count() == AM_KILLS
            && kills.len() >= AM_KILLS + DAEMON_KILLS - 1,
        "too few kills mid-run ({kills:?}): the test proves little"
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
