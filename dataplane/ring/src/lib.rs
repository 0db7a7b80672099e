//! A lock-free single-producer, single-consumer ring of variable-length records in shared memory.
//!
//! The node daemon writes Arrow IPC messages into one ring per trainer rank, a file under
//! `/dev/shm/sluice/<job>/`; the trainer maps the same file and reads the messages in place.
//!
//! ```no_run
//! use sluice_ring::{RecordKind, RecordMeta, Ring, RingOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ring = RingOptions::new("/dev/shm/sluice/job/0.ring").capacity(64 << 20).create()?;
//! let mut producer = ring.producer()?;
//! let mut slot = producer.reserve(5)?;
//! slot.payload_mut().copy_from_slice(b"hello");
//! slot.commit(RecordMeta::of_kind(RecordKind::Batch));
//! producer.close();
//!
//! let mut consumer = Ring::open("/dev/shm/sluice/job/0.ring")?.consumer()?;
//! while let Some(record) = consumer.next()? {
//!     assert_eq!(record.payload(), b"hello");
//! } // dropping a record releases its bytes to the producer
//! # Ok(())
//! # }
//! ```
//!
//! # Implementation
//!
//! The file is a 4096-byte header page followed by a data region of `capacity` bytes (see [`layout`]).
//! Three cursors count bytes from the creation of the ring and never wrap: the **write cursor** is the
//! end of the last published record, the **read cursor** the end of the last released one, and the
//! **retain cursor** the end of the last one the producer folded, `retain <= read <= write`. The bytes
//! `[read, write)` hold records that the consumer may read; `[retain, read)` records it released,
//! whose headers the producer still reads when it folds them (see [`Producer`]); `[write, retain +
//! capacity)` is free for the producer. A byte position `p` lies at offset `p % capacity` of the data region. Records are 64-byte
//! aligned and never wrap: when a record does not fit before the end of the region, the producer first
//! commits a padding record that fills it.
//!
//! **Publishing.** The producer writes the record header and payload with plain stores, and commits the
//! record by advancing its private write position. A payload of 64 KiB or more that [`Slot::write`]
//! copies while the consumer is 16 MiB or more behind goes with non-temporal stores instead (x86_64),
//! which skip the read of each line a plain store first makes; they are weakly ordered, so that
//! record's commit issues `sfence` before its header is written and the write cursor published. It publishes the write cursor with a `swap`
//! (`AcqRel`) in batches: once the unpublished bytes reach a threshold (an eighth of the ring, at most
//! 64 KiB), at the first commit after the consumer has set WAITING on the write cursor (a plain load of
//! that word per commit, which stays in the producer's cache while nobody writes it), before the producer
//! waits for space or reports a full ring, and on `flush`, `close` (before it sets the closed flag, so a
//! consumer that sees the flag finds every record below the cursor) and drop. The consumer loads the write
//! cursor with `Acquire` before it reads anything below it. Releasing is the mirror image on the read
//! cursor: the consumer publishes it once an eighth of the ring (at most 256 KiB) is pending, at once
//! when the producer has set WAITING on the read cursor, and always before it waits for data itself.
//! Since each side publishes everything before it waits, neither can wait on the other's unpublished
//! progress. Each side keeps a private copy of the other's cursor and reloads it only when that copy says
//! the ring is full (or empty), so in steady state a cursor's cache line moves between cores once per
//! batch of records, not per record, and the payload stores of a batch drain without a fence between
//! records.
//!
//! A commit is only a promise to the producer's own process until it is published: the consumer cannot
//! see it, and a producer that dies first loses it exactly like a reserved slot. The one case the
//! triggers above do not cover is a producer that commits and then stops without waiting on the ring;
//! such a producer calls `flush` (see [`Producer`] for the exact rule).
//!
//! **Sleeping.** Bit 63 of each cursor word is a WAITING flag. A side that finds nothing to do spins
//! briefly, then reads the futex count, sets the flag with `fetch_or` on the *other* side's cursor word, and
//! re-checks the cursor value that `fetch_or` returned. The other side's publishing `swap` returns the old
//! word, so it sees the flag exactly when the `fetch_or` came first, and then bumps the futex. Both are
//! read-modify-writes of one word, so they are totally ordered: either the sleeper sees the new cursor, or
//! the publisher sees the flag. No wake-up is lost, and the hot path costs no fence beyond the `swap` of
//! each batch. The consumer adapts its spin, as an adaptive mutex does: it halves it (down to about a
//! microsecond) after a wait that had to sleep, since its producer is slower than it and spinning only
//! takes a core the producer may need, and doubles it (up to about 50 µs) after one that caught data.
//!
//! **Crashes.** The roles are claimed by compare-and-swap of a packed `(start time, pid)` word (see
//! [`ProcessId`]); a role whose holder is dead may be taken over. A new producer resumes at the write
//! cursor: what the dead one had reserved, or committed without publishing, is gone, and what it
//! published stays for the consumer. It recovers the next sequence number from the records from the
//! retain cursor on, or, when the dead one folded them all, from the sequence number the consumer stores
//! before each release; and it folds the records the dead one had not, so that every released record's
//! meta reaches a fold hook at least once across producers. A consumer that waits
//! on an empty ring with no live producer gives up after its peer timeout, and so does a producer waiting
//! on a full ring with no live consumer.

// The file-backed parts are compiled out under loom, which models the in-memory ring only.
#![cfg_attr(loom, allow(dead_code))]

#[cfg(not(loom))]
pub mod announce;
#[cfg(not(loom))]
pub mod gc;
pub mod layout;
pub mod lease;
#[cfg(not(loom))]
pub mod ledger;

mod consumer;
mod error;
mod process;
mod producer;
mod role;
mod stream;
mod sync;

#[cfg(not(loom))]
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

pub use consumer::{Consumer, Record};
pub use error::{
    AttachError, FoldError, RecvError, ReserveError, RingCreateError, RingOpenError, Role,
    TryRecvError, TryReserveError,
};
pub use layout::{RecordKind, RecordMeta};
pub use lease::Lease;
pub use process::{PeerState, ProcessId};
pub use producer::{Producer, Slot};
pub use sluice_process::files;

use layout::{HEADER_LEN, LAYOUT_VERSION, MAGIC, RingHeader, WAITING};
use sync::Ordering;

/// The default size of a ring's data region.
pub const DEFAULT_CAPACITY: u64 = 256 << 20;
/// How long a side waits, by default, for a dead or absent peer to be replaced before it gives up.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// The file name extension of ring files.
pub const RING_EXTENSION: &str = "ring";
/// The file name extension of a ring's schema file: the Arrow IPC schema message of its stream,
/// written by its producer beside the ring, so that a trainer that attaches after the stream's
/// schema record was read (a trainer started again) can decode the batches that follow.
pub const SCHEMA_EXTENSION: &str = "schema";

/// Where rings go unless told otherwise: `/dev/shm/sluice-<uid>`, a directory of this user's own,
/// so that users of one host never share (or contend for) one.
pub fn default_ring_dir() -> PathBuf {
    PathBuf::from(format!("/dev/shm/sluice-{}", files::user()))
}

/// The schema file beside the ring at `ring_path`.
pub fn schema_path_beside(ring_path: &Path) -> PathBuf {
    ring_path.with_extension(SCHEMA_EXTENSION)
}

/// Settings for creating a ring file.
#[derive(Debug, Clone)]
pub struct RingOptions {
    path: PathBuf,
    capacity: u64,
}

impl RingOptions {
    /// Starts the settings of a ring at `path`, with [`DEFAULT_CAPACITY`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RingOptions {
            path: path.into(),
            capacity: DEFAULT_CAPACITY,
        }
    }

    /// Sets the size of the data region in bytes; a positive multiple of 4096.
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = capacity;
        self
    }

    /// Creates the ring file, its directory if needed, and maps it.
    ///
    /// Checks that the filesystem has room for the whole ring and reserves it with `posix_fallocate`,
    /// so that a full `/dev/shm` is an error here and never a `SIGBUS` later. The file is initialised
    /// under a temporary name and linked into place, so no process ever opens a half-written header.
    #[cfg(not(loom))]
    pub fn create(self) -> Result<Ring, RingCreateError> {
        validate_capacity(self.capacity)?;
        let path = self.path;
        let io_error = |operation: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source: std::io::Error| RingCreateError::Io {
                path,
                operation,
                source,
            }
        };
        let directory = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        use files::Sharing;
        // A directory the daemon prepared gives the files its sharing; one made here is private.
        let sharing = if directory.exists() {
            Sharing::of_dir(directory).map_err(RingCreateError::Files)?
        } else {
            files::ensure_dir(directory, Sharing::Private).map_err(RingCreateError::Files)?;
            Sharing::Private
        };
        if path.exists() {
            return Err(RingCreateError::Exists { path });
        }
        let needed = self.capacity + HEADER_LEN as u64;
        let free = free_bytes(directory).map_err(io_error("statvfs", directory))?;
        if free < needed {
            return Err(RingCreateError::NoSpace { path, free, needed });
        }
        let file_name = path
            .file_name()
            .map_or_else(|| "ring".into(), |name| name.to_string_lossy().into_owned());
        let temporary = directory.join(format!(".{file_name}.{}.tmp", std::process::id()));
        let file = files::create_temporary(&temporary, sharing).map_err(RingCreateError::Files)?;
        let result = initialise(&file, &temporary, &path, self.capacity, free);
        let linked = result.and_then(|mapping| {
            fs::hard_link(&temporary, &path).map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => RingCreateError::Exists { path: path.clone() },
                _ => RingCreateError::Io {
                    path: path.clone(),
                    operation: "link into place",
                    source,
                },
            })?;
            Ok(mapping)
        });
        // The temporary name is removed whatever happened; the ring lives on under `path`.
        let _ = fs::remove_file(&temporary);
        let mapping = linked?;
        let inode =
            std::os::unix::fs::MetadataExt::ino(&file.metadata().map_err(io_error("stat", &path))?);
        Ok(Ring::from_mapping(mapping, path, inode))
    }
}

#[cfg(not(loom))]
fn initialise(
    file: &File,
    temporary: &Path,
    path: &Path,
    capacity: u64,
    free: u64,
) -> Result<memmap2::MmapRaw, RingCreateError> {
    let needed = capacity + HEADER_LEN as u64;
    reserve(file, needed).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOSPC) => RingCreateError::NoSpace {
            path: path.to_path_buf(),
            free,
            needed,
        },
        _ => RingCreateError::Io {
            path: temporary.to_path_buf(),
            operation: "posix_fallocate",
            source,
        },
    })?;
    let mapping = map(file).map_err(|source| RingCreateError::Io {
        path: temporary.to_path_buf(),
        operation: "mmap",
        source,
    })?;
    let creator = process::pack(&ProcessId::current().map_err(|source| RingCreateError::Io {
        path: path.to_path_buf(),
        operation: "read own identity",
        source,
    })?);
    let header = mapping.as_mut_ptr().cast::<RingHeader>();
    // SAFETY: the mapping is `needed` >= HEADER_LEN bytes long, page aligned (so aligned for RingHeader),
    // zero-filled by posix_fallocate, and not yet visible to any other process (it has a temporary name),
    // so these plain writes race with nothing. Every field of RingHeader is valid for any bits.
    unsafe {
        (&raw mut (*header).magic).write(MAGIC);
        (&raw mut (*header).version).write(LAYOUT_VERSION);
        (&raw mut (*header).header_len).write(HEADER_LEN as u32);
        (&raw mut (*header).capacity).write(capacity);
        (&raw mut (*header).creator).write(creator);
    }
    Ok(mapping)
}

/// Maps a whole ring file shared. Its page tables are filled in by [`populate_in_background`], not
/// here: `MAP_POPULATE` of a 256 MiB ring takes about 0.1 s, which every side would wait for before
/// its first record.
#[cfg(not(loom))]
fn map(file: &File) -> std::io::Result<memmap2::MmapRaw> {
    memmap2::MmapOptions::new().map_raw(file)
}

/// Fills in the page tables of a mapped ring on a thread of its own (`MADV_POPULATE_WRITE`), so that
/// the first pass over the ring does not take a page fault every 4 KiB on the hot path, and no side
/// waits for the whole ring to be mapped before it writes or reads its first record. The thread holds
/// the ring's memory until it is done. Prefaulting neither reads nor writes the bytes, so it races
/// with nothing; a kernel without `MADV_POPULATE_WRITE` (before Linux 5.14) leaves the pages to be
/// faulted in as they are first touched, as they would be without it.
#[cfg(not(any(loom, miri)))]
fn populate_in_background(shared: &Arc<Shared>) {
    let shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("ring-populate".to_owned())
        .spawn(move || {
            if let Memory::Mapped { _mapping: mapping } = &shared._memory {
                // An error leaves the pages to their first touch: the advice is only an optimisation.
                let _ = mapping.advise(memmap2::Advice::PopulateWrite);
            }
        });
    // A thread that cannot be spawned leaves the pages to their first touch too.
    drop(spawned);
}

/// Sets `file`'s length to `length` bytes and allocates all of them in its filesystem
/// (`posix_fallocate`), so that writes through a shared mapping of the file never meet a full
/// filesystem: on a full `/dev/shm` this fails with `ENOSPC`, where a sparse file would bring a
/// `SIGBUS` at the first write to a page without memory behind it.
#[cfg(not(loom))]
fn reserve(file: &File, length: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;

    let length = libc::off_t::try_from(length).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{length} bytes do not fit in off_t"),
        )
    })?;
    // SAFETY: the descriptor belongs to `file`, which outlives the call; posix_fallocate touches no
    // memory of this process.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, length) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(not(loom))]
fn free_bytes(directory: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;

    let c_path = std::ffi::CString::new(directory.as_os_str().as_bytes())
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string and `stats` points at writable memory for one statvfs.
    let status = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `stats`.
    let stats = unsafe { stats.assume_init() };
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

fn validate_capacity(capacity: u64) -> Result<(), RingCreateError> {
    if capacity == 0 || !capacity.is_multiple_of(4096) || capacity >= WAITING >> 1 {
        return Err(RingCreateError::InvalidCapacity { capacity });
    }
    Ok(())
}

/// A handle on one ring: the shared memory, mapped. Cloning it shares the mapping.
///
/// A `Ring` hands out at most one [`Producer`] and one [`Consumer`] at a time across all processes.
#[derive(Debug, Clone)]
pub struct Ring {
    shared: Arc<Shared>,
}

/// The memory of a ring and where its parts lie.
#[derive(Debug)]
pub(crate) struct Shared {
    header: NonNull<RingHeader>,
    data: NonNull<u8>,
    capacity: u64,
    path: PathBuf,
    /// The inode of the ring's file; 0 for a ring in the heap.
    inode: u64,
    _memory: Memory,
}

#[derive(Debug)]
enum Memory {
    #[cfg(not(loom))]
    Mapped { _mapping: memmap2::MmapRaw },
    /// Two allocations made by `Box::into_raw`, freed on drop. Raw pointers rather than boxes, so that
    /// moving this value does not assert unique ownership over memory the ring's pointers share.
    Heap {
        header: NonNull<RingHeader>,
        data: NonNull<[Line]>,
    },
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Heap { header, data } = *self {
            // SAFETY: both pointers come from `Box::into_raw` in `Ring::in_memory`, are freed only here,
            // and the `Shared` that holds this value, the last user of the pointers, is being dropped.
            unsafe {
                drop(Box::from_raw(header.as_ptr()));
                drop(Box::from_raw(data.as_ptr()));
            }
        }
    }
}

#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct Line([u8; 64]);

// SAFETY: `Shared` only hands out the memory it owns (a mapping or two boxes, kept alive by `_memory`)
// through atomics in the header and through the producer/consumer protocol, which gives each byte of the
// data region to one side at a time. The pointers are never freed before `Shared` is dropped.
unsafe impl Send for Shared {}
// SAFETY: as above: shared references only read immutable header fields or go through atomics.
unsafe impl Sync for Shared {}

impl Shared {
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: `header` points at a RingHeader inside `_memory`, which lives as long as `self`; every
        // field is valid for any bit pattern and the mutable ones are atomics.
        unsafe { self.header.as_ref() }
    }

    pub(crate) fn data(&self) -> *mut u8 {
        self.data.as_ptr()
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Ring {
    /// Opens and maps an existing ring file, checking its header.
    #[cfg(not(loom))]
    pub fn open(path: impl AsRef<Path>) -> Result<Ring, RingOpenError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |operation: &'static str| {
            let path = path.clone();
            move |source| RingOpenError::Io {
                path,
                operation,
                source,
            }
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error("open"))?;
        let metadata = file.metadata().map_err(io_error("stat"))?;
        let len = metadata.len();
        if len < HEADER_LEN as u64 {
            return Err(RingOpenError::Truncated { path, len });
        }
        let mapping = map(&file).map_err(io_error("mmap"))?;
        // SAFETY: the mapping is at least HEADER_LEN bytes and page aligned; every RingHeader field is
        // valid for any bits, and the mapping outlives this reference.
        let header = unsafe { &*mapping.as_ptr().cast::<RingHeader>() };
        header
            .validate(mapping.len() as u64)
            .map_err(|fault| RingOpenError::Invalid {
                path: path.clone(),
                reason: fault.to_string(),
            })?;
        let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
        Ok(Ring::from_mapping(mapping, path, inode))
    }

    #[cfg(not(loom))]
    fn from_mapping(mapping: memmap2::MmapRaw, path: PathBuf, inode: u64) -> Ring {
        let base = mapping.as_mut_ptr();
        // SAFETY: the mapping is HEADER_LEN + capacity bytes long (checked by the caller), so the data
        // region starts inside it.
        let data = unsafe { base.add(HEADER_LEN) };
        // SAFETY: the header lies at the start of the mapping, as checked by the caller.
        let capacity = unsafe { (*base.cast::<RingHeader>()).capacity };
        let shared = Shared {
            header: NonNull::new(base.cast()).expect("mmap never returns null"),
            data: NonNull::new(data).expect("mmap never returns null"),
            capacity,
            path,
            inode,
            _memory: Memory::Mapped { _mapping: mapping },
        };
        let shared = Arc::new(shared);
        #[cfg(not(miri))]
        populate_in_background(&shared);
        Ring { shared }
    }

    /// Creates a ring in this process's heap: the same protocol, for threads of one process, for tests and
    /// for tools (loom and Miri) that cannot map files.
    pub fn in_memory(capacity: u64) -> Result<Ring, RingCreateError> {
        validate_capacity(capacity)?;
        let lines = usize::try_from(capacity / 64)
            .map_err(|_| RingCreateError::InvalidCapacity { capacity })?;
        let header = Box::new(RingHeader {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            header_len: HEADER_LEN as u32,
            capacity,
            ..RingHeader::default()
        });
        let header = NonNull::from(Box::leak(header));
        let data = NonNull::from(Box::leak(vec![Line([0; 64]); lines].into_boxed_slice()));
        let shared = Shared {
            header,
            data: data.cast(),
            capacity,
            path: PathBuf::from("<in-memory>"),
            inode: 0,
            _memory: Memory::Heap { header, data },
        };
        Ok(Ring {
            shared: Arc::new(shared),
        })
    }

    /// Takes the producer role; see [`Producer`].
    pub fn producer(&self) -> Result<Producer, AttachError> {
        Producer::attach(Arc::clone(&self.shared))
    }

    /// Takes the consumer role; see [`Consumer`].
    pub fn consumer(&self) -> Result<Consumer, AttachError> {
        Consumer::attach(Arc::clone(&self.shared))
    }

    /// The path of the ring file.
    pub fn path(&self) -> &Path {
        self.shared.path()
    }

    /// The inode of the ring's file, as it was opened: a daemon that replaces a ring creates a new
    /// file, whose inode differs while this one is mapped. 0 for a ring in the heap.
    pub fn inode(&self) -> u64 {
        self.shared.inode
    }

    /// The size of the data region in bytes.
    pub fn capacity(&self) -> u64 {
        self.shared.capacity()
    }

    /// The largest payload a single record can carry in this ring.
    pub fn max_payload(&self) -> u64 {
        self.shared.capacity() - layout::RECORD_HEADER_LEN
    }

    /// Who holds the producer role now.
    pub fn producer_state(&self) -> PeerState {
        PeerState::of_word(self.shared.header().producer.load(Ordering::Acquire))
    }

    /// Who holds the consumer role now.
    pub fn consumer_state(&self) -> PeerState {
        PeerState::of_word(self.shared.header().consumer.load(Ordering::Acquire))
    }

    /// The process that created the ring.
    pub fn creator_state(&self) -> PeerState {
        PeerState::of_word(self.shared.header().creator)
    }

    /// Tells whether the producer has closed the stream.
    pub fn is_closed(&self) -> bool {
        self.shared.header().closed.load(Ordering::Acquire) != 0
    }

    /// The write and read cursors: bytes published by the producer and bytes released by the consumer
    /// since the ring was created. Both sides publish in batches, so either may be a little ahead of its
    /// cursor.
    pub fn cursors(&self) -> (u64, u64) {
        let header = self.shared.header();
        (
            header.write.load(Ordering::Acquire) & !WAITING,
            header.read.load(Ordering::Acquire) & !WAITING,
        )
    }

    /// How long the ring's consumers waited on it empty (a trainer starved for data) and its
    /// producers waited on it full (the trainer slower than the daemon), summed since its creation.
    pub fn waits(&self) -> (Duration, Duration) {
        let header = self.shared.header();
        // Relaxed: statistics; nothing is read through them.
        (
            Duration::from_nanos(header.consumer_wait_ns.load(Ordering::Relaxed)),
            Duration::from_nanos(header.producer_wait_ns.load(Ordering::Relaxed)),
        )
    }

    /// Tells whether the consumer sleeps waiting for records now: a trainer starved for data.
    pub fn consumer_waits(&self) -> bool {
        // Acquire pairs with the AcqRel `fetch_or` of WAITING in the consumer's wait for data.
        self.shared.header().write.load(Ordering::Acquire) & WAITING != 0
    }

    /// Tells whether the producer sleeps waiting for space now: a daemon held back by its trainer.
    pub fn producer_waits(&self) -> bool {
        // Acquire pairs with the AcqRel `fetch_or` of WAITING in the producer's wait for space.
        self.shared.header().read.load(Ordering::Acquire) & WAITING != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
