//! The journal's benchmark, in two parts, each against a baseline run side by side:
//!
//! - appends of heartbeat events with 1, 16 and 256 concurrent appenders on a local directory:
//!   entries per second and append-to-durable latency (p50, p99), for the group-committing journal
//!   and for one `write` + `fdatasync` per append under a lock;
//! - a snapshot of a task table of `--tasks` tasks (10 million by default): its size, the time to
//!   encode it, to make it durable and to open the journal again, in postcard through the journal
//!   and in JSON (`serde_json`) for comparison.
//!
//! `cargo bench -p sluice-am --bench journal -- [--dir DIR] [--seconds S] [--tasks N]
//! [--write-interval-ms N]`, where `S` is the number of one-second rounds of each kind per appender
//! count.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_am::decide::{
    DataPosition, Event, NodeId, NodeRecord, NodeStatus, TaskId, TaskProgress, TaskRecord,
    TaskStatus,
};
use sluice_am::journal::{self, JournalConfig, StorageOptions};

struct Options {
    directory: Option<PathBuf>,
    seconds: u64,
    tasks: u64,
    write_interval: Duration,
}

fn parse_options() -> Options {
    let mut options = Options {
        directory: None,
        seconds: 3,
        tasks: 10_000_000,
        write_interval: Duration::ZERO,
    };
    let mut arguments = std::env::args().skip(1);
    while let Some(argument) = arguments.next() {
        let mut value = |name: &str| {
            arguments
                .next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match argument.as_str() {
            // `cargo bench` passes this to every bench binary.
            "--bench" => {}
            "--dir" => options.directory = Some(PathBuf::from(value("--dir"))),
            "--seconds" => options.seconds = value("--seconds").parse().expect("--seconds N"),
            "--tasks" => options.tasks = value("--tasks").parse().expect("--tasks N"),
            "--write-interval-ms" => {
                options.write_interval = Duration::from_millis(
                    value("--write-interval-ms")
                        .parse()
                        .expect("--write-interval-ms N"),
                );
            }
            other => panic!(
                "unknown argument {other:?}; use --dir DIR, --seconds S, --tasks N, --write-interval-ms N"
            ),
        }
    }
    options
}

/// A heartbeat of a node holding four tasks, with counts of a job hours in.
fn heartbeat(node: u64, beat: u64) -> Event {
    let now_ms = 1_790_000_000_000 + beat * 500;
    Event::Heartbeat {
        node: NodeId(node),
        now_ms,
        progress: (0..4)
            .map(|task| TaskProgress {
                task: TaskId(1_000_000 + node * 16 + task),
                enqueued: 2_000_000 + beat * 40 + task * 1000,
                consumed: 2_000_000 + beat * 40,
            })
            .collect(),
    }
}

/// How long each measured round of appends lasts.
const ROUND: Duration = Duration::from_secs(1);

/// What runs of appenders measured.
#[derive(Default)]
struct Figures {
    entries: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    writes: u64,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.entries as f64 / self.elapsed.as_secs_f64()
    }

    fn add(&mut self, round: Figures) {
        self.entries += round.entries;
        self.elapsed += round.elapsed;
        self.latencies.extend(round.latencies);
        self.writes += round.writes;
    }

    /// The latency at `fraction` of the sorted latencies.
    fn percentile(&self, fraction: f64) -> Duration {
        let index = ((self.latencies.len() - 1) as f64 * fraction).round() as usize;
        self.latencies[index]
    }
}

/// The snapshot the benchmark's journal takes: a task table's position alone.
#[derive(PartialEq, serde::Serialize, serde::Deserialize)]
struct TableSnapshot(DataPosition);

impl journal::SnapshotFormat for TableSnapshot {}

async fn journal_appends(
    directory: &Path,
    appenders: u64,
    duration: Duration,
    write_interval: Duration,
) -> Figures {
    let uri = directory.to_str().expect("utf-8 path").to_string();
    let (journal, _) = journal::open::<Event, TableSnapshot>(
        &uri,
        &StorageOptions::new(),
        JournalConfig::new("bench").write_interval(write_interval),
    )
    .await
    .expect("opens");
    let journal = Arc::new(journal);
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..appenders)
        .map(|node| {
            let journal = Arc::clone(&journal);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut beat = 0;
                while Instant::now() < deadline {
                    let event = heartbeat(node, beat);
                    let appended = Instant::now();
                    journal.append(&event).await.expect("durable");
                    latencies.push(appended.elapsed());
                    beat += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("appender"));
    }
    let elapsed = started.elapsed();
    let journal = Arc::into_inner(journal).expect("appenders done");
    let writes = journal.stats().writes;
    journal.close().await.expect("closes");
    Figures {
        entries: latencies.len() as u64,
        elapsed,
        latencies,
        writes,
    }
}

/// The baseline: each appender encodes the same frame and writes it with its own `write` and
/// `fdatasync`, holding a lock on the file.
fn synced_appends(directory: &Path, appenders: u64, duration: Duration) -> Figures {
    std::fs::create_dir_all(directory).expect("directory");
    let file = Arc::new(Mutex::new(
        File::create(directory.join("baseline.log")).expect("baseline file"),
    ));
    let started = Instant::now();
    let deadline = started + duration;
    let threads: Vec<_> = (0..appenders)
        .map(|node| {
            let file = Arc::clone(&file);
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut beat = 0;
                while Instant::now() < deadline {
                    let event = heartbeat(node, beat);
                    let appended = Instant::now();
                    let body = postcard::to_stdvec(&event).expect("encodes");
                    let mut frame = Vec::with_capacity(body.len() + 8);
                    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
                    frame.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
                    frame.extend_from_slice(&body);
                    {
                        let mut file = file.lock().expect("lock");
                        file.write_all(&frame).expect("write");
                        file.sync_data().expect("fdatasync");
                    }
                    latencies.push(appended.elapsed());
                    beat += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for thread in threads {
        latencies.extend(thread.join().expect("appender"));
    }
    let count = latencies.len() as u64;
    Figures {
        entries: count,
        elapsed: started.elapsed(),
        latencies,
        writes: count,
    }
}

fn build_position(tasks: u64) -> DataPosition {
    let mut pending = Vec::new();
    let records = (0..tasks)
        .map(|task| {
            let status = match task % 10 {
                0..=5 => TaskStatus::Done,
                6 | 7 => {
                    pending.push(TaskId(task));
                    TaskStatus::Pending
                }
                8 => TaskStatus::InFlight {
                    node: NodeId(task % 64),
                    enqueued: 90_000 + task % 1000,
                    consumed: 80_000 + task % 1000,
                    stop_at: None,
                },
                _ => TaskStatus::Failed,
            };
            TaskRecord {
                split: (task / 8) as u32,
                start: (task % 8) * 125_000,
                end: (task % 8 + 1) * 125_000,
                failures: (task % 3) as u32,
                status,
            }
        })
        .collect();
    DataPosition {
        epoch: 0,
        first_task_id: 0,
        tasks: records,
        pending,
        requeued: 0,
        nodes: (0..64)
            .map(|node| NodeRecord {
                node: NodeId(node),
                status: NodeStatus::Alive,
                failures: 0,
            })
            .collect(),
        done_rows: tasks / 10 * 6 * 125_000,
        failed_rows: tasks / 10 * 125_000,
        total_failures: 0,
        outcome: None,
        splits: None,
        following: false,
    }
}

fn directory_size(directory: &Path) -> u64 {
    std::fs::read_dir(directory)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .filter_map(|entry| entry.metadata().ok())
                .map(|metadata| metadata.len())
                .sum()
        })
        .unwrap_or(0)
}

async fn snapshot_figures(directory: &Path, tasks: u64) {
    let position = build_position(tasks);
    let uri = directory.to_str().expect("utf-8 path").to_string();
    let (journal, _) = journal::open::<Event, TableSnapshot>(
        &uri,
        &StorageOptions::new(),
        JournalConfig::new("bench"),
    )
    .await
    .expect("opens");
    let started = Instant::now();
    let encoded_bytes = postcard::to_stdvec(&position).expect("postcard encodes");
    let encoded = started.elapsed();
    drop(encoded_bytes);
    // The journal encodes the snapshot on its own thread, after `snapshot` returns: the time to
    // durable counts the encoding again.
    let queued = TableSnapshot(position.clone());
    let started = Instant::now();
    journal.snapshot(queued).await.expect("snapshot durable");
    let written = started.elapsed();
    journal.close().await.expect("closes");
    let size = directory_size(&directory.join("snapshot"));
    let started = Instant::now();
    let (journal, recovered) = journal::open::<Event, TableSnapshot>(
        &uri,
        &StorageOptions::new(),
        JournalConfig::new("bench"),
    )
    .await
    .expect("reopens");
    let opened = started.elapsed();
    assert!(
        recovered.snapshot.as_ref().map(|snapshot| &snapshot.0) == Some(&position),
        "the snapshot reads back as written"
    );
    drop(recovered);
    journal.close().await.expect("closes");

    let started = Instant::now();
    let json = serde_json::to_vec(&position).expect("json encodes");
    let json_encoded = started.elapsed();
    let started = Instant::now();
    let decoded: DataPosition = serde_json::from_slice(&json).expect("json decodes");
    let json_decoded = started.elapsed();
    assert!(decoded == position, "json reads back as written");

    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    println!();
    println!("snapshot of {tasks} tasks");
    println!(
        "| format | size | encode | durable (encode + crc + write + fdatasync) | open (read + crc + decode) |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| postcard (journal) | {:.1} MiB | {:.2} s | {:.2} s | {:.2} s |",
        mib(size),
        encoded.as_secs_f64(),
        written.as_secs_f64(),
        opened.as_secs_f64()
    );
    println!(
        "| JSON (serde_json, in memory, no IO) | {:.1} MiB ({:.2}× postcard) | {:.2} s ({:.2}×) | | decode {:.2} s ({:.2}× the journal's whole open) |",
        mib(json.len() as u64),
        json.len() as f64 / size as f64,
        json_encoded.as_secs_f64(),
        json_encoded.as_secs_f64() / encoded.as_secs_f64(),
        json_decoded.as_secs_f64(),
        json_decoded.as_secs_f64() / opened.as_secs_f64()
    );
}

fn main() {
    let options = parse_options();
    let scratch = match &options.directory {
        Some(directory) => tempfile::tempdir_in(directory),
        None => tempfile::tempdir(),
    }
    .expect("scratch directory");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "appends of a heartbeat event ({} bytes encoded) in {}, {} rounds of one second each, journal write interval {:?}",
        postcard::to_stdvec(&heartbeat(1, 1))
            .expect("encodes")
            .len(),
        scratch.path().display(),
        options.seconds,
        options.write_interval
    );
    println!(
        "| appenders | journal entries/s | p50 | p99 | entries per write | write + fdatasync per append: entries/s | p50 | p99 | journal ÷ baseline |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for appenders in [1, 16, 256] {
        // The two alternate in one-second rounds, so that the disk's other traffic (fsync latency
        // on a shared disk varies by the second) falls on both alike.
        let mut journal = Figures::default();
        let mut baseline = Figures::default();
        for round in 0..options.seconds {
            let directory = scratch.path().join(format!("journal-{appenders}-{round}"));
            journal.add(runtime.block_on(journal_appends(
                &directory,
                appenders,
                ROUND,
                options.write_interval,
            )));
            let directory = scratch.path().join(format!("baseline-{appenders}-{round}"));
            baseline.add(synced_appends(&directory, appenders, ROUND));
        }
        journal.latencies.sort_unstable();
        baseline.latencies.sort_unstable();
        let micros = |latency: Duration| format!("{:.0} µs", latency.as_secs_f64() * 1e6);
        println!(
            "| {appenders} | {:.0} | {} | {} | {:.1} | {:.0} | {} | {} | {:.1}× |",
            journal.rate(),
            micros(journal.percentile(0.5)),
            micros(journal.percentile(0.99)),
            journal.entries as f64 / journal.writes as f64,
            baseline.rate(),
            micros(baseline.percentile(0.5)),
            micros(baseline.percentile(0.99)),
            journal.rate() / baseline.rate()
        );
    }
    runtime.block_on(snapshot_figures(
        &scratch.path().join("snapshot-journal"),
        options.tasks,
    ));
}
