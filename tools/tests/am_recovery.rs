//! `kill -9` of the AM: a new AM with the same spec and checkpoint location takes the job over with
//! the same task table, and a daemon that reconnects on its own consumes every row exactly once
//! across any number of AM deaths.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::AmProcess;

use sluice_proto::v1;
use sluice_proto::v1::command::Command as Cmd;
use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use tonic::transport::Channel;

const ROWS: u64 = 2000;

/// 2000 rows in 4 files, tasks of 50 rows, journaled under `<directory>/ckpt`.
fn job(directory: &Path) -> PathBuf {
    let data = common::generate(directory, ROWS, 4, 50);
    common::write_spec(
        directory,
        &format!(
            r#"
name: recovery
data:
  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 50
  batch_size: 5
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 50, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{}" }}
"#,
            data.display(),
            directory.join("ckpt").display()
        ),
    )
}

/// A task a simulated daemon holds: its rows in file terms and how far it consumed them.
#[derive(Debug, Clone)]
struct Held {
    uri: String,
    /// The task's first row in split rows.
    start: u64,
    /// The file row of the task's `start`.
    first: u64,
    rows: u64,
    consumed: u64,
}

/// A daemon speaking the real protocol that consumes `step` rows of each held task per heartbeat,
/// records every row it consumes, and reconnects and registers again, holding its tasks, whenever
/// the AM goes away.
struct Daemon {
    address: String,
    held: BTreeMap<u64, Held>,
    consumed: BTreeMap<(String, u64), u32>,
    step: u64,
}

impl Daemon {
    fn new(address: &str, step: u64) -> Daemon {
        Daemon {
            address: address.to_owned(),
            held: BTreeMap::new(),
            consumed: BTreeMap::new(),
            step,
        }
    }

    /// Registers holding nothing, then takes up to `max_tasks` tasks.
    async fn join(&mut self, client: &mut DaemonServiceClient<Channel>, max_tasks: u32) {
        let mut acks = Vec::new();
        let reply = client
            .register(v1::RegisterRequest {
                node_id: 0,
                job_id: "recovery".into(),
                ..v1::RegisterRequest::default()
            })
            .await
            .expect("register");
        self.apply(reply.into_inner().commands, &mut acks);
        let reply = client
            .acquire_tasks(v1::AcquireTasksRequest {
                node_id: 0,
                max_tasks,
                dry: true,
            })
            .await
            .expect("acquire");
        self.apply(reply.into_inner().commands, &mut acks);
    }

    /// Sends one heartbeat with the counts of every held task.
    async fn report(&self, client: &mut DaemonServiceClient<Channel>) {
        client
            .heartbeat(v1::HeartbeatRequest {
                node_id: 0,
                progress: self.progress(),
                ..v1::HeartbeatRequest::default()
            })
            .await
            .expect("heartbeat");
    }

    async fn connect(address: &str) -> Option<DaemonServiceClient<Channel>> {
        DaemonServiceClient::connect(format!("http://{address}"))
            .await
            .ok()
    }

    fn progress(&self) -> Vec<v1::TaskProgress> {
        self.held
            .iter()
            .map(|(task_id, held)| v1::TaskProgress {
                task_id: *task_id,
                enqueued: held.consumed,
                consumed: held.consumed,
                bad: Vec::new(),
                sent: 0,
                dropped: Vec::new(),
            })
            .collect()
    }

    /// Applies the AM's commands; returns whether it said the job is over.
    fn apply(&mut self, commands: Vec<v1::Command>, acks: &mut Vec<(u64, u64)>) -> bool {
        let mut over = false;
        for command in commands {
            match command.command {
                Some(Cmd::Assign(assign)) => {
                    for task in assign.tasks {
                        let split = task.split.expect("split");
                        // A task given back after registering again resumes where it stands.
                        self.held.entry(task.task_id).or_insert(Held {
                            uri: split.uri,
                            start: task.start,
                            first: split.first_row + task.start,
                            rows: task.end - task.start,
                            consumed: 0,
                        });
                    }
                }
                Some(Cmd::Stop(stop)) => {
                    if let Some(held) = self.held.get_mut(&stop.task_id) {
                        let stop_row = stop.row.max(held.start + held.consumed);
                        held.rows = stop_row - held.start;
                        acks.push((stop.task_id, stop_row));
                    }
                }
                Some(Cmd::Fence(_) | Cmd::Release(_)) => self.held.clear(),
                Some(Cmd::Shutdown(_)) => over = true,
                // The job has no data.even_batches.
                Some(Cmd::Refuse(_) | Cmd::Settled(_)) | None => {}
            }
        }
        over
    }

    /// Runs until the AM says the job is over, riding through AM deaths.
    async fn run(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        'connection: loop {
            assert!(Instant::now() < deadline, "the daemon never finished");
            let Some(mut client) = Daemon::connect(&self.address).await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let held: Vec<v1::TaskProgress> = self.progress();
            let Ok(reply) = client
                .register(v1::RegisterRequest {
                    node_by_host: false,
                    node_id: 0,
                    job_id: "recovery".into(),
                    hostname: "test".into(),
                    held,
                })
                .await
            else {
                continue;
            };
            let mut acks = Vec::new();
            if self.apply(reply.into_inner().commands, &mut acks) {
                return;
            }
            loop {
                assert!(Instant::now() < deadline, "the daemon never finished");
                for (task_id, stop_row) in acks.drain(..) {
                    let Ok(reply) = client
                        .ack_stop(v1::AckStopRequest {
                            node_id: 0,
                            task_id,
                            stop_row,
                        })
                        .await
                    else {
                        continue 'connection;
                    };
                    let mut more = Vec::new();
                    if self.apply(reply.into_inner().commands, &mut more) {
                        return;
                    }
                }
                if self.held.len() < 2 {
                    let Ok(reply) = client
                        .acquire_tasks(v1::AcquireTasksRequest {
                            node_id: 0,
                            max_tasks: 2,
                            dry: true,
                        })
                        .await
                    else {
                        continue 'connection;
                    };
                    if self.apply(reply.into_inner().commands, &mut acks) {
                        return;
                    }
                }
                self.consume_step();
                let Ok(reply) = client
                    .heartbeat(v1::HeartbeatRequest {
                        node_id: 0,
                        progress: self.progress(),
                        ..v1::HeartbeatRequest::default()
                    })
                    .await
                else {
                    continue 'connection;
                };
                if self.apply(reply.into_inner().commands, &mut acks) {
                    return;
                }
                // A task is done once the AM has heard that every row of it was consumed.
                self.held.retain(|_, held| held.consumed < held.rows);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    fn consume_step(&mut self) {
        for held in self.held.values_mut() {
            let until = (held.consumed + self.step).min(held.rows);
            for row in held.consumed..until {
                *self
                    .consumed
                    .entry((held.uri.clone(), held.first + row))
                    .or_default() += 1;
            }
            held.consumed = until;
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_new_am_takes_over_the_same_task_table() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = job(directory.path());
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let address = am.address.clone();
    let mut daemon = Daemon::new(&address, 20);
    let before = runtime().block_on(async {
        let mut client = Daemon::connect(&address).await.expect("connect");
        daemon.join(&mut client, 3).await;
        assert_eq!(daemon.held.len(), 3);
        daemon.consume_step();
        daemon.report(&mut client).await;
        common::status_json(&address)
    });
    assert_eq!(before["tasks"]["in_flight"], 3);
    assert_eq!(before["tasks"]["rows_consumed"], 60);
    am.kill();

    let am = AmProcess::start(&spec, &address, &[]);
    let after = common::status_json(&am.address);
    assert_eq!(after["tasks"], before["tasks"], "the same task table");
    assert_eq!(after["epoch"], before["epoch"]);
    drop(am);
}

#[test]
fn every_row_is_consumed_once_across_repeated_am_kills() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = job(directory.path());
    let address = common::free_address();
    let mut am = AmProcess::start(&spec, &address, &[]);
    let rt = runtime();
    let daemon_address = address.clone();
    let daemon = rt.spawn(async move {
        let mut daemon = Daemon::new(&daemon_address, 5);
        daemon.run().await;
        daemon.consumed
    });
    let mut seed = 0x5EED_u64;
    for _ in 0..3 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(150 + (seed >> 33) % 400));
        am.kill();
        am = AmProcess::start(&spec, &address, &[]);
    }
    let consumed = rt.block_on(daemon).expect("the daemon finished");
    let (success, stdout) = am.finish();
    assert!(success, "the AM failed: {stdout}");
    let twice: Vec<_> = consumed.iter().filter(|(_, count)| **count > 1).collect();
    assert!(
        twice.is_empty(),
        "rows consumed twice: {:?}",
        &twice[..twice.len().min(10)]
    );
    assert_eq!(consumed.len() as u64, ROWS, "every row consumed");
}

#[test]
fn a_data_checkpoint_committed_over_grpc_resumes_a_new_am_at_its_step() {
    use sluice_proto::v1::checkpoint_service_client::CheckpointServiceClient;

    let directory = tempfile::tempdir().expect("tempdir");
    let spec = job(directory.path());
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let address = am.address.clone();
    let mut daemon = Daemon::new(&address, 20);
    let token = runtime().block_on(async {
        let mut client = Daemon::connect(&address).await.expect("connect");
        daemon.join(&mut client, 2).await;
        daemon.consume_step();
        // The trainer (rank 0 of 1) checkpoints here: 20 rows of each of its two tasks.
        let positions = daemon
            .held
            .iter()
            .map(|(task_id, held)| v1::TaskPosition {
                task_id: *task_id,
                end_row: held.start + held.consumed,
            })
            .collect();
        let mut checkpoints = CheckpointServiceClient::connect(format!("http://{address}"))
            .await
            .expect("connect");
        let reply = checkpoints
            .commit_data_checkpoint(v1::CommitDataCheckpointRequest {
                step: 100,
                rank: 0,
                world_size: 1,
                positions,
                epoch: 0,
            })
            .await
            .expect("commit")
            .into_inner();
        let Some(v1::commit_data_checkpoint_reply::State::Token(token)) = reply.state else {
            panic!("the only rank committed, so the checkpoint is complete: {reply:?}");
        };
        // Training goes on past the checkpoint before the AM dies.
        daemon.consume_step();
        daemon.report(&mut client).await;
        token
    });
    assert_eq!(common::status_json(&address)["tasks"]["rows_consumed"], 80);
    am.kill();

    let am = AmProcess::start(&spec, "127.0.0.1:0", &["--resume-from", &token]);
    let status = common::status_json(&am.address);
    assert_eq!(
        status["tasks"]["rows_consumed"], 40,
        "back at the checkpoint's step"
    );
    assert_eq!(status["tasks"]["in_flight"], 0, "every task queued again");
    assert_eq!(status["tasks"]["pending"], 40);
    drop(am);

    let unknown = common::sluice()
        .arg("am")
        .arg(&spec)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--resume-from",
            "recovery-step9-00000000",
        ])
        .output()
        .expect("run sluice am");
    assert!(!unknown.status.success());
    let message = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        message.contains("recovery-step9-00000000 is not in"),
        "{message}"
    );
}
