//! Executors as processes on this machine.
//!
//! # Implementation
//! Each executor runs under `sluice shim`, started in a process group of its own so that it
//! survives the AM. The shim records its identity (pid and start time) in `<state>/<executor>.pid`,
//! starts the command in its process group, records the command's identity beside its own, waits
//! for it, and writes the exit code (128 + signal for a signal) to `<state>/<executor>.exit` by
//! rename, so the file is whole or absent. Any AM of the job reads those files: an exit file means
//! the executor ended; a live shim means it runs; a dead shim without an exit file means the shim
//! itself was killed. Its command may outlive it, holding its ring: the launcher then kills the
//! command's process group (the shim's), found through the command's recorded identity, and tells
//! the executor's end only once the command is gone, so that a relaunch never meets its orphan.
//! Output goes to `<state>/<executor>.log`, appended by every launch after a line of its own.
//! [`Launcher::terminate`] sends SIGTERM to the group: `sluice shim` outlives it and records how its
//! command ended, so a command that handles SIGTERM ends in its own time.
//!
//! A watcher thread looks at the executors launched or adopted every [`WATCH_INTERVAL`] and sends
//! one [`ExecutorEvent::Exited`] for each that ended. It holds the launcher weakly and ends with
//! it.

use super::{EventChannel, ExecutorEvent, ExecutorId, Exit, LaunchSpec, Launcher};
use crate::error::{AmError, Result};
use sluice_process::ProcessId;
use sluice_process::files::{self, Sharing};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

/// The start of the line a launch writes to its executor's log before the executor's own output.
pub const LAUNCH_MARK: &str = "==> sluice: launching ";

/// How often the watcher looks at the executors it follows.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// Runs executors as local processes under `sluice shim`.
#[derive(Debug)]
pub struct LocalLauncher {
    local: Arc<Local>,
}

/// What the launcher and its watcher share.
#[derive(Debug)]
struct Local {
    state_dir: PathBuf,
    shim: PathBuf,
    children: Mutex<BTreeMap<ExecutorId, Child>>,
    /// The executors launched or adopted whose end is not yet told.
    followed: Mutex<BTreeSet<ExecutorId>>,
    events: EventChannel,
}

/// What the watcher sees of an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Observation {
    /// No process of it ever ran here, as far as the state directory tells.
    Unknown,
    /// It runs.
    Running,
    /// It ended.
    Exited(Exit),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LocalLauncher {
    /// Keeps executor state under `state_dir`, starting executors with the `sluice` binary at
    /// `shim` (its `shim` subcommand).
    pub fn new(state_dir: impl Into<PathBuf>, shim: impl Into<PathBuf>) -> Result<LocalLauncher> {
        let state_dir = state_dir.into();
        // The pid files say which processes this launcher signals: nobody else may write here.
        files::ensure_dir(&state_dir, Sharing::Private).map_err(|error| {
            AmError::FailedPrecondition(format!(
                "executor state directory: {error}; choose another --state-dir"
            ))
        })?;
        let local = Arc::new(Local {
            state_dir,
            shim: shim.into(),
            children: Mutex::new(BTreeMap::new()),
            followed: Mutex::new(BTreeSet::new()),
            events: EventChannel::default(),
        });
        let watched = Arc::downgrade(&local);
        std::thread::Builder::new()
            .name("sluice-executors".to_owned())
            .spawn(move || watch(&watched))
            .map_err(|error| {
                AmError::FailedPrecondition(format!(
                    "cannot start the thread that follows the executors: {error}"
                ))
            })?;
        Ok(LocalLauncher { local })
    }

    /// The executor's output file: the output of every launch of it, each after a line that starts
    /// with [`LAUNCH_MARK`].
    pub fn log_file(&self, id: &ExecutorId) -> PathBuf {
        self.local.file(id, "log")
    }
}

/// Looks at the followed executors until the launcher is dropped.
fn watch(local: &Weak<Local>) {
    loop {
        std::thread::sleep(WATCH_INTERVAL);
        let Some(local) = local.upgrade() else {
            return;
        };
        local.look();
    }
}

impl Local {
    /// Tells the end of every followed executor that ended.
    fn look(&self) {
        let followed: Vec<ExecutorId> = lock(&self.followed).iter().cloned().collect();
        for id in followed {
            let exit = match self.observe(&id) {
                Observation::Running => continue,
                Observation::Exited(exit) => exit,
                Observation::Unknown => Exit::Killed,
            };
            lock(&self.followed).remove(&id);
            self.events.send(ExecutorEvent::Exited {
                id,
                exit,
                cause: None,
            });
        }
    }

    fn file(&self, id: &ExecutorId, extension: &str) -> PathBuf {
        self.state_dir.join(format!("{id}.{extension}"))
    }

    /// The identities the shim of executor `id` recorded: its own, and its command's once started.
    /// A pid file that is not this user's, or names a process of another user, records nothing:
    /// the launcher never signals a process it did not start.
    fn recorded(&self, id: &ExecutorId) -> Option<(ProcessId, Option<ProcessId>)> {
        let path = self.file(id, "pid");
        if let Err(error) = files::check_owned(&path) {
            if error.io_kind() != Some(std::io::ErrorKind::NotFound) {
                tracing::warn!(executor = %id, %error, "ignoring its pid file");
            }
            return None;
        }
        let text = std::fs::read_to_string(&path).ok()?;
        let numbers: Vec<u64> = text
            .split_ascii_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let user = files::user();
        let identity = |pid: u64, start_ticks: u64| {
            let pid = u32::try_from(pid).ok()?;
            // A process that runs as another user is not one this launcher started (root's
            // executors run as root).
            if files::process_owner(pid).is_some_and(|owner| owner != user) {
                tracing::warn!(executor = %id, pid, "its pid file names another user's process: ignored");
                return None;
            }
            Some(ProcessId { pid, start_ticks })
        };
        match numbers[..] {
            [pid, ticks] => Some((identity(pid, ticks)?, None)),
            [pid, ticks, command, command_ticks] => Some((
                identity(pid, ticks)?,
                Some(identity(command, command_ticks)?),
            )),
            _ => None,
        }
    }

    fn shim_process(&self, id: &ExecutorId) -> Option<ProcessId> {
        self.recorded(id).map(|(shim, _)| shim)
    }

    /// The process group of executor `id` while any process of it that the launcher knows runs:
    /// the shim's, or, once the shim is gone, its command's if that still runs in the shim's group.
    fn live_group(&self, id: &ExecutorId) -> Option<u32> {
        let (shim, command) = self.recorded(id)?;
        if shim.is_alive() {
            return Some(shim.pid);
        }
        command
            .and_then(|command| command.group())
            .filter(|group| *group == shim.pid)
    }

    /// Reaps a shim this AM started once it has exited, so it leaves no zombie.
    fn reap(&self, id: &ExecutorId) -> bool {
        let mut children = lock(&self.children);
        match children.get_mut(id).map(Child::try_wait) {
            Some(Ok(Some(_)) | Err(_)) => {
                children.remove(id);
                true
            }
            Some(Ok(None)) => false,
            None => true,
        }
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<()> {
        let exit_file = self.file(&spec.id, "exit");
        let pid_file = self.file(&spec.id, "pid");
        for stale in [&exit_file, &pid_file] {
            match std::fs::remove_file(stale) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    return Err(AmError::FailedPrecondition(format!(
                        "{}: cannot remove {}: {error}",
                        spec.id,
                        stale.display()
                    )));
                }
            }
        }
        // Each launch appends after a line of its own ([`LAUNCH_MARK`]), so the output of the runs
        // before a restart, and why they ended, stays readable after it.
        let log_error = |error: std::io::Error| {
            AmError::FailedPrecondition(format!(
                "{}: cannot write its log in {}: {error}",
                spec.id,
                self.state_dir.display()
            ))
        };
        let mut log = files::open_append(&self.file(&spec.id, "log"), Sharing::Private)
            .map_err(|error| log_error(std::io::Error::other(error)))?;
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        writeln!(
            log,
            "{LAUNCH_MARK}{} at {} s since the Unix epoch",
            spec.id,
            since_epoch.as_secs()
        )
        .map_err(log_error)?;
        let log_err = log
            .try_clone()
            .map_err(|error| AmError::FailedPrecondition(format!("{}: {error}", spec.id)))?;
        let mut command = Command::new(&self.shim);
        command
            .arg("shim")
            .arg("--pid-file")
            .arg(&pid_file)
            .arg("--exit-file")
            .arg(&exit_file)
            .arg("--")
            .args(&spec.command)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        let child = command.spawn().map_err(|error| {
            AmError::FailedPrecondition(format!(
                "{}: cannot start {}: {error}; check that the sluice binary is installed",
                spec.id,
                self.shim.display()
            ))
        })?;
        lock(&self.children).insert(spec.id.clone(), child);
        lock(&self.followed).insert(spec.id.clone());
        tracing::info!(executor = %spec.id, command = ?spec.command, "executor launched");
        Ok(())
    }

    fn observe(&self, id: &ExecutorId) -> Observation {
        let reaped = self.reap(id);
        if let Ok(text) = std::fs::read_to_string(self.file(id, "exit")) {
            return match text.trim().parse::<i32>() {
                Ok(code) if code < 128 => Observation::Exited(Exit::Code(code)),
                _ => Observation::Exited(Exit::Killed),
            };
        }
        match self.shim_process(id) {
            Some(shim) if shim.is_alive() => Observation::Running,
            Some(_) => match self.live_group(id) {
                // The shim was killed and left its command running: the command ends first.
                Some(group) => {
                    tracing::warn!(executor = %id, group, "its supervisor died: killing its orphaned processes");
                    if let Err(error) = ProcessId::signal_group_id(group, libc::SIGKILL) {
                        tracing::warn!(executor = %id, %error, "killing the orphaned processes failed");
                    }
                    Observation::Running
                }
                None => Observation::Exited(Exit::Killed),
            },
            // The shim has not written its pid yet: it runs if this AM holds it unreaped.
            None if !reaped => Observation::Running,
            None if self.file(id, "log").exists() => Observation::Exited(Exit::Killed),
            None => Observation::Unknown,
        }
    }

    /// Sends `signal` to the process group of a live executor: its shim's, which its command
    /// shares, also when the shim is gone and the command is not.
    fn signal(&self, id: &ExecutorId, signal: libc::c_int) {
        // The group is checked through the identity (pid and start time) of a live member.
        if let Some(group) = self.live_group(id)
            && let Err(error) = ProcessId::signal_group_id(group, signal)
        {
            tracing::warn!(executor = %id, signal, %error, "signalling the executor failed");
        }
    }
}

impl Launcher for LocalLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<()> {
        self.local.launch(spec)
    }

    fn adopt(&self, id: &ExecutorId) {
        lock(&self.local.followed).insert(id.clone());
    }

    fn terminate(&self, id: &ExecutorId) {
        self.local.signal(id, libc::SIGTERM);
    }

    fn kill(&self, id: &ExecutorId) {
        self.local.signal(id, libc::SIGKILL);
        self.local.reap(id);
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>> {
        self.local.events.take()
    }
}

/// `sluice shim`: runs `command` in the shim's process group, records the shim's identity in
/// `pid_file`, and writes the command's exit code to `exit_file` when it ends.
pub fn run_shim(pid_file: &Path, exit_file: &Path, command: &[String]) -> std::io::Result<i32> {
    let (program, arguments) = command.split_first().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command to run")
    })?;
    let me = ProcessId::current()?;
    let shim = format!("{} {}", me.pid, me.start_ticks);
    write_atomically(pid_file, &format!("{shim}\n"))?;
    let status = Command::new(program)
        .args(arguments)
        .spawn()
        .and_then(|mut child| {
            // The command's identity beside the shim's: should the shim be killed, the launcher finds
            // the command it left by it.
            let recorded = ProcessId::of(child.id()).and_then(|command| {
                write_atomically(
                    pid_file,
                    &format!("{shim} {} {}\n", command.pid, command.start_ticks),
                )
            });
            match recorded {
                // Gone already: `wait` tells how it ended.
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => {
                    // Unrecorded, it could outlive this shim unseen: it does not run.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(error);
                }
            }
            child.wait()
        });
    let code = match status {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
        }
        Err(error) => {
            eprintln!("sluice shim: cannot start {program}: {error}");
            127
        }
    };
    write_atomically(exit_file, &format!("{code}\n"))?;
    Ok(code)
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut file =
        files::create_temporary(&temporary, Sharing::Private).map_err(std::io::Error::other)?;
    file.write_all(text.as_bytes())?;
    std::fs::rename(&temporary, path)
}
