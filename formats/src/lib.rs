//! Sluice's formats layer: sources by URI over object stores, lake-format readers, the split planner and the
//! row filter language.
//!
//! - [`store`]: `file://` and plain paths, `s3://`, `gs://`, `az://`, with per-source storage options.
//! - [`cache`]: a block cache on local disk in front of an object store's pinned reads.
//! - [`Dataset`]: a Parquet file, directory tree or glob (hive `k=v` directories become columns), a Delta
//!   table (through `delta_kernel`), an Iceberg table (its metadata and manifests read directly), or
//!   Arrow IPC, CSV, JSON lines and TFRecord files.
//! - [`Dataset::plan`] cuts a dataset into [`Split`]s that cover every row exactly once, in a stable order. A
//!   split of a CSV, JSON lines, TFRecord or Arrow IPC file carries where its rows lie in the file
//!   ([`SplitBytes`]), found once by the planner, so that reading it fetches those bytes only. A split of a
//!   plain file carries the file's [`ObjectIdentity`] as listed (entity tag, version, a local file's
//!   modification time), and every read of the split finds that object or fails naming it.
//! - [`Dataset::read_split`] reads one split with projection and a [`filter::Expr`], pushed down to row-group
//!   statistics, bloom filters and the page index where the files have them.
//! - [`Dataset::read_split_covered`] reads it as [`SplitBatch`]es whose split-row ranges tile the split
//!   exactly, rows removed by the filter or a deletion vector included.
//! - [`generate`] writes synthetic training data (Parquet or Delta).
//!
//! A planner lists splits; a reader turns byte ranges into record batches; the caller decides prefetch and
//! concurrency.

#![forbid(unsafe_code)]

pub use sluice_io::allocator;
pub mod cache;
pub mod coverage;
pub mod dataset;
pub mod delta;
pub mod error;
pub mod fetch;
pub mod filter;
pub mod follow;
mod footer;
pub mod generate;
mod iceberg;
mod identity;
mod ipc;
mod layout;
mod local;
mod parquet;
pub mod plan;
pub mod read;
pub mod store;
pub mod text;
pub mod types;
/// Local byte-range reads through io_uring or `pread`, from the local IO engine.
pub use sluice_io::uring;

pub use cache::{BlockCache, CacheConfig, CacheFigures, CacheOpenError};
pub use coverage::SplitBatch;
pub use dataset::{BadDataUnit, Dataset, FormatKind, LeftOut, OpenOptions};
pub use error::{FormatError, Result};
pub use fetch::FetchStats;
pub use filter::Expr;
pub use plan::{DeletionVector, DeltaSplitInfo, ObjectIdentity, Split, SplitBytes};
pub use read::ReadOptions;
pub use store::StorageOptions;
pub use uring::LocalIo;
