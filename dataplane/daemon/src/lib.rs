//! The Sluice node daemon: it registers with the job's AM, pulls tasks, reads their rows through the
//! formats layer, and writes them as Arrow record batches into one ring per local trainer rank.
//!
//! # Implementation
//! Each rank's ring has a writer thread ([`writer`]) that owns the ring's producer, and a feeder
//! task ([`feeder`]) that reads the tasks given to that ring one after the other and hands their
//! batches to the writer. A task feeds exactly one ring; new tasks go to the ring with the fewest
//! tasks queued. The main loop heartbeats, pulls tasks before the queues run dry, and applies the
//! AM's commands.
//!
//! The daemon is built of rooms, one concern each, that the main loop composes:
//! - [`session`]: the session with the AM: connecting, registering, and the main loop's calls
//!   (heartbeats, task requests, stop acknowledgements, failure reports), tried again while the AM
//!   is unavailable, and the [`lease`] they renew;
//! - [`rings`]: the rings the daemon owns: opened, or taken over from their ledgers after a restart,
//!   surveyed for the counts it reports, stopped and given back;
//! - [`book`]: the task book, which does no IO: the tasks held, their rings, counts and stops, what
//!   to report and when, and how many tasks to ask for;
//! - the feeder pipeline: [`feeder`], [`pipeline`] (read, permute, transform, batch), [`shuffle`],
//!   [`transform`], [`writer`] and [`stats`], the stages' figures;
//! - [`sources`]: the job's sources, opened through the formats layer;
//! - [`metrics`]: the Prometheus endpoint.
//!
//! Positions are the task's order positions: split rows, in the split's delivery order when the
//! job shuffles ([`shuffle`]). The formats layer tells which positions each batch covers, rows a
//! filter or a deletion vector removed included, and a batch record carries exactly that range
//! ([`pipeline`]); the ranges of a task's batches tile it. A task's *enqueued* count is the end of
//! its last published batch, its *consumed* count the end of the last batch the trainer released
//! (the ring's read cursor passed it); the AM marks a task done once its consumed count reaches its
//! end.
//!
//! A stop request ("deliver up to row k") is acknowledged with the row where the feeder really
//! stops: `k`, or the end of what it had already handed to the writer if that is further. The
//! feeder cuts the batch that holds that row, so the rows before it go out and the rest do not.
//!
//! # Restarts
//! Everything the daemon reports comes from the rings and their ledgers in shared memory (see
//! [`writer`]): a task is bound to its ring's ledger before its first batch is written, the ledger's
//! consumed ends rise as the writer folds what the trainer released, and a task's slot is freed
//! only once the AM has acknowledged it finished. A daemon started again with the same node id,
//! job and ring directory, while its trainers live, takes over the rings its ledgers name, folds
//! and surveys them, and registers holding every task they list, with consumed = the ledger's
//! consumed end and enqueued = the end of the task's last record still in the ring. The AM gives
//! the tasks it kept back ([`v1::TaskAssignment`]s of tasks already bound to a ring), and each one
//! resumes after its enqueued rows: the batches still in the ring stay there, so the trainer sees no
//! gap and no repeat. Slots of tasks the AM did not give back are freed. A daemon fenced at its
//! registration (the AM declared the node lost and queued its tasks again while no daemon served
//! it) empties its ledgers, registers holding nothing, and writes the fence's error record into
//! each ring that held tasks before anything else, as the fenced daemon would have (below).
//!
//! # Cut off from the AM
//! Every answer from the AM renews the daemon's [`lease`]; while it has lapsed the ring writers
//! publish nothing, so that a node cut off stops feeding its trainers before the AM can declare it
//! lost and queue its tasks elsewhere. When the AM answers with a fence (it did declare the node
//! lost), the daemon fences its rings ([`writer`]): each trainer gets an error record after what
//! its ring held, saying that its reads since the AM last heard from the node are void, its
//! ledgers forget their tasks, and the daemon exits. Until the record is written (a ring that
//! stays full, a daemon killed first) the ledger says it is owed, and the daemon that takes the
//! ring over writes it first. The records the rings still hold are void for good: a binding counts
//! only the records written after it, so a task the AM hands back to the same ring is not counted
//! by its void copies (see [`sluice_ring::ledger`]). While calls fail, the [`session`] looks for
//! the AM's address under the job's checkpoint location, in case the AM was started again on
//! another host. A daemon that gives up on the AM (no answer for `--am-timeout-s`) fences its rings
//! the same way before it exits, since the AM may have declared the node lost meanwhile: a node cut
//! off until its job ended is never heard again, and its trainers learn it from the record.
//!
//! # Scaling
//! When a role is scaled the AM stops every trainer, then sends `Release`: the daemon stops its
//! feeders and writers, surveys each ring a last time (the read cursors are final, since no
//! trainer reads them), reports its tasks' final counts in a heartbeat, removes its rings and
//! ledgers with the rows still unread, and registers again holding nothing; the AM queues the tasks
//! again from their consumed counts. The registration's answer names the ranks to open rings for
//! (none while other daemons still give theirs back; a later `Release` then brings them).

#![forbid(unsafe_code)]

mod attach;
mod book;
mod error;
#[cfg(test)]
mod feed_tests;
mod feeder;
mod lease;
mod metrics;
mod pipeline;
mod rings;
mod session;
mod shuffle;
mod sources;
mod stats;
mod transform;
mod tune;
mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_formats::{BlockCache, CacheConfig};
use sluice_proto::connect::ClientTls;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::{NodeId, TaskId, v1};
use sluice_ring::files::Sharing;

use book::TaskBook;
use feeder::{Control, DecodeRuntime, Job, Pipeline, lock, open_pipeline};
use metrics::{ServedRings, serve_metrics};
use rings::{Recovered, Rings};
use session::Session;
use tune::{HostLimits, Tuning};

pub use error::{DaemonError, Result};
pub use transform::{StepError, TransformError};

/// How often the daemon looks at its rings' read cursors between heartbeats.
const PROGRESS_POLL: Duration = Duration::from_millis(5);

/// With `data.even_batches`, how many rounds (a heartbeat, a request for work) a daemon makes per
/// heartbeat interval while one of its rings starves (see [`starved`]).
const STARVED_ROUNDS: u32 = 10;

/// With `data.even_batches`, whether one of the rings starves: it ran dry, and the tail of the epoch
/// is cut for it by a stop, an acknowledgement and a request for work, a round each; or, with
/// `drop`, its feeder holds as many batches as it may and waits for what the AM allows. Rounds
/// come faster then, so that the epoch's tail is shared out in a fraction of a heartbeat interval
/// per cut, not an interval each.
fn starved(pipeline: &Pipeline, book: &TaskBook, rings: &Rings) -> bool {
    pipeline.shape.even
        && (book.has_dry_ring(|ring| rings.is_empty(ring))
            || (pipeline.shape.drop && rings.holding_full()))
}

/// How a daemon is run.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// The AM's gRPC address.
    pub am: String,
    /// This node's id in the job; without it, the daemon serves the node whose rings it finds on
    /// its host (with `job`), else the node the AM picks for its host's name.
    pub node_id: Option<NodeId>,
    /// Rings are created under `<ring_dir>/<job>/<rank>.ring`.
    pub ring_dir: PathBuf,
    /// Who besides this user may open the rings: by default nobody (files 0600, directories
    /// 0700); trainers running as other users of one group need that group.
    pub sharing: Sharing,
    /// The size of each ring's data region.
    pub ring_size: u64,
    /// The AM's shared token.
    pub token: Option<String>,
    /// How to reach the AM over TLS (its CA, and this daemon's certificate for mTLS).
    pub tls: ClientTls,
    /// How long to keep trying to reach an AM that does not answer.
    pub am_timeout: Duration,
    /// Serve Prometheus `/metrics` (stages and rings) on this address.
    pub http: Option<std::net::SocketAddr>,
    /// The job the daemon was launched for. With it, a daemon started again finds the rings its
    /// node fed under `<ring_dir>/<job>` and takes them over; without it, it starts from nothing.
    pub job: Option<String>,
    /// The local disk cache of remote sources; without it, the job's `data.cache`, if any.
    pub cache: Option<CacheConfig>,
}

/// Runs the daemon until the AM shuts it down.
pub async fn run(options: DaemonOptions) -> Result<()> {
    if let Some(job) = &options.job {
        check_job_name("--job (SLUICE_JOB)", job)?;
    }
    let session = Session::connect(&options).await?;
    let job_id = options.job.clone().unwrap_or_default();
    let mut recovered = Recovered::default();
    if let Some(job) = &options.job {
        let job_dir = options.ring_dir.join(job);
        let node = match options.node_id {
            Some(node) => Some(node),
            None => Recovered::owner(&job_dir)?,
        };
        if let Some(node) = node {
            session.ask_for(node);
            recovered = Recovered::take_over(&job_dir, node)?;
        }
    }
    let mut reply = session.register(&job_id, recovered.held()?).await?;
    check_job_name("the AM's answer to the registration", &reply.job_id)?;
    let node = session.node_id();
    let fenced = reply
        .commands
        .iter()
        .any(|command| matches!(command.command, Some(Cmd::Fence(_))));
    if fenced && !recovered.is_empty() {
        recovered.forget_tasks();
        reply = session.register(&job_id, Vec::new()).await?;
    }
    let data = reply.data.clone().unwrap_or_default();
    // Tasks are read and decoded on a runtime of their own, so that the work never delays the
    // heartbeats, progress and commands of this one.
    let tuning = Arc::new(Tuning::new(
        HostLimits::read(),
        (data.max_threads > 0).then_some(data.max_threads),
        (data.max_read_ahead_bytes > 0).then_some(data.max_read_ahead_bytes),
    ));
    let decode = DecodeRuntime::start(tuning.caps().0)?;
    let cache = open_cache(options.cache.clone(), data.cache.as_ref()).await?;
    let pipeline = Arc::new(open_pipeline(&data, decode.handle(), tuning.clone(), cache).await?);
    let job_dir = options.ring_dir.join(&reply.job_id);
    rings::prepare_dir(&job_dir, options.sharing)?;
    let served = ServedRings::default();
    let metrics = match options.http {
        Some(address) => {
            Some(serve_metrics(address, node, pipeline.clone(), served.clone()).await?)
        }
        None => None,
    };
    let tuner = tokio::spawn(tune::run(tuning, {
        let served = served.clone();
        move || served.waits()
    }));
    loop {
        let ranks = if reply.attach {
            let interval = heartbeat_interval(&reply);
            match attach::await_trainers(&session, &pipeline, &job_dir, interval).await? {
                attach::Waited::Ranks { ranks, settled } => {
                    // After the registration's own: the later counts win.
                    reply.commands.extend(settled.map(|told| v1::Command {
                        command: Some(Cmd::Settled(told)),
                    }));
                    ranks
                }
                attach::Waited::Shutdown => break,
                attach::Waited::Release => {
                    reply = session.register(&job_id, Vec::new()).await?;
                    continue;
                }
            }
        } else {
            reply.ranks.clone()
        };
        let rings = Rings::open(
            &job_dir,
            &ranks,
            reply.world_size,
            options.ring_size,
            node,
            &mut recovered,
            &pipeline,
            session.lease(),
            reply.current_epoch,
        )?;
        recovered.leave_unserved();
        served.set(rings.states());
        tracing::info!(
            node = node.0,
            job = reply.job_id,
            ?ranks,
            "daemon serves its rings"
        );
        let ended = serve(&session, &pipeline, rings, reply).await;
        served.clear();
        match ended? {
            Ended::Shutdown => break,
            Ended::GaveBack => {
                reply = session.register(&job_id, Vec::new()).await?;
            }
        }
    }
    tuner.abort();
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    tracing::info!(node = node.0, "daemon shut down");
    Ok(())
}

/// Opens the cache of the daemon's `--cache-dir`, else of the job's `data.cache`; `None` without
/// either.
async fn open_cache(
    flags: Option<CacheConfig>,
    spec: Option<&v1::CacheData>,
) -> Result<Option<Arc<BlockCache>>> {
    let Some(config) = flags.or_else(|| {
        spec.map(|cache| CacheConfig {
            dir: PathBuf::from(&cache.dir),
            max_bytes: cache.max_bytes,
        })
    }) else {
        return Ok(None);
    };
    let opened = tokio::task::spawn_blocking(move || BlockCache::open(&config))
        .await
        .map_err(|error| DaemonError::CacheOpenPanicked(error.to_string()))?
        .map_err(DaemonError::Cache)?;
    tracing::info!(
        dir = %opened.dir().display(),
        held_bytes = opened.figures().bytes_held,
        "remote sources are cached on local disk"
    );
    Ok(Some(opened))
}

/// Refuses a job name that cannot be one directory under the ring directory (`..`, a path, an
/// absolute path), as the spec's validation refuses it.
fn check_job_name(from: &'static str, name: &str) -> Result<()> {
    match sluice_proto::slug_problem(name, sluice_proto::JOB_NAME_MAX_LEN) {
        Some((problem, fix)) => Err(DaemonError::JobName {
            from,
            name: name.to_owned(),
            problem,
            fix,
        }),
        None => Ok(()),
    }
}

/// How serving one registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The AM shut the daemon down.
    Shutdown,
    /// A role was scaled: the daemon gave its tasks and rings back and registers again.
    GaveBack,
}

/// Serves one registration: applies the AM's commands, pulls tasks, heartbeats, and reports, until
/// the AM shuts the daemon down or asks for its rings back. The task book decides; this loop reads
/// the rings and the feeders for it, and does what it answers.
async fn serve(
    session: &Session,
    pipeline: &Pipeline,
    mut rings: Rings,
    reply: v1::RegisterReply,
) -> Result<Ended> {
    let served = serve_rings(session, pipeline, &mut rings, reply).await;
    if let Err(DaemonError::Unreachable { seconds, .. }) = &served {
        // The AM may have declared the node lost meanwhile: its trainers are told that their
        // last reads may be void, and nothing of this generation counts from here on.
        rings
            .fence(&writer::gave_up_message(session.node_id(), *seconds))
            .await?;
    }
    served
}

/// [`serve`], with the rings it serves.
async fn serve_rings(
    session: &Session,
    pipeline: &Pipeline,
    rings: &mut Rings,
    reply: v1::RegisterReply,
) -> Result<Ended> {
    let interval = heartbeat_interval(&reply);
    let mut book = TaskBook::new(
        session.node_id(),
        rings.ranks(),
        pipeline.shape.window(),
        interval,
    );
    // What each held task's feeder shares with this loop.
    let mut controls: BTreeMap<TaskId, Arc<Mutex<Control>>> = BTreeMap::new();
    let mut pending = reply.commands;
    let mut registering = true;
    loop {
        let mut ended = None;
        for command in pending.drain(..) {
            match command.command {
                Some(Cmd::Assign(assign)) => {
                    pipeline.learn_sources(assign.sources);
                    for assignment in assign.tasks {
                        take_task(assignment, rings, &mut book, &mut controls)?;
                    }
                }
                Some(Cmd::Stop(stop)) => {
                    let task_id = TaskId(stop.task_id);
                    if let Some(control) = controls.get(&task_id) {
                        // Held while the stop applies, so that the feeder hands out nothing more.
                        let mut control = lock(control);
                        if let Some(stopped) = book.stop(task_id, stop.row, control.sent_end) {
                            tracing::debug!(%task_id, asked = stop.row, at = stopped.at, "stop applied");
                            control.stop = Some(stopped.at);
                            rings.set_end(stopped.ring, task_id, stopped.at);
                        }
                    }
                }
                Some(Cmd::Shutdown(_)) => ended = Some(Ended::Shutdown),
                Some(Cmd::Release(_)) => {
                    // The commands after it were meant for the rings given back.
                    ended = Some(Ended::GaveBack);
                    break;
                }
                Some(Cmd::Fence(_)) => {
                    rings
                        .fence(&writer::fence_message(session.node_id()))
                        .await?;
                    return Err(DaemonError::Fenced);
                }
                Some(Cmd::Settled(settled)) => rings.settle(&settled),
                Some(Cmd::Refuse(refuse)) => {
                    tracing::warn!(message = refuse.message, "the AM refused part of a request")
                }
                None => {}
            }
        }
        match ended {
            Some(Ended::Shutdown) => {
                rings.end().await?;
                return Ok(Ended::Shutdown);
            }
            Some(Ended::GaveBack) => {
                give_back(session, pipeline, rings, &mut book).await?;
                return Ok(Ended::GaveBack);
            }
            None => {}
        }
        if registering {
            // The registration's answer gave back every task the AM kept on this node; the AM
            // has the others finished, or queued again, so their slots describe nothing.
            registering = false;
            rings.free_unheld(|task_id| book.holds(task_id));
        }
        for (task_id, stop_row) in book.take_acks() {
            pending.extend(session.ack_stop(task_id, stop_row).await?);
        }
        let wanted = book.wanted();
        if wanted > 0 {
            let dry = book.has_dry_ring(|ring| rings.is_empty(ring));
            let answer = session.acquire_tasks(wanted, dry).await?;
            tracing::debug!(
                wanted,
                dry,
                answer = answer.commands.len(),
                "asked for tasks"
            );
            // Before the new tasks are taken: one may be a finished task's id in a new epoch.
            if let Some(mark) = &answer.journal {
                let_go(book.journal_marked(mark), rings, &mut controls);
            }
            pending.extend(settle_now(answer.commands, rings));
        }
        // Commands are taken at once, but stops wait for the next round: with `data.even_batches`
        // the answer to this node's own request for work may ask it to stop one of its own tasks,
        // and taking that at once, acknowledging and asking again could go on without a heartbeat.
        if pending
            .iter()
            .any(|command| !matches!(command.command, Some(Cmd::Stop(_) | Cmd::Refuse(_))))
        {
            continue;
        }
        // A ring is surveyed (its released records folded into the ledger) at the start of the
        // interval and whenever its trainer released more.
        let waiting = Instant::now();
        let mut surveys_due = true;
        loop {
            rings.survey(surveys_due);
            surveys_due = false;
            tokio::time::sleep(PROGRESS_POLL.min(interval)).await;
            book.record(rings.counts(book.placed()));
            for (task_id, control) in &controls {
                let mut control = lock(control);
                // Before the rings' batch counts, which the heartbeat reads after: a feeder counts
                // a batch before it raises `sent_end` past its rows.
                book.handed(*task_id, control.sent_end);
                book.skipped(*task_id, std::mem::take(&mut control.skipped));
                book.dropped(*task_id, std::mem::take(&mut control.dropped));
                if book.failed(*task_id) {
                    continue;
                }
                if let Some(reason) = &control.failed {
                    book.fail(*task_id, reason, control.sent_end);
                }
            }
            if book.heartbeat_due(waiting.elapsed())
                || (waiting.elapsed() >= interval / STARVED_ROUNDS
                    && starved(pipeline, &book, rings))
            {
                break;
            }
        }
        let failures = book.failures();
        let answer = session
            .heartbeat(
                book.progress(),
                pipeline.stage_stats(),
                rings.stats(),
                pipeline.tuning.report(),
            )
            .await?;
        // The AM has these finished on record: their slots can go.
        let_go(
            book.heartbeat_answered(answer.journal.as_ref()),
            rings,
            &mut controls,
        );
        pending.extend(settle_now(answer.commands, rings));
        for failure in failures {
            pending.extend(
                session
                    .report_failed(failure.task_id, failure.consumed, &failure.reason)
                    .await?,
            );
            if let Some(freed) = book.failure_reported(failure.task_id) {
                controls.remove(&freed.task_id);
                rings.free(freed);
            }
        }
        if let Some(failure) = rings.failure() {
            return Err(failure);
        }
    }
}

/// Hands the feeders the counts of `data.even_batches` the AM settled, at once, and returns the
/// other commands: an answer that carries only counts leaves nothing to do before the heartbeat.
fn settle_now(commands: Vec<v1::Command>, rings: &Rings) -> Vec<v1::Command> {
    commands
        .into_iter()
        .filter(|command| match &command.command {
            Some(Cmd::Settled(settled)) => {
                rings.settle(settled);
                false
            }
            _ => true,
        })
        .collect()
}

/// Frees the ledger slots of the tasks the book let go, and forgets their feeders' controls.
fn let_go(
    freed: Vec<book::Freed>,
    rings: &Rings,
    controls: &mut BTreeMap<TaskId, Arc<Mutex<Control>>>,
) {
    for freed in freed {
        controls.remove(&freed.task_id);
        rings.free(freed);
    }
}

/// How often the AM asked to hear from the daemon, within bounds.
fn heartbeat_interval(reply: &v1::RegisterReply) -> Duration {
    Duration::from_millis(reply.heartbeat_interval_ms.clamp(10, 10_000))
}

/// Takes an assigned task: the book places it, its ring's ledger binds it (or moves its end, for
/// a task the AM gives back after a restart), and its feeder reads what remains of it.
fn take_task(
    assignment: v1::TaskAssignment,
    rings: &Rings,
    book: &mut TaskBook,
    controls: &mut BTreeMap<TaskId, Arc<Mutex<Control>>>,
) -> Result<()> {
    let task_id = TaskId(assignment.task_id);
    let placement = book.assign(&assignment, rings.bound(task_id))?;
    rings.write_ledger(placement.ring, task_id, placement.ledger)?;
    let control = Arc::new(Mutex::new(Control {
        sent_end: placement.resume_at,
        ..Control::default()
    }));
    controls.insert(task_id, control.clone());
    if placement.feed {
        rings.feed(
            placement.ring,
            Job {
                assignment: v1::TaskAssignment {
                    start: placement.resume_at,
                    ..assignment
                },
                control,
            },
        );
    }
    Ok(())
}

/// Gives every task and ring back after a scale: the writers stop and survey their rings a last
/// time (no trainer reads them any more, so the read cursors are final), a heartbeat reports each
/// task's final counts, and the rings and their ledgers are removed with the rows still unread. The
/// AM queues the tasks again from their consumed counts when the daemon registers holding nothing.
async fn give_back(
    session: &Session,
    pipeline: &Pipeline,
    rings: &mut Rings,
    book: &mut TaskBook,
) -> Result<()> {
    let states = rings.give_back().await?;
    let last = book
        .placed()
        .filter_map(|(task_id, ring)| states[ring].ledger().task(task_id.0))
        .map(book::Counts::from)
        .collect::<Vec<_>>();
    book.record(last);
    let progress = book.final_progress();
    let consumed: u64 = progress.iter().map(|task| task.consumed).sum();
    session
        .heartbeat(
            progress,
            pipeline.stage_stats(),
            Vec::new(),
            pipeline.tuning.report(),
        )
        .await?;
    rings::remove(states)?;
    tracing::info!(
        node = session.node_id().0,
        tasks = book.len(),
        consumed,
        "gave every task and ring back"
    );
    Ok(())
}
