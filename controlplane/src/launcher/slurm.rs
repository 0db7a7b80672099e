//! Executors as Slurm job steps inside the allocation the AM runs in.
//!
//! # Implementation
//! Each executor is one step of the allocation, `srun --jobid J --nodes 1 --ntasks 1 --nodelist
//! HOST --overlap --job-name <job>.<executor> -- COMMAND`, so that each is launched and stopped
//! alone. The `srun` client runs on the AM's host under the [`LocalLauncher`]: `srun` returns when
//! its step ends, with the step's exit code, so the local launcher's exit records and events are
//! the steps' own, and a new AM of the job adopts the steps the same way it adopts local
//! executors. The daemon of node `n`, and the trainers of the ranks that node feeds, run on the
//! allocation's `n`-th host. Stopping an executor goes through Slurm (`scancel` of its step, found
//! by name), so that the step's processes on their host end with it, not only the `srun` client.

use super::local::LocalLauncher;
use super::{ExecutorEvent, ExecutorId, LaunchSpec, Launcher};
use crate::error::{AmError, Result};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use tokio::sync::mpsc;

/// The Slurm client commands the launcher runs.
const CLIENT_COMMANDS: [&str; 4] = ["srun", "scontrol", "squeue", "scancel"];

/// Checks that `program` is on the `PATH`, naming the fix when it is not.
fn on_path(program: &str) -> Result<()> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|directory| {
        std::fs::metadata(directory.join(program))
            .is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
    });
    if found {
        Ok(())
    } else {
        Err(AmError::FailedPrecondition(format!(
            "the Slurm launcher runs `{program}`, which is not on the PATH ({}); install Slurm's client commands on the AM's host or add their directory to the PATH",
            path.to_string_lossy()
        )))
    }
}

/// The Slurm allocation (a batch job or `salloc`) the AM runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Its job id (`SLURM_JOB_ID`).
    pub job_id: String,
    /// Its hosts, in the order of its node list (`SLURM_JOB_NODELIST`).
    pub hosts: Vec<String>,
}

impl Allocation {
    /// The allocation this process runs in, from `SLURM_JOB_ID` and `SLURM_JOB_NODELIST` (expanded
    /// with `scontrol show hostnames`).
    pub fn from_env() -> Result<Allocation> {
        let outside = || {
            AmError::FailedPrecondition(
                "the Slurm launcher runs inside a Slurm allocation, and SLURM_JOB_ID or SLURM_JOB_NODELIST is not set: submit the job with `sluice submit --launcher slurm JOB.yaml`, or run it inside `salloc`".to_owned(),
            )
        };
        let job_id = std::env::var("SLURM_JOB_ID").map_err(|_| outside())?;
        let node_list = std::env::var("SLURM_JOB_NODELIST").map_err(|_| outside())?;
        for program in CLIENT_COMMANDS {
            on_path(program)?;
        }
        let output = Command::new("scontrol")
            .args(["show", "hostnames", &node_list])
            .output()
            .map_err(|error| {
                AmError::FailedPrecondition(format!(
                    "cannot run `scontrol show hostnames {node_list}`: {error}; the Slurm launcher needs Slurm's client commands on the PATH"
                ))
            })?;
        if !output.status.success() {
            return Err(AmError::FailedPrecondition(format!(
                "`scontrol show hostnames {node_list}` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let hosts: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::trim)
            .filter(|host| !host.is_empty())
            .map(str::to_owned)
            .collect();
        if hosts.is_empty() {
            return Err(AmError::FailedPrecondition(format!(
                "Slurm job {job_id} has no hosts in its node list `{node_list}`"
            )));
        }
        Ok(Allocation { job_id, hosts })
    }
}

/// Runs executors as steps of the Slurm allocation the AM runs in.
#[derive(Debug)]
pub struct SlurmLauncher {
    local: LocalLauncher,
    allocation: Allocation,
    job: String,
    /// GPUs per trainer, by role, asked of each trainer's step.
    gpus: BTreeMap<String, u32>,
}

impl SlurmLauncher {
    /// Launches the executors of job `job` as steps of `allocation`, each step's `srun` client
    /// under `local`; a trainer of a role named in `gpus` asks for that many GPUs.
    pub fn new(
        local: LocalLauncher,
        allocation: Allocation,
        job: &str,
        gpus: BTreeMap<String, u32>,
    ) -> SlurmLauncher {
        SlurmLauncher {
            local,
            allocation,
            job: job.to_owned(),
            gpus,
        }
    }

    /// The allocation the steps run in.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// The name of an executor's step, by which it is found again.
    pub fn step_name(&self, id: &ExecutorId) -> String {
        format!("{}.{id}", self.job)
    }

    /// The running steps of executor `id` (`JOBID.STEPID`), as `squeue` lists them.
    fn steps_of(&self, id: &ExecutorId) -> Vec<String> {
        let name = self.step_name(id);
        let output = Command::new("squeue")
            .args(["--noheader", "--steps", "--jobs", &self.allocation.job_id])
            .args(["--format", "%i %j"])
            .output();
        match output {
            Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| line.split_once(' '))
                .filter(|(_, step)| step.trim() == name)
                .map(|(step, _)| step.to_owned())
                .collect(),
            Ok(output) => {
                tracing::warn!(
                    executor = %id,
                    status = %output.status,
                    stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                    "squeue failed; the executor's step is not found"
                );
                Vec::new()
            }
            Err(error) => {
                tracing::warn!(executor = %id, %error, "cannot run squeue");
                Vec::new()
            }
        }
    }

    /// Runs `scancel` on executor `id`'s steps with `options`; whether it found a step.
    fn cancel(&self, id: &ExecutorId, options: &[&str]) -> bool {
        let steps = self.steps_of(id);
        for step in &steps {
            match Command::new("scancel").args(options).arg(step).output() {
                Ok(output) if output.status.success() => {}
                Ok(output) => tracing::warn!(
                    executor = %id,
                    step,
                    stderr = %String::from_utf8_lossy(&output.stderr).trim(),
                    "scancel failed"
                ),
                Err(error) => tracing::warn!(executor = %id, step, %error, "cannot run scancel"),
            }
        }
        !steps.is_empty()
    }
}

/// The `srun` command that runs `command` as one step named `step_name` on `host` of allocation
/// `job_id`, with `gpus` GPUs.
pub fn srun_command(
    job_id: &str,
    host: &str,
    step_name: &str,
    gpus: u32,
    command: &[String],
) -> Vec<String> {
    let mut srun: Vec<String> = [
        "srun",
        "--jobid",
        job_id,
        "--nodes",
        "1",
        "--ntasks",
        "1",
        "--nodelist",
        host,
        "--overlap",
        "--job-name",
        step_name,
        "--kill-on-bad-exit=1",
        "--quiet",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    if gpus > 0 {
        srun.push(format!("--gpus-per-task={gpus}"));
    }
    srun.push("--".to_owned());
    srun.extend(command.iter().cloned());
    srun
}

/// The environment of an executor's step: its own, and for a trainer `MASTER_ADDR`, where
/// `torch.distributed`'s `env://` start-up meets: the allocation's first host, as in torchrun's
/// static rendezvous (the trainer's code or env chooses `MASTER_PORT`). A role's env wins.
fn step_env(allocation: &Allocation, spec: &LaunchSpec) -> BTreeMap<String, String> {
    let mut env = spec.env.clone();
    if let Some(first) = allocation.hosts.first()
        && matches!(spec.id, ExecutorId::Trainer { .. })
    {
        env.entry("MASTER_ADDR".to_owned())
            .or_insert_with(|| first.clone());
    }
    env
}

impl Launcher for SlurmLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<()> {
        let host = self
            .allocation
            .hosts
            .get(spec.node as usize)
            .ok_or_else(|| {
                AmError::FailedPrecondition(format!(
                    "{}: it runs on node {} of the job, but Slurm job {} has {} host(s); give the job as many nodes as its spec's `nodes`",
                    spec.id,
                    spec.node,
                    self.allocation.job_id,
                    self.allocation.hosts.len()
                ))
            })?;
        let gpus = match &spec.id {
            ExecutorId::Trainer { role, .. } => self.gpus.get(role).copied().unwrap_or(0),
            ExecutorId::Daemon(_) => 0,
        };
        self.local.launch(&LaunchSpec {
            id: spec.id.clone(),
            node: spec.node,
            command: srun_command(
                &self.allocation.job_id,
                host,
                &self.step_name(&spec.id),
                gpus,
                &spec.command,
            ),
            env: step_env(&self.allocation, spec),
        })
    }

    fn adopt(&self, id: &ExecutorId) {
        self.local.adopt(id);
    }

    fn terminate(&self, id: &ExecutorId) {
        if !self.cancel(id, &["--signal=TERM"]) {
            self.local.terminate(id);
        }
    }

    fn kill(&self, id: &ExecutorId) {
        self.cancel(id, &[]);
        self.local.kill(id);
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>> {
        self.local.events()
    }

    fn remote(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_runs_one_task_on_its_host_and_may_overlap_the_others() {
        let command = vec!["sluice".to_owned(), "daemon".to_owned()];
        let sut = srun_command("42", "gpu-7", "job.daemon-1", 0, &command);
        assert_eq!(
            sut.join(" "),
            "srun --jobid 42 --nodes 1 --ntasks 1 --nodelist gpu-7 --overlap --job-name job.daemon-1 --kill-on-bad-exit=1 --quiet -- sluice daemon"
        );
        let sut = srun_command("42", "gpu-7", "job.trainer-worker-3", 2, &command);
        assert!(
            sut.contains(&"--gpus-per-task=2".to_owned()),
            "a trainer's GPUs are asked of its step: {sut:?}"
        );
        assert_eq!(sut[sut.len() - 3..], ["--", "sluice", "daemon"]);
    }

    #[test]
    fn trainers_meet_on_the_first_host_unless_their_role_says_otherwise() {
        let allocation = Allocation {
            job_id: "42".to_owned(),
            hosts: vec!["gpu-1".to_owned(), "gpu-2".to_owned()],
        };
        let spec = |id: ExecutorId, env: &[(&str, &str)]| LaunchSpec {
            id,
            node: 1,
            command: Vec::new(),
            env: env
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        };
        let trainer = ExecutorId::Trainer {
            role: "worker".to_owned(),
            rank: 3,
        };
        let sut = step_env(&allocation, &spec(trainer.clone(), &[("RANK", "3")]));
        assert_eq!(sut["MASTER_ADDR"], "gpu-1");
        assert_eq!(sut["RANK"], "3");
        let sut = step_env(&allocation, &spec(trainer, &[("MASTER_ADDR", "10.0.0.9")]));
        assert_eq!(sut["MASTER_ADDR"], "10.0.0.9", "the role's env wins");
        let sut = step_env(&allocation, &spec(ExecutorId::Daemon(1), &[]));
        assert!(!sut.contains_key("MASTER_ADDR"), "daemons do not meet");
    }
}
