//! Equal batches per ring (`data.even_batches`): when an epoch's batch count is settled.
//!
//! Each daemon reports in every heartbeat the rows of each task it handed to its rings' writers,
//! and each ring's batch count in its last epochs, counted before those rows were read for the
//! report. An epoch is settled once nothing of it is pending and every task in flight was handed
//! to its end: no ring can get another batch of it (a stop asked of such a task is acknowledged at
//! its end and cuts nothing off). Its count is then the most batches any ring was handed, and every
//! ring pads up to it before its end of epoch. A past epoch's count is the most any ring reports
//! for it: its rings' counts are final.
//!
//! A scale or a restore replaces the rings, and the trainers start again from their checkpoint:
//! everything here is forgotten, the reports of the rings being given back are not taken, and the
//! new rings count the epoch from the new start.
//!
//! Nothing here is journaled. The daemons report again in every heartbeat what a new AM needs, and
//! a count only grows: a node lost after a settle has its tasks queued again, their batches raise
//! the count, and the rings pad further (rings end an epoch only once its rows are all consumed).

use super::calls::EpochBatches;
use crate::decide::{JobState, NodeId, TaskId};
use std::collections::BTreeMap;

/// What the daemons last reported, and the counts settled from it.
#[derive(Debug, Default)]
pub(super) struct EvenBatches {
    /// Per node, the rows of each task it holds handed to its rings' writers.
    handed: BTreeMap<NodeId, BTreeMap<TaskId, u64>>,
    /// Per node, each ring's batches in its last epochs.
    counts: BTreeMap<NodeId, Vec<Vec<EpochBatches>>>,
    /// The settled count of each epoch.
    settled: BTreeMap<u32, u64>,
}

impl EvenBatches {
    /// Takes a node's heartbeat: its tasks' handed rows and its rings' counts.
    pub(super) fn report(
        &mut self,
        node: NodeId,
        handed: BTreeMap<TaskId, u64>,
        rings: Vec<Vec<EpochBatches>>,
    ) {
        self.handed.insert(node, handed);
        self.counts.insert(node, rings);
    }

    /// Settles what the reports allow: every past epoch a ring reports, and the current epoch once
    /// all its rows are handed to rings.
    pub(super) fn settle(&mut self, table: &JobState) {
        let current = table.epoch();
        let mut most: BTreeMap<u32, u64> = BTreeMap::new();
        for ring in self.counts.values().flatten() {
            for counted in ring {
                let batches = most.entry(counted.epoch).or_default();
                *batches = (*batches).max(counted.batches);
            }
        }
        let all_handed = table.pending_count() == 0
            && table.tasks_in_flight().all(|flight| {
                // A stop asked of a task handed to its end is acknowledged at its end: it cuts
                // nothing off.
                self.handed
                    .get(&flight.node)
                    .and_then(|handed| handed.get(&flight.task))
                    .is_some_and(|&rows| rows >= flight.span.end - flight.span.start)
            });
        for (epoch, batches) in most {
            if epoch < current || (epoch == current && all_handed) {
                let settled = self.settled.entry(epoch).or_default();
                *settled = (*settled).max(batches);
            }
        }
    }

    /// The settled counts `node` may still need: from the oldest epoch one of its rings is in (a
    /// ring that got no task for a while ends its epochs only when told their counts), or from the
    /// epoch before `current` for a ring that has counted nothing yet.
    pub(super) fn settled_for(&self, node: NodeId, current: u32) -> Vec<(u32, u64)> {
        let fresh = current.saturating_sub(1);
        let oldest = self
            .counts
            .get(&node)
            .into_iter()
            .flatten()
            .map(|ring| {
                ring.iter()
                    .map(|counted| counted.epoch)
                    .max()
                    .unwrap_or(fresh)
            })
            .min()
            .unwrap_or(fresh);
        self.settled
            .range(oldest..)
            .map(|(epoch, batches)| (*epoch, *batches))
            .collect()
    }
}
