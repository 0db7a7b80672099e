//! How the states of a job's node pods become executor events, as pure functions of what the
//! watch sees, so that recorded sequences of pod states test them without an API server.
//!
//! A node pod runs its node's daemon (a native sidecar) and a container per trainer rank. The
//! kubelet restarts their containers by the pod's restart policy (the spec's `failover.restart`);
//! the AM counts each end against the failure budget. So every end the watch sees becomes one
//! [`ExecutorEvent::Exited`], with its cause when Kubernetes says more than an exit code:
//! - a container that terminated (its state, or its last state once restarted), as its exit code,
//!   or killed for a code from 128 on (`OOMKilled` and the like named);
//! - a container whose image cannot be pulled or whose configuration is refused, at each attempt
//!   (each new `ErrImagePull`), so that the failure budget ends a job whose image is wrong;
//! - every executor of a pod that failed as a whole (evicted, its node shut down), whose node
//!   stopped reporting (phase `Unknown`), that was deleted, or that could not be scheduled for
//!   longer than the pending limit.
//!
//! Pods are told apart by uid, so that a pod created again under the same name starts afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use sluice_am::launcher::{ExecutorEvent, ExecutorId, Exit};

use crate::manifests::{DAEMON_CONTAINER, NODE_LABEL};

/// Waiting reasons that mean a container cannot start as it is: each new one is an attempt that
/// failed.
const START_FAILURES: [&str; 4] = [
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// What the watch last saw of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ContainerSeen {
    /// Its restart count.
    restarts: i32,
    /// The restart count at which its termination was told, if it was.
    told_at: Option<i32>,
    /// The waiting reason last seen, so that each new failed start is told once.
    waiting: Option<String>,
}

/// What the watch knows of one pod.
#[derive(Debug, Clone)]
struct PodSeen {
    name: String,
    node: u32,
    /// The executors it runs, by container name.
    executors: BTreeMap<String, ExecutorId>,
    containers: BTreeMap<String, ContainerSeen>,
    /// The executors whose end was told since the pod failed as a whole.
    ended: BTreeSet<ExecutorId>,
    /// Since when the pod is known to be unschedulable.
    unschedulable_since: Option<Instant>,
}

/// The executor events of a job's node pods.
#[derive(Debug)]
pub struct PodWatch {
    pods: BTreeMap<String, PodSeen>,
    /// Pods of nodes whose pod was created again: what they do no longer tells anything.
    forgotten: BTreeSet<String>,
    pending_limit: Duration,
}

/// The executor a container of node `node`'s pod runs: the daemon, or the trainer
/// `<role>-<rank>`.
pub fn executor_of(container: &str, node: u32) -> Option<ExecutorId> {
    if container == DAEMON_CONTAINER {
        return Some(ExecutorId::Daemon(node));
    }
    let (role, rank) = container.rsplit_once('-')?;
    Some(ExecutorId::Trainer {
        role: role.to_owned(),
        rank: rank.parse().ok()?,
    })
}

/// The node a pod serves, from its label.
pub fn node_of(pod: &Pod) -> Option<u32> {
    pod.metadata.labels.as_ref()?.get(NODE_LABEL)?.parse().ok()
}

/// The exit and cause of a terminated container.
fn ended(
    terminated: &ContainerStateTerminated,
    container: &str,
    pod: &str,
) -> (Exit, Option<String>) {
    let exit = if (0..128).contains(&terminated.exit_code) {
        Exit::Code(terminated.exit_code)
    } else {
        Exit::Killed
    };
    let cause = terminated
        .reason
        .as_deref()
        .filter(|reason| !matches!(*reason, "Completed" | "Error"))
        .map(|reason| {
            let message = terminated
                .message
                .as_deref()
                .map(|message| format!(": {}", message.trim()))
                .unwrap_or_default();
            format!(
                "{reason}{message} (container {container} of pod {pod}, exit code {})",
                terminated.exit_code
            )
        });
    (exit, cause)
}

fn event(id: ExecutorId, exit: Exit, cause: Option<String>) -> ExecutorEvent {
    ExecutorEvent::Exited { id, exit, cause }
}

impl PodWatch {
    /// A watch that ends the executors of a pod that cannot be scheduled for `pending_limit`.
    pub fn new(pending_limit: Duration) -> PodWatch {
        PodWatch {
            pods: BTreeMap::new(),
            forgotten: BTreeSet::new(),
            pending_limit,
        }
    }

    /// Whether the pod of node `node` is known, and neither failed as a whole nor deleted.
    pub fn serves(&self, node: u32) -> bool {
        self.pods
            .values()
            .any(|pod| pod.node == node && pod.ended.is_empty())
    }

    /// Forgets the pods of node `node`, whose pod is being created again: their later states and
    /// their deletion tell nothing, since their executors' ends were told.
    pub fn forget_node(&mut self, node: u32) {
        let uids: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, pod)| pod.node == node)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in uids {
            self.pods.remove(&uid);
            self.forgotten.insert(uid);
        }
    }

    /// Whether the pod of uid `uid` is followed.
    pub fn tracks(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// The events a pod's new state tells, seen at `now`.
    pub fn observe(&mut self, pod: &Pod, now: Instant) -> Vec<ExecutorEvent> {
        let (Some(uid), Some(node)) = (pod.metadata.uid.clone(), node_of(pod)) else {
            return Vec::new();
        };
        if self.forgotten.contains(&uid) {
            return Vec::new();
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let seen = self.pods.entry(uid).or_insert_with(|| PodSeen {
            name: name.clone(),
            node,
            executors: pod
                .spec
                .iter()
                .flat_map(|spec| {
                    let init = spec.init_containers.iter().flatten();
                    init.chain(spec.containers.iter())
                })
                .filter_map(|container| {
                    Some((container.name.clone(), executor_of(&container.name, node)?))
                })
                .collect(),
            containers: BTreeMap::new(),
            ended: BTreeSet::new(),
            unschedulable_since: None,
        });
        let Some(status) = &pod.status else {
            return Vec::new();
        };
        let mut events = Vec::new();
        let statuses = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for container in statuses {
            events.extend(container_events(seen, container));
        }
        let phase = status.phase.as_deref().unwrap_or("Pending");
        let whole = match phase {
            "Failed" => Some(format!(
                "pod {name} failed{}",
                reason_and_message(status.reason.as_deref(), status.message.as_deref())
            )),
            "Unknown" => Some(format!(
                "the node of pod {name} stopped reporting (phase Unknown){}",
                reason_and_message(status.reason.as_deref(), status.message.as_deref())
            )),
            "Pending" => match unschedulable(pod) {
                Some(message) => {
                    let since = *seen.unschedulable_since.get_or_insert(now);
                    (now.saturating_duration_since(since) >= self.pending_limit).then(|| {
                        format!(
                            "pod {name} could not be scheduled for {} s: {message}",
                            self.pending_limit.as_secs()
                        )
                    })
                }
                None => {
                    seen.unschedulable_since = None;
                    None
                }
            },
            _ => None,
        };
        if let Some(cause) = whole {
            events.extend(end_all(seen, &cause));
        }
        events
    }

    /// The events of a pod that was deleted: every executor whose end was not told.
    pub fn deleted(&mut self, pod: &Pod) -> Vec<ExecutorEvent> {
        let Some(uid) = &pod.metadata.uid else {
            return Vec::new();
        };
        self.forgotten.remove(uid);
        let Some(mut seen) = self.pods.remove(uid) else {
            return Vec::new();
        };
        let cause = format!(
            "pod {} was deleted (its node was lost or drained, or it was removed)",
            seen.name
        );
        end_all(&mut seen, &cause)
    }

    /// The events of a new listing of the job's pods (after the watch started again, when
    /// deletions may have been missed): every pod not among the `present` uids was deleted.
    pub fn relisted(&mut self, present: &BTreeSet<String>) -> Vec<ExecutorEvent> {
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !present.contains(*uid))
            .cloned()
            .collect();
        let mut events = Vec::new();
        for uid in gone {
            if let Some(mut seen) = self.pods.remove(&uid) {
                let cause = format!(
                    "pod {} is gone (deleted while the watch was away)",
                    seen.name
                );
                events.extend(end_all(&mut seen, &cause));
            }
        }
        events
    }

    /// Whether a pod of node `node` is known, live or ended.
    pub fn knows(&self, node: u32) -> bool {
        self.pods.values().any(|pod| pod.node == node)
    }

    /// The events of the passing of time to `now`: pods unschedulable past the pending limit.
    pub fn tick(&mut self, now: Instant) -> Vec<ExecutorEvent> {
        let limit = self.pending_limit;
        self.pods
            .values_mut()
            .filter(|seen| {
                seen.ended.is_empty()
                    && seen
                        .unschedulable_since
                        .is_some_and(|since| now.saturating_duration_since(since) >= limit)
            })
            .flat_map(|seen| {
                let cause = format!(
                    "pod {} could not be scheduled for {} s",
                    seen.name,
                    limit.as_secs()
                );
                end_all(seen, &cause)
            })
            .collect()
    }
}

/// ` (reason): message`, of what is given.
fn reason_and_message(reason: Option<&str>, message: Option<&str>) -> String {
    let mut text = String::new();
    if let Some(reason) = reason {
        text.push_str(&format!(" ({reason})"));
    }
    if let Some(message) = message {
        text.push_str(&format!(": {}", message.trim()));
    }
    text
}

/// The scheduler's message when it cannot place the pod.
fn unschedulable(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|condition| {
            condition.type_ == "PodScheduled"
                && condition.status == "False"
                && condition.reason.as_deref() == Some("Unschedulable")
        })
        .map(|condition| condition.message.clone().unwrap_or_default())
}

/// The ends of every executor of a pod whose end was not told, all killed by `cause`.
fn end_all(seen: &mut PodSeen, cause: &str) -> Vec<ExecutorEvent> {
    let mut events = Vec::new();
    for (container, id) in &seen.executors {
        if seen.ended.contains(id) {
            continue;
        }
        let already = seen
            .containers
            .get(container)
            .is_some_and(|container| container.told_at == Some(container.restarts));
        seen.ended.insert(id.clone());
        if !already {
            events.push(event(id.clone(), Exit::Killed, Some(cause.to_owned())));
        }
    }
    events
}

/// The ends one container's status tells that were not told yet.
fn container_events(seen: &mut PodSeen, status: &ContainerStatus) -> Vec<ExecutorEvent> {
    let Some(id) = seen.executors.get(&status.name).cloned() else {
        return Vec::new();
    };
    if seen.ended.contains(&id) {
        return Vec::new();
    }
    let pod = seen.name.clone();
    let container = seen.containers.entry(status.name.clone()).or_default();
    let mut events = Vec::new();
    if status.restart_count > container.restarts {
        // Each restart ended a run; the one told as terminated already is not told again. The
        // last of them is the container's last state.
        let mut untold = status.restart_count - container.restarts;
        if container.told_at == Some(container.restarts) {
            untold -= 1;
        }
        for index in 0..untold {
            let last = status
                .last_state
                .as_ref()
                .and_then(|state| state.terminated.as_ref())
                .filter(|_| index + 1 == untold);
            let (exit, cause) = match last {
                Some(terminated) => ended(terminated, &status.name, &pod),
                None => (
                    Exit::Killed,
                    Some(format!("container {} of pod {pod} restarted", status.name)),
                ),
            };
            events.push(event(id.clone(), exit, cause));
        }
        container.restarts = status.restart_count;
        container.told_at = None;
    }
    let state = status.state.as_ref();
    if let Some(terminated) = state.and_then(|state| state.terminated.as_ref())
        && container.told_at != Some(status.restart_count)
    {
        let (exit, cause) = ended(terminated, &status.name, &pod);
        events.push(event(id.clone(), exit, cause));
        container.told_at = Some(status.restart_count);
    }
    let waiting = state
        .and_then(|state| state.waiting.as_ref())
        .and_then(|waiting| Some((waiting.reason.clone()?, waiting.message.clone())));
    match waiting {
        Some((reason, message)) => {
            if START_FAILURES.contains(&reason.as_str())
                && container.waiting.as_deref() != Some(reason.as_str())
            {
                let image = status.image.as_str();
                events.push(event(
                    id,
                    Exit::Killed,
                    Some(format!(
                        "{reason}{} (container {} of pod {pod}, image {image})",
                        message
                            .map(|message| format!(": {}", message.trim()))
                            .unwrap_or_default(),
                        status.name
                    )),
                ));
            }
            container.waiting = Some(reason);
        }
        None => container.waiting = None,
    }
    events
}

#[cfg(test)]
mod tests;
