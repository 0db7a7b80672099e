//! The multi-host test bed (`sluice_testkit::netbed`) on the real path: hosts that reach each other
//! by address and by name, private `/dev/shm` and `/tmp` that last as long as the bed, pulled cables,
//! the delaying proxy between hosts, SeaweedFS on a host, a Sluice job on one host reading S3 on
//! another, and a bed that leaves nothing behind, whether dropped, panicked out of or killed.
//!
//! Every test needs root and network namespaces: a plain `cargo test` lists them as ignored, and
//! `./scripts/test.sh` runs them with `--ignored`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use sluice_testkit::job::read_ids;
use sluice_testkit::{DelayProxy, Host, NetBed};

use common::bed::Running;
use common::output_within;

/// How long a server on a host may take to listen, or a cable to carry again.
const READY_WATCHDOG: Duration = Duration::from_secs(30);
/// The port of the HTTP servers the tests run on hosts.
const HTTP_PORT: u16 = 8000;
/// Set in the child process of `a_bed_left_by_a_killed_test_is_removed_by_the_next_one`.
const STALE_CHILD: &str = "SLUICE_NETBED_STALE_CHILD";

/// Makes a bed, failing the test with the reason when namespaces are refused.
fn bed(names: &[&str]) -> NetBed {
    NetBed::new(names).unwrap_or_else(|error| panic!("{error}"))
}

/// Runs `script` with `sh -c` on `host` and returns its standard output, failing on an error.
fn shell(host: &Host, script: &str) -> String {
    let output = output_within(host.command("sh").args(["-c", script]), READY_WATCHDOG);
    assert!(
        output.status.success(),
        "{script:?} on {}: {}",
        host.name(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether `host` opens a TCP connection to `target` (a name or an address) within three seconds.
fn host_connects(host: &Host, target: &str, port: u16) -> bool {
    let script =
        "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)";
    output_within(
        host.command("python3")
            .args(["-c", script, target, &port.to_string()]),
        READY_WATCHDOG,
    )
    .status
    .success()
}

/// What `host` gets for `url` over HTTP.
fn host_fetches(host: &Host, url: &str) -> String {
    let script = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())";
    let output = output_within(
        host.command("python3").args(["-c", script, url]),
        READY_WATCHDOG,
    );
    assert!(
        output.status.success(),
        "{} fetching {url}: {}",
        host.name(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Starts `python3 -m http.server` on `host`, on its address, serving `directory` (a path on the
/// host), and waits until the test reaches it through the root leg.
fn serve_http(host: &Host, directory: &str) -> Running {
    let server = host
        .command("python3")
        .args(["-m", "http.server", &HTTP_PORT.to_string()])
        .args([
            "--bind",
            &host.address().to_string(),
            "--directory",
            directory,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn python3 -m http.server");
    let server = Running(server);
    wait_until_reachable(SocketAddr::from((host.address(), HTTP_PORT)));
    server
}

/// Waits until the test process connects to `address`, failing after the watchdog.
fn wait_until_reachable(address: SocketAddr) {
    let started = Instant::now();
    while TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err() {
        assert!(
            started.elapsed() < READY_WATCHDOG,
            "{address} is not reachable from the test within {READY_WATCHDOG:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `sleep 600` on `host`, its output going nowhere: a process that outlives a failed test
/// holds no pipe of the test's.
fn spawn_sleep(host: &Host) -> Child {
    host.command("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sleep")
}

/// Whether the process `pid` still runs: it exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
    })
}

/// The network namespaces `ip netns` lists.
fn netns_names() -> Vec<String> {
    let output = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The mount points of the test's namespace.
fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("the mount table")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(str::to_owned)
        .collect()
}

/// Fails unless nothing is left of the host `host` of the bed `index`, whose process `pid` ran on it:
/// the process, the host's network namespace, and its namespaces' files and mounts. Names are
/// checked with the host's name, which no other test uses, since a bed made later may take the index.
fn assert_nothing_left(index: u32, host: &str, pid: u32) {
    assert!(!alive(pid), "process {pid} of host {host} still runs");
    let netns = format!("sluice-netbed-{index}-{host}");
    assert!(
        !netns_names().contains(&netns),
        "network namespace {netns} is left"
    );
    let namespace_file = format!("/run/sluice-netbed/{index}/ns/{host}.mnt");
    assert!(
        !mount_points().contains(&namespace_file),
        "the mount of {namespace_file} is left"
    );
    assert!(
        !Path::new(&namespace_file).exists(),
        "{namespace_file} is left"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn hosts_reach_each_other_by_address_and_by_name() {
    let bed = bed(&["n1", "n2"]);
    let (n1, n2) = (bed.host("n1"), bed.host("n2"));
    // Written to n2's private /tmp, so only a server on n2 can serve it.
    shell(n2, "echo served-by-n2 > /tmp/page.txt");
    let _server = serve_http(n2, "/tmp");
    let by_name = host_fetches(n1, &format!("http://n2:{HTTP_PORT}/page.txt"));
    assert_eq!(by_name, "served-by-n2\n", "n1 fetches from n2 by name");
    let by_address = host_fetches(n1, &format!("http://{}:{HTTP_PORT}/page.txt", n2.address()));
    assert_eq!(
        by_address, "served-by-n2\n",
        "n1 fetches from n2 by address"
    );
    let from_test = common::http_get(
        SocketAddr::from((bed.address("n2"), HTTP_PORT)),
        "/page.txt",
    );
    assert_eq!(from_test, "served-by-n2\n", "the test fetches from n2");
    assert_eq!(
        shell(n2, "getent hosts n1").split_whitespace().next(),
        Some(n1.address().to_string().as_str()),
        "n2 resolves n1 to its address"
    );
    assert!(
        !host_connects(n1, "1.1.1.1", 80),
        "a host has no route out of the bed"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn every_host_has_its_own_hostname() {
    let own = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let bed = bed(&["am", "n1", "s3"]);
    for host in bed.hosts() {
        assert_eq!(shell(host, "hostname").trim(), host.name());
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname"),
        own,
        "the test's hostname is unchanged"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn dev_shm_and_tmp_are_private_to_each_host_and_last_as_long_as_the_bed() {
    let bed = bed(&["shm1", "shm2"]);
    let (first, second) = (bed.host("shm1"), bed.host("shm2"));
    // Unique to this bed of this process: a file a broken run left in the test's /dev/shm is not it.
    let name = format!("netbed-probe-{}-{}", std::process::id(), bed.index());
    shell(
        first,
        &format!("echo written-on-shm1 > /dev/shm/{name} && echo also > /tmp/{name}"),
    );
    assert_eq!(
        shell(first, &format!("cat /dev/shm/{name} /tmp/{name}")),
        "written-on-shm1\nalso\n",
        "a later process on the host sees what an earlier one left"
    );
    assert_eq!(
        shell(
            second,
            &format!("ls /dev/shm/{name} /tmp/{name} 2>/dev/null; true")
        ),
        "",
        "another host sees neither file"
    );
    for directory in ["/dev/shm", "/tmp"] {
        assert!(
            !Path::new(directory).join(&name).exists(),
            "the test's {directory} does not have the host's file"
        );
    }
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn a_host_runs_the_callers_programs_from_under_tmp_and_keeps_the_rest_of_tmp_its_own() {
    let caller = tempfile::Builder::new()
        .prefix("netbed-caller-")
        .tempdir_in("/tmp")
        .expect("a directory under the test's /tmp");
    let program = caller.path().join("bin/hello");
    std::fs::create_dir_all(program.parent().expect("a folder")).expect("mkdir");
    std::fs::write(
        &program,
        "#!/bin/sh\necho \"hello from $(hostname)\" > \"$1\"\n",
    )
    .expect("write the program");
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let elsewhere = tempfile::Builder::new()
        .prefix("netbed-not-shared-")
        .tempdir_in("/tmp")
        .expect("another directory under the test's /tmp");
    let bed =
        NetBed::sharing(&["tmp1"], &[caller.path()]).unwrap_or_else(|error| panic!("{error}"));
    let host = bed.host("tmp1");
    let written = caller.path().join("written-by-the-host");
    let output = output_within(host.command(&program).arg(&written), READY_WATCHDOG);
    assert!(
        output.status.success(),
        "{} on the host: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&written).expect("what the host wrote, in the caller's directory"),
        "hello from tmp1\n"
    );
    assert_eq!(
        shell(
            host,
            &format!("ls -d {} 2>/dev/null; true", elsewhere.path().display())
        ),
        "",
        "the rest of the caller's /tmp stays hidden"
    );
    // The test's own binaries, wherever its target directory is (CARGO_TARGET_DIR under /tmp too).
    let own = std::env::current_exe().expect("the test's executable");
    shell(host, &format!("test -x '{}'", own.display()));
    assert!(
        bed.caller_dirs().iter().any(|dir| dir == caller.path()),
        "{:?}",
        bed.caller_dirs()
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn a_pulled_cable_cuts_the_host_off_until_it_is_plugged_back() {
    let bed = bed(&["cut1", "cut2"]);
    let (first, second) = (bed.host("cut1"), bed.host("cut2"));
    let _server = serve_http(second, "/tmp");
    let server = SocketAddr::from((second.address(), HTTP_PORT));
    let test_listener = TcpListener::bind((bed.root_address(), 0)).expect("listen on the root leg");
    let test_port = test_listener.local_addr().expect("its address").port();
    let root = bed.root_address().to_string();
    assert!(host_connects(first, "cut2", HTTP_PORT), "connected before");
    assert!(
        host_connects(second, &root, test_port),
        "reaches the test before"
    );

    second.link_down();
    assert!(
        !host_connects(first, "cut2", HTTP_PORT),
        "cut2 cannot be reached from cut1 with its cable out"
    );
    assert!(
        TcpStream::connect_timeout(&server, Duration::from_secs(3)).is_err(),
        "cut2 cannot be reached from the test with its cable out"
    );
    assert!(
        !host_connects(second, &root, test_port),
        "cut2 cannot reach the test with its cable out"
    );

    second.link_up();
    let started = Instant::now();
    while !host_connects(first, "cut2", HTTP_PORT) {
        assert!(
            started.elapsed() < READY_WATCHDOG,
            "cut2 is still cut off {READY_WATCHDOG:?} after its cable was plugged back"
        );
    }
    wait_until_reachable(server);
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn kill_all_ends_every_process_of_one_host() {
    let bed = bed(&["doomed", "spared"]);
    let mut doomed = Running(spawn_sleep(bed.host("doomed")));
    let mut spared = Running(spawn_sleep(bed.host("spared")));
    // A grandchild, which the test never saw.
    let grandchild = shell(bed.host("doomed"), "sleep 600 >/dev/null 2>&1 & echo $!");
    let grandchild: u32 = grandchild.trim().parse().expect("a pid");
    assert!(alive(grandchild), "the grandchild runs");

    bed.host("doomed").kill_all();
    // kill_all returns once its processes are gone, so the sleep has ended.
    let status = doomed.0.try_wait().expect("try_wait");
    assert!(
        status.is_some_and(|status| status.signal() == Some(9)),
        "the host's process is killed with SIGKILL: {status:?}"
    );
    assert!(!alive(grandchild), "the grandchild is killed too");
    assert!(
        spared.0.try_wait().expect("try_wait").is_none(),
        "the other host's process still runs"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn dropping_the_bed_removes_everything_even_when_the_test_panics() {
    let mut left = None;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let bed = bed(&["dropped"]);
        let sleeper = spawn_sleep(bed.host("dropped"));
        std::fs::write(bed.shared_dir().join("marker"), "x").expect("write a shared file");
        // A proxy on the root leg, which outlives the bed: its address goes with the bed.
        let proxy = DelayProxy::start(
            SocketAddr::from((bed.root_address(), 0)),
            SocketAddr::from((bed.root_address(), 1)),
            Duration::ZERO,
            None,
        );
        left = Some((bed.index(), bed.directory().to_owned(), sleeper, proxy));
        panic!("the test fails midway");
    }));
    assert!(panicked.is_err(), "the closure panicked");
    let (index, directory, mut sleeper, proxy) = left.expect("the bed was made");
    let (stopped, proxy_stopped) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(proxy);
        let _ = stopped.send(());
    });
    proxy_stopped
        .recv_timeout(READY_WATCHDOG)
        .expect("a proxy whose address went with the bed stops when dropped");
    let status = sleeper.try_wait().expect("try_wait");
    assert!(
        status.is_some_and(|status| status.signal() == Some(9)),
        "the bed's drop killed the host's process: {status:?}"
    );
    assert_nothing_left(index, "dropped", sleeper.id());
    assert!(
        !directory.join("shared/marker").exists(),
        "the shared directory is removed"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn a_bed_left_by_a_killed_test_is_removed_by_the_next_one() {
    if std::env::var_os(STALE_CHILD).is_some() {
        // The child: makes a bed with a process on it, says so, and waits to be killed.
        let bed = bed(&["orphan"]);
        let sleeper = Running(spawn_sleep(bed.host("orphan")));
        println!("netbed-child: bed {} pid {}", bed.index(), sleeper.0.id());
        std::io::stdout().flush().expect("flush");
        std::thread::sleep(Duration::from_secs(600));
        panic!("the child was not killed within 600 s");
    }
    // A bed of the test's own takes an index below the child's, so that the next bed, made once it
    // is dropped, takes that one, and the child's is removed by the sweep of the beds left behind.
    let holder = bed(&["holder"]);
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "a_bed_left_by_a_killed_test_is_removed_by_the_next_one",
            "--ignored",
            "--nocapture",
        ])
        .env(STALE_CHILD, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child test");
    let child_stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
    let line = child_stdout
        .lines()
        .map(|line| line.expect("the child's output"))
        .find(|line| line.starts_with("netbed-child: "))
        .expect("the child reports its bed");
    let words: Vec<&str> = line.split_whitespace().collect();
    let (index, pid): (u32, u32) = match words[..] {
        [_, "bed", index, "pid", pid] => (
            index.parse().expect("an index"),
            pid.parse().expect("a pid"),
        ),
        _ => panic!("the child's report: {line:?}"),
    };
    child.kill().expect("kill -9 the child test");
    child.wait().expect("reap the child test");
    assert!(alive(pid), "the orphan host's process outlives its test");
    assert!(
        netns_names().contains(&format!("sluice-netbed-{index}-orphan")),
        "the killed test's bed is left"
    );

    assert!(
        index > holder.index(),
        "the child's bed is above the test's"
    );
    drop(holder);
    let _next = bed(&["successor"]);
    assert_nothing_left(index, "orphan", pid);
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn the_proxy_delays_what_one_host_fetches_from_another_and_counts_it() {
    let bed = bed(&["client", "server"]);
    let payload = "0123456789".repeat(100_000);
    shell(
        bed.host("server"),
        "python3 -c 'print(\"0123456789\" * 100000, end=\"\")' > /tmp/payload",
    );
    let _server = serve_http(bed.host("server"), "/tmp");
    let delay = Duration::from_millis(200);
    let proxy = DelayProxy::start(
        SocketAddr::from((bed.root_address(), 0)),
        SocketAddr::from((bed.address("server"), HTTP_PORT)),
        delay,
        None,
    );
    let started = Instant::now();
    let fetched = host_fetches(
        bed.host("client"),
        &format!("http://{}/payload", proxy.address()),
    );
    let elapsed = started.elapsed();
    assert!(fetched == payload, "the payload arrives whole");
    assert!(
        elapsed >= 2 * delay,
        "a request and its answer each take the delay: {elapsed:?}"
    );
    assert!(
        proxy.bytes_to_client() >= payload.len() as u64,
        "the proxy counts the payload: {} bytes",
        proxy.bytes_to_client()
    );
    assert!(
        proxy.bytes_to_upstream() > 0,
        "the proxy counts the request"
    );
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn seaweedfs_on_a_host_takes_a_write_from_the_test() {
    let bed = bed(&["s3"]);
    let server = sluice_testkit::start_seaweed_on(bed.host("s3"));
    assert_eq!(
        server.address(),
        SocketAddr::from((bed.address("s3"), sluice_testkit::S3_PORT))
    );
    let options = sluice_testkit::s3_options_at(server.address());
    common::runtime().block_on(async {
        sluice_testkit::wait_for_bucket(&server, &options).await;
        let store = sluice_testkit::s3_store(&options);
        let path = object_store::path::Path::from("netbed/written-by-the-test");
        store
            .put(
                &path,
                object_store::PutPayload::from_static(b"across the bed"),
            )
            .await
            .expect("put");
        let read = store
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(&read[..], b"across the bed");
    });
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn a_job_on_one_host_reads_every_row_once_from_s3_on_another() {
    const ROWS: i64 = 100_000;
    let bed = bed(&["n1", "n2", "s3"]);
    let server = sluice_testkit::start_seaweed_on(bed.host("s3"));
    common::runtime().block_on(sluice_testkit::wait_for_bucket(
        &server,
        &sluice_testkit::s3_options_at(server.address()),
    ));
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let uri = format!("s3://{}/train", sluice_testkit::BUCKET);

    // n2 writes the data straight to the S3 host.
    let generated = output_within(
        bed.host("n2")
            .command(sluice)
            .args(["gen", "--out", &uri, "--rows", &ROWS.to_string()])
            .args(["--files", "4", "--row-group-rows", "10000"])
            .args(storage_option_arguments(server.address())),
        Duration::from_secs(120),
    );
    assert!(
        generated.status.success(),
        "sluice gen on n2: {}\n{}",
        String::from_utf8_lossy(&generated.stderr),
        server.log()
    );
    let report: serde_json::Value =
        serde_json::from_slice(&generated.stdout).expect("the JSON of sluice gen");
    let written = report["bytes"].as_u64().expect("bytes written");

    // n1 reads it through a proxy on the test's root leg, which counts what it reads.
    let proxy = DelayProxy::start(
        SocketAddr::from((bed.root_address(), 0)),
        server.address(),
        Duration::from_millis(2),
        None,
    );
    let shared = bed.shared_dir();
    let storage_options: Vec<String> = sluice_testkit::s3_options_at(proxy.address())
        .into_iter()
        .map(|(key, value)| format!("{key}: \"{value}\""))
        .collect();
    // Unique to this process: rings a broken run left in the test's /dev/shm are not this job's.
    let job = format!("netbed-s3-{}", std::process::id());
    let spec = shared.join("job.yaml");
    std::fs::write(
        &spec,
        format!(
            r#"
name: {job}
data:
  sources: [{{ uri: "{uri}", format: parquet, storage_options: {{ {options} }} }}]
  task_rows: 5000
  batch_size: 1024
nodes: 2
roles:
  - {{ name: worker, num: 2, command: ["{sluice}", consume, --ids-out, "{shared}/ids-{{rank}}.bin"] }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 10000 }}
"#,
            options = storage_options.join(", "),
            shared = shared.display(),
        ),
    )
    .expect("write the job spec");
    let run = output_within(
        bed.host("n1")
            .command(sluice)
            .arg("run")
            .arg(&spec)
            .args(["--ring-size", &(16 << 20).to_string(), "--state-dir"])
            .arg(shared.join("state")),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "sluice run on n1 failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&run.stderr),
        sluice_testkit::job::logs(&shared.join("state"))
    );
    assert!(stdout.contains(&format!("job {job} succeeded")), "{stdout}");
    let mut ids: Vec<i64> = (0..2)
        .flat_map(|rank| read_ids(&shared.join(format!("ids-{rank}.bin"))))
        .collect();
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "some ids were delivered twice");
    assert_eq!(ids, (0..ROWS).collect::<Vec<_>>(), "every id delivered");
    assert!(
        proxy.bytes_to_client() >= written,
        "n1 read the data from S3 through the proxy: {} bytes read, {written} written",
        proxy.bytes_to_client()
    );
    // `sluice run` removed the trainers' rings from n1's /dev/shm at its end; no other host, nor
    // the test, had them.
    let rings = format!("/dev/shm/sluice/{job}");
    let has_rings = |host: &Host| shell(host, &format!("test -e {rings} && echo yes || echo no"));
    assert_eq!(
        has_rings(bed.host("n1")),
        "no\n",
        "n1's rings {rings} are removed"
    );
    assert_eq!(
        has_rings(bed.host("n2")),
        "no\n",
        "n2 does not have {rings}"
    );
    assert!(
        !Path::new(&rings).exists(),
        "the test does not have {rings}"
    );
}

/// `--storage-option key=value` for each S3 option that reaches `endpoint`.
fn storage_option_arguments(endpoint: SocketAddr) -> Vec<String> {
    sluice_testkit::s3_options_at(endpoint)
        .into_iter()
        .flat_map(|(key, value)| ["--storage-option".to_owned(), format!("{key}={value}")])
        .collect()
}
