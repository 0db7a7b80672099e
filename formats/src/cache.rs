//! A cache of remote objects' bytes on the node's local disk, for jobs that read their data more
//! than once (once an epoch), shared by the daemons of the node.
//!
//! # Implementation
//! [`BlockCache::wrap`] puts the cache in front of an object store (S3, GCS, Azure). It serves the
//! reads pinned to an object's identity alone: a `get` with `If-Match` (an entity tag) or a
//! version, of a bounded range or the whole object, with no other condition. Every read of a
//! planned file is one (see the identity module); any other request, a read of an object the plan
//! did not pin included, goes to the store untouched.
//!
//! - **Blocks.** An object is cached in aligned blocks of `block_bytes` (4 MiB by default). A read
//!   takes the blocks its range covers; the missing ones are fetched from the store one request per
//!   run of consecutive blocks, with the read's own `If-Match` and version, and written. A read of
//!   the whole object learns the object's size from its first block's entry, or fetches it whole.
//! - **Keys.** An entry is keyed by the object's URI (the store's root and the path), its entity
//!   tag, its version and the block size: an object overwritten has another tag, so a read pinned
//!   to the new object never finds the old one's blocks. A read pinned to the old tag finds them,
//!   and gets exactly the bytes its plan named, as a read of an older version of a versioned bucket
//!   does. What the store answers is cached only when its tag and version are the ones asked for,
//!   so that a store that ignored `If-Match` never fills the cache under the wrong key. The file of
//!   an entry is named by 128 bits of XXH64 over its key, `blocks/<2 hex>/<32 hex>.<block>`; the
//!   key is written in the entry and compared on every read, so that a clash of names is a miss.
//! - **Entries.** An entry is a JSON header line (key, block, length, CRC-32C of the data, and the
//!   object's size, time, tag and version) and then the block's data. It is written under `tmp/`
//!   as a new file (`O_EXCL`, mode 0600) and renamed into place, so that a reader finds a whole
//!   entry or none: a daemon killed while writing leaves a temporary file that no read ever opens,
//!   removed after ten minutes. The data's CRC catches an entry that a crash of the machine left
//!   short (its rename reached the disk before its data): such an entry is removed and read again
//!   from the store, never served. A process checks an entry file's CRC the first time it reads
//!   it, reading it whole; its later reads of the same file (by device and inode) read the header
//!   and the bytes they need alone, since a file written whole before its rename stays whole while
//!   the machine runs, and every daemon started after a crash checks each entry again. Those bytes
//!   are mapped rather than copied (for 64 KiB or more; an entry file is never written in place),
//!   and a read within one block is served as a slice of them: the decoder reads the page cache's
//!   pages as it does a local file's.
//! - **Sharing.** The daemons of a node share the directory: a rename is atomic, and two daemons
//!   that fetch the same block write the same bytes. The directory is the user's own (0700; one of
//!   another user's is refused), as the rings' is.
//! - **Eviction.** Least recently used, by the entries' modification times: a read that finds an
//!   entry sets its time to now, when it is more than ten seconds old. When the bytes this process counts pass `max_bytes`, it lists the
//!   whole directory, the other daemons' entries with its own, and removes the oldest entries until
//!   the cache holds 90 % of `max_bytes`. An entry removed while another daemon reads it stays
//!   readable through that daemon's open file.
//! - **Failures.** The cache never fails a read: an entry it cannot read is a miss, and a block it
//!   cannot write (a full disk) is logged and left out.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::ops::{Range, RangeInclusive};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, RenameOptions,
};
use serde::{Deserialize, Serialize};
use sluice_process::files::{self, FileError, Sharing};

use crate::identity::bare;

/// The block size of a cache opened with [`BlockCache::open`]: large enough that a cached object
/// is a few files, small enough that a footer's read fetches little more than it needs.
pub const DEFAULT_BLOCK_BYTES: u64 = 4 << 20;

/// What the cache keeps after an eviction, in percent of `max_bytes`: the room left spares a
/// listing of the directory on every write.
const LOW_WATER_PERCENT: u64 = 90;

/// How old a temporary file must be before it counts as left by a daemon that died writing it.
const STALE_TEMPORARY: Duration = Duration::from_secs(600);

/// How stale an entry's time of last use may be before a read sets it again: eviction needs the
/// order of use at about this grain, not a write of metadata per read.
const USE_GRANULARITY: Duration = Duration::from_secs(10);

/// The most bytes an entry's header line takes: a key of a long URI, and the object's facts.
const MAX_HEADER_BYTES: usize = 16 << 10;

/// The layout of an entry's header; an entry of another layout is a miss.
const ENTRY_FORMAT: u32 = 1;

/// Where a cache keeps its blocks, and how many bytes it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The directory, made if missing (mode 0700); one of another user's is refused.
    pub dir: PathBuf,
    /// The most bytes of entries the cache keeps; the least recently read go beyond it.
    pub max_bytes: u64,
}

/// Why a cache cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum CacheOpenError {
    /// `max_bytes` cannot hold two blocks.
    #[error(
        "cache {}: max_bytes {max_bytes} holds less than two blocks of {block_bytes} bytes; give data.cache.max_bytes or --cache-max-bytes at least {}",
        .dir.display(), 2 * .block_bytes
    )]
    TooSmall {
        /// The cache's directory.
        dir: PathBuf,
        /// The size asked for.
        max_bytes: u64,
        /// The size of a block.
        block_bytes: u64,
    },
    /// `max_bytes` is more than the file system that holds the directory.
    #[error(
        "cache {}: max_bytes {max_bytes} is more than the {filesystem_bytes} bytes of the file system that holds it; give data.cache.max_bytes or --cache-max-bytes a size its disk can hold",
        .dir.display()
    )]
    TooLarge {
        /// The cache's directory.
        dir: PathBuf,
        /// The size asked for.
        max_bytes: u64,
        /// The size of the file system.
        filesystem_bytes: u64,
    },
    /// The directory cannot be made, or is not one this user may trust.
    #[error("cache directory {0}")]
    Dir(#[source] FileError),
}

/// The cache's figures since it was opened (and the bytes it holds as last counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheFigures {
    /// Blocks read from the cache.
    pub hits: u64,
    /// Blocks fetched from the store (and written to the cache).
    pub misses: u64,
    /// Bytes that reads got from the cache.
    pub bytes_from_cache: u64,
    /// Bytes fetched from the store for the cache's blocks.
    pub bytes_from_store: u64,
    /// Entries removed to keep the cache within `max_bytes`.
    pub evictions: u64,
    /// The bytes of entries in the cache, as this process last counted them.
    pub bytes_held: u64,
}

/// The counters behind [`CacheFigures`]; relaxed throughout: statistics, ordering nothing.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_from_cache: AtomicU64,
    bytes_from_store: AtomicU64,
    evictions: AtomicU64,
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// A block cache on local disk; see the module's notes.
#[derive(Debug)]
pub struct BlockCache {
    dir: PathBuf,
    blocks: PathBuf,
    temporary: PathBuf,
    max_bytes: u64,
    block_bytes: u64,
    /// The bytes of entries on disk as this process counts them: the last listing's total, plus
    /// what it wrote since. Relaxed: a gauge that decides when to list the directory.
    held: AtomicU64,
    counters: Counters,
    /// The number of this process's next temporary file.
    next_temporary: AtomicU64,
    /// Held by the one thread of this process that evicts at a time.
    evicting: Mutex<()>,
    /// The entry files (device, inode) this process read whole and found whole: a later read of
    /// one reads only the bytes it needs.
    verified: Mutex<HashSet<(u64, u64)>>,
}

impl BlockCache {
    /// Opens (or makes) the cache of `config` with blocks of [`DEFAULT_BLOCK_BYTES`]. It lists the
    /// directory, and evicts down to `max_bytes` what an earlier run left beyond it: blocking IO.
    ///
    /// # Errors
    ///
    /// [`CacheOpenError`]: a size under two blocks or over the disk's, a directory that cannot be
    /// made or belongs to another user.
    pub fn open(config: &CacheConfig) -> Result<Arc<BlockCache>, CacheOpenError> {
        Self::with_block_bytes(config, DEFAULT_BLOCK_BYTES)
    }

    /// Opens the cache of `config` with blocks of `block_bytes` (more than zero); see
    /// [`BlockCache::open`]. Caches of different block sizes can share a directory: their entries
    /// have different keys.
    ///
    /// # Errors
    ///
    /// As [`BlockCache::open`].
    pub fn with_block_bytes(
        config: &CacheConfig,
        block_bytes: u64,
    ) -> Result<Arc<BlockCache>, CacheOpenError> {
        let block_bytes = block_bytes.max(1);
        let dir = config.dir.clone();
        if config.max_bytes < 2 * block_bytes {
            return Err(CacheOpenError::TooSmall {
                dir,
                max_bytes: config.max_bytes,
                block_bytes,
            });
        }
        files::ensure_dir(&dir, Sharing::Private).map_err(CacheOpenError::Dir)?;
        let filesystem_bytes = files::filesystem_bytes(&dir).map_err(CacheOpenError::Dir)?;
        if config.max_bytes > filesystem_bytes {
            return Err(CacheOpenError::TooLarge {
                dir,
                max_bytes: config.max_bytes,
                filesystem_bytes,
            });
        }
        let blocks = dir.join("blocks");
        let temporary = dir.join("tmp");
        for made in [&blocks, &temporary] {
            files::ensure_dir(made, Sharing::Private).map_err(CacheOpenError::Dir)?;
        }
        let cache = BlockCache {
            dir,
            blocks,
            temporary,
            max_bytes: config.max_bytes,
            block_bytes,
            held: AtomicU64::new(0),
            counters: Counters::default(),
            next_temporary: AtomicU64::new(0),
            evicting: Mutex::new(()),
            verified: Mutex::new(HashSet::new()),
        };
        cache.evict();
        Ok(Arc::new(cache))
    }

    /// The cache's directory.
    pub fn dir(&self) -> &FsPath {
        &self.dir
    }

    /// The cache's figures so far.
    pub fn figures(&self) -> CacheFigures {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheFigures {
            hits: load(&self.counters.hits),
            misses: load(&self.counters.misses),
            bytes_from_cache: load(&self.counters.bytes_from_cache),
            bytes_from_store: load(&self.counters.bytes_from_store),
            evictions: load(&self.counters.evictions),
            bytes_held: load(&self.held),
        }
    }

    /// The store `inner`, whose root URI is `root` (`s3://bucket/`), with this cache in front of
    /// its pinned reads.
    pub fn wrap(self: &Arc<Self>, root: &str, inner: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        Arc::new(CachedStore {
            cache: Arc::clone(self),
            root: root.to_owned(),
            inner,
            table_log: None,
        })
    }

    /// The store `inner` of a table (Delta or Iceberg), whose root URI is `root`, with this cache
    /// in front of its pinned reads and of every plain read of a file outside a directory named
    /// `log` (`_delta_log`, Iceberg's `metadata`): the table's log names each data file once and
    /// neither protocol writes one in place, so a data file's URI is its identity (the daemon still
    /// holds each file to the size the log gives it).
    pub fn wrap_table(
        self: &Arc<Self>,
        root: &str,
        inner: Arc<dyn ObjectStore>,
        log: &'static str,
    ) -> Arc<dyn ObjectStore> {
        Arc::new(CachedStore {
            cache: Arc::clone(self),
            root: root.to_owned(),
            inner,
            table_log: Some(log),
        })
    }

    fn entry_path(&self, key: &ObjectKey, block: u64) -> PathBuf {
        self.blocks
            .join(&key.name[..2])
            .join(format!("{}.{block}", key.name))
    }

    /// The bytes `want` (offsets in the block) of the entry of `block` of the object `key`, when
    /// the cache has a whole one; marks it used.
    ///
    /// The first read of an entry file by this process reads it whole and checks its CRC, unless
    /// this process wrote it; later reads of the same file read its header and the bytes wanted
    /// alone. An entry file is written
    /// whole before it is renamed into place, so a file this process found whole stays whole while
    /// it runs; what the CRC guards against, a file that a crash of the machine left short or
    /// zeroed, is met again by the first read of every daemon started after it.
    fn read_entry(&self, key: &ObjectKey, block: u64, want: Range<u64>) -> Option<Entry> {
        let path = self.entry_path(key, block);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
            Err(error) => {
                tracing::warn!(entry = %path.display(), %error, "cannot open a cache entry");
                return None;
            }
        };
        let metadata = file.metadata().ok()?;
        let identity = (metadata.dev(), metadata.ino());
        let verified = self
            .verified
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains(&identity);
        let entry = if verified {
            read_part(&file, metadata.len(), key, block, want)
        } else {
            let mut content = Vec::new();
            if let Err(error) = file.read_to_end(&mut content) {
                tracing::warn!(entry = %path.display(), %error, "cannot read a cache entry");
                return None;
            }
            let entry = Entry::parse(content, key, block);
            if entry.is_some() {
                self.found_whole(identity);
            }
            entry
        };
        let Some(entry) = entry else {
            // A damaged entry (or a clash of names): it is replaced by the block fetched again.
            tracing::warn!(entry = %path.display(), "removed a cache entry that does not hold its block whole");
            let _ = fs::remove_file(&path);
            return None;
        };
        let used = metadata
            .modified()
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok());
        if used.is_none_or(|since| since >= USE_GRANULARITY)
            && let Err(error) = file.set_modified(SystemTime::now())
        {
            tracing::debug!(entry = %path.display(), %error, "cannot mark a cache entry used");
        }
        Some(entry)
    }

    /// Notes that the entry file of `identity` (device and inode) is whole: this process read it
    /// whole, or wrote it.
    fn found_whole(&self, identity: (u64, u64)) {
        let mut verified = self
            .verified
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Entries evicted and written again leave their identities behind: start over once there
        // are more than the cache can hold.
        if verified.len() as u64 > 2 * (self.max_bytes / self.block_bytes) + 1024 {
            verified.clear();
        }
        verified.insert(identity);
    }

    /// Writes the entry of `block` of the object `key`: a new temporary file, renamed into place.
    /// The file this process wrote whole is known whole: its later reads read only what they need.
    fn write_entry(&self, key: &ObjectKey, block: u64, entry: &Entry) -> io::Result<()> {
        let mut content = serde_json::to_vec(&entry.header(key, block))?;
        content.push(b'\n');
        content.extend_from_slice(&entry.data);
        // Relaxed: a counter that names files; only its uniqueness matters.
        let number = self.next_temporary.fetch_add(1, Ordering::Relaxed);
        let temporary = self
            .temporary
            .join(format!("{}.{number}", std::process::id()));
        let written = files::create_temporary(&temporary, Sharing::Private)
            .map_err(io::Error::other)
            .and_then(|mut file| {
                file.write_all(&content)?;
                let metadata = file.metadata()?;
                Ok((metadata.dev(), metadata.ino()))
            });
        let target = self.entry_path(key, block);
        let placed = written.and_then(|identity| {
            if let Some(parent) = target.parent() {
                match fs::DirBuilder::new().mode(0o700).create(parent) {
                    Ok(()) => {}
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(error) => return Err(error),
                }
            }
            let replaced = fs::symlink_metadata(&target).is_ok();
            fs::rename(&temporary, &target)?;
            self.found_whole(identity);
            Ok(replaced)
        });
        match placed {
            Ok(replaced) => {
                if !replaced {
                    add(&self.held, content.len() as u64);
                }
                Ok(())
            }
            Err(error) => {
                let _ = fs::remove_file(&temporary);
                Err(error)
            }
        }
    }

    /// Evicts when the bytes this process counts pass `max_bytes`, unless another of its threads
    /// is evicting.
    fn settle(&self) {
        if self.held.load(Ordering::Relaxed) <= self.max_bytes {
            return;
        }
        if let Ok(_evicting) = self.evicting.try_lock() {
            self.evict();
        }
    }

    /// Lists the directory, removes stale temporary files, and when the entries pass `max_bytes`
    /// removes the least recently used down to [`LOW_WATER_PERCENT`] of it.
    fn evict(&self) {
        let now = SystemTime::now();
        for (path, modified, _) in list_files(&self.temporary) {
            if now.duration_since(modified).unwrap_or_default() > STALE_TEMPORARY {
                let _ = fs::remove_file(path);
            }
        }
        let mut entries: Vec<(PathBuf, SystemTime, u64)> = fs::read_dir(&self.blocks)
            .into_iter()
            .flatten()
            .filter_map(std::result::Result::ok)
            .flat_map(|directory| list_files(&directory.path()))
            .collect();
        let mut total: u64 = entries.iter().map(|(_, _, bytes)| bytes).sum();
        if total > self.max_bytes {
            let keep = self.max_bytes / 100 * LOW_WATER_PERCENT;
            entries.sort_by_key(|(_, modified, _)| *modified);
            for (path, _, bytes) in entries {
                if total <= keep {
                    break;
                }
                match fs::remove_file(&path) {
                    Ok(()) => {
                        total -= bytes;
                        add(&self.counters.evictions, 1);
                    }
                    // Another daemon of the node evicted it first.
                    Err(error) if error.kind() == io::ErrorKind::NotFound => total -= bytes,
                    Err(error) => {
                        tracing::warn!(entry = %path.display(), %error, "cannot evict a cache entry");
                    }
                }
            }
        }
        self.held.store(total, Ordering::Relaxed);
    }

    /// The entries of `blocks` of the object `key` that the cache has, in order, each with the
    /// bytes of `requested` (offsets in the object) that fall in its block.
    async fn lookup(
        self: &Arc<Self>,
        key: &Arc<ObjectKey>,
        blocks: RangeInclusive<u64>,
        requested: Range<u64>,
    ) -> Vec<Option<Entry>> {
        let count = blocks.clone().count();
        let cache = Arc::clone(self);
        let key = Arc::clone(key);
        tokio::task::spawn_blocking(move || {
            blocks
                .map(|block| {
                    let start = block * cache.block_bytes;
                    let want = requested.start.max(start).saturating_sub(start)
                        ..requested
                            .end
                            .min(start.saturating_add(cache.block_bytes))
                            .saturating_sub(start);
                    cache.read_entry(&key, block, want)
                })
                .collect()
        })
        .await
        .unwrap_or_else(|_| vec![None; count])
    }

    /// Writes the blocks of `data`, which starts at block `first_block` of the object `key`.
    async fn store_blocks(
        self: &Arc<Self>,
        key: &Arc<ObjectKey>,
        first_block: u64,
        entries: Vec<Entry>,
    ) {
        let cache = Arc::clone(self);
        let key = Arc::clone(key);
        let written = tokio::task::spawn_blocking(move || {
            for (block, entry) in (first_block..).zip(&entries) {
                if let Err(error) = cache.write_entry(&key, block, entry) {
                    tracing::warn!(dir = %cache.dir.display(), %error, "cannot write a block to the cache");
                    break;
                }
            }
            cache.settle();
        })
        .await;
        if let Err(error) = written {
            tracing::warn!(%error, "writing blocks to the cache stopped");
        }
    }

    /// Cuts `data`, the object's bytes from the start of a block, into block entries.
    fn cut(&self, data: &Bytes, object: &ObjectFacts) -> Vec<Entry> {
        let block_bytes = usize::try_from(self.block_bytes).unwrap_or(usize::MAX);
        (0..data.len())
            .step_by(block_bytes)
            .map(|start| {
                Entry::whole(
                    object.clone(),
                    data.slice(start..data.len().min(start.saturating_add(block_bytes))),
                )
            })
            .collect()
    }

    /// Reads `pinned` of the object at `path` of `inner`, through the cache.
    async fn get(
        self: &Arc<Self>,
        inner: &dyn ObjectStore,
        path: &Path,
        pinned: Pinned,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let key = Arc::new(ObjectKey::new(&pinned, self.block_bytes));
        let requested = match pinned.range.clone() {
            Some(range) => range,
            None => match self.lookup(&key, 0..=0, 0..0).await.pop().flatten() {
                Some(first) => 0..first.object.size,
                None => return self.fetch_whole(inner, path, &key, &pinned, options).await,
            },
        };
        if requested.is_empty() {
            return inner.get_opts(path, options).await;
        }
        let block_bytes = self.block_bytes;
        let first_block = requested.start / block_bytes;
        let mut found = self
            .lookup(
                &key,
                first_block..=(requested.end - 1) / block_bytes,
                requested.clone(),
            )
            .await;
        let was_hit: Vec<bool> = found.iter().map(Option::is_some).collect();
        let mut object = found
            .iter()
            .flatten()
            .next()
            .map(|entry| entry.object.clone());
        let mut index = 0;
        while index < found.len() {
            if found[index].is_some() {
                index += 1;
                continue;
            }
            let run_end = (index..found.len())
                .find(|later| found[*later].is_some())
                .unwrap_or(found.len());
            let start = (first_block + index as u64) * block_bytes;
            let mut end = (first_block + run_end as u64) * block_bytes;
            if let Some(known) = &object {
                if start >= known.size {
                    break;
                }
                end = end.min(known.size);
            }
            let fetched = inner
                .get_opts(
                    path,
                    GetOptions {
                        range: Some(GetRange::Bounded(start..end)),
                        ..options.clone()
                    },
                )
                .await?;
            if !pinned.answered_by(&fetched.meta) {
                // The store did not hold the read to its identity: its own answer goes back
                // uncached, for the caller to check.
                return inner.get_opts(path, options).await;
            }
            let facts = ObjectFacts::of(&fetched.meta);
            let data = fetched.bytes().await?;
            let entries = self.cut(&data, &facts);
            add(&self.counters.misses, entries.len() as u64);
            add(&self.counters.bytes_from_store, data.len() as u64);
            self.store_blocks(&key, first_block + index as u64, entries.clone())
                .await;
            for (slot, entry) in found[index..run_end].iter_mut().zip(entries) {
                *slot = Some(entry);
            }
            object = Some(facts);
            index = run_end;
        }
        let Some(object) = object else {
            return inner.get_opts(path, options).await;
        };
        let served = requested.start..requested.end.min(object.size);
        if served.is_empty() {
            // A range past the object's end: the store's own answer.
            return inner.get_opts(path, options).await;
        }
        let mut parts = Vec::with_capacity(found.len());
        let mut hits = 0;
        let mut from_cache = 0;
        for (offset, slot) in found.iter().enumerate() {
            let block_start = (first_block + offset as u64) * block_bytes;
            if block_start >= served.end {
                break;
            }
            let Some(entry) = slot else {
                return inner.get_opts(path, options).await;
            };
            let from = served.start.max(block_start) - block_start;
            let to = (served.end.min(block_start + block_bytes) - block_start).min(entry.len);
            let Some(bytes) = entry.bytes(from..to) else {
                return inner.get_opts(path, options).await;
            };
            parts.push(bytes);
            if was_hit[offset] {
                hits += 1;
                from_cache += to - from;
            }
        }
        add(&self.counters.hits, hits);
        add(&self.counters.bytes_from_cache, from_cache);
        // A read within one block is a slice of its entry's bytes; a read across blocks joins them.
        let data = match parts.as_slice() {
            [one] => one.clone(),
            _ => {
                let mut data = BytesMut::with_capacity((served.end - served.start) as usize);
                parts.iter().for_each(|part| data.extend_from_slice(part));
                data.freeze()
            }
        };
        Ok(object.result(path, served, data))
    }

    /// Reads the whole object at `path`, one request, and caches its blocks.
    async fn fetch_whole(
        self: &Arc<Self>,
        inner: &dyn ObjectStore,
        path: &Path,
        key: &Arc<ObjectKey>,
        pinned: &Pinned,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let fetched = inner.get_opts(path, options).await?;
        if !pinned.answered_by(&fetched.meta) {
            return Ok(fetched);
        }
        let facts = ObjectFacts::of(&fetched.meta);
        let data = fetched.bytes().await?;
        let entries = self.cut(&data, &facts);
        add(&self.counters.misses, entries.len() as u64);
        add(&self.counters.bytes_from_store, data.len() as u64);
        self.store_blocks(key, 0, entries).await;
        Ok(facts.result(path, 0..data.len() as u64, data))
    }
}

/// Lists the regular files of `directory`: path, modification time and size.
fn list_files(directory: &FsPath) -> Vec<(PathBuf, SystemTime, u64)> {
    fs::read_dir(directory)
        .into_iter()
        .flatten()
        .filter_map(std::result::Result::ok)
        .filter_map(|entry| {
            let metadata = entry.metadata().ok()?;
            metadata.is_file().then(|| {
                (
                    entry.path(),
                    metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    metadata.len(),
                )
            })
        })
        .collect()
}

/// The identity a read is pinned to, and its range (`None`: the whole object).
#[derive(Debug, Clone)]
struct Pinned {
    /// The object's URI.
    uri: String,
    /// The entity tag of `If-Match`, without its quotes.
    e_tag: Option<String>,
    /// The version asked for.
    version: Option<String>,
    range: Option<Range<u64>>,
}

impl Pinned {
    /// The pin of a read of `uri` with `options`, when it is a read the cache serves: one with an
    /// entity tag or a version, or any plain read of a file that never changes (`immutable`).
    fn of(uri: String, options: &GetOptions, immutable: bool) -> Option<Pinned> {
        if options.head
            || options.if_none_match.is_some()
            || options.if_modified_since.is_some()
            || options.if_unmodified_since.is_some()
        {
            return None;
        }
        let e_tag = match options.if_match.as_deref() {
            None => None,
            // A wildcard or a list of tags names no one object.
            Some(tag) if tag == "*" || tag.contains(',') => return None,
            Some(tag) => Some(bare(tag).to_owned()),
        };
        if e_tag.is_none() && options.version.is_none() && !immutable {
            return None;
        }
        let range = match &options.range {
            None => None,
            Some(GetRange::Bounded(range)) => Some(range.clone()),
            Some(GetRange::Offset(_) | GetRange::Suffix(_)) => return None,
        };
        Some(Pinned {
            uri,
            e_tag,
            version: options.version.clone(),
            range,
        })
    }

    /// Whether the store's answer is the object this read is pinned to.
    fn answered_by(&self, meta: &ObjectMeta) -> bool {
        let tag_holds = self
            .e_tag
            .as_deref()
            .is_none_or(|tag| meta.e_tag.as_deref().map(bare) == Some(tag));
        let version_holds = self
            .version
            .as_deref()
            .is_none_or(|version| meta.version.as_deref() == Some(version));
        tag_holds && version_holds
    }
}

/// An object's identity with the block size: what names its entries.
#[derive(Debug)]
struct ObjectKey {
    /// URI, tag, version and block size, one a line: written in each entry and compared.
    text: String,
    /// 32 hex digits of a hash of `text`: the entries' file name.
    name: String,
}

impl ObjectKey {
    fn new(pinned: &Pinned, block_bytes: u64) -> ObjectKey {
        let text = format!(
            "{}\n{}\n{}\n{block_bytes}",
            pinned.uri,
            pinned.e_tag.as_deref().unwrap_or(""),
            pinned.version.as_deref().unwrap_or("")
        );
        let low = twox_hash::XxHash64::oneshot(0, text.as_bytes());
        let high = twox_hash::XxHash64::oneshot(0x9e37_79b9_7f4a_7c15, text.as_bytes());
        ObjectKey {
            name: format!("{high:016x}{low:016x}"),
            text,
        }
    }
}

/// What a read of an object tells of it, kept with each of its blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ObjectFacts {
    size: u64,
    modified_ns: i64,
    e_tag: Option<String>,
    version: Option<String>,
}

impl ObjectFacts {
    fn of(meta: &ObjectMeta) -> ObjectFacts {
        ObjectFacts {
            size: meta.size,
            modified_ns: meta.last_modified.timestamp_nanos_opt().unwrap_or(0),
            e_tag: meta.e_tag.clone(),
            version: meta.version.clone(),
        }
    }

    /// The answer to a read of `range` of the object at `path`: `data`.
    fn result(&self, path: &Path, range: Range<u64>, data: Bytes) -> GetResult {
        GetResult {
            payload: GetResultPayload::Stream(stream::once(async move { Ok(data) }).boxed()),
            meta: ObjectMeta {
                location: path.clone(),
                last_modified: chrono::DateTime::from_timestamp_nanos(self.modified_ns),
                size: self.size,
                e_tag: self.e_tag.clone(),
                version: self.version.clone(),
            },
            range,
            attributes: Attributes::default(),
            extensions: object_store::Extensions::default(),
        }
    }
}

/// The header line of an entry's file.
#[derive(Debug, Serialize, Deserialize)]
struct EntryHeader {
    format: u32,
    key: String,
    block: u64,
    len: u64,
    crc32c: u32,
    object: ObjectFacts,
}

/// One block of an object, or the part of it a read needs: its data, where the data starts in the
/// block, the block's length, and what its read told of the object.
#[derive(Debug, Clone)]
struct Entry {
    object: ObjectFacts,
    data: Bytes,
    /// The offset in the block of `data`'s first byte.
    offset: u64,
    /// The length of the whole block.
    len: u64,
}

impl Entry {
    /// A whole block's entry.
    fn whole(object: ObjectFacts, data: Bytes) -> Entry {
        Entry {
            object,
            len: data.len() as u64,
            data,
            offset: 0,
        }
    }

    /// The bytes `range` (offsets in the block) of the entry, when it holds them: a slice of its
    /// data, no copy.
    fn bytes(&self, range: Range<u64>) -> Option<Bytes> {
        let start = usize::try_from(range.start.checked_sub(self.offset)?).ok()?;
        let end = usize::try_from(range.end.checked_sub(self.offset)?).ok()?;
        (start <= end && end <= self.data.len()).then(|| self.data.slice(start..end))
    }

    fn header(&self, key: &ObjectKey, block: u64) -> EntryHeader {
        EntryHeader {
            format: ENTRY_FORMAT,
            key: key.text.clone(),
            block,
            len: self.data.len() as u64,
            crc32c: crc32c::crc32c(&self.data),
            object: self.object.clone(),
        }
    }

    /// The entry in `content`, an entry file's bytes, when it is whole and is `block` of `key`.
    fn parse(content: Vec<u8>, key: &ObjectKey, block: u64) -> Option<Entry> {
        let newline = content.iter().position(|byte| *byte == b'\n')?;
        let header: EntryHeader = serde_json::from_slice(&content[..newline]).ok()?;
        let data = Bytes::from(content).slice(newline + 1..);
        let whole = header.format == ENTRY_FORMAT
            && header.key == key.text
            && header.block == block
            && header.len == data.len() as u64
            && header.crc32c == crc32c::crc32c(&data);
        whole.then(|| Entry::whole(header.object, data))
    }
}

/// The smallest read of an entry found whole that maps the entry's bytes rather than copying them.
const MAP_FROM_BYTES: usize = 64 << 10;

/// The bytes `want` (offsets in the block) of the entry file `file` of `file_len` bytes, an entry
/// already found whole: its header is read and checked against `key` and `block`, and the length
/// of the file against the header; the data is not checked again.
fn read_part(
    file: &File,
    file_len: u64,
    key: &ObjectKey,
    block: u64,
    want: Range<u64>,
) -> Option<Entry> {
    let mut head = vec![0; MAX_HEADER_BYTES.min(usize::try_from(file_len).ok()?)];
    file.read_exact_at(&mut head, 0).ok()?;
    let newline = head.iter().position(|byte| *byte == b'\n')?;
    let header: EntryHeader = serde_json::from_slice(&head[..newline]).ok()?;
    let data_start = newline as u64 + 1;
    let fits = header.format == ENTRY_FORMAT
        && header.key == key.text
        && header.block == block
        && data_start.checked_add(header.len) == Some(file_len);
    if !fits {
        return None;
    }
    let end = want.end.min(header.len);
    let start = want.start.min(end);
    let length = usize::try_from(end - start).ok()?;
    // An entry file is written whole under `tmp/` and renamed into place, and never written again: its
    // bytes can be mapped rather than copied. A short read costs less copied than mapped.
    let data = if length >= MAP_FROM_BYTES {
        sluice_io::map_frozen(file, data_start + start, length).ok()?
    } else {
        let mut data = vec![0; length];
        file.read_exact_at(&mut data, data_start + start).ok()?;
        Bytes::from(data)
    };
    Some(Entry {
        object: header.object,
        data,
        offset: start,
        len: header.len,
    })
}

/// An object store with a [`BlockCache`] in front of its pinned reads.
#[derive(Debug)]
struct CachedStore {
    cache: Arc<BlockCache>,
    /// The URI of the store's root, ending in `/`.
    root: String,
    inner: Arc<dyn ObjectStore>,
    /// For a table's store, the directory of its log: the files outside it never change, so that
    /// their plain reads are cached too.
    table_log: Option<&'static str>,
}

impl fmt::Display for CachedStore {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} cached in {}",
            self.inner,
            self.cache.dir.display()
        )
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ObjectStore for CachedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        options: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, options).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        options: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, options).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let immutable = self
            .table_log
            .is_some_and(|log| !location.parts().any(|part| part.as_ref() == log));
        match Pinned::of(format!("{}{location}", self.root), &options, immutable) {
            Some(pinned) => {
                self.cache
                    .get(self.inner.as_ref(), location, pinned, options)
                    .await
            }
            None => self.inner.get_opts(location, options).await,
        }
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;
    use std::os::unix::fs::MetadataExt;

    const BLOCK: u64 = 1024;

    fn config(dir: &FsPath, max_bytes: u64) -> CacheConfig {
        CacheConfig {
            dir: dir.to_path_buf(),
            max_bytes,
        }
    }

    /// `length` bytes that differ with `seed` and with their place.
    fn content(seed: u8, length: usize) -> Bytes {
        (0..length)
            .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    }

    /// Puts `data` at `name` and gives its entity tag.
    async fn put(store: &InMemory, name: &str, data: Bytes) -> String {
        store
            .put(&Path::from(name), PutPayload::from(data))
            .await
            .expect("put")
            .e_tag
            .expect("an in-memory store tags its objects")
    }

    /// Reads `range` (the whole object with `None`) of `name` pinned to `tag`.
    async fn read(
        store: &dyn ObjectStore,
        name: &str,
        tag: &str,
        range: Option<Range<u64>>,
    ) -> object_store::Result<Bytes> {
        let options = GetOptions {
            if_match: Some(format!("\"{}\"", bare(tag))),
            range: range.map(GetRange::Bounded),
            ..GetOptions::default()
        };
        store
            .get_opts(&Path::from(name), options)
            .await?
            .bytes()
            .await
    }

    /// A cache of 1 MiB in blocks of [`BLOCK`] in a new directory, in front of a new in-memory
    /// store: the directory, the store, the cache and the cached store.
    fn cached_store() -> (
        tempfile::TempDir,
        Arc<InMemory>,
        Arc<BlockCache>,
        Arc<dyn ObjectStore>,
    ) {
        let directory = tempfile::tempdir().expect("tempdir");
        let inner = Arc::new(InMemory::new());
        let cache =
            BlockCache::with_block_bytes(&config(directory.path(), 1 << 20), BLOCK).expect("open");
        let sut = cache.wrap("s3://bucket/", inner.clone());
        (directory, inner, cache, sut)
    }

    /// Every entry file of the cache in `dir`.
    fn entries(dir: &FsPath) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(dir.join("blocks"))
            .expect("blocks")
            .flat_map(|sub| list_files(&sub.expect("entry").path()))
            .map(|(path, _, _)| path)
            .collect();
        found.sort();
        found
    }

    fn bytes_on_disk(dir: &FsPath) -> u64 {
        entries(dir)
            .iter()
            .map(|path| fs::metadata(path).expect("stat").len())
            .sum()
    }

    #[tokio::test]
    async fn ranges_read_again_from_entries_found_whole_are_the_objects_bytes() {
        let (_directory, inner, cache, sut) = cached_store();
        let size = 5 * BLOCK + 300;
        let data = content(7, size as usize);
        let tag = put(&inner, "r.parquet", data.clone()).await;
        let ranges = [
            0..size,
            0..1,
            BLOCK - 1..BLOCK + 1,
            BLOCK..2 * BLOCK,
            100..4 * BLOCK + 7,
            3 * BLOCK + 5..3 * BLOCK + 6,
            5 * BLOCK..size,
            size - 1..size,
        ];
        // The first round fills the cache and finds each entry whole; the later ones read the
        // parts they need from the entries found whole.
        for round in 0..3 {
            for range in ranges.clone() {
                let got = read(sut.as_ref(), "r.parquet", &tag, Some(range.clone()))
                    .await
                    .expect("read");
                assert_eq!(
                    got,
                    data.slice(range.start as usize..range.end as usize),
                    "round {round}, {range:?}"
                );
            }
        }
        assert_eq!(cache.figures().misses, 6, "each block fetched once");
    }

    #[tokio::test]
    async fn large_ranges_are_mapped_from_entries_found_whole_and_outlive_their_files() {
        let directory = tempfile::tempdir().expect("tempdir");
        let inner = Arc::new(InMemory::new());
        let block = 4 * MAP_FROM_BYTES as u64;
        let cache =
            BlockCache::with_block_bytes(&config(directory.path(), 64 << 20), block).expect("open");
        let sut = cache.wrap("s3://bucket/", inner.clone());
        let size = 3 * block + 1000;
        let data = content(3, size as usize);
        let tag = put(&inner, "m.parquet", data.clone()).await;
        // Within a block (a slice of one mapping), across two (joined), and a short one (copied).
        let ranges = [
            block / 2..block / 2 + MAP_FROM_BYTES as u64,
            block - 100..2 * block + 100,
            2 * block + 10..2 * block + 20,
            0..size,
        ];
        let mut held = Vec::new();
        for round in 0..2 {
            for range in ranges.clone() {
                let got = read(sut.as_ref(), "m.parquet", &tag, Some(range.clone()))
                    .await
                    .expect("read");
                assert_eq!(
                    got,
                    data.slice(range.start as usize..range.end as usize),
                    "round {round}, {range:?}"
                );
                held.push((range, got));
            }
        }
        assert_eq!(cache.figures().misses, 4, "each block fetched once");
        // Entries removed (evicted, or by hand) while their bytes are held: the bytes stay.
        for path in entries(directory.path()) {
            fs::remove_file(path).expect("remove");
        }
        for (range, got) in held {
            assert_eq!(got, data.slice(range.start as usize..range.end as usize));
        }
    }

    #[tokio::test]
    async fn an_entry_file_replaced_after_it_was_found_whole_is_checked_again() {
        let (directory, inner, cache, sut) = cached_store();
        let data = content(3, (2 * BLOCK) as usize);
        let tag = put(&inner, "e.parquet", data.clone()).await;
        for _ in 0..2 {
            read(sut.as_ref(), "e.parquet", &tag, Some(0..BLOCK))
                .await
                .expect("read");
        }
        assert_eq!(cache.figures().misses, 1);
        // Another file in the entry's place, its data damaged at the same length.
        let entry = entries(directory.path()).remove(0);
        let mut damaged = fs::read(&entry).expect("entry");
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        let replacement = directory.path().join("replacement");
        fs::write(&replacement, &damaged).expect("write");
        fs::rename(&replacement, &entry).expect("rename");
        let got = read(sut.as_ref(), "e.parquet", &tag, Some(0..BLOCK))
            .await
            .expect("read");
        assert_eq!(
            got,
            data.slice(0..BLOCK as usize),
            "never the damaged bytes"
        );
        assert_eq!(
            cache.figures().misses,
            2,
            "the damaged entry is fetched again"
        );
    }

    #[tokio::test]
    async fn a_tables_data_files_are_cached_by_uri_and_its_log_never() {
        // Delta's log, and Iceberg's metadata, whose newest file changes.
        for (log, log_file) in [
            ("_delta_log", "t/_delta_log/_last_checkpoint"),
            ("metadata", "t/metadata/00001-a.metadata.json"),
        ] {
            a_tables_data_files_are_cached_and_not(log, log_file).await;
        }
    }

    async fn a_tables_data_files_are_cached_and_not(log: &'static str, log_file: &'static str) {
        let directory = tempfile::tempdir().expect("tempdir");
        let inner = Arc::new(InMemory::new());
        let cache =
            BlockCache::with_block_bytes(&config(directory.path(), 1 << 20), BLOCK).expect("open");
        let sut = cache.wrap_table("s3://bucket/", inner.clone(), log);
        let data = content(2, 3_000);
        put(&inner, "t/part-0.parquet", data.clone()).await;
        put(&inner, log_file, content(3, 100)).await;
        let plain = |name: &'static str, range: Range<u64>| {
            let sut = Arc::clone(&sut);
            async move {
                let options = GetOptions {
                    range: Some(GetRange::Bounded(range)),
                    ..GetOptions::default()
                };
                sut.get_opts(&Path::from(name), options)
                    .await
                    .expect("read")
                    .bytes()
                    .await
                    .expect("bytes")
            }
        };
        for _ in 0..2 {
            assert_eq!(
                plain("t/part-0.parquet", 100..2_100).await,
                data.slice(100..2_100)
            );
        }
        let figures = cache.figures();
        assert_eq!(
            (figures.hits, figures.misses),
            (3, 3),
            "blocks 0 to 2, fetched once"
        );
        for _ in 0..2 {
            plain(log_file, 0..10).await;
        }
        assert_eq!(cache.figures(), figures, "the log is read from the store");
        // The same plain read through a store of files that may change is never cached.
        let other = cache.wrap("s3://bucket/", inner.clone());
        let options = GetOptions {
            range: Some(GetRange::Bounded(0..10)),
            ..GetOptions::default()
        };
        other
            .get_opts(&Path::from("t/part-0.parquet"), options)
            .await
            .expect("read");
        assert_eq!(cache.figures(), figures);
    }

    #[tokio::test]
    async fn a_pinned_read_is_fetched_once_then_served_from_disk_and_an_unpinned_one_never_cached()
    {
        let (directory, inner, cache, sut) = cached_store();
        let data = content(1, 10_000);
        let tag = put(&inner, "d/a.parquet", data.clone()).await;

        let range = 1500..4200;
        let first = read(sut.as_ref(), "d/a.parquet", &tag, Some(range.clone()))
            .await
            .expect("miss");
        assert_eq!(first, data.slice(1500..4200));
        let figures = cache.figures();
        assert_eq!((figures.hits, figures.misses), (0, 4), "blocks 1 to 4");
        assert_eq!(figures.bytes_from_store, 4 * BLOCK);
        assert_eq!(entries(directory.path()).len(), 4);

        let again = read(sut.as_ref(), "d/a.parquet", &tag, Some(range))
            .await
            .expect("hit");
        assert_eq!(again, data.slice(1500..4200));
        let figures = cache.figures();
        assert_eq!((figures.hits, figures.misses), (4, 4));
        assert_eq!(figures.bytes_from_cache, 2700);
        assert_eq!(figures.bytes_from_store, 4 * BLOCK, "nothing fetched again");

        let past_end = read(sut.as_ref(), "d/a.parquet", &tag, Some(9_000..20_000))
            .await
            .expect("a range past the end is cut at it, as the store cuts it");
        assert_eq!(past_end, data.slice(9_000..));

        let whole = read(sut.as_ref(), "d/a.parquet", &tag, None)
            .await
            .expect("whole");
        assert_eq!(whole, data);
        let before = cache.figures();
        let whole_again = read(sut.as_ref(), "d/a.parquet", &tag, None)
            .await
            .expect("whole again");
        assert_eq!(whole_again, data);
        let after = cache.figures();
        assert_eq!(
            after.misses, before.misses,
            "the whole object came from disk"
        );
        assert_eq!(after.bytes_from_cache - before.bytes_from_cache, 10_000);

        let unpinned = sut
            .get_range(&Path::from("d/a.parquet"), 0..100)
            .await
            .expect("unpinned");
        assert_eq!(unpinned, data.slice(0..100));
        let head = sut.head(&Path::from("d/a.parquet")).await.expect("head");
        assert_eq!(head.size, 10_000);
        assert_eq!(
            cache.figures(),
            after,
            "a read with neither tag nor version goes to the store"
        );
    }

    #[tokio::test]
    async fn an_overwritten_object_is_read_anew_and_a_read_pinned_to_the_old_tag_gets_the_old_bytes()
     {
        let (_directory, inner, _cache, sut) = cached_store();
        let old = content(1, 3000);
        let old_tag = put(&inner, "a.csv", old.clone()).await;
        read(sut.as_ref(), "a.csv", &old_tag, Some(0..BLOCK))
            .await
            .expect("cached");

        let new = content(2, 3000);
        let new_tag = put(&inner, "a.csv", new.clone()).await;
        assert_ne!(new_tag, old_tag);
        let fresh = read(sut.as_ref(), "a.csv", &new_tag, Some(0..3000))
            .await
            .expect("the new object");
        assert_eq!(
            fresh, new,
            "a read pinned to the new tag never gets the old bytes"
        );

        let planned = read(sut.as_ref(), "a.csv", &old_tag, Some(0..BLOCK))
            .await
            .expect("the old tag's cached block");
        assert_eq!(
            planned,
            old.slice(0..BLOCK as usize),
            "the bytes the old tag names"
        );
        let gone = read(sut.as_ref(), "a.csv", &old_tag, Some(BLOCK..2 * BLOCK))
            .await
            .expect_err("a block of the old object that was never cached");
        assert!(
            matches!(gone, object_store::Error::Precondition { .. }),
            "{gone:?}"
        );
    }

    /// A store that drops `If-Match` from every read, as a store that ignores it would.
    #[derive(Debug)]
    struct IgnoresIfMatch(InMemory);

    impl fmt::Display for IgnoresIfMatch {
        fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(formatter, "a store that ignores If-Match")
        }
    }

    #[async_trait]
    impl ObjectStore for IgnoresIfMatch {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            options: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.0.put_opts(location, payload, options).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            options: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, options).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            let options = GetOptions {
                if_match: None,
                ..options
            };
            self.0.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.0.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.0.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn what_a_store_answers_for_another_tag_than_asked_is_handed_over_uncached() {
        let directory = tempfile::tempdir().expect("tempdir");
        let inner = InMemory::new();
        let old_tag = put(&inner, "a.csv", content(1, 3000)).await;
        put(&inner, "a.csv", content(2, 3000)).await;
        let inner = Arc::new(IgnoresIfMatch(inner));
        let cache =
            BlockCache::with_block_bytes(&config(directory.path(), 1 << 20), BLOCK).expect("open");
        let sut = cache.wrap("s3://bucket/", inner);
        let options = GetOptions {
            if_match: Some(format!("\"{old_tag}\"")),
            range: Some(GetRange::Bounded(0..100)),
            ..GetOptions::default()
        };
        let answer = sut
            .get_opts(&Path::from("a.csv"), options)
            .await
            .expect("the store answers");
        assert_ne!(
            answer.meta.e_tag.as_deref().map(bare),
            Some(old_tag.as_str()),
            "the answer shows its own tag, which the caller's check refuses"
        );
        assert!(entries(directory.path()).is_empty(), "nothing cached");
    }

    #[tokio::test]
    async fn a_damaged_or_unfinished_entry_is_never_served_after_a_crash() {
        let (directory, inner, cache, sut) = cached_store();
        let data = content(3, 2 * BLOCK as usize);
        let tag = put(&inner, "a.arrow", data.clone()).await;
        read(sut.as_ref(), "a.arrow", &tag, None)
            .await
            .expect("cached");
        let written = entries(directory.path());
        assert_eq!(written.len(), 2);

        // A rename that reached the disk before the data did: the entry is cut short.
        let whole = fs::read(&written[0]).expect("entry");
        fs::write(&written[0], &whole[..whole.len() - 100]).expect("cut");
        // The same length with a byte changed.
        let mut flipped = fs::read(&written[1]).expect("entry");
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        fs::write(&written[1], &flipped).expect("flip");
        // A temporary file left by a daemon killed while writing: never read.
        fs::write(directory.path().join("tmp/4242.0"), b"{\"format\":1}\nhalf").expect("temporary");

        // The daemon started after the crash.
        drop(sut);
        drop(cache);
        let cache =
            BlockCache::with_block_bytes(&config(directory.path(), 1 << 20), BLOCK).expect("open");
        let sut = cache.wrap("s3://bucket/", inner.clone());
        let before = cache.figures();
        let again = read(sut.as_ref(), "a.arrow", &tag, Some(0..2 * BLOCK))
            .await
            .expect("read again");
        assert_eq!(again, data, "the store's bytes, not the damaged entries'");
        let after = cache.figures();
        assert_eq!(after.hits, before.hits, "no damaged entry is a hit");
        assert_eq!(after.misses - before.misses, 2);
        let repaired = read(sut.as_ref(), "a.arrow", &tag, Some(0..2 * BLOCK))
            .await
            .expect("read a third time");
        assert_eq!(repaired, data);
        assert_eq!(cache.figures().hits - after.hits, 2, "written whole again");
    }

    /// Sets the modification time of an entry to `seconds` after the epoch.
    fn age(seconds: u64) -> impl Fn(&PathBuf) {
        move |path: &PathBuf| {
            File::options()
                .write(true)
                .open(path)
                .expect("open entry")
                .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
                .expect("set time");
        }
    }

    #[tokio::test]
    async fn the_least_recently_read_entries_go_when_the_cache_passes_max_bytes() {
        let directory = tempfile::tempdir().expect("tempdir");
        let dir = directory.path();
        let inner = Arc::new(InMemory::new());
        let mut tags = Vec::new();
        for (seed, name) in ["a", "b", "c"].into_iter().enumerate() {
            tags.push(put(&inner, name, content(seed as u8, 4 * BLOCK as usize)).await);
        }
        let max_bytes = 12 * BLOCK;
        let cache = BlockCache::with_block_bytes(&config(dir, max_bytes), BLOCK).expect("open");
        let sut = cache.wrap("s3://bucket/", inner.clone());
        read(sut.as_ref(), "b", &tags[1], None).await.expect("b");
        let of_b = entries(dir);
        read(sut.as_ref(), "a", &tags[0], None).await.expect("a");
        assert_eq!(cache.figures().evictions, 0, "two objects fit");
        // b's entries are the oldest; a is read again, which makes its entries the newest.
        of_b.iter().for_each(age(1));
        entries(dir)
            .iter()
            .filter(|path| !of_b.contains(path))
            .for_each(age(2));
        read(sut.as_ref(), "a", &tags[0], None)
            .await
            .expect("a again");
        read(sut.as_ref(), "c", &tags[2], None).await.expect("c");

        let figures = cache.figures();
        let evicted_of_b = of_b.iter().filter(|path| !path.exists()).count() as u64;
        assert!(
            figures.evictions > 0 && figures.evictions == evicted_of_b,
            "b's blocks go first: {figures:?}"
        );
        let held = bytes_on_disk(dir);
        assert!(
            held <= max_bytes && figures.bytes_held == held,
            "{held} {figures:?}"
        );
        let misses = figures.misses;
        read(sut.as_ref(), "a", &tags[0], None).await.expect("a");
        read(sut.as_ref(), "c", &tags[2], None).await.expect("c");
        assert_eq!(cache.figures().misses, misses, "a and c stayed");
        read(sut.as_ref(), "b", &tags[1], None).await.expect("b");
        assert!(
            cache.figures().misses >= misses + evicted_of_b,
            "b's evicted blocks are fetched again"
        );
    }

    #[tokio::test]
    async fn an_entry_evicted_while_it_is_read_stays_whole_for_its_reader() {
        let directory = tempfile::tempdir().expect("tempdir");
        let dir = directory.path();
        let inner = Arc::new(InMemory::new());
        let first = content(5, BLOCK as usize);
        let first_tag = put(&inner, "first", first.clone()).await;
        let cache = BlockCache::with_block_bytes(&config(dir, 4 * BLOCK), BLOCK).expect("open");
        let sut = cache.wrap("s3://bucket/", inner.clone());
        read(sut.as_ref(), "first", &first_tag, None)
            .await
            .expect("cached");
        let entry = entries(dir).pop().expect("one entry");
        entries(dir).iter().for_each(age(1));
        // A daemon that opened the entry and has not read it yet.
        let mut reader = File::open(&entry).expect("open");

        for index in 0..4 {
            let name = format!("other{index}");
            let tag = put(&inner, &name, content(index, BLOCK as usize)).await;
            read(sut.as_ref(), &name, &tag, None).await.expect("other");
        }
        assert!(!entry.exists(), "evicted");
        let mut read_back = Vec::new();
        reader
            .read_to_end(&mut read_back)
            .expect("read the evicted entry");
        let key = ObjectKey::new(
            &Pinned::of(
                "s3://bucket/first".to_owned(),
                &GetOptions {
                    if_match: Some(first_tag.clone()),
                    ..GetOptions::default()
                },
                false,
            )
            .expect("pinned"),
            BLOCK,
        );
        let whole = Entry::parse(read_back, &key, 0).expect("whole");
        assert_eq!(whole.data, first);
    }

    #[tokio::test]
    async fn daemons_sharing_a_directory_read_each_others_blocks_while_they_evict() {
        let directory = tempfile::tempdir().expect("tempdir");
        let dir = directory.path();
        let inner = Arc::new(InMemory::new());
        let mut objects = Vec::new();
        for index in 0..12_u8 {
            let name = format!("part-{index}");
            let data = content(index, 3 * BLOCK as usize);
            let tag = put(&inner, &name, data.clone()).await;
            objects.push((name, tag, data));
        }
        let objects = Arc::new(objects);
        let first = BlockCache::with_block_bytes(&config(dir, 16 * BLOCK), BLOCK).expect("open");
        let second = BlockCache::with_block_bytes(&config(dir, 16 * BLOCK), BLOCK).expect("open");

        let (name, tag, data) = &objects[0];
        read(
            first.wrap("s3://b/", inner.clone()).as_ref(),
            name,
            tag,
            None,
        )
        .await
        .expect("first");
        let shared = read(
            second.wrap("s3://b/", inner.clone()).as_ref(),
            name,
            tag,
            None,
        )
        .await
        .expect("second");
        assert_eq!(&shared, data);
        assert_eq!(second.figures().hits, 3, "the other daemon's blocks");

        let readers: Vec<_> = [first.clone(), second.clone()]
            .into_iter()
            .enumerate()
            .map(|(which, cache)| {
                let store = cache.wrap("s3://b/", inner.clone());
                let objects = Arc::clone(&objects);
                tokio::spawn(async move {
                    for round in 0..6 {
                        for step in 0..objects.len() {
                            let (name, tag, data) =
                                &objects[(step * (which + 1) + round) % objects.len()];
                            let got = read(store.as_ref(), name, tag, Some(100..3000))
                                .await
                                .expect("read");
                            assert_eq!(got, data.slice(100..3000), "{name}");
                        }
                    }
                })
            })
            .collect();
        for reader in readers {
            reader.await.expect("reader");
        }
        let evictions = first.figures().evictions + second.figures().evictions;
        assert!(evictions > 0, "the readers overflowed the cache");
        assert!(bytes_on_disk(dir) <= 16 * BLOCK + 2 * 3 * (BLOCK + 512));
    }

    #[test]
    fn sizes_under_two_blocks_or_over_the_disk_and_foreign_directories_are_refused() {
        let directory = tempfile::tempdir().expect("tempdir");
        let dir = directory.path().join("cache");
        let small = BlockCache::open(&config(&dir, 1000)).expect_err("too small");
        assert!(
            small.to_string().contains(
                "max_bytes 1000 holds less than two blocks of 4194304 bytes; give data.cache.max_bytes or --cache-max-bytes at least 8388608"
            ),
            "{small}"
        );
        let large = BlockCache::open(&config(&dir, u64::MAX)).expect_err("too large");
        assert!(
            matches!(large, CacheOpenError::TooLarge { .. })
                && large.to_string().contains("a size its disk can hold"),
            "{large}"
        );

        let file = directory.path().join("a-file");
        fs::write(&file, b"").expect("file");
        let not_a_dir = BlockCache::open(&config(&file, 1 << 30)).expect_err("a file");
        assert!(
            not_a_dir.to_string().starts_with("cache directory "),
            "{not_a_dir}"
        );

        let opened = BlockCache::open(&config(&dir, 1 << 30)).expect("open");
        let mode = fs::metadata(opened.dir()).expect("stat").mode() & 0o777;
        assert_eq!(mode, 0o700);
        if files::user() == 0 {
            let foreign = directory.path().join("foreign");
            fs::create_dir(&foreign).expect("mkdir");
            std::os::unix::fs::chown(&foreign, Some(4242), Some(4242)).expect("chown");
            let error = BlockCache::open(&config(&foreign, 1 << 30)).expect_err("foreign");
            assert!(
                error
                    .to_string()
                    .contains("belongs to uid 4242, not to this user"),
                "{error}"
            );
        }
    }
}
