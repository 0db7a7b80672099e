//! A journal writer (`journal-writer`) is killed with SIGKILL at random moments, many times, and a
//! new one reopens the journal each time, over a local directory and over S3. Every number a writer
//! acknowledged must be recovered, in order, none twice, and nothing past the appends it had in
//! flight.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_am::journal::{self, JournalConfig, StorageOptions};
use sluice_testkit::{BUCKET, s3_options, start_seaweed, wait_for_bucket};
use sluice_tests::{Count, mix};

/// The writer's appends in flight (appended, not yet printed) at most: `WINDOW` in journal_writer.rs.
const WINDOW: u64 = 512;
/// How long a writer may take to open the journal before the test fails.
const OPEN_WATCHDOG: Duration = Duration::from_secs(60);

/// What the parent knows between runs: every number below `acknowledged` was printed as durable,
/// and no number at or above `appended_bound` was ever appended.
#[derive(Debug, Clone, Copy)]
struct Known {
    acknowledged: u64,
    appended_bound: u64,
}

impl Known {
    fn check(&self, recovered: u64, context: &str) {
        assert!(
            recovered >= self.acknowledged,
            "{context}: recovered {recovered} numbers, but {} were acknowledged",
            self.acknowledged
        );
        assert!(
            recovered <= self.appended_bound,
            "{context}: recovered {recovered} numbers, but at most {} were ever appended",
            self.appended_bound
        );
    }
}

/// One writer's life: what it said it recovered (if it got that far) and the numbers it printed.
struct Life {
    recovered: Option<u64>,
    printed: Vec<u64>,
    stderr: String,
}

/// Runs one writer and kills it `delay` after it reports what it recovered, or `delay` after its
/// start when `early` (possibly while it opens the journal).
fn live_and_die(uri: &str, options: &StorageOptions, delay: Duration, early: bool) -> Life {
    let mut writer = Command::new(env!("CARGO_BIN_EXE_journal-writer"))
        .arg(uri)
        .args(options.iter().map(|(key, value)| format!("{key}={value}")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn journal-writer");
    let stdout = writer.stdout.take().expect("stdout");
    let (lines, received) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdout.read_until(b'\n', &mut line) {
                // A line cut by the kill has no newline: the parent never saw that number.
                Ok(0) => return,
                Ok(_) if line.last() != Some(&b'\n') => return,
                Ok(_) => {
                    let text = String::from_utf8(line[..line.len() - 1].to_vec()).expect("utf-8");
                    if lines.send(text).is_err() {
                        return;
                    }
                }
                Err(error) => panic!("reading the writer's stdout: {error}"),
            }
        }
    });
    let mut life = Life {
        recovered: None,
        printed: Vec::new(),
        stderr: String::new(),
    };
    if early {
        std::thread::sleep(delay);
    } else {
        match received.recv_timeout(OPEN_WATCHDOG) {
            Ok(line) => life.recovered = Some(parse_recovered(&line)),
            Err(_) => {
                let _ = writer.kill();
                let _ = writer.wait();
                let mut stderr = String::new();
                let _ = writer
                    .stderr
                    .take()
                    .expect("stderr")
                    .read_to_string(&mut stderr);
                panic!("the writer did not open {uri} within {OPEN_WATCHDOG:?}:\n{stderr}");
            }
        }
        std::thread::sleep(delay);
    }
    writer.kill().expect("SIGKILL");
    let status = writer.wait().expect("wait");
    writer
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut life.stderr)
        .expect("read stderr");
    reader.join().expect("reader");
    for line in received.try_iter() {
        if life.recovered.is_none() {
            life.recovered = Some(parse_recovered(&line));
        } else {
            life.printed.push(line.parse().expect("a number per line"));
        }
    }
    assert!(
        status.code().is_none(),
        "the writer exited by itself ({status}) instead of being killed:\n{}",
        life.stderr
    );
    life
}

fn parse_recovered(line: &str) -> u64 {
    line.strip_prefix("recovered ")
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("expected `recovered <count>`, got {line:?}"))
}

/// Kills `kills` writers of the journal at `uri` and checks what each next one recovers.
fn kill_repeatedly(uri: &str, options: &StorageOptions, kills: u32, delays_ms: (u64, u64)) {
    let mut random = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    eprintln!("{uri}: kill schedule seed {random}");
    let mut known = Known {
        acknowledged: 0,
        appended_bound: 0,
    };
    let mut killed_mid_stream = 0;
    for kill in 0..kills {
        random = mix(random);
        let early = random.is_multiple_of(6);
        let delay = if early {
            Duration::from_millis(random % 40)
        } else {
            Duration::from_millis(delays_ms.0 + (random >> 8) % (delays_ms.1 - delays_ms.0))
        };
        let context = format!("{uri}, writer {kill}");
        let life = live_and_die(uri, options, delay, early);
        let Some(recovered) = life.recovered else {
            continue;
        };
        known.check(recovered, &context);
        let expected: Vec<u64> = (recovered..recovered + life.printed.len() as u64).collect();
        assert_eq!(
            life.printed, expected,
            "{context}: acknowledgements out of order\n{}",
            life.stderr
        );
        if !life.printed.is_empty() {
            killed_mid_stream += 1;
        }
        let acknowledged = recovered + life.printed.len() as u64;
        known = Known {
            acknowledged,
            appended_bound: acknowledged + WINDOW,
        };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let recovered = runtime.block_on(async {
        let (journal, recovered) = journal::open::<u64, Count>(
            uri,
            options,
            JournalConfig::new("journal-crash").writer("journal_crash test"),
        )
        .await
        .expect("the journal opens after the last kill");
        journal.close().await.expect("closes");
        recovered
    });
    let start = recovered.snapshot.map_or(0, |Count(count)| count);
    let expected: Vec<u64> = (start..start + recovered.entries.len() as u64).collect();
    assert_eq!(recovered.entries, expected, "{uri}: after snapshot {start}");
    known.check(
        start + recovered.entries.len() as u64,
        &format!("{uri}, at the end"),
    );
    eprintln!(
        "{uri}: {kills} kills, {killed_mid_stream} mid-stream, {} numbers acknowledged, {} recovered",
        known.acknowledged,
        start + recovered.entries.len() as u64
    );
    assert!(
        killed_mid_stream * 2 >= kills,
        "{uri}: only {killed_mid_stream} of {kills} writers acknowledged anything before the kill; the test did not exercise appends"
    );
}

#[test]
fn killed_journal_writers_lose_nothing_acknowledged_on_a_local_directory() {
    let directory = tempfile::tempdir().expect("tempdir");
    let uri = format!("file://{}/ckpt", directory.path().display());
    kill_repeatedly(&uri, &StorageOptions::new(), 40, (5, 300));
}

#[test]
fn killed_journal_writers_lose_nothing_acknowledged_on_s3() {
    let server = start_seaweed();
    let options = s3_options();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(wait_for_bucket(&server, &options));
    kill_repeatedly(&format!("s3://{BUCKET}/crash"), &options, 16, (50, 600));
}
