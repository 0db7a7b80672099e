//! The AM's gRPC services: thin wrappers that hand each request to the [`Master`], make its
//! changes durable, and answer.
//!
//! # Implementation
//! Every call takes the master's lock, applies the request, and sequences the resulting journal
//! entries while still holding it, so the journal's order is the order of the changes. The lock is
//! released before the call waits for the entries to be durable, so concurrent calls share one
//! group commit; only then does the call answer.

use crate::checkpoint_store::CheckpointStore;
use crate::error::AmError;
use crate::master::{Applied, CommitOutcome, Master};
use crate::persist::Persist;
use sluice_proto::v1;
use sluice_proto::v1::checkpoint_service_server::CheckpointService;
use sluice_proto::v1::control_service_server::ControlService;
use sluice_proto::v1::daemon_service_server::DaemonService;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

/// Milliseconds since the Unix epoch: one clock that keeps running across AM restarts, so that
/// journaled times stay comparable with the new AM's.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// The state the services share.
#[derive(Debug)]
pub struct Am {
    master: Mutex<Master>,
    persist: Persist,
    checkpoints: CheckpointStore,
}

impl Am {
    /// Wraps a master, where its changes go, and where data checkpoints are stored.
    pub fn new(master: Master, persist: Persist, checkpoints: CheckpointStore) -> Am {
        Am {
            master: Mutex::new(master),
            persist,
            checkpoints,
        }
    }

    /// Locks the master. A panic while it was held leaves the state as the last complete call
    /// left it, so the lock is taken over rather than poisoning every later call.
    pub fn master(&self) -> MutexGuard<'_, Master> {
        self.master
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `call` to the master, then waits until its entries are durable.
    async fn apply<T>(
        &self,
        call: impl FnOnce(&mut Master) -> Result<Applied<T>, AmError>,
    ) -> Result<T, Status> {
        let durable = {
            let mut master = self.master();
            let applied = call(&mut master)?;
            let durable = self.persist.append(&applied.entries, &master);
            (applied.reply, durable)
        };
        let (reply, durable) = durable;
        durable.await?;
        Ok(reply)
    }

    /// Declares silent nodes lost and samples the throughput; called periodically.
    pub async fn tick(&self) -> Result<(), AmError> {
        let durable = {
            let mut master = self.master();
            let applied = master.tick(now_ms());
            self.persist.append(&applied.entries, &master)
        };
        durable.await
    }

    /// Resets the task table to the data checkpoint named `token`.
    pub async fn restore(&self, token: &str) -> Result<v1::RestoreDataCheckpointReply, AmError> {
        let position = self.checkpoints.get(token).await?;
        let token = token.to_owned();
        let durable = {
            let mut master = self.master();
            let applied = master.restore(token, position, now_ms())?;
            (
                applied.reply,
                self.persist.append(&applied.entries, &master),
            )
        };
        let (reply, durable) = durable;
        durable.await?;
        Ok(reply)
    }

    /// Whether the job is over and every daemon was told so.
    pub fn finished(&self) -> bool {
        self.master().finished()
    }

    /// Where the AM's changes go.
    pub fn persist(&self) -> &Persist {
        &self.persist
    }
}

/// The gRPC face of an [`Am`]: the daemon, checkpoint and control services.
#[derive(Debug, Clone)]
pub struct AmService {
    am: Arc<Am>,
}

impl AmService {
    /// Serves `am`.
    pub fn new(am: Arc<Am>) -> AmService {
        AmService { am }
    }
}

#[tonic::async_trait]
impl DaemonService for AmService {
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .am
            .apply(|master| master.register(request, now_ms()))
            .await?;
        Ok(Response::new(reply))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .am
            .apply(|master| Ok(master.heartbeat(request, now_ms())))
            .await?;
        Ok(Response::new(reply))
    }

    async fn acquire_tasks(
        &self,
        request: Request<v1::AcquireTasksRequest>,
    ) -> Result<Response<v1::AcquireTasksReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .am
            .apply(|master| Ok(master.acquire(request, now_ms())))
            .await?;
        Ok(Response::new(reply))
    }

    async fn report_task(
        &self,
        request: Request<v1::ReportTaskRequest>,
    ) -> Result<Response<v1::ReportTaskReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .am
            .apply(|master| master.report(request, now_ms()))
            .await?;
        Ok(Response::new(reply))
    }

    async fn ack_stop(
        &self,
        request: Request<v1::AckStopRequest>,
    ) -> Result<Response<v1::AckStopReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .am
            .apply(|master| Ok(master.ack_stop(request, now_ms())))
            .await?;
        Ok(Response::new(reply))
    }
}

#[tonic::async_trait]
impl CheckpointService for AmService {
    async fn commit_data_checkpoint(
        &self,
        request: Request<v1::CommitDataCheckpointRequest>,
    ) -> Result<Response<v1::CommitDataCheckpointReply>, Status> {
        let request = request.into_inner();
        let outcome = self
            .am
            .apply(|master| master.commit_checkpoint(request))
            .await?;
        let state = match outcome {
            CommitOutcome::Pending {
                reported,
                world_size,
            } => v1::commit_data_checkpoint_reply::State::Pending(v1::CheckpointPending {
                ranks_reported: reported,
                world_size,
            }),
            CommitOutcome::Stored(token) => v1::commit_data_checkpoint_reply::State::Token(token),
            CommitOutcome::Ready(ready) => {
                self.am
                    .checkpoints
                    .put(&ready.token, &ready.position)
                    .await?;
                let token = ready.token.clone();
                self.am
                    .apply(|master| Ok(master.checkpoint_stored(ready.step, ready.token)))
                    .await?;
                v1::commit_data_checkpoint_reply::State::Token(token)
            }
        };
        Ok(Response::new(v1::CommitDataCheckpointReply {
            state: Some(state),
        }))
    }

    async fn restore_data_checkpoint(
        &self,
        request: Request<v1::RestoreDataCheckpointRequest>,
    ) -> Result<Response<v1::RestoreDataCheckpointReply>, Status> {
        let reply = self.am.restore(&request.into_inner().token).await?;
        Ok(Response::new(reply))
    }
}

#[tonic::async_trait]
impl ControlService for AmService {
    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusReply>, Status> {
        Ok(Response::new(self.am.master().status(now_ms())))
    }

    async fn scale_role(
        &self,
        request: Request<v1::ScaleRoleRequest>,
    ) -> Result<Response<v1::ScaleRoleReply>, Status> {
        let request = request.into_inner();
        Err(Status::failed_precondition(format!(
            "role {:?}: this AM launches no executors, so it cannot scale them; run the job with `sluice run` or `sluice submit` to let the AM launch them",
            request.role
        )))
    }

    async fn stop(
        &self,
        request: Request<v1::StopRequest>,
    ) -> Result<Response<v1::StopReply>, Status> {
        let reason = request.into_inner().reason;
        let state = self.am.apply(|master| Ok(master.stop(reason))).await?;
        Ok(Response::new(v1::StopReply {
            state: state as i32,
        }))
    }
}

/// Checks the shared token of a request, when the AM has one.
#[derive(Debug, Clone)]
pub struct TokenCheck {
    expected: Option<Arc<str>>,
}

impl TokenCheck {
    /// Requires `authorization: Bearer <token>` on every call when `token` is set.
    pub fn new(token: Option<String>) -> TokenCheck {
        TokenCheck {
            expected: token.map(Arc::from),
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        if given == Some(expected.as_ref()) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "this AM requires its shared token; pass --token or set SLUICE_TOKEN to the AM's token",
            ))
        }
    }
}
