//! The command line of `sluice-bench`: one subcommand a benchmark, and the hidden ones of the
//! processes the benchmarks start (`ring-peer`, `am-server`, `am-client`), which re-execute
//! `sluice-bench` itself. Benchmarks that run `sluice` take the one beside `sluice-bench`.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use sluice_bench::am::{
    AmBenchOptions, AmClientArgs, AmPeers, AmServerArgs, client_main, run_am_bench,
    serve_synthetic_am,
};
use sluice_bench::cache::{CacheBenchOptions, run_cache_bench};
use sluice_bench::chaos::{ChaosOptions, HostsPlan, run_chaos_bench};
use sluice_bench::command::sluice_beside_current_exe;
use sluice_bench::decode::run_decode_bench;
use sluice_bench::local_io::{
    DEFAULT_IN_FLIGHT, DEFAULT_RANGE_SIZES, LocalIoBenchOptions, run_local_io_bench,
};
use sluice_bench::pipeline::run_pipeline_bench;
use sluice_bench::plan::{PlanBenchOptions, run_plan_bench};
use sluice_bench::suite::chart::draw_rows_per_s;
use sluice_bench::suite::remote::{DEFAULT_DELAY_MS, DEFAULT_MBPS, RemoteOptions};
use sluice_bench::suite::{SuiteOptions, run_suite_bench};
use sluice_bench::training_data::PyarrowComparison;
use sluice_bench::workload::parse_sizes;
use sluice_bench::{PeerArgs, PeerCommand, RingBenchOptions, Transport, peer_main, run_ring_bench};

/// The benchmarks of Sluice: the ring against other transports, Parquet decode against pyarrow, and
/// more. `sluice bench ...` runs this binary when it is installed beside `sluice`.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Ring throughput per record size, beside memcpy, a Unix socket, a crossbeam channel and iceoryx2.
    Ring(RingArgs),
    /// The producer process of a two-process run; `sluice-bench ring` starts it.
    #[command(hide = true)]
    RingPeer(RingPeerArgs),
    /// Parquet decode of a training-like file: `sluice read --stats` against pyarrow, both on one core.
    Decode(VsPyarrowArgs),
    /// Rows/s delivered to one trainer by AM + daemon + ring, against a pyarrow scan in process.
    Pipeline(VsPyarrowArgs),
    /// Sluice (Reader and torch Dataset) against a PyTorch DataLoader, pyarrow, the ring and memcpy, on the
    /// same data: rows/s, GB/s, CPU per row, trainer stall and peak RSS.
    Suite(SuiteArgs),
    /// Local byte-range reads through io_uring against pread, cold and warm.
    LocalIo(LocalIoArgs),
    /// A job whose daemons and AM are killed with `kill -9` at random moments: every id exactly once.
    Chaos(ChaosArgs),
    /// A job of two epochs on S3 behind a delaying proxy, without and with the local disk cache,
    /// and on local disk: rows/s and bytes read from S3 per epoch.
    Cache(CacheArgs),
    /// Planning a Delta table of 1,000 files: `sluice plan` against a pyarrow planner.
    Plan(PlanArgs),
    /// The AM on one core under simulated executors: heartbeat latency, cpu, memory, recovery time.
    Am(AmArgs),
    /// The AM process of `sluice-bench am`: a synthetic job served through the real AM.
    #[command(hide = true)]
    AmServer(AmServerCliArgs),
    /// A process of simulated daemons of `sluice-bench am`.
    #[command(hide = true)]
    AmClient(AmClientCliArgs),
}

#[derive(Debug, Args)]
struct AmArgs {
    /// Simulated node daemons, each heartbeating once a second.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    executors: u32,
    /// Tasks in the job.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    tasks: u64,
    /// Seconds in the measurement window.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Tasks in the job whose AM memory is measured.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    memory_tasks: u64,
    /// Seconds between the journaled AM's snapshots, so that snapshots fall inside the window
    /// (default: the AM's 300 s).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_interval_s: Option<u64>,
    /// The daemons let a finished task go on the answer to the heartbeat that reports it, so the
    /// AM answers such a heartbeat once it is durable (as for daemons that do not keep finished
    /// tasks until the AM's journal mark says they are durable).
    #[arg(long)]
    daemons_let_finished_go: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ChaosArgs {
    /// Rows of the generated dataset.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(100_000..))]
    rows: u64,
    /// Node daemons killed.
    #[arg(long, default_value_t = 3)]
    daemon_kills: usize,
    /// AM processes killed.
    #[arg(long, default_value_t = 2)]
    am_kills: usize,
    /// Supervisors (`sluice shim`) of node daemons killed, leaving their daemons to the launcher:
    /// on one machine only, where `sluice run` supervises its executors.
    #[arg(long, default_value_t = 0, conflicts_with = "hosts")]
    shim_kills: usize,
    /// Trainers (`sluice consume`) killed; whoever runs them (the launcher, or across hosts the
    /// bench) starts each again with the same rank, and it reads on from its ring.
    #[arg(long, default_value_t = 0)]
    trainer_kills: usize,
    /// Rows per second each of the four trainers takes at most, standing for its compute.
    #[arg(long, default_value_t = 25_000, value_parser = clap::value_parser!(u64).range(1..))]
    trainer_rows_per_s: u64,
    /// The seed of the kill schedule (default: from the clock; the report gives it).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the data, ids files, journal and logs in this directory (default: a temporary one).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds after which the run is declared hung and everything is killed (default: the time the
    /// trainers need for the rows, plus four minutes).
    #[arg(long)]
    watchdog_s: Option<u64>,
    /// Run across this many node hosts of a test bed of network namespaces (needs root), each with a
    /// daemon and one trainer launched by the bench, adding link cuts, AM moves and hangs.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..=8))]
    hosts: Option<usize>,
    /// With --hosts: node cables pulled until the AM declares the node lost.
    #[arg(long, default_value_t = 2, requires = "hosts")]
    link_cuts: usize,
    /// With --hosts: trainers stopped until the AM reports them hanging.
    #[arg(long, default_value_t = 1, requires = "hosts")]
    hangs: usize,
    /// With --hosts: faults overlap. A link cut also kills the cut node's daemon, which starts
    /// again cut off and is fenced at its registration, or moves the AM while the node is cut
    /// off, as the seed picks.
    #[arg(long, requires = "hosts")]
    heavy: bool,
    /// Runs one after another, the first with the seed, each next with the seed plus one; every
    /// run must deliver every id exactly once. With --dir, run N keeps its files in DIR/run-N.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    runs: usize,
    /// Print one JSON object instead of a report.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct AmServerCliArgs {
    #[arg(long)]
    tasks: u64,
    #[arg(long)]
    executors: u32,
    #[arg(long)]
    listen: SocketAddr,
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    #[arg(long)]
    snapshot_interval_s: Option<u64>,
}

#[derive(Debug, Args)]
struct AmClientCliArgs {
    #[arg(long)]
    am: String,
    #[arg(long)]
    first_node: u64,
    #[arg(long)]
    nodes: u64,
    #[arg(long)]
    total_nodes: u64,
    #[arg(long)]
    channels: usize,
    #[arg(long)]
    let_finished_go: bool,
}

#[derive(Debug, Args)]
struct LocalIoArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A 64 MiB file instead of 1 GiB, and one round.
    #[arg(long)]
    quick: bool,
    /// Rounds; the two paths take turns in each.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Reads in flight at once.
    #[arg(long, default_value_t = DEFAULT_IN_FLIGHT)]
    in_flight: usize,
    /// Range sizes, comma-separated, in bytes or with KiB/MiB (default 64KiB,512KiB,1MiB,8MiB).
    #[arg(long, value_name = "SIZES")]
    sizes: Option<String>,
    /// Where the file is written once and then reused; not tmpfs [default: ~/.cache/sluice/bench].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct CacheArgs {
    /// Rows of the dataset.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(10_000..))]
    rows: u64,
    /// Files of the dataset.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    files: u64,
    /// Rows per task.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..))]
    task_rows: u64,
    /// Milliseconds the proxy adds to every chunk it forwards, each way.
    #[arg(long, default_value_t = 20)]
    delay_ms: u64,
    /// The proxy's bandwidth, each way, in MiB/s.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    bandwidth_mib_per_s: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PlanArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A table of 100 files instead of 1,000, and one round.
    #[arg(long)]
    quick: bool,
    /// Rounds; the two planners take turns in each.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Where the table is written once and then reused [default: ~/.cache/sluice/bench].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The Python interpreter that has pyarrow.
    #[arg(long, default_value = "python3")]
    python: OsString,
}

/// The options of the benchmarks that compare Sluice with pyarrow on the training-like file.
#[derive(Debug, Args)]
struct VsPyarrowArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A file of 175,000 rows instead of 2.8 million, and one round.
    #[arg(long)]
    quick: bool,
    /// Rounds of the sides, which take turns.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the Parquet files are written once and then reused [default: ~/.cache/sluice/bench].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The Python interpreter that has pyarrow.
    #[arg(long, default_value = "python3")]
    python: OsString,
}

#[derive(Debug, Args)]
struct SuiteArgs {
    /// 120,000 rows instead of 20 million, and one round.
    #[arg(long)]
    quick: bool,
    /// Rounds of each phase; the order of the systems rotates from one to the next.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Write the report as one JSON object to this file.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Draw rows/s per system as a bar chart to this PNG file.
    #[arg(long, value_name = "OUT")]
    png: Option<PathBuf>,
    /// Read this dataset (a Parquet file or directory, or a URI) instead of generated data.
    #[arg(long, value_name = "URI")]
    source: Option<String>,
    /// Generate this many rows instead of 20 million, in files of a million rows.
    #[arg(long, value_name = "N", conflicts_with_all = ["quick", "source"])]
    rows: Option<u64>,
    /// Run only these systems, comma-separated names as in the JSON, `sluice` among them [default:
    /// every one].
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    systems: Option<Vec<String>>,
    /// The trainer's work per batch in the stall phase, in µs [default: the daemon's CPU per batch].
    #[arg(long, value_name = "US")]
    work_us: Option<f64>,
    /// Where the generated data and the suite's Python environment are written once and then reused
    /// [default: ~/.cache/sluice/bench].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// The Python interpreter of the trainers, with the peers, torch and the sluice package [default:
    /// a venv under the cache directory with the peers pinned in benches/python/requirements.txt,
    /// made once from python3].
    #[arg(long, value_name = "PY")]
    python: Option<OsString>,
    /// Read the data from S3: a SeaweedFS server on 127.0.0.1 behind a delaying, bandwidth-capped
    /// proxy, both started by the suite, the data uploaded to it once; idle trainers only, with the
    /// bytes each system read through the link and the fraction of the link it used.
    #[arg(long)]
    remote: bool,
    /// The time the link adds before the first byte of every response, in ms.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_DELAY_MS, requires = "remote")]
    remote_delay_ms: u64,
    /// The link's bandwidth in each direction, shared by every connection, in megabits (1e6 bits)
    /// per second.
    #[arg(long, value_name = "MBPS", default_value_t = DEFAULT_MBPS, requires = "remote")]
    remote_mbps: u64,
}

#[derive(Debug, Args)]
struct RingArgs {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Run each size for about 0.1 s instead of 1 s.
    #[arg(long)]
    quick: bool,
    /// Record sizes, comma-separated, in bytes or with KiB/MiB (default 64,4KiB,64KiB,1MiB).
    #[arg(long, value_name = "SIZES")]
    sizes: Option<String>,
}

#[derive(Debug, Args)]
struct RingPeerArgs {
    #[arg(long)]
    transport: Transport,
    #[arg(long)]
    size: usize,
    #[arg(long)]
    count: u64,
    #[arg(long)]
    path: String,
    #[arg(long)]
    cpu: Option<usize>,
}

/// Runs `sluice-bench ...`.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        BenchCommand::Ring(ring) => run_ring(ring),
        BenchCommand::RingPeer(peer) => Ok(peer_main(&PeerArgs {
            transport: peer.transport,
            size: peer.size,
            count: peer.count,
            path: peer.path,
            cpu: peer.cpu,
        })?),
        BenchCommand::Decode(decode) => run_decode(decode),
        BenchCommand::Pipeline(pipeline) => run_pipeline(pipeline),
        BenchCommand::Suite(suite) => run_suite(suite),
        BenchCommand::LocalIo(local_io) => run_local_io(local_io),
        BenchCommand::Chaos(chaos) => run_chaos(chaos),
        BenchCommand::Cache(cache) => run_cache(cache),
        BenchCommand::Plan(plan) => run_plan(plan),
        BenchCommand::Am(am) => run_am(am),
        BenchCommand::AmServer(server) => {
            let args = AmServerArgs {
                tasks: server.tasks,
                executors: server.executors,
                listen: server.listen,
                checkpoint: server.checkpoint,
                snapshot_interval_s: server.snapshot_interval_s,
            };
            // The same runtime as `sluice am`, so that the AM under test is the one users run.
            Ok(sluice_am::server::runtime()
                .context("starting the AM's runtime")?
                .block_on(serve_synthetic_am(&args))?)
        }
        BenchCommand::AmClient(client) => Ok(client_main(&AmClientArgs {
            am: client.am,
            first_node: client.first_node,
            nodes: client.nodes,
            total_nodes: client.total_nodes,
            channels: client.channels,
            let_finished_go: client.let_finished_go,
        })?),
    }
}

/// The cache of benchmark files: `$XDG_CACHE_HOME/sluice/bench`, `~/.cache/sluice/bench`, or under the
/// temporary directory when neither is set.
fn default_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|value| !value.is_empty())
                .map(|home| PathBuf::from(home).join(".cache"))
        })
        .unwrap_or_else(std::env::temp_dir)
        .join("sluice")
        .join("bench")
}

/// Runs a benchmark with its progress on stderr (unless `json`), then prints its report: one JSON
/// object with `json`, its tables otherwise.
fn print_report<R, E>(
    json: bool,
    run: impl FnOnce(&mut dyn FnMut(&str)) -> Result<R, E>,
    to_json: impl FnOnce(&R) -> serde_json::Result<String>,
    render: impl FnOnce(&R) -> String,
) -> anyhow::Result<()>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let report = run(&mut |line| {
        if !json {
            eprintln!("{line}");
        }
    })?;
    if json {
        println!("{}", to_json(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// The options of a comparison with pyarrow on the training file, for the `sluice` beside
/// `sluice-bench`.
fn comparison(args: VsPyarrowArgs) -> anyhow::Result<PyarrowComparison> {
    Ok(PyarrowComparison {
        sluice: sluice_beside_current_exe()?,
        python: args.python,
        cache_dir: args.cache_dir.unwrap_or_else(default_cache_dir),
        quick: args.quick,
        rounds: args.rounds,
    })
}

fn run_decode(args: VsPyarrowArgs) -> anyhow::Result<()> {
    let json = args.json;
    let options = comparison(args)?;
    print_report(
        json,
        |progress| run_decode_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}

fn run_pipeline(args: VsPyarrowArgs) -> anyhow::Result<()> {
    let json = args.json;
    let options = comparison(args)?;
    print_report(
        json,
        |progress| run_pipeline_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}

fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let trainers = args.hosts.unwrap_or(4) as u64;
    let paced_s = args.rows / (args.trainer_rows_per_s * trainers) + 1;
    let first_seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let mut options = ChaosOptions {
        sluice: sluice_beside_current_exe()?,
        rows: args.rows,
        daemon_kills: args.daemon_kills,
        am_kills: args.am_kills,
        shim_kills: args.shim_kills,
        trainer_kills: args.trainer_kills,
        trainer_rows_per_s: args.trainer_rows_per_s,
        seed: args.seed,
        directory: args.dir.clone(),
        watchdog: Duration::from_secs(args.watchdog_s.unwrap_or(paced_s + 240)),
        across: args.hosts.map(|hosts| HostsPlan {
            hosts,
            link_cuts: args.link_cuts,
            hangs: args.hangs,
            heavy: args.heavy,
        }),
    };
    let mut failed = Vec::new();
    for run in 0..args.runs {
        options.seed = Some(first_seed.wrapping_add(run as u64));
        if args.runs > 1 {
            options.directory = args.dir.as_ref().map(|dir| dir.join(format!("run-{run}")));
        }
        let report = run_chaos_bench(&options)?;
        if args.json {
            println!("{}", report.to_json()?);
        } else {
            print!("{}", report.render());
        }
        if !report.exactly_once() {
            failed.push(format!(
                "the job {}; {} ids repeated, {} missing (seed {}; rerun with --seed {} --dir DIR to keep its logs)",
                if report.job_succeeded {
                    "succeeded"
                } else {
                    "failed"
                },
                report.duplicates,
                report.missing,
                report.seed,
                report.seed
            ));
        }
    }
    if args.runs > 1 && !args.json {
        println!(
            "{} runs, seeds {first_seed} to {}: {} delivered every id exactly once",
            args.runs,
            first_seed.wrapping_add(args.runs as u64 - 1),
            args.runs - failed.len()
        );
    }
    anyhow::ensure!(failed.is_empty(), "bench chaos: {}", failed.join("; "));
    Ok(())
}

fn run_suite(args: SuiteArgs) -> anyhow::Result<()> {
    let options = SuiteOptions {
        sluice: sluice_beside_current_exe()?,
        python: args.python,
        cache_dir: args.cache_dir.unwrap_or_else(default_cache_dir),
        quick: args.quick,
        rounds: args.rounds,
        source: args.source,
        rows: args.rows,
        systems: args.systems,
        work_us: args.work_us,
        peer: PeerCommand::current_exe()
            .context("locating sluice-bench, which runs the ring's producer process")?,
        remote: args
            .remote
            .then(|| {
                RemoteOptions::new(
                    Duration::from_millis(args.remote_delay_ms),
                    args.remote_mbps,
                )
            })
            .transpose()?,
    };
    let report = run_suite_bench(&options, &mut |line| eprintln!("{line}"))?;
    print!("{}", report.render_table());
    if let Some(path) = &args.json {
        std::fs::write(path, report.to_json()?)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if let Some(path) = &args.png {
        draw_rows_per_s(path, &report.chart_title(), &report.chart_bars())?;
    }
    Ok(())
}

fn run_am(args: AmArgs) -> anyhow::Result<()> {
    let peers = AmPeers::current_exe()
        .context("locating sluice-bench, which runs the AM and the daemons")?;
    let mut options = AmBenchOptions::new(peers);
    options.executors = args.executors;
    options.tasks = args.tasks;
    options.seconds = args.seconds;
    options.memory_tasks = args.memory_tasks;
    options.snapshot_interval_s = args.snapshot_interval_s;
    options.daemons_let_finished_go = args.daemons_let_finished_go;
    print_report(
        args.json,
        |progress| run_am_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}

fn run_ring(args: RingArgs) -> anyhow::Result<()> {
    let peer = PeerCommand::current_exe()
        .context("locating sluice-bench, which runs the producer process")?;
    let mut options = RingBenchOptions::new(peer);
    options.quick = args.quick;
    if let Some(sizes) = &args.sizes {
        options.sizes = parse_sizes(sizes)?;
    }
    print_report(
        args.json,
        |progress| run_ring_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_tables(),
    )
}

fn run_local_io(args: LocalIoArgs) -> anyhow::Result<()> {
    let options = LocalIoBenchOptions {
        cache_dir: args.cache_dir.unwrap_or_else(default_cache_dir),
        quick: args.quick,
        rounds: args.rounds,
        in_flight: args.in_flight,
        range_sizes: match &args.sizes {
            Some(sizes) => parse_sizes(sizes)?,
            None => DEFAULT_RANGE_SIZES.to_vec(),
        },
    };
    print_report(
        args.json,
        |progress| run_local_io_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}

fn run_cache(args: CacheArgs) -> anyhow::Result<()> {
    let options = CacheBenchOptions {
        sluice: sluice_beside_current_exe()?,
        rows: args.rows,
        files: args.files,
        task_rows: args.task_rows,
        delay: Duration::from_millis(args.delay_ms),
        bandwidth_bytes_per_s: NonZeroU64::new(args.bandwidth_mib_per_s << 20)
            .context("--bandwidth-mib-per-s is at least 1")?,
    };
    print_report(
        args.json,
        |progress| run_cache_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}

fn run_plan(args: PlanArgs) -> anyhow::Result<()> {
    let options = PlanBenchOptions {
        sluice: sluice_beside_current_exe()?,
        python: args.python,
        cache_dir: args.cache_dir.unwrap_or_else(default_cache_dir),
        quick: args.quick,
        rounds: args.rounds,
    };
    print_report(
        args.json,
        |progress| run_plan_bench(&options, progress),
        |report| report.to_json(),
        |report| report.render_table(),
    )
}
