//! The local launcher over real processes: exit codes and kills as events, and a second launcher
//! (a new AM) adopting executors the first one started.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluice_am::launcher::local::{LAUNCH_MARK, LocalLauncher, WATCH_INTERVAL};
use sluice_am::launcher::{ExecutorEvent, ExecutorId, Exit, LaunchSpec, Launcher};
use tokio::sync::mpsc::UnboundedReceiver;

fn trainer(rank: u32) -> ExecutorId {
    ExecutorId::Trainer {
        role: "worker".into(),
        rank,
    }
}

fn spec(id: ExecutorId, script: &str) -> LaunchSpec {
    LaunchSpec {
        id,
        node: 0,
        command: vec!["sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([("SLUICE_RANK".to_owned(), "7".to_owned())]),
    }
}

/// Waits for the next event, which must be the end of `id`, failing after 10 s.
fn wait_exit(events: &mut UnboundedReceiver<ExecutorEvent>, id: &ExecutorId) -> Exit {
    let started = Instant::now();
    loop {
        if let Ok(ExecutorEvent::Exited {
            id: ended, exit, ..
        }) = events.try_recv()
        {
            assert_eq!(&ended, id, "the end of another executor came first");
            return exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no end of {id} after 10 s (deadlock watchdog)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn launcher(directory: &std::path::Path) -> (LocalLauncher, UnboundedReceiver<ExecutorEvent>) {
    let launcher = LocalLauncher::new(directory, env!("CARGO_BIN_EXE_sluice")).expect("launcher");
    let events = launcher.events().expect("the events, taken once");
    assert!(launcher.events().is_none(), "the events are taken once");
    (launcher, events)
}

#[test]
fn exit_codes_and_the_environment_reach_the_launcher() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (sut, mut events) = launcher(directory.path());
    sut.adopt(&trainer(4));
    assert_eq!(
        wait_exit(&mut events, &trainer(4)),
        Exit::Killed,
        "an executor this launcher cannot find is reported ended"
    );
    sut.launch(&spec(trainer(0), "echo rank $SLUICE_RANK; exit 3"))
        .expect("launch");
    assert_eq!(wait_exit(&mut events, &trainer(0)), Exit::Code(3));
    let log = std::fs::read_to_string(sut.log_file(&trainer(0))).expect("log");
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].starts_with(LAUNCH_MARK) && lines[1] == "rank 7",
        "{log}"
    );
    sut.launch(&spec(trainer(0), "exit 0"))
        .expect("launch again");
    assert_eq!(
        wait_exit(&mut events, &trainer(0)),
        Exit::Code(0),
        "a relaunch forgets the previous exit"
    );
    let log = std::fs::read_to_string(sut.log_file(&trainer(0))).expect("log");
    assert_eq!(
        log.matches(LAUNCH_MARK).count(),
        2,
        "a relaunch appends to the log: {log}"
    );
    assert!(log.contains("rank 7"), "{log}");
}

#[test]
fn a_new_launcher_adopts_running_executors_and_can_kill_them() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (first, mut first_events) = launcher(directory.path());
    first.launch(&spec(trainer(1), "sleep 60")).expect("launch");
    let started = Instant::now();
    while !directory.path().join("trainer-worker-1.pid").exists() {
        assert!(started.elapsed() < Duration::from_secs(10), "no pid file");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (second, mut second_events) = launcher(directory.path());
    second.adopt(&trainer(1));
    std::thread::sleep(WATCH_INTERVAL * 5);
    assert!(
        second_events.try_recv().is_err(),
        "an adopted executor that runs is not reported ended"
    );
    second.kill(&trainer(1));
    assert_eq!(wait_exit(&mut second_events, &trainer(1)), Exit::Killed);
    assert_eq!(wait_exit(&mut first_events, &trainer(1)), Exit::Killed);
}

#[test]
fn a_missing_program_is_exit_code_127_with_a_message() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (sut, mut events) = launcher(directory.path());
    sut.launch(&LaunchSpec {
        id: trainer(2),
        node: 0,
        command: vec!["/nonexistent/trainer".into()],
        env: BTreeMap::new(),
    })
    .expect("the shim starts");
    assert_eq!(wait_exit(&mut events, &trainer(2)), Exit::Code(127));
    let log = std::fs::read_to_string(sut.log_file(&trainer(2))).expect("log");
    assert!(log.contains("cannot start /nonexistent/trainer"), "{log}");
}

/// The identities `<state>/<executor>.pid` holds once the shim started its command: the shim's
/// pid and the command's pid.
fn recorded_pids(directory: &std::path::Path, id: &ExecutorId) -> (u32, u32) {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(directory.join(format!("{id}.pid"))).unwrap_or_default();
        let numbers: Vec<u32> = text
            .split_ascii_whitespace()
            .filter_map(|word| word.parse().ok())
            .collect();
        if let [shim, _, command, _] = numbers[..] {
            return (shim, command);
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the shim recorded no command: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or_default()
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_killed_supervisor_leaves_no_orphan_and_its_end_comes_once_the_command_is_gone() {
    let directory = tempfile::tempdir().expect("tempdir");
    let (sut, mut events) = launcher(directory.path());
    let id = ExecutorId::Daemon(0);
    // A command with a child of its own, both in the shim's process group.
    sut.launch(&spec(id.clone(), "sleep 300 & wait"))
        .expect("launch");
    let (shim, command) = recorded_pids(directory.path(), &id);
    assert!(alive(command));
    let status = std::process::Command::new("kill")
        .args(["-9", &shim.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert_eq!(wait_exit(&mut events, &id), Exit::Killed);
    assert!(
        !alive(command),
        "the orphaned command is gone before its end is told"
    );
    let sleepers = std::process::Command::new("pgrep")
        .args(["-g", &shim.to_string()])
        .output()
        .expect("pgrep");
    let left: Vec<u32> = String::from_utf8_lossy(&sleepers.stdout)
        .split_ascii_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .filter(|pid| alive(*pid))
        .collect();
    assert!(
        left.is_empty(),
        "nothing of its process group is left: {left:?}"
    );
}

#[test]
fn an_adopted_executor_whose_supervisor_died_is_ended_before_the_new_am_launches_it() {
    let directory = tempfile::tempdir().expect("tempdir");
    let id = trainer(1);
    let (shim, command) = {
        let (first, _events) = launcher(directory.path());
        first
            .launch(&spec(id.clone(), "exec sleep 300"))
            .expect("launch");
        recorded_pids(directory.path(), &id)
    };
    let status = std::process::Command::new("kill")
        .args(["-9", &shim.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert!(alive(command), "the command outlives its shim");
    let (second, mut events) = launcher(directory.path());
    second.adopt(&id);
    assert_eq!(wait_exit(&mut events, &id), Exit::Killed);
    assert!(!alive(command), "the new AM ended the orphan");
}
