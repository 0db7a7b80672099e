//! The live progress line of `sluice run`, and its closing summary, from the AM's own status.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_am::service::Am;
use sluice_proto::v1;

/// The AM's status at one moment.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    status: v1::StatusReply,
}

impl Sample {
    fn take(am: &Am) -> Sample {
        Sample {
            at: Instant::now(),
            status: am.status(),
        }
    }
}

/// Totals over every node of the waits and work the daemons report.
#[derive(Debug, Default, Clone, PartialEq)]
struct Totals {
    /// Per stage, in the order the daemons report them: busy and wait nanoseconds, rows, bytes.
    stages: Vec<(String, v1::StageStats)>,
    rings: usize,
    used_bytes: u64,
    capacity_bytes: u64,
    trainer_wait_ns: u64,
    daemon_wait_ns: u64,
}

fn totals(status: &v1::StatusReply) -> Totals {
    let mut totals = Totals::default();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for node in &status.nodes {
        for stage in &node.stages {
            let at = *index.entry(stage.stage.clone()).or_insert_with(|| {
                totals
                    .stages
                    .push((stage.stage.clone(), v1::StageStats::default()));
                totals.stages.len() - 1
            });
            let sum = &mut totals.stages[at].1;
            sum.busy_ns += stage.busy_ns;
            sum.wait_ns += stage.wait_ns;
            sum.rows += stage.rows;
            sum.bytes += stage.bytes;
        }
        for ring in &node.rings {
            totals.rings += 1;
            totals.used_bytes += ring.used_bytes;
            totals.capacity_bytes += ring.capacity_bytes;
            totals.trainer_wait_ns += ring.trainer_wait_ns;
            totals.daemon_wait_ns += ring.daemon_wait_ns;
        }
    }
    totals
}

/// `part` of `whole` nanoseconds, as a percentage.
fn percent(part: u64, whole: f64) -> f64 {
    if whole > 0.0 {
        100.0 * part as f64 / whole
    } else {
        0.0
    }
}

/// One progress line: where the epoch stands, and how busy each stage, the rings and the
/// trainers were since `previous`.
fn render_line(previous: &Sample, now: &Sample) -> String {
    let status = &now.status;
    let tasks = status.tasks.unwrap_or_default();
    let mut line = format!(
        "epoch {}/{} | {}/{} rows ({:.1}%) | {:.2} M rows/s | tasks {} done, {} in flight, {} pending",
        status.epoch + 1,
        status.epochs.max(1),
        tasks.rows_consumed,
        tasks.rows_total,
        percent(tasks.rows_consumed, tasks.rows_total as f64),
        status.rows_per_second / 1e6,
        tasks.done,
        tasks.in_flight,
        tasks.pending,
    );
    let before = totals(&previous.status);
    let after = totals(&now.status);
    let window_ns = now.at.saturating_duration_since(previous.at).as_nanos() as f64;
    if after.rings > 0 {
        let ring_time = window_ns * after.rings as f64;
        write!(
            line,
            " | rings {:.0}% full | trainers waited {:.1}% | daemons waited {:.1}%",
            percent(after.used_bytes, after.capacity_bytes as f64),
            percent(
                after.trainer_wait_ns.saturating_sub(before.trainer_wait_ns),
                ring_time
            ),
            percent(
                after.daemon_wait_ns.saturating_sub(before.daemon_wait_ns),
                ring_time
            ),
        )
        .ok();
    }
    let nodes = status.nodes.len().max(1) as f64;
    for (name, stage) in &after.stages {
        let earlier = before
            .stages
            .iter()
            .find(|(other, _)| other == name)
            .map(|(_, stage)| stage.clone())
            .unwrap_or_default();
        write!(
            line,
            " | {name} busy {:.0}% wait {:.0}%",
            percent(
                stage.busy_ns.saturating_sub(earlier.busy_ns),
                window_ns * nodes
            ),
            percent(
                stage.wait_ns.saturating_sub(earlier.wait_ns),
                window_ns * nodes
            ),
        )
        .ok();
    }
    line
}

/// The closing table: per stage, what the daemons did over the whole run, and the waits on the
/// rings.
fn render_summary(status: &v1::StatusReply, seconds: f64) -> String {
    let totals = totals(status);
    let mut out = String::new();
    if !totals.stages.is_empty() {
        writeln!(
            out,
            "{:<10} {:>10} {:>10} {:>14} {:>12} {:>12}",
            "stage", "busy s", "wait s", "rows", "MB", "rows/s"
        )
        .ok();
        for (name, stage) in &totals.stages {
            writeln!(
                out,
                "{:<10} {:>10.2} {:>10.2} {:>14} {:>12.1} {:>12.0}",
                name,
                stage.busy_ns as f64 / 1e9,
                stage.wait_ns as f64 / 1e9,
                stage.rows,
                stage.bytes as f64 / 1e6,
                stage.rows as f64 / seconds.max(1e-3),
            )
            .ok();
        }
    }
    if totals.rings > 0 {
        writeln!(
            out,
            "rings: {}; trainers waited on empty rings {:.2} s, daemons waited on full rings {:.2} s (summed over rings, {:.1} s run)",
            totals.rings,
            totals.trainer_wait_ns as f64 / 1e9,
            totals.daemon_wait_ns as f64 / 1e9,
            seconds
        )
        .ok();
    }
    if status.bad_ranges > 0 {
        writeln!(
            out,
            "bad data: {} rows skipped in {} skips (data.on_bad_data); the last:",
            status.bad_rows, status.bad_ranges
        )
        .ok();
        let shown = status.bad_data.len().saturating_sub(BAD_DATA_SHOWN);
        for skip in &status.bad_data[shown..] {
            let group = skip
                .row_group
                .map(|group| format!(" row group {group}"))
                .unwrap_or_default();
            writeln!(
                out,
                "  epoch {}: {}{group}: {} rows: {}",
                skip.epoch, skip.uri, skip.rows, skip.cause
            )
            .ok();
        }
    }
    if status.dropped_rows > 0 {
        writeln!(
            out,
            "even batches: {} rows dropped (data.even_batches: drop), their splits read first in the next epoch; the last:",
            status.dropped_rows
        )
        .ok();
        let shown = status.dropped.len().saturating_sub(BAD_DATA_SHOWN);
        for drop in &status.dropped[shown..] {
            writeln!(
                out,
                "  epoch {}: {} split at row {}: split rows [{}, {})",
                drop.epoch,
                drop.uri,
                drop.split_first_row,
                drop.first_row,
                drop.first_row + drop.row_count
            )
            .ok();
        }
    }
    out
}

/// How many skips of bad data the closing table names.
const BAD_DATA_SHOWN: usize = 10;

/// Prints a progress line until aborted: redrawn in place twice a second on a terminal, one
/// line every five seconds otherwise.
pub fn spawn(label: String, am: Arc<Am>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let terminal = std::io::stdout().is_terminal();
        let period = if terminal {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(5)
        };
        let mut previous = Sample::take(&am);
        loop {
            tokio::time::sleep(period).await;
            let now = Sample::take(&am);
            let line = render_line(&previous, &now);
            let mut stdout = std::io::stdout().lock();
            if terminal {
                write!(stdout, "\r\x1b[2K{label}: {line}").ok();
            } else {
                writeln!(stdout, "{label}: {line}").ok();
            }
            stdout.flush().ok();
            previous = now;
        }
    })
}

/// Stops the progress line and prints the closing summary of a run of `seconds`.
pub async fn finish(progress: tokio::task::JoinHandle<()>, am: &Am, seconds: f64) {
    progress.abort();
    // A cancelled task reports only that it was cancelled.
    let _ = progress.await;
    let mut stdout = std::io::stdout().lock();
    if stdout.is_terminal() {
        writeln!(stdout).ok();
    }
    write!(
        stdout,
        "{}",
        render_summary(&Sample::take(am).status, seconds)
    )
    .ok();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(consumed: u64, trainer_wait_ns: u64, decode_busy_ns: u64) -> v1::StatusReply {
        v1::StatusReply {
            epoch: 0,
            epochs: 2,
            tasks: Some(v1::TaskCounts {
                pending: 3,
                in_flight: 2,
                done: 5,
                rows_total: 1000,
                rows_consumed: consumed,
                ..v1::TaskCounts::default()
            }),
            rows_per_second: 1.5e6,
            nodes: vec![
                v1::NodeStatus {
                    stages: vec![v1::StageStats {
                        stage: "decode".to_owned(),
                        busy_ns: decode_busy_ns,
                        wait_ns: 0,
                        rows: consumed,
                        bytes: consumed * 10,
                    }],
                    rings: vec![v1::RingStats {
                        rank: 0,
                        used_bytes: 25,
                        capacity_bytes: 100,
                        trainer_wait_ns,
                        daemon_wait_ns: 0,
                        ..v1::RingStats::default()
                    }],
                    ..v1::NodeStatus::default()
                },
                v1::NodeStatus {
                    rings: vec![v1::RingStats {
                        rank: 1,
                        used_bytes: 75,
                        capacity_bytes: 100,
                        ..v1::RingStats::default()
                    }],
                    ..v1::NodeStatus::default()
                },
            ],
            ..v1::StatusReply::default()
        }
    }

    #[test]
    fn the_line_gives_progress_and_the_shares_of_time_since_the_last_sample() {
        let start = Instant::now();
        let previous = Sample {
            at: start,
            status: status(100, 0, 0),
        };
        let now = Sample {
            at: start + Duration::from_secs(1),
            status: status(400, 500_000_000, 1_000_000_000),
        };
        let line = render_line(&previous, &now);
        assert_eq!(
            line,
            "epoch 1/2 | 400/1000 rows (40.0%) | 1.50 M rows/s | tasks 5 done, 2 in flight, 3 pending \
             | rings 50% full | trainers waited 25.0% | daemons waited 0.0% | decode busy 50% wait 0%"
        );
    }

    #[test]
    fn the_summary_sums_stages_and_ring_waits_over_nodes() {
        let summary = render_summary(&status(1000, 2_000_000_000, 3_000_000_000), 2.0);
        assert!(
            summary.contains(
                "decode           3.00       0.00           1000          0.0          500"
            ),
            "{summary}"
        );
        assert!(
            summary.contains("rings: 2; trainers waited on empty rings 2.00 s"),
            "{summary}"
        );
    }
}
