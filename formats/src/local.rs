//! The Parquet reader's adapter of the local IO engine (`sluice-io`): an [`AsyncFileReader`] over one
//! local file, and the settling of what is decoded from a mapping of it.
//!
//! The decoder takes the column chunks that the page cache holds in full straight from a mapping of the
//! file, with no copy at all ([`sluice_io::Mapping`], which also covers files that shrink while mapped).
//! Footers, page indexes and bloom filters, which outlive the decode in caches, and chunks the page cache
//! lacks are read through the engine's [`LocalReader::read_cached_first`], ranges closer than
//! [`COALESCE_GAP_BYTES`] as one read. A batch decoded from a mapping goes through [`Settle::settle`]
//! before it leaves: arrays that still point into the mapping are copied out of it, and a mapping that
//! faulted is an error, so bytes of zeros never reach a reader as data.
//!
//! A file rewritten in place at the same length, or replaced by a rename onto its path, raises no fault:
//! the mapping's pages, or the next read, hold another file's bytes. So a file is opened as the version
//! whose footer was read (its [`FileIdentity`]), and every batch decoded from it leaves only once
//! [`FileGuard::settle`] found the file still that version, open and at its path.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayData, RecordBatch, RecordBatchOptions, make_array};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::error::ArrowError;
use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;
use sluice_io::{FileIdentity, LazyMapping, LocalReader, Mapping};

use crate::fetch::FetchStats;

/// Ranges closer than this are fetched as one read.
const COALESCE_GAP_BYTES: u64 = 64 * 1024;

/// Merges ranges whose gaps are under [`COALESCE_GAP_BYTES`]; returns the merged ranges and, for each input
/// range, the merged range index that holds it.
fn coalesce(ranges: &[Range<u64>]) -> (Vec<Range<u64>>, Vec<usize>) {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|index| ranges[*index].start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    let mut owner = vec![0; ranges.len()];
    for index in order {
        let range = &ranges[index];
        match merged.last_mut() {
            Some(last) if range.start <= last.end + COALESCE_GAP_BYTES => {
                last.end = last.end.max(range.end)
            }
            _ => merged.push(range.clone()),
        }
        owner[index] = merged.len() - 1;
    }
    (merged, owner)
}

/// An [`AsyncFileReader`] over one local file through a [`LocalReader`].
#[derive(Debug, Clone)]
pub(crate) struct LocalFileReader {
    reader: LocalReader,
    file: Arc<File>,
    file_size: u64,
    uri: String,
    guard: FileGuard,
    fetch: Arc<FetchStats>,
}

impl LocalFileReader {
    /// Opens `path` on the blocking pool. With `expected`, the file opened must be that version of the
    /// file (the one a footer was read from), or the open fails.
    pub(crate) async fn open(
        reader: LocalReader,
        path: PathBuf,
        file_size: u64,
        uri: &str,
        fetch: Arc<FetchStats>,
        expected: Option<FileIdentity>,
    ) -> std::io::Result<Self> {
        let (file, path, identity) = tokio::task::spawn_blocking(move || {
            let file = File::open(&path)?;
            let identity = match expected {
                Some(expected) => {
                    expected.verify(&file, &path)?;
                    expected
                }
                None => FileIdentity::of(&file)?,
            };
            Ok::<_, std::io::Error>((file, path, identity))
        })
        .await
        .map_err(std::io::Error::other)??;
        let file = Arc::new(file);
        Ok(Self {
            reader,
            file: Arc::clone(&file),
            file_size,
            uri: uri.to_string(),
            guard: FileGuard {
                file,
                path: Arc::from(path),
                identity,
                mapping: LazyMapping::default(),
            },
            fetch,
        })
    }

    /// What settles the batches decoded from this reader's bytes.
    pub(crate) fn guard(&self) -> FileGuard {
        self.guard.clone()
    }

    /// `range` straight from a mapping of the file when the page cache holds all of it. A page evicted
    /// between this check and the decode is read back by a page fault on the decoder's thread.
    fn mapped(&self, range: &Range<u64>) -> Option<Bytes> {
        let mapping = self
            .guard
            .mapping
            .get_or_map(&self.file, self.file_size, &self.uri)?;
        let range = usize::try_from(range.start).ok()?..usize::try_from(range.end).ok()?;
        if !mapping.resident(range.clone()) {
            return None;
        }
        self.fetch.record_mapped(range.len() as u64);
        Some(mapping.bytes().slice(range))
    }

    /// A column chunk range: from the mapping when it is cached, read otherwise.
    async fn chunk(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        match self.mapped(&range) {
            Some(bytes) => Ok(bytes),
            None => self.exact(range).await,
        }
    }

    fn error(&self, error: std::io::Error) -> parquet::errors::ParquetError {
        parquet::errors::ParquetError::External(Box::new(std::io::Error::new(
            error.kind(),
            format!("reading {}: {error}", self.uri),
        )))
    }

    /// Reads `range`, which must lie inside the file: a range the decoder asks for comes from the
    /// file's own footer or page headers, so a range past the file's end is refused before a
    /// buffer is sized by it.
    async fn exact(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        if range.start > range.end || range.end > self.file_size {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{}: range {}..{} runs past the end of the file ({} bytes): the footer or a page header claims bytes the file does not hold",
                self.uri, range.start, range.end, self.file_size
            )));
        }
        let wanted = range.end - range.start;
        let bytes = self
            .reader
            .read_cached_first(&self.file, range.clone())
            .await
            .map_err(|error| self.error(error))?;
        if (bytes.len() as u64) < wanted {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{}: range {}..{} runs past the end of the file ({} bytes)",
                self.uri, range.start, range.end, self.file_size
            )));
        }
        Ok(bytes)
    }
}

impl AsyncFileReader for LocalFileReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move { self.exact(range).await }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let (merged, owner) = coalesce(&ranges);
            let fetched =
                futures::future::try_join_all(merged.iter().map(|range| self.chunk(range.clone())))
                    .await?;
            Ok(ranges
                .iter()
                .zip(owner)
                .map(|(range, index)| {
                    let base = merged[index].start;
                    let start = usize::try_from(range.start - base).unwrap_or(usize::MAX);
                    let end = usize::try_from(range.end - base).unwrap_or(usize::MAX);
                    fetched[index].slice(start..end)
                })
                .collect())
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

/// One local file as it was opened for a read: the version of the file its bytes must come from, and
/// the mapping its column chunks may be read from.
#[derive(Debug, Clone)]
pub(crate) struct FileGuard {
    file: Arc<File>,
    path: Arc<Path>,
    identity: FileIdentity,
    mapping: LazyMapping,
}

impl FileGuard {
    /// The version of the file that was opened.
    pub(crate) fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// Makes a batch decoded from the file safe to hand on: the mapping settles it ([`Settle`]), then the
    /// file must still be the version that was opened, open and at its path; an error otherwise.
    pub(crate) fn settle(&self, batch: RecordBatch) -> std::io::Result<RecordBatch> {
        let batch = self.mapping.settle(batch)?;
        self.identity.verify(&self.file, &self.path)?;
        Ok(batch)
    }

    /// The cause to give for a decoder's error, when there is one: the file shrank under its mapping, or
    /// it changed while it was read.
    pub(crate) fn check(&self) -> std::io::Result<()> {
        self.mapping.check()?;
        self.identity.verify(&self.file, &self.path)
    }
}

/// Makes batches decoded from a mapping of a file safe to hand on.
pub(crate) trait Settle {
    /// Makes a decoded batch safe to hand on: columns that point into the mapping are copied out of it,
    /// then a fault anywhere in the mapping is an error (`UnexpectedEof`).
    fn settle(&self, batch: RecordBatch) -> std::io::Result<RecordBatch>;
}

impl Settle for Mapping {
    fn settle(&self, batch: RecordBatch) -> std::io::Result<RecordBatch> {
        let batch = if batch
            .columns()
            .iter()
            .any(|column| aliases(self, &column.to_data()))
        {
            batch
                .columns()
                .iter()
                .map(|column| copied(self, column.to_data()).map(make_array))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|columns| {
                    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                    RecordBatch::try_new_with_options(batch.schema(), columns, &options)
                })
                .map_err(|error| {
                    std::io::Error::other(format!(
                        "copying decoded arrays out of the file's mapping: {error}"
                    ))
                })?
        } else {
            batch
        };
        self.check()?;
        Ok(batch)
    }
}

impl Settle for LazyMapping {
    /// [`Mapping::settle`](Settle::settle) when the file was mapped; the batch as it is otherwise.
    fn settle(&self, batch: RecordBatch) -> std::io::Result<RecordBatch> {
        match self.get() {
            Some(mapping) => mapping.settle(batch),
            None => Ok(batch),
        }
    }
}

/// Whether a buffer of `data` or of its children points into `mapping`.
fn aliases(mapping: &Mapping, data: &ArrayData) -> bool {
    data.buffers()
        .iter()
        .any(|buffer| mapping.overlaps(buffer.as_slice()))
        || data
            .nulls()
            .is_some_and(|nulls| mapping.overlaps(nulls.buffer().as_slice()))
        || data
            .child_data()
            .iter()
            .any(|child| aliases(mapping, child))
}

/// `data` with every buffer that points into `mapping` copied out of it.
fn copied(mapping: &Mapping, data: ArrayData) -> Result<ArrayData, ArrowError> {
    let own = |buffer: &Buffer| {
        if mapping.overlaps(buffer.as_slice()) {
            Buffer::from_slice_ref(buffer.as_slice())
        } else {
            buffer.clone()
        }
    };
    let buffers = data.buffers().iter().map(own).collect();
    let nulls = data.nulls().map(|nulls| {
        NullBuffer::new(BooleanBuffer::new(
            own(nulls.buffer()),
            nulls.offset(),
            nulls.len(),
        ))
    });
    let children = data
        .child_data()
        .iter()
        .map(|child| copied(mapping, child.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    data.into_builder()
        .buffers(buffers)
        .nulls(nulls)
        .child_data(children)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    use arrow::array::{Array, Int32Array};

    /// Bytes of the test files filled with one value: a page on most systems, though nothing here
    /// depends on the page size.
    const STRIDE: usize = 4096;

    /// A file of `strides` runs of [`STRIDE`] bytes, each filled with its own index plus one.
    fn paged_file(strides: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let content: Vec<u8> = (0..strides)
            .flat_map(|index| std::iter::repeat_n(index as u8 + 1, STRIDE))
            .collect();
        let mut file = tempfile::NamedTempFile::new().expect("tempfile");
        file.write_all(&content).expect("write");
        file.as_file().sync_all().expect("sync");
        (file, content)
    }

    fn mapped(file: &tempfile::NamedTempFile, length: usize) -> Arc<Mapping> {
        Mapping::new(file.as_file(), length as u64)
            .expect("maps")
            .expect("a free slot")
    }

    #[test]
    fn coalescing_merges_near_ranges_and_maps_each_back() {
        let ranges = vec![200_000..200_010, 0..10, 20..30, 100_000..100_005];
        let (merged, owner) = coalesce(&ranges);
        assert_eq!(merged, vec![0..30, 100_000..100_005, 200_000..200_010]);
        assert_eq!(owner, vec![2, 0, 0, 1]);
    }

    #[test]
    fn arrays_that_point_into_the_mapping_are_copied_out_of_it() {
        let (file, content) = paged_file(2);
        let sut = mapped(&file, content.len());
        let values = Buffer::from(sut.bytes().slice(STRIDE..STRIDE + 16));
        let column = Int32Array::new(values.into(), None);
        let kept = Int32Array::from(vec![7, 8, 9, 10]);
        let batch = RecordBatch::try_from_iter([
            ("mapped", Arc::new(column.clone()) as _),
            ("kept", Arc::new(kept.clone()) as _),
        ])
        .expect("batch");
        let settled = sut.settle(batch).expect("settles");
        assert!(aliases(&sut, &column.to_data()));
        assert!(!aliases(&sut, &settled.column(0).to_data()));
        assert!(
            settled.column(1).to_data().buffers()[0].ptr_eq(&kept.to_data().buffers()[0]),
            "arrays outside the mapping are kept as they are"
        );
        file.as_file().set_len(0).expect("truncate");
        assert_eq!(
            settled.column(0).as_ref(),
            &Int32Array::from(vec![0x0202_0202; 4]) as &dyn Array,
            "the copy holds the file's bytes after the file is gone"
        );
        assert!(
            !sut.faulted(),
            "nothing read the mapping after the truncation"
        );
    }

    #[test]
    fn a_batch_settled_after_its_mapping_faulted_is_an_error() {
        // Past the end of the truncated file by far more than a page, whatever the page size.
        let (file, content) = paged_file(128);
        let sut = mapped(&file, content.len());
        let bytes = sut.bytes();
        file.as_file().set_len(0).expect("truncate");
        assert_eq!(
            bytes[content.len() / 2],
            0,
            "a page past the end reads as zeros"
        );
        let column = Int32Array::from(vec![1, 2, 3]);
        let batch = RecordBatch::try_from_iter([("value", Arc::new(column) as _)]).expect("batch");
        let error = sut.settle(batch).expect_err("a faulted mapping fails");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(error.to_string().contains("shrank while it was read"));
        let lazy = LazyMapping::default();
        let other =
            RecordBatch::try_from_iter([("value", Arc::new(Int32Array::from(vec![4])) as _)])
                .expect("batch");
        assert_eq!(lazy.settle(other.clone()).expect("unmapped"), other);
    }
}
