//! An AM moved to another host, on the multi-host test bed: the job's journal and checkpoints are
//! on S3 (SeaweedFS on a host of its own), the AM serves over TLS with a token and asks the daemons
//! for their certificates, and on two other hosts a `sluice daemon` sidecar feeds a `sluice
//! consume` trainer. Mid-run the AM's host dies (every process on it killed, its cable pulled); an
//! AM started on another host with the same checkpoint location takes the journal over and writes
//! its address there, the daemons find it, and the job ends with every row delivered exactly once.
//!
//! Needs root and network namespaces: a plain `cargo test` lists it as ignored, and
//! `./scripts/test.sh` runs it with `--ignored`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::bed::{Running, consume_on, daemon_on, every_log, finish, log, wait_for};
use sluice_testkit::job::read_ids;
use sluice_testkit::pki::Pki;
use sluice_testkit::{Host, NetBed};

const ROWS: i64 = 100_000;
const AM_PORT: u16 = 7070;
const JOB: &str = "moved";
const TOKEN: &str = "netbed-am-move-token";
/// Each trainer's pace, so that the job lasts through the move.
const ROWS_PER_S: u32 = 8_000;
/// How long the job may take in all.
const WATCHDOG: Duration = Duration::from_secs(180);

/// `sluice am` on `host`, serving TLS with a token and reading S3 through `s3_env`.
fn am_on(
    host: &Host,
    spec: &Path,
    pki: &Pki,
    s3_env: &BTreeMap<String, String>,
    logs: &Path,
) -> Running {
    Running(
        host.command(env!("CARGO_BIN_EXE_sluice"))
            .arg("am")
            .arg(spec)
            .args(["--listen", &format!("{}:{AM_PORT}", host.address())])
            .args(["--token", TOKEN])
            .args(common::am_tls_args(pki))
            .envs(s3_env)
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(log(logs, &format!("am-{}.log", host.name())))
            .stderr(log(logs, &format!("am-{}.err", host.name())))
            .spawn()
            .expect("spawn sluice am"),
    )
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn daemons_find_an_am_started_on_another_host_and_the_job_ends_exactly_once() {
    let bed =
        NetBed::new(&["am1", "am2", "n0", "n1", "s3"]).unwrap_or_else(|error| panic!("{error}"));
    let server = sluice_testkit::start_seaweed_on(bed.host("s3"));
    let s3_options = sluice_testkit::s3_options_at(server.address());
    common::runtime().block_on(sluice_testkit::wait_for_bucket(&server, &s3_options));
    // The AMs and the daemons reach S3 through the environment, as a cluster's hosts would.
    let s3_env: BTreeMap<String, String> = s3_options
        .iter()
        .map(|(key, value)| (key.to_uppercase(), value.clone()))
        .collect();
    let shared = bed.shared_dir();
    let logs = shared.join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let pki_dir = shared.join("pki");
    std::fs::create_dir_all(&pki_dir).expect("pki");
    let am1_ip = bed.address("am1").to_string();
    let am2_ip = bed.address("am2").to_string();
    let pki = sluice_testkit::pki::write(&pki_dir, &["am1", "am2", &am1_ip, &am2_ip]);

    let data = common::generate(&shared, ROWS as u64, 4, 2000);
    // Unique to this run: the bucket outlives a failed one.
    let checkpoint = format!(
        "s3://{}/am-move-{}",
        sluice_testkit::BUCKET,
        std::process::id()
    );
    let spec = common::write_spec(
        &shared,
        &format!(
            "name: {JOB}\n\
             data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 2000\n  batch_size: 250\n\
             nodes: 2\n\
             launcher: {{ kind: external }}\n\
             roles:\n  - {{ name: worker, num: 2 }}\n\
             failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 15000 }}\n\
             checkpoint: {{ uri: \"{checkpoint}\" }}\n",
            data.display(),
        ),
    );

    let mut am1 = am_on(bed.host("am1"), &spec, &pki, &s3_env, &logs);
    let daemon_env: Vec<(&str, &str)> = s3_env
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .chain([("SLUICE_TOKEN", TOKEN)])
        .collect();
    // Started without --node-id: each serves the node of its host's name.
    let mut daemons: Vec<Running> = ["n0", "n1"]
        .iter()
        .map(|name| {
            daemon_on(
                bed.host(name),
                &format!("am1:{AM_PORT}"),
                None,
                &common::daemon_tls_args(&pki),
                &daemon_env,
                &logs,
            )
        })
        .collect();
    let mut trainers: Vec<Running> = ["n0", "n1"]
        .iter()
        .enumerate()
        .map(|(rank, name)| {
            consume_on(
                bed.host(name),
                JOB,
                (rank as u32, 2),
                ROWS_PER_S,
                &shared,
                &logs,
            )
        })
        .collect();
    let read_so_far = || -> u64 {
        ["n0", "n1"]
            .iter()
            .map(|name| {
                std::fs::metadata(shared.join(format!("ids-{name}.bin")))
                    .map_or(0, |meta| meta.len() / 8)
            })
            .sum()
    };

    // The AM's host dies mid-run.
    wait_for("the trainers read", WATCHDOG, &logs, || {
        read_so_far() >= 15_000
    });
    bed.host("am1").kill_all();
    bed.host("am1").link_down();
    let _ = am1.0.wait();
    let at_move = read_so_far();

    // An AM on another host takes the job over from its checkpoint location.
    let mut am2 = am_on(bed.host("am2"), &spec, &pki, &s3_env, &logs);
    for (trainer, name) in trainers.iter_mut().zip(["n0", "n1"]) {
        assert!(
            finish(
                &mut trainer.0,
                &format!("the trainer on {name}"),
                WATCHDOG,
                &logs
            ),
            "a trainer failed\n{}",
            every_log(&logs)
        );
    }
    assert!(
        finish(&mut am2.0, "the AM on am2", WATCHDOG, &logs),
        "the AM on am2 exits 0 once the job succeeded\n{}",
        every_log(&logs)
    );
    for (daemon, name) in daemons.iter_mut().zip(["n0", "n1"]) {
        assert!(
            finish(
                &mut daemon.0,
                &format!("the daemon on {name}"),
                WATCHDOG,
                &logs
            ),
            "a daemon failed\n{}",
            every_log(&logs)
        );
        let text = std::fs::read_to_string(logs.join(format!("daemon-{name}.log")))
            .unwrap_or_default()
            + &std::fs::read_to_string(logs.join(format!("daemon-{name}.err"))).unwrap_or_default();
        assert!(
            text.contains("the AM moved") && text.contains(&am2_ip),
            "the daemon on {name} found the AM on am2 through the checkpoint location:\n{text}"
        );
    }

    let mut ids: Vec<i64> = ["n0", "n1"]
        .iter()
        .flat_map(|name| read_ids(&shared.join(format!("ids-{name}.bin"))))
        .collect();
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), delivered, "a row was delivered twice");
    assert_eq!(ids, (0..ROWS).collect::<Vec<_>>(), "every row delivered");
    assert!(
        at_move < ROWS as u64,
        "the AM moved mid-run: {at_move} rows read before"
    );
}
