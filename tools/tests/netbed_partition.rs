//! A node cut off mid-run, on the multi-host test bed: an AM on one host that launches nothing, and
//! on two others a `sluice daemon` sidecar and a `sluice consume` trainer (an asynchronous role).
//! The cable of one node is pulled while its trainer reads; the AM declares the node lost and the
//! other trainer reads the rest. The cable is plugged back: the old daemon is fenced, its trainer
//! gets the fence's error, and the job ends. Every row is delivered exactly once by the rule of the
//! architecture document: a cut-off trainer's reads count up to the AM's last count of its node, and
//! the reads after it (void, delivered again elsewhere) are the tail of what it read.
//!
//! Needs root and network namespaces: a plain `cargo test` lists it as ignored, and
//! `./scripts/test.sh` runs it with `--ignored`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::bed::{Running, consume_on, daemon_on, every_log, finish, log, wait_for};
use sluice_testkit::NetBed;
use sluice_testkit::job::read_ids;

const ROWS: i64 = 200_000;
const AM_PORT: u16 = 7070;
const JOB: &str = "cut";
/// The survivor's pace, so that the job lasts through the cut and the fence.
const SURVIVOR_ROWS_PER_S: u32 = 15_000;
/// The cut-off trainer's pace: slow enough that, when its node's lease lapses, its daemon still
/// has rows of its task to write beyond what its ring holds.
const CUT_OFF_ROWS_PER_S: u32 = 3_000;
/// Rows per task: each node holds a task of which its ring holds a small part.
const TASK_ROWS: u64 = 20_000;
/// The rings' size: a few thousand rows of ids.
const RING_SIZE: u64 = 64 << 10;
const HEARTBEAT_TIMEOUT_MS: u64 = 2_000;
/// How long the job may take in all.
const WATCHDOG: Duration = Duration::from_secs(120);

/// The state of node `node` in the AM's status, if the AM lists it.
fn node_state(am: &str, node: u64) -> Option<String> {
    let status = common::status_json(am);
    status["nodes"]
        .as_array()?
        .iter()
        .find(|entry| entry["node_id"].as_u64() == Some(node))
        .and_then(|entry| entry["state"].as_str().map(str::to_owned))
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn a_node_cut_off_mid_run_is_fenced_and_every_row_is_delivered_once_by_the_rule() {
    let bed = NetBed::new(&["am", "n0", "n1"]).unwrap_or_else(|error| panic!("{error}"));
    let shared = bed.shared_dir();
    let logs = shared.join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let data = common::generate(&shared, ROWS as u64, 4, 5000);
    let spec = common::write_spec(
        &shared,
        &format!(
            "name: {JOB}\n\
             data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: {TASK_ROWS}\n  batch_size: 250\n\
             nodes: 2\n\
             launcher: {{ kind: external }}\n\
             roles:\n  - {{ name: worker, num: 2 }}\n\
             failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS} }}\n",
            data.display(),
        ),
    );

    let am_address = format!("{}:{AM_PORT}", bed.address("am"));
    let mut am = Running(
        bed.host("am")
            .command(sluice)
            .arg("am")
            .arg(&spec)
            .args(["--listen", &am_address, "--insecure"])
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(log(&logs, "am.log"))
            .stderr(log(&logs, "am.err"))
            .spawn()
            .expect("spawn sluice am"),
    );
    let ring_size = ["--ring-size".into(), RING_SIZE.to_string().into()];
    let mut daemons: Vec<Running> = ["n0", "n1"]
        .iter()
        .enumerate()
        .map(|(node, name)| {
            daemon_on(
                bed.host(name),
                &format!("am:{AM_PORT}"),
                Some(node),
                &ring_size,
                &[],
                &logs,
            )
        })
        .collect();
    let mut survivor = consume_on(
        bed.host("n0"),
        JOB,
        (0, 2),
        SURVIVOR_ROWS_PER_S,
        &shared,
        &logs,
    );
    let mut cut_off = consume_on(
        bed.host("n1"),
        JOB,
        (1, 2),
        CUT_OFF_ROWS_PER_S,
        &shared,
        &logs,
    );
    let cut_ids = shared.join("ids-n1.bin");
    let ids_read = |path: &Path| std::fs::metadata(path).map_or(0, |meta| meta.len() / 8);

    // n1's cable is pulled while its trainer reads.
    wait_for("n1's trainer reads", WATCHDOG, &logs, || {
        ids_read(&cut_ids) >= 3_000
    });
    bed.host("n1").link_down();
    let at_cut = ids_read(&cut_ids);
    wait_for(
        "the AM declares n1 lost",
        Duration::from_millis(HEARTBEAT_TIMEOUT_MS) * 10,
        &logs,
        || node_state(&am_address, 1).as_deref() == Some("lost"),
    );
    assert_eq!(
        node_state(&am_address, 0).as_deref(),
        Some("alive"),
        "n0 is alive"
    );

    // The cable is plugged back: the old daemon is fenced and leaves its trainer the fence's error.
    bed.host("n1").link_up();
    assert!(
        !finish(&mut daemons[1].0, "n1's daemon", WATCHDOG, &logs),
        "n1's daemon exits with an error once fenced\n{}",
        every_log(&logs)
    );
    assert!(
        !finish(&mut cut_off.0, "n1's trainer", WATCHDOG, &logs),
        "n1's trainer fails on the fence's error\n{}",
        every_log(&logs)
    );
    let daemon_err = std::fs::read_to_string(logs.join("daemon-n1.err")).unwrap_or_default();
    assert!(
        daemon_err.contains("declared this daemon lost"),
        "n1's daemon names the fence: {daemon_err}"
    );
    let daemon_log = std::fs::read_to_string(logs.join("daemon-n1.log")).unwrap_or_default();
    assert!(
        format!("{daemon_log}{daemon_err}").contains("no answer from the AM within the lease"),
        "n1's daemon stopped publishing once its lease lapsed: {daemon_log}{daemon_err}"
    );
    let trainer_err = std::fs::read_to_string(logs.join("trainer-n1.err")).unwrap_or_default();
    assert!(
        trainer_err.contains("node 1 lost its AM") && trainer_err.contains("delivered again"),
        "n1's trainer is told its last reads are void: {trainer_err}"
    );

    // The survivor reads the rest; the job succeeds.
    assert!(
        finish(&mut survivor.0, "n0's trainer", WATCHDOG, &logs),
        "n0's trainer reads to the end\n{}",
        every_log(&logs)
    );
    assert!(
        finish(&mut am.0, "sluice am", WATCHDOG, &logs),
        "the AM exits 0 once the job succeeded\n{}",
        every_log(&logs)
    );
    assert!(
        finish(&mut daemons[0].0, "n0's daemon", WATCHDOG, &logs),
        "n0's daemon ends with the job\n{}",
        every_log(&logs)
    );

    // The rule: the void reads are the tail of the cut-off trainer's reads, and its reads before
    // them with the survivor's are every row once.
    let survivor_ids = read_ids(&shared.join("ids-n0.bin"));
    let cut_off_ids = read_ids(&cut_ids);
    let survivor_set: BTreeSet<i64> = survivor_ids.iter().copied().collect();
    assert_eq!(
        survivor_set.len(),
        survivor_ids.len(),
        "the survivor read a row twice"
    );
    let counted = cut_off_ids
        .iter()
        .position(|id| survivor_set.contains(id))
        .unwrap_or(cut_off_ids.len());
    let (kept, void) = cut_off_ids.split_at(counted);
    assert!(
        void.iter().all(|id| survivor_set.contains(id)),
        "a row read on n1 after a void read was not delivered again: the void reads are not a tail"
    );
    assert!(
        !void.is_empty(),
        "n1's trainer read on after the AM's last count of n1 (rows {at_cut} at the cut, {} in all)",
        cut_off_ids.len()
    );
    let mut delivered: Vec<i64> = kept.iter().chain(&survivor_ids).copied().collect();
    delivered.sort_unstable();
    let before = delivered.len();
    delivered.dedup();
    assert_eq!(before, delivered.len(), "a row was delivered twice");
    assert_eq!(
        delivered,
        (0..ROWS).collect::<Vec<_>>(),
        "every row delivered"
    );
    eprintln!(
        "n1 read {} rows: {} counted, {} void ({} read before the cut)",
        cut_off_ids.len(),
        kept.len(),
        void.len(),
        at_cut
    );
}
