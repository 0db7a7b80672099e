//! Sluice's local file IO engine: byte ranges of local files, read or mapped, with no knowledge of what the
//! bytes hold.
//!
//! - [`uring`]: a [`LocalReader`] reads byte ranges through io_uring, one ring and thread per core, or
//!   through `pread` on tokio's blocking pool where io_uring is refused; it copies what the page cache
//!   holds on the caller's thread first when asked to (`preadv2(RWF_NOWAIT)`), and hands out buffers of
//!   finished reads again.
//! - [`mapped`]: a [`Mapping`] of a local file, read-only and shared, whose pages a `SIGBUS` handler
//!   replaces with zeros when the file shrinks under it, flagging the mapping so that the caller fails
//!   what it decoded instead of the process dying; and the [`FileIdentity`] of a file (device and inode,
//!   size, modification and status change times), which the caller verifies after decoding, so that a
//!   file rewritten in place or replaced while it was read is an error as well; and [`map_frozen`], a
//!   zero-copy read of a file that is never written or shortened in place (a disk cache's entry).
//!
//! - [`allocator`]: the glibc allocator settings decoding and local reads are fast under, which the
//!   binaries set first thing in `main`.
//!
//! The formats layer adapts the first two to Parquet's reader. This crate holds every line of `unsafe` they
//! need (system calls, the signal handler, buffers the kernel fills); each `unsafe` block states the
//! obligation it relies on in a `// SAFETY:` comment.
//!
//! Miri runs the parts that make no system call Miri lacks: the buffer pool and the bookkeeping of reads
//! in a ring. io_uring, `preadv2`, `mmap` with its signal handler and `mincore` cannot run under Miri, and
//! their tests are ignored there.

pub mod allocator;
pub mod mapped;
pub mod uring;

pub use mapped::{FileIdentity, LazyMapping, Mapping, map_frozen};
pub use uring::{LocalBackend, LocalIo, LocalReader};
