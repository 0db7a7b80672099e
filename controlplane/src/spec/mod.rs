//! The job spec: parsed from YAML, TOML or JSON, then validated once into typed values.
//!
//! # Implementation
//! Parsing has three steps. The text is read into a format-neutral tree by the format's own parser (so
//! syntax errors keep their line and column). The tree is mapped onto serde structs that reject unknown
//! keys (`raw`), with errors that carry the key path. Then [`JobSpec`] is built from those structs by
//! `validate`, which fills the defaults and checks every rule, naming the key and the fix.

mod error;
mod nesting;
mod raw;
mod tree;
mod validate;
mod vars;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use error::SpecError;
pub use validate::{KUBERNETES_JOB_NAME_MAX_LEN, KUBERNETES_ROLE_NAME_MAX_LEN};

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The text format of a job spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Format {
    /// YAML, the default.
    Yaml,
    /// TOML.
    Toml,
    /// JSON.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
            Format::Json => "JSON",
        })
    }
}

impl Format {
    /// Picks the format from a file name's extension (`.yaml`, `.yml`, `.toml`, `.json`).
    pub fn from_path(path: &Path) -> Result<Format, SpecError> {
        let extension = path
            .extension()
            .and_then(|extension| extension.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("yaml" | "yml") => Ok(Format::Yaml),
            Some("toml") => Ok(Format::Toml),
            Some("json") => Ok(Format::Json),
            _ => Err(SpecError::UnknownExtension {
                path: path.to_owned(),
            }),
        }
    }

    /// Guesses the format of text with no file name, such as a spec piped on stdin.
    ///
    /// Text whose first non-blank character is `{` is JSON. Text whose first line that is neither blank
    /// nor a comment is a `[table]` header or a `key = value` line is TOML. Anything else is YAML.
    pub fn sniff(text: &str) -> Format {
        if text.trim_start().starts_with('{') {
            return Format::Json;
        }
        let first_line = text
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty() && !line.starts_with('#'));
        match first_line {
            Some(line) if line.starts_with('[') && line.ends_with(']') => Format::Toml,
            Some(line) => {
                let before_equals = line.split('=').next().unwrap_or("");
                let is_toml_key = line.contains('=')
                    && !before_equals.contains(':')
                    && !before_equals.trim().is_empty()
                    && before_equals.trim().chars().all(|character| {
                        character.is_ascii_alphanumeric() || "_-.\"' ".contains(character)
                    });
                if is_toml_key {
                    Format::Toml
                } else {
                    Format::Yaml
                }
            }
            None => Format::Yaml,
        }
    }
}

/// The most node daemons a job may have.
pub const MAX_NODES: u32 = 65_536;
/// The most trainers a job may have, over all its roles: the AM keeps a record of each, and hands
/// out ranks below this.
pub const MAX_TRAINERS: u32 = 1 << 20;

/// A validated job spec. Every optional key has its default filled in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSpec {
    /// The job's name; it names shared-memory directories and pods, so it is a lowercase slug.
    pub name: String,
    /// What to read and how to cut it into tasks.
    pub data: DataSpec,
    /// How many node daemons to run (default 1).
    pub nodes: u32,
    /// The trainer roles.
    pub roles: Vec<RoleSpec>,
    /// Restart, failure and heartbeat policy.
    pub failover: FailoverSpec,
    /// Where executors run (default `local`).
    pub launcher: LauncherKind,
    /// What the batch script of `launcher: { kind: slurm }` asks of Slurm; empty for the other
    /// launchers.
    pub slurm: SlurmSpec,
    /// Where and how `launcher: { kind: kubernetes }` runs the job's pods; `None` for the other
    /// launchers.
    pub kubernetes: Option<KubernetesSpec>,
    /// Where the journal and snapshots go; `None` means the job cannot resume after an AM restart.
    pub checkpoint: Option<CheckpointSpec>,
    /// Caps on each node daemon's tuning of its reading (`daemon`); left out of the encoding when
    /// unset.
    #[serde(skip_serializing_if = "DaemonSpec::is_default")]
    pub daemon: DaemonSpec,
}

/// The `daemon` section: the most a node daemon's tuning may give its reading. The daemon adjusts
/// both at run time, within these and within its cgroup's CPU quota and memory limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DaemonSpec {
    /// The most tasks a daemon reads and decodes at once, within its CPU quota in cores (default:
    /// the quota).
    pub max_threads: Option<u32>,
    /// The most bytes of decoded batches a daemon holds ahead of its rings, within a quarter of its
    /// cgroup's memory limit (default 1 GiB).
    pub max_read_ahead_bytes: Option<u64>,
}

impl DaemonSpec {
    fn is_default(&self) -> bool {
        *self == DaemonSpec::default()
    }
}

/// The `data` section.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataSpec {
    /// The sources, read in order.
    pub sources: Vec<SourceSpec>,
    /// Rows per record batch handed to trainers (default 1024).
    pub batch_size: u32,
    /// Passes over the data (default 1).
    pub epochs: u32,
    /// Target rows per task (default 65536).
    pub task_rows: u64,
    /// Seeds and window of the shuffle.
    pub shuffle: ShuffleSpec,
    /// When re-splitting, rows past what the holder has enqueued that it keeps as a margin
    /// (default `batch_size`).
    pub resplit_margin_rows: u64,
    /// The smallest remainder worth re-splitting to an idle node (default `batch_size`).
    pub resplit_min_rows: u64,
    /// Preprocessing applied by the daemons to every batch, in order, after projection and filter.
    pub transforms: Vec<TransformSpec>,
    /// Whether every batch but a task's last holds exactly `batch_size` rows (default false: a
    /// batch holds what the reader decoded of `batch_size` rows once the filter has run).
    pub fixed_batch_size: bool,
    /// The local disk cache of remote sources on each node, read again from the second epoch on.
    /// Not part of what the job reads: left out of the journal's identity (and so out of the
    /// encoding when unset, as the data section of a spec without it was encoded before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// What a daemon does with data it cannot decode (`data.on_bad_data`, `data.max_bad_fraction`).
    /// Left out of the journal's identity like the cache, and out of the encoding at its default.
    #[serde(skip_serializing_if = "BadDataSpec::is_default")]
    pub bad_data: BadDataSpec,
    /// Whether every trainer gets the same number of batches in each epoch (`data.even_batches`,
    /// default `off`). Part of the journal's identity (it changes what the trainers get), and left
    /// out of the encoding when off, as the data section of a spec without it was encoded before it.
    #[serde(skip_serializing_if = "EvenBatches::is_off")]
    pub even_batches: EvenBatches,
}

/// `data.even_batches`: how every trainer gets the same number of batches in each epoch, so that
/// data-parallel ranks that step in lockstep all run the epoch's last step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EvenBatches {
    /// Each trainer gets the batches its ring was given.
    #[default]
    Off,
    /// Once the epoch's batches are all counted, the rings with fewer batches than the most get
    /// batches of rows they already had, marked by the boolean column `_sluice_pad`.
    Pad,
    /// No ring gets more batches than the fewest any ring gets: a ring holds back the batches it
    /// was handed past the fewest so far, and once the epoch's batches are all counted, drops
    /// those past the fewest. The dropped rows are counted and named in status, and their splits'
    /// tasks come first in the next epoch.
    Drop,
}

impl EvenBatches {
    /// The names accepted in `data.even_batches`.
    pub const NAMES: &'static [&'static str] = &["off", "pad", "drop"];

    fn is_off(&self) -> bool {
        *self == EvenBatches::Off
    }
}

/// `data.on_bad_data` and `data.max_bad_fraction`: what happens to a file, row group or record that
/// does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BadDataSpec {
    /// The policy (default `fail`).
    pub policy: BadDataPolicy,
    /// With `skip` or `warn`, the share of an epoch's rows, and of a source's files, that may be
    /// skipped before the job fails (default 0.01).
    pub max_fraction: f64,
}

impl BadDataSpec {
    /// The default `max_bad_fraction`.
    pub const DEFAULT_MAX_FRACTION: f64 = 0.01;

    fn is_default(&self) -> bool {
        *self == BadDataSpec::default()
    }
}

impl Default for BadDataSpec {
    fn default() -> Self {
        BadDataSpec {
            policy: BadDataPolicy::Fail,
            max_fraction: BadDataSpec::DEFAULT_MAX_FRACTION,
        }
    }
}

/// What a daemon does with data that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BadDataPolicy {
    /// The task fails, and the failover policy decides (attempts, then the failed percentages).
    Fail,
    /// The rows that do not decode are skipped: counted in the metrics and named in the job's summary.
    Skip,
    /// As `skip`, and every skip is also logged as a warning by the daemon and the AM.
    Warn,
}

impl BadDataPolicy {
    /// The names accepted in `data.on_bad_data`.
    pub const NAMES: &'static [&'static str] = &["fail", "skip", "warn"];
}

/// `data.cache`: where each node keeps the blocks of the remote objects it read, and how many
/// bytes it keeps. A daemon started with `--cache-dir` uses its own instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheSpec {
    /// An absolute directory on the node's local disk.
    pub dir: String,
    /// The most bytes kept; the daemon refuses less than two blocks (8 MiB) or more than the disk.
    pub max_bytes: u64,
}

/// One entry of `data.transforms`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransformSpec {
    /// Casts `column` to the type named `to`.
    Cast {
        /// The column.
        column: String,
        /// A name from the formats layer's type names, for example `float32`.
        to: String,
    },
    /// Replaces the nulls of `column` with `value`, read as the column's type.
    FillNull {
        /// The column.
        column: String,
        /// The value, as text.
        value: String,
    },
    /// Replaces x with (x - mean) / std.
    Normalize {
        /// The column.
        column: String,
        /// Subtracted first.
        mean: f64,
        /// The divisor; positive and finite.
        std: f64,
    },
    /// Writes a stable hash of `column` modulo `buckets` to `output`.
    HashBucket {
        /// The column hashed.
        column: String,
        /// The number of buckets, at least 1.
        buckets: u64,
        /// The column written (default: `column` itself).
        output: String,
    },
}

impl TransformSpec {
    /// The keys an entry of `data.transforms` may have, one per entry.
    pub const NAMES: &'static [&'static str] = &["cast", "fill_null", "normalize", "hash_bucket"];
}

/// One data source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceSpec {
    /// Where the data is: `file://`, `s3://`, `gs://`, `az://` and the other object-store schemes.
    pub uri: String,
    /// How it is encoded; inferred from the uri's extension when not given.
    pub format: SourceFormat,
    /// The columns to read; `None` reads them all.
    pub columns: Option<Vec<String>>,
    /// A row filter in the formats layer's filter language, checked there.
    pub filter: Option<String>,
    /// Object-store settings that override the environment.
    pub storage_options: BTreeMap<String, String>,
    /// The Delta table version, or the Iceberg snapshot id, to read; the latest when neither it
    /// nor `timestamp` is set.
    pub version: Option<u64>,
    /// Read the Delta table version, or the Iceberg snapshot, current at this time (RFC 3339, or
    /// milliseconds since the epoch).
    pub timestamp: Option<String>,
    /// Whether new files (Parquet) or new commits (Delta) become tasks while the job runs.
    pub follow: Option<FollowSpec>,
    /// The source's share of a job that mixes its sources (`weight`, `on_exhausted`): set on every
    /// source or on none. Part of the journal's identity, and left out of the encoding when unset,
    /// as a source without it was encoded before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<SourceMix>,
}

/// A source's part in a job that mixes its sources by weight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SourceMix {
    /// Its share of the rows, relative to the other sources' weights.
    pub weight: f64,
    /// What happens when its pass runs out (default `end_epoch`).
    pub on_exhausted: OnExhausted,
}

/// `data.sources[].on_exhausted`: what a mixed source does when every row of its pass was drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExhausted {
    /// The epoch ends; the source starts its next pass in the next epoch, and the other sources
    /// go on from where they were.
    #[default]
    EndEpoch,
    /// The source starts its next pass at once, in a new order, and the epoch goes on.
    NextPass,
}

impl OnExhausted {
    /// The names accepted in `on_exhausted`.
    pub const NAMES: &'static [&'static str] = &["end_epoch", "next_pass"];
}

/// The `follow` setting of a source: how often it is polled, and when following ends by itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FollowSpec {
    /// Milliseconds between two polls of the source (default 5000).
    pub interval_ms: u64,
    /// For a Delta table: the last version planned; following ends once it is.
    pub until_version: Option<u64>,
    /// When following ends, in milliseconds since the Unix epoch: for a Delta table, commits
    /// after this commit timestamp are not planned; for Parquet, the wall clock.
    pub until_timestamp_ms: Option<i64>,
}

impl FollowSpec {
    /// The poll interval when the spec sets none.
    pub const DEFAULT_INTERVAL_MS: u64 = 5000;
}

/// The encoding of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// Apache Parquet files.
    Parquet,
    /// A Delta Lake table.
    Delta,
    /// An Apache Iceberg table.
    Iceberg,
    /// Arrow IPC files.
    Ipc,
    /// Comma-separated values.
    Csv,
    /// JSON lines.
    Jsonl,
    /// TFRecord files.
    Tfrecord,
}

impl SourceFormat {
    /// The names accepted in `format`.
    pub const NAMES: &'static [&'static str] = &[
        "parquet", "delta", "iceberg", "ipc", "csv", "jsonl", "tfrecord",
    ];

    /// The name of the format as written in `format`.
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Parquet => "parquet",
            SourceFormat::Delta => "delta",
            SourceFormat::Iceberg => "iceberg",
            SourceFormat::Ipc => "ipc",
            SourceFormat::Csv => "csv",
            SourceFormat::Jsonl => "jsonl",
            SourceFormat::Tfrecord => "tfrecord",
        }
    }
}

/// The `data.shuffle` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShuffleSpec {
    /// Whether the spec has the section. The AM orders each epoch's tasks by the seed either way;
    /// only with it do the daemons interleave open tasks and permute the rows within each task.
    pub enabled: bool,
    /// The job seed: task order per epoch, interleave and row permutation derive from it (default 0).
    pub seed: u64,
    /// Open tasks interleaved by a daemon (default 4).
    pub window: u32,
}

/// One trainer role.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoleSpec {
    /// The role's name, unique in the job.
    pub name: String,
    /// How many processes (default 1).
    pub num: u32,
    /// The command and its arguments; `{rank}` is replaced by the process's rank. Empty under the
    /// external launcher, which may leave it out.
    pub command: Vec<String>,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// What each process needs.
    pub resources: Resources,
    /// Its container image under the Kubernetes launcher, in place of `launcher.image`.
    pub image: Option<String>,
}

/// Resources of one trainer process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Resources {
    /// CPU cores, fractional allowed.
    pub cpu: Option<f64>,
    /// Memory in bytes, written as `512Mi`, `4Gi`, `2G` or a plain byte count.
    pub memory_bytes: Option<u64>,
    /// GPUs (default 0).
    pub gpu: u32,
}

/// The `failover` section.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FailoverSpec {
    /// When an exited executor is started again (default `on-failure`).
    pub restart: RestartPolicy,
    /// Failures allowed per executor before it is not restarted again (default 3).
    pub max_failures: u32,
    /// Failures allowed for the whole job: task failures plus lost nodes (default
    /// `max_failures` × (nodes + trainer processes)).
    pub max_total_failures: u32,
    /// Attempts per task before it is failed (default 3).
    pub max_task_attempts: u32,
    /// Task failures on one node before the node is blacklisted (default `max_failures`).
    pub blacklist_after_failures: u32,
    /// How often daemons heartbeat (default 1000 ms).
    pub heartbeat_interval_ms: u64,
    /// Silence after which a daemon is declared lost (default 10 × the interval).
    pub heartbeat_timeout_ms: u64,
    /// The job succeeds once this percentage of the last epoch's rows is consumed (default 100).
    pub task_success_percent: f64,
    /// The job fails once this percentage of an epoch's rows belongs to failed tasks (default 100).
    pub task_failed_percent: f64,
    /// What a hang is, and what the AM does about one.
    pub hang: HangSpec,
    /// How long an executor that failed waits before it is launched again (default 250 ms); each
    /// failure of it after the first doubles the wait, up to `restart_backoff_max_ms`. 0 launches
    /// it again at once.
    pub restart_backoff_ms: u64,
    /// The longest wait before a relaunch (default 10,000 ms).
    pub restart_backoff_max_ms: u64,
}

impl FailoverSpec {
    /// How long an executor that failed `failures` times waits before it is launched again.
    pub fn restart_backoff(&self, failures: u32) -> std::time::Duration {
        let doublings = failures.saturating_sub(1).min(32);
        let wait = self
            .restart_backoff_ms
            .saturating_mul(1 << doublings)
            .min(self.restart_backoff_max_ms);
        std::time::Duration::from_millis(wait)
    }
}

/// The `failover.hang` section: when a trainer that stopped reading its ring counts as hung, and
/// what the AM does then.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HangSpec {
    /// The least time, in seconds, a trainer may hold its ring unread before it counts as hung
    /// (default 300).
    pub after_s: u64,
    /// A trainer counts as hung once it has not read for this many times its recent time between
    /// reads, and for at least `after_s` (default 10).
    pub factor: f64,
    /// What the AM does about a hang (default `warn`).
    pub action: HangAction,
}

impl HangSpec {
    /// How long a trainer whose reads came `interval_ms` apart lately may go without reading
    /// before it counts as hung, in milliseconds.
    pub fn bound_ms(&self, interval_ms: u64) -> u64 {
        let scaled = (interval_ms as f64 * self.factor).min(u64::MAX as f64) as u64;
        self.after_s.saturating_mul(1000).max(scaled)
    }
}

/// What the AM does about a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HangAction {
    /// Say so: in the log, the status and `/metrics`.
    Warn,
    /// Say so, and kill the hung trainer so that the failover rules start it again.
    Restart,
    /// Say so, and fail the job.
    Fail,
}

impl HangAction {
    /// The names accepted in `failover.hang.action`.
    pub const NAMES: &'static [&'static str] = &["warn", "restart", "fail"];

    /// The action's name in the spec.
    pub fn name(self) -> &'static str {
        match self {
            HangAction::Warn => "warn",
            HangAction::Restart => "restart",
            HangAction::Fail => "fail",
        }
    }
}

/// When an exited executor is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Restart after a non-zero exit.
    OnFailure,
    /// Never restart.
    Never,
    /// Restart after any exit.
    Always,
}

impl FailoverSpec {
    /// The lease a daemon holds on its rings: how long it goes on publishing batches with no answer
    /// from the AM. The heartbeat timeout less one interval, and at least half the timeout, so that
    /// a daemon cut off stops feeding its trainers before the AM can declare it lost.
    pub fn lease_ms(&self) -> u64 {
        self.heartbeat_timeout_ms
            .saturating_sub(self.heartbeat_interval_ms)
            .max(self.heartbeat_timeout_ms / 2)
    }
}

impl RestartPolicy {
    /// The names accepted in `failover.restart`.
    pub const NAMES: &'static [&'static str] = &["on-failure", "never", "always"];
}

/// Where executors run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LauncherKind {
    /// Processes on this machine.
    Local,
    /// One pod per node.
    Kubernetes,
    /// `srun` steps.
    Slurm,
    /// Someone else launches them (torchrun, srun, a Kubernetes Job): the AM launches nothing and
    /// waits for the daemons and trainers to come.
    External,
}

impl LauncherKind {
    /// The names accepted in `launcher.kind`.
    pub const NAMES: &'static [&'static str] = &["local", "kubernetes", "slurm", "external"];
}

/// The Slurm options of `launcher: { kind: slurm, partition, time, sbatch }`, written into the
/// batch script that `sluice submit` hands to `sbatch`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SlurmSpec {
    /// The partition (`#SBATCH --partition`); the cluster's default when absent.
    pub partition: Option<String>,
    /// The time limit (`#SBATCH --time`) in one of Slurm's forms: `MM`, `MM:SS`, `HH:MM:SS`,
    /// `D-HH`, `D-HH:MM` or `D-HH:MM:SS`.
    pub time: Option<String>,
    /// More `sbatch` options, one per entry (`--account=ml`, `--qos=high`), each written as an
    /// `#SBATCH` line.
    pub sbatch: Vec<String>,
}

/// The Kubernetes options of `launcher: { kind: kubernetes, image, namespace, ... }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubernetesSpec {
    /// The container image of the AM, the node daemons and, unless a role names its own, the
    /// trainers: it has `sluice` on its `PATH`.
    pub image: String,
    /// The namespace of every object of the job (default `default`).
    pub namespace: String,
    /// Labels a node must have to run the job's node pods.
    pub node_selector: BTreeMap<String, String>,
    /// Taints the node pods tolerate.
    pub tolerations: Vec<Toleration>,
    /// Secrets to pull the images with.
    pub image_pull_secrets: Vec<String>,
    /// How the node pods start together.
    pub gang: Gang,
}

/// How a job's node pods start together on Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Gang {
    /// As the default scheduler places each (`gang: none`, the default).
    None,
    /// All at once or none, by Volcano (`gang: volcano`): a PodGroup of every node pod, in the
    /// Volcano queue named (`queue`, default `default`).
    Volcano {
        /// The Volcano queue.
        queue: String,
    },
}

/// A taint a pod tolerates, as Kubernetes writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Toleration {
    /// The taint's key; `None` with `Exists` tolerates every taint.
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    pub operator: String,
    /// The value an `Equal` toleration matches.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; `None` matches them all.
    pub effect: Option<String>,
}

/// The `checkpoint` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointSpec {
    /// The object-store prefix for the journal and snapshots.
    pub uri: String,
    /// Seconds between compacted snapshots (default 300).
    pub interval_s: u64,
    /// How many data checkpoints are kept: the newest by step, and the one the job was last
    /// restored to; an older one is deleted once a newer one is stored past the count. `None` (the
    /// default) keeps them all.
    pub keep: Option<u32>,
}

impl SourceSpec {
    /// Parses and validates a source added to a running job (`sluice source add`), written as the
    /// entry `index` of `data.sources` would be, in YAML or JSON. `${NAME}` is left as it is (the
    /// shell that sent the text expanded what it meant to), so that the AM that replays the source
    /// from its journal reads the same source. `follow` is refused: an added source is planned
    /// once.
    pub fn parse_added(text: &str, index: usize) -> Result<SourceSpec, SpecError> {
        // Read as YAML, which takes JSON too, and YAML's flow mappings that look like it.
        let syntax_error = |message: String| SpecError::Syntax {
            format: Format::Yaml,
            message,
        };
        nesting::check_flow_openings(text).map_err(syntax_error)?;
        let document: tree::Node =
            serde_norway::from_str(text).map_err(|error| syntax_error(error.to_string()))?;
        if document == tree::Node::Null {
            return Err(SpecError::Missing {
                path: format!("data.sources[{index}].uri"),
                fix: "give the source's uri, for example `{ uri: file:///data/more, format: parquet }`"
                    .to_owned(),
            });
        }
        let raw: raw::RawSource = tree::from_node(document).map_err(error::from_tree_error)?;
        validate::validate_added_source(index, raw)
    }
}

impl JobSpec {
    /// Reads and validates a spec file, choosing the format by its extension.
    pub fn from_path(path: impl AsRef<Path>) -> Result<JobSpec, SpecError> {
        let path = path.as_ref();
        let format = Format::from_path(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.to_owned(),
            source,
        })?;
        JobSpec::parse(&text, format)
    }

    /// Parses and validates spec text in the given format, after replacing each `${NAME}` with
    /// the environment variable `NAME`.
    pub fn parse(text: &str, format: Format) -> Result<JobSpec, SpecError> {
        let text = &vars::expand(text, |name| std::env::var(name).ok())?;
        let syntax_error = |message: String| SpecError::Syntax { format, message };
        let document: tree::Node = match format {
            Format::Yaml => {
                nesting::check_flow_openings(text).map_err(syntax_error)?;
                serde_norway::from_str(text).map_err(|error| syntax_error(error.to_string()))?
            }
            Format::Toml => {
                toml::from_str(text).map_err(|error| syntax_error(error.to_string()))?
            }
            Format::Json => {
                serde_json::from_str(text).map_err(|error| syntax_error(error.to_string()))?
            }
        };
        if document == tree::Node::Null {
            return Err(SpecError::Empty);
        }
        let raw: raw::RawJobSpec = tree::from_node(document).map_err(error::from_tree_error)?;
        validate::validate(raw)
    }
}
