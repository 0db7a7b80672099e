//! The Kubernetes objects of a job: what `sluice manifests` prints and what the AM creates.
//!
//! A job is, in its namespace:
//! - a ConfigMap `<job>-spec` holding the job spec, mounted into the AM;
//! - a ServiceAccount `<job>-am` with a Role and RoleBinding of the same name that let the AM
//!   create, watch and delete pods and keep the job's token in a Secret;
//! - a Service `<job>-am` in front of the AM's API (gRPC and JSON on [`AM_PORT`], the status page
//!   on [`HTTP_PORT`]);
//! - a batch Job `<job>-am` running the AM (`sluice run --launcher kubernetes`);
//! - per node `n`, a pod `<job>-node-<n>` that the AM creates, owned by the AM's Job so that
//!   deleting the AM deletes it, while an AM pod that the Job starts again (and that takes the job
//!   over from its journal) keeps it: the node daemon as a native sidecar (an init container with
//!   `restartPolicy: Always`), a container per trainer rank the node feeds, and `/dev/shm` a
//!   memory-backed emptyDir shared by all of them, sized for the rings. The pod shares one process
//!   namespace, so that the ring's liveness checks (process identities) see every process.
//!
//! Objects are written as JSON and read back into the `k8s-openapi` types, so that a field of the
//! wrong shape fails here, in the tests, rather than at the API server.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde_json::{Value, json};
use sluice_am::launcher::LaunchSpec;
use sluice_am::spec::{Gang, JobSpec, KubernetesSpec, RestartPolicy};

/// The port of the AM's gRPC API and JSON calls.
pub const AM_PORT: u16 = 7070;

/// The port of the AM's status page and `/metrics`.
pub const HTTP_PORT: u16 = 7071;

/// Where the AM's container finds the job spec.
pub const SPEC_PATH: &str = "/etc/sluice/job.yaml";

/// The ring directory inside node pods: the pod's own `/dev/shm`.
pub const RING_DIR: &str = "/dev/shm/sluice";

/// The key of the job's token in its Secret.
pub const TOKEN_KEY: &str = "token";

/// The label every object of a job carries, with the job's name.
pub const JOB_LABEL: &str = "sluice.dev/job";

/// The label saying what an object is to its job: `am` or `node`.
pub const COMPONENT_LABEL: &str = "sluice.dev/component";

/// The label of a node pod with its node's number.
pub const NODE_LABEL: &str = "sluice.dev/node";

/// The annotation that puts a pod in a Volcano PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";

/// The name of the daemon's container in a node pod.
pub const DAEMON_CONTAINER: &str = "sluice-daemon";

/// Room in `/dev/shm` beyond the rings themselves: ledgers, schemas and announcements.
const SHM_SLACK_BYTES: u64 = 64 << 20;

/// The memory the node daemon asks for besides the rings: its decode and read buffers.
pub const DAEMON_MEMORY_BYTES: u64 = 512 << 20;

/// The names of a job's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    job: String,
}

impl Names {
    /// The names of the objects of job `job`.
    pub fn of(job: &str) -> Names {
        Names {
            job: job.to_owned(),
        }
    }

    /// The AM's batch Job, ServiceAccount, Role, RoleBinding and Service.
    pub fn am(&self) -> String {
        format!("{}-am", self.job)
    }

    /// The ConfigMap holding the job spec.
    pub fn spec(&self) -> String {
        format!("{}-spec", self.job)
    }

    /// The Secret holding the job's token.
    pub fn token(&self) -> String {
        format!("{}-token", self.job)
    }

    /// The Volcano PodGroup of the node pods.
    pub fn pod_group(&self) -> String {
        format!("{}-nodes", self.job)
    }

    /// The pod of node `node`.
    pub fn node_pod(&self, node: u32) -> String {
        format!("{}-node-{node}", self.job)
    }

    /// The container of a trainer.
    pub fn trainer_container(role: &str, rank: u32) -> String {
        format!("{role}-{rank}")
    }

    /// The AM's address inside the cluster, through its Service.
    pub fn am_address(&self, namespace: &str) -> String {
        format!("{}.{namespace}.svc:{AM_PORT}", self.am())
    }
}

/// The AM's Job, which owns the node pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// A node pod's trainer: its container's name and image, and what the AM launches it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trainer {
    /// The role it belongs to.
    pub role: String,
    /// Its launch: rank, command and environment.
    pub launch: LaunchSpec,
}

fn labels(job: &str, component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "sluice",
        "app.kubernetes.io/managed-by": "sluice",
        JOB_LABEL: job,
        COMPONENT_LABEL: component,
    })
}

fn metadata(name: &str, namespace: &str, job: &str, component: &str) -> Value {
    json!({ "name": name, "namespace": namespace, "labels": labels(job, component) })
}

/// Reads `value` into a `k8s-openapi` type; a shape it does not have is a bug of this module.
fn typed<T: serde::de::DeserializeOwned>(value: Value) -> T {
    match serde_json::from_value(value) {
        Ok(typed) => typed,
        Err(error) => panic!("a Kubernetes object of the wrong shape: {error}"),
    }
}

/// A command word as Kubernetes passes it: `$(NAME)` is its variable reference, so a literal one
/// is written `$$(NAME)`.
fn literal(word: &str) -> String {
    word.replace("$(", "$$(")
}

/// The environment of a container: `env` as given, but the token, which comes from the job's
/// Secret.
fn container_env(env: &BTreeMap<String, String>, names: &Names) -> Value {
    let mut entries: Vec<Value> = env
        .iter()
        .filter(|(name, _)| name.as_str() != "SLUICE_TOKEN")
        .map(|(name, value)| json!({ "name": name, "value": value }))
        .collect();
    entries.push(json!({
        "name": "SLUICE_TOKEN",
        "valueFrom": { "secretKeyRef": { "name": names.token(), "key": TOKEN_KEY } },
    }));
    Value::Array(entries)
}

/// The `resources` of a trainer's container.
fn trainer_resources(spec: &JobSpec, role: &str) -> Value {
    let Some(resources) = spec
        .roles
        .iter()
        .find(|candidate| candidate.name == role)
        .map(|found| found.resources)
    else {
        return json!({});
    };
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    if let Some(cpu) = resources.cpu {
        requests.insert(
            "cpu".to_owned(),
            json!(format!("{}m", (cpu * 1000.0).ceil() as u64)),
        );
    }
    if let Some(memory) = resources.memory_bytes {
        requests.insert("memory".to_owned(), json!(memory.to_string()));
        limits.insert("memory".to_owned(), json!(memory.to_string()));
    }
    if resources.gpu > 0 {
        limits.insert(
            "nvidia.com/gpu".to_owned(),
            json!(resources.gpu.to_string()),
        );
    }
    json!({ "requests": requests, "limits": limits })
}

/// The pod's restart policy for the spec's: the kubelet restarts the pod's containers, and the
/// AM counts each restart against the failure budget.
fn restart_policy(restart: RestartPolicy) -> &'static str {
    match restart {
        RestartPolicy::OnFailure => "OnFailure",
        RestartPolicy::Never => "Never",
        RestartPolicy::Always => "Always",
    }
}

/// The pod of node `node`, owned by the AM's Job `owner`: the daemon `daemon` as a native
/// sidecar, and `trainers`, each with its role's image and resources, sharing a `/dev/shm` sized
/// for their rings of `ring_size` bytes.
pub fn node_pod(
    spec: &JobSpec,
    kubernetes: &KubernetesSpec,
    node: u32,
    owner: &Owner,
    daemon: &LaunchSpec,
    trainers: &[Trainer],
    ring_size: u64,
) -> Pod {
    let names = Names::of(&spec.name);
    let shm_bytes = ring_size
        .saturating_mul(trainers.len() as u64)
        .saturating_add(SHM_SLACK_BYTES);
    let shm_mount = json!([{ "name": "dshm", "mountPath": "/dev/shm" }]);
    let containers: Vec<Value> = trainers
        .iter()
        .map(|trainer| {
            let rank = match &trainer.launch.id {
                sluice_am::launcher::ExecutorId::Trainer { rank, .. } => *rank,
                sluice_am::launcher::ExecutorId::Daemon(_) => 0,
            };
            let image = spec
                .roles
                .iter()
                .find(|role| role.name == trainer.role)
                .and_then(|role| role.image.clone())
                .unwrap_or_else(|| kubernetes.image.clone());
            json!({
                "name": Names::trainer_container(&trainer.role, rank),
                "image": image,
                "command": trainer.launch.command.iter().map(|word| literal(word)).collect::<Vec<_>>(),
                "env": container_env(&trainer.launch.env, &names),
                "resources": trainer_resources(spec, &trainer.role),
                "volumeMounts": shm_mount,
            })
        })
        .collect();
    let mut metadata = metadata(
        &names.node_pod(node),
        &kubernetes.namespace,
        &spec.name,
        "node",
    );
    metadata["labels"][NODE_LABEL] = json!(node.to_string());
    metadata["ownerReferences"] = owner_references(owner);
    let mut pod_spec = json!({
        "restartPolicy": restart_policy(spec.failover.restart),
        "shareProcessNamespace": true,
        "initContainers": [{
            "name": DAEMON_CONTAINER,
            "image": kubernetes.image,
            "restartPolicy": "Always",
            "command": daemon.command.iter().map(|word| literal(word)).collect::<Vec<_>>(),
            "env": container_env(&daemon.env, &names),
            // The daemon creates the rings, so the memory-backed `/dev/shm` is charged to it.
            "resources": {
                "requests": { "memory": (shm_bytes + DAEMON_MEMORY_BYTES).to_string() },
            },
            "volumeMounts": shm_mount,
        }],
        "containers": containers,
        "volumes": [{
            "name": "dshm",
            "emptyDir": { "medium": "Memory", "sizeLimit": shm_bytes.to_string() },
        }],
    });
    add_placement(&mut pod_spec, kubernetes);
    if let Gang::Volcano { .. } = kubernetes.gang {
        pod_spec["schedulerName"] = json!("volcano");
        metadata["annotations"] = json!({ VOLCANO_GROUP_ANNOTATION: names.pod_group() });
    }
    typed(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": pod_spec,
    }))
}

/// The spec's node selector, tolerations and image pull secrets, on a pod spec.
fn add_placement(pod_spec: &mut Value, kubernetes: &KubernetesSpec) {
    if !kubernetes.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(kubernetes.node_selector);
    }
    if !kubernetes.tolerations.is_empty() {
        pod_spec["tolerations"] = Value::Array(
            kubernetes
                .tolerations
                .iter()
                .map(|toleration| {
                    let mut entry = json!({ "operator": toleration.operator });
                    if let Some(key) = &toleration.key {
                        entry["key"] = json!(key);
                    }
                    if let Some(value) = &toleration.value {
                        entry["value"] = json!(value);
                    }
                    if let Some(effect) = &toleration.effect {
                        entry["effect"] = json!(effect);
                    }
                    entry
                })
                .collect(),
        );
    }
    add_pull_secrets(pod_spec, kubernetes);
}

/// The spec's image pull secrets, on a pod spec.
fn add_pull_secrets(pod_spec: &mut Value, kubernetes: &KubernetesSpec) {
    if !kubernetes.image_pull_secrets.is_empty() {
        pod_spec["imagePullSecrets"] = Value::Array(
            kubernetes
                .image_pull_secrets
                .iter()
                .map(|name| json!({ "name": name }))
                .collect(),
        );
    }
}

/// The Secret holding the job's token, owned by the AM's Job: the AM makes it when it first
/// runs, and node pods read the token from it.
pub fn token_secret(
    spec: &JobSpec,
    kubernetes: &KubernetesSpec,
    owner: &Owner,
    token: &str,
) -> Secret {
    let names = Names::of(&spec.name);
    let mut metadata = metadata(&names.token(), &kubernetes.namespace, &spec.name, "am");
    metadata["ownerReferences"] = owner_references(owner);
    typed(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": { TOKEN_KEY: token },
    }))
}

/// References to the AM's Job as an owner that is not the controller: the Job controller counts
/// only the AM's own pods.
fn owner_references(owner: &Owner) -> Value {
    json!([{
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": owner.name,
        "uid": owner.uid,
        "controller": false,
        "blockOwnerDeletion": true,
    }])
}

/// The objects that run the AM of job `spec`, whose spec file reads `spec_text`: in the order
/// `kubectl apply` needs them.
#[derive(Debug, Clone)]
pub struct AmObjects {
    /// The job spec.
    pub config_map: ConfigMap,
    /// The AM's identity.
    pub service_account: ServiceAccount,
    /// What the AM may do: pods, the token's Secret, and reading its own Job.
    pub role: Role,
    /// The Role, given to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// The AM's API inside the cluster.
    pub service: Service,
    /// The AM itself.
    pub job: Job,
}

/// The objects that run the AM of job `spec` (its spec file's text `spec_text`) with rings of
/// `ring_size` bytes.
pub fn am_objects(
    spec: &JobSpec,
    kubernetes: &KubernetesSpec,
    spec_text: &str,
    ring_size: u64,
) -> AmObjects {
    let names = Names::of(&spec.name);
    let namespace = &kubernetes.namespace;
    let meta = |name: String| metadata(&name, namespace, &spec.name, "am");
    let config_map = typed(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names.spec()),
        "data": { "job.yaml": spec_text },
    }));
    let service_account = typed(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(names.am()),
    }));
    let role = typed(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(names.am()),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "create", "delete"],
            },
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get", "create"],
            },
            {
                "apiGroups": ["batch"],
                "resources": ["jobs"],
                "verbs": ["get"],
            },
        ],
    }));
    let role_binding = typed(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(names.am()),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": names.am(),
        },
        "subjects": [{ "kind": "ServiceAccount", "name": names.am(), "namespace": namespace }],
    }));
    let selector = json!({ JOB_LABEL: spec.name, COMPONENT_LABEL: "am" });
    let service = typed(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(names.am()),
        "spec": {
            "selector": selector,
            "ports": [
                { "name": "grpc", "port": AM_PORT, "targetPort": AM_PORT },
                { "name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT },
            ],
        },
    }));
    // Without a checkpoint location an AM started again would begin the job anew, delivering
    // rows twice: only a job that can be taken over is retried.
    let backoff_limit = if spec.checkpoint.is_some() {
        spec.failover.max_failures
    } else {
        0
    };
    let field = |path: &str| json!({ "fieldRef": { "fieldPath": path } });
    let mut pod_spec = json!({
        "serviceAccountName": names.am(),
        "restartPolicy": "Never",
        "containers": [{
            "name": "am",
            "image": kubernetes.image,
            "command": [
                "sluice", "run", SPEC_PATH,
                "--launcher", "kubernetes",
                "--listen", format!("0.0.0.0:{AM_PORT}"),
                "--http", format!("0.0.0.0:{HTTP_PORT}"),
                "--advertise", names.am_address(namespace),
                "--ring-size", ring_size.to_string(),
                "--state-dir", "/var/lib/sluice",
                "--insecure",
            ],
            "env": [
                { "name": "POD_NAME", "valueFrom": field("metadata.name") },
                { "name": "POD_UID", "valueFrom": field("metadata.uid") },
                { "name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace") },
            ],
            "ports": [
                { "name": "grpc", "containerPort": AM_PORT },
                { "name": "http", "containerPort": HTTP_PORT },
            ],
            "volumeMounts": [
                { "name": "spec", "mountPath": "/etc/sluice", "readOnly": true },
                { "name": "state", "mountPath": "/var/lib/sluice" },
            ],
        }],
        "volumes": [
            { "name": "spec", "configMap": { "name": names.spec() } },
            { "name": "state", "emptyDir": {} },
        ],
    });
    add_pull_secrets(&mut pod_spec, kubernetes);
    let job = typed(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(names.am()),
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": { "labels": labels(&spec.name, "am") },
                "spec": pod_spec,
            },
        },
    }));
    AmObjects {
        config_map,
        service_account,
        role,
        role_binding,
        service,
        job,
    }
}

/// Under `gang: volcano`, the PodGroup of the job's node pods: Volcano starts them all at once
/// or none, in the spec's queue. A custom resource of Volcano (`scheduling.volcano.sh/v1beta1`),
/// so written as plain JSON.
pub fn pod_group(spec: &JobSpec, kubernetes: &KubernetesSpec) -> Option<Value> {
    let Gang::Volcano { queue } = &kubernetes.gang else {
        return None;
    };
    let names = Names::of(&spec.name);
    Some(json!({
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata(&names.pod_group(), &kubernetes.namespace, &spec.name, "node"),
        "spec": { "minMember": spec.nodes, "queue": queue },
    }))
}

/// `objects` as one YAML stream, each document after a `---` line.
pub fn to_yaml<T: serde::Serialize>(objects: &[T]) -> Result<String, serde_norway::Error> {
    let mut text = String::new();
    for object in objects {
        text.push_str("---\n");
        text.push_str(&serde_norway::to_string(object)?);
    }
    Ok(text)
}
