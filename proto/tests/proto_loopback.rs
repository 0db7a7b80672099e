//! A real tonic server on loopback and the generated client: `Register` and `Heartbeat` go over the
//! wire and their replies come back intact.

use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
use sluice_proto::v1::daemon_service_server::{DaemonService, DaemonServiceServer};
use sluice_proto::v1::{
    AckStopReply, AckStopRequest, AcquireTasksReply, AcquireTasksRequest, Command, HeartbeatReply,
    HeartbeatRequest, Refusal, Refuse, RegisterReply, RegisterRequest, ReportTaskReply,
    ReportTaskRequest, RingStats, StopTask, TaskProgress, UnknownNode, command, refusal,
};
use sluice_proto::{JobId, NodeId, TaskId};
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// The one node the echo service knows.
const KNOWN_NODE: NodeId = NodeId(7);

/// Answers `Register` and `Heartbeat` from the request alone: it echoes the job and asks every
/// reported task to stop at its reported count; other calls are unimplemented.
#[derive(Debug)]
struct EchoDaemonService;

fn stop_at(task_id: u64, row: u64) -> Command {
    Command {
        command: Some(command::Command::Stop(StopTask { task_id, row })),
    }
}

#[tonic::async_trait]
impl DaemonService for EchoDaemonService {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterReply>, Status> {
        let request = request.into_inner();
        let commands = request
            .held
            .iter()
            .map(|held| stop_at(held.task_id, held.enqueued))
            .collect();
        Ok(Response::new(RegisterReply {
            job_id: request.job_id,
            heartbeat_interval_ms: 250,
            commands,
            ..RegisterReply::default()
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        let request = request.into_inner();
        if NodeId::from(request.node_id) != KNOWN_NODE {
            let refuse = Refuse {
                reason: Some(Refusal {
                    kind: Some(refusal::Kind::UnknownNode(UnknownNode {})),
                }),
                message: format!("{} never registered", NodeId::from(request.node_id)),
            };
            return Ok(Response::new(HeartbeatReply {
                commands: vec![Command {
                    command: Some(command::Command::Refuse(refuse)),
                }],
                journal: None,
            }));
        }
        let commands = request
            .progress
            .iter()
            .map(|progress| stop_at(progress.task_id, progress.consumed))
            .collect();
        Ok(Response::new(HeartbeatReply {
            commands,
            journal: None,
        }))
    }

    async fn acquire_tasks(
        &self,
        _request: Request<AcquireTasksRequest>,
    ) -> Result<Response<AcquireTasksReply>, Status> {
        Err(Status::unimplemented("the echo service hands out no tasks"))
    }

    async fn report_task(
        &self,
        _request: Request<ReportTaskRequest>,
    ) -> Result<Response<ReportTaskReply>, Status> {
        Err(Status::unimplemented("the echo service takes no reports"))
    }

    async fn ack_stop(
        &self,
        _request: Request<AckStopRequest>,
    ) -> Result<Response<AckStopReply>, Status> {
        Err(Status::unimplemented(
            "the echo service takes no stop acknowledgements",
        ))
    }
}

fn stop_rows(commands: &[Command]) -> Vec<(TaskId, u64)> {
    commands
        .iter()
        .map(|command| match &command.command {
            Some(command::Command::Stop(stop)) => (TaskId::from(stop.task_id), stop.row),
            other => panic!("expected a stop command, got {other:?}"),
        })
        .collect()
}

async fn register_and_heartbeat(address: std::net::SocketAddr) {
    let mut sut = DaemonServiceClient::connect(format!("http://{address}"))
        .await
        .expect("the client connects to the loopback server");

    let registered = sut
        .register(RegisterRequest {
            node_by_host: false,
            node_id: KNOWN_NODE.into(),
            job_id: JobId::from("quickstart").into(),
            hostname: "localhost".into(),
            held: vec![TaskProgress {
                task_id: TaskId(5).into(),
                enqueued: 300,
                consumed: 200,
                bad: Vec::new(),
                sent: 0,
                dropped: Vec::new(),
            }],
        })
        .await
        .expect("register succeeds")
        .into_inner();
    assert_eq!(JobId::from(registered.job_id), JobId::from("quickstart"));
    assert_eq!(registered.heartbeat_interval_ms, 250);
    assert_eq!(stop_rows(&registered.commands), vec![(TaskId(5), 300)]);

    let heartbeat = sut
        .heartbeat(HeartbeatRequest {
            hostname: String::new(),
            node_id: KNOWN_NODE.into(),
            progress: vec![
                TaskProgress {
                    task_id: 5,
                    enqueued: 400,
                    consumed: 350,
                    bad: Vec::new(),
                    sent: 0,
                    dropped: Vec::new(),
                },
                TaskProgress {
                    task_id: 9,
                    enqueued: 10,
                    consumed: 0,
                    bad: Vec::new(),
                    sent: 0,
                    dropped: Vec::new(),
                },
            ],
            stages: Vec::new(),
            rings: vec![RingStats {
                rank: 0,
                used_bytes: 64,
                capacity_bytes: 1024,
                trainer_wait_ns: 1,
                daemon_wait_ns: 2,
                reader_idle_ms: 0,
                reader_interval_ms: 0,
                ..RingStats::default()
            }],
            keeps_finished_until_durable: true,
            tuning: None,
        })
        .await
        .expect("heartbeat succeeds")
        .into_inner();
    assert_eq!(
        stop_rows(&heartbeat.commands),
        vec![(TaskId(5), 350), (TaskId(9), 0)]
    );

    let refused = sut
        .heartbeat(HeartbeatRequest {
            node_id: 8,
            ..HeartbeatRequest::default()
        })
        .await
        .expect("a heartbeat of an unknown node is answered, not failed")
        .into_inner();
    let [
        Command {
            command: Some(command::Command::Refuse(refuse)),
        },
    ] = refused.commands.as_slice()
    else {
        panic!("expected one refusal, got {:?}", refused.commands);
    };
    assert_eq!(
        refuse
            .reason
            .as_ref()
            .and_then(|reason| reason.kind.as_ref()),
        Some(&refusal::Kind::UnknownNode(UnknownNode {}))
    );
    assert_eq!(refuse.message, "node-8 never registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_and_heartbeat_over_loopback() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind an ephemeral loopback port");
    let address = listener.local_addr().expect("the listener has an address");
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DaemonServiceServer::new(EchoDaemonService))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                // An error means the sender was dropped; either way the server stops.
                let _ = server_stopped.await;
            }),
    );

    tokio::time::timeout(Duration::from_secs(30), register_and_heartbeat(address))
        .await
        .expect("register and heartbeat finish within 30 s on loopback");

    stop_server.send(()).expect("the server is still running");
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the server stops within 30 s")
        .expect("the server task did not panic")
        .expect("the server ran without a transport error");
}
