//! Property tests of the whole [`Master`], driven through its public API as the gRPC service
//! drives it: simulated daemons and trainers, a launching AM that scales its role and restores data
//! checkpoints, a followed source that grows, and AM takeovers from a simulated journal; the rows
//! the trainers consumed are checked against the data.
//!
//! # Implementation
//! The model, from the outside in:
//!
//! - **Daemons** follow the serve loop of `sluice-daemon` (`dataplane/daemon/src/lib.rs`) and its
//!   task book. A daemon registers holding the tasks its rings hold, with their counts, and keeps
//!   only the tasks the registration's answer gives back. Each call it makes first does what its
//!   loop owes: the final heartbeat of a give-back, the registration after one, the stop
//!   acknowledgements queued. It asks for at most one task per ring more than it holds (a node
//!   with no ranks asks for none), places a new task on its ring with the fewest tasks, cuts a
//!   task at `max(row, rows enqueued)` when told to stop, lets go the tasks consumed to their end
//!   once a heartbeat is answered, and on `Release` reports its final counts in a heartbeat
//!   (whose answer it ignores), removes its rings and registers again holding nothing. A
//!   restarted daemon keeps its rings, tasks and counts and forgets its queued acknowledgements.
//!   A daemon told to shut down exits with success, as the launcher sees; launched again (after a
//!   restore of a finished job), it starts from nothing.
//! - **Rings** are the daemon's real ledgers (`sluice_ring::ledger`, in memory), each row a record
//!   of its own at the next position of the ring's stream: a task is bound where the stream stands,
//!   each row written raises its enqueued end, each row the trainer releases is folded, and every
//!   count the daemon reports, and every task a restarted daemon registers holding, is read from
//!   them, as `sluice-daemon` reads its own.
//! - **A node cut off** makes no call until its link comes back; its trainers read on what its
//!   rings hold, and its feeders publish nothing (its lease lapsed). A loss moves time past the
//!   heartbeat timeout, the other nodes heartbeating just before, so the AM declares the cut node
//!   lost. Its next call, once back, is fenced, or, for a daemon restarted meanwhile, its
//!   registration holding its tasks: the daemon does what `sluice-daemon` does (its rings owe
//!   their trainers the fence's error record, its ledgers forget their tasks; fenced while
//!   serving, it writes the record unless the ring is full, and exits to be started again; fenced
//!   at its registration, it registers again holding nothing and its writers write the record
//!   before anything else). The trainer's reads the AM had not counted are void: they leave the
//!   trainers' state, and the rows the ring still holds of those tasks are read void too, before
//!   anything written after them, and folded into ledgers whose tasks the AM may have handed
//!   back to the same ring. No record is written while a fence's record is owed.
//! - **Trainers** are processes the simulated launcher runs: launched when the AM's
//!   [`Master::executors_to_launch`] names them, ended one by one when the AM retires them. The
//!   trainer of rank `r` reads ring `r` of the node that feeds it, whatever the AM believes, so a
//!   task's rows are consumed only while a trainer of its ring's rank runs. Trainers that a
//!   restore relaunches load the checkpoint and call [`Master::restore`] again, which must change
//!   nothing.
//! - **The ledger** is the ground truth: the multiset of `(epoch, split, row)` the trainers'
//!   state holds. A row enters it when a trainer releases it, not when the AM learns of it. A
//!   data checkpoint is committed by every rank at once (rank 0 reports every task's consumed end
//!   of the epoch, the others none, which the AM merges alike) together with a copy of the ledger;
//!   an effective restore puts that copy back, and the rows that trainers launched before the
//!   restore consume afterwards never enter it (those trainers are being restarted from the
//!   checkpoint). A row entering the ledger twice fails the test at once; at the end, after the
//!   surviving daemons and trainers drained the job with following ended, the job must have
//!   succeeded and the ledger must hold every row of every epoch, planned and added splits
//!   alike, exactly once.
//! - **The journal** is every [`Applied::entries`] in order, and a [`Snapshot`] taken at random
//!   points (its position in the journal with it). A takeover builds a new master as
//!   `controlplane/src/server.rs` does: [`Master::new`], [`Master::launch_executors`],
//!   [`Master::restore_snapshot`] of the last snapshot, [`Master::replay`] of the entries after
//!   it, then [`Master::grant_grace`] and [`Master::resume_commands`] as `Am::take_over` does.
//!   Daemons and trainers live through it and carry on, each daemon registering again at its
//!   next call or not (its session only retries the call; a restarted daemon registers).
//! - **The durability rule** (docs/architecture.md): what the AM acknowledges or acts on outside is
//!   durable before anyone learns of it, but consumed counts in heartbeats may be journaled
//!   without waiting, and so may tasks finished by a daemon that keeps them until they are
//!   durable. The master says which heartbeats those are ([`Master::answers_before_durable`], which
//!   the service follows); every other call waits, and since a journal is durable in order, it
//!   makes every entry before its own durable. A group commit ([`Op::Commit`]) or a snapshot does
//!   too. A takeover loses any tail of the entries not yet durable. The answers to a daemon carry
//!   the journal's mark as the service sends it: the AM's generation (one more at each takeover),
//!   the entries appended once the call's own were, and the entries durable. A daemon that keeps
//!   finished tasks (the job's `keeps_finished`, as `sluice-daemon` does) reports a task consumed
//!   to its end in every heartbeat and lets it go once an answer of the generation it first
//!   reported it to says durable what was appended up to that report, and it does not count it
//!   among the tasks it holds when it asks for more; one that does not lets it go on the answer to
//!   the heartbeat that reports it, which the master must then have made durable. The final
//!   heartbeat of a give-back is never answered before it is durable either: on its answer the
//!   daemon removes its rings, which hold the only other copy of its counts. The daemon does not
//!   register again after an AM restart (its session only retries the call), so a takeover alone
//!   does not make it report its counts; a daemon restart, at any point, does.
//!
//! # Regression cases
//! Minimal cases the property test once found are plain tests at the end of the file: a restore to
//! a checkpoint committed before a node registered, and the two heartbeats the daemon acts on
//! though their answers carry no command (a give-back's final one, one that finishes a task, for a
//! daemon that lets the task go on that answer and for one that keeps it until it is durable).
//!
//! Time advances by one millisecond per step and the heartbeat timeout is far away: liveness is
//! the table's own property tests' subject (`decide/proptests.rs`), exactly-once across the
//! master's processes is this one's.

use super::tests::planned_split;
use super::*;
use crate::decide::{Assignment, ReportOutcome, TaskProgress};
use crate::decide::{DataPosition, JobOutcome};
use crate::launcher::{ExecutorId, Exit, LaunchAction};
use crate::spec::Format;
use calls::RankCommit;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_ring::ledger::{Ledger as RingLedger, LedgerTask};
use sluice_ring::{RecordKind, RecordMeta};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

/// The job's one role.
const ROLE: &str = "worker";

/// Silence after which the AM declares a node lost: far beyond the millisecond a step takes, so
/// that only [`Op::Lose`] loses one.
const HEARTBEAT_TIMEOUT_MS: u64 = 1_000_000_000;

/// One step of the simulation. `pick` chooses among a node's tasks, or among candidates, modulo
/// their number (a plain number, so that a failing case can be pasted into a regression test).
#[derive(Debug, Clone)]
enum Op {
    /// The daemon asks for tasks (or does what its loop owes first).
    Acquire { node: usize },
    /// The daemon's feeders write rows of a task into its ring.
    Produce { node: usize, pick: u8, rows: u64 },
    /// The trainer reading a task's ring releases rows of it.
    Consume { node: usize, pick: u8, rows: u64 },
    /// The daemon heartbeats its counts (or does what its loop owes first).
    Heartbeat { node: usize },
    /// The daemon reports a task consumed to its end with `ReportTask` (or does what it owes).
    /// `sluice-daemon` reports finished tasks in heartbeats; the API takes this report too.
    ReportDone { node: usize, pick: u8 },
    /// The daemon restarts; its rings and trainers survive.
    DaemonRestart { node: usize },
    /// One trainer the AM retired ends.
    TrainerExits { pick: u8 },
    /// The AM launches the executors it wants running.
    Launch,
    /// `sluice scale worker NUM`.
    Scale { num: u32 },
    /// Every rank commits a data checkpoint at the same step.
    Checkpoint,
    /// A stored data checkpoint is restored on the live job.
    Restore { pick: u8 },
    /// The followed source grows by splits of these row counts.
    AddSplits { rows: Vec<u64> },
    /// Following ends, as at `until_version` or `sluice stop`.
    EndFollow,
    /// The journal gets a snapshot of the master, once everything before it is durable.
    Snapshot,
    /// The journal's writer makes every entry appended so far durable.
    Commit,
    /// A new AM takes the job over; `lose` picks how much of the losable tail is lost. With
    /// `reregister`, every daemon registers again at its next call, holding its tasks (the
    /// daemon's session only retries its call; a daemon restarted meanwhile registers).
    Takeover { lose: u8, reregister: bool },
    /// The daemon heartbeats, and the AM is taken over right after answering, before anything
    /// else is durable: the moment a heartbeat answered early is at stake.
    HeartbeatThenTakeover {
        node: usize,
        lose: u8,
        reregister: bool,
    },
    /// The node's link is cut: its daemon's calls fail, its trainers read on. `full`: a ring of
    /// it is full when its daemon is fenced, so the fence's record waits for the daemon started
    /// again.
    Cut { node: usize, full: bool },
    /// Time passes beyond the heartbeat timeout; every node not cut off heartbeats just before,
    /// so the AM declares the cut nodes lost.
    Lose,
    /// The node's link comes back.
    Reconnect { node: usize },
}

impl Op {
    /// The op with its node taken modulo `nodes`.
    fn on_nodes(self, nodes: usize) -> Op {
        match self {
            Op::Acquire { node } => Op::Acquire { node: node % nodes },
            Op::Produce { node, pick, rows } => Op::Produce {
                node: node % nodes,
                pick,
                rows,
            },
            Op::Consume { node, pick, rows } => Op::Consume {
                node: node % nodes,
                pick,
                rows,
            },
            Op::Heartbeat { node } => Op::Heartbeat { node: node % nodes },
            Op::ReportDone { node, pick } => Op::ReportDone {
                node: node % nodes,
                pick,
            },
            Op::DaemonRestart { node } => Op::DaemonRestart { node: node % nodes },
            Op::HeartbeatThenTakeover {
                node,
                lose,
                reregister,
            } => Op::HeartbeatThenTakeover {
                node: node % nodes,
                lose,
                reregister,
            },
            Op::Cut { node, full } => Op::Cut {
                node: node % nodes,
                full,
            },
            Op::Reconnect { node } => Op::Reconnect { node: node % nodes },
            other => other,
        }
    }
}

#[derive(Debug, Clone)]
struct Job {
    split_rows: Vec<u64>,
    task_rows: u64,
    epochs: u32,
    seed: u64,
    resplit_margin_rows: u64,
    resplit_min_rows: u64,
    nodes: u32,
    trainers: u32,
    follow: bool,
    /// The daemons keep a finished task until the journal's mark says its end is durable.
    keeps_finished: bool,
    ops: Vec<Op>,
}

/// Where a simulated daemon's loop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not registered: its next call registers, holding its tasks.
    Unregistered,
    /// Serving a registration.
    Serving,
    /// Told to release: its next call is the heartbeat of its final counts.
    Released,
    /// Rings given back: its next call registers holding nothing.
    GaveBack,
    /// Shut down by the AM.
    Shutdown,
}

#[derive(Debug, Clone)]
struct SimTask {
    task_id: u64,
    epoch: u32,
    split: u32,
    /// Split rows `[start, end)`; `end` moves when a stop cuts the task.
    start: u64,
    end: u64,
    /// The trainer rank whose ring the task feeds.
    rank: u32,
    /// Rows written into the ring and released by its trainer: what happened, which the daemon
    /// knows only from its ledger.
    enqueued: u64,
    consumed: u64,
    /// The stream position of the record of each row written, by its offset in the task.
    records: Vec<u64>,
    /// The offsets of the rows whose release entered the trainers' state.
    entered: BTreeSet<u64>,
    /// Reported consumed to its end to the AM of this generation, with the entries appended
    /// once that report's were: the daemon lets it go once as many are durable.
    reported_done: Option<(u64, usize)>,
}

impl SimTask {
    fn rows(&self) -> u64 {
        self.end - self.start
    }

    /// The meta of the record of the row at `offset`.
    fn record(&self, offset: u64) -> RecordMeta {
        RecordMeta {
            kind: RecordKind::Batch,
            task_id: self.task_id,
            first_row: self.start + offset,
            row_count: 1,
            tag: 0,
        }
    }
}

/// A ring of a simulated node: its ledger, the real one, and its stream.
#[derive(Debug, Clone)]
struct SimRing {
    ledger: Arc<RingLedger>,
    /// The stream position of the next record.
    position: u64,
    /// Records of tasks the node was fenced from, not yet read, with their positions: void, and
    /// read before anything written after them.
    void: VecDeque<(RecordMeta, u64)>,
}

impl SimRing {
    fn new(node: usize) -> SimRing {
        SimRing {
            ledger: Arc::new(RingLedger::in_memory(64, node as u64)),
            position: 0,
            void: VecDeque::new(),
        }
    }

    /// A record goes into the stream; returns its position.
    fn write(&mut self) -> u64 {
        self.position += 1;
        self.position - 1
    }

    /// The counts of `task` as the daemon reports them: from the ledger.
    fn progress(&self, task: &SimTask) -> Result<TaskProgress, TestCaseError> {
        let bound = self
            .ledger
            .task(task.task_id)
            .ok_or_else(|| fail(format!("task-{} is not bound to its ring", task.task_id)))?;
        Ok(TaskProgress {
            task: TaskId(task.task_id),
            enqueued: bound.enqueued_end - bound.start,
            consumed: bound.consumed_end - bound.start,
        })
    }
}

#[derive(Debug, Clone)]
struct SimNode {
    phase: Phase,
    ranks: Vec<u32>,
    tasks: Vec<SimTask>,
    /// Stops applied and not yet acknowledged: task and stop row.
    acks: Vec<(u64, u64)>,
    /// The rings, by rank; they outlive the daemon, and go with a give-back.
    rings: BTreeMap<u32, SimRing>,
    /// The node's link is cut.
    cut: bool,
    /// The daemon's lease lapsed: its writers publish nothing until an answer renews it.
    lapsed: bool,
    /// The AM declared the node lost: its trainers' reads are void until the fence.
    reads_void: bool,
    /// A ring of it is full when its daemon is fenced.
    full: bool,
}

impl SimNode {
    fn new() -> SimNode {
        SimNode {
            phase: Phase::Unregistered,
            ranks: Vec::new(),
            tasks: Vec::new(),
            acks: Vec::new(),
            rings: BTreeMap::new(),
            cut: false,
            lapsed: false,
            reads_void: false,
            full: false,
        }
    }

    fn ring(&self, rank: u32) -> Result<&SimRing, TestCaseError> {
        self.rings
            .get(&rank)
            .ok_or_else(|| fail(format!("no ring of rank {rank}")))
    }

    /// The counts of every task the daemon holds, from its ledgers.
    fn progress(&self) -> Result<Vec<TaskProgress>, TestCaseError> {
        self.tasks
            .iter()
            .map(|task| self.ring(task.rank)?.progress(task))
            .collect()
    }

    /// Frees the ledger slots of tasks the daemon let go.
    fn let_go(&self, tasks: &[SimTask]) {
        for task in tasks {
            if let Some(ring) = self.rings.get(&task.rank) {
                ring.ledger.free(task.task_id);
            }
        }
    }

    /// Whether the daemon's ledger has `task` consumed to its end.
    fn finished(&self, task: &SimTask) -> bool {
        self.ring(task.rank)
            .and_then(|ring| ring.progress(task))
            .is_ok_and(|progress| progress.consumed >= task.rows())
    }
}

/// `(epoch, split, row)` and how often the trainers' state holds it.
type Ledger = HashMap<(u32, u32, u64), u32>;

/// Each task's consumed end (a split row) in each epoch: what the ranks report at a checkpoint.
type Positions = BTreeMap<u32, BTreeMap<u64, u64>>;

/// A stored data checkpoint and the trainers' state at its step.
#[derive(Debug, Clone)]
struct Stored {
    token: String,
    position: DataPosition,
    ledger: Ledger,
    positions: Positions,
}

/// Counts of notable paths across all cases, to show they were exercised.
#[derive(Debug, Default)]
struct Coverage {
    scales: usize,
    scales_done: usize,
    checkpoints: usize,
    restores: usize,
    relaunch_restores: usize,
    takeovers: usize,
    takeovers_mid_scale: usize,
    takeovers_mid_restore: usize,
    lost_entries: usize,
    /// Heartbeats answered before their entries were durable that finished tasks.
    finished_early: usize,
    /// Takeovers that lost one of them.
    lost_finishes: usize,
    snapshots_used: usize,
    added_splits: usize,
    resumed: usize,
    stops: usize,
    succeeded: usize,
    followed_grew_and_succeeded: usize,
    /// Nodes declared lost.
    lost: usize,
    /// Daemons fenced while serving, and at their registration.
    fenced_serving: usize,
    fenced_registering: usize,
    /// Fences whose record found its ring full and was written by the daemon started again.
    fence_records_deferred: usize,
    /// Reads the AM had not counted, made void by a fence.
    void_reads: usize,
    /// Void records read while their task was bound to the ring again.
    void_reads_rebound: usize,
}

struct Sim<'a> {
    spec: Arc<JobSpec>,
    plan: Arc<JobPlan>,
    sut: Master,
    now_ms: u64,
    nodes: Vec<SimNode>,
    /// Running trainer processes, each with the number of restores before its launch.
    trainers: BTreeMap<ExecutorId, u64>,
    /// Effective restores so far.
    restores: u64,
    /// The checkpoint the trainers a restore relaunches load.
    relaunch_from: Option<(String, DataPosition)>,
    split_rows: Vec<u64>,
    ledger: Ledger,
    positions: Positions,
    stored: Vec<Stored>,
    next_step: u64,
    /// Every entry journaled, and whether it comes from a heartbeat answered before it was
    /// durable that finished tasks.
    journal: Vec<(Entry, bool)>,
    /// The entries of `journal` that are durable: a takeover keeps these.
    durable: usize,
    /// The AM's generation in the journal's marks: one more at each takeover.
    generation: u64,
    /// The daemons keep a finished task until the journal's mark says its end is durable.
    keeps_finished: bool,
    snapshot: Option<(Snapshot, usize)>,
    added_files: usize,
    coverage: &'a RefCell<Coverage>,
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

/// Whether an answer fences the daemon.
fn fences(commands: &[NodeCommand]) -> bool {
    commands
        .iter()
        .any(|command| matches!(command, NodeCommand::Fence))
}

fn trainer(rank: u32) -> ExecutorId {
    ExecutorId::Trainer {
        role: ROLE.to_owned(),
        rank,
    }
}

fn spec_text(job: &Job) -> String {
    let follow = if job.follow { ", follow: true" } else { "" };
    format!(
        r#"
name: prop
data:
  sources: [{{ uri: "file:///data/train", format: parquet{follow} }}]
  task_rows: {task_rows}
  epochs: {epochs}
  batch_size: 2
  shuffle: {{ seed: {seed} }}
  resplit_margin_rows: {margin}
  resplit_min_rows: {min}
nodes: {nodes}
roles:
  - {{ name: {ROLE}, num: {trainers}, command: [train] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS}, max_total_failures: 1000000 }}
"#,
        task_rows = job.task_rows,
        epochs = job.epochs,
        seed = job.seed,
        margin = job.resplit_margin_rows,
        min = job.resplit_min_rows,
        nodes = job.nodes,
        trainers = job.trainers,
    )
}

impl Sim<'_> {
    /// Journals what a call applied, and unless it is answered `early` (before its entries are
    /// durable) waits for them, which makes every entry before them durable too. A call without
    /// entries waits for nothing.
    fn journal<T>(&mut self, applied: &Applied<T>, early: bool) {
        self.journal
            .extend(applied.entries.iter().map(|entry| (entry.clone(), false)));
        if !early && !applied.entries.is_empty() {
            self.durable = self.journal.len();
        }
    }

    /// The daemon takes the journal's mark from an answer, as it goes out once the call's
    /// entries are appended: the finished tasks it `reported` in this call (and reported to no
    /// earlier call of this AM) wait for what is appended now, and those whose wait is over go.
    fn take_mark(&mut self, node: usize, reported: bool) {
        let (generation, appended, durable) = (self.generation, self.journal.len(), self.durable);
        let finished: BTreeSet<u64> = self.nodes[node]
            .tasks
            .iter()
            .filter(|task| self.nodes[node].finished(task))
            .map(|task| task.task_id)
            .collect();
        let tasks = &mut self.nodes[node].tasks;
        if reported {
            for task in tasks
                .iter_mut()
                .filter(|task| finished.contains(&task.task_id))
            {
                if task
                    .reported_done
                    .is_none_or(|(reported_to, _)| reported_to != generation)
                {
                    task.reported_done = Some((generation, appended));
                }
            }
        }
        let sim_node = &mut self.nodes[node];
        let (gone, kept): (Vec<SimTask>, Vec<SimTask>) = std::mem::take(&mut sim_node.tasks)
            .into_iter()
            .partition(|task| {
                task.reported_done.is_some_and(|(reported_to, until)| {
                    reported_to == generation && durable >= until
                })
            });
        sim_node.tasks = kept;
        sim_node.let_go(&gone);
    }

    fn tick(&mut self) {
        self.now_ms += 1;
    }

    /// Whether the trainer reading ring `rank` runs, and whether its rows enter the ledger.
    fn reader(&self, rank: u32) -> Option<bool> {
        self.trainers
            .get(&trainer(rank))
            .map(|restores| *restores == self.restores)
    }

    /// Applies the AM's commands as the daemon's serve loop does. A registration's answer gives
    /// back the tasks the daemon keeps; the others are freed.
    fn obey(
        &mut self,
        node: usize,
        commands: Vec<NodeCommand>,
        registering: bool,
    ) -> Result<(), TestCaseError> {
        let mut kept = BTreeSet::new();
        let was_shut_down = self.nodes[node].phase == Phase::Shutdown;
        if !fences(&commands) {
            // Any answer but a fence renews the lease.
            self.nodes[node].lapsed = false;
        }
        for command in commands {
            match command {
                NodeCommand::Assign(tasks) => {
                    for assignment in tasks {
                        kept.insert(assignment.task.0);
                        self.take_task(node, &assignment)?;
                    }
                }
                NodeCommand::Stop { task: stop, row } => {
                    self.coverage.borrow_mut().stops += 1;
                    let sim_node = &mut self.nodes[node];
                    if let Some(task) = sim_node
                        .tasks
                        .iter_mut()
                        .find(|task| task.task_id == stop.0)
                    {
                        let at = row.max(task.start + task.enqueued).min(task.end);
                        task.end = at;
                        let rank = task.rank;
                        if let Some(ring) = sim_node.rings.get(&rank) {
                            ring.ledger.set_end(stop.0, at);
                        }
                        sim_node.acks.push((stop.0, at));
                    }
                }
                NodeCommand::Shutdown => self.nodes[node].phase = Phase::Shutdown,
                // The simulated job has no data.even_batches: no ring pads.
                NodeCommand::Settled { .. } => {}
                NodeCommand::Release => {
                    // The commands after it were meant for the rings given back.
                    self.nodes[node].phase = Phase::Released;
                    break;
                }
                NodeCommand::Fence => return self.fenced(node, registering),
                NodeCommand::Refuse(_) => {}
            }
        }
        if registering {
            // The registration's answer gave back every task the AM kept; the other slots go.
            let sim_node = &mut self.nodes[node];
            let (kept, gone): (Vec<SimTask>, Vec<SimTask>) = std::mem::take(&mut sim_node.tasks)
                .into_iter()
                .partition(|task| kept.contains(&task.task_id));
            sim_node.tasks = kept;
            sim_node.let_go(&gone);
        }
        if !was_shut_down && self.nodes[node].phase == Phase::Shutdown {
            // The daemon exits, and the launcher sees it.
            let applied = self
                .sut
                .executor_exited(ExecutorId::Daemon(node as u32), Exit::Code(0));
            self.journal(&applied, false);
        }
        Ok(())
    }

    fn take_task(&mut self, node: usize, assignment: &Assignment) -> Result<(), TestCaseError> {
        let sim_node = &mut self.nodes[node];
        if let Some(held) = sim_node
            .tasks
            .iter_mut()
            .find(|task| task.task_id == assignment.task.0)
        {
            if held.start != assignment.start || held.start + held.enqueued > assignment.end {
                return Err(fail(format!(
                    "node {node} is given back {assignment:?}, but its ring holds {held:?}"
                )));
            }
            held.end = assignment.end;
            let (task_id, rank) = (held.task_id, held.rank);
            sim_node.ring(rank)?.ledger.set_end(task_id, assignment.end);
            self.coverage.borrow_mut().resumed += 1;
            return Ok(());
        }
        let Some(rank) = sim_node.ranks.iter().copied().min_by_key(|rank| {
            sim_node
                .tasks
                .iter()
                .filter(|task| task.rank == *rank)
                .count()
        }) else {
            return Err(fail(format!(
                "node {node} feeds no trainer rank but was assigned {assignment:?}"
            )));
        };
        let ring = sim_node.ring(rank)?;
        // Bound where the ring's stream stands, as `RingState::bind` binds.
        ring.ledger
            .bind(
                &LedgerTask {
                    task_id: assignment.task.0,
                    epoch: assignment.epoch,
                    start: assignment.start,
                    end: assignment.end,
                    consumed_end: assignment.start,
                    enqueued_end: assignment.start,
                },
                ring.position,
            )
            .map_err(|error| fail(format!("node {node}: {error}")))?;
        if ring
            .void
            .iter()
            .any(|(meta, _)| meta.task_id == assignment.task.0)
        {
            self.coverage.borrow_mut().void_reads_rebound += 1;
        }
        sim_node.tasks.push(SimTask {
            task_id: assignment.task.0,
            epoch: assignment.epoch,
            split: assignment.split,
            start: assignment.start,
            end: assignment.end,
            rank,
            enqueued: 0,
            consumed: 0,
            records: Vec::new(),
            entered: BTreeSet::new(),
            reported_done: None,
        });
        Ok(())
    }

    /// The daemon registers holding what its ledgers hold, as `Recovered::held` reads them.
    fn register(&mut self, node: usize) -> Result<(), TestCaseError> {
        let mut held = Vec::new();
        for ring in self.nodes[node].rings.values() {
            let tasks = ring
                .ledger
                .tasks()
                .map_err(|error| fail(format!("node {node}: {error}")))?;
            held.extend(tasks.iter().map(|task| TaskProgress {
                task: TaskId(task.task_id),
                enqueued: task.enqueued_end - task.start,
                consumed: task.consumed_end - task.start,
            }));
        }
        self.register_holding(node, held)
    }

    fn register_holding(
        &mut self,
        node: usize,
        held: Vec<TaskProgress>,
    ) -> Result<(), TestCaseError> {
        let applied = self
            .sut
            .register(
                Registration {
                    node: NodeId(node as u64),
                    job_id: "prop".into(),
                    hostname: format!("host-{node}"),
                    held,
                    by_host: false,
                },
                self.now_ms,
            )
            .map_err(|error| fail(format!("registration of node {node} refused: {error}")))?;
        self.journal(&applied, false);
        if fences(&applied.reply.commands) {
            return self.obey(node, applied.reply.commands, true);
        }
        let sim_node = &mut self.nodes[node];
        sim_node.phase = Phase::Serving;
        sim_node.ranks = applied.reply.ranks;
        sim_node.acks.clear();
        sim_node.reads_void = false;
        // The rings of its ranks open; a writer whose ring owes a fence's record writes it first.
        for rank in sim_node.ranks.clone() {
            let ring = sim_node
                .rings
                .entry(rank)
                .or_insert_with(|| SimRing::new(node));
            if ring.ledger.fence_owed() {
                ring.write();
                ring.ledger.fence_written();
            }
        }
        self.obey(node, applied.reply.commands, true)
    }

    /// The AM fenced the daemon, at its registration or while it served: the rows its trainers
    /// read that the AM has yet to see consumed are void, and leave the trainers' state; the rows
    /// its rings still hold of its tasks are read void; its ledgers forget their tasks and owe
    /// their trainers the fence's record. Fenced at its registration, the daemon registers again
    /// holding nothing; fenced while serving, it writes the record (unless its ring is full) and
    /// exits, to be started again.
    fn fenced(&mut self, node: usize, registering: bool) -> Result<(), TestCaseError> {
        self.void_reads(node)?;
        let sim_node = &mut self.nodes[node];
        sim_node.reads_void = false;
        for task in std::mem::take(&mut sim_node.tasks) {
            let ring = sim_node
                .rings
                .get_mut(&task.rank)
                .ok_or_else(|| fail(format!("node {node}: no ring of rank {}", task.rank)))?;
            for offset in task.consumed..task.enqueued {
                ring.void
                    .push_back((task.record(offset), task.records[offset as usize]));
            }
        }
        sim_node.acks.clear();
        let full = std::mem::take(&mut sim_node.full);
        let mut coverage = self.coverage.borrow_mut();
        for ring in sim_node.rings.values_mut() {
            let holds_tasks = !ring.ledger.tasks().map_or(true, |tasks| tasks.is_empty());
            if !registering || holds_tasks {
                ring.ledger.owe_fence();
            }
            if !registering && !full {
                ring.write();
                ring.ledger.fence_written();
            }
            ring.ledger.clear();
        }
        if registering {
            coverage.fenced_registering += 1;
            drop(coverage);
            return self.register_holding(node, Vec::new());
        }
        coverage.fenced_serving += 1;
        coverage.fence_records_deferred += usize::from(full);
        sim_node.phase = Phase::Unregistered;
        Ok(())
    }

    /// The AM declared the node lost, or fenced it: the reads of its trainers that the AM has yet
    /// to see consumed are void. They leave the trainers' state, with the positions they moved,
    /// and its trainers' reads from now on until the fence are void too.
    fn void_reads(&mut self, node: usize) -> Result<(), TestCaseError> {
        let owed = self.owed_rows();
        let sim_node = &mut self.nodes[node];
        sim_node.reads_void = true;
        let mut void_reads = 0;
        for task in &mut sim_node.tasks {
            let void: Vec<u64> = task
                .entered
                .iter()
                .copied()
                .filter(|offset| owed.contains(&(task.epoch, task.split, task.start + offset)))
                .collect();
            for offset in void {
                task.entered.remove(&offset);
                void_reads += 1;
                let row = (task.epoch, task.split, task.start + offset);
                // The trainers' state drops the void tail of the task's reads, its position with
                // it.
                if let Some(position) = self
                    .positions
                    .get_mut(&task.epoch)
                    .and_then(|positions| positions.get_mut(&task.task_id))
                {
                    *position = (*position).min(row.2);
                }
                match self.ledger.get_mut(&row) {
                    Some(count) if *count > 1 => *count -= 1,
                    Some(_) => {
                        self.ledger.remove(&row);
                    }
                    None => {
                        return Err(fail(format!(
                            "node {node}: a void read of {row:?} is not in the trainers' state"
                        )));
                    }
                }
            }
        }
        self.coverage.borrow_mut().void_reads += void_reads;
        Ok(())
    }

    /// Every row of the current epoch the AM has yet to see consumed: the rows of its tasks not
    /// done, past what their holders reported.
    fn owed_rows(&self) -> BTreeSet<(u32, u32, u64)> {
        let table = self.sut.table();
        let epoch = table.epoch();
        let consumed: HashMap<TaskId, u64> = table
            .tasks_in_flight()
            .map(|flight| (flight.task, flight.consumed))
            .collect();
        let mut owed = BTreeSet::new();
        for (index, (span, done)) in table.task_spans().enumerate() {
            if done {
                continue;
            }
            let task = TaskId(table.first_task_id() + index as u64);
            let from = span.start + consumed.get(&task).copied().unwrap_or(0);
            owed.extend((from..span.end).map(|row| (epoch, span.split, row)));
        }
        owed
    }

    /// What the daemon's loop owes before any other call; returns whether it did something, or
    /// could make no call at all (its link is cut).
    fn owed(&mut self, node: usize) -> Result<bool, TestCaseError> {
        if self.nodes[node].cut {
            return Ok(true);
        }
        match self.nodes[node].phase {
            Phase::Shutdown => Ok(true),
            Phase::Unregistered | Phase::GaveBack => {
                self.register(node)?;
                Ok(true)
            }
            Phase::Released => {
                self.give_back(node)?;
                Ok(true)
            }
            Phase::Serving if !self.nodes[node].acks.is_empty() => {
                let acks = std::mem::take(&mut self.nodes[node].acks);
                let mut commands = Vec::new();
                for (task_id, stop_row) in acks {
                    let applied = self.sut.ack_stop(
                        NodeId(node as u64),
                        TaskId(task_id),
                        stop_row,
                        self.now_ms,
                    );
                    self.journal(&applied, false);
                    commands.extend(applied.reply);
                }
                self.obey(node, commands, false)?;
                Ok(true)
            }
            Phase::Serving => Ok(false),
        }
    }

    /// Reports the final counts of every task and removes the rings.
    fn give_back(&mut self, node: usize) -> Result<(), TestCaseError> {
        let progress = self.nodes[node].progress()?;
        let before = self.sut.standing();
        let applied = self.sut.heartbeat(
            Heartbeat {
                hostname: String::new(),
                node: NodeId(node as u64),
                progress,
                stages: Vec::new(),
                rings: Vec::new(),
                ring_batches: Vec::new(),
                keeps_finished_until_durable: self.keeps_finished,
                tuning: None,
                bad: Vec::new(),
                handed: Vec::new(),
                dropped: Vec::new(),
            },
            self.now_ms,
        );
        // On its answer the daemon removes its rings, the only other copy of its counts.
        if self
            .sut
            .answers_before_durable(before, &applied.reply, self.keeps_finished)
        {
            return Err(fail(format!(
                "node {node}: the master would answer a give-back's final heartbeat before it is durable"
            )));
        }
        self.journal(&applied, false);
        let sim_node = &mut self.nodes[node];
        sim_node.tasks.clear();
        sim_node.ranks.clear();
        sim_node.acks.clear();
        sim_node.rings.clear();
        sim_node.phase = Phase::GaveBack;
        Ok(())
    }

    fn heartbeat(&mut self, node: usize) -> Result<(), TestCaseError> {
        let progress = self.nodes[node].progress()?;
        let before = self.sut.standing();
        let applied = self.sut.heartbeat(
            Heartbeat {
                hostname: String::new(),
                node: NodeId(node as u64),
                progress,
                stages: Vec::new(),
                rings: Vec::new(),
                ring_batches: Vec::new(),
                keeps_finished_until_durable: self.keeps_finished,
                tuning: None,
                bad: Vec::new(),
                handed: Vec::new(),
                dropped: Vec::new(),
            },
            self.now_ms,
        );
        // The master says which heartbeats are answered before they are durable: those the
        // journal may lose at a takeover.
        let early = self
            .sut
            .answers_before_durable(before, &applied.reply, self.keeps_finished);
        self.journal(&applied, early);
        if early && self.sut.standing() != before {
            self.coverage.borrow_mut().finished_early += 1;
            let appended = self.journal.len();
            for (_, finishing) in &mut self.journal[appended - applied.entries.len()..] {
                *finishing = true;
            }
        }
        if fences(&applied.reply) {
            // The daemon lets nothing go on a fence: its rings are void from the AM's last count.
            return self.obey(node, applied.reply, false);
        }
        if self.keeps_finished {
            self.take_mark(node, true);
        } else {
            let sim_node = &mut self.nodes[node];
            let (gone, kept): (Vec<SimTask>, Vec<SimTask>) = std::mem::take(&mut sim_node.tasks)
                .into_iter()
                .partition(|task| sim_node.finished(task));
            sim_node.tasks = kept;
            sim_node.let_go(&gone);
        }
        self.obey(node, applied.reply, false)
    }

    fn acquire(&mut self, node: usize) -> Result<(), TestCaseError> {
        let sim_node = &self.nodes[node];
        let holding = sim_node
            .tasks
            .iter()
            .filter(|task| task.reported_done.is_none())
            .count();
        let wanted = (2 * sim_node.ranks.len()).saturating_sub(holding);
        if wanted == 0 {
            return Ok(());
        }
        let applied = self
            .sut
            .acquire(NodeId(node as u64), wanted as u32, true, self.now_ms);
        self.journal(&applied, false);
        if self.keeps_finished && !fences(&applied.reply) {
            self.take_mark(node, false);
        }
        self.obey(node, applied.reply, false)
    }

    fn report_done(&mut self, node: usize, pick: u8) -> Result<(), TestCaseError> {
        let tasks = &self.nodes[node].tasks;
        if tasks.is_empty() {
            return Ok(());
        }
        let task = tasks[usize::from(pick) % tasks.len()].clone();
        if !self.nodes[node].finished(&task) {
            return Ok(());
        }
        let consumed = self.nodes[node].ring(task.rank)?.progress(&task)?.consumed;
        let applied = self.sut.report(
            TaskReport {
                node: NodeId(node as u64),
                task: TaskId(task.task_id),
                consumed,
                outcome: ReportOutcome::Done,
            },
            self.now_ms,
        );
        self.journal(&applied, false);
        if fences(&applied.reply) {
            return self.obey(node, applied.reply, false);
        }
        let sim_node = &mut self.nodes[node];
        sim_node.tasks.retain(|held| held.task_id != task.task_id);
        sim_node.let_go(std::slice::from_ref(&task));
        self.obey(node, applied.reply, false)
    }

    /// The index of the task `pick` chooses on a serving node.
    fn pick_task(&self, node: usize, pick: u8) -> Option<usize> {
        let sim_node = &self.nodes[node];
        (sim_node.phase == Phase::Serving && !sim_node.tasks.is_empty())
            .then(|| usize::from(pick) % sim_node.tasks.len())
    }

    /// The task's feeder writes up to `rows` more rows of it into its ring, one record each, and
    /// the survey raises the ledger's enqueued end; a node cut off, or whose lease lapsed,
    /// publishes nothing.
    fn produce(&mut self, node: usize, index: usize, rows: u64) -> Result<(), TestCaseError> {
        let sim_node = &mut self.nodes[node];
        if sim_node.cut || sim_node.lapsed {
            return Ok(());
        }
        let task = &mut sim_node.tasks[index];
        let ring = sim_node
            .rings
            .get_mut(&task.rank)
            .ok_or_else(|| fail(format!("node {node}: no ring of rank {}", task.rank)))?;
        let to = task.enqueued.saturating_add(rows).min(task.rows());
        for offset in task.enqueued..to {
            if ring.ledger.fence_owed() {
                return Err(fail(format!(
                    "node {node}: a record written into ring {} before the fence's record it owes",
                    task.rank
                )));
            }
            let position = ring.write();
            task.records.push(position);
            ring.ledger
                .record_enqueued(task.task_id, task.start + offset + 1, position);
        }
        task.enqueued = to;
        Ok(())
    }

    /// The trainer of the task's ring releases up to `rows` more rows of it, each folded into the
    /// ring's ledger; first the void rows the ring holds from before a fence, which enter nothing.
    fn consume(&mut self, node: usize, index: usize, rows: u64) -> Result<(), TestCaseError> {
        let rank = self.nodes[node].tasks[index].rank;
        let Some(counted) = self.reader(rank) else {
            return Ok(());
        };
        let ring = self.nodes[node]
            .rings
            .get_mut(&rank)
            .ok_or_else(|| fail(format!("node {node}: no ring of rank {rank}")))?;
        if !ring.void.is_empty() {
            for _ in 0..rows {
                let Some((meta, position)) = ring.void.pop_front() else {
                    break;
                };
                ring.ledger.fold(meta, position);
            }
            return Ok(());
        }
        let ledger = ring.ledger.clone();
        let counted = counted && !self.nodes[node].reads_void;
        let task = &mut self.nodes[node].tasks[index];
        let from = task.consumed;
        task.consumed = (task.consumed + rows).min(task.enqueued);
        for offset in from..task.consumed {
            ledger.fold(task.record(offset), task.records[offset as usize]);
        }
        if counted {
            task.entered.extend(from..task.consumed);
        }
        let task = task.clone();
        if !counted {
            return Ok(());
        }
        for offset in from..task.consumed {
            let row = (task.epoch, task.split, task.start + offset);
            let count = self.ledger.entry(row).or_insert(0);
            *count += 1;
            if *count > 1 {
                return Err(fail(format!(
                    "row {} of split {} in epoch {} consumed twice, by rank {} from task-{} on node {node}",
                    row.2, row.1, row.0, task.rank, task.task_id
                )));
            }
        }
        self.positions
            .entry(task.epoch)
            .or_default()
            .insert(task.task_id, task.start + task.consumed);
        Ok(())
    }

    /// The launcher launches what the AM wants running; trainers a restore relaunched load its
    /// checkpoint and call `restore`, which must change nothing.
    fn launch(&mut self) -> Result<(), TestCaseError> {
        let mut launched_trainers = Vec::new();
        for LaunchAction::Launch(id) in self.sut.executors_to_launch() {
            let applied = self.sut.executor_launched(id.clone());
            self.journal(&applied, false);
            match id {
                ExecutorId::Trainer { .. } => {
                    self.trainers.insert(id.clone(), self.restores);
                    launched_trainers.push(id);
                }
                ExecutorId::Daemon(node) => {
                    // A daemon launched again starts from nothing: the one before it shut down.
                    if let Some(sim_node) = self.nodes.get_mut(node as usize)
                        && sim_node.phase == Phase::Shutdown
                    {
                        *sim_node = SimNode { ..SimNode::new() };
                    }
                }
            }
        }
        if launched_trainers.is_empty() {
            return Ok(());
        }
        let Some((token, position)) = self.relaunch_from.take() else {
            return Ok(());
        };
        for id in launched_trainers {
            let applied = self
                .sut
                .restore(token.clone(), position.clone(), self.now_ms, None)
                .map_err(|error| {
                    fail(format!(
                        "{id}, relaunched by the restore of {token}, calls restore again: {error}"
                    ))
                })?;
            if !applied.entries.is_empty() {
                return Err(fail(format!(
                    "{id}, relaunched by the restore of {token}, restored it again: {:?}",
                    applied.entries
                )));
            }
            self.coverage.borrow_mut().relaunch_restores += 1;
        }
        Ok(())
    }

    /// One trainer the AM retired ends, or is seen ended: the launcher reports a retiring trainer
    /// that no longer runs as ended.
    fn trainer_exits(&mut self, pick: impl FnOnce(usize) -> usize) {
        let retiring: Vec<ExecutorId> = self
            .sut
            .executors()
            .map(|executors| executors.retiring().cloned().collect())
            .unwrap_or_default();
        if retiring.is_empty() {
            return;
        }
        let id = retiring[pick(retiring.len())].clone();
        self.trainers.remove(&id);
        let applied = self.sut.executor_exited(id, Exit::Killed);
        self.journal(&applied, false);
    }

    fn scale(&mut self, num: u32) {
        if let Ok(applied) = self.sut.scale(ROLE, num) {
            if !applied.entries.is_empty() {
                self.coverage.borrow_mut().scales += 1;
            }
            self.journal(&applied, false);
        }
    }

    /// Every rank of the running world commits the same step, when every trainer runs.
    fn checkpoint(&mut self) -> Result<(), TestCaseError> {
        let world = self.sut.world_size();
        let all_running = (0..world).all(|rank| self.reader(rank) == Some(true))
            && self.trainers.len() == world as usize;
        if !all_running {
            return Ok(());
        }
        let epoch = self.sut.table().epoch();
        let step = self.next_step;
        self.next_step += 1;
        let mine = self.positions.get(&epoch).cloned().unwrap_or_default();
        for rank in 0..world {
            let positions = if rank == 0 {
                mine.iter()
                    .map(|(task_id, end_row)| (TaskId(*task_id), *end_row))
                    .collect()
            } else {
                Vec::new()
            };
            let applied = match self.sut.commit_checkpoint(RankCommit {
                step,
                rank,
                world_size: world,
                epoch,
                positions,
            }) {
                Ok(applied) => applied,
                Err(error) => {
                    return Err(fail(format!(
                        "rank {rank}'s commit of step {step} refused: {error}"
                    )));
                }
            };
            self.journal(&applied, false);
            if let CommitOutcome::Ready(ready) = applied.reply {
                let stored = self.sut.checkpoint_stored(ready.step, ready.token.clone());
                self.journal(&stored, false);
                self.stored.push(Stored {
                    token: ready.token,
                    position: ready.position,
                    ledger: self.ledger.clone(),
                    positions: self.positions.clone(),
                });
                self.coverage.borrow_mut().checkpoints += 1;
            }
        }
        Ok(())
    }

    fn restore(&mut self, pick: u8) -> Result<(), TestCaseError> {
        if self.stored.is_empty() {
            return Ok(());
        }
        let stored = self.stored[usize::from(pick) % self.stored.len()].clone();
        let Ok(applied) = self.sut.restore(
            stored.token.clone(),
            stored.position.clone(),
            self.now_ms,
            None,
        ) else {
            return Ok(());
        };
        if applied.entries.is_empty() {
            return Ok(());
        }
        self.journal(&applied, false);
        self.ledger = stored.ledger;
        self.positions = stored.positions;
        // The trainers' state is the checkpoint's: no read since is in it.
        for task in self.nodes.iter_mut().flat_map(|node| node.tasks.iter_mut()) {
            task.entered.clear();
        }
        self.restores += 1;
        self.relaunch_from = Some((stored.token, stored.position));
        self.coverage.borrow_mut().restores += 1;
        Ok(())
    }

    fn add_splits(&mut self, rows: Vec<u64>) {
        if self.sut.follow_target(0).is_none() {
            return;
        }
        let splits = rows
            .iter()
            .map(|rows| {
                self.added_files += 1;
                planned_split(&format!("added-{}", self.added_files), *rows)
            })
            .collect();
        let applied = self.sut.add_splits(0, None, JobPlan::of_splits(0, splits));
        self.journal(&applied, false);
        self.split_rows.extend(rows);
        self.coverage.borrow_mut().added_splits += 1;
    }

    fn end_follow(&mut self) {
        let following = self
            .sut
            .follows()
            .first()
            .and_then(Option::as_ref)
            .is_some_and(|follow| follow.following);
        if following {
            let applied = self.sut.end_follow(0, "until_version reached".to_owned());
            self.journal(&applied, false);
        }
    }

    /// A new AM takes the job over from the journal, which lost `lose` of the entries not yet
    /// durable (none before the last snapshot).
    fn take_over(&mut self, lose: u8) -> Result<(), TestCaseError> {
        let from = self.snapshot.as_ref().map_or(0, |(_, at)| *at);
        let losable = self.journal.len() - self.durable;
        let lost = usize::from(lose) % (losable + 1);
        let lost_finish = self.journal[self.journal.len() - lost..]
            .iter()
            .any(|(_, finishing)| *finishing);
        self.journal.truncate(self.journal.len() - lost);
        {
            let mut coverage = self.coverage.borrow_mut();
            coverage.takeovers += 1;
            coverage.lost_entries += lost;
            coverage.lost_finishes += usize::from(lost_finish);
            coverage.snapshots_used += usize::from(self.snapshot.is_some());
            if let Some(rescale) = &self.sut.rescale {
                if rescale.restore {
                    coverage.takeovers_mid_restore += 1;
                } else {
                    coverage.takeovers_mid_scale += 1;
                }
            }
        }
        let broken = |error: AmError| fail(format!("takeover failed: {error}"));
        let mut sut = Master::new(self.spec.clone(), self.plan.clone()).map_err(broken)?;
        sut.launch_executors();
        if let Some((snapshot, _)) = &self.snapshot {
            sut.restore_snapshot(snapshot.clone()).map_err(broken)?;
        }
        for (entry, _) in &self.journal[from..] {
            sut.replay(entry.clone()).map_err(broken)?;
        }
        sut.grant_grace(self.now_ms);
        sut.resume_commands();
        self.sut = sut;
        // What the new AM read is durable, and it writes as a new generation.
        self.durable = self.journal.len();
        self.generation += 1;
        Ok(())
    }

    /// A takeover; with `reregister`, every daemon registers again at its next call.
    fn take_over_then(&mut self, lose: u8, reregister: bool) -> Result<(), TestCaseError> {
        self.take_over(lose)?;
        if reregister {
            for node in 0..self.nodes.len() {
                self.restart_daemon(node);
            }
        }
        Ok(())
    }

    /// The daemon restarts: it keeps its rings, tasks and counts, forgets its queued
    /// acknowledgements, and registers at its next call (holding nothing once it gave its rings
    /// back).
    fn restart_daemon(&mut self, node: usize) {
        let sim_node = &mut self.nodes[node];
        sim_node.acks.clear();
        if matches!(sim_node.phase, Phase::Serving | Phase::Released) {
            sim_node.phase = Phase::Unregistered;
        }
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        self.tick();
        let nodes = self.nodes.len();
        match op.on_nodes(nodes) {
            Op::Acquire { node } => {
                if !self.owed(node)? {
                    self.acquire(node)?;
                }
            }
            Op::Produce { node, pick, rows } => {
                if let Some(index) = self.pick_task(node, pick) {
                    self.produce(node, index, rows)?;
                }
            }
            Op::Consume { node, pick, rows } => {
                if let Some(index) = self.pick_task(node, pick) {
                    self.consume(node, index, rows)?;
                }
            }
            Op::Heartbeat { node } => {
                if !self.owed(node)? {
                    self.heartbeat(node)?;
                }
            }
            Op::ReportDone { node, pick } => {
                if !self.owed(node)? {
                    self.report_done(node, pick)?;
                }
            }
            Op::DaemonRestart { node } => self.restart_daemon(node),
            Op::TrainerExits { pick } => self.trainer_exits(|len| usize::from(pick) % len),
            Op::Launch => self.launch()?,
            Op::Scale { num } => self.scale(num),
            Op::Checkpoint => self.checkpoint()?,
            Op::Restore { pick } => self.restore(pick)?,
            Op::AddSplits { rows } => self.add_splits(rows),
            Op::EndFollow => self.end_follow(),
            Op::Snapshot => {
                self.durable = self.journal.len();
                self.snapshot = Some((self.sut.snapshot(), self.journal.len()));
            }
            Op::Commit => self.durable = self.journal.len(),
            Op::Takeover { lose, reregister } => self.take_over_then(lose, reregister)?,
            Op::HeartbeatThenTakeover {
                node,
                lose,
                reregister,
            } => {
                if !self.owed(node)? {
                    self.heartbeat(node)?;
                }
                self.take_over_then(lose, reregister)?;
            }
            Op::Cut { node, full } => {
                let sim_node = &mut self.nodes[node];
                sim_node.cut = true;
                sim_node.full = full;
            }
            Op::Lose => self.lose()?,
            Op::Reconnect { node } => self.nodes[node].cut = false,
        }
        Ok(())
    }

    /// Time passes beyond the heartbeat timeout, every node not cut off heartbeating (or doing
    /// what its loop owes) just before; the AM's tick declares the cut nodes lost.
    fn lose(&mut self) -> Result<(), TestCaseError> {
        if !self.nodes.iter().any(|node| node.cut) {
            return Ok(());
        }
        self.now_ms += HEARTBEAT_TIMEOUT_MS;
        for node in &mut self.nodes {
            node.lapsed |= node.cut;
        }
        for node in 0..self.nodes.len() {
            if !self.owed(node)? && self.nodes[node].phase == Phase::Serving {
                self.heartbeat(node)?;
            }
        }
        self.tick();
        let alive: BTreeSet<NodeId> = self.sut.table().alive_nodes().collect();
        let applied = self.sut.tick(self.now_ms);
        self.journal(&applied, false);
        let still: BTreeSet<NodeId> = self.sut.table().alive_nodes().collect();
        for lost in alive.difference(&still) {
            self.coverage.borrow_mut().lost += 1;
            self.void_reads(lost.0 as usize)?;
        }
        Ok(())
    }

    /// Follows the job to its end with the surviving daemons and trainers: every retired trainer
    /// ends, every executor wanted is launched, and each daemon does what it owes, reads its tasks
    /// to their end, heartbeats and asks for more.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for node in &mut self.nodes {
            node.cut = false;
        }
        self.end_follow();
        let mut last_progress = None;
        let mut idle_rounds = 0;
        while idle_rounds < 50 {
            if self.sut.table().outcome().is_some() {
                return Ok(());
            }
            let counts = self.sut.table().task_counts();
            let progress = Some((
                self.ledger.len(),
                self.sut.rows_consumed_total(),
                self.sut.table().epoch(),
                (counts.pending, counts.in_flight, counts.done),
                self.sut.scaling(),
                self.trainers.len(),
            ));
            if progress == last_progress {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
                last_progress = progress;
            }
            self.tick();
            let retiring = self
                .sut
                .executors()
                .map_or(0, |executors| executors.retiring().count());
            for _ in 0..retiring {
                self.trainer_exits(|_| 0);
            }
            self.launch()?;
            for node in 0..self.nodes.len() {
                // What the loop owes (a registration, a give-back, acknowledgements) comes first,
                // then the loop reads, heartbeats and asks for more, as a daemon's does.
                for _ in 0..4 {
                    if !self.owed(node)? {
                        break;
                    }
                }
                if self.nodes[node].phase != Phase::Serving {
                    continue;
                }
                for index in 0..self.nodes[node].tasks.len() {
                    self.produce(node, index, u64::MAX / 4)?;
                    self.consume(node, index, u64::MAX / 4)?;
                }
                self.heartbeat(node)?;
                if !self.owed(node)? {
                    self.acquire(node)?;
                }
            }
        }
        Err(fail(format!(
            "stuck: the job does not finish; {} tasks pending, {} in flight, scaling: {}, nodes: {:?}, trainers: {:?}",
            self.sut.table().pending_count(),
            self.sut.table().in_flight_count(),
            self.sut.scaling(),
            self.nodes,
            self.trainers
        )))
    }
}

/// The most nodes a job has; an op's node is taken modulo the job's.
const MAX_NODES: usize = 3;

fn op_strategy() -> impl Strategy<Value = Op> {
    let node = 0..MAX_NODES;
    prop_oneof![
        6 => node.clone().prop_map(|node| Op::Acquire { node }),
        8 => (node.clone(), any::<u8>(), 1..12u64)
            .prop_map(|(node, pick, rows)| Op::Produce { node, pick, rows }),
        8 => (node.clone(), any::<u8>(), 1..12u64)
            .prop_map(|(node, pick, rows)| Op::Consume { node, pick, rows }),
        6 => node.clone().prop_map(|node| Op::Heartbeat { node }),
        1 => (node.clone(), any::<u8>()).prop_map(|(node, pick)| Op::ReportDone { node, pick }),
        1 => node.clone().prop_map(|node| Op::DaemonRestart { node }),
        3 => any::<u8>().prop_map(|pick| Op::TrainerExits { pick }),
        2 => Just(Op::Launch),
        1 => (1..5u32).prop_map(|num| Op::Scale { num }),
        2 => Just(Op::Checkpoint),
        1 => any::<u8>().prop_map(|pick| Op::Restore { pick }),
        2 => prop::collection::vec(0..20u64, 1..3).prop_map(|rows| Op::AddSplits { rows }),
        1 => Just(Op::EndFollow),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Commit),
        2 => (any::<u8>(), any::<bool>())
            .prop_map(|(lose, reregister)| Op::Takeover { lose, reregister }),
        2 => (node.clone(), any::<u8>(), any::<bool>()).prop_map(|(node, lose, reregister)| {
            Op::HeartbeatThenTakeover {
                node,
                lose,
                reregister,
            }
        }),
        1 => (node.clone(), any::<bool>()).prop_map(|(node, full)| Op::Cut { node, full }),
        1 => Just(Op::Lose),
        1 => node.prop_map(|node| Op::Reconnect { node }),
    ]
}

fn job_strategy() -> impl Strategy<Value = Job> {
    // No `prop_flat_map`, so that the ops shrink on their own.
    (
        prop::collection::vec(1..40u64, 1..4),
        1..12u64,
        1..3u32,
        any::<u64>(),
        0..4u64,
        1..4u64,
        1..=MAX_NODES as u32,
        1..5u32,
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(op_strategy(), 0..150),
    )
        .prop_map(
            |(
                split_rows,
                task_rows,
                epochs,
                seed,
                resplit_margin_rows,
                resplit_min_rows,
                nodes,
                trainers,
                follow,
                keeps_finished,
                ops,
            )| Job {
                split_rows,
                task_rows,
                // A followed source has no end at which a next epoch could begin.
                epochs: if follow { 1 } else { epochs },
                seed,
                resplit_margin_rows,
                resplit_min_rows,
                nodes,
                trainers,
                follow,
                keeps_finished,
                ops,
            },
        )
}

/// Runs one job to its end and checks the ledger.
fn run_job(job: Job, coverage: &RefCell<Coverage>) -> Result<(), TestCaseError> {
    let spec = JobSpec::parse(&spec_text(&job), Format::Yaml)
        .map_err(|error| fail(format!("the spec: {error}")))?;
    let splits = job
        .split_rows
        .iter()
        .enumerate()
        .map(|(index, rows)| planned_split(&format!("part-{index}"), *rows))
        .collect();
    let mut plan = JobPlan::default();
    plan.extend(0, splits);
    if job.follow {
        plan.versions.push(None);
    }
    let spec = Arc::new(spec);
    let plan = Arc::new(plan);
    let mut sut = Master::new(spec.clone(), plan.clone())
        .map_err(|error| fail(format!("the master: {error}")))?;
    sut.launch_executors();
    let mut sim = Sim {
        spec,
        plan,
        sut,
        now_ms: 0,
        nodes: vec![SimNode::new(); job.nodes as usize],
        trainers: BTreeMap::new(),
        restores: 0,
        relaunch_from: None,
        split_rows: job.split_rows.clone(),
        ledger: Ledger::new(),
        positions: Positions::new(),
        stored: Vec::new(),
        next_step: 1,
        journal: Vec::new(),
        durable: 0,
        generation: 0,
        keeps_finished: job.keeps_finished,
        snapshot: None,
        added_files: 0,
        coverage,
    };
    sim.launch()?;
    for op in job.ops {
        let was_scaling = sim.sut.scaling();
        sim.step(op)?;
        if was_scaling && !sim.sut.scaling() {
            coverage.borrow_mut().scales_done += 1;
        }
    }
    sim.drain()?;
    prop_assert_eq!(
        sim.sut.table().outcome(),
        Some(&JobOutcome::Succeeded),
        "the drained job succeeds"
    );
    coverage.borrow_mut().succeeded += 1;
    if job.follow && sim.split_rows.len() > job.split_rows.len() {
        coverage.borrow_mut().followed_grew_and_succeeded += 1;
    }
    let mut expected = BTreeMap::new();
    for epoch in 0..job.epochs {
        for (split, rows) in sim.split_rows.iter().enumerate() {
            for row in 0..*rows {
                expected.insert((epoch, split as u32, row), 1u32);
            }
        }
    }
    let got: BTreeMap<(u32, u32, u64), u32> = sim.ledger.into_iter().collect();
    if got != expected {
        let missing: Vec<_> = expected
            .keys()
            .filter(|row| !got.contains_key(row))
            .take(8)
            .collect();
        let extra: Vec<_> = got
            .iter()
            .filter(|(row, count)| expected.get(row) != Some(count))
            .take(8)
            .collect();
        return Err(fail(format!(
            "every row of every epoch exactly once: missing (epoch, split, row) {missing:?}, extra {extra:?}"
        )));
    }
    Ok(())
}

#[test]
fn every_row_of_every_epoch_is_consumed_exactly_once_through_the_masters_processes() {
    let coverage = RefCell::new(Coverage::default());
    // `PROPTEST_CASES` runs more cases, to look for rarer failures.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256);
    // A takeover that loses a heartbeat finishing a task is rare (about one run of 256 cases in
    // twelve has none): new cases run, up to three more times, until one has. Each run has a runner
    // of its own, since a runner counts the cases it passed across its runs.
    for _ in 0..4 {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            // A failing case shrinks for at most a minute.
            max_shrink_time: 60_000,
            ..Config::default()
        });
        let result = runner.run(&job_strategy(), |job| run_job(job, &coverage));
        if let Err(failure) = result {
            panic!("{failure}");
        }
        if coverage.borrow().lost_finishes > 0 {
            break;
        }
    }
    let coverage = coverage.into_inner();
    eprintln!("{coverage:?}");
    assert!(coverage.scales_done > 0, "no scale finished: {coverage:?}");
    assert!(
        coverage.takeovers_mid_scale > 0,
        "no takeover mid-scale: {coverage:?}"
    );
    assert!(coverage.resumed > 0, "no task given back: {coverage:?}");
    assert!(
        coverage.lost_entries > 0,
        "no takeover lost a heartbeat: {coverage:?}"
    );
    assert!(
        coverage.finished_early > 0 && coverage.lost_finishes > 0,
        "no takeover lost a heartbeat that finished a task: {coverage:?}"
    );
    assert!(
        coverage.restores > 0 && coverage.relaunch_restores > 0,
        "no restore relaunched the trainers: {coverage:?}"
    );
    assert!(
        coverage.takeovers_mid_restore > 0,
        "no takeover mid-restore: {coverage:?}"
    );
    assert!(
        coverage.succeeded > 100,
        "too few jobs succeeded: {coverage:?}"
    );
    assert!(
        coverage.followed_grew_and_succeeded > 20,
        "too few followed jobs grew and succeeded: {coverage:?}"
    );
    assert!(
        coverage.lost > 0 && coverage.void_reads > 0,
        "no node lost with reads the AM had not counted: {coverage:?}"
    );
    assert!(
        coverage.fenced_serving > 0 && coverage.fenced_registering > 0,
        "no daemon fenced while serving, or at its registration: {coverage:?}"
    );
    assert!(
        coverage.fence_records_deferred > 0,
        "no fence's record left to the daemon started again: {coverage:?}"
    );
    assert!(
        coverage.void_reads_rebound > 0,
        "no void record read while its task was bound to its ring again: {coverage:?}"
    );
}

/// Runs one case of the property test, as a regression test does.
fn run_case(job: Job) {
    let coverage = RefCell::new(Coverage::default());
    if let Err(failure) = run_job(job, &coverage) {
        panic!("{failure}");
    }
}

/// A regression case: one node, one epoch of one split of `rows` rows cut into one task, fed to
/// `trainers` trainers, through `ops`; the daemon keeps finished tasks until they are durable.
fn one_node_job(rows: u64, trainers: u32, ops: Vec<Op>) -> Job {
    Job {
        split_rows: vec![rows],
        task_rows: rows,
        epochs: 1,
        seed: 0,
        resplit_margin_rows: 0,
        resplit_min_rows: 1,
        nodes: 1,
        trainers,
        follow: false,
        keeps_finished: true,
        ops,
    }
}

/// Node 0 heartbeats, takes its tasks, and the trainer of its first task's ring reads one row of it.
fn first_row_read() -> Vec<Op> {
    use Op::*;
    vec![
        Heartbeat { node: 0 },
        Acquire { node: 0 },
        Produce {
            node: 0,
            pick: 0,
            rows: 1,
        },
        Consume {
            node: 0,
            pick: 0,
            rows: 1,
        },
    ]
}

/// A daemon that registered after a checkpoint's step is still alive after a restore to it: it
/// gives its rings back like the others, or the relaunched trainers would read the rows left in them.
#[test]
fn a_restore_to_a_checkpoint_committed_before_a_node_registered_keeps_the_node() {
    use Op::*;
    run_case(one_node_job(
        1,
        1,
        vec![
            Checkpoint,
            Heartbeat { node: 0 },
            Acquire { node: 0 },
            Restore { pick: 0 },
        ],
    ));
}

/// The final heartbeat of a give-back carries the only copy of the counts left once the daemon
/// removes its rings on its answer, though its answer carries no command: the master has it
/// answered only once durable, or a takeover that lost it would queue the task again from older
/// counts and deliver the rows consumed since twice.
#[test]
fn a_give_back_heartbeat_is_durable_before_its_answer() {
    use Op::*;
    let mut ops = first_row_read();
    ops.extend([
        Scale { num: 1 },
        TrainerExits { pick: 0 },
        TrainerExits { pick: 0 },
        // Answered with `Release`; the next call is the final heartbeat.
        Acquire { node: 0 },
        Acquire { node: 0 },
        Takeover {
            lose: 1,
            reregister: false,
        },
    ]);
    run_case(one_node_job(2, 2, ops));
}

/// One node feeding one trainer two one-row tasks; the first is read to its end and reported in a
/// heartbeat, then the AM is taken over, losing that heartbeat if it was answered before it was
/// durable.
fn finish_then_lose_it(keeps_finished: bool, reregister: bool) -> Job {
    use Op::*;
    let mut ops = first_row_read();
    ops.extend([
        HeartbeatThenTakeover {
            node: 0,
            lose: 1,
            reregister,
        },
        Acquire { node: 0 },
    ]);
    Job {
        split_rows: vec![2],
        task_rows: 1,
        keeps_finished,
        ..one_node_job(2, 1, ops)
    }
}

/// On the answer to a heartbeat that reports a task consumed to its end, a daemon that does not
/// keep finished tasks lets the task go, though the answer carries no command: the master has it
/// answered only once durable, or a takeover that lost it would leave the task in flight at its
/// earlier counts, and deliver its last rows twice once the daemon registers again without it.
#[test]
fn a_heartbeat_that_finishes_a_task_is_durable_before_its_answer() {
    for reregister in [true, false] {
        run_case(finish_then_lose_it(false, reregister));
    }
}

/// A daemon that keeps finished tasks has its finishing heartbeat answered at once; the takeover
/// loses it, and the daemon, still holding the task, tells the new AM, whether it registers again
/// or its next heartbeat does. The new AM's journal marks count from another generation: the
/// entries it makes durable at the acquisition after the takeover number as many as the old AM
/// had appended up to the lost heartbeat, and a daemon that took them as covering its report
/// would let the task go without any AM having recorded its end.
#[test]
fn a_daemon_keeps_a_finished_task_until_the_am_that_recorded_its_end_made_it_durable() {
    for reregister in [true, false] {
        run_case(finish_then_lose_it(true, reregister));
    }
}

/// A node cut off holds a row of a task in its ring; the AM declares it lost and queues the task
/// again, a new AM takes the job over, and the daemon, started again, is fenced at its
/// registration and handed the task back, on the ring that still holds the void copy of its row.
/// The trainer reads that copy after the binding: counted for the new binding, it would raise the
/// task's counts past the rows the new binding wrote, and the daemon would report a row consumed
/// that it never delivered.
#[test]
fn a_task_handed_back_to_a_ring_that_holds_void_copies_of_its_rows_counts_only_its_new_records() {
    use Op::*;
    run_case(Job {
        split_rows: vec![10],
        task_rows: 1,
        keeps_finished: false,
        nodes: 2,
        ..one_node_job(
            10,
            2,
            vec![
                Heartbeat { node: 0 },
                Acquire { node: 0 },
                Produce {
                    node: 0,
                    pick: 134,
                    rows: 1,
                },
                Acquire { node: 0 },
                Acquire { node: 0 },
                Cut {
                    node: 0,
                    full: false,
                },
                Acquire { node: 0 },
                Acquire { node: 0 },
                Lose,
                Produce {
                    node: 0,
                    pick: 0,
                    rows: 1,
                },
                Acquire { node: 0 },
                Takeover {
                    lose: 0,
                    reregister: true,
                },
                Acquire { node: 0 },
            ],
        )
    });
}
