//! The Slurm launcher on a real Slurm cluster (Debian's Slurm, two node names on this host, started
//! by the shared `slurm-ci.sh`): `sluice submit --launcher slurm` hands the job to `sbatch`, its AM
//! runs in the batch job and starts each node daemon and trainer as a step of the allocation on
//! its node's host, and every row is delivered once, also when a daemon's step is cancelled
//! mid-run and launched again.
//!
//! Slurm's daemons run as root, so these tests are ignored by `cargo test`; `scripts/test.sh` runs
//! them as root, after installing Slurm.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::sluice;
use sluice_testkit::job::read_ids;

/// The cluster's ports are fixed: one test at a time.
static CLUSTER: Mutex<()> = Mutex::new(());

/// A throw-away Slurm cluster with nodes `n1` and `n2`, stopped when dropped.
struct Cluster {
    directory: PathBuf,
}

fn slurm_ci_script() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/slurm-ci.sh");
    assert!(
        script.is_file(),
        "{} is missing: the shared tools must sit beside the repository",
        script.display()
    );
    script
}

impl Cluster {
    /// A cluster in a temporary directory, once no other test has one: the guard that keeps the
    /// others out, the directory, and the cluster, to drop in that order's reverse.
    fn start_alone() -> (
        std::sync::MutexGuard<'static, ()>,
        tempfile::TempDir,
        Cluster,
    ) {
        let alone = CLUSTER
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let directory = tempfile::tempdir().expect("tempdir");
        let cluster = Cluster::start(directory.path());
        (alone, directory, cluster)
    }

    fn start(directory: &Path) -> Cluster {
        let directory = directory.join("slurm");
        let status = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$0" && slurm_ci_start"#)
            .arg(slurm_ci_script())
            .env("SLURM_CI_DIR", &directory)
            .env("SLURM_CI_NODES", "2")
            .status()
            .expect("run slurm-ci.sh");
        let cluster = Cluster { directory };
        assert!(status.success(), "the Slurm cluster did not start");
        cluster
    }

    fn conf(&self) -> PathBuf {
        self.directory.join("slurm.conf")
    }

    /// A Slurm client command of this cluster.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf());
        command
    }

    fn output(&self, program: &str, args: &[&str]) -> String {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|error| panic!("{program}: {error}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The running steps of batch job `job_id`: (step id, name, node list).
    fn steps(&self, job_id: &str) -> Vec<(String, String, String)> {
        self.output("squeue", &["-h", "-s", "-j", job_id, "-o", "%i %j %N"])
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                Some((
                    fields.next()?.to_owned(),
                    fields.next()?.to_owned(),
                    fields.next()?.to_owned(),
                ))
            })
            .collect()
    }

    /// `JobState=...` of batch job `job_id`, as `scontrol show job` says it.
    fn job_state(&self, job_id: &str) -> String {
        let text = self.output("scontrol", &["show", "job", job_id]);
        text.split_whitespace()
            .find_map(|field| field.strip_prefix("JobState="))
            .unwrap_or("UNKNOWN")
            .to_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$0" && slurm_ci_stop"#)
            .arg(slurm_ci_script())
            .env("SLURM_CI_DIR", &self.directory)
            .env("SLURM_CONF", self.conf())
            .status();
    }
}

/// A job of `rows` rows over two nodes and four paced trainers, under the Slurm launcher.
fn job_spec(root: &Path, name: &str, rows: u64, rows_per_s: u64) -> PathBuf {
    let data = common::generate(root, rows, 4, 1000);
    common::write_spec(
        root,
        &format!(
            r#"
name: {name}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 2000
  batch_size: 256
nodes: 2
roles:
  - {{ name: worker, num: 4, command: [sluice, consume, --ids-out, "{root}/ids-{{rank}}.bin", --max-rows-per-s, "{rows_per_s}"] }}
launcher: {{ kind: slurm, partition: debug, time: "10:00" }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 10000 }}
"#,
            data = data.display(),
            root = root.display(),
        ),
    )
}

/// Submits the job with `sluice submit --launcher slurm` and `extra` arguments; the batch job's
/// id.
fn submit(cluster: &Cluster, root: &Path, spec: &Path, name: &str, extra: &[&str]) -> String {
    let output = sluice()
        .args(["submit", "--launcher", "slurm"])
        .args(extra)
        .arg(spec)
        .arg("--state-dir")
        .arg(root.join("state"))
        .arg("--ring-dir")
        .arg(root.join("rings"))
        .env("SLURM_CONF", cluster.conf())
        .current_dir(root)
        .output()
        .expect("run sluice submit");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "sluice submit failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let job_id = stdout
        .split("as batch job ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no batch job id in: {stdout}"))
        .to_owned();
    assert!(
        stdout.contains(&format!("sluice-{name}-{job_id}.out")),
        "submit names the AM's output: {stdout}"
    );
    job_id
}

/// What went on, for a failure's message: the AM's output and the executors' logs.
fn story(root: &Path, name: &str, job_id: &str) -> String {
    let am = std::fs::read_to_string(root.join(format!("sluice-{name}-{job_id}.out")))
        .unwrap_or_default();
    format!(
        "--- the AM\n{am}\n{}",
        sluice_testkit::job::logs(&root.join("state"))
    )
}

/// Waits for batch job `job_id` to end; its final state.
fn wait_for_end(cluster: &Cluster, root: &Path, name: &str, job_id: &str) -> String {
    let started = Instant::now();
    loop {
        let state = cluster.job_state(job_id);
        if !matches!(
            state.as_str(),
            "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"
        ) {
            return state;
        }
        if started.elapsed() > Duration::from_secs(180) {
            let _ = cluster.command("scancel").arg(job_id).status();
            panic!(
                "batch job {job_id} still {state} after 180 s: cancelled\n{}",
                story(root, name, job_id)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until `ready` holds, failing with the job's story after 60 s.
fn wait_until(root: &Path, name: &str, job_id: &str, what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what} within 60 s\n{}",
            story(root, name, job_id)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every id the four trainers wrote, sorted, checked to be each of `0..rows` once.
fn assert_every_row_once(root: &Path, name: &str, job_id: &str, rows: u64) {
    let mut ids: Vec<i64> = (0..4)
        .flat_map(|rank| read_ids(&root.join(format!("ids-{rank}.bin"))))
        .collect();
    let delivered = ids.len();
    ids.sort_unstable();
    ids.dedup();
    let context = story(root, name, job_id);
    assert_eq!(
        ids.len(),
        delivered,
        "some ids were delivered twice\n{context}"
    );
    assert_eq!(
        ids,
        (0..rows as i64).collect::<Vec<_>>(),
        "not every id was delivered\n{context}"
    );
}

#[test]
#[ignore = "needs root to run Slurm's daemons: scripts/test.sh runs it as root"]
fn a_submitted_job_runs_its_executors_as_steps_on_their_nodes_and_delivers_every_row_once() {
    let (_one_cluster, directory, cluster) = Cluster::start_alone();
    let root = directory.path();
    let name = "slurm-once";
    let rows = 60_000;
    let spec = job_spec(root, name, rows, 5_000);
    let job_id = submit(&cluster, root, &spec, name, &[]);
    let mut placed = Vec::new();
    wait_until(root, name, &job_id, "every daemon runs as a step", || {
        for (_, step, nodes) in cluster.steps(&job_id) {
            if !placed.contains(&(step.clone(), nodes.clone())) {
                placed.push((step, nodes));
            }
        }
        placed
            .iter()
            .filter(|(step, _)| step.contains(".daemon-"))
            .count()
            == 2
    });
    let state = wait_for_end(&cluster, root, name, &job_id);
    let context = story(root, name, &job_id);
    assert_eq!(state, "COMPLETED", "{context}");
    assert!(
        context.contains(&format!("job {name} succeeded")),
        "the AM says the job succeeded\n{context}"
    );
    for (step, host) in [("daemon-0", "n1"), ("daemon-1", "n2")] {
        assert!(
            placed.contains(&(format!("{name}.{step}"), host.to_owned())),
            "{step} runs as a step on {host}: {placed:?}"
        );
    }
    assert_every_row_once(root, name, &job_id, rows);
}

#[test]
#[ignore = "needs root to run Slurm's daemons: scripts/test.sh runs it as root"]
fn a_daemon_step_cancelled_mid_run_is_launched_again_and_every_row_arrives_once() {
    let (_one_cluster, directory, cluster) = Cluster::start_alone();
    let root = directory.path();
    let name = "slurm-kill";
    let rows = 100_000;
    let spec = job_spec(root, name, rows, 4_000);
    let job_id = submit(&cluster, root, &spec, name, &[]);
    let daemon = format!("{name}.daemon-0");
    let mut step = None;
    wait_until(
        root,
        name,
        &job_id,
        "daemon-0 runs and its trainers read",
        || {
            step = cluster
                .steps(&job_id)
                .into_iter()
                .find(|(_, step_name, _)| *step_name == daemon)
                .map(|(id, _, _)| id);
            step.is_some() && read_ids(&root.join("ids-0.bin")).len() >= 5_000
        },
    );
    let step = step.expect("the daemon's step");
    let status = cluster
        .command("scancel")
        .args(["--signal=KILL", &step])
        .status()
        .expect("scancel");
    assert!(status.success(), "scancel of step {step}");
    let state = wait_for_end(&cluster, root, name, &job_id);
    let context = story(root, name, &job_id);
    assert_eq!(state, "COMPLETED", "{context}");
    let launches = std::fs::read_to_string(root.join("state/daemon-0.log"))
        .unwrap_or_default()
        .matches("==> sluice: launching daemon-0")
        .count();
    assert!(
        launches >= 2,
        "daemon-0 was launched again after its step was killed\n{context}"
    );
    assert_every_row_once(root, name, &job_id, rows);
}

#[test]
#[ignore = "needs root to run Slurm's daemons: scripts/test.sh runs it as root"]
fn sluice_stop_cancels_the_steps_and_ends_the_batch_job() {
    let (_one_cluster, directory, cluster) = Cluster::start_alone();
    let root = directory.path();
    let name = "slurm-stop";
    let spec = job_spec(root, name, 100_000, 1_000);
    let address = common::free_address();
    let job_id = submit(&cluster, root, &spec, name, &["--listen", &address]);
    wait_until(root, name, &job_id, "the trainers run as steps", || {
        cluster
            .steps(&job_id)
            .iter()
            .filter(|(_, step, _)| step.contains(".trainer-"))
            .count()
            == 4
    });
    let stop = sluice()
        .args(["stop", "--am", &address])
        .output()
        .expect("run sluice stop");
    assert!(
        stop.status.success(),
        "sluice stop: {}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let state = wait_for_end(&cluster, root, name, &job_id);
    let context = story(root, name, &job_id);
    assert_eq!(state, "COMPLETED", "a stopped job ends well\n{context}");
    assert!(
        context.contains(&format!("job {name} stopped")),
        "the AM says the job stopped\n{context}"
    );
    let remaining = read_ids(&root.join("ids-0.bin")).len()
        + read_ids(&root.join("ids-1.bin")).len()
        + read_ids(&root.join("ids-2.bin")).len()
        + read_ids(&root.join("ids-3.bin")).len();
    assert!(
        remaining < 100_000,
        "the job stopped before it read everything ({remaining} rows)\n{context}"
    );
}

#[test]
fn a_dry_run_prints_the_batch_script_and_submits_nothing() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = job_spec(root, "slurm-dry", 1_000, 1_000);
    let output = sluice()
        .args([
            "submit",
            "--dry-run",
            "--insecure",
            "--listen",
            "0.0.0.0:7070",
        ])
        .arg(&spec)
        .env("PATH", "/nonexistent")
        .output()
        .expect("run sluice submit --dry-run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "#SBATCH --job-name=slurm-dry",
        "#SBATCH --nodes=2",
        "#SBATCH --partition=debug",
        "#SBATCH --time=10:00",
    ] {
        assert!(
            stdout.lines().any(|found| found == line),
            "{line} in:\n{stdout}"
        );
    }
    let exec = format!(
        "exec '{}' run '{}' '--launcher' 'slurm' '--listen' '0.0.0.0:7070'",
        env!("CARGO_BIN_EXE_sluice"),
        spec.display()
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with(&exec), "{last}");
    assert!(last.ends_with("'--insecure'"), "{last}");
}

#[test]
fn the_slurm_launcher_outside_an_allocation_says_how_to_submit() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = job_spec(root, "slurm-outside", 1_000, 1_000);
    let output = sluice()
        .arg("run")
        .arg(&spec)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_JOB_NODELIST")
        .output()
        .expect("run sluice run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("inside a Slurm allocation")
            && stderr.contains("sluice submit --launcher slurm"),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs root to run Slurm's daemons: scripts/test.sh runs it as root"]
fn a_partition_slurm_does_not_have_is_named_with_the_fix() {
    let (_one_cluster, directory, cluster) = Cluster::start_alone();
    let root = directory.path();
    let spec = job_spec(root, "slurm-nowhere", 1_000, 1_000);
    let text = std::fs::read_to_string(&spec)
        .expect("spec")
        .replace("partition: debug", "partition: nowhere");
    std::fs::write(&spec, text).expect("spec");
    let output = sluice()
        .args(["submit", "--launcher", "slurm"])
        .arg(&spec)
        .env("SLURM_CONF", cluster.conf())
        .current_dir(root)
        .output()
        .expect("run sluice submit");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("sbatch refused job slurm-nowhere")
            && stderr.contains("`launcher.partition`")
            && stderr.contains("sinfo"),
        "{stderr}"
    );
}

#[test]
fn the_slurm_launcher_without_srun_says_what_to_install() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = job_spec(root, "slurm-no-srun", 1_000, 1_000);
    let output = sluice()
        .arg("run")
        .arg(&spec)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env("SLURM_JOB_ID", "7")
        .env("SLURM_JOB_NODELIST", "n[1-2]")
        .env("PATH", root)
        .output()
        .expect("run sluice run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("runs `srun`, which is not on the PATH")
            && stderr.contains("install Slurm's client commands"),
        "{stderr}"
    );
}
