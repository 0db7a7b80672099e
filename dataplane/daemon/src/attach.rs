//! Trainers launched by someone else (the spec's `launcher: { kind: external }`): the daemon waits
//! until every local rank of its node has announced itself (see [`sluice_ring::announce`]), then
//! serves one ring per local rank, named by it.
//!
//! While it waits, the daemon heartbeats holding nothing, so that the AM keeps it alive and can end
//! the wait with a shutdown; every [`WAIT_LOG_INTERVAL`] it logs which local ranks it still waits
//! for, and where.

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_ring::announce::{Announced, announced};

use crate::error::{DaemonError, Result};
use crate::feeder::Pipeline;
use crate::session::Session;

/// How often a daemon that waits for its trainers says so.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How often the announcements are read while waiting.
const POLL: Duration = Duration::from_millis(50);

/// How a wait for the trainers ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Waited {
    /// Every local rank announced itself: open a ring for each of these.
    Ranks {
        /// The local ranks.
        ranks: Vec<u32>,
        /// With `data.even_batches`, the latest counts the AM told while the daemon waited: the
        /// rings start in its current epoch.
        settled: Option<v1::SettledBatches>,
    },
    /// The AM shut the daemon down.
    Shutdown,
    /// A restore began: register again (holding nothing) before waiting on.
    Release,
}

/// Waits until every local rank of the node has announced itself under `job_dir`, answering the
/// AM's commands meanwhile.
pub(crate) async fn await_trainers(
    session: &Session,
    pipeline: &Pipeline,
    job_dir: &Path,
    interval: Duration,
) -> Result<Waited> {
    let started = Instant::now();
    let mut logged = started;
    let mut heartbeat = started;
    let mut settled = None;
    loop {
        let found = announced(job_dir).map_err(|error| DaemonError::Announcements {
            dir: job_dir.to_path_buf(),
            error,
        })?;
        if let Some(size) = found.complete() {
            tracing::info!(
                local_world_size = size,
                ranks = ?found.trainers.iter().map(|trainer| trainer.rank).collect::<Vec<_>>(),
                "every local trainer announced itself"
            );
            return Ok(Waited::Ranks {
                ranks: (0..size).collect(),
                settled,
            });
        }
        if logged.elapsed() >= WAIT_LOG_INTERVAL {
            logged = Instant::now();
            log_wait(job_dir, &found, started.elapsed());
        }
        if heartbeat.elapsed() >= interval {
            heartbeat = Instant::now();
            let commands = session
                .heartbeat(
                    Vec::new(),
                    pipeline.stage_stats(),
                    Vec::new(),
                    pipeline.tuning.report(),
                )
                .await?
                .commands;
            // Holding no task and no ring, the daemon has nothing to stop or give back: a
            // shutdown ends it, a release or a fence sends it to register again.
            for command in commands {
                match command.command {
                    Some(Cmd::Shutdown(_)) => return Ok(Waited::Shutdown),
                    Some(Cmd::Release(_) | Cmd::Fence(_)) => return Ok(Waited::Release),
                    Some(Cmd::Settled(told)) => settled = Some(told),
                    _ => {}
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

fn log_wait(job_dir: &Path, found: &Announced, waited: Duration) {
    for (path, why) in &found.unreadable {
        tracing::warn!(file = %path.display(), %why, "an announcement that cannot be read is passed over");
    }
    let announced: Vec<u32> = found
        .trainers
        .iter()
        .map(|trainer| trainer.local_rank)
        .collect();
    match found.trainers.first() {
        None => tracing::warn!(
            dir = %job_dir.display(),
            waited_s = waited.as_secs(),
            "waiting for the trainers of this node: none has announced itself yet; start them with torchrun, srun or SLUICE_RANK and SLUICE_AM set, and the same ring directory"
        ),
        Some(first) => tracing::warn!(
            dir = %job_dir.display(),
            waited_s = waited.as_secs(),
            local_world_size = first.local_world_size,
            ?announced,
            "waiting for the other trainers of this node"
        ),
    }
}
