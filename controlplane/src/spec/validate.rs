//! The rules of the job spec, applied once to the raw structs to build a [`JobSpec`].

use super::error::suggest;
use super::raw::{
    RawCache, RawCheckpoint, RawDaemon, RawData, RawFailover, RawFollow, RawHang, RawJobSpec,
    RawLauncher, RawResources, RawRole, RawSource, RawToleration, RawTransform, ScalarString,
};
use super::{
    BadDataPolicy, BadDataSpec, CacheSpec, CheckpointSpec, DaemonSpec, DataSpec, EvenBatches,
    FailoverSpec, FollowSpec, Gang, HangAction, HangSpec, JobSpec, KubernetesSpec, LauncherKind,
    MAX_NODES, MAX_TRAINERS, OnExhausted, Resources, RestartPolicy, RoleSpec, ShuffleSpec,
    SlurmSpec, SourceFormat, SourceMix, SourceSpec, SpecError, Toleration, TransformSpec,
};
use std::collections::{BTreeMap, BTreeSet};

/// Object-store schemes a source or checkpoint uri may use.
const URI_SCHEMES: &[&str] = &[
    "file", "s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https", "memory",
];

/// Environment variables the AM sets for its trainers.
const RESERVED_ENV: &[&str] = &[
    "SLUICE_RING",
    "SLUICE_RANK",
    "SLUICE_WORLD_SIZE",
    "SLUICE_AM",
    "SLUICE_RESTORED_TO",
];

/// The most attempts a task may be given; a larger number hides a broken task.
const MAX_TASK_ATTEMPTS: u32 = 1000;
/// The longest wait before a relaunch: an hour.
const MAX_RESTART_BACKOFF_MS: u64 = 3_600_000;

/// The shortest poll interval of a followed source: polling lists the source each time.
const MIN_FOLLOW_INTERVAL_MS: u64 = 10;

/// The shortest heartbeat interval accepted.
const MIN_HEARTBEAT_INTERVAL_MS: u64 = 10;

pub(crate) fn validate(raw: RawJobSpec) -> Result<JobSpec, SpecError> {
    let name = validate_slug("name", &raw.name, sluice_proto::JOB_NAME_MAX_LEN)?;
    let data = validate_data(raw.data)?;
    let nodes = raw.nodes.unwrap_or(1);
    if nodes == 0 {
        return Err(SpecError::invalid(
            "nodes",
            "is 0",
            "set it to 1 or more: every job needs a node daemon",
        ));
    }
    if nodes > MAX_NODES {
        return Err(SpecError::invalid(
            "nodes",
            format!("is {nodes}, more than the {MAX_NODES} node daemons a job may have"),
            format!("set it to at most {MAX_NODES}, one per machine that runs trainers"),
        ));
    }
    if raw.roles.is_empty() {
        return Err(SpecError::invalid(
            "roles",
            "is an empty list",
            "add at least one role, for example `{ name: worker, num: 1, command: [sluice, consume] }`",
        ));
    }
    let (launcher, slurm, kubernetes) = match raw.launcher {
        None => (LauncherKind::Local, SlurmSpec::default(), None),
        Some(launcher) => validate_launcher(launcher)?,
    };
    let mut roles = Vec::with_capacity(raw.roles.len());
    let mut role_names = BTreeSet::new();
    for (index, raw_role) in raw.roles.into_iter().enumerate() {
        let role = validate_role(index, raw_role, launcher)?;
        if !role_names.insert(role.name.clone()) {
            return Err(SpecError::invalid(
                format!("roles[{index}].name"),
                format!("repeats the role name `{}`", role.name),
                "give every role its own name",
            ));
        }
        roles.push(role);
    }
    if launcher == LauncherKind::Kubernetes {
        check_kubernetes_names(&name, &roles)?;
    }
    let trainers: u64 = roles.iter().map(|role| u64::from(role.num)).sum();
    if trainers > u64::from(MAX_TRAINERS) {
        return Err(SpecError::invalid(
            "roles",
            format!(
                "have {trainers} trainers in all (their `num`), more than the {MAX_TRAINERS} a job may have"
            ),
            format!(
                "lower the roles' `num` to {MAX_TRAINERS} in all, or split the work into several jobs"
            ),
        ));
    }
    let failover = validate_failover(raw.failover, u64::from(nodes) + trainers)?;
    if failover.hang.action == HangAction::Restart && launcher == LauncherKind::External {
        return Err(SpecError::invalid(
            "failover.hang.action",
            "is `restart`, but under `launcher: { kind: external }` the AM launches nothing to restart",
            "use `warn` or `fail`, or have the trainers' launcher restart them",
        ));
    }
    let checkpoint = raw.checkpoint.map(validate_checkpoint).transpose()?;
    Ok(JobSpec {
        name,
        data,
        nodes,
        roles,
        failover,
        launcher,
        slurm,
        kubernetes,
        checkpoint,
        daemon: raw
            .daemon
            .map(validate_daemon)
            .transpose()?
            .unwrap_or_default(),
    })
}

/// The most threads `daemon.max_threads` may give a daemon's reading.
const MAX_DAEMON_THREADS: u32 = 1024;

fn validate_daemon(raw: RawDaemon) -> Result<DaemonSpec, SpecError> {
    if let Some(threads) = raw.max_threads
        && !(1..=MAX_DAEMON_THREADS).contains(&threads)
    {
        return Err(SpecError::invalid(
            "daemon.max_threads",
            format!("is {threads}"),
            format!(
                "give from 1 to {MAX_DAEMON_THREADS} tasks read at once, or leave it out to use the daemon's CPU quota"
            ),
        ));
    }
    if raw.max_read_ahead_bytes == Some(0) {
        return Err(SpecError::invalid(
            "daemon.max_read_ahead_bytes",
            "is 0, which would leave no room for a single batch",
            "give the bytes of decoded batches a daemon may hold ahead of its rings, for example 268435456 (256 MiB)",
        ));
    }
    Ok(DaemonSpec {
        max_threads: raw.max_threads,
        max_read_ahead_bytes: raw.max_read_ahead_bytes,
    })
}

/// The `launcher` section: its kind, and the options only `kind: slurm` or `kind: kubernetes`
/// takes.
fn validate_launcher(
    raw: RawLauncher,
) -> Result<(LauncherKind, SlurmSpec, Option<KubernetesSpec>), SpecError> {
    let kind = match raw.kind.as_str() {
        "local" => LauncherKind::Local,
        "kubernetes" => LauncherKind::Kubernetes,
        "slurm" => LauncherKind::Slurm,
        "external" => LauncherKind::External,
        other => {
            return Err(SpecError::invalid(
                "launcher.kind",
                format!("has unknown value `{other}`"),
                suggest(other, LauncherKind::NAMES),
            ));
        }
    };
    let options = [
        ("partition", raw.partition.is_some(), LauncherKind::Slurm),
        ("time", raw.time.is_some(), LauncherKind::Slurm),
        ("sbatch", raw.sbatch.is_some(), LauncherKind::Slurm),
        ("image", raw.image.is_some(), LauncherKind::Kubernetes),
        (
            "namespace",
            raw.namespace.is_some(),
            LauncherKind::Kubernetes,
        ),
        (
            "node_selector",
            raw.node_selector.is_some(),
            LauncherKind::Kubernetes,
        ),
        (
            "tolerations",
            raw.tolerations.is_some(),
            LauncherKind::Kubernetes,
        ),
        (
            "image_pull_secrets",
            raw.image_pull_secrets.is_some(),
            LauncherKind::Kubernetes,
        ),
        ("gang", raw.gang.is_some(), LauncherKind::Kubernetes),
        ("queue", raw.queue.is_some(), LauncherKind::Kubernetes),
    ];
    if let Some((key, _, owner)) = options
        .iter()
        .find(|(_, given, owner)| *given && *owner != kind)
    {
        let owner = if *owner == LauncherKind::Slurm {
            "slurm"
        } else {
            "kubernetes"
        };
        return Err(SpecError::invalid(
            format!("launcher.{key}"),
            format!(
                "is an option of the {owner} launcher, but `kind` is `{}`",
                raw.kind
            ),
            format!("remove `{key}`, or set `kind: {owner}`"),
        ));
    }
    if let Some(partition) = &raw.partition
        && (partition.is_empty() || !partition.chars().all(slurm_name_char))
    {
        return Err(SpecError::invalid(
            "launcher.partition",
            format!("is `{partition}`, not a Slurm partition name"),
            "give the name `sinfo` lists, for example `partition: gpu`",
        ));
    }
    if let Some(time) = &raw.time
        && !is_slurm_time(time)
    {
        return Err(SpecError::invalid(
            "launcher.time",
            format!("is `{time}`, not a Slurm time limit"),
            "write it as minutes, `HH:MM:SS` or `D-HH:MM:SS`, for example `time: \"12:00:00\"`",
        ));
    }
    let sbatch = raw.sbatch.unwrap_or_default();
    for (index, option) in sbatch.iter().enumerate() {
        if !option.starts_with('-') || option.chars().any(char::is_control) {
            return Err(SpecError::invalid(
                format!("launcher.sbatch[{index}]"),
                format!("is `{}`, not one sbatch option", option.escape_debug()),
                "give one option per entry as sbatch takes it, for example `--account=ml`",
            ));
        }
    }
    let slurm = SlurmSpec {
        partition: raw.partition,
        time: raw.time,
        sbatch,
    };
    if kind != LauncherKind::Kubernetes {
        return Ok((kind, slurm, None));
    }
    let image = match raw.image {
        Some(image) => validate_image("launcher.image", image)?,
        None => {
            return Err(SpecError::invalid(
                "launcher.image",
                "is missing",
                "give the container image that has `sluice` on its PATH (and, unless a role names its own `image`, the trainers' code), for example `image: ghcr.io/acme/train:1.4`",
            ));
        }
    };
    let namespace = match raw.namespace {
        Some(namespace) => validate_dns_label("launcher.namespace", namespace)?,
        None => "default".to_owned(),
    };
    let node_selector = string_map("launcher.node_selector", raw.node_selector, |key| {
        if key.is_empty() || key.len() > 253 || key.chars().any(|c| c.is_whitespace()) {
            Err((
                "is not a Kubernetes label key".to_owned(),
                "write it as `prefix/name` or `name`, for example `node.kubernetes.io/instance-type`".to_owned(),
            ))
        } else {
            Ok(())
        }
    })?;
    let tolerations = raw
        .tolerations
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, toleration)| validate_toleration(index, toleration))
        .collect::<Result<Vec<_>, _>>()?;
    let image_pull_secrets = raw
        .image_pull_secrets
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, name)| {
            validate_dns_subdomain(&format!("launcher.image_pull_secrets[{index}]"), name)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gang = match (raw.gang.as_deref(), raw.queue) {
        (None | Some("none"), None) => Gang::None,
        (None | Some("none"), Some(_)) => {
            return Err(SpecError::invalid(
                "launcher.queue",
                "names a Volcano queue, but the node pods are not a gang",
                "set `gang: volcano`, or remove `queue`",
            ));
        }
        (Some("volcano"), queue) => Gang::Volcano {
            queue: match queue {
                Some(queue) => validate_dns_subdomain("launcher.queue", queue)?,
                None => "default".to_owned(),
            },
        },
        (Some(other), _) => {
            return Err(SpecError::invalid(
                "launcher.gang",
                format!("has unknown value `{other}`"),
                suggest(other, &["none", "volcano"]),
            ));
        }
    };
    Ok((
        kind,
        slurm,
        Some(KubernetesSpec {
            image,
            namespace,
            node_selector,
            tolerations,
            image_pull_secrets,
            gang,
        }),
    ))
}

/// The longest job name under the Kubernetes launcher: its objects are named `<job>-node-<n>`,
/// and its Service, a DNS label of at most 63 characters, `<job>-am`.
pub const KUBERNETES_JOB_NAME_MAX_LEN: usize = 50;

/// The longest role name under the Kubernetes launcher: its containers, DNS labels of at most 63
/// characters, are named `<role>-<rank>`.
pub const KUBERNETES_ROLE_NAME_MAX_LEN: usize = 55;

/// Under the Kubernetes launcher the job's name starts object names (DNS labels that start with a
/// letter) and each role's name starts its containers' names (DNS labels).
fn check_kubernetes_names(job: &str, roles: &[RoleSpec]) -> Result<(), SpecError> {
    let label = |value: &str, max_len: usize| {
        value.len() <= max_len
            && value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !value.ends_with('-')
    };
    if !label(job, KUBERNETES_JOB_NAME_MAX_LEN)
        || !job.starts_with(|c: char| c.is_ascii_lowercase())
    {
        return Err(SpecError::invalid(
            "name",
            format!("is `{job}`, which cannot start the names of Kubernetes objects"),
            format!(
                "under `launcher: {{ kind: kubernetes }}` use at most {KUBERNETES_JOB_NAME_MAX_LEN} lowercase letters, digits and `-`, starting with a letter and ending with a letter or digit"
            ),
        ));
    }
    for (index, role) in roles.iter().enumerate() {
        if !label(&role.name, KUBERNETES_ROLE_NAME_MAX_LEN) {
            return Err(SpecError::invalid(
                format!("roles[{index}].name"),
                format!("is `{}`, which cannot start a container's name", role.name),
                format!(
                    "under `launcher: {{ kind: kubernetes }}` use at most {KUBERNETES_ROLE_NAME_MAX_LEN} lowercase letters, digits and `-`, ending with a letter or digit"
                ),
            ));
        }
    }
    Ok(())
}

/// A container image reference: no spaces or control characters.
fn validate_image(path: &str, image: String) -> Result<String, SpecError> {
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SpecError::invalid(
            path,
            format!("is `{}`, not a container image name", image.escape_debug()),
            "write it as `registry/repository:tag`, for example `ghcr.io/acme/train:1.4`",
        ));
    }
    Ok(image)
}

/// A Kubernetes DNS label (RFC 1123): a namespace.
fn validate_dns_label(path: &str, name: String) -> Result<String, SpecError> {
    let valid = (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(name)
    } else {
        Err(SpecError::invalid(
            path,
            format!("is `{}`, not a Kubernetes name", name.escape_debug()),
            "use at most 63 lowercase letters, digits and `-`, starting and ending with a letter or digit",
        ))
    }
}

/// A Kubernetes DNS subdomain (RFC 1123): a secret's name.
fn validate_dns_subdomain(path: &str, name: String) -> Result<String, SpecError> {
    let valid = (1..=253).contains(&name.len())
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(name)
    } else {
        Err(SpecError::invalid(
            path,
            format!("is `{}`, not a Kubernetes name", name.escape_debug()),
            "use lowercase letters, digits, `-` and `.`, as `kubectl get secrets` lists it",
        ))
    }
}

/// One of `launcher.tolerations`.
fn validate_toleration(index: usize, raw: RawToleration) -> Result<Toleration, SpecError> {
    let at = |key: &str| format!("launcher.tolerations[{index}].{key}");
    let operator = raw.operator.unwrap_or_else(|| "Equal".to_owned());
    if !matches!(operator.as_str(), "Equal" | "Exists") {
        return Err(SpecError::invalid(
            at("operator"),
            format!("has unknown value `{operator}`"),
            suggest(&operator, &["Equal", "Exists"]),
        ));
    }
    if let Some(effect) = &raw.effect
        && !matches!(
            effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        )
    {
        return Err(SpecError::invalid(
            at("effect"),
            format!("has unknown value `{effect}`"),
            suggest(effect, &["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        ));
    }
    if operator == "Exists" && raw.value.is_some() {
        return Err(SpecError::invalid(
            at("value"),
            "is given with `operator: Exists`, which matches any value",
            "remove `value`, or use `operator: Equal`",
        ));
    }
    if operator == "Equal" && raw.key.is_none() {
        return Err(SpecError::invalid(
            at("key"),
            "is missing, and `operator: Equal` needs one",
            "name the taint's key, or use `operator: Exists` to tolerate every taint",
        ));
    }
    Ok(Toleration {
        key: raw.key,
        operator,
        value: raw.value,
        effect: raw.effect,
    })
}

/// Whether `c` may appear in a Slurm partition name.
fn slurm_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Whether `time` is one of Slurm's time limit forms: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
/// `D-HH:MM` or `D-HH:MM:SS`, or `UNLIMITED`.
fn is_slurm_time(time: &str) -> bool {
    let number = |part: &str| {
        !part.is_empty() && part.len() <= 9 && part.bytes().all(|b| b.is_ascii_digit())
    };
    if time.eq_ignore_ascii_case("unlimited") || time.eq_ignore_ascii_case("infinite") {
        return true;
    }
    let (days, clock) = match time.split_once('-') {
        Some((days, clock)) => (Some(days), clock),
        None => (None, time),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let fields_fit = match days {
        Some(days) => number(days) && (1..=3).contains(&parts.len()),
        None => (1..=3).contains(&parts.len()),
    };
    fields_fit && parts.iter().all(|part| number(part))
}

/// A lowercase name usable in paths and pod names (see [`sluice_proto::slug_problem`]).
fn validate_slug(path: &str, value: &str, max_len: usize) -> Result<String, SpecError> {
    match sluice_proto::slug_problem(value, max_len) {
        Some((problem, fix)) if value.is_empty() => Err(SpecError::invalid(path, problem, fix)),
        Some((problem, fix)) => Err(SpecError::invalid(
            path,
            format!("`{value}` {problem}"),
            fix,
        )),
        None => Ok(value.to_owned()),
    }
}

fn validate_data(raw: RawData) -> Result<DataSpec, SpecError> {
    if raw.sources.is_empty() {
        return Err(SpecError::invalid(
            "data.sources",
            "is an empty list",
            "add at least one source, for example `{ uri: file:///data/train, format: parquet }`",
        ));
    }
    let sources = raw
        .sources
        .into_iter()
        .enumerate()
        .map(|(index, source)| validate_source(index, source))
        .collect::<Result<Vec<_>, _>>()?;
    validate_mix(&sources)?;
    let batch_size = positive_u32("data.batch_size", raw.batch_size, 1024)?;
    let epochs = positive_u32("data.epochs", raw.epochs, 1)?;
    if epochs > 1
        && let Some(index) = sources.iter().position(|source| source.follow.is_some())
    {
        return Err(SpecError::invalid(
            "data.epochs",
            format!("is {epochs}, but data.sources[{index}] is followed"),
            "set epochs to 1, or stop following: a followed source has no end at which a next epoch could begin",
        ));
    }
    let task_rows = positive_u64("data.task_rows", raw.task_rows, 65_536)?;
    let shuffle = match raw.shuffle {
        None => ShuffleSpec {
            enabled: false,
            seed: 0,
            window: 4,
        },
        Some(shuffle) => ShuffleSpec {
            enabled: true,
            seed: shuffle.seed.unwrap_or(0),
            window: positive_u32("data.shuffle.window", shuffle.window, 4)?,
        },
    };
    let resplit_margin_rows = raw.resplit_margin_rows.unwrap_or(u64::from(batch_size));
    let resplit_min_rows = positive_u64(
        "data.resplit_min_rows",
        raw.resplit_min_rows,
        u64::from(batch_size),
    )?;
    let transforms = raw
        .transforms
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, transform)| validate_transform(index, transform))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DataSpec {
        sources,
        batch_size,
        epochs,
        task_rows,
        shuffle,
        resplit_margin_rows,
        resplit_min_rows,
        transforms,
        fixed_batch_size: raw.fixed_batch_size.unwrap_or(false),
        cache: raw.cache.map(validate_cache).transpose()?,
        bad_data: validate_bad_data(raw.on_bad_data.as_deref(), raw.max_bad_fraction)?,
        even_batches: validate_even_batches(
            raw.even_batches.as_deref(),
            raw.fixed_batch_size.unwrap_or(false),
        )?,
    })
}

fn validate_even_batches(
    even: Option<&str>,
    fixed_batch_size: bool,
) -> Result<EvenBatches, SpecError> {
    let even = match even {
        None | Some("off") => EvenBatches::Off,
        Some("pad") => EvenBatches::Pad,
        Some("drop") => EvenBatches::Drop,
        Some(other) => {
            return Err(SpecError::invalid(
                "data.even_batches",
                format!("has unknown value `{other}`"),
                suggest(other, EvenBatches::NAMES),
            ));
        }
    };
    if even != EvenBatches::Off && !fixed_batch_size {
        return Err(SpecError::invalid(
            "data.even_batches",
            "is set, but data.fixed_batch_size is not: equal batch counts mean equal steps only when batches have one size",
            "set data.fixed_batch_size: true, or leave data.even_batches out",
        ));
    }
    Ok(even)
}

fn validate_bad_data(
    policy: Option<&str>,
    max_fraction: Option<f64>,
) -> Result<BadDataSpec, SpecError> {
    let policy = match policy {
        None | Some("fail") => BadDataPolicy::Fail,
        Some("skip") => BadDataPolicy::Skip,
        Some("warn") => BadDataPolicy::Warn,
        Some(other) => {
            return Err(SpecError::invalid(
                "data.on_bad_data",
                format!("has unknown value `{other}`"),
                suggest(other, BadDataPolicy::NAMES),
            ));
        }
    };
    let max_fraction = match max_fraction {
        None => BadDataSpec::DEFAULT_MAX_FRACTION,
        Some(_) if policy == BadDataPolicy::Fail => {
            return Err(SpecError::invalid(
                "data.max_bad_fraction",
                "is set, but data.on_bad_data is `fail`, which skips nothing",
                "set data.on_bad_data to `skip` or `warn`, or leave max_bad_fraction out",
            ));
        }
        Some(fraction) if fraction.is_finite() && (0.0..=1.0).contains(&fraction) => fraction,
        Some(fraction) => {
            return Err(SpecError::invalid(
                "data.max_bad_fraction",
                format!("is {fraction}"),
                "give a fraction from 0 to 1, for example 0.01 for at most 1% of the rows",
            ));
        }
    };
    Ok(BadDataSpec {
        policy,
        max_fraction,
    })
}

fn validate_cache(raw: RawCache) -> Result<CacheSpec, SpecError> {
    if !raw.dir.starts_with('/') {
        return Err(SpecError::invalid(
            "data.cache.dir",
            format!("is {:?}, not an absolute path", raw.dir),
            "give a directory on the nodes' local disk from the root, for example /var/cache/sluice",
        ));
    }
    if raw.max_bytes == 0 {
        return Err(SpecError::invalid(
            "data.cache.max_bytes",
            "is 0",
            "give the bytes the cache may keep on each node, for example 107374182400 (100 GiB)",
        ));
    }
    Ok(CacheSpec {
        dir: raw.dir,
        max_bytes: raw.max_bytes,
    })
}

fn validate_transform(index: usize, raw: RawTransform) -> Result<TransformSpec, SpecError> {
    let at = format!("data.transforms[{index}]");
    let column = |kind: &str, column: String| {
        if column.trim().is_empty() {
            Err(SpecError::invalid(
                format!("{at}.{kind}.column"),
                "is an empty column name",
                "name the column the step applies to",
            ))
        } else {
            Ok(column)
        }
    };
    match (raw.cast, raw.fill_null, raw.normalize, raw.hash_bucket) {
        (Some(cast), None, None, None) => {
            let column = column("cast", cast.column)?;
            if sluice_formats::types::data_type_by_name(&cast.to).is_none() {
                return Err(SpecError::invalid(
                    format!("{at}.cast.to"),
                    format!("is the unknown type `{}`", cast.to),
                    suggest(&cast.to, sluice_formats::types::DATA_TYPE_NAMES),
                ));
            }
            Ok(TransformSpec::Cast {
                column,
                to: cast.to,
            })
        }
        (None, Some(fill), None, None) => Ok(TransformSpec::FillNull {
            column: column("fill_null", fill.column)?,
            value: fill.value.0,
        }),
        (None, None, Some(normalize), None) => {
            let column = column("normalize", normalize.column)?;
            if !normalize.mean.is_finite() {
                return Err(SpecError::invalid(
                    format!("{at}.normalize.mean"),
                    format!("is {}", normalize.mean),
                    "give a finite number",
                ));
            }
            if !(normalize.std.is_finite() && normalize.std > 0.0) {
                return Err(SpecError::invalid(
                    format!("{at}.normalize.std"),
                    format!("is {}", normalize.std),
                    "give a positive finite number: the values are divided by it",
                ));
            }
            Ok(TransformSpec::Normalize {
                column,
                mean: normalize.mean,
                std: normalize.std,
            })
        }
        (None, None, None, Some(bucket)) => {
            let column = column("hash_bucket", bucket.column)?;
            if bucket.buckets == 0 {
                return Err(SpecError::invalid(
                    format!("{at}.hash_bucket.buckets"),
                    "is 0",
                    "set it to 1 or more",
                ));
            }
            let output = match bucket.output {
                None => column.clone(),
                Some(output) if output.trim().is_empty() => {
                    return Err(SpecError::invalid(
                        format!("{at}.hash_bucket.output"),
                        "is an empty column name",
                        "name the column to write, or remove the key to overwrite the hashed column",
                    ));
                }
                Some(output) => output,
            };
            Ok(TransformSpec::HashBucket {
                column,
                buckets: bucket.buckets,
                output,
            })
        }
        (cast, fill_null, normalize, hash_bucket) => {
            let keys = [
                cast.is_some(),
                fill_null.is_some(),
                normalize.is_some(),
                hash_bucket.is_some(),
            ]
            .iter()
            .filter(|is_set| **is_set)
            .count();
            Err(SpecError::invalid(
                at,
                format!("has {keys} of the keys {}", TransformSpec::NAMES.join(", ")),
                "write exactly one step per entry, for example `{ cast: { column: x, to: float32 } }`",
            ))
        }
    }
}

fn positive_u32(path: &str, value: Option<u32>, default: u32) -> Result<u32, SpecError> {
    match value {
        None => Ok(default),
        Some(0) => Err(SpecError::invalid(
            path,
            "is 0",
            format!("set it to 1 or more, or remove it for the default {default}"),
        )),
        Some(value) => Ok(value),
    }
}

fn positive_u64(path: &str, value: Option<u64>, default: u64) -> Result<u64, SpecError> {
    match value {
        None => Ok(default),
        Some(0) => Err(SpecError::invalid(
            path,
            "is 0",
            format!("set it to 1 or more, or remove it for the default {default}"),
        )),
        Some(value) => Ok(value),
    }
}

fn validate_uri(path: &str, uri: &str) -> Result<(), SpecError> {
    let schemes = URI_SCHEMES.join("://, ") + "://";
    let Some((scheme, rest)) = uri.split_once("://") else {
        let fix = if uri.starts_with('/') {
            format!("write a local path as file://{uri}")
        } else {
            format!("start it with one of {schemes}")
        };
        return Err(SpecError::invalid(
            path,
            format!("`{uri}` has no scheme"),
            fix,
        ));
    };
    if !URI_SCHEMES.contains(&scheme) {
        return Err(SpecError::invalid(
            path,
            format!("`{uri}` uses the unsupported scheme `{scheme}://`"),
            format!("use one of {schemes}"),
        ));
    }
    if rest.trim_matches('/').is_empty() {
        return Err(SpecError::invalid(
            path,
            format!("`{uri}` names no bucket or path"),
            format!("add the location after `{scheme}://`"),
        ));
    }
    Ok(())
}

/// Infers a source format from the uri's extension or a Delta log in the path.
fn infer_format(uri: &str) -> Option<SourceFormat> {
    let lower = uri.trim_end_matches('/').to_ascii_lowercase();
    if lower.ends_with(".metadata.json") {
        return Some(SourceFormat::Iceberg);
    }
    let extension = lower.rsplit('/').next()?.rsplit_once('.')?.1;
    match extension {
        "parquet" | "pq" => Some(SourceFormat::Parquet),
        "arrow" | "ipc" | "feather" => Some(SourceFormat::Ipc),
        "csv" => Some(SourceFormat::Csv),
        "jsonl" | "ndjson" => Some(SourceFormat::Jsonl),
        "tfrecord" | "tfrecords" => Some(SourceFormat::Tfrecord),
        _ => None,
    }
}

/// A source added to a running job: as [`validate_source`] checks an entry of `data.sources`,
/// without `follow`.
pub(crate) fn validate_added_source(index: usize, raw: RawSource) -> Result<SourceSpec, SpecError> {
    if !matches!(raw.follow, None | Some(RawFollow::Flag(false))) {
        return Err(SpecError::invalid(
            format!("data.sources[{index}].follow"),
            "is set on a source added to a running job",
            "remove it: an added source is planned once; to follow a source, name it in the job spec",
        ));
    }
    if raw.weight.is_some() || raw.on_exhausted.is_some() {
        return Err(SpecError::invalid(
            format!("data.sources[{index}].weight"),
            "is set on a source added to a running job",
            "remove it: a job's mix is fixed when it starts; name the source in the job spec to mix it",
        ));
    }
    validate_source(index, raw)
}

fn validate_source(index: usize, raw: RawSource) -> Result<SourceSpec, SpecError> {
    let at = |key: &str| format!("data.sources[{index}].{key}");
    validate_uri(&at("uri"), &raw.uri)?;
    let format = match raw.format.as_deref() {
        Some("parquet") => SourceFormat::Parquet,
        Some("delta") => SourceFormat::Delta,
        Some("iceberg") => SourceFormat::Iceberg,
        Some("ipc" | "arrow") => SourceFormat::Ipc,
        Some("csv") => SourceFormat::Csv,
        Some("jsonl") => SourceFormat::Jsonl,
        Some("tfrecord") => SourceFormat::Tfrecord,
        Some(other) => {
            return Err(SpecError::invalid(
                at("format"),
                format!("has unknown value `{other}`"),
                suggest(other, SourceFormat::NAMES),
            ));
        }
        None => infer_format(&raw.uri).ok_or_else(|| SpecError::Missing {
            path: at("format"),
            fix: format!(
                "the uri `{}` does not tell the format; set it to one of: {}",
                raw.uri,
                SourceFormat::NAMES.join(", ")
            ),
        })?,
    };
    let columns = match raw.columns {
        None => None,
        Some(columns) if columns.is_empty() => {
            return Err(SpecError::invalid(
                at("columns"),
                "is an empty list",
                "list the columns to read, or remove the key to read them all",
            ));
        }
        Some(columns) => {
            let mut seen = BTreeSet::new();
            for (column_index, column) in columns.iter().enumerate() {
                if column.trim().is_empty() {
                    return Err(SpecError::invalid(
                        format!("{}[{column_index}]", at("columns")),
                        "is an empty column name",
                        "write the column's name or remove the entry",
                    ));
                }
                if !seen.insert(column.as_str()) {
                    return Err(SpecError::invalid(
                        format!("{}[{column_index}]", at("columns")),
                        format!("repeats the column `{column}`"),
                        "list each column once",
                    ));
                }
            }
            Some(columns)
        }
    };
    let filter = match raw.filter {
        Some(filter) if filter.trim().is_empty() => {
            return Err(SpecError::invalid(
                at("filter"),
                "is blank",
                "write a filter expression, or remove the key to keep every row",
            ));
        }
        Some(filter) => {
            // Parsed here so that a filter no daemon can read fails the spec, not every daemon.
            if let Err(error) = sluice_formats::filter::Expr::parse(&filter) {
                return Err(SpecError::invalid(
                    at("filter"),
                    error.to_string(),
                    "fix the expression, for example `label = 1 and score >= 0.5`",
                ));
            }
            Some(filter)
        }
        None => None,
    };
    let storage_options = string_map(&at("storage_options"), raw.storage_options, |_| Ok(()))?;
    let timestamp = raw.timestamp.map(|timestamp| timestamp.0);
    let pinned = match (raw.version, &timestamp) {
        (Some(_), Some(_)) => {
            return Err(SpecError::invalid(
                at("timestamp"),
                "is set together with `version`",
                "pin the table by one of them",
            ));
        }
        (Some(_), None) => Some("version"),
        (None, Some(_)) => Some("timestamp"),
        (None, None) => None,
    };
    if let Some(key) = pinned
        && !matches!(format, SourceFormat::Delta | SourceFormat::Iceberg)
    {
        return Err(SpecError::invalid(
            at(key),
            format!(
                "pins a table version, but the source's format is {}",
                format.name()
            ),
            "remove it, or read a Delta or Iceberg table (`format: delta`, `format: iceberg`)",
        ));
    }
    if timestamp
        .as_deref()
        .is_some_and(|text| text.trim().is_empty())
    {
        return Err(SpecError::invalid(
            at("timestamp"),
            "is blank",
            "write an RFC 3339 time or milliseconds since the epoch, or remove the key",
        ));
    }
    let follow = validate_follow(&at, format, raw.version, raw.follow)?;
    let mix = validate_source_mix(&at, raw.weight, raw.on_exhausted.as_deref())?;
    if mix.is_some() && follow.is_some() {
        return Err(SpecError::invalid(
            at("weight"),
            "is set on a followed source",
            "stop following it, or leave weights out: a followed source has no pass to draw in proportion",
        ));
    }
    Ok(SourceSpec {
        uri: raw.uri,
        format,
        columns,
        filter,
        storage_options,
        version: raw.version,
        timestamp,
        follow,
        mix,
    })
}

fn validate_source_mix(
    at: &impl Fn(&str) -> String,
    weight: Option<f64>,
    on_exhausted: Option<&str>,
) -> Result<Option<SourceMix>, SpecError> {
    let on_exhausted = match on_exhausted {
        None | Some("end_epoch") => OnExhausted::EndEpoch,
        Some("next_pass") => OnExhausted::NextPass,
        Some(other) => {
            return Err(SpecError::invalid(
                at("on_exhausted"),
                format!("has unknown value `{other}`"),
                suggest(other, OnExhausted::NAMES),
            ));
        }
    };
    let Some(weight) = weight else {
        if on_exhausted != OnExhausted::EndEpoch {
            return Err(SpecError::invalid(
                at("on_exhausted"),
                "is set on a source without a weight",
                "give every source a weight to mix them, or remove the key",
            ));
        }
        return Ok(None);
    };
    if !(weight.is_finite() && weight > 0.0) {
        return Err(SpecError::invalid(
            at("weight"),
            format!("is {weight}"),
            "give a positive number: the sources' rows are drawn in proportion to their weights",
        ));
    }
    Ok(Some(SourceMix {
        weight,
        on_exhausted,
    }))
}

/// Checks that the sources are mixed all or none, and that a mix has an end: at least one source
/// whose running out ends the epoch.
fn validate_mix(sources: &[SourceSpec]) -> Result<(), SpecError> {
    let weighted = sources.iter().filter(|source| source.mix.is_some()).count();
    if weighted == 0 {
        return Ok(());
    }
    if let Some(index) = sources.iter().position(|source| source.mix.is_none()) {
        return Err(SpecError::invalid(
            format!("data.sources[{index}].weight"),
            format!("is missing, but {weighted} other sources have one"),
            "give every source a weight, or none: the weights are the sources' shares of the rows",
        ));
    }
    let ends = sources.iter().any(|source| {
        source
            .mix
            .is_some_and(|mix| mix.on_exhausted == OnExhausted::EndEpoch)
    });
    if !ends {
        return Err(SpecError::invalid(
            "data.sources",
            "are all `on_exhausted: next_pass`, so an epoch would never end",
            "set `on_exhausted: end_epoch` on at least one source, the one whose pass makes an epoch",
        ));
    }
    Ok(())
}

fn validate_follow(
    at: &dyn Fn(&str) -> String,
    format: SourceFormat,
    version: Option<u64>,
    raw: Option<RawFollow>,
) -> Result<Option<FollowSpec>, SpecError> {
    let settings = match raw {
        None | Some(RawFollow::Flag(false)) => return Ok(None),
        Some(RawFollow::Flag(true)) => None,
        Some(RawFollow::Settings(settings)) => Some(settings),
    };
    if !matches!(format, SourceFormat::Parquet | SourceFormat::Delta) {
        return Err(SpecError::invalid(
            at("follow"),
            format!("is set on a {} source", format.name()),
            "follow a Parquet directory or a Delta table, or remove the key",
        ));
    }
    let Some(settings) = settings else {
        return Ok(Some(FollowSpec {
            interval_ms: FollowSpec::DEFAULT_INTERVAL_MS,
            until_version: None,
            until_timestamp_ms: None,
        }));
    };
    let interval_ms = settings
        .interval_ms
        .unwrap_or(FollowSpec::DEFAULT_INTERVAL_MS);
    if interval_ms < MIN_FOLLOW_INTERVAL_MS {
        return Err(SpecError::invalid(
            at("follow.interval_ms"),
            format!("is {interval_ms}"),
            format!("poll at most every {MIN_FOLLOW_INTERVAL_MS} ms; every poll lists the source"),
        ));
    }
    if let Some(until_version) = settings.until_version {
        if format != SourceFormat::Delta {
            return Err(SpecError::invalid(
                at("follow.until_version"),
                format!(
                    "ends following at a Delta version, but the source's format is {}",
                    format.name()
                ),
                "use until_timestamp to end following a Parquet directory, or `sluice stop`",
            ));
        }
        if let Some(version) = version
            && until_version < version
        {
            return Err(SpecError::invalid(
                at("follow.until_version"),
                format!("({until_version}) is before the pinned version ({version})"),
                "set it at or after `version`: following starts after the pinned version",
            ));
        }
    }
    let until_timestamp_ms = settings
        .until_timestamp
        .map(|ScalarString(text)| {
            sluice_formats::delta::parse_timestamp_millis(text.trim()).map_err(|_| {
                SpecError::invalid(
                    at("follow.until_timestamp"),
                    format!("`{text}` is not a time"),
                    "write RFC 3339 such as 2026-05-01T12:00:00Z, or milliseconds since the epoch",
                )
            })
        })
        .transpose()?;
    Ok(Some(FollowSpec {
        interval_ms,
        until_version: settings.until_version,
        until_timestamp_ms,
    }))
}

/// Converts a map of scalars to strings, refusing empty keys and checking each key.
fn string_map(
    path: &str,
    raw: Option<BTreeMap<String, ScalarString>>,
    check_key: impl Fn(&str) -> Result<(), (String, String)>,
) -> Result<BTreeMap<String, String>, SpecError> {
    let mut converted = BTreeMap::new();
    for (key, ScalarString(value)) in raw.unwrap_or_default() {
        if key.trim().is_empty() {
            return Err(SpecError::invalid(
                path,
                "has an empty key",
                "name every entry",
            ));
        }
        check_key(&key)
            .map_err(|(problem, fix)| SpecError::invalid(format!("{path}.{key}"), problem, fix))?;
        converted.insert(key, value);
    }
    Ok(converted)
}

fn validate_role(
    index: usize,
    raw: RawRole,
    launcher: LauncherKind,
) -> Result<RoleSpec, SpecError> {
    let at = |key: &str| format!("roles[{index}].{key}");
    let name = validate_slug(&at("name"), &raw.name, 63)?;
    let num = positive_u32(&at("num"), raw.num, 1)?;
    let command = match raw.command {
        Some(command) => {
            check_command(&at("command"), &command)?;
            command
        }
        None if launcher == LauncherKind::External => Vec::new(),
        None => {
            return Err(SpecError::invalid(
                at("command"),
                "is missing",
                "add the command to run, as a list, for example `command: [python, train.py]` (only `launcher: { kind: external }`, where the AM launches nothing, leaves it out)",
            ));
        }
    };
    let env = string_map(&at("env"), raw.env, |key| {
        let valid_name = key
            .chars()
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
            && key
                .chars()
                .all(|character| character.is_ascii_alphanumeric() || character == '_');
        if !valid_name {
            return Err((
                "is not a valid environment variable name".to_owned(),
                "use letters, digits and `_`, not starting with a digit".to_owned(),
            ));
        }
        if RESERVED_ENV.contains(&key) {
            return Err((
                "is set by the application master for every trainer".to_owned(),
                "remove it".to_owned(),
            ));
        }
        Ok(())
    })?;
    let resources = validate_resources(&at("resources"), raw.resources)?;
    let image = match raw.image {
        Some(_) if launcher != LauncherKind::Kubernetes => {
            return Err(SpecError::invalid(
                at("image"),
                "is an option of the kubernetes launcher, which runs trainers in containers",
                "remove `image`, or set `launcher: { kind: kubernetes, image: ... }`",
            ));
        }
        Some(image) => Some(validate_image(&at("image"), image)?),
        None => None,
    };
    Ok(RoleSpec {
        name,
        num,
        command,
        env,
        resources,
        image,
    })
}

/// A trainer command names a program first.
fn check_command(path: &str, command: &[String]) -> Result<(), SpecError> {
    match command.first() {
        None => Err(SpecError::invalid(
            path,
            "is an empty list",
            "write the program and its arguments, for example `[python, train.py]`",
        )),
        Some(program) if program.trim().is_empty() => Err(SpecError::invalid(
            format!("{path}[0]"),
            "is an empty program name",
            "write the program to run first",
        )),
        Some(_) => Ok(()),
    }
}

fn validate_resources(path: &str, raw: Option<RawResources>) -> Result<Resources, SpecError> {
    let Some(raw) = raw else {
        return Ok(Resources {
            cpu: None,
            memory_bytes: None,
            gpu: 0,
        });
    };
    if let Some(cpu) = raw.cpu
        && !(cpu.is_finite() && cpu > 0.0)
    {
        return Err(SpecError::invalid(
            format!("{path}.cpu"),
            format!("is {cpu}"),
            "give a positive number of cores, for example 2 or 0.5",
        ));
    }
    let memory_bytes = raw
        .memory
        .map(|ScalarString(text)| {
            parse_bytes(&text).ok_or_else(|| {
                SpecError::invalid(
                    format!("{path}.memory"),
                    format!("`{text}` is not a size"),
                    "write a byte count or a size with a unit, for example 512Mi, 4Gi or 2G",
                )
            })
        })
        .transpose()?;
    Ok(Resources {
        cpu: raw.cpu,
        memory_bytes,
        gpu: raw.gpu.unwrap_or(0),
    })
}

/// Parses `4Gi`, `512Mi`, `2G`, `1500` into bytes; `None` if it is not a positive size.
fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|character: char| !character.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 = number.parse().ok()?;
    let multiplier: u64 = match unit.trim() {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(multiplier).filter(|bytes| *bytes > 0)
}

fn validate_failover(raw: Option<RawFailover>, executors: u64) -> Result<FailoverSpec, SpecError> {
    let raw = raw.unwrap_or(RawFailover {
        restart: None,
        max_failures: None,
        max_total_failures: None,
        max_task_attempts: None,
        blacklist_after_failures: None,
        heartbeat_interval_ms: None,
        heartbeat_timeout_ms: None,
        task_success_percent: None,
        task_failed_percent: None,
        hang: None,
        restart_backoff_ms: None,
        restart_backoff_max_ms: None,
    });
    let restart = match raw.restart.as_deref() {
        None | Some("on-failure") => RestartPolicy::OnFailure,
        Some("never") => RestartPolicy::Never,
        Some("always") => RestartPolicy::Always,
        Some(other) => {
            return Err(SpecError::invalid(
                "failover.restart",
                format!("has unknown value `{other}`"),
                suggest(other, RestartPolicy::NAMES),
            ));
        }
    };
    let max_failures = raw.max_failures.unwrap_or(3);
    let default_total =
        u32::try_from(u64::from(max_failures).saturating_mul(executors)).unwrap_or(u32::MAX);
    let max_total_failures = raw.max_total_failures.unwrap_or(default_total);
    let max_task_attempts = positive_u32("failover.max_task_attempts", raw.max_task_attempts, 3)?;
    if max_task_attempts > MAX_TASK_ATTEMPTS {
        return Err(SpecError::invalid(
            "failover.max_task_attempts",
            format!("is {max_task_attempts}"),
            format!("use at most {MAX_TASK_ATTEMPTS}: a task that fails that often is broken"),
        ));
    }
    let blacklist_after_failures = positive_u32(
        "failover.blacklist_after_failures",
        raw.blacklist_after_failures,
        max_failures.max(1),
    )?;
    let restart_backoff_ms = raw.restart_backoff_ms.unwrap_or(250);
    let restart_backoff_max_ms = raw
        .restart_backoff_max_ms
        .unwrap_or(10_000)
        .max(restart_backoff_ms);
    if restart_backoff_max_ms > MAX_RESTART_BACKOFF_MS {
        return Err(SpecError::invalid(
            if raw.restart_backoff_ms.unwrap_or(0) > MAX_RESTART_BACKOFF_MS {
                "failover.restart_backoff_ms"
            } else {
                "failover.restart_backoff_max_ms"
            },
            format!("is more than {MAX_RESTART_BACKOFF_MS} ms"),
            "wait at most an hour between relaunches",
        ));
    }
    let heartbeat_interval_ms = raw.heartbeat_interval_ms.unwrap_or(1000);
    if heartbeat_interval_ms < MIN_HEARTBEAT_INTERVAL_MS {
        return Err(SpecError::invalid(
            "failover.heartbeat_interval_ms",
            format!("is {heartbeat_interval_ms}"),
            format!("use {MIN_HEARTBEAT_INTERVAL_MS} or more"),
        ));
    }
    let heartbeat_timeout_ms = raw
        .heartbeat_timeout_ms
        .unwrap_or(heartbeat_interval_ms.saturating_mul(10));
    if heartbeat_timeout_ms <= heartbeat_interval_ms {
        return Err(SpecError::invalid(
            "failover.heartbeat_timeout_ms",
            format!(
                "({heartbeat_timeout_ms}) must be greater than heartbeat_interval_ms ({heartbeat_interval_ms})"
            ),
            "raise it or lower the interval",
        ));
    }
    let task_success_percent = percent(
        "failover.task_success_percent",
        raw.task_success_percent,
        100.0,
    )?;
    let task_failed_percent = percent(
        "failover.task_failed_percent",
        raw.task_failed_percent,
        100.0,
    )?;
    let hang = validate_hang(raw.hang)?;
    Ok(FailoverSpec {
        restart,
        max_failures,
        max_total_failures,
        max_task_attempts,
        blacklist_after_failures,
        heartbeat_interval_ms,
        heartbeat_timeout_ms,
        task_success_percent,
        task_failed_percent,
        hang,
        restart_backoff_ms,
        restart_backoff_max_ms,
    })
}

/// The longest `failover.hang.after_s`: a week.
const MAX_HANG_AFTER_S: u64 = 7 * 24 * 3600;
/// The largest `failover.hang.factor`.
const MAX_HANG_FACTOR: f64 = 10_000.0;

fn validate_hang(raw: Option<RawHang>) -> Result<HangSpec, SpecError> {
    let raw = raw.unwrap_or(RawHang {
        after_s: None,
        factor: None,
        action: None,
    });
    let after_s = raw.after_s.unwrap_or(300);
    if !(1..=MAX_HANG_AFTER_S).contains(&after_s) {
        return Err(SpecError::invalid(
            "failover.hang.after_s",
            format!("is {after_s}"),
            format!("use 1 to {MAX_HANG_AFTER_S} seconds"),
        ));
    }
    let factor = raw.factor.unwrap_or(10.0);
    if !(factor.is_finite() && (1.0..=MAX_HANG_FACTOR).contains(&factor)) {
        return Err(SpecError::invalid(
            "failover.hang.factor",
            format!("is {factor}"),
            format!("use 1 to {MAX_HANG_FACTOR}"),
        ));
    }
    let action = match raw.action.as_deref() {
        None | Some("warn") => HangAction::Warn,
        Some("restart") => HangAction::Restart,
        Some("fail") => HangAction::Fail,
        Some(other) => {
            return Err(SpecError::invalid(
                "failover.hang.action",
                format!("has unknown value `{other}`"),
                suggest(other, HangAction::NAMES),
            ));
        }
    };
    Ok(HangSpec {
        after_s,
        factor,
        action,
    })
}

fn percent(path: &str, value: Option<f64>, default: f64) -> Result<f64, SpecError> {
    match value {
        None => Ok(default),
        Some(value) if value.is_finite() && value > 0.0 && value <= 100.0 => Ok(value),
        Some(value) => Err(SpecError::invalid(
            path,
            format!("is {value}"),
            "give a percentage above 0 and at most 100",
        )),
    }
}

fn validate_checkpoint(raw: RawCheckpoint) -> Result<CheckpointSpec, SpecError> {
    validate_uri("checkpoint.uri", &raw.uri)?;
    let interval_s = positive_u64("checkpoint.interval_s", raw.interval_s, 300)?;
    if raw.keep == Some(0) {
        return Err(SpecError::invalid(
            "checkpoint.keep",
            "is 0, which would delete every data checkpoint as it is made",
            "keep at least 1, or leave `keep` out to keep them all",
        ));
    }
    Ok(CheckpointSpec {
        uri: raw.uri,
        interval_s,
        keep: raw.keep,
    })
}
