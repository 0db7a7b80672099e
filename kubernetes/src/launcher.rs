//! The Kubernetes launcher: the AM, in its pod, runs each node as a pod and follows them with a
//! watch.
//!
//! # Implementation
//! A node's pod holds its daemon and the trainers of its ranks ([`manifests::node_pod`]), so it is
//! created once the AM has launched every executor of the node, which the AM does in one pass.
//! The kubelet restarts the pod's containers by its restart policy, so a launch of an executor
//! whose pod serves is already done; a launch on a node whose pod failed as a whole, or is gone,
//! creates the pod again (deleting what is left of the old one first). Stopping an executor
//! deletes its node's pod: a pod is the unit Kubernetes stops, and the watch then ends every
//! executor of it, which the AM launches again by its rules.
//!
//! A kube-rs watcher on the job's pods (by label) feeds [`PodWatch`], whose events go to the AM;
//! a listing after the watch started again ends the pods it no longer holds, and a clock tick
//! ends pods that stay unschedulable. API calls run as tasks on the AM's runtime, so that no
//! launcher call blocks; one that fails ends its executors with the API's error as their cause.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use sluice_am::launcher::{EventChannel, ExecutorEvent, ExecutorId, Exit, LaunchSpec, Launcher};
use sluice_am::master::Placement;
use sluice_am::spec::{JobSpec, KubernetesSpec};
use sluice_am::{AmError, Result};
use tokio::sync::mpsc;

use crate::manifests::{self, JOB_LABEL, Names, Owner, TOKEN_KEY, Trainer};
use crate::watch::{PodWatch, node_of};

/// How long a node pod may stay unschedulable before its executors count as failed.
pub const PENDING_LIMIT: Duration = Duration::from_secs(600);

/// How often the launcher looks at the clock for pods pending past [`PENDING_LIMIT`].
const TICK: Duration = Duration::from_secs(5);

/// Runs a job's nodes as pods of the cluster the AM runs in.
#[derive(Debug)]
pub struct KubernetesLauncher {
    shared: Arc<Shared>,
}

/// What the launcher, its API tasks and its watch share.
#[derive(Debug)]
struct Shared {
    runtime: tokio::runtime::Handle,
    pods: Api<Pod>,
    spec: JobSpec,
    kubernetes: KubernetesSpec,
    owner: Owner,
    ring_size: u64,
    /// The executors of each node, as the job starts.
    expected: BTreeMap<u32, BTreeSet<ExecutorId>>,
    /// The latest launch of each executor, by node.
    launches: Mutex<BTreeMap<u32, BTreeMap<ExecutorId, LaunchSpec>>>,
    /// The nodes whose pod this launcher created or found, until it is gone.
    created: Mutex<BTreeSet<u32>>,
    /// Executors an earlier AM launched, to be ended if their pod is not found.
    adopted: Mutex<BTreeSet<ExecutorId>>,
    watch: Mutex<PodWatch>,
    events: EventChannel,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl KubernetesLauncher {
    /// Connects to the cluster's API (in the AM's pod, or through `KUBECONFIG`), finds the AM's
    /// Job, which owns the node pods, and the job's token (made and kept in a Secret the first
    /// time), and starts watching the job's pods. Returns the launcher and the token.
    pub async fn connect(spec: &JobSpec, ring_size: u64) -> Result<(KubernetesLauncher, String)> {
        let kubernetes = spec.kubernetes.clone().ok_or_else(|| {
            AmError::FailedPrecondition(format!(
                "job {}: its spec does not run on Kubernetes; set `launcher: {{ kind: kubernetes, image: IMAGE }}`",
                spec.name
            ))
        })?;
        let client = kube::Client::try_default().await.map_err(|error| {
            AmError::FailedPrecondition(format!(
                "cannot reach the Kubernetes API: {error}; the Kubernetes launcher runs in the AM's pod (apply the objects `sluice manifests JOB.yaml` prints), or with KUBECONFIG naming a cluster"
            ))
        })?;
        let namespace = kubernetes.namespace.clone();
        let names = Names::of(&spec.name);
        let api_error = |what: String| {
            let namespace = namespace.clone();
            move |error: kube::Error| {
                AmError::FailedPrecondition(format!(
                    "{what} in namespace {namespace}: {error}; check that the AM runs with the ServiceAccount, Role and RoleBinding `sluice manifests` prints"
                ))
            }
        };
        let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
        let job = jobs
            .get(&names.am())
            .await
            .map_err(api_error(format!("reading the AM's Job {}", names.am())))?;
        let owner = Owner {
            name: names.am(),
            uid: job.metadata.uid.unwrap_or_default(),
        };
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let token = match secrets
            .get_opt(&names.token())
            .await
            .map_err(api_error(format!(
                "reading the token Secret {}",
                names.token()
            )))? {
            Some(secret) => secret
                .data
                .and_then(|data| data.get(TOKEN_KEY).cloned())
                .and_then(|bytes| String::from_utf8(bytes.0).ok())
                .ok_or_else(|| {
                    AmError::FailedPrecondition(format!(
                        "the Secret {} has no `{TOKEN_KEY}`; delete it, and the AM makes a new one",
                        names.token()
                    ))
                })?,
            None => {
                let token = sluice_am::service::new_token().map_err(|error| {
                    AmError::FailedPrecondition(format!(
                        "reading /dev/urandom for the job's token: {error}"
                    ))
                })?;
                let secret = manifests::token_secret(spec, &kubernetes, &owner, &token);
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(api_error(format!(
                        "creating the token Secret {}",
                        names.token()
                    )))?;
                token
            }
        };
        let expected = executors_by_node(spec);
        let shared = Arc::new(Shared {
            runtime: tokio::runtime::Handle::current(),
            pods: Api::namespaced(client, &namespace),
            spec: spec.clone(),
            kubernetes,
            owner,
            ring_size,
            expected,
            launches: Mutex::new(BTreeMap::new()),
            created: Mutex::new(BTreeSet::new()),
            adopted: Mutex::new(BTreeSet::new()),
            watch: Mutex::new(PodWatch::new(PENDING_LIMIT)),
            events: EventChannel::default(),
        });
        tokio::spawn(follow(Arc::downgrade(&shared)));
        tokio::spawn(tick(Arc::downgrade(&shared)));
        Ok((KubernetesLauncher { shared }, token))
    }
}

/// Follows the job's pods until the launcher is dropped, sending the executor events they tell.
async fn follow(shared: std::sync::Weak<Shared>) {
    let Some(pods) = shared.upgrade().map(|shared| shared.pods.clone()) else {
        return;
    };
    let job = shared
        .upgrade()
        .map(|shared| shared.spec.name.clone())
        .unwrap_or_default();
    let config = watcher::Config::default().labels(&format!("{JOB_LABEL}={job}"));
    let mut stream = watcher(pods, config).default_backoff().boxed();
    let mut listing: BTreeSet<String> = BTreeSet::new();
    while let Some(event) = stream.next().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "the watch of the job's pods failed; it starts again");
                continue;
            }
        };
        let now = Instant::now();
        let ended = match event {
            watcher::Event::Init => {
                listing.clear();
                Vec::new()
            }
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                if let Some(uid) = &pod.metadata.uid {
                    listing.insert(uid.clone());
                }
                let mut watch = lock(&shared.watch);
                let events = watch.observe(&pod, now);
                let followed = pod
                    .metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| watch.tracks(uid));
                if let (true, Some(node)) = (followed, node_of(&pod)) {
                    lock(&shared.created).insert(node);
                }
                events
            }
            watcher::Event::Delete(pod) => {
                let mut watch = lock(&shared.watch);
                // A pod forgotten since its node's pod was created again leaves that one be.
                let followed = pod
                    .metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| watch.tracks(uid));
                if let (true, Some(node)) = (followed, node_of(&pod)) {
                    lock(&shared.created).remove(&node);
                }
                watch.deleted(&pod)
            }
            watcher::Event::InitDone => {
                let mut ended = lock(&shared.watch).relisted(&listing);
                // Every pod runs its node's daemon: a pod gone unseen ended its daemon.
                for event in &ended {
                    if let ExecutorEvent::Exited {
                        id: ExecutorId::Daemon(node),
                        ..
                    } = event
                    {
                        lock(&shared.created).remove(node);
                    }
                }
                ended.extend(shared.unfound_adopted());
                ended
            }
        };
        for event in ended {
            shared.events.send(event);
        }
    }
}

/// Ends pods unschedulable past the limit, until the launcher is dropped.
async fn tick(shared: std::sync::Weak<Shared>) {
    let mut interval = tokio::time::interval(TICK);
    loop {
        interval.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let ended = lock(&shared.watch).tick(Instant::now());
        for event in ended {
            shared.events.send(event);
        }
    }
}

impl Shared {
    /// The adopted executors whose node has no pod: they ended while no AM watched.
    fn unfound_adopted(&self) -> Vec<ExecutorEvent> {
        let adopted = std::mem::take(&mut *lock(&self.adopted));
        let placement = Placement::of(&self.spec);
        let watch = lock(&self.watch);
        adopted
            .into_iter()
            .filter(|id| !watch.knows(placement.node_of(id)))
            .map(|id| ExecutorEvent::Exited {
                id,
                exit: Exit::Killed,
                cause: Some("its pod was not found when this AM took the job over".to_owned()),
            })
            .collect()
    }

    /// Whether node `node`'s pod runs its executors, restarting their containers itself.
    fn serves(&self, node: u32) -> bool {
        let watch = lock(&self.watch);
        lock(&self.created).contains(&node) && (!watch.knows(node) || watch.serves(node))
    }

    /// Deletes node `node`'s pod (at once, or after the pods' grace period).
    fn delete(self: &Arc<Self>, node: u32, at_once: bool) {
        let shared = self.clone();
        self.runtime.spawn(async move {
            let name = Names::of(&shared.spec.name).node_pod(node);
            let params = DeleteParams {
                grace_period_seconds: at_once.then_some(0),
                ..DeleteParams::default()
            };
            match shared.pods.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => tracing::warn!(pod = name, %error, "deleting the node pod failed"),
            }
        });
    }

    /// Creates node `node`'s pod from its executors' launches, deleting what is left of an
    /// earlier one first.
    fn create(self: &Arc<Self>, node: u32, launches: BTreeMap<ExecutorId, LaunchSpec>) {
        let Some(daemon) = launches.get(&ExecutorId::Daemon(node)).cloned() else {
            return;
        };
        let trainers: Vec<Trainer> = launches
            .values()
            .filter_map(|launch| match &launch.id {
                ExecutorId::Trainer { role, .. } => Some(Trainer {
                    role: role.clone(),
                    launch: launch.clone(),
                }),
                ExecutorId::Daemon(_) => None,
            })
            .collect();
        let pod = manifests::node_pod(
            &self.spec,
            &self.kubernetes,
            node,
            &self.owner,
            &daemon,
            &trainers,
            self.ring_size,
        );
        lock(&self.watch).forget_node(node);
        lock(&self.created).insert(node);
        let shared = self.clone();
        self.runtime.spawn(async move {
            let name = Names::of(&shared.spec.name).node_pod(node);
            if let Err(error) = shared.replace(&name, &pod).await {
                lock(&shared.created).remove(&node);
                let cause = format!("creating pod {name}: {error}");
                for id in launches.into_keys() {
                    shared.events.send(ExecutorEvent::Exited {
                        id,
                        exit: Exit::Killed,
                        cause: Some(cause.clone()),
                    });
                }
            }
        });
    }

    /// Creates `pod` as `name`, once an older pod of that name is gone.
    async fn replace(&self, name: &str, pod: &Pod) -> std::result::Result<(), kube::Error> {
        let started = Instant::now();
        loop {
            match self.pods.get_opt(name).await? {
                None => break,
                Some(old) if old.metadata.deletion_timestamp.is_none() => {
                    let params = DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    };
                    match self.pods.delete(name, &params).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => break,
                        Err(error) => return Err(error),
                    }
                }
                Some(_) if started.elapsed() > Duration::from_secs(120) => break,
                Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        self.pods
            .create(&PostParams::default(), pod)
            .await
            .map(drop)
    }
}

impl Launcher for KubernetesLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<()> {
        let shared = &self.shared;
        let node = spec.node;
        if shared.serves(node) {
            // The kubelet restarts the executor's container by the pod's restart policy.
            return Ok(());
        }
        let ready = {
            let mut launches = lock(&shared.launches);
            let of_node = launches.entry(node).or_default();
            of_node.insert(spec.id.clone(), spec.clone());
            let expected = shared.expected.get(&node).cloned().unwrap_or_default();
            expected
                .iter()
                .all(|id| of_node.contains_key(id))
                .then(|| of_node.clone())
        };
        if let Some(launches) = ready {
            shared.create(node, launches);
        }
        Ok(())
    }

    fn adopt(&self, id: &ExecutorId) {
        lock(&self.shared.adopted).insert(id.clone());
    }

    fn terminate(&self, id: &ExecutorId) {
        let node = Placement::of(&self.shared.spec).node_of(id);
        self.shared.delete(node, false);
    }

    fn kill(&self, id: &ExecutorId) {
        let node = Placement::of(&self.shared.spec).node_of(id);
        self.shared.delete(node, true);
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>> {
        self.shared.events.take()
    }

    fn remote(&self) -> bool {
        true
    }
}

/// The executors of each node of `spec` as it starts: what a node's pod waits for.
fn executors_by_node(spec: &JobSpec) -> BTreeMap<u32, BTreeSet<ExecutorId>> {
    let placement = Placement::of(spec);
    let mut by_node: BTreeMap<u32, BTreeSet<ExecutorId>> = BTreeMap::new();
    for id in (0..spec.nodes)
        .map(ExecutorId::Daemon)
        .chain(placement.trainer_ids(&spec.roles))
    {
        by_node
            .entry(placement.node_of(&id))
            .or_default()
            .insert(id);
    }
    by_node
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_am::spec::Format;

    #[test]
    fn a_node_pod_waits_for_its_daemon_and_the_trainers_of_its_ranks() {
        let spec = JobSpec::parse(
            "name: j\ndata: { sources: [{ uri: 'file:///d', format: parquet }] }\nnodes: 2\nroles: [{ name: w, num: 3, command: [x] }, { name: e, num: 1, command: [y] }]\nlauncher: { kind: kubernetes, image: i }\n",
            Format::Yaml,
        )
        .expect("spec");
        let trainer = |role: &str, rank| ExecutorId::Trainer {
            role: role.to_owned(),
            rank,
        };
        let sut = executors_by_node(&spec);
        assert_eq!(
            sut[&0],
            BTreeSet::from([ExecutorId::Daemon(0), trainer("w", 0), trainer("w", 1)])
        );
        assert_eq!(
            sut[&1],
            BTreeSet::from([ExecutorId::Daemon(1), trainer("w", 2), trainer("e", 3)])
        );
    }
}
