//! `sluice daemon`: the node daemon of a job.

use std::path::PathBuf;
use std::time::Duration;

use sluice_daemon::DaemonOptions;
use sluice_proto::NodeId;
use sluice_proto::connect::ClientTls;

use crate::cmd::read::runtime;

/// Arguments of `sluice daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// The AM's gRPC address.
    #[arg(long, env = "SLUICE_AM")]
    pub am: String,
    /// This node's id in the job, from 0 to the job's `nodes` - 1. Without it, the daemon serves the
    /// node whose rings it finds on this host (with --job), else the node the AM gives this host's
    /// name: the one it gave it before, or one no host has held.
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Rings are created under <ring-dir>/<job>/<rank>.ring (default: /dev/shm/sluice-<uid>, this
    /// user's own).
    #[arg(long, default_value_os_t = sluice_ring::default_ring_dir())]
    pub ring_dir: PathBuf,
    /// Serve trainers that run as other users of GROUP: rings 0660 and their directories 0770, of
    /// that group (by default this user's alone: 0600 and 0700).
    #[arg(long, value_name = "GROUP")]
    pub shared_group: Option<String>,
    /// The size of each ring's data region in bytes (a multiple of 4096).
    #[arg(long, default_value_t = sluice_ring::DEFAULT_CAPACITY)]
    pub ring_size: u64,
    /// The AM's shared token.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA that signed the AM's TLS certificate (PEM); makes a bare host:port mean TLS.
    #[arg(long, env = "SLUICE_TLS_CA", value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// This daemon's certificate (PEM), for an AM that asks daemons for one (mTLS).
    #[arg(
        long,
        env = "SLUICE_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(
        long,
        env = "SLUICE_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// How long to keep trying to reach an AM that does not answer, in seconds.
    #[arg(long, default_value_t = 120)]
    pub am_timeout_s: u64,
    /// The job the daemon is launched for (the AM passes it). Started again with the same job, node
    /// id and ring directory, the daemon takes over the rings its node fed and resumes their tasks.
    #[arg(long, env = "SLUICE_JOB")]
    pub job: Option<String>,
    /// Serve Prometheus /metrics (each stage's busy and wait time, rows and bytes; each ring's
    /// occupancy and waits) on this address; port 0 takes a free port, printed at start.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
    /// Serve --http on a non-loopback address, with neither TLS nor a token: only on a network
    /// you trust.
    #[arg(long)]
    pub insecure: bool,
    /// Keep the blocks of the remote objects the daemon reads in this directory on local disk
    /// (made 0700 if missing), so that the next epoch reads them from disk; the daemons of a node
    /// can share one. It takes the place of the spec's `data.cache`.
    #[arg(long, value_name = "DIR", requires = "cache_max_bytes")]
    pub cache_dir: Option<PathBuf>,
    /// The most bytes --cache-dir keeps; the least recently read blocks go beyond it.
    #[arg(long, value_name = "BYTES", requires = "cache_dir")]
    pub cache_max_bytes: Option<u64>,
}

/// Runs the daemon until the AM shuts it down.
pub fn run(args: DaemonArgs) -> anyhow::Result<()> {
    crate::cmd::raise_open_files_limit("sluice daemon");
    if let Some(address) = args.http
        && !address.ip().is_loopback()
        && !args.insecure
    {
        anyhow::bail!(
            "sluice daemon --http {address} would serve this node's metrics to the network with neither TLS nor a token; bind a loopback address (a local agent can scrape it) or pass --insecure on a network you trust"
        );
    }
    let sharing = match &args.shared_group {
        Some(group) => sluice_ring::files::Sharing::group(group)?,
        None => sluice_ring::files::Sharing::Private,
    };
    let options = DaemonOptions {
        sharing,
        am: args.am,
        node_id: args.node_id.map(NodeId),
        ring_dir: args.ring_dir,
        ring_size: args.ring_size,
        token: args.token,
        tls: ClientTls::new(args.tls_ca, args.tls_cert, args.tls_key),
        am_timeout: Duration::from_secs(args.am_timeout_s),
        job: args.job,
        http: args.http,
        cache: args
            .cache_dir
            .zip(args.cache_max_bytes)
            .map(|(dir, max_bytes)| sluice_formats::CacheConfig { dir, max_bytes }),
    };
    runtime(2)?.block_on(sluice_daemon::run(options))?;
    Ok(())
}
