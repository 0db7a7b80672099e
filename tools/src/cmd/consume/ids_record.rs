//! The ids file of `sluice consume --ids-out`, kept to exactly the batches the ring counts as
//! consumed, through a `kill -9` and a restart of the trainer.
//!
//! # Implementation
//!
//! The ids file (`FILE`) holds little-endian int64s and nothing else, so where each batch's ids end
//! is kept beside it, in `FILE.positions`: one entry per batch of seven little-endian u64s,
//! `[ring inode, ring creator's pid, ring creator's start ticks, end of the batch's record in the
//! ring's stream, ids in FILE after the batch, the batch's task, the row of its task it starts
//! at]` (the first entry, written at the start, holds no batch: its task and row are 0). The task
//! and row say which rows of the job the ids are, in the AM's terms: a task queued again from a
//! row is delivered again from that row on. A batch goes out in three steps: its ids are
//! appended to FILE, its entry to `FILE.positions`, and only then is it released, which publishes
//! the ring's read cursor past its record. A trainer killed at any point of them leaves:
//!
//! - ids past the count of the last entry: the batch was neither recorded whole nor released;
//! - an entry whose end lies past the ring's read cursor: recorded, not released;
//! - otherwise the batch recorded and released.
//!
//! Started again on the same FILE, the trainer takes the consumer role first: the read cursor then
//! stands where the dead trainer's releases stopped, and the next record it reads is the first one
//! not released. [`IdsRecord::open`] cuts both files back to the last entry the ring counts (one of
//! an earlier ring of the rank always counts; one of this ring when it ends at the read cursor or
//! before) and FILE to that entry's count. So FILE holds the ids of exactly the batches released
//! on the ring, which the daemon turns into the consumed counts the AM keeps; the batches cut come
//! again from the ring.
//!
//! What it cannot tell: a trainer killed whose ring is replaced before it is started again (a
//! scale or a restore racing the kill gives the ring back) finds its last entry on a ring that is
//! gone, and keeps it, counted or not. A scale or a restore that comes first stops the trainers
//! with SIGTERM, after which every entry counts.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sluice_ring::{PeerState, ProcessId, Ring};

/// Bytes of one id in FILE.
const ID_LEN: u64 = 8;
/// Bytes of one entry of `FILE.positions`.
const ENTRY_LEN: u64 = 56;

/// Which ring a batch came from: a ring replaced by a daemon is a new file, made by another
/// process or at another inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingIdentity {
    inode: u64,
    creator: Option<ProcessId>,
}

impl RingIdentity {
    /// The identity of `ring`.
    pub fn of(ring: &Ring) -> RingIdentity {
        let creator = match ring.creator_state() {
            PeerState::Alive(process) | PeerState::Dead(process) => Some(process),
            PeerState::Absent => None,
        };
        RingIdentity {
            inode: ring.inode(),
            creator,
        }
    }
}

/// One batch recorded: where its record ends in its ring, how many ids FILE holds after it, and
/// which rows of which task it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ring: RingIdentity,
    end: u64,
    ids: u64,
    rows: TaskRows,
}

/// Where a batch's rows lie in the job: its task, and the row of the task's row order it starts
/// at (the ring record's `task_id` and `first_row`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskRows {
    /// The task.
    pub task_id: u64,
    /// The row of the task the batch starts at.
    pub first_row: u64,
}

impl Entry {
    fn encode(&self) -> [u8; ENTRY_LEN as usize] {
        // A ring with no creator (one in the heap) is stored as pid 0, which no process has.
        let (pid, start_ticks) = self.ring.creator.map_or((0, 0), |process| {
            (u64::from(process.pid), process.start_ticks)
        });
        let mut bytes = [0; ENTRY_LEN as usize];
        for (field, value) in bytes.chunks_exact_mut(8).zip([
            self.ring.inode,
            pid,
            start_ticks,
            self.end,
            self.ids,
            self.rows.task_id,
            self.rows.first_row,
        ]) {
            field.copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    fn decode(bytes: &[u8; ENTRY_LEN as usize]) -> Entry {
        let mut fields = bytes
            .chunks_exact(8)
            .map(|field| u64::from_le_bytes(field.try_into().expect("entries hold 8-byte fields")));
        let mut next = || fields.next().expect("an entry holds seven fields");
        let (inode, pid, start_ticks, end, ids) = (next(), next(), next(), next(), next());
        let rows = TaskRows {
            task_id: next(),
            first_row: next(),
        };
        let creator = u32::try_from(pid)
            .ok()
            .filter(|pid| *pid != 0)
            .map(|pid| ProcessId { pid, start_ticks });
        Entry {
            ring: RingIdentity { inode, creator },
            end,
            ids,
            rows,
        }
    }
}

/// FILE and `FILE.positions`, open for appending batches.
#[derive(Debug)]
pub struct IdsRecord {
    ids: File,
    positions: File,
    ids_path: PathBuf,
    positions_path: PathBuf,
    ring: RingIdentity,
    /// Ids in FILE.
    count: u64,
    /// The ids of a batch, encoded before they go out in one write.
    scratch: Vec<u8>,
}

/// What [`IdsRecord::open`] found and cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reopened {
    /// Ids FILE holds, kept.
    pub kept: u64,
    /// Ids of batches the ring did not count as consumed, cut from FILE.
    pub cut: u64,
}

impl IdsRecord {
    /// The file beside `ids` that places each batch's ids in its ring.
    pub fn positions_path(ids: &Path) -> PathBuf {
        let mut name = ids.as_os_str().to_owned();
        name.push(".positions");
        PathBuf::from(name)
    }

    /// Opens FILE (`ids`) for a trainer reading `ring`, whose read cursor stands at `released`, and
    /// cuts FILE and `FILE.positions` back to the batches the ring counts (see the module's
    /// documentation). A FILE without `FILE.positions` (written by other means) is kept whole;
    /// a `FILE.positions` without FILE (FILE removed) is emptied.
    ///
    /// # Errors
    ///
    /// Fails when a file cannot be opened, read, cut or written, or when FILE holds fewer ids than
    /// `FILE.positions` says it does (the two files are not of one trainer).
    pub fn open(
        ids: &Path,
        ring: RingIdentity,
        released: u64,
    ) -> anyhow::Result<(IdsRecord, Reopened)> {
        let positions_path = IdsRecord::positions_path(ids);
        let ids_missing = matches!(
            std::fs::symlink_metadata(ids),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound
        );
        if ids_missing {
            // Emptied before FILE is made: a trainer killed in between finds FILE missing again.
            File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&positions_path)
                .with_context(|| {
                    format!(
                        "emptying {}, which placed the ids of a removed --ids-out",
                        positions_path.display()
                    )
                })?;
        }
        let open = |path: &Path| {
            File::options()
                .read(true)
                .append(true)
                .create(true)
                .open(path)
                .with_context(|| format!("opening --ids-out {}", path.display()))
        };
        let ids_file = open(ids)?;
        let positions = open(&positions_path)?;
        let length = |file: &File, path: &Path| {
            file.metadata()
                .map(|metadata| metadata.len())
                .with_context(|| format!("reading the size of {}", path.display()))
        };
        let ids_len = length(&ids_file, ids)?;
        let mut record = IdsRecord {
            ids: ids_file,
            positions,
            ids_path: ids.to_path_buf(),
            positions_path,
            ring,
            count: ids_len / ID_LEN,
            scratch: Vec::new(),
        };
        let entries = length(&record.positions, &record.positions_path)? / ENTRY_LEN;
        if entries == 0 {
            // No batch recorded yet: the ids FILE holds (if any) stand as they are, and an entry
            // says so, so that the ids of a batch written before its entry are cut later.
            record.cut(ids_len, record.count * ID_LEN, 0)?;
            let baseline = Entry {
                ring,
                end: released,
                ids: record.count,
                rows: TaskRows::default(),
            };
            record.append_entry(&baseline)?;
            let kept = record.count;
            return Ok((record, Reopened { kept, cut: 0 }));
        }
        let (kept_entries, last) = record.last_counted(entries, released)?;
        if last.ids > record.count {
            anyhow::bail!(
                "--ids-out {} holds {} ids, but {} records {} written; they are not the files of one trainer: remove both, or pass another --ids-out",
                record.ids_path.display(),
                record.count,
                record.positions_path.display(),
                last.ids
            );
        }
        let cut = record.count - last.ids;
        record.cut(ids_len, last.ids * ID_LEN, kept_entries * ENTRY_LEN)?;
        record.count = last.ids;
        Ok((
            record,
            Reopened {
                kept: last.ids,
                cut,
            },
        ))
    }

    /// The number of entries up to the last one the ring counts, and that entry.
    ///
    /// The first entry always counts: it was written at the read cursor of its ring, and a ring's
    /// read cursor only moves on. So none counting means the files were not written by trainers of
    /// this ring's rank, and that is an error.
    fn last_counted(&self, entries: u64, released: u64) -> anyhow::Result<(u64, Entry)> {
        let mut bytes = [0; ENTRY_LEN as usize];
        for index in (0..entries).rev() {
            self.positions
                .read_exact_at(&mut bytes, index * ENTRY_LEN)
                .with_context(|| format!("reading {}", self.positions_path.display()))?;
            let entry = Entry::decode(&bytes);
            if entry.ring != self.ring || entry.end <= released {
                return Ok((index + 1, entry));
            }
        }
        anyhow::bail!(
            "{} places every batch of --ids-out {} past the read cursor of its ring ({released}), which never moves back: the files are not of this ring's trainer; remove both, or pass another --ids-out",
            self.positions_path.display(),
            self.ids_path.display()
        )
    }

    /// Cuts FILE from `ids_len` bytes to `ids_to`, then `FILE.positions` to `positions_to` bytes:
    /// in that order, so that a trainer killed in between finds the same entries to cut again.
    fn cut(&mut self, ids_len: u64, ids_to: u64, positions_to: u64) -> anyhow::Result<()> {
        if ids_len != ids_to {
            self.ids
                .set_len(ids_to)
                .with_context(|| format!("cutting {}", self.ids_path.display()))?;
        }
        self.positions
            .set_len(positions_to)
            .with_context(|| format!("cutting {}", self.positions_path.display()))
    }

    fn append_entry(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.positions
            .write_all(&entry.encode())
            .with_context(|| format!("writing {}", self.positions_path.display()))
    }

    /// Records a batch's `ids`, the `rows` of a task whose record ends at `end` in the ring's
    /// stream: the ids, then the entry. The caller releases the batch only once this returned.
    ///
    /// # Errors
    ///
    /// Fails when a write fails (a full disk): the batch is then not recorded whole, and must not
    /// be released.
    pub fn record(
        &mut self,
        ids: impl Iterator<Item = i64>,
        end: u64,
        rows: TaskRows,
    ) -> anyhow::Result<()> {
        self.scratch.clear();
        for id in ids {
            self.scratch.extend_from_slice(&id.to_le_bytes());
        }
        self.ids
            .write_all(&self.scratch)
            .with_context(|| format!("writing --ids-out {}", self.ids_path.display()))?;
        self.count += self.scratch.len() as u64 / ID_LEN;
        let entry = Entry {
            ring: self.ring,
            end,
            ids: self.count,
            rows,
        };
        self.append_entry(&entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING: RingIdentity = RingIdentity {
        inode: 7,
        creator: Some(ProcessId {
            pid: 4242,
            start_ticks: 99,
        }),
    };
    /// The rows of the batches the tests record, which the files keep but do not read.
    const ROWS: TaskRows = TaskRows {
        task_id: 3,
        first_row: 0,
    };
    /// The ring that replaced [`RING`]: another file of the same daemon.
    const NEXT_RING: RingIdentity = RingIdentity {
        inode: 8,
        creator: RING.creator,
    };

    fn ids_in(path: &Path) -> Vec<i64> {
        std::fs::read(path)
            .expect("ids file")
            .chunks_exact(8)
            .map(|id| i64::from_le_bytes(id.try_into().expect("8 bytes")))
            .collect()
    }

    fn append(path: &Path, bytes: &[u8]) {
        File::options()
            .append(true)
            .open(path)
            .expect("open")
            .write_all(bytes)
            .expect("append");
    }

    #[test]
    fn a_batch_recorded_but_not_released_is_cut_and_one_released_is_kept() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, reopened) = IdsRecord::open(&path, RING, 0).expect("open");
        assert_eq!(reopened, Reopened { kept: 0, cut: 0 });
        sut.record(0..3, 100, ROWS).expect("record");
        sut.record(3..6, 200, ROWS).expect("record");
        sut.record(6..9, 300, ROWS).expect("record");
        drop(sut);
        // Killed after recording the third batch, before its release was published.
        let (mut sut, reopened) = IdsRecord::open(&path, RING, 200).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 6, cut: 3 });
        assert_eq!(ids_in(&path), (0..6).collect::<Vec<_>>());
        // The ring hands the third batch out again.
        sut.record(6..9, 300, ROWS).expect("record");
        drop(sut);
        let (_, reopened) = IdsRecord::open(&path, RING, 300).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 9, cut: 0 });
        assert_eq!(ids_in(&path), (0..9).collect::<Vec<_>>());
    }

    #[test]
    fn ids_written_before_their_entry_are_cut_and_so_is_a_torn_id_or_entry() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, _) = IdsRecord::open(&path, RING, 0).expect("open");
        sut.record(0..2, 100, ROWS).expect("record");
        drop(sut);
        // Killed between the ids of the next batch and its entry, midway through both.
        append(&path, &[2, 0, 0, 0, 0, 0, 0, 0, 3, 0]);
        append(&IdsRecord::positions_path(&path), &[1, 2, 3]);
        let (_, reopened) = IdsRecord::open(&path, RING, 100).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 2, cut: 1 });
        assert_eq!(ids_in(&path), vec![0, 1]);
        assert_eq!(std::fs::metadata(&path).expect("stat").len(), 16);
        assert_eq!(
            std::fs::metadata(IdsRecord::positions_path(&path))
                .expect("stat")
                .len(),
            2 * ENTRY_LEN,
            "the baseline and one batch"
        );
    }

    #[test]
    fn batches_of_an_earlier_ring_count_whatever_the_new_rings_cursor() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, _) = IdsRecord::open(&path, RING, 0).expect("open");
        sut.record(0..2, 100, ROWS).expect("record");
        sut.record(2..4, 200, ROWS).expect("record");
        drop(sut);
        // A scale gave the ring back; the rank reads a new one from its start.
        let (mut sut, reopened) = IdsRecord::open(&path, NEXT_RING, 0).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 4, cut: 0 });
        sut.record(4..6, 64, ROWS).expect("record");
        drop(sut);
        let (_, reopened) = IdsRecord::open(&path, NEXT_RING, 0).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 4, cut: 2 });
        assert_eq!(ids_in(&path), (0..4).collect::<Vec<_>>());
    }

    #[test]
    fn a_file_written_without_positions_is_kept_whole() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        std::fs::write(&path, 41i64.to_le_bytes()).expect("write");
        let (mut sut, reopened) = IdsRecord::open(&path, RING, 500).expect("open");
        assert_eq!(reopened, Reopened { kept: 1, cut: 0 });
        sut.record(std::iter::once(42), 600, ROWS).expect("record");
        drop(sut);
        let (_, reopened) = IdsRecord::open(&path, RING, 500).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 1, cut: 1 });
        assert_eq!(ids_in(&path), vec![41]);
    }

    #[test]
    fn an_ids_file_removed_takes_its_positions_with_it() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, _) = IdsRecord::open(&path, RING, 0).expect("open");
        sut.record(0..4, 100, ROWS).expect("record");
        drop(sut);
        std::fs::remove_file(&path).expect("remove the ids file");
        let (mut sut, reopened) = IdsRecord::open(&path, NEXT_RING, 0).expect("a new run");
        assert_eq!(reopened, Reopened { kept: 0, cut: 0 });
        sut.record(10..12, 64, ROWS).expect("record");
        drop(sut);
        let (_, reopened) = IdsRecord::open(&path, NEXT_RING, 64).expect("reopen");
        assert_eq!(reopened, Reopened { kept: 2, cut: 0 });
        assert_eq!(ids_in(&path), vec![10, 11]);
    }

    #[test]
    fn files_that_are_not_of_one_trainer_are_refused_naming_both() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, _) = IdsRecord::open(&path, RING, 0).expect("open");
        sut.record(0..4, 100, ROWS).expect("record");
        drop(sut);
        std::fs::write(&path, []).expect("empty the ids file");
        let error = IdsRecord::open(&path, RING, 100)
            .expect_err("fewer ids than recorded")
            .to_string();
        assert!(
            error.contains("holds 0 ids") && error.contains("ids.bin.positions"),
            "{error}"
        );

        let other = directory.path().join("other.bin");
        let (sut, _) = IdsRecord::open(&other, RING, 300).expect("open");
        drop(sut);
        let error = IdsRecord::open(&other, RING, 200)
            .expect_err("a cursor behind the first entry")
            .to_string();
        assert!(error.contains("never moves back"), "{error}");
    }

    #[test]
    fn the_batches_are_read_back_with_their_task_and_row_through_kills() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let (mut sut, _) = IdsRecord::open(&path, RING, 0).expect("open");
        let rows = |task_id, first_row| TaskRows { task_id, first_row };
        sut.record(0..2, 100, rows(4, 0)).expect("record");
        sut.record(2..5, 200, rows(4, 2)).expect("record");
        drop(sut);
        // Killed before its release: the second batch is cut and read again.
        let (mut sut, _) = IdsRecord::open(&path, RING, 100).expect("reopen");
        sut.record(2..5, 200, rows(4, 2)).expect("record");
        sut.record(std::iter::once(9), 300, rows(7, 40))
            .expect("record");
        drop(sut);
        let batch = |task_id, first_row, ids: &[i64]| sluice_testkit::job::ReadBatch {
            task_id,
            first_row,
            ids: ids.to_vec(),
        };
        assert_eq!(
            sluice_testkit::job::read_batches(&path),
            vec![
                batch(4, 0, &[0, 1]),
                batch(4, 2, &[2, 3, 4]),
                batch(7, 40, &[9])
            ]
        );
    }

    #[test]
    fn an_entry_encodes_its_ring_with_or_without_a_creator() {
        for ring in [
            RING,
            RingIdentity {
                inode: 0,
                creator: None,
            },
        ] {
            let entry = Entry {
                ring,
                end: 1 << 40,
                ids: 12,
                rows: TaskRows {
                    task_id: 9,
                    first_row: 50_000,
                },
            };
            assert_eq!(Entry::decode(&entry.encode()), entry);
        }
    }
}
