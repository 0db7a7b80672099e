//! Attach mode across machines: `torchrun --nnodes 2 --nproc-per-node 2` on two hosts of the
//! multi-host test bed (c10d rendezvous, a DDP model over gloo whose parameters are all-reduced
//! across the hosts; per-step gradient sync needs every rank to get as many batches, which pull
//! balancing does not promise) reading `sluice.torch.Dataset`, fed by a
//! `sluice daemon` sidecar on each host and an AM on a third host that launches nothing, with TLS,
//! daemons' client certificates and a token on. The trainers save their data position with the
//! model at a step and stop; torchrun is started again, every rank loads what it saved, and the job
//! reads on to its end: every row exactly once over the two runs.
//!
//! Needs root and network namespaces: a plain `cargo test` lists it as ignored, and
//! `./scripts/test.sh` runs it with `--ignored`.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::bed::{Running, daemon_on, every_log, finish, log};

use sluice_testkit::{Host, NetBed};

const ROWS: i64 = 100_000;
/// The step at which every rank of the first run saves its position and stops.
const SAVE_AT: u64 = 4;
const TOKEN: &str = "netbed-torchrun-token";
const AM_PORT: u16 = 7070;
/// How long a run of torchrun may take (four ranks importing torch on two cores).
const RUN_WATCHDOG: Duration = Duration::from_secs(240);

/// The trainer: DDP over gloo, a `sluice.torch.Dataset` with nothing but its launcher's
/// environment, the ids it trained on written out per rank and run.
const TRAINER: &str = r#"
import json, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from sluice.torch import Dataset

out, phase, save_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
dataset = Dataset()
model = DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
state_path = os.path.join(out, f"state-{rank}.pt")
if phase == "resume":
    saved = torch.load(state_path)
    model.module.load_state_dict(saved["model"])
    dataset.load_state_dict(saved["data"])
ids, steps = [], 0
# The nodes pull tasks as they go, so the ranks get unequal numbers of batches, and a rank whose
# ring is empty waits for the epoch's end: gradients are not all-reduced at every step (that would
# wait on it), but the parameters are averaged across the ranks once each run ends.
with model.no_sync():
    for item in torch.utils.data.DataLoader(dataset, batch_size=None):
        x = item["id"].to(torch.float32).unsqueeze(1)
        loss = model(x).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ids.extend(item["id"].tolist())
        steps += 1
        if phase == "first" and steps == save_at:
            torch.save({"model": model.module.state_dict(), "data": dataset.state_dict()}, state_path)
            break
for parameter in model.parameters():
    dist.all_reduce(parameter.data)
    parameter.data /= dist.get_world_size()
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as file:
    json.dump({"rank": rank, "steps": steps, "ids": ids, "host": os.uname().nodename}, file)
dist.destroy_process_group()
"#;

/// `torchrun` of `phase` on `host`, node `node` of two.
fn torchrun(host: &Host, trainer: &Path, shared: &Path, phase: &str, logs: &Path) -> Child {
    host.command("python3")
        .args([
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
        ])
        .args(["--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400"])
        .args(["--rdzv-id", phase, "--max-restarts", "0"])
        .arg(trainer)
        .arg(shared)
        .args([phase, &SAVE_AT.to_string()])
        .env("SLUICE_AM", format!("am:{AM_PORT}"))
        .env("SLUICE_TLS_CA", shared.join("pki/ca.pem"))
        .env("SLUICE_TOKEN", TOKEN)
        .env("GLOO_SOCKET_IFNAME", "eth0")
        .env("OMP_NUM_THREADS", "1")
        .env_remove("SLUICE_RING")
        .env_remove("SLUICE_RANK")
        .env_remove("SLUICE_WORLD_SIZE")
        .env_remove("SLUICE_JOB")
        .env_remove("SLUICE_RING_DIR")
        .stdin(Stdio::null())
        .stdout(log(logs, &format!("torchrun-{phase}-{}.log", host.name())))
        .stderr(log(logs, &format!("torchrun-{phase}-{}.err", host.name())))
        .spawn()
        .expect("spawn torchrun")
}

/// The ids every rank of `phase` wrote, with the ranks' hosts.
fn trained(shared: &Path, phase: &str) -> (Vec<i64>, Vec<String>) {
    let mut ids = Vec::new();
    let mut hosts = Vec::new();
    for rank in 0..4 {
        let path = shared.join(format!("{phase}-{rank}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let report: serde_json::Value = serde_json::from_str(&text).expect("a rank's JSON");
        ids.extend(
            report["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|id| id.as_i64().expect("an id")),
        );
        hosts.push(report["host"].as_str().expect("host").to_owned());
    }
    (ids, hosts)
}

#[test]
#[ignore = "needs root and network namespaces: scripts/test.sh runs it"]
fn torchrun_ddp_across_two_hosts_saves_resumes_and_trains_on_every_row_once() {
    sluice_testkit::require_python_modules("torch, sluice");
    let bed = NetBed::new(&["am", "n0", "n1"]).unwrap_or_else(|error| panic!("{error}"));
    let shared = bed.shared_dir();
    let logs = shared.join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let pki_dir = shared.join("pki");
    std::fs::create_dir_all(&pki_dir).expect("pki");
    let am_ip = bed.address("am").to_string();
    let pki = sluice_testkit::pki::write(&pki_dir, &["am", &am_ip]);
    let sluice = env!("CARGO_BIN_EXE_sluice");

    let data = common::generate(&shared, ROWS as u64, 4, 2500);
    let spec = common::write_spec(
        &shared,
        &format!(
            "name: ddp\n\
             data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 2500\n  batch_size: 500\n\
             nodes: 2\n\
             launcher: {{ kind: external }}\n\
             roles:\n  - {{ name: worker, num: 4 }}\n\
             failover: {{ heartbeat_interval_ms: 200, heartbeat_timeout_ms: 30000 }}\n\
             checkpoint: {{ uri: \"file://{}\" }}\n",
            data.display(),
            shared.join("journal").display()
        ),
    );
    let trainer = shared.join("train_ddp.py");
    std::fs::write(&trainer, TRAINER).expect("write the trainer");

    let mut am = Running(
        bed.host("am")
            .command(sluice)
            .arg("am")
            .arg(&spec)
            .args(["--listen", &format!("{am_ip}:{AM_PORT}"), "--token", TOKEN])
            .args(common::am_tls_args(&pki))
            .stdout(log(&logs, "am.log"))
            .stderr(log(&logs, "am.err"))
            .spawn()
            .expect("spawn sluice am"),
    );
    // Started without --node-id: each serves the node of its host's name.
    let mut daemons: Vec<Running> = ["n0", "n1"]
        .iter()
        .map(|name| {
            daemon_on(
                bed.host(name),
                &format!("am:{AM_PORT}"),
                None,
                &common::daemon_tls_args(&pki),
                &[("SLUICE_TOKEN", TOKEN)],
                &logs,
            )
        })
        .collect();

    // The first run saves at step SAVE_AT and stops.
    let mut first: Vec<Child> = ["n0", "n1"]
        .iter()
        .map(|name| torchrun(bed.host(name), &trainer, &shared, "first", &logs))
        .collect();
    for (index, child) in first.iter_mut().enumerate() {
        assert!(
            finish(
                child,
                &format!("torchrun first on n{index}"),
                RUN_WATCHDOG,
                &logs
            ),
            "the first run failed\n{}",
            every_log(&logs)
        );
    }
    let (before, first_hosts) = trained(&shared, "first");
    assert_eq!(
        before.len() as u64,
        4 * SAVE_AT * 500,
        "every rank trained SAVE_AT batches"
    );

    // torchrun again: every rank loads what it saved and the job reads on to its end.
    let mut resumed: Vec<Child> = ["n0", "n1"]
        .iter()
        .map(|name| torchrun(bed.host(name), &trainer, &shared, "resume", &logs))
        .collect();
    for (index, child) in resumed.iter_mut().enumerate() {
        assert!(
            finish(
                child,
                &format!("torchrun resume on n{index}"),
                RUN_WATCHDOG,
                &logs
            ),
            "the resumed run failed\n{}",
            every_log(&logs)
        );
    }
    assert!(
        finish(&mut am.0, "sluice am", Duration::from_secs(60), &logs),
        "the AM exits 0 once the job succeeded\n{}",
        every_log(&logs)
    );
    for daemon in &mut daemons {
        assert!(
            finish(
                &mut daemon.0,
                "sluice daemon",
                Duration::from_secs(60),
                &logs
            ),
            "a daemon failed\n{}",
            every_log(&logs)
        );
    }

    let (after, resumed_hosts) = trained(&shared, "resume");
    for hosts in [&first_hosts, &resumed_hosts] {
        let mut names = hosts.clone();
        names.sort_unstable();
        assert_eq!(names, ["n0", "n0", "n1", "n1"], "two ranks on each host");
    }
    let mut seen: Vec<i64> = before.into_iter().chain(after).collect();
    seen.sort_unstable();
    let expected: Vec<i64> = (0..ROWS).collect();
    assert_eq!(
        seen.len(),
        expected.len(),
        "every row once over the two runs"
    );
    assert_eq!(seen, expected, "every row exactly once over the two runs");
}
