//! The epochs of a job that mixes its sources by weight (`data.sources[].weight`).
//!
//! # Implementation
//! Each source's splits are cut into tasks of `task_rows` as an unmixed epoch cuts them. A pass over
//! a source hands out each of its tasks once, in an order seeded by `(seed, source, pass)`. An epoch
//! is drawn task by task: next comes the source whose rows drawn so far, with those of its next
//! task, are the smallest multiple of its weight (the rule of weighted fair queueing). The counts
//! run over the whole job, not per epoch, so after any prefix of the run each source is within one
//! task of its share of the rows drawn.
//!
//! When every task of a source's pass is drawn, the source starts its next pass: at once
//! (`next_pass`), or in the next epoch, which its running out ends (`end_epoch`). A pass goes on
//! across epochs: the tasks of a pass an epoch did not draw are drawn first in the next one. So an
//! epoch is a prefix of the draws that is fixed by the seed, the sources' splits and the weights,
//! and the plan of epoch `e` is found again by drawing the epochs before it.

use super::order::epoch_order;
use super::state::{MAX_EPOCH_TASKS, PlanError};

/// One source of a mix: its splits, its weight, and whether its running out ends an epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct MixedSource {
    /// The indices of the source's splits in the job's plan.
    pub splits: Vec<u32>,
    /// Its share of the rows, relative to the other sources' weights.
    pub weight: f64,
    /// Whether the epoch ends when its pass runs out (`end_epoch`), rather than the source
    /// starting its next pass at once (`next_pass`).
    pub ends_epoch: bool,
}

/// A task of a mixed epoch: a row range of one split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Drawn {
    pub(super) split: u32,
    pub(super) start: u64,
    pub(super) end: u64,
}

/// The sources of a mix with their tasks cut; the same for every epoch.
#[derive(Debug, PartialEq)]
pub(super) struct Mixer {
    sources: Vec<SourceTasks>,
}

#[derive(Debug, PartialEq)]
struct SourceTasks {
    tasks: Vec<Drawn>,
    weight: f64,
    ends_epoch: bool,
    /// The seed of the source's pass orders.
    seed: u64,
}

/// Where the draws stand between two epochs: per source, its pass, the tasks of the pass drawn,
/// and the rows drawn over the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MixCursor {
    sources: Vec<SourceCursor>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SourceCursor {
    pass: u32,
    next: u32,
    drawn: u64,
}

impl MixCursor {
    /// The rows drawn before the cursor, over every source.
    pub(super) fn rows_drawn(&self) -> u64 {
        self.sources.iter().map(|at| at.drawn).sum()
    }
}

impl Mixer {
    /// Cuts the sources' splits into tasks of `task_rows`; refused when a source has no rows, or a
    /// split is named that the plan does not have.
    pub(super) fn new(
        sources: &[MixedSource],
        split_rows: &[u64],
        task_rows: u64,
        seed: u64,
    ) -> Result<Mixer, PlanError> {
        let task_rows = task_rows.max(1);
        let mut cut = Vec::with_capacity(sources.len());
        for (index, source) in sources.iter().enumerate() {
            let mut tasks = Vec::new();
            for &split in &source.splits {
                let rows = split_rows
                    .get(split as usize)
                    .copied()
                    .ok_or(PlanError::MixedSplitUnknown { index, split })?;
                let mut start = 0;
                while start < rows {
                    let end = (start + task_rows).min(rows);
                    tasks.push(Drawn { split, start, end });
                    start = end;
                }
            }
            if tasks.is_empty() {
                return Err(PlanError::MixedSourceEmpty { index });
            }
            if tasks.len() as u64 > MAX_EPOCH_TASKS {
                return Err(PlanError::TooManyTasks {
                    tasks: tasks.len() as u64,
                    max: MAX_EPOCH_TASKS,
                    task_rows: task_rows * (tasks.len() as u64).div_ceil(MAX_EPOCH_TASKS),
                });
            }
            cut.push(SourceTasks {
                tasks,
                weight: source.weight,
                ends_epoch: source.ends_epoch,
                seed: seed ^ (index as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407),
            });
        }
        Ok(Mixer { sources: cut })
    }

    /// The cursor of the job's start: every source at the start of its first pass.
    pub(super) fn start(&self) -> MixCursor {
        MixCursor {
            sources: vec![
                SourceCursor {
                    pass: 0,
                    next: 0,
                    drawn: 0,
                };
                self.sources.len()
            ],
        }
    }

    /// The tasks of the epoch that begins at `cursor`, in the order they are handed out, and the
    /// cursor of the epoch after it. Refused when the epoch would have more tasks than a table may.
    pub(super) fn draw_epoch(
        &self,
        cursor: &MixCursor,
    ) -> Result<(Vec<Drawn>, MixCursor), PlanError> {
        let mut cursor = cursor.clone();
        let mut orders: Vec<Vec<u32>> = self
            .sources
            .iter()
            .zip(&cursor.sources)
            .map(|(source, at)| source.pass_order(at.pass))
            .collect();
        let mut drawn = Vec::new();
        loop {
            let index = self.next_source(&cursor, &orders);
            let source = &self.sources[index];
            let at = &mut cursor.sources[index];
            let task = source.tasks[orders[index][at.next as usize] as usize];
            drawn.push(task);
            at.drawn += task.end - task.start;
            at.next += 1;
            let ran_out = at.next as usize == source.tasks.len();
            if ran_out {
                at.pass += 1;
                at.next = 0;
                orders[index] = source.pass_order(at.pass);
            }
            if drawn.len() as u64 > MAX_EPOCH_TASKS {
                let rows: u64 = drawn.iter().map(|task| task.end - task.start).sum();
                return Err(PlanError::TooManyTasks {
                    tasks: drawn.len() as u64,
                    max: MAX_EPOCH_TASKS,
                    task_rows: rows.div_ceil(MAX_EPOCH_TASKS),
                });
            }
            if ran_out && source.ends_epoch {
                return Ok((drawn, cursor));
            }
        }
    }

    /// The cursor at the start of `epoch`, found by drawing the epochs before it.
    pub(super) fn cursor_at(&self, epoch: u32) -> Result<MixCursor, PlanError> {
        let mut cursor = self.start();
        for _ in 0..epoch {
            cursor = self.draw_epoch(&cursor)?.1;
        }
        Ok(cursor)
    }

    /// The source drawn next: the smallest rows drawn with its next task's, over its weight; the
    /// first such source on a tie. `orders` are the sources' current pass orders.
    fn next_source(&self, cursor: &MixCursor, orders: &[Vec<u32>]) -> usize {
        let finish = |index: usize| {
            let source = &self.sources[index];
            let at = cursor.sources[index];
            let next = source.tasks[orders[index][at.next as usize] as usize];
            (at.drawn + next.end - next.start) as f64 / source.weight
        };
        (1..self.sources.len()).fold(0, |best, index| {
            if finish(index) < finish(best) {
                index
            } else {
                best
            }
        })
    }
}

impl SourceTasks {
    fn pass_order(&self, pass: u32) -> Vec<u32> {
        epoch_order(self.tasks.len() as u32, self.seed, pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn source(splits: &[u32], weight: f64, ends_epoch: bool) -> MixedSource {
        MixedSource {
            splits: splits.to_vec(),
            weight,
            ends_epoch,
        }
    }

    /// Three sources of 3,000, 2,000 and 10,000 rows in tasks of 10 rows, at 0.5/0.3/0.2.
    fn three(ends: [bool; 3]) -> Mixer {
        let split_rows = [1_500, 1_500, 2_000, 10_000];
        let sources = [
            source(&[0, 1], 0.5, ends[0]),
            source(&[2], 0.3, ends[1]),
            source(&[3], 0.2, ends[2]),
        ];
        Mixer::new(&sources, &split_rows, 10, 7).expect("plans")
    }

    fn source_of(task: &Drawn) -> usize {
        match task.split {
            0 | 1 => 0,
            2 => 1,
            _ => 2,
        }
    }

    #[test]
    fn every_prefix_of_the_draws_is_within_one_task_of_the_shares() {
        let sut = three([true, true, true]);
        let mut cursor = sut.start();
        let mut rows = [0u64; 3];
        for _ in 0..6 {
            let (drawn, next) = sut.draw_epoch(&cursor).expect("draws");
            for task in &drawn {
                rows[source_of(task)] += task.end - task.start;
                let total: u64 = rows.iter().sum();
                for (index, share) in [0.5, 0.3, 0.2].into_iter().enumerate() {
                    let off = (rows[index] as f64 - share * total as f64).abs();
                    assert!(off <= 10.0, "source {index} is {off} rows off its share");
                }
            }
            cursor = next;
        }
    }

    #[test]
    fn the_source_that_runs_out_first_ends_the_epoch_and_the_others_go_on_where_they_were() {
        let sut = three([true, true, true]);
        // Source 0's 3,000 rows at 0.5 run out first, after 6,000 rows.
        let (first, cursor) = sut.draw_epoch(&sut.start()).expect("draws");
        let rows = |tasks: &[Drawn], index| -> u64 {
            tasks
                .iter()
                .filter(|task| source_of(task) == index)
                .map(|task| task.end - task.start)
                .sum()
        };
        assert_eq!(rows(&first, 0), 3_000);
        assert_eq!(source_of(first.last().expect("a task")), 0);
        assert!((1_790..=1_810).contains(&rows(&first, 1)), "{first:?}");
        // The next epoch draws the rest of source 1's pass, about 200 rows, and ends when it runs
        // out; source 0 starts its second pass.
        let (second, _) = sut.draw_epoch(&cursor).expect("draws");
        assert_eq!(source_of(second.last().expect("a task")), 1);
        assert_eq!(rows(&first, 1) + rows(&second, 1), 2_000);
        let pass: std::collections::BTreeSet<_> = first
            .iter()
            .chain(&second)
            .filter(|task| source_of(task) == 1)
            .map(|task| task.start)
            .collect();
        assert_eq!(
            pass.len(),
            200,
            "source 1's pass draws each of its tasks once"
        );
    }

    #[test]
    fn a_next_pass_source_starts_again_within_the_epoch_and_each_pass_draws_each_task_once() {
        // Only the large source ends the epoch: the two small ones are drawn pass after pass.
        let sut = three([false, false, true]);
        let (drawn, _) = sut.draw_epoch(&sut.start()).expect("draws");
        let mut passes: BTreeMap<usize, Vec<Drawn>> = BTreeMap::new();
        for task in &drawn {
            passes.entry(source_of(task)).or_default().push(*task);
        }
        // 10,000 rows at 0.2: 50,000 rows in the epoch, 25,000 of source 0 (8 passes and a third).
        assert_eq!(passes[&2].len(), 1_000);
        assert_eq!(passes[&0].len(), 2_500);
        for (index, per_pass) in [(0, 300), (1, 200)] {
            for pass in passes[&index].chunks(per_pass) {
                let distinct: std::collections::BTreeSet<_> =
                    pass.iter().map(|task| (task.split, task.start)).collect();
                assert_eq!(
                    distinct.len(),
                    pass.len(),
                    "source {index} drew a task twice in a pass"
                );
            }
            assert_ne!(
                passes[&index][..per_pass],
                passes[&index][per_pass..2 * per_pass],
                "each pass has an order of its own"
            );
        }
    }

    #[test]
    fn the_draws_are_fixed_by_the_seed_and_found_again_from_the_start() {
        let sut = three([true, false, true]);
        let mut cursor = sut.start();
        for epoch in 0..4 {
            assert_eq!(sut.cursor_at(epoch).expect("draws"), cursor);
            cursor = sut.draw_epoch(&cursor).expect("draws").1;
        }
        let again = three([true, false, true]);
        assert_eq!(
            again.draw_epoch(&again.start()),
            sut.draw_epoch(&sut.start())
        );
        let sources = [
            source(&[0, 1], 0.5, true),
            source(&[2], 0.3, false),
            source(&[3], 0.2, true),
        ];
        let other_seed =
            Mixer::new(&sources, &[1_500, 1_500, 2_000, 10_000], 10, 8).expect("plans");
        assert_ne!(
            other_seed.draw_epoch(&other_seed.start()),
            sut.draw_epoch(&sut.start())
        );
    }

    #[test]
    fn a_source_without_rows_or_with_a_split_the_plan_lacks_is_refused() {
        let empty = Mixer::new(
            &[source(&[0], 1.0, true), source(&[1], 1.0, true)],
            &[5, 0],
            10,
            0,
        );
        assert_eq!(empty, Err(PlanError::MixedSourceEmpty { index: 1 }));
        let unknown = Mixer::new(&[source(&[3], 1.0, true)], &[5], 10, 0);
        assert_eq!(
            unknown,
            Err(PlanError::MixedSplitUnknown { index: 0, split: 3 })
        );
    }
}
