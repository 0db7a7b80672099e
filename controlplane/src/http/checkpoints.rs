//! The data checkpoint calls of the gRPC `CheckpointService` as JSON over HTTP, for clients with no
//! gRPC stack: the Python package calls them with its standard library.
//!
//! The routes are served on the gRPC API's own port (see [`crate::server`]), so a trainer needs
//! only `SLUICE_AM`:
//! - `POST /api/v1/checkpoints/commit` takes `{"step", "rank", "world_size", "epoch",
//!   "positions": [{"task_id", "end_row"}]}`, as `CommitDataCheckpoint` does, and answers
//!   `{"token": ...}` once every rank of the step has reported, `{"pending": {"ranks_reported",
//!   "world_size"}}` before.
//! - `POST /api/v1/checkpoints/restore` takes `{"token"}` (and the `rank` asking, for trainers that no AM launched), as `RestoreDataCheckpoint` does, and
//!   answers `{"step", "epoch", "effect"}`, the effect being `"already_there"`,
//!   `"trainers_restart"` or `"rings_replaced"`.
//! - `POST /api/v1/job` takes `{}` and answers `{"job_id", "world_size"}`: a trainer that someone
//!   else launched asks it for the job directory its ring is in (see `sluice_ring::announce`).
//!
//! Both call the [`Am`] methods the gRPC service calls, and require the AM's shared token, when it
//! has one, as `Authorization: Bearer <token>` (the gRPC API's [`TokenCheck`]). Unknown fields of a
//! request are ignored, as protobuf ignores them. A refused call answers with an HTTP status (400
//! for a malformed request, 401 without the token, 404 for an unknown checkpoint, 409 when the
//! job's state refuses it, 503 when the journal fails, 500 otherwise) and the body
//! `{"code", "message"}`, the message naming the problem and its fix.

use crate::decide::TaskId;
use crate::error::AmError;
use crate::master::calls::RankCommit;
use crate::service::{Am, TokenCheck};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use sluice_proto::v1;
use std::sync::Arc;

/// The largest request body the routes take: a commit lists a position per task the rank read in
/// its epoch, about 40 bytes each, so this holds several hundred thousand tasks.
const MAX_REQUEST_BYTES: usize = 32 << 20;

/// The route of a rank's commit.
pub const COMMIT_ROUTE: &str = "/api/v1/checkpoints/commit";

/// The route of a restore.
pub const RESTORE_ROUTE: &str = "/api/v1/checkpoints/restore";

/// The route a trainer asks which job it belongs to.
pub const JOB_ROUTE: &str = "/api/v1/job";

/// The checkpoint and job routes of `am`, behind `check`.
pub fn router(am: Arc<Am>, check: TokenCheck) -> Router {
    Router::new()
        .route(COMMIT_ROUTE, post(commit))
        .route(RESTORE_ROUTE, post(restore))
        .route(JOB_ROUTE, post(job))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(axum::middleware::from_fn_with_state(check, require_token))
        .with_state(am)
}

/// One rank's data position at a step, as `CommitDataCheckpointRequest` carries it.
#[derive(Debug, Deserialize)]
struct CommitRequest {
    step: u64,
    rank: u32,
    world_size: u32,
    epoch: u32,
    positions: Vec<TaskPosition>,
}

/// How far the rank consumed one task: the split row, exclusive, up to which it trained on it.
#[derive(Debug, Deserialize)]
struct TaskPosition {
    task_id: u64,
    end_row: u64,
}

impl From<CommitRequest> for RankCommit {
    fn from(request: CommitRequest) -> RankCommit {
        RankCommit {
            step: request.step,
            rank: request.rank,
            world_size: request.world_size,
            epoch: request.epoch,
            positions: request
                .positions
                .into_iter()
                .map(|position| (TaskId(position.task_id), position.end_row))
                .collect(),
        }
    }
}

/// Where a commit stands: exactly one of the fields is set.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum CommitReply {
    /// Every rank reported: the token that names the checkpoint.
    Token(String),
    /// Other ranks of the step have not reported yet.
    Pending {
        ranks_reported: u32,
        world_size: u32,
    },
}

/// A request to go back to the data checkpoint a commit named.
#[derive(Debug, Deserialize)]
struct RestoreRequest {
    token: String,
    /// The rank asking, for trainers that no AM launched.
    #[serde(default)]
    rank: Option<u32>,
}

/// The point the task table was reset to, and what the restore does to the trainers.
#[derive(Debug, Serialize)]
struct RestoreReply {
    step: u64,
    epoch: u32,
    effect: &'static str,
}

/// The job a trainer belongs to.
#[derive(Debug, Serialize)]
struct JobReply {
    job_id: String,
    world_size: u32,
}

async fn job(State(am): State<Arc<Am>>) -> axum::Json<JobReply> {
    let master = am.master();
    axum::Json(JobReply {
        job_id: master.job_id().to_owned(),
        world_size: master.world_size(),
    })
}

async fn commit(
    State(am): State<Arc<Am>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<CommitReply>, ApiError> {
    let request: CommitRequest = parse(
        body,
        r#"{"step": 0, "rank": 0, "world_size": 1, "epoch": 0, "positions": [{"task_id": 0, "end_row": 0}]}"#,
    )?;
    let reply = am.commit_checkpoint(request.into()).await?;
    let reply = match reply.state {
        Some(v1::commit_data_checkpoint_reply::State::Token(token)) => CommitReply::Token(token),
        Some(v1::commit_data_checkpoint_reply::State::Pending(pending)) => CommitReply::Pending {
            ranks_reported: pending.ranks_reported,
            world_size: pending.world_size,
        },
        None => {
            return Err(ApiError::internal(
                "the AM answered a data checkpoint commit with neither a token nor a pending state"
                    .to_owned(),
            ));
        }
    };
    Ok(axum::Json(reply))
}

async fn restore(
    State(am): State<Arc<Am>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<RestoreReply>, ApiError> {
    let request: RestoreRequest = parse(body, r#"{"token": "..."}"#)?;
    let reply = am.restore(&request.token, request.rank).await?;
    let effect = match reply.effect() {
        v1::RestoreEffect::AlreadyThere => "already_there",
        v1::RestoreEffect::TrainersRestart => "trainers_restart",
        v1::RestoreEffect::RingsReplaced => "rings_replaced",
        v1::RestoreEffect::Unspecified => {
            return Err(ApiError::internal(format!(
                "the AM restored data checkpoint {} without saying what the restore does to the trainers",
                request.token
            )));
        }
    };
    Ok(axum::Json(RestoreReply {
        step: reply.step,
        epoch: reply.epoch,
        effect,
    }))
}

/// The request of a body, or a 400 naming what is wrong with it and the shape expected.
fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    expected: &str,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| ApiError {
        status: rejection.status(),
        code: "invalid_argument",
        message: format!("reading the request body: {}", rejection.body_text()),
    })?;
    serde_json::from_slice(&body).map_err(|error| ApiError {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_argument",
        message: format!(
            "the request body is not the JSON object expected: {error}; send {expected}"
        ),
    })
}

/// Lets a request through when the AM has no token, or when its `Authorization` header carries it.
async fn require_token(State(check): State<TokenCheck>, request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if check.accepts_authorization(authorization) {
        return next.run(request).await;
    }
    let mut response = ApiError {
        status: StatusCode::UNAUTHORIZED,
        code: "unauthenticated",
        message: "this AM requires its shared token: send `Authorization: Bearer <token>` with the token given to the AM by --token or SLUICE_TOKEN (a trainer passes SLUICE_TOKEN on)".to_owned(),
    }
    .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// A refused call: its HTTP status and the JSON body `{"code", "message"}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    /// The name of the gRPC status code the gRPC API answers the same refusal with.
    code: &'static str,
    message: String,
}

impl ApiError {
    fn internal(message: String) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message,
        }
    }
}

/// The gRPC API's mapping of an [`AmError`] onto a status code (`impl From<AmError> for
/// tonic::Status`), carried on to the HTTP status of the same meaning.
impl From<AmError> for ApiError {
    fn from(error: AmError) -> ApiError {
        let status = tonic::Status::from(error);
        let (http_status, code) = match status.code() {
            tonic::Code::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_argument"),
            tonic::Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            tonic::Code::FailedPrecondition => (StatusCode::CONFLICT, "failed_precondition"),
            tonic::Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError {
            status: http_status,
            code,
            message: status.message().to_owned(),
        }
    }
}

/// Answers a request no route of the AM's port takes: a gRPC call with the gRPC status
/// `UNIMPLEMENTED`, as tonic does, and any other request with 404 and a JSON error body.
pub async fn unknown_route(request: Request) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return tonic::Status::unimplemented("").into_http::<axum::body::Body>();
    }
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: format!(
            "no route {} {} on the AM's API port: it serves gRPC, POST {COMMIT_ROUTE} and POST {RESTORE_ROUTE}; the status page is on the address given to `sluice am --http`",
            request.method(),
            request.uri().path()
        ),
    }
    .into_response()
}

#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code,
            message: &self.message,
        };
        (self.status, axum::Json(body)).into_response()
    }
}
