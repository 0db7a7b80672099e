//! The daemon's session with the job's AM: it connects, registers, and makes the calls of the serve
//! loop (heartbeats, task requests, stop acknowledgements, failure reports), each one tried again
//! while the AM is unavailable, up to the timeout. Every answer renews the daemon's [`Lease`],
//! except one that fences the daemon.
//!
//! An AM that stops answering may have been started again on another host: while a call fails,
//! the session reads the address the job's AM publishes under its checkpoint location (see
//! [`sluice_store::am_address`]) and, when it names another AM, goes on there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::BearerToken;
use sluice_proto::connect;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use sluice_proto::{NodeId, TaskId, v1};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::DaemonOptions;
use crate::error::{DaemonError, Result};
use crate::lease::Lease;

/// A client of the AM's daemon service that presents the shared token.
type AmClient = DaemonServiceClient<InterceptedService<Channel, BearerToken>>;

/// How long calls fail before the session looks whether the AM moved, and how often it looks
/// again.
const LOOK_FOR_A_MOVED_AM: Duration = Duration::from_secs(1);

/// How long reading the AM's published address may take.
const ADDRESS_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the AM, as one node of the job.
#[derive(Debug)]
pub(crate) struct Session {
    /// The AM called, and its address.
    current: Mutex<(AmClient, String)>,
    /// The node this daemon serves; `None` until the AM picks it by the host's name, at the first
    /// registration, for a daemon started without a node id. Calls other than `register` are made
    /// only once it is known.
    node: Mutex<Option<NodeId>>,
    /// This host's name, sent with registrations and heartbeats.
    hostname: String,
    token: Option<String>,
    tls: connect::ClientTls,
    am_timeout: Duration,
    lease: Arc<Lease>,
    /// Where the AM publishes its address, once a registration said.
    checkpoint_uri: Mutex<Option<String>>,
    /// When the session last read the published address.
    looked: Mutex<Option<Instant>>,
}

/// The commands of an answer, and how far the AM's journal was written as it went out: `None`
/// from an AM that keeps no journal, or that answers only once the call is recorded.
#[derive(Debug)]
pub(crate) struct Marked {
    pub(crate) commands: Vec<v1::Command>,
    pub(crate) journal: Option<v1::JournalMark>,
}

/// An answer, and when the call it answers was sent.
struct Answered<T> {
    reply: T,
    sent: Instant,
}

impl<T> Answered<T> {
    fn map<U>(self, part: impl FnOnce(T) -> U) -> Answered<U> {
        Answered {
            reply: part(self.reply),
            sent: self.sent,
        }
    }
}

impl Session {
    /// Connects to the AM, trying again with backoff up to the timeout.
    pub(crate) async fn connect(options: &DaemonOptions) -> Result<Session> {
        let endpoint =
            connect::endpoint(&options.am, &options.tls).map_err(DaemonError::AmAddress)?;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            let attempt = endpoint.connect().await;
            match attempt {
                Ok(channel) => {
                    let client = DaemonServiceClient::with_interceptor(
                        channel,
                        BearerToken(options.token.clone()),
                    );
                    return Ok(Session {
                        current: Mutex::new((client, options.am.clone())),
                        node: Mutex::new(options.node_id),
                        hostname: sluice_proto::host_name(),
                        token: options.token.clone(),
                        tls: options.tls.clone(),
                        am_timeout: options.am_timeout,
                        lease: Arc::new(Lease::new()),
                        checkpoint_uri: Mutex::new(None),
                        looked: Mutex::new(None),
                    });
                }
                Err(error) if started.elapsed() < options.am_timeout => {
                    tracing::debug!(%error, "AM not reachable yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(error) => {
                    return Err(DaemonError::Unreachable {
                        am: options.am.clone(),
                        seconds: options.am_timeout.as_secs(),
                        cause: connect::explain(&connect::error_chain(&error), &options.tls),
                    });
                }
            }
        }
    }

    /// The node this daemon serves, as registered.
    pub(crate) fn node_id(&self) -> NodeId {
        lock(&self.node).unwrap_or(NodeId(0))
    }

    /// Makes the registrations from now on ask for `node`: the node whose rings this daemon, started
    /// without a node id, found on its host.
    pub(crate) fn ask_for(&self, node: NodeId) {
        *lock(&self.node) = Some(node);
    }

    /// The lease the AM's answers renew.
    pub(crate) fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    /// Registers with the AM for job `job_id` (empty when the daemon was not told its job),
    /// holding `held`; the answer sets the lease's length, and the node, when the AM picked it.
    pub(crate) async fn register(
        &self,
        job_id: &str,
        held: Vec<v1::TaskProgress>,
    ) -> Result<v1::RegisterReply> {
        let node = *lock(&self.node);
        let answered = self
            .call(|mut client| {
                let request = v1::RegisterRequest {
                    node_id: node.map_or(0, |node| node.0),
                    job_id: job_id.to_owned(),
                    hostname: self.hostname.clone(),
                    held: held.clone(),
                    node_by_host: node.is_none(),
                };
                async move { client.register(request).await }
            })
            .await?;
        *lock(&self.node) = Some(NodeId(answered.reply.node_id));
        self.lease
            .set_length(Duration::from_millis(answered.reply.lease_ms));
        *lock(&self.checkpoint_uri) =
            Some(answered.reply.checkpoint_uri.clone()).filter(|uri| !uri.is_empty());
        self.renew(&answered.reply.commands, answered.sent);
        Ok(answered.reply)
    }

    /// Renews the lease from `sent` unless `commands` fence the daemon: the AM declared it lost,
    /// so the rings must get nothing more.
    fn renew(&self, commands: &[v1::Command], sent: Instant) {
        let fenced = commands
            .iter()
            .any(|command| matches!(command.command, Some(v1::command::Command::Fence(_))));
        if !fenced {
            self.lease.renew(sent);
        }
    }

    /// The commands of an answer, the lease renewed by it.
    fn commands(&self, answered: Answered<Vec<v1::Command>>) -> Vec<v1::Command> {
        self.renew(&answered.reply, answered.sent);
        answered.reply
    }

    /// Tells the AM that task `task_id` stops at `stop_row`; returns the AM's commands.
    pub(crate) async fn ack_stop(
        &self,
        task_id: TaskId,
        stop_row: u64,
    ) -> Result<Vec<v1::Command>> {
        let answered = self
            .call(|mut client| {
                let request = v1::AckStopRequest {
                    node_id: self.node_id().into(),
                    task_id: task_id.into(),
                    stop_row,
                };
                async move { client.ack_stop(request).await }
            })
            .await?;
        Ok(self.commands(answered.map(|reply| reply.commands)))
    }

    /// Asks the AM for up to `max_tasks` tasks, telling whether one of the rings has nothing left to
    /// write (`dry`); returns the AM's commands and its journal's mark.
    pub(crate) async fn acquire_tasks(&self, max_tasks: u32, dry: bool) -> Result<Marked> {
        let answered = self
            .call(|mut client| {
                let request = v1::AcquireTasksRequest {
                    node_id: self.node_id().into(),
                    max_tasks,
                    dry,
                };
                async move { client.acquire_tasks(request).await }
            })
            .await?;
        let journal = answered.reply.journal;
        Ok(Marked {
            commands: self.commands(answered.map(|reply| reply.commands)),
            journal,
        })
    }

    /// Reports the tasks' counts, the stages' figures and the rings'; returns the AM's commands
    /// and its journal's mark. The daemon keeps a task reported consumed to its end until a mark
    /// says that the AM's record of it is durable (see [`TaskBook`](crate::book::TaskBook)).
    pub(crate) async fn heartbeat(
        &self,
        progress: Vec<v1::TaskProgress>,
        stages: Vec<v1::StageStats>,
        rings: Vec<v1::RingStats>,
        tuning: v1::ReadTuning,
    ) -> Result<Marked> {
        let answered = self
            .call(|mut client| {
                let request = v1::HeartbeatRequest {
                    node_id: self.node_id().into(),
                    progress: progress.clone(),
                    stages: stages.clone(),
                    rings: rings.clone(),
                    hostname: self.hostname.clone(),
                    keeps_finished_until_durable: true,
                    tuning: Some(tuning),
                };
                async move { client.heartbeat(request).await }
            })
            .await?;
        let journal = answered.reply.journal;
        Ok(Marked {
            commands: self.commands(answered.map(|reply| reply.commands)),
            journal,
        })
    }

    /// Reports that task `task_id` failed for `reason`, `consumed` of its rows consumed; returns
    /// the AM's commands.
    pub(crate) async fn report_failed(
        &self,
        task_id: TaskId,
        consumed: u64,
        reason: &str,
    ) -> Result<Vec<v1::Command>> {
        let answered = self
            .call(|mut client| {
                let request = v1::ReportTaskRequest {
                    node_id: self.node_id().into(),
                    task_id: task_id.into(),
                    consumed,
                    outcome: Some(v1::report_task_request::Outcome::Failed(v1::TaskFailed {
                        reason: reason.to_owned(),
                    })),
                };
                async move { client.report_task(request).await }
            })
            .await?;
        Ok(self.commands(answered.map(|reply| reply.commands)))
    }

    /// Makes one call on a clone of the client, trying again while the AM is unavailable, up to
    /// the timeout; returns the answer and when the answered attempt was sent.
    async fn call<T, F, Fut>(&self, mut make: F) -> Result<Answered<T>>
    where
        F: FnMut(AmClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            let sent = Instant::now();
            let client = lock(&self.current).0.clone();
            match make(client).await {
                Ok(reply) => {
                    return Ok(Answered {
                        reply: reply.into_inner(),
                        sent,
                    });
                }
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::Unknown
                            | tonic::Code::Cancelled
                            | tonic::Code::DeadlineExceeded
                    ) =>
                {
                    if started.elapsed() >= self.am_timeout {
                        return Err(DaemonError::Unreachable {
                            am: lock(&self.current).1.clone(),
                            seconds: self.am_timeout.as_secs(),
                            cause: connect::explain(&connect::error_chain(&status), &self.tls),
                        });
                    }
                    if started.elapsed() >= LOOK_FOR_A_MOVED_AM {
                        self.look_for_a_moved_am().await;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(status) => return Err(DaemonError::Refused { status }),
            }
        }
    }

    /// Reads the address the job's AM published, at most once per [`LOOK_FOR_A_MOVED_AM`], and
    /// calls the AM there from now on when it is not the one called.
    async fn look_for_a_moved_am(&self) {
        let Some(uri) = lock(&self.checkpoint_uri).clone() else {
            return;
        };
        {
            let mut looked = lock(&self.looked);
            if looked.is_some_and(|at| at.elapsed() < LOOK_FOR_A_MOVED_AM) {
                return;
            }
            *looked = Some(Instant::now());
        }
        let read =
            tokio::time::timeout(ADDRESS_READ_TIMEOUT, sluice_store::am_address::read(&uri)).await;
        let address = match read {
            Ok(Ok(Some(address))) => address,
            Ok(Ok(None)) => return,
            Ok(Err(error)) => {
                tracing::warn!(%error, "looking for the AM's address");
                return;
            }
            Err(_) => {
                tracing::warn!(uri, "reading the AM's address took too long");
                return;
            }
        };
        if lock(&self.current).1 == address {
            return;
        }
        match connect::endpoint(&address, &self.tls) {
            Ok(endpoint) => {
                let client = DaemonServiceClient::with_interceptor(
                    endpoint.connect_lazy(),
                    BearerToken(self.token.clone()),
                );
                let mut current = lock(&self.current);
                tracing::info!(from = current.1, to = address, "the AM moved");
                *current = (client, address);
            }
            Err(error) => {
                tracing::warn!(address, %error, "the AM's published address is not usable");
            }
        }
    }
}

/// Locks one of the session's mutexes; a poisoned one is taken as it is, since each holds plain
/// values written whole.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
