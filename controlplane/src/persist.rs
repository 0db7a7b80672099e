//! Where the AM's changes go before it answers: the job's journal, or nowhere for a job without a
//! `checkpoint` location.

use crate::error::AmError;
use crate::journal::{self, Journal};
use crate::master::{Entry, Master, Snapshot};
use futures::future::BoxFuture;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Resolves once the entries it was made for are durable.
pub type Durable = BoxFuture<'static, Result<(), AmError>>;

/// Entries after which a snapshot is written even before the snapshot interval has passed, so that
/// a journal never grows without bound between snapshots.
const SNAPSHOT_AFTER_ENTRIES: u64 = 1 << 20;

/// The AM's journal, or nothing: a job without a checkpoint location cannot be taken over by a new
/// AM.
#[derive(Debug)]
pub struct Persist {
    journal: Option<Journal<Entry, Snapshot>>,
    interval: Duration,
    since_snapshot: Mutex<(Instant, u64)>,
}

impl Persist {
    /// Keeps nothing: changes live only in the AM's memory.
    pub fn in_memory() -> Persist {
        Persist {
            journal: None,
            interval: Duration::MAX,
            since_snapshot: Mutex::new((Instant::now(), 0)),
        }
    }

    /// Appends to `journal`, with a compacted snapshot at least every `interval`.
    pub fn journal(journal: Journal<Entry, Snapshot>, interval: Duration) -> Persist {
        Persist {
            journal: Some(journal),
            interval,
            since_snapshot: Mutex::new((Instant::now(), 0)),
        }
    }

    /// Sequences `entries` after every earlier append and returns a future that resolves once they
    /// are durable. Called with the master locked, so the journal's order is the order of changes;
    /// a snapshot of `master`, when one is due, follows them.
    pub fn append(&self, entries: &[Entry], master: &Master) -> Durable {
        let Some(journal) = &self.journal else {
            return Box::pin(std::future::ready(Ok(())));
        };
        let mut durables: Vec<journal::Durable> =
            entries.iter().map(|entry| journal.append(entry)).collect();
        let due = {
            let mut since = self
                .since_snapshot
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            since.1 += entries.len() as u64;
            let due = since.1 > 0
                && (since.0.elapsed() >= self.interval || since.1 >= SNAPSHOT_AFTER_ENTRIES);
            if due {
                *since = (Instant::now(), 0);
            }
            due
        };
        if due {
            durables.push(journal.snapshot(&master.snapshot()));
        }
        Box::pin(async move {
            for durable in durables {
                durable.await?;
            }
            Ok(())
        })
    }
}
