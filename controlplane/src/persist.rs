//! Where the AM's changes go before it answers: the job's journal, or nowhere for a job without a
//! `checkpoint` location.
//!
//! # Implementation
//! [`Persist::append`] runs with the master locked. It sequences the call's entries and, when a
//! snapshot is due, captures the master ([`Master::snapshot`], which shares the task table's chunks
//! rather than copying them) and queues the capture at the same point of the journal. The journal
//! encodes and writes the snapshot on its own threads, so the lock is held for the capture only.
//! The call answers once its entries are durable, without waiting for the snapshot: a snapshot only
//! compacts what is already durable. One snapshot is in progress at a time; a due one waits for
//! the previous to be written.

use crate::error::AmError;
use crate::journal::{self, Journal};
use crate::master::{Entry, Master, Snapshot};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Resolves once the entries it was made for are durable.
pub type Durable = BoxFuture<'static, Result<(), AmError>>;

/// Resolves once every one of `durables` has, in order; fails with the first that fails.
pub fn all_durable<F, E>(durables: Vec<F>) -> Durable
where
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    AmError: From<E>,
{
    Box::pin(async move {
        for durable in durables {
            durable.await?;
        }
        Ok(())
    })
}

/// Entries after which a snapshot is written even before the snapshot interval has passed, so that
/// a journal never grows without bound between snapshots.
const SNAPSHOT_AFTER_ENTRIES: u64 = 1 << 20;

/// The AM's journal, or nothing: a job without a checkpoint location cannot be taken over by a new
/// AM.
#[derive(Debug)]
pub struct Persist {
    journal: Option<Journal<Entry, Snapshot>>,
    interval: Duration,
    schedule: Mutex<SnapshotSchedule>,
}

/// When the next snapshot is due.
#[derive(Debug)]
struct SnapshotSchedule {
    /// When the last snapshot was taken.
    taken: Instant,
    /// Entries appended since.
    entries: u64,
    /// The snapshot being encoded and written, until it is durable or failed.
    writing: Option<journal::Durable>,
}

impl SnapshotSchedule {
    fn new() -> SnapshotSchedule {
        SnapshotSchedule {
            taken: Instant::now(),
            entries: 0,
            writing: None,
        }
    }

    /// Whether the last snapshot taken is still being encoded or written. Looks without waiting:
    /// the journal settles the snapshot's handle from its own task.
    fn writing(&mut self) -> bool {
        let Some(writing) = &mut self.writing else {
            return false;
        };
        let mut context = Context::from_waker(futures::task::noop_waker_ref());
        match writing.poll_unpin(&mut context) {
            Poll::Pending => true,
            // A failed snapshot was logged by the journal, and the entries it would have replaced
            // stay; the next one is taken when due.
            Poll::Ready(_) => {
                self.writing = None;
                false
            }
        }
    }
}

impl Persist {
    /// Keeps nothing: changes live only in the AM's memory.
    pub fn in_memory() -> Persist {
        Persist {
            journal: None,
            interval: Duration::MAX,
            schedule: Mutex::new(SnapshotSchedule::new()),
        }
    }

    /// Appends to `journal`, with a compacted snapshot at least every `interval`.
    pub fn journal(journal: Journal<Entry, Snapshot>, interval: Duration) -> Persist {
        Persist {
            journal: Some(journal),
            interval,
            schedule: Mutex::new(SnapshotSchedule::new()),
        }
    }

    /// Makes everything queued durable, the snapshot being written included, then stops the
    /// journal.
    ///
    /// # Errors
    ///
    /// The error that stopped the journal's writer, if a write failed.
    pub async fn close(self) -> Result<(), AmError> {
        match self.journal {
            Some(journal) => Ok(journal.close().await?),
            None => Ok(()),
        }
    }

    /// Why the journal can record nothing more (a newer AM fenced it, or a write failed), once
    /// that happened; `None` while it works, and always without a journal.
    pub fn lost(&self) -> Option<String> {
        Some(self.journal.as_ref()?.failure()?.to_string())
    }

    /// How far the journal is written; `None` without a journal, where every change is recorded
    /// as it is made.
    pub fn mark(&self) -> Option<journal::Mark> {
        self.journal.as_ref().map(Journal::mark)
    }

    /// Sequences `entries` after every earlier append and returns a future that resolves once they
    /// are durable. Called with the master locked, so the journal's order is the order of changes;
    /// a snapshot of `master`, when one is due, follows them, and is written in the background.
    pub fn append(&self, entries: &[Entry], master: &Master) -> Durable {
        let Some(journal) = &self.journal else {
            return Box::pin(std::future::ready(Ok(())));
        };
        let durables: Vec<journal::Durable> =
            entries.iter().map(|entry| journal.append(entry)).collect();
        {
            let mut schedule = self
                .schedule
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            schedule.entries += entries.len() as u64;
            let due = schedule.entries > 0
                && (schedule.taken.elapsed() >= self.interval
                    || schedule.entries >= SNAPSHOT_AFTER_ENTRIES)
                && !schedule.writing();
            if due {
                schedule.taken = Instant::now();
                schedule.entries = 0;
                schedule.writing = Some(journal.snapshot(master.snapshot()));
            }
        }
        all_durable(durables)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{NodeId, TaskId, TaskProgress};
    use crate::journal::{JournalConfig, StorageOptions};
    use crate::master::calls::{Heartbeat, NodeCommand, Registration};
    use crate::service::tests::one_file_master;

    /// Two nodes over 6,000 one-row tasks: the table spans many chunks of slots.
    fn master() -> Master {
        let text = r#"
name: snap
data: { sources: [{ uri: "file:///d", format: parquet }], task_rows: 1 }
nodes: 2
roles:
  - { name: worker, num: 2, command: [train] }
"#;
        one_file_master(text, 6000)
    }

    fn task_ids(commands: &[NodeCommand]) -> Vec<TaskId> {
        commands
            .iter()
            .filter_map(|command| match command {
                NodeCommand::Assign(tasks) => Some(tasks.clone()),
                _ => None,
            })
            .flatten()
            .map(|assignment| assignment.task)
            .collect()
    }

    #[tokio::test]
    async fn snapshots_written_while_the_master_changes_replay_with_the_entries_after_them() {
        let directory = tempfile::tempdir().expect("tempdir");
        let uri = directory.path().display().to_string();
        let options = StorageOptions::default();
        let open =
            || crate::journal::open::<Entry, Snapshot>(&uri, &options, JournalConfig::new("snap"));
        let (journal, _) = open().await.expect("open the journal");
        // A snapshot is due at every append while none is being written.
        let sut = Persist::journal(journal, Duration::ZERO);
        let mut master = master();
        for node in 0..2 {
            let request = Registration {
                node: NodeId(node),
                job_id: "snap".into(),
                hostname: String::new(),
                held: Vec::new(),
                by_host: false,
            };
            let applied = master.register(request, 0).expect("registered");
            sut.append(&applied.entries, &master)
                .await
                .expect("durable");
        }
        for round in 0..100u64 {
            let node = NodeId(round % 2);
            let applied = master.acquire(node, 40, true, round);
            let tasks = task_ids(&applied.reply);
            sut.append(&applied.entries, &master)
                .await
                .expect("durable");
            let request = Heartbeat {
                hostname: String::new(),
                node,
                progress: tasks
                    .iter()
                    .take(30)
                    .map(|task| TaskProgress {
                        task: *task,
                        enqueued: 1,
                        consumed: 1,
                    })
                    .collect(),
                stages: Vec::new(),
                rings: Vec::new(),
                ring_batches: Vec::new(),
                keeps_finished_until_durable: true,
                tuning: None,
                bad: Vec::new(),
                handed: Vec::new(),
                dropped: Vec::new(),
            };
            let applied = master.heartbeat(request, round);
            // Not awaited, as a heartbeat of counts alone is answered.
            drop(sut.append(&applied.entries, &master));
        }
        sut.close().await.expect("everything durable");

        let (_, recovered) = open().await.expect("reopen the journal");
        let snapshot = recovered.snapshot.expect("snapshots were written");
        let mut replayed = self::master();
        replayed.restore_snapshot(snapshot).expect("restore");
        for entry in recovered.entries {
            replayed.replay(entry).expect("replay");
        }
        assert_eq!(replayed.table().task_counts().done, 100 * 30);
        assert_eq!(replayed.snapshot(), master.snapshot());
    }
}
