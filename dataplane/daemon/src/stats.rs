//! How busy each stage of the daemon's pipeline is, and how long it waits.
//!
//! - `fetch`: byte ranges read from the object store or local files (the formats layer's
//!   [`sluice_formats::FetchStats`]); its bytes are the bytes fetched.
//! - `decode`: the time the feeders waited on the formats layer for a batch, less the fetch time
//!   in it (fetches run inside those waits); its wait is a feeder's time with no task to read.
//! - `transform`: permutation, transforms and batching into the ring's batches; its wait is the
//!   time a feeder waited for room in its writer's queue.
//! - `write`: encoding batches into ring records; its wait is the writer's time with nothing to
//!   write plus its time on a full ring.
//!
//! Rows and bytes are those that left the stage; bytes of batches are their Arrow memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_formats::CacheFigures;
use sluice_proto::v1;

use crate::tune::TuningFigures;

/// One stage's counters, added to from any thread.
#[derive(Debug, Default)]
pub(crate) struct StageCounter {
    busy_ns: AtomicU64,
    wait_ns: AtomicU64,
    rows: AtomicU64,
    bytes: AtomicU64,
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl StageCounter {
    // Relaxed throughout: statistics, read on their own and ordering nothing.

    pub(crate) fn busy(&self, duration: Duration) {
        self.busy_ns.fetch_add(nanos(duration), Ordering::Relaxed);
    }

    pub(crate) fn wait(&self, duration: Duration) {
        self.wait_ns.fetch_add(nanos(duration), Ordering::Relaxed);
    }

    pub(crate) fn out(&self, rows: usize, bytes: usize) {
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn stats(&self, stage: &str) -> v1::StageStats {
        v1::StageStats {
            stage: stage.to_owned(),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The counters of the stages after fetch; fetch's come from the formats layer.
#[derive(Debug, Default)]
pub(crate) struct Stages {
    /// Waits on the formats layer for a batch (fetch and decode together).
    pub(crate) read: StageCounter,
    pub(crate) transform: StageCounter,
    pub(crate) write: StageCounter,
}

impl Stages {
    /// Every stage's figures, given what fetching cost: `fetch_busy` and `fetch_bytes`.
    pub(crate) fn report(&self, fetch_busy: Duration, fetch_bytes: u64) -> Vec<v1::StageStats> {
        let read = self.read.stats("decode");
        let fetch_ns = nanos(fetch_busy);
        vec![
            v1::StageStats {
                stage: "fetch".to_owned(),
                busy_ns: fetch_ns,
                wait_ns: 0,
                rows: 0,
                bytes: fetch_bytes,
            },
            v1::StageStats {
                busy_ns: read.busy_ns.saturating_sub(fetch_ns),
                ..read
            },
            self.transform.stats("transform"),
            self.write.stats("write"),
        ]
    }
}

/// The Prometheus text of a daemon's stages and rings.
pub(crate) fn prometheus(
    node: u64,
    stages: &[v1::StageStats],
    rings: &[v1::RingStats],
    cache: Option<&CacheFigures>,
    tuning: &TuningFigures,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut family =
        |name: &str, kind: &str, help: &str, values: &mut dyn Iterator<Item = (String, f64)>| {
            // Writing to a String cannot fail.
            writeln!(out, "# HELP sluice_daemon_{name} {help}").ok();
            writeln!(out, "# TYPE sluice_daemon_{name} {kind}").ok();
            for (labels, value) in values {
                writeln!(
                    out,
                    "sluice_daemon_{name}{{node=\"{node}\",{labels}}} {value}"
                )
                .ok();
            }
        };
    let stage = |pick: fn(&v1::StageStats) -> f64| {
        stages
            .iter()
            .map(move |stats| (format!("stage=\"{}\"", stats.stage), pick(stats)))
    };
    family(
        "stage_busy_seconds_total",
        "counter",
        "Time the stage worked.",
        &mut stage(|stats| stats.busy_ns as f64 / 1e9),
    );
    family(
        "stage_wait_seconds_total",
        "counter",
        "Time the stage waited for input or for room downstream.",
        &mut stage(|stats| stats.wait_ns as f64 / 1e9),
    );
    family(
        "stage_rows_total",
        "counter",
        "Rows that left the stage.",
        &mut stage(|stats| stats.rows as f64),
    );
    family(
        "stage_bytes_total",
        "counter",
        "Bytes that left the stage.",
        &mut stage(|stats| stats.bytes as f64),
    );
    let ring = |pick: fn(&v1::RingStats) -> f64| {
        rings
            .iter()
            .map(move |stats| (format!("rank=\"{}\"", stats.rank), pick(stats)))
    };
    family(
        "ring_used_bytes",
        "gauge",
        "Bytes written to the ring and not yet released by its trainer.",
        &mut ring(|stats| stats.used_bytes as f64),
    );
    family(
        "ring_capacity_bytes",
        "gauge",
        "The ring's capacity.",
        &mut ring(|stats| stats.capacity_bytes as f64),
    );
    family(
        "ring_trainer_wait_seconds_total",
        "counter",
        "Time the trainer waited on an empty ring.",
        &mut ring(|stats| stats.trainer_wait_ns as f64 / 1e9),
    );
    family(
        "ring_daemon_wait_seconds_total",
        "counter",
        "Time the daemon waited on a full ring.",
        &mut ring(|stats| stats.daemon_wait_ns as f64 / 1e9),
    );
    family(
        "ring_reader_idle_seconds",
        "gauge",
        "How long the trainer has held the ring's records without releasing any, since it first read (0 while it reads or the ring is empty).",
        &mut ring(|stats| stats.reader_idle_ms as f64 / 1e3),
    );
    family(
        "ring_source_wait_seconds",
        "gauge",
        "How long the ring's feeder has waited for the next batch of a task from its source (0 while it does not wait for one).",
        &mut ring(|stats| stats.source_wait_ms as f64 / 1e3),
    );
    family(
        "decode_threads",
        "gauge",
        "Tasks the daemon reads and decodes at once: as tuned now, and the most it may (the job's daemon.max_threads or the CPU quota).",
        &mut [
            ("kind=\"tuned\"".to_owned(), tuning.threads as f64),
            ("kind=\"max\"".to_owned(), tuning.max_threads as f64),
        ]
        .into_iter(),
    );
    family(
        "read_ahead_bytes",
        "gauge",
        "Bytes of decoded batches the daemon may hold ahead of its rings, as tuned now, held now, and the most it may.",
        &mut [
            ("kind=\"tuned\"".to_owned(), tuning.read_ahead as f64),
            ("kind=\"held\"".to_owned(), tuning.read_ahead_held as f64),
            ("kind=\"max\"".to_owned(), tuning.max_read_ahead as f64),
        ]
        .into_iter(),
    );
    if let Some(quota) = tuning.cpu_quota {
        family(
            "cpu_quota_cores",
            "gauge",
            "The CPU quota of the daemon's cgroup, in cores.",
            &mut [("kind=\"cgroup\"".to_owned(), quota)].into_iter(),
        );
    }
    if let Some(cache) = cache {
        family(
            "cache_blocks_total",
            "counter",
            "Blocks of remote objects that reads found in the local disk cache (hit) or fetched from the store into it (miss).",
            &mut [
                ("result=\"hit\"".to_owned(), cache.hits as f64),
                ("result=\"miss\"".to_owned(), cache.misses as f64),
            ]
            .into_iter(),
        );
        family(
            "cache_bytes_total",
            "counter",
            "Bytes of remote objects read from the local disk cache, and fetched from the store for it.",
            &mut [
                ("from=\"cache\"".to_owned(), cache.bytes_from_cache as f64),
                ("from=\"store\"".to_owned(), cache.bytes_from_store as f64),
            ]
            .into_iter(),
        );
        family(
            "cache_evictions_total",
            "counter",
            "Blocks removed from the local disk cache to keep it within its max_bytes.",
            &mut [("kind=\"lru\"".to_owned(), cache.evictions as f64)].into_iter(),
        );
        family(
            "cache_held_bytes",
            "gauge",
            "Bytes in the local disk cache (the node's daemons' together), as this daemon last counted them.",
            &mut [("kind=\"blocks\"".to_owned(), cache.bytes_held as f64)].into_iter(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_the_read_wait_less_fetch_and_every_stage_is_exported() {
        let stages = Stages::default();
        stages.read.busy(Duration::from_millis(30));
        stages.read.out(100, 800);
        stages.transform.wait(Duration::from_millis(5));
        stages.write.busy(Duration::from_millis(2));
        stages.write.out(100, 900);
        let report = stages.report(Duration::from_millis(10), 4096);
        let names: Vec<&str> = report.iter().map(|stats| stats.stage.as_str()).collect();
        assert_eq!(names, ["fetch", "decode", "transform", "write"]);
        assert_eq!(report[0].bytes, 4096);
        assert_eq!(report[1].busy_ns, 20_000_000);
        assert_eq!((report[1].rows, report[1].bytes), (100, 800));
        assert_eq!(report[2].wait_ns, 5_000_000);
        let rings = [v1::RingStats {
            rank: 3,
            used_bytes: 10,
            capacity_bytes: 100,
            trainer_wait_ns: 1_500_000_000,
            daemon_wait_ns: 0,
            reader_idle_ms: 0,
            reader_interval_ms: 0,
            source_wait_ms: 2_500,
            source_task_id: 4,
            epoch_batches: Vec::new(),
        }];
        let cache = CacheFigures {
            hits: 7,
            misses: 3,
            bytes_from_cache: 700,
            bytes_from_store: 300,
            evictions: 2,
            bytes_held: 1000,
        };
        let tuning = TuningFigures {
            threads: 1,
            max_threads: 2,
            read_ahead: 8 << 20,
            read_ahead_held: 4096,
            max_read_ahead: 1 << 30,
            cpu_quota: Some(1.5),
        };
        let text = prometheus(1, &report, &rings, Some(&cache), &tuning);
        for line in [
            "sluice_daemon_cache_blocks_total{node=\"1\",result=\"hit\"} 7\n",
            "sluice_daemon_cache_bytes_total{node=\"1\",from=\"store\"} 300\n",
            "sluice_daemon_cache_evictions_total{node=\"1\",kind=\"lru\"} 2\n",
            "sluice_daemon_cache_held_bytes{node=\"1\",kind=\"blocks\"} 1000\n",
            "sluice_daemon_decode_threads{node=\"1\",kind=\"tuned\"} 1\n",
            "sluice_daemon_decode_threads{node=\"1\",kind=\"max\"} 2\n",
            "sluice_daemon_read_ahead_bytes{node=\"1\",kind=\"held\"} 4096\n",
            "sluice_daemon_cpu_quota_cores{node=\"1\",kind=\"cgroup\"} 1.5\n",
        ] {
            assert!(text.contains(line), "{line}{text}");
        }
        assert!(
            !prometheus(1, &report, &rings, None, &tuning).contains("cache"),
            "a daemon without a cache exports no cache figures"
        );
        assert!(
            text.contains("sluice_daemon_ring_source_wait_seconds{node=\"1\",rank=\"3\"} 2.5\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "sluice_daemon_stage_busy_seconds_total{node=\"1\",stage=\"decode\"} 0.02\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("sluice_daemon_stage_rows_total{node=\"1\",stage=\"write\"} 100\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "sluice_daemon_ring_trainer_wait_seconds_total{node=\"1\",rank=\"3\"} 1.5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE sluice_daemon_ring_used_bytes gauge\n"),
            "{text}"
        );
    }
}
