//! Recorded sequences of a node pod's states, as the API server reports them, and the executor
//! events each must give.

use super::*;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);

/// Node 1's pod (`uid`) in `phase`, with the daemon's and two trainers' statuses and more status
/// fields in `extra`.
fn pod(uid: &str, phase: &str, statuses: &[Value], extra: Value) -> Pod {
    let (init, main): (Vec<Value>, Vec<Value>) = statuses
        .iter()
        .cloned()
        .partition(|status| status["name"] == DAEMON_CONTAINER);
    let mut status = json!({
        "phase": phase,
        "initContainerStatuses": init,
        "containerStatuses": main,
    });
    if let (Some(status), Some(extra)) = (status.as_object_mut(), extra.as_object()) {
        status.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": { "name": "job-node-1", "uid": uid, "labels": { NODE_LABEL: "1" } },
        "spec": {
            "initContainers": [{ "name": DAEMON_CONTAINER, "restartPolicy": "Always" }],
            "containers": [{ "name": "worker-2" }, { "name": "worker-3" }],
        },
        "status": status,
    }))
    .expect("a pod")
}

fn running(name: &str, restarts: i32) -> Value {
    json!({
        "name": name, "image": "train:1", "imageID": "", "ready": true,
        "restartCount": restarts, "state": { "running": {} },
    })
}

fn terminated(name: &str, restarts: i32, code: i32, reason: &str) -> Value {
    json!({
        "name": name, "image": "train:1", "imageID": "", "ready": false,
        "restartCount": restarts,
        "state": { "terminated": { "exitCode": code, "reason": reason } },
    })
}

fn restarted_after(name: &str, restarts: i32, code: i32, reason: &str) -> Value {
    json!({
        "name": name, "image": "train:1", "imageID": "", "ready": true,
        "restartCount": restarts, "state": { "running": {} },
        "lastState": { "terminated": { "exitCode": code, "reason": reason, "message": "over its limit" } },
    })
}

fn waiting(name: &str, reason: &str) -> Value {
    json!({
        "name": name, "image": "registry.example/train:typo", "imageID": "", "ready": false,
        "restartCount": 0,
        "state": { "waiting": { "reason": reason, "message": "manifest unknown" } },
    })
}

fn all_running(restarts: i32) -> Vec<Value> {
    vec![
        running(DAEMON_CONTAINER, 0),
        running("worker-2", restarts),
        running("worker-3", 0),
    ]
}

fn worker(rank: u32) -> ExecutorId {
    ExecutorId::Trainer {
        role: "worker".to_owned(),
        rank,
    }
}

/// The events as (executor, exit, whether the cause contains `needle`).
fn summary(events: &[ExecutorEvent], needle: &str) -> Vec<(ExecutorId, Exit, bool)> {
    events
        .iter()
        .map(|ExecutorEvent::Exited { id, exit, cause }| {
            (
                id.clone(),
                *exit,
                cause.as_deref().is_some_and(|cause| cause.contains(needle)),
            )
        })
        .collect()
}

#[test]
fn containers_map_to_their_executors() {
    assert_eq!(
        executor_of(DAEMON_CONTAINER, 4),
        Some(ExecutorId::Daemon(4))
    );
    assert_eq!(
        executor_of("data-loader-17", 4),
        Some(ExecutorId::Trainer {
            role: "data-loader".to_owned(),
            rank: 17
        })
    );
    assert_eq!(executor_of("sidecar", 4), None);
}

#[test]
fn an_oom_killed_trainer_is_told_once_though_the_kubelet_restarts_it() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    assert!(
        sut.observe(&pod("a", "Running", &all_running(0), json!({})), now)
            .is_empty()
    );
    assert!(sut.serves(1));
    let oom = [
        running(DAEMON_CONTAINER, 0),
        terminated("worker-2", 0, 137, "OOMKilled"),
        running("worker-3", 0),
    ];
    let events = sut.observe(&pod("a", "Running", &oom, json!({})), now);
    assert_eq!(
        summary(
            &events,
            "OOMKilled (container worker-2 of pod job-node-1, exit code 137)"
        ),
        [(worker(2), Exit::Killed, true)]
    );
    // The kubelet restarts it: the same end, now its last state, is not told again.
    let back = [
        running(DAEMON_CONTAINER, 0),
        restarted_after("worker-2", 1, 137, "OOMKilled"),
        running("worker-3", 0),
    ];
    assert!(
        sut.observe(&pod("a", "Running", &back, json!({})), now)
            .is_empty()
    );
    // Two restarts the watch did not see as terminated: each is told, the last with its cause.
    let twice = [
        running(DAEMON_CONTAINER, 0),
        restarted_after("worker-2", 3, 3, "Error"),
        running("worker-3", 0),
    ];
    let events = sut.observe(&pod("a", "Running", &twice, json!({})), now);
    assert_eq!(
        summary(&events, "restarted"),
        [
            (worker(2), Exit::Killed, true),
            (worker(2), Exit::Code(3), false)
        ]
    );
}

#[test]
fn a_trainer_that_completes_exits_with_code_zero_and_no_cause() {
    let mut sut = PodWatch::new(LIMIT);
    let done = [
        running(DAEMON_CONTAINER, 0),
        terminated("worker-2", 0, 0, "Completed"),
        running("worker-3", 0),
    ];
    let events = sut.observe(&pod("a", "Running", &done, json!({})), Instant::now());
    assert_eq!(
        events,
        [ExecutorEvent::Exited {
            id: worker(2),
            exit: Exit::Code(0),
            cause: None
        }]
    );
}

#[test]
fn an_evicted_pod_ends_each_of_its_executors_once() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    sut.observe(&pod("a", "Running", &all_running(0), json!({})), now);
    let evicted = [
        terminated(DAEMON_CONTAINER, 0, 137, "Error"),
        terminated("worker-2", 0, 137, "Error"),
        running("worker-3", 0),
    ];
    let extra = json!({ "reason": "Evicted", "message": "The node was low on resource: memory." });
    let events = sut.observe(&pod("a", "Failed", &evicted, extra.clone()), now);
    assert_eq!(
        summary(
            &events,
            "pod job-node-1 failed (Evicted): The node was low on resource: memory."
        ),
        [
            (ExecutorId::Daemon(1), Exit::Killed, false),
            (worker(2), Exit::Killed, false),
            (worker(3), Exit::Killed, true),
        ],
        "the terminated containers by their own exit, the running one by the eviction"
    );
    assert!(!sut.serves(1), "a failed pod serves no more");
    assert!(
        sut.observe(&pod("a", "Failed", &evicted, extra.clone()), now)
            .is_empty()
    );
    assert!(
        sut.deleted(&pod("a", "Failed", &evicted, extra)).is_empty(),
        "its deletion tells nothing new"
    );
}

#[test]
fn a_lost_node_ends_the_executors_of_its_pod() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    sut.observe(&pod("a", "Running", &all_running(0), json!({})), now);
    let extra = json!({ "reason": "NodeLost", "message": "Node gpu-7 which was running pod job-node-1 is unresponsive" });
    let events = sut.observe(&pod("a", "Unknown", &all_running(0), extra), now);
    assert_eq!(
        summary(
            &events,
            "stopped reporting (phase Unknown) (NodeLost): Node gpu-7"
        ),
        [
            (ExecutorId::Daemon(1), Exit::Killed, true),
            (worker(2), Exit::Killed, true),
            (worker(3), Exit::Killed, true),
        ]
    );
}

#[test]
fn a_deleted_pod_ends_what_it_ran_and_a_new_pod_of_the_same_name_starts_afresh() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    let first = pod("a", "Running", &all_running(2), json!({}));
    sut.observe(&first, now);
    let events = sut.deleted(&first);
    assert_eq!(
        summary(&events, "pod job-node-1 was deleted"),
        [
            (ExecutorId::Daemon(1), Exit::Killed, true),
            (worker(2), Exit::Killed, true),
            (worker(3), Exit::Killed, true),
        ]
    );
    assert!(!sut.serves(1));
    let second = pod("b", "Running", &all_running(0), json!({}));
    assert!(
        sut.observe(&second, now).is_empty(),
        "restart counts start over"
    );
    assert!(sut.serves(1));
}

#[test]
fn a_pod_pending_past_the_limit_ends_its_executors_naming_the_scheduler() {
    let start = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    let extra = json!({ "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu.",
    }] });
    let pending = pod("a", "Pending", &[], extra);
    assert!(sut.observe(&pending, start).is_empty());
    assert!(
        sut.observe(&pending, start + Duration::from_secs(30))
            .is_empty()
    );
    assert!(sut.tick(start + Duration::from_secs(59)).is_empty());
    let events = sut.tick(start + Duration::from_secs(61));
    assert_eq!(
        summary(&events, "pod job-node-1 could not be scheduled for 60 s"),
        [
            (ExecutorId::Daemon(1), Exit::Killed, true),
            (worker(2), Exit::Killed, true),
            (worker(3), Exit::Killed, true),
        ]
    );
    assert!(
        sut.tick(start + Duration::from_secs(90)).is_empty(),
        "told once"
    );
    // Seen by the watch rather than the clock, the scheduler's own words are named.
    let mut sut = PodWatch::new(LIMIT);
    sut.observe(&pending, start);
    let events = sut.observe(&pending, start + LIMIT);
    assert_eq!(summary(&events, "8 Insufficient nvidia.com/gpu.").len(), 3);
    assert!(
        summary(&events, "8 Insufficient nvidia.com/gpu.")
            .iter()
            .all(|(_, _, named)| *named)
    );
}

#[test]
fn each_failed_image_pull_counts_once_and_names_the_image() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    let statuses = |reason: &str| {
        vec![
            running(DAEMON_CONTAINER, 0),
            waiting("worker-2", reason),
            running("worker-3", 0),
        ]
    };
    let events = sut.observe(
        &pod("a", "Pending", &statuses("ErrImagePull"), json!({})),
        now,
    );
    assert_eq!(
        summary(
            &events,
            "ErrImagePull: manifest unknown (container worker-2 of pod job-node-1, image registry.example/train:typo)"
        ),
        [(worker(2), Exit::Killed, true)]
    );
    for (reason, told) in [
        ("ErrImagePull", 0),
        ("ImagePullBackOff", 0),
        ("ImagePullBackOff", 0),
        ("ErrImagePull", 1),
    ] {
        let events = sut.observe(&pod("a", "Pending", &statuses(reason), json!({})), now);
        assert_eq!(events.len(), told, "{reason}");
    }
}

#[test]
fn a_pod_missing_from_a_new_listing_was_deleted_unseen() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    sut.observe(&pod("a", "Running", &all_running(0), json!({})), now);
    assert!(sut.relisted(&BTreeSet::from(["a".to_owned()])).is_empty());
    assert!(sut.knows(1));
    let events = sut.relisted(&BTreeSet::new());
    assert_eq!(
        summary(&events, "pod job-node-1 is gone"),
        [
            (ExecutorId::Daemon(1), Exit::Killed, true),
            (worker(2), Exit::Killed, true),
            (worker(3), Exit::Killed, true),
        ]
    );
    assert!(!sut.knows(1));
}

#[test]
fn a_node_whose_pod_is_created_again_forgets_the_old_one() {
    let now = Instant::now();
    let mut sut = PodWatch::new(LIMIT);
    let extra = json!({ "reason": "Evicted" });
    let old = pod("a", "Failed", &all_running(0), extra);
    assert_eq!(sut.observe(&old, now).len(), 3);
    assert!(sut.knows(1) && !sut.serves(1));
    sut.forget_node(1);
    assert!(!sut.knows(1) && !sut.tracks("a"));
    assert!(
        sut.observe(&old, now).is_empty(),
        "its later states tell nothing"
    );
    assert!(!sut.knows(1), "nor bring it back");
    assert!(sut.deleted(&old).is_empty(), "nor its deletion");
    assert!(
        sut.observe(&pod("b", "Running", &all_running(0), json!({})), now)
            .is_empty()
    );
    assert!(sut.serves(1));
}
