//! The recent past of a job, one sample per second, for the status page's charts.

use sluice_proto::v1;
use std::collections::VecDeque;

/// The job at one moment, summed over its nodes and their rings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(super) struct Sample {
    /// When, in milliseconds since the Unix epoch.
    pub(super) t_ms: u64,
    /// Rows of the current epoch consumed.
    pub(super) rows_consumed: u64,
    /// The AM's throughput estimate.
    pub(super) rows_per_second: f64,
    /// Nanoseconds trainers waited on empty rings, summed over every ring the nodes last reported;
    /// each ring counts from its daemon's start.
    pub(super) trainer_wait_ns: u64,
    /// Nanoseconds daemons waited on full rings, summed the same way.
    pub(super) daemon_wait_ns: u64,
    /// The rings summed, so that a wait can be read as a share of the rings' time.
    pub(super) rings: u32,
}

impl Sample {
    /// Sums a status into one sample, taken at the status's time.
    pub(super) fn of(t_ms: u64, status: &v1::StatusReply) -> Sample {
        let rings = status.nodes.iter().flat_map(|node| &node.rings);
        let (trainer_wait_ns, daemon_wait_ns, count) =
            rings.fold((0u64, 0u64, 0u32), |(trainer, daemon, count), ring| {
                (
                    trainer.saturating_add(ring.trainer_wait_ns),
                    daemon.saturating_add(ring.daemon_wait_ns),
                    count + 1,
                )
            });
        Sample {
            t_ms,
            rows_consumed: status.tasks.map_or(0, |tasks| tasks.rows_consumed),
            rows_per_second: status.rows_per_second,
            trainer_wait_ns,
            daemon_wait_ns,
            rings: count,
        }
    }
}

/// The latest samples, oldest first, at most `capacity` of them.
#[derive(Debug)]
pub(super) struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
}

impl History {
    /// An empty history that keeps the latest `capacity` samples.
    pub(super) fn new(capacity: usize) -> History {
        debug_assert!(capacity > 0, "a history keeps at least one sample");
        History {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a sample, dropping the oldest when full.
    pub(super) fn record(&mut self, sample: Sample) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// The samples, oldest first.
    pub(super) fn samples(&self) -> &VecDeque<Sample> {
        &self.samples
    }
}
