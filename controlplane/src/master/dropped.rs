//! The rows the rings left out of their epoch to keep their batch counts equal
//! (`data.even_batches: drop`), and the tasks that come first in the next epoch because of them.
//!
//! A daemon reports dropped rows with the counts of their task, for as long as it reports the task.
//! A drop is known by where it lies, the epoch, the split and the split row it starts at, and is
//! counted once, as a skip of bad data is.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::bad_data::SkipKey;

/// Every drop of the job, in the order they were first reported; encoded as that list alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<(SkipKey, u64)>", into = "Vec<(SkipKey, u64)>")]
pub struct DroppedLog {
    drops: Vec<(SkipKey, u64)>,
    known: BTreeSet<SkipKey>,
    rows: u64,
}

impl From<Vec<(SkipKey, u64)>> for DroppedLog {
    fn from(drops: Vec<(SkipKey, u64)>) -> Self {
        let mut log = DroppedLog::default();
        for (key, rows) in drops {
            log.record(key, rows);
        }
        log
    }
}

impl From<DroppedLog> for Vec<(SkipKey, u64)> {
    fn from(log: DroppedLog) -> Self {
        log.drops
    }
}

impl DroppedLog {
    /// Whether the drop at `key` is already recorded.
    pub fn knows(&self, key: &SkipKey) -> bool {
        self.known.contains(key)
    }

    /// Records `rows` dropped at `key`; one already recorded there changes nothing.
    pub fn record(&mut self, key: SkipKey, rows: u64) {
        if self.known.insert(key) {
            self.rows = self.rows.saturating_add(rows);
            self.drops.push((key, rows));
        }
    }

    /// The rows dropped in every epoch.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The drops of `epoch`: where each lies, and its rows.
    pub fn of_epoch(&self, epoch: u32) -> impl Iterator<Item = &(SkipKey, u64)> {
        self.drops.iter().filter(move |(key, _)| key.epoch == epoch)
    }

    /// The last drops, the most recent last, at most [`super::bad_data::LISTED`].
    pub fn recent(&self) -> impl Iterator<Item = &(SkipKey, u64)> {
        let listed = super::bad_data::LISTED;
        self.drops[self.drops.len().saturating_sub(listed)..].iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(epoch: u32, split: u32, first_row: u64) -> SkipKey {
        SkipKey {
            epoch,
            split,
            first_row,
        }
    }

    #[test]
    fn a_drop_reported_again_counts_once_and_each_epoch_knows_its_own() {
        let mut sut = DroppedLog::default();
        sut.record(key(0, 4, 100), 50);
        sut.record(key(0, 4, 100), 50);
        sut.record(key(0, 2, 0), 30);
        sut.record(key(1, 7, 10), 5);
        assert_eq!(sut.rows(), 85);
        assert!(sut.knows(&key(0, 2, 0)) && !sut.knows(&key(1, 2, 0)));
        let of_first: Vec<(u32, u64)> = sut
            .of_epoch(0)
            .map(|(key, rows)| (key.split, *rows))
            .collect();
        assert_eq!(of_first, [(4, 50), (2, 30)]);
        assert_eq!(sut.of_epoch(2).count(), 0);
        let encoded = postcard::to_allocvec(&sut).expect("encodes");
        let decoded: DroppedLog = postcard::from_bytes(&encoded).expect("decodes");
        assert_eq!(decoded, sut, "the list alone rebuilds the log");
        let listed: Vec<u64> = sut.recent().map(|(_, rows)| *rows).collect();
        assert_eq!(listed, [50, 30, 5]);
    }
}
