//! A ring's ledger: the tasks a producer has bound to the ring, and how far the consumer got in each,
//! kept in shared memory beside the ring so that a producer that takes over after a crash knows them.
//!
//! ```text
//! <job dir>/<rank>.ring     the ring
//! <job dir>/<rank>.ledger   its ledger
//! ```
//!
//! # Implementation
//!
//! The file is a 64-byte header and a fixed number of 64-byte slots, all little-endian `u64` words
//! accessed as atomics:
//!
//! ```text
//! header  word 0 magic `SLUICELG`, word 1 version (bits 0..32) and slot count (bits 32..64),
//!         word 2 the last folded mark ([`EpochMark`]), word 3 the owner (a node id), word 4 the
//!         largest record tag folded ([`RecordMeta::tag`]), word 5 1 while a fence's error record
//!         is owed to the ring, else 0, words 6..8 zero
//! slot    word 0 state (0 free, 1 bound), 1 task id, 2 epoch, 3 start, 4 end,
//!         5 consumed end, 6 enqueued end, 7 the stream position its records count from
//! ```
//!
//! Positions are the task's rows in its delivery order (split rows): `[start, end)` is the task as
//! bound, `consumed end` the end of the last of its records the producer folded (the consumer released
//! it), `enqueued end` the end of the last of its published records the producer has seen.
//!
//! **Binding** writes words 1 to 7 of a free slot, then stores the state with `Release`; a reader
//! loads the state with `Acquire` before the rest. A producer binds a task before the first record of
//! the task can be published, so a producer that dies half-way through a binding (the state still 0)
//! has no record of that task in the ring. Word 7 is where the ring's stream stood at the binding:
//! only records at or past it are the binding's. A ring may still hold records of an earlier binding
//! of the same task id that were never folded into it: a node the AM declared lost keeps the rows
//! its rings held, which its trainer reads void, and the AM may hand the task, queued again from its
//! last count, back to the same ring. Those records count for nothing. **Folding** a record (see
//! [`crate::Producer::fold`]) raises its task's consumed and enqueued ends with `fetch_max`, so
//! folding a record twice (a producer died after the ledger write and before the retain cursor
//! moved) changes nothing. **Freeing** stores the state 0; a producer frees a task only once no
//! record of it is left to fold, or once the AM fenced the node and every record left is void.
//!
//!
//! **A fence is owed** (header word 5) from the moment the AM fenced the node until its error
//! record is in the ring: the records before it are void, and the trainer learns so only from that
//! record. The producer that is fenced sets it and clears the slots; whichever producer writes the
//! error record (that one, or, if it died or found no room, the one that takes the ring over,
//! before anything else) clears it.
//!
//! Version 1, which had header word 5 and slot word 7 zero, is read as version 2 with no fence
//! owed and every binding counting from the stream's start.
//!
//! The ledger has one writer process: the holder of the ring's producer role. Its threads share it
//! through the atomics. Every value read from the file is validated before it is trusted, so any
//! bytes give a ledger or an error, never a crash.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use crate::layout::{RecordKind, RecordMeta};
use crate::sync::{AtomicU64, Ordering};

/// The magic number at offset 0 of every ledger file: `SLUICELG` in ASCII.
pub const LEDGER_MAGIC: u64 = u64::from_le_bytes(*b"SLUICELG");
/// The version of the ledger layout described in this module.
pub const LEDGER_VERSION: u32 = 2;
/// The oldest ledger layout this build reads (see the [module documentation](self)).
const OLDEST_LEDGER_VERSION: u32 = 1;
/// The file name extension of ledger files.
pub const LEDGER_EXTENSION: &str = "ledger";
/// How many tasks a ledger created by [`Ledger::create`] holds at once.
pub const DEFAULT_LEDGER_SLOTS: u32 = 256;

const WORDS_PER_SLOT: usize = 8;
const HEADER_WORDS: usize = 8;
const STATE_FREE: u64 = 0;
const STATE_BOUND: u64 = 1;
const MARK_BATCH: u64 = 1 << 62;
const MARK_END_OF_EPOCH: u64 = 1 << 63;

/// The last batch or end-of-epoch record of a ring's stream: where the stream stands between epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochMark {
    /// No batch and no end of epoch yet.
    Start,
    /// A batch of a task of this epoch.
    Batch {
        /// The epoch of the batch's task.
        epoch: u32,
    },
    /// An end-of-epoch record.
    EndOfEpoch,
}

impl EpochMark {
    fn word(self) -> u64 {
        match self {
            EpochMark::Start => 0,
            EpochMark::Batch { epoch } => MARK_BATCH | u64::from(epoch),
            EpochMark::EndOfEpoch => MARK_END_OF_EPOCH,
        }
    }

    fn of_word(word: u64) -> Option<EpochMark> {
        match word {
            0 => Some(EpochMark::Start),
            MARK_END_OF_EPOCH => Some(EpochMark::EndOfEpoch),
            word if word & !MARK_BATCH <= u64::from(u32::MAX) && word & MARK_BATCH != 0 => {
                Some(EpochMark::Batch {
                    epoch: (word & !MARK_BATCH) as u32,
                })
            }
            _ => None,
        }
    }
}

/// One task bound to a ring, as its ledger slot holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerTask {
    /// The task.
    pub task_id: u64,
    /// Its epoch.
    pub epoch: u32,
    /// The first row of the task as bound.
    pub start: u64,
    /// The row (exclusive) the task ends at; a stop moves it.
    pub end: u64,
    /// The end of the task's rows the consumer released, as folded.
    pub consumed_end: u64,
    /// The end of the task's rows published into the ring, as far as the producer looked.
    pub enqueued_end: u64,
}

/// Why a ledger could not be created, opened, read or written.
#[derive(Debug)]
pub enum LedgerError {
    /// A system call failed.
    Io {
        path: PathBuf,
        operation: &'static str,
        source: io::Error,
    },
    /// The file is not a ledger this build can read, or its contents are inconsistent.
    Invalid { path: PathBuf, reason: String },
    /// The filesystem that would hold the ledger is full.
    NoSpace { path: PathBuf, needed: u64 },
    /// Every slot is bound.
    Full { path: PathBuf, slots: u32 },
    /// The task is already bound.
    AlreadyBound { path: PathBuf, task_id: u64 },
    /// The ledger or its directory is not this user's to use.
    Files(crate::files::FileError),
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Io {
                path,
                operation,
                source,
            } => write!(
                formatter,
                "ledger {}: {operation}: {source}",
                path.display()
            ),
            LedgerError::Invalid { path, reason } => write!(
                formatter,
                "ledger {}: {reason}; remove the ring and its ledger (`sluice gc` once its processes are gone) and restart the job from its last checkpoint",
                path.display()
            ),
            LedgerError::NoSpace { path, needed } => write!(
                formatter,
                "ledger {}: the filesystem is full, the ledger needs {needed} bytes; free space in {} (`sluice gc` removes rings no process uses) or raise its size",
                path.display(),
                path.parent().unwrap_or(path).display()
            ),
            LedgerError::Full { path, slots } => write!(
                formatter,
                "ledger {}: all {slots} task slots are bound; the daemon holds more tasks per ring than a ledger tracks",
                path.display()
            ),
            LedgerError::AlreadyBound { path, task_id } => write!(
                formatter,
                "ledger {}: task {task_id} is already bound to this ring",
                path.display()
            ),
            LedgerError::Files(error) => write!(formatter, "ledger: {error}"),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LedgerError::Io { source, .. } => Some(source),
            LedgerError::Files(error) => Some(error),
            _ => None,
        }
    }
}

/// A ring's ledger, mapped; see the [module documentation](self).
#[derive(Debug)]
pub struct Ledger {
    memory: Memory,
    path: PathBuf,
    slots: usize,
}

#[derive(Debug)]
enum Memory {
    Mapped(memmap2::MmapRaw),
    Heap(Box<[AtomicU64]>),
}

impl Ledger {
    /// The path of the ledger of the ring at `ring_path`: the same name with the ledger extension.
    pub fn path_beside(ring_path: &Path) -> PathBuf {
        ring_path.with_extension(LEDGER_EXTENSION)
    }

    /// Creates an empty ledger with [`DEFAULT_LEDGER_SLOTS`] slots at `path` for `owner` (the node
    /// whose producers keep it), replacing any file there. The file is initialised under a temporary
    /// name and renamed into place, so no process ever opens a half-written one.
    pub fn create(path: impl AsRef<Path>, owner: u64) -> Result<Ledger, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |operation: &'static str, at: &Path| {
            let at = at.to_path_buf();
            move |source| LedgerError::Io {
                path: at,
                operation,
                source,
            }
        };
        let directory = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let file_name = path.file_name().map_or_else(
            || "ledger".into(),
            |name| name.to_string_lossy().into_owned(),
        );
        let temporary = directory.join(format!(".{file_name}.{}.tmp", std::process::id()));
        let file = crate::files::Sharing::of_dir(directory)
            .and_then(|sharing| crate::files::create_temporary(&temporary, sharing))
            .map_err(LedgerError::Files)?;
        let slots = DEFAULT_LEDGER_SLOTS as usize;
        if let Err(source) = crate::reserve(&file, file_len(slots)) {
            let _ = fs::remove_file(&temporary);
            return Err(match source.raw_os_error() {
                Some(libc::ENOSPC) => LedgerError::NoSpace {
                    path,
                    needed: file_len(slots),
                },
                _ => io_error("posix_fallocate", &temporary)(source),
            });
        }
        let mapping = map(&file).map_err(io_error("mmap", &temporary))?;
        let sut = Ledger {
            memory: Memory::Mapped(mapping),
            path: path.clone(),
            slots,
        };
        sut.initialise(owner);
        let renamed = fs::rename(&temporary, &path).map_err(io_error("rename into place", &path));
        if renamed.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        renamed?;
        Ok(sut)
    }

    /// Opens and maps an existing ledger, checking its header and length.
    pub fn open(path: impl AsRef<Path>) -> Result<Ledger, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |operation: &'static str| {
            let path = path.clone();
            move |source| LedgerError::Io {
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
        let len = file.metadata().map_err(io_error("stat"))?.len();
        let invalid = |reason: String| LedgerError::Invalid {
            path: path.clone(),
            reason,
        };
        if len < file_len(0) {
            return Err(invalid(format!(
                "file is {len} bytes, shorter than the {}-byte header",
                file_len(0)
            )));
        }
        let mapping = map(&file).map_err(io_error("mmap"))?;
        let sut = Ledger {
            memory: Memory::Mapped(mapping),
            path: path.clone(),
            slots: 0,
        };
        let magic = sut.word(0).load(Ordering::Relaxed);
        if magic != LEDGER_MAGIC {
            return Err(invalid(format!(
                "bad magic {magic:#018x} (expected {LEDGER_MAGIC:#018x}): not a sluice ledger"
            )));
        }
        let word = sut.word(1).load(Ordering::Relaxed);
        let version = word as u32;
        if !(OLDEST_LEDGER_VERSION..=LEDGER_VERSION).contains(&version) {
            return Err(invalid(format!(
                "layout version {version}, this build reads versions {OLDEST_LEDGER_VERSION} to {LEDGER_VERSION}: use a sluice build of the same version"
            )));
        }
        let slots = (word >> 32) as usize;
        if len != file_len(slots) {
            return Err(invalid(format!(
                "file is {len} bytes, {slots} slots need {}: the file is truncated or corrupt",
                file_len(slots)
            )));
        }
        Ok(Ledger { slots, ..sut })
    }

    /// Creates a ledger with `slots` slots in this process's heap, for tests and for tools (Miri) that
    /// cannot map files.
    pub fn in_memory(slots: u32, owner: u64) -> Ledger {
        let words = (0..HEADER_WORDS + slots as usize * WORDS_PER_SLOT)
            .map(|_| AtomicU64::new(0))
            .collect();
        let sut = Ledger {
            memory: Memory::Heap(words),
            path: PathBuf::from("<in-memory>"),
            slots: slots as usize,
        };
        sut.initialise(owner);
        sut
    }

    /// The path of the ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The node whose producers keep this ledger.
    pub fn owner(&self) -> u64 {
        self.word(3).load(Ordering::Relaxed)
    }

    /// Binds a task to the ring, before any record of it is committed, its records counting from
    /// stream position `from` (where the ring's stream stands: see the [module
    /// documentation](self)). Fails when every slot is bound or the task is bound already.
    pub fn bind(&self, task: &LedgerTask, from: u64) -> Result<(), LedgerError> {
        if self.find(task.task_id).is_some() {
            return Err(LedgerError::AlreadyBound {
                path: self.path.clone(),
                task_id: task.task_id,
            });
        }
        let slot = (0..self.slots)
            .find(|slot| self.slot_word(*slot, 0).load(Ordering::Acquire) == STATE_FREE)
            .ok_or_else(|| LedgerError::Full {
                path: self.path.clone(),
                slots: self.slots as u32,
            })?;
        let values = [
            task.task_id,
            u64::from(task.epoch),
            task.start,
            task.end,
            task.consumed_end,
            task.enqueued_end,
            from,
        ];
        for (index, value) in values.into_iter().enumerate() {
            self.slot_word(slot, index + 1)
                .store(value, Ordering::Relaxed);
        }
        // Release pairs with the Acquire loads of the state in `find` and `tasks`: a bound slot's
        // fields are written before it is seen bound.
        self.slot_word(slot, 0)
            .store(STATE_BOUND, Ordering::Release);
        Ok(())
    }

    /// Moves a bound task's end (a stop); returns whether the task is bound.
    pub fn set_end(&self, task_id: u64, end: u64) -> bool {
        self.find(task_id).is_some_and(|slot| {
            self.slot_word(slot, 4).store(end, Ordering::Relaxed);
            true
        })
    }

    /// Frees a task's slot; returns whether the task was bound.
    pub fn free(&self, task_id: u64) -> bool {
        self.find(task_id).is_some_and(|slot| {
            // Release: a later binding of the slot comes after every use of the freed task's fields.
            self.slot_word(slot, 0).store(STATE_FREE, Ordering::Release);
            true
        })
    }

    /// Records that the AM fenced the node: the ring owes its trainer the fence's error record, and
    /// the tasks bound to it are void. Set before the slots are cleared, so that a producer that
    /// dies in between leaves the record owed.
    pub fn owe_fence(&self) {
        self.word(5).store(1, Ordering::Release);
    }

    /// Whether the ring owes its trainer a fence's error record: the next record written must be
    /// it (see [`Ledger::owe_fence`]).
    pub fn fence_owed(&self) -> bool {
        self.word(5).load(Ordering::Acquire) != 0
    }

    /// Records that the fence's error record is in the ring.
    pub fn fence_written(&self) {
        self.word(5).store(0, Ordering::Release);
    }

    /// Frees every slot.
    pub fn clear(&self) {
        for slot in 0..self.slots {
            self.slot_word(slot, 0).store(STATE_FREE, Ordering::Release);
        }
    }

    /// Takes in the record at stream position `position` that the producer folds: raises its task's
    /// consumed and enqueued ends, and records it as the last folded mark. The body of a producer's
    /// fold hook.
    ///
    /// A batch of a task that is not bound, or of an earlier binding of its task id (below the
    /// position the binding counts from), changes no slot: it is a void record of a fenced node.
    /// Dropped rows count as a batch's do: the reader took them, and nobody is to read them again.
    pub fn fold(&self, meta: RecordMeta, position: u64) {
        if let Some(mark) = self.mark_of(meta, position) {
            self.word(2).store(mark.word(), Ordering::Relaxed);
        }
        if meta.tag != 0 {
            self.word(4).fetch_max(meta.tag, Ordering::Relaxed);
        }
        if matches!(meta.kind, RecordKind::Batch | RecordKind::Dropped)
            && let Some(slot) = self.binding_of(meta.task_id, position)
        {
            let end = meta.first_row.saturating_add(meta.row_count);
            self.slot_word(slot, 6).fetch_max(end, Ordering::Relaxed);
            self.slot_word(slot, 5).fetch_max(end, Ordering::Relaxed);
        }
    }

    /// Raises a bound task's enqueued end to `end`, the end of its published record at stream
    /// position `position`, if that record is the binding's.
    pub fn record_enqueued(&self, task_id: u64, end: u64, position: u64) {
        if let Some(slot) = self.binding_of(task_id, position) {
            self.slot_word(slot, 6).fetch_max(end, Ordering::Relaxed);
        }
    }

    /// The mark the record at stream position `position` sets, if it is a batch of rows of a bound
    /// task's binding or an end of epoch. A batch of no rows (a pad batch) belongs to no task, and
    /// dropped rows, written only right before an end of epoch, mark nothing.
    pub fn mark_of(&self, meta: RecordMeta, position: u64) -> Option<EpochMark> {
        match meta.kind {
            RecordKind::Batch if meta.row_count == 0 => None,
            RecordKind::Batch => {
                let slot = self.binding_of(meta.task_id, position)?;
                let epoch = self.slot_word(slot, 2).load(Ordering::Relaxed);
                Some(EpochMark::Batch {
                    epoch: u32::try_from(epoch).ok()?,
                })
            }
            RecordKind::EndOfEpoch => Some(EpochMark::EndOfEpoch),
            RecordKind::Schema | RecordKind::Error | RecordKind::Dropped => None,
        }
    }

    /// The largest tag of a record folded, 0 when none had one. Folding raises it with `fetch_max`,
    /// so a record folded twice changes nothing.
    pub fn largest_tag(&self) -> u64 {
        self.word(4).load(Ordering::Relaxed)
    }

    /// The mark of the last batch or end of epoch folded.
    pub fn last_folded(&self) -> Result<EpochMark, LedgerError> {
        let word = self.word(2).load(Ordering::Relaxed);
        EpochMark::of_word(word).ok_or_else(|| LedgerError::Invalid {
            path: self.path.clone(),
            reason: format!("unknown epoch mark {word:#018x}"),
        })
    }

    /// The bound task `task_id`, if it is bound and its slot is consistent.
    pub fn task(&self, task_id: u64) -> Option<LedgerTask> {
        self.find(task_id)
            .and_then(|slot| self.read_slot(slot).ok().flatten())
    }

    /// Every bound task, checked: each slot's state is free or bound, and a bound one has its consumed
    /// and enqueued ends within `[start, end]` and an epoch that fits 32 bits; no task is bound twice.
    /// The enqueued end returned is at least the consumed end.
    pub fn tasks(&self) -> Result<Vec<LedgerTask>, LedgerError> {
        let mut tasks = Vec::new();
        for slot in 0..self.slots {
            if let Some(task) = self.read_slot(slot)? {
                if tasks
                    .iter()
                    .any(|seen: &LedgerTask| seen.task_id == task.task_id)
                {
                    return Err(
                        self.invalid(format!("task {} is bound in two slots", task.task_id))
                    );
                }
                tasks.push(task);
            }
        }
        Ok(tasks)
    }

    fn read_slot(&self, slot: usize) -> Result<Option<LedgerTask>, LedgerError> {
        // Acquire pairs with the Release store in `bind`.
        match self.slot_word(slot, 0).load(Ordering::Acquire) {
            STATE_FREE => return Ok(None),
            STATE_BOUND => {}
            state => return Err(self.invalid(format!("slot {slot} has unknown state {state}"))),
        }
        let word = |index| self.slot_word(slot, index).load(Ordering::Relaxed);
        let epoch = word(2);
        let task = LedgerTask {
            task_id: word(1),
            epoch: u32::try_from(epoch)
                .map_err(|_| self.invalid(format!("slot {slot} has epoch {epoch}")))?,
            start: word(3),
            end: word(4),
            consumed_end: word(5),
            enqueued_end: word(6),
        };
        let within = |row: u64| task.start <= row && row <= task.end;
        if !within(task.consumed_end) || !within(task.enqueued_end) {
            return Err(self.invalid(format!(
                "slot {slot} (task {}) has start {}, consumed end {}, enqueued end {}, end {}",
                task.task_id, task.start, task.consumed_end, task.enqueued_end, task.end
            )));
        }
        // The two ends are raised one after the other; a reader on another thread may see the
        // consumed end raised first.
        Ok(Some(LedgerTask {
            enqueued_end: task.enqueued_end.max(task.consumed_end),
            ..task
        }))
    }

    fn find(&self, task_id: u64) -> Option<usize> {
        (0..self.slots).find(|slot| {
            // Acquire pairs with the Release store in `bind`.
            self.slot_word(*slot, 0).load(Ordering::Acquire) == STATE_BOUND
                && self.slot_word(*slot, 1).load(Ordering::Relaxed) == task_id
        })
    }

    /// The slot of the binding of `task_id` that the record at stream position `position` belongs
    /// to: the task is bound, and the record lies at or past where the binding counts from.
    fn binding_of(&self, task_id: u64, position: u64) -> Option<usize> {
        self.find(task_id)
            .filter(|slot| position >= self.slot_word(*slot, 7).load(Ordering::Relaxed))
    }

    fn invalid(&self, reason: String) -> LedgerError {
        LedgerError::Invalid {
            path: self.path.clone(),
            reason,
        }
    }

    fn initialise(&self, owner: u64) {
        self.word(0).store(LEDGER_MAGIC, Ordering::Relaxed);
        self.word(3).store(owner, Ordering::Relaxed);
        self.word(1).store(
            u64::from(LEDGER_VERSION) | (self.slots as u64) << 32,
            Ordering::Relaxed,
        );
    }

    fn words(&self) -> &[AtomicU64] {
        match &self.memory {
            Memory::Heap(words) => words,
            Memory::Mapped(mapping) => {
                // SAFETY: the mapping is page aligned, so aligned for AtomicU64, and lives as long as
                // `self`; `len / 8` words lie inside it. AtomicU64 is valid for any bits, and every
                // access goes through it, so other processes' writes are data races on atomics only.
                unsafe {
                    std::slice::from_raw_parts(
                        mapping.as_ptr().cast::<AtomicU64>(),
                        mapping.len() / 8,
                    )
                }
            }
        }
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        &self.words()[index]
    }

    fn slot_word(&self, slot: usize, index: usize) -> &AtomicU64 {
        debug_assert!(slot < self.slots && index < WORDS_PER_SLOT);
        &self.words()[HEADER_WORDS + slot * WORDS_PER_SLOT + index]
    }
}

fn file_len(slots: usize) -> u64 {
    ((HEADER_WORDS + slots * WORDS_PER_SLOT) * 8) as u64
}

fn map(file: &File) -> io::Result<memmap2::MmapRaw> {
    memmap2::MmapOptions::new().map_raw(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(task_id: u64, start: u64, end: u64) -> LedgerTask {
        LedgerTask {
            task_id,
            epoch: 2,
            start,
            end,
            consumed_end: start,
            enqueued_end: start,
        }
    }

    fn batch(task_id: u64, first_row: u64, row_count: u64) -> RecordMeta {
        RecordMeta {
            kind: RecordKind::Batch,
            task_id,
            first_row,
            row_count,
            tag: 0,
        }
    }

    /// A symlink planted at the temporary name a daemon of a known pid will use is removed, never
    /// followed: the file it points at keeps its bytes, and the ledger is private.
    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_symlink_planted_at_the_temporary_name_redirects_nothing() {
        use std::os::unix::fs::MetadataExt;
        let directory = tempfile::tempdir().expect("tempdir");
        let victim = directory.path().join("victim");
        std::fs::write(&victim, "precious").expect("write");
        let path = directory.path().join("0.ledger");
        let temporary = directory
            .path()
            .join(format!(".0.ledger.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &temporary).expect("plant");
        let sut = Ledger::create(&path, 3).expect("created");
        assert_eq!(sut.owner(), 3);
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "precious");
        let metadata = std::fs::symlink_metadata(&path).expect("stat");
        assert!(metadata.is_file());
        assert_eq!(metadata.mode() & 0o777, 0o600);
    }

    #[test]
    fn folding_raises_counts_once_and_marks_the_stream() {
        let sut = Ledger::in_memory(4, 0);
        assert_eq!(sut.last_folded().expect("mark"), EpochMark::Start);
        sut.bind(&task(7, 100, 200), 0).expect("bind");
        sut.bind(&task(0, 0, 50), 0)
            .expect("a task id of 0 binds too");
        sut.fold(batch(7, 100, 30), 0);
        sut.fold(batch(7, 130, 20), 0);
        sut.fold(batch(7, 130, 20), 0);
        sut.record_enqueued(7, 180, 0);
        let seven = sut.task(7).expect("bound");
        assert_eq!((seven.consumed_end, seven.enqueued_end), (150, 180));
        assert_eq!(
            sut.last_folded().expect("mark"),
            EpochMark::Batch { epoch: 2 }
        );
        assert_eq!(sut.largest_tag(), 0, "no record had a tag");
        sut.fold(batch(7, 150, 10).tagged(5), 0);
        sut.fold(batch(7, 150, 10).tagged(5), 0);
        sut.fold(RecordMeta::of_kind(RecordKind::EndOfEpoch).tagged(9), 0);
        sut.fold(RecordMeta::of_kind(RecordKind::Schema), 0);
        assert_eq!(
            sut.largest_tag(),
            9,
            "the largest tag, however often folded"
        );
        assert_eq!(sut.last_folded().expect("mark"), EpochMark::EndOfEpoch);
        sut.fold(batch(0, 0, 0).tagged(7), 0);
        assert_eq!(
            sut.last_folded().expect("mark"),
            EpochMark::EndOfEpoch,
            "a batch of no rows belongs to no task, task 0 bound or not"
        );
        assert_eq!(sut.task(0).expect("bound").consumed_end, 0);
        assert_eq!(sut.largest_tag(), 9);
        sut.fold(
            RecordMeta {
                kind: RecordKind::Dropped,
                ..batch(7, 160, 15)
            },
            0,
        );
        let seven = sut.task(7).expect("bound");
        assert_eq!(
            (seven.consumed_end, seven.enqueued_end),
            (175, 180),
            "dropped rows are taken as read"
        );
        assert_eq!(sut.last_folded().expect("mark"), EpochMark::EndOfEpoch);
        assert!(sut.set_end(7, 190));
        assert_eq!(sut.task(7).expect("bound").end, 190);
        assert!(sut.set_end(7, 160));
        assert_eq!(
            sut.task(7),
            None,
            "an end below the enqueued end is inconsistent"
        );
        assert!(sut.tasks().is_err());
        assert!(sut.set_end(7, 190));
        assert!(sut.free(7));
        assert!(!sut.free(7));
        assert_eq!(sut.tasks().expect("tasks"), vec![task(0, 0, 50)]);
    }

    #[test]
    fn records_of_an_earlier_binding_of_the_task_id_count_for_nothing() {
        // A fenced node's ring held rows 30..60 of task 7 beyond the AM's count of 30; the ledger
        // was emptied, and the AM handed task 7 back from row 30 once the stream stood at 4096.
        let sut = Ledger::in_memory(4, 0);
        sut.bind(&task(7, 30, 100), 4096).expect("bind");
        sut.fold(batch(7, 30, 30), 1024);
        sut.record_enqueued(7, 60, 2048);
        assert_eq!(sut.mark_of(batch(7, 30, 30), 1024), None);
        let seven = sut.task(7).expect("bound");
        assert_eq!(
            (seven.consumed_end, seven.enqueued_end),
            (30, 30),
            "the void records before the binding raise nothing"
        );
        assert_eq!(sut.last_folded().expect("mark"), EpochMark::Start);
        sut.record_enqueued(7, 40, 4096);
        sut.fold(batch(7, 30, 10), 4096);
        let seven = sut.task(7).expect("bound");
        assert_eq!((seven.consumed_end, seven.enqueued_end), (40, 40));
        assert_eq!(
            sut.last_folded().expect("mark"),
            EpochMark::Batch { epoch: 2 }
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_fence_owed_outlives_the_producer_that_owed_it() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ledger");
        let fenced = Ledger::create(&path, 2).expect("create");
        fenced.bind(&task(4, 0, 10), 0).expect("bind");
        assert!(!fenced.fence_owed());
        fenced.owe_fence();
        fenced.clear();
        drop(fenced);
        let successor = Ledger::open(&path).expect("open");
        assert!(successor.fence_owed(), "the record is owed until written");
        assert!(successor.tasks().expect("tasks").is_empty());
        successor.fence_written();
        assert!(!Ledger::open(&path).expect("open").fence_owed());
    }

    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_ledger_of_version_one_counts_every_record_of_a_binding() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("0.ledger");
        Ledger::create(&path, 0)
            .expect("create")
            .bind(&task(4, 0, 10), 0)
            .expect("bind");
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let sut = Ledger::open(&path).expect("version 1 is read");
        sut.fold(batch(4, 0, 5), 0);
        assert_eq!(sut.task(4).expect("bound").consumed_end, 5);
        assert!(!sut.fence_owed());
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let error = Ledger::open(&path).expect_err("a later version is refused");
        assert!(error.to_string().contains("versions 1 to 2"), "{error}");
    }

    #[test]
    fn binding_twice_or_past_the_slots_is_an_error() {
        let sut = Ledger::in_memory(2, 0);
        sut.bind(&task(1, 0, 10), 0).expect("bind");
        assert!(matches!(
            sut.bind(&task(1, 0, 10), 0),
            Err(LedgerError::AlreadyBound { task_id: 1, .. })
        ));
        sut.bind(&task(2, 0, 10), 0).expect("bind");
        let error = sut.bind(&task(3, 0, 10), 0).expect_err("full");
        assert!(error.to_string().contains("all 2 task slots"), "{error}");
        sut.clear();
        assert!(sut.tasks().expect("tasks").is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn a_ledger_file_survives_its_mapping() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = Ledger::path_beside(&directory.path().join("3.ring"));
        assert_eq!(path, directory.path().join("3.ledger"));
        let sut = Ledger::create(&path, 6).expect("create");
        sut.bind(&task(9, 10, 90), 0).expect("bind");
        sut.fold(batch(9, 10, 40), 0);
        drop(sut);
        let reopened = Ledger::open(&path).expect("open");
        assert_eq!(reopened.owner(), 6);
        let nine = reopened.task(9).expect("bound");
        assert_eq!((nine.start, nine.consumed_end, nine.end), (10, 50, 90));
        let fresh = Ledger::create(&path, 6).expect("create again");
        assert!(fresh.tasks().expect("tasks").is_empty(), "creation empties");
        assert_eq!(
            std::fs::read_dir(directory.path()).expect("list").count(),
            1,
            "no temporary file is left"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
    fn foreign_or_inconsistent_files_are_errors() {
        let directory = tempfile::tempdir().expect("tempdir");
        let short = directory.path().join("short.ledger");
        std::fs::write(&short, b"tiny").expect("write");
        let error = Ledger::open(&short).expect_err("short");
        assert!(error.to_string().contains("shorter"), "{error}");

        let path = directory.path().join("0.ledger");
        Ledger::create(&path, 0)
            .expect("create")
            .bind(&task(4, 0, 10), 0)
            .expect("bind");
        let mut bytes = std::fs::read(&path).expect("read");
        // Slot 0's consumed end (word 5 of the slot after the 8-word header) runs past the task's end.
        let consumed = (HEADER_WORDS + 5) * 8;
        bytes[consumed..consumed + 8].copy_from_slice(&99u64.to_le_bytes());
        std::fs::write(&path, &bytes).expect("write");
        let error = Ledger::open(&path)
            .expect("the header is fine")
            .tasks()
            .expect_err("the slot is not");
        assert!(error.to_string().contains("consumed end 99"), "{error}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes in a ledger file give a ledger or an error, and reading and folding into whatever
        /// it holds never panics.
        #[test]
        #[cfg_attr(miri, ignore = "maps a file, which Miri cannot")]
        fn any_file_bytes_are_rejected_or_read_safely(
            patch in proptest::collection::vec((0usize..1024, proptest::prelude::any::<u8>()), 0..32),
            keep_header in proptest::prelude::any::<bool>(),
            file_len in proptest::prelude::prop_oneof![proptest::strategy::Just(16448u64), 0u64..17000],
        ) {
            let directory = tempfile::tempdir().expect("tempdir");
            let path = directory.path().join("0.ledger");
            Ledger::create(&path, 0).expect("create").bind(&task(1, 0, 10), 0).expect("bind");
            let mut bytes = std::fs::read(&path).expect("read");
            for (offset, value) in patch {
                if keep_header && offset < 16 {
                    continue;
                }
                bytes[offset] = value;
            }
            bytes.resize(file_len as usize, 0);
            std::fs::write(&path, &bytes).expect("write");
            let Ok(sut) = Ledger::open(&path) else { return Ok(()); };
            let _ = sut.tasks();
            let _ = sut.last_folded();
            sut.fold(batch(1, 0, 5), 0);
            let _ = sut.bind(&task(2, 0, 10), 0);
        }
    }
}
