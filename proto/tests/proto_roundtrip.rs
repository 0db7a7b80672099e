//! Encodes and decodes the daemon protocol's messages with prost, and converts ids.

use prost::Message;
use sluice_proto::v1::{
    AddedSource, AssignTasks, BadRange, Blacklisted, Command, CountOutOfRange, DeletionVector,
    DeltaSplitInfo, DoneBeforeEnd, EpochBatches, Fence, HeartbeatReply, HeartbeatRequest,
    JournalMark, NoStopRequested, NotHeld, ObjectIdentity, PartitionValue, ReadTuning, Refusal,
    Refuse, Release, RingStats, RowSpan, SettledBatches, Shutdown, SourceData, Split, SplitBytes,
    StageStats, StopRowOutOfRange, StopTask, TaskAssignment, TaskProgress, UnknownNode,
    UnknownTask, command, refusal,
};
use sluice_proto::{JobId, NodeId, TaskId};
use std::collections::BTreeSet;

fn heartbeat_request() -> HeartbeatRequest {
    HeartbeatRequest {
        hostname: String::new(),
        node_id: NodeId(3).into(),
        progress: vec![
            TaskProgress {
                task_id: 11,
                enqueued: 4096,
                consumed: 1024,
                bad: vec![BadRange {
                    uri: "s3://bucket/part-0.parquet".into(),
                    row_group: Some(2),
                    first_row: 500,
                    row_count: 250,
                    cause: "invalid page header".into(),
                }],
                sent: 8192,
                dropped: vec![RowSpan {
                    first_row: 800,
                    row_count: 96,
                }],
            },
            TaskProgress {
                task_id: 12,
                enqueued: 0,
                consumed: 0,
                bad: Vec::new(),
                sent: 0,
                dropped: Vec::new(),
            },
        ],
        stages: vec![
            StageStats {
                stage: "fetch".into(),
                busy_ns: 7,
                wait_ns: 9,
                rows: 0,
                bytes: 1 << 20,
            },
            StageStats {
                stage: "decode".into(),
                busy_ns: 70,
                wait_ns: 90,
                rows: 4096,
                bytes: 3,
            },
        ],
        rings: vec![RingStats {
            rank: 1,
            used_bytes: 512,
            capacity_bytes: 1 << 28,
            trainer_wait_ns: 100,
            daemon_wait_ns: 200,
            reader_idle_ms: 0,
            reader_interval_ms: 0,
            source_wait_ms: 1_500,
            source_task_id: 6,
            epoch_batches: vec![
                EpochBatches {
                    epoch: 2,
                    batches: 40,
                },
                EpochBatches {
                    epoch: 3,
                    batches: 7,
                },
            ],
        }],
        keeps_finished_until_durable: true,
        tuning: Some(ReadTuning {
            threads: 2,
            max_threads: 4,
            read_ahead_bytes: 8 << 20,
            max_read_ahead_bytes: 1 << 30,
            held_bytes: 65_536,
        }),
    }
}

fn delta_assignment() -> TaskAssignment {
    TaskAssignment {
        task_id: 42,
        epoch: 2,
        split_index: 5,
        start: 100,
        end: 65_636,
        split: Some(Split {
            uri: "s3://bucket/table/part=a/file.parquet".into(),
            file_size: 123_456_789,
            first_row: 131_072,
            row_count: 65_536,
            partition_values: vec![
                PartitionValue {
                    name: "part".into(),
                    value: Some("a".into()),
                },
                PartitionValue {
                    name: "day".into(),
                    value: None,
                },
            ],
            delta: Some(DeltaSplitInfo {
                version: 17,
                deletion_vector: Some(DeletionVector {
                    storage_type: "u".into(),
                    path_or_inline_dv: "ab^-aqEH.-t@S}K{vb[*k^".into(),
                    offset: Some(4),
                    size_in_bytes: 40,
                    cardinality: 6,
                }),
            }),
            source_index: 1,
            bytes: None,
            identity: None,
        }),
    }
}

fn refuse(kind: refusal::Kind) -> Command {
    Command {
        command: Some(command::Command::Refuse(Refuse {
            reason: Some(Refusal { kind: Some(kind) }),
            message: "refused".into(),
        })),
    }
}

fn heartbeat_reply_with_every_command() -> HeartbeatReply {
    let mut commands = vec![
        Command {
            command: Some(command::Command::Assign(AssignTasks {
                tasks: vec![
                    delta_assignment(),
                    TaskAssignment {
                        task_id: 43,
                        epoch: 2,
                        split_index: 6,
                        start: 0,
                        end: 10,
                        split: Some(Split {
                            uri: "file:///data/train/0.parquet".into(),
                            file_size: 999,
                            first_row: 0,
                            row_count: 10,
                            partition_values: Vec::new(),
                            delta: None,
                            source_index: 0,
                            bytes: None,
                            identity: None,
                        }),
                    },
                    TaskAssignment {
                        task_id: 44,
                        epoch: 2,
                        split_index: 7,
                        start: 3,
                        end: 9,
                        split: Some(Split {
                            uri: "s3://bucket/rows.csv".into(),
                            file_size: 4_096,
                            first_row: 10,
                            row_count: 10,
                            partition_values: Vec::new(),
                            delta: None,
                            source_index: 2,
                            bytes: Some(SplitBytes {
                                start: 1_000,
                                end: 2_000,
                                first_row: 10,
                                rows: 10,
                                crc32c: Some(0xe306_9283),
                            }),
                            identity: Some(ObjectIdentity {
                                e_tag: Some("\"9b2cf535f27731c974343645a3985328\"".into()),
                                version: Some("3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY".into()),
                                modified_ns: None,
                            }),
                        }),
                    },
                ],
                sources: vec![AddedSource {
                    index: 2,
                    data: Some(SourceData {
                        uri: "s3://bucket/rows.csv".into(),
                        format: "csv".into(),
                        columns: vec!["id".into()],
                        filter: Some("id > 3".into()),
                        storage_options: [("region".to_owned(), "local".to_owned())].into(),
                        version: None,
                    }),
                }],
            })),
        },
        Command {
            command: Some(command::Command::Stop(StopTask {
                task_id: 11,
                row: 5000,
            })),
        },
        Command {
            command: Some(command::Command::Shutdown(Shutdown {})),
        },
        Command {
            command: Some(command::Command::Fence(Fence {})),
        },
        Command {
            command: Some(command::Command::Release(Release {})),
        },
        Command {
            command: Some(command::Command::Settled(SettledBatches {
                epochs: vec![EpochBatches {
                    epoch: 2,
                    batches: 41,
                }],
                current_epoch: 3,
                allowed: vec![EpochBatches {
                    epoch: 3,
                    batches: 17,
                }],
            })),
        },
    ];
    commands.extend(
        [
            refusal::Kind::UnknownNode(UnknownNode {}),
            refusal::Kind::Blacklisted(Blacklisted {}),
            refusal::Kind::UnknownTask(UnknownTask { task_id: 1 }),
            refusal::Kind::NotHeld(NotHeld { task_id: 2 }),
            refusal::Kind::CountOutOfRange(CountOutOfRange {
                task_id: 3,
                enqueued: 10,
                consumed: 11,
                rows: 10,
            }),
            refusal::Kind::NoStopRequested(NoStopRequested { task_id: 4 }),
            refusal::Kind::StopRowOutOfRange(StopRowOutOfRange {
                task_id: 5,
                stop_row: 3,
                min: 4,
                max: 9,
            }),
            refusal::Kind::DoneBeforeEnd(DoneBeforeEnd {
                task_id: 6,
                consumed: 2,
                rows: 9,
            }),
        ]
        .into_iter()
        .map(refuse),
    );
    HeartbeatReply {
        commands,
        journal: Some(JournalMark {
            generation: 7,
            appended: 1 << 40,
            durable: (1 << 40) - 3,
        }),
    }
}

/// Names a command's kind; the match is exhaustive, so a new kind must be added to the test.
fn command_kind(command: &command::Command) -> &'static str {
    match command {
        command::Command::Assign(_) => "assign",
        command::Command::Stop(_) => "stop",
        command::Command::Shutdown(_) => "shutdown",
        command::Command::Fence(_) => "fence",
        command::Command::Refuse(_) => "refuse",
        command::Command::Release(_) => "release",
        command::Command::Settled(_) => "settled",
    }
}

/// Names a refusal's kind; the match is exhaustive, so a new kind must be added to the test.
fn refusal_kind(kind: &refusal::Kind) -> &'static str {
    match kind {
        refusal::Kind::UnknownNode(_) => "unknown_node",
        refusal::Kind::Blacklisted(_) => "blacklisted",
        refusal::Kind::UnknownTask(_) => "unknown_task",
        refusal::Kind::NotHeld(_) => "not_held",
        refusal::Kind::CountOutOfRange(_) => "count_out_of_range",
        refusal::Kind::NoStopRequested(_) => "no_stop_requested",
        refusal::Kind::StopRowOutOfRange(_) => "stop_row_out_of_range",
        refusal::Kind::DoneBeforeEnd(_) => "done_before_end",
    }
}

#[test]
fn heartbeat_request_survives_encode_and_decode() {
    let sut = heartbeat_request();
    let bytes = sut.encode_to_vec();
    let decoded = HeartbeatRequest::decode(bytes.as_slice()).expect("a valid HeartbeatRequest");
    assert_eq!(decoded, sut);
    assert_eq!(NodeId::from(decoded.node_id), NodeId(3));
    assert_eq!(decoded.progress[0].consumed, 1024);
    assert_eq!(decoded.rings[0].daemon_wait_ns, 200);
    assert_eq!(decoded.progress[0].sent, 8192);
    assert_eq!(decoded.rings[0].epoch_batches[1].batches, 7);
}

#[test]
fn heartbeat_reply_with_every_command_kind_survives_encode_and_decode() {
    let sut = heartbeat_reply_with_every_command();
    let bytes = sut.encode_to_vec();
    let decoded = HeartbeatReply::decode(bytes.as_slice()).expect("a valid HeartbeatReply");
    assert_eq!(decoded, sut);

    let commands: Vec<&command::Command> = decoded
        .commands
        .iter()
        .map(|command| command.command.as_ref().expect("every command is set"))
        .collect();
    let command_kinds: BTreeSet<&str> = commands
        .iter()
        .map(|command| command_kind(command))
        .collect();
    assert_eq!(
        command_kinds,
        BTreeSet::from([
            "assign", "stop", "shutdown", "fence", "refuse", "release", "settled"
        ])
    );
    let refusal_kinds: BTreeSet<&str> = commands
        .iter()
        .filter_map(|command| match command {
            command::Command::Refuse(refuse) => refuse.reason.as_ref()?.kind.as_ref(),
            _ => None,
        })
        .map(refusal_kind)
        .collect();
    assert_eq!(
        refusal_kinds.len(),
        8,
        "every refusal kind: {refusal_kinds:?}"
    );

    let command::Command::Assign(assign) = commands[0] else {
        panic!("the first command assigns tasks, got {:?}", commands[0]);
    };
    let split = assign.tasks[0].split.as_ref().expect("the split is set");
    assert_eq!(
        split.partition_values[1].value, None,
        "a null partition value stays null"
    );
    let deletion_vector = split
        .delta
        .as_ref()
        .and_then(|delta| delta.deletion_vector.as_ref())
        .expect("the deletion vector is set");
    assert_eq!(deletion_vector.offset, Some(4));
    assert_eq!(
        assign.tasks[1]
            .split
            .as_ref()
            .and_then(|split| split.delta.as_ref()),
        None
    );
}

#[test]
fn ids_convert_to_and_from_the_generated_fields() {
    let task_field: u64 = TaskId(42).into();
    assert_eq!(task_field, 42);
    assert_eq!(TaskId::from(task_field), TaskId(42));
    assert_eq!(TaskId(42).to_string(), "task-42");

    let node_field: u64 = NodeId(7).into();
    assert_eq!(NodeId::from(node_field), NodeId(7));
    assert_eq!(NodeId(7).to_string(), "node-7");

    let job_field: String = JobId::from("quickstart").into();
    assert_eq!(job_field, "quickstart");
    assert_eq!(JobId::from(job_field.clone()).to_string(), "quickstart");
}
