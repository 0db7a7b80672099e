//! The figures of a `sluice-bench am` run, as one JSON object or as a table for people.

use std::fmt::Write as _;

use serde::Serialize;

/// What one steady-state window measured of one AM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WindowFigures {
    /// Median heartbeat latency, client side, in milliseconds.
    pub heartbeat_p50_ms: f64,
    /// 99th percentile heartbeat latency, in milliseconds.
    pub heartbeat_p99_ms: f64,
    /// Slowest heartbeat, in milliseconds.
    pub heartbeat_max_ms: f64,
    /// Heartbeats answered per second.
    pub heartbeats_per_s: f64,
    /// Heartbeats that failed within the window.
    pub heartbeat_errors: u64,
    /// Tasks finished per second.
    pub tasks_done_per_s: f64,
    /// CPU the AM used over the window, in percent of one core.
    pub am_cpu_percent: f64,
    /// Time the AM's threads were runnable but waiting for a CPU (taken by other processes or by
    /// each other), in percent of the window, summed over threads: what a busy host adds.
    pub am_cpu_wait_percent: f64,
    /// The AM's resident memory at the end of the window (`VmRSS`).
    pub am_rss_bytes: u64,
    /// The AM's peak resident memory so far (`VmHWM`).
    pub am_hwm_bytes: u64,
}

/// Everything one `sluice-bench am` run measured. The top-level window figures are those of the
/// journaled AM, the one under test; `baseline_no_journal` is the same AM and load without a
/// journal, measured in the same run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AmBenchReport {
    /// Simulated node daemons.
    pub executors: u32,
    /// Tasks in the job.
    pub tasks: u64,
    /// Seconds in the measurement window.
    pub window_s: f64,
    /// Seconds between the journaled AM's snapshots, when set (`--snapshot-interval-s`); otherwise
    /// the AM's default of 300 s, and no snapshot falls in the window.
    pub snapshot_interval_s: Option<u64>,
    /// The daemons let a finished task go on the answer to the heartbeat that reports it
    /// (`--daemons-let-finished-go`), so the AM answers such heartbeats once durable.
    pub daemons_let_finished_go: bool,
    /// The journaled AM's figures.
    #[serde(flatten)]
    pub journaled: WindowFigures,
    /// Milliseconds from starting the AM again on the killed AM's journal until it answered
    /// `Status`.
    pub recovery_ms: f64,
    /// Bytes of the journal the new AM recovered from.
    pub journal_bytes: u64,
    /// The recovered AM's peak resident memory (`VmHWM`), replay included.
    pub recovery_hwm_bytes: u64,
    /// Tasks in the job of the memory measurement.
    pub memory_tasks: u64,
    /// Resident memory of an AM serving `memory_tasks` tasks (`VmRSS`).
    pub memory_rss_bytes: u64,
    /// Its peak resident memory (`VmHWM`), planning included.
    pub memory_hwm_bytes: u64,
    /// The peak resident memory (`VmHWM`) of an AM that takes that job over from its journal.
    pub memory_takeover_hwm_bytes: u64,
    /// The AM and load without a journal.
    pub baseline_no_journal: WindowFigures,
    /// The machine's one-minute load average at the end of the run.
    pub load_average: f64,
    /// Where the processes ran; shown in the table, not part of the JSON contract.
    #[serde(skip)]
    pub placement: String,
}

impl AmBenchReport {
    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report as a table, for people.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let (ours, base) = (&self.journaled, &self.baseline_no_journal);
        // Writing to a String cannot fail.
        writeln!(
            out,
            "AM under {} simulated executors, {} tasks, {:.1} s window",
            self.executors, self.tasks, self.window_s
        )
        .ok();
        writeln!(
            out,
            "{}; load average {:.2}",
            self.placement, self.load_average
        )
        .ok();
        if let Some(seconds) = self.snapshot_interval_s {
            writeln!(
                out,
                "journaled AM snapshotting every {seconds} s (back to back if one takes longer)"
            )
            .ok();
        }
        if self.daemons_let_finished_go {
            writeln!(
                out,
                "daemons let a finished task go on the heartbeat's answer: the AM answers it once durable"
            )
            .ok();
        }
        writeln!(out).ok();
        writeln!(
            out,
            "  {:<22} {:>14} {:>14} {:>14}",
            "", "journaled AM", "no journal", "journaled ÷"
        )
        .ok();
        let rows = [
            (
                "heartbeat p50 (ms)",
                ours.heartbeat_p50_ms,
                base.heartbeat_p50_ms,
            ),
            (
                "heartbeat p99 (ms)",
                ours.heartbeat_p99_ms,
                base.heartbeat_p99_ms,
            ),
            (
                "heartbeat max (ms)",
                ours.heartbeat_max_ms,
                base.heartbeat_max_ms,
            ),
            ("heartbeats/s", ours.heartbeats_per_s, base.heartbeats_per_s),
            ("tasks done/s", ours.tasks_done_per_s, base.tasks_done_per_s),
            (
                "AM cpu (% of a core)",
                ours.am_cpu_percent,
                base.am_cpu_percent,
            ),
            (
                "AM waiting for cpu (%)",
                ours.am_cpu_wait_percent,
                base.am_cpu_wait_percent,
            ),
            (
                "AM rss (MiB)",
                mib(ours.am_rss_bytes),
                mib(base.am_rss_bytes),
            ),
        ];
        for (name, journaled, baseline) in rows {
            writeln!(
                out,
                "  {name:<22} {journaled:>14.2} {baseline:>14.2} {:>13.2}x",
                journaled / baseline
            )
            .ok();
        }
        if ours.heartbeat_errors + base.heartbeat_errors > 0 {
            writeln!(
                out,
                "  heartbeat errors: {} journaled, {} without journal",
                ours.heartbeat_errors, base.heartbeat_errors
            )
            .ok();
        }
        writeln!(out).ok();
        writeln!(
            out,
            "recovery after kill -9: {:.0} ms to answer Status, from a journal of {:.2} MiB (peak rss {:.1} MiB)",
            self.recovery_ms,
            mib(self.journal_bytes),
            mib(self.recovery_hwm_bytes)
        )
        .ok();
        writeln!(
            out,
            "memory: {} tasks in {:.1} MiB rss (peak {:.1} MiB; {:.1} MiB at the peak of a takeover)",
            self.memory_tasks,
            mib(self.memory_rss_bytes),
            mib(self.memory_hwm_bytes),
            mib(self.memory_takeover_hwm_bytes)
        )
        .ok();
        out
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(p99: f64) -> WindowFigures {
        WindowFigures {
            heartbeat_p50_ms: 0.5,
            heartbeat_p99_ms: p99,
            heartbeat_max_ms: 9.0,
            heartbeats_per_s: 10_000.0,
            heartbeat_errors: 0,
            tasks_done_per_s: 5000.0,
            am_cpu_percent: 40.0,
            am_cpu_wait_percent: 10.0,
            am_rss_bytes: 64 << 20,
            am_hwm_bytes: 80 << 20,
        }
    }

    fn report() -> AmBenchReport {
        AmBenchReport {
            executors: 10_000,
            tasks: 1_000_000,
            window_s: 30.0,
            snapshot_interval_s: Some(1),
            daemons_let_finished_go: false,
            journaled: window(4.0),
            recovery_ms: 850.0,
            journal_bytes: 3 << 20,
            recovery_hwm_bytes: 100 << 20,
            memory_tasks: 10_000_000,
            memory_rss_bytes: 512 << 20,
            memory_hwm_bytes: 700 << 20,
            memory_takeover_hwm_bytes: 1200 << 20,
            baseline_no_journal: window(2.0),
            load_average: 1.5,
            placement: "AM on cpu 0, clients on cpu 1".to_owned(),
        }
    }

    #[test]
    fn json_has_the_journaled_figures_at_the_top_and_the_baseline_beside() {
        let json: serde_json::Value =
            serde_json::from_str(&report().to_json().expect("encodes")).expect("valid JSON");
        for key in [
            "executors",
            "tasks",
            "heartbeat_p50_ms",
            "heartbeat_p99_ms",
            "am_cpu_percent",
            "am_rss_bytes",
            "recovery_ms",
            "journal_bytes",
            "memory_rss_bytes",
        ] {
            assert!(json.get(key).is_some(), "{key} missing from {json}");
        }
        assert_eq!(json["heartbeat_p99_ms"], 4.0);
        assert_eq!(json["baseline_no_journal"]["heartbeat_p99_ms"], 2.0);
        assert!(json.get("placement").is_none());
    }

    #[test]
    fn the_table_shows_each_figure_beside_the_baseline_with_the_ratio() {
        let table = report().render_table();
        let p99 = table
            .lines()
            .find(|line| line.trim_start().starts_with("heartbeat p99"))
            .expect("p99 row");
        assert!(
            p99.contains("4.00") && p99.contains("2.00") && p99.contains("2.00x"),
            "{p99}"
        );
        assert!(table.contains("load average 1.50"), "{table}");
        assert!(table.contains("snapshotting every 1 s"), "{table}");
        assert!(table.contains("AM waiting for cpu"), "{table}");
        assert!(table.contains("850 ms"), "{table}");
        assert!(table.contains("10000000 tasks in 512.0 MiB"), "{table}");
        assert!(
            table.contains("1200.0 MiB at the peak of a takeover"),
            "{table}"
        );
    }
}
