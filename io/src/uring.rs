//! Local byte-range reads through io_uring on dedicated threads, with a `pread` fallback.
//!
//! # Implementation
//!
//! A caller may take the ranges that the page cache holds in full straight from a mapping of the file,
//! with no copy at all (see [`crate::mapped`], which also covers files that shrink while mapped); the
//! formats layer's Parquet reader does so for column chunks. Everything else is read here.
//!
//! [`LocalReader::read_cached_first`], the read for a caller that waits for its bytes (a decoder), first
//! copies what the page cache holds of its range on the caller's thread, with `preadv2(RWF_NOWAIT)`, which copies cached pages and answers
//! `EAGAIN` (or a short count) instead of waiting for the device: the system call exists for this, so that
//! a thread-pool design hands only the reads that would block to its pool. The copy costs the same CPU on
//! whichever thread makes it; made by a decoder that has nothing to do until its bytes arrive, it needs no
//! hand-off and no wake-up, and it does not preempt another decoder on the core where a ring thread would
//! have run. Only what is left (the pages not cached, or every read where the file system refuses
//! `RWF_NOWAIT`) goes to the backend below, which [`LocalReader::read`] uses for the whole range: a caller
//! with many reads in flight in one task has them copied in parallel by the ring threads, where copies on
//! its own thread would follow one another.
//!
//! There is one ring per core this process may use, each owned by its own thread. A caller takes the
//! read's buffer (unzeroed), puts the rest of the request on a queue the ring threads share, and awaits a
//! oneshot reply; a ring thread takes more requests only while it has fewer than two pieces waiting, so a
//! ring with a backlog leaves new reads to an idle one. The rest of a read is cut into 1 MiB pieces. Each
//! piece is first issued with `RWF_NOWAIT`, so the kernel copies right away on the ring's thread what the
//! page cache holds, and answers `EAGAIN` (or a short count) instead of waiting for the device; what is
//! left of the piece is then issued again with `IOSQE_ASYNC`, for the kernel's worker threads, which wait
//! for the device and serve several pieces at once. Cold reads thus keep many requests in flight at the
//! device, and a warm read costs one copy: on the caller's thread with `read_cached_first`, on a ring's
//! thread, after one hop, with `read`.
//!
//! The thread keeps each buffer and file in the read's entry until the completion of every piece has
//! arrived, so the kernel never writes into freed memory and never reads a closed descriptor. A piece that
//! the workers cut short (the end of the file, or the file shrank) ends the read there, and `pread` checks
//! the rest on the same thread. A thread drains its in-flight reads before it exits, which it does when the
//! last [`LocalReader`] handle is dropped.
//!
//! A read's buffer comes from a small pool of the buffers of finished reads (see [`BufferPool`]), so that
//! a long read fills pages already mapped instead of faulting in fresh ones.
//!
//! Registered buffers (`IORING_OP_READ_FIXED`) are not used: a read's bytes go to the caller as they are
//! and live as long as it needs them (a decoder: until it has decoded what they hold), so a fixed set of
//! registered buffers would either be copied out of, or be held by the caller for as long.
//!
//! Where io_uring is refused (seccomp filters in containers, old kernels), [`LocalIo::Auto`] falls back to
//! `pread` on tokio's blocking pool.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Entries of the submission queue.
const RING_ENTRIES: u32 = 128;

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
    /// The first bytes of the range already read, with room for `length` bytes: the read fills its spare
    /// capacity, so no byte is zeroed first.
    buffer: Vec<u8>,
    reply: tokio::sync::oneshot::Sender<std::io::Result<Vec<u8>>>,
}

/// The ring threads of a [`LocalReader`]: one per core this process may use, all taking reads from one
/// queue, each when it has little left to copy, so that no ring idles while another has a backlog.
#[derive(Debug)]
struct Rings {
    sender: crossbeam_channel::Sender<ReadRequest>,
}

/// Reads byte ranges of local files.
#[derive(Debug, Clone)]
pub struct LocalReader {
    backend: LocalBackend,
    rings: Option<Arc<Rings>>,
    buffers: Arc<BufferPool>,
    /// Set for good when the file system refuses `RWF_NOWAIT`: [`LocalReader::read_cached_first`] then
    /// sends every read to the backend.
    nowait_refused: Arc<AtomicBool>,
}

/// Buffers this long or longer are pooled; shorter ones come from the allocator's heap, which reuses
/// freed memory by itself.
const POOLED_MIN_BYTES: usize = 1 << 20;
/// At most this many bytes of buffers wait in the pool.
const POOL_MAX_BYTES: usize = 256 << 20;

/// The buffers of finished reads, kept for the next ones.
///
/// A buffer larger than the allocator's mmap threshold (32 MiB with glibc, whatever `mallopt` says) is a
/// fresh mapping for every read, and each of its pages faults when the kernel first copies into it: on a
/// training-like file, whose column chunks run to tens of megabytes, most of a read's system time. A
/// buffer handed out again has its pages mapped already.
#[derive(Debug, Default)]
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// An empty buffer with room for `length` bytes: the smallest pooled one that has the room, else the
    /// largest grown to it (growing keeps its mapped pages), else a new one.
    fn take(&self, length: usize) -> Vec<u8> {
        if length >= POOLED_MIN_BYTES {
            let mut free = self
                .free
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let fitting = (0..free.len())
                .filter(|&index| free[index].capacity() >= length)
                .min_by_key(|&index| free[index].capacity());
            let chosen =
                fitting.or_else(|| (0..free.len()).max_by_key(|&index| free[index].capacity()));
            if let Some(index) = chosen {
                let mut buffer = free.swap_remove(index);
                drop(free);
                buffer.clear();
                buffer.reserve_exact(length);
                return buffer;
            }
        }
        Vec::with_capacity(length)
    }

    /// Keeps `buffer` for a later read, dropping the smallest buffers beyond [`POOL_MAX_BYTES`].
    fn give_back(&self, buffer: Vec<u8>) {
        if buffer.capacity() < POOLED_MIN_BYTES {
            return;
        }
        let mut free = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        free.push(buffer);
        free.sort_unstable_by_key(|buffer| std::cmp::Reverse(buffer.capacity()));
        let mut kept = 0usize;
        free.retain(|buffer| {
            kept += buffer.capacity();
            kept <= POOL_MAX_BYTES
        });
    }

    /// The bytes of a filled buffer, which comes back to the pool once the last of them is dropped.
    fn bytes(self: &Arc<Self>, buffer: Vec<u8>) -> Bytes {
        if buffer.capacity() < POOLED_MIN_BYTES {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(Pooled {
            buffer,
            pool: Arc::clone(self),
        })
    }
}

/// A filled buffer lent out as [`Bytes`].
struct Pooled {
    buffer: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

impl LocalReader {
    /// Starts a reader: with [`LocalIo::Uring`] or [`LocalIo::Auto`], a ring and a thread for each core this
    /// process may use.
    ///
    /// # Errors
    ///
    /// Returns the OS error when [`LocalIo::Uring`] is asked for and the kernel refuses io_uring.
    pub fn new(mode: LocalIo) -> std::io::Result<Self> {
        if matches!(mode, LocalIo::Pread | LocalIo::ObjectStore) {
            return Ok(Self::with_pread());
        }
        let count = std::thread::available_parallelism().map_or(1, usize::from);
        let mut rings = Vec::with_capacity(count);
        for _ in 0..count {
            match io_uring::IoUring::new(RING_ENTRIES) {
                Ok(ring) => rings.push(ring),
                Err(error) if mode == LocalIo::Auto => {
                    tracing::info!(%error, "io_uring is not available, reading local files with pread");
                    return Ok(Self::with_pread());
                }
                Err(error) => return Err(error),
            }
        }
        let (sender, receiver) = crossbeam_channel::unbounded();
        for (index, ring) in rings.into_iter().enumerate() {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("sluice-uring-{index}"))
                .spawn(move || ring_thread(ring, &receiver))?;
        }
        Ok(Self {
            backend: LocalBackend::Uring,
            rings: Some(Arc::new(Rings { sender })),
            buffers: Arc::default(),
            nowait_refused: Arc::default(),
        })
    }

    fn with_pread() -> Self {
        Self {
            backend: LocalBackend::Pread,
            rings: None,
            buffers: Arc::default(),
            nowait_refused: Arc::default(),
        }
    }

    /// Returns the backend in use.
    pub fn backend(&self) -> LocalBackend {
        self.backend
    }

    /// Reads `range` of `file` through the backend; the result is shorter only at the end of the file.
    ///
    /// The buffer is taken here, on the caller's thread, from the buffers of finished reads, or allocated
    /// on the thread where the decoder that holds the bytes frees them: either way the memory is handed out
    /// again for the next read instead of fresh pages being mapped.
    ///
    /// # Errors
    ///
    /// Returns the OS error of the read.
    pub async fn read(&self, file: &Arc<File>, range: Range<u64>) -> std::io::Result<Bytes> {
        let length = range_length(&range)?;
        let buffer = self.buffers.take(length);
        let filled = self.read_rest(file, range.start, buffer, length).await?;
        Ok(self.buffers.bytes(filled))
    }

    /// Reads `range` of `file` like [`LocalReader::read`], after copying what the page cache holds of it on
    /// this thread (see the module's documentation): the thread is busy for as long as that copy takes, and
    /// never waits for the device. For a caller that awaits the bytes before it can go on, as a decoder does;
    /// concurrent reads of one task are copied one after another.
    ///
    /// # Errors
    ///
    /// Returns the OS error of the read.
    pub async fn read_cached_first(
        &self,
        file: &Arc<File>,
        range: Range<u64>,
    ) -> std::io::Result<Bytes> {
        let length = range_length(&range)?;
        let mut buffer = self.buffers.take(length);
        if !self.nowait_refused.load(Ordering::Relaxed) {
            match read_cached(file, range.start, &mut buffer, length) {
                Cached::Complete => return Ok(self.buffers.bytes(buffer)),
                Cached::Partial => {}
                Cached::Refused => self.nowait_refused.store(true, Ordering::Relaxed),
            }
        }
        let filled = self.read_rest(file, range.start, buffer, length).await?;
        Ok(self.buffers.bytes(filled))
    }

    /// Reads the range of `length` bytes at `offset` through the backend, from the end of the bytes
    /// `buffer` already holds.
    async fn read_rest(
        &self,
        file: &Arc<File>,
        offset: u64,
        buffer: Vec<u8>,
        length: usize,
    ) -> std::io::Result<Vec<u8>> {
        match &self.rings {
            Some(rings) => {
                let (reply, response) = tokio::sync::oneshot::channel();
                rings
                    .sender
                    .send(ReadRequest {
                        file: Arc::clone(file),
                        offset,
                        length,
                        buffer,
                        reply,
                    })
                    .map_err(|_| std::io::Error::other("the io_uring thread has stopped"))?;
                response
                    .await
                    .map_err(|_| std::io::Error::other("the io_uring thread dropped a read"))?
            }
            None => {
                let file = Arc::clone(file);
                tokio::task::spawn_blocking(move || pread_into(&file, offset, buffer, length))
                    .await
                    .map_err(std::io::Error::other)?
            }
        }
    }
}

/// The length of `range` as a buffer length.
fn range_length(range: &Range<u64>) -> std::io::Result<usize> {
    usize::try_from(range.end.saturating_sub(range.start))
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "range too large"))
}

/// How far [`read_cached`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cached {
    /// The buffer holds the whole range, or the range up to the end of the file.
    Complete,
    /// The buffer holds the first bytes of the range (perhaps none); the page cache lacks the next ones,
    /// or the read failed and the backend reads it again to report the error.
    Partial,
    /// The file system does not take `RWF_NOWAIT`; the buffer holds no more than before.
    Refused,
}

/// Copies into the spare capacity of `buffer` what the page cache holds of the `length` bytes at `offset`,
/// from the end of the bytes `buffer` already holds, without waiting for the device.
fn read_cached(file: &File, offset: u64, buffer: &mut Vec<u8>, length: usize) -> Cached {
    buffer.reserve_exact(length.saturating_sub(buffer.len()));
    while buffer.len() < length {
        let filled = buffer.len();
        let Ok(position) = libc::off_t::try_from(offset + filled as u64) else {
            return Cached::Partial;
        };
        let spare = &mut buffer.spare_capacity_mut()[..length - filled];
        let destination = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        // SAFETY: the one iovec covers `length - filled` bytes of the spare capacity of `buffer` (reserved
        // above), which nothing else references during the call; the descriptor is open while `file` is.
        let count = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &raw const destination,
                1,
                position,
                libc::RWF_NOWAIT,
            )
        };
        match count {
            0 => return Cached::Complete,
            count if count > 0 => {
                // SAFETY: `preadv2` initialised the `count` bytes after `filled`, and count <= length - filled
                // <= capacity - filled.
                unsafe { buffer.set_len(filled + count.unsigned_abs()) };
            }
            _ => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS) => return Cached::Refused,
                _ => return Cached::Partial,
            },
        }
    }
    Cached::Complete
}

/// Reads with `pread` into the spare capacity of `buffer` until it holds `length` bytes or the file ends;
/// the bytes already in `buffer` are the first ones of the range that starts at `offset`.
fn pread_into(
    file: &File,
    offset: u64,
    mut buffer: Vec<u8>,
    length: usize,
) -> std::io::Result<Vec<u8>> {
    buffer.reserve_exact(length.saturating_sub(buffer.len()));
    while buffer.len() < length {
        let filled = buffer.len();
        let position = libc::off_t::try_from(offset + filled as u64).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset too large")
        })?;
        // SAFETY: the destination is the spare capacity of `buffer` past `filled`, which holds at least
        // `length - filled` bytes (reserved above) and which nothing else references during the call.
        let count = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buffer.as_mut_ptr().add(filled).cast(),
                length - filled,
                position,
            )
        };
        match count {
            0 => break,
            count if count > 0 => {
                // SAFETY: `pread` initialised the `count` bytes after `filled`, and count <= length - filled
                // <= capacity - filled.
                unsafe { buffer.set_len(filled + count.unsigned_abs()) };
            }
            _ => {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
    Ok(buffer)
}

/// Bytes per `IORING_OP_READ`: longer reads are cut into pieces, so that the part of a read that must wait
/// for the device is served by several of the kernel's workers at once.
const PIECE_BYTES: usize = 1 << 20;
/// Pieces tried from the page cache per `io_uring_enter`. The kernel copies them before the call returns,
/// so a small batch lets the thread answer the reads they finish before it copies the next ones, instead of
/// answering a whole queue of reads at once after a long copy.
const CACHE_PIECES_PER_ENTER: usize = 1;
/// A ring takes more reads from the shared queue only while fewer pieces than this wait in it.
const QUEUED_PIECES_LOW: usize = 2;
/// Bits of a completion's user data that number the piece; the rest number the read.
const PIECE_BITS: u32 = 24;

/// Where one piece of a read stands.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Bytes of the piece read so far.
    done: usize,
    /// Whether the next attempt goes to the kernel's workers (after the page cache could not serve it).
    in_workers: bool,
}

/// A read in the ring: the request, the buffer the kernel writes into, and where each piece stands.
struct PendingRead {
    request: ReadRequest,
    /// Bytes of the range the buffer held before the ring: the pieces cover the rest.
    base: usize,
    pieces: Vec<Piece>,
    /// Pieces not complete yet.
    outstanding: usize,
    /// The first error a piece returned, as a negated errno.
    error: Option<i32>,
}

impl PendingRead {
    fn wanted(&self, index: usize) -> usize {
        PIECE_BYTES.min(self.request.length - self.base - index * PIECE_BYTES)
    }

    /// Records the result of one attempt at piece `index`; returns whether the piece must be queued again.
    fn record(&mut self, index: usize, result: i32) -> bool {
        let wanted = self.wanted(index);
        let Some(piece) = self.pieces.get_mut(index) else {
            return false;
        };
        let retry = match result {
            result if result == -libc::EAGAIN && !piece.in_workers => true,
            result if result < 0 => {
                self.error.get_or_insert(result);
                false
            }
            0 => false,
            count => {
                piece.done += count.unsigned_abs() as usize;
                piece.done < wanted && !piece.in_workers
            }
        };
        if retry {
            // What the page cache did not hold is read by the kernel's workers, which may block on the device.
            piece.in_workers = true;
        } else {
            self.outstanding -= 1;
        }
        retry
    }

    /// Builds the reply once every piece is complete.
    fn finish(self) {
        let Self {
            request,
            base,
            pieces,
            error,
            ..
        } = self;
        let ReadRequest {
            file,
            offset,
            length,
            mut buffer,
            reply,
        } = request;
        if let Some(errno) = error {
            let _ = reply.send(Err(std::io::Error::from_raw_os_error(-errno)));
            return;
        }
        // The bytes up to the first short piece are in place; a short piece means the end of the file, or
        // a read the kernel cut short, which pread finishes from there.
        let mut filled = base;
        for (index, piece) in pieces.iter().enumerate() {
            let wanted = PIECE_BYTES.min(length - base - index * PIECE_BYTES);
            filled = base + index * PIECE_BYTES + piece.done.min(wanted);
            if piece.done < wanted {
                break;
            }
        }
        debug_assert!(filled <= buffer.capacity());
        // SAFETY: the first `base` bytes were initialised before the ring took the read; every piece before
        // the first short one was read whole and the short one up to its count, so the kernel initialised
        // the bytes after them up to `filled`, and the buffer has room for `length`.
        unsafe { buffer.set_len(filled) };
        let result = if filled < length {
            pread_into(&file, offset, buffer, length)
        } else {
            Ok(buffer)
        };
        let _ = reply.send(result);
    }
}

/// Serves a request with `pread` on this thread: after io_uring failed, or for a read too long to number.
fn serve_with_pread(request: ReadRequest) {
    let ReadRequest {
        file,
        offset,
        length,
        buffer,
        reply,
    } = request;
    let _ = reply.send(pread_into(&file, offset, buffer, length));
}

fn ring_thread(mut ring: io_uring::IoUring, receiver: &crossbeam_channel::Receiver<ReadRequest>) {
    let capacity = RING_ENTRIES as usize;
    let mut reads: HashMap<u64, PendingRead> = HashMap::new();
    // Pieces to hand to the kernel, as their user data, in request order.
    let mut queued: VecDeque<u64> = VecDeque::new();
    // Attempts handed to the kernel whose completion has not been reaped: at most `capacity`, so the
    // completion queue (twice the submission queue) never overflows.
    let mut submitted = 0usize;
    let mut next_read = 0u64;
    let mut open = true;
    while open || !reads.is_empty() {
        let mut incoming = Vec::new();
        if reads.is_empty() {
            match receiver.recv() {
                Ok(request) => incoming.push(request),
                Err(_) => open = false,
            }
        }
        // More reads only while this ring has little queued: the other rings take the rest.
        while queued.len() + incoming.len() < QUEUED_PIECES_LOW {
            match receiver.try_recv() {
                Ok(request) => incoming.push(request),
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        for request in incoming {
            let base = request.buffer.len();
            let piece_count = request.length.saturating_sub(base).div_ceil(PIECE_BYTES);
            if piece_count == 0 || piece_count >= 1 << PIECE_BITS {
                serve_with_pread(request);
                continue;
            }
            let read = next_read;
            next_read += 1;
            queued.extend((0..piece_count as u64).map(|piece| (read << PIECE_BITS) | piece));
            let piece = Piece {
                done: 0,
                in_workers: false,
            };
            reads.insert(
                read,
                PendingRead {
                    request,
                    base,
                    pieces: vec![piece; piece_count],
                    outstanding: piece_count,
                    error: None,
                },
            );
        }
        {
            let mut submission = ring.submission();
            let mut from_cache = 0;
            while submitted < capacity
                && let Some(&user_data) = queued.front()
            {
                let index = (user_data & ((1 << PIECE_BITS) - 1)) as usize;
                let Some(pending) = reads.get_mut(&(user_data >> PIECE_BITS)) else {
                    queued.pop_front();
                    continue;
                };
                let wanted = pending.wanted(index);
                let piece = pending.pieces[index];
                if !piece.in_workers && from_cache == CACHE_PIECES_PER_ENTER {
                    break;
                }
                let start = pending.base + index * PIECE_BYTES + piece.done;
                debug_assert!(piece.done < wanted && start < pending.request.buffer.capacity());
                // `start` is inside the buffer, and `wanted - done` bytes from it stay inside.
                let entry = io_uring::opcode::Read::new(
                    io_uring::types::Fd(pending.request.file.as_raw_fd()),
                    pending.request.buffer.as_mut_ptr().wrapping_add(start),
                    u32::try_from(wanted - piece.done).unwrap_or(u32::MAX),
                )
                .offset(pending.request.offset + start as u64);
                // First from the page cache on this thread, failing instead of waiting; then by the workers.
                let entry = if piece.in_workers {
                    entry.build().flags(io_uring::squeue::Flags::ASYNC)
                } else {
                    entry.rw_flags(libc::RWF_NOWAIT).build()
                };
                let entry = entry.user_data(user_data);
                // SAFETY: the kernel writes at most `wanted - done` bytes from `start`, inside the spare
                // capacity of the buffer held in `reads` (whose heap block does not move when the map does)
                // until this attempt's completion is reaped, and the file it reads stays open in the same
                // entry.
                if unsafe { submission.push(&entry) }.is_err() {
                    break;
                }
                queued.pop_front();
                submitted += 1;
                from_cache += usize::from(!piece.in_workers);
            }
        }
        if submitted == 0 {
            continue;
        }
        if let Err(error) = ring.submit_and_wait(1) {
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(%error, "io_uring failed, continuing with pread");
            // Tearing the ring down cancels and waits for its reads, so the buffers can be reused after it.
            drop(ring);
            for (_, pending) in reads.drain() {
                serve_with_pread(pending.request);
            }
            while let Ok(request) = receiver.recv() {
                serve_with_pread(request);
            }
            return;
        }
        let completions: Vec<(u64, i32)> = ring
            .completion()
            .map(|entry| (entry.user_data(), entry.result()))
            .collect();
        for (user_data, result) in completions {
            submitted = submitted.saturating_sub(1);
            let read = user_data >> PIECE_BITS;
            let index = (user_data & ((1 << PIECE_BITS) - 1)) as usize;
            let Some(pending) = reads.get_mut(&read) else {
                continue;
            };
            if pending.record(index, result) {
                queued.push_back(user_data);
            } else if pending.outstanding == 0
                && let Some(done) = reads.remove(&read)
            {
                done.finish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pending(
        length: usize,
    ) -> (
        PendingRead,
        tokio::sync::oneshot::Receiver<std::io::Result<Vec<u8>>>,
    ) {
        let file = tempfile::tempfile().expect("tempfile");
        let (reply, response) = tokio::sync::oneshot::channel();
        let piece_count = length.div_ceil(PIECE_BYTES);
        let sut = PendingRead {
            request: ReadRequest {
                file: Arc::new(file),
                offset: 0,
                length,
                buffer: Vec::with_capacity(length),
                reply,
            },
            base: 0,
            pieces: vec![
                Piece {
                    done: 0,
                    in_workers: false,
                };
                piece_count
            ],
            outstanding: piece_count,
            error: None,
        };
        (sut, response)
    }

    #[test]
    fn a_piece_the_page_cache_cannot_serve_goes_to_the_workers_once() {
        let (mut sut, _response) = pending(PIECE_BYTES + 10);
        assert!(sut.record(0, -libc::EAGAIN), "EAGAIN from the cache: retry");
        assert!(sut.pieces[0].in_workers);
        assert!(
            !sut.record(0, -libc::EAGAIN),
            "EAGAIN from the workers: an error"
        );
        assert_eq!(sut.error, Some(-libc::EAGAIN));
        assert!(
            sut.record(1, 4),
            "a short read from the cache: the rest goes to the workers"
        );
        assert_eq!(sut.pieces[1].done, 4);
        assert!(
            !sut.record(1, 3),
            "a short read from the workers ends the piece"
        );
        assert_eq!(sut.outstanding, 0);
    }

    #[tokio::test]
    async fn a_read_ends_at_the_first_short_piece_and_reports_the_first_error() {
        let (mut sut, response) = pending(2 * PIECE_BYTES + 5);
        let whole = i32::try_from(PIECE_BYTES).expect("fits");
        assert!(!sut.record(0, whole));
        assert!(!sut.record(2, 0));
        assert!(sut.record(1, 100));
        assert!(!sut.record(1, 0), "the end of the file");
        assert_eq!(sut.outstanding, 0);
        sut.finish();
        // The file is empty, so pread finds nothing past the 1 MiB + 100 bytes the pieces reported.
        let bytes = response.await.expect("reply").expect("read");
        assert_eq!(bytes.len(), PIECE_BYTES + 100);
        let (mut failing, response) = pending(10);
        assert!(!failing.record(0, -libc::EIO));
        failing.finish();
        let error = response.await.expect("reply").expect_err("error");
        assert_eq!(error.raw_os_error(), Some(libc::EIO));
    }

    /// A file of `length` bytes on disk (synced, so the page cache can drop it), open, and its bytes:
    /// position-dependent, so that a byte in the wrong place shows.
    fn test_file(length: usize) -> (tempfile::TempDir, Arc<File>, Vec<u8>) {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("bytes.bin");
        let content: Vec<u8> = (0..length)
            .map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut writer = std::fs::File::create(&path).expect("create");
        writer.write_all(&content).expect("write");
        writer.sync_all().expect("sync");
        let file = Arc::new(File::open(&path).expect("open"));
        (directory, file, content)
    }

    /// A reader through io_uring; these tests exist to check it, so a machine that refuses io_uring
    /// fails them, naming why.
    fn uring_reader() -> LocalReader {
        LocalReader::new(LocalIo::Uring).unwrap_or_else(|error| {
            panic!(
                "io_uring is refused on this machine ({error}): these tests need a kernel and seccomp profile that allow it"
            )
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(miri, ignore = "io_uring, which Miri cannot run")]
    async fn long_reads_come_back_whole_from_a_cold_and_a_warm_page_cache() {
        uring_reader();
        for cached_first in [false, true] {
            long_reads_come_back_whole(cached_first).await;
        }
    }

    async fn long_reads_come_back_whole(cached_first: bool) {
        let uring = LocalReader::new(LocalIo::Uring).expect("io_uring");
        let size = 3 * PIECE_BYTES + PIECE_BYTES / 2;
        let (_directory, file, content) = test_file(size);
        let size = size as u64;
        let piece = PIECE_BYTES as u64;
        let ranges = [
            0..size,
            piece - 5..2 * piece + 7,
            size - 10..size + 2 * piece,
            3 * piece..size,
        ];
        for cold in [true, false] {
            if cold {
                // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
                let status = unsafe {
                    libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                };
                assert_eq!(status, 0, "dropping the file from the page cache");
            }
            let reads = futures::future::try_join_all(ranges.iter().map(|range| async {
                if cached_first {
                    uring.read_cached_first(&file, range.clone()).await
                } else {
                    uring.read(&file, range.clone()).await
                }
            }))
            .await
            .expect("reads");
            for (range, bytes) in ranges.iter().zip(reads) {
                let start = usize::try_from(range.start).expect("fits");
                let end = usize::try_from(range.end.min(size)).expect("fits");
                assert_eq!(bytes.len(), end - start, "{range:?} cold={cold}");
                assert!(
                    bytes[..] == content[start..end],
                    "{range:?} cold={cold}: bytes differ"
                );
            }
        }
    }

    #[test]
    fn a_returned_buffer_serves_the_next_read_that_fits() {
        let pool = Arc::new(BufferPool::default());
        let buffer = pool.take(3 << 20);
        let address = buffer.as_ptr();
        let bytes = pool.bytes(buffer);
        let copy = bytes.clone();
        drop(bytes);
        assert!(
            pool.free.lock().expect("lock").is_empty(),
            "a clone still holds it"
        );
        drop(copy);
        let again = pool.take(2 << 20);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty() && again.capacity() >= 2 << 20);
        let grown = {
            pool.give_back(again);
            pool.take(5 << 20)
        };
        assert!(
            grown.capacity() >= 5 << 20,
            "the pooled buffer grows to the read"
        );
        assert!(pool.free.lock().expect("lock").is_empty());
    }

    #[test]
    fn the_pool_keeps_the_largest_buffers_within_its_limit_and_no_small_ones() {
        let pool = BufferPool::default();
        pool.give_back(Vec::with_capacity(POOLED_MIN_BYTES - 1));
        assert!(pool.free.lock().expect("lock").is_empty());
        for megabytes in [100, 20, 150, 10] {
            pool.give_back(Vec::with_capacity(megabytes << 20));
        }
        let kept: Vec<usize> = pool
            .free
            .lock()
            .expect("lock")
            .iter()
            .map(|buffer| buffer.capacity() >> 20)
            .collect();
        assert_eq!(kept, vec![150, 100]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(
        miri,
        ignore = "posix_fadvise, preadv2 and io_uring, which Miri cannot run"
    )]
    async fn cached_pages_are_copied_first_and_the_backend_reads_the_rest() {
        let size = 4 * PIECE_BYTES + 12_345;
        let (_directory, file, content) = test_file(size);
        let cached = 2 * PIECE_BYTES;
        let dropped = i64::try_from(cached).expect("fits");
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
        let status =
            unsafe { libc::posix_fadvise(file.as_raw_fd(), dropped, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(status, 0, "dropping the second half from the page cache");
        let mut buffer = Vec::new();
        let outcome = read_cached(&file, 0, &mut buffer, size + 100);
        assert_ne!(
            outcome,
            Cached::Refused,
            "preadv2(RWF_NOWAIT) is refused on this machine: this test needs a kernel that has it (4.14 or later)"
        );
        assert!(
            buffer.len() >= cached,
            "{outcome:?}: {} bytes copied of the {cached} cached",
            buffer.len()
        );
        assert!(
            buffer[..] == content[..buffer.len()],
            "the cached bytes differ"
        );
        let mut readers = vec![LocalReader::new(LocalIo::Pread).expect("pread")];
        readers.extend(LocalReader::new(LocalIo::Uring).ok());
        for reader in readers {
            // SAFETY: as above.
            let status = unsafe {
                libc::posix_fadvise(file.as_raw_fd(), dropped, 0, libc::POSIX_FADV_DONTNEED)
            };
            assert_eq!(status, 0);
            let bytes = reader
                .read_cached_first(&file, 0..size as u64 + 100)
                .await
                .expect("read");
            assert!(bytes[..] == content[..], "{:?}", reader.backend());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(miri, ignore = "io_uring, which Miri cannot run")]
    async fn the_backends_read_on_from_the_bytes_a_buffer_already_holds() {
        let size = 3 * PIECE_BYTES + 777;
        let (_directory, file, content) = test_file(size);
        let mut readers = vec![LocalReader::new(LocalIo::Pread).expect("pread")];
        readers.extend(LocalReader::new(LocalIo::Uring).ok());
        for reader in readers {
            for (start, held, end) in [
                (0, PIECE_BYTES + PIECE_BYTES / 2 + 3, size),
                (5, 10, 2 * PIECE_BYTES),
                (PIECE_BYTES, PIECE_BYTES, size + 4096),
                (100, 0, 200),
            ] {
                let length = end - start;
                let mut buffer = Vec::with_capacity(length);
                buffer.extend_from_slice(&content[start..start + held]);
                let bytes = reader
                    .read_rest(&file, start as u64, buffer, length)
                    .await
                    .expect("read");
                let expected = &content[start..end.min(size)];
                assert_eq!(
                    bytes.len(),
                    expected.len(),
                    "{:?} {start}+{held}..{end}",
                    reader.backend()
                );
                assert!(
                    bytes[..] == expected[..],
                    "{:?} {start}+{held}..{end}: bytes differ",
                    reader.backend()
                );
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(miri, ignore = "io_uring, which Miri cannot run")]
    async fn reads_in_reused_buffers_hold_their_own_bytes() {
        let (_directory, file, content) = test_file(5 << 20);
        let mut readers = vec![LocalReader::new(LocalIo::Pread).expect("pread")];
        readers.extend(LocalReader::new(LocalIo::Uring).ok());
        for reader in readers {
            // Each read reuses the buffer of the one before, which held other bytes; the last one is cut
            // short by the end of the file.
            for range in [0..(3u64 << 20), (1 << 20)..(3 << 20), (4 << 20)..(7 << 20)] {
                let bytes = reader.read(&file, range.clone()).await.expect("read");
                let end = (range.end as usize).min(content.len());
                assert_eq!(&bytes[..], &content[range.start as usize..end], "{range:?}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(miri, ignore = "io_uring, which Miri cannot run")]
    async fn many_reads_in_flight_over_the_shared_queue_each_get_their_bytes() {
        let (_directory, file, content) = test_file(6 << 20);
        let reader = uring_reader();
        let ranges: Vec<Range<u64>> = (0..48u64)
            .map(|index| {
                let start = (index * 131_071) % (4 << 20);
                start..start + (index % 5 + 1) * 300_000
            })
            .collect();
        let reads = ranges.iter().map(|range| reader.read(&file, range.clone()));
        let results = futures::future::join_all(reads).await;
        for (range, bytes) in ranges.iter().zip(results) {
            let bytes = bytes.expect("read");
            assert_eq!(
                &bytes[..],
                &content[range.start as usize..range.end as usize],
                "{range:?}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(miri, ignore = "io_uring, which Miri cannot run")]
    async fn uring_and_pread_read_the_same_bytes() {
        let (_directory, file, content) = test_file(300_000);
        let pread = LocalReader::new(LocalIo::Pread).expect("pread");
        let uring = uring_reader();
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
