//! Running an AM: plan the job, serve the gRPC API, tick, and exit once the job is over.
//!
//! One listener serves both the gRPC API (HTTP/2) and the JSON form of the checkpoint calls
//! ([`checkpoints`], HTTP/1.1 or HTTP/2), so that clients with no gRPC stack, such as the Python
//! package, reach the AM at the same address, `SLUICE_AM`. The status page keeps its own listener.

use crate::checkpoint_store::CheckpointStore;
use crate::connections::ConnectionGuard;
use crate::error::{AmError, Result};
use crate::http::checkpoints;
use crate::journal::{self, JournalConfig};
use crate::launcher::{ExecutorEvent, Launcher};
use crate::master::Master;
use crate::persist::Persist;
use crate::plan::JobPlan;
use crate::service::{Am, AmService, ExecutorLauncher, ExecutorSetup, TokenCheck};
use crate::spec::JobSpec;
use crate::tls::{ServerTls, check_bind};
use sluice_proto::v1;
use sluice_proto::v1::checkpoint_service_server::CheckpointServiceServer;
use sluice_proto::v1::control_service_server::ControlServiceServer;
use sluice_proto::v1::daemon_service_server::DaemonServiceServer;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tonic::service::Routes;
use tonic::transport::ServerTlsConfig;

/// How an AM is run.
#[derive(Debug, Clone)]
pub struct AmOptions {
    /// The address of the gRPC API and of the JSON checkpoint calls.
    pub listen: SocketAddr,
    /// A shared token every caller must present.
    pub token: Option<String>,
    /// A data checkpoint to reset the job to before serving.
    pub resume_from: Option<String>,
    /// Launch the job's executors (daemons and trainers) with this launcher.
    pub launch: Option<LaunchOptions>,
    /// Serve over TLS with this certificate, and ask daemons for theirs.
    pub tls: Option<ServerTls>,
    /// Serve a non-loopback address without TLS and a token: the network is trusted.
    pub insecure: bool,
    /// The address daemons reach this AM at, written under the checkpoint location; by default
    /// the listen address, or this host's name with its port when it listens on every address.
    pub advertise: Option<String>,
}

/// How the AM launches the job's executors.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The launcher.
    pub launcher: Arc<dyn Launcher>,
    /// The `sluice` binary the daemons run.
    pub sluice: PathBuf,
    /// The directory rings live under.
    pub ring_dir: PathBuf,
    /// The group the daemons share their rings with (`--shared-group`), if any.
    pub shared_group: Option<String>,
    /// The size of each ring the daemons create, in bytes.
    pub ring_size: u64,
    /// The CA executors check the AM's certificate with, when it serves TLS.
    pub tls_ca: Option<PathBuf>,
}

/// A bound, planned AM, ready to serve.
#[derive(Debug)]
pub struct AmServer {
    am: Arc<Am>,
    listener: TcpListener,
    /// The TLS settings of the gRPC port, when it serves TLS.
    tls: Option<ServerTlsConfig>,
    /// Whether daemons must present a client certificate.
    daemon_certs: bool,
    token: Option<String>,
    tick_interval: Duration,
    /// The launcher, and the stream of its executors' events.
    executors: Option<(ExecutorLauncher, mpsc::UnboundedReceiver<ExecutorEvent>)>,
}

/// The state a job ended in, as the AM saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEnd {
    /// The final state.
    pub state: v1::JobState,
    /// Why it failed, when it did.
    pub failure_reason: Option<String>,
    /// Rows consumed over every epoch.
    pub rows_consumed: u64,
}

impl AmServer {
    /// Plans the job (or loads the plan a previous AM stored), restores the journal, and binds
    /// the listen address.
    pub async fn start(spec: JobSpec, options: AmOptions) -> Result<AmServer> {
        let spec = Arc::new(spec);
        let checkpoints = match &spec.checkpoint {
            Some(checkpoint) => CheckpointStore::at(&checkpoint.uri, &Default::default())?,
            None => CheckpointStore::in_memory(),
        };
        let plan = match checkpoints.load_plan().await? {
            Some(plan) => plan,
            None => checkpoints.store_plan(JobPlan::build(&spec).await?).await?,
        };
        AmServer::start_with_plan(spec, plan, checkpoints, options).await
    }

    /// Starts from a plan made beforehand: restores the journal, if the job has one, and binds
    /// the listen address.
    pub async fn start_with_plan(
        spec: Arc<JobSpec>,
        plan: JobPlan,
        checkpoints: CheckpointStore,
        options: AmOptions,
    ) -> Result<AmServer> {
        let mut master = Master::new(spec.clone(), Arc::new(plan))?;
        if options.launch.is_some() {
            master.launch_executors();
        }
        let (persist, resumed) = match &spec.checkpoint {
            Some(checkpoint) => {
                let config = JournalConfig::new(journal_identity(&spec))
                    .writer(format!("sluice am on {}", options.listen));
                let (journal, recovered) =
                    journal::open(&checkpoint.uri, &Default::default(), config).await?;
                let resumed = recovered.snapshot.is_some() || !recovered.entries.is_empty();
                let entries = recovered.entries.len();
                if let Some(snapshot) = recovered.snapshot {
                    master.restore_snapshot(snapshot)?;
                }
                for entry in recovered.entries {
                    master.replay(entry)?;
                }
                if let Some(token) = master.restored_position_missing() {
                    let token = token.to_owned();
                    let position = checkpoints.get(&token).await.map_err(|error| {
                        AmError::FailedPrecondition(format!(
                            "the job was restored to data checkpoint {token}, whose rows count in its later checkpoints, and it cannot be read: {error}; put it back under the checkpoint location"
                        ))
                    })?;
                    master.restored_position(&position);
                }
                if resumed {
                    tracing::info!(
                        uri = checkpoint.uri,
                        entries,
                        epoch = master.table().epoch(),
                        "job taken over from its journal"
                    );
                }
                (
                    Persist::journal(journal, Duration::from_secs(checkpoint.interval_s)),
                    resumed,
                )
            }
            None => (Persist::in_memory(), false),
        };
        let am = Arc::new(Am::new(master, persist, checkpoints));
        if resumed {
            am.take_over();
        }
        if let Some(token) = &options.resume_from {
            let reply = am.resume_from(token).await?;
            tracing::info!(
                token,
                step = reply.step,
                epoch = reply.epoch,
                "job reset to data checkpoint"
            );
        }
        check_bind(
            "the AM's API",
            options.listen,
            options.tls.is_some(),
            options.token.is_some(),
            options.insecure,
        )?;
        let tls = options.tls.as_ref().map(ServerTls::grpc).transpose()?;
        let daemon_certs = options
            .tls
            .as_ref()
            .is_some_and(|tls| tls.client_ca.is_some());
        let listener =
            crate::connections::bind(options.listen).map_err(|source| AmError::Serve {
                address: options.listen.to_string(),
                source,
            })?;
        let tick_interval =
            Duration::from_millis((spec.failover.heartbeat_interval_ms / 2).clamp(10, 1000));
        let bound = listener.local_addr().map_err(|source| AmError::Serve {
            address: options.listen.to_string(),
            source,
        })?;
        if let Some(checkpoint) = &spec.checkpoint {
            let address = options
                .advertise
                .clone()
                .unwrap_or_else(|| advertised(bound));
            sluice_store::am_address::publish(&checkpoint.uri, &address)
                .await
                .map_err(|error| {
                    AmError::FailedPrecondition(format!(
                        "{error}; check that the checkpoint location is writable"
                    ))
                })?;
            tracing::info!(
                address,
                uri = checkpoint.uri,
                "the AM's address is published"
            );
        }
        let executors = options.launch.map(|launch| ExecutorLauncher {
            setup: ExecutorSetup {
                // Executors on other hosts reach the AM where it says it is; local ones at
                // loopback.
                am_address: if launch.launcher.remote() {
                    options
                        .advertise
                        .clone()
                        .unwrap_or_else(|| advertised(bound))
                } else {
                    reachable(bound).to_string()
                },
                sluice: launch.sluice,
                ring_dir: launch.ring_dir,
                shared_group: launch.shared_group,
                ring_size: launch.ring_size,
                token: options.token.clone(),
                tls_ca: launch.tls_ca,
            },
            launcher: launch.launcher,
        });
        let executors = match executors {
            Some(executors) => {
                let events = executors.launcher.events().ok_or_else(|| {
                    AmError::FailedPrecondition(
                        "the launcher's executor events were already taken by another AM in this process; give each AM a launcher of its own".to_owned(),
                    )
                })?;
                am.adopt_executors(&executors);
                Some((executors, events))
            }
            None => None,
        };
        Ok(AmServer {
            am,
            listener,
            tls,
            daemon_certs,
            token: options.token,
            tick_interval,
            executors,
        })
    }

    /// The address the gRPC API and the JSON checkpoint calls listen on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The shared state, for the HTTP status page and tests.
    pub fn am(&self) -> Arc<Am> {
        self.am.clone()
    }

    /// Serves until the job is over and every daemon was told so.
    ///
    /// While the job waits for daemons or trainers that the AM does not launch, its log says so
    /// (see [`Master::waiting`](crate::master::Master::waiting)), when that changes and every
    /// [`WAITING_LOG_INTERVAL`] meanwhile.
    pub async fn serve(self) -> Result<JobEnd> {
        let address = self.local_addr();
        let check = TokenCheck::new(self.token);
        let service = AmService::new(self.am.clone(), self.daemon_certs);
        // Connections are admitted by a guard that closes those showing no token in time (see
        // `connections`); the routes' token layer tells it which did.
        let guard = ConnectionGuard::new("the AM's API");
        let incoming =
            futures::stream::unfold((self.listener, guard), |(listener, guard)| async move {
                let (connection, _) = guard.accept(&listener).await;
                Some((Ok::<_, std::io::Error>(connection), (listener, guard)))
            });
        let am = self.am.clone();
        let spec = Arc::new(am.master().spec().clone());
        crate::follow::spawn(am.clone(), spec).map_err(|source| AmError::Serve {
            address: address.to_string(),
            source,
        })?;
        let tick_interval = self.tick_interval;
        let shown = if self.tls.is_some() {
            format!("https://{address}")
        } else {
            address.to_string()
        };
        let (executors, mut events) = self.executors.unzip();
        let launcher = executors.clone();
        let finished = async move {
            let mut ticker = tokio::time::interval(tick_interval);
            let mut said_waiting: Option<(String, Instant)> = None;
            loop {
                // An executor's end is acted on at once; the rest waits for the next tick.
                let mut ended = Vec::new();
                match &mut events {
                    Some(events) => tokio::select! {
                        _ = ticker.tick() => {}
                        Some(event) = events.recv() => ended.push(event),
                    },
                    None => {
                        ticker.tick().await;
                    }
                }
                if let Some(events) = &mut events {
                    while let Ok(event) = events.try_recv() {
                        ended.push(event);
                    }
                }
                if let Err(error) = am.tick().await {
                    tracing::error!(%error, "journaling a tick failed");
                }
                if let Some(cause) = am.journal_lost() {
                    tracing::error!(
                        cause,
                        "the journal records nothing more: this AM steps down"
                    );
                    return;
                }
                if let Some(executors) = &launcher {
                    supervise(&am, executors, ended).await;
                }
                let waiting = am.master().waiting();
                say_waiting(waiting, &shown, &mut said_waiting);
                if am.finished() {
                    return;
                }
            }
        };
        tracing::info!(%address, "application master serving");
        let grpc = Routes::new(DaemonServiceServer::with_interceptor(
            service.clone(),
            check.clone(),
        ))
        .add_service(CheckpointServiceServer::with_interceptor(
            service.clone(),
            check.clone(),
        ))
        .add_service(ControlServiceServer::with_interceptor(
            service,
            check.clone(),
        ));
        let routes = grpc
            .into_axum_router()
            .merge(checkpoints::router(self.am.clone(), check.clone()))
            .fallback(checkpoints::unknown_route)
            .layer(axum::middleware::from_fn_with_state(
                check,
                crate::http::note_token,
            ));
        // Pings find the connections of callers that are gone but never closed them (a daemon
        // stopped or cut off), so that they do not hold the AM's end open for ever.
        let mut server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(SERVER_KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(SERVER_KEEPALIVE_TIMEOUT));
        if let Some(tls) = self.tls {
            server = server.tls_config(tls).map_err(|error| AmError::Serve {
                address: address.to_string(),
                source: std::io::Error::other(error),
            })?;
        }
        server
            .accept_http1(true)
            .add_routes(Routes::from(routes).prepare())
            .serve_with_incoming_shutdown(incoming, finished)
            .await
            .map_err(|error| AmError::Serve {
                address: address.to_string(),
                source: std::io::Error::other(error),
            })?;
        // Stepping down, the AM leaves the executors to the AM that took the job over.
        if let Some(cause) = self.am.journal_lost() {
            return Err(AmError::SteppedDown { cause });
        }
        if let Some(executors) = &executors {
            let am = self.am.clone();
            let executors = executors.clone();
            let _ = tokio::task::spawn_blocking(move || am.kill_executors(&executors)).await;
        }
        let status = self.am.status();
        Ok(JobEnd {
            state: v1::JobState::try_from(status.state).unwrap_or(v1::JobState::Unspecified),
            failure_reason: status.failure_reason,
            rows_consumed: self.am.master().rows_consumed_total(),
        })
    }
}

/// Worker threads of the AM's runtime: two, or one when the AM may run on one CPU only. Two
/// workers sharing one CPU wait for each other: under `sluice-bench am`, with the AM pinned to one
/// core, one worker cut the heartbeat p99 from about a second to about 0.1 s (see BENCHMARKS.md).
pub fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cpus| cpus.get().min(2))
}

/// The runtime an AM is served on, with [`worker_threads`] workers: the one of `sluice am` and
/// `sluice run`, and of the AM `sluice-bench am` measures, so that the AM measured is the one users
/// run.
///
/// # Errors
///
/// Returns the error of the runtime's builder when its threads cannot be started.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .enable_all()
        .build()
}

/// The address executors on this machine reach a listener at: an unspecified address (`0.0.0.0`)
/// becomes loopback.
/// One pass of the AM's supervision of its executors: their ends and the launches due are
/// journaled, and only once that is durable are the executors started.
async fn supervise(am: &Arc<Am>, executors: &ExecutorLauncher, ended: Vec<ExecutorEvent>) {
    let supervising = am.clone();
    let launcher = executors.clone();
    let supervision =
        tokio::task::spawn_blocking(move || supervising.supervise(&launcher, ended)).await;
    let supervision = match supervision {
        Ok(supervision) => supervision,
        Err(error) => {
            tracing::error!(%error, "supervising executors failed");
            return;
        }
    };
    if let Err(error) = supervision.durable.await {
        tracing::error!(%error, "journaling an executor change failed: nothing is launched");
        return;
    }
    if supervision.launches.is_empty() {
        return;
    }
    let launching = am.clone();
    let launcher = executors.clone();
    let launched =
        tokio::task::spawn_blocking(move || launching.launch(&launcher, supervision.launches))
            .await;
    match launched {
        Ok(durable) => {
            if let Err(error) = durable.await {
                tracing::error!(%error, "journaling a failed launch failed");
            }
        }
        Err(error) => tracing::error!(%error, "launching executors failed"),
    }
}

fn reachable(bound: SocketAddr) -> SocketAddr {
    if bound.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), bound.port())
    } else {
        bound
    }
}

/// The address to publish for an AM bound to `bound`: the address itself, or this host's name with
/// its port when it listens on every address.
fn advertised(bound: SocketAddr) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let hostname = sluice_proto::host_name();
    if hostname.is_empty() {
        reachable(bound).to_string()
    } else {
        format!("{hostname}:{}", bound.port())
    }
}

/// The identity of a job's journal: its name and a digest of what it reads and how it is cut into
/// tasks, so a journal is never replayed over other data. Where the nodes cache the data is not
/// part of it: a job started again with another `data.cache` takes its journal over.
fn journal_identity(spec: &JobSpec) -> String {
    let data = crate::spec::DataSpec {
        cache: None,
        bad_data: crate::spec::BadDataSpec::default(),
        ..spec.data.clone()
    };
    let data = serde_json::to_vec(&data).expect("the data section serializes");
    format!("{}:{:08x}", spec.name, crc32c::crc32c(&data))
}

/// How often the AM pings each connection, and how long the answer may take before it closes it.
const SERVER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);
const SERVER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// How often the AM says again what it waits for.
const WAITING_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Logs what the job waits for, naming this AM's address, when it changed or was last said
/// [`WAITING_LOG_INTERVAL`] ago.
fn say_waiting(waiting: Option<String>, address: &str, said: &mut Option<(String, Instant)>) {
    let Some(waiting) = waiting else {
        *said = None;
        return;
    };
    let due = said
        .as_ref()
        .is_none_or(|(before, at)| *before != waiting || at.elapsed() >= WAITING_LOG_INTERVAL);
    if due {
        let text = waiting.replace("<this AM's address>", address);
        tracing::warn!("waiting: {text}");
        *said = Some((waiting, Instant::now()));
    }
}
