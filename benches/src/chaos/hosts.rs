//! `sluice-bench chaos --hosts N`: the chaos job across the hosts of a test bed (network, mount and
//! UTS namespaces on this machine, see [`sluice_testkit::netbed`]), as a cluster runs it: the AM on
//! one host, and on each of `N` node hosts a `sluice daemon` sidecar and one `sluice consume`
//! trainer, both started by the bench (the spec's external launcher), which starts them again when
//! they end before the job does.
//!
//! Beside `kill -9` of daemons and trainers (a killed trainer is started again on its ids file, as
//! torchrun restarts a rank, and reads on from its ring), it pulls node cables (`ip link set
//! down`) until the AM declares the node lost, then plugs them back: the old daemon is fenced, its
//! trainer told that its last reads are void; it moves the AM (kill it, start it on the spare AM
//! host, where the daemons find it through the address it publishes under the checkpoint
//! location); and it stops a trainer (`SIGSTOP`) until the AM reports the hang. It times each
//! detection. With `--heavy` the faults overlap: a link cut also kills the cut node's daemon (the
//! one started again is cut off, takes the rings over, and is fenced at its registration once the
//! link is back) or moves the AM while the node is cut off (the new AM declares it lost). The ids are
//! counted by the rule of a node cut off (`docs/architecture.md`, and [`super::fenced`]): the
//! reads of a fenced trainer of the rows the AM queued again when it declared the node lost are
//! void, always a tail of its reads, and delivered again elsewhere.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::job::read_batches;
use sluice_testkit::{Host, NetBed};

use super::fenced::{GenerationReads, losses_in, node_served};
use super::{
    ChaosOptions, ChaosReport, Detection, Kill, Tally, generate, ids_cut, mix, schedule, setup,
};
use crate::error::{BenchError, Result};

/// The port every AM listens on, on its host's address.
const AM_PORT: u16 = 7070;
/// The job's name.
const JOB: &str = "chaos-hosts";
/// Silence after which the AM declares a node lost.
const HEARTBEAT_TIMEOUT_MS: u64 = 3_000;
/// The least time a trainer must stop reading before the AM reports it hangs.
const HANG_AFTER_S: u64 = 2;
/// How long a detection may take before the run gives up on it.
const DETECTION_LIMIT: Duration = Duration::from_secs(60);
/// What a trainer prints when its daemon was fenced.
const FENCED: &str = "delivered again";

/// The faults of a run across hosts, beside the daemon kills and AM moves of [`ChaosOptions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostsPlan {
    /// Node hosts, each with a daemon and one trainer.
    pub hosts: usize,
    /// Node cables pulled until the AM declares the node lost.
    pub link_cuts: usize,
    /// Trainers stopped until the AM reports them hanging.
    pub hangs: usize,
    /// Faults overlap: a link cut also kills the cut node's daemon (started again cut off, it is
    /// fenced at its registration once the link is back) or moves the AM (which declares the node
    /// lost itself), as the seed picks.
    pub heavy: bool,
}

/// What else happens while a node's link is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum During {
    /// Nothing.
    Nothing,
    /// The node's daemon is killed, and started again cut off.
    DaemonKilled,
    /// The AM is moved to the other AM host.
    AmMoved,
}

/// One generation of a host's trainer: its ids file, and whether its daemon was fenced under it. A
/// trainer killed and started again stays in its generation: it reads on from its ring and
/// records into the same ids file.
#[derive(Debug)]
struct Generation {
    ids: PathBuf,
    fenced: bool,
}

/// A node host: its daemon and trainer, started again while the job runs.
struct Node {
    host: usize,
    daemon: Option<Child>,
    daemons: usize,
    trainer: Option<Child>,
    /// Trainers started on the host, each with its own logs.
    trainers: usize,
    /// Whether the running trainer was killed by the bench, to be started again in its generation.
    trainer_killed: bool,
    generations: Vec<Generation>,
    trainer_done: bool,
}

/// The bed, the job's files and its processes.
struct Cluster<'a> {
    options: &'a ChaosOptions,
    bed: &'a NetBed,
    shared: PathBuf,
    logs: PathBuf,
    spec: PathBuf,
    /// The AM's host (0 or 1), the AM, and how often it was started.
    am_host: usize,
    am: Option<Child>,
    ams: usize,
    nodes: Vec<Node>,
    /// How the AM ended, once it did.
    am_exit: Option<bool>,
    takeovers: usize,
    /// When the AM was first started, the data being ready.
    began: Instant,
}

/// Runs the chaos job across `plan.hosts` node hosts.
pub(super) fn run(options: &ChaosOptions, plan: &HostsPlan, seed: u64) -> Result<ChaosReport> {
    let mut names = vec!["am0".to_owned(), "am1".to_owned()];
    names.extend((0..plan.hosts).map(|node| format!("n{node}")));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let bed = NetBed::new(&names).map_err(|error| BenchError::Chaos {
        reason: format!(
            "--hosts needs a test bed of network namespaces: {error}; run as root on Linux with `ip` and `nsenter` (iproute2, util-linux)"
        ),
        logs: String::new(),
    })?;
    let mut cluster = Cluster::start(options, &bed, plan.hosts)?;
    let started = cluster.began;
    let outcome = cluster
        .faults(plan, seed, started)
        .and_then(|(kills, detections)| {
            cluster
                .finish(started)
                .map(|seconds| (kills, detections, seconds))
        });
    let (kills, detections, seconds) = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            cluster.keep_logs();
            cluster.stop_everything();
            return Err(error);
        }
    };
    cluster.keep_logs();
    let tally = cluster.tally();
    let job_succeeded = cluster.am_exit == Some(true);
    let takeovers = cluster.takeovers;
    let ids_cut = ids_cut(&cluster.every_log());
    Ok(ChaosReport {
        rows: options.rows,
        seed,
        kills,
        job_succeeded,
        outcome: format!(
            "sluice am: job {JOB} {}",
            if job_succeeded { "succeeded" } else { "failed" }
        ),
        delivered: tally.delivered,
        duplicates: tally.duplicates,
        missing: tally.missing,
        first_duplicates: tally.first_duplicates,
        first_missing: tally.first_missing,
        takeovers,
        ids_cut,
        seconds,
        hosts: plan.hosts,
        void_reads: tally.void,
        detections,
        rows_per_s: options.rows as f64 / seconds,
    })
}

impl<'a> Cluster<'a> {
    /// Generates the data, writes the spec, and starts the AM, the daemons and the trainers.
    fn start(options: &'a ChaosOptions, bed: &'a NetBed, hosts: usize) -> Result<Cluster<'a>> {
        let shared = bed.shared_dir();
        let logs = shared.join("logs");
        std::fs::create_dir_all(&logs).map_err(setup(format!("creating {}", logs.display())))?;
        let data = shared.join("data");
        generate(options, &data)?;
        let spec = shared.join("chaos.yaml");
        let text = format!(
            r#"
name: {JOB}
data:
  sources: [{{ uri: "file://{data}", format: parquet, columns: [id, label] }}]
  task_rows: 50000
  batch_size: 1000
  shuffle: {{ seed: 3, window: 2 }}
nodes: {hosts}
launcher: {{ kind: external }}
roles:
  - {{ name: worker, num: {hosts} }}
failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: {HEARTBEAT_TIMEOUT_MS}, hang: {{ after_s: {HANG_AFTER_S}, factor: 10, action: warn }} }}
checkpoint: {{ uri: "file://{journal}" }}
"#,
            data = data.display(),
            journal = shared.join("journal").display(),
        );
        std::fs::write(&spec, text).map_err(setup(format!("writing {}", spec.display())))?;
        let mut cluster = Cluster {
            options,
            bed,
            logs,
            spec,
            am_host: 0,
            am: None,
            ams: 0,
            nodes: Vec::new(),
            am_exit: None,
            takeovers: 0,
            shared,
            began: Instant::now(),
        };
        cluster.began = Instant::now();
        cluster.am = Some(cluster.start_am()?);
        for node in 0..hosts {
            let mut entry = Node {
                host: node + 2,
                daemon: None,
                daemons: 0,
                trainer: None,
                trainers: 0,
                trainer_killed: false,
                generations: Vec::new(),
                trainer_done: false,
            };
            entry.daemon = Some(cluster.start_daemon(&mut entry)?);
            entry.trainer = Some(cluster.start_trainer(&mut entry, false)?);
            cluster.nodes.push(entry);
        }
        Ok(cluster)
    }

    fn host(&self, index: usize) -> &Host {
        &self.bed.hosts()[index]
    }

    /// The current AM's address.
    fn am_address(&self) -> String {
        format!("{}:{AM_PORT}", self.host(self.am_host).address())
    }

    fn log(&self, name: &str) -> Result<std::fs::File> {
        let path = self.logs.join(name);
        std::fs::File::create(&path).map_err(setup(format!("creating {}", path.display())))
    }

    fn spawn(&self, mut command: Command, what: &str) -> Result<Child> {
        command.spawn().map_err(|source| BenchError::ToolMissing {
            program: self.options.sluice.display().to_string(),
            purpose: what.to_owned(),
            reason: source.to_string(),
            fix: "build it with `cargo build --release -p sluice-cli`, beside sluice-bench; `nsenter` comes with util-linux".to_owned(),
        })
    }

    /// Starts `sluice am` on the current AM host; it takes the job over from its journal when
    /// there is one.
    fn start_am(&mut self) -> Result<Child> {
        let host = self.host(self.am_host);
        let mut command = host.command(&self.options.sluice);
        command
            .arg("am")
            .arg(&self.spec)
            .args(["--listen", &self.am_address(), "--insecure"])
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(self.log(&format!("am-{}.log", self.ams))?)
            .stderr(self.log(&format!("am-{}.err", self.ams))?);
        self.ams += 1;
        self.spawn(command, "running the AM of the chaos job")
    }

    /// Starts the daemon of `node` with the job's name and no node id: it serves the node the AM
    /// gives its host, and takes over the rings it finds there.
    fn start_daemon(&self, node: &mut Node) -> Result<Child> {
        let host = self.host(node.host);
        let mut command = host.command(&self.options.sluice);
        command
            .args(["daemon", "--am", &self.am_address(), "--job", JOB])
            .args(["--ring-size", &(64u64 << 20).to_string()])
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(self.log(&format!("daemon-{}-{}.log", host.name(), node.daemons))?)
            .stderr(self.log(&format!("daemon-{}-{}.err", host.name(), node.daemons))?);
        node.daemons += 1;
        self.spawn(command, "running a node daemon of the chaos job")
    }

    /// Starts the trainer of `node`, rank `node.host - 2` of the job, launched as torchrun would:
    /// its rank and job come from the environment. `again`: in the generation of a trainer that was
    /// killed, on its ids file, as a launcher starts a rank again; otherwise in a new generation.
    fn start_trainer(&self, node: &mut Node, again: bool) -> Result<Child> {
        let host = self.host(node.host);
        let ids = match node.generations.last() {
            Some(last) if again => last.ids.clone(),
            _ => {
                let ids = self.shared.join(format!(
                    "ids-{}-{}.bin",
                    host.name(),
                    node.generations.len()
                ));
                node.generations.push(Generation {
                    ids: ids.clone(),
                    fenced: false,
                });
                ids
            }
        };
        let start = node.trainers;
        node.trainers += 1;
        let mut command = host.command(&self.options.sluice);
        command
            .arg("consume")
            .arg("--ids-out")
            .arg(&ids)
            .args([
                "--max-rows-per-s",
                &self.options.trainer_rows_per_s.to_string(),
            ])
            .env("SLUICE_RANK", (node.host - 2).to_string())
            .env(
                "SLUICE_WORLD_SIZE",
                (self.bed.hosts().len() - 2).to_string(),
            )
            .env("SLUICE_LOCAL_RANK", "0")
            .env("SLUICE_LOCAL_WORLD_SIZE", "1")
            .env("SLUICE_JOB", JOB)
            .env_remove("SLUICE_RING")
            .env_remove("SLUICE_RING_DIR")
            .stdin(Stdio::null())
            .stdout(self.log(&format!("trainer-{}-{start}.log", host.name()))?)
            .stderr(self.log(&format!("trainer-{}-{start}.err", host.name()))?);
        self.spawn(command, "running a trainer of the chaos job")
    }

    /// Starts again what ended before the job did: a daemon that failed (killed, or fenced), and
    /// a trainer that failed (killed, or its daemon fenced). Notes the AM's end.
    fn tend(&mut self) -> Result<()> {
        if self.am_exit.is_none()
            && let Some(am) = &mut self.am
            && let Some(status) = am.try_wait().map_err(setup("waiting for the AM"))?
        {
            self.am_exit = Some(status.success());
        }
        // Out of `self` while tended, since starting a process reads the rest of `self`.
        let mut nodes = std::mem::take(&mut self.nodes);
        let tended = nodes.iter_mut().try_for_each(|node| self.tend_node(node));
        self.nodes = nodes;
        tended
    }

    fn tend_node(&self, node: &mut Node) -> Result<()> {
        if let Some(daemon) = &mut node.daemon
            && let Some(status) = daemon.try_wait().map_err(setup("waiting for a daemon"))?
        {
            node.daemon = None;
            if !status.success() && self.am_exit.is_none() {
                node.daemon = Some(self.start_daemon(node)?);
            }
        }
        if let Some(trainer) = &mut node.trainer
            && let Some(status) = trainer.try_wait().map_err(setup("waiting for a trainer"))?
        {
            node.trainer = None;
            let killed = std::mem::take(&mut node.trainer_killed);
            if status.success() {
                node.trainer_done = true;
            } else {
                let host = self.host(node.host).name().to_owned();
                let err = std::fs::read_to_string(
                    self.logs
                        .join(format!("trainer-{host}-{}.err", node.trainers - 1)),
                )
                .unwrap_or_default();
                let fenced = err.contains(FENCED);
                if let Some(generation) = node.generations.last_mut() {
                    generation.fenced |= fenced;
                }
                if self.am_exit.is_none() {
                    node.trainer = Some(self.start_trainer(node, killed && !fenced)?);
                } else {
                    node.trainer_done = true;
                }
            }
        }
        Ok(())
    }

    /// Ids the trainers have written so far.
    fn delivered(&self) -> u64 {
        self.nodes
            .iter()
            .flat_map(|node| &node.generations)
            .map(|generation| std::fs::metadata(&generation.ids).map_or(0, |file| file.len() / 8))
            .sum()
    }

    /// Tends the processes until `ready` holds, failing after `limit`; returns the time it took.
    fn wait_until(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut(&mut Self) -> bool,
    ) -> Result<f64> {
        let started = Instant::now();
        loop {
            self.tend()?;
            if ready(self) {
                return Ok(started.elapsed().as_secs_f64());
            }
            if started.elapsed() > limit {
                return Err(BenchError::Chaos {
                    reason: format!("{what}: not within {limit:?}"),
                    logs: self.every_log(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The current AM's status, or `None` while it does not answer.
    fn status(&self) -> Option<serde_json::Value> {
        let output = Command::new(&self.options.sluice)
            .args(["status", "--json", "--am", &self.am_address()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !output.status.success() {
            return None;
        }
        serde_json::from_slice(&output.stdout).ok()
    }

    /// The standing of the node the AM's status lists for `host`.
    /// The state the AM gives the node `node` serves. By the node's id, which its daemons' logs
    /// give: an AM that took the job over learns a node's host name only when its daemon calls,
    /// and a node cut off does not.
    fn node_state(&self, node: &Node) -> Option<String> {
        let id = self.node_served(node)?;
        let status = self.status()?;
        status["nodes"]
            .as_array()?
            .iter()
            .find(|entry| entry["node_id"].as_u64() == Some(u64::from(id)))
            .and_then(|entry| entry["state"].as_str().map(str::to_owned))
    }

    /// The node the daemons of `node`'s host serve, once one of them said.
    fn node_served(&self, node: &Node) -> Option<u32> {
        let host = self.host(node.host).name();
        (0..node.daemons).find_map(|daemon| {
            let log = self.logs.join(format!("daemon-{host}-{daemon}.err"));
            node_served(&std::fs::read_to_string(log).unwrap_or_default())
        })
    }

    /// Runs the faults in a random order (every kind once before any twice), each once the
    /// trainers received more ids, none after 90 % of the rows; returns them with the detections
    /// they were timed by.
    fn faults(
        &mut self,
        plan: &HostsPlan,
        seed: u64,
        started: Instant,
    ) -> Result<(Vec<Kill>, Vec<Detection>)> {
        let mut random = seed;
        let faults = schedule(
            &[
                ("daemon", self.options.daemon_kills),
                ("am", self.options.am_kills),
                ("link", plan.link_cuts),
                ("hang", plan.hangs),
                ("trainer", self.options.trainer_kills),
            ],
            &mut random,
        );
        let late = self.options.rows * 9 / 10;
        let mut kills = Vec::new();
        let mut detections = Vec::new();
        let mut last_seen = 0;
        for fault in faults {
            random = mix(random);
            let pause = Duration::from_millis(1000 + random % 2000);
            let resting = Instant::now();
            self.wait_until(
                "the trainers receive more ids",
                self.options.watchdog,
                |cluster| {
                    let seen = cluster.delivered();
                    let moved = (seen > last_seen || seen >= late) && resting.elapsed() >= pause;
                    if moved {
                        last_seen = seen;
                    }
                    moved || cluster.am_exit.is_some()
                },
            )?;
            if self.am_exit.is_some() || last_seen >= late {
                break;
            }
            let live: Vec<usize> = (0..self.nodes.len())
                .filter(|node| !self.nodes[*node].trainer_done)
                .collect();
            let Some(&node) = live.get((random >> 32) as usize % live.len().max(1)) else {
                break;
            };
            let at_s = started.elapsed().as_secs_f64();
            kills.push(Kill {
                what: fault,
                after_ids: last_seen,
                at_s,
            });
            match fault {
                "daemon" => {
                    if let Some(daemon) = &mut self.nodes[node].daemon {
                        let _ = daemon.kill();
                    }
                }
                "trainer" => self.kill_trainer(node),
                "am" => detections.push(self.move_am(None)?),
                "link" => {
                    let during = match (plan.heavy, (random >> 16) % 3) {
                        (false, _) | (true, 0) => During::Nothing,
                        (true, 1) => During::DaemonKilled,
                        (true, _) => During::AmMoved,
                    };
                    if let Some(kill) = kills.last_mut() {
                        kill.what = match during {
                            During::Nothing => "link",
                            During::DaemonKilled => "link+daemon",
                            During::AmMoved => "link+am",
                        };
                    }
                    detections.extend(self.cut(node, during)?);
                }
                _ => detections.push(self.hang(node)?),
            }
        }
        Ok((kills, detections))
    }

    /// Kills the trainer of `node` with `kill -9`; [`Cluster::tend`] starts it again in its
    /// generation.
    fn kill_trainer(&mut self, node: usize) {
        let node = &mut self.nodes[node];
        if let Some(trainer) = &mut node.trainer
            && trainer.kill().is_ok()
        {
            node.trainer_killed = true;
        }
    }

    /// Kills the AM and starts it on the other AM host; times until every node host with a live
    /// daemon, but the node `cut` off, is heard by the new AM.
    fn move_am(&mut self, cut: Option<usize>) -> Result<Detection> {
        if let Some(am) = &mut self.am {
            let _ = am.kill();
            let _ = am.wait();
        }
        self.am_host = 1 - self.am_host;
        self.am = Some(self.start_am()?);
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(index, node)| node.daemon.is_some() && Some(*index) != cut)
            .map(|(_, node)| self.host(node.host).name().to_owned())
            .collect();
        let seconds = self.wait_until(
            "the daemons reach the moved AM",
            DETECTION_LIMIT,
            |cluster| {
                let Some(status) = cluster.status() else {
                    return cluster.am_exit.is_some();
                };
                let heard: HashMap<String, u64> = status["nodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|entry| {
                        Some((
                            entry["hostname"].as_str()?.to_owned(),
                            entry["since_last_heartbeat_ms"].as_u64()?,
                        ))
                    })
                    .collect();
                hosts
                    .iter()
                    .all(|host| heard.get(host).is_some_and(|since| *since < 1_000))
            },
        )?;
        Ok(Detection {
            what: "daemons reach the moved AM",
            seconds,
        })
    }

    /// Pulls the cable of `node` until the AM declares it lost, `during` it killing its daemon
    /// or moving the AM, then plugs it back; times the detections.
    fn cut(&mut self, node: usize, during: During) -> Result<Vec<Detection>> {
        let host = self.host(self.nodes[node].host).name().to_owned();
        self.host(self.nodes[node].host).link_down();
        let mut detections = Vec::new();
        match during {
            During::Nothing => {}
            During::DaemonKilled => {
                // [`Cluster::tend`] starts it again, cut off: it takes the rings over and
                // registers once the link is back.
                if let Some(daemon) = &mut self.nodes[node].daemon {
                    let _ = daemon.kill();
                }
            }
            During::AmMoved => match self.move_am(Some(node)) {
                Ok(detection) => detections.push(detection),
                Err(error) => {
                    self.host(self.nodes[node].host).link_up();
                    return Err(error);
                }
            },
        }
        let detected = self.wait_until(
            &format!("the AM declares the node of {host} lost"),
            DETECTION_LIMIT,
            |cluster| {
                cluster.node_state(&cluster.nodes[node]).as_deref() == Some("lost")
                    || cluster.am_exit.is_some()
            },
        );
        self.host(self.nodes[node].host).link_up();
        detections.push(Detection {
            what: "node lost",
            seconds: detected?,
        });
        Ok(detections)
    }

    /// Stops the trainer of `node` until the AM reports it hanging, then lets it go on; times the
    /// detection.
    fn hang(&mut self, node: usize) -> Result<Detection> {
        let host = self.host(self.nodes[node].host).name().to_owned();
        let Some(pid) = self.nodes[node].trainer.as_ref().map(Child::id) else {
            return Ok(Detection {
                what: "trainer hang (no trainer to stop)",
                seconds: 0.0,
            });
        };
        let signal = |signal: &str| {
            Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .is_ok_and(|status| status.success())
        };
        signal("-STOP");
        let detected = self.wait_until(
            &format!("the AM reports the stopped trainer of {host}"),
            DETECTION_LIMIT,
            |cluster| {
                cluster.am_exit.is_some()
                    || cluster.status().is_some_and(|status| {
                        status["hangs"]
                            .as_array()
                            .is_some_and(|hangs| hangs.iter().any(|hang| hang["kind"] == "trainer"))
                    })
            },
        );
        signal("-CONT");
        Ok(Detection {
            what: "trainer hang",
            seconds: detected?,
        })
    }

    /// Waits for the job to end and every trainer with it; returns the run's wall time.
    fn finish(&mut self, started: Instant) -> Result<f64> {
        let watchdog = self.options.watchdog.saturating_sub(started.elapsed());
        self.wait_until("the job ends", watchdog, |cluster| {
            cluster.am_exit.is_some()
        })?;
        let seconds = started.elapsed().as_secs_f64();
        self.wait_until("the trainers end", DETECTION_LIMIT, |cluster| {
            cluster
                .nodes
                .iter()
                .all(|node| node.trainer.is_none() && node.daemon.is_none())
        })?;
        self.takeovers = self
            .every_log()
            .matches("took over a ring this node fed before it restarted")
            .count();
        Ok(seconds)
    }

    /// The ids by the rule of a node cut off: every generation's batches, in each host's order,
    /// with the node its daemons served and whether it was fenced, and the losses the AMs logged.
    fn tally(&self) -> Tally {
        let read = |name: String| std::fs::read_to_string(self.logs.join(name)).unwrap_or_default();
        let generations: Vec<GenerationReads> = self
            .nodes
            .iter()
            .flat_map(|node| {
                let served = self.node_served(node);
                node.generations
                    .iter()
                    .map(move |generation| GenerationReads {
                        node: served,
                        batches: read_batches(&generation.ids),
                        fenced: generation.fenced,
                    })
            })
            .collect();
        let am_logs: Vec<String> = (0..self.ams)
            .map(|am| read(format!("am-{am}.err")))
            .collect();
        let losses = losses_in(am_logs.iter().map(String::as_str));
        Tally::by_the_rule(&generations, &losses, self.options.rows)
    }

    fn every_log(&self) -> String {
        sluice_testkit::job::logs(&self.logs)
    }

    /// Copies the logs and ids files to the run's directory, when it has one.
    fn keep_logs(&self) {
        let Some(directory) = &self.options.directory else {
            return;
        };
        let _ = std::fs::create_dir_all(directory);
        for source in [&self.logs, &self.shared] {
            let Ok(entries) = std::fs::read_dir(source) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let keep = path.is_file()
                    && path.extension().is_some_and(|extension| {
                        ["bin", "positions", "log", "err", "yaml"]
                            .iter()
                            .any(|kept| extension == *kept)
                    });
                if keep && let Some(name) = path.file_name() {
                    let _ = std::fs::copy(&path, directory.join(name));
                }
            }
        }
    }

    /// Kills every process of the run.
    fn stop_everything(&mut self) {
        if let Some(am) = &mut self.am {
            let _ = am.kill();
            let _ = am.wait();
        }
        for node in &mut self.nodes {
            for child in [node.daemon.as_mut(), node.trainer.as_mut()]
                .into_iter()
                .flatten()
            {
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        for host in self.bed.hosts() {
            host.link_up();
        }
        self.stop_everything();
    }
}
