//! Names from the wire and the environment are checked like names from the spec: a job name that
//! would lead out of the ring directory (`..`, a path) is refused by the daemon, whether an AM
//! answers it or `--job` gives it, and by a trainer's `--job`, with an error naming it and the
//! rule; nothing is created outside the ring directory.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;

use common::sluice;
use sluice_proto::v1::daemon_service_server::{DaemonService, DaemonServiceServer};
use sluice_proto::v1::{
    AckStopReply, AckStopRequest, AcquireTasksReply, AcquireTasksRequest, HeartbeatReply,
    HeartbeatRequest, RegisterReply, RegisterRequest, ReportTaskReply, ReportTaskRequest,
};
use tonic::{Request, Response, Status};

/// An AM that answers every registration with the job name it was made with.
struct HostileAm {
    job_id: String,
}

#[tonic::async_trait]
impl DaemonService for HostileAm {
    async fn register(
        &self,
        _: Request<RegisterRequest>,
    ) -> Result<Response<RegisterReply>, Status> {
        Ok(Response::new(RegisterReply {
            job_id: self.job_id.clone(),
            heartbeat_interval_ms: 100,
            ..RegisterReply::default()
        }))
    }

    async fn heartbeat(
        &self,
        _: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatReply>, Status> {
        Err(Status::unimplemented(
            "a registration is all this AM answers",
        ))
    }

    async fn acquire_tasks(
        &self,
        _: Request<AcquireTasksRequest>,
    ) -> Result<Response<AcquireTasksReply>, Status> {
        Err(Status::unimplemented(
            "a registration is all this AM answers",
        ))
    }

    async fn report_task(
        &self,
        _: Request<ReportTaskRequest>,
    ) -> Result<Response<ReportTaskReply>, Status> {
        Err(Status::unimplemented(
            "a registration is all this AM answers",
        ))
    }

    async fn ack_stop(&self, _: Request<AckStopRequest>) -> Result<Response<AckStopReply>, Status> {
        Err(Status::unimplemented(
            "a registration is all this AM answers",
        ))
    }
}

/// Serves a [`HostileAm`] on loopback; returns its address.
fn serve(runtime: &tokio::runtime::Runtime, job_id: &str) -> SocketAddr {
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let address = listener.local_addr().expect("an address");
    let service = DaemonServiceServer::new(HostileAm {
        job_id: job_id.to_owned(),
    });
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    address
}

fn daemon(am: &str, ring_dir: &Path, job: Option<&str>) -> Output {
    let mut command = sluice();
    command
        .args([
            "daemon",
            "--am",
            am,
            "--node-id",
            "0",
            "--am-timeout-s",
            "5",
        ])
        .arg("--ring-dir")
        .arg(ring_dir)
        .env_remove("SLUICE_JOB");
    if let Some(job) = job {
        command.args(["--job", job]);
    }
    command.output().expect("run sluice daemon")
}

/// Every entry under `directory`, recursively.
fn entries(directory: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(directory).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(entries(&path));
        }
        found.push(path);
    }
    found
}

#[test]
fn a_job_name_that_leads_out_of_the_ring_directory_is_refused() {
    let directory = tempfile::tempdir().expect("tempdir");
    let ring_dir = directory.path().join("rings").join("inside");
    std::fs::create_dir_all(&ring_dir).expect("the ring directory");
    // The AMs serve on the runtime's worker while the test waits for the processes.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    for hostile in ["../../escaped", "/tmp/absolute", "a/b", ".."] {
        let am = serve(&runtime, hostile).to_string();
        let output = daemon(&am, &ring_dir, None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{hostile:?}: {stderr}");
        assert!(
            stderr.contains("the AM's answer to the registration names the job")
                && stderr.contains("cannot name files"),
            "{hostile:?}: {stderr}"
        );

        let output = daemon(&am, &ring_dir, Some(hostile));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{hostile:?}: {stderr}");
        assert!(
            stderr.contains("--job (SLUICE_JOB) names the job"),
            "{hostile:?}: {stderr}"
        );

        let output = sluice()
            .args(["consume", "--job", hostile, "--ring-dir"])
            .arg(&ring_dir)
            .env("SLUICE_RANK", "0")
            .env("SLUICE_WORLD_SIZE", "1")
            .env_remove("SLUICE_RING")
            .output()
            .expect("run sluice consume");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{hostile:?}: {stderr}");
        assert!(
            stderr.contains("--job (SLUICE_JOB) names the job"),
            "{hostile:?}: {stderr}"
        );
    }
    assert_eq!(
        entries(directory.path()),
        vec![ring_dir.clone(), directory.path().join("rings")],
        "nothing was made beside the ring directory"
    );
    assert!(
        !Path::new("/tmp/absolute").exists(),
        "nothing was made at an absolute path"
    );
}
