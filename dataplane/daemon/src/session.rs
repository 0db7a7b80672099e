//! The daemon's session with the job's AM: it connects, registers, and makes the calls of the serve
//! loop (heartbeats, task requests, stop acknowledgements, failure reports), each one tried again
//! while the AM is unavailable, up to the timeout.

use std::time::{Duration, Instant};

use sluice_proto::BearerToken;
use sluice_proto::connect;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use sluice_proto::{NodeId, TaskId, v1};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::DaemonOptions;
use crate::error::{DaemonError, Result};

/// A client of the AM's daemon service that presents the shared token.
type AmClient = DaemonServiceClient<InterceptedService<Channel, BearerToken>>;

/// A connection to the AM, as node `node_id`.
#[derive(Debug)]
pub(crate) struct Session {
    client: AmClient,
    node_id: NodeId,
    am: String,
    tls: connect::ClientTls,
    am_timeout: Duration,
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
                    return Ok(Session {
                        client: DaemonServiceClient::with_interceptor(
                            channel,
                            BearerToken(options.token.clone()),
                        ),
                        node_id: options.node_id,
                        am: options.am.clone(),
                        tls: options.tls.clone(),
                        am_timeout: options.am_timeout,
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

    /// Registers with the AM for job `job_id` (empty when the daemon was not told its job),
    /// holding `held`.
    pub(crate) async fn register(
        &self,
        job_id: &str,
        held: Vec<v1::TaskProgress>,
    ) -> Result<v1::RegisterReply> {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_default();
        self.call(|mut client| {
            let request = v1::RegisterRequest {
                node_id: self.node_id.into(),
                job_id: job_id.to_owned(),
                hostname: hostname.clone(),
                held: held.clone(),
            };
            async move { client.register(request).await }
        })
        .await
    }

    /// Tells the AM that task `task_id` stops at `stop_row`; returns the AM's commands.
    pub(crate) async fn ack_stop(
        &self,
        task_id: TaskId,
        stop_row: u64,
    ) -> Result<Vec<v1::Command>> {
        let reply = self
            .call(|mut client| {
                let request = v1::AckStopRequest {
                    node_id: self.node_id.into(),
                    task_id: task_id.into(),
                    stop_row,
                };
                async move { client.ack_stop(request).await }
            })
            .await?;
        Ok(reply.commands)
    }

    /// Asks the AM for up to `max_tasks` tasks; returns the AM's commands.
    pub(crate) async fn acquire_tasks(&self, max_tasks: u32) -> Result<Vec<v1::Command>> {
        let reply = self
            .call(|mut client| {
                let request = v1::AcquireTasksRequest {
                    node_id: self.node_id.into(),
                    max_tasks,
                };
                async move { client.acquire_tasks(request).await }
            })
            .await?;
        Ok(reply.commands)
    }

    /// Reports the tasks' counts, the stages' figures and the rings'; returns the AM's commands.
    pub(crate) async fn heartbeat(
        &self,
        progress: Vec<v1::TaskProgress>,
        stages: Vec<v1::StageStats>,
        rings: Vec<v1::RingStats>,
    ) -> Result<Vec<v1::Command>> {
        let reply = self
            .call(|mut client| {
                let request = v1::HeartbeatRequest {
                    node_id: self.node_id.into(),
                    progress: progress.clone(),
                    stages: stages.clone(),
                    rings: rings.clone(),
                };
                async move { client.heartbeat(request).await }
            })
            .await?;
        Ok(reply.commands)
    }

    /// Reports that task `task_id` failed for `reason`, `consumed` of its rows consumed; returns
    /// the AM's commands.
    pub(crate) async fn report_failed(
        &self,
        task_id: TaskId,
        consumed: u64,
        reason: &str,
    ) -> Result<Vec<v1::Command>> {
        let reply = self
            .call(|mut client| {
                let request = v1::ReportTaskRequest {
                    node_id: self.node_id.into(),
                    task_id: task_id.into(),
                    consumed,
                    outcome: Some(v1::report_task_request::Outcome::Failed(v1::TaskFailed {
                        reason: reason.to_owned(),
                    })),
                };
                async move { client.report_task(request).await }
            })
            .await?;
        Ok(reply.commands)
    }

    /// Makes one call on a clone of the client, trying again while the AM is unavailable, up to
    /// the timeout.
    async fn call<T, F, Fut>(&self, mut make: F) -> Result<T>
    where
        F: FnMut(AmClient) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match make(self.client.clone()).await {
                Ok(reply) => return Ok(reply.into_inner()),
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
                            am: self.am.clone(),
                            seconds: self.am_timeout.as_secs(),
                            cause: connect::explain(&connect::error_chain(&status), &self.tls),
                        });
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(status) => return Err(DaemonError::Refused { status }),
            }
        }
    }
}
