//! `sluice-bench am`: the application master under many simulated node daemons, its recovery
//! time, and its memory for a large job.
//!
//! # Implementation
//! The driver re-executes itself (`sluice-bench`) for every process it needs:
//! - the AM (`sluice-bench am-server`, see [`server`]), pinned with `taskset` to the first core this
//!   process may use. It serves a job of `--tasks` tasks through the real `AmServer`, with its
//!   journal in a scratch directory on the temp dir's file system;
//! - client processes (`sluice-bench am-client`, see [`client`]), pinned to the second core, that
//!   run the `--executors` daemons between them.
//!
//! One run measures, in order:
//! 1. **The journaled AM.** Once every daemon has registered and [`WARMUP`] has passed, the window
//!    of `--seconds` opens: the clients record every heartbeat's latency in an HDR histogram, and
//!    the driver reads the AM's CPU time (`/proc/<pid>/stat`) at both ends of the window and its
//!    memory (`/proc/<pid>/status`) at the end. With `--snapshot-interval-s N` the AM snapshots its
//!    journal every `N` seconds (or back to back, if one takes longer), so the window measures
//!    heartbeats while snapshots are taken; by default (every 300 s) none falls in it.
//! 2. **Recovery.** The clients stop, the AM is killed with SIGKILL, and a new AM starts on the same
//!    journal; the time from spawning it until it answers `Status` is the recovery time.
//! 3. **The baseline**: the same AM and load without a journal, so the journal's share shows as
//!    a ratio measured in the same run.
//! 4. **Memory.** An AM with `--memory-tasks` tasks and no daemons: its resident memory once it
//!    answers `Status`. Then one daemon registers and takes a task, the AM is killed, and the peak
//!    resident memory of the AM that takes the job over (which copies the task table while it
//!    restores it) is measured too.

pub mod client;
pub mod procfs;
pub mod report;
pub mod server;

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sluice_proto::v1;
use sluice_proto::v1::control_service_client::ControlServiceClient;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;

use crate::affinity::allowed_cpus;
use crate::error::{BenchError, Result};
pub use client::{AmClientArgs, ClientReport, Registered, client_main};
pub use report::{AmBenchReport, WindowFigures};
pub use server::{AmServerArgs, serve_synthetic_am};

/// Client processes that share the daemons.
const CLIENT_PROCESSES: u64 = 2;
/// gRPC channels per client process.
const CHANNELS_PER_CLIENT: usize = 4;
/// Time after every daemon registered before the window opens: first tasks acquired, heartbeats
/// at their phases.
pub const WARMUP: Duration = Duration::from_secs(2);
/// The longest an AM may take to start serving: planning, and replaying a long journal.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest the daemons may take to register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest a client may take to report once the window closes.
const REPORT_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a failed process's stderr an error carries.
const STDERR_TAIL_BYTES: u64 = 2000;

/// How to start the benchmark's processes: an executable with the hidden subcommands
/// `am-server` and `am-client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmPeers {
    /// The `sluice-bench` executable.
    pub program: PathBuf,
}

impl AmPeers {
    /// Runs the current executable, `sluice-bench`.
    pub fn current_exe() -> std::io::Result<AmPeers> {
        Ok(AmPeers {
            program: std::env::current_exe()?,
        })
    }
}

/// What `sluice-bench am` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmBenchOptions {
    /// Simulated node daemons.
    pub executors: u32,
    /// Tasks in the job.
    pub tasks: u64,
    /// Seconds in the measurement window.
    pub seconds: u64,
    /// Tasks in the job of the memory measurement.
    pub memory_tasks: u64,
    /// Seconds between the journaled AM's snapshots; none keeps the AM's default (300 s).
    pub snapshot_interval_s: Option<u64>,
    /// The simulated daemons let a finished task go on the answer to the heartbeat that reports
    /// it, rather than keep it until the AM's journal mark says its end is durable.
    pub daemons_let_finished_go: bool,
    /// How to start the processes.
    pub peers: AmPeers,
}

impl AmBenchOptions {
    /// 10,000 executors, a million tasks, a 30 s window, and ten million tasks for memory.
    pub fn new(peers: AmPeers) -> AmBenchOptions {
        AmBenchOptions {
            executors: 10_000,
            tasks: 1_000_000,
            seconds: 30,
            memory_tasks: 10_000_000,
            snapshot_interval_s: None,
            daemons_let_finished_go: false,
            peers,
        }
    }

    fn validate(&self) -> Result<()> {
        let problem = if self.executors == 0 {
            Some("--executors is 0; simulate at least one daemon")
        } else if self.tasks == 0 || self.memory_tasks == 0 {
            Some("--tasks and --memory-tasks must be at least 1")
        } else if self.tasks > u64::from(u32::MAX) || self.memory_tasks > u64::from(u32::MAX) {
            Some("--tasks and --memory-tasks must fit an epoch: at most 4294967295")
        } else if self.seconds == 0 {
            Some("--seconds is 0; measure for at least one second")
        } else if self.snapshot_interval_s == Some(0) {
            Some("--snapshot-interval-s is 0; snapshot at most once a second")
        } else {
            None
        };
        match problem {
            Some(reason) => Err(BenchError::InvalidAmArgs {
                reason: reason.to_owned(),
            }),
            None => Ok(()),
        }
    }
}

/// Runs `sluice-bench am`; `progress` receives a line per step.
pub fn run_am_bench(
    options: &AmBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<AmBenchReport> {
    options.validate()?;
    let placement = Placement::detect()?;
    progress(&placement.note);
    let scratch = tempfile::Builder::new()
        .prefix("sluice-bench-am-")
        .tempdir()
        .map_err(|source| BenchError::AmIo {
            operation: "creating a scratch directory in the temp dir".to_owned(),
            source,
        })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::AmIo {
            operation: "starting the driver's runtime".to_owned(),
            source,
        })?;
    let bench = Bench {
        options,
        placement: &placement,
        scratch: scratch.path(),
        runtime: &runtime,
    };

    let journal = scratch.path().join("journal");
    let (mut am, address) = bench.start_am("AM", options.tasks, Some(&journal))?;
    progress(&format!(
        "journaled AM serving on {address}; starting the daemons"
    ));
    let journaled = bench.run_window(&mut am, address, progress)?;
    progress(&format!(
        "journaled AM: heartbeat p99 {:.2} ms, {:.0} heartbeats/s, cpu {:.1}%",
        journaled.heartbeat_p99_ms, journaled.heartbeats_per_s, journaled.am_cpu_percent
    ));

    am.kill()?;
    let journal_bytes = directory_bytes(&journal)?;
    let restarted = Instant::now();
    let (mut recovered, address) = bench.start_am("recovered AM", options.tasks, Some(&journal))?;
    let status = bench.status(address, &recovered)?;
    let recovery = restarted.elapsed();
    let counts = status.tasks.unwrap_or_default();
    if counts.pending + counts.in_flight + counts.done + counts.failed != options.tasks
        || counts.done == 0
    {
        return Err(recovered.failure(&format!(
            "recovered a table of {} pending, {} in flight and {} done tasks, not the {} tasks of the job with the tasks done before the kill",
            counts.pending, counts.in_flight, counts.done, options.tasks
        )));
    }
    let recovery_memory = procfs::memory(recovered.pid())?;
    recovered.kill()?;
    progress(&format!(
        "recovery: {:.0} ms from a journal of {journal_bytes} bytes ({} tasks done)",
        recovery.as_secs_f64() * 1e3,
        counts.done
    ));

    let (mut am, address) = bench.start_am("AM without journal", options.tasks, None)?;
    let baseline = bench.run_window(&mut am, address, progress)?;
    am.kill()?;
    progress(&format!(
        "AM without journal: heartbeat p99 {:.2} ms, cpu {:.1}%",
        baseline.heartbeat_p99_ms, baseline.am_cpu_percent
    ));

    let memory_journal = scratch.path().join("memory-journal");
    let (mut am, address) = bench.start_am("AM", options.memory_tasks, Some(&memory_journal))?;
    let status = bench.status(address, &am)?;
    let pending = status.tasks.unwrap_or_default().pending;
    if pending != options.memory_tasks {
        return Err(am.failure(&format!(
            "serves {pending} pending tasks, not the {} asked for",
            options.memory_tasks
        )));
    }
    let memory = procfs::memory(am.pid())?;
    bench.take_a_task(address, &am)?;
    am.kill()?;
    let (mut taken_over, address) =
        bench.start_am("recovered AM", options.memory_tasks, Some(&memory_journal))?;
    bench.status(address, &taken_over)?;
    let takeover_memory = procfs::memory(taken_over.pid())?;
    taken_over.kill()?;
    progress(&format!(
        "memory: {} tasks in {} bytes resident, {} at the peak of a takeover",
        options.memory_tasks, memory.rss_bytes, takeover_memory.hwm_bytes
    ));

    Ok(AmBenchReport {
        executors: options.executors,
        tasks: options.tasks,
        window_s: options.seconds as f64,
        snapshot_interval_s: options.snapshot_interval_s,
        daemons_let_finished_go: options.daemons_let_finished_go,
        journaled,
        recovery_ms: recovery.as_secs_f64() * 1e3,
        journal_bytes,
        recovery_hwm_bytes: recovery_memory.hwm_bytes,
        memory_tasks: options.memory_tasks,
        memory_rss_bytes: memory.rss_bytes,
        memory_hwm_bytes: memory.hwm_bytes,
        memory_takeover_hwm_bytes: takeover_memory.hwm_bytes,
        baseline_no_journal: baseline,
        load_average: crate::command::load_average().ok_or_else(|| BenchError::AmSetup {
            operation: "reading /proc/loadavg".to_owned(),
            reason: "no load average could be read".to_owned(),
        })?,
        placement: placement.note,
    })
}

/// The cores the AM and the clients run on, and how to pin them.
#[derive(Debug, Clone)]
struct Placement {
    taskset: Option<PathBuf>,
    am: Option<usize>,
    clients: Option<usize>,
    note: String,
}

impl Placement {
    /// The AM on the first core this process may use, the clients on the second, through
    /// `taskset`; unpinned, with a note, when `taskset` is missing or only one core is allowed.
    fn detect() -> Result<Placement> {
        let cpus = allowed_cpus().map_err(|source| BenchError::AmIo {
            operation: "reading the cpus this process may use".to_owned(),
            source,
        })?;
        let taskset = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|directory| directory.join("taskset"))
                .find(|candidate| candidate.is_file())
        });
        Ok(match (taskset, cpus.as_slice()) {
            (Some(taskset), [am, clients, ..]) => Placement {
                taskset: Some(taskset),
                am: Some(*am),
                clients: Some(*clients),
                note: format!("AM pinned to cpu {am}, clients to cpu {clients}"),
            },
            (None, _) => Placement {
                taskset: None,
                am: None,
                clients: None,
                note: "taskset not found (install util-linux to pin): AM and clients unpinned"
                    .to_owned(),
            },
            (Some(_), _) => Placement {
                taskset: None,
                am: None,
                clients: None,
                note: "one cpu available: AM and clients unpinned".to_owned(),
            },
        })
    }

    /// `program args...`, under `taskset -c cpu` when pinning.
    fn command(&self, cpu: Option<usize>, program: &Path, args: Vec<OsString>) -> Command {
        match (&self.taskset, cpu) {
            (Some(taskset), Some(cpu)) => {
                let mut command = Command::new(taskset);
                command
                    .arg("-c")
                    .arg(cpu.to_string())
                    .arg(program)
                    .args(args);
                command
            }
            _ => {
                let mut command = Command::new(program);
                command.args(args);
                command
            }
        }
    }
}

/// What every step of a run needs.
struct Bench<'run> {
    options: &'run AmBenchOptions,
    placement: &'run Placement,
    scratch: &'run Path,
    runtime: &'run tokio::runtime::Runtime,
}

impl Bench<'_> {
    /// Starts an AM serving a job of `tasks` tasks and returns it with its address.
    fn start_am(
        &self,
        role: &str,
        tasks: u64,
        journal: Option<&Path>,
    ) -> Result<(Process, SocketAddr)> {
        let mut args: Vec<OsString> = vec![
            "am-server".into(),
            "--tasks".into(),
            tasks.to_string().into(),
            "--executors".into(),
            self.options.executors.to_string().into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        if let Some(journal) = journal {
            args.extend(["--checkpoint".into(), journal.as_os_str().to_owned()]);
            if let Some(seconds) = self.options.snapshot_interval_s {
                args.extend(["--snapshot-interval-s".into(), seconds.to_string().into()]);
            }
        }
        let command = self
            .placement
            .command(self.placement.am, &self.options.peers.program, args);
        let mut am = Process::spawn(role, command, &self.scratch.join("am.stderr"))?;
        let line = am.line(START_TIMEOUT, "its address")?;
        let address = line
            .strip_prefix("serving on ")
            .and_then(|address| address.parse().ok())
            .ok_or_else(|| am.failure(&format!("printed {line:?}, not `serving on ADDR`")))?;
        Ok((am, address))
    }

    /// Calls `Status` on the AM at `address`.
    fn status(&self, address: SocketAddr, am: &Process) -> Result<v1::StatusReply> {
        self.runtime
            .block_on(async {
                let mut client = ControlServiceClient::connect(format!("http://{address}"))
                    .await
                    .map_err(|error| error.to_string())?;
                client
                    .status(v1::StatusRequest {})
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| status.to_string())
            })
            .map_err(|reason| am.failure(&format!("did not answer Status: {reason}")))
    }

    /// Registers node 0 and acquires a task, so that the AM's journal holds entries and a new AM
    /// takes the job over from it (an AM whose journal is empty starts afresh).
    fn take_a_task(&self, address: SocketAddr, am: &Process) -> Result<()> {
        self.runtime
            .block_on(async {
                let mut client = DaemonServiceClient::connect(format!("http://{address}"))
                    .await
                    .map_err(|error| error.to_string())?;
                client
                    .register(v1::RegisterRequest {
                        node_by_host: false,
                        node_id: 0,
                        job_id: server::JOB_NAME.to_owned(),
                        hostname: "bench-0".to_owned(),
                        held: Vec::new(),
                    })
                    .await
                    .map_err(|status| status.to_string())?;
                client
                    .acquire_tasks(v1::AcquireTasksRequest {
                        node_id: 0,
                        max_tasks: 1,
                        dry: true,
                    })
                    .await
                    .map_err(|status| status.to_string())
            })
            .map(drop)
            .map_err(|reason| am.failure(&format!("did not hand out a task: {reason}")))
    }

    /// Starts the daemons against the AM, measures one window, and stops them.
    fn run_window(
        &self,
        am: &mut Process,
        address: SocketAddr,
        progress: &mut dyn FnMut(&str),
    ) -> Result<WindowFigures> {
        let executors = u64::from(self.options.executors);
        let processes = CLIENT_PROCESSES.min(executors);
        let mut clients = Vec::with_capacity(processes as usize);
        for index in 0..processes {
            let first_node = executors * index / processes;
            let nodes = executors * (index + 1) / processes - first_node;
            let mut args: Vec<OsString> = vec![
                "am-client".into(),
                "--am".into(),
                address.to_string().into(),
                "--first-node".into(),
                first_node.to_string().into(),
                "--nodes".into(),
                nodes.to_string().into(),
                "--total-nodes".into(),
                executors.to_string().into(),
                "--channels".into(),
                CHANNELS_PER_CLIENT.to_string().into(),
            ];
            if self.options.daemons_let_finished_go {
                args.push("--let-finished-go".into());
            }
            let command =
                self.placement
                    .command(self.placement.clients, &self.options.peers.program, args);
            let stderr = self.scratch.join(format!("client-{index}.stderr"));
            clients.push(Process::spawn(
                &format!("client {index}"),
                command,
                &stderr,
            )?);
        }
        let registering = Instant::now();
        for client in &mut clients {
            let line = client.line(REGISTER_TIMEOUT, "that its daemons registered")?;
            let registered: Registered = serde_json::from_str(&line)
                .map_err(|error| client.failure(&format!("printed {line:?}: {error}")))?;
            if registered.failed > 0 {
                return Err(client.failure(&format!(
                    "could not register {} of its daemons: {}",
                    registered.failed,
                    registered.first_error.unwrap_or_default()
                )));
            }
        }
        progress(&format!(
            "{executors} daemons registered in {:.1} s; warming up for {WARMUP:?}",
            registering.elapsed().as_secs_f64()
        ));
        std::thread::sleep(WARMUP);
        am.check_alive("before the window")?;
        let cpu_before = procfs::cpu_time(am.pid())?;
        let waits_before = procfs::cpu_waits(am.pid())?;
        let opened = Instant::now();
        for client in &mut clients {
            client.send("start")?;
        }
        std::thread::sleep(Duration::from_secs(self.options.seconds));
        for client in &mut clients {
            client.send("stop")?;
        }
        // Read before anything else, and before the AM is known to be alive: a zombie's CPU time
        // can still be read, and the clients' reports tell why an AM exited.
        let cpu = procfs::cpu_time(am.pid()).map(|cpu| cpu.saturating_sub(cpu_before));
        let waited = procfs::cpu_waits(am.pid())
            .map(|waits_after| procfs::waited_between(&waits_before, &waits_after));
        let window = opened.elapsed();
        let memory = procfs::memory(am.pid());
        let mut reports = Vec::with_capacity(clients.len());
        for client in &mut clients {
            let line = client.line(REPORT_TIMEOUT, "its report")?;
            let report: ClientReport = serde_json::from_str(&line)
                .map_err(|error| client.failure(&format!("printed {line:?}: {error}")))?;
            reports.push(report);
        }
        for client in clients {
            client.finish()?;
        }
        job_outlasted_the_window(&reports)?;
        am.check_alive("during the window")?;
        window_figures(
            &reports,
            AmUsage {
                cpu: cpu?,
                waited: waited?,
                memory: memory?,
            },
            window,
        )
    }
}

/// Fails when daemons were shut down: the job ended before the window closed, so the window did
/// not measure a running job.
fn job_outlasted_the_window(reports: &[ClientReport]) -> Result<()> {
    if reports.iter().any(|report| report.shutdowns > 0) {
        return Err(BenchError::InvalidAmArgs {
            reason: "the job's tasks were all consumed before the window closed, so its daemons were shut down; raise --tasks or lower --seconds".to_owned(),
        });
    }
    Ok(())
}

/// What the AM used over a window.
#[derive(Debug, Clone, Copy)]
struct AmUsage {
    /// CPU time, all threads.
    cpu: Duration,
    /// Time its threads were runnable but waiting for a CPU, all threads.
    waited: Duration,
    /// Memory at the end.
    memory: procfs::Memory,
}

/// Combines the clients' reports with what the AM used over the window.
fn window_figures(
    reports: &[ClientReport],
    usage: AmUsage,
    window: Duration,
) -> Result<WindowFigures> {
    let mut latency_us: Histogram<u64> = client::latency_histogram();
    let mut heartbeats_per_s = 0.0;
    let mut tasks_done_per_s = 0.0;
    let mut heartbeat_errors = 0;
    job_outlasted_the_window(reports)?;
    for report in reports {
        for &(value, count) in &report.latency_us {
            latency_us.saturating_record_n(value, count);
        }
        heartbeats_per_s += report.heartbeats as f64 / report.window_s;
        tasks_done_per_s += report.tasks_done as f64 / report.window_s;
        heartbeat_errors += report.heartbeat_errors;
    }
    if latency_us.is_empty() {
        let first_error = reports
            .iter()
            .find_map(|report| report.first_error.clone())
            .unwrap_or_else(|| "none".to_owned());
        return Err(BenchError::AmSetup {
            operation: "measuring heartbeats".to_owned(),
            reason: format!(
                "no heartbeat was answered within the window; first failed call: {first_error}"
            ),
        });
    }
    let ms = |us: u64| us as f64 / 1e3;
    Ok(WindowFigures {
        heartbeat_p50_ms: ms(latency_us.value_at_quantile(0.50)),
        heartbeat_p99_ms: ms(latency_us.value_at_quantile(0.99)),
        heartbeat_max_ms: ms(latency_us.max()),
        heartbeats_per_s,
        heartbeat_errors,
        tasks_done_per_s,
        am_cpu_percent: usage.cpu.as_secs_f64() * 100.0 / window.as_secs_f64(),
        am_cpu_wait_percent: usage.waited.as_secs_f64() * 100.0 / window.as_secs_f64(),
        am_rss_bytes: usage.memory.rss_bytes,
        am_hwm_bytes: usage.memory.hwm_bytes,
    })
}

/// The bytes of every file under `directory`.
fn directory_bytes(directory: &Path) -> Result<u64> {
    let io_error = |source| BenchError::AmIo {
        operation: format!("measuring the journal under {}", directory.display()),
        source,
    };
    let mut total = 0;
    for entry in std::fs::read_dir(directory).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let metadata = entry.metadata().map_err(io_error)?;
        total += if metadata.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}

/// A process of the benchmark, killed when dropped, whose stdout arrives line by line.
struct Process {
    role: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: PathBuf,
}

impl Process {
    fn spawn(role: &str, mut command: Command, stderr: &Path) -> Result<Process> {
        let io_error = |operation: String| {
            move |source| BenchError::AmIo {
                operation: operation.clone(),
                source,
            }
        };
        let stderr_file =
            File::create(stderr).map_err(io_error(format!("creating {}", stderr.display())))?;
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .map_err(io_error(format!("starting the {role} process {command:?}")))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Process {
            role: role.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: stderr.to_owned(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line the process prints, waiting at most `timeout`.
    fn line(&mut self, timeout: Duration, waiting_for: &str) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(self.failure(&format!("did not print {waiting_for} within {timeout:?}")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map_or_else(
                    |error| format!("status unknown: {error}"),
                    |status| status.to_string(),
                );
                Err(self.failure(&format!("exited ({status}) before printing {waiting_for}")))
            }
        }
    }

    /// Writes one line to the process's stdin.
    fn send(&mut self, line: &str) -> Result<()> {
        let written = match &mut self.stdin {
            Some(stdin) => writeln!(stdin, "{line}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin was closed")),
        };
        written.map_err(|error| self.failure(&format!("could not be sent {line:?}: {error}")))
    }

    fn check_alive(&mut self, when: &str) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.failure(&format!("exited ({status}) {when}"))),
            Err(error) => Err(self.failure(&format!("could not be checked {when}: {error}"))),
        }
    }

    /// Kills the process with SIGKILL, as a crash would end it, and reaps it.
    fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .and_then(|()| self.child.wait().map(drop))
            .map_err(|source| BenchError::AmIo {
                operation: format!("killing the {} process", self.role),
                source,
            })
    }

    /// Closes stdin and waits for the process to exit by itself, killing it after
    /// [`REPORT_TIMEOUT`].
    fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + REPORT_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(self.failure(&format!("exited ({status})"))),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    return Err(self.failure(&format!("did not exit within {REPORT_TIMEOUT:?}")));
                }
                Err(error) => {
                    return Err(self.failure(&format!("could not be waited for: {error}")));
                }
            }
        }
    }

    /// An error about this process, with the end of its stderr.
    fn failure(&self, problem: &str) -> BenchError {
        BenchError::AmProcess {
            role: self.role.clone(),
            problem: problem.to_owned(),
            stderr: stderr_tail(&self.stderr),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The process may have exited already; then there is nothing to kill.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a file, or why it could not be read.
fn stderr_tail(path: &Path) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let length = file.metadata()?.len();
        file.seek(SeekFrom::Start(length.saturating_sub(STDERR_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_owned())
    };
    match read() {
        Ok(text) if text.is_empty() => "(nothing)".to_owned(),
        Ok(text) => text,
        Err(error) => format!("(unreadable: {error})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client_report(latencies_us: &[u64], heartbeats: u64, window_s: f64) -> ClientReport {
        let mut histogram = client::latency_histogram();
        for latency in latencies_us {
            histogram.record(*latency).expect("in range");
        }
        ClientReport {
            window_s,
            heartbeats,
            heartbeat_errors: 0,
            latency_us: histogram
                .iter_recorded()
                .map(|value| (value.value_iterated_to(), value.count_at_value()))
                .collect(),
            acquires: 0,
            tasks_done: 10,
            refusals: 0,
            fences: 0,
            shutdowns: 0,
            first_error: None,
        }
    }

    fn usage(cpu: Duration) -> AmUsage {
        AmUsage {
            cpu,
            waited: cpu / 5,
            memory: procfs::Memory {
                rss_bytes: 1 << 20,
                hwm_bytes: 2 << 20,
            },
        }
    }

    #[test]
    fn reports_of_several_clients_merge_into_one_distribution() {
        let fast: Vec<u64> = vec![1000; 99];
        let reports = [
            client_report(&fast, 99, 2.0),
            client_report(&[20_000], 1, 2.0),
        ];
        let sut = window_figures(
            &reports,
            usage(Duration::from_millis(500)),
            Duration::from_secs(2),
        )
        .expect("figures");
        assert!((sut.heartbeat_p50_ms - 1.0).abs() < 0.01, "{sut:?}");
        assert!((sut.heartbeat_p99_ms - 1.0).abs() < 0.01, "{sut:?}");
        assert!((sut.heartbeat_max_ms - 20.0).abs() < 0.02, "{sut:?}");
        assert_eq!(sut.heartbeats_per_s, 50.0);
        assert_eq!(sut.tasks_done_per_s, 10.0);
        assert_eq!(sut.am_cpu_percent, 25.0);
        assert_eq!(sut.am_cpu_wait_percent, 5.0);
        assert_eq!(sut.am_rss_bytes, 1 << 20);
    }

    #[test]
    fn a_window_without_heartbeats_is_an_error_naming_the_first_failure() {
        let mut report = client_report(&[], 0, 1.0);
        report.first_error = Some("heartbeat of node-3: connection refused".to_owned());
        let error = window_figures(&[report], usage(Duration::ZERO), Duration::from_secs(1))
            .expect_err("no heartbeats");
        assert!(error.to_string().contains("node-3"), "{error}");
    }

    #[test]
    fn a_job_that_ended_inside_the_window_asks_for_more_tasks() {
        let mut report = client_report(&[1000], 1, 1.0);
        report.shutdowns = 3;
        let error = window_figures(&[report], usage(Duration::ZERO), Duration::from_secs(1))
            .expect_err("job over");
        assert!(error.to_string().contains("raise --tasks"), "{error}");
    }

    #[test]
    fn options_out_of_range_are_refused_with_the_flag_to_fix() {
        let peers = AmPeers {
            program: PathBuf::from("/bin/false"),
        };
        let mut sut = AmBenchOptions::new(peers);
        sut.executors = 0;
        assert!(
            sut.validate()
                .expect_err("0 executors")
                .to_string()
                .contains("--executors")
        );
        sut.executors = 1;
        sut.seconds = 0;
        assert!(
            sut.validate()
                .expect_err("0 seconds")
                .to_string()
                .contains("--seconds")
        );
        sut.seconds = 1;
        sut.snapshot_interval_s = Some(0);
        assert!(
            sut.validate()
                .expect_err("0 s between snapshots")
                .to_string()
                .contains("--snapshot-interval-s")
        );
        sut.snapshot_interval_s = Some(1);
        sut.tasks = 1 << 33;
        assert!(
            sut.validate()
                .expect_err("too many")
                .to_string()
                .contains("--tasks")
        );
    }
}
