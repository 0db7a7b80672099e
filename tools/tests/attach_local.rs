//! Attach mode on one machine: a job whose AM launches nothing (`launcher: { kind: external }`),
//! two `sluice daemon` sidecars started by hand, and four `sluice consume` trainers started the way
//! torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, and SLUICE_AM only).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{AmProcess, generate, sluice, status_json, write_spec};
use sluice_testkit::job::read_ids;

const ROWS: u64 = 40_000;

fn spec(data: &Path) -> String {
    format!(
        "name: attach\n\
         data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 2000\n  batch_size: 500\n\
         nodes: 2\n\
         launcher: {{ kind: external }}\n\
         roles:\n  - {{ name: worker, num: 4 }}\n\
         failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 30000 }}\n",
        data.display()
    )
}

/// `sluice daemon` of node `node`, with its own ring directory as on a host of its own.
fn daemon(am: &str, node: u64, ring_dir: &Path) -> Child {
    sluice()
        .args(["daemon", "--am", am, "--node-id", &node.to_string()])
        .arg("--ring-dir")
        .arg(ring_dir)
        .env_remove("SLUICE_TOKEN")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice daemon")
}

/// A trainer as torchrun starts it: its ranks in the environment, the AM's address, the ring
/// directory of its node's daemon.
fn trainer(am: &str, rank: u32, ring_dir: &Path, ids: &Path) -> Child {
    common::torchrun_consume(am, ring_dir, ids, (rank, 4), (rank % 2, 2))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice consume")
}

fn wait(child: &mut Child, what: &str, limit: Duration) -> bool {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.success();
        }
        assert!(
            started.elapsed() < limit,
            "{what} did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn trainers_launched_by_someone_else_get_every_row_exactly_once() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), ROWS, 4, 1000);
    let spec = write_spec(directory.path(), &spec(&data));
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);

    // The AM waits, and says for what: no daemon has come, and it launches none.
    let status = status_json(&am.address);
    assert_eq!(status["state"], "starting", "{status}");
    let waiting = status["waiting"]
        .as_str()
        .expect("the AM says what it waits for");
    assert!(
        waiting.contains("0 of 2 node daemons") && waiting.contains("sluice daemon --am"),
        "{waiting}"
    );

    let ring_dirs: Vec<_> = (0..2)
        .map(|node| directory.path().join(format!("host-{node}/shm")))
        .collect();
    let mut daemons: Vec<Child> = (0..2)
        .map(|node| daemon(&am.address, node, &ring_dirs[node as usize]))
        .collect();
    // The daemons came; the trainers have not announced themselves yet.
    let started = Instant::now();
    loop {
        let status = status_json(&am.address);
        let waiting = status["waiting"].as_str().unwrap_or_default().to_owned();
        if waiting.contains("0 of 4 trainers") {
            assert!(waiting.contains("torchrun"), "{waiting}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the AM never said it waits for the trainers: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ids: BTreeMap<u32, _> = (0..4)
        .map(|rank| (rank, directory.path().join(format!("ids-{rank}.bin"))))
        .collect();
    let mut trainers: Vec<Child> = (0..4)
        .map(|rank| {
            trainer(
                &am.address,
                rank,
                &ring_dirs[rank as usize / 2],
                &ids[&rank],
            )
        })
        .collect();
    for (rank, child) in trainers.iter_mut().enumerate() {
        assert!(
            wait(child, &format!("trainer {rank}"), Duration::from_secs(120)),
            "trainer {rank} failed"
        );
    }
    let (succeeded, rest) = am.finish();
    assert!(succeeded, "the AM exits 0 once the job succeeded: {rest}");
    for (node, child) in daemons.iter_mut().enumerate() {
        assert!(
            wait(child, &format!("daemon {node}"), Duration::from_secs(30)),
            "daemon {node} failed"
        );
    }

    let mut seen: Vec<i64> = Vec::new();
    // A node whose trainers come first may take every task: pull balancing, not equal shares.
    for path in ids.values() {
        seen.extend(read_ids(path));
    }
    seen.sort_unstable();
    let expected: Vec<i64> = (0..ROWS as i64).collect();
    assert_eq!(seen.len(), expected.len(), "every row once");
    assert_eq!(seen, expected, "every row exactly once");
}

#[test]
fn sluice_run_refuses_a_job_it_would_launch_nothing_for_and_names_the_commands() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = write_spec(directory.path(), &spec(directory.path()));
    let output = sluice()
        .arg("run")
        .arg(&spec)
        .output()
        .expect("run sluice run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("sluice am")
            && stderr.contains("sluice daemon --am")
            && stderr.contains("torchrun"),
        "{stderr}"
    );
}
