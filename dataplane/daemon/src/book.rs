//! The task book: the tasks a daemon holds, which ring each one feeds, their counts and stops, and
//! what to tell the AM and when to ask it for more work.
//!
//! # Implementation
//! The book does no IO: it reads no ring, calls no AM and reads no clock. The serve loop tells it
//! what happened (a task assigned, a stop asked for, the counts a survey of the ledgers found, a
//! feeder's failure, a heartbeat answered, the time waited) and does what it answers (bind a task
//! to a ring's ledger, feed it from a row, acknowledge a stop, free a ledger slot, heartbeat).
//!
//! A task's counts are ends in its rows: *enqueued* the end of what its ring holds or held, and
//! *consumed* the end of what the trainer released. Both only rise: a survey that finds less than
//! the book knows (a ledger read before a fold) changes nothing. The AM receives them relative to
//! the task's start.
//!
//! A stop ("deliver up to row k") moves the task's end to `k`, or to the end of what the feeder
//! had already handed to the writer if that is further, and never past the task's end; the row it
//! moved to is acknowledged to the AM. The caller passes the feeder's handed-out end while it holds
//! the feeder from handing out more, so that no row at or past the acknowledged row is written.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_proto::{NodeId, TaskId, v1};
use sluice_ring::ledger::LedgerTask;

use crate::error::{DaemonError, Result};

/// The tasks a daemon holds, over its rings; see the [module documentation](self).
#[derive(Debug)]
pub(crate) struct TaskBook {
    node: NodeId,
    /// The rank of each ring, by the ring's index.
    ranks: Vec<u32>,
    /// Per ring, the tasks given to it that are not consumed to their end yet.
    queued: Vec<usize>,
    /// How many tasks a ring interleaves.
    window: usize,
    heartbeat_interval: Duration,
    tasks: BTreeMap<TaskId, HeldTask>,
    /// Stops applied and not yet acknowledged to the AM: task and stop row.
    acks: Vec<(TaskId, u64)>,
}

/// A task the daemon holds.
#[derive(Debug)]
struct HeldTask {
    start: u64,
    end: u64,
    ring: usize,
    /// The end of the rows the feeder handed to the writer, as last told.
    sent_end: u64,
    enqueued_end: u64,
    consumed_end: u64,
    failure: Option<Failure>,
    /// The rows skipped because they did not decode, reported with the task's counts.
    skipped: Vec<v1::BadRange>,
    /// How many of `skipped` an answered heartbeat carried.
    skips_answered: usize,
    /// The rows its ring left out of their epoch (`data.even_batches: drop`), reported with the
    /// task's counts.
    dropped: Vec<v1::RowSpan>,
    /// Reported consumed to its end: the generation of the AM it was first reported to, and the
    /// end of that AM's journal once the report was appended. The task goes once as much of that
    /// journal is durable.
    reported_done: Option<(u64, u64)>,
}

impl HeldTask {
    /// The end of the rows handed to the writer: at least what the ring holds, at most the end.
    fn sent(&self) -> u64 {
        self.sent_end
            .max(self.enqueued_end)
            .max(self.consumed_end)
            .min(self.end)
    }
}

/// Why a task's feeder failed, and how far it got.
#[derive(Debug)]
struct Failure {
    reason: String,
    /// The end of the rows the feeder had handed to the writer.
    sent_end: u64,
}

/// What to write into a ring's ledger for a task just assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerWrite {
    /// Bind the task to the ring, before any of its rows are read.
    Bind(LedgerTask),
    /// The task is bound already: move its end to this row.
    SetEnd(u64),
}

/// Where a task just assigned goes, and what to do for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The index of the ring the task feeds.
    pub(crate) ring: usize,
    /// What to write into that ring's ledger.
    pub(crate) ledger: LedgerWrite,
    /// The row the task resumes at: the end of its rows enqueued before, or its start.
    pub(crate) resume_at: u64,
    /// Whether rows remain to read, from `resume_at`: the task goes to the ring's feeder.
    pub(crate) feed: bool,
}

/// A stop applied to a task the book holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// The index of the task's ring.
    pub(crate) ring: usize,
    /// The row the task now ends at.
    pub(crate) at: u64,
}

/// What a survey of a ring's ledger found for one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// The task.
    pub(crate) task_id: TaskId,
    /// The end of its rows published into the ring.
    pub(crate) enqueued_end: u64,
    /// The end of its rows the trainer released.
    pub(crate) consumed_end: u64,
}

impl From<LedgerTask> for Counts {
    fn from(entry: LedgerTask) -> Self {
        Counts {
            task_id: TaskId(entry.task_id),
            enqueued_end: entry.enqueued_end,
            consumed_end: entry.consumed_end,
        }
    }
}

/// A task whose feeder failed, to report once its delivered rows are consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedTask {
    /// The task.
    pub(crate) task_id: TaskId,
    /// Why it failed.
    pub(crate) reason: String,
    /// Its rows the trainer consumed, from its start.
    pub(crate) consumed: u64,
}

/// A task the book let go: its slot in the ledger of ring `ring` is to be freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Freed {
    /// The index of the task's ring.
    pub(crate) ring: usize,
    /// The task.
    pub(crate) task_id: TaskId,
}

impl TaskBook {
    /// An empty book for node `node` feeding the rings of `ranks`, each of which interleaves
    /// `window` tasks, heartbeating every `heartbeat_interval`.
    pub(crate) fn new(
        node: NodeId,
        ranks: Vec<u32>,
        window: usize,
        heartbeat_interval: Duration,
    ) -> Self {
        TaskBook {
            node,
            queued: vec![0; ranks.len()],
            ranks,
            window,
            heartbeat_interval,
            tasks: BTreeMap::new(),
            acks: Vec::new(),
        }
    }

    /// Takes an assigned task. `bound` is the ring and ledger slot that already hold the task (the
    /// AM gives the tasks it kept back after a restart): it resumes there after its enqueued rows,
    /// and is refused if the ring and the AM disagree on its rows. A new task goes to the ring with
    /// the fewest tasks queued.
    pub(crate) fn assign(
        &mut self,
        assignment: &v1::TaskAssignment,
        bound: Option<(usize, LedgerTask)>,
    ) -> Result<Placement> {
        let task_id = TaskId(assignment.task_id);
        let (ring, entry, ledger) = match bound {
            Some((ring, entry)) => {
                if entry.start != assignment.start || entry.enqueued_end > assignment.end {
                    return Err(DaemonError::Disagreement {
                        task_id,
                        start: assignment.start,
                        end: assignment.end,
                        rank: self.ranks[ring],
                        bound_start: entry.start,
                        enqueued_end: entry.enqueued_end,
                    });
                }
                let entry = LedgerTask {
                    end: assignment.end,
                    ..entry
                };
                (ring, entry, LedgerWrite::SetEnd(assignment.end))
            }
            None => {
                let ring = (0..self.queued.len())
                    .min_by_key(|index| self.queued[*index])
                    .ok_or(DaemonError::NoRanks { node: self.node })?;
                let entry = LedgerTask {
                    task_id: task_id.0,
                    epoch: assignment.epoch,
                    start: assignment.start,
                    end: assignment.end,
                    consumed_end: assignment.start,
                    enqueued_end: assignment.start,
                };
                (ring, entry, LedgerWrite::Bind(entry))
            }
        };
        self.tasks.insert(
            task_id,
            HeldTask {
                start: entry.start,
                end: entry.end,
                ring,
                sent_end: entry.enqueued_end,
                enqueued_end: entry.enqueued_end,
                consumed_end: entry.consumed_end,
                failure: None,
                skipped: Vec::new(),
                skips_answered: 0,
                dropped: Vec::new(),
                reported_done: None,
            },
        );
        let feed = entry.enqueued_end < entry.end;
        if feed {
            self.queued[ring] += 1;
        }
        Ok(Placement {
            ring,
            ledger,
            resume_at: entry.enqueued_end,
            feed,
        })
    }

    /// Applies the AM's request that task `task_id` stop at `row`, given `sent_end`, the end of what
    /// its feeder has handed to the writer (held still while the caller applies the stop). Returns
    /// where the task now ends, also queued to acknowledge; `None` for a task the book does not hold.
    pub(crate) fn stop(&mut self, task_id: TaskId, row: u64, sent_end: u64) -> Option<Stopped> {
        let task = self.tasks.get_mut(&task_id)?;
        let at = row.max(sent_end).min(task.end);
        task.end = at;
        self.acks.push((task_id, at));
        Some(Stopped {
            ring: task.ring,
            at,
        })
    }

    /// The stops to acknowledge to the AM, task and stop row, in the order they were applied.
    pub(crate) fn take_acks(&mut self) -> Vec<(TaskId, u64)> {
        std::mem::take(&mut self.acks)
    }

    /// How many tasks to ask the AM for: at most one task per ring more than the ring interleaves
    /// not yet consumed, which keeps every ring fed and lets nodes share the work. A task reported
    /// finished and kept only until the AM's record of it is durable does not count.
    pub(crate) fn wanted(&self) -> u32 {
        let enough = (self.window + 1) * self.ranks.len();
        let held = self
            .tasks
            .values()
            .filter(|task| task.reported_done.is_none())
            .count();
        u32::try_from(enough.saturating_sub(held)).unwrap_or(u32::MAX)
    }

    /// Whether one of the rings ran dry: `empty` says it holds nothing unread, and every task it
    /// holds was handed to its writer to the end, or it holds none. With `data.even_batches` the AM
    /// gives tasks queued again only to a daemon that says so.
    pub(crate) fn has_dry_ring(&self, empty: impl Fn(usize) -> bool) -> bool {
        (0..self.ranks.len()).any(|ring| {
            empty(ring)
                && !self
                    .tasks
                    .values()
                    .any(|task| task.ring == ring && task.sent() < task.end)
        })
    }

    /// Every task held, with the index of its ring: where to look for its counts.
    pub(crate) fn placed(&self) -> impl Iterator<Item = (TaskId, usize)> + '_ {
        self.tasks
            .iter()
            .map(|(task_id, task)| (*task_id, task.ring))
    }

    /// Takes what a survey of the ledgers found. Counts only rise; counts of a task the book does
    /// not hold are ignored.
    pub(crate) fn record(&mut self, counts: impl IntoIterator<Item = Counts>) {
        for found in counts {
            if let Some(task) = self.tasks.get_mut(&found.task_id) {
                task.consumed_end = task.consumed_end.max(found.consumed_end);
                task.enqueued_end = task.enqueued_end.max(found.enqueued_end);
            }
        }
        self.queued.iter_mut().for_each(|queued| *queued = 0);
        for task in self.tasks.values() {
            if task.consumed_end < task.end {
                self.queued[task.ring] += 1;
            }
        }
    }

    /// Takes a feeder's failure of task `task_id`, after it handed the writer rows up to
    /// `sent_end`. The first failure of a task counts; one of a task not held is ignored.
    pub(crate) fn fail(&mut self, task_id: TaskId, reason: &str, sent_end: u64) {
        if let Some(task) = self.tasks.get_mut(&task_id)
            && task.failure.is_none()
        {
            task.failure = Some(Failure {
                reason: reason.to_owned(),
                sent_end,
            });
        }
    }

    /// Takes the end of the rows of task `task_id` its feeder handed to the writer; it only rises.
    pub(crate) fn handed(&mut self, task_id: TaskId, sent_end: u64) {
        if let Some(task) = self.tasks.get_mut(&task_id) {
            task.sent_end = task.sent_end.max(sent_end);
        }
    }

    /// Records rows of the held task `task_id` that its feeder skipped because they did not decode;
    /// every later heartbeat reports them with the task's counts.
    pub(crate) fn skipped(&mut self, task_id: TaskId, ranges: Vec<v1::BadRange>) {
        if let Some(task) = self.tasks.get_mut(&task_id) {
            task.skipped.extend(ranges);
        }
    }

    /// Records rows of the held task `task_id` that its ring left out of their epoch; every later
    /// heartbeat reports them with the task's counts, the one that reports them consumed among
    /// them: the feeder tells of them before the writer has their record.
    pub(crate) fn dropped(&mut self, task_id: TaskId, spans: Vec<v1::RowSpan>) {
        if let Some(task) = self.tasks.get_mut(&task_id) {
            task.dropped.extend(spans);
        }
    }

    /// Whether the task `task_id` is held and its failure known.
    pub(crate) fn failed(&self, task_id: TaskId) -> bool {
        self.tasks
            .get(&task_id)
            .is_some_and(|task| task.failure.is_some())
    }

    /// Whether to heartbeat now, `waited` after the last one: once per interval, or as soon as a
    /// task is consumed to its end (and not reported yet), has failed or has skipped rows no
    /// heartbeat carried yet, so that the AM learns it at once and the daemon can pull the next
    /// task.
    pub(crate) fn heartbeat_due(&self, waited: Duration) -> bool {
        let settled = self.tasks.values().any(|task| {
            (task.consumed_end >= task.end && task.reported_done.is_none())
                || task.failure.is_some()
                || task.skips_answered < task.skipped.len()
        });
        settled || waited >= self.heartbeat_interval
    }

    /// Every held task's counts, relative to its start, for a heartbeat.
    pub(crate) fn progress(&self) -> Vec<v1::TaskProgress> {
        self.tasks
            .iter()
            .map(|(task_id, task)| v1::TaskProgress {
                task_id: task_id.0,
                enqueued: task.enqueued_end.saturating_sub(task.start),
                consumed: task.consumed_end.saturating_sub(task.start),
                bad: task.skipped.clone(),
                sent: task.sent().saturating_sub(task.start),
                dropped: task.dropped.clone(),
            })
            .collect()
    }

    /// Every held task's final counts once its ring is given back, each enqueued count at least its
    /// consumed count.
    pub(crate) fn final_progress(&self) -> Vec<v1::TaskProgress> {
        self.tasks
            .iter()
            .map(|(task_id, task)| v1::TaskProgress {
                task_id: task_id.0,
                enqueued: task
                    .enqueued_end
                    .max(task.consumed_end)
                    .saturating_sub(task.start),
                consumed: task.consumed_end.saturating_sub(task.start),
                bad: task.skipped.clone(),
                sent: task.sent().saturating_sub(task.start),
                dropped: task.dropped.clone(),
            })
            .collect()
    }

    /// The failed tasks to report: those whose rows handed to the writer are all consumed.
    pub(crate) fn failures(&self) -> Vec<FailedTask> {
        self.tasks
            .iter()
            .filter_map(|(task_id, task)| {
                let failure = task.failure.as_ref()?;
                (task.consumed_end >= failure.sent_end).then(|| FailedTask {
                    task_id: *task_id,
                    reason: failure.reason.clone(),
                    consumed: task.consumed_end.saturating_sub(task.start),
                })
            })
            .collect()
    }

    /// The AM answered a heartbeat, which reported every task consumed to its end. With `journal`,
    /// the mark of the AM's journal as the answer went out, each such task waits for the end of
    /// the journal then (unless it already waits for an earlier end of the same AM's journal), and
    /// the tasks whose wait is over go. Without (an AM that keeps no journal, or that answers a
    /// heartbeat only once it is recorded), they all go.
    pub(crate) fn heartbeat_answered(&mut self, journal: Option<&v1::JournalMark>) -> Vec<Freed> {
        for task in self.tasks.values_mut() {
            task.skips_answered = task.skipped.len();
        }
        let Some(mark) = journal else {
            let finished: Vec<TaskId> = self
                .tasks
                .iter()
                .filter(|(_, task)| task.consumed_end >= task.end)
                .map(|(task_id, _)| *task_id)
                .collect();
            return finished
                .into_iter()
                .filter_map(|task_id| self.release(task_id))
                .collect();
        };
        for task in self.tasks.values_mut() {
            let reported_to_this_am = task
                .reported_done
                .is_some_and(|(generation, _)| generation == mark.generation);
            if task.consumed_end >= task.end && !reported_to_this_am {
                task.reported_done = Some((mark.generation, mark.appended));
            }
        }
        self.journal_marked(mark)
    }

    /// An answer of the AM says how far its journal is durable: the finished tasks reported to
    /// it whose record is now durable go.
    pub(crate) fn journal_marked(&mut self, mark: &v1::JournalMark) -> Vec<Freed> {
        let durable: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, task)| {
                matches!(task.reported_done,
                    Some((generation, end)) if generation == mark.generation && mark.durable >= end)
            })
            .map(|(task_id, _)| *task_id)
            .collect();
        durable
            .into_iter()
            .filter_map(|task_id| self.release(task_id))
            .collect()
    }

    /// The AM took the failure of task `task_id`: the book lets it go, if it still holds it.
    pub(crate) fn failure_reported(&mut self, task_id: TaskId) -> Option<Freed> {
        self.release(task_id)
    }

    fn release(&mut self, task_id: TaskId) -> Option<Freed> {
        self.tasks.remove(&task_id).map(|task| Freed {
            ring: task.ring,
            task_id,
        })
    }

    /// Whether the book holds task `task_id`.
    pub(crate) fn holds(&self, task_id: TaskId) -> bool {
        self.tasks.contains_key(&task_id)
    }

    /// How many tasks the book holds.
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INTERVAL: Duration = Duration::from_millis(100);

    fn assignment(task_id: u64, start: u64, end: u64) -> v1::TaskAssignment {
        v1::TaskAssignment {
            task_id,
            epoch: 0,
            split_index: 0,
            start,
            end,
            split: None,
        }
    }

    fn counts(task_id: u64, enqueued_end: u64, consumed_end: u64) -> Counts {
        Counts {
            task_id: TaskId(task_id),
            enqueued_end,
            consumed_end,
        }
    }

    fn book(rings: u32, window: usize) -> TaskBook {
        TaskBook::new(NodeId(7), (0..rings).collect(), window, INTERVAL)
    }

    #[test]
    fn new_tasks_go_to_the_ring_with_the_fewest_queued_and_are_bound_before_reading() {
        let mut sut = book(2, 1);
        let first = sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert_eq!(
            first,
            Placement {
                ring: 0,
                ledger: LedgerWrite::Bind(LedgerTask {
                    task_id: 1,
                    epoch: 0,
                    start: 0,
                    end: 100,
                    consumed_end: 0,
                    enqueued_end: 0,
                }),
                resume_at: 0,
                feed: true,
            }
        );
        let second = sut.assign(&assignment(2, 50, 80), None).expect("assigns");
        assert_eq!((second.ring, second.resume_at), (1, 50));
        let third = sut.assign(&assignment(3, 0, 10), None).expect("assigns");
        assert_eq!(third.ring, 0, "a tie goes to the first ring");
        assert_eq!(sut.wanted(), 1, "two per ring are enough without a shuffle");
    }

    #[test]
    fn a_ring_is_dry_once_every_task_it_holds_was_handed_to_its_writer_to_the_end() {
        let mut sut = book(2, 1);
        let empty = |_| true;
        assert!(sut.has_dry_ring(empty), "rings without tasks");
        assert!(!sut.has_dry_ring(|_| false), "rings with records unread");
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert!(sut.has_dry_ring(empty), "ring 1 holds nothing");
        sut.assign(&assignment(2, 0, 100), None).expect("assigns");
        assert!(!sut.has_dry_ring(empty), "both rings have rows to write");
        sut.handed(TaskId(2), 60);
        assert!(!sut.has_dry_ring(empty));
        // Stopped where its feeder stands, the task has nothing left to hand.
        sut.stop(TaskId(2), 60, 60).expect("held");
        assert!(sut.has_dry_ring(empty));
        assert!(
            !sut.has_dry_ring(|ring| ring == 0),
            "ring 1 still holds records"
        );
    }

    #[test]
    fn a_task_given_back_resumes_after_its_enqueued_rows_on_its_ring() {
        let mut sut = book(2, 1);
        let bound = LedgerTask {
            task_id: 4,
            epoch: 1,
            start: 10,
            end: 100,
            consumed_end: 20,
            enqueued_end: 40,
        };
        let placed = sut
            .assign(&assignment(4, 10, 60), Some((1, bound)))
            .expect("assigns");
        assert_eq!(
            placed,
            Placement {
                ring: 1,
                ledger: LedgerWrite::SetEnd(60),
                resume_at: 40,
                feed: true,
            }
        );
        assert_eq!(
            sut.progress(),
            vec![v1::TaskProgress {
                task_id: 4,
                enqueued: 30,
                consumed: 10,
                bad: Vec::new(),
                sent: 30,
                dropped: Vec::new(),
            }]
        );
        let done = LedgerTask {
            enqueued_end: 60,
            ..bound
        };
        let placed = sut
            .assign(&assignment(4, 10, 60), Some((1, done)))
            .expect("assigns");
        assert!(!placed.feed, "every row is in the ring already");
    }

    #[test]
    fn a_task_given_back_with_other_rows_than_its_ring_holds_is_refused() {
        let mut sut = book(2, 1);
        let bound = LedgerTask {
            task_id: 4,
            epoch: 1,
            start: 10,
            end: 100,
            consumed_end: 20,
            enqueued_end: 40,
        };
        let moved = sut
            .assign(&assignment(4, 0, 100), Some((1, bound)))
            .expect_err("refused");
        assert_eq!(
            moved.to_string(),
            "the AM refused this daemon: the AM gives back task-4 as rows 0..100, but ring 1 holds it from row 10 with rows up to 40 enqueued; the ring and the AM disagree"
        );
        let short = sut
            .assign(&assignment(4, 10, 30), Some((0, bound)))
            .expect_err("refused");
        assert!(
            short.to_string().contains("rows up to 40 enqueued"),
            "{short}"
        );
        assert!(!sut.holds(TaskId(4)));
    }

    #[test]
    fn a_node_without_rings_refuses_tasks_with_the_fix() {
        let mut sut = book(0, 1);
        let error = sut
            .assign(&assignment(1, 0, 10), None)
            .expect_err("refused");
        assert!(error.to_string().contains("node-7 feeds no trainer rank"));
        assert_eq!(sut.wanted(), 0);
    }

    #[test]
    fn a_stop_beyond_what_was_sent_ends_the_task_there() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        let stopped = sut.stop(TaskId(1), 60, 30).expect("held");
        assert_eq!(stopped, Stopped { ring: 0, at: 60 });
        assert_eq!(sut.take_acks(), vec![(TaskId(1), 60)]);
        assert!(sut.take_acks().is_empty(), "acknowledged once");
    }

    #[test]
    fn a_stop_at_what_was_sent_ends_the_task_there() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert_eq!(
            sut.stop(TaskId(1), 30, 30).map(|stopped| stopped.at),
            Some(30)
        );
        assert_eq!(sut.take_acks(), vec![(TaskId(1), 30)]);
    }

    #[test]
    fn a_stop_before_what_was_sent_ends_the_task_after_the_rows_sent() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert_eq!(
            sut.stop(TaskId(1), 10, 45).map(|stopped| stopped.at),
            Some(45)
        );
        assert_eq!(sut.take_acks(), vec![(TaskId(1), 45)]);
    }

    #[test]
    fn a_stop_past_the_end_or_after_another_stop_never_extends_the_task() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert_eq!(
            sut.stop(TaskId(1), 500, 0).map(|stopped| stopped.at),
            Some(100)
        );
        assert_eq!(
            sut.stop(TaskId(1), 40, 0).map(|stopped| stopped.at),
            Some(40)
        );
        assert_eq!(
            sut.stop(TaskId(1), 90, 0).map(|stopped| stopped.at),
            Some(40)
        );
        assert_eq!(
            sut.take_acks(),
            vec![(TaskId(1), 100), (TaskId(1), 40), (TaskId(1), 40)]
        );
    }

    #[test]
    fn a_stop_for_a_task_not_held_is_ignored() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        assert_eq!(sut.stop(TaskId(2), 10, 0), None);
        assert!(sut.take_acks().is_empty());
        assert_eq!(sut.progress().len(), 1);
    }

    #[test]
    fn a_stopped_task_finishes_when_consumed_to_its_stop_row() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        sut.stop(TaskId(1), 40, 20).expect("held");
        sut.record([counts(1, 40, 39)]);
        assert!(!sut.heartbeat_due(Duration::ZERO));
        assert!(sut.heartbeat_answered(None).is_empty());
        sut.record([counts(1, 40, 40)]);
        assert!(
            sut.heartbeat_due(Duration::ZERO),
            "a finished task is told at once"
        );
        assert_eq!(
            sut.heartbeat_answered(None),
            vec![Freed {
                ring: 0,
                task_id: TaskId(1)
            }]
        );
        assert!(!sut.holds(TaskId(1)));
        assert_eq!(sut.wanted(), 2);
    }

    #[test]
    fn counts_never_go_backwards() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 10, 100), None).expect("assigns");
        sut.record([counts(1, 50, 30)]);
        sut.record([counts(1, 40, 20), counts(9, 99, 99)]);
        assert_eq!(
            sut.progress(),
            vec![v1::TaskProgress {
                task_id: 1,
                enqueued: 40,
                consumed: 20,
                bad: Vec::new(),
                sent: 40,
                dropped: Vec::new(),
            }]
        );
    }

    #[test]
    fn the_heartbeat_waits_for_its_interval_unless_a_task_settled() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        sut.record([counts(1, 50, 30)]);
        assert!(!sut.heartbeat_due(INTERVAL / 2));
        assert!(sut.heartbeat_due(INTERVAL));
        sut.fail(TaskId(1), "decoding failed", 50);
        assert!(
            sut.heartbeat_due(Duration::ZERO),
            "a failure is told at once"
        );
    }

    #[test]
    fn skipped_rows_are_told_at_once_and_in_every_heartbeat_while_the_task_is_held() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 100), None).expect("assigns");
        sut.record([counts(1, 50, 30)]);
        let skip = v1::BadRange {
            uri: "file:///d/part-0.parquet".to_owned(),
            row_group: Some(1),
            first_row: 40,
            row_count: 10,
            cause: "invalid page header".to_owned(),
        };
        sut.skipped(TaskId(1), vec![skip.clone()]);
        sut.skipped(TaskId(2), vec![skip.clone()]);
        assert!(sut.heartbeat_due(Duration::ZERO), "a skip is told at once");
        assert_eq!(sut.progress()[0].bad, vec![skip.clone()]);
        assert!(sut.heartbeat_answered(None).is_empty(), "not finished");
        assert!(!sut.heartbeat_due(INTERVAL / 2), "told once at once");
        assert_eq!(
            sut.progress()[0].bad,
            vec![skip],
            "and again with the counts"
        );
    }

    #[test]
    fn a_failure_is_reported_once_the_rows_sent_are_consumed() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 10, 100), None).expect("assigns");
        sut.fail(TaskId(1), "decoding failed", 50);
        sut.fail(TaskId(1), "a later failure", 60);
        sut.fail(TaskId(2), "not held", 0);
        assert!(sut.failed(TaskId(1)));
        assert!(!sut.failed(TaskId(2)));
        sut.record([counts(1, 50, 49)]);
        assert!(
            sut.failures().is_empty(),
            "rows in the ring are delivered first"
        );
        sut.record([counts(1, 50, 50)]);
        assert_eq!(
            sut.failures(),
            vec![FailedTask {
                task_id: TaskId(1),
                reason: "decoding failed".to_owned(),
                consumed: 40,
            }]
        );
        assert!(sut.heartbeat_answered(None).is_empty(), "not finished");
        assert_eq!(
            sut.failure_reported(TaskId(1)),
            Some(Freed {
                ring: 0,
                task_id: TaskId(1)
            })
        );
        assert_eq!(sut.failure_reported(TaskId(1)), None);
    }

    #[test]
    fn the_daemon_asks_for_one_task_per_ring_more_than_it_interleaves() {
        let mut sut = book(2, 3);
        assert_eq!(sut.wanted(), 8);
        for task_id in 0..8 {
            sut.assign(&assignment(task_id, 0, 10), None)
                .expect("assigns");
        }
        assert_eq!(sut.wanted(), 0);
        let rings: Vec<usize> = sut.placed().map(|(_, ring)| ring).collect();
        assert_eq!(
            rings,
            vec![0, 1, 0, 1, 0, 1, 0, 1],
            "the rings share the tasks"
        );
    }

    #[test]
    fn final_counts_enqueue_at_least_what_was_consumed() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 10, 100), None).expect("assigns");
        sut.record([counts(1, 10, 30)]);
        assert_eq!(sut.progress()[0].enqueued, 0);
        assert_eq!(
            sut.final_progress(),
            vec![v1::TaskProgress {
                task_id: 1,
                enqueued: 20,
                consumed: 20,
                bad: Vec::new(),
                sent: 20,
                dropped: Vec::new(),
            }]
        );
    }

    fn mark(generation: u64, appended: u64, durable: u64) -> v1::JournalMark {
        v1::JournalMark {
            generation,
            appended,
            durable,
        }
    }

    #[test]
    fn a_finished_task_stays_until_the_am_that_recorded_it_says_its_record_is_durable() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 10), None).expect("assigns");
        sut.assign(&assignment(2, 0, 10), None).expect("assigns");
        sut.record([counts(1, 10, 10)]);
        assert!(
            sut.heartbeat_due(Duration::ZERO),
            "a finished task is told at once"
        );
        assert!(sut.heartbeat_answered(Some(&mark(3, 50, 49))).is_empty());
        assert!(
            !sut.heartbeat_due(Duration::ZERO),
            "told once, then at the interval"
        );
        assert_eq!(sut.wanted(), 1, "a finished task counts no more");
        assert_eq!(sut.progress().len(), 2, "it is still reported");
        // A later report to the same AM waits for no later end.
        assert!(sut.heartbeat_answered(Some(&mark(3, 60, 49))).is_empty());
        // Another AM's journal numbers its records anew: its marks say nothing of the report.
        assert!(sut.journal_marked(&mark(4, 70, 70)).is_empty());
        assert!(sut.holds(TaskId(1)));
        let freed = Freed {
            ring: 0,
            task_id: TaskId(1),
        };
        assert_eq!(sut.heartbeat_answered(Some(&mark(4, 80, 79))), vec![]);
        assert_eq!(sut.journal_marked(&mark(4, 90, 80)), vec![freed]);
        assert!(!sut.holds(TaskId(1)));
        assert!(sut.holds(TaskId(2)), "a task not finished stays");
    }

    #[test]
    fn an_answer_that_comes_once_durable_lets_the_finished_task_go_at_once() {
        let mut sut = book(1, 1);
        sut.assign(&assignment(1, 0, 10), None).expect("assigns");
        sut.record([counts(1, 10, 10)]);
        assert_eq!(
            sut.heartbeat_answered(Some(&mark(3, 50, 50))),
            vec![Freed {
                ring: 0,
                task_id: TaskId(1)
            }]
        );
    }

    /// One step of a daemon's life, as the serve loop tells the book.
    #[derive(Debug, Clone)]
    enum Step {
        /// A new task of `rows` rows is assigned.
        Assign { rows: u64 },
        /// The feeder of the task at this index hands `rows` more rows to the writer.
        Send { task: usize, rows: u64 },
        /// The writer publishes and the trainer releases some of the rows sent.
        Survey { published: u64, released: u64 },
        /// The AM asks the task at this index to stop at `row`.
        Stop { task: usize, row: u64 },
        /// A heartbeat, answered by the AM of `generation` with its journal's mark (the end of
        /// the records once the heartbeat's are appended, one more than at the last call, and
        /// `lag` records fewer durable), or without a mark.
        Heartbeat { journal: Option<(u64, u64)> },
        /// An answer to another call, with the mark of the AM of `generation`, `lag` records
        /// fewer durable than appended.
        Marked { generation: u64, lag: u64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u64..200).prop_map(|rows| Step::Assign { rows }),
            (0usize..8, 0u64..80).prop_map(|(task, rows)| Step::Send { task, rows }),
            (0u64..100, 0u64..100).prop_map(|(published, released)| Step::Survey {
                published,
                released
            }),
            (0usize..8, 0u64..250).prop_map(|(task, row)| Step::Stop { task, row }),
            proptest::option::of((0u64..2, 0u64..3))
                .prop_map(|journal| Step::Heartbeat { journal }),
            (0u64..2, 0u64..3).prop_map(|(generation, lag)| Step::Marked { generation, lag }),
        ]
    }

    /// What the model knows of a task: its first row, its original end, and the ends of the rows
    /// its feeder sent, the writer published and the trainer released.
    #[derive(Debug, Clone, Copy)]
    struct Modelled {
        task_id: u64,
        start: u64,
        end: u64,
        limit: u64,
        sent_end: u64,
        enqueued_end: u64,
        consumed_end: u64,
    }

    proptest! {
        /// Reported counts only rise and stay within the task's rows; a stop is acknowledged at a
        /// row no smaller than what was sent, so no row at or past it is enqueued; a task is
        /// reported once per heartbeat until it is let go, which it is once consumed to where it
        /// ends and, when the AM's answers carry its journal's mark, once the first AM of the
        /// mark's generation it was reported to has its record durable.
        #[test]
        fn counts_rise_within_the_rows_and_stops_cut_no_row_sent(
            steps in proptest::collection::vec(step(), 1..120),
        ) {
            let mut sut = book(2, 1);
            let mut model: Vec<Modelled> = Vec::new();
            let mut reported: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            // Per finished task, the generation and journal end of its first report to that AM.
            let mut reported_done: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            let mut appended = 0;
            let mut next_start = 0;
            for step in steps {
                match step {
                    Step::Assign { rows } => {
                        let task_id = model.len() as u64;
                        let (start, end) = (next_start, next_start + rows);
                        next_start += 7;
                        let placed = sut
                            .assign(&assignment(task_id, start, end), None)
                            .expect("assigns");
                        prop_assert!(placed.feed);
                        prop_assert_eq!(placed.resume_at, start);
                        model.push(Modelled {
                            task_id,
                            start,
                            end,
                            limit: end,
                            sent_end: start,
                            enqueued_end: start,
                            consumed_end: start,
                        });
                    }
                    Step::Send { task, rows } => {
                        if let Some(task) = model.get_mut(task) {
                            task.sent_end = (task.sent_end + rows).min(task.limit);
                        }
                    }
                    Step::Survey { published, released } => {
                        for task in &mut model {
                            task.enqueued_end = (task.enqueued_end + published).min(task.sent_end);
                            task.consumed_end = (task.consumed_end + released).min(task.enqueued_end);
                        }
                        sut.record(model.iter().map(|task| {
                            counts(task.task_id, task.enqueued_end, task.consumed_end)
                        }));
                    }
                    Step::Stop { task, row } => {
                        let Some(task) = model.get_mut(task) else { continue };
                        let held = sut.holds(TaskId(task.task_id));
                        let stopped = sut.stop(TaskId(task.task_id), task.start + row, task.sent_end);
                        prop_assert_eq!(stopped.is_some(), held, "a stop applies to held tasks only");
                        if let Some(stopped) = stopped {
                            prop_assert!(stopped.at >= task.sent_end, "no row sent is cut off");
                            prop_assert!(stopped.at <= task.limit, "a stop never extends a task");
                            prop_assert!(stopped.at <= task.end, "a stop stays within the task's rows");
                            if (task.sent_end..=task.limit).contains(&(task.start + row)) {
                                prop_assert_eq!(stopped.at, task.start + row);
                            }
                            task.limit = stopped.at;
                            prop_assert_eq!(sut.take_acks(), vec![(TaskId(task.task_id), stopped.at)]);
                        }
                    }
                    Step::Heartbeat { journal } => {
                        let progress = sut.progress();
                        let held: Vec<u64> = sut.placed().map(|(task_id, _)| task_id.0).collect();
                        let told: Vec<u64> = progress.iter().map(|task| task.task_id).collect();
                        prop_assert_eq!(told, held, "every held task is told once");
                        for told in &progress {
                            let task = model[told.task_id as usize];
                            prop_assert!(told.consumed <= told.enqueued);
                            prop_assert!(task.start + told.enqueued <= task.limit);
                            prop_assert!(task.start + told.consumed <= task.limit);
                            let (enqueued, consumed) =
                                reported.insert(told.task_id, (told.enqueued, told.consumed)).unwrap_or_default();
                            prop_assert!(told.enqueued >= enqueued && told.consumed >= consumed,
                                "task {} went back from {:?} to {:?}", told.task_id, (enqueued, consumed), told);
                        }
                        let finished: Vec<u64> = model
                            .iter()
                            .filter(|task| sut.holds(TaskId(task.task_id)) && task.consumed_end == task.limit)
                            .map(|task| task.task_id)
                            .collect();
                        let mut durable = appended;
                        let freed = match journal {
                            None => {
                                let freed = sut.heartbeat_answered(None);
                                let freed: Vec<u64> = freed.iter().map(|freed| freed.task_id.0).collect();
                                prop_assert_eq!(&freed, &finished, "without a mark, every finished task goes");
                                freed
                            }
                            Some((generation, lag)) => {
                                appended += 1;
                                let mark = mark(generation, appended, appended - lag.min(appended));
                                durable = mark.durable;
                                for task_id in &finished {
                                    let first = reported_done.get(task_id).filter(|(to, _)| *to == generation);
                                    if first.is_none() {
                                        reported_done.insert(*task_id, (generation, appended));
                                    }
                                }
                                let freed = sut.heartbeat_answered(Some(&mark));
                                let freed: Vec<u64> = freed.iter().map(|freed| freed.task_id.0).collect();
                                for task_id in &freed {
                                    let first = reported_done.get(task_id).copied();
                                    prop_assert!(
                                        first.is_some_and(|(to, end)| to == generation && end <= mark.durable),
                                        "task {} let go on {:?}, first reported {:?}", task_id, mark, first
                                    );
                                }
                                freed
                            }
                        };
                        for task_id in freed {
                            let task = model[task_id as usize];
                            prop_assert_eq!(task.consumed_end, task.limit, "let go once consumed to its end");
                            prop_assert!(!sut.holds(TaskId(task_id)));
                        }
                        check_kept(&sut, &model, &reported_done, journal.map(|(generation, _)| generation), durable, true)?;
                    }
                    Step::Marked { generation, lag } => {
                        let mark = mark(generation, appended, appended - lag.min(appended));
                        for freed in sut.journal_marked(&mark) {
                            let first = reported_done.get(&freed.task_id.0).copied();
                            prop_assert!(
                                first.is_some_and(|(to, end)| to == generation && end <= mark.durable),
                                "task {} let go on {:?}, first reported {:?}", freed.task_id.0, mark, first
                            );
                        }
                        check_kept(&sut, &model, &reported_done, Some(generation), mark.durable, false)?;
                    }
                }
                let waiting = model
                    .iter()
                    .filter(|task| sut.holds(TaskId(task.task_id)) && reported_done.contains_key(&task.task_id))
                    .count();
                prop_assert_eq!(sut.wanted() as usize, 4usize.saturating_sub(sut.len() - waiting));
            }
        }
    }

    /// After an answer of the AM of `generation` that had `durable` records durable (`None`: an
    /// answer to a heartbeat without a mark), no task is held that has gone unnoticed: each held
    /// task is unfinished, or finished and waiting for a record of that AM not yet durable, or of
    /// another, or (after an answer to another call than a heartbeat) not reported yet.
    fn check_kept(
        sut: &TaskBook,
        model: &[Modelled],
        reported_done: &BTreeMap<u64, (u64, u64)>,
        generation: Option<u64>,
        durable: u64,
        heartbeat: bool,
    ) -> Result<(), TestCaseError> {
        for task in model.iter().filter(|task| sut.holds(TaskId(task.task_id))) {
            if task.consumed_end < task.limit {
                continue;
            }
            let Some(generation) = generation else {
                return Err(TestCaseError::fail(format!(
                    "task {} finished and kept",
                    task.task_id
                )));
            };
            let waits = match reported_done.get(&task.task_id) {
                Some((to, end)) => *to != generation || *end > durable,
                None => !heartbeat,
            };
            prop_assert!(
                waits,
                "task {} finished, reported {:?}, kept",
                task.task_id,
                reported_done.get(&task.task_id)
            );
        }
        Ok(())
    }
}
