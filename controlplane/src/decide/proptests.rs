//! Property tests: a simulated cluster of daemons and trainers drives the real [`decide`] through
//! random interleavings, and the rows the trainers consumed are checked against the data.
//!
//! # Implementation
//! Each simulated daemon holds the tasks the AM assigned to it, with an `enqueued` count (rows
//! written into its rings) and a `consumed` count (rows its trainers released, always a prefix).
//! Rows count as seen by the job only when the AM accepts a heartbeat or report carrying them;
//! rows consumed on a node that is then lost or fenced are lost with it, as they are for a node
//! whose daemon and trainers die together. The ledger is therefore the multiset of
//! `(epoch, split, row)` the job's trainers saw. At the end, the remaining work is drained by a fresh
//! node, and a successful job's ledger must hold every row of every epoch exactly once; any job's
//! ledger must hold no row twice. A job that follows its sources gets splits added at random points
//! (between any two events, across AM restarts and rollbacks), must not succeed while it follows,
//! and its ledger must then hold every row of the added splits exactly once too. A job that mixes
//! its sources by weight must hold every row of every epoch as often as the epoch drew it.

use super::*;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

/// The journal's encoding of `value`.
fn postcard_bytes<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, TestCaseError> {
    postcard::to_stdvec(value).map_err(|error| TestCaseError::fail(error.to_string()))
}

/// One step of the simulation. `pick` chooses among the node's tasks.
#[derive(Debug, Clone)]
enum Op {
    /// With `even_batches`, `dry` is what the node says of its rings.
    Acquire {
        node: usize,
        max_tasks: u32,
        dry: bool,
    },
    Produce {
        node: usize,
        pick: Index,
        rows: u64,
    },
    Consume {
        node: usize,
        pick: Index,
        rows: u64,
    },
    Heartbeat {
        node: usize,
    },
    AckStop {
        node: usize,
        pick: Index,
    },
    ReportDone {
        node: usize,
        pick: Index,
    },
    ReportFailed {
        node: usize,
        pick: Index,
    },
    /// Time passes, then the AM ticks.
    Advance {
        ms: u64,
    },
    /// The daemon restarts; its rings and trainers survive, so it keeps its tasks and counts but
    /// forgets pending stop requests, and registers again.
    DaemonRestart {
        node: usize,
    },
    /// The node dies with its trainers; it comes back holding nothing on its next step.
    NodeCrash {
        node: usize,
    },
    /// The AM restarts from a snapshot of its current table (as after replaying its journal).
    AmRestart,
    /// A data checkpoint is committed together with the trainers' state.
    Checkpoint,
    /// Trainers roll back to the last checkpoint; daemons start over.
    Rollback,
    /// A followed source grows by splits of these row counts.
    AddSplits {
        rows: Vec<u64>,
    },
    /// Following ends, as at `until_version` or `sluice stop`.
    EndFollow,
    /// Rows of a split are cut out of their pending tasks to the order's front
    /// (`data.even_batches: drop`).
    Carve {
        split: Index,
        start: u64,
        rows: u64,
    },
}

#[derive(Debug, Clone)]
struct Job {
    split_rows: Vec<u64>,
    /// The sources, when they are mixed by weight.
    mix: Option<Vec<MixedSource>>,
    config: DecideConfig,
    nodes: usize,
    ops: Vec<Op>,
}

#[derive(Debug, Clone)]
struct SimTask {
    assignment: Assignment,
    enqueued: u64,
    consumed: u64,
    /// The consumed count the AM has accepted.
    reported: u64,
    stop_request: Option<u64>,
}

impl SimTask {
    fn rows(&self) -> u64 {
        self.assignment.end - self.assignment.start
    }

    fn progress(&self) -> TaskProgress {
        TaskProgress {
            task: self.assignment.task,
            enqueued: self.enqueued,
            consumed: self.consumed,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct SimNode {
    registered: bool,
    tasks: Vec<SimTask>,
}

type Ledger = HashMap<(u32, u32, u64), u32>;

/// Counts of notable actions across all cases, to show the paths were exercised.
#[derive(Debug, Default)]
struct Coverage {
    splits: usize,
    lost: usize,
    blacklisted: usize,
    fenced: usize,
    requeued: usize,
    failed: usize,
    epochs: usize,
    kept_on_register: usize,
    resumed: usize,
    restarts: usize,
    rollbacks: usize,
    succeeded: usize,
    added_splits: usize,
    followed_succeeded: usize,
    mixed_succeeded: usize,
    carved: usize,
}

struct Sim<'a> {
    state: JobState,
    split_rows: Vec<u64>,
    mix: Option<Vec<MixedSource>>,
    config: DecideConfig,
    nodes: Vec<SimNode>,
    now_ms: u64,
    ledger: Ledger,
    checkpoint: Option<(DataPosition, Ledger)>,
    coverage: &'a RefCell<Coverage>,
}

fn node_id(index: usize) -> NodeId {
    NodeId(index as u64 + 1)
}

/// Whether the AM refused the whole event for the node's standing.
fn refused_outright(actions: &[Action]) -> bool {
    matches!(
        actions.first(),
        Some(
            Action::Fence { .. }
                | Action::Shutdown { .. }
                | Action::Refuse {
                    reason: Refusal::Blacklisted | Refusal::UnknownNode,
                    ..
                }
        )
    )
}

impl Sim<'_> {
    /// A request for work: with `even_batches`, saying whether the node has a dry ring.
    fn acquire(&self, node: usize, max_tasks: u32, dry: bool) -> Event {
        if self.config.even_batches {
            Event::AcquireEven {
                node: node_id(node),
                now_ms: self.now_ms,
                max_tasks,
                near: Vec::new(),
                dry,
            }
        } else {
            Event::Acquire {
                node: node_id(node),
                now_ms: self.now_ms,
                max_tasks,
            }
        }
    }

    /// Restores the table from `position`, mixed as the job is.
    fn restore(
        &self,
        position: DataPosition,
        mode: RestoreMode,
    ) -> Result<JobState, TestCaseError> {
        let split_rows = self.split_rows.clone();
        match &self.mix {
            Some(sources) => {
                JobState::restore_mixed(self.config, split_rows, sources, position, mode)
            }
            None => JobState::restore(self.config, split_rows, position, mode),
        }
        .map_err(|error| TestCaseError::fail(error.to_string()))
    }

    /// Sends one event to the real `decide`, checks the invariants, then credits the rows the AM
    /// accepted and delivers the commands to the simulated nodes.
    fn send(
        &mut self,
        event: Event,
        reporter: Option<(usize, Vec<TaskProgress>)>,
    ) -> Result<Vec<Action>, TestCaseError> {
        let actions = decide(&mut self.state, event.clone());
        self.state
            .check_invariants()
            .map_err(|broken| TestCaseError::fail(format!("after {event:?}: {broken}")))?;
        if self.state.following() && self.state.outcome() == Some(&JobOutcome::Succeeded) {
            return Err(TestCaseError::fail(format!(
                "the job succeeded while it still follows, after {event:?}"
            )));
        }
        if let Some((node, sent)) = reporter
            && !refused_outright(&actions)
        {
            let refused = actions.iter().any(
                |action| matches!(action, Action::Refuse { node: target, .. } if *target == node_id(node)),
            );
            if refused {
                return Err(TestCaseError::fail(format!(
                    "honest report refused: {event:?} -> {actions:?}"
                )));
            }
            for progress in sent {
                self.credit(node, progress);
            }
        }
        for action in &actions {
            self.deliver(action)?;
        }
        Ok(actions)
    }

    /// Moves the rows consumed since the last accepted count into the ledger.
    fn credit(&mut self, node: usize, progress: TaskProgress) {
        let Some(task) = self.nodes[node]
            .tasks
            .iter_mut()
            .find(|task| task.assignment.task == progress.task)
        else {
            return;
        };
        let assignment = task.assignment;
        for offset in task.reported..progress.consumed {
            *self
                .ledger
                .entry((
                    assignment.epoch,
                    assignment.split,
                    assignment.start + offset,
                ))
                .or_insert(0) += 1;
        }
        task.reported = task.reported.max(progress.consumed);
    }

    fn deliver(&mut self, action: &Action) -> Result<(), TestCaseError> {
        let mut coverage = self.coverage.borrow_mut();
        match action {
            Action::Assign { node, tasks } => {
                let index = (node.0 - 1) as usize;
                if let Some(sim_node) = self.nodes.get_mut(index) {
                    sim_node
                        .tasks
                        .extend(tasks.iter().map(|assignment| SimTask {
                            assignment: *assignment,
                            enqueued: 0,
                            consumed: 0,
                            reported: 0,
                            stop_request: None,
                        }));
                }
            }
            Action::Resume { node, tasks } => {
                // A resumed task is one the node holds, as the node last knew it.
                let index = (node.0 - 1) as usize;
                let held = self
                    .nodes
                    .get(index)
                    .map(|sim_node| &sim_node.tasks[..])
                    .unwrap_or_default();
                for assignment in tasks {
                    if !held.iter().any(|task| task.assignment == *assignment) {
                        return Err(TestCaseError::fail(format!(
                            "resumed {assignment:?}, which {node} does not hold as such: {held:?}"
                        )));
                    }
                }
                coverage.resumed += tasks.len();
            }
            Action::StopAt { node, task, row } => {
                let index = (node.0 - 1) as usize;
                if let Some(held) = self.nodes.get_mut(index).and_then(|sim_node| {
                    sim_node
                        .tasks
                        .iter_mut()
                        .find(|held| held.assignment.task == *task)
                }) {
                    held.stop_request = Some(*row);
                }
            }
            Action::Fence { node }
            | Action::Refuse {
                node,
                reason: Refusal::Blacklisted | Refusal::UnknownNode,
            } => {
                coverage.fenced += 1;
                if let Some(sim_node) = self.nodes.get_mut((node.0 - 1) as usize) {
                    *sim_node = SimNode::default();
                }
            }
            Action::Refuse { .. } => {
                return Err(TestCaseError::fail(format!(
                    "unexpected refusal {action:?}"
                )));
            }
            Action::TaskSplit { .. } => coverage.splits += 1,
            Action::NodeLost { .. } => coverage.lost += 1,
            Action::NodeBlacklisted { .. } => coverage.blacklisted += 1,
            Action::TaskRequeued { .. } => coverage.requeued += 1,
            Action::TaskFailed { .. } => coverage.failed += 1,
            Action::EpochStarted { .. } => coverage.epochs += 1,
            Action::TasksAdded { splits, .. } => coverage.added_splits += *splits as usize,
            Action::Registered { kept, .. } => coverage.kept_on_register += *kept as usize,
            Action::Shutdown { .. } | Action::TaskDone { .. } | Action::JobFinished { .. } => {}
        }
        Ok(())
    }

    /// Registers a node that is not registered, holding whatever it still has.
    fn ensure_registered(&mut self, node: usize) -> Result<bool, TestCaseError> {
        if self.nodes[node].registered {
            return Ok(true);
        }
        self.register(node)?;
        Ok(self.nodes[node].registered)
    }

    fn register(&mut self, node: usize) -> Result<(), TestCaseError> {
        let held: Vec<TaskProgress> = self.nodes[node]
            .tasks
            .iter()
            .map(SimTask::progress)
            .collect();
        let actions = self.send(
            Event::Register {
                node: node_id(node),
                now_ms: self.now_ms,
                held: held.clone(),
            },
            Some((node, held)),
        )?;
        if actions
            .iter()
            .any(|action| matches!(action, Action::Registered { node: target, .. } if *target == node_id(node)))
        {
            self.nodes[node].registered = true;
            self.forget_finished(node);
        }
        Ok(())
    }

    /// Drops the tasks the AM now counts as finished on this node.
    fn forget_finished(&mut self, node: usize) {
        self.nodes[node]
            .tasks
            .retain(|task| task.reported < task.rows());
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Acquire {
                node,
                max_tasks,
                dry,
            } => {
                if self.ensure_registered(node)? {
                    let event = self.acquire(node, max_tasks, dry);
                    self.send(event, None)?;
                }
            }
            Op::Produce { node, pick, rows } => {
                if let Some(task) = pick_task(&mut self.nodes[node], pick) {
                    task.enqueued = (task.enqueued + rows).min(task.rows());
                }
            }
            Op::Consume { node, pick, rows } => {
                if let Some(task) = pick_task(&mut self.nodes[node], pick) {
                    task.consumed = (task.consumed + rows).min(task.enqueued);
                }
            }
            Op::Heartbeat { node } => {
                if self.ensure_registered(node)? {
                    let sent: Vec<TaskProgress> = self.nodes[node]
                        .tasks
                        .iter()
                        .map(SimTask::progress)
                        .collect();
                    self.send(
                        Event::Heartbeat {
                            node: node_id(node),
                            now_ms: self.now_ms,
                            progress: sent.clone(),
                        },
                        Some((node, sent)),
                    )?;
                    self.forget_finished(node);
                }
            }
            Op::AckStop { node, pick } => {
                if !self.ensure_registered(node)? {
                    return Ok(());
                }
                let Some(task) = pick_task(&mut self.nodes[node], pick) else {
                    return Ok(());
                };
                let Some(requested) = task.stop_request else {
                    return Ok(());
                };
                let assignment = task.assignment;
                let stop_row = requested
                    .max(assignment.start + task.enqueued)
                    .min(assignment.end);
                let task_id = assignment.task;
                let actions = self.send(
                    Event::StopAck {
                        node: node_id(node),
                        now_ms: self.now_ms,
                        task: task_id,
                        stop_row,
                    },
                    Some((node, Vec::new())),
                )?;
                if !refused_outright(&actions)
                    && let Some(task) = self.nodes[node]
                        .tasks
                        .iter_mut()
                        .find(|task| task.assignment.task == task_id)
                {
                    task.assignment.end = stop_row;
                    task.stop_request = None;
                }
                // Cutting at the rows already consumed finishes the task.
                self.forget_finished(node);
            }
            Op::ReportDone { node, pick } => {
                if !self.ensure_registered(node)? {
                    return Ok(());
                }
                let Some(task) = pick_task(&mut self.nodes[node], pick) else {
                    return Ok(());
                };
                if task.consumed < task.rows() {
                    return Ok(());
                }
                let sent = task.progress();
                self.send(
                    Event::Report {
                        node: node_id(node),
                        now_ms: self.now_ms,
                        task: sent.task,
                        consumed: sent.consumed,
                        outcome: ReportOutcome::Done,
                    },
                    Some((node, vec![sent])),
                )?;
                self.forget_finished(node);
            }
            Op::ReportFailed { node, pick } => {
                if !self.ensure_registered(node)? {
                    return Ok(());
                }
                let Some(task) = pick_task(&mut self.nodes[node], pick) else {
                    return Ok(());
                };
                // A daemon reports failure once its rings hold no more rows of the task.
                task.enqueued = task.consumed;
                let sent = task.progress();
                let actions = self.send(
                    Event::Report {
                        node: node_id(node),
                        now_ms: self.now_ms,
                        task: sent.task,
                        consumed: sent.consumed,
                        outcome: ReportOutcome::Failed {
                            reason: "simulated read error".to_owned(),
                        },
                    },
                    Some((node, vec![sent])),
                )?;
                if !refused_outright(&actions) {
                    self.nodes[node]
                        .tasks
                        .retain(|task| task.assignment.task != sent.task);
                }
            }
            Op::Advance { ms } => {
                self.now_ms += ms;
                self.send(
                    Event::Tick {
                        now_ms: self.now_ms,
                    },
                    None,
                )?;
            }
            Op::DaemonRestart { node } => {
                if self.nodes[node].registered {
                    for task in &mut self.nodes[node].tasks {
                        task.stop_request = None;
                    }
                    self.register(node)?;
                }
            }
            Op::NodeCrash { node } => {
                self.nodes[node] = SimNode::default();
            }
            Op::AmRestart => {
                let position = self.state.position();
                // The journal's snapshot encodes a capture of the table, which must be the
                // position's bytes exactly.
                prop_assert_eq!(
                    postcard_bytes(&self.state.capture())?,
                    postcard_bytes(&position)?,
                    "a captured table encodes as its position"
                );
                let json = serde_json::to_string(&position)
                    .map_err(|error| TestCaseError::fail(error.to_string()))?;
                let decoded: DataPosition = serde_json::from_str(&json)
                    .map_err(|error| TestCaseError::fail(error.to_string()))?;
                self.state = self.restore(
                    decoded,
                    RestoreMode::Resume {
                        now_ms: self.now_ms,
                    },
                )?;
                prop_assert_eq!(self.state.position(), position);
                self.coverage.borrow_mut().restarts += 1;
            }
            Op::Checkpoint => {
                self.checkpoint = Some((self.state.position(), self.ledger.clone()));
            }
            Op::AddSplits { rows } => {
                if self.state.following() && self.state.outcome().is_none() {
                    self.split_rows.extend_from_slice(&rows);
                    self.send(Event::SplitsAdded { split_rows: rows }, None)?;
                }
            }
            Op::EndFollow => {
                self.send(Event::FollowEnded, None)?;
            }
            Op::Carve { split, start, rows } => {
                let split = split.index(self.split_rows.len()) as u32;
                let tasks = self.state.slots.len();
                let rows = vec![TaskSpan {
                    split,
                    start,
                    end: start + rows,
                }];
                self.send(Event::CarveFront { rows }, None)?;
                self.coverage.borrow_mut().carved += self.state.slots.len() - tasks;
            }
            Op::Rollback => {
                if let Some((position, ledger)) = self.checkpoint.clone() {
                    // Following is the sources' state, not the trainers': the AM keeps it.
                    let following = self.state.following();
                    self.state = self.restore(
                        position,
                        RestoreMode::Requeue {
                            now_ms: self.now_ms,
                        },
                    )?;
                    self.state.following = following;
                    self.ledger = ledger;
                    for sim_node in &mut self.nodes {
                        *sim_node = SimNode::default();
                    }
                    self.coverage.borrow_mut().rollbacks += 1;
                }
            }
        }
        Ok(())
    }

    /// Lets every simulated node go silent until lost, then a fresh node consumes what is left.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        self.now_ms += self.config.heartbeat_timeout_ms + 1;
        self.send(
            Event::Tick {
                now_ms: self.now_ms,
            },
            None,
        )?;
        for sim_node in &mut self.nodes {
            *sim_node = SimNode::default();
        }
        let drainer = self.nodes.len();
        self.nodes.push(SimNode::default());
        self.register(drainer)?;
        if self.state.following() {
            self.send(Event::FollowEnded, None)?;
        }
        for _ in 0..100_000 {
            if self.state.outcome().is_some() {
                return Ok(());
            }
            let event = self.acquire(drainer, 8, true);
            self.send(event, None)?;
            if self.nodes[drainer].tasks.is_empty() {
                return Err(TestCaseError::fail(format!(
                    "stuck: no task for an idle node, {} pending, {} in flight",
                    self.state.pending_count(),
                    self.state.in_flight_count()
                )));
            }
            for task in &mut self.nodes[drainer].tasks {
                task.enqueued = task.rows();
                task.consumed = task.rows();
            }
            let sent: Vec<TaskProgress> = self.nodes[drainer]
                .tasks
                .iter()
                .map(SimTask::progress)
                .collect();
            self.send(
                Event::Heartbeat {
                    node: node_id(drainer),
                    now_ms: self.now_ms,
                    progress: sent.clone(),
                },
                Some((drainer, sent)),
            )?;
            self.forget_finished(drainer);
        }
        Err(TestCaseError::fail("the drain did not finish the job"))
    }
}

fn pick_task(node: &mut SimNode, pick: Index) -> Option<&mut SimTask> {
    if node.tasks.is_empty() {
        return None;
    }
    let index = pick.index(node.tasks.len());
    node.tasks.get_mut(index)
}

fn op_strategy(nodes: usize) -> impl Strategy<Value = Op> {
    let node = 0..nodes;
    prop_oneof![
        8 => (node.clone(), 1..4u32, any::<bool>())
            .prop_map(|(node, max_tasks, dry)| Op::Acquire { node, max_tasks, dry }),
        6 => (node.clone(), any::<Index>(), 1..12u64)
            .prop_map(|(node, pick, rows)| Op::Produce { node, pick, rows }),
        6 => (node.clone(), any::<Index>(), 1..12u64)
            .prop_map(|(node, pick, rows)| Op::Consume { node, pick, rows }),
        4 => node.clone().prop_map(|node| Op::Heartbeat { node }),
        5 => (node.clone(), any::<Index>()).prop_map(|(node, pick)| Op::AckStop { node, pick }),
        2 => (node.clone(), any::<Index>()).prop_map(|(node, pick)| Op::ReportDone { node, pick }),
        1 => (node.clone(), any::<Index>()).prop_map(|(node, pick)| Op::ReportFailed { node, pick }),
        2 => (0..600u64).prop_map(|ms| Op::Advance { ms }),
        1 => node.clone().prop_map(|node| Op::DaemonRestart { node }),
        1 => node.prop_map(|node| Op::NodeCrash { node }),
        1 => Just(Op::AmRestart),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Rollback),
        2 => prop::collection::vec(0..30u64, 1..3).prop_map(|rows| Op::AddSplits { rows }),
        1 => (any::<Index>(), 0..30u64, 1..12u64)
            .prop_map(|(split, start, rows)| Op::Carve { split, start, rows }),
    ]
}

fn job_strategy() -> impl Strategy<Value = Job> {
    (
        prop::collection::vec(0..40u64, 1..5),
        1..12u64,
        1..4u32,
        any::<u64>(),
        prop_oneof![3 => Just(1000u32), 1 => 1..4u32],
        2..5u32,
        0..4u64,
        1..4u64,
        2..5usize,
        any::<bool>(),
        any::<bool>(),
        prop::option::weighted(0.3, prop::collection::vec((1..5u32, any::<bool>()), 1..4)),
    )
        .prop_flat_map(
            |(
                mut split_rows,
                task_rows,
                epochs,
                seed,
                max_task_attempts,
                blacklist_after_failures,
                resplit_margin_rows,
                resplit_min_rows,
                nodes,
                follow,
                even_batches,
                mix,
            )| {
                // A followed job may start with no rows at all; the others need one.
                if !follow {
                    split_rows[0] += 1;
                }
                let mix = mix
                    .filter(|_| !follow)
                    .map(|weights| mixed_sources(&mut split_rows, &weights));
                let config = DecideConfig {
                    seed,
                    epochs: if follow { 1 } else { epochs },
                    task_rows,
                    max_task_attempts,
                    blacklist_after_failures,
                    max_total_failures: u32::MAX,
                    heartbeat_timeout_ms: 1000,
                    task_success_percent: 100.0,
                    task_failed_percent: 100.0,
                    resplit_margin_rows,
                    resplit_min_rows,
                    follow,
                    even_batches,
                };
                let ops = prop::collection::vec(op_strategy(nodes), 0..200);
                let end_follow_at = prop::option::of(0..200usize);
                (ops, end_follow_at).prop_map(move |(mut ops, end_follow_at)| {
                    if let Some(at) = end_follow_at {
                        ops.insert(at.min(ops.len()), Op::EndFollow);
                    }
                    Job {
                        split_rows: split_rows.clone(),
                        mix: mix.clone(),
                        config,
                        nodes,
                        ops,
                    }
                })
            },
        )
}

/// Deals the splits out to one source per weight, in turn, each source at least one row (a split
/// is given a row if a source would have none), and makes the last source end the epoch if none
/// does.
fn mixed_sources(split_rows: &mut [u64], weights: &[(u32, bool)]) -> Vec<MixedSource> {
    let mut sources: Vec<MixedSource> = weights
        .iter()
        .map(|&(weight, ends_epoch)| MixedSource {
            splits: Vec::new(),
            weight: f64::from(weight),
            ends_epoch,
        })
        .collect();
    let count = sources.len().min(split_rows.len());
    sources.truncate(count);
    for split in 0..split_rows.len() {
        sources[split % count].splits.push(split as u32);
    }
    for source in &sources {
        let first = source.splits[0] as usize;
        if source
            .splits
            .iter()
            .all(|split| split_rows[*split as usize] == 0)
        {
            split_rows[first] += 1;
        }
    }
    if !sources.iter().any(|source| source.ends_epoch) {
        sources[count - 1].ends_epoch = true;
    }
    sources
}

/// How many times each row of each epoch is to be consumed: once per epoch, or as often as each
/// epoch of a mix drew it.
fn expected_rows(job: &Job, split_rows: &[u64]) -> BTreeMap<(u32, u32, u64), u32> {
    let mut expected = BTreeMap::new();
    let Some(sources) = &job.mix else {
        for epoch in 0..job.config.epochs {
            for (split, rows) in split_rows.iter().enumerate() {
                for row in 0..*rows {
                    expected.insert((epoch, split as u32, row), 1u32);
                }
            }
        }
        return expected;
    };
    let mixer = mix::Mixer::new(sources, split_rows, job.config.task_rows, job.config.seed)
        .expect("the job's mix plans");
    let mut cursor = mixer.start();
    for epoch in 0..job.config.epochs {
        let (drawn, next) = mixer.draw_epoch(&cursor).expect("the epoch draws");
        for task in drawn {
            for row in task.start..task.end {
                *expected.entry((epoch, task.split, row)).or_insert(0) += 1;
            }
        }
        cursor = next;
    }
    expected
}

/// Runs one job to its end and checks the ledger.
fn run_job(mut job: Job, coverage: &RefCell<Coverage>) -> Result<(), TestCaseError> {
    let state = match &job.mix {
        Some(sources) => JobState::mixed(job.config, job.split_rows.clone(), sources),
        None => JobState::new(job.config, job.split_rows.clone()),
    }
    .map_err(|error| TestCaseError::fail(error.to_string()))?;
    let mut sim = Sim {
        state,
        split_rows: job.split_rows.clone(),
        mix: job.mix.clone(),
        config: job.config,
        nodes: vec![SimNode::default(); job.nodes],
        now_ms: 0,
        ledger: Ledger::new(),
        checkpoint: None,
        coverage,
    };
    for op in std::mem::take(&mut job.ops) {
        sim.step(op)?;
    }
    sim.drain()?;
    let expected = expected_rows(&job, &sim.split_rows);
    if let Some(((epoch, split, row), count)) = sim.ledger.iter().find(|(key, count)| {
        **count
            > expected
                .get(key)
                .copied()
                .unwrap_or(if job.mix.is_some() { 0 } else { 1 })
    }) {
        return Err(TestCaseError::fail(format!(
            "row {row} of split {split} in epoch {epoch} was consumed {count} times"
        )));
    }
    if sim.state.outcome() == Some(&JobOutcome::Succeeded) {
        coverage.borrow_mut().succeeded += 1;
        if job.config.follow && sim.split_rows.len() > job.split_rows.len() {
            coverage.borrow_mut().followed_succeeded += 1;
        }
        if job.mix.is_some() {
            coverage.borrow_mut().mixed_succeeded += 1;
        }
        let got: BTreeMap<(u32, u32, u64), u32> = sim.ledger.into_iter().collect();
        prop_assert_eq!(got, expected, "every row of every epoch exactly once");
    } else {
        // Only a task that failed for good may fail the job here.
        prop_assert!(
            job.config.max_task_attempts < 1000,
            "{:?}",
            sim.state.outcome()
        );
    }
    Ok(())
}

#[test]
fn every_row_of_every_epoch_is_consumed_exactly_once() {
    let coverage = RefCell::new(Coverage::default());
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&job_strategy(), |job| run_job(job, &coverage));
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let coverage = coverage.into_inner();
    // The random runs must have gone through every path they are meant to check.
    assert!(coverage.splits > 0, "no re-split happened: {coverage:?}");
    assert!(coverage.lost > 0, "no node was lost: {coverage:?}");
    assert!(
        coverage.blacklisted > 0,
        "no node was blacklisted: {coverage:?}"
    );
    assert!(coverage.fenced > 0, "no node was fenced: {coverage:?}");
    assert!(coverage.requeued > 0, "no task was requeued: {coverage:?}");
    assert!(coverage.failed > 0, "no task failed for good: {coverage:?}");
    assert!(coverage.epochs > 0, "no second epoch: {coverage:?}");
    assert!(
        coverage.kept_on_register > 0,
        "no task kept across a restart: {coverage:?}"
    );
    assert!(
        coverage.resumed > 0,
        "no kept task was resumed: {coverage:?}"
    );
    assert!(
        coverage.restarts > 0 && coverage.rollbacks > 0,
        "{coverage:?}"
    );
    assert!(
        coverage.added_splits > 0 && coverage.followed_succeeded > 50,
        "too few followed jobs grew and succeeded: {coverage:?}"
    );
    assert!(
        coverage.mixed_succeeded > 30,
        "too few mixed jobs succeeded: {coverage:?}"
    );
    assert!(coverage.carved > 0, "no task was carved: {coverage:?}");
    assert!(
        coverage.succeeded > 100,
        "too few jobs succeeded: {coverage:?}"
    );
}
