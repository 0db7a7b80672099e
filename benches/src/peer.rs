//! Two-process runs: the driver keeps the consumer, and re-executes a binary as the producer peer.
//!
//! # Implementation
//!
//! The driver starts a consumer thread, pinned to the consumer core, that sets up its end of the
//! transport (binds the socket, creates the ring or the iceoryx2 subscriber) and then says it is ready.
//! Only then does the driver start the peer process (`sluice-bench ring-peer ...`), so the producer never
//! waits for the consumer to appear. The peer pins itself to the producer core, reads the system-wide
//! monotonic clock just before its first record, produces every record, and prints that start time as one
//! JSON line. The consumer thread reads the same clock after its last record; the difference is the run's
//! time.
//!
//! The driver watches both sides: a peer that exits with a failure, or a run that outlasts
//! [`RUN_TIMEOUT`], ends the run with an error that carries the peer's stderr, and a peer still running
//! then is killed. Closing the peer's stdin tells it the consumer is done; a producer whose records live
//! in its own memory (iceoryx2) waits for that before it exits.

use std::ffi::OsString;
use std::io::{self, BufRead, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::affinity::pin_current_thread;
use crate::error::{BenchError, Result};
use crate::transport::{self, Measurement, Transport};
use crate::workload::{MAX_RECORD_SIZE, MIN_RECORD_SIZE};

/// The longest a two-process run may take, setup included, before its peer is killed.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest the consumer may take to set up its end of the transport.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest the peer may take to exit once the consumer has every record.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a consumer blocked on its transport waits for a producer that stopped sending.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(20);

/// How the driver starts a peer process: a program and the arguments that select the peer subcommand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCommand {
    /// The executable to run.
    pub program: PathBuf,
    /// The arguments before the peer's own, e.g. `["ring-peer"]`.
    pub leading_args: Vec<OsString>,
}

impl PeerCommand {
    /// Runs the current executable, `sluice-bench`, as `sluice-bench ring-peer ...`.
    pub fn current_exe() -> io::Result<PeerCommand> {
        Ok(PeerCommand {
            program: std::env::current_exe()?,
            leading_args: vec!["ring-peer".into()],
        })
    }
}

/// The arguments of the producer peer: `--transport T --size S --count N --path P [--cpu C]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerArgs {
    /// The transport to produce into.
    pub transport: Transport,
    /// The payload bytes of each record.
    pub size: usize,
    /// The records to produce.
    pub count: u64,
    /// The socket or ring file path, or the iceoryx2 service name.
    pub path: String,
    /// The core to pin the producer to.
    pub cpu: Option<usize>,
}

impl PeerArgs {
    fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--transport".into(),
            self.transport.name().into(),
            "--size".into(),
            self.size.to_string().into(),
            "--count".into(),
            self.count.to_string().into(),
            "--path".into(),
            self.path.clone().into(),
        ];
        if let Some(cpu) = self.cpu {
            args.extend(["--cpu".into(), cpu.to_string().into()]);
        }
        args
    }
}

/// The one line a peer prints on stdout when it has produced every record.
#[derive(Debug, Serialize, Deserialize)]
struct PeerReport {
    start_ns: u64,
}

/// Runs the producer side of a two-process run: the body of `sluice-bench ring-peer`.
pub fn peer_main(args: &PeerArgs) -> Result<()> {
    if !(MIN_RECORD_SIZE..=MAX_RECORD_SIZE).contains(&args.size) {
        return Err(BenchError::InvalidPeerArgs {
            reason: format!(
                "--size {} is outside {MIN_RECORD_SIZE}..={MAX_RECORD_SIZE} bytes",
                args.size
            ),
        });
    }
    pin_current_thread(args.cpu).map_err(|source| BenchError::Io {
        transport: args.transport,
        operation: format!("pinning the producer to cpu {:?}", args.cpu),
        source,
    })?;
    transport::produce(args)
}

/// Prints the producer's start time for the driver; every producer calls it once, after its last record.
pub(crate) fn report_start(transport: Transport, start_ns: u64) -> Result<()> {
    let line = serde_json::to_string(&PeerReport { start_ns }).map_err(|error| BenchError::Io {
        transport,
        operation: "encoding the producer report".to_owned(),
        source: error.into(),
    })?;
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|source| BenchError::Io {
            transport,
            operation: "printing the producer report".to_owned(),
            source,
        })
}

/// Blocks until the driver closes this process's stdin, which it does once the consumer has every record.
pub(crate) fn wait_for_driver(transport: Transport) -> Result<()> {
    let mut stdin = io::stdin().lock();
    loop {
        let buffered = stdin.fill_buf().map_err(|source| BenchError::Io {
            transport,
            operation: "waiting for the driver to close stdin".to_owned(),
            source,
        })?;
        if buffered.is_empty() {
            return Ok(());
        }
        let len = buffered.len();
        stdin.consume(len);
    }
}

/// What the consumer thread of a two-process run is given.
#[derive(Debug)]
pub(crate) struct ConsumerContext {
    ready: Option<mpsc::Sender<()>>,
    abort: Arc<AtomicBool>,
}

impl ConsumerContext {
    /// Tells the driver the consumer's end is set up, so it starts the producer.
    pub fn ready(&mut self) {
        if let Some(ready) = self.ready.take() {
            // A driver that stopped listening has given up on the run; the consumer learns it from
            // `aborted`.
            ready.send(()).ok();
        }
    }

    /// Tells whether the driver has given up on the run; a consumer that polls checks it while it waits.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
}

/// The consumer side of a two-process run: sets up its end, calls [`ConsumerContext::ready`], consumes
/// every record and returns the monotonic time at which it finished.
pub(crate) trait ConsumerSide:
    FnOnce(&mut ConsumerContext) -> Result<u64> + Send + 'static
{
}

impl<F: FnOnce(&mut ConsumerContext) -> Result<u64> + Send + 'static> ConsumerSide for F {}

/// Runs one two-process measurement: `consumer` on a thread pinned to `consumer_cpu`, and the peer
/// described by `args` as a child process.
pub(crate) fn run_with_peer(
    peer: &PeerCommand,
    args: PeerArgs,
    consumer_cpu: Option<usize>,
    consumer: impl ConsumerSide,
) -> Result<Measurement> {
    let transport = args.transport;
    let started = Instant::now();
    let abort = Arc::new(AtomicBool::new(false));
    let (ready_sender, ready) = mpsc::channel();
    let mut context = ConsumerContext {
        ready: Some(ready_sender),
        abort: Arc::clone(&abort),
    };
    let consumer_thread = thread::Builder::new()
        .name(format!("{transport}-consumer"))
        .spawn(move || {
            pin_current_thread(consumer_cpu).map_err(|source| BenchError::Io {
                transport,
                operation: format!("pinning the consumer to cpu {consumer_cpu:?}"),
                source,
            })?;
            consumer(&mut context)
        })
        .map_err(|source| BenchError::Io {
            transport,
            operation: "starting the consumer thread".to_owned(),
            source,
        })?;
    let abort_run = |error: BenchError| {
        abort.store(true, Ordering::Relaxed);
        error
    };

    match ready.recv_timeout(SETUP_TIMEOUT) {
        Ok(()) => {}
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err(join(consumer_thread, transport).err().unwrap_or_else(|| {
                BenchError::ShortStream {
                    transport,
                    expected: args.count,
                    received: 0,
                }
            }));
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(abort_run(BenchError::Io {
                transport,
                operation: format!("setting up the consumer took over {SETUP_TIMEOUT:?}"),
                source: io::ErrorKind::TimedOut.into(),
            }));
        }
    }

    let mut child = PeerProcess::spawn(peer, &args)?;
    loop {
        if consumer_thread.is_finished() {
            break;
        }
        if let Some(status) = child.try_wait()?
            && !status.success()
        {
            return Err(abort_run(child.failed(status)));
        }
        if started.elapsed() > RUN_TIMEOUT {
            abort.store(true, Ordering::Relaxed);
            return Err(child.timed_out(args.size));
        }
        thread::sleep(Duration::from_millis(1));
    }

    let end_ns = match join(consumer_thread, transport) {
        Ok(end_ns) => end_ns,
        Err(consumer_error) => {
            // A producer that failed first explains the consumer's error better than the error does.
            return Err(match child.wait_for_exit(EXIT_TIMEOUT)? {
                Some(status) if !status.success() => child.failed(status),
                _ => consumer_error,
            });
        }
    };
    child.close_stdin();
    let status = match child.wait_for_exit(EXIT_TIMEOUT)? {
        Some(status) => status,
        None => return Err(child.timed_out(args.size)),
    };
    if !status.success() {
        return Err(child.failed(status));
    }
    let report = child.report()?;
    Ok(Measurement {
        messages: args.count,
        size: args.size,
        elapsed: Duration::from_nanos(end_ns.saturating_sub(report.start_ns)),
    })
}

fn join<T>(handle: JoinHandle<Result<T>>, transport: Transport) -> Result<T> {
    handle.join().map_err(|_| BenchError::ThreadPanicked {
        transport,
        role: "consumer",
    })?
}

/// A running peer, with its stdout and stderr drained on their own threads so it never blocks on them.
#[derive(Debug)]
struct PeerProcess {
    transport: Transport,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl PeerProcess {
    fn spawn(peer: &PeerCommand, args: &PeerArgs) -> Result<PeerProcess> {
        let mut child = Command::new(&peer.program)
            .args(&peer.leading_args)
            .args(args.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| BenchError::PeerSpawn {
                transport: args.transport,
                program: peer.program.clone(),
                source,
            })?;
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        Ok(PeerProcess {
            transport: args.transport,
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
        })
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.child.try_wait().map_err(|source| BenchError::Io {
            transport: self.transport,
            operation: "checking on the producer process".to_owned(),
            source,
        })
    }

    fn wait_for_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn kill(&mut self) {
        // The child may have exited on its own in the meantime; either way it is gone afterwards.
        self.child.kill().ok();
        self.child.wait().ok();
    }

    fn stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .map(|text| text.trim().to_owned())
            .filter(|text| !text.is_empty())
            .unwrap_or_else(|| "(empty)".to_owned())
    }

    fn failed(&mut self, status: ExitStatus) -> BenchError {
        BenchError::PeerFailed {
            transport: self.transport,
            status,
            stderr: self.stderr(),
        }
    }

    fn timed_out(&mut self, size: usize) -> BenchError {
        self.kill();
        BenchError::PeerTimeout {
            transport: self.transport,
            size,
            timeout: RUN_TIMEOUT,
            stderr: self.stderr(),
        }
    }

    fn report(&mut self) -> Result<PeerReport> {
        let stdout = self
            .stdout
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default();
        serde_json::from_str(stdout.trim()).map_err(|_| BenchError::PeerReport {
            transport: self.transport,
            stdout,
        })
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        // What was read before an error is still worth showing.
        pipe.read_to_end(&mut bytes).ok();
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str) -> PeerCommand {
        PeerCommand {
            program: "/bin/sh".into(),
            leading_args: vec!["-c".into(), script.into(), "peer".into()],
        }
    }

    fn args() -> PeerArgs {
        PeerArgs {
            transport: Transport::UnixSocket,
            size: 64,
            count: 10,
            path: "unused".to_owned(),
            cpu: None,
        }
    }

    #[test]
    fn peer_args_become_the_documented_flags() {
        let sut = PeerArgs {
            cpu: Some(1),
            ..args()
        };
        let flags: Vec<String> = sut
            .to_args()
            .into_iter()
            .map(|flag| flag.into_string().expect("utf-8"))
            .collect();
        assert_eq!(
            flags,
            [
                "--transport",
                "unix_socket",
                "--size",
                "64",
                "--count",
                "10",
                "--path",
                "unused",
                "--cpu",
                "1"
            ]
        );
    }

    #[test]
    fn the_run_lasts_from_the_peer_start_to_the_consumer_end() {
        let peer = shell(r#"echo '{"start_ns": 1000}'"#);
        let measurement = run_with_peer(&peer, args(), None, |context: &mut ConsumerContext| {
            context.ready();
            Ok(1_000_000_000 + 1000)
        })
        .expect("run");
        assert_eq!(measurement.elapsed, Duration::from_secs(1));
        assert_eq!(measurement.messages, 10);
    }

    #[test]
    fn a_failing_peer_is_reported_with_its_stderr() {
        let peer = shell("echo 'ring is busy' >&2; exit 3");
        let error = run_with_peer(&peer, args(), None, |context: &mut ConsumerContext| {
            context.ready();
            while !context.aborted() {
                thread::sleep(Duration::from_millis(1));
            }
            Err(BenchError::ShortStream {
                transport: Transport::UnixSocket,
                expected: 10,
                received: 0,
            })
        })
        .expect_err("peer exits with 3");
        let message = error.to_string();
        assert!(message.contains("ring is busy"), "{message}");
        assert!(message.contains("exit status: 3"), "{message}");
    }

    #[test]
    fn a_peer_that_prints_no_report_is_an_error() {
        let peer = shell("echo hello");
        let error = run_with_peer(&peer, args(), None, |context: &mut ConsumerContext| {
            context.ready();
            Ok(0)
        })
        .expect_err("no report");
        assert!(error.to_string().contains("\"hello\\n\""), "{error}");
    }

    #[test]
    fn a_consumer_that_fails_to_set_up_stops_the_run_before_the_peer_starts() {
        let scratch = tempfile::tempdir().expect("temp dir");
        let marker = scratch.path().join("started");
        let peer = shell(&format!("touch '{}'", marker.display()));
        let error = run_with_peer(&peer, args(), None, |_: &mut ConsumerContext| {
            Err(BenchError::InvalidPeerArgs {
                reason: "setup failed".to_owned(),
            })
        })
        .expect_err("setup fails");
        assert!(error.to_string().contains("setup failed"), "{error}");
        assert!(
            !marker.exists(),
            "the peer ran although the consumer was not ready"
        );
    }
}
