//! The AM's gRPC services: thin wrappers that hand each request to the [`Master`], make its
//! changes durable, and answer.
//!
//! # Implementation
//! Every call takes the master's lock, applies the request, and sequences the resulting journal
//! entries while still holding it, so the journal's order is the order of the changes. The lock is
//! released before the call waits for the entries to be durable, so concurrent calls share one
//! group commit; only then does the call answer.
//!
//! One kind of call answers without waiting: a heartbeat whose only changes are consumed and
//! enqueued counts (and the node's liveness) and, from a daemon that keeps finished tasks until
//! they are durable (`keeps_finished_until_durable`), tasks finished. Its answer carries no command.
//! A daemon reports every held task's counts in every heartbeat, so an AM that restarts having lost
//! those entries learns the counts again from the next heartbeats; and such a daemon keeps
//! reporting a finished task until an answer's journal mark (`JournalMark`: generation, appended,
//! durable) from the same AM says that the entries appended up to the answer to its report are
//! durable. A heartbeat that finishes a task of a daemon that lets it go on the answer, starts an
//! epoch, ends the job, answers with a command, or comes during a scale or a restore (whose final
//! counts the daemon reports before it removes its rings) waits as every other call does. The
//! entries of a heartbeat that does not wait are journaled in order all the same, so every later
//! call that waits also waits for them: the answer to `AcquireTasks` says so with its mark.

use crate::checkpoint_store::CheckpointStore;
use crate::clock::{AmClock, Clock, SystemClock};
use crate::connections::ConnectionInfo;
use crate::decide::DataPosition;
use crate::error::AmError;
use crate::launcher::{
    ExecutorEvent, ExecutorId, ExecutorState, Exit, LaunchAction, LaunchSpec, Launcher,
};
use crate::master::calls::{JobPhase, RankCommit, Restored};
use crate::master::{Applied, CommitOutcome, Master, Placement, SourceAdded};
use crate::persist::{Durable, Persist, all_durable};
use crate::plan::JobPlan;
use crate::spec::{HangAction, JobSpec, SourceSpec};
use crate::wire;
use sluice_proto::v1;
use sluice_proto::v1::checkpoint_service_server::CheckpointService;
use sluice_proto::v1::control_service_server::ControlService;
use sluice_proto::v1::daemon_service_server::DaemonService;
use sluice_proto::{NodeId, TaskId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tonic::transport::server::TlsConnectInfo;
use tonic::{Request, Response, Status};

/// How long a trainer a scale stops has, from its SIGTERM, to finish the batch it holds and exit
/// before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The state the services share.
#[derive(Debug)]
pub struct Am {
    master: Mutex<Master>,
    persist: Persist,
    checkpoints: CheckpointStore,
    /// When each retiring trainer was asked to end.
    stopping: Mutex<BTreeMap<ExecutorId, Instant>>,
    /// The hangs seen, with when the AM last acted on each.
    hangs: Mutex<BTreeMap<HangKey, Instant>>,
    /// Hung executors to kill, so that the failover rules start them again.
    restarts: Mutex<Vec<ExecutorId>>,
    /// The AM time (ms) before which each executor that failed is not launched again.
    backoff: Mutex<BTreeMap<ExecutorId, u64>>,
    /// The time the master is handed, continued from the latest time of its journal.
    clock: AmClock,
}

impl Am {
    /// Wraps a master, where its changes go, and where data checkpoints are stored, on the host's
    /// clocks.
    pub fn new(master: Master, persist: Persist, checkpoints: CheckpointStore) -> Am {
        Am::with_clock(master, persist, checkpoints, Arc::new(SystemClock::new()))
    }

    /// Wraps a master as [`Am::new`] does, reading the time from `clock`. The AM's time continues
    /// from the latest time of the changes the master applied, those it replayed included.
    pub fn with_clock(
        master: Master,
        persist: Persist,
        checkpoints: CheckpointStore,
        clock: Arc<dyn Clock>,
    ) -> Am {
        let clock = AmClock::continuing_from(clock, master.latest_ms());
        Am {
            master: Mutex::new(master),
            persist,
            checkpoints,
            stopping: Mutex::new(BTreeMap::new()),
            hangs: Mutex::new(BTreeMap::new()),
            restarts: Mutex::new(Vec::new()),
            backoff: Mutex::new(BTreeMap::new()),
            clock,
        }
    }

    /// The AM's time now, in milliseconds on its monotonic clock: the time liveness is decided
    /// on, and the only time the master is handed.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The job's status now, for `sluice status`, the status page and the progress line.
    pub fn status(&self) -> v1::StatusReply {
        let master = self.master();
        master.status(self.now_ms())
    }

    /// Takes over the job the master replayed from its journal: gives every live node a full
    /// heartbeat timeout from now to report to this AM, and queues again the stops still due.
    pub fn take_over(&self) {
        let mut master = self.master();
        master.grant_grace(self.now_ms());
        master.resume_commands();
    }

    /// Locks the master. A panic while it was held leaves the state as the last complete call
    /// left it, so the lock is taken over rather than poisoning every later call.
    pub fn master(&self) -> MutexGuard<'_, Master> {
        self.master
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Why this AM steps down, once its journal can record nothing more: a newer AM fenced it, or
    /// a write failed. It then changes nothing and acts on nothing, and its server ends.
    pub fn journal_lost(&self) -> Option<String> {
        self.persist.lost()
    }

    /// Refuses a change once the journal can record nothing more.
    fn check_journal(&self) -> Result<(), AmError> {
        match self.journal_lost() {
            Some(cause) => Err(AmError::SteppedDown { cause }),
            None => Ok(()),
        }
    }

    /// Applies `call` to the master and sequences its entries in the journal while the master is
    /// locked, so the journal's order is the order of the changes; returns the reply and a future
    /// that resolves once the entries are durable.
    fn record<T>(
        &self,
        call: impl FnOnce(&mut Master) -> Result<Applied<T>, AmError>,
    ) -> Result<(T, Durable), AmError> {
        self.check_journal()?;
        let mut master = self.master();
        let applied = call(&mut master)?;
        let durable = self.persist.append(&applied.entries, &master);
        Ok((applied.reply, durable))
    }

    /// Applies `call` to the master, then waits until its entries are durable.
    pub(crate) async fn apply<T>(
        &self,
        call: impl FnOnce(&mut Master) -> Result<Applied<T>, AmError>,
    ) -> Result<T, AmError> {
        let (reply, durable) = self.record(call)?;
        durable.await?;
        Ok(reply)
    }

    /// Makes executor `id`, which just failed, wait before it is launched again, the longer the
    /// more it failed (`failover.restart_backoff_ms`), so that a failure that repeats at once does
    /// not spend the failure budget in a moment.
    fn back_off(&self, id: ExecutorId) {
        let wait = {
            let master = self.master();
            let failures = master
                .executors()
                .and_then(|executors| {
                    executors
                        .records()
                        .find(|(record_id, _)| **record_id == id)
                        .map(|(_, record)| record.failures)
                })
                .unwrap_or(1);
            master.spec().failover.restart_backoff(failures)
        };
        let at = self
            .now_ms()
            .saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        lock(&self.backoff).insert(id, at);
    }

    /// Stops the job at once, as two `sluice stop`s do: a followed job ends its following and
    /// stops too, rather than delivering the rows it planned first.
    pub async fn stop_now(&self, reason: &str) -> Result<JobPhase, AmError> {
        self.apply(|master| {
            let mut applied = master.stop(reason.to_owned());
            if matches!(master.phase(), JobPhase::Starting | JobPhase::Running) {
                let again = master.stop(reason.to_owned());
                applied.entries.extend(again.entries);
                applied.reply = again.reply;
            }
            Ok(applied)
        })
        .await
    }

    /// How far the journal is written, for an answer to a daemon; `None` without a journal.
    fn journal_mark(&self) -> Option<v1::JournalMark> {
        self.persist.mark().map(wire::journal_mark)
    }

    /// Applies a heartbeat and sequences its entries. Returns the reply, with the journal's mark
    /// once they are appended, and the future to wait on before answering unless the heartbeat may
    /// be answered before its entries are durable (see the module documentation).
    fn record_heartbeat(
        &self,
        request: v1::HeartbeatRequest,
    ) -> (v1::HeartbeatReply, Option<Durable>) {
        let keeps_finished = request.keeps_finished_until_durable;
        let node = NodeId(request.node_id);
        let mut master = self.master();
        let before = master.standing();
        let applied = master.heartbeat(wire::heartbeat(request), self.now_ms());
        let early = master.answers_before_durable(before, &applied.reply, keeps_finished);
        let durable = self.persist.append(&applied.entries, &master);
        let settled = master.settled_for(node);
        let reply = v1::HeartbeatReply {
            commands: wire::commands(
                master.plan(),
                master.added_sources(),
                applied.reply.into_iter().chain(settled).collect(),
            ),
            journal: self.journal_mark(),
        };
        (reply, (!early).then_some(durable))
    }

    /// Applies a heartbeat and answers, once its entries are durable unless it may be answered
    /// before. The answer's mark says how far the journal was durable once the heartbeat's entries
    /// were appended, or once they were durable when the answer waited for them.
    pub(crate) async fn heartbeat(
        &self,
        request: v1::HeartbeatRequest,
    ) -> Result<v1::HeartbeatReply, AmError> {
        self.check_journal()?;
        let (mut reply, durable) = self.record_heartbeat(request);
        if let Some(durable) = durable {
            durable.await?;
            if let (Some(mark), Some(now)) = (&mut reply.journal, self.journal_mark()) {
                mark.durable = now.durable;
            }
        }
        Ok(reply)
    }

    /// Declares silent nodes lost, samples the throughput, and acts on hung trainers by the
    /// spec's `failover.hang`; called periodically.
    pub async fn tick(&self) -> Result<(), AmError> {
        self.apply(|master| Ok(master.tick(self.now_ms()))).await?;
        self.act_on_hangs().await
    }

    /// Says when a trainer or a daemon starts or stops hanging, and does what
    /// `failover.hang.action` says: nothing more, kill it (so that the failover rules start it
    /// again; again if it hangs still one bound later), or fail the job.
    async fn act_on_hangs(&self) -> Result<(), AmError> {
        let now_ms = self.now_ms();
        let (hangs, action) = {
            let master = self.master();
            (master.hangs(now_ms), master.spec().failover.hang.action)
        };
        if hangs.is_empty() && lock(&self.hangs).is_empty() {
            return Ok(());
        }
        let mut failure = None;
        let mut hung_daemons = Vec::new();
        {
            let mut seen = lock(&self.hangs);
            let now: BTreeSet<HangKey> = hangs.iter().map(HangKey::of).collect();
            seen.retain(|key, _| {
                let hung = now.contains(key);
                if !hung {
                    tracing::info!("{}: no longer hangs", key.what());
                }
                hung
            });
            for hang in &hangs {
                let key = HangKey::of(hang);
                // A warning or a failure is said once a hang; a restart is tried again while
                // what was started again hangs one bound later.
                let due = seen.get(&key).is_none_or(|acted| {
                    action == HangAction::Restart
                        && acted.elapsed() >= Duration::from_millis(hang.bound_ms)
                });
                if !due {
                    continue;
                }
                seen.insert(key.clone(), Instant::now());
                let what = format!(
                    "{} has not {} for {:.1} s (the bound is {:.1} s: failover.hang)",
                    key.what(),
                    key.verb(),
                    hang.stuck_ms as f64 / 1000.0,
                    hang.bound_ms as f64 / 1000.0
                );
                tracing::warn!(action = hang.action, "{what}");
                match action {
                    HangAction::Warn => {}
                    HangAction::Restart => {
                        let executor = if key.in_the_daemon() {
                            u32::try_from(hang.node_id).ok().map(ExecutorId::Daemon)
                        } else {
                            self.master().trainer_ids().into_iter().find(|id| {
                                matches!(id, ExecutorId::Trainer { rank, .. } if *rank == hang.rank)
                            })
                        };
                        if let Some(executor) = executor {
                            lock(&self.restarts).push(executor);
                        }
                    }
                    HangAction::Fail => {
                        if key.kind == HangKind::Daemon {
                            hung_daemons.push(key.node);
                        }
                        failure.get_or_insert(format!(
                            "{what}; find why it stopped (a stuck step, a deadlock, a stopped process), or raise failover.hang.after_s or factor"
                        ));
                    }
                }
            }
        }
        let Some(reason) = failure else {
            return Ok(());
        };
        self.apply(|master| Ok(master.fail(reason))).await?;
        // A hung daemon cannot hear that the job is over: the AM does not wait for it.
        let mut master = self.master();
        for node in hung_daemons {
            master.give_up_on(node);
        }
        Ok(())
    }

    /// Records one rank's data position at a step; once every rank of the step has reported,
    /// stores the checkpoint and answers with its token. The gRPC service and the JSON API both
    /// call it.
    pub async fn commit_checkpoint(
        &self,
        commit: RankCommit,
    ) -> Result<v1::CommitDataCheckpointReply, AmError> {
        let outcome = self
            .apply(|master| master.commit_checkpoint(commit))
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
                if let Err(error) = self.checkpoints.put(&ready.token, &ready.position).await {
                    // The ranks waiting for the token complete the step again when they ask.
                    self.master().checkpoint_store_failed(ready.step);
                    return Err(error);
                }
                let token = ready.token.clone();
                let pruned = self
                    .apply(|master| Ok(master.checkpoint_stored(ready.step, ready.token)))
                    .await?;
                for old in pruned {
                    // A checkpoint left behind costs only space; the next prune does not see it.
                    if let Err(error) = self.checkpoints.delete(&old).await {
                        tracing::warn!(token = old, %error, "deleting a pruned data checkpoint failed");
                    }
                }
                v1::commit_data_checkpoint_reply::State::Token(token)
            }
        };
        Ok(v1::CommitDataCheckpointReply { state: Some(state) })
    }

    /// Adds the source `text` describes (one entry of `data.sources`) to the running job: parsed
    /// and planned with the master unlocked, then journaled through the master.
    pub async fn add_source(&self, text: String) -> Result<SourceAdded, AmError> {
        self.check_journal()?;
        let (spec, index) = {
            let master = self.master();
            (master.spec().clone(), master.next_source_index())
        };
        let source = SourceSpec::parse_added(&text, index as usize)?;
        let (block, version) = plan_added_source(spec, index, source.clone())
            .await
            .map_err(|error| match error {
                // The caller's source, not the AM, is what cannot be read.
                AmError::Source { .. } => AmError::InvalidRequest(error.to_string()),
                error => error,
            })?;
        let uri = source.uri.clone();
        let added = self
            .apply(|master| master.add_source(text, source, version, block))
            .await?;
        tracing::info!(
            %uri,
            index = added.index,
            files = added.files,
            rows = added.rows,
            epoch = added.epoch,
            "source added to the running job"
        );
        Ok(added)
    }

    /// Resets the task table to the data checkpoint named `token`. The gRPC service and the JSON
    /// API both call it.
    pub async fn restore(
        &self,
        token: &str,
        rank: Option<u32>,
    ) -> Result<v1::RestoreDataCheckpointReply, AmError> {
        self.reset_to_stored(token, |master, token, position, now_ms| {
            master.restore(token, position, now_ms, rank)
        })
        .await
    }

    /// Resets the job to the stored data checkpoint `token` as the AM starts, at the role sizes of
    /// its spec ([`Master::resume_from`]).
    pub async fn resume_from(
        &self,
        token: &str,
    ) -> Result<v1::RestoreDataCheckpointReply, AmError> {
        self.reset_to_stored(token, Master::resume_from).await
    }

    /// Reads the data checkpoint `token` from the store and resets the master to it with `reset`
    /// ([`Master::restore`] or [`Master::resume_from`]), given the token, the stored position and
    /// the time.
    async fn reset_to_stored(
        &self,
        token: &str,
        reset: impl FnOnce(&mut Master, String, DataPosition, u64) -> Result<Applied<Restored>, AmError>,
    ) -> Result<v1::RestoreDataCheckpointReply, AmError> {
        let position = self.checkpoints.get(token).await?;
        let token = token.to_owned();
        let mut restored = self
            .apply(|master| reset(master, token, position, self.now_ms()))
            .await?;
        if self
            .master()
            .spec()
            .checkpoint
            .as_ref()
            .is_some_and(|checkpoint| checkpoint.keep.is_some())
        {
            for old in std::mem::take(&mut restored.forgotten) {
                // As a pruned checkpoint: one left behind costs only space.
                if let Err(error) = self.checkpoints.delete(&old).await {
                    tracing::warn!(token = old, %error, "deleting a data checkpoint the restore left behind failed");
                }
            }
        }
        Ok(wire::restore_reply(restored))
    }

    /// Whether the job is over and every daemon was told so.
    pub fn finished(&self) -> bool {
        self.master().finished()
    }

    /// Has the launcher follow the executors the journal says run: those an earlier AM of the job
    /// launched, which this AM takes over. Their ends then come as events like the others'.
    pub fn adopt_executors(&self, executors: &ExecutorLauncher) {
        for id in self.running_executors(|_| true) {
            executors.launcher.adopt(&id);
        }
    }

    /// Follows the executors: records the ones that `ended` (the launcher's events since the last
    /// call), stops the trainers a scale retired, records the launches of the ones the failover
    /// rules want running, and kills the trainers that still run once the job is over. The
    /// launches themselves wait for [`Am::launch`], once the records are durable: an AM whose
    /// journal fails or was fenced launches nothing the journal does not hold. Blocks on process
    /// and file operations, so it runs on a blocking thread.
    pub fn supervise(
        &self,
        executors: &ExecutorLauncher,
        ended: Vec<ExecutorEvent>,
    ) -> Supervision {
        let mut durables = Vec::new();
        let restarts = std::mem::take(&mut *lock(&self.restarts));
        for id in restarts {
            tracing::warn!(executor = %id, "it hangs: killing it, to be started again");
            executors.launcher.kill(&id);
        }
        for ExecutorEvent::Exited { id, exit, cause } in ended {
            tracing::info!(executor = %id, ?exit, ?cause, "executor ended");
            self.stopping().remove(&id);
            let failed = exit != Exit::Code(0);
            let backoff_id = id.clone();
            durables.push(self.record_change(|master| {
                master.executor_cause(&id, cause);
                master.executor_exited(id, exit)
            }));
            if failed {
                self.back_off(backoff_id);
            }
        }
        let retiring: Vec<ExecutorId> = self
            .master()
            .executors()
            .map(|records| records.retiring().cloned().collect())
            .unwrap_or_default();
        for id in retiring {
            self.stop_retiring(executors, id);
        }
        let (to_launch, over) = {
            let master = self.master();
            let over = master.outcome().is_some();
            let to_launch = if over {
                Vec::new()
            } else {
                master.executors_to_launch()
            };
            (to_launch, over)
        };
        let now_ms = self.now_ms();
        let mut launches = Vec::new();
        for LaunchAction::Launch(id) in to_launch {
            if lock(&self.backoff).get(&id).is_some_and(|at| *at > now_ms) {
                // Launched on a later pass, once its wait is over.
                continue;
            }
            let spec = {
                let master = self.master();
                let mut spec = executors
                    .setup
                    .spec_for(master.spec(), &master.placement(), &id);
                if let Some(token) = master.restored_to(&id) {
                    spec.env
                        .insert("SLUICE_RESTORED_TO".to_owned(), token.to_owned());
                }
                spec
            };
            durables.push(self.record_change(|master| master.executor_launched(id)));
            launches.push(spec);
        }
        if over {
            let trainers = self.running_executors(|id| matches!(id, ExecutorId::Trainer { .. }));
            for id in trainers {
                tracing::info!(executor = %id, "the job is over: stopping trainer");
                executors.launcher.kill(&id);
            }
        }
        Supervision {
            durable: all_durable(durables),
            launches,
        }
    }

    /// Starts the executors whose launches [`Am::supervise`] recorded, once those records are
    /// durable. A launch that fails is recorded as the executor's exit, with code 127, and counts
    /// as a failure. Blocks on process operations, so it runs on a blocking thread.
    pub fn launch(&self, executors: &ExecutorLauncher, launches: Vec<LaunchSpec>) -> Durable {
        let mut durables = Vec::new();
        for spec in launches {
            if let Err(error) = executors.launcher.launch(&spec) {
                tracing::error!(executor = %spec.id, %error, "launch failed");
                let id = spec.id;
                durables.push(self.record_change(|master| {
                    master.executor_cause(&id, Some(format!("not launched: {error}")));
                    master.executor_exited(id, Exit::Code(127))
                }));
            }
        }
        all_durable(durables)
    }

    fn stopping(&self) -> MutexGuard<'_, BTreeMap<ExecutorId, Instant>> {
        lock(&self.stopping)
    }

    /// Stops a trainer a scale or a restore retired: SIGTERM first, so it releases the batch it holds and
    /// exits, then, past the grace period, SIGKILL.
    fn stop_retiring(&self, executors: &ExecutorLauncher, id: ExecutorId) {
        let mut stopping = self.stopping();
        match stopping.get(&id) {
            None => {
                tracing::info!(executor = %id, "trainers restart: stopping trainer");
                executors.launcher.terminate(&id);
                stopping.insert(id, Instant::now());
            }
            Some(asked) if asked.elapsed() >= STOP_GRACE => {
                tracing::warn!(executor = %id, grace = ?STOP_GRACE, "trainer still runs past its grace period: killing it");
                executors.launcher.kill(&id);
            }
            Some(_) => {}
        }
    }

    /// Applies a change that cannot be refused and sequences its entries.
    fn record_change(&self, change: impl FnOnce(&mut Master) -> Applied<()>) -> Durable {
        let mut master = self.master();
        let applied = change(&mut master);
        self.persist.append(&applied.entries, &master)
    }

    /// The executors running now that `wanted` selects, the trainers a scale retired included.
    fn running_executors(&self, wanted: impl Fn(&ExecutorId) -> bool) -> Vec<ExecutorId> {
        self.master()
            .executors()
            .map(|records| {
                records
                    .records()
                    .filter(|(_, record)| record.state == ExecutorState::Running)
                    .map(|(id, _)| id)
                    .chain(records.retiring())
                    .filter(|id| wanted(id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills every executor still running, once the job is over and the AM exits.
    pub fn kill_executors(&self, executors: &ExecutorLauncher) {
        let running = self.running_executors(|_| true);
        for id in running {
            executors.launcher.kill(&id);
        }
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
    daemon_certs: bool,
}

impl AmService {
    /// Serves `am`; with `daemon_certs`, the daemon calls need a client certificate, which the TLS
    /// layer has checked against the AM's client CA.
    pub fn new(am: Arc<Am>, daemon_certs: bool) -> AmService {
        AmService { am, daemon_certs }
    }

    /// Refuses a daemon call without a client certificate when the AM asks daemons for one, so
    /// that holding the job's token is not enough to pose as a daemon.
    fn check_daemon<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let presented = request
            .extensions()
            .get::<TlsConnectInfo<ConnectionInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .is_some_and(|certs| !certs.is_empty());
        if !self.daemon_certs || presented {
            return Ok(());
        }
        Err(Status::unauthenticated(
            "this AM serves daemons that present a client certificate signed by its client CA (--tls-client-ca): start sluice daemon with --tls-cert and --tls-key (SLUICE_TLS_CERT, SLUICE_TLS_KEY)",
        ))
    }
}

#[tonic::async_trait]
impl DaemonService for AmService {
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterReply>, Status> {
        self.check_daemon(&request)?;
        let registration = wire::registration(request.into_inner());
        let reply = self
            .am
            .apply(|master| {
                let applied = master.register(registration, self.am.now_ms())?;
                Ok(applied.map(|registered| {
                    wire::register_reply(master.spec(), master.plan(), registered)
                }))
            })
            .await?;
        Ok(Response::new(reply))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatReply>, Status> {
        self.check_daemon(&request)?;
        let reply = self.am.heartbeat(request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    async fn acquire_tasks(
        &self,
        request: Request<v1::AcquireTasksRequest>,
    ) -> Result<Response<v1::AcquireTasksReply>, Status> {
        self.check_daemon(&request)?;
        let request = request.into_inner();
        let node = NodeId(request.node_id);
        let reply = self
            .am
            .apply(|master| {
                let applied =
                    master.acquire(node, request.max_tasks, request.dry, self.am.now_ms());
                // First: a daemon given the next epoch's first tasks learns how its rings end this one.
                let settled = master.settled_for(node);
                Ok(applied.map(|commands| v1::AcquireTasksReply {
                    commands: wire::commands(
                        master.plan(),
                        master.added_sources(),
                        settled.into_iter().chain(commands).collect(),
                    ),
                    journal: None,
                }))
            })
            .await?;
        Ok(Response::new(v1::AcquireTasksReply {
            journal: self.am.journal_mark(),
            ..reply
        }))
    }

    async fn report_task(
        &self,
        request: Request<v1::ReportTaskRequest>,
    ) -> Result<Response<v1::ReportTaskReply>, Status> {
        self.check_daemon(&request)?;
        let report = wire::task_report(request.into_inner())?;
        let reply = self
            .am
            .apply(|master| {
                let applied = master.report(report, self.am.now_ms());
                Ok(applied.map(|commands| v1::ReportTaskReply {
                    commands: wire::commands(master.plan(), master.added_sources(), commands),
                }))
            })
            .await?;
        Ok(Response::new(reply))
    }

    async fn ack_stop(
        &self,
        request: Request<v1::AckStopRequest>,
    ) -> Result<Response<v1::AckStopReply>, Status> {
        self.check_daemon(&request)?;
        let request = request.into_inner();
        let (node, task) = (NodeId(request.node_id), TaskId(request.task_id));
        let reply = self
            .am
            .apply(|master| {
                let applied = master.ack_stop(node, task, request.stop_row, self.am.now_ms());
                Ok(applied.map(|commands| v1::AckStopReply {
                    commands: wire::commands(master.plan(), master.added_sources(), commands),
                }))
            })
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
        let reply = self
            .am
            .commit_checkpoint(wire::rank_commit(request.into_inner()))
            .await?;
        Ok(Response::new(reply))
    }

    async fn restore_data_checkpoint(
        &self,
        request: Request<v1::RestoreDataCheckpointRequest>,
    ) -> Result<Response<v1::RestoreDataCheckpointReply>, Status> {
        let request = request.into_inner();
        let reply = self.am.restore(&request.token, request.rank).await?;
        Ok(Response::new(reply))
    }
}

#[tonic::async_trait]
impl ControlService for AmService {
    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusReply>, Status> {
        Ok(Response::new(self.am.status()))
    }

    async fn scale_role(
        &self,
        request: Request<v1::ScaleRoleRequest>,
    ) -> Result<Response<v1::ScaleRoleReply>, Status> {
        let request = request.into_inner();
        let scaled = self
            .am
            .apply(|master| master.scale(&request.role, request.num))
            .await?;
        Ok(Response::new(wire::scale_reply(scaled)))
    }

    async fn stop(
        &self,
        request: Request<v1::StopRequest>,
    ) -> Result<Response<v1::StopReply>, Status> {
        let reason = request.into_inner().reason;
        let state = self.am.apply(|master| Ok(master.stop(reason))).await?;
        Ok(Response::new(v1::StopReply {
            state: v1::JobState::from(state) as i32,
        }))
    }

    async fn add_source(
        &self,
        request: Request<v1::AddSourceRequest>,
    ) -> Result<Response<v1::AddSourceReply>, Status> {
        let added = self.am.add_source(request.into_inner().source).await?;
        Ok(Response::new(wire::source_added(added)))
    }
}

/// Plans a source to add to the running job on a thread and runtime of its own, as the follower
/// plans what it finds: listing a large source or reading its footers never holds up the AM's
/// gRPC workers.
async fn plan_added_source(
    spec: JobSpec,
    index: u32,
    source: SourceSpec,
) -> Result<(JobPlan, Option<u64>), AmError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let thread_error = |error: std::io::Error| {
        AmError::FailedPrecondition(format!(
            "starting a thread to plan the source: {error}; try again"
        ))
    };
    std::thread::Builder::new()
        .name("sluice-add-source".to_owned())
        .spawn(move || {
            let planned = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(thread_error)
                .and_then(|runtime| {
                    runtime.block_on(JobPlan::for_added_source(&spec, index, &source))
                });
            let _ = sender.send(planned);
        })
        .map_err(thread_error)?;
    receiver.await.map_err(|_| {
        AmError::FailedPrecondition("planning the source stopped; try again".to_owned())
    })?
}

/// A fresh shared token for a job: 32 bytes from the kernel's random source, hex-encoded.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0_u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Checks the shared token of a request, when the AM has one: the one check of the gRPC API, the
/// JSON API on its port and the status page.
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

    /// Whether a call that presents `given` as its token passes: every call when the AM has no
    /// token, otherwise one that presents it. The bytes are compared in constant time, so the time
    /// an answer takes does not tell a caller how much of a guess was right.
    pub fn accepts(&self, given: Option<&str>) -> bool {
        match &self.expected {
            None => true,
            Some(expected) => {
                given.is_some_and(|given| bool::from(given.as_bytes().ct_eq(expected.as_bytes())))
            }
        }
    }

    /// Whether a call whose `authorization` header is `header` passes: see [`TokenCheck::accepts`]
    /// for the token of a `Bearer <token>` header.
    pub fn accepts_authorization(&self, header: Option<&str>) -> bool {
        self.accepts(header.and_then(|value| value.strip_prefix("Bearer ")))
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok());
        if self.accepts_authorization(authorization) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "this AM requires its shared token; pass --token or set SLUICE_TOKEN to the AM's token",
            ))
        }
    }
}

/// One pass of [`Am::supervise`]: the changes it recorded, and the executors to start once they
/// are durable.
#[must_use = "the recorded launches start only through Am::launch, once `durable` resolves"]
pub struct Supervision {
    /// Resolves once every change of the pass is durable.
    pub durable: Durable,
    /// The executors whose launches were recorded, for [`Am::launch`].
    pub launches: Vec<LaunchSpec>,
}

impl std::fmt::Debug for Supervision {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Supervision")
            .field("launches", &self.launches)
            .finish_non_exhaustive()
    }
}

/// What the AM needs to launch its executors: a launcher, and what the executors are told.
#[derive(Debug, Clone)]
pub struct ExecutorLauncher {
    /// The launcher.
    pub launcher: Arc<dyn Launcher>,
    /// The executors' commands and environment.
    pub setup: ExecutorSetup,
}

/// How the AM's executors are started: the `sluice` binary daemons run, where rings and the API
/// are, and how executors prove themselves to it.
#[derive(Debug, Clone)]
pub struct ExecutorSetup {
    /// The `sluice` binary, for `sluice daemon`.
    pub sluice: std::path::PathBuf,
    /// The directory rings live under (`<ring_dir>/<job>/<rank>.ring`).
    pub ring_dir: std::path::PathBuf,
    /// The group the daemons share their rings with (their `--shared-group`), if any.
    pub shared_group: Option<String>,
    /// The size of each ring the daemons create, in bytes.
    pub ring_size: u64,
    /// The AM's API address (gRPC, and the JSON checkpoint calls) as executors reach it.
    pub am_address: String,
    /// The AM's shared token, passed on to executors.
    pub token: Option<String>,
    /// The CA that signed the AM's certificate, passed on to executors (`SLUICE_TLS_CA`) when the
    /// AM serves TLS.
    pub tls_ca: Option<std::path::PathBuf>,
}

impl ExecutorSetup {
    /// The command and environment of executor `id` of job `spec`, its trainers placed by
    /// `placement`.
    pub fn spec_for(&self, spec: &JobSpec, placement: &Placement, id: &ExecutorId) -> LaunchSpec {
        let mut env = std::collections::BTreeMap::new();
        env.insert("SLUICE_AM".to_owned(), self.am_address.clone());
        if let Some(token) = &self.token {
            env.insert("SLUICE_TOKEN".to_owned(), token.clone());
        }
        if let Some(ca) = &self.tls_ca {
            env.insert("SLUICE_TLS_CA".to_owned(), ca.display().to_string());
        }
        let node = placement.node_of(id);
        let command = match id {
            ExecutorId::Daemon(node) => vec![
                self.sluice.display().to_string(),
                "daemon".to_owned(),
                "--am".to_owned(),
                self.am_address.clone(),
                "--node-id".to_owned(),
                node.to_string(),
                "--ring-dir".to_owned(),
                self.ring_dir.display().to_string(),
                "--ring-size".to_owned(),
                self.ring_size.to_string(),
                "--job".to_owned(),
                spec.name.clone(),
            ]
            .into_iter()
            .chain(
                self.shared_group
                    .iter()
                    .flat_map(|group| ["--shared-group".to_owned(), group.clone()]),
            )
            .collect(),
            ExecutorId::Trainer { role, rank } => {
                let role_spec = spec.roles.iter().find(|candidate| candidate.name == *role);
                env.extend(role_spec.map(|found| found.env.clone()).unwrap_or_default());
                let ring = self.ring_dir.join(&spec.name).join(format!("{rank}.ring"));
                env.insert("SLUICE_RING".to_owned(), ring.display().to_string());
                env.insert("SLUICE_RANK".to_owned(), rank.to_string());
                env.insert(
                    "SLUICE_WORLD_SIZE".to_owned(),
                    placement.world_size().to_string(),
                );
                // The ranks as torchrun gives them, so that `torch.distributed`'s `env://`
                // start-up finds them; a role's own env wins.
                let local_ranks = placement.ranks_of(NodeId(u64::from(node)));
                let local_rank = local_ranks.iter().position(|local| local == rank);
                for (name, value) in [
                    ("RANK", rank.to_string()),
                    ("WORLD_SIZE", placement.world_size().to_string()),
                    ("LOCAL_RANK", local_rank.unwrap_or(0).to_string()),
                    ("LOCAL_WORLD_SIZE", local_ranks.len().max(1).to_string()),
                ] {
                    env.entry(name.to_owned()).or_insert(value);
                }
                role_spec
                    .map(|found| trainer_command(&found.command, *rank, &self.sluice))
                    .unwrap_or_default()
            }
        };
        LaunchSpec {
            id: id.clone(),
            node,
            command,
            env,
        }
    }
}

/// A role's command for `rank`: `{rank}` replaced, and a bare `sluice` program run as the AM's own
/// `sluice` binary, so job specs need not know where it is installed.
fn trainer_command(command: &[String], rank: u32, sluice: &std::path::Path) -> Vec<String> {
    command
        .iter()
        .enumerate()
        .map(|(index, argument)| {
            if index == 0 && argument == "sluice" {
                sluice.display().to_string()
            } else {
                argument.replace("{rank}", &rank.to_string())
            }
        })
        .collect()
}

/// What hangs: a node's daemon, the trainer of one of its rings, or a task its daemon reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct HangKey {
    node: NodeId,
    rank: u32,
    kind: HangKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum HangKind {
    Daemon,
    Trainer,
    /// A task whose source read makes no progress, by id.
    Task(u64),
}

impl HangKey {
    fn of(hang: &v1::Hang) -> HangKey {
        HangKey {
            node: NodeId(hang.node_id),
            rank: hang.rank,
            kind: match hang.kind.as_str() {
                "daemon" => HangKind::Daemon,
                "task" => HangKind::Task(hang.task_id),
                _ => HangKind::Trainer,
            },
        }
    }

    fn what(&self) -> String {
        match self.kind {
            HangKind::Daemon => format!("the daemon of node {}", self.node.0),
            HangKind::Trainer => {
                format!("the trainer of ring {} on node {}", self.rank, self.node.0)
            }
            HangKind::Task(task) => format!(
                "task {task}, read for ring {} by the daemon of node {},",
                self.rank, self.node.0
            ),
        }
    }

    /// What it has not done.
    fn verb(&self) -> &'static str {
        match self.kind {
            HangKind::Daemon => "called the AM",
            HangKind::Trainer => "read",
            HangKind::Task(_) => "given its ring a batch from its source",
        }
    }

    /// Whether starting the node's daemon again is what restarts it.
    fn in_the_daemon(&self) -> bool {
        matches!(self.kind, HangKind::Daemon | HangKind::Task(_))
    }
}

/// Locks one of the AM's bookkeeping mutexes; a poisoned one is taken as it is, since each holds
/// plain values written whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::checkpoint_store::CheckpointStore;
    use crate::clock::simulated::SimulatedClock;
    use crate::launcher::EventChannel;
    use crate::master::calls::{JobPhase, NodeCommand};
    use crate::plan::JobPlan;
    use crate::spec::{Format, JobSpec};
    use tokio::sync::mpsc;

    /// A launcher whose executors end when the test says so.
    #[derive(Debug, Default)]
    struct ScriptedLauncher {
        refused: Mutex<Vec<ExecutorId>>,
        launched: Mutex<Vec<LaunchSpec>>,
        adopted: Mutex<Vec<ExecutorId>>,
        killed: Mutex<Vec<ExecutorId>>,
        terminated: Mutex<Vec<ExecutorId>>,
        events: EventChannel,
    }

    impl ScriptedLauncher {
        /// Executor `id` ends with `exit`.
        fn end(&self, id: ExecutorId, exit: Exit) {
            self.end_by(id, exit, None);
        }

        fn end_by(&self, id: ExecutorId, exit: Exit, cause: Option<&str>) {
            self.events.send(ExecutorEvent::Exited {
                id,
                exit,
                cause: cause.map(str::to_owned),
            });
        }
    }

    /// Opens the AM journal in `directory`, as an AM of the job named `identity` does when it
    /// starts, fencing any AM that had it open.
    async fn open_journal(
        directory: &std::path::Path,
        identity: &str,
    ) -> (
        crate::journal::Journal<crate::master::Entry, crate::master::Snapshot>,
        crate::journal::Recovered<crate::master::Entry, crate::master::Snapshot>,
    ) {
        crate::journal::open(
            &directory.display().to_string(),
            &crate::journal::StorageOptions::default(),
            crate::journal::JournalConfig::new(identity),
        )
        .await
        .expect("open the journal")
    }

    /// An AM of [`master`] that records its changes in `journal`, snapshotting it only hourly.
    fn journaled_am(
        journal: crate::journal::Journal<crate::master::Entry, crate::master::Snapshot>,
    ) -> Am {
        Am::new(
            master(),
            Persist::journal(journal, std::time::Duration::from_secs(3600)),
            CheckpointStore::in_memory(),
        )
    }

    /// One pass of the AM's supervision with the launcher's events so far, as its loop runs it.
    async fn supervise(
        sut: &Am,
        executors: &ExecutorLauncher,
        events: &mut mpsc::UnboundedReceiver<ExecutorEvent>,
    ) {
        let mut ended = Vec::new();
        while let Ok(event) = events.try_recv() {
            ended.push(event);
        }
        let supervision = sut.supervise(executors, ended);
        supervision.durable.await.expect("durable");
        sut.launch(executors, supervision.launches)
            .await
            .expect("durable");
    }

    impl Launcher for ScriptedLauncher {
        fn launch(&self, spec: &LaunchSpec) -> crate::Result<()> {
            if self.refused.lock().expect("lock").contains(&spec.id) {
                return Err(AmError::FailedPrecondition(format!(
                    "{} cannot start",
                    spec.id
                )));
            }
            self.launched.lock().expect("lock").push(spec.clone());
            Ok(())
        }

        fn adopt(&self, id: &ExecutorId) {
            self.adopted.lock().expect("lock").push(id.clone());
        }

        fn terminate(&self, id: &ExecutorId) {
            self.terminated.lock().expect("lock").push(id.clone());
        }

        fn kill(&self, id: &ExecutorId) {
            self.killed.lock().expect("lock").push(id.clone());
            self.end(id.clone(), Exit::Killed);
        }

        fn events(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>> {
            self.events.take()
        }
    }

    /// A scripted launcher for `sut`, its events, after the first pass of supervision launched
    /// every executor.
    async fn started(
        sut: &Am,
    ) -> (
        Arc<ScriptedLauncher>,
        ExecutorLauncher,
        mpsc::UnboundedReceiver<ExecutorEvent>,
    ) {
        let scripted = Arc::new(ScriptedLauncher::default());
        let executors = launcher(&scripted);
        let mut events = scripted.events.take().expect("events");
        supervise(sut, &executors, &mut events).await;
        (scripted, executors, events)
    }

    fn am() -> Am {
        Am::new(master(), Persist::in_memory(), CheckpointStore::in_memory())
    }

    fn master() -> Master {
        let text = r#"
name: sup
data: { sources: [{ uri: "file:///d", format: parquet }], task_rows: 10 }
nodes: 1
roles:
  - { name: worker, num: 2, command: [train, "--out", "/tmp/ids-{rank}"], env: { MODE: fast } }
failover: { max_failures: 1, restart_backoff_ms: 0 }
"#;
        let mut master = one_file_master(text, 20);
        master.launch_executors();
        master
    }

    /// A master of the job spec `text` over one file of `rows` rows.
    pub(crate) fn one_file_master(text: &str, rows: u64) -> Master {
        let spec = Arc::new(JobSpec::parse(text, Format::Yaml).expect("spec"));
        let mut plan = JobPlan::default();
        plan.extend(
            0,
            vec![sluice_formats::Split {
                task_id: 0,
                uri: "file:///d/a.parquet".into(),
                file_size: 1,
                first_row: 0,
                row_count: rows,
                partition_values: Vec::new(),
                delta: None,
                bytes: None,
                identity: None,
            }],
        );
        Master::new(spec, Arc::new(plan)).expect("master")
    }

    fn launcher(scripted: &Arc<ScriptedLauncher>) -> ExecutorLauncher {
        ExecutorLauncher {
            launcher: scripted.clone(),
            setup: ExecutorSetup {
                sluice: "/usr/bin/sluice".into(),
                ring_dir: "/dev/shm/sluice".into(),
                shared_group: None,
                ring_size: 1 << 20,
                am_address: "127.0.0.1:7070".into(),
                token: None,
                tls_ca: None,
            },
        }
    }

    fn trainer(rank: u32) -> ExecutorId {
        ExecutorId::Trainer {
            role: "worker".into(),
            rank,
        }
    }

    #[test]
    fn a_bare_sluice_program_is_the_ams_own_binary() {
        let command = |words: &[&str]| -> Vec<String> {
            trainer_command(
                &words
                    .iter()
                    .map(|word| (*word).to_owned())
                    .collect::<Vec<_>>(),
                3,
                std::path::Path::new("/opt/bin/sluice"),
            )
        };
        assert_eq!(
            command(&["sluice", "consume", "--ids-out", "/tmp/{rank}.bin"]),
            ["/opt/bin/sluice", "consume", "--ids-out", "/tmp/3.bin"]
        );
        assert_eq!(
            command(&["python3", "train.py", "sluice"]),
            ["python3", "train.py", "sluice"]
        );
    }

    #[tokio::test]
    async fn executors_are_launched_with_their_commands_and_environment() {
        let sut = am();
        let scripted = Arc::new(ScriptedLauncher::default());
        let mut events = scripted.events.take().expect("events");
        supervise(&sut, &launcher(&scripted), &mut events).await;
        let launched = scripted.launched.lock().expect("lock").clone();
        assert_eq!(launched.len(), 3);
        let daemon = &launched[0];
        assert_eq!(daemon.id, ExecutorId::Daemon(0));
        assert_eq!(
            daemon.command,
            [
                "/usr/bin/sluice",
                "daemon",
                "--am",
                "127.0.0.1:7070",
                "--node-id",
                "0",
                "--ring-dir",
                "/dev/shm/sluice",
                "--ring-size",
                "1048576",
                "--job",
                "sup"
            ]
        );
        let rank_one = &launched[2];
        assert_eq!(rank_one.id, trainer(1));
        assert_eq!(rank_one.command, ["train", "--out", "/tmp/ids-1"]);
        assert_eq!(rank_one.env["SLUICE_RING"], "/dev/shm/sluice/sup/1.ring");
        assert_eq!(rank_one.env["SLUICE_RANK"], "1");
        assert_eq!(rank_one.env["SLUICE_WORLD_SIZE"], "2");
        assert_eq!(rank_one.env["SLUICE_AM"], "127.0.0.1:7070");
        assert_eq!(rank_one.env["MODE"], "fast");
        for (name, value) in [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
        ] {
            assert_eq!(rank_one.env[name], value, "{name}, as torchrun sets it");
        }
        let status = sut.master().status(0);
        assert_eq!(status.roles[0].running, 2);
    }

    #[tokio::test]
    async fn a_failed_trainer_is_relaunched_and_success_of_every_trainer_ends_the_job() {
        let sut = am();
        let (scripted, executors, mut events) = started(&sut).await;
        scripted.end(trainer(0), Exit::Code(5));
        supervise(&sut, &executors, &mut events).await;
        assert_eq!(
            scripted.launched.lock().expect("lock").len(),
            4,
            "rank 0 relaunched"
        );
        let status = sut.master().status(0);
        assert_eq!(status.trainers[0].restarts, 1);
        assert_eq!(status.trainers[0].exit_code, Some(5));
        for rank in [0, 1] {
            scripted.end(trainer(rank), Exit::Code(0));
        }
        supervise(&sut, &executors, &mut events).await;
        assert_eq!(sut.master().outcome(), Some(JobPhase::Succeeded));
        assert!(
            sut.finished(),
            "no daemon registered, so none waits for its shutdown"
        );
        sut.kill_executors(&executors);
        assert_eq!(
            *scripted.killed.lock().expect("lock"),
            vec![ExecutorId::Daemon(0)],
            "the daemon still running is killed when the AM exits"
        );
    }

    #[tokio::test]
    async fn an_am_taking_the_job_over_adopts_the_executors_that_still_run() {
        let first = am();
        let (scripted, executors, mut events) = started(&first).await;
        scripted.end(trainer(0), Exit::Code(0));
        supervise(&first, &executors, &mut events).await;

        let mut master = master();
        master.launch_executors();
        master
            .restore_snapshot(first.master().snapshot())
            .expect("restore");
        let second = Am::new(master, Persist::in_memory(), CheckpointStore::in_memory());
        let adopting = Arc::new(ScriptedLauncher::default());
        second.adopt_executors(&launcher(&adopting));
        assert_eq!(
            *adopting.adopted.lock().expect("lock"),
            vec![ExecutorId::Daemon(0), trainer(1)],
            "the trainer that succeeded is not followed again"
        );
        assert!(adopting.launched.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn a_failed_executor_waits_longer_after_each_failure_before_it_is_launched_again() {
        let text = r#"
name: backoff
data: { sources: [{ uri: "file:///d", format: parquet }], task_rows: 10 }
nodes: 1
roles:
  - { name: worker, num: 1, command: [train] }
failover: { max_failures: 5, restart_backoff_ms: 100, restart_backoff_max_ms: 300 }
"#;
        let mut master = one_file_master(text, 20);
        master.launch_executors();
        let clock = Arc::new(SimulatedClock::at_wall(0));
        let sut = Am::with_clock(
            master,
            Persist::in_memory(),
            CheckpointStore::in_memory(),
            clock.clone(),
        );
        let (scripted, executors, mut events) = started(&sut).await;
        let launches = |scripted: &ScriptedLauncher| {
            scripted
                .launched
                .lock()
                .expect("lock")
                .iter()
                .filter(|spec| spec.id == trainer(0))
                .count()
        };
        assert_eq!(launches(&scripted), 1);
        for (failure, wait_ms) in [(1, 100), (2, 200), (3, 300), (4, 300)] {
            scripted.end(trainer(0), Exit::Code(1));
            supervise(&sut, &executors, &mut events).await;
            assert_eq!(
                launches(&scripted),
                failure,
                "failure {failure}: not at once"
            );
            clock.advance(Duration::from_millis(wait_ms - 1));
            supervise(&sut, &executors, &mut events).await;
            assert_eq!(
                launches(&scripted),
                failure,
                "failure {failure}: not before {wait_ms} ms"
            );
            clock.advance(Duration::from_millis(1));
            supervise(&sut, &executors, &mut events).await;
            assert_eq!(
                launches(&scripted),
                failure + 1,
                "failure {failure}: after {wait_ms} ms"
            );
        }
    }

    #[tokio::test]
    async fn a_trainer_past_max_failures_fails_the_job_and_the_others_are_stopped() {
        let sut = am();
        let (scripted, executors, mut events) = started(&sut).await;
        scripted.end_by(trainer(0), Exit::Code(1), Some("an earlier cause"));
        supervise(&sut, &executors, &mut events).await;
        scripted.end_by(
            trainer(0),
            Exit::Killed,
            Some("OOMKilled: over its 1Gi limit"),
        );
        supervise(&sut, &executors, &mut events).await;
        assert_eq!(sut.master().outcome(), Some(JobPhase::Failed));
        let reason = sut.master().failure_reason().expect("a reason");
        assert!(
            reason.contains("trainer-worker-0 failed 2 times")
                && reason.ends_with("; trainer-worker-0 last ended: OOMKilled: over its 1Gi limit"),
            "the launcher's cause of the last end is named: {reason}"
        );
        assert!(
            scripted.killed.lock().expect("lock").contains(&trainer(1)),
            "the other trainer is stopped"
        );
    }

    /// Two nodes and no executors; a node silent for a second is lost.
    fn two_node_master() -> Master {
        let text = r#"
name: clock
data: { sources: [{ uri: "file:///d", format: parquet }], task_rows: 10 }
nodes: 2
roles:
  - { name: worker, num: 2, command: [train] }
failover: { heartbeat_interval_ms: 100, heartbeat_timeout_ms: 1000 }
"#;
        one_file_master(text, 20)
    }

    const HOUR_MS: u64 = 3_600_000;

    async fn register_node(service: &AmService, node: u64) {
        service
            .register(Request::new(v1::RegisterRequest {
                node_id: node,
                job_id: "clock".into(),
                ..v1::RegisterRequest::default()
            }))
            .await
            .expect("registered");
    }

    async fn heartbeat_node(service: &AmService, node: u64) {
        service
            .heartbeat(Request::new(v1::HeartbeatRequest {
                node_id: node,
                ..v1::HeartbeatRequest::default()
            }))
            .await
            .expect("heartbeat");
    }

    fn node_states(am: &Am) -> Vec<v1::NodeState> {
        am.status()
            .nodes
            .iter()
            .map(|node| v1::NodeState::try_from(node.state).expect("a node state"))
            .collect()
    }

    #[tokio::test]
    async fn a_step_of_the_wall_clock_expires_no_node_and_a_silent_node_is_still_lost() {
        let clock = Arc::new(SimulatedClock::at_wall(400_000 * HOUR_MS));
        let am = Arc::new(Am::with_clock(
            two_node_master(),
            Persist::in_memory(),
            CheckpointStore::in_memory(),
            clock.clone(),
        ));
        let sut = AmService::new(am.clone(), false);
        register_node(&sut, 0).await;
        register_node(&sut, 1).await;
        let alive = [v1::NodeState::Alive, v1::NodeState::Alive];
        // Each step: the nodes heartbeat, the wall clock is set, then the AM ticks.
        let steps = [
            ("forward by six hours", 400_006 * HOUR_MS),
            ("back by nine hours", 399_997 * HOUR_MS),
            ("forward by a day", 400_021 * HOUR_MS),
            ("back to the epoch", 0),
        ];
        for (step, wall_ms) in steps {
            clock.advance(Duration::from_millis(300));
            heartbeat_node(&sut, 0).await;
            heartbeat_node(&sut, 1).await;
            clock.set_wall(wall_ms);
            am.tick().await.expect("tick");
            assert_eq!(node_states(&am), alive, "wall clock {step}");
        }
        // Node 1 stops; the wall clock steps back by an hour at every tick, so that on the wall
        // clock it would never be silent for long.
        for _ in 0..5 {
            clock.advance(Duration::from_millis(300));
            heartbeat_node(&sut, 0).await;
            clock.set_wall(clock.wall_ms().saturating_sub(HOUR_MS));
            am.tick().await.expect("tick");
        }
        assert_eq!(
            node_states(&am),
            [v1::NodeState::Alive, v1::NodeState::Lost],
            "a node silent for 1.5 s of a 1 s timeout is lost"
        );
    }

    /// `(task, enqueued, consumed)` counts as a daemon reports them.
    fn heartbeat_request(node: u64, counts: &[(u64, u64, u64)]) -> v1::HeartbeatRequest {
        v1::HeartbeatRequest {
            node_id: node,
            progress: counts
                .iter()
                .map(|&(task_id, enqueued, consumed)| v1::TaskProgress {
                    task_id,
                    enqueued,
                    consumed,
                    bad: Vec::new(),
                    sent: 0,
                    dropped: Vec::new(),
                })
                .collect(),
            ..v1::HeartbeatRequest::default()
        }
    }

    /// Registers node 0 of job `sup` at time 0.
    async fn register_node_0(sut: &Am) {
        let register = v1::RegisterRequest {
            node_id: 0,
            job_id: "sup".into(),
            ..v1::RegisterRequest::default()
        };
        sut.apply(|master| master.register(wire::registration(register), 0))
            .await
            .expect("registered");
    }

    #[tokio::test]
    async fn only_a_heartbeat_that_changes_nothing_but_counts_answers_before_its_entries_are_durable()
     {
        let sut = am();
        register_node_0(&sut).await;
        let reply = sut
            .apply(|master| Ok(master.acquire(NodeId(0), 2, true, 1)))
            .await
            .expect("acquired");
        let tasks: Vec<u64> = reply
            .iter()
            .filter_map(|command| match command {
                NodeCommand::Assign(tasks) => Some(tasks.clone()),
                _ => None,
            })
            .flatten()
            .map(|assignment| assignment.task.0)
            .collect();
        assert_eq!(tasks.len(), 2, "both tasks of 10 rows handed out");

        let (_, durable) = sut.record_heartbeat(heartbeat_request(0, &[(tasks[0], 6, 4)]));
        assert!(durable.is_none(), "counts alone answer at once");
        let (_, durable) = sut.record_heartbeat(heartbeat_request(0, &[(tasks[0], 6, 4)]));
        assert!(
            durable.is_none(),
            "counts that change nothing answer at once"
        );
        let (_, durable) = sut.record_heartbeat(heartbeat_request(0, &[(tasks[0], 10, 10)]));
        assert!(
            durable.is_some(),
            "a task done waits: the daemon lets it go on the answer"
        );
        let (reply, durable) = sut.record_heartbeat(heartbeat_request(0, &[(tasks[0], 10, 10)]));
        assert!(
            reply.commands.is_empty() && durable.is_none(),
            "a task done reported again changes nothing"
        );
        let (reply, durable) = sut.record_heartbeat(heartbeat_request(0, &[(99, 1, 1)]));
        assert!(
            !reply.commands.is_empty() && durable.is_some(),
            "a refusal waits"
        );
        let (_, durable) = sut.record_heartbeat(heartbeat_request(0, &[(tasks[1], 10, 10)]));
        assert!(durable.is_some(), "the job's end waits");
        assert_eq!(
            sut.master().table().outcome(),
            Some(&crate::decide::JobOutcome::Succeeded)
        );
    }

    #[tokio::test]
    async fn a_heartbeat_that_finishes_a_task_a_daemon_keeps_answers_at_once_with_the_journals_mark()
     {
        let directory = tempfile::tempdir().expect("tempdir");
        let (journal, _) = open_journal(directory.path(), "sup").await;
        let am = Arc::new(journaled_am(journal));
        let sut = AmService::new(am.clone(), false);
        sut.register(Request::new(v1::RegisterRequest {
            node_id: 0,
            job_id: "sup".into(),
            ..v1::RegisterRequest::default()
        }))
        .await
        .expect("registered");
        let acquire = || {
            sut.acquire_tasks(Request::new(v1::AcquireTasksRequest {
                node_id: 0,
                max_tasks: 2,
                dry: true,
            }))
        };
        let acquired = acquire().await.expect("acquired").into_inner();
        let first = acquired.journal.expect("a journaled AM marks its answers");
        assert!(
            first.durable >= first.appended,
            "{first:?}: an acquisition answers once durable"
        );
        let tasks: Vec<u64> = acquired
            .commands
            .into_iter()
            .filter_map(|command| match command.command {
                Some(v1::command::Command::Assign(assign)) => Some(assign.tasks),
                _ => None,
            })
            .flatten()
            .map(|task| task.task_id)
            .collect();
        assert_eq!(tasks.len(), 2, "both tasks of 10 rows handed out");
        let keeping = |counts: &[(u64, u64, u64)]| v1::HeartbeatRequest {
            keeps_finished_until_durable: true,
            ..heartbeat_request(0, counts)
        };

        let (reply, durable) =
            am.record_heartbeat(keeping(&[(tasks[0], 10, 10), (tasks[1], 2, 1)]));
        assert!(
            durable.is_none(),
            "a task done of a daemon that keeps it answers at once"
        );
        let finished = reply.journal.expect("marked");
        assert_eq!(finished.generation, first.generation);
        assert!(
            finished.appended > first.appended && finished.durable < finished.appended,
            "{finished:?}: the task's end is appended, not yet durable"
        );
        let again = am
            .heartbeat(keeping(&[(tasks[0], 10, 10), (tasks[1], 2, 1)]))
            .await
            .expect("heartbeat");
        assert!(again.commands.is_empty(), "reported again, nothing changes");

        let acquired = acquire().await.expect("acquired").into_inner();
        let later = acquired.journal.expect("marked");
        assert_eq!(later.generation, first.generation);
        assert!(
            later.durable >= finished.appended,
            "{later:?}: the acquisition's answer says the task's end is durable"
        );

        let (journal, recovered) = open_journal(directory.path(), "sup").await;
        let mut replayed = master();
        for entry in recovered.entries {
            replayed.replay(entry).expect("the journal replays");
        }
        assert_eq!(
            replayed.table().task_counts().done,
            1,
            "the task's end is in the journal"
        );
        let next = Persist::journal(journal, Duration::from_secs(3600))
            .mark()
            .expect("a journal's mark");
        assert!(
            next.generation > first.generation,
            "an AM taking the job over writes as a later generation: {next:?} after {first:?}"
        );
    }

    #[tokio::test]
    async fn heartbeats_wait_for_their_entries_while_a_scale_is_under_way() {
        let sut = am();
        register_node_0(&sut).await;
        sut.apply(|master| master.scale("worker", 3))
            .await
            .expect("scaled");
        assert!(sut.master().scaling());
        let (_, durable) = sut.record_heartbeat(heartbeat_request(0, &[]));
        assert!(
            durable.is_some(),
            "a daemon reports its final counts during a scale, then removes its rings"
        );
    }

    #[tokio::test]
    async fn an_am_taking_a_job_over_continues_the_journals_clock_so_a_later_am_replays_its_decisions()
     {
        let directory = tempfile::tempdir().expect("tempdir");
        let open = || open_journal(directory.path(), "clock");
        let interval = Duration::from_secs(3600);

        // The first AM has run for five hours when the nodes register.
        let (journal, _) = open().await;
        let first_clock = Arc::new(SimulatedClock::at_wall(0));
        let first = Arc::new(Am::with_clock(
            two_node_master(),
            Persist::journal(journal, interval),
            CheckpointStore::in_memory(),
            first_clock.clone(),
        ));
        first_clock.advance(Duration::from_secs(5 * 3600));
        register_node(&AmService::new(first.clone(), false), 0).await;
        register_node(&AmService::new(first.clone(), false), 1).await;
        drop(first);

        // The second AM's monotonic clock starts from zero; it takes the job over, and node 1
        // never reports to it.
        let (journal, recovered) = open().await;
        let mut master = two_node_master();
        for entry in recovered.entries {
            master.replay(entry).expect("replay");
        }
        let second_clock = Arc::new(SimulatedClock::at_wall(0));
        let second = Arc::new(Am::with_clock(
            master,
            Persist::journal(journal, interval),
            CheckpointStore::in_memory(),
            second_clock.clone(),
        ));
        second.take_over();
        assert!(
            second.now_ms() >= 5 * HOUR_MS,
            "the clock continues from the journal's latest time: {}",
            second.now_ms()
        );
        let service = AmService::new(second.clone(), false);
        second_clock.advance(Duration::from_millis(900));
        heartbeat_node(&service, 0).await;
        second.tick().await.expect("tick");
        assert_eq!(
            node_states(&second),
            [v1::NodeState::Alive, v1::NodeState::Alive],
            "a node gets a full timeout to report to a new AM"
        );
        for _ in 0..3 {
            second_clock.advance(Duration::from_millis(300));
            heartbeat_node(&service, 0).await;
            second.tick().await.expect("tick");
        }
        assert_eq!(
            node_states(&second),
            [v1::NodeState::Alive, v1::NodeState::Lost]
        );
        drop(service);
        drop(second);

        let (_, recovered) = open().await;
        let mut third = two_node_master();
        for entry in recovered.entries {
            third.replay(entry).expect("replay");
        }
        assert_eq!(
            third.table().node_status(crate::decide::NodeId(1)),
            Some(crate::decide::NodeStatus::Lost),
            "the loss the second AM decided replays"
        );
        assert_eq!(
            third.table().node_status(crate::decide::NodeId(0)),
            Some(crate::decide::NodeStatus::Alive)
        );
    }

    #[tokio::test]
    async fn launches_wait_for_their_records_and_a_fenced_am_launches_nothing() {
        let directory = tempfile::tempdir().expect("tempdir");
        let open = || open_journal(directory.path(), "fenced");
        let sut = journaled_am(open().await.0);
        let scripted = Arc::new(ScriptedLauncher::default());
        let executors = launcher(&scripted);
        let (_newer, _) = open().await;

        let supervision = sut.supervise(&executors, Vec::new());
        assert_eq!(
            supervision.launches.len(),
            3,
            "the daemon and two trainers are due"
        );
        assert!(
            scripted.launched.lock().expect("lock").is_empty(),
            "nothing starts before its launch is durable"
        );
        let error = supervision
            .durable
            .await
            .expect_err("the journal was fenced");
        assert!(error.to_string().contains("fenced"), "{error}");
        assert!(sut.journal_lost().is_some(), "the AM steps down");
    }

    #[tokio::test]
    async fn the_executor_changes_supervising_journals_replay_to_the_same_records() {
        let directory = tempfile::tempdir().expect("tempdir");
        let open = || open_journal(directory.path(), "sup");
        let sut = journaled_am(open().await.0);
        let scripted = Arc::new(ScriptedLauncher::default());
        scripted.refused.lock().expect("lock").push(trainer(1));
        let executors = launcher(&scripted);
        let mut events = scripted.events.take().expect("events");
        supervise(&sut, &executors, &mut events).await;
        scripted.end(trainer(0), Exit::Code(4));
        supervise(&sut, &executors, &mut events).await;

        let (_, recovered) = open().await;
        let mut replayed = master();
        for entry in recovered.entries {
            replayed.replay(entry).expect("replay");
        }
        let status = replayed.status(0);
        // Rank 1's launch was refused in both passes and rank 0 exited with code 4.
        assert_eq!(
            status.roles[0].failures, 3,
            "refused launches count as failures"
        );
        assert_eq!(replayed.snapshot(), sut.master().snapshot());
    }
}
