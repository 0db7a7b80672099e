//! The master's journal: the [`Entry`] each change of state is recorded as, the [`Snapshot`] a
//! journal is compacted into, and how a new AM rebuilds the state from both.
//!
//! Their encoding is the journal's format: a variant is added only at the end of [`Entry`], and a
//! field only at the end of [`Snapshot`], which still reads the snapshots written without it (see
//! [`crate::journal::SnapshotFormat`]); any other change raises the layout version (see the golden
//! journal of `tests/journal_format.rs`).

use super::bad_data::{BadDataLog, BadRange, SkipKey};
use super::calls::NodeCommand;
use super::checkpoint::{Checkpoints, PendingCheckpoint, RankPositions, RestoredAt};
use super::dropped::DroppedLog;
use super::rescale::Rescale;
use super::{JournaledSource, Master, SourceFollow};
use crate::decide::{DataPosition, Event, NodeId, RestoreMode, TableSnapshot, TaskId};
use crate::error::{AmError, Result};
use crate::launcher::{ExecutorId, Executors, Exit};
use crate::plan::{JobPlan, PlannedBytes, PlannedFile, PlannedIdentity, PlannedSplit};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One change of the AM's state, in journal order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// An event applied to the task table.
    Event(Event),
    /// A rank reported its data position at a step.
    RankCommitted {
        /// The trainer's step.
        step: u64,
        /// The rank.
        rank: u32,
        /// Ranks that report for the step.
        world_size: u32,
        /// The rank's epoch.
        epoch: u32,
        /// Split row up to which the rank consumed each task it read.
        positions: RankPositions,
    },
    /// Every rank of a step reported and the checkpoint was stored under `token`.
    CheckpointStored {
        /// The trainer's step.
        step: u64,
        /// The token that names the stored position.
        token: String,
    },
    /// The task table was reset to a stored data checkpoint.
    Restored {
        /// The checkpoint's token.
        token: String,
        /// The position it holds.
        position: DataPosition,
        /// When the AM reset the table.
        now_ms: u64,
    },
    /// A role's size changed.
    RoleScaled {
        /// The role.
        role: String,
        /// Its new number of trainers.
        num: u32,
    },
    /// A stop of the job was requested.
    StopRequested {
        /// Why, for logs and status.
        reason: String,
    },
    /// A followed source grew: its new files and splits join the plan, and their tasks the
    /// current epoch. Written by releases whose followed files were not pinned; this one writes
    /// [`Entry::FilesAdded`].
    SplitsAdded {
        /// The index of the source in the spec.
        source: u32,
        /// For a Delta table, the version planned up to, this one included.
        version: Option<u64>,
        /// The new files.
        files: Vec<PlannedFile>,
        /// Their splits, with file indices counted from the first of `files`.
        splits: Vec<PlannedSplit>,
    },
    /// A source is no longer followed.
    FollowEnded {
        /// The index of the source in the spec.
        source: u32,
        /// Why, for logs and status.
        reason: String,
    },
    /// The AM started an executor.
    ExecutorLaunched {
        /// The executor.
        id: ExecutorId,
    },
    /// An executor ended.
    ExecutorExited {
        /// The executor.
        id: ExecutorId,
        /// How.
        exit: Exit,
    },
    /// The task table was reset to a stored data checkpoint at start (`--resume-from`), with the
    /// roles' sizes of the spec the AM was started with.
    ResumedFrom {
        /// The checkpoint's token.
        token: String,
        /// The position it holds.
        position: DataPosition,
        /// When the AM reset the table.
        now_ms: u64,
        /// The roles' sizes, in spec order.
        role_sizes: Vec<u32>,
    },
    /// A followed source grew: its new files and splits join the plan, pinned to the identities
    /// the files had when the follower planned them, and their tasks the current epoch.
    FilesAdded {
        /// The index of the source in the spec.
        source: u32,
        /// For a Delta table, the version planned up to, this one included.
        version: Option<u64>,
        /// The new files.
        files: Vec<PlannedFile>,
        /// Their splits, with file indices counted from the first of `files`.
        splits: Vec<PlannedSplit>,
        /// Where the rows of the row formats' splits lie, split indices counted from the first of
        /// `splits`.
        bytes: Vec<PlannedBytes>,
        /// The files' identities, file indices counted from the first of `files`.
        identities: Vec<PlannedIdentity>,
    },
    /// A daemon skipped rows that did not decode (`data.on_bad_data: skip | warn`).
    BadDataSkipped {
        /// Where the rows lie in the job's plan.
        key: SkipKey,
        /// The rows and why.
        range: BadRange,
    },
    /// A source was added to the running job (`sluice source add`): it becomes the job's next
    /// source, its files and splits join the plan, pinned as they were planned, and their tasks
    /// the current epoch.
    SourceAdded {
        /// The source, as sent.
        source: JournaledSource,
        /// Its files.
        files: Vec<PlannedFile>,
        /// Their splits, with file indices counted from the first of `files`.
        splits: Vec<PlannedSplit>,
        /// Where the rows of the row formats' splits lie, split indices counted from the first of
        /// `splits`.
        bytes: Vec<PlannedBytes>,
        /// The files' identities, file indices counted from the first of `files`.
        identities: Vec<PlannedIdentity>,
    },
    /// A ring left rows out of their epoch to keep the batch counts equal
    /// (`data.even_batches: drop`).
    RowsDropped {
        /// Where the rows lie in the job's plan.
        key: SkipKey,
        /// How many split rows.
        rows: u64,
    },
}

/// The AM's state at one point of its journal, from which the entries after it replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub(super) core: SnapshotCore,
    pub(super) bad_data: BadDataLog,
    pub(super) added_sources: Vec<JournaledSource>,
    pub(super) dropped: DroppedLog,
}

/// A [`Snapshot`] as written before rings could drop rows (`data.even_batches: drop`).
#[derive(Deserialize)]
struct SnapshotWithoutDrops {
    core: SnapshotCore,
    bad_data: BadDataLog,
    added_sources: Vec<JournaledSource>,
}

/// A [`Snapshot`] as written before sources could be added to a running job.
#[derive(Deserialize)]
struct SnapshotWithoutAddedSources {
    core: SnapshotCore,
    bad_data: BadDataLog,
}

/// The fields of a [`Snapshot`] written before skipped bad data was recorded: the encoding of such a
/// snapshot, and the first part of this release's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct SnapshotCore {
    pub(super) position: TableSnapshot,
    pub(super) last_seen_ms: BTreeMap<NodeId, u64>,
    pub(super) pieces: BTreeMap<TaskId, u64>,
    pub(super) checkpoints: BTreeMap<u64, PendingCheckpoint>,
    pub(super) stored: BTreeMap<u64, String>,
    pub(super) stop_reason: Option<String>,
    pub(super) executors: Option<Executors>,
    pub(super) last_task_failure: Option<String>,
    pub(super) role_sizes: Vec<u32>,
    pub(super) rescale: Option<Rescale>,
    pub(super) follows: Vec<Option<SourceFollow>>,
    pub(super) added_files: Vec<PlannedFile>,
    pub(super) added_splits: Vec<PlannedSplit>,
    pub(super) restored: Option<RestoredAt>,
    pub(super) added_bytes: Vec<PlannedBytes>,
    pub(super) added_identities: Vec<PlannedIdentity>,
}

/// A [`Snapshot`] as written before followed files were pinned: its fields up to `restored`.
#[derive(Deserialize)]
struct SnapshotWithoutAddedPins {
    position: TableSnapshot,
    last_seen_ms: BTreeMap<NodeId, u64>,
    pieces: BTreeMap<TaskId, u64>,
    checkpoints: BTreeMap<u64, PendingCheckpoint>,
    stored: BTreeMap<u64, String>,
    stop_reason: Option<String>,
    executors: Option<Executors>,
    last_task_failure: Option<String>,
    role_sizes: Vec<u32>,
    rescale: Option<Rescale>,
    follows: Vec<Option<SourceFollow>>,
    added_files: Vec<PlannedFile>,
    added_splits: Vec<PlannedSplit>,
    restored: Option<RestoredAt>,
}

/// The files and splits an entry added to the plan, as [`JobPlan::append`] takes them.
fn journaled_block(
    files: Vec<PlannedFile>,
    splits: Vec<PlannedSplit>,
    bytes: Vec<PlannedBytes>,
    identities: Vec<PlannedIdentity>,
) -> JobPlan {
    JobPlan {
        files,
        splits,
        bytes,
        identities,
        versions: Vec::new(),
        left_out: Vec::new(),
    }
}

/// Decodes `body` as exactly one `T`, with nothing left over.
fn exactly<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Option<T> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((value, [])) => Some(value),
        _ => None,
    }
}

impl crate::journal::SnapshotFormat for Snapshot {
    /// Reads a snapshot of this release, or one written by an earlier release: before skipped bad
    /// data was recorded (none then), or before the files followed sources add carried their bytes
    /// and identities (those files are then read as they are, unpinned).
    fn decode(body: &[u8]) -> postcard::Result<Snapshot> {
        let error = match postcard::from_bytes(body) {
            Ok(snapshot) => return Ok(snapshot),
            Err(error) => error,
        };
        // Each older encoding is a prefix of the newer ones: it must take the whole body, or the
        // body is none of them.
        if let Some(older) = exactly::<SnapshotWithoutDrops>(body) {
            return Ok(Snapshot {
                core: older.core,
                bad_data: older.bad_data,
                added_sources: older.added_sources,
                dropped: DroppedLog::default(),
            });
        }
        if let Some(older) = exactly::<SnapshotWithoutAddedSources>(body) {
            return Ok(Snapshot {
                core: older.core,
                bad_data: older.bad_data,
                added_sources: Vec::new(),
                dropped: DroppedLog::default(),
            });
        }
        let core = exactly::<SnapshotCore>(body).or_else(|| {
            exactly::<SnapshotWithoutAddedPins>(body).map(|older| SnapshotCore {
                position: older.position,
                last_seen_ms: older.last_seen_ms,
                pieces: older.pieces,
                checkpoints: older.checkpoints,
                stored: older.stored,
                stop_reason: older.stop_reason,
                executors: older.executors,
                last_task_failure: older.last_task_failure,
                role_sizes: older.role_sizes,
                rescale: older.rescale,
                follows: older.follows,
                added_files: older.added_files,
                added_splits: older.added_splits,
                restored: older.restored,
                added_bytes: Vec::new(),
                added_identities: Vec::new(),
            })
        });
        core.map(|core| Snapshot {
            core,
            bad_data: BadDataLog::default(),
            added_sources: Vec::new(),
            dropped: DroppedLog::default(),
        })
        .ok_or(error)
    }
}

impl Master {
    /// The latest time of the changes applied so far, journaled or replayed, on the AM's clock
    /// (see [`crate::clock`]): an AM that takes the job over continues its clock from there.
    pub fn latest_ms(&self) -> u64 {
        self.latest_ms
    }

    /// Applies a journal entry during recovery; commands it would send are dropped, since the
    /// daemons they were meant for ask again.
    pub fn replay(&mut self, entry: Entry) -> Result<()> {
        match entry {
            Entry::Event(event) => {
                // The event's commands (assignments, stops, fences) stay out of the outbox: a
                // daemon holds what it was assigned, and [`Master::resume_commands`] asks again
                // for the stops still due.
                let outbox = std::mem::take(&mut self.outbox);
                self.apply_event(None, event);
                self.outbox = outbox;
            }
            Entry::RankCommitted {
                step,
                rank,
                world_size,
                epoch,
                positions,
            } => self.replay_report(step, rank, world_size, epoch, positions)?,
            Entry::CheckpointStored { step, token } => {
                // The checkpoints it pruned were deleted, or are left, by the AM that wrote it.
                self.checkpoint_stored(step, token);
            }
            // The checkpoints a restore forgot were deleted, or are left, by the AM that wrote it.
            Entry::Restored {
                token,
                position,
                now_ms,
            } => {
                self.apply_restore(token, position, now_ms, None)?;
            }
            Entry::ResumedFrom {
                token,
                position,
                now_ms,
                role_sizes,
            } => {
                self.apply_restore(token, position, now_ms, Some(role_sizes))?;
            }
            Entry::RoleScaled { role, num } => {
                let index = self
                    .spec
                    .roles
                    .iter()
                    .position(|found| found.name == role)
                    .ok_or_else(|| {
                        AmError::FailedPrecondition(format!(
                            "the journal scales role {role:?}, which the job spec does not have; start the AM with the spec the job was run with"
                        ))
                    })?;
                self.apply_scale(index, num);
            }
            Entry::StopRequested { reason } => self.stop_reason = Some(reason),
            Entry::SplitsAdded {
                source,
                version,
                files,
                splits,
            } => self.apply_added(
                source,
                version,
                JobPlan {
                    files,
                    splits,
                    ..JobPlan::default()
                },
            ),
            Entry::FilesAdded {
                source,
                version,
                files,
                splits,
                bytes,
                identities,
            } => self.apply_added(
                source,
                version,
                journaled_block(files, splits, bytes, identities),
            ),
            Entry::FollowEnded { source, reason } => self.apply_follow_ended(source, reason),
            Entry::SourceAdded {
                source,
                files,
                splits,
                bytes,
                identities,
            } => {
                let source = Master::parse_journaled(self.next_source_index(), source)?;
                self.apply_source_added(source, journaled_block(files, splits, bytes, identities));
            }
            Entry::BadDataSkipped { key, range } => {
                self.bad_data.record(key, range);
            }
            Entry::RowsDropped { key, rows } => self.dropped.record(key, rows),
            Entry::ExecutorLaunched { id } => {
                self.executor_launched(id);
            }
            Entry::ExecutorExited { id, exit } => {
                self.executor_exited(id, exit);
            }
        }
        Ok(())
    }

    /// The state to write as a snapshot: replaying the entries journaled after it over
    /// [`Master::restore_snapshot`] gives the state this master will then have.
    ///
    /// Cheap enough to take under the master's lock: the task table is captured, not copied (see
    /// [`JobState::capture`]), and encoding the snapshot is left to the journal's own threads.
    pub fn snapshot(&self) -> Snapshot {
        let (checkpoints_pending, stored, restored) = self.checkpoints.to_parts();
        let core = SnapshotCore {
            position: self.table.capture(),
            last_seen_ms: self
                .table
                .nodes()
                .map(|(node, view)| (node, view.last_seen_ms))
                .collect(),
            pieces: self.origins.pieces.clone(),
            checkpoints: checkpoints_pending,
            stored,
            stop_reason: self.stop_reason.clone(),
            executors: self.executors.clone(),
            last_task_failure: self.last_task_failure.clone(),
            role_sizes: self.role_sizes.clone(),
            rescale: self.rescale.clone(),
            follows: self.follows.sources().to_vec(),
            added_files: self.added.files.clone(),
            added_splits: self.added.splits.clone(),
            restored,
            added_bytes: self.added.bytes.clone(),
            added_identities: self.added.identities.clone(),
        };
        Snapshot {
            core,
            bad_data: self.bad_data.clone(),
            added_sources: self
                .added_sources
                .iter()
                .map(|source| source.journaled.clone())
                .collect(),
            dropped: self.dropped.clone(),
        }
    }

    /// Replaces this master's state with a snapshot of the same job.
    pub fn restore_snapshot(&mut self, snapshot: Snapshot) -> Result<()> {
        let Snapshot {
            core: snapshot,
            bad_data,
            added_sources,
            dropped,
        } = snapshot;
        self.bad_data = bad_data;
        self.dropped = dropped;
        self.restore_sources(added_sources)?;
        let planned_files = self.plan.files.len() - self.added.files.len();
        let planned_splits = self.plan.splits.len() - self.added.splits.len();
        self.added = JobPlan {
            files: snapshot.added_files,
            splits: snapshot.added_splits,
            bytes: snapshot.added_bytes,
            identities: snapshot.added_identities,
            versions: Vec::new(),
            left_out: Vec::new(),
        };
        let plan = Arc::make_mut(&mut self.plan);
        plan.truncate(planned_files, planned_splits);
        plan.append(&self.added);
        self.follows.restore(snapshot.follows);
        let mut table = self.restored_table(
            snapshot.position.into_position(),
            RestoreMode::Resume { now_ms: 0 },
        )?;
        table.restore_last_seen(&snapshot.last_seen_ms);
        let latest_seen_ms = snapshot.last_seen_ms.values().copied().max();
        self.latest_ms = self.latest_ms.max(latest_seen_ms.unwrap_or(0));
        self.table = table;
        self.origins.pieces = snapshot.pieces;
        self.origins.place_added(&self.table, planned_splits);
        self.checkpoints =
            Checkpoints::from_parts((snapshot.checkpoints, snapshot.stored, snapshot.restored));
        self.stop_reason = snapshot.stop_reason;
        self.last_task_failure = snapshot.last_task_failure;
        if snapshot.executors.is_some() {
            self.executors = snapshot.executors;
        }
        if snapshot.role_sizes.len() == self.role_sizes.len() {
            self.role_sizes = snapshot.role_sizes;
        }
        self.rescale = snapshot.rescale;
        Ok(())
    }

    /// Queues again the commands the table implies after a recovery: a stop request for every
    /// task whose stop is not yet acknowledged.
    ///
    /// Reads only the tasks in flight: copying the whole table into a position here would make a
    /// new AM of a ten-million-task job hold it twice while it takes the job over.
    pub fn resume_commands(&mut self) {
        let mut stops: Vec<(TaskId, NodeId, u64)> = self
            .table
            .tasks_in_flight()
            .filter_map(|flight| Some((flight.task, flight.node, flight.stop_at?)))
            .collect();
        stops.sort_unstable();
        for (task, node, row) in stops {
            self.outbox
                .entry(node)
                .or_default()
                .push(NodeCommand::Stop { task, row });
        }
    }
}
