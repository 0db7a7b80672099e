//! A real `sluice am` held to 1,024 open files (`prlimit --nofile=1024:1024`) and flooded with
//! thousands of connections that show no token (silent, half-closed, or stopped in the middle of
//! an HTTP/1.1 request or of the HTTP/2 preface) on both its ports: the job's daemon and trainer
//! go on, the AM does not step down, the job succeeds with every row once, and the AM closes the
//! idle connections, so its open descriptors fall back to what the job needs. An AM whose callers
//! (which show the token) take every descriptor it may open waits for one where its journal needs
//! it, instead of stepping down. And an AM raises its limit of open files to the hard limit.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{AmProcess, generate, sluice, write_spec};
use sluice_testkit::job::read_ids;

const ROWS: u64 = 20_000;
const TOKEN: &str = "the-jobs-token";
/// Connections opened to each of the AM's ports.
const FLOOD: usize = 5_000;
/// The threads that open the connections of a flood.
const FLOOD_THREADS: usize = 16;
/// The limit of open files the AM runs under, the common default.
const AM_OPEN_FILES: u32 = 1_024;
/// The limit of open files of an AM whose callers take every descriptor it may open.
const AM_FEW_OPEN_FILES: u32 = 128;
/// How many more descriptors than before the flood the AM may hold once it has closed the
/// connections that showed no token: status calls in flight, a reconnecting client.
const DESCRIPTOR_MARGIN: usize = 64;
/// Bounds on waits for events (deadlock watchdogs), not times the test expects.
const WATCHDOG: Duration = Duration::from_secs(60);

/// The job: its journal takes a snapshot every second, and so starts a new segment file each
/// second, which needs a descriptor.
fn spec(directory: &Path, data: &Path) -> PathBuf {
    write_spec(
        directory,
        &format!(
            "name: flooded\n\
             data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 1000\n  batch_size: 250\n\
             nodes: 1\n\
             launcher: {{ kind: external }}\n\
             roles:\n  - {{ name: worker, num: 1 }}\n\
             failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 3000 }}\n\
             checkpoint: {{ uri: \"file://{}\", interval_s: 1 }}\n",
            data.display(),
            directory.join("checkpoints").display()
        ),
    )
}

/// `sluice am SPEC` on loopback with its status page, under `prlimit --nofile=SOFT:HARD`, its log
/// in `log` when given.
fn am_under_prlimit(spec: &Path, soft: u32, hard: u32, log: Option<&Path>) -> AmProcess {
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={soft}:{hard}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg("am")
        .arg(spec)
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .env("SLUICE_TOKEN", TOKEN)
        .env("NO_COLOR", "1");
    if let Some(log) = log {
        command.stderr(std::fs::File::create(log).expect("the AM's log"));
    }
    AmProcess::start_command(command, true)
}

fn daemon(am: &str, ring_dir: &Path) -> Child {
    sluice()
        .args(["daemon", "--am", am, "--node-id", "0"])
        .arg("--ring-dir")
        .arg(ring_dir)
        .env("SLUICE_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice daemon")
}

/// The job's one trainer, reading at most 2,000 rows per second so that the job lasts through the
/// flood.
fn trainer(am: &str, ring_dir: &Path, ids: &Path) -> Child {
    common::torchrun_consume(am, ring_dir, ids, (0, 1), (0, 1))
        .args(["--max-rows-per-s", "2000"])
        .env("SLUICE_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice consume")
}

/// `sluice status --json` of the AM at `address`, with the job's token.
fn status(address: &str) -> serde_json::Value {
    let output = sluice()
        .args(["status", "--json", "--am", address])
        .env("SLUICE_TOKEN", TOKEN)
        .output()
        .expect("run sluice status");
    assert!(
        output.status.success(),
        "sluice status: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("status JSON")
}

/// Polls the AM's status until `done` holds of it, failing after the watchdog with the last one.
fn wait_for_status(
    address: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let status = status(address);
        if done(&status) {
            return status;
        }
        assert!(
            started.elapsed() < WATCHDOG,
            "waited {WATCHDOG:?} for {what}: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn rows_consumed(status: &serde_json::Value) -> u64 {
    status["tasks"]["rows_consumed"].as_u64().unwrap_or(0)
}

fn node_alive(status: &serde_json::Value) -> bool {
    status["nodes"]
        .as_array()
        .is_some_and(|nodes| nodes.len() == 1 && nodes[0]["state"] == "alive")
}

/// Waits for `child` to exit, failing after the watchdog, and returns whether it succeeded.
fn exits_successfully(child: &mut Child) -> bool {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.success();
        }
        assert!(started.elapsed() < WATCHDOG, "a process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many descriptors the process `pid` has open, failing when it has exited.
fn open_descriptors(pid: u32) -> usize {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    assert!(
        !matches!(state, None | Some("Z" | "X")),
        "the AM (pid {pid}) exited"
    );
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the AM's descriptors (the test runs as the AM's user)")
        .count()
}

/// Opens `count` connections to `address` that never complete a request: in turn silent, a
/// partial HTTP/1.1 request line, a partial HTTP/2 preface, and a partial request after which the
/// client closes its side (half-closed). Writes to a connection the AM closed already fail, and
/// are not checked.
///
/// The connections are opened from [`FLOOD_THREADS`] threads: a connection the kernel completes
/// waits in the listener's queue until the AM accepts it, and one that finds the queue full is
/// tried again by the kernel a second later, so one thread alone would spend its time waiting.
fn flood(address: SocketAddr, count: usize) -> Vec<TcpStream> {
    let opened: Vec<Vec<TcpStream>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..FLOOD_THREADS)
            .map(|thread| {
                scope.spawn(move || {
                    (thread..count)
                        .step_by(FLOOD_THREADS)
                        .map(|index| half_open(address, index))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().expect("a flooding thread"))
            .collect()
    });
    opened.into_iter().flatten().collect()
}

/// Connection `index` of a flood of `address`: see [`flood`].
fn half_open(address: SocketAddr, index: usize) -> TcpStream {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(10))
        .unwrap_or_else(|error| panic!("connection {index} to {address}: {error}"));
    match index % 4 {
        0 => {}
        1 => {
            let _ = stream.write_all(b"GET /api/status HTTP/1.1\r\nHost: am\r\n");
        }
        2 => {
            let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nS");
        }
        _ => {
            let _ = stream.write_all(b"POST /sluice.v1.DaemonService/Heart");
            let _ = stream.shutdown(Shutdown::Write);
        }
    }
    stream.set_nonblocking(true).expect("a non-blocking socket");
    stream
}

/// How many of `connections` the far end has closed.
fn closed_by_the_am(connections: &[TcpStream]) -> usize {
    let mut buffer = [0; 512];
    connections
        .iter()
        .filter(|&stream| {
            loop {
                let mut reader: &TcpStream = stream;
                match reader.read(&mut buffer) {
                    Ok(0) => break true,
                    // An answer, such as a refusal of the partial request: read on to the end.
                    Ok(_) => {}
                    Err(error) if error.kind() == ErrorKind::WouldBlock => break false,
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break true,
                }
            }
        })
        .count()
}

#[test]
fn thousands_of_connections_without_a_token_do_not_stop_an_am_held_to_1024_open_files() {
    let limit = sluice_process::raise_open_files_limit().expect("raise the test's own limit");
    let needed = (2 * FLOOD + 1_000) as u64;
    assert!(
        limit.after >= needed,
        "the test holds {needed} connections open and may open {} files: raise the hard limit (ulimit -Hn)",
        limit.after
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), ROWS, 4, 1000);
    let spec = spec(directory.path(), &data);
    let am = am_under_prlimit(&spec, AM_OPEN_FILES, AM_OPEN_FILES, None);
    let http: SocketAddr = am
        .http
        .as_deref()
        .expect("started with --http")
        .parse()
        .expect("the status page's address");
    let grpc: SocketAddr = am.address.parse().expect("the AM's address");

    let ring_dir = directory.path().join("shm");
    let ids = directory.path().join("ids.bin");
    let mut daemon = daemon(&am.address, &ring_dir);
    let mut trainer = trainer(&am.address, &ring_dir, &ids);
    let before = wait_for_status(&am.address, "the job to read rows", |status| {
        rows_consumed(status) > 0
    });
    let descriptors_before = open_descriptors(am.pid());

    let mut connections = flood(grpc, FLOOD);
    connections.extend(flood(http, FLOOD));

    // The daemon's heartbeats and the trainer's reads go on while the connections are open.
    let during = wait_for_status(
        &am.address,
        "the job to read on and its node to stay alive, under the flood",
        |status| rows_consumed(status) > rows_consumed(&before) && node_alive(status),
    );
    assert_eq!(during["state"], "running", "{during}");

    // The AM closes the connections that showed no token, and holds no more descriptors than the
    // job needs.
    let started = Instant::now();
    loop {
        let descriptors = open_descriptors(am.pid());
        if descriptors <= descriptors_before + DESCRIPTOR_MARGIN {
            break;
        }
        assert!(
            started.elapsed() < WATCHDOG,
            "the AM holds {descriptors} descriptors {WATCHDOG:?} after the flood, {descriptors_before} before it; {} of the {} connections were closed",
            closed_by_the_am(&connections),
            connections.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let closed = closed_by_the_am(&connections);
    assert!(
        closed > 0,
        "the AM's descriptors fell back, so it closed connections: the clients saw none close"
    );
    let after = status(&am.address);
    assert!(node_alive(&after), "{after}");

    assert!(exits_successfully(&mut trainer), "the trainer failed");
    let (succeeded, rest) = am.finish();
    assert!(
        succeeded,
        "the AM exits 0 once the job succeeded, without stepping down: {rest}"
    );
    assert!(rest.contains("succeeded"), "{rest}");
    assert!(exits_successfully(&mut daemon), "the daemon failed");
    drop(connections);

    let mut seen = read_ids(&ids);
    seen.sort_unstable();
    let expected: Vec<i64> = (0..ROWS as i64).collect();
    assert_eq!(seen, expected, "every row exactly once");
}

#[test]
fn an_am_whose_callers_take_every_descriptor_waits_for_one_and_does_not_step_down() {
    sluice_process::raise_open_files_limit().expect("raise the test's own limit");
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), ROWS, 4, 1000);
    let spec = spec(directory.path(), &data);
    let log = directory.path().join("am.log");
    let am = am_under_prlimit(&spec, AM_FEW_OPEN_FILES, AM_FEW_OPEN_FILES, Some(&log));
    let http: SocketAddr = am
        .http
        .as_deref()
        .expect("started with --http")
        .parse()
        .expect("the status page's address");
    let ring_dir = directory.path().join("shm");
    let ids = directory.path().join("ids.bin");
    let mut daemon = daemon(&am.address, &ring_dir);
    let mut trainer = trainer(&am.address, &ring_dir, &ids);
    wait_for_status(&am.address, "the job to read rows", |status| {
        rows_consumed(status) > 0
    });

    // Callers that show the token keep their connections, which no guard closes: one after the
    // other, each answered, until they hold every descriptor the AM may open.
    let mut callers: Vec<TcpStream> = Vec::new();
    while open_descriptors(am.pid()) < AM_FEW_OPEN_FILES as usize {
        assert!(
            callers.len() < AM_FEW_OPEN_FILES as usize,
            "{} callers and the AM still has descriptors free",
            callers.len()
        );
        let mut stream = TcpStream::connect_timeout(&http, Duration::from_secs(10))
            .unwrap_or_else(|error| panic!("caller {}: {error}", callers.len()));
        write!(
            stream,
            "GET /api/tasks HTTP/1.1\r\nHost: am\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        )
        .expect("send a request with the token");
        stream
            .set_read_timeout(Some(WATCHDOG))
            .expect("a read timeout");
        let mut answer = [0; 64];
        let read = stream.read(&mut answer).expect("the AM answers the caller");
        if read == 0 {
            // The caller took the AM's last descriptor: its next accept found none, and it closed
            // the connection that had not yet shown its token to keep one for the job.
            break;
        }
        assert!(
            answer[..read].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer[..read])
        );
        callers.push(stream);
    }
    // And one more, which shows its token from the listener's queue: it takes the descriptor the
    // journal held for a moment when the count was taken, if it did, and keeps it. One alone: with
    // another behind it, the AM would close it to make room before reading its request.
    let mut queued =
        TcpStream::connect_timeout(&http, Duration::from_secs(10)).expect("a queued caller");
    write!(
        queued,
        "GET /api/tasks HTTP/1.1\r\nHost: am\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    )
    .expect("send a queued request with the token");
    callers.push(queued);
    // The journal finds no descriptor for its next segment (or for a check): it waits for one, or,
    // taking the shortage for a lost journal, the AM steps down.
    let started = Instant::now();
    let said = loop {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if said.contains("the journal waits for a file descriptor") || said.contains("steps down") {
            break said;
        }
        assert!(
            started.elapsed() < WATCHDOG,
            "the AM's journal never ran out of descriptors: {said}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!said.contains("steps down"), "{said}");
    drop(callers);

    assert!(exits_successfully(&mut trainer), "the trainer failed");
    let (succeeded, rest) = am.finish();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        succeeded && rest.contains("succeeded"),
        "the AM exits 0 once the job succeeded, without stepping down: {rest}\n{said}"
    );
    assert!(!said.contains("steps down"), "{said}");
    assert!(exits_successfully(&mut daemon), "the daemon failed");
    let mut seen = read_ids(&ids);
    seen.sort_unstable();
    let expected: Vec<i64> = (0..ROWS as i64).collect();
    assert_eq!(seen, expected, "every row exactly once");
}

#[test]
fn the_am_raises_its_limit_of_open_files_to_the_hard_limit() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), 1_000, 1, 500);
    let spec = spec(directory.path(), &data);
    // The AM raises the limit before it says where it serves.
    let am = am_under_prlimit(&spec, 512, 4096, None);
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", am.pid())).expect("the AM's limits");
    let open_files: Vec<&str> = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a limit of open files")
        .split_whitespace()
        .collect();
    assert_eq!(open_files[3..5], ["4096", "4096"], "{limits}");
    am.kill();
}
