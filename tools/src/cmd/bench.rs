//! `sluice bench`: the benchmark suite.

use anyhow::Context;
use clap::{Args, Subcommand};
use sluice_bench::workload::parse_sizes;
use sluice_bench::{PeerArgs, PeerCommand, RingBenchOptions, Transport, peer_main, run_ring_bench};

/// Arguments of `sluice bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Ring throughput per record size, beside memcpy, a Unix socket, a crossbeam channel and iceoryx2.
    Ring(RingArgs),
    /// The producer process of a two-process run; `sluice bench ring` starts it.
    #[command(hide = true)]
    RingPeer(RingPeerArgs),
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

/// Runs `sluice bench ...`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Ring(ring) => run_ring(ring),
        BenchCommand::RingPeer(peer) => Ok(peer_main(&PeerArgs {
            transport: peer.transport,
            size: peer.size,
            count: peer.count,
            path: peer.path,
            cpu: peer.cpu,
        })?),
    }
}

fn run_ring(args: RingArgs) -> anyhow::Result<()> {
    let peer = PeerCommand::current_exe()
        .context("locating the sluice executable, which runs the producer process")?;
    let mut options = RingBenchOptions::new(peer);
    options.quick = args.quick;
    if let Some(sizes) = &args.sizes {
        options.sizes = parse_sizes(sizes)?;
    }
    let json = args.json;
    let report = run_ring_bench(&options, &mut |line| {
        if !json {
            eprintln!("{line}");
        }
    })?;
    if json {
        println!("{}", report.to_json()?);
    } else {
        print!("{}", report.render_tables());
    }
    Ok(())
}
