//! The AM's HTTP face: the status page, its JSON API and Prometheus `/metrics`, on the address of
//! `sluice am --http`; and the JSON form of the checkpoint calls ([`checkpoints`]), which the gRPC
//! API's listener serves.
//!
//! - `GET /` is one HTML document with its CSS and JS inline, so it works with no network beyond
//!   the AM. Its script polls the JSON API every second and draws the charts as inline SVG.
//! - `GET /api/status` is the object of `sluice status --json`, plus `history`: one sample per
//!   second of the rows consumed, the throughput and the ring waits, for the charts.
//! - `GET /api/tasks` is the task table: the tasks in flight with their progress, and the count of
//!   tasks in each state.
//! - `GET /metrics` is the OpenMetrics text exposition, which Prometheus scrapes.
//!
//! When the AM has a shared token, every route but the page requires it, as `Authorization:
//! Bearer <token>`, never in the address (addresses end up in logs and browser histories). The page
//! holds no data of the job: it asks for the token in a form when the API refuses it, keeps it in
//! the tab's session storage, and sends it with each API call. A link may carry it after `#token=`,
//! which browsers never send: the page moves it to the session storage and drops it from the
//! address.
//!
//! With TLS ([`HttpServer::bind`]'s `tls`), the page is served over HTTPS with the AM's
//! certificate.
//!
//! The server runs on the AM's runtime beside the gRPC API and reads the same [`Am`]: every
//! request takes the master's lock once, long enough to copy out what it shows.

pub mod checkpoints;
mod history;
mod metrics;

#[cfg(test)]
mod tests;

use crate::clock::wall_ms;
use crate::connections::{ConnectionGuard, ConnectionInfo, GuardedListener, Ticket};
use crate::error::{AmError, Result};
use crate::service::{Am, TokenCheck};
use crate::status::status_json;
use crate::tls::{ServerTls, TlsListener, check_bind};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use history::{History, Sample};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::rustls;

/// The status page, served as it is.
const PAGE: &str = include_str!("page.html");

/// How often the sampler records a point of the charts.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// How many samples the charts keep: an hour at one per second.
const HISTORY_SAMPLES: usize = 3600;

/// The content type of the OpenMetrics text exposition that `prometheus-client` writes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A bound status server, ready to serve.
#[derive(Debug)]
pub struct HttpServer {
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: HttpState,
}

impl HttpServer {
    /// Binds `address` for the HTTP face of `am`; with a `token`, every API route requires it,
    /// and with `tls`, it serves HTTPS. A non-loopback address needs both, or `insecure`.
    pub async fn bind(
        address: SocketAddr,
        am: Arc<Am>,
        token: Option<String>,
        tls: Option<&ServerTls>,
        insecure: bool,
    ) -> Result<HttpServer> {
        check_bind(
            "the status page",
            address,
            tls.is_some(),
            token.is_some(),
            insecure,
        )?;
        let tls = tls.map(ServerTls::http).transpose()?;
        let listener = crate::connections::bind(address).map_err(|cause| AmError::Http {
            address: address.to_string(),
            cause,
        })?;
        Ok(HttpServer {
            listener,
            tls,
            state: HttpState::new(am, token),
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Samples the job every second and serves until the server fails; dropping the future stops
    /// both.
    pub async fn serve(self) -> Result<()> {
        let address = self.local_addr();
        let sampler = sample(self.state.clone());
        tracing::info!(%address, tls = self.tls.is_some(), "status page serving");
        let router = router(self.state);
        // Connections are admitted by a guard that closes those showing no token in time (see
        // `connections`); the token check tells it which did.
        let guard = ConnectionGuard::new("the status page");
        let served = async move {
            match self.tls {
                Some(config) => {
                    let listener =
                        TlsListener::new(self.listener, guard, config).map_err(|cause| {
                            AmError::Http {
                                address: address.to_string(),
                                cause,
                            }
                        })?;
                    axum::serve(
                        listener,
                        router.into_make_service_with_connect_info::<ConnectionInfo>(),
                    )
                    .await
                }
                None => {
                    axum::serve(
                        GuardedListener::new(self.listener, guard),
                        router.into_make_service_with_connect_info::<ConnectionInfo>(),
                    )
                    .await
                }
            }
            .map_err(|cause| AmError::Http {
                address: address.to_string(),
                cause,
            })
        };
        tokio::select! {
            served = served => served,
            never = sampler => match never {},
        }
    }
}

/// What the routes share.
#[derive(Debug, Clone)]
struct HttpState {
    am: Arc<Am>,
    history: Arc<Mutex<History>>,
    token: TokenCheck,
}

impl HttpState {
    fn new(am: Arc<Am>, token: Option<String>) -> HttpState {
        HttpState {
            am,
            history: Arc::new(Mutex::new(History::new(HISTORY_SAMPLES))),
            token: TokenCheck::new(token),
        }
    }

    /// Locks the history. A panic while it was held leaves at worst one sample missing, so the
    /// lock is taken over rather than poisoning every later request.
    fn history(&self) -> MutexGuard<'_, History> {
        self.history
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Records one sample of the job per [`SAMPLE_INTERVAL`], forever.
async fn sample(state: HttpState) -> Infallible {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        let status = state.am.status();
        state.history().record(Sample::of(wall_ms(), &status));
    }
}

/// The page, and the data routes behind the token check.
fn router(state: HttpState) -> Router {
    let data = Router::new()
        .route("/api/status", get(api_status))
        .route("/api/tasks", get(api_tasks))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            check_token,
        ));
    Router::new()
        .route("/", get(page))
        .merge(data)
        .with_state(state)
}

async fn page() -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Html(PAGE),
    )
}

async fn api_status(State(state): State<HttpState>) -> impl IntoResponse {
    let status = state.am.status();
    let mut body = status_json(&status);
    let history =
        serde_json::to_value(state.history().samples()).expect("history samples serialize to JSON");
    body["history"] = history;
    axum::Json(body)
}

async fn api_tasks(State(state): State<HttpState>) -> impl IntoResponse {
    axum::Json(state.am.master().task_table())
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let status = state.am.status();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE),
        )],
        metrics::exposition(&status),
    )
}

/// Whether `request` passes `token`: the AM has no token, or the request carries it in its
/// `Authorization` header (gRPC metadata is that header too). A request that passes tells its
/// connection's guard that the connection showed the token ([`Ticket::show_token`]).
fn shows_token(token: &TokenCheck, request: &Request) -> bool {
    let from_header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let shown = token.accepts_authorization(from_header);
    if shown && let Some(ticket) = Ticket::of(request.extensions()) {
        ticket.show_token();
    }
    shown
}

/// Tells a request's connection guard when the request shows the AM's token, and passes every
/// request on: the routes behind it check the token themselves. It wraps the routes of the gRPC
/// port, whose services check the token in tonic's interceptors.
pub async fn note_token(State(token): State<TokenCheck>, request: Request, next: Next) -> Response {
    shows_token(&token, &request);
    next.run(request).await
}

/// Lets a request through when the AM has no token, or when the request carries it in its
/// `Authorization` header.
async fn check_token(State(state): State<HttpState>, request: Request, next: Next) -> Response {
    if shows_token(&state.token, &request) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))],
        "this AM requires its shared token: send `Authorization: Bearer <token>` (the status page asks for it), with the token given to the AM by --token or SLUICE_TOKEN\n",
    )
        .into_response()
}
