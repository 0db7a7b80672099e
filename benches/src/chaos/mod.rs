//! `sluice-bench chaos`: a job whose node daemons, their supervisors (`sluice shim`), trainers and
//! AM are killed with `kill -9` at random moments, and started again as an operator (or the
//! launcher) would; every id must still reach the trainers exactly once.
//!
//! The job reads `rows` generated rows in eight Parquet files with two node daemons and four reference
//! trainers (`sluice consume --ids-out`), each paced at `trainer_rows_per_s`, shuffled. The launcher
//! starts a killed daemon again (`restart: on-failure`) with the same node id, job and ring directory,
//! and it takes its rings over from their ledgers; a daemon whose shim was killed is stopped by the
//! launcher, which finds it from the identity the shim recorded, and launched again the same way; a
//! killed trainer is launched again with the same rank, ring and ids file, and reads on from its
//! ring (the trainer-restart rule of `docs/architecture.md`); a killed AM (`sluice run`) is started
//! again with the same spec, address and state, replays its journal and adopts the executors. Each
//! kill lands 1 to 3 s after the previous one, once the trainers have received more ids, and none
//! after 90% of the rows. The ids files are then checked: every id once.
//!
//! With [`ChaosOptions::across`], the job runs across the hosts of a test bed instead, with link
//! cuts, AM moves and hangs beside the kills (see [`hosts`]).

mod fenced;
mod hosts;

pub use hosts::HostsPlan;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sluice_testkit::job::{logs, processes_naming, read_ids};

use crate::error::{BenchError, Result};

/// Trainer ranks of the job.
const TRAINERS: usize = 4;
/// Ids kept of each kind of fault in a report.
const SHOWN: usize = 10;

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The `sluice` binary.
    pub sluice: PathBuf,
    /// Rows of the generated dataset.
    pub rows: u64,
    /// Node daemons killed.
    pub daemon_kills: usize,
    /// AM processes killed.
    pub am_kills: usize,
    /// Supervisors (`sluice shim`) of node daemons killed; on one machine only.
    pub shim_kills: usize,
    /// Trainers (`sluice consume`) killed; whoever runs them starts them again on their rings.
    pub trainer_kills: usize,
    /// Rows per second each trainer takes at most, standing for its compute.
    pub trainer_rows_per_s: u64,
    /// The seed of the kill schedule (default: from the clock; the report gives it).
    pub seed: Option<u64>,
    /// Where the data, the ids files, the journal and the executors' logs go, and stay; default: a
    /// temporary directory removed at the end.
    pub directory: Option<PathBuf>,
    /// The whole run must end within this; past it everything is killed (a deadlock watchdog).
    pub watchdog: Duration,
    /// Run across the hosts of a test bed, with these faults beside the kills; `None`: on this
    /// machine, under `sluice run`.
    pub across: Option<HostsPlan>,
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Kill {
    /// `daemon`, `shim` (the supervisor of a daemon), `trainer` or `am` (across hosts, the AM moves
    /// to the other AM host), `link` (a node cable pulled), `link+daemon` (and its daemon killed
    /// while cut off), `link+am` (and the AM moved while it is cut off) or `hang` (a trainer
    /// stopped).
    pub what: &'static str,
    /// Ids the trainers had received when it landed.
    pub after_ids: u64,
    /// Seconds from the start of the job.
    pub at_s: f64,
}

/// What a chaos run found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChaosReport {
    /// Rows of the dataset.
    pub rows: u64,
    /// The seed of the kill schedule.
    pub seed: u64,
    /// The kills, in order.
    pub kills: Vec<Kill>,
    /// Whether the last `sluice run` ended with the job's success.
    pub job_succeeded: bool,
    /// The last lines `sluice run` printed.
    pub outcome: String,
    /// Ids the trainers received, repeats included.
    pub delivered: u64,
    /// Ids received more than once (each extra copy counted).
    pub duplicates: u64,
    /// Ids never received.
    pub missing: u64,
    /// The first ids received twice.
    pub first_duplicates: Vec<i64>,
    /// The first ids never received.
    pub first_missing: Vec<i64>,
    /// Rings that restarted daemons took over from their ledgers.
    pub takeovers: usize,
    /// Ids that trainers started again cut from their ids files: recorded by a killed trainer
    /// before it released their batch, which the ring then gave again.
    pub ids_cut: u64,
    /// Wall time of the whole run, kills and restarts included.
    pub seconds: f64,
    /// Node hosts of a run across hosts; 0 on one machine.
    pub hosts: usize,
    /// Reads of fenced trainers after the AM's last count of their node: void, delivered again.
    pub void_reads: u64,
    /// How long the AM took to notice each link cut, hang and move.
    pub detections: Vec<Detection>,
    /// Rows of the dataset over the run's wall time.
    pub rows_per_s: f64,
}

/// How long one fault took to be noticed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detection {
    /// What was noticed.
    pub what: &'static str,
    /// Seconds from the fault.
    pub seconds: f64,
}

/// The ids the trainers received, checked against the rows of the dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tally {
    delivered: u64,
    duplicates: u64,
    missing: u64,
    first_duplicates: Vec<i64>,
    first_missing: Vec<i64>,
    void: u64,
}

impl Tally {
    /// Every id of `0..rows` once in `ids`?
    fn of(mut ids: Vec<i64>, rows: u64) -> Tally {
        let delivered = ids.len() as u64;
        ids.sort_unstable();
        let first_duplicates: Vec<i64> = ids
            .windows(2)
            .filter(|pair| pair[0] == pair[1])
            .map(|pair| pair[0])
            .take(SHOWN)
            .collect();
        ids.dedup();
        let duplicates = delivered - ids.len() as u64;
        let mut first_missing = Vec::new();
        let mut missing = 0;
        let mut next = ids.iter().peekable();
        for id in 0..rows as i64 {
            if next.next_if_eq(&&id).is_none() {
                missing += 1;
                if first_missing.len() < SHOWN {
                    first_missing.push(id);
                }
            }
        }
        Tally {
            delivered,
            duplicates,
            missing,
            first_duplicates,
            first_missing,
            void: 0,
        }
    }
}

impl ChaosReport {
    /// Whether the job succeeded with every id delivered exactly once.
    pub fn exactly_once(&self) -> bool {
        self.job_succeeded && self.duplicates == 0 && self.missing == 0
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report for a terminal.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let across = if self.hosts > 0 {
            format!(" across {} node hosts", self.hosts)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "chaos{across}: {} rows, {} faults in {:.1} s, {:.0} rows/s (seed {})",
            self.rows,
            self.kills.len(),
            self.seconds,
            self.rows_per_s,
            self.seed
        );
        for kill in &self.kills {
            let fault = match kill.what {
                "daemon" => "kill -9 a daemon",
                "shim" => "kill -9 a daemon's shim",
                "trainer" => "kill -9 a trainer",
                "am" if self.hosts > 0 => "move the AM",
                "am" => "kill -9 the AM",
                "link" => "cut a node's link",
                _ => "stop a trainer",
            };
            let _ = writeln!(
                out,
                "  {fault:<23} at {:>6.1} s, after {} ids",
                kill.at_s, kill.after_ids
            );
        }
        for detection in &self.detections {
            let _ = writeln!(out, "  {}: {:.2} s", detection.what, detection.seconds);
        }
        let _ = writeln!(
            out,
            "rings taken over by restarted daemons: {}",
            self.takeovers
        );
        if self.kills.iter().any(|kill| kill.what == "trainer") {
            let _ = writeln!(
                out,
                "ids recorded by killed trainers, not released, cut by the next: {}",
                self.ids_cut
            );
        }
        if self.hosts > 0 {
            let _ = writeln!(
                out,
                "void reads of fenced trainers, delivered again: {}",
                self.void_reads
            );
        }
        let _ = writeln!(
            out,
            "ids: {} received, {} twice, {} missing{}{}",
            self.delivered,
            self.duplicates,
            self.missing,
            shown(", first repeated", &self.first_duplicates),
            shown(", first missing", &self.first_missing),
        );
        let _ = writeln!(out, "job: {}", self.outcome);
        let verdict = if self.exactly_once() {
            "every id exactly once"
        } else {
            "FAILED: not every id exactly once"
        };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

fn shown(label: &str, ids: &[i64]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!("{label} {ids:?}")
    }
}

/// Runs the job, kills as scheduled, and checks the trainers' ids.
///
/// # Errors
///
/// Fails when the data cannot be generated, a process cannot be started, or the job does not end
/// within the watchdog (everything is killed then, and the error holds the executors' logs). Lost
/// or repeated ids are not an error here: they are in the report.
pub fn run_chaos_bench(options: &ChaosOptions) -> Result<ChaosReport> {
    let seed = options.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    if let Some(plan) = &options.across {
        return hosts::run(options, plan, seed);
    }
    let temporary;
    let root = match &options.directory {
        Some(directory) => {
            std::fs::create_dir_all(directory).map_err(setup(format!(
                "creating the chaos directory {}",
                directory.display()
            )))?;
            directory.clone()
        }
        None => {
            temporary = tempfile::tempdir().map_err(setup("creating a temporary directory"))?;
            temporary.path().to_path_buf()
        }
    };
    let rings = tempfile::Builder::new()
        .prefix("sluice-chaos")
        .tempdir_in("/dev/shm")
        .map_err(setup("creating a ring directory in /dev/shm"))?;
    let job = Job::prepare(options, &root, rings.path())?;
    let started = Instant::now();
    let mut run = job.start(0)?;
    let kills = match job.kill_on_schedule(options, seed, started, &mut run) {
        Ok(kills) => kills,
        Err(error) => {
            job.kill_everything(run);
            return Err(error);
        }
    };
    let (job_succeeded, stdout) = job.finish(run, started, options.watchdog)?;
    let seconds = started.elapsed().as_secs_f64();
    let ids: Vec<i64> = (0..TRAINERS)
        .flat_map(|rank| read_ids(&job.ids_file(rank)))
        .collect();
    let tally = Tally::of(ids, options.rows);
    let logs = job.logs();
    Ok(ChaosReport {
        rows: options.rows,
        seed,
        kills,
        job_succeeded,
        outcome: stdout
            .lines()
            .rev()
            .find(|line| line.contains(" job "))
            .unwrap_or("sluice run printed no outcome")
            .trim()
            .to_owned(),
        delivered: tally.delivered,
        duplicates: tally.duplicates,
        missing: tally.missing,
        first_duplicates: tally.first_duplicates,
        first_missing: tally.first_missing,
        takeovers: logs
            .matches("took over a ring this node fed before it restarted")
            .count(),
        ids_cut: ids_cut(&logs),
        seconds,
        hosts: 0,
        void_reads: 0,
        detections: Vec::new(),
        rows_per_s: options.rows as f64 / seconds,
    })
}

/// The ids that trainers started again cut from their ids files, as they said in `logs`.
fn ids_cut(logs: &str) -> u64 {
    const CUT: &str = "sluice consume: cut ";
    logs.match_indices(CUT)
        .filter_map(|(at, _)| {
            logs[at + CUT.len()..]
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// A running `sluice run`, its stdout read by a thread; its stderr goes to `am-logs/am-<n>.log`.
struct Run {
    child: Child,
    stdout: JoinHandle<String>,
}

/// The job's files and how to start it.
struct Job {
    sluice: PathBuf,
    root: PathBuf,
    rings: PathBuf,
    state: PathBuf,
    spec: PathBuf,
    listen: String,
    rows: u64,
}

impl Job {
    /// Generates the data and writes the spec.
    fn prepare(options: &ChaosOptions, root: &Path, rings: &Path) -> Result<Job> {
        let data = root.join("data");
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(setup(format!(
                "removing the data of an earlier run at {}",
                data.display()
            )))?;
        }
        generate(options, &data)?;
        for rank in 0..TRAINERS {
            // The ids file, and beside it the places of its batches in the ring.
            for name in [
                format!("ids-{rank}.bin"),
                format!("ids-{rank}.bin.positions"),
            ] {
                let file = root.join(name);
                if file.exists() {
                    std::fs::remove_file(&file)
                        .map_err(setup(format!("removing {}", file.display())))?;
                }
            }
        }
        let journal = root.join("journal");
        let state = root.join("state");
        let am_logs = root.join("am-logs");
        for directory in [&journal, &state, &am_logs] {
            if directory.exists() {
                std::fs::remove_dir_all(directory)
                    .map_err(setup(format!("removing {}", directory.display())))?;
            }
        }
        std::fs::create_dir_all(&am_logs)
            .map_err(setup(format!("creating {}", am_logs.display())))?;
        let spec = root.join("chaos.yaml");
        let text = format!(
            r#"
name: chaos
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 50000
  batch_size: 1000
  shuffle: {{ seed: 3, window: 2 }}
nodes: 2
roles:
  - {{ name: worker, num: {TRAINERS}, command: ["{sluice}", consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "{rate}"] }}
failover: {{ restart: on-failure, max_failures: 50, heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{journal}" }}
"#,
            data = data.display(),
            sluice = options.sluice.display(),
            root = root.display(),
            rate = options.trainer_rows_per_s,
            journal = journal.display(),
        );
        std::fs::write(&spec, text).map_err(setup(format!("writing {}", spec.display())))?;
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(setup("finding a free port for the AM"))?
            .to_string();
        Ok(Job {
            sluice: options.sluice.clone(),
            root: root.to_path_buf(),
            rings: rings.to_path_buf(),
            state,
            spec,
            listen,
            rows: options.rows,
        })
    }

    /// Where the `sluice run`s write their stderr.
    fn am_logs(&self) -> PathBuf {
        self.root.join("am-logs")
    }

    /// Every log of the run: the executors' and the AMs'.
    fn logs(&self) -> String {
        logs(&self.state) + &logs(&self.am_logs())
    }

    fn ids_file(&self, rank: usize) -> PathBuf {
        self.root.join(format!("ids-{rank}.bin"))
    }

    /// Ids the trainers have written so far.
    fn delivered(&self) -> u64 {
        (0..TRAINERS)
            .map(|rank| std::fs::metadata(self.ids_file(rank)).map_or(0, |file| file.len() / 8))
            .sum()
    }

    /// Starts `sluice run` of the job, the `index`th time (0 the first; its stderr goes to
    /// `am-logs/am-<index>.log`).
    fn start(&self, index: usize) -> Result<Run> {
        let log_path = self.am_logs().join(format!("am-{index}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(setup(format!("creating {}", log_path.display())))?;
        let mut command = Command::new(&self.sluice);
        command
            .arg("run")
            .arg(&self.spec)
            .args(["--listen", &self.listen])
            .arg("--ring-dir")
            .arg(&self.rings)
            .arg("--state-dir")
            .arg(&self.state)
            .env("SLUICE_LOG", "warn,sluice_daemon=info")
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = command.spawn().map_err(|source| BenchError::ToolMissing {
            program: self.sluice.display().to_string(),
            purpose: "running the chaos job".to_owned(),
            reason: source.to_string(),
            fix: "build it with `cargo build --release -p sluice-cli`, beside sluice-bench"
                .to_owned(),
        })?;
        let mut output = child.stdout.take().ok_or_else(|| BenchError::Chaos {
            reason: "sluice run has no stdout pipe".to_owned(),
            logs: String::new(),
        })?;
        let stdout =
            std::thread::spawn(move || std::io::read_to_string(&mut output).unwrap_or_default());
        Ok(Run { child, stdout })
    }

    /// Kills daemons, their shims, trainers and the AM in a random order (every kind once before
    /// any twice), each once the trainers moved on.
    fn kill_on_schedule(
        &self,
        options: &ChaosOptions,
        seed: u64,
        started: Instant,
        run: &mut Run,
    ) -> Result<Vec<Kill>> {
        let mut random = seed;
        let victims = schedule(
            &[
                ("daemon", options.daemon_kills),
                ("am", options.am_kills),
                ("shim", options.shim_kills),
                ("trainer", options.trainer_kills),
            ],
            &mut random,
        );
        let late = self.rows * 9 / 10;
        let mut kills = Vec::new();
        let mut last_seen = 0;
        for victim in victims {
            loop {
                random = mix(random);
                std::thread::sleep(Duration::from_millis(1000 + random % 2000));
                if started.elapsed() > options.watchdog {
                    return Err(BenchError::Chaos {
                        reason: format!(
                            "only {} kills within {:?} ({kills:?}): the trainers stopped receiving ids",
                            kills.len(),
                            options.watchdog
                        ),
                        logs: self.logs(),
                    });
                }
                let ended = run
                    .child
                    .try_wait()
                    .map_err(setup("waiting for sluice run"))?;
                if ended.is_some() {
                    // The job ended (or its AM failed) before every kill: the report tells.
                    return Ok(kills);
                }
                let seen = self.delivered();
                if seen > last_seen || seen >= late {
                    last_seen = seen;
                    break;
                }
            }
            if last_seen >= late {
                break;
            }
            let at_s = started.elapsed().as_secs_f64();
            if victim == "am" {
                let _ = run.child.kill();
                let _ = run.child.wait();
                let restarts = kills.iter().filter(|kill| kill.what == "am").count();
                *run = self.start(restarts + 1)?;
                kills.push(Kill {
                    what: "am",
                    after_ids: last_seen,
                    at_s,
                });
                continue;
            }
            let live = match victim {
                "shim" => daemon_shims(&self.rings),
                // A trainer names the run's directory in its --ids-out.
                "trainer" => processes_naming(&self.root, Some("consume")),
                _ => processes_naming(&self.rings, Some("daemon")),
            };
            let Some(pid) = live.get((random >> 32) as usize % live.len().max(1)) else {
                continue;
            };
            let killed = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .is_ok_and(|status| status.success());
            if killed {
                kills.push(Kill {
                    what: victim,
                    after_ids: last_seen,
                    at_s,
                });
            }
        }
        Ok(kills)
    }

    /// Waits for `sluice run` to end; past the watchdog, kills everything and fails.
    fn finish(&self, mut run: Run, started: Instant, watchdog: Duration) -> Result<(bool, String)> {
        loop {
            let exited = run
                .child
                .try_wait()
                .map_err(setup("waiting for sluice run"))?;
            if let Some(status) = exited {
                let stdout = run.stdout.join().unwrap_or_default();
                return Ok((status.success(), stdout));
            }
            if started.elapsed() > watchdog {
                self.kill_everything(run);
                return Err(BenchError::Chaos {
                    reason: format!(
                        "sluice run did not finish within {watchdog:?}: killed (deadlock watchdog)"
                    ),
                    logs: self.logs(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills `sluice run` and every executor, all of which name a directory of the run.
    fn kill_everything(&self, mut run: Run) {
        let _ = run.child.kill();
        let _ = run.child.wait();
        for directory in [&self.root, &self.rings] {
            for pid in processes_naming(directory, None) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

/// Generates the job's dataset, `options.rows` rows in eight Parquet files, into `data`.
/// The supervisors (`sluice shim`) of the node daemons whose rings are under `rings`.
fn daemon_shims(rings: &Path) -> Vec<u32> {
    processes_naming(rings, Some("shim"))
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|command_line| {
                command_line
                    .split(|byte| *byte == 0)
                    .any(|argument| argument == b"daemon")
            })
        })
        .collect()
}

fn generate(options: &ChaosOptions, data: &Path) -> Result<()> {
    let mut generate = Command::new(&options.sluice);
    generate
        .args(["gen", "--out"])
        .arg(data)
        .args(["--rows", &options.rows.to_string(), "--files", "8"])
        .args(["--row-group-rows", "50000"]);
    crate::command::run_timed(&mut generate, Duration::from_secs(600))?;
    Ok(())
}

fn setup(operation: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let operation = operation.into();
    move |source| BenchError::Setup { operation, source }
}

/// The faults of a run in a random order drawn from `random`, in rounds: each round has one fault
/// of every kind with faults left, shuffled, so that a run whose data ends before its last faults
/// has still seen every kind.
fn schedule(kinds: &[(&'static str, usize)], random: &mut u64) -> Vec<&'static str> {
    let rounds = kinds.iter().map(|(_, count)| *count).max().unwrap_or(0);
    let mut faults = Vec::new();
    for round in 0..rounds {
        let mut this_round: Vec<&'static str> = kinds
            .iter()
            .filter(|(_, count)| *count > round)
            .map(|(kind, _)| *kind)
            .collect();
        for index in (1..this_round.len()).rev() {
            *random = mix(*random);
            this_round.swap(index, *random as usize % (index + 1));
        }
        faults.extend(this_round);
    }
    faults
}

/// A SplitMix64 step, for the kill schedule.
fn mix(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^ (state >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(job_succeeded: bool, duplicates: u64, missing: u64) -> ChaosReport {
        ChaosReport {
            rows: 10,
            seed: 1,
            kills: vec![Kill {
                what: "daemon",
                after_ids: 4,
                at_s: 1.5,
            }],
            job_succeeded,
            outcome: "sluice run: job chaos succeeded".to_owned(),
            delivered: 10 + duplicates - missing,
            duplicates,
            missing,
            first_duplicates: Vec::new(),
            first_missing: Vec::new(),
            takeovers: 1,
            ids_cut: 0,
            seconds: 3.0,
            hosts: 0,
            void_reads: 0,
            detections: Vec::new(),
            rows_per_s: 10.0 / 3.0,
        }
    }

    #[test]
    fn exactly_once_needs_success_and_neither_repeats_nor_gaps() {
        assert!(report(true, 0, 0).exactly_once());
        assert!(!report(false, 0, 0).exactly_once());
        assert!(!report(true, 1, 0).exactly_once());
        assert!(!report(true, 0, 1).exactly_once());
        assert!(
            report(true, 0, 0)
                .render()
                .contains("every id exactly once")
        );
        assert!(report(true, 0, 1).render().contains("FAILED"));
    }

    #[test]
    fn a_schedule_has_every_kind_in_each_round_and_every_fault_once() {
        let kinds = [("daemon", 3), ("am", 2), ("shim", 0), ("trainer", 1)];
        let mut random = 7;
        let sut = schedule(&kinds, &mut random);
        assert_eq!(sut.len(), 6);
        let mut first_round = sut[..3].to_vec();
        first_round.sort_unstable();
        assert_eq!(first_round, ["am", "daemon", "trainer"]);
        let mut second_round = sut[3..5].to_vec();
        second_round.sort_unstable();
        assert_eq!(second_round, ["am", "daemon"]);
        assert_eq!(sut[5], "daemon");
        let mut again = 7;
        assert_eq!(schedule(&kinds, &mut again), sut, "one seed, one schedule");
        assert_eq!(again, random);
    }

    #[test]
    fn the_first_ids_missing_are_shown() {
        assert_eq!(Tally::of(vec![0, 0, 2], 3).first_missing, vec![1]);
    }

    #[test]
    fn the_ids_cut_are_summed_from_what_the_trainers_said() {
        let logs = "sluice consume: cut 1000 ids from /r/ids-0.bin: ...\nother\n\
                    sluice consume: cut 24 ids from /r/ids-3.bin: ...\n";
        assert_eq!(ids_cut(logs), 1024);
        assert_eq!(ids_cut("sluice consume: waiting up to 60 s"), 0);
    }
}
