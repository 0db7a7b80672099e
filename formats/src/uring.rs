//! Local byte-range reads through io_uring on a dedicated thread, with a `pread` fallback.
//!
//! # Implementation
//!
//! One thread owns the ring. Callers send it read requests over a channel and await a oneshot reply. The
//! thread allocates each request's buffer, queues an `IORING_OP_READ` tagged with the request's slot, and
//! keeps the buffer and the file in that slot until the completion for the tag arrives, so the kernel never
//! writes into freed memory and never reads a closed descriptor. A short read (the file shrank, or the
//! kernel returned fewer bytes) is finished with `pread` on the same thread. The thread drains its in-flight
//! reads before it exits, which it does when the last [`LocalReader`] handle is dropped.
//!
//! Where io_uring is refused (seccomp filters in containers, old kernels), [`LocalIo::Auto`] falls back to
//! `pread` on tokio's blocking pool.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::mpsc;

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;

/// Entries of the submission queue.
const RING_ENTRIES: u32 = 128;
/// Ranges closer than this are fetched as one read.
const COALESCE_GAP_BYTES: u64 = 64 * 1024;

/// How local files are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LocalIo {
    /// io_uring when the kernel allows it, `pread` otherwise.
    #[default]
    Auto,
    /// io_uring, or an error when the kernel refuses it.
    Uring,
    /// `pread` on the blocking thread pool.
    Pread,
    /// `object_store`'s local file system, like remote stores.
    ObjectStore,
}

/// The backend a [`LocalReader`] ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalBackend {
    /// The io_uring thread.
    Uring,
    /// `pread` on the blocking pool.
    Pread,
}

struct ReadRequest {
    file: Arc<File>,
    offset: u64,
    length: usize,
    reply: tokio::sync::oneshot::Sender<std::io::Result<Bytes>>,
}

/// A read queued in the ring: the request and the buffer the kernel writes into.
struct InFlight {
    request: ReadRequest,
    buffer: Vec<u8>,
}

/// Reads byte ranges of local files.
#[derive(Debug, Clone)]
pub struct LocalReader {
    backend: LocalBackend,
    sender: Option<mpsc::Sender<ReadRequest>>,
}

impl LocalReader {
    /// Starts a reader: with [`LocalIo::Uring`] or [`LocalIo::Auto`], a ring and its thread.
    ///
    /// # Errors
    ///
    /// Returns the OS error when [`LocalIo::Uring`] is asked for and the kernel refuses io_uring.
    pub fn new(mode: LocalIo) -> std::io::Result<Self> {
        if matches!(mode, LocalIo::Pread | LocalIo::ObjectStore) {
            return Ok(Self {
                backend: LocalBackend::Pread,
                sender: None,
            });
        }
        match io_uring::IoUring::new(RING_ENTRIES) {
            Ok(ring) => {
                let (sender, receiver) = mpsc::channel();
                std::thread::Builder::new()
                    .name("sluice-uring".to_string())
                    .spawn(move || ring_thread(ring, &receiver))?;
                Ok(Self {
                    backend: LocalBackend::Uring,
                    sender: Some(sender),
                })
            }
            Err(error) if mode == LocalIo::Auto => {
                tracing::info!(%error, "io_uring is not available, reading local files with pread");
                Ok(Self {
                    backend: LocalBackend::Pread,
                    sender: None,
                })
            }
            Err(error) => Err(error),
        }
    }

    /// Returns the backend in use.
    pub fn backend(&self) -> LocalBackend {
        self.backend
    }

    /// Reads `range` of `file`; the result is shorter only at the end of the file.
    ///
    /// # Errors
    ///
    /// Returns the OS error of the read.
    pub async fn read(&self, file: &Arc<File>, range: Range<u64>) -> std::io::Result<Bytes> {
        let length = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "range too large")
        })?;
        match &self.sender {
            Some(sender) => {
                let (reply, response) = tokio::sync::oneshot::channel();
                sender
                    .send(ReadRequest {
                        file: Arc::clone(file),
                        offset: range.start,
                        length,
                        reply,
                    })
                    .map_err(|_| std::io::Error::other("the io_uring thread has stopped"))?;
                response
                    .await
                    .map_err(|_| std::io::Error::other("the io_uring thread dropped a read"))?
            }
            None => {
                let file = Arc::clone(file);
                tokio::task::spawn_blocking(move || {
                    pread_exact(&file, range.start, vec![0; length], 0)
                })
                .await
                .map_err(std::io::Error::other)?
            }
        }
    }
}

/// Fills `buffer[filled..]` from `offset + filled` with `pread`, stopping early only at the end of the file.
fn pread_exact(
    file: &File,
    offset: u64,
    mut buffer: Vec<u8>,
    mut filled: usize,
) -> std::io::Result<Bytes> {
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    buffer.truncate(filled);
    Ok(Bytes::from(buffer))
}

fn ring_thread(mut ring: io_uring::IoUring, receiver: &mpsc::Receiver<ReadRequest>) {
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    let mut next_tag = 0u64;
    let mut open = true;
    while open || !in_flight.is_empty() {
        let mut incoming = Vec::new();
        if in_flight.is_empty() {
            match receiver.recv() {
                Ok(request) => incoming.push(request),
                Err(_) => open = false,
            }
        }
        loop {
            match receiver.try_recv() {
                Ok(request) => incoming.push(request),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        for request in incoming {
            let tag = next_tag;
            next_tag += 1;
            let Ok(length) = u32::try_from(request.length) else {
                // Larger than one read can return: serve it with pread on this thread.
                let result = pread_exact(&request.file, request.offset, vec![0; request.length], 0);
                let _ = request.reply.send(result);
                continue;
            };
            let mut slot = InFlight {
                buffer: vec![0; request.length],
                request,
            };
            let entry = io_uring::opcode::Read::new(
                io_uring::types::Fd(slot.request.file.as_raw_fd()),
                slot.buffer.as_mut_ptr(),
                length,
            )
            .offset(slot.request.offset)
            .build()
            .user_data(tag);
            let pushed = {
                let mut submission = ring.submission();
                // SAFETY: the buffer and the file live in `in_flight[tag]`, which is removed only when the
                // completion tagged `tag` has arrived; the heap buffer does not move when the slot moves.
                unsafe { submission.push(&entry) }
            };
            if pushed.is_err() {
                // The queue is full: hand what is queued to the kernel and retry once there is room.
                if let Err(error) = ring.submit() {
                    let _ = slot.request.reply.send(Err(error));
                    continue;
                }
                let retry = {
                    let mut submission = ring.submission();
                    // SAFETY: as above; the slot is stored below before any completion is reaped.
                    unsafe { submission.push(&entry) }
                };
                if retry.is_err() {
                    let result = pread_exact(
                        &slot.request.file,
                        slot.request.offset,
                        std::mem::take(&mut slot.buffer),
                        0,
                    );
                    let _ = slot.request.reply.send(result);
                    continue;
                }
            }
            in_flight.insert(tag, slot);
        }
        if in_flight.is_empty() {
            continue;
        }
        if let Err(error) = ring.submit_and_wait(1) {
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(%error, "io_uring failed, continuing with pread");
            // Tearing the ring down cancels and waits for its reads, so the buffers can be freed after it.
            drop(ring);
            for (_, slot) in in_flight.drain() {
                let result = pread_exact(&slot.request.file, slot.request.offset, slot.buffer, 0);
                let _ = slot.request.reply.send(result);
            }
            while let Ok(request) = receiver.recv() {
                let result = pread_exact(&request.file, request.offset, vec![0; request.length], 0);
                let _ = request.reply.send(result);
            }
            return;
        }
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|entry| (entry.user_data(), entry.result()))
            .collect();
        for (tag, result) in completions {
            let Some(slot) = in_flight.remove(&tag) else {
                continue;
            };
            let reply = if result < 0 {
                Err(std::io::Error::from_raw_os_error(-result))
            } else {
                let filled = usize::try_from(result).unwrap_or(0);
                if filled == slot.buffer.len() || filled == 0 {
                    let mut buffer = slot.buffer;
                    buffer.truncate(filled);
                    Ok(Bytes::from(buffer))
                } else {
                    pread_exact(&slot.request.file, slot.request.offset, slot.buffer, filled)
                }
            };
            let _ = slot.request.reply.send(reply);
        }
    }
}

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
}

impl LocalFileReader {
    /// Opens `path` on the blocking pool.
    pub(crate) async fn open(
        reader: LocalReader,
        path: std::path::PathBuf,
        file_size: u64,
        uri: &str,
    ) -> std::io::Result<Self> {
        let file = tokio::task::spawn_blocking(move || File::open(path))
            .await
            .map_err(std::io::Error::other)??;
        Ok(Self {
            reader,
            file: Arc::new(file),
            file_size,
            uri: uri.to_string(),
        })
    }

    fn error(&self, error: std::io::Error) -> parquet::errors::ParquetError {
        parquet::errors::ParquetError::External(Box::new(std::io::Error::new(
            error.kind(),
            format!("reading {}: {error}", self.uri),
        )))
    }

    async fn exact(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        let wanted = range.end.saturating_sub(range.start);
        let bytes = self
            .reader
            .read(&self.file, range.clone())
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
                futures::future::try_join_all(merged.iter().map(|range| self.exact(range.clone())))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn coalescing_merges_near_ranges_and_maps_each_back() {
        let ranges = vec![200_000..200_010, 0..10, 20..30, 100_000..100_005];
        let (merged, owner) = coalesce(&ranges);
        assert_eq!(merged, vec![0..30, 100_000..100_005, 200_000..200_010]);
        assert_eq!(owner, vec![2, 0, 0, 1]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uring_and_pread_read_the_same_bytes() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("bytes.bin");
        let content: Vec<u8> = (0..300_000u32)
            .map(|value| (value.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        std::fs::File::create(&path)
            .expect("create")
            .write_all(&content)
            .expect("write");
        let file = Arc::new(File::open(&path).expect("open"));
        let pread = LocalReader::new(LocalIo::Pread).expect("pread");
        let uring = match LocalReader::new(LocalIo::Uring) {
            Ok(reader) => reader,
            Err(error) => {
                eprintln!(
                    "skipped: uring_and_pread_read_the_same_bytes: io_uring refused here ({error})"
                );
                return;
            }
        };
        assert_eq!(uring.backend(), LocalBackend::Uring);
        let ranges = [
            0..10u64,
            4096..70_000,
            299_990..300_000,
            299_995..300_100,
            300_000..300_010,
            5..5,
        ];
        for range in ranges {
            let from_uring = uring.read(&file, range.clone()).await.expect("uring read");
            let from_pread = pread.read(&file, range.clone()).await.expect("pread read");
            let end = usize::try_from(range.end.min(300_000)).expect("fits");
            let start = usize::try_from(range.start.min(300_000)).expect("fits");
            assert_eq!(from_uring, from_pread, "{range:?}");
            assert_eq!(&from_uring[..], &content[start..end], "{range:?}");
        }
        let many = futures::future::try_join_all(
            (0..500u64).map(|index| uring.read(&file, index * 599..index * 599 + 77)),
        )
        .await
        .expect("concurrent reads");
        for (index, bytes) in many.iter().enumerate() {
            let start = index * 599;
            assert_eq!(&bytes[..], &content[start..start + 77]);
        }
    }
}
