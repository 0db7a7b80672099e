//! What fetching byte ranges cost a dataset: the time its reads waited for bytes, and the bytes, for every
//! format.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;

/// Time spent fetching byte ranges and the bytes fetched, summed over every read of a dataset
/// (footers included). Reads in flight together each count their own time.
#[derive(Debug, Default)]
pub struct FetchStats {
    busy_ns: AtomicU64,
    bytes: AtomicU64,
    mapped: AtomicU64,
}

impl FetchStats {
    /// The time reads waited for their bytes.
    pub fn busy(&self) -> Duration {
        // Relaxed: a statistic; no other memory depends on it.
        Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed))
    }

    /// The bytes fetched.
    pub fn bytes(&self) -> u64 {
        // Relaxed: a statistic.
        self.bytes.load(Ordering::Relaxed)
    }

    /// The bytes of those read from a mapping of a local file, with no copy.
    pub fn mapped_bytes(&self) -> u64 {
        // Relaxed: a statistic.
        self.mapped.load(Ordering::Relaxed)
    }

    pub(crate) fn record_mapped(&self, bytes: u64) {
        // Relaxed: a statistic.
        self.mapped.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Adds a fetch of `bytes` that began at `started`.
    pub(crate) fn record(&self, started: Instant, bytes: u64) {
        let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: statistics, read on their own.
        self.busy_ns.fetch_add(elapsed, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A file reader that adds what its fetches cost to a [`FetchStats`].
pub(crate) struct Measured {
    inner: Box<dyn AsyncFileReader>,
    stats: Arc<FetchStats>,
    file_size: u64,
}

impl Measured {
    pub(crate) fn new(
        inner: Box<dyn AsyncFileReader>,
        stats: Arc<FetchStats>,
        file_size: u64,
    ) -> Measured {
        Measured {
            inner,
            stats,
            file_size,
        }
    }
}

impl AsyncFileReader for Measured {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let started = Instant::now();
            let bytes = self.inner.get_bytes(range).await?;
            self.stats.record(started, bytes.len() as u64);
            Ok(bytes)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let started = Instant::now();
            let parts = self.inner.get_byte_ranges(ranges).await?;
            self.stats
                .record(started, parts.iter().map(|part| part.len() as u64).sum());
            Ok(parts)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        let file_size = self.file_size;
        crate::parquet::load_metadata(self, file_size, options).boxed()
    }
}
