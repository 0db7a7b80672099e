//! Drivers of the benchmark suite, run by the `sluice-bench` binary (its command line is in `main.rs`;
//! `sluice bench ...` runs it when it is installed beside `sluice`). The suite is a binary of its own so
//! that `sluice` links none of the benchmarks' dependencies.
//!
//! - `sluice-bench ring`: the ring against other transports (below);
//! - `sluice-bench decode` ([`decode`]): Parquet decode of a training-like file, Sluice against pyarrow on
//!   one core, and Sluice on two cores;
//! - `sluice-bench local-io` ([`local_io`]): local byte-range reads through io_uring against `pread`;
//! - `sluice-bench plan` ([`plan`]): planning a Delta table of 1,000 files, Sluice against pyarrow;
//! - `sluice-bench pipeline` ([`pipeline`]): rows/s delivered to one trainer through the AM, a node daemon
//!   and a ring, against a pyarrow scan in the trainer's process.
//!
//! `sluice-bench ring` moves records of each size from a producer to a consumer over the Sluice ring and
//! over the transports a user would otherwise pick, one after the other in the same run, and compares
//! them with the single-thread memcpy bandwidth of the machine:
//!
//! - `sluice_ring`: the shared-memory ring, over a file in /dev/shm, between two processes;
//! - `unix_socket`: a Unix domain stream socket with length-prefixed records, between two processes;
//! - `crossbeam`: a bounded crossbeam channel between two threads of one process (the in-process upper
//!   bound);
//! - `iceoryx2`: iceoryx2 publish-subscribe of byte slices, between two processes.
//!
//! Every transport runs the same workload (see [`workload`]) with the producer and the consumer pinned to
//! the same two cores. Two-process runs re-execute `sluice-bench` as the producer (see [`peer`]).
//! Each run is sized to last about a second (a tenth in quick mode), from a short pilot run.
//!
//! `sluice-bench am` (see [`am`]) puts the application master, alone on one core, under thousands of
//! simulated node daemons speaking the real protocol, and measures heartbeat latency, the AM's CPU
//! and memory, its recovery time after a SIGKILL, and its memory for a job of ten million tasks.

pub mod affinity;
pub mod am;
pub mod cache;
pub mod chaos;
pub mod command;
pub mod decode;
pub mod error;
pub mod local_io;
pub mod memcpy;
pub mod peer;
pub mod pipeline;
pub mod plan;
pub mod report;
pub mod suite;
pub mod training_data;
pub mod transport;
pub mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use error::{BenchError, Result};
pub use peer::{PeerArgs, PeerCommand, peer_main};
pub use report::{Baselines, FarBehind, Figures, RingBenchReport, RingOfSize, SizeReport};
pub use transport::{Measurement, Transport};

use affinity::{Placement, pin_current_thread};
use memcpy::{MEMCPY_BUFFER_BYTES, measure_memcpy_gbps};
use transport::RunContext;
use transport::sluice_ring::FAR_BEHIND_BYTES;
use workload::DEFAULT_SIZES;

/// A ring larger than the last-level cache (32 MiB on the benchmark host), so that its records
/// travel through memory, as a daemon's 256 MiB ring's do when the trainer lags.
pub const DRAM_RING_BYTES: u64 = 256 << 20;
/// The smallest record size also run through a ring of [`DRAM_RING_BYTES`].
pub const DRAM_RING_FROM: usize = 1 << 20;

/// The most records one run may move.
const MAX_COUNT: u64 = 1 << 32;
/// The most pilot runs before a count is accepted.
const MAX_CALIBRATION_ROUNDS: usize = 5;

/// What `sluice-bench ring` runs.
#[derive(Debug, Clone)]
pub struct RingBenchOptions {
    /// The record sizes, in bytes.
    pub sizes: Vec<usize>,
    /// Runs each size for about 0.1 s instead of 1 s, for CI.
    pub quick: bool,
    /// How to start the producer process of two-process runs.
    pub peer: PeerCommand,
}

impl RingBenchOptions {
    /// The default sizes (64 B, 4 KiB, 64 KiB, 1 MiB), full length, with this executable as the peer.
    pub fn new(peer: PeerCommand) -> RingBenchOptions {
        RingBenchOptions {
            sizes: DEFAULT_SIZES.to_vec(),
            quick: false,
            peer,
        }
    }

    fn target(&self) -> Duration {
        if self.quick {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        }
    }
}

/// Runs the ring benchmark and its baselines; `progress` receives one line per finished run.
pub fn run_ring_bench(
    options: &RingBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<RingBenchReport> {
    let mut sut = TransportBench::new(options)?;
    progress(&format!("memcpy: {:.2} GB/s", sut.memcpy_gbps));
    let mut sizes = Vec::with_capacity(options.sizes.len());
    for &size in &options.sizes {
        let mut measure = |transport: Transport| -> Result<Figures> {
            let measurement = sut.measure(transport, size)?;
            progress(&format!(
                "{size} B {transport}: {:.0} records/s, {:.3} GB/s ({} records in {:?})",
                measurement.msgs_per_s(),
                measurement.gbps(),
                measurement.messages,
                measurement.elapsed
            ));
            Ok(Figures::from(measurement))
        };
        let ring = measure(Transport::SluiceRing)?;
        let baselines = Baselines {
            unix_socket: measure(Transport::UnixSocket)?,
            crossbeam: measure(Transport::Crossbeam)?,
            iceoryx2: measure(Transport::Iceoryx2)?,
        };
        let ring_bytes = transport::sluice_ring::capacity(size);
        let memcpy_working_set_gbps = sut.measure_memcpy_working_set(ring_bytes)?;
        let dram_ring = if size >= DRAM_RING_FROM {
            let measurement = sut.measure_ring(size, DRAM_RING_BYTES)?;
            let memcpy_gbps = sut.measure_memcpy_working_set(DRAM_RING_BYTES)?;
            progress(&format!(
                "{size} B sluice_ring of {} MiB: {:.0} records/s, {:.3} GB/s; memcpy over {} MiB {memcpy_gbps:.2} GB/s",
                DRAM_RING_BYTES >> 20,
                measurement.msgs_per_s(),
                measurement.gbps(),
                DRAM_RING_BYTES >> 20,
            ));
            Some(RingOfSize {
                ring_bytes: DRAM_RING_BYTES,
                msgs_per_s: measurement.msgs_per_s(),
                gbps: measurement.gbps(),
                memcpy_working_set_gbps: memcpy_gbps,
                ratio_to_memcpy_working_set: measurement.gbps() / memcpy_gbps,
            })
        } else {
            None
        };
        let far_behind = if size >= DRAM_RING_FROM {
            sut.measure_far_behind(size, DRAM_RING_BYTES)?
                .map(|(ring_write_gbps, plain_copy_gbps)| {
                    progress(&format!(
                        "{size} B sluice_ring producer {} MiB ahead: write {ring_write_gbps:.3} GB/s, plain copy {plain_copy_gbps:.3} GB/s",
                        FAR_BEHIND_BYTES >> 20
                    ));
                    FarBehind {
                        ring_bytes: DRAM_RING_BYTES,
                        backlog_bytes: FAR_BEHIND_BYTES,
                        ring_write_gbps,
                        plain_copy_gbps,
                        ratio: ring_write_gbps / plain_copy_gbps,
                    }
                })
        } else {
            None
        };
        sizes.push(SizeReport {
            bytes: size,
            msgs_per_s: ring.msgs_per_s,
            gbps: ring.gbps,
            ratio_to_memcpy: ring.gbps / sut.memcpy_gbps,
            ring_bytes,
            memcpy_working_set_gbps,
            ratio_to_memcpy_working_set: ring.gbps / memcpy_working_set_gbps,
            dram_ring,
            far_behind,
            baselines,
        });
    }
    Ok(RingBenchReport {
        memcpy_gbps: sut.memcpy_gbps,
        sizes,
        placement: sut.placement,
    })
}

/// Calibrated runs of one transport at one record size, on the cores `sluice-bench ring` uses, with the
/// memcpy bandwidth of the consumer's core beside them.
#[derive(Debug)]
pub struct TransportBench<'a> {
    options: &'a RingBenchOptions,
    placement: Placement,
    scratch_root: PathBuf,
    runs: u64,
    /// Single-thread memcpy bandwidth on the consumer's core, GB/s, measured when the bench was set up.
    pub memcpy_gbps: f64,
}

impl<'a> TransportBench<'a> {
    /// Finds the cores to run on and measures memcpy there.
    ///
    /// # Errors
    ///
    /// Returns an error when the allowed cpus cannot be read or the memcpy thread cannot be pinned.
    pub fn new(options: &'a RingBenchOptions) -> Result<TransportBench<'a>> {
        let placement = Placement::detect().map_err(|source| BenchError::Io {
            transport: Transport::SluiceRing,
            operation: "reading the cpus this process may use".to_owned(),
            source,
        })?;
        let mut bench = TransportBench {
            options,
            placement,
            scratch_root: scratch_root(),
            runs: 0,
            memcpy_gbps: 0.0,
        };
        bench.memcpy_gbps = bench.measure_memcpy()?;
        Ok(bench)
    }

    /// Measures the single-thread memcpy bandwidth of the consumer's core between two buffers of a
    /// ring's `ring_bytes`, in GB/s: the best of enough passes to copy about 2 GiB (4 in quick mode).
    ///
    /// # Errors
    ///
    /// Returns an error when the memcpy thread cannot be pinned.
    pub fn measure_memcpy_working_set(&self, ring_bytes: u64) -> Result<f64> {
        let bytes = usize::try_from(ring_bytes).unwrap_or(usize::MAX);
        let passes = if self.options.quick {
            4
        } else {
            ((2usize << 30) / bytes.max(1)).clamp(5, 256)
        };
        memcpy_working_set_on(self.placement.consumer, bytes, passes)
    }

    /// Measures the single-thread memcpy bandwidth of the consumer's core again, in GB/s.
    ///
    /// # Errors
    ///
    /// Returns an error when the memcpy thread cannot be pinned.
    pub fn measure_memcpy(&self) -> Result<f64> {
        memcpy_on(
            self.placement.consumer,
            if self.options.quick { 2 } else { 5 },
        )
    }

    /// The producer's payload GB/s writing `size`-byte records into a ring of `ring_bytes` far
    /// ahead of its consumer, on the producer's core: through the ring's write and through a plain
    /// copy, `None` when the ring holds no record past the backlog.
    ///
    /// # Errors
    ///
    /// Returns the ring's error, or an error when its scratch directory or the pinning fails.
    pub fn measure_far_behind(
        &mut self,
        size: usize,
        ring_bytes: u64,
    ) -> Result<Option<(f64, f64)>> {
        let scratch = tempfile::Builder::new()
            .prefix("sluice-bench-")
            .tempdir_in(&self.scratch_root)
            .map_err(|source| BenchError::Io {
                transport: Transport::SluiceRing,
                operation: format!(
                    "creating a scratch directory in {}",
                    self.scratch_root.display()
                ),
                source,
            })?;
        let path = scratch.path().join("far-behind.ring");
        let cpu = self.placement.producer;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    pin_current_thread(cpu).map_err(|source| BenchError::Io {
                        transport: Transport::SluiceRing,
                        operation: format!("pinning the producer to cpu {cpu:?}"),
                        source,
                    })?;
                    transport::sluice_ring::far_behind(size, ring_bytes, &path)
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(BenchError::Io {
                        transport: Transport::SluiceRing,
                        operation: "writing far ahead of the consumer".to_owned(),
                        source: std::io::Error::other("the producer thread panicked"),
                    })
                })
        })
    }

    /// Moves `size`-byte records over `transport` for about the options' target time.
    ///
    /// # Errors
    ///
    /// Returns the transport's error, or an error when its scratch directory cannot be created.
    pub fn measure(&mut self, transport: Transport, size: usize) -> Result<Measurement> {
        self.measure_with_ring_bytes(transport, size, None)
    }

    /// Moves `size`-byte records through a Sluice ring of `ring_bytes` for about the options' target
    /// time.
    ///
    /// # Errors
    ///
    /// Returns the ring's error, or an error when its scratch directory cannot be created.
    pub fn measure_ring(&mut self, size: usize, ring_bytes: u64) -> Result<Measurement> {
        self.measure_with_ring_bytes(Transport::SluiceRing, size, Some(ring_bytes))
    }

    fn measure_with_ring_bytes(
        &mut self,
        transport: Transport,
        size: usize,
        ring_bytes: Option<u64>,
    ) -> Result<Measurement> {
        let TransportBench {
            options,
            placement,
            scratch_root,
            runs,
            ..
        } = self;
        calibrated(options.target(), size, |count| {
            *runs += 1;
            let scratch = tempfile::Builder::new()
                .prefix("sluice-bench-")
                .tempdir_in(&*scratch_root)
                .map_err(|source| BenchError::Io {
                    transport,
                    operation: format!(
                        "creating a scratch directory in {}",
                        scratch_root.display()
                    ),
                    source,
                })?;
            let context = RunContext {
                placement: *placement,
                peer: &options.peer,
                scratch: scratch.path(),
                run_name: format!("{}-{runs}", std::process::id()),
                ring_bytes,
            };
            transport::run(transport, size, count, &context)
        })
    }
}

/// Measures memcpy bandwidth between two 256 MiB buffers on a thread pinned to `cpu`, where the
/// consumers run.
fn memcpy_on(cpu: Option<usize>, passes: usize) -> Result<f64> {
    memcpy_working_set_on(cpu, MEMCPY_BUFFER_BYTES, passes)
}

/// Measures memcpy bandwidth between two `bytes`-byte buffers on a thread pinned to `cpu`: a working
/// set of a ring's size, in the cache or not as the ring is.
fn memcpy_working_set_on(cpu: Option<usize>, bytes: usize, passes: usize) -> Result<f64> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                pin_current_thread(cpu)?;
                Ok(measure_memcpy_gbps(bytes, passes))
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the memcpy thread panicked")))
    })
    .map_err(|source| BenchError::Io {
        transport: Transport::SluiceRing,
        operation: "measuring memcpy bandwidth".to_owned(),
        source,
    })
}

/// Where runs put their files: /dev/shm when it exists, as the ring's home, else the temp dir.
pub(crate) fn scratch_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A first count for `size`-byte records: a few MiB worth, small enough to finish quickly on any
/// transport.
fn pilot_count(size: usize) -> u64 {
    ((4 << 20) / size).clamp(16, 1 << 16) as u64
}

/// Runs `run` with growing counts until one run lasts at least half of `target`, and returns that run.
fn calibrated(
    target: Duration,
    size: usize,
    mut run: impl FnMut(u64) -> Result<Measurement>,
) -> Result<Measurement> {
    let mut count = pilot_count(size);
    let mut measurement = run(count)?;
    for _ in 1..MAX_CALIBRATION_ROUNDS {
        if measurement.elapsed >= target / 2 || count >= MAX_COUNT {
            break;
        }
        let scale = target.as_secs_f64() / measurement.elapsed.as_secs_f64().max(1e-6);
        count = ((count as f64 * scale.min(100.0) * 1.05) as u64).clamp(count + 1, MAX_COUNT);
        measurement = run(count)?;
    }
    Ok(measurement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_grows_the_count_until_a_run_is_long_enough() {
        let mut counts = Vec::new();
        let measurement = calibrated(Duration::from_secs(1), 64, |count| {
            counts.push(count);
            Ok(Measurement {
                messages: count,
                size: 64,
                elapsed: Duration::from_nanos(count * 10),
            })
        })
        .expect("calibrated");
        assert!(
            measurement.elapsed >= Duration::from_millis(500),
            "{counts:?}"
        );
        assert!(
            counts.windows(2).all(|pair| pair[0] < pair[1]),
            "{counts:?}"
        );
        assert!(counts.len() <= MAX_CALIBRATION_ROUNDS, "{counts:?}");
    }

    #[test]
    fn calibration_keeps_a_pilot_that_is_already_long_enough() {
        let mut runs = 0;
        calibrated(Duration::from_millis(100), 1 << 20, |count| {
            runs += 1;
            Ok(Measurement {
                messages: count,
                size: 1 << 20,
                elapsed: Duration::from_millis(80),
            })
        })
        .expect("calibrated");
        assert_eq!(runs, 1);
    }

    #[test]
    fn calibration_stops_at_the_first_failure() {
        let error = calibrated(Duration::from_secs(1), 64, |_| {
            Err(BenchError::ShortStream {
                transport: Transport::UnixSocket,
                expected: 1,
                received: 0,
            })
        })
        .expect_err("run fails");
        assert!(error.to_string().contains("after 0 of 1"), "{error}");
    }
}
