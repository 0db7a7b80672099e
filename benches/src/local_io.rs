//! `sluice-bench local-io`: byte-range reads of a local file through io_uring and through `pread`, the two
//! paths of [`sluice_formats::uring::LocalReader`].
//!
//! The file (1 GiB, 64 MiB in quick mode) lives in the cache directory, on a real file system rather than
//! tmpfs. Every pass reads the whole file as ranges of one size, in a shuffled order, with a fixed number
//! of reads in flight, from a two-worker tokio runtime as the daemon has, and checks that each range came
//! back whole and from the right offset (every 8-byte word of the file holds its own offset). Passes run
//! in two states of the page cache:
//!
//! - `cold`: the file's pages are dropped with `posix_fadvise(DONTNEED)` before the pass, so the reads go to
//!   the device (or the hypervisor's cache: hence "cold-ish");
//! - `warm`: the file was read just before, so every page is in memory and a read is a copy.
//!
//! The two paths take turns, and their order swaps from one round to the next.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use serde::Serialize;
use sluice_formats::LocalIo;
use sluice_formats::uring::{LocalBackend, LocalReader};

use crate::command::{Spread, load_average};
use crate::error::{BenchError, Result};

/// The file of a full run.
pub const FULL_FILE_BYTES: u64 = 1 << 30;
/// The file of a quick run.
pub const QUICK_FILE_BYTES: u64 = 64 << 20;
/// Range sizes typical of Parquet column chunks and pages.
pub const DEFAULT_RANGE_SIZES: [usize; 4] = [64 << 10, 512 << 10, 1 << 20, 8 << 20];
/// Reads in flight at once, by default.
pub const DEFAULT_IN_FLIGHT: usize = 8;
/// Bytes written to the file per call while it is created.
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// What `sluice-bench local-io` runs.
#[derive(Debug, Clone)]
pub struct LocalIoBenchOptions {
    /// Where the file is written and reused from; not tmpfs, or "cold" means nothing.
    pub cache_dir: PathBuf,
    /// A 64 MiB file and one round, for CI.
    pub quick: bool,
    /// Rounds (at least 1).
    pub rounds: usize,
    /// Reads in flight at once (at least 1).
    pub in_flight: usize,
    /// The range sizes, in bytes.
    pub range_sizes: Vec<usize>,
}

/// The page-cache state a pass starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheState {
    /// The file's pages were dropped just before.
    Cold,
    /// The whole file is in the page cache.
    Warm,
}

impl CacheState {
    fn name(self) -> &'static str {
        match self {
            CacheState::Cold => "cold",
            CacheState::Warm => "warm",
        }
    }
}

/// The figures of one range size in one cache state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalIoCase {
    /// The page-cache state.
    pub cache: CacheState,
    /// The bytes of each read.
    pub range_bytes: usize,
    /// io_uring: GB/s (1e9 bytes per second).
    pub uring_gbps: Spread,
    /// `pread` on the blocking pool: GB/s.
    pub pread_gbps: Spread,
    /// Median io_uring GB/s over median `pread` GB/s.
    pub ratio: f64,
}

/// Everything one `sluice-bench local-io` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalIoBenchReport {
    /// The file read.
    pub file: String,
    /// Its size.
    pub file_bytes: u64,
    /// Reads in flight.
    pub in_flight: usize,
    /// Rounds.
    pub rounds: usize,
    /// The 1-minute load average when the run started.
    pub load_average_start: Option<f64>,
    /// The 1-minute load average when the run ended.
    pub load_average_end: Option<f64>,
    /// One entry per cache state and range size.
    pub cases: Vec<LocalIoCase>,
}

/// The value of the 8-byte word at `offset` (a multiple of 8) of the benchmark file.
fn word_at(offset: u64) -> u64 {
    offset ^ 0x5a5a_5a5a_5a5a_5a5a
}

fn setup_error(operation: String) -> impl FnOnce(std::io::Error) -> BenchError {
    move |source| BenchError::Setup { operation, source }
}

/// Returns the benchmark file of `bytes` bytes in `directory`, writing it unless it is already there.
fn ensure_file(directory: &Path, bytes: u64) -> Result<PathBuf> {
    let path = directory.join(format!("local-io-{bytes}.bin"));
    if std::fs::metadata(&path).is_ok_and(|metadata| metadata.len() == bytes) {
        return Ok(path);
    }
    std::fs::create_dir_all(directory).map_err(setup_error(format!(
        "creating the cache directory {}",
        directory.display()
    )))?;
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    let mut file =
        File::create(&partial).map_err(setup_error(format!("creating {}", partial.display())))?;
    let mut chunk = Vec::with_capacity(WRITE_CHUNK_BYTES);
    let mut offset = 0u64;
    while offset < bytes {
        chunk.clear();
        let end = (offset + WRITE_CHUNK_BYTES as u64).min(bytes);
        for word in (offset..end).step_by(8) {
            chunk.extend_from_slice(&word_at(word).to_le_bytes());
        }
        chunk.truncate(usize::try_from(end - offset).unwrap_or(usize::MAX));
        file.write_all(&chunk)
            .map_err(setup_error(format!("writing {}", partial.display())))?;
        offset = end;
    }
    file.sync_all()
        .map_err(setup_error(format!("syncing {}", partial.display())))?;
    std::fs::rename(&partial, &path).map_err(setup_error(format!(
        "moving {} into place",
        partial.display()
    )))?;
    Ok(path)
}

/// Drops the file's pages from the page cache (the file is clean, so all of them go).
fn drop_from_page_cache(file: &File, path: &Path) -> Result<()> {
    // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for the call.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if status != 0 {
        return Err(BenchError::Setup {
            operation: format!("dropping {} from the page cache", path.display()),
            source: std::io::Error::from_raw_os_error(status),
        });
    }
    Ok(())
}

/// The file cut into ranges of `size` bytes (the last one shorter), in a shuffled order.
fn shuffled_ranges(file_bytes: u64, size: usize, seed: u64) -> Vec<Range<u64>> {
    let size = size as u64;
    let mut ranges: Vec<Range<u64>> = (0..file_bytes.div_ceil(size))
        .map(|index| index * size..((index + 1) * size).min(file_bytes))
        .collect();
    ranges.shuffle(&mut SmallRng::seed_from_u64(seed));
    ranges
}

/// Reads every range through `reader` with `in_flight` reads at once; returns the time it took.
async fn pass(
    reader: &LocalReader,
    file: &Arc<File>,
    ranges: &[Range<u64>],
    in_flight: usize,
) -> std::io::Result<Duration> {
    let started = Instant::now();
    let mut reads = futures::stream::iter(ranges.iter().map(|range| async move {
        reader
            .read(file, range.clone())
            .await
            .map(|bytes| (range.clone(), bytes))
    }))
    .buffer_unordered(in_flight);
    while let Some(read) = reads.next().await {
        let (range, bytes) = read?;
        let expected = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        let first_word = bytes
            .get(..8)
            .and_then(|word| word.try_into().ok())
            .map(u64::from_le_bytes);
        if bytes.len() != expected || first_word != Some(word_at(range.start)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "range {range:?} came back as {} bytes starting with {first_word:x?}",
                    bytes.len()
                ),
            ));
        }
    }
    Ok(started.elapsed())
}

/// Runs the local-read benchmark; `progress` receives one line per finished pass.
///
/// # Errors
///
/// Returns an error when the file cannot be written, io_uring is refused, or a read fails or returns the
/// wrong bytes.
pub fn run_local_io_bench(
    options: &LocalIoBenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<LocalIoBenchReport> {
    if options.rounds == 0 || options.in_flight == 0 || options.range_sizes.is_empty() {
        return Err(BenchError::InvalidOption {
            option: "--rounds, --in-flight, --sizes".to_owned(),
            reason: "each needs at least 1".to_owned(),
        });
    }
    if let Some(size) = options.range_sizes.iter().find(|size| **size < 8) {
        return Err(BenchError::InvalidOption {
            option: "--sizes".to_owned(),
            reason: format!("{size} bytes is below the 8-byte words the reads are checked by"),
        });
    }
    let file_bytes = if options.quick {
        QUICK_FILE_BYTES
    } else {
        FULL_FILE_BYTES
    };
    let rounds = if options.quick { 1 } else { options.rounds };
    let path = ensure_file(&options.cache_dir, file_bytes)?;
    let file =
        Arc::new(File::open(&path).map_err(setup_error(format!("opening {}", path.display())))?);
    let uring = LocalReader::new(LocalIo::Uring).map_err(|source| BenchError::ToolMissing {
        program: "io_uring".to_owned(),
        purpose: "the io_uring side of the comparison".to_owned(),
        reason: source.to_string(),
        fix: "run on a kernel and in a container that allow io_uring_setup".to_owned(),
    })?;
    let pread =
        LocalReader::new(LocalIo::Pread).map_err(setup_error("starting pread reads".to_owned()))?;
    let readers = [(LocalBackend::Uring, &uring), (LocalBackend::Pread, &pread)];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(setup_error("starting the async runtime".to_owned()))?;
    let load_average_start = load_average();
    let mut samples: BTreeMap<(CacheState, usize, bool), Vec<f64>> = BTreeMap::new();
    for round in 0..rounds {
        for cache in [CacheState::Cold, CacheState::Warm] {
            for &size in &options.range_sizes {
                let ranges = shuffled_ranges(file_bytes, size, round as u64);
                for turn in 0..readers.len() {
                    let (backend, reader) = readers[(round + turn) % readers.len()];
                    match cache {
                        CacheState::Cold => drop_from_page_cache(&file, &path)?,
                        CacheState::Warm => {
                            let all = shuffled_ranges(file_bytes, 8 << 20, 0);
                            runtime
                                .block_on(pass(&pread, &file, &all, options.in_flight))
                                .map_err(setup_error(format!("warming {}", path.display())))?;
                        }
                    }
                    let elapsed = runtime
                        .block_on(pass(reader, &file, &ranges, options.in_flight))
                        .map_err(setup_error(format!(
                            "reading {} through {backend:?}",
                            path.display()
                        )))?;
                    let gbps = file_bytes as f64 / elapsed.as_secs_f64() / 1e9;
                    progress(&format!(
                        "round {}: {} {}: {backend:?}: {gbps:.2} GB/s",
                        round + 1,
                        cache.name(),
                        human_bytes(size)
                    ));
                    samples
                        .entry((cache, size, backend == LocalBackend::Uring))
                        .or_default()
                        .push(gbps);
                }
            }
        }
    }
    let mut cases = Vec::new();
    for cache in [CacheState::Cold, CacheState::Warm] {
        for &size in &options.range_sizes {
            let mut spread = |uring: bool| {
                Spread::measured(
                    samples.remove(&(cache, size, uring)).unwrap_or_default(),
                    || format!("{} {} reads", cache.name(), human_bytes(size)),
                )
            };
            let uring_gbps = spread(true)?;
            let pread_gbps = spread(false)?;
            cases.push(LocalIoCase {
                cache,
                range_bytes: size,
                ratio: uring_gbps.median / pread_gbps.median,
                uring_gbps,
                pread_gbps,
            });
        }
    }
    Ok(LocalIoBenchReport {
        file: path.display().to_string(),
        file_bytes,
        in_flight: options.in_flight,
        rounds,
        load_average_start,
        load_average_end: load_average(),
        cases,
    })
}

/// `64 KiB`, `8 MiB` or a byte count.
pub fn human_bytes(bytes: usize) -> String {
    match bytes {
        bytes if bytes >= 1 << 20 && bytes % (1 << 20) == 0 => format!("{} MiB", bytes >> 20),
        bytes if bytes >= 1 << 10 && bytes % (1 << 10) == 0 => format!("{} KiB", bytes >> 10),
        bytes => format!("{bytes} B"),
    }
}

impl LocalIoBenchReport {
    /// The report as one JSON object.
    ///
    /// # Errors
    ///
    /// Returns serde's error, which a report of finite numbers never produces.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report as a table for people.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let load = crate::command::format_load;
        // Writing to a String cannot fail.
        writeln!(
            out,
            "local reads of {} ({} MiB), {} in flight, GB/s: median of {} round(s) [min..max]; load average {} at start, {} at end",
            self.file,
            self.file_bytes >> 20,
            self.in_flight,
            self.rounds,
            load(self.load_average_start),
            load(self.load_average_end)
        )
        .ok();
        writeln!(
            out,
            "{:<6} {:>8} {:>22} {:>22} {:>8}",
            "cache", "range", "io_uring", "pread", "ratio"
        )
        .ok();
        let rate = |spread: &Spread| {
            format!(
                "{:.2} [{:.2}..{:.2}]",
                spread.median, spread.min, spread.max
            )
        };
        for case in &self.cases {
            writeln!(
                out,
                "{:<6} {:>8} {:>22} {:>22} {:>7.2}x",
                case.cache.name(),
                human_bytes(case.range_bytes),
                rate(&case.uring_gbps),
                rate(&case.pread_gbps),
                case.ratio
            )
            .ok();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_file_once_in_a_shuffled_order() {
        let sut = shuffled_ranges(10_000, 4096, 3);
        let mut sorted = sut.clone();
        sorted.sort_by_key(|range| range.start);
        assert_eq!(sorted, vec![0..4096, 4096..8192, 8192..10_000]);
        let many = shuffled_ranges(1 << 20, 4096, 3);
        assert!(
            many.windows(2).any(|pair| pair[0].start > pair[1].start),
            "shuffled"
        );
    }

    #[test]
    fn a_pass_checks_every_range_and_reports_a_wrong_one() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = ensure_file(directory.path(), 1 << 20).expect("file");
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 1 << 20);
        let file = Arc::new(File::open(&path).expect("open"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let reader = LocalReader::new(LocalIo::Pread).expect("pread");
        let ranges = shuffled_ranges(1 << 20, 64 << 10, 1);
        runtime
            .block_on(pass(&reader, &file, &ranges, 4))
            .expect("every range is right");
        let past_the_end = (1 << 20) - 8..(1 << 20) + 8;
        let error = runtime
            .block_on(pass(&reader, &file, std::slice::from_ref(&past_the_end), 1))
            .expect_err("short read");
        assert!(
            error.to_string().contains("came back as 8 bytes"),
            "{error}"
        );
        let misaligned = 4..12;
        runtime
            .block_on(pass(&reader, &file, std::slice::from_ref(&misaligned), 1))
            .expect_err("a range from the wrong offset");
    }
}
