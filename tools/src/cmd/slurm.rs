//! `sluice submit --launcher slurm` outside an allocation: the batch script that runs the job's AM
//! (`sluice run --launcher slurm`) on the allocation's first host, and its submission to `sbatch`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;
use sluice_am::launcher::ExecutorId;
use sluice_am::master::Placement;
use sluice_am::spec::JobSpec;

/// What the trainers of the busiest node need, summed over the ranks it feeds, the way Slurm asks
/// for resources: per node.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct NodeNeeds {
    ranks: u64,
    cpu: f64,
    memory_bytes: u64,
    gpu: u32,
}

/// The most any one node needs, with the trainers placed on nodes as the AM places them.
fn node_needs(spec: &JobSpec) -> NodeNeeds {
    let placement = Placement::of(spec);
    let mut per_node = vec![NodeNeeds::default(); spec.nodes.max(1) as usize];
    for id in placement.trainer_ids(&spec.roles) {
        let ExecutorId::Trainer { role, .. } = &id else {
            continue;
        };
        let Some(resources) = spec
            .roles
            .iter()
            .find(|candidate| candidate.name == *role)
            .map(|found| found.resources)
        else {
            continue;
        };
        let Some(node) = per_node.get_mut(placement.node_of(&id) as usize) else {
            continue;
        };
        node.ranks += 1;
        node.cpu += resources.cpu.unwrap_or(0.0);
        node.memory_bytes += resources.memory_bytes.unwrap_or(0);
        node.gpu += resources.gpu;
    }
    per_node
        .into_iter()
        .fold(NodeNeeds::default(), |most, node| NodeNeeds {
            ranks: most.ranks.max(node.ranks),
            cpu: most.cpu.max(node.cpu),
            memory_bytes: most.memory_bytes.max(node.memory_bytes),
            gpu: most.gpu.max(node.gpu),
        })
}

/// A word quoted for the shell.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The batch script of job `spec`: one allocation of `spec.nodes` hosts, each with the CPUs,
/// memory and GPUs its trainers ask for (plus a CPU for its node daemon, and its rings'
/// `ring_size` bytes in memory, since `/dev/shm` is charged to the job), the spec's partition,
/// time and extra options; it runs `sluice run` with `run_args`.
pub fn batch_script(
    spec: &JobSpec,
    sluice: &Path,
    run_args: &[OsString],
    ring_size: u64,
) -> String {
    let needs = node_needs(spec);
    let mut script = String::from("#!/bin/bash\n");
    let mut option = |line: String| {
        let _ = writeln!(script, "#SBATCH {line}");
    };
    option(format!("--job-name={}", spec.name));
    option(format!("--nodes={}", spec.nodes));
    option("--ntasks-per-node=1".to_owned());
    option(format!("--output=sluice-{}-%j.out", spec.name));
    if needs.cpu > 0.0 {
        option(format!("--cpus-per-task={}", needs.cpu.ceil() as u64 + 1));
    }
    if needs.memory_bytes > 0 {
        let bytes = needs.memory_bytes + needs.ranks * ring_size;
        option(format!("--mem={}M", bytes.div_ceil(1 << 20)));
    }
    if needs.gpu > 0 {
        option(format!("--gpus-per-node={}", needs.gpu));
    }
    if let Some(partition) = &spec.slurm.partition {
        option(format!("--partition={partition}"));
    }
    if let Some(time) = &spec.slurm.time {
        option(format!("--time={time}"));
    }
    for extra in &spec.slurm.sbatch {
        option(extra.clone());
    }
    let _ = writeln!(
        script,
        "# The job's AM runs here, on the allocation's first host, and starts its node daemons and\n# trainers as steps of the allocation."
    );
    let mut command = vec![quoted(&sluice.display().to_string()), "run".to_owned()];
    command.extend(
        run_args
            .iter()
            .map(|argument| quoted(&argument.to_string_lossy())),
    );
    let _ = writeln!(script, "exec {}", command.join(" "));
    script
}

/// Hands `script` to `sbatch` and says how to follow the batch job; a `token` goes to the job in
/// its environment, not in the script.
pub fn sbatch(name: &str, script: &str, token: Option<&str>) -> anyhow::Result<()> {
    let mut command = Command::new("sbatch");
    command
        .arg("--parsable")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(token) = token {
        command.env("SLUICE_TOKEN", token);
    }
    let mut child = command.spawn().context(
        "cannot run sbatch; the Slurm launcher needs Slurm's client commands on the PATH",
    )?;
    child
        .stdin
        .take()
        .context("sbatch's standard input")?
        .write_all(script.as_bytes())
        .context("writing the batch script to sbatch")?;
    let output = child.wait_with_output().context("waiting for sbatch")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let setting = ["partition", "time"]
            .into_iter()
            .find(|setting| stderr.contains(setting))
            .map_or_else(
                || "the spec's `launcher.sbatch` options".to_owned(),
                |setting| format!("the spec's `launcher.{setting}`"),
            );
        anyhow::bail!(
            "sbatch refused job {name} ({}): {}; check {setting} (`sinfo` lists the partitions and their time limits); `sluice submit --launcher slurm --dry-run` shows the script",
            output.status,
            stderr.trim()
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let job_id = stdout.trim().split(';').next().unwrap_or_default();
    println!(
        "sluice submit: job {name} submitted to Slurm as batch job {job_id}; its AM writes to sluice-{name}-{job_id}.out; follow it with `squeue -j {job_id}`, end it with `sluice stop` or `scancel {job_id}`"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_am::spec::Format;

    fn spec(text: &str) -> JobSpec {
        JobSpec::parse(text, Format::Yaml).expect("valid spec")
    }

    const JOB: &str = r#"
name: train
data: { sources: [{ uri: "file:///data", format: parquet }] }
nodes: 2
launcher: { kind: slurm, partition: gpu, time: "2:00:00", sbatch: [--account=ml] }
roles:
  - { name: worker, num: 4, command: [python, train.py], resources: { cpu: 1.5, memory: 1Gi, gpu: 1 } }
  - { name: eval, num: 1, command: [python, eval.py], resources: { cpu: 1, gpu: 1 } }
"#;

    #[test]
    fn the_busiest_node_sets_what_each_node_asks_for() {
        // Ranks 0-2 (three workers) on node 0; rank 3 (a worker) and rank 4 (eval) on node 1.
        let sut = node_needs(&spec(JOB));
        assert_eq!(
            sut,
            NodeNeeds {
                ranks: 3,
                cpu: 4.5,
                memory_bytes: 3 << 30,
                gpu: 3,
            }
        );
    }

    #[test]
    fn the_script_asks_for_the_nodes_and_resources_and_runs_the_am() {
        let args: Vec<OsString> = ["/jobs/it's.yaml", "--launcher", "slurm"]
            .into_iter()
            .map(OsString::from)
            .collect();
        let sut = batch_script(&spec(JOB), Path::new("/opt/sluice"), &args, 64 << 20);
        let expected = [
            "#!/bin/bash",
            "#SBATCH --job-name=train",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --output=sluice-train-%j.out",
            "#SBATCH --cpus-per-task=6",
            // Three trainers' 1 GiB and three 64 MiB rings.
            "#SBATCH --mem=3264M",
            "#SBATCH --gpus-per-node=3",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=2:00:00",
            "#SBATCH --account=ml",
        ];
        let lines: Vec<&str> = sut.lines().collect();
        assert_eq!(lines[..expected.len()], expected);
        assert_eq!(
            lines.last().copied(),
            Some(r"exec '/opt/sluice' run '/jobs/it'\''s.yaml' '--launcher' 'slurm'")
        );
    }

    #[test]
    fn a_job_without_resources_asks_only_for_its_nodes() {
        let text = JOB
            .replace(", resources: { cpu: 1.5, memory: 1Gi, gpu: 1 }", "")
            .replace(", resources: { cpu: 1, gpu: 1 }", "");
        let sut = batch_script(&spec(&text), Path::new("/opt/sluice"), &[], 1 << 20);
        for absent in ["--cpus-per-task", "--mem", "--gpus"] {
            assert!(!sut.contains(absent), "{absent} in:\n{sut}");
        }
    }
}
