//! The rule of a node cut off (`docs/architecture.md`), as the chaos run across hosts counts ids by
//! it: when the AM declares a node lost, it queues each task the node held again from the row it
//! had counted, and the reads of the node's trainer from those rows on are void (the trainer is
//! told so, and the rows go to other trainers). Everything else a trainer read counts.
//!
//! The bench learns the rows from the AM's logs ("task queued again" for each task, then "node
//! lost" or "node blacklisted" for the node), and which task and row each batch holds from the
//! trainers' `FILE.positions` ([`sluice_testkit::job::read_batches`]). Nothing is inferred from the
//! ids themselves: a read of a row the AM had counted is never void, even when it is delivered
//! again elsewhere, so a task queued again from too early a row shows as rows twice.

use std::collections::{BTreeMap, HashMap, VecDeque};

use sluice_testkit::job::ReadBatch;

use super::Tally;

/// The rows the AM queued again when it declared a node lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Loss {
    /// The node, by its id.
    pub node: u32,
    /// Each task the node held, and the row of the task it is delivered again from.
    pub from_rows: BTreeMap<u64, u64>,
}

/// What one generation of a trainer read: a trainer and those started again in its place on its
/// ids file, up to its daemon's fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GenerationReads {
    /// The node whose ring it read, when its daemons said which.
    pub node: Option<u32>,
    /// Its batches, in the order read.
    pub batches: Vec<ReadBatch>,
    /// Whether its daemon was fenced under it, so that it was told its last reads are void.
    pub fenced: bool,
}

/// The value of `name=` in a log line, up to the next space.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=");
    let at = line.find(&key)? + key.len();
    line[at..].split(' ').next()
}

/// The number of a `task-N` or `node-N` field.
fn numbered(line: &str, name: &str) -> Option<u64> {
    field(line, name)?
        .strip_prefix(&format!("{name}-"))?
        .parse()
        .ok()
}

/// The node losses in the logs of the AMs of a job, in the order the AMs were started. An AM that
/// takes the job over from its journal logs what it replays before it says so ("job taken over
/// from its journal"); replayed from the journal's start (no snapshot), those losses are the ones
/// the journal holds, and stand for what the AMs before it logged, which may name a loss they never
/// made durable. A node may be lost twice with the same rows queued again (a task handed back to
/// it, and no row of it counted before the second loss): each loss counts.
pub(super) fn losses_in<'a>(am_logs: impl IntoIterator<Item = &'a str>) -> Vec<Loss> {
    const TAKEN_OVER: &str = "job taken over from its journal";
    let mut losses: Vec<Loss> = Vec::new();
    for log in am_logs {
        let (replayed, live) = match log.find(TAKEN_OVER) {
            Some(at) => log.split_at(at),
            None => ("", log),
        };
        let whole_journal = replayed
            .lines()
            .any(|line| line.contains("opened the journal") && line.contains("snapshot=false"));
        if whole_journal {
            losses = losses_logged(replayed);
        }
        losses.extend(losses_logged(live));
    }
    losses
}

/// The losses one stretch of an AM's log names, in order.
fn losses_logged(log: &str) -> Vec<Loss> {
    let mut losses = Vec::new();
    let mut requeued: Vec<(u64, u64)> = Vec::new();
    for line in log.lines() {
        if line.contains("task queued again") {
            let task = numbered(line, "task");
            let from = field(line, "from_row").and_then(|row| row.parse().ok());
            if let (Some(task), Some(from)) = (task, from) {
                requeued.push((task, from));
            }
        } else if line.contains("node lost") || line.contains("node blacklisted") {
            let node = numbered(line, "node").and_then(|node| u32::try_from(node).ok());
            let count = field(line, "requeued").and_then(|count| count.parse::<usize>().ok());
            if let (Some(node), Some(count)) = (node, count) {
                let first = requeued.len().saturating_sub(count);
                losses.push(Loss {
                    node,
                    from_rows: requeued[first..].iter().copied().collect(),
                });
            }
            requeued.clear();
        } else if line.contains("node registered") {
            requeued.clear();
        }
    }
    losses
}

/// The node a daemon's log says it serves.
pub(super) fn node_served(daemon_log: &str) -> Option<u32> {
    daemon_log
        .lines()
        .filter(|line| line.contains("daemon serves its rings"))
        .find_map(|line| field(line, "node")?.parse().ok())
}

impl Tally {
    /// Every id once by the rule of a node cut off: the `losses` of each node are matched, in
    /// order, with the fenced generations of its trainers (given in each node's order); of a
    /// fenced generation, the batches at its end that hold rows its node's loss queued again are
    /// void. Each void read must have been read by another trainer, else it shows as missing; a
    /// read of a row the AM had counted that another trainer read too shows as a duplicate.
    pub(super) fn by_the_rule(
        generations: &[GenerationReads],
        losses: &[Loss],
        rows: u64,
    ) -> Tally {
        let mut losses_of: HashMap<u32, VecDeque<&Loss>> = HashMap::new();
        for loss in losses {
            losses_of.entry(loss.node).or_default().push_back(loss);
        }
        let mut counted = Vec::new();
        let mut void = 0;
        for generation in generations {
            let loss = generation
                .node
                .filter(|_| generation.fenced)
                .and_then(|node| losses_of.get_mut(&node)?.pop_front());
            let void_batches = loss.map_or(0, |loss| {
                generation
                    .batches
                    .iter()
                    .rev()
                    .take_while(|batch| {
                        loss.from_rows
                            .get(&batch.task_id)
                            .is_some_and(|from| batch.first_row >= *from)
                    })
                    .count()
            });
            let kept = generation.batches.len() - void_batches;
            for batch in &generation.batches[kept..] {
                void += batch.ids.len() as u64;
            }
            for batch in &generation.batches[..kept] {
                counted.extend_from_slice(&batch.ids);
            }
        }
        Tally {
            void,
            ..Tally::of(counted, rows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(task_id: u64, first_row: u64, ids: &[i64]) -> ReadBatch {
        ReadBatch {
            task_id,
            first_row,
            ids: ids.to_vec(),
        }
    }

    fn loss(node: u32, from_rows: &[(u64, u64)]) -> Loss {
        Loss {
            node,
            from_rows: from_rows.iter().copied().collect(),
        }
    }

    #[test]
    fn the_losses_are_read_from_the_ams_logs_once_each() {
        let lost_twice = "\
            2026-12-07T15:23:20.008926Z  INFO sluice_am::master: task queued again task=task-3 from_row=10000\n\
            2026-12-07T15:23:20.008958Z  INFO sluice_am::master: task queued again task=task-18 from_row=0\n\
            2026-12-07T15:23:20.008963Z  WARN sluice_am::master: node lost: no heartbeat within the timeout node=node-2 requeued=2\n\
            2026-12-07T15:23:22.089485Z  INFO sluice_am::master: node registered node=node-2 kept=0 requeued=0\n\
            2026-12-07T15:23:24.000000Z  INFO sluice_am::master: task queued again task=task-3 from_row=10000\n\
            2026-12-07T15:23:24.000001Z  INFO sluice_am::master: task queued again task=task-18 from_row=0\n\
            2026-12-07T15:23:24.000002Z  WARN sluice_am::master: node lost: no heartbeat within the timeout node=node-2 requeued=2\n";
        let first = format!(
            "2026-12-07T15:23:03Z  INFO sluice_am::journal: opened the journal uri=\"file:///j\" entries=0 snapshot=false sequence=0\n\
             {lost_twice}\
             2026-12-07T15:23:25.000000Z  INFO sluice_am::master: task queued again task=task-7 from_row=0\n\
             2026-12-07T15:23:25.000001Z  WARN sluice_am::master: node lost: no heartbeat within the timeout node=node-1 requeued=1\n"
        );
        // The next AM replays from the journal the losses it holds (the last one never became
        // durable), then makes one of its own; a task queued again at a registration belongs to no
        // loss.
        let second = format!(
            "2026-12-07T15:23:26Z  INFO sluice_am::journal: opened the journal uri=\"file:///j\" entries=61 snapshot=false sequence=62\n\
             {lost_twice}\
             2026-12-07T15:23:26.5Z  INFO sluice_am::server: job taken over from its journal uri=\"file:///j\" entries=61 epoch=0\n\
             2026-12-07T15:23:30.000000Z  INFO sluice_am::master: task queued again task=task-9 from_row=500\n\
             2026-12-07T15:23:30.000001Z  INFO sluice_am::master: node registered node=node-1 kept=0 requeued=1\n\
             2026-12-07T15:23:33.462732Z  INFO sluice_am::master: task queued again task=task-14 from_row=0\n\
             2026-12-07T15:23:33.462769Z  WARN sluice_am::master: node lost: no heartbeat within the timeout node=node-0 requeued=1\n"
        );
        let twice = loss(2, &[(3, 10_000), (18, 0)]);
        assert_eq!(
            losses_in([first.as_str()]),
            vec![twice.clone(), twice.clone(), loss(1, &[(7, 0)])]
        );
        assert_eq!(
            losses_in([first.as_str(), second.as_str()]),
            vec![twice.clone(), twice, loss(0, &[(14, 0)])]
        );
        assert_eq!(
            node_served(
                "2026-12-07T15:23:03Z  INFO sluice_daemon: daemon serves its rings node=1 job=\"chaos-hosts\" ranks=[0]\n"
            ),
            Some(1)
        );
    }

    #[test]
    fn a_fenced_trainers_reads_of_the_rows_queued_again_are_void_and_nothing_else() {
        // Node 0's trainer read task 1 (rows 0 to 3), then rows 0 and 2 of task 2; the AM had
        // counted task 2 to row 2 when it declared node 0 lost, and queued it again from there.
        let fenced = GenerationReads {
            node: Some(0),
            batches: vec![
                batch(1, 0, &[0, 1]),
                batch(1, 2, &[2, 3]),
                batch(2, 0, &[4, 5]),
                batch(2, 2, &[6, 7]),
            ],
            fenced: true,
        };
        let other = GenerationReads {
            node: Some(1),
            batches: vec![batch(2, 2, &[6, 7])],
            fenced: false,
        };
        let losses = [loss(0, &[(2, 2)])];
        let tally = Tally::by_the_rule(&[fenced.clone(), other.clone()], &losses, 8);
        assert_eq!((tally.void, tally.duplicates, tally.missing), (2, 0, 0));

        // Queued again from too early a row: rows the AM had counted are delivered twice.
        let twice = GenerationReads {
            batches: vec![batch(2, 0, &[4, 5]), batch(2, 2, &[6, 7])],
            ..other.clone()
        };
        let early = [loss(0, &[(2, 0)])];
        let tally = Tally::by_the_rule(&[fenced.clone(), twice.clone()], &losses, 8);
        assert_eq!((tally.void, tally.duplicates), (2, 2));
        // Queued again from its start, all of task 2 is read void on node 0.
        let tally = Tally::by_the_rule(&[fenced.clone(), twice], &early, 8);
        assert_eq!((tally.void, tally.duplicates, tally.missing), (4, 0, 0));
        // Void reads are a tail: rows queued again that come before a read that counts count too.
        let mixed = GenerationReads {
            batches: vec![batch(2, 2, &[6, 7]), batch(1, 0, &[0, 1])],
            ..fenced.clone()
        };
        let tally = Tally::by_the_rule(&[mixed, other.clone()], &losses, 8);
        assert_eq!((tally.void, tally.duplicates), (0, 2));

        // Not fenced, or no loss of its node: the same reads count, and show as duplicates.
        let unfenced = GenerationReads {
            fenced: false,
            ..fenced.clone()
        };
        let tally = Tally::by_the_rule(&[unfenced, other.clone()], &losses, 8);
        assert_eq!((tally.void, tally.duplicates), (0, 2));
        let tally = Tally::by_the_rule(&[fenced.clone(), other.clone()], &[], 8);
        assert_eq!((tally.void, tally.duplicates), (0, 2));

        // Void reads nobody else made are missing.
        let tally = Tally::by_the_rule(&[fenced], &losses, 8);
        assert_eq!((tally.void, tally.missing), (2, 2));
    }
}
