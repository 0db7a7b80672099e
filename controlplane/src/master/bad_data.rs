//! The rows the daemons skipped because they did not decode (`data.on_bad_data: skip | warn`), and
//! the budget that fails the job when they are too many (`data.max_bad_fraction`).
//!
//! A daemon reports a skip with the counts of its task, for as long as it reports the task; a task
//! read again (after a failure, a re-split, a restore, or each task of a shuffled split, which reads
//! the whole split) reports it again. A skip is therefore known by where it lies, the epoch, the
//! split and the split row it starts at, and is counted once.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Rows of one file that a daemon skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRange {
    /// The file.
    pub uri: String,
    /// The row group of a Parquet file.
    pub row_group: Option<u32>,
    /// The first split row skipped, in the file's order.
    pub first_row: u64,
    /// The number of split rows skipped.
    pub row_count: u64,
    /// Why the rows did not decode.
    pub cause: String,
}

impl BadRange {
    /// Where the range lies, for logs and errors: the file and the row group or the rows.
    pub fn place(&self) -> String {
        match self.row_group {
            Some(group) => format!("{} row group {group}", self.uri),
            None => format!(
                "{} rows [{}, {}) of its split",
                self.uri,
                self.first_row,
                self.first_row + self.row_count
            ),
        }
    }
}

/// Where a skip lies: the epoch, the split's index in the plan, and its first split row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SkipKey {
    /// The epoch.
    pub epoch: u32,
    /// The split.
    pub split: u32,
    /// The first split row skipped.
    pub first_row: u64,
}

/// Every skip of the job, in the order they were first reported; encoded as that list alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<(SkipKey, BadRange)>", into = "Vec<(SkipKey, BadRange)>")]
pub struct BadDataLog {
    skips: Vec<(SkipKey, BadRange)>,
    known: BTreeSet<SkipKey>,
    rows_per_epoch: BTreeMap<u32, u64>,
}

impl From<Vec<(SkipKey, BadRange)>> for BadDataLog {
    fn from(skips: Vec<(SkipKey, BadRange)>) -> Self {
        let mut log = BadDataLog::default();
        for (key, range) in skips {
            log.record(key, range);
        }
        log
    }
}

impl From<BadDataLog> for Vec<(SkipKey, BadRange)> {
    fn from(log: BadDataLog) -> Self {
        log.skips
    }
}

/// How many skips status lists, and how many of the files left out of the plan.
pub(super) const LISTED: usize = 100;

impl BadDataLog {
    /// Whether the skip at `key` is already recorded.
    pub fn knows(&self, key: &SkipKey) -> bool {
        self.known.contains(key)
    }

    /// Records a skip; one already recorded at `key` changes nothing. Returns the rows skipped in
    /// the epoch of `key` so far.
    pub fn record(&mut self, key: SkipKey, range: BadRange) -> u64 {
        if self.known.insert(key) {
            let rows = self.rows_per_epoch.entry(key.epoch).or_default();
            *rows = rows.saturating_add(range.row_count);
            self.skips.push((key, range));
        }
        self.rows_per_epoch.get(&key.epoch).copied().unwrap_or(0)
    }

    /// The rows skipped in every epoch.
    pub fn rows(&self) -> u64 {
        self.rows_per_epoch
            .values()
            .fold(0, |total, rows| total.saturating_add(*rows))
    }

    /// The number of skips in every epoch.
    pub fn len(&self) -> usize {
        self.skips.len()
    }

    /// The last skips, the most recent last, at most [`LISTED`].
    pub fn recent(&self) -> impl Iterator<Item = &(SkipKey, BadRange)> {
        self.skips[self.skips.len().saturating_sub(LISTED)..].iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first_row: u64, row_count: u64) -> BadRange {
        BadRange {
            uri: "file:///data/part-0.parquet".into(),
            row_group: Some(2),
            first_row,
            row_count,
            cause: "invalid page header".into(),
        }
    }

    fn key(epoch: u32, split: u32, first_row: u64) -> SkipKey {
        SkipKey {
            epoch,
            split,
            first_row,
        }
    }

    #[test]
    fn a_skip_reported_again_counts_once_and_epochs_count_apart() {
        let mut log = BadDataLog::default();
        assert_eq!(log.record(key(0, 1, 500), range(500, 250)), 250);
        assert_eq!(log.record(key(0, 1, 500), range(500, 250)), 250);
        assert_eq!(log.record(key(0, 3, 0), range(0, 100)), 350);
        assert_eq!(log.record(key(1, 1, 500), range(500, 250)), 250);
        assert!(log.knows(&key(0, 3, 0)) && !log.knows(&key(1, 3, 0)));
        assert_eq!((log.len(), log.rows()), (3, 600));
        let firsts: Vec<u32> = log.recent().map(|(key, _)| key.split).collect();
        assert_eq!(firsts, [1, 3, 1]);
    }

    #[test]
    fn status_lists_the_last_hundred() {
        let mut log = BadDataLog::default();
        for row in 0..150 {
            log.record(key(0, 0, row), range(row, 1));
        }
        let listed: Vec<u64> = log.recent().map(|(key, _)| key.first_row).collect();
        assert_eq!(listed, (50..150).collect::<Vec<_>>());
    }
}
