//! Pieces shared by the tests that run `sluice` as a process: generated data, job specs, and a
//! running `sluice am`.

#![allow(dead_code)]

pub mod bed;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// What the test gets for `path` from the HTTP server at `address`, with a plain HTTP/1.0 request.
pub fn http_get(address: SocketAddr, path: &str) -> String {
    let mut stream =
        TcpStream::connect_timeout(&address, Duration::from_secs(10)).expect("connect");
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_else(|| panic!("an HTTP response from {address}: {response:?}"))
}

/// `sluice run SPEC` listening at `address`, its rings and state under `root` (`rings`, `state`),
/// with `environment`; its output (stdout and stderr) goes to `root/run.out`, read back by
/// [`run_output`].
pub fn spawn_run(root: &Path, spec: &Path, address: &str, environment: &[(&str, String)]) -> Child {
    let output = std::fs::File::create(root.join("run.out")).expect("output file");
    sluice()
        .arg("run")
        .arg(spec)
        .args(["--listen", address])
        .arg("--ring-dir")
        .arg(root.join("rings"))
        .arg("--state-dir")
        .arg(root.join("state"))
        .envs(environment.iter().map(|(key, value)| (key, value)))
        .env("NO_COLOR", "1")
        .stdout(output.try_clone().expect("output file"))
        .stderr(output)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sluice run")
}

/// What a `sluice run` of [`spawn_run`] under `root` printed, and its executors' logs.
pub fn run_output(root: &Path) -> String {
    format!(
        "{}\n{}",
        std::fs::read_to_string(root.join("run.out")).unwrap_or_default(),
        sluice_testkit::job::logs(&root.join("state"))
    )
}

/// The `sluice` binary under test.
pub fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

/// `sluice consume --ids-out IDS` started as torchrun starts a trainer: rank `rank` of
/// `world_size`, local rank `local` of `local_world_size`, the AM at `am` and its node's daemon's
/// rings under `ring_dir`, and none of the variables the AM sets for the trainers it launches.
pub fn torchrun_consume(
    am: &str,
    ring_dir: &Path,
    ids: &Path,
    (rank, world_size): (u32, u32),
    (local, local_world_size): (u32, u32),
) -> Command {
    let mut command = sluice();
    command
        .args(["consume", "--ids-out"])
        .arg(ids)
        .env_remove("SLUICE_RING")
        .env_remove("SLUICE_RANK")
        .env_remove("SLUICE_WORLD_SIZE")
        .env_remove("SLUICE_JOB")
        .env_remove("SLUICE_TOKEN")
        .env("SLUICE_AM", am)
        .env("SLUICE_RING_DIR", ring_dir)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("LOCAL_RANK", local.to_string())
        .env("LOCAL_WORLD_SIZE", local_world_size.to_string());
    command
}

/// Writes `rows` generated rows in `files` Parquet files of row groups of `row_group_rows` under
/// `directory/data`, and returns that directory.
pub fn generate(directory: &Path, rows: u64, files: u64, row_group_rows: u64) -> PathBuf {
    let data = directory.join("data");
    let status = sluice()
        .args(["gen", "--out"])
        .arg(&data)
        .args(["--rows", &rows.to_string(), "--files", &files.to_string()])
        .args(["--row-group-rows", &row_group_rows.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("run sluice gen");
    assert!(status.success(), "sluice gen failed");
    data
}

/// Writes a job spec to `directory/job.yaml`.
pub fn write_spec(directory: &Path, text: &str) -> PathBuf {
    let spec = directory.join("job.yaml");
    std::fs::write(&spec, text).expect("write job spec");
    spec
}

/// A running `sluice am`, killed with SIGKILL when dropped.
pub struct AmProcess {
    child: Child,
    /// Its gRPC address.
    pub address: String,
    /// Its status page's address, when it was started with `--http`.
    pub http: Option<String>,
    /// Kept open so that the AM's last lines find a reader.
    stdout: BufReader<ChildStdout>,
}

impl AmProcess {
    /// Starts `sluice am SPEC --listen LISTEN EXTRA...` and reads the addresses it prints.
    pub fn start(spec: &Path, listen: &str, extra: &[&str]) -> AmProcess {
        let mut command = sluice();
        command
            .arg("am")
            .arg(spec)
            .args(["--listen", listen])
            .args(extra)
            .env_remove("SLUICE_TOKEN");
        AmProcess::start_command(command, extra.contains(&"--http"))
    }

    /// Starts `command`, a `sluice am` (or a program such as `prlimit` that executes one in its
    /// place), and reads the addresses it prints; `http` says whether it serves its status page.
    pub fn start_command(mut command: Command, http: bool) -> AmProcess {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn sluice am");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
        let mut read_line = |marker: &str| {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read a line of the AM");
            assert!(
                line.contains(marker),
                "expected {marker:?} from sluice am, got {line:?}"
            );
            line.trim()
                .rsplit(' ')
                .next()
                .expect("an address ends the line")
                .to_owned()
        };
        let address = read_line(" serving on ");
        let http = http.then(|| {
            let page = read_line(" status page on ");
            page.strip_prefix("http://")
                .or_else(|| page.strip_prefix("https://"))
                .and_then(|rest| rest.strip_suffix('/'))
                .unwrap_or_else(|| panic!("the status page's address is a URL: {page:?}"))
                .to_owned()
        });
        AmProcess {
            child,
            address,
            http,
            stdout,
        }
    }

    /// The AM's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the AM with SIGKILL.
    pub fn kill(mut self) {
        self.child.kill().expect("kill -9 the AM");
        self.child.wait().expect("reap the AM");
    }

    /// Waits for the AM to exit and returns its success and the rest of its stdout.
    pub fn finish(mut self) -> (bool, String) {
        let status = wait_for_am(&mut self.child);
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).expect("utf-8 stdout");
        (status.success(), rest)
    }
}

impl Drop for AmProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sluice status --json` of the AM at `address`.
pub fn status_json(address: &str) -> serde_json::Value {
    let output = sluice()
        .args(["status", "--json", "--am", address])
        .output()
        .expect("run sluice status");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("status JSON")
}

/// The arguments that serve an AM over TLS with the test PKI's server certificate, asking daemons
/// for certificates its CA signed.
pub fn am_tls_args(pki: &sluice_testkit::pki::Pki) -> Vec<std::ffi::OsString> {
    [
        ("--tls-cert", &pki.server_cert),
        ("--tls-key", &pki.server_key),
        ("--tls-client-ca", &pki.ca),
    ]
    .into_iter()
    .flat_map(|(flag, path)| [flag.into(), path.into()])
    .collect()
}

/// The arguments that make a daemon trust the test PKI's CA and present its client certificate.
pub fn daemon_tls_args(pki: &sluice_testkit::pki::Pki) -> Vec<std::ffi::OsString> {
    [
        ("--tls-ca", &pki.ca),
        ("--tls-cert", &pki.client_cert),
        ("--tls-key", &pki.client_key),
    ]
    .into_iter()
    .flat_map(|(flag, path)| [flag.into(), path.into()])
    .collect()
}

/// A free loopback address for a server to listen on.
pub fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("address").to_string()
}

/// A runtime on the test's thread.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Registers node 0 of job `job` with the AM at `address` as a daemon would, waiting up to 30 s for
/// the AM to listen.
pub fn register_node(
    address: &str,
    job: &str,
) -> Result<tonic::Response<sluice_proto::v1::RegisterReply>, tonic::Status> {
    use sluice_proto::v1::daemon_service_client::DaemonServiceClient;
    runtime().block_on(async move {
        let started = Instant::now();
        let mut client = loop {
            match DaemonServiceClient::connect(format!("http://{address}")).await {
                Ok(client) => break client,
                Err(error) => {
                    assert!(started.elapsed() < Duration::from_secs(30), "{error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        client
            .register(sluice_proto::v1::RegisterRequest {
                node_id: 0,
                job_id: job.into(),
                hostname: "test".into(),
                ..sluice_proto::v1::RegisterRequest::default()
            })
            .await
    })
}

/// Writes the spec of a one-node job named `name` over 1,000 generated rows in `root`, with its
/// journal at `journal`: for tests of the AM alone, which register the node themselves.
pub fn one_node_spec(root: &Path, name: &str, journal: &Path) -> PathBuf {
    let data = generate(root, 1_000, 2, 100);
    write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{}", format: parquet }}]
  task_rows: 250
nodes: 1
roles:
  - {{ name: worker, num: 1, command: [sluice, consume] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}
checkpoint: {{ uri: "file://{}" }}
"#,
            data.display(),
            journal.display()
        ),
    )
}

/// A running `sluice am` whose log goes to a file, for tests that read what it said once it
/// exited; killed with SIGKILL when dropped.
pub struct LoggedAm {
    child: Child,
    log: PathBuf,
    /// Its gRPC address.
    pub address: String,
    /// The address of its status page and HTTP API.
    pub http: String,
}

impl LoggedAm {
    /// Starts `sluice am SPEC` on free loopback addresses, its log in `log`.
    pub fn start(spec: &Path, log: &Path) -> LoggedAm {
        let address = free_address();
        let http = free_address();
        let child = sluice()
            .arg("am")
            .arg(spec)
            .args(["--listen", &address, "--http", &http])
            .env_remove("SLUICE_TOKEN")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("a log"))
            .spawn()
            .expect("spawn sluice am");
        LoggedAm {
            child,
            log: log.to_path_buf(),
            address,
            http,
        }
    }

    /// Waits for the AM to exit, at most 30 s (a deadlock watchdog), and returns whether it
    /// succeeded and its log.
    pub fn exit(mut self) -> (bool, String) {
        let status = wait_for_am(&mut self.child);
        let log = std::fs::read_to_string(&self.log).expect("the AM's log");
        (status.success(), log)
    }
}

impl Drop for LoggedAm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a `sluice am` to exit, at most 30 s (a deadlock watchdog).
fn wait_for_am(child: &mut Child) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "sluice am did not exit within 30 s (deadlock watchdog)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `command` to its end with its output captured, killing it and failing after `limit`
/// (deadlock watchdog).
pub fn output_within(command: &mut Command, limit: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a command");
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match receiver.recv_timeout(limit) {
        Ok(output) => output.expect("wait for a command"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{command:?} did not finish within {limit:?}: killed (deadlock watchdog)");
        }
    }
}
