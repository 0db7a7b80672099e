//! The Kubernetes launcher as far as it goes without an API server, which cannot run here:
//! `sluice manifests` prints objects that pass strict validation against the schema of a pinned
//! Kubernetes release (the `kubernetes-validate` package, release 1.37) and say what the job asks
//! for (the AM's Job, its access and Service, and node pods with the daemon as a native sidecar, a
//! container per trainer rank of the node, and a shared memory-backed `/dev/shm`); an AM that
//! cannot reach a cluster, and `sluice submit`, say what to do. The watch's handling of pod states
//! is tested on recorded sequences in the `sluice-kube` crate.

mod common;

use std::path::Path;
use std::process::Command;

use common::sluice;
use serde_json::Value;

/// The pinned release the objects are checked against.
const KUBERNETES_RELEASE: &str = "1.37.0";

const JOB: &str = r#"
name: train
data:
  sources: [{ uri: "s3://bucket/train", format: parquet }]
nodes: 2
roles:
  - { name: worker, num: 3, command: [python, train.py, --rank, "{rank}"], resources: { cpu: 2, memory: 8Gi, gpu: 1 } }
  - { name: eval, num: 1, command: [sluice, consume], image: "ghcr.io/acme/eval:2" }
launcher:
  kind: kubernetes
  image: ghcr.io/acme/train:1.4
  namespace: ml
  node_selector: { gpu: a100 }
  tolerations: [{ key: gpu, operator: Exists, effect: NoSchedule }]
  image_pull_secrets: [regcred]
checkpoint: { uri: "s3://bucket/ckpt" }
"#;

/// The objects `sluice manifests` prints for `spec`: those to apply, and the node pods (printed
/// as comments), each as YAML text.
fn manifests(spec: &Path) -> (String, String) {
    let output = sluice()
        .args(["manifests", "--ring-size", "67108864"])
        .arg(spec)
        .output()
        .expect("run sluice manifests");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (apply, pods) = stdout
        .split_once("# The node pods below")
        .expect("the node pods come apart");
    let pods: Vec<&str> = pods
        .lines()
        .skip(2)
        .map(|line| {
            line.strip_prefix("# ")
                .unwrap_or_else(|| panic!("not a comment: {line}"))
        })
        .collect();
    (apply.to_owned(), pods.join("\n") + "\n")
}

fn documents(text: &str) -> Vec<Value> {
    text.split("---\n")
        .filter(|document| !document.trim().is_empty())
        .map(|document| serde_norway::from_str(document).expect("a YAML document"))
        .collect()
}

/// Runs `kubernetes-validate --strict` for the pinned release over `text` (written into
/// `directory`): whether it passed, and its report.
fn validate(directory: &Path, text: &str) -> (bool, String) {
    sluice_testkit::require_program(
        "kubernetes-validate",
        "pip install kubernetes-validate (scripts/test.sh installs it)",
    );
    let file = directory.join("objects.yaml");
    std::fs::write(&file, text).expect("write");
    let output = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", KUBERNETES_RELEASE])
        .arg(&file)
        .output()
        .expect("run kubernetes-validate");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), report)
}

#[test]
fn every_object_passes_the_schema_of_the_pinned_release() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = common::write_spec(directory.path(), JOB);
    let (apply, pods) = manifests(&spec);
    let (passed, report) = validate(directory.path(), &format!("{apply}{pods}"));
    assert!(passed, "{report}");
    for resource in [
        "configmap/train-spec",
        "serviceaccount/train-am",
        "role/train-am",
        "rolebinding/train-am",
        "service/train-am",
        "job/train-am",
        "pod/train-node-0",
        "pod/train-node-1",
    ] {
        assert!(
            report.contains(&format!(
                "passed for resource {resource} against version 1.37"
            )),
            "{resource} validated: {report}"
        );
    }
}

#[test]
fn the_example_job_passes_the_schema_too() {
    let directory = tempfile::tempdir().expect("tempdir");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kubernetes.yaml");
    let (apply, pods) = manifests(&example);
    let (passed, report) = validate(directory.path(), &format!("{apply}{pods}"));
    assert!(passed, "{report}");
    assert_eq!(report.matches("passed for resource").count(), 8, "{report}");
}

#[test]
fn a_field_the_schema_does_not_have_fails_the_validation() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = common::write_spec(directory.path(), JOB);
    let (_, pods) = manifests(&spec);
    let broken = pods.replacen(
        "  shareProcessNamespace: true",
        "  shareProcessNamespaces: true",
        1,
    );
    assert_ne!(broken, pods);
    let (passed, report) = validate(directory.path(), &broken);
    assert!(!passed, "the check can fail");
    assert!(
        report.contains("'shareProcessNamespaces' was unexpected"),
        "the field is named: {report}"
    );
}

#[test]
fn node_pods_run_the_daemon_as_a_sidecar_beside_their_ranks_on_a_shared_memory_dev_shm() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = common::write_spec(directory.path(), JOB);
    let (apply, pods) = manifests(&spec);
    let kinds: Vec<String> = documents(&apply)
        .iter()
        .map(|object| object["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Service",
            "Job"
        ]
    );
    let am = &documents(&apply)[5];
    let command = am["spec"]["template"]["spec"]["containers"][0]["command"].clone();
    assert_eq!(command[0], "sluice");
    assert!(
        command
            .as_array()
            .expect("a list")
            .windows(2)
            .any(|pair| pair[0] == "--launcher" && pair[1] == "kubernetes"),
        "{command}"
    );
    let pods = documents(&pods);
    assert_eq!(pods.len(), 2, "a pod per node");
    let containers = |pod: &Value| -> Vec<String> {
        pod["spec"]["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .map(|container| container["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    // Four ranks over two nodes: ranks 0 and 1 on node 0, ranks 2 and 3 on node 1.
    assert_eq!(containers(&pods[0]), ["worker-0", "worker-1"]);
    assert_eq!(containers(&pods[1]), ["worker-2", "eval-3"]);
    for (node, pod) in pods.iter().enumerate() {
        let spec = &pod["spec"];
        assert_eq!(spec["shareProcessNamespace"], true);
        assert_eq!(spec["restartPolicy"], "OnFailure");
        let daemon = &spec["initContainers"][0];
        assert_eq!(daemon["name"], "sluice-daemon");
        assert_eq!(daemon["restartPolicy"], "Always", "a native sidecar");
        let daemon_command: Vec<&str> = daemon["command"]
            .as_array()
            .expect("command")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            daemon_command,
            [
                "sluice",
                "daemon",
                "--am",
                "train-am.ml.svc:7070",
                "--node-id",
                &node.to_string(),
                "--ring-dir",
                "/dev/shm/sluice",
                "--ring-size",
                "67108864",
                "--job",
                "train"
            ]
        );
        let volume = &spec["volumes"][0];
        assert_eq!(volume["emptyDir"]["medium"], "Memory");
        // Two 64 MiB rings and 64 MiB of room for ledgers and schemas.
        assert_eq!(volume["emptyDir"]["sizeLimit"], (192u64 << 20).to_string());
        assert_eq!(
            daemon["resources"]["requests"]["memory"],
            ((192u64 + 512) << 20).to_string(),
            "the daemon, whose rings the memory-backed /dev/shm charges, asks for them"
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "Job");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["name"], "train-am");
        assert_eq!(spec["nodeSelector"]["gpu"], "a100");
        assert_eq!(spec["tolerations"][0]["operator"], "Exists");
        assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred");
        for container in spec["containers"].as_array().expect("containers") {
            let token = container["env"]
                .as_array()
                .expect("env")
                .iter()
                .find(|entry| entry["name"] == "SLUICE_TOKEN")
                .expect("the token");
            assert_eq!(token["valueFrom"]["secretKeyRef"]["name"], "train-token");
        }
    }
    let eval = &pods[1]["spec"]["containers"][1];
    assert_eq!(eval["image"], "ghcr.io/acme/eval:2", "a role's own image");
    let worker = &pods[1]["spec"]["containers"][0];
    assert_eq!(worker["image"], "ghcr.io/acme/train:1.4");
    assert_eq!(worker["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(worker["resources"]["requests"]["cpu"], "2000m");
}

#[test]
fn a_job_not_on_kubernetes_is_told_how_to_get_there() {
    let directory = tempfile::tempdir().expect("tempdir");
    let text = JOB
        .split("launcher:")
        .next()
        .expect("the spec before its launcher")
        .replace(", image: \"ghcr.io/acme/eval:2\"", "");
    let spec = common::write_spec(directory.path(), &text);
    let output = sluice().arg("manifests").arg(&spec).output().expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("does not run on Kubernetes") && stderr.contains("kind: kubernetes"),
        "{stderr}"
    );
}

#[test]
fn an_am_out_of_a_cluster_says_where_the_kubernetes_launcher_runs() {
    let directory = tempfile::tempdir().expect("tempdir");
    let spec = common::write_spec(directory.path(), JOB);
    let output = sluice()
        .args(["run", "--state-dir"])
        .arg(directory.path().join("state"))
        .arg(&spec)
        .env("KUBECONFIG", directory.path().join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("run sluice run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("cannot reach the Kubernetes API")
            && stderr.contains("sluice manifests JOB.yaml"),
        "{stderr}"
    );
    let output = sluice()
        .args(["submit"])
        .arg(&spec)
        .output()
        .expect("run sluice submit");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("| kubectl apply -f -"), "{stderr}");
}

#[test]
fn a_volcano_gang_puts_every_node_pod_in_one_pod_group() {
    let directory = tempfile::tempdir().expect("tempdir");
    let text = JOB.replace(
        "  namespace: ml\n",
        "  namespace: ml\n  gang: volcano\n  queue: research\n",
    );
    let spec = common::write_spec(directory.path(), &text);
    let (apply, pods) = manifests(&spec);
    let objects = documents(&apply);
    let group = objects
        .iter()
        .find(|object| object["kind"] == "PodGroup")
        .expect("a PodGroup");
    assert_eq!(group["apiVersion"], "scheduling.volcano.sh/v1beta1");
    assert_eq!(group["metadata"]["name"], "train-nodes");
    assert_eq!(group["spec"]["minMember"], 2, "every node pod or none");
    assert_eq!(group["spec"]["queue"], "research");
    for pod in documents(&pods) {
        assert_eq!(pod["spec"]["schedulerName"], "volcano");
        assert_eq!(
            pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
            "train-nodes"
        );
    }
    // The PodGroup is Volcano's custom resource, outside Kubernetes' schema: the rest is checked.
    let core: String = apply
        .split("---\n")
        .filter(|document| !document.trim().is_empty() && !document.contains("kind: PodGroup"))
        .map(|document| format!("---\n{document}"))
        .collect();
    let (passed, report) = validate(directory.path(), &format!("{core}{pods}"));
    assert!(passed, "{report}");
    assert_eq!(report.matches("passed for resource").count(), 8, "{report}");
}
