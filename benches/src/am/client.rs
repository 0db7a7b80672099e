//! Simulated node daemons: many per process, each speaking the real `DaemonService` protocol.
//!
//! # Implementation
//! Every daemon is a task on one current-thread runtime, and the daemons share a few gRPC channels
//! (HTTP/2 connections). A daemon registers, acquires tasks, then heartbeats once per
//! [`HEARTBEAT_INTERVAL_MS`], at a phase set by its node id so that the job's heartbeats are spread
//! evenly over the interval. Each heartbeat carries the counts of the tasks it holds, which grow as a
//! trainer would read them: [`ENQUEUED_PER_HEARTBEAT`] more rows enqueued, and what was enqueued one
//! heartbeat earlier consumed. A task whose consumed count reaches its length is done with that
//! heartbeat; the daemon then acquires more whenever it holds fewer than [`HELD_TASKS`] unfinished.
//! As `sluice-daemon` does, it keeps a finished task, reporting it in every heartbeat, until an
//! answer's journal mark says that the AM's record of its end is durable (or, with
//! [`AmClientArgs::let_finished_go`], as daemons without that protocol did, lets it go on the
//! answer to the heartbeat that reports it, which the AM then answers only once it is durable). It
//! obeys the commands in every reply as a daemon does: new tasks, stop requests (acknowledged),
//! fences (register again holding nothing), drains and shutdowns.
//!
//! The driver steers the process through its stdin and stdout, one line each way:
//! - the process prints a [`Registered`] line once every daemon has registered (or failed to);
//! - `start` begins the measurement window, `stop` ends it, and the process prints its
//!   [`ClientReport`] and exits.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::MissedTickBehavior;
use tonic::transport::{Channel, Endpoint};

use super::server::{HEARTBEAT_INTERVAL_MS, JOB_NAME};
use crate::error::{BenchError, Result};

/// Tasks a daemon keeps in hand; it acquires more when it holds fewer.
pub const HELD_TASKS: usize = 2;
/// Rows a daemon enqueues into its rings per task between two heartbeats.
pub const ENQUEUED_PER_HEARTBEAT: u64 = 40;
/// Registrations in flight at once per process, so that starting is a ramp rather than a storm.
const REGISTRATIONS_IN_FLIGHT: usize = 64;
/// The longest one call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Latencies are recorded in microseconds, up to this bound.
const MAX_LATENCY_US: u64 = 60_000_000;

/// The arguments of `sluice-bench am-client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmClientArgs {
    /// The AM's gRPC address, `host:port`.
    pub am: String,
    /// The node id of this process's first daemon.
    pub first_node: u64,
    /// How many daemons this process runs: node ids `first_node..first_node + nodes`.
    pub nodes: u64,
    /// Daemons in the whole job, which spreads the heartbeat phases.
    pub total_nodes: u64,
    /// gRPC channels (HTTP/2 connections) the daemons share.
    pub channels: usize,
    /// The daemons let a finished task go on the answer to the heartbeat that reports it, rather
    /// than keep it until the AM's journal mark says its end is durable.
    pub let_finished_go: bool,
}

/// The line a client prints once its daemons have registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// Daemons registered.
    pub registered: u64,
    /// Daemons whose registration failed.
    pub failed: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// What one client process measured over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientReport {
    /// Seconds between `start` and `stop`, as this process saw them.
    pub window_s: f64,
    /// Heartbeats answered within the window.
    pub heartbeats: u64,
    /// Heartbeats that failed within the window.
    pub heartbeat_errors: u64,
    /// Heartbeat latencies, as (microseconds, count) pairs of an HDR histogram.
    pub latency_us: Vec<(u64, u64)>,
    /// Acquire calls within the window.
    pub acquires: u64,
    /// Tasks that daemons finished within the window.
    pub tasks_done: u64,
    /// Refusals received within the window.
    pub refusals: u64,
    /// Fences received within the window.
    pub fences: u64,
    /// Daemons told to shut down, at any time.
    pub shutdowns: u64,
    /// The first failed call, at any time.
    pub first_error: Option<String>,
}

/// A new latency histogram: 1 µs to a minute, three significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("the bounds are valid")
}

/// Counts shared by the daemons of a process.
#[derive(Debug)]
struct Stats {
    window_start: Option<Instant>,
    latency_us: Histogram<u64>,
    heartbeats: u64,
    heartbeat_errors: u64,
    acquires: u64,
    tasks_done: u64,
    refusals: u64,
    fences: u64,
    shutdowns: u64,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            window_start: None,
            latency_us: latency_histogram(),
            heartbeats: 0,
            heartbeat_errors: 0,
            acquires: 0,
            tasks_done: 0,
            refusals: 0,
            fences: 0,
            shutdowns: 0,
            first_error: None,
        }
    }

    fn measuring(&self) -> bool {
        self.window_start.is_some()
    }

    fn begin(&mut self, now: Instant) {
        let (shutdowns, first_error) = (self.shutdowns, self.first_error.take());
        *self = Stats::new();
        self.shutdowns = shutdowns;
        self.first_error = first_error;
        self.window_start = Some(now);
    }

    fn report(&self, now: Instant) -> ClientReport {
        ClientReport {
            window_s: self
                .window_start
                .map_or(0.0, |start| (now - start).as_secs_f64()),
            heartbeats: self.heartbeats,
            heartbeat_errors: self.heartbeat_errors,
            latency_us: self
                .latency_us
                .iter_recorded()
                .map(|value| (value.value_iterated_to(), value.count_at_value()))
                .collect(),
            acquires: self.acquires,
            tasks_done: self.tasks_done,
            refusals: self.refusals,
            fences: self.fences,
            shutdowns: self.shutdowns,
            first_error: self.first_error.clone(),
        }
    }

    fn failed(&mut self, call: &str, node: u64, status: &tonic::Status) {
        if self.first_error.is_none() {
            self.first_error = Some(format!("{call} of node-{node}: {status}"));
        }
    }
}

/// The state one process's daemons share.
#[derive(Debug)]
struct Shared {
    stats: Mutex<Stats>,
    registered: watch::Sender<(u64, u64)>,
    registrations: Semaphore,
}

impl Shared {
    fn stats(&self) -> MutexGuard<'_, Stats> {
        self.stats
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A task a daemon holds, in split rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeldTask {
    task_id: u64,
    start: u64,
    end: u64,
    enqueued: u64,
    consumed: u64,
    /// Reported done: the generation of the AM first told, and the end of its journal then.
    reported_done: Option<(u64, u64)>,
}

impl HeldTask {
    fn rows(&self) -> u64 {
        self.end - self.start
    }

    /// One heartbeat later: what was enqueued was consumed, and more rows were enqueued.
    fn advance(&mut self) {
        self.consumed = self.enqueued;
        self.enqueued = (self.enqueued + ENQUEUED_PER_HEARTBEAT).min(self.rows());
    }

    fn done(&self) -> bool {
        self.consumed == self.rows()
    }
}

/// Whether a daemon goes on after a batch of commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Shutdown,
}

/// One simulated daemon.
#[derive(Debug)]
struct Daemon {
    node: u64,
    client: DaemonServiceClient<Channel>,
    shared: Arc<Shared>,
    held: Vec<HeldTask>,
    let_finished_go: bool,
}

impl Daemon {
    async fn register(&mut self) -> std::result::Result<Flow, tonic::Status> {
        self.held.clear();
        let reply = self
            .client
            .register(v1::RegisterRequest {
                node_by_host: false,
                node_id: self.node,
                job_id: JOB_NAME.to_owned(),
                hostname: format!("bench-{}", self.node),
                held: Vec::new(),
            })
            .await?
            .into_inner();
        Ok(self.obey(reply.commands).await)
    }

    /// Tasks held and not reported done.
    fn unfinished(&self) -> usize {
        self.held
            .iter()
            .filter(|task| task.reported_done.is_none())
            .count()
    }

    /// Lets go the tasks reported done whose record `mark` says durable.
    fn journal_marked(&mut self, mark: &v1::JournalMark) {
        self.held.retain(|task| {
            !matches!(task.reported_done,
                Some((generation, end)) if generation == mark.generation && mark.durable >= end)
        });
    }

    /// Acquires tasks when the daemon holds fewer than [`HELD_TASKS`] unfinished.
    async fn acquire_if_low(&mut self) -> Flow {
        let unfinished = self.unfinished();
        if unfinished >= HELD_TASKS {
            return Flow::Continue;
        }
        let request = v1::AcquireTasksRequest {
            node_id: self.node,
            max_tasks: (HELD_TASKS - unfinished) as u32,
            dry: true,
        };
        let reply = self.client.acquire_tasks(request).await;
        let reply = {
            let mut stats = self.shared.stats();
            stats.acquires += u64::from(stats.measuring());
            match reply {
                Ok(reply) => reply.into_inner(),
                Err(status) => {
                    stats.failed("acquire", self.node, &status);
                    return Flow::Continue;
                }
            }
        };
        if let Some(mark) = &reply.journal {
            self.journal_marked(mark);
        }
        self.obey(reply.commands).await
    }

    /// Sends one heartbeat with the counts of every task held, then acquires if needed.
    async fn beat(&mut self) -> Flow {
        for task in &mut self.held {
            task.advance();
        }
        let request = v1::HeartbeatRequest {
            hostname: String::new(),
            node_id: self.node,
            keeps_finished_until_durable: !self.let_finished_go,
            tuning: None,
            progress: self
                .held
                .iter()
                .map(|task| v1::TaskProgress {
                    task_id: task.task_id,
                    enqueued: task.enqueued,
                    consumed: task.consumed,
                    bad: Vec::new(),
                    sent: task.enqueued,
                    dropped: Vec::new(),
                })
                .collect(),
            stages: self.stage_stats(),
            rings: vec![v1::RingStats {
                rank: self.node as u32,
                used_bytes: 4 << 20,
                capacity_bytes: 256 << 20,
                trainer_wait_ns: 0,
                daemon_wait_ns: 0,
                reader_idle_ms: 0,
                reader_interval_ms: 0,
                ..v1::RingStats::default()
            }],
        };
        let sent = Instant::now();
        let reply = self.client.heartbeat(request).await;
        let latency = sent.elapsed();
        let reply = {
            let mut stats = self.shared.stats();
            match reply {
                Ok(reply) => {
                    if stats.measuring() {
                        stats.heartbeats += 1;
                        stats
                            .latency_us
                            .saturating_record(latency.as_micros().max(1) as u64);
                    }
                    reply.into_inner()
                }
                Err(status) => {
                    stats.heartbeat_errors += u64::from(stats.measuring());
                    stats.failed("heartbeat", self.node, &status);
                    return Flow::Continue;
                }
            }
        };
        let finished = self
            .held
            .iter()
            .filter(|task| task.done() && task.reported_done.is_none())
            .count() as u64;
        {
            let mut stats = self.shared.stats();
            stats.tasks_done += if stats.measuring() { finished } else { 0 };
        }
        match (&reply.journal, self.let_finished_go) {
            (Some(mark), false) => {
                for task in self.held.iter_mut().filter(|task| task.done()) {
                    if task
                        .reported_done
                        .is_none_or(|(generation, _)| generation != mark.generation)
                    {
                        task.reported_done = Some((mark.generation, mark.appended));
                    }
                }
                self.journal_marked(mark);
            }
            _ => self.held.retain(|task| !task.done()),
        }
        let commands = reply.commands;
        if self.obey(commands).await == Flow::Shutdown {
            return Flow::Shutdown;
        }
        self.acquire_if_low().await
    }

    /// Pipeline statistics as a daemon reports them: cumulative counters that grow.
    fn stage_stats(&self) -> Vec<v1::StageStats> {
        ["fetch", "decode", "shuffle", "write"]
            .into_iter()
            .map(|stage| v1::StageStats {
                stage: stage.to_owned(),
                busy_ns: 1_000_000,
                wait_ns: 500_000,
                rows: ENQUEUED_PER_HEARTBEAT,
                bytes: ENQUEUED_PER_HEARTBEAT * 64,
            })
            .collect()
    }

    /// Applies the commands of a reply in order, and of the replies to the calls they lead to.
    async fn obey(&mut self, commands: Vec<v1::Command>) -> Flow {
        let mut queue: VecDeque<v1::Command> = commands.into();
        while let Some(command) = queue.pop_front() {
            match command.command {
                Some(Cmd::Assign(assign)) => {
                    self.held
                        .extend(assign.tasks.into_iter().map(|task| HeldTask {
                            task_id: task.task_id,
                            start: task.start,
                            end: task.end,
                            enqueued: 0,
                            consumed: 0,
                            reported_done: None,
                        }));
                }
                Some(Cmd::Stop(stop)) => {
                    let Some(task) = self
                        .held
                        .iter_mut()
                        .find(|task| task.task_id == stop.task_id)
                    else {
                        continue;
                    };
                    // Rows already in a ring cannot be taken back: stop at the row asked for or
                    // after what was enqueued.
                    let stop_row = stop.row.max(task.start + task.enqueued).min(task.end);
                    task.end = stop_row;
                    let reply = self
                        .client
                        .ack_stop(v1::AckStopRequest {
                            node_id: self.node,
                            task_id: stop.task_id,
                            stop_row,
                        })
                        .await;
                    match reply {
                        Ok(reply) => queue.extend(reply.into_inner().commands),
                        Err(status) => self.shared.stats().failed("ack stop", self.node, &status),
                    }
                }
                Some(Cmd::Shutdown(_)) => {
                    self.shared.stats().shutdowns += 1;
                    return Flow::Shutdown;
                }
                // The bench never scales a role: a release would be answered as a fence is.
                Some(Cmd::Fence(_) | Cmd::Release(_)) => {
                    {
                        let mut stats = self.shared.stats();
                        stats.fences += u64::from(stats.measuring());
                    }
                    self.held.clear();
                    let reply = self
                        .client
                        .register(v1::RegisterRequest {
                            node_by_host: false,
                            node_id: self.node,
                            job_id: JOB_NAME.to_owned(),
                            hostname: format!("bench-{}", self.node),
                            held: Vec::new(),
                        })
                        .await;
                    match reply {
                        Ok(reply) => queue.extend(reply.into_inner().commands),
                        Err(status) => self.shared.stats().failed("register", self.node, &status),
                    }
                }
                Some(Cmd::Refuse(_)) => {
                    let mut stats = self.shared.stats();
                    stats.refusals += u64::from(stats.measuring());
                }
                // The bench's job has no data.even_batches: no count to pad to.
                Some(Cmd::Settled(_)) | None => {}
            }
        }
        Flow::Continue
    }
}

/// Runs one daemon: registers, then heartbeats at its phase of every interval until shut down.
async fn run_daemon(mut daemon: Daemon, first_beat: tokio::time::Instant) {
    let shared = Arc::clone(&daemon.shared);
    let registered = {
        let _permit = shared.registrations.acquire().await;
        match daemon.register().await {
            Ok(flow) => Ok(flow),
            Err(status) => {
                daemon
                    .shared
                    .stats()
                    .failed("register", daemon.node, &status);
                Err(())
            }
        }
    };
    daemon
        .shared
        .registered
        .send_modify(|(ok, failed)| match registered {
            Ok(_) => *ok += 1,
            Err(()) => *failed += 1,
        });
    if registered != Ok(Flow::Continue) || daemon.acquire_if_low().await == Flow::Shutdown {
        return;
    }
    let interval = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
    let mut ticker = tokio::time::interval_at(first_beat, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        if daemon.beat().await == Flow::Shutdown {
            return;
        }
    }
}

/// Runs `sluice-bench am-client`: the daemons of one process, steered through stdin and stdout.
pub fn client_main(args: &AmClientArgs) -> Result<()> {
    if args.nodes == 0 || args.channels == 0 || args.first_node + args.nodes > args.total_nodes {
        return Err(BenchError::InvalidAmArgs {
            reason: format!(
                "am-client: nodes {}..{} of {} over {} channels is not a range of the job's nodes",
                args.first_node,
                args.first_node + args.nodes,
                args.total_nodes,
                args.channels
            ),
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::AmIo {
            operation: "starting the client runtime".to_owned(),
            source,
        })?;
    runtime.block_on(run_clients(args))
}

async fn run_clients(args: &AmClientArgs) -> Result<()> {
    let endpoint = Endpoint::from_shared(format!("http://{}", args.am))
        .map_err(|error| BenchError::InvalidAmArgs {
            reason: format!("am-client: --am {:?} is not an address: {error}", args.am),
        })?
        .tcp_nodelay(true)
        .timeout(CALL_TIMEOUT)
        .connect_timeout(CALL_TIMEOUT);
    let mut channels = Vec::with_capacity(args.channels);
    for _ in 0..args.channels {
        channels.push(
            endpoint
                .connect()
                .await
                .map_err(|error| BenchError::AmSetup {
                    operation: format!("connecting to the AM at {}", args.am),
                    reason: error.to_string(),
                })?,
        );
    }
    let (registered, mut registrations) = watch::channel((0u64, 0u64));
    let shared = Arc::new(Shared {
        stats: Mutex::new(Stats::new()),
        registered,
        registrations: Semaphore::new(REGISTRATIONS_IN_FLIGHT),
    });
    let origin = tokio::time::Instant::now() + Duration::from_millis(HEARTBEAT_INTERVAL_MS);
    let mut daemons = tokio::task::JoinSet::new();
    for node in args.first_node..args.first_node + args.nodes {
        let phase = Duration::from_micros(HEARTBEAT_INTERVAL_MS * 1000 * node / args.total_nodes);
        let daemon = Daemon {
            node,
            client: DaemonServiceClient::new(channels[node as usize % channels.len()].clone()),
            shared: Arc::clone(&shared),
            held: Vec::new(),
            let_finished_go: args.let_finished_go,
        };
        daemons.spawn(run_daemon(daemon, origin + phase));
    }
    let nodes = args.nodes;
    let (ok, failed) = *registrations
        .wait_for(|(ok, failed)| ok + failed == nodes)
        .await
        .map_err(|_| BenchError::AmSetup {
            operation: "registering the daemons".to_owned(),
            reason: "every daemon ended before registering".to_owned(),
        })?;
    let first_error = shared.stats().first_error.clone();
    print_line(&Registered {
        registered: ok,
        failed,
        first_error,
    })?;
    let mut control = control_lines();
    while let Some(line) = control.recv().await {
        match line.trim() {
            "start" => shared.stats().begin(Instant::now()),
            "stop" => {
                let report = shared.stats().report(Instant::now());
                print_line(&report)?;
                break;
            }
            other => {
                return Err(BenchError::InvalidAmArgs {
                    reason: format!(
                        "am-client: unknown control line {other:?}; expected start or stop"
                    ),
                });
            }
        }
    }
    daemons.abort_all();
    Ok(())
}

/// Lines from stdin, read on a thread of their own; the channel closes at end of input.
fn control_lines() -> mpsc::UnboundedReceiver<String> {
    let (sender, receiver) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

fn print_line(value: &impl Serialize) -> Result<()> {
    let line = serde_json::to_string(value).expect("a report encodes as JSON");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|source| BenchError::AmIo {
            operation: "printing to the driver".to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_consumed_a_heartbeat_behind_what_is_enqueued_until_done() {
        let mut sut = HeldTask {
            task_id: 1,
            start: 200,
            end: 300,
            enqueued: 0,
            consumed: 0,
            reported_done: None,
        };
        let mut counts = Vec::new();
        while !sut.done() {
            sut.advance();
            counts.push((sut.enqueued, sut.consumed));
        }
        assert_eq!(counts, [(40, 0), (80, 40), (100, 80), (100, 100)]);
    }

    #[test]
    fn a_window_counts_only_what_happened_inside_it() {
        let mut sut = Stats::new();
        sut.shutdowns = 1;
        sut.heartbeats = 5;
        let start = Instant::now();
        sut.begin(start);
        sut.heartbeats += 2;
        sut.latency_us.saturating_record(1500);
        sut.latency_us.saturating_record(1500);
        let report = sut.report(start + Duration::from_secs(2));
        assert_eq!(report.heartbeats, 2);
        assert_eq!(report.shutdowns, 1, "shutdowns count for the whole run");
        assert_eq!(report.window_s, 2.0);
        assert_eq!(report.latency_us.len(), 1);
        assert_eq!(report.latency_us[0].1, 2);
        assert!((1499..=1501).contains(&report.latency_us[0].0));
    }
}
