//! Splits and the pure split-cutting rule of the planner.

use serde::{Deserialize, Serialize};

/// What a Delta split needs to be read exactly: the pinned table version and the file's deletion vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaSplitInfo {
    /// The table version the plan was made at.
    pub version: u64,
    /// The deletion vector of the file at that version, if any.
    pub deletion_vector: Option<DeletionVector>,
}

/// A Delta deletion vector descriptor, as stored in the table's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionVector {
    /// `u` (relative path), `p` (absolute path) or `i` (inline).
    pub storage_type: String,
    /// The encoded path or the inline bitmap.
    pub path_or_inline_dv: String,
    /// Byte offset of the bitmap in the file, for file-based vectors.
    pub offset: Option<i32>,
    /// Size of the serialized bitmap in bytes.
    pub size_in_bytes: i32,
    /// Number of deleted rows.
    pub cardinality: i64,
}

/// Where the rows of a split of a row format (CSV, JSON lines, TFRecord, Arrow IPC) lie in its file, found
/// once when the file was planned, so that a reader fetches these bytes and no others.
///
/// The bytes `[start, end)` hold whole records (or, for Arrow IPC, whole record batches): the file's rows
/// `[first_row, first_row + rows)`, which contain the split's rows. A CSV range never holds the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitBytes {
    /// The offset of the range's first byte.
    pub start: u64,
    /// The offset just past the range's last byte.
    pub end: u64,
    /// The file row the range starts with.
    pub first_row: u64,
    /// The number of rows the range holds.
    pub rows: u64,
    /// The CRC32C of the range's bytes, for the formats whose planning reads every byte (CSV, JSON lines,
    /// TFRecord); `None` for Arrow IPC, whose record batches are found again in the file's footer.
    pub crc32c: Option<u32>,
}

impl SplitBytes {
    /// The length of the range in bytes.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the range holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a plain data file was when it was planned, so that every read of its splits finds that very
/// object or fails naming it: a file overwritten after planning never hands out other rows than the
/// planned ones. Its size is the split's `file_size`.
///
/// On an object store, the entity tag pins the object: reads send it as `If-Match` and check the tag
/// of what they got; where the store gave a version, reads ask for that version. A local file is
/// pinned by its modification time to the nanosecond, besides the tag `object_store` makes of its
/// inode, modification time and size. An identity with none of these (the default) pins a file by
/// its size alone, as a Delta table's files are: the table's version pins the table, and its log
/// lists each file with its size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectIdentity {
    /// The entity tag the store listed the object with.
    pub e_tag: Option<String>,
    /// The object's version, on a store that keeps versions and gave it.
    pub version: Option<String>,
    /// The modification time of a local file, in nanoseconds since the Unix epoch.
    pub modified_ns: Option<i64>,
}

/// One task's worth of data: a row range of one file, with what is needed to read it exactly.
///
/// Row numbers count the file's physical rows, in file order. For a Delta file, rows removed by the deletion
/// vector lie inside the range but never come out of the reader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// A stable id: the position of the split in the plan, which is sorted by file and row.
    pub task_id: u64,
    /// The file's URI.
    pub uri: String,
    /// The file's size in bytes, so the reader needs no extra request.
    pub file_size: u64,
    /// The first row of the range, counted from the start of the file.
    pub first_row: u64,
    /// The number of rows in the range.
    pub row_count: u64,
    /// Hive or Delta partition values of the file: column name and value as text (`None` for null).
    pub partition_values: Vec<(String, Option<String>)>,
    /// Set for splits of a Delta table.
    pub delta: Option<DeltaSplitInfo>,
    /// Where the rows lie in the file, for row formats planned with an index of their records; without
    /// it, a row format's split reads its whole file.
    #[serde(default)]
    pub bytes: Option<SplitBytes>,
    /// What the file was when it was planned, which every read of the split must find again; `None`
    /// for a file read as it is.
    #[serde(default)]
    pub identity: Option<ObjectIdentity>,
}

/// The most splits a plan makes. An epoch of a job holds at most 50,000,000 tasks (the AM's bound)
/// and every split is at least one task, so a larger plan could never run; the splits are counted
/// ([`cut_count`]) before any is made, so that a footer claiming more rows than any file holds
/// costs no memory.
pub const MAX_PLAN_SPLITS: u64 = 50_000_000;

/// A piece of a file chosen by [`cut`]: `(file index, first row, row count)`.
pub type Cut = (usize, u64, u64);

/// Cuts files, each given as its row-group sizes, into pieces of at most `task_rows` rows.
///
/// Whole row groups are packed together while they fit; a row group larger than `task_rows` is split into
/// near-equal row ranges. Pieces never cross files, are never empty, come in file then row order, and cover
/// every row exactly once.
pub fn cut(files: &[Vec<u64>], task_rows: u64) -> Vec<Cut> {
    let task_rows = task_rows.max(1);
    let mut pieces = Vec::new();
    for (file, groups) in files.iter().enumerate() {
        let mut pending_start = 0u64;
        let mut pending_rows = 0u64;
        for &group in groups {
            if group == 0 {
                continue;
            }
            if pending_rows > 0 && pending_rows + group > task_rows {
                pieces.push((file, pending_start, pending_rows));
                pending_start += pending_rows;
                pending_rows = 0;
            }
            if group > task_rows {
                let parts = group.div_ceil(task_rows);
                let base = group / parts;
                let extra = group % parts;
                for part in 0..parts {
                    let rows = base + u64::from(part < extra);
                    pieces.push((file, pending_start, rows));
                    pending_start += rows;
                }
            } else {
                pending_rows += group;
            }
        }
        if pending_rows > 0 {
            pieces.push((file, pending_start, pending_rows));
        }
    }
    pieces
}

/// The number of pieces [`cut`] makes of `files`, counted without making them (saturating at
/// `u64::MAX`), in time linear in the number of row groups whatever their row counts.
pub fn cut_count(files: &[Vec<u64>], task_rows: u64) -> u64 {
    let task_rows = task_rows.max(1);
    let mut count = 0u64;
    for groups in files {
        let mut pending_rows = 0u64;
        for &group in groups {
            if group == 0 {
                continue;
            }
            if pending_rows > 0 && pending_rows.saturating_add(group) > task_rows {
                count = count.saturating_add(1);
                pending_rows = 0;
            }
            if group > task_rows {
                count = count.saturating_add(group.div_ceil(task_rows));
            } else {
                pending_rows += group;
            }
        }
        if pending_rows > 0 {
            count = count.saturating_add(1);
        }
    }
    count
}

/// Refuses to cut `files` into more than [`MAX_PLAN_SPLITS`] pieces, naming the file `name_of`
/// gives for the index of the one that claims the most rows, before any piece is made.
///
/// # Errors
///
/// Returns [`FormatError::PlanTooLarge`](crate::FormatError::PlanTooLarge) with the `task_rows`
/// that fits.
pub(crate) fn check_cut(
    files: &[Vec<u64>],
    task_rows: u64,
    name_of: impl Fn(usize) -> String,
) -> crate::Result<()> {
    let splits = cut_count(files, task_rows);
    if splits <= MAX_PLAN_SPLITS {
        return Ok(());
    }
    let rows_of = |groups: &Vec<u64>| {
        groups
            .iter()
            .fold(0u64, |total, rows| total.saturating_add(*rows))
    };
    let total_rows = files
        .iter()
        .fold(0u64, |total, groups| total.saturating_add(rows_of(groups)));
    let (largest, largest_rows) = files
        .iter()
        .enumerate()
        .map(|(index, groups)| (index, rows_of(groups)))
        .max_by_key(|(_, rows)| *rows)
        .unwrap_or((0, 0));
    Err(crate::FormatError::PlanTooLarge {
        splits,
        task_rows,
        fitting_task_rows: total_rows
            .div_ceil(MAX_PLAN_SPLITS / 2)
            .max(task_rows.saturating_add(1)),
        largest: name_of(largest),
        largest_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_whole_row_groups_and_splits_big_ones() {
        let sut = cut(&[vec![3, 3, 3], vec![10], vec![], vec![0, 4]], 6);
        assert_eq!(
            sut,
            vec![(0, 0, 6), (0, 6, 3), (1, 0, 5), (1, 5, 5), (3, 0, 4)]
        );
    }

    #[test]
    fn a_plan_of_more_splits_than_a_job_runs_is_refused_before_any_is_made() {
        let claimed = vec![vec![250, 1 << 62, 250], vec![1000]];
        assert_eq!(
            cut_count(&claimed, 1000),
            1 + (1u64 << 62).div_ceil(1000) + 1 + 1
        );
        let error = check_cut(&claimed, 1000, |index| format!("file-{index}"))
            .expect_err("refused")
            .to_string();
        assert!(
            error.contains("file-0 claims the most rows (4611686018427388404)")
                && error.contains("about 184467440738"),
            "{error}"
        );
        assert!(check_cut(&claimed, 1 << 40, |index| format!("file-{index}")).is_ok());
    }

    proptest! {
        #[test]
        fn every_row_is_covered_exactly_once(
            files in prop::collection::vec(prop::collection::vec(0u64..500, 0..6), 0..6),
            task_rows in 1u64..700,
        ) {
            let sut = cut(&files, task_rows);
            prop_assert_eq!(cut_count(&files, task_rows), sut.len() as u64, "the count is the cut's");
            let mut next_row = vec![0u64; files.len()];
            let mut previous_file = 0usize;
            for &(file, first_row, row_count) in &sut {
                prop_assert!(row_count > 0 && row_count <= task_rows);
                prop_assert!(file >= previous_file, "pieces are in file order");
                prop_assert_eq!(first_row, next_row[file], "pieces are contiguous and do not overlap");
                next_row[file] += row_count;
                previous_file = file;
            }
            for (file, groups) in files.iter().enumerate() {
                prop_assert_eq!(next_row[file], groups.iter().sum::<u64>(), "file {} fully covered", file);
            }
        }
    }
}
