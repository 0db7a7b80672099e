//! Equal batches per ring (`data.even_batches`): when an epoch's batch count is settled.
//!
//! Each daemon reports in every heartbeat the rows of each task it handed to its rings' writers,
//! and each ring's batch count in its last epochs, counted before those rows were read for the
//! report. An epoch is settled once nothing of it is pending and every task in flight was handed
//! to its end: no ring can get another batch of it (a stop asked of such a task is acknowledged at
//! its end and cuts nothing off). A past epoch's count is taken from the rings' reports of it:
//! their counts are final.
//!
//! With `pad`, the count is the most batches any ring was handed, and every ring pads up to it
//! before its end of epoch.
//!
//! With `drop`, it is the fewest, and every ring's batches past it are dropped. Until then each
//! ring writes only the batches every ring will have, and holds the others: the fewest any ring
//! was handed so far (*allowed*), told once every ring of the job has reported, since a count only
//! grows. A daemon started again after a crash has lost the batches it held, its ring counts fewer
//! than were allowed, and the other rings may have written up to that: the settled count is never
//! below what was allowed, and such a ring pads up to it.
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
#[derive(Debug)]
pub(super) struct EvenBatches {
    /// Whether rings drop their batches past the fewest (`drop`) rather than pad up to the most.
    drop: bool,
    /// The rings of the job, once all report: with `drop`, what may be allowed waits for them.
    world: u32,
    /// Per node, the rows of each task it holds handed to its rings' writers.
    handed: BTreeMap<NodeId, BTreeMap<TaskId, u64>>,
    /// Per node, each ring's batches in its last epochs.
    counts: BTreeMap<NodeId, Vec<Vec<EpochBatches>>>,
    /// The settled count of each epoch.
    settled: BTreeMap<u32, u64>,
    /// With `drop`, the batches every ring may write in each epoch not settled, the most told.
    allowed: BTreeMap<u32, u64>,
}

impl EvenBatches {
    /// Nothing reported yet, for a job whose rings pad (`drop` false) or drop, `world` of them.
    pub(super) fn new(drop: bool, world: u32) -> EvenBatches {
        EvenBatches {
            drop,
            world,
            handed: BTreeMap::new(),
            counts: BTreeMap::new(),
            settled: BTreeMap::new(),
            allowed: BTreeMap::new(),
        }
    }

    /// Forgets every report and count, for rings of `world` after a scale or a restore.
    pub(super) fn reset(&mut self, world: u32) {
        *self = EvenBatches::new(self.drop, world);
    }

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
    /// all its rows are handed to rings; with `drop`, raises what the rings may write in the
    /// current epoch.
    pub(super) fn settle(&mut self, table: &JobState) {
        let current = table.epoch();
        let all_handed = table.pending_count() == 0
            && table.tasks_in_flight().all(|flight| {
                // A stop asked of a task handed to its end is acknowledged at its end: it cuts
                // nothing off.
                self.handed
                    .get(&flight.node)
                    .and_then(|handed| handed.get(&flight.task))
                    .is_some_and(|&rows| rows >= flight.span.end - flight.span.start)
            });
        let epochs: std::collections::BTreeSet<u32> = self
            .rings()
            .flatten()
            .map(|counted| counted.epoch)
            .collect();
        for epoch in epochs {
            let Some(count) = self.count(epoch) else {
                continue;
            };
            if epoch < current || (epoch == current && all_handed) {
                if self.drop {
                    let allowed = self.allowed.get(&epoch).copied().unwrap_or(0);
                    self.settled.entry(epoch).or_insert(count.max(allowed));
                } else {
                    let settled = self.settled.entry(epoch).or_default();
                    *settled = (*settled).max(count);
                }
            } else if self.drop && !self.settled.contains_key(&epoch) {
                let allowed = self.allowed.entry(epoch).or_default();
                *allowed = (*allowed).max(count);
            }
        }
    }

    /// Every ring reported, in no order.
    fn rings(&self) -> impl Iterator<Item = &Vec<EpochBatches>> {
        self.counts.values().flatten()
    }

    /// The count the rings' reports give `epoch`: with `pad`, the most any ring was handed; with
    /// `drop`, the fewest, over the rings still in the epoch or before it (a ring that moved past it
    /// ended it settled), and only once every ring of the job reported.
    fn count(&self, epoch: u32) -> Option<u64> {
        if !self.drop {
            return self
                .rings()
                .flatten()
                .filter(|counted| counted.epoch == epoch)
                .map(|counted| counted.batches)
                .max();
        }
        if self.rings().count() < self.world as usize {
            return None;
        }
        self.rings()
            .filter_map(
                |ring| match ring.iter().find(|counted| counted.epoch == epoch) {
                    Some(counted) => Some(counted.batches),
                    None if ring.iter().all(|counted| counted.epoch < epoch) => Some(0),
                    None => None,
                },
            )
            .min()
    }

    /// With `drop`, what the rings may write in the epochs not settled yet, from `current` on.
    pub(super) fn allowed_from(&self, current: u32) -> Vec<(u32, u64)> {
        self.allowed
            .range(current.saturating_sub(1)..)
            .filter(|(epoch, _)| !self.settled.contains_key(epoch))
            .map(|(epoch, batches)| (*epoch, *batches))
            .collect()
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
