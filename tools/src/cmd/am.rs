//! `sluice am`, `sluice status`, `sluice stop`, `sluice scale` and `sluice source`: the application
//! master and its control API.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::Context;
use sluice_am::http::HttpServer;
use sluice_am::server::{AmOptions, AmServer};
use sluice_am::spec::JobSpec;
use sluice_am::status::{node_state_name, state_name, status_json};
use sluice_am::tls::ServerTls;
use sluice_proto::BearerToken;
use sluice_proto::connect::{self, ClientTls};
use sluice_proto::v1;
use sluice_proto::v1::control_service_client::ControlServiceClient;
use tonic::transport::Channel;

use crate::cmd::read::runtime;
use crate::cmd::token::{self, Published};

/// The address the AM listens on when none is given.
pub const DEFAULT_AM_ADDRESS: &str = "127.0.0.1:7070";

/// The address of the status page when `--http` is given without one.
pub const DEFAULT_HTTP_ADDRESS: &str = "127.0.0.1:7071";

/// Arguments of `sluice am`.
#[derive(Debug, clap::Args)]
pub struct AmArgs {
    /// The job spec (YAML, TOML or JSON).
    pub job: std::path::PathBuf,
    /// The address of the gRPC API.
    #[arg(long, default_value = DEFAULT_AM_ADDRESS)]
    pub listen: SocketAddr,
    /// A shared token every caller must present.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Reset the job to this data checkpoint before serving.
    #[arg(long)]
    pub resume_from: Option<String>,
    /// Serve the status page, its JSON API and Prometheus /metrics on this address
    /// (127.0.0.1:7071 when the flag is given without one).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_HTTP_ADDRESS)]
    pub http: Option<SocketAddr>,
    /// The address daemons reach this AM at (HOST:PORT), written under the job's checkpoint
    /// location so that daemons find an AM started again on another host; by default the
    /// --listen address, or this host's name when it listens on every address.
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// How the AM's API is made private across hosts.
#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// Serve the gRPC API, its JSON calls and the status page over TLS with this certificate
    /// chain (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Daemons must present a certificate signed by this CA (PEM), so that the token alone does
    /// not let a caller pose as a daemon.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
    /// Serve a non-loopback address without TLS or without a token: only on a network you trust.
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    /// The AM's TLS settings, when it serves TLS.
    pub fn server_tls(&self) -> Option<ServerTls> {
        Some(ServerTls {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

/// Runs the AM until the job is over; exits non-zero when the job failed.
pub fn run(args: AmArgs) -> anyhow::Result<()> {
    let spec = JobSpec::from_path(&args.job)?;
    let options = AmOptions {
        listen: args.listen,
        token: args.token,
        resume_from: args.resume_from,
        launch: None,
        tls: args.tls.server_tls(),
        insecure: args.tls.insecure,
        advertise: args.advertise,
    };
    sluice_am::server::runtime()
        .context("starting the AM's runtime")?
        .block_on(serve_job(
            spec,
            options,
            Serving {
                label: "sluice am",
                http: args.http,
                notes: &[],
                progress: false,
                publish_token: false,
                // A signal ends this AM alone: an AM started again takes the job over.
                stop_on_signal: false,
            },
        ))
}

/// How [`serve_job`] serves a job and speaks of it.
#[derive(Debug, Clone, Copy)]
pub struct Serving<'a> {
    /// The prefix of every line printed (`sluice run`, `sluice am`).
    pub label: &'a str,
    /// The address of the status page, when it is served.
    pub http: Option<SocketAddr>,
    /// Lines printed after where the AM serves.
    pub notes: &'a [String],
    /// Print a live progress line and a closing summary.
    pub progress: bool,
    /// Write the AM's token, made for the job, where the user's own commands find it (see
    /// [`token`](crate::cmd::token)).
    pub publish_token: bool,
    /// Stop the job on SIGINT or SIGTERM (a second one ends this process at once), rather than
    /// leave its executors to an AM started again.
    pub stop_on_signal: bool,
}

/// Serves a job's AM (and its status page when `serving.http` is set) until the job is over,
/// printing where it serves, then the notes, then (with `progress`) a live progress line and a
/// closing summary, then how the job ended, each line prefixed with the label.
pub async fn serve_job(
    spec: JobSpec,
    options: AmOptions,
    serving: Serving<'_>,
) -> anyhow::Result<()> {
    let Serving {
        label,
        http,
        notes,
        progress,
        publish_token,
        stop_on_signal,
    } = serving;
    crate::cmd::raise_open_files_limit(label);
    let name = spec.name.clone();
    let token = options.token.clone();
    let tls = options.tls.clone();
    let insecure = options.insecure;
    let server = AmServer::start(spec, options).await?;
    let http = match http {
        Some(address) => Some(
            HttpServer::bind(address, server.am(), token.clone(), tls.as_ref(), insecure).await?,
        ),
        None => None,
    };
    let published = match (&token, publish_token) {
        (Some(token), true) => Some(Published::write(&server.local_addr().to_string(), token)?),
        _ => None,
    };
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "{label}: job {name} serving on {}",
        server.local_addr()
    )?;
    if let Some(http) = http {
        let scheme = if tls.is_some() { "https" } else { "http" };
        writeln!(
            stdout,
            "{label}: status page on {scheme}://{}/",
            http.local_addr()
        )?;
        let label = label.to_owned();
        tokio::spawn(async move {
            if let Err(error) = http.serve().await {
                eprintln!("{label}: status page stopped: {error}");
            }
        });
    }
    for note in notes {
        writeln!(stdout, "{label}: {note}")?;
    }
    if let Some(published) = &published {
        writeln!(
            stdout,
            "{label}: the job's token is in {} (the status page asks for it; sluice status, stop and scale read it there)",
            published.path().display()
        )?;
    }
    stdout.flush()?;
    let started = std::time::Instant::now();
    let am = server.am();
    if stop_on_signal {
        stop_on_signals(label.to_owned(), am.clone())?;
    }
    let progress = progress.then(|| crate::cmd::progress::spawn(label.to_owned(), am.clone()));
    let end = server.serve().await?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(progress) = progress {
        crate::cmd::progress::finish(progress, &am, seconds).await;
    }
    writeln!(
        stdout,
        "{label}: {} rows consumed in {seconds:.1} s ({:.0} rows/s)",
        end.rows_consumed,
        end.rows_consumed as f64 / seconds.max(1e-3)
    )?;
    writeln!(stdout, "{label}: job {name} {}", state_name(end.state))?;
    match end.state {
        v1::JobState::Succeeded | v1::JobState::Stopped => Ok(()),
        _ => Err(anyhow::anyhow!(
            "job {name} {}: {}",
            state_name(end.state),
            end.failure_reason.unwrap_or_default()
        )),
    }
}

/// Stops the job on the first SIGINT or SIGTERM, so that its executors end and its rings go;
/// ends this process at once on the second.
fn stop_on_signals(
    label: String,
    am: std::sync::Arc<sluice_am::service::Am>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    tokio::spawn(async move {
        let mut signals = 0;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            signals += 1;
            if signals > 1 {
                eprintln!("{label}: {name} again: exiting at once, executors may be left running");
                std::process::exit(130);
            }
            eprintln!("{label}: {name}: stopping the job (again to exit at once)");
            if let Err(error) = am.stop_now(&format!("stopped by {name}")).await {
                eprintln!("{label}: stopping the job failed: {error}");
            }
        }
    });
    Ok(())
}

/// Where to reach an AM.
#[derive(Debug, clap::Args)]
pub struct AmAddress {
    /// The AM's gRPC address.
    #[arg(long, env = "SLUICE_AM", default_value = DEFAULT_AM_ADDRESS)]
    pub am: String,
    /// The AM's shared token, when it has one; by default the one `sluice run` made for the AM
    /// at this address, if it made one.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA that signed the AM's TLS certificate (PEM); makes a bare host:port mean TLS.
    #[arg(long, env = "SLUICE_TLS_CA", value_name = "PEM")]
    pub tls_ca: Option<std::path::PathBuf>,
}

impl AmAddress {
    /// The job's status, as the AM tells it.
    pub async fn status(&self) -> anyhow::Result<v1::StatusReply> {
        let mut client = self.control().await?;
        let reply = client
            .status(v1::StatusRequest {})
            .await
            .map_err(|status| self.refused("status", &status))?;
        Ok(reply.into_inner())
    }

    /// A failed call as the user reads it: the AM's own message when it answered, the cause and
    /// its fix when the call never reached it (a TLS mistake, an AM gone).
    fn refused(&self, what: &str, status: &tonic::Status) -> anyhow::Error {
        match status.code() {
            tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded => {
                let tls = ClientTls::new(self.tls_ca.clone(), None, None);
                anyhow::anyhow!(
                    "{what}: the AM at {} did not answer: {}",
                    self.am,
                    connect::explain(&connect::error_chain(status), &tls)
                )
            }
            _ => anyhow::anyhow!("{what}: {}", status.message()),
        }
    }

    async fn control(
        &self,
    ) -> anyhow::Result<
        ControlServiceClient<tonic::service::interceptor::InterceptedService<Channel, BearerToken>>,
    > {
        let tls = ClientTls::new(self.tls_ca.clone(), None, None);
        let channel = connect::connect(&self.am, &tls).await?;
        let token = self.token.clone().or_else(|| token::lookup(&self.am));
        Ok(ControlServiceClient::with_interceptor(
            channel,
            BearerToken(token),
        ))
    }
}

/// Arguments of `sluice status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub address: AmAddress,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// Prints the job's status.
pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    let reply = runtime(1)?.block_on(args.address.status())?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &status_json(&reply))?;
        writeln!(stdout)?;
    } else {
        write_status(&mut stdout, &reply)?;
    }
    Ok(())
}

/// Arguments of `sluice stop`.
#[derive(Debug, clap::Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub address: AmAddress,
    /// Why, for the AM's log and status.
    #[arg(long, default_value = "stopped from the command line")]
    pub reason: String,
}

/// Asks the AM to stop the job.
pub fn stop(args: StopArgs) -> anyhow::Result<()> {
    let state = runtime(1)?.block_on(async {
        let mut client = args.address.control().await?;
        let reply = client
            .stop(v1::StopRequest {
                reason: args.reason.clone(),
            })
            .await
            .map_err(|status| args.address.refused("stop", &status))?;
        anyhow::Ok(reply.into_inner().state)
    })?;
    let state = v1::JobState::try_from(state).unwrap_or(v1::JobState::Unspecified);
    println!("job {}", state_name(state));
    Ok(())
}

/// Arguments of `sluice scale`.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// The role, by its name in the job spec.
    pub role: String,
    /// Its new number of trainers, at least 1.
    pub num: u32,
    #[command(flatten)]
    pub address: AmAddress,
}

/// Asks the AM to change a role's number of trainers: it stops them all and launches them again
/// over the new ranks, each row still delivered once.
pub fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    let reply = runtime(1)?.block_on(async {
        let mut client = args.address.control().await?;
        let reply = client
            .scale_role(v1::ScaleRoleRequest {
                role: args.role.clone(),
                num: args.num,
            })
            .await
            .map_err(|status| args.address.refused("scale", &status))?;
        anyhow::Ok(reply.into_inner())
    })?;
    println!(
        "role {}: {} -> {} trainers",
        args.role, reply.previous_num, reply.num
    );
    Ok(())
}

/// Arguments of `sluice source`.
#[derive(Debug, clap::Args)]
pub struct SourceArgs {
    #[command(subcommand)]
    pub command: SourceCommand,
}

/// What `sluice source` does.
#[derive(Debug, clap::Subcommand)]
pub enum SourceCommand {
    /// Adds a source to the running job: its rows join the current epoch and every later one,
    /// each delivered once. Its columns must be the job's first source's.
    Add(AddSourceArgs),
}

/// Arguments of `sluice source add`: the keys of an entry of `data.sources`.
#[derive(Debug, clap::Args)]
pub struct AddSourceArgs {
    /// Where the data is: `file://`, `s3://`, `gs://`, `az://`.
    pub uri: String,
    /// How it is encoded (parquet, delta, ipc, csv, jsonl, tfrecord); by default told by the
    /// uri's extension.
    #[arg(long)]
    pub format: Option<String>,
    /// The columns to read, comma-separated; by default all of them.
    #[arg(long, value_delimiter = ',')]
    pub columns: Option<Vec<String>>,
    /// A row filter, as `data.sources[].filter`.
    #[arg(long)]
    pub filter: Option<String>,
    /// An object-store setting, KEY=VALUE; may be repeated.
    #[arg(long = "storage-option", value_name = "KEY=VALUE")]
    pub storage_options: Vec<String>,
    /// The Delta table version to read.
    #[arg(long)]
    pub version: Option<u64>,
    /// Read the Delta table version current at this time (RFC 3339, or milliseconds since the
    /// epoch).
    #[arg(long, conflicts_with = "version")]
    pub timestamp: Option<String>,
    #[command(flatten)]
    pub address: AmAddress,
}

impl AddSourceArgs {
    /// The source as an entry of `data.sources`, in JSON.
    fn entry(&self) -> anyhow::Result<String> {
        let mut entry = serde_json::Map::new();
        entry.insert("uri".to_owned(), self.uri.clone().into());
        if let Some(format) = &self.format {
            entry.insert("format".to_owned(), format.clone().into());
        }
        if let Some(columns) = &self.columns {
            entry.insert("columns".to_owned(), columns.clone().into());
        }
        if let Some(filter) = &self.filter {
            entry.insert("filter".to_owned(), filter.clone().into());
        }
        if !self.storage_options.is_empty() {
            let mut options = serde_json::Map::new();
            for option in &self.storage_options {
                let (key, value) = option
                    .split_once('=')
                    .with_context(|| format!("--storage-option {option}: write it as KEY=VALUE"))?;
                options.insert(key.to_owned(), value.into());
            }
            entry.insert("storage_options".to_owned(), options.into());
        }
        if let Some(version) = self.version {
            entry.insert("version".to_owned(), version.into());
        }
        if let Some(timestamp) = &self.timestamp {
            entry.insert("timestamp".to_owned(), timestamp.clone().into());
        }
        Ok(serde_json::Value::Object(entry).to_string())
    }
}

/// Runs `sluice source`.
pub fn source(args: SourceArgs) -> anyhow::Result<()> {
    match args.command {
        SourceCommand::Add(args) => add_source(args),
    }
}

/// Asks the AM to add a source to the running job.
fn add_source(args: AddSourceArgs) -> anyhow::Result<()> {
    let source = args.entry()?;
    let reply = runtime(1)?.block_on(async {
        let mut client = args.address.control().await?;
        let reply = client
            .add_source(v1::AddSourceRequest { source })
            .await
            .map_err(|status| args.address.refused("add source", &status))?;
        anyhow::Ok(reply.into_inner())
    })?;
    println!(
        "source {} added as source {}: {} files, {} splits, {} rows, from epoch {}",
        args.uri,
        reply.index,
        reply.files,
        reply.splits,
        reply.rows,
        reply.epoch + 1
    );
    Ok(())
}

fn write_status(out: &mut dyn Write, reply: &v1::StatusReply) -> std::io::Result<()> {
    let tasks = reply.tasks.unwrap_or_default();
    let state = v1::JobState::try_from(reply.state).unwrap_or(v1::JobState::Unspecified);
    writeln!(
        out,
        "job {}: {} (epoch {} of {})",
        reply.job_id,
        state_name(state),
        reply.epoch + 1,
        reply.epochs
    )?;
    if let Some(reason) = &reply.failure_reason {
        writeln!(out, "  failure: {reason}")?;
    }
    if let Some(waiting) = &reply.waiting {
        writeln!(out, "  waiting: {waiting}")?;
    }
    for hang in &reply.hangs {
        let (what, verb) = match hang.kind.as_str() {
            "daemon" => (
                format!("the daemon of node {}", hang.node_id),
                "called the AM",
            ),
            "task" => (
                format!(
                    "task {}, read for ring {} by the daemon of node {},",
                    hang.task_id, hang.rank, hang.node_id
                ),
                "given its ring a batch from its source",
            ),
            _ => (
                format!("the trainer of ring {} on node {}", hang.rank, hang.node_id),
                "read",
            ),
        };
        writeln!(
            out,
            "  hangs: {what} has not {verb} for {:.1} s (bound {:.1} s; {})",
            hang.stuck_ms as f64 / 1000.0,
            hang.bound_ms as f64 / 1000.0,
            hang.action
        )?;
    }
    let percent = if tasks.rows_total == 0 {
        0.0
    } else {
        tasks.rows_consumed as f64 * 100.0 / tasks.rows_total as f64
    };
    writeln!(
        out,
        "  rows: {} of {} consumed ({percent:.1}%), {} failed, {:.0} rows/s",
        tasks.rows_consumed, tasks.rows_total, tasks.rows_failed, reply.rows_per_second
    )?;
    writeln!(
        out,
        "  tasks: {} pending, {} in flight, {} done, {} failed",
        tasks.pending, tasks.in_flight, tasks.done, tasks.failed
    )?;
    // One source read whole says nothing the spec does not; several, or one followed, do.
    if reply.sources.len() > 1 || reply.sources.iter().any(|source| source.followed) {
        for (index, source) in reply.sources.iter().enumerate() {
            let following = match (&source.follow_ended, source.following) {
                (_, true) => ", followed".to_owned(),
                (Some(ended), false) => format!(", no longer followed: {ended}"),
                (None, false) => String::new(),
            };
            writeln!(
                out,
                "  source {index}: {}, {} files{following}",
                source.uri, source.planned_files
            )?;
        }
    }
    for node in &reply.nodes {
        writeln!(
            out,
            "  node {} ({}): {}, {} tasks, last heard {} ms ago",
            node.node_id,
            node.hostname,
            node_state_name(node.state),
            node.tasks_held,
            node.since_last_heartbeat_ms
        )?;
    }
    Ok(())
}
