use super::*;
use crate::decide::{ReportOutcome, TaskStatus};
use crate::spec::{Format, SourceSpec};
use crate::wire;
use calls::{RankCommit, RestoreEffect};
use sluice_formats::{ObjectIdentity, Split};
use v1::command::Command as Cmd;

/// Two nodes, four trainers, tasks of 10 rows over splits of 25 and 15 rows.
const SPEC: &str = r#"
name: unit
data:
  sources: [{ uri: "file:///data/train", format: parquet }]
  task_rows: 10
  batch_size: 2
  shuffle: { seed: 3 }
nodes: 2
roles:
  - { name: worker, num: 4, command: [sluice, consume] }
failover: { heartbeat_interval_ms: 100, heartbeat_timeout_ms: 1000 }
"#;

fn master() -> Master {
    master_of(SPEC)
}

/// A master of the job `spec` over the splits of [`master`].
fn master_of(spec: &str) -> Master {
    let spec = Arc::new(JobSpec::parse(spec, Format::Yaml).expect("valid spec"));
    let mut plan = JobPlan::default();
    let splits = [25u64, 15]
        .iter()
        .enumerate()
        .map(|(index, rows)| Split {
            task_id: index as u64,
            uri: format!("file:///data/train/part-{index}.parquet"),
            file_size: 1000,
            first_row: 0,
            row_count: *rows,
            partition_values: Vec::new(),
            delta: None,
            bytes: None,
            identity: None,
        })
        .collect();
    plan.extend(0, splits);
    Master::new(spec, Arc::new(plan)).expect("the splits have rows")
}

/// Registers `request` as the service does, answering on the wire.
fn register_request(
    sut: &mut Master,
    request: v1::RegisterRequest,
    now_ms: u64,
) -> Result<Applied<v1::RegisterReply>> {
    let applied = sut.register(wire::registration(request), now_ms)?;
    Ok(applied.map(|registered| wire::register_reply(sut.spec(), sut.plan(), registered)))
}

fn register(sut: &mut Master, node: u64, now_ms: u64) -> Applied<v1::RegisterReply> {
    register_request(
        sut,
        v1::RegisterRequest {
            node_id: node,
            job_id: "unit".into(),
            hostname: format!("host-{node}"),
            held: Vec::new(),
            node_by_host: false,
        },
        now_ms,
    )
    .expect("registration accepted")
}

/// The master's commands as the service sends them.
fn on_the_wire(sut: &Master, applied: Applied<Vec<NodeCommand>>) -> Applied<Vec<v1::Command>> {
    applied.map(|commands| wire::commands(sut.plan(), sut.added_sources(), commands))
}

/// `node` asks for up to `max_tasks` tasks, as the master applied it.
fn acquire_applied(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    max_tasks: u32,
) -> Applied<Vec<v1::Command>> {
    let applied = sut.acquire(NodeId(node), max_tasks, true, now_ms);
    on_the_wire(sut, applied)
}

fn acquire(sut: &mut Master, node: u64, now_ms: u64, max_tasks: u32) -> Vec<v1::Command> {
    acquire_applied(sut, node, now_ms, max_tasks).reply
}

/// A heartbeat of `node` reporting `(task, enqueued, consumed)` counts, as the master applied it.
fn heartbeat_applied(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    progress: &[(u64, u64, u64)],
) -> Applied<Vec<v1::Command>> {
    let applied = sut.heartbeat(
        wire::heartbeat(v1::HeartbeatRequest {
            node_id: node,
            progress: progress
                .iter()
                .map(|(task_id, enqueued, consumed)| v1::TaskProgress {
                    task_id: *task_id,
                    enqueued: *enqueued,
                    consumed: *consumed,
                    bad: Vec::new(),
                    sent: 0,
                    dropped: Vec::new(),
                })
                .collect(),
            ..v1::HeartbeatRequest::default()
        }),
        now_ms,
    );
    on_the_wire(sut, applied)
}

fn heartbeat(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    progress: &[(u64, u64, u64)],
) -> Vec<v1::Command> {
    heartbeat_applied(sut, node, now_ms, progress).reply
}

fn assigned(commands: &[v1::Command]) -> Vec<v1::TaskAssignment> {
    commands
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Assign(assign)) => Some(assign.tasks.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn has_shutdown(commands: &[v1::Command]) -> bool {
    commands
        .iter()
        .any(|command| matches!(command.command, Some(Cmd::Shutdown(_))))
}

#[test]
fn register_hands_out_the_job_data_and_the_node_ranks() {
    let mut sut = master();
    let applied = register(&mut sut, 1, 0);
    assert_eq!(applied.reply.job_id, "unit");
    assert_eq!(applied.reply.ranks, vec![2, 3]);
    assert_eq!(applied.reply.world_size, 4);
    let data = applied.reply.data.expect("job data");
    assert_eq!(data.sources[0].uri, "file:///data/train");
    assert_eq!(data.sources[0].format, "parquet");
    assert_eq!(data.batch_size, 2);
    assert_eq!(applied.entries.len(), 1, "a registration is journaled");
    assert_eq!(sut.ranks_of(NodeId(0)), vec![0, 1]);
}

#[test]
fn register_refuses_a_node_outside_the_job_and_a_daemon_of_another_job() {
    let mut sut = master();
    let outside = register_request(
        &mut sut,
        v1::RegisterRequest {
            node_id: 2,
            job_id: "unit".into(),
            ..v1::RegisterRequest::default()
        },
        0,
    )
    .expect_err("node 2 of a 2-node job");
    assert!(outside.to_string().contains("numbered 0 to 1"), "{outside}");
    let foreign = register_request(
        &mut sut,
        v1::RegisterRequest {
            node_id: 0,
            job_id: "other".into(),
            ..v1::RegisterRequest::default()
        },
        0,
    )
    .expect_err("another job's daemon");
    assert!(foreign.to_string().contains("\"other\""), "{foreign}");
}

#[test]
fn a_job_runs_to_success_and_every_daemon_is_shut_down() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    assert_eq!(sut.phase(), JobPhase::Running);
    let mut delivered = Vec::new();
    let mut now = 1;
    for node in [0, 1].iter().cycle() {
        now += 1;
        let tasks = assigned(&acquire(&mut sut, *node, now, 1));
        if tasks.is_empty() && sut.table().outcome().is_some() {
            break;
        }
        for task in tasks {
            let split = task.split.as_ref().expect("split attached");
            assert_eq!(split.row_count, if task.split_index == 0 { 25 } else { 15 });
            delivered.push((task.split_index, task.start, task.end));
            let rows = task.end - task.start;
            heartbeat(&mut sut, *node, now, &[(task.task_id, rows, rows)]);
        }
        assert!(now < 100, "the job did not finish");
    }
    delivered.sort_unstable();
    assert_eq!(
        delivered,
        vec![
            (0, 0, 10),
            (0, 10, 20),
            (0, 20, 25),
            (1, 0, 10),
            (1, 10, 15)
        ]
    );
    assert_eq!(sut.phase(), JobPhase::Succeeded);
    assert!(!sut.finished(), "daemons were not told yet");
    assert!(has_shutdown(&heartbeat(&mut sut, 0, now, &[])));
    assert!(has_shutdown(&heartbeat(&mut sut, 1, now, &[])));
    assert!(sut.finished());
}

/// A heartbeat of `node` with `(task, enqueued, consumed, sent)` counts and, per ring, its batch
/// counts by epoch; returns what `settled_for` then tells the node: the current epoch and the
/// settled epochs.
fn even_heartbeat(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    progress: &[(u64, u64, u64, u64)],
    rings: &[&[(u32, u64)]],
) -> (u32, Vec<(u32, u64)>) {
    let progress: Vec<DropProgress> = progress
        .iter()
        .map(|&(task, enqueued, consumed, sent)| (task, enqueued, consumed, sent, &[][..]))
        .collect();
    drop_heartbeat(sut, node, now_ms, &progress, rings);
    let (current, settled, _) = told(sut, node);
    (current, settled)
}

#[test]
fn an_epoch_settles_at_the_most_batches_of_a_ring_once_every_row_is_handed_to_a_ring() {
    let mut sut = master_of(&SPEC.replace(
        "  shuffle: { seed: 3 }\n",
        "  shuffle: { seed: 3 }\n  epochs: 2\n  fixed_batch_size: true\n  even_batches: pad\n",
    ));
    assert_eq!(
        master().settled_for(NodeId(0)),
        None,
        "a job without even_batches"
    );
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let first = assigned(&acquire(&mut sut, 0, 1, 3));
    let second = assigned(&acquire(&mut sut, 1, 1, 3));
    assert_eq!(
        (first.len(), second.len()),
        (3, 2),
        "every task of the epoch is out"
    );
    let rows = |task: &v1::TaskAssignment| task.end - task.start;
    let all = |tasks: &[v1::TaskAssignment]| -> Vec<(u64, u64, u64, u64)> {
        tasks
            .iter()
            .map(|task| (task.task_id, 0, 0, rows(task)))
            .collect()
    };
    // Node 0 handed everything, node 1 not yet its last row: nothing is settled.
    let (current, settled) = even_heartbeat(&mut sut, 0, 2, &all(&first), &[&[(0, 7)], &[(0, 3)]]);
    assert_eq!((current, settled), (0, vec![]));
    let mut partly = all(&second);
    partly[1].3 -= 1;
    let (_, settled) = even_heartbeat(&mut sut, 1, 2, &partly, &[&[(0, 2)], &[(0, 6)]]);
    assert_eq!(
        settled,
        vec![],
        "a row not handed yet may make another batch"
    );
    // Once node 1 handed its last row too, the epoch settles at the most any ring has: 7.
    let (_, settled) = even_heartbeat(&mut sut, 1, 3, &all(&second), &[&[(0, 2)], &[(0, 6)]]);
    assert_eq!(settled, vec![(0, 7)]);
    assert_eq!(
        on_the_wire(
            &sut,
            Applied {
                reply: sut.settled_for(NodeId(1)).into_iter().collect(),
                entries: Vec::new(),
            }
        )
        .reply[0]
            .command,
        Some(Cmd::Settled(v1::SettledBatches {
            epochs: vec![v1::EpochBatches {
                epoch: 0,
                batches: 7
            }],
            current_epoch: 0,
            allowed: Vec::new(),
        }))
    );
    // Every row consumed: epoch 1 begins; epoch 0 stays settled for the rings still padding it,
    // and a count reported later for it (a ring that padded) never lowers it.
    let done = |tasks: &[v1::TaskAssignment]| -> Vec<(u64, u64, u64, u64)> {
        tasks
            .iter()
            .map(|task| (task.task_id, rows(task), rows(task), rows(task)))
            .collect()
    };
    even_heartbeat(&mut sut, 0, 4, &done(&first), &[&[(0, 7)], &[(0, 7)]]);
    let (current, settled) =
        even_heartbeat(&mut sut, 1, 4, &done(&second), &[&[(0, 7)], &[(0, 6)]]);
    assert_eq!(sut.table().epoch(), 1);
    assert_eq!((current, settled), (1, vec![(0, 7)]));
    // A ring in epoch 1 that counted nothing there yet: the node is told from epoch 0 on.
    let (_, settled) = even_heartbeat(&mut sut, 0, 5, &[], &[&[(0, 7), (1, 0)], &[(0, 7)]]);
    assert_eq!(settled, vec![(0, 7)]);
}

/// A task's counts in the heartbeat of a job with even batches: `(task, enqueued, consumed, sent,
/// dropped spans as (first row, rows))`.
type DropProgress<'a> = (u64, u64, u64, u64, &'a [(u64, u64)]);

/// Batch counts by epoch: `(epoch, batches)`.
type Counts = Vec<(u32, u64)>;

/// A heartbeat of `node` in a job with even batches: its tasks' counts and its rings' batch counts
/// by epoch, as the master applied it.
fn drop_heartbeat(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    progress: &[DropProgress],
    rings: &[&[(u32, u64)]],
) -> Applied<Vec<NodeCommand>> {
    sut.heartbeat(
        wire::heartbeat(v1::HeartbeatRequest {
            node_id: node,
            progress: progress
                .iter()
                .map(
                    |&(task_id, enqueued, consumed, sent, dropped)| v1::TaskProgress {
                        task_id,
                        enqueued,
                        consumed,
                        bad: Vec::new(),
                        sent,
                        dropped: dropped
                            .iter()
                            .map(|&(first_row, row_count)| v1::RowSpan {
                                first_row,
                                row_count,
                            })
                            .collect(),
                    },
                )
                .collect(),
            rings: rings
                .iter()
                .enumerate()
                .map(|(rank, counts)| v1::RingStats {
                    rank: rank as u32,
                    epoch_batches: counts
                        .iter()
                        .map(|&(epoch, batches)| v1::EpochBatches { epoch, batches })
                        .collect(),
                    ..v1::RingStats::default()
                })
                .collect(),
            ..v1::HeartbeatRequest::default()
        }),
        now_ms,
    )
}

/// What `settled_for` tells `node` of a job with even batches: the current epoch, the settled
/// counts and the allowed batches.
fn told(sut: &Master, node: u64) -> (u32, Counts, Counts) {
    match sut.settled_for(NodeId(node)) {
        Some(NodeCommand::Settled {
            current,
            epochs,
            allowed,
        }) => (current, epochs, allowed),
        other => panic!("a job with even batches tells every node its counts: {other:?}"),
    }
}

#[test]
fn a_dropping_job_allows_the_fewest_batches_settles_at_them_and_reads_the_dropped_splits_first() {
    dropping_job(true);
}

#[test]
fn a_dropping_job_without_a_shuffle_reads_the_dropped_rows_first_as_tasks_of_their_own() {
    dropping_job(false);
}

/// A job with `data.even_batches: drop` over two epochs, `shuffled` or not: the fewest batches
/// allowed and settled, a drop journaled once and listed, the dropped rows first in the next
/// epoch, and the same table from the journal and from a snapshot.
fn dropping_job(shuffled: bool) {
    let spec = || {
        let even = "  epochs: 2\n  fixed_batch_size: true\n  even_batches: drop\n";
        let shuffle = if shuffled {
            "  shuffle: { seed: 3 }\n"
        } else {
            ""
        };
        SPEC.replace("  shuffle: { seed: 3 }\n", &format!("{shuffle}{even}"))
    };
    let mut sut = master_of(&spec());
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    journal.extend(register(&mut sut, 1, 0).entries);
    let applied = acquire_applied(&mut sut, 0, 1, 3);
    let first = assigned(&applied.reply);
    journal.extend(applied.entries);
    let applied = acquire_applied(&mut sut, 1, 1, 3);
    let second = assigned(&applied.reply);
    journal.extend(applied.entries);
    assert_eq!((first.len(), second.len()), (3, 2));
    let rows = |task: &v1::TaskAssignment| task.end - task.start;
    let handed = |tasks: &[v1::TaskAssignment]| -> Vec<DropProgress> {
        tasks
            .iter()
            .map(|task| (task.task_id, 0, 0, rows(task), &[][..]))
            .collect()
    };
    // Two of the job's four rings reported: nothing is allowed yet.
    let applied = drop_heartbeat(&mut sut, 0, 2, &handed(&first), &[&[(0, 7)], &[(0, 3)]]);
    journal.extend(applied.entries);
    assert_eq!(told(&sut, 0), (0, vec![], vec![]));
    // All four: every ring may write the fewest any has, 2; node 1 has a row not handed yet.
    let mut partly = handed(&second);
    partly[1].3 -= 1;
    let applied = drop_heartbeat(&mut sut, 1, 2, &partly, &[&[(0, 2)], &[(0, 6)]]);
    journal.extend(applied.entries);
    assert_eq!(told(&sut, 0), (0, vec![], vec![(0, 2)]));
    // Every row handed: the epoch settles at the fewest, 3, and nothing more is only allowed.
    let applied = drop_heartbeat(&mut sut, 1, 3, &handed(&second), &[&[(0, 5)], &[(0, 6)]]);
    journal.extend(applied.entries);
    assert_eq!(told(&sut, 1), (0, vec![(0, 3)], vec![]));
    // Node 0's first ring dropped the rows of its last four batches: two spans of its first task.
    let dropping = &first[0];
    let spans = [(dropping.end - 2, 1), (dropping.end - 1, 1)];
    let done = |tasks: &[v1::TaskAssignment]| -> Vec<DropProgress> {
        tasks
            .iter()
            .map(|task| {
                let dropped: &[(u64, u64)] = if task.task_id == dropping.task_id {
                    &spans
                } else {
                    &[]
                };
                (task.task_id, rows(task), rows(task), rows(task), dropped)
            })
            .collect()
    };
    let applied = drop_heartbeat(&mut sut, 0, 4, &done(&first), &[&[(0, 7)], &[(0, 3)]]);
    journal.extend(applied.entries);
    let again = drop_heartbeat(&mut sut, 0, 4, &done(&first), &[&[(0, 7)], &[(0, 3)]]);
    assert!(
        !again
            .entries
            .iter()
            .any(|entry| matches!(entry, Entry::RowsDropped { .. })),
        "a drop reported again is journaled once"
    );
    journal.extend(again.entries);
    let applied = drop_heartbeat(&mut sut, 1, 5, &done(&second), &[&[(0, 5)], &[(0, 6)]]);
    let front = applied.entries.iter().find_map(|entry| match entry {
        Entry::Event(event @ (Event::Front { .. } | Event::CarveFront { .. })) => Some(event),
        _ => None,
    });
    match front {
        Some(Event::Front { .. }) if shuffled => {}
        Some(Event::CarveFront { rows }) if !shuffled => assert_eq!(
            rows,
            &[TaskSpan {
                split: dropping.split_index,
                start: dropping.end - 2,
                end: dropping.end,
            }],
            "the two dropped spans, merged"
        ),
        other => panic!("the epoch's end brings the dropped rows forward, journaled: {other:?}"),
    }
    journal.extend(applied.entries);
    assert_eq!(sut.table().epoch(), 1);
    let status = sut.status(6);
    assert_eq!(status.dropped_rows, 2);
    let listed: Vec<(u32, String, u64, u64)> = status
        .dropped
        .iter()
        .map(|drop| (drop.epoch, drop.uri.clone(), drop.first_row, drop.row_count))
        .collect();
    let uri = format!("file:///data/train/part-{}.parquet", dropping.split_index);
    assert_eq!(
        listed,
        [
            (0, uri.clone(), dropping.end - 2, 1),
            (0, uri, dropping.end - 1, 1)
        ]
    );
    // Without a shuffle the node that did not read the dropped split last asks first: the tasks of
    // the splits it read come first for it, but after the dropped rows.
    let last_reader = sut.readers[dropping.split_index as usize].expect("read in epoch 0");
    let asker = if shuffled { 0 } else { 1 - last_reader.0 };
    for (split, reader) in sut.readers.iter_mut().enumerate() {
        if !shuffled && split != dropping.split_index as usize {
            *reader = Some(NodeId(asker));
        }
    }
    let applied = acquire_applied(&mut sut, asker, 7, 5);
    let next = assigned(&applied.reply);
    journal.extend(applied.entries);
    if !shuffled {
        // Epoch 1 hands out the dropped rows first, cut out of their task; the rest of that task
        // keeps its place.
        let first = (next[0].split_index, next[0].start, next[0].end);
        assert_eq!(
            first,
            (dropping.split_index, dropping.end - 2, dropping.end)
        );
        assert!(
            !next[1..]
                .iter()
                .any(|task| task.split_index == dropping.split_index
                    && task.start < dropping.end
                    && dropping.end - 2 < task.end),
            "the dropped rows are handed out once: {next:?}"
        );
    }
    // With a shuffle, epoch 1 hands out every task of the dropped split before any other.
    let splits: Vec<u32> = next.iter().map(|task| task.split_index).collect();
    let of_dropped = splits
        .iter()
        .filter(|split| **split == dropping.split_index)
        .count();
    if shuffled {
        assert!(of_dropped > 0 && of_dropped < splits.len(), "{splits:?}");
        assert!(
            splits[..of_dropped]
                .iter()
                .all(|split| *split == dropping.split_index),
            "the dropped split's tasks come first: {splits:?}"
        );
    }
    // The journal rebuilds the same table, its order included, and the same drops; so does a
    // snapshot, and one written before drops were kept.
    let mut recovered = master_of(&spec());
    for entry in journal {
        recovered.replay(entry).expect("replay");
    }
    assert_eq!(recovered.table().position(), sut.table().position());
    assert_eq!(recovered.status(6).dropped, status.dropped);
    let snapshot = sut.snapshot();
    let encoded = postcard::to_stdvec(&snapshot).expect("encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&encoded).expect("decodes");
    assert_eq!(decoded, snapshot);
    let older = postcard::to_stdvec(&(&snapshot.core, &snapshot.bad_data, &snapshot.added_sources))
        .expect("encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&older).expect("decodes");
    assert_eq!(decoded.core, snapshot.core);
    assert_eq!(decoded.dropped.rows(), 0);
}

#[test]
fn a_stop_request_for_the_holder_of_a_re_split_task_waits_for_its_next_call() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let mut held = Vec::new();
    while let Some(task) = assigned(&acquire(&mut sut, 0, 1, 1)).pop() {
        held.push(task);
    }
    assert_eq!(held.len(), 5, "node 0 took every task");
    // Node 1 is idle with nothing pending: the AM re-splits one of node 0's tasks.
    let idle = acquire(&mut sut, 1, 2, 1);
    assert!(
        assigned(&idle).is_empty(),
        "nothing to hand out before the holder stops"
    );
    let commands = heartbeat(&mut sut, 0, 3, &[]);
    let stop = commands
        .iter()
        .find_map(|command| match &command.command {
            Some(Cmd::Stop(stop)) => Some(*stop),
            _ => None,
        })
        .expect("node 0 is asked to stop a task");
    assert!(held.iter().any(|task| task.task_id == stop.task_id));
    let ack = sut.ack_stop(NodeId(0), TaskId(stop.task_id), stop.row, 4);
    assert_eq!(ack.entries.len(), 1);
    let piece = assigned(&acquire(&mut sut, 1, 5, 1));
    assert_eq!(piece.len(), 1, "the cut-off piece goes to the idle node");
    assert_eq!(piece[0].start, stop.row);
}

#[test]
fn with_even_batches_a_re_split_takes_rows_not_handed_to_a_ring_and_leaves_a_task_handed_whole() {
    let mut sut = master_of(&SPEC.replace(
        "  shuffle: { seed: 3 }\n",
        "  shuffle: { seed: 3 }\n  fixed_batch_size: true\n  even_batches: pad\n",
    ));
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let held = assigned(&acquire(&mut sut, 0, 1, 8));
    assert_eq!(held.len(), 5, "node 0 took every task");
    // Two rows of each task are in node 0's rings; its writers were handed the first task whole,
    // and four rows of each other one, while its rings are full.
    let counts: Vec<(u64, u64, u64, u64)> = held
        .iter()
        .enumerate()
        .map(|(index, task)| {
            let handed = if index == 0 { task.end - task.start } else { 4 };
            (task.task_id, 2, 0, handed)
        })
        .collect();
    even_heartbeat(&mut sut, 0, 2, &counts, &[&[(0, 1)], &[(0, 1)]]);
    acquire(&mut sut, 1, 3, 1);
    let commands = heartbeat_applied(&mut sut, 0, 4, &[]).reply;
    let stops: Vec<v1::StopTask> = commands
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Stop(stop)) => Some(*stop),
            _ => None,
        })
        .collect();
    let [stop] = stops[..] else {
        panic!("node 0 is asked to stop one task: {commands:?}");
    };
    assert_ne!(
        stop.task_id, held[0].task_id,
        "the task handed whole is left alone"
    );
    let task = held
        .iter()
        .find(|task| task.task_id == stop.task_id)
        .expect("a task of node 0");
    assert_eq!(
        stop.row,
        task.start + 4 + (task.end - task.start - 4) / 2,
        "half of what is not handed"
    );
}

#[test]
fn an_am_taking_the_job_over_asks_again_for_a_stop_not_yet_acknowledged() {
    let mut old_am = master();
    let mut entries = Vec::new();
    for node in [0, 1] {
        entries.extend(register(&mut old_am, node, 0).entries);
    }
    loop {
        let applied = acquire_applied(&mut old_am, 0, 1, 1);
        entries.extend(applied.entries);
        if assigned(&applied.reply).is_empty() {
            break;
        }
    }
    let idle = acquire_applied(&mut old_am, 1, 2, 1);
    entries.extend(idle.entries);
    let stops = |commands: &[v1::Command]| -> Vec<v1::StopTask> {
        commands
            .iter()
            .filter_map(|command| match &command.command {
                Some(Cmd::Stop(stop)) => Some(*stop),
                _ => None,
            })
            .collect()
    };
    let asked = stops(&heartbeat(&mut old_am, 0, 3, &[]));
    assert_eq!(asked.len(), 1, "the old AM asked node 0 to stop one task");

    let mut sut = master();
    for entry in entries {
        sut.replay(entry).expect("entry replays");
    }
    sut.grant_grace(10);
    assert!(
        sut.outbox.is_empty(),
        "replaying sends nothing again: {:?}",
        sut.outbox
    );
    assert!(
        stops(&heartbeat(&mut sut, 1, 11, &[])).is_empty(),
        "the stop is for the holder only"
    );
    sut.resume_commands();
    assert_eq!(stops(&heartbeat(&mut sut, 0, 12, &[])), asked);
    assert!(
        stops(&heartbeat(&mut sut, 0, 13, &[])).is_empty(),
        "asked once"
    );
}

/// Registers a daemon started without a node id on `host`, as the service does.
fn register_by_host(
    sut: &mut Master,
    host: &str,
    now_ms: u64,
) -> Result<Applied<v1::RegisterReply>> {
    register_request(
        sut,
        v1::RegisterRequest {
            job_id: "unit".into(),
            hostname: host.into(),
            node_by_host: true,
            ..v1::RegisterRequest::default()
        },
        now_ms,
    )
}

#[test]
fn a_daemon_without_a_node_id_serves_the_node_of_its_host() {
    let mut sut = master();
    let mut journal = Vec::new();
    let mut node_of = |sut: &mut Master, host: &str, now_ms: u64| {
        let applied = register_by_host(sut, host, now_ms).expect("registered");
        journal.extend(applied.entries);
        applied.reply.node_id
    };
    assert_eq!(node_of(&mut sut, "alpha", 0), 0);
    assert_eq!(node_of(&mut sut, "beta", 1), 1);
    assert_eq!(
        node_of(&mut sut, "alpha", 2),
        0,
        "started again on its host"
    );
    let refused = register_by_host(&mut sut, "gamma", 3).expect_err("no node left");
    let message = refused.to_string();
    for part in [
        "gamma",
        "2 nodes",
        "node-0 on \"alpha\"",
        "node-1 on \"beta\"",
        "--node-id",
    ] {
        assert!(message.contains(part), "{part:?} in {message:?}");
    }
    // Beta falls silent and is lost; its node stays beta's, since its daemon may come back.
    heartbeat(&mut sut, 0, 1500, &[]);
    sut.tick(2000);
    assert!(register_by_host(&mut sut, "gamma", 2001).is_err());
    assert_eq!(node_of(&mut sut, "beta", 2002), 1);

    // An AM that takes the job over learns which host holds which node from their heartbeats; a
    // node whose host it has not heard from goes to a daemon of another host (the job's daemons
    // started again), once the nodes never registered are all taken.
    let mut taken_over = master();
    for entry in journal {
        taken_over.replay(entry).expect("replay");
    }
    heartbeat_applied_from(&mut taken_over, 1, "beta", 2004);
    let mut node_of = |host: &str| {
        register_by_host(&mut taken_over, host, 2005).map(|applied| applied.reply.node_id)
    };
    assert_eq!(node_of("beta").expect("registered"), 1);
    assert_eq!(node_of("delta").expect("registered"), 0);
    assert!(node_of("gamma").is_err());
    assert!(
        node_of("")
            .expect_err("no host name")
            .to_string()
            .contains("--node-id")
    );
}

/// A heartbeat of `node` on `host` with no counts.
fn heartbeat_applied_from(sut: &mut Master, node: u64, host: &str, now_ms: u64) {
    sut.heartbeat(
        wire::heartbeat(v1::HeartbeatRequest {
            node_id: node,
            hostname: host.into(),
            ..v1::HeartbeatRequest::default()
        }),
        now_ms,
    );
}

#[test]
fn replaying_the_journal_rebuilds_the_same_table() {
    let mut sut = master();
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    journal.extend(register(&mut sut, 1, 0).entries);
    let applied = acquire_applied(&mut sut, 0, 1, 2);
    let tasks = assigned(&applied.reply);
    journal.extend(applied.entries);
    let applied = heartbeat_applied(&mut sut, 0, 2, &[(tasks[0].task_id, 6, 4)]);
    journal.extend(applied.entries);
    // Node 1 falls silent and is declared lost.
    journal.extend(heartbeat_entries(&mut sut, 0, 1500));
    let tick = sut.tick(2000);
    assert_eq!(
        tick.entries.len(),
        1,
        "the tick that loses node 1 is journaled"
    );
    journal.extend(tick.entries);
    assert!(
        sut.tick(2001).entries.is_empty(),
        "a tick that changes nothing is not"
    );

    let mut recovered = master();
    for entry in journal {
        recovered.replay(entry).expect("replay");
    }
    assert_eq!(recovered.table().position(), sut.table().position());
}

#[test]
fn a_snapshot_and_the_entries_after_it_rebuild_the_same_state() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let tasks = assigned(&acquire(&mut sut, 0, 1, 3));
    heartbeat(&mut sut, 0, 2, &[(tasks[0].task_id, 5, 3)]);
    // Node 1 is lost; node 0 fails a task, which goes back to the queue.
    heartbeat(&mut sut, 0, 1500, &[]);
    sut.tick(1600);
    sut.report(
        TaskReport {
            node: NodeId(0),
            task: TaskId(tasks[1].task_id),
            consumed: 0,
            outcome: ReportOutcome::Failed {
                reason: "corrupt page".into(),
            },
        },
        1700,
    );
    let snapshot = sut.snapshot();
    let captured = snapshot.clone();

    // Another failure after the snapshot queues its task behind the first one, ahead of the
    // epoch's order.
    let mut later = Vec::new();
    let applied = sut.report(
        TaskReport {
            node: NodeId(0),
            task: TaskId(tasks[2].task_id),
            consumed: 0,
            outcome: ReportOutcome::Failed {
                reason: "timeout".into(),
            },
        },
        1800,
    );
    later.extend(applied.entries);
    later.extend(heartbeat_entries(&mut sut, 0, 2900));
    let tick = sut.tick(3000);
    later.extend(tick.entries);

    let later_again = later.clone();
    let mut recovered = master();
    recovered.restore_snapshot(snapshot).expect("restore");
    for entry in later {
        recovered.replay(entry).expect("replay");
    }
    let position = sut.table().position();
    assert_eq!(
        &position.pending[..2],
        &[TaskId(tasks[1].task_id), TaskId(tasks[2].task_id)]
    );
    assert_eq!(recovered.table().position(), position);
    assert_eq!(recovered.snapshot(), sut.snapshot());

    // The journal encodes a snapshot after it was taken, while the master goes on: what it
    // encodes is the state at the snapshot all the same.
    let encoded = postcard::to_stdvec(&captured).expect("a snapshot encodes");
    let decoded: Snapshot = postcard::from_bytes(&encoded).expect("a snapshot decodes");
    let mut from_bytes = master();
    from_bytes.restore_snapshot(decoded).expect("restore");
    for entry in later_again {
        from_bytes.replay(entry).expect("replay");
    }
    assert_eq!(from_bytes.snapshot(), sut.snapshot());
}

fn heartbeat_entries(sut: &mut Master, node: u64, now_ms: u64) -> Vec<Entry> {
    heartbeat_applied(sut, node, now_ms, &[]).entries
}

#[test]
fn a_stopped_job_shuts_every_daemon_down() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let stop = sut.stop("operator".into());
    assert_eq!(stop.reply, JobPhase::Stopping);
    assert_eq!(stop.entries.len(), 1);
    assert!(sut.stop("again".into()).entries.is_empty());
    assert!(has_shutdown(&acquire(&mut sut, 0, 1, 4)));
    assert_eq!(sut.phase(), JobPhase::Stopped);
    assert!(sut.finished());
}

/// Consumes `rows` of a task on `node` with one heartbeat.
fn consume(sut: &mut Master, node: u64, now_ms: u64, task: &v1::TaskAssignment, rows: u64) {
    heartbeat(sut, node, now_ms, &[(task.task_id, rows, rows)]);
}

fn commit(
    sut: &mut Master,
    step: u64,
    rank: u32,
    positions: &[(u64, u64)],
) -> Result<Applied<CommitOutcome>> {
    commit_of(sut, step, (rank, 2), positions)
}

/// Rank `rank` of `world_size` commits its positions at `step` of epoch 0.
fn commit_of(
    sut: &mut Master,
    step: u64,
    (rank, world_size): (u32, u32),
    positions: &[(u64, u64)],
) -> Result<Applied<CommitOutcome>> {
    sut.commit_checkpoint(RankCommit {
        step,
        rank,
        world_size,
        epoch: 0,
        positions: positions
            .iter()
            .map(|(task_id, end_row)| (TaskId(*task_id), *end_row))
            .collect(),
    })
}

#[test]
fn a_data_checkpoint_restores_exactly_the_rows_not_consumed_at_its_step() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let tasks = assigned(&acquire(&mut sut, 0, 1, 3));
    assert_eq!(tasks.len(), 3);
    let (first, second, third) = (&tasks[0], &tasks[1], &tasks[2]);
    // At step 5, rank 0 finished the first task and read 4 rows of the second; rank 1 read 2
    // rows of the third.
    consume(&mut sut, 0, 2, first, first.end - first.start);
    let pending = commit(
        &mut sut,
        5,
        0,
        &[
            (first.task_id, first.end),
            (second.task_id, second.start + 4),
        ],
    )
    .expect("rank 0 commits");
    assert!(matches!(
        pending.reply,
        CommitOutcome::Pending {
            reported: 1,
            world_size: 2
        }
    ));
    // The trainers go on past step 5 before rank 1 commits it.
    consume(&mut sut, 0, 3, second, 6);
    let ready = commit(&mut sut, 5, 1, &[(third.task_id, third.start + 2)]).expect("rank 1");
    let CommitOutcome::Ready(ready) = ready.reply else {
        panic!("every rank reported");
    };
    assert!(ready.token.starts_with("unit-step5-"), "{}", ready.token);
    assert_eq!(ready.position.done_rows, (first.end - first.start) + 4 + 2);
    sut.checkpoint_stored(5, ready.token.clone());
    assert!(matches!(
        commit(&mut sut, 5, 0, &[]).expect("a late retry").reply,
        CommitOutcome::Stored(ref token) if *token == ready.token
    ));

    // Run on, then go back to step 5: the daemon gives its rings back, and what is handed out
    // afterwards is exactly the rows not consumed at step 5.
    consume(&mut sut, 0, 4, third, third.end - third.start);
    let restored = sut
        .restore(ready.token.clone(), ready.position.clone(), 10, None)
        .expect("restore");
    assert_eq!(restored.reply.step, 5);
    assert_eq!(
        restored.reply.effect,
        RestoreEffect::RingsReplaced,
        "an AM that launches no trainers only takes the rings back"
    );
    let commands = heartbeat(&mut sut, 0, 11, &[]);
    assert!(
        has_release(&commands),
        "the daemon gives its rings back: {commands:?}"
    );
    register(&mut sut, 0, 12);
    let mut after: Vec<(u32, u64, u64)> = Vec::new();
    loop {
        let tasks = assigned(&acquire(&mut sut, 0, 13, 8));
        if tasks.is_empty() {
            break;
        }
        for task in tasks {
            after.push((task.split_index, task.start, task.end));
            consume(&mut sut, 0, 13, &task, task.end - task.start);
        }
    }
    let mut expected: Vec<(u32, u64, u64)> = vec![
        (0, 0, 10),
        (0, 10, 20),
        (0, 20, 25),
        (1, 0, 10),
        (1, 10, 15),
    ]
    .into_iter()
    .filter_map(|(split, start, end)| {
        let consumed_to = [
            (first, first.end),
            (second, second.start + 4),
            (third, third.start + 2),
        ]
        .iter()
        .find(|(task, _)| task.split_index == split && task.start == start)
        .map_or(start, |(_, consumed_to)| *consumed_to);
        (consumed_to < end).then_some((split, consumed_to, end))
    })
    .collect();
    expected.sort_unstable();
    after.sort_unstable();
    assert_eq!(after, expected);
    assert_eq!(sut.phase(), JobPhase::Succeeded);
}

#[test]
fn a_checkpoint_after_a_restore_counts_what_the_restored_one_consumed_at_any_world_size() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let tasks = assigned(&acquire(&mut sut, 0, 1, 3));
    let (first, second, third) = (&tasks[0], &tasks[1], &tasks[2]);
    consume(&mut sut, 0, 2, first, first.end - first.start);
    commit(
        &mut sut,
        5,
        0,
        &[
            (first.task_id, first.end),
            (second.task_id, second.start + 4),
        ],
    )
    .expect("rank 0 of 2");
    let CommitOutcome::Ready(ready) = commit(&mut sut, 5, 1, &[(third.task_id, third.start + 2)])
        .expect("rank 1 of 2")
        .reply
    else {
        panic!("both ranks reported");
    };
    sut.checkpoint_stored(5, ready.token.clone());
    sut.restore(ready.token.clone(), ready.position.clone(), 10, None)
        .expect("restore");
    assert!(has_release(&heartbeat(&mut sut, 0, 11, &[])));
    register(&mut sut, 0, 12);
    let snapshot = sut.snapshot();

    // Three ranks read on from the checkpoint; each reports only the tasks it read since: rank 0
    // the rest of the second task. The rows the checkpoint had consumed count all the same: the
    // first task, and 2 rows of the third, which no rank reports.
    let after_restore = |sut: &mut Master| {
        let mut resumed: Vec<(u64, u64)> = assigned(&acquire(sut, 0, 13, 2))
            .iter()
            .map(|task| (task.task_id, task.start))
            .collect();
        resumed.sort_unstable();
        let mut in_progress = [
            (second.task_id, second.start + 4),
            (third.task_id, third.start + 2),
        ];
        in_progress.sort_unstable();
        assert_eq!(
            resumed, in_progress,
            "the tasks in progress at the step come first, from their consumed counts"
        );
        let reports = [vec![(second.task_id, second.end)], vec![], vec![]];
        let mut outcome = None;
        for (rank, positions) in reports.iter().enumerate() {
            outcome = Some(
                commit_of(sut, 8, (rank as u32, 3), positions)
                    .expect("a rank of 3")
                    .reply,
            );
        }
        let Some(CommitOutcome::Ready(ready)) = outcome else {
            panic!("the three ranks reported: {outcome:?}");
        };
        ready.position
    };
    let position = after_restore(&mut sut);
    assert_eq!(
        position.done_rows,
        (first.end - first.start) + (second.end - second.start) + 2,
        "rows consumed before the restore count at the later step"
    );
    let starts: Vec<(TaskStatus, u64)> = [first, second, third]
        .iter()
        .map(|task| {
            let record = &position.tasks[(task.task_id - position.first_task_id) as usize];
            (record.status.clone(), record.start)
        })
        .collect();
    assert_eq!(
        starts,
        [
            (TaskStatus::Done, first.end),
            (TaskStatus::Done, second.end),
            (TaskStatus::Pending, third.start + 2),
        ]
    );

    // An AM that takes the job over from a snapshot taken after the restore reads the restored
    // checkpoint from the store, and counts the same.
    let mut taken_over = master();
    taken_over
        .restore_snapshot(snapshot)
        .expect("the snapshot after the restore");
    assert_eq!(
        taken_over.restored_position_missing(),
        Some(ready.token.as_str())
    );
    taken_over.restored_position(&ready.position);
    assert_eq!(taken_over.restored_position_missing(), None);
    assert_eq!(after_restore(&mut taken_over), position);
}

#[test]
fn a_checkpoint_with_a_position_outside_a_task_is_refused() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let tasks = assigned(&acquire(&mut sut, 0, 1, 1));
    let error = commit(&mut sut, 1, 0, &[(tasks[0].task_id, tasks[0].end + 1)])
        .expect_err("rows past the task's end");
    assert!(error.to_string().contains("outside its rows"), "{error}");
    let pending = commit(&mut sut, 1, 1, &[]).expect("rank 1");
    assert!(
        matches!(
            pending.reply,
            CommitOutcome::Pending {
                reported: 1,
                world_size: 2
            }
        ),
        "the refused report is not kept: the step waits for rank 0"
    );
    let ready = commit(&mut sut, 1, 0, &[(tasks[0].task_id, tasks[0].end)]).expect("rank 0");
    assert!(matches!(ready.reply, CommitOutcome::Ready(_)));
    let mismatch = commit(&mut sut, 2, 0, &[]).and_then(|_| {
        sut.commit_checkpoint(RankCommit {
            step: 2,
            rank: 1,
            world_size: 3,
            ..RankCommit::default()
        })
    });
    assert!(
        mismatch.is_err(),
        "ranks of a step disagree on the world size"
    );
}

/// An AM that launches executors and takes the job over by replaying `journal`.
fn replayed_from(journal: Vec<Entry>) -> Master {
    let mut replayed = master();
    replayed.launch_executors();
    for entry in journal {
        replayed.replay(entry).expect("replay");
    }
    replayed
}

/// An AM that launches executors and takes the job over from `snapshot`.
fn restored_from(snapshot: Snapshot) -> Master {
    let mut restored = master();
    restored.launch_executors();
    restored.restore_snapshot(snapshot).expect("snapshot");
    restored
}

/// A master that launches its executors, each one launched, and both nodes registered.
fn launching_master(journal: &mut Vec<Entry>) -> Master {
    let mut sut = master();
    sut.launch_executors();
    for LaunchAction::Launch(id) in sut.executors_to_launch() {
        journal.extend(sut.executor_launched(id).entries);
    }
    journal.extend(register(&mut sut, 0, 0).entries);
    journal.extend(register(&mut sut, 1, 0).entries);
    sut
}

fn trainer(rank: u32) -> ExecutorId {
    ExecutorId::Trainer {
        role: "worker".into(),
        rank,
    }
}

fn has_release(commands: &[v1::Command]) -> bool {
    matches!(
        commands
            .first()
            .and_then(|command| command.command.as_ref()),
        Some(Cmd::Release(_))
    )
}

fn trainers_to_launch(sut: &Master) -> Vec<ExecutorId> {
    sut.executors_to_launch()
        .into_iter()
        .map(|LaunchAction::Launch(id)| id)
        .filter(|id| matches!(id, ExecutorId::Trainer { .. }))
        .collect()
}

fn register_holding_nothing(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    journal: &mut Vec<Entry>,
) -> v1::RegisterReply {
    let applied = register(sut, node, now_ms);
    journal.extend(applied.entries);
    applied.reply
}

#[test]
fn a_scale_forgets_the_settled_counts_of_the_rings_it_replaces() {
    let mut sut = master_of(&SPEC.replace(
        "  shuffle: { seed: 3 }\n",
        "  shuffle: { seed: 3 }\n  fixed_batch_size: true\n  even_batches: pad\n",
    ));
    sut.launch_executors();
    for LaunchAction::Launch(id) in sut.executors_to_launch() {
        sut.executor_launched(id);
    }
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let tasks: Vec<(u64, u64, u64, u64)> = assigned(&acquire(&mut sut, 0, 1, 5))
        .iter()
        .map(|task| (task.task_id, 0, 0, task.end - task.start))
        .collect();
    even_heartbeat(&mut sut, 1, 2, &[], &[&[(0, 4)], &[(0, 0)]]);
    let (_, settled) = even_heartbeat(&mut sut, 0, 2, &tasks, &[&[(0, 9)], &[(0, 6)]]);
    assert_eq!(settled, vec![(0, 9)]);
    sut.scale("worker", 2).expect("a scale");
    let (_, settled) = even_heartbeat(&mut sut, 0, 3, &tasks, &[&[(0, 9)], &[(0, 6)]]);
    assert_eq!(
        settled,
        vec![],
        "the rings being given back count for nothing"
    );
}

#[test]
fn a_scale_is_refused_with_a_reason_for_bad_requests_and_finishing_jobs() {
    let mut without_executors = master();
    let error = without_executors
        .scale("worker", 2)
        .expect_err("no executors");
    assert!(
        error.to_string().contains("launches no executors"),
        "{error}"
    );

    let mut sut = launching_master(&mut Vec::new());
    let error = sut.scale("reader", 2).expect_err("unknown role");
    assert!(
        error.to_string().contains(r#"name one of ["worker"]"#),
        "{error}"
    );
    let error = sut.scale("worker", 0).expect_err("zero trainers");
    assert!(error.to_string().contains("at least one"), "{error}");
    let error = sut
        .scale("worker", 4_000_000_000)
        .expect_err("four billion trainers");
    assert!(
        error
            .to_string()
            .contains("more than the 1048576 a job may have"),
        "{error}"
    );
    let same = sut.scale("worker", 4).expect("the same size");
    assert!(same.entries.is_empty(), "the same size changes nothing");
    assert!(!sut.scaling());

    sut.scale("worker", 2).expect("a first scale");
    let error = sut.scale("worker", 3).expect_err("a scale under way");
    assert!(
        error.to_string().contains("earlier scale is under way"),
        "{error}"
    );

    let mut stopping = launching_master(&mut Vec::new());
    stopping.stop("operator".into());
    let error = stopping.scale("worker", 2).expect_err("stopping");
    assert!(error.to_string().contains("finishing"), "{error}");

    let mut finishing = launching_master(&mut Vec::new());
    finishing.executor_exited(trainer(2), Exit::Code(0));
    let error = finishing
        .scale("worker", 2)
        .expect_err("a trainer succeeded");
    assert!(
        error
            .to_string()
            .contains("trainer-worker-2 exited with success"),
        "{error}"
    );
}

#[test]
fn a_scale_stops_the_trainers_takes_the_rings_back_and_relaunches_over_the_new_ranks() {
    let mut journal = Vec::new();
    let mut sut = launching_master(&mut journal);
    let applied = acquire_applied(&mut sut, 0, 1, 1);
    let task = assigned(&applied.reply)[0].clone();
    journal.extend(applied.entries);
    journal.extend(heartbeat_entries(&mut sut, 0, 2));
    let applied = heartbeat_applied(&mut sut, 0, 3, &[(task.task_id, 6, 2)]);
    journal.extend(applied.entries);
    sut.commit_checkpoint(RankCommit {
        step: 7,
        rank: 0,
        world_size: 4,
        epoch: 0,
        positions: Vec::new(),
    })
    .expect("a rank's commit");

    let scaled = sut.scale("worker", 2).expect("scale");
    assert_eq!(
        (scaled.reply.previous_num, scaled.reply.num),
        (4, 2),
        "the reply names both sizes"
    );
    journal.extend(scaled.entries);
    assert!(sut.scaling());
    assert!(
        sut.snapshot().core.checkpoints.is_empty(),
        "a checkpoint waiting for ranks of the old world is dropped"
    );
    assert!(
        trainers_to_launch(&sut).is_empty(),
        "no trainer launches mid-scale"
    );
    let retiring: Vec<ExecutorId> = sut
        .executors()
        .expect("executors")
        .retiring()
        .cloned()
        .collect();
    assert_eq!(retiring, (0..4).map(trainer).collect::<Vec<_>>());
    assert!(
        !has_release(&heartbeat(&mut sut, 0, 4, &[])),
        "no release while trainers may still read the rings"
    );
    for rank in 0..4 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    assert_eq!(
        sut.status(5).roles[0].failures,
        0,
        "stopped trainers did not fail"
    );

    // Node 0 reports its final count, 3 rows of the task, and gives everything back.
    let applied = heartbeat_applied(&mut sut, 0, 6, &[(task.task_id, 6, 3)]);
    assert!(has_release(&applied.reply), "{applied:?}");
    journal.extend(applied.entries);
    let reply = register_holding_nothing(&mut sut, 0, 7, &mut journal);
    assert!(
        reply.ranks.is_empty(),
        "node 1 still feeds rings of the old ranks: node 0 opens none yet"
    );
    assert_eq!(
        sut.table().in_flight_count(),
        0,
        "the task was queued again"
    );

    let commands = heartbeat(&mut sut, 1, 8, &[]);
    assert!(has_release(&commands), "{commands:?}");
    let reply = register_holding_nothing(&mut sut, 1, 9, &mut journal);
    assert_eq!(
        (reply.ranks.clone(), reply.world_size),
        (vec![1], 2),
        "the last node to give its rings back gets its new ranks at once"
    );
    let commands = heartbeat(&mut sut, 0, 10, &[]);
    assert!(has_release(&commands), "node 0 is asked to register again");
    let reply = register_holding_nothing(&mut sut, 0, 11, &mut journal);
    assert_eq!((reply.ranks.clone(), reply.world_size), (vec![0], 2));
    assert!(!sut.scaling());
    assert!(!has_release(&heartbeat(&mut sut, 0, 12, &[])));
    assert_eq!(trainers_to_launch(&sut), vec![trainer(0), trainer(1)]);
    assert_eq!(sut.world_size(), 2);
    assert_eq!(sut.status(12).roles[0].num, 2);

    let position_after_scale = sut.table().position();
    let again = assigned(&acquire(&mut sut, 1, 13, 8));
    let resumed = again
        .iter()
        .find(|assignment| assignment.task_id == task.task_id)
        .expect("the released task is handed out again");
    assert_eq!(
        resumed.start,
        task.start + 3,
        "it resumes after the 3 rows consumed, not the 6 enqueued"
    );

    let replayed = replayed_from(journal);
    assert_eq!(replayed.world_size(), 2);
    assert!(!replayed.scaling());
    assert_eq!(
        replayed.table().position(),
        position_after_scale,
        "the replayed table has the released task queued again from the same row"
    );
    assert_eq!(trainers_to_launch(&replayed), vec![trainer(0), trainer(1)]);
}

#[test]
fn an_am_taking_a_job_over_mid_scale_carries_on_where_it_stood() {
    let mut journal = Vec::new();
    let mut sut = launching_master(&mut journal);
    journal.extend(sut.scale("worker", 6).expect("scale").entries);
    for rank in 0..4 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    register_holding_nothing(&mut sut, 0, 5, &mut journal);
    let snapshot = sut.snapshot();

    let mut replayed = replayed_from(journal);
    let mut restored = restored_from(snapshot);
    for taken_over in [&mut replayed, &mut restored] {
        assert!(taken_over.scaling());
        assert!(
            has_release(&heartbeat(taken_over, 1, 6, &[])),
            "node 1 still has its rings to give back"
        );
        assert!(!has_release(&heartbeat(taken_over, 0, 6, &[])));
        let reply = register(taken_over, 1, 7).reply;
        assert_eq!(reply.ranks, vec![3, 4, 5]);
        assert!(has_release(&heartbeat(taken_over, 0, 8, &[])));
        assert_eq!(register(taken_over, 0, 9).reply.ranks, vec![0, 1, 2]);
        assert_eq!(trainers_to_launch(taken_over).len(), 6);
    }
}

#[test]
fn a_node_lost_while_giving_its_rings_back_takes_no_part_in_the_scale_any_more() {
    let mut sut = launching_master(&mut Vec::new());
    sut.scale("worker", 1).expect("scale");
    for rank in 0..4 {
        sut.executor_exited(trainer(rank), Exit::Code(143));
    }
    assert!(has_release(&heartbeat(&mut sut, 0, 500, &[])));
    assert_eq!(register(&mut sut, 0, 600).reply.ranks, Vec::<u32>::new());
    // Node 1 never answers and is lost: node 0 is asked back for its new ranks.
    heartbeat(&mut sut, 0, 1500, &[]);
    sut.tick(1600);
    assert!(has_release(&heartbeat(&mut sut, 0, 1700, &[])));
    let reply = register(&mut sut, 0, 1800).reply;
    assert_eq!((reply.ranks, reply.world_size), (vec![0], 1));
    assert!(!sut.scaling());
    assert_eq!(trainers_to_launch(&sut), vec![trainer(0)]);
}

#[test]
fn restoring_a_finished_job_launches_its_daemons_and_trainers_again() {
    let mut sut = launching_master(&mut Vec::new());
    let at_start = sut.table().position();
    for rank in 0..4 {
        sut.executor_exited(trainer(rank), Exit::Code(0));
    }
    sut.executor_exited(ExecutorId::Daemon(0), Exit::Code(0));
    assert_eq!(sut.outcome(), Some(JobPhase::Succeeded));
    assert!(sut.executors_to_launch().is_empty());

    let applied = sut
        .restore("unit-step1-0".into(), at_start, 10, None)
        .expect("restore");
    let mut replayed = launching_master(&mut Vec::new());
    for rank in 0..4 {
        replayed.executor_exited(trainer(rank), Exit::Code(0));
    }
    replayed.executor_exited(ExecutorId::Daemon(0), Exit::Code(0));
    for entry in applied.entries {
        replayed.replay(entry).expect("replay");
    }
    for restored in [&mut sut, &mut replayed] {
        assert_eq!(restored.outcome(), None, "the job runs again");
        let launched: Vec<ExecutorId> = restored
            .executors_to_launch()
            .into_iter()
            .map(|LaunchAction::Launch(id)| id)
            .collect();
        assert_eq!(
            launched,
            vec![ExecutorId::Daemon(0)],
            "the daemon that ended; daemon 1 still runs, and the trainers wait for the rings"
        );
        // The new daemon 0 registers holding nothing; daemon 1 gives its rings back.
        register(restored, 0, 11);
        assert!(has_release(&heartbeat(restored, 1, 12, &[])));
        register(restored, 1, 13);
        assert!(has_release(&heartbeat(restored, 0, 14, &[])));
        register(restored, 0, 15);
        assert_eq!(
            trainers_to_launch(restored),
            (0..4).map(trainer).collect::<Vec<_>>(),
            "every trainer runs again"
        );
    }
}

#[test]
fn a_daemon_that_ends_after_its_finished_job_was_restored_is_launched_again() {
    // The AM that told daemon 0 the job was over ended before it saw the daemon exit: the restore
    // finds the daemon running, and it exits with code 0 afterwards.
    let mut sut = launching_master(&mut Vec::new());
    let at_start = sut.table().position();
    for rank in 0..4 {
        sut.executor_exited(trainer(rank), Exit::Code(0));
    }
    assert_eq!(sut.outcome(), Some(JobPhase::Succeeded));
    let mut journal = sut
        .restore("unit-step1-0".into(), at_start, 10, None)
        .expect("restore")
        .entries;
    assert!(
        sut.executors_to_launch().is_empty(),
        "both daemons still run, and the trainers wait for the rings"
    );
    journal.extend(
        sut.executor_exited(ExecutorId::Daemon(0), Exit::Code(0))
            .entries,
    );
    assert_eq!(
        sut.executors_to_launch(),
        vec![LaunchAction::Launch(ExecutorId::Daemon(0))],
        "the job runs again, so it needs its daemon"
    );

    let mut replayed = launching_master(&mut Vec::new());
    for rank in 0..4 {
        replayed.executor_exited(trainer(rank), Exit::Code(0));
    }
    for entry in journal {
        replayed.replay(entry).expect("replay");
    }
    assert_eq!(
        replayed.executors_to_launch(),
        sut.executors_to_launch(),
        "a replay decides the same"
    );
}

#[test]
fn a_daemon_told_that_the_job_is_over_is_not_launched_again() {
    let mut sut = launching_master(&mut Vec::new());
    for rank in 0..4 {
        sut.executor_exited(trainer(rank), Exit::Code(0));
    }
    sut.executor_exited(ExecutorId::Daemon(0), Exit::Code(0));
    assert!(sut.executors_to_launch().is_empty());
}

/// The unit job, following its source.
fn following_master() -> Master {
    let text = SPEC.replace("format: parquet }", "format: parquet, follow: true }");
    let spec = Arc::new(JobSpec::parse(&text, Format::Yaml).expect("valid spec"));
    let mut plan = JobPlan::default();
    plan.extend(0, vec![planned_split("part-0", 25)]);
    plan.versions.push(None);
    Master::new(spec, Arc::new(plan)).expect("the splits have rows")
}

/// A planned split of `rows` rows of file `name`.
pub(super) fn planned_split(name: &str, rows: u64) -> Split {
    Split {
        task_id: 0,
        uri: format!("file:///data/train/{name}.parquet"),
        file_size: 1000,
        first_row: 0,
        row_count: rows,
        partition_values: Vec::new(),
        delta: None,
        bytes: None,
        identity: None,
    }
}

/// Consumes every task handed to `node` now; returns the commands of the last heartbeat.
fn consume_all(sut: &mut Master, node: u64, now_ms: u64) -> Vec<v1::Command> {
    let tasks = assigned(&acquire(sut, node, now_ms, 100));
    let counts: Vec<(u64, u64, u64)> = tasks
        .iter()
        .map(|task| (task.task_id, task.end - task.start, task.end - task.start))
        .collect();
    heartbeat(sut, node, now_ms, &counts)
}

#[test]
fn added_splits_are_assigned_with_their_files_and_replay_from_the_journal() {
    let mut sut = following_master();
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    let first = assigned(&acquire(&mut sut, 0, 1, 1));
    // The added file is pinned to what it was when the follower found it.
    let pinned = Split {
        identity: Some(ObjectIdentity {
            e_tag: Some("\"added\"".to_owned()),
            version: None,
            modified_ns: None,
        }),
        ..planned_split("part-1", 12)
    };
    let added = sut.add_splits(0, None, JobPlan::of_splits(0, vec![pinned]));
    assert!(matches!(added.entries[..], [Entry::FilesAdded { .. }]));
    journal.extend(added.entries);
    let applied = acquire_applied(&mut sut, 0, 2, 100);
    journal.extend(applied.entries);
    let rest = assigned(&applied.reply);
    let uris: BTreeSet<String> = first
        .iter()
        .chain(&rest)
        .filter_map(|task| task.split.as_ref().map(|split| split.uri.clone()))
        .collect();
    assert!(
        uris.contains("file:///data/train/part-1.parquet"),
        "{uris:?}"
    );
    assert_eq!(first.len() + rest.len(), 5, "3 planned tasks and 2 added");
    let e_tags: BTreeSet<Option<String>> = first
        .iter()
        .chain(&rest)
        .filter_map(|task| task.split.as_ref())
        .filter(|split| split.uri.ends_with("part-1.parquet"))
        .map(|split| {
            split
                .identity
                .as_ref()
                .and_then(|identity| identity.e_tag.clone())
        })
        .collect();
    assert_eq!(
        e_tags,
        BTreeSet::from([Some("\"added\"".to_owned())]),
        "the added file's tasks carry its identity"
    );
    let status = sut.status(3);
    assert_eq!(status.sources.len(), 1);
    assert!(status.sources[0].followed && status.sources[0].following);
    assert_eq!(status.sources[0].planned_files, 2);

    let mut recovered = following_master();
    for entry in journal {
        recovered.replay(entry).expect("replay");
    }
    assert_eq!(recovered.table().position(), sut.table().position());
    assert_eq!(recovered.snapshot(), sut.snapshot());
    // A snapshot carries the added files too: a new AM loads only the planned ones.
    let mut from_snapshot = following_master();
    from_snapshot
        .restore_snapshot(sut.snapshot())
        .expect("restore");
    assert_eq!(from_snapshot.snapshot(), sut.snapshot());
    assert_eq!(from_snapshot.status(3).sources, status.sources);
    for master in [&recovered, &from_snapshot] {
        assert_eq!(master.plan(), sut.plan(), "the added file stays pinned");
    }
}

#[test]
fn stop_ends_following_first_and_the_job_succeeds_once_its_rows_are_consumed() {
    let mut sut = following_master();
    register(&mut sut, 0, 0);
    let commands = consume_all(&mut sut, 0, 1);
    assert!(!has_shutdown(&commands));
    assert_eq!(sut.outcome(), None, "a followed job waits for more data");
    assert_eq!(sut.phase(), JobPhase::Running);
    sut.add_splits(
        0,
        None,
        JobPlan::of_splits(0, vec![planned_split("part-1", 7)]),
    );
    let stop = sut.stop("sluice stop".to_owned());
    assert!(matches!(stop.entries[..], [Entry::FollowEnded { .. }]));
    assert_eq!(stop.reply, JobPhase::Running, "planned rows remain");
    assert!(sut.follow_target(0).is_none());
    consume_all(&mut sut, 0, 2);
    assert_eq!(sut.outcome(), Some(JobPhase::Succeeded));
    assert_eq!(sut.rows_consumed_total(), 32);
    let status = sut.status(3);
    assert_eq!(
        status.sources[0].follow_ended.as_deref(),
        Some("sluice stop")
    );
}

#[test]
fn a_second_stop_stops_a_job_that_no_longer_follows() {
    let mut sut = following_master();
    register(&mut sut, 0, 0);
    sut.stop("first".to_owned());
    let stop = sut.stop("second".to_owned());
    assert!(matches!(stop.entries[..], [Entry::StopRequested { .. }]));
    assert_eq!(stop.reply, JobPhase::Stopping);
}

/// The rows consumed over the job, as the status reports them.
fn rows_consumed(sut: &Master) -> u64 {
    sut.status(0).tasks.expect("task counts").rows_consumed
}

/// Node 0, then node 1, give their rings back and register again; returns each one's new ranks.
fn give_rings_back(sut: &mut Master, now_ms: u64, journal: &mut Vec<Entry>) -> Vec<Vec<u32>> {
    let commands = heartbeat(sut, 0, now_ms, &[]);
    assert!(has_release(&commands), "{commands:?}");
    let first = register_holding_nothing(sut, 0, now_ms + 1, journal);
    assert!(first.ranks.is_empty(), "node 1 still feeds its rings");
    assert!(has_release(&heartbeat(sut, 1, now_ms + 2, &[])));
    let node_1 = register_holding_nothing(sut, 1, now_ms + 3, journal);
    assert!(has_release(&heartbeat(sut, 0, now_ms + 4, &[])));
    let node_0 = register_holding_nothing(sut, 0, now_ms + 5, journal);
    vec![node_0.ranks, node_1.ranks]
}

#[test]
fn a_live_restore_stops_the_trainers_takes_the_rings_back_and_relaunches_them() {
    let mut journal = Vec::new();
    let mut sut = launching_master(&mut journal);
    let applied = acquire_applied(&mut sut, 0, 1, 1);
    let task = assigned(&applied.reply)[0].clone();
    journal.extend(applied.entries);
    let applied = heartbeat_applied(&mut sut, 0, 2, &[(task.task_id, 6, 2)]);
    journal.extend(applied.entries);
    let checkpoint = sut.table().position();
    let token = "unit-step3-0".to_owned();
    // The trainers read on past the checkpoint before one of them is relaunched and restores it.
    journal.extend(heartbeat_entries(&mut sut, 0, 3));
    consume(&mut sut, 0, 3, &task, 8);
    assert_eq!(rows_consumed(&sut), 8);

    let restored = sut
        .restore(token.clone(), checkpoint.clone(), 4, None)
        .expect("restore");
    assert_eq!(restored.reply.effect, RestoreEffect::TrainersRestart);
    assert_eq!(restored.entries.len(), 1, "the restore is journaled");
    journal.extend(restored.entries);
    assert_eq!(rows_consumed(&sut), 2, "back at the checkpoint");
    let retiring: Vec<ExecutorId> = sut
        .executors()
        .expect("executors")
        .retiring()
        .cloned()
        .collect();
    assert_eq!(retiring, (0..4).map(trainer).collect::<Vec<_>>());
    assert!(trainers_to_launch(&sut).is_empty());
    assert!(
        assigned(&acquire(&mut sut, 1, 5, 8)).is_empty(),
        "no task is handed out while the trainers stop"
    );
    // A trainer still reading before its stop: its counts are of the rings given back.
    let commands = heartbeat(&mut sut, 0, 5, &[(task.task_id, 10, 10)]);
    assert!(!has_release(&commands), "trainers may still read the rings");
    assert_eq!(
        rows_consumed(&sut),
        2,
        "rows read after the reset do not count"
    );
    for rank in 0..4 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    assert_eq!(
        sut.status(6).roles[0].failures,
        0,
        "stopped trainers did not fail"
    );

    let ranks = give_rings_back(&mut sut, 7, &mut journal);
    assert_eq!(ranks, vec![vec![0, 1], vec![2, 3]], "the same ranks again");
    assert!(!sut.scaling());
    assert_eq!(
        trainers_to_launch(&sut),
        (0..4).map(trainer).collect::<Vec<_>>()
    );
    assert!(
        (0..4).all(|rank| sut.restored_to(&trainer(rank)) == Some(token.as_str())),
        "each trainer the restore launches again is told the checkpoint"
    );

    // Each relaunched trainer loads the same checkpoint: nothing changes.
    for rank in 0..4 {
        sut.executor_launched(trainer(rank));
        assert_eq!(
            sut.restored_to(&trainer(rank)),
            None,
            "a trainer launched again after this one ended is not told"
        );
        let again = sut
            .restore(token.clone(), checkpoint.clone(), 13, None)
            .expect("the same checkpoint");
        assert!(again.entries.is_empty(), "rank {rank}: nothing to journal");
        assert_eq!(again.reply.effect, RestoreEffect::AlreadyThere);
    }
    assert_eq!(
        sut.executors().expect("executors").retiring().count(),
        0,
        "no trainer is stopped again"
    );
    let error = sut
        .restore("unit-step9-0".into(), checkpoint.clone(), 14, None)
        .expect_err("another checkpoint");
    let message = error.to_string();
    assert!(
        message.contains("unit-step3-0") && message.contains("unit-step9-0"),
        "{message}"
    );
    let resumed = assigned(&acquire(&mut sut, 0, 15, 8));
    let resumed = resumed
        .iter()
        .find(|assignment| assignment.task_id == task.task_id)
        .expect("the task is handed out again");
    assert_eq!(resumed.start, task.start + 2, "from the checkpoint's count");

    let mut replayed = replayed_from(journal);
    assert!(!replayed.scaling());
    assert_eq!(
        trainers_to_launch(&replayed),
        (0..4).map(trainer).collect::<Vec<_>>()
    );
    let again = replayed
        .restore(token, checkpoint, 16, None)
        .expect("the same checkpoint after a replay");
    assert!(
        again.entries.is_empty(),
        "the replayed AM remembers the checkpoint it was restored to"
    );

    // Once a row is consumed, the same checkpoint restores again.
    consume(&mut sut, 0, 16, resumed, 1);
    let restored = sut
        .restore("unit-step3-0".into(), sut.table().position(), 17, None)
        .expect("restore again");
    assert_eq!(restored.entries.len(), 1);
    assert!(sut.scaling());
}

#[test]
fn resuming_from_a_checkpoint_relaunches_the_trainers_at_the_spec_sizes_and_replays_the_same() {
    let mut journal = Vec::new();
    let mut sut = launching_master(&mut journal);
    let checkpoint = sut.table().position();
    // The job runs at two trainers when it is resumed with the spec's four.
    journal.extend(sut.scale("worker", 2).expect("scale").entries);
    for rank in 0..4 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    give_rings_back(&mut sut, 1, &mut journal);
    assert_eq!(
        trainers_to_launch(&sut),
        (0..2).map(trainer).collect::<Vec<_>>()
    );

    let resumed = sut
        .resume_from("unit-step3-0".to_owned(), checkpoint, 10)
        .expect("resume");
    assert!(matches!(resumed.entries[..], [Entry::ResumedFrom { .. }]));
    journal.extend(resumed.entries);
    assert!(
        sut.scaling(),
        "the rings go back before the trainers launch"
    );
    let ranks = give_rings_back(&mut sut, 11, &mut journal);
    assert_eq!(ranks, vec![vec![0, 1], vec![2, 3]], "four ranks again");
    assert_eq!(
        trainers_to_launch(&sut),
        (0..4).map(trainer).collect::<Vec<_>>()
    );
    assert!(
        (0..4).all(|rank| sut.restored_to(&trainer(rank)) == Some("unit-step3-0")),
        "the trainers are told the checkpoint they start from"
    );
    assert_eq!(replayed_from(journal).snapshot(), sut.snapshot());
}

#[test]
fn a_restore_to_a_checkpoint_taken_before_a_node_registered_takes_that_nodes_rings_back_too() {
    let mut journal = Vec::new();
    let mut sut = master();
    sut.launch_executors();
    for LaunchAction::Launch(id) in sut.executors_to_launch() {
        journal.extend(sut.executor_launched(id).entries);
    }
    journal.extend(register(&mut sut, 0, 0).entries);
    let checkpoint = sut.table().position();
    // Node 1 registers after the step and its trainers read a task.
    journal.extend(register(&mut sut, 1, 1).entries);
    let applied = acquire_applied(&mut sut, 1, 2, 1);
    let task = assigned(&applied.reply)[0].clone();
    journal.extend(applied.entries);
    consume(&mut sut, 1, 3, &task, 4);

    let restored = sut
        .restore("unit-step1-0".into(), checkpoint, 4, None)
        .expect("restore");
    journal.extend(restored.entries);
    for rank in 0..4 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    assert!(
        has_release(&heartbeat(&mut sut, 1, 5, &[(task.task_id, 6, 4)])),
        "node 1 holds rings of the trainers that restart: it gives them back"
    );
    let ranks = give_rings_back(&mut sut, 6, &mut journal);
    assert_eq!(ranks, vec![vec![0, 1], vec![2, 3]]);
    let applied = acquire_applied(&mut sut, 0, 12, 8);
    journal.extend(applied.entries);
    let resumed = assigned(&applied.reply);
    let resumed = resumed
        .iter()
        .find(|assignment| assignment.task_id == task.task_id)
        .expect("the task is handed out again");
    assert_eq!(
        resumed.start, task.start,
        "no row of it was consumed at the step"
    );
    assert_eq!(replayed_from(journal).snapshot(), sut.snapshot());
}

#[test]
fn an_am_taking_a_job_over_mid_restore_carries_on_where_it_stood() {
    let mut journal = Vec::new();
    let mut sut = launching_master(&mut journal);
    let checkpoint = sut.table().position();
    let applied = acquire_applied(&mut sut, 1, 1, 2);
    journal.extend(applied.entries);
    let restored = sut
        .restore("unit-step0-0".into(), checkpoint.clone(), 2, None)
        .expect("restore");
    journal.extend(restored.entries);
    for rank in 0..2 {
        journal.extend(sut.executor_exited(trainer(rank), Exit::Killed).entries);
    }
    let snapshot = sut.snapshot();

    let mut replayed = replayed_from(journal);
    let mut from_snapshot = restored_from(snapshot);
    for taken_over in [&mut replayed, &mut from_snapshot] {
        assert!(taken_over.scaling());
        assert_eq!(taken_over.table().in_flight_count(), 0, "the reset table");
        let again = taken_over
            .restore("unit-step0-0".into(), checkpoint.clone(), 3, None)
            .expect("a relaunched trainer's call mid-restore");
        assert!(again.entries.is_empty());
        assert_eq!(
            again.reply.effect,
            RestoreEffect::TrainersRestart,
            "the caller is being stopped"
        );
        let retiring: Vec<ExecutorId> = taken_over
            .executors()
            .expect("executors")
            .retiring()
            .cloned()
            .collect();
        assert_eq!(retiring, vec![trainer(2), trainer(3)]);
        assert!(!has_release(&heartbeat(taken_over, 0, 4, &[])));
        taken_over.executor_exited(trainer(2), Exit::Killed);
        taken_over.executor_exited(trainer(3), Exit::Killed);
        assert!(assigned(&acquire(taken_over, 1, 5, 4)).is_empty());
        let ranks = give_rings_back(taken_over, 6, &mut Vec::new());
        assert_eq!(ranks, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(trainers_to_launch(taken_over).len(), 4);
        assert_eq!(assigned(&acquire(taken_over, 1, 12, 2)).len(), 2);
    }
}

#[test]
fn the_status_never_shows_a_source_s_storage_options() {
    const SECRET: &str = "wJalrXUtnFEMI-not-a-real-key";
    let text = SPEC.replace(
        r#"format: parquet }"#,
        &format!(r#"format: parquet, storage_options: {{ aws_secret_access_key: "{SECRET}" }} }}"#),
    );
    assert!(text.contains(SECRET), "the spec carries the secret");
    let spec = Arc::new(JobSpec::parse(&text, Format::Yaml).expect("valid spec"));
    let mut sut = Master::new(spec, master().plan.clone()).expect("a master");
    // A daemon that authenticated gets the options it needs to read the source.
    let registered = register(&mut sut, 0, 0).reply;
    let data = registered.data.expect("job data");
    assert_eq!(
        data.sources[0].storage_options["aws_secret_access_key"],
        SECRET
    );
    // The status, its JSON and the task table never show them.
    let status = sut.status(1);
    let shown = format!(
        "{:?}{}{}",
        status,
        crate::status::status_json(&status),
        serde_json::to_string(&sut.task_table()).expect("task table JSON")
    );
    assert!(!shown.contains(SECRET), "{shown}");
}

#[test]
fn a_trainer_that_holds_its_ring_unread_past_the_bound_hangs_until_it_reads_again() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let ring = |idle_ms: u64, interval_ms: u64| v1::RingStats {
        rank: 1,
        used_bytes: 4096,
        capacity_bytes: 1 << 20,
        reader_idle_ms: idle_ms,
        reader_interval_ms: interval_ms,
        ..v1::RingStats::default()
    };
    let report = |sut: &mut Master, now_ms: u64, stats: v1::RingStats| {
        let applied = sut.heartbeat(
            wire::heartbeat(v1::HeartbeatRequest {
                node_id: 0,
                rings: vec![stats],
                ..v1::HeartbeatRequest::default()
            }),
            now_ms,
        );
        on_the_wire(sut, applied);
    };
    // The default bound: 300 s, or 10 times the recent time between reads when that is more.
    report(&mut sut, 100, ring(299_999, 1_000));
    assert!(sut.hangs(100).is_empty(), "under the floor");
    report(&mut sut, 200, ring(300_000, 1_000));
    let hangs = sut.hangs(200);
    assert_eq!(hangs.len(), 1);
    assert_eq!(
        (
            hangs[0].node_id,
            hangs[0].rank,
            hangs[0].stuck_ms,
            hangs[0].bound_ms
        ),
        (0, 1, 300_000, 300_000)
    );
    assert_eq!(
        (hangs[0].action.as_str(), hangs[0].kind.as_str()),
        ("warn", "trainer")
    );
    report(&mut sut, 300, ring(350_000, 40_000));
    assert!(
        sut.hangs(300).is_empty(),
        "a slow trainer's bound is 10 times its pace"
    );
    report(&mut sut, 400, ring(0, 40_000));
    assert!(sut.hangs(400).is_empty(), "reading again");

    // A task whose source read makes no progress: the ring's feeder waits for it past `after_s`.
    let waiting = |wait_ms: u64| v1::RingStats {
        source_wait_ms: wait_ms,
        source_task_id: 7,
        ..ring(0, 40_000)
    };
    report(&mut sut, 500, waiting(299_999));
    assert!(sut.hangs(500).is_empty(), "under the floor");
    report(&mut sut, 600, waiting(300_000));
    let hangs = sut.hangs(600);
    assert_eq!(
        hangs
            .iter()
            .map(|hang| (
                hang.kind.as_str(),
                hang.task_id,
                hang.rank,
                hang.stuck_ms,
                hang.bound_ms
            ))
            .collect::<Vec<_>>(),
        vec![("task", 7, 1, 300_000, 300_000)]
    );
    report(&mut sut, 700, waiting(0));
    assert!(sut.hangs(700).is_empty(), "the batch came");
}

#[test]
fn a_daemon_silent_past_the_bound_hangs_until_it_calls_again() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    // The bound: 300 s, or 10 heartbeat intervals when that is more.
    assert!(sut.hangs(299_999).is_empty());
    let hangs = sut.hangs(300_000);
    assert_eq!(hangs.len(), 1);
    assert_eq!(
        (
            hangs[0].kind.as_str(),
            hangs[0].node_id,
            hangs[0].stuck_ms,
            hangs[0].bound_ms
        ),
        ("daemon", 0, 300_000, 300_000)
    );
    heartbeat(&mut sut, 0, 300_000, &[]);
    assert!(sut.hangs(300_001).is_empty(), "heard from again");
}

#[test]
fn the_node_of_a_rank_is_the_node_that_feeds_it() {
    for world in 1..=13u32 {
        for nodes in 1..=5u32 {
            let sizes = [world];
            let mut fed = 0;
            for node in 0..u64::from(nodes) {
                for rank in ranks_over(&sizes, nodes, NodeId(node)) {
                    assert_eq!(
                        node_over(rank, world, nodes),
                        NodeId(node),
                        "rank {rank} of {world} over {nodes} nodes"
                    );
                    fed += 1;
                }
            }
            assert_eq!(fed, world, "every rank has a node");
        }
    }
}

#[test]
fn stored_checkpoints_past_keep_are_pruned_oldest_first_and_replay_prunes_the_same() {
    let text = format!("{SPEC}checkpoint: {{ uri: \"file:///tmp/unit-checkpoints\", keep: 2 }}\n");
    let spec = Arc::new(JobSpec::parse(&text, Format::Yaml).expect("valid spec"));
    let plan = Arc::new(master().plan().clone());
    let mut sut = Master::new(spec.clone(), plan.clone()).expect("master");
    let mut journal = Vec::new();
    let mut pruned = Vec::new();
    for (step, token) in [(1, "a"), (2, "b"), (3, "c"), (5, "e"), (4, "d")] {
        let applied = sut.checkpoint_stored(step, token.to_owned());
        pruned.push(applied.reply);
        journal.extend(applied.entries);
    }
    assert_eq!(
        pruned,
        [
            Vec::<String>::new(),
            Vec::new(),
            vec!["a".to_owned()],
            vec!["b".to_owned()],
            vec!["c".to_owned()],
        ],
        "the newest two by step are kept"
    );
    let mut replayed = Master::new(spec, plan).expect("master");
    for entry in journal {
        replayed.replay(entry).expect("replay");
    }
    assert_eq!(replayed.snapshot(), sut.snapshot());

    // The checkpoint the job was restored to stays, besides the newest two; the one of a later
    // step belongs to the run the restore left, and is forgotten at once.
    let position = sut.table().position();
    let restored = sut
        .restore("d".to_owned(), position, 1, None)
        .expect("restore");
    assert_eq!(restored.reply.forgotten, ["e"]);
    let pruned: Vec<Vec<String>> = [(6, "f"), (7, "g")]
        .into_iter()
        .map(|(step, token)| sut.checkpoint_stored(step, token.to_owned()).reply)
        .collect();
    assert_eq!(pruned, [Vec::<String>::new(), Vec::new()]);
    assert_eq!(
        sut.snapshot().core.stored.into_values().collect::<Vec<_>>(),
        ["d", "f", "g"]
    );
}

#[test]
fn a_role_on_kubernetes_is_not_scaled_in_place() {
    let text = format!("{SPEC}launcher: {{ kind: kubernetes, image: train }}\n");
    let spec = Arc::new(JobSpec::parse(&text, Format::Yaml).expect("valid spec"));
    let mut sut = Master::new(spec, Arc::new(master().plan().clone())).expect("master");
    sut.launch_executors();
    let error = sut.scale("worker", 6).expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("change `roles[].num` in the spec"),
        "{error}"
    );
}

/// [`SPEC`] with `data.on_bad_data: skip` and a budget of a fifth of the 40 rows: 8.
fn skipping_master() -> Master {
    master_of(&SPEC.replace(
        "  shuffle: { seed: 3 }\n",
        "  shuffle: { seed: 3 }\n  on_bad_data: skip\n  max_bad_fraction: 0.2\n",
    ))
}

/// A heartbeat of `node` with the counts of `task` and the rows of it skipped from `first_row`.
fn heartbeat_with_skip(
    sut: &mut Master,
    node: u64,
    now_ms: u64,
    task: &v1::TaskAssignment,
    first_row: u64,
    row_count: u64,
) -> Applied<Vec<NodeCommand>> {
    sut.heartbeat(
        wire::heartbeat(v1::HeartbeatRequest {
            node_id: node,
            progress: vec![v1::TaskProgress {
                task_id: task.task_id,
                enqueued: 0,
                consumed: 0,
                bad: vec![v1::BadRange {
                    uri: task.split.as_ref().expect("a split").uri.clone(),
                    row_group: Some(0),
                    first_row,
                    row_count,
                    cause: "invalid page header".into(),
                }],
                sent: 0,
                dropped: Vec::new(),
            }],
            ..v1::HeartbeatRequest::default()
        }),
        now_ms,
    )
}

#[test]
fn skipped_bad_data_is_counted_once_kept_across_takeover_and_fails_the_job_past_its_budget() {
    let mut sut = skipping_master();
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    let applied = acquire_applied(&mut sut, 0, 10, 2);
    journal.extend(applied.entries);
    let tasks = assigned(&applied.reply);
    let task = &tasks[0];

    for now_ms in [100, 200] {
        let applied = heartbeat_with_skip(&mut sut, 0, now_ms, task, task.start + 2, 3);
        let skips = applied
            .entries
            .iter()
            .filter(|entry| matches!(entry, Entry::BadDataSkipped { .. }))
            .count();
        assert_eq!(
            skips,
            usize::from(now_ms == 100),
            "a skip reported again is journaled once"
        );
        journal.extend(applied.entries);
    }
    let status = sut.status(300);
    assert_eq!((status.bad_rows, status.bad_ranges), (3, 1));
    let [listed] = status.bad_data.as_slice() else {
        panic!("one skip listed: {:?}", status.bad_data);
    };
    assert_eq!(
        (listed.epoch, listed.row_group, listed.rows),
        (0, Some(0), 3)
    );
    assert!(listed.uri.ends_with(".parquet") && listed.cause == "invalid page header");
    assert_eq!(status.state, v1::JobState::Running as i32);

    // A new AM knows the skip from the journal, or from a snapshot, old encodings included.
    let mut replayed = skipping_master();
    for entry in journal.clone() {
        replayed.replay(entry).expect("replay");
    }
    assert_eq!(replayed.status(300).bad_rows, 3);
    let encoded = postcard::to_stdvec(&sut.snapshot()).expect("a snapshot encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&encoded).expect("decodes");
    let mut restored = skipping_master();
    restored.restore_snapshot(decoded).expect("restore");
    assert_eq!(restored.status(300).bad_data, status.bad_data);
    let older = postcard::to_stdvec(&sut.snapshot().core).expect("the core encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&older).expect("decodes");
    assert_eq!(decoded.core, sut.snapshot().core);
    assert_eq!(decoded.bad_data, BadDataLog::default());

    // A skip outside its task's split is refused, whatever its rows.
    for (first_row, row_count) in [(u64::MAX, 2), (0, u64::MAX), (task.start, 0), (1_000, 1)] {
        let applied = heartbeat_with_skip(&mut sut, 0, 300, task, first_row, row_count);
        assert!(
            !applied
                .entries
                .iter()
                .any(|entry| matches!(entry, Entry::BadDataSkipped { .. })),
            "[{first_row}, +{row_count}) is refused"
        );
    }
    assert_eq!(sut.status(300).bad_rows, 3);

    // Six more rows make nine of the 40, past the budget of 8: the job fails, naming the last skip.
    let applied = heartbeat_with_skip(&mut sut, 0, 400, &tasks[1], 0, 6);
    assert!(
        applied
            .entries
            .iter()
            .any(|entry| matches!(entry, Entry::Event(Event::Failed { .. }))),
        "the failure is journaled"
    );
    let status = sut.status(500);
    assert_eq!(status.state, v1::JobState::Failed as i32);
    let reason = status.failure_reason.expect("a reason");
    assert!(
        reason.contains("9 rows skipped as bad data")
            && reason.contains("data.max_bad_fraction (0.2)")
            && reason.contains("row group 0: invalid page header"),
        "{reason}"
    );
}

/// One task for `node`, consumed to its end: the assignment, and the journal entries of both calls.
fn take_and_finish(sut: &mut Master, node: u64, now_ms: u64) -> (v1::TaskAssignment, Vec<Entry>) {
    let applied = acquire_applied(sut, node, now_ms, 1);
    let mut entries = applied.entries;
    let Ok([task]) = <[v1::TaskAssignment; 1]>::try_from(assigned(&applied.reply)) else {
        panic!("one task for node-{node}: {:?}", applied.reply);
    };
    let rows = task.end - task.start;
    entries.extend(heartbeat_applied(sut, node, now_ms + 1, &[(task.task_id, rows, rows)]).entries);
    (task, entries)
}

#[test]
fn a_node_takes_first_the_pending_tasks_of_the_splits_it_read_last_and_a_replay_agrees() {
    let spec = SPEC.replace("  task_rows: 10\n", "  task_rows: 10\n  epochs: 3\n");
    let mut sut = master_of(&spec);
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    journal.extend(register(&mut sut, 1, 0).entries);
    let mut near_choices = 0;
    let mut now_ms = 10;
    // Three epochs of five tasks, the nodes taking one task each in turn.
    for turn in 0..15u64 {
        let node = NodeId(turn % 2);
        let near: Vec<TaskId> = sut
            .table()
            .pending_window()
            .filter(|(_, span)| sut.readers.get(span.split as usize) == Some(&Some(node)))
            .map(|(task, _)| task)
            .collect();
        let (task, entries) = take_and_finish(&mut sut, node.0, now_ms);
        journal.extend(entries);
        now_ms += 10;
        if !near.is_empty() {
            near_choices += 1;
            assert!(
                near.contains(&TaskId(task.task_id)),
                "turn {turn}: node-{} got task-{} of split {}, not one of {near:?}",
                node.0,
                task.task_id,
                task.split_index
            );
        }
    }
    assert!(near_choices >= 5, "locality chose {near_choices} times");
    assert!(
        journal
            .iter()
            .any(|entry| matches!(entry, Entry::Event(Event::AcquireNear { .. }))),
        "the choices are journaled"
    );
    assert_eq!(sut.status(now_ms).state, v1::JobState::Succeeded as i32);

    let mut replayed = master_of(&spec);
    for entry in journal {
        replayed.replay(entry).expect("replay");
    }
    assert_eq!(replayed.table().position(), sut.table().position());
    assert_eq!(replayed.readers, sut.readers);
}

/// A source to add to the job of [`master`], with its one split of 12 rows.
fn added_source() -> (String, SourceSpec, JobPlan) {
    let text = r#"{ "uri": "file:///data/more", "format": "parquet" }"#.to_owned();
    let spec = SourceSpec::parse_added(&text, 1).expect("valid source");
    let block = JobPlan::of_splits(0, vec![planned_split("more-0", 12)]);
    (text, spec, block)
}

#[test]
fn an_added_source_joins_the_epoch_its_daemons_learn_it_and_it_replays() {
    let mut sut = master();
    let mut journal = Vec::new();
    journal.extend(register(&mut sut, 0, 0).entries);
    let first = assigned(&acquire(&mut sut, 0, 1, 1));
    let (text, spec, block) = added_source();
    let added = sut
        .add_source(text.clone(), spec, None, block)
        .expect("added to a running job");
    assert_eq!(
        added.reply,
        SourceAdded {
            index: 1,
            files: 1,
            splits: 1,
            rows: 12,
            epoch: 0
        }
    );
    assert!(matches!(added.entries[..], [Entry::SourceAdded { .. }]));
    journal.extend(added.entries);
    let applied = acquire_applied(&mut sut, 0, 2, 100);
    journal.extend(applied.entries);
    let rest = assigned(&applied.reply);
    assert_eq!(first.len() + rest.len(), 7, "5 planned tasks and 2 added");
    let of_added: Vec<&v1::TaskAssignment> = rest
        .iter()
        .filter(|task| {
            task.split
                .as_ref()
                .is_some_and(|split| split.source_index == 1)
        })
        .collect();
    assert_eq!(of_added.len(), 2, "{rest:?}");
    // A daemon that registered before the add learns the source with its tasks.
    let told: Vec<v1::AddedSource> = applied
        .reply
        .iter()
        .filter_map(|command| match &command.command {
            Some(Cmd::Assign(assign)) => Some(assign.sources.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let [told] = told.as_slice() else {
        panic!("one added source told: {told:?}");
    };
    assert_eq!(told.index, 1);
    assert_eq!(
        told.data.as_ref().map(|data| data.uri.as_str()),
        Some("file:///data/more")
    );
    // One that registers after learns it from the job's data.
    let registered = register(&mut sut, 1, 3);
    journal.extend(registered.entries);
    let sources = registered
        .reply
        .data
        .map(|data| data.sources)
        .unwrap_or_default();
    assert_eq!(sources.len(), 2);
    assert_eq!(sut.status(3).sources[1].planned_files, 1);

    let mut recovered = master();
    for entry in journal {
        recovered.replay(entry).expect("replay");
    }
    assert_eq!(recovered.table().position(), sut.table().position());
    assert_eq!(recovered.spec(), sut.spec());
    assert_eq!(recovered.plan(), sut.plan());
    assert_eq!(recovered.added_sources(), sut.added_sources());
    // From a snapshot, this release's encoding or the one before added sources.
    let encoded = postcard::to_stdvec(&sut.snapshot()).expect("a snapshot encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&encoded).expect("decodes");
    let mut from_snapshot = master();
    from_snapshot.restore_snapshot(decoded).expect("restore");
    assert_eq!(from_snapshot.snapshot(), sut.snapshot());
    assert_eq!(from_snapshot.spec(), sut.spec());
    assert_eq!(from_snapshot.plan(), sut.plan());
    let snapshot = sut.snapshot();
    let older = postcard::to_stdvec(&(&snapshot.core, &snapshot.bad_data)).expect("encodes");
    let decoded = <Snapshot as crate::journal::SnapshotFormat>::decode(&older).expect("decodes");
    assert_eq!(decoded.core, snapshot.core);
    assert!(decoded.added_sources.is_empty());
    // A snapshot taken over twice keeps the sources once.
    from_snapshot
        .restore_snapshot(sut.snapshot())
        .expect("restore");
    assert_eq!(from_snapshot.spec(), sut.spec());
}

#[test]
fn a_source_is_refused_once_the_job_stops_or_past_the_tables_limits() {
    let mut sut = master();
    register(&mut sut, 0, 0);
    let (text, spec, _) = added_source();
    let huge = JobPlan::of_splits(0, vec![planned_split("more-0", u64::MAX / 2)]);
    let error = sut
        .add_source(text.clone(), spec.clone(), None, huge)
        .expect_err("past the limits");
    assert!(error.to_string().contains("data.task_rows"), "{error}");
    assert_eq!(sut.spec().data.sources.len(), 1, "nothing was added");
    sut.stop("enough".to_owned());
    let (_, _, block) = added_source();
    let error = sut
        .add_source(text, spec, None, block)
        .expect_err("the job stops");
    assert!(error.to_string().contains("stopping (enough)"), "{error}");
}

/// Two sources mixed 3 to 1: source 0 of splits of 25 and 15 rows ends each epoch, source 1's
/// split of 8 rows is passed through again within one; tasks of 10 rows, three epochs.
fn mixed_master() -> Master {
    mixed_master_of(
        "{ uri: \"file:///data/train\", format: parquet, weight: 3 }",
        "{ uri: \"file:///data/more\", format: parquet, weight: 1, on_exhausted: next_pass }",
    )
}

/// A master over the splits of [`mixed_master`], its two sources as given.
fn mixed_master_of(first: &str, second: &str) -> Master {
    let spec = SPEC.replace(
        r#"  sources: [{ uri: "file:///data/train", format: parquet }]"#,
        &format!("  sources:\n    - {first}\n    - {second}\n  epochs: 3"),
    );
    let spec = Arc::new(JobSpec::parse(&spec, Format::Yaml).expect("valid spec"));
    let mut plan = JobPlan::default();
    plan.extend(
        0,
        vec![planned_split("part-0", 25), planned_split("part-1", 15)],
    );
    plan.extend(1, vec![planned_split("more-0", 8)]);
    Master::new(spec, Arc::new(plan)).expect("the splits have rows")
}

/// Every rank of the four commits `step` of `epoch`, rank 0 with `positions` and the others with
/// none; the checkpoint they make.
fn commit_every_rank(
    sut: &mut Master,
    step: u64,
    epoch: u32,
    positions: Vec<(TaskId, u64)>,
) -> ReadyCheckpoint {
    let mut ready = None;
    for rank in 0..4 {
        let applied = sut
            .commit_checkpoint(RankCommit {
                step,
                rank,
                world_size: 4,
                epoch,
                positions: if rank == 0 {
                    positions.clone()
                } else {
                    Vec::new()
                },
            })
            .expect("a position inside the epoch's tasks");
        if let CommitOutcome::Ready(checkpoint) = applied.reply {
            ready = Some(checkpoint);
        }
    }
    ready.expect("every rank committed")
}

/// Takes every task of the current epoch one by one and consumes it whole; the tasks taken.
fn consume_epoch(sut: &mut Master, now_ms: u64) -> Vec<(u32, u64, u64)> {
    let epoch = sut.table().epoch();
    let mut taken = Vec::new();
    while sut.table().epoch() == epoch && sut.phase() == JobPhase::Running {
        let tasks = assigned(&acquire(sut, 0, now_ms, 1));
        let [task] = &tasks[..] else {
            panic!("one task at a time: {tasks:?}");
        };
        taken.push((task.split_index, task.start, task.end));
        consume(sut, 0, now_ms, task, task.end - task.start);
    }
    taken
}

#[test]
fn a_mixed_job_draws_its_epochs_by_weight_and_a_checkpoint_restores_exactly_the_rest() {
    let mut straight = mixed_master();
    register(&mut straight, 0, 0);
    let epochs: Vec<Vec<(u32, u64, u64)>> =
        (0..3).map(|_| consume_epoch(&mut straight, 1)).collect();
    assert_eq!(straight.phase(), JobPhase::Succeeded);
    let rows = |tasks: &[(u32, u64, u64)], source: fn(u32) -> bool| -> u64 {
        tasks
            .iter()
            .filter(|(split, _, _)| source(*split))
            .map(|(_, start, end)| end - start)
            .sum()
    };
    for tasks in &epochs {
        // Source 0 (splits 0 and 1) ends every epoch: its 40 rows once each. Source 1 (split 2)
        // gets a quarter of the rows drawn, within its one 8-row task, pass after pass.
        assert_eq!(rows(tasks, |split| split < 2), 40, "{tasks:?}");
        let source_1 = rows(tasks, |split| split == 2);
        assert!((8..=24).contains(&source_1), "{tasks:?}");
        assert!(
            tasks
                .iter()
                .filter(|task| task.0 == 2)
                .all(|task| (task.1, task.2) == (0, 8))
        );
    }
    let run = epochs.concat();
    let quarter = (rows(&run, |split| split == 2) + rows(&run, |split| split < 2)) as f64 / 4.0;
    assert!(
        (rows(&run, |split| split == 2) as f64 - quarter).abs() <= 8.0,
        "source 1 gets a quarter of the run's rows, within its one task: {run:?}"
    );

    // The same job, checkpointed in the middle of epoch 1 (a task consumed in part), restored
    // there after running on, and taken over by another AM from a snapshot.
    let mut sut = mixed_master();
    register(&mut sut, 0, 0);
    consume_epoch(&mut sut, 1);
    let tasks = assigned(&acquire(&mut sut, 0, 2, 2));
    let (first, second) = (&tasks[0], &tasks[1]);
    consume(&mut sut, 0, 3, first, first.end - first.start);
    let positions = vec![
        (TaskId(first.task_id), first.end),
        (TaskId(second.task_id), second.start + 1),
    ];
    let ready = commit_every_rank(&mut sut, 7, 1, positions);
    sut.checkpoint_stored(7, ready.token.clone());
    consume(&mut sut, 0, 4, second, second.end - second.start);
    sut.restore(ready.token.clone(), ready.position.clone(), 10, None)
        .expect("restore");
    heartbeat(&mut sut, 0, 11, &[]);
    register(&mut sut, 0, 12);
    let mut sut = {
        let mut taken_over = mixed_master();
        taken_over
            .restore_snapshot(sut.snapshot())
            .expect("snapshot");
        taken_over
    };
    register(&mut sut, 0, 13);
    let rest = consume_epoch(&mut sut, 13);
    // The epoch handed its tasks out in the order drawn: the first two were the checkpoint's.
    let mut expected = epochs[1].clone();
    assert_eq!(
        expected[..2],
        [
            (first.split_index, first.start, first.end),
            (second.split_index, second.start, second.end)
        ]
    );
    expected[1].1 += 1;
    expected.remove(0);
    let mut rest_sorted = rest.clone();
    expected.sort_unstable();
    rest_sorted.sort_unstable();
    assert_eq!(rest_sorted, expected, "the rest of epoch 1, exactly");
    assert_eq!(
        consume_epoch(&mut sut, 14),
        epochs[2],
        "epoch 2 as the job drew it"
    );
    assert_eq!(sut.phase(), JobPhase::Succeeded);
}

#[test]
fn a_re_split_piece_of_a_short_mixed_epoch_is_checkpointed_from_where_it_was_cut() {
    // Source 1's one task of 8 rows ends the epoch, after a task or two of source 0: the epoch has
    // fewer tasks than the splits would be cut into, and a piece takes a slot they would have had.
    let mut sut = mixed_master_of(
        "{ uri: \"file:///data/train\", format: parquet, weight: 1, on_exhausted: next_pass }",
        "{ uri: \"file:///data/more\", format: parquet, weight: 3 }",
    );
    register(&mut sut, 0, 0);
    register(&mut sut, 1, 0);
    let held = assigned(&acquire(&mut sut, 0, 1, 8));
    assert!(held.len() < 5, "a short epoch: {held:?}");
    let counts: Vec<(u64, u64, u64)> = held.iter().map(|task| (task.task_id, 1, 0)).collect();
    heartbeat(&mut sut, 0, 2, &counts);
    acquire(&mut sut, 1, 3, 1);
    let stop = heartbeat(&mut sut, 0, 4, &[])
        .iter()
        .find_map(|command| match &command.command {
            Some(Cmd::Stop(stop)) => Some(*stop),
            _ => None,
        })
        .expect("node 0 is asked to stop a task");
    sut.ack_stop(NodeId(0), TaskId(stop.task_id), stop.row, 5);
    let piece = assigned(&acquire(&mut sut, 1, 6, 1));
    assert_eq!(piece.len(), 1);
    let piece = &piece[0];
    assert_eq!(piece.start, stop.row);
    let ready = commit_every_rank(
        &mut sut,
        1,
        0,
        vec![(TaskId(piece.task_id), piece.start + 1)],
    );
    assert_eq!(
        ready.position.done_rows, 1,
        "one row of the piece, from where it was cut"
    );
}
