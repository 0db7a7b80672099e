//! The AM's one listener: the gRPC API over HTTP/2 and the JSON checkpoint calls over HTTP/1.1,
//! on the same address, behind the same token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_am::checkpoint_store::CheckpointStore;
use sluice_am::http::checkpoints::{COMMIT_ROUTE, RESTORE_ROUTE};
use sluice_am::plan::JobPlan;
use sluice_am::server::{AmOptions, AmServer};
use sluice_am::spec::{Format, JobSpec};
use sluice_proto::BearerToken;
use sluice_proto::v1;
use sluice_proto::v1::checkpoint_service_client::CheckpointServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "s3cret";

/// How long a request may take before the test fails as a deadlock.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Starts an AM of a job of one rank over one split, with a token, and serves it in the
/// background; returns its address.
async fn serve_am() -> SocketAddr {
    let spec = JobSpec::parse(
        r#"
name: port
data: { sources: [{ uri: "file:///data", format: parquet }], task_rows: 10 }
nodes: 1
roles: [{ name: worker, num: 1, command: [train] }]
"#,
        Format::Yaml,
    )
    .expect("a valid spec");
    let mut plan = JobPlan::default();
    plan.extend(
        0,
        vec![sluice_formats::Split {
            task_id: 0,
            uri: "file:///data/a.parquet".into(),
            file_size: 1,
            first_row: 0,
            row_count: 20,
            partition_values: Vec::new(),
            delta: None,
            bytes: None,
            identity: None,
        }],
    );
    let options = AmOptions {
        listen: "127.0.0.1:0".parse().expect("an address"),
        token: Some(TOKEN.into()),
        resume_from: None,
        launch: None,
        tls: None,
        insecure: false,
        advertise: None,
    };
    let server =
        AmServer::start_with_plan(Arc::new(spec), plan, CheckpointStore::in_memory(), options)
            .await
            .expect("the AM starts");
    let address = server.local_addr();
    tokio::spawn(server.serve());
    address
}

/// Sends one HTTP/1.1 request and returns the status code and the body.
async fn http1(
    address: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("the AM accepts connections");
        let authorization = token.map_or(String::new(), |token| {
            format!("Authorization: Bearer {token}\r\n")
        });
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("the request is sent");
        let mut answer = Vec::new();
        stream
            .read_to_end(&mut answer)
            .await
            .expect("the answer is read");
        answer
    };
    let answer = tokio::time::timeout(WATCHDOG, exchange)
        .await
        .expect("the AM answers: deadlock watchdog");
    let answer = String::from_utf8(answer).expect("a UTF-8 answer");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP answer: {answer:?}"));
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    let status = head[9..12].parse().expect("a status code");
    let body = serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {answer}"));
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_serves_grpc_and_the_json_checkpoint_calls() {
    let address = serve_am().await;

    let (status, refused) = http1(address, "POST", COMMIT_ROUTE, "{}", None).await;
    assert_eq!(status, 401, "{refused}");
    assert_eq!(refused["code"], "unauthenticated");

    let commit = r#"{"step": 5, "rank": 0, "world_size": 1, "epoch": 0, "positions": [{"task_id": 0, "end_row": 4}]}"#;
    let (status, committed) = http1(address, "POST", COMMIT_ROUTE, commit, Some(TOKEN)).await;
    assert_eq!(status, 200, "{committed}");
    let token = committed["token"].as_str().expect("a token").to_owned();

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("an endpoint")
        .connect_timeout(WATCHDOG)
        .timeout(WATCHDOG)
        .connect()
        .await
        .expect("the gRPC client connects");
    let mut grpc =
        CheckpointServiceClient::with_interceptor(channel, BearerToken(Some(TOKEN.into())));
    let reply = grpc
        .commit_data_checkpoint(v1::CommitDataCheckpointRequest {
            step: 5,
            rank: 0,
            world_size: 1,
            epoch: 0,
            positions: vec![v1::TaskPosition {
                task_id: 0,
                end_row: 4,
            }],
        })
        .await
        .expect("the gRPC commit is answered")
        .into_inner();
    assert_eq!(
        reply.state,
        Some(v1::commit_data_checkpoint_reply::State::Token(
            token.clone()
        )),
        "gRPC and JSON share one AM"
    );

    let restore = serde_json::json!({ "token": token }).to_string();
    let (status, restored) = http1(address, "POST", RESTORE_ROUTE, &restore, Some(TOKEN)).await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(
        restored,
        serde_json::json!({ "step": 5, "epoch": 0, "effect": "rings_replaced" })
    );

    let (status, unknown) = http1(address, "GET", "/api/status", "", Some(TOKEN)).await;
    assert_eq!(status, 404, "{unknown}");
    assert!(
        unknown["message"]
            .as_str()
            .is_some_and(|message| message.contains("sluice am --http")),
        "{unknown}"
    );

    let mut unauthenticated = CheckpointServiceClient::connect(format!("http://{address}"))
        .await
        .expect("the gRPC client connects");
    let refused = unauthenticated
        .restore_data_checkpoint(v1::RestoreDataCheckpointRequest { token, rank: None })
        .await
        .expect_err("a gRPC call without the token is refused");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
}
