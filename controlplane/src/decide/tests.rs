use super::order::epoch_order;
use super::state::TaskSlot;
use super::*;

const NODE_A: NodeId = NodeId(1);
const NODE_B: NodeId = NodeId(2);

fn config() -> DecideConfig {
    DecideConfig {
        seed: 7,
        epochs: 1,
        task_rows: 10,
        max_task_attempts: 3,
        blacklist_after_failures: 3,
        max_total_failures: 100,
        heartbeat_timeout_ms: 1000,
        task_success_percent: 100.0,
        task_failed_percent: 100.0,
        resplit_margin_rows: 2,
        resplit_min_rows: 2,
        follow: false,
        even_batches: false,
    }
}

fn new_state(config: DecideConfig, split_rows: Vec<u64>) -> JobState {
    let state = JobState::new(config, split_rows).expect("splits have rows");
    state.check_invariants().expect("a new table is consistent");
    state
}

/// Runs one event and checks the table's invariants after it.
fn run(state: &mut JobState, event: Event) -> Vec<Action> {
    let actions = decide(state, event);
    if let Err(broken) = state.check_invariants() {
        panic!("invariant broken: {broken}");
    }
    actions
}

fn register(state: &mut JobState, node: NodeId, now_ms: u64) -> Vec<Action> {
    run(
        state,
        Event::Register {
            node,
            now_ms,
            held: Vec::new(),
        },
    )
}

fn acquire(state: &mut JobState, node: NodeId, now_ms: u64, max_tasks: u32) -> Vec<Action> {
    run(
        state,
        Event::Acquire {
            node,
            now_ms,
            max_tasks,
        },
    )
}

/// The tasks handed to `node` in `actions`.
fn assigned(actions: &[Action], node: NodeId) -> Vec<Assignment> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Assign {
                node: target,
                tasks,
            } if *target == node => Some(tasks.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn progress(task: TaskId, enqueued: u64, consumed: u64) -> TaskProgress {
    TaskProgress {
        task,
        enqueued,
        consumed,
    }
}

fn heartbeat(
    state: &mut JobState,
    node: NodeId,
    now_ms: u64,
    counts: &[TaskProgress],
) -> Vec<Action> {
    run(
        state,
        Event::Heartbeat {
            node,
            now_ms,
            progress: counts.to_vec(),
        },
    )
}

fn stop_ack(
    state: &mut JobState,
    node: NodeId,
    now_ms: u64,
    task: TaskId,
    stop_row: u64,
) -> Vec<Action> {
    run(
        state,
        Event::StopAck {
            node,
            now_ms,
            task,
            stop_row,
        },
    )
}

fn report_failed(state: &mut JobState, node: NodeId, task: TaskId, consumed: u64) -> Vec<Action> {
    run(
        state,
        Event::Report {
            node,
            now_ms: 1,
            task,
            consumed,
            outcome: ReportOutcome::Failed {
                reason: "corrupt page".to_owned(),
            },
        },
    )
}

#[test]
fn splits_are_cut_into_tasks_of_task_rows() {
    let sut = new_state(config(), vec![25, 10, 0]);
    let ranges: Vec<(u32, u64, u64)> = sut
        .slots
        .iter()
        .map(|slot| (slot.split, slot.start, slot.end))
        .collect();
    assert_eq!(
        ranges,
        vec![(0, 0, 10), (0, 10, 20), (0, 20, 25), (1, 0, 10)]
    );
    assert_eq!(sut.epoch_rows(), 35);
    assert_eq!(sut.pending_count(), 4);
}

#[test]
fn planning_refuses_data_without_rows_or_with_too_many_tasks() {
    assert_eq!(
        JobState::new(config(), vec![0, 0]).err(),
        Some(PlanError::NoRows { splits: 2 })
    );
    let one_row_tasks = DecideConfig {
        task_rows: 1,
        ..config()
    };
    let error = JobState::new(one_row_tasks, vec![1 << 33]).expect_err("too many tasks");
    assert!(matches!(error, PlanError::TooManyTasks { .. }));
    assert!(error.to_string().contains("raise data.task_rows"));
    // A billion one-row tasks would take the AM tens of GiB: refused, naming a task_rows that fits.
    let error = JobState::new(one_row_tasks, vec![1_000_000_000]).expect_err("a billion tasks");
    assert!(
        error
            .to_string()
            .contains("more than 50000000; raise data.task_rows to 20 or more"),
        "{error}"
    );
}

#[test]
fn tasks_go_out_in_the_seeded_order_of_the_epoch() {
    let mut sut = new_state(config(), vec![40, 20]);
    register(&mut sut, NODE_A, 0);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 10), NODE_A);
    let expected: Vec<u64> = epoch_order(6, 7, 0).into_iter().map(u64::from).collect();
    let got: Vec<u64> = tasks.iter().map(|task| task.task.0).collect();
    assert_eq!(got, expected);
    let slot_of_first = expected[0] as usize;
    let planned = sut.slots[slot_of_first];
    assert_eq!(
        (tasks[0].split, tasks[0].start, tasks[0].end, tasks[0].epoch),
        (planned.split, planned.start, planned.end, 0)
    );
}

#[test]
fn carved_rows_become_tasks_of_their_own_handed_out_first_and_the_rest_keeps_its_place() {
    // Splits of 40 and 20 rows, tasks of 10: split 0's tasks are slots 0 to 3, split 1's 4 and 5.
    let mut sut = new_state(config(), vec![40, 20]);
    register(&mut sut, NODE_A, 0);
    let first = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0];
    let before: Vec<u32> = sut.order.iter_from(sut.cursor).copied().collect();
    let span = |split, start, end| TaskSpan { split, start, end };
    let rows = vec![
        // Across two tasks of split 0, and the middle of a task of split 1.
        span(0, 14, 23),
        span(1, 3, 5),
        // The rows of the task handed out already, and rows of no split: passed over.
        span(first.split, first.start, first.end),
        span(9, 0, 5),
    ];
    run(&mut sut, Event::CarveFront { rows });
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 20), NODE_A);
    let got: Vec<(u32, u64, u64)> = tasks
        .iter()
        .map(|task| (task.split, task.start, task.end))
        .collect();
    // The carved rows first, in the order given, each task's piece on its own.
    let carved: Vec<(u32, u64, u64)> = vec![(0, 14, 20), (0, 20, 23), (1, 3, 5)];
    let carved_here: Vec<(u32, u64, u64)> = carved
        .iter()
        .copied()
        .filter(|(split, start, _)| {
            !(*split == first.split && first.start <= *start && *start < first.end)
        })
        .collect();
    assert_eq!(got[..carved_here.len()], carved_here[..]);
    // The rest in the order before, each cut task's remaining pieces at its place.
    let rest: Vec<(u32, u64, u64)> = before
        .iter()
        .flat_map(|slot| {
            let task = sut.slots[*slot as usize];
            let planned = (task.split, task.start, task.start + 10);
            let pieces: Vec<(u32, u64, u64)> = match planned {
                (0, 10, 20) => vec![(0, 10, 14)],
                (0, 20, 30) => vec![(0, 23, 30)],
                (1, 0, 10) => vec![(1, 0, 3), (1, 5, 10)],
                other => vec![other],
            };
            pieces
        })
        .collect();
    assert_eq!(got[carved_here.len()..], rest[..]);
    // Every row of the epoch but the task handed first is handed out once.
    let mut rows: Vec<(u32, u64)> = tasks
        .iter()
        .flat_map(|task| (task.start..task.end).map(move |row| (task.split, row)))
        .collect();
    rows.sort_unstable();
    let expected: Vec<(u32, u64)> = (0..40)
        .map(|row| (0, row))
        .chain((0..20).map(|row| (1, row)))
        .filter(|(split, row)| !(*split == first.split && first.start <= *row && *row < first.end))
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn acquire_gives_at_most_the_tasks_asked_for() {
    let mut sut = new_state(config(), vec![100]);
    register(&mut sut, NODE_A, 0);
    assert_eq!(assigned(&acquire(&mut sut, NODE_A, 0, 3), NODE_A).len(), 3);
    assert_eq!(sut.in_flight_count(), 3);
    assert_eq!(sut.pending_count(), 7);
}

#[test]
fn events_from_an_unknown_node_are_refused() {
    let mut sut = new_state(config(), vec![10]);
    assert_eq!(
        acquire(&mut sut, NODE_A, 0, 1),
        vec![Action::Refuse {
            node: NODE_A,
            reason: Refusal::UnknownNode
        }]
    );
    assert_eq!(sut.in_flight_count(), 0);
}

#[test]
fn a_task_is_done_when_its_consumed_count_reaches_its_length() {
    let mut sut = new_state(config(), vec![10, 10]);
    register(&mut sut, NODE_A, 0);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 2), NODE_A);
    let actions = heartbeat(
        &mut sut,
        NODE_A,
        1,
        &[
            progress(tasks[0].task, 10, 4),
            progress(tasks[1].task, 10, 10),
        ],
    );
    assert_eq!(
        actions,
        vec![Action::TaskDone {
            task: tasks[1].task
        }]
    );
    assert_eq!(sut.done_rows(), 14);
    assert_eq!(sut.in_flight_count(), 1);
}

#[test]
fn consumed_counts_never_go_back() {
    let mut sut = new_state(config(), vec![10]);
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    heartbeat(&mut sut, NODE_A, 1, &[progress(task, 8, 6)]);
    heartbeat(&mut sut, NODE_A, 2, &[progress(task, 8, 3)]);
    assert_eq!(sut.done_rows(), 6);
}

#[test]
fn impossible_counts_and_foreign_tasks_are_refused() {
    let mut sut = new_state(config(), vec![10, 10]);
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let task_a = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    let actions = heartbeat(&mut sut, NODE_A, 1, &[progress(task_a, 11, 0)]);
    assert!(matches!(
        actions[..],
        [Action::Refuse {
            reason: Refusal::CountOutOfRange { .. },
            ..
        }]
    ));
    let actions = heartbeat(&mut sut, NODE_A, 1, &[progress(task_a, 3, 4)]);
    assert!(matches!(
        actions[..],
        [Action::Refuse {
            reason: Refusal::CountOutOfRange { .. },
            ..
        }]
    ));
    let actions = heartbeat(&mut sut, NODE_B, 1, &[progress(task_a, 3, 3)]);
    assert_eq!(
        actions,
        vec![Action::Refuse {
            node: NODE_B,
            reason: Refusal::NotHeld(task_a)
        }]
    );
    let actions = heartbeat(&mut sut, NODE_B, 1, &[progress(TaskId(99), 0, 0)]);
    assert_eq!(
        actions,
        vec![Action::Refuse {
            node: NODE_B,
            reason: Refusal::UnknownTask(TaskId(99))
        }]
    );
    assert_eq!(sut.done_rows(), 0);
}

#[test]
fn a_task_reported_done_again_changes_nothing_and_is_not_refused() {
    let mut sut = new_state(config(), vec![10, 10]);
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    let actions = heartbeat(&mut sut, NODE_A, 1, &[progress(task, 10, 10)]);
    assert_eq!(actions, vec![Action::TaskDone { task }]);
    let done = sut.done_rows();
    // The daemon keeps reporting the task until it learns that its end is durable; any node's
    // report of a done task is taken as already known.
    for node in [NODE_A, NODE_B] {
        assert_eq!(
            heartbeat(&mut sut, node, 2, &[progress(task, 10, 10)]),
            vec![]
        );
    }
    assert_eq!(sut.done_rows(), done);
}

/// One 100-row task on node A, which has enqueued 10 and consumed 5; B is idle.
fn straggler() -> (JobState, Assignment) {
    let mut sut = new_state(
        DecideConfig {
            task_rows: 100,
            ..config()
        },
        vec![100],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0];
    heartbeat(&mut sut, NODE_A, 1, &[progress(task.task, 10, 5)]);
    (sut, task)
}

#[test]
fn an_idle_node_makes_the_am_ask_a_straggler_to_stop_early() {
    let (mut sut, task) = straggler();
    let actions = acquire(&mut sut, NODE_B, 2, 1);
    // Unread past enqueued: 90; margin 2; the holder keeps 2 + 88 / 2 = 46 more rows.
    assert_eq!(
        actions,
        vec![Action::StopAt {
            node: NODE_A,
            task: task.task,
            row: 56
        }]
    );
    // Nothing is handed out before the holder acknowledges.
    assert_eq!(sut.pending_count(), 0);
    assert_eq!(acquire(&mut sut, NODE_B, 2, 1), Vec::new());
}

#[test]
fn the_rest_of_a_task_is_handed_out_only_after_the_holder_acknowledges() {
    let (mut sut, task) = straggler();
    acquire(&mut sut, NODE_B, 2, 1);
    // A had enqueued past the requested row meanwhile, so it stops at 60.
    let actions = stop_ack(&mut sut, NODE_A, 3, task.task, 60);
    let child = TaskId(1);
    assert_eq!(
        actions,
        vec![Action::TaskSplit {
            parent: task.task,
            child,
            at_row: 60
        }]
    );
    let tasks = assigned(&acquire(&mut sut, NODE_B, 3, 1), NODE_B);
    assert_eq!(
        tasks,
        vec![Assignment {
            task: child,
            epoch: 0,
            split: 0,
            start: 60,
            end: 100
        }]
    );
    let actions = heartbeat(&mut sut, NODE_A, 4, &[progress(task.task, 60, 60)]);
    assert_eq!(actions, vec![Action::TaskDone { task: task.task }]);
    let actions = heartbeat(&mut sut, NODE_B, 4, &[progress(child, 40, 40)]);
    assert_eq!(
        actions,
        vec![
            Action::TaskDone { task: child },
            Action::JobFinished {
                outcome: JobOutcome::Succeeded
            }
        ]
    );
}

#[test]
fn stop_acknowledgements_are_checked() {
    let (mut sut, task) = straggler();
    assert_eq!(
        stop_ack(&mut sut, NODE_A, 3, task.task, 50),
        vec![Action::Refuse {
            node: NODE_A,
            reason: Refusal::NoStopRequested(task.task)
        }]
    );
    acquire(&mut sut, NODE_B, 2, 1);
    let below_enqueued = stop_ack(&mut sut, NODE_A, 3, task.task, 9);
    assert!(matches!(
        below_enqueued[..],
        [Action::Refuse {
            reason: Refusal::StopRowOutOfRange {
                min: 10,
                max: 100,
                ..
            },
            ..
        }]
    ));
    let past_end = stop_ack(&mut sut, NODE_A, 3, task.task, 101);
    assert!(matches!(
        past_end[..],
        [Action::Refuse {
            reason: Refusal::StopRowOutOfRange { .. },
            ..
        }]
    ));
    // A holder that already enqueued everything stops at the end: nothing is cut off.
    assert_eq!(stop_ack(&mut sut, NODE_A, 3, task.task, 100), Vec::new());
    assert_eq!(sut.task_count(), 1);
    assert_eq!(sut.pending_count(), 0);
}

#[test]
fn no_resplit_for_a_busy_node_or_a_small_remainder() {
    let (mut sut, task) = straggler();
    // A busy node asking for more triggers nothing.
    assert_eq!(acquire(&mut sut, NODE_A, 2, 1), Vec::new());
    // Only 3 rows remain past enqueued: margin 2 leaves 1, below resplit_min_rows.
    heartbeat(&mut sut, NODE_A, 2, &[progress(task.task, 97, 90)]);
    assert_eq!(acquire(&mut sut, NODE_B, 2, 1), Vec::new());
}

/// One split of 100 rows, one task, with `even_batches` (no margin, pieces down to one row).
fn even_state() -> JobState {
    new_state(
        DecideConfig {
            task_rows: 100,
            even_batches: true,
            resplit_margin_rows: 0,
            resplit_min_rows: 1,
            ..config()
        },
        vec![100],
    )
}

#[test]
fn with_even_batches_a_busy_node_re_splits_the_tail_down_to_one_row_and_its_own_tasks_too() {
    let mut sut = even_state();
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0];
    heartbeat(&mut sut, NODE_A, 1, &[progress(task.task, 10, 5)]);
    // A holds the epoch's last task and asks for more (one of its rings ran dry): it is asked to
    // stop at half of what it has not enqueued, so that the rest goes to its dry ring.
    assert_eq!(
        acquire(&mut sut, NODE_A, 2, 1),
        vec![Action::StopAt {
            node: NODE_A,
            task: task.task,
            row: 55
        }]
    );
    let actions = stop_ack(&mut sut, NODE_A, 3, task.task, 98);
    assert!(
        actions.contains(&Action::TaskSplit {
            parent: task.task,
            child: TaskId(1),
            at_row: 98
        }),
        "{actions:?}"
    );
    // A two-row remainder is handed out, to the node that asked.
    let child = assigned(&acquire(&mut sut, NODE_A, 4, 1), NODE_A);
    assert_eq!((child[0].start, child[0].end), (98, 100));
}

#[test]
fn with_even_batches_the_piece_cut_for_a_dry_ring_goes_only_to_a_node_that_has_one() {
    let mut sut = even_state();
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let acquire_even = |sut: &mut JobState, node, now_ms, dry| {
        run(
            sut,
            Event::AcquireEven {
                node,
                now_ms,
                max_tasks: 2,
                near: Vec::new(),
                dry,
            },
        )
    };
    let task = assigned(&acquire_even(&mut sut, NODE_A, 1, true), NODE_A)[0];
    heartbeat(&mut sut, NODE_A, 2, &[progress(task.task, 20, 10)]);
    // A, whose rings are full, asking for more re-splits nothing.
    assert_eq!(acquire_even(&mut sut, NODE_A, 3, false), Vec::new());
    // B, whose ring ran dry, asks: A is asked to stop half way through what it has not enqueued.
    assert_eq!(
        acquire_even(&mut sut, NODE_B, 4, true),
        vec![Action::StopAt {
            node: NODE_A,
            task: task.task,
            row: 60
        }]
    );
    stop_ack(&mut sut, NODE_A, 5, task.task, 60);
    // A asks again at once, as a daemon does after acknowledging: the piece is not for it.
    assert_eq!(acquire_even(&mut sut, NODE_A, 5, false), Vec::new());
    let piece = assigned(&acquire_even(&mut sut, NODE_B, 6, true), NODE_B);
    assert_eq!((piece[0].start, piece[0].end), (60, 100));
}

#[test]
fn done_reports_need_every_row_consumed() {
    let mut sut = new_state(config(), vec![10]);
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    let report = |consumed| Event::Report {
        node: NODE_A,
        now_ms: 1,
        task,
        consumed,
        outcome: ReportOutcome::Done,
    };
    assert_eq!(
        run(&mut sut, report(9)),
        vec![Action::Refuse {
            node: NODE_A,
            reason: Refusal::DoneBeforeEnd {
                task,
                consumed: 9,
                rows: 10
            }
        }]
    );
    assert_eq!(sut.done_rows(), 0);
    let actions = run(&mut sut, report(10));
    assert_eq!(actions[0], Action::TaskDone { task });
}

#[test]
fn a_failed_task_is_retried_from_its_consumed_count_then_failed() {
    let mut sut = new_state(
        DecideConfig {
            task_failed_percent: 50.0,
            task_success_percent: 50.0,
            ..config()
        },
        vec![10, 10],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0];
    let actions = report_failed(&mut sut, NODE_A, task.task, 3);
    assert_eq!(
        actions,
        vec![Action::TaskRequeued {
            task: task.task,
            from_row: task.start + 3
        }]
    );
    let retry = assigned(&acquire(&mut sut, NODE_B, 1, 1), NODE_B)[0];
    assert_eq!((retry.task, retry.start), (task.task, task.start + 3));
    report_failed(&mut sut, NODE_B, task.task, 2);
    let third = assigned(&acquire(&mut sut, NODE_A, 1, 1), NODE_A)[0];
    assert_eq!(third.start, task.start + 5);
    let actions = report_failed(&mut sut, NODE_A, task.task, 0);
    assert_eq!(
        actions[0],
        Action::TaskFailed {
            task: task.task,
            attempts: 3,
            reason: "corrupt page".to_owned()
        }
    );
    assert_eq!(sut.done_rows(), 5);
    assert_eq!(sut.failed_rows(), 5);
    // 5 of 20 rows failed: below 50%, and 50% success is still reachable.
    assert_eq!(sut.outcome(), None);
}

#[test]
fn the_job_fails_when_failed_rows_reach_task_failed_percent() {
    let mut sut = new_state(
        DecideConfig {
            max_task_attempts: 1,
            task_failed_percent: 25.0,
            task_success_percent: 50.0,
            ..config()
        },
        vec![10, 10, 10, 10],
    );
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    let actions = report_failed(&mut sut, NODE_A, task, 0);
    let Some(Action::JobFinished {
        outcome: JobOutcome::Failed { reason },
    }) = actions.last()
    else {
        panic!("job should fail: {actions:?}");
    };
    assert!(reason.contains("task_failed_percent (25)"), "{reason}");
    assert_eq!(
        acquire(&mut sut, NODE_A, 1, 1),
        vec![Action::Shutdown { node: NODE_A }]
    );
}

#[test]
fn the_job_fails_as_soon_as_task_success_percent_is_out_of_reach() {
    let mut sut = new_state(
        DecideConfig {
            max_task_attempts: 1,
            ..config()
        },
        vec![10, 10, 10, 10],
    );
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    let actions = report_failed(&mut sut, NODE_A, task, 4);
    let Some(Action::JobFinished {
        outcome: JobOutcome::Failed { reason },
    }) = actions.last()
    else {
        panic!("job should fail: {actions:?}");
    };
    assert!(
        reason.contains("task_success_percent (100) cannot be reached"),
        "{reason}"
    );
}

#[test]
fn the_last_epoch_stops_early_at_task_success_percent() {
    let mut sut = new_state(
        DecideConfig {
            task_success_percent: 50.0,
            ..config()
        },
        vec![10, 10, 10, 10],
    );
    register(&mut sut, NODE_A, 0);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 3), NODE_A);
    let first = heartbeat(&mut sut, NODE_A, 1, &[progress(tasks[0].task, 10, 10)]);
    assert_eq!(first.len(), 1, "25% is not enough: {first:?}");
    let second = heartbeat(&mut sut, NODE_A, 1, &[progress(tasks[1].task, 10, 10)]);
    assert_eq!(
        second.last(),
        Some(&Action::JobFinished {
            outcome: JobOutcome::Succeeded
        })
    );
}

#[test]
fn a_node_that_keeps_failing_is_blacklisted_and_fenced() {
    let mut sut = new_state(
        DecideConfig {
            blacklist_after_failures: 2,
            max_task_attempts: 10,
            ..config()
        },
        vec![10, 10, 10],
    );
    register(&mut sut, NODE_A, 0);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 2), NODE_A);
    report_failed(&mut sut, NODE_A, tasks[0].task, 0);
    heartbeat(&mut sut, NODE_A, 1, &[progress(tasks[1].task, 4, 4)]);
    let again = assigned(&acquire(&mut sut, NODE_A, 1, 1), NODE_A)[0];
    let actions = report_failed(&mut sut, NODE_A, again.task, 0);
    assert!(actions.contains(&Action::NodeBlacklisted {
        node: NODE_A,
        requeued: 1
    }));
    assert_eq!(actions.last(), Some(&Action::Fence { node: NODE_A }));
    assert_eq!(sut.node_status(NODE_A), Some(NodeStatus::Blacklisted));
    assert_eq!(sut.in_flight_count(), 0);
    let refused = Action::Refuse {
        node: NODE_A,
        reason: Refusal::Blacklisted,
    };
    assert_eq!(acquire(&mut sut, NODE_A, 2, 1), vec![refused.clone()]);
    assert_eq!(register(&mut sut, NODE_A, 2), vec![refused]);
    // The partly consumed task resumes after its 4 consumed rows on another node.
    register(&mut sut, NODE_B, 2);
    let moved = assigned(&acquire(&mut sut, NODE_B, 2, 3), NODE_B);
    assert!(moved.contains(&Assignment {
        start: tasks[1].start + 4,
        ..tasks[1]
    }));
}

#[test]
fn a_silent_node_is_lost_and_its_tasks_resume_from_their_consumed_counts() {
    let mut sut = new_state(config(), vec![10, 10]);
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0];
    heartbeat(&mut sut, NODE_A, 100, &[progress(task.task, 8, 6)]);
    heartbeat(&mut sut, NODE_B, 1000, &[]);
    // Exactly the timeout is not yet past it.
    assert_eq!(run(&mut sut, Event::Tick { now_ms: 1100 }), Vec::new());
    let actions = run(&mut sut, Event::Tick { now_ms: 1101 });
    assert_eq!(
        actions,
        vec![
            Action::TaskRequeued {
                task: task.task,
                from_row: task.start + 6
            },
            Action::NodeLost {
                node: NODE_A,
                requeued: 1
            }
        ]
    );
    assert_eq!(sut.node_status(NODE_A), Some(NodeStatus::Lost));
    let moved = assigned(&acquire(&mut sut, NODE_B, 1101, 1), NODE_B)[0];
    assert_eq!(moved.start, task.start + 6);
}

#[test]
fn a_lost_node_is_fenced_until_it_registers_holding_nothing() {
    let mut sut = new_state(config(), vec![10, 10]);
    register(&mut sut, NODE_A, 0);
    let task = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A)[0].task;
    run(&mut sut, Event::Tick { now_ms: 5000 });
    let fence = vec![Action::Fence { node: NODE_A }];
    assert_eq!(
        heartbeat(&mut sut, NODE_A, 5001, &[progress(task, 10, 10)]),
        fence
    );
    assert_eq!(sut.done_rows(), 0, "a late heartbeat changes nothing");
    let stale_register = run(
        &mut sut,
        Event::Register {
            node: NODE_A,
            now_ms: 5002,
            held: vec![progress(task, 10, 10)],
        },
    );
    assert_eq!(stale_register, fence);
    assert_eq!(
        register(&mut sut, NODE_A, 5003),
        vec![Action::Registered {
            node: NODE_A,
            kept: 0,
            requeued: 0
        }]
    );
    assert_eq!(sut.node_status(NODE_A), Some(NodeStatus::Alive));
    assert_eq!(
        assigned(&acquire(&mut sut, NODE_A, 5003, 1), NODE_A).len(),
        1
    );
}

#[test]
fn a_daemon_restarting_in_time_keeps_what_it_reports() {
    let mut sut = new_state(
        DecideConfig {
            task_rows: 100,
            ..config()
        },
        vec![100, 100],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 0, 2), NODE_A);
    heartbeat(
        &mut sut,
        NODE_A,
        1,
        &[
            progress(tasks[0].task, 10, 5),
            progress(tasks[1].task, 20, 7),
        ],
    );
    let stop = acquire(&mut sut, NODE_B, 2, 1);
    let [
        Action::StopAt {
            task: stopped, row, ..
        },
    ] = stop[..]
    else {
        panic!("expected a stop request: {stop:?}");
    };
    // The daemon restarts: its rings still hold tasks[0]'s rows, tasks[1] is gone.
    let kept = if stopped == tasks[0].task {
        tasks[0]
    } else {
        tasks[1]
    };
    let forgotten = if stopped == tasks[0].task {
        tasks[1]
    } else {
        tasks[0]
    };
    let actions = run(
        &mut sut,
        Event::Register {
            node: NODE_A,
            now_ms: 500,
            held: vec![progress(kept.task, 30, 25)],
        },
    );
    let forgotten_consumed = if forgotten.task == tasks[0].task {
        5
    } else {
        7
    };
    assert_eq!(
        actions,
        vec![
            Action::TaskRequeued {
                task: forgotten.task,
                from_row: forgotten.start + forgotten_consumed
            },
            Action::Registered {
                node: NODE_A,
                kept: 1,
                requeued: 1
            },
            Action::Resume {
                node: NODE_A,
                tasks: vec![kept],
            },
            Action::StopAt {
                node: NODE_A,
                task: kept.task,
                row
            },
        ]
    );
    assert_eq!(sut.done_rows(), 25 + forgotten_consumed);
}

#[test]
fn task_failures_and_lost_nodes_past_max_total_failures_fail_the_job() {
    let mut sut = new_state(
        DecideConfig {
            max_total_failures: 1,
            ..config()
        },
        vec![10, 10],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    assert_eq!(
        run(&mut sut, Event::Tick { now_ms: 0 }),
        Vec::new(),
        "nobody is late yet"
    );
    heartbeat(&mut sut, NODE_B, 1500, &[]);
    let actions = run(&mut sut, Event::Tick { now_ms: 1500 });
    assert_eq!(sut.outcome(), None, "one lost node is allowed: {actions:?}");
    let task = assigned(&acquire(&mut sut, NODE_B, 1500, 1), NODE_B)[0].task;
    let actions = report_failed(&mut sut, NODE_B, task, 0);
    let Some(Action::JobFinished {
        outcome: JobOutcome::Failed { reason },
    }) = actions.last()
    else {
        panic!("job should fail: {actions:?}");
    };
    assert!(reason.contains("max_total_failures (1)"), "{reason}");
}

#[test]
fn the_next_epoch_starts_with_its_own_order_when_one_is_consumed() {
    let mut sut = new_state(
        DecideConfig {
            epochs: 2,
            ..config()
        },
        vec![30, 30],
    );
    register(&mut sut, NODE_A, 0);
    let first_tasks = assigned(&acquire(&mut sut, NODE_A, 1, 6), NODE_A);
    let counts: Vec<TaskProgress> = first_tasks
        .iter()
        .map(|task| progress(task.task, 10, 10))
        .collect();
    let first_epoch = heartbeat(&mut sut, NODE_A, 1, &counts);
    assert_eq!(
        first_epoch.last(),
        Some(&Action::EpochStarted { epoch: 1, tasks: 6 })
    );
    assert_eq!(sut.epoch(), 1);
    let tasks = assigned(&acquire(&mut sut, NODE_A, 2, 6), NODE_A);
    let expected: Vec<u64> = epoch_order(6, 7, 1)
        .into_iter()
        .map(|slot| 6 + u64::from(slot))
        .collect();
    assert_eq!(
        tasks.iter().map(|task| task.task.0).collect::<Vec<u64>>(),
        expected
    );
    assert!(tasks.iter().all(|task| task.epoch == 1));
    let counts: Vec<TaskProgress> = tasks
        .iter()
        .map(|task| progress(task.task, 10, 10))
        .collect();
    let actions = heartbeat(&mut sut, NODE_A, 3, &counts);
    assert_eq!(
        actions.last(),
        Some(&Action::JobFinished {
            outcome: JobOutcome::Succeeded
        })
    );
}

/// A table mid-run: tasks done, in flight with counts and a stop pending, failed once, pending.
fn busy_state() -> JobState {
    let mut sut = new_state(
        DecideConfig {
            task_rows: 20,
            max_task_attempts: 5,
            ..config()
        },
        vec![50, 30, 7],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let tasks_a = assigned(&acquire(&mut sut, NODE_A, 0, 2), NODE_A);
    heartbeat(
        &mut sut,
        NODE_A,
        1,
        &[
            progress(tasks_a[0].task, tasks_a[0].end - tasks_a[0].start, 3),
            progress(tasks_a[1].task, 2, 1),
        ],
    );
    let tasks_b = assigned(&acquire(&mut sut, NODE_B, 1, 1), NODE_B);
    let rows_b = tasks_b[0].end - tasks_b[0].start;
    heartbeat(
        &mut sut,
        NODE_B,
        2,
        &[progress(tasks_b[0].task, rows_b, rows_b)],
    );
    let more_b = assigned(&acquire(&mut sut, NODE_B, 2, 1), NODE_B);
    report_failed(&mut sut, NODE_B, more_b[0].task, 1);
    sut
}

#[test]
fn grace_in_place_gives_the_table_a_resumed_restore_would() {
    let mut sut = busy_state();
    let grace_from = 50_000;
    let restored = JobState::restore(
        sut.config,
        sut.split_rows.clone(),
        sut.position(),
        RestoreMode::Resume { now_ms: grace_from },
    )
    .expect("position restores");
    sut.grant_grace(grace_from);
    sut.check_invariants().expect("the table stays consistent");
    assert_eq!(sut.position(), restored.position());
    let timeout = sut.config.heartbeat_timeout_ms;
    assert!(!sut.has_expired_nodes(grace_from + timeout));
    assert!(sut.has_expired_nodes(grace_from + timeout + 1));
    let mut restored = restored;
    for event in [
        Event::Tick {
            now_ms: grace_from + timeout,
        },
        Event::Tick {
            now_ms: grace_from + timeout + 1,
        },
    ] {
        assert_eq!(run(&mut sut, event.clone()), run(&mut restored, event));
    }
}

#[test]
fn a_position_survives_serialization_and_restores_the_same_table() {
    let sut = busy_state();
    let position = sut.position();
    let json = serde_json::to_string(&position).expect("position serializes");
    let decoded: DataPosition = serde_json::from_str(&json).expect("position deserializes");
    assert_eq!(decoded, position);
    let mut restored = JobState::restore(
        sut.config,
        sut.split_rows.clone(),
        decoded,
        RestoreMode::Resume { now_ms: 2 },
    )
    .expect("position restores");
    restored
        .check_invariants()
        .expect("restored table is consistent");
    assert_eq!(restored.position(), position);
    // The restored table makes the same decisions as the original.
    let mut original = sut;
    let events = [
        Event::Acquire {
            node: NODE_B,
            now_ms: 3,
            max_tasks: 10,
        },
        Event::Acquire {
            node: NODE_B,
            now_ms: 3,
            max_tasks: 1,
        },
        Event::Tick { now_ms: 3000 },
    ];
    for event in events {
        assert_eq!(run(&mut restored, event.clone()), run(&mut original, event));
    }
}

#[test]
fn restoring_with_requeue_puts_in_flight_tasks_first_from_their_counts() {
    let sut = busy_state();
    let position = sut.position();
    let in_flight: Vec<(TaskId, u64)> = position
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(index, record)| match record.status {
            TaskStatus::InFlight { consumed, .. } => {
                Some((TaskId(index as u64), record.start + consumed))
            }
            _ => None,
        })
        .collect();
    assert_eq!(in_flight.len(), 2);
    let mut restored = JobState::restore(
        sut.config,
        sut.split_rows.clone(),
        position,
        RestoreMode::Requeue { now_ms: 0 },
    )
    .expect("position restores");
    restored
        .check_invariants()
        .expect("restored table is consistent");
    assert_eq!(restored.in_flight_count(), 0);
    let tasks = assigned(&acquire(&mut restored, NODE_A, 1, 2), NODE_A);
    let got: Vec<(TaskId, u64)> = tasks.iter().map(|task| (task.task, task.start)).collect();
    assert_eq!(got, in_flight);
}

#[test]
fn a_position_from_other_data_is_refused() {
    let sut = busy_state();
    let restore = |split_rows: Vec<u64>, position: DataPosition| {
        JobState::restore(
            sut.config,
            split_rows,
            position,
            RestoreMode::Resume { now_ms: 0 },
        )
        .err()
    };
    assert!(matches!(
        restore(vec![50, 30], sut.position()),
        Some(RestoreError::SplitsMissing {
            covered: 3,
            splits: 2
        })
    ));
    let unsized_position = DataPosition {
        splits: None,
        ..sut.position()
    };
    assert!(matches!(
        restore(vec![50, 30], unsized_position),
        Some(RestoreError::UnknownSplit { split: 2, .. })
    ));
    assert!(matches!(
        restore(vec![50, 30, 8], sut.position()),
        Some(RestoreError::RowsMismatch { .. })
    ));
    assert!(matches!(
        restore(vec![50, 30, 6], sut.position()),
        Some(RestoreError::BadRange { .. })
    ));
    let mut missing_pending = sut.position();
    missing_pending.pending.pop();
    assert!(matches!(
        restore(sut.split_rows.clone(), missing_pending),
        Some(RestoreError::PendingMismatch { .. })
    ));
    let mut orphan = sut.position();
    orphan.nodes.retain(|record| record.node != NODE_A);
    assert!(matches!(
        restore(sut.split_rows.clone(), orphan),
        Some(RestoreError::BadHolder { node: NODE_A, .. })
    ));
    let mut late_epoch = sut.position();
    late_epoch.epoch = 1;
    let error = restore(sut.split_rows.clone(), late_epoch).expect("epoch past the job");
    assert!(error.to_string().contains("check data.epochs"));
}

/// A table of 9,000 one-row tasks, three chunks of slots, with tasks in every state: done,
/// failed for good, in flight with a stop asked, pending from the order and queued again.
fn table_over_chunks() -> JobState {
    let mut sut = new_state(
        DecideConfig {
            task_rows: 1,
            max_task_attempts: 1,
            blacklist_after_failures: 100,
            task_success_percent: 50.0,
            ..config()
        },
        vec![5000, 4000],
    );
    register(&mut sut, NODE_A, 0);
    register(&mut sut, NODE_B, 0);
    let tasks_a = assigned(&acquire(&mut sut, NODE_A, 0, 3), NODE_A);
    heartbeat(&mut sut, NODE_A, 1, &[progress(tasks_a[0].task, 1, 1)]);
    report_failed(&mut sut, NODE_A, tasks_a[1].task, 0);
    let tasks_b = assigned(&acquire(&mut sut, NODE_B, 1, 2), NODE_B);
    heartbeat(&mut sut, NODE_B, 1000, &[progress(tasks_b[0].task, 1, 0)]);
    run(&mut sut, Event::Tick { now_ms: 1500 });
    assert_eq!(
        sut.node_status(NODE_A),
        Some(NodeStatus::Lost),
        "node A was silent past its timeout"
    );
    assert_eq!(sut.in_flight_count(), tasks_b.len());
    assert!(sut.pending_count() > 0 && sut.task_counts().done == 1);
    assert_eq!(sut.outcome(), None);
    sut
}

#[test]
fn a_captured_table_encodes_as_its_position_and_keeps_it_while_the_table_changes() {
    let mut sut = table_over_chunks();
    let position = sut.position();
    let encoded = postcard::to_stdvec(&position).expect("a position encodes");
    let captured = sut.capture();
    assert_eq!(
        postcard::to_stdvec(&captured).expect("a capture encodes"),
        encoded,
        "a capture encodes to the bytes of its position"
    );
    // The table changes in every chunk: tasks handed out, done, failed, cut, and a new epoch's
    // slots would replace them all.
    register(&mut sut, NODE_A, 1600);
    let handed = assigned(&acquire(&mut sut, NODE_A, 1600, 4000), NODE_A);
    assert_eq!(handed.len(), 4000);
    let counts: Vec<TaskProgress> = handed
        .iter()
        .take(3000)
        .map(|task| progress(task.task, 1, 1))
        .collect();
    heartbeat(&mut sut, NODE_A, 1601, &counts);
    report_failed(&mut sut, NODE_A, handed[3500].task, 0);
    assert_ne!(sut.position(), position);
    assert_eq!(
        postcard::to_stdvec(&captured).expect("a capture encodes"),
        encoded,
        "the capture holds the table as it was when captured"
    );
    let decoded: TableSnapshot = postcard::from_bytes(&encoded).expect("a capture decodes");
    assert_eq!(decoded.into_position(), position);
    assert_eq!(captured.into_position(), position);
}

#[test]
fn one_task_costs_28_bytes_so_ten_million_fit_well_under_2_gib() {
    assert_eq!(std::mem::size_of::<TaskSlot>(), 24);
    let one_row_tasks = DecideConfig {
        task_rows: 1000,
        ..config()
    };
    // 1,000 splits of 1,000,000 rows: one million tasks.
    let sut = new_state(one_row_tasks, vec![1_000_000; 1000]);
    assert_eq!(sut.task_count(), 1_000_000);
    let per_task = sut.memory_estimate_bytes() as f64 / 1_000_000.0;
    assert!(per_task <= 28.1, "one task costs {per_task} bytes");
    let ten_million = per_task * 10_000_000.0;
    assert!(ten_million < f64::from(1u32 << 30), "{ten_million} bytes");
}

fn following() -> DecideConfig {
    DecideConfig {
        follow: true,
        ..config()
    }
}

/// Hands every pending task to `node` and reports all its rows consumed.
fn consume_everything(state: &mut JobState, node: NodeId, now_ms: u64) -> Vec<Action> {
    let tasks = assigned(&acquire(state, node, now_ms, 100), node);
    let counts: Vec<TaskProgress> = tasks
        .iter()
        .map(|task| progress(task.task, task.end - task.start, task.end - task.start))
        .collect();
    heartbeat(state, node, now_ms, &counts)
}

fn finished(actions: &[Action]) -> Option<&JobOutcome> {
    actions.iter().find_map(|action| match action {
        Action::JobFinished { outcome } => Some(outcome),
        _ => None,
    })
}

#[test]
fn added_splits_become_tasks_after_the_planned_ones_with_stable_ids() {
    let mut sut = new_state(following(), vec![25]);
    register(&mut sut, NODE_A, 0);
    let first = assigned(&acquire(&mut sut, NODE_A, 0, 1), NODE_A);
    let actions = run(
        &mut sut,
        Event::SplitsAdded {
            split_rows: vec![12, 0, 5],
        },
    );
    assert_eq!(
        actions,
        vec![Action::TasksAdded {
            splits: 3,
            tasks: 3
        }]
    );
    assert_eq!(sut.split_count(), 4);
    assert_eq!(sut.epoch_rows(), 42);
    let rest = assigned(&acquire(&mut sut, NODE_A, 0, 100), NODE_A);
    let mut handed: Vec<(u64, u32, u64, u64)> = first
        .iter()
        .chain(&rest)
        .map(|task| (task.task.0, task.split, task.start, task.end))
        .collect();
    // The planned tasks come first, then the added ones, which take the next ids.
    assert!(rest[..2].iter().all(|task| task.split == 0), "{rest:?}");
    handed.sort_unstable();
    assert_eq!(
        handed,
        vec![
            (0, 0, 0, 10),
            (1, 0, 10, 20),
            (2, 0, 20, 25),
            (3, 1, 0, 10),
            (4, 1, 10, 12),
            (5, 3, 0, 5),
        ]
    );
}

#[test]
fn a_followed_job_waits_when_its_rows_are_consumed_and_succeeds_once_following_ends() {
    let mut sut = new_state(following(), vec![15]);
    register(&mut sut, NODE_A, 0);
    let actions = consume_everything(&mut sut, NODE_A, 1);
    assert_eq!(finished(&actions), None, "{actions:?}");
    assert_eq!(sut.outcome(), None);
    assert!(assigned(&acquire(&mut sut, NODE_A, 2, 4), NODE_A).is_empty());
    run(
        &mut sut,
        Event::SplitsAdded {
            split_rows: vec![7],
        },
    );
    let actions = run(&mut sut, Event::FollowEnded);
    assert_eq!(finished(&actions), None, "the added rows are still open");
    let actions = consume_everything(&mut sut, NODE_A, 3);
    assert_eq!(finished(&actions), Some(&JobOutcome::Succeeded));
    assert_eq!(sut.done_rows(), 22);
}

#[test]
fn a_followed_job_may_start_empty_and_ends_when_following_ends() {
    let mut sut = new_state(following(), Vec::new());
    assert_eq!(sut.task_count(), 0);
    let error = JobState::new(config(), Vec::new()).expect_err("not followed");
    assert_eq!(error, PlanError::NoRows { splits: 0 });
    let actions = run(&mut sut, Event::FollowEnded);
    assert_eq!(finished(&actions), Some(&JobOutcome::Succeeded));
}

#[test]
fn a_failed_follow_fails_the_job_and_late_splits_change_nothing() {
    let mut sut = new_state(following(), vec![5]);
    let actions = run(
        &mut sut,
        Event::FollowFailed {
            reason: "version 3 removes files".to_owned(),
        },
    );
    assert_eq!(
        finished(&actions),
        Some(&JobOutcome::Failed {
            reason: "version 3 removes files".to_owned()
        })
    );
    let actions = run(
        &mut sut,
        Event::SplitsAdded {
            split_rows: vec![4],
        },
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(sut.split_count(), 1);
}

#[test]
fn splits_added_after_following_ended_fail_the_job() {
    let mut sut = new_state(following(), vec![5]);
    run(&mut sut, Event::FollowEnded);
    let actions = run(
        &mut sut,
        Event::SplitsAdded {
            split_rows: vec![4],
        },
    );
    assert!(
        matches!(finished(&actions), Some(JobOutcome::Failed { reason }) if reason.contains("no longer follows")),
        "{actions:?}"
    );
}

#[test]
fn a_position_taken_before_splits_were_added_restores_them_as_pending() {
    let mut sut = new_state(following(), vec![15]);
    register(&mut sut, NODE_A, 0);
    consume_everything(&mut sut, NODE_A, 1);
    let before = sut.position();
    assert_eq!(before.splits, Some(1));
    run(
        &mut sut,
        Event::SplitsAdded {
            split_rows: vec![12],
        },
    );
    let restored = JobState::restore(
        following(),
        vec![15, 12],
        before.clone(),
        RestoreMode::Requeue { now_ms: 5 },
    )
    .expect("restores over more splits");
    restored.check_invariants().expect("consistent");
    assert_eq!(restored.epoch_rows(), 27);
    assert_eq!(restored.done_rows(), 15);
    assert_eq!(restored.pending_count(), 2);
    assert_eq!(restored.slots.len(), sut.slots.len());
    let error = JobState::restore(
        following(),
        Vec::new(),
        before,
        RestoreMode::Requeue { now_ms: 5 },
    )
    .expect_err("fewer splits than the position");
    assert_eq!(
        error,
        RestoreError::SplitsMissing {
            covered: 1,
            splits: 0
        }
    );
}

#[test]
fn the_read_accessors_show_the_tasks_in_flight_and_the_nodes_as_the_table_has_them() {
    let mut sut = new_state(config(), vec![25, 10]);
    assert_eq!(
        sut.task_splits().collect::<Vec<_>>(),
        vec![0, 0, 0, 1],
        "the split of each task, in task order"
    );
    assert_eq!(
        sut.task_span(2),
        Some(TaskSpan {
            split: 0,
            start: 20,
            end: 25
        })
    );
    assert_eq!(sut.task_span(4), None, "the epoch has four tasks");
    register(&mut sut, NODE_A, 10);
    register(&mut sut, NODE_B, 20);
    let task = assigned(&acquire(&mut sut, NODE_A, 30, 1), NODE_A)[0];
    heartbeat(&mut sut, NODE_A, 40, &[progress(task.task, 4, 3)]);
    let in_flight: Vec<TaskInFlight> = sut.tasks_in_flight().collect();
    assert_eq!(
        in_flight,
        vec![TaskInFlight {
            task: task.task,
            span: TaskSpan {
                split: task.split,
                start: task.start,
                end: task.end
            },
            node: NODE_A,
            enqueued: 4,
            consumed: 3,
            stop_at: None,
        }]
    );
    let nodes: Vec<(NodeId, NodeView)> = sut.nodes().collect();
    assert_eq!(
        nodes,
        vec![
            (
                NODE_A,
                NodeView {
                    status: NodeStatus::Alive,
                    last_seen_ms: 40,
                    failures: 0,
                    tasks_held: 1
                }
            ),
            (
                NODE_B,
                NodeView {
                    status: NodeStatus::Alive,
                    last_seen_ms: 20,
                    failures: 0,
                    tasks_held: 0
                }
            ),
        ]
    );
    run(&mut sut, Event::Tick { now_ms: 1030 });
    assert_eq!(
        sut.alive_nodes().collect::<Vec<_>>(),
        vec![NODE_A],
        "node B, silent past the timeout, is lost"
    );
    sut.restore_last_seen(&std::collections::BTreeMap::from([
        (NODE_A, 7),
        (NodeId(9), 8),
    ]));
    assert_eq!(
        sut.nodes()
            .map(|(_, view)| view.last_seen_ms)
            .collect::<Vec<_>>(),
        vec![7, 20],
        "a node the table does not know is ignored"
    );
}
