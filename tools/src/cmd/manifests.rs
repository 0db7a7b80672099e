//! `sluice manifests`: the Kubernetes objects of a job, for review or for GitOps.

use std::path::PathBuf;

use anyhow::Context;
use sluice_am::launcher::ExecutorId;
use sluice_am::master::Placement;
use sluice_am::service::ExecutorSetup;
use sluice_am::spec::JobSpec;
use sluice_kube::manifests::{self, Names, Owner, RING_DIR, Trainer};
use sluice_proto::NodeId;

/// Arguments of `sluice manifests`.
#[derive(Debug, clap::Args)]
pub struct ManifestsArgs {
    /// The job spec (YAML, TOML or JSON), with `launcher: { kind: kubernetes, image: ... }`.
    pub job: PathBuf,
    /// The size of each trainer's ring in bytes; each node pod's `/dev/shm` holds its rings.
    #[arg(long, default_value_t = sluice_ring::DEFAULT_CAPACITY)]
    pub ring_size: u64,
}

/// Prints the objects that run the job (apply them with `kubectl apply -f -`), then, as comments
/// apart, the node pods its AM creates.
pub fn run(args: ManifestsArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.job)
        .with_context(|| format!("reading {}", args.job.display()))?;
    let spec = JobSpec::from_path(&args.job)?;
    let kubernetes = spec.kubernetes.clone().with_context(|| {
        format!(
            "job {}: its spec does not run on Kubernetes; set `launcher: {{ kind: kubernetes, image: IMAGE }}`",
            spec.name
        )
    })?;
    let am = manifests::am_objects(&spec, &kubernetes, &text, args.ring_size);
    let mut out = manifests::to_yaml(&[am.config_map])?;
    out.push_str(&manifests::to_yaml(&[am.service_account])?);
    out.push_str(&manifests::to_yaml(&[am.role])?);
    out.push_str(&manifests::to_yaml(&[am.role_binding])?);
    out.push_str(&manifests::to_yaml(&[am.service])?);
    out.push_str(&manifests::to_yaml(&[am.job])?);
    if let Some(group) = manifests::pod_group(&spec, &kubernetes) {
        out.push_str(&manifests::to_yaml(&[group])?);
    }
    print!("{out}");
    let pods = node_pods(&spec, args.ring_size)?;
    println!(
        "# The node pods below are created by the AM when the job runs, owned by its Job (whose uid\n# is known only then): shown for review, not to apply."
    );
    for line in manifests::to_yaml(&pods)?.lines() {
        println!("# {line}");
    }
    Ok(())
}

/// The node pods the AM of `spec` creates, as it creates them.
pub fn node_pods(
    spec: &JobSpec,
    ring_size: u64,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let kubernetes = spec
        .kubernetes
        .as_ref()
        .context("the spec does not run on Kubernetes")?;
    let names = Names::of(&spec.name);
    let setup = ExecutorSetup {
        sluice: "sluice".into(),
        ring_dir: RING_DIR.into(),
        shared_group: None,
        ring_size,
        am_address: names.am_address(&kubernetes.namespace),
        token: None,
        tls_ca: None,
    };
    let placement = Placement::of(spec);
    let trainers = placement.trainer_ids(&spec.roles);
    let owner = Owner {
        name: names.am(),
        uid: "the-uid-of-the-am-job".to_owned(),
    };
    Ok((0..spec.nodes)
        .map(|node| {
            let daemon = setup.spec_for(spec, &placement, &ExecutorId::Daemon(node));
            let fed = placement.ranks_of(NodeId(u64::from(node)));
            let trainers: Vec<Trainer> = trainers
                .iter()
                .filter_map(|id| match id {
                    ExecutorId::Trainer { role, rank } if fed.contains(rank) => Some(Trainer {
                        role: role.clone(),
                        launch: setup.spec_for(spec, &placement, id),
                    }),
                    _ => None,
                })
                .collect();
            manifests::node_pod(
                spec, kubernetes, node, &owner, &daemon, &trainers, ring_size,
            )
        })
        .collect())
}
