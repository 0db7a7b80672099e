//! `sluice-bench cache`: a job of two epochs over Parquet files on a real S3 server (SeaweedFS)
//! behind the test kit's delaying proxy, which adds a latency to every request and caps the
//! bandwidth as a remote store would. Three runs of the same job, one after the other:
//!
//! - `s3`: no cache; both epochs read S3 through the proxy;
//! - `s3 + cache`: `data.cache` on local disk, empty at the start: the first epoch reads S3 and
//!   fills the cache, the second reads the cache;
//! - `local disk`: the same files on local disk (`file://`), the speed the cache aims at.
//!
//! For each epoch of each run the report gives the rows per second the trainer consumed (the rise
//! of the AM's consumed rows between the first and last status seen in that epoch, polled from
//! the AM's status page, so that the start of the processes and the planning do not count) and
//! the bytes the proxy forwarded from S3 (the counter read when the status first shows the next
//! epoch). The trainer is `sluice consume`, unpaced.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_testkit::DelayProxy;

use crate::error::{BenchError, Result};

/// How long one run may take before the benchmark gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);
/// How often the AM's status is read during a run.
const POLL: Duration = Duration::from_millis(10);

/// What the cache benchmark runs.
#[derive(Debug, Clone)]
pub struct CacheBenchOptions {
    /// The `sluice` binary.
    pub sluice: PathBuf,
    /// Rows of the dataset.
    pub rows: u64,
    /// Files of the dataset.
    pub files: u64,
    /// Rows per task.
    pub task_rows: u64,
    /// What the proxy adds to every chunk it forwards, each way.
    pub delay: Duration,
    /// The proxy's bandwidth, each way, in bytes per second.
    pub bandwidth_bytes_per_s: NonZeroU64,
}

/// One epoch of one run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EpochFigures {
    /// Rows per second the trainer consumed.
    pub rows_per_s: f64,
    /// Bytes the proxy forwarded from S3 during the epoch.
    pub bytes_from_s3: u64,
}

/// One run: its name and its two epochs.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// `s3`, `s3 + cache` or `local disk`.
    pub run: String,
    /// The first and the second epoch.
    pub epochs: [EpochFigures; 2],
}

/// The benchmark's report.
#[derive(Debug, Clone, Serialize)]
pub struct CacheReport {
    /// Rows of the dataset.
    pub rows: u64,
    /// Bytes of its files.
    pub data_bytes: u64,
    /// The proxy's delay per chunk, in milliseconds.
    pub delay_ms: u64,
    /// The proxy's bandwidth in bytes per second.
    pub bandwidth_bytes_per_s: u64,
    /// The runs.
    pub runs: Vec<RunFigures>,
}

fn failed(reason: impl Into<String>) -> BenchError {
    BenchError::Cache {
        reason: reason.into(),
    }
}

/// Writes the dataset with `sluice gen` to `out`, with `environment`.
fn generate(options: &CacheBenchOptions, out: &str, environment: &[(&str, String)]) -> Result<()> {
    let generated = Command::new(&options.sluice)
        .args(["gen", "--out", out, "--rows", &options.rows.to_string()])
        .args(["--files", &options.files.to_string()])
        .args([
            "--row-group-rows",
            &options.task_rows.min(65_536).to_string(),
        ])
        .envs(environment.iter().map(|(key, value)| (*key, value)))
        .output()
        .map_err(|error| failed(format!("running sluice gen: {error}")))?;
    if !generated.status.success() {
        return Err(failed(format!(
            "sluice gen --out {out} failed: {}",
            String::from_utf8_lossy(&generated.stderr)
        )));
    }
    Ok(())
}

/// One status of the AM, as the benchmark reads it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    epoch: u64,
    rows_consumed: u64,
    bytes: u64,
}

/// Runs the two-epoch job over `source` in `directory`, with the cache in `cache` if given.
fn run_job(
    options: &CacheBenchOptions,
    directory: &Path,
    source: &str,
    cache: Option<&Path>,
    environment: &[(&str, String)],
    bytes: &dyn Fn() -> u64,
) -> Result<[EpochFigures; 2]> {
    std::fs::create_dir_all(directory)
        .map_err(|error| failed(format!("making {}: {error}", directory.display())))?;
    let cache_line = cache
        .map(|dir| {
            format!(
                "  cache: {{ dir: \"{}\", max_bytes: {} }}\n",
                dir.display(),
                64_u64 << 30
            )
        })
        .unwrap_or_default();
    let spec = format!(
        r#"name: bench-cache
data:
  sources: [{{ uri: "{source}", format: parquet }}]
  task_rows: {task_rows}
  batch_size: 4096
  epochs: 2
{cache_line}nodes: 1
roles:
  - {{ name: worker, num: 1, command: ["{sluice}", consume] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 60000 }}
"#,
        task_rows = options.task_rows,
        sluice = options.sluice.display(),
    );
    let spec_path = directory.join("job.yaml");
    std::fs::write(&spec_path, spec)
        .map_err(|error| failed(format!("writing {}: {error}", spec_path.display())))?;
    let address = free_address()?;
    let http = free_address()?;
    let log = directory.join("run.out");
    let output = std::fs::File::create(&log)
        .map_err(|error| failed(format!("creating {}: {error}", log.display())))?;
    let error_output = output
        .try_clone()
        .map_err(|error| failed(format!("{}: {error}", log.display())))?;
    let mut run = Command::new(&options.sluice)
        .arg("run")
        .arg(&spec_path)
        .args(["--listen", &address.to_string()])
        .args(["--http", &http.to_string()])
        .arg("--ring-dir")
        .arg(directory.join("rings"))
        .arg("--state-dir")
        .arg(directory.join("state"))
        .envs(environment.iter().map(|(key, value)| (*key, value)))
        .stdout(output)
        .stderr(error_output)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|error| failed(format!("starting sluice run: {error}")))?;
    // The token `sluice run` makes for the job, once it has: the status page asks for it.
    let token = directory.join("state").join("token");
    let started = Instant::now();
    let at_start = bytes();
    let mut samples = Vec::new();
    let status = loop {
        if let Some(status) = run
            .try_wait()
            .map_err(|error| failed(format!("waiting for sluice run: {error}")))?
        {
            break status;
        }
        if started.elapsed() > RUN_TIMEOUT {
            let _ = run.kill();
            return Err(failed(format!(
                "the run did not end within {RUN_TIMEOUT:?}; see {}",
                log.display()
            )));
        }
        if let Some(status) = api_status(http, &token)
            && let (Some(epoch), Some(rows_consumed)) = (
                status["epoch"].as_u64(),
                status["tasks"]["rows_consumed"].as_u64(),
            )
        {
            samples.push(Sample {
                at: Instant::now(),
                epoch,
                rows_consumed,
                bytes: bytes(),
            });
        }
        std::thread::sleep(POLL);
    };
    if !status.success() {
        // The run's directory goes with the benchmark's: its last lines say why.
        let output = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = output.lines().collect();
        return Err(failed(format!(
            "sluice run failed ({status}); its last lines:\n{}",
            lines[lines.len().saturating_sub(10)..].join("\n")
        )));
    }
    let at_end = bytes();
    let epoch = |index: u64| -> Result<EpochFigures> {
        let within: Vec<&Sample> = samples
            .iter()
            .filter(|sample| sample.epoch == index && sample.rows_consumed > 0)
            .collect();
        let (Some(first), Some(last)) = (within.first(), within.last()) else {
            return Err(failed(format!(
                "no status showed epoch {index} under way; give more --rows"
            )));
        };
        let seconds = last.at.duration_since(first.at).as_secs_f64();
        if last.rows_consumed <= first.rows_consumed || seconds <= 0.0 {
            return Err(failed(format!(
                "epoch {index} ended between two statuses; give more --rows"
            )));
        }
        let next = samples.iter().find(|sample| sample.epoch > index);
        let start = samples
            .iter()
            .find(|sample| sample.epoch >= index)
            .filter(|_| index > 0)
            .map_or(at_start, |sample| sample.bytes);
        let end = next.map_or(at_end, |sample| sample.bytes);
        Ok(EpochFigures {
            rows_per_s: (last.rows_consumed - first.rows_consumed) as f64 / seconds,
            bytes_from_s3: end.saturating_sub(start),
        })
    };
    Ok([epoch(0)?, epoch(1)?])
}

/// A free loopback address, for one of the AM's listeners.
fn free_address() -> Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(|error| failed(format!("finding a free port: {error}")))
}

/// The AM's status from its status page at `http` (`GET /api/status`, the object of `sluice status
/// --json`) with the job's token read from `token`, or `None` while either is not there yet: read
/// in-process, so that polling it every [`POLL`] costs the host little and times an epoch of local
/// data too.
fn api_status(http: SocketAddr, token: &Path) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let token = std::fs::read_to_string(token).ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&http, POLL).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!(
        "GET /api/status HTTP/1.0\r\nAuthorization: Bearer {}\r\n\r\n",
        token.trim()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let body = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|end| &response[end + 4..])?;
    serde_json::from_slice(body).ok()
}

/// Runs the benchmark; `progress` gets a line as each run starts.
///
/// # Errors
///
/// [`BenchError::Cache`] when a run fails or ends too soon to be measured.
pub fn run_cache_bench(
    options: &CacheBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<CacheReport> {
    let work =
        tempfile::tempdir().map_err(|error| failed(format!("a temporary directory: {error}")))?;
    let root = work.path();
    progress("starting the S3 server (SeaweedFS)");
    let server = sluice_testkit::start_seaweed();
    let s3_options = sluice_testkit::s3_options();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| failed(format!("a runtime: {error}")))?
        .block_on(sluice_testkit::wait_for_bucket(&server, &s3_options));
    let upstream = SocketAddr::from(([127, 0, 0, 1], sluice_testkit::S3_PORT));
    let proxy = DelayProxy::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        upstream,
        options.delay,
        Some(options.bandwidth_bytes_per_s),
    );
    let s3 = format!("s3://{}/bench-cache", sluice_testkit::BUCKET);
    let local = root.join("data");
    progress("writing the dataset to S3 and to local disk");
    generate(options, &s3, &sluice_testkit::s3_environment(upstream))?;
    generate(options, &local.display().to_string(), &[])?;
    let data_bytes = directory_bytes(&local);
    let through_proxy = sluice_testkit::s3_environment(proxy.address());
    let proxy_bytes = || proxy.bytes_to_client();
    let no_bytes = || 0;
    let mut runs = Vec::new();
    progress("run 1 of 3: s3");
    runs.push(RunFigures {
        run: "s3".to_owned(),
        epochs: run_job(
            options,
            &root.join("s3"),
            &s3,
            None,
            &through_proxy,
            &proxy_bytes,
        )?,
    });
    progress("run 2 of 3: s3 + cache");
    let cache = root.join("cache");
    runs.push(RunFigures {
        run: "s3 + cache".to_owned(),
        epochs: run_job(
            options,
            &root.join("s3-cache"),
            &s3,
            Some(&cache),
            &through_proxy,
            &proxy_bytes,
        )?,
    });
    progress("run 3 of 3: local disk");
    runs.push(RunFigures {
        run: "local disk".to_owned(),
        epochs: run_job(
            options,
            &root.join("local"),
            &format!("file://{}", local.display()),
            None,
            &[],
            &no_bytes,
        )?,
    });
    Ok(CacheReport {
        rows: options.rows,
        data_bytes,
        delay_ms: u64::try_from(options.delay.as_millis()).unwrap_or(u64::MAX),
        bandwidth_bytes_per_s: options.bandwidth_bytes_per_s.get(),
        runs,
    })
}

/// The bytes of the files under `directory`.
fn directory_bytes(directory: &Path) -> u64 {
    std::fs::read_dir(directory)
        .into_iter()
        .flatten()
        .filter_map(std::result::Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => directory_bytes(&entry.path()),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}

impl CacheReport {
    /// The report as one JSON object.
    ///
    /// # Errors
    ///
    /// serde_json's, which a report of numbers and names does not meet.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report as a table, with the ratios that matter: the cached second epoch against the
    /// first and against local disk.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        // Writing to a String cannot fail.
        writeln!(
            out,
            "{} rows, {:.1} MiB of Parquet; S3 behind a proxy adding {} ms a chunk each way, capped at {:.0} MiB/s",
            self.rows,
            mib(self.data_bytes),
            self.delay_ms,
            mib(self.bandwidth_bytes_per_s)
        )
        .ok();
        writeln!(
            out,
            "{:<12} {:>16} {:>16} {:>18} {:>18}",
            "run", "epoch 1 rows/s", "epoch 2 rows/s", "epoch 1 MiB of S3", "epoch 2 MiB of S3"
        )
        .ok();
        for run in &self.runs {
            writeln!(
                out,
                "{:<12} {:>16.0} {:>16.0} {:>18.2} {:>18.2}",
                run.run,
                run.epochs[0].rows_per_s,
                run.epochs[1].rows_per_s,
                mib(run.epochs[0].bytes_from_s3),
                mib(run.epochs[1].bytes_from_s3)
            )
            .ok();
        }
        let find = |name: &str| self.runs.iter().find(|run| run.run == name);
        if let (Some(cached), Some(local)) = (find("s3 + cache"), find("local disk")) {
            writeln!(
                out,
                "cached epoch 2 / its epoch 1: {:.2}x rows/s; cached epoch 2 / local disk epoch 2: {:.2}x",
                cached.epochs[1].rows_per_s / cached.epochs[0].rows_per_s,
                cached.epochs[1].rows_per_s / local.epochs[1].rows_per_s
            )
            .ok();
        }
        out
    }
}
