//! Another user of the same host against a job's files: a ring directory made in advance, a ring and
//! ledger planted for a daemon to take over, pid files that name a victim's process, and symlinks at
//! the names Sluice writes. The tests play the other user with uid 65534 (`nobody`), so they run as
//! root: `scripts/test.sh` runs them as root.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::sluice;
use sluice_am::launcher::local::LocalLauncher;
use sluice_am::launcher::{ExecutorId, LaunchSpec, Launcher};
use sluice_ring::ledger::Ledger;
use sluice_ring::{ProcessId, RING_EXTENSION, RingOptions};

/// The other user.
const NOBODY: u32 = 65534;

fn give_to_nobody(path: &Path) {
    std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).unwrap_or_else(|error| {
        panic!(
            "chown {} to uid {NOBODY}: {error}; this test plays another user, which needs root",
            path.display()
        )
    });
}

fn spec(root: &Path, name: &str) -> std::path::PathBuf {
    let data = common::generate(root, 2_000, 1, 1_000);
    common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id] }}]
  task_rows: 1000
nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume] }}
failover: {{ restart: on-failure, max_failures: 1, heartbeat_interval_ms: 100, heartbeat_timeout_ms: 5000 }}
"#,
            data = data.display(),
            sluice = env!("CARGO_BIN_EXE_sluice"),
        ),
    )
}

/// Runs `sluice run SPEC` with its rings under `rings`, to its end (at most two minutes).
fn run(spec: &Path, rings: &Path, state: &Path) -> (bool, String) {
    let mut child = sluice()
        .arg("run")
        .arg(spec)
        .arg("--ring-dir")
        .arg(rings)
        .args(["--ring-size", &(1u64 << 20).to_string()])
        .arg("--state-dir")
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice run");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the job did not end within two minutes (a hang)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output: Output = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[test]
#[ignore = "needs root to play another user: scripts/test.sh runs it as root"]
fn a_ring_directory_another_user_made_is_refused_naming_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = spec(root, "planted-dir");
    let rings = root.join("rings");
    std::fs::create_dir(&rings).expect("mkdir");
    std::fs::set_permissions(&rings, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    give_to_nobody(&rings);
    let (succeeded, text) = run(&spec, &rings, &root.join("state"));
    assert!(
        !succeeded,
        "the job ran in another user's directory:\n{text}"
    );
    assert!(
        text.contains(&rings.display().to_string()) && text.contains("uid 65534"),
        "the error names the directory and its owner:\n{text}"
    );
    assert!(
        std::fs::read_dir(&rings).expect("list").next().is_none(),
        "nothing was written into the other user's directory"
    );
}

#[test]
#[ignore = "needs root to play another user: scripts/test.sh runs it as root"]
fn a_ring_and_ledger_another_user_planted_are_not_taken_over() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = spec(root, "planted-ring");
    let rings = root.join("rings");
    let job_dir = rings.join("planted-ring");
    let ring = job_dir.join(format!("0.{RING_EXTENSION}"));
    // A ring of node 0 that looks left by a daemon that stopped (its creator, this process, lives
    // on, so nothing collects it), with forged counts in its ledger.
    let _kept = RingOptions::new(&ring)
        .capacity(1 << 20)
        .create()
        .expect("ring");
    let ledger = Ledger::create(Ledger::path_beside(&ring), 0).expect("ledger");
    give_to_nobody(&ring);
    give_to_nobody(ledger.path());
    let (succeeded, text) = run(&spec, &rings, &root.join("state"));
    assert!(!succeeded, "the job took over a planted ring:\n{text}");
    assert!(
        text.contains("not taking over") && text.contains("uid 65534"),
        "the error says the planted file is not taken over and whose it is:\n{text}"
    );
}

fn victim() -> std::process::Child {
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: `setgid` and `setuid` are, and it allocates nothing.
    unsafe {
        Command::new("sleep")
            .arg("60")
            .process_group(0)
            .pre_exec(|| {
                if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .spawn()
            .expect("start a process as uid 65534 (needs root)")
    }
}

#[test]
#[ignore = "needs root to play another user: scripts/test.sh runs it as root"]
fn a_pid_file_naming_another_users_process_signals_nothing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let state = directory.path().join("state");
    let sut = LocalLauncher::new(&state, env!("CARGO_BIN_EXE_sluice")).expect("launcher");
    let mut victim = victim();
    let identity = ProcessId::of(victim.id()).expect("the victim's identity");
    let id = ExecutorId::Daemon(0);
    // The pid file of an executor, as its shim writes it, naming the victim as the shim.
    std::fs::write(
        state.join(format!("{id}.pid")),
        format!("{} {}\n", identity.pid, identity.start_ticks),
    )
    .expect("write the pid file");
    sut.kill(&id);
    sut.terminate(&id);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        victim.try_wait().expect("try_wait").is_none(),
        "the launcher signalled another user's process"
    );
    let _ = victim.kill();
    let _ = victim.wait();
}

#[test]
#[ignore = "needs root to play another user: scripts/test.sh runs it as root"]
fn a_pid_file_another_user_wrote_signals_nothing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let state = directory.path().join("state");
    let sut = LocalLauncher::new(&state, env!("CARGO_BIN_EXE_sluice")).expect("launcher");
    // A process of this user's, in a group of its own, as a shim would be.
    let mut victim = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .expect("sleep");
    let identity = ProcessId::of(victim.id()).expect("identity");
    let id = ExecutorId::Daemon(0);
    let pid_file = state.join(format!("{id}.pid"));
    std::fs::write(
        &pid_file,
        format!("{} {}\n", identity.pid, identity.start_ticks),
    )
    .expect("write the pid file");
    give_to_nobody(&pid_file);
    sut.kill(&id);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        victim.try_wait().expect("try_wait").is_none(),
        "the launcher acted on a pid file another user wrote"
    );
    // The same file of this user's is acted on: the check above is the file's owner.
    std::os::unix::fs::lchown(&pid_file, Some(0), Some(0)).expect("chown back");
    sut.kill(&id);
    let started = Instant::now();
    while victim.try_wait().expect("try_wait").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the launcher did not kill the executor its own pid file names"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root to play another user: scripts/test.sh runs it as root"]
fn a_state_directory_another_user_made_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let state = directory.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    give_to_nobody(&state);
    let error = LocalLauncher::new(&state, env!("CARGO_BIN_EXE_sluice")).expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains("uid 65534") && message.contains("--state-dir"),
        "{message}"
    );
}

/// Symlinks at the executor's log name and at its pid file's temporary name redirect no write:
/// the launch is refused naming the log, and the files they point at keep their bytes.
#[test]
fn symlinks_at_an_executors_file_names_redirect_nothing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let state = directory.path().join("state");
    let sut = LocalLauncher::new(&state, env!("CARGO_BIN_EXE_sluice")).expect("launcher");
    let victim = directory.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let id = ExecutorId::Daemon(0);
    std::os::unix::fs::symlink(&victim, state.join(format!("{id}.log"))).expect("plant");
    let spec = LaunchSpec {
        id: id.clone(),
        node: 0,
        command: vec!["true".into()],
        env: BTreeMap::new(),
    };
    let error = sut.launch(&spec).expect_err("a symlinked log");
    assert!(error.to_string().contains("symlink"), "{error}");
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");

    // The shim's own files: a symlink at the pid file's temporary name is removed, not followed.
    let pid_file = state.join("shim.pid");
    std::os::unix::fs::symlink(&victim, state.join("shim.pid.tmp")).expect("plant");
    let status = sluice()
        .arg("shim")
        .arg("--pid-file")
        .arg(&pid_file)
        .arg("--exit-file")
        .arg(state.join("shim.exit"))
        .args(["--", "true"])
        .status()
        .expect("run sluice shim");
    assert!(status.success());
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
    let metadata = std::fs::symlink_metadata(&pid_file).expect("the pid file");
    assert!(metadata.is_file());
    assert_eq!(metadata.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&state).expect("state").mode() & 0o777,
        0o700
    );
}
