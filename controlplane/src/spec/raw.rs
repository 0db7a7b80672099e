//! The job spec as written: serde structs that reject unknown keys and leave defaults to validation.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The document's top level.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJobSpec {
    pub(crate) name: String,
    pub(crate) data: RawData,
    pub(crate) nodes: Option<u32>,
    pub(crate) roles: Vec<RawRole>,
    pub(crate) failover: Option<RawFailover>,
    pub(crate) launcher: Option<RawLauncher>,
    pub(crate) checkpoint: Option<RawCheckpoint>,
    pub(crate) daemon: Option<RawDaemon>,
}

/// `daemon`: caps on what each node daemon's tuning may choose.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDaemon {
    pub(crate) max_threads: Option<u32>,
    pub(crate) max_read_ahead_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawData {
    pub(crate) sources: Vec<RawSource>,
    pub(crate) batch_size: Option<u32>,
    pub(crate) epochs: Option<u32>,
    pub(crate) task_rows: Option<u64>,
    pub(crate) shuffle: Option<RawShuffle>,
    pub(crate) resplit_margin_rows: Option<u64>,
    pub(crate) resplit_min_rows: Option<u64>,
    pub(crate) transforms: Option<Vec<RawTransform>>,
    pub(crate) fixed_batch_size: Option<bool>,
    pub(crate) cache: Option<RawCache>,
    pub(crate) on_bad_data: Option<String>,
    pub(crate) max_bad_fraction: Option<f64>,
    pub(crate) even_batches: Option<String>,
}

/// `data.cache`: a local disk cache of remote sources.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCache {
    pub(crate) dir: String,
    pub(crate) max_bytes: u64,
}

/// One entry of `data.transforms`: exactly one of its keys is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTransform {
    pub(crate) cast: Option<RawCast>,
    pub(crate) fill_null: Option<RawFillNull>,
    pub(crate) normalize: Option<RawNormalize>,
    pub(crate) hash_bucket: Option<RawHashBucket>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCast {
    pub(crate) column: String,
    pub(crate) to: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFillNull {
    pub(crate) column: String,
    pub(crate) value: ScalarString,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNormalize {
    pub(crate) column: String,
    pub(crate) mean: f64,
    pub(crate) std: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHashBucket {
    pub(crate) column: String,
    pub(crate) buckets: u64,
    pub(crate) output: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSource {
    pub(crate) uri: String,
    pub(crate) format: Option<String>,
    pub(crate) columns: Option<Vec<String>>,
    pub(crate) filter: Option<String>,
    pub(crate) storage_options: Option<BTreeMap<String, ScalarString>>,
    pub(crate) version: Option<u64>,
    pub(crate) timestamp: Option<ScalarString>,
    pub(crate) follow: Option<RawFollow>,
    pub(crate) weight: Option<f64>,
    pub(crate) on_exhausted: Option<String>,
}

/// `follow: true`, `follow: false`, or `follow: { interval_ms, until_version, until_timestamp }`.
#[derive(Debug)]
pub(crate) enum RawFollow {
    Flag(bool),
    Settings(RawFollowSettings),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFollowSettings {
    pub(crate) interval_ms: Option<u64>,
    pub(crate) until_version: Option<u64>,
    pub(crate) until_timestamp: Option<ScalarString>,
}

impl<'de> Deserialize<'de> for RawFollow {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FollowVisitor;

        impl<'de> serde::de::Visitor<'de> for FollowVisitor {
            type Value = RawFollow;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str(
                    "true, false, or a map of interval_ms, until_version and until_timestamp",
                )
            }

            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<RawFollow, E> {
                Ok(RawFollow::Flag(value))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawFollow, A::Error> {
                RawFollowSettings::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawFollow::Settings)
            }
        }

        deserializer.deserialize_any(FollowVisitor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShuffle {
    pub(crate) seed: Option<u64>,
    pub(crate) window: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRole {
    pub(crate) name: String,
    pub(crate) num: Option<u32>,
    pub(crate) command: Option<Vec<String>>,
    pub(crate) env: Option<BTreeMap<String, ScalarString>>,
    pub(crate) resources: Option<RawResources>,
    pub(crate) image: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResources {
    pub(crate) cpu: Option<f64>,
    pub(crate) memory: Option<ScalarString>,
    pub(crate) gpu: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFailover {
    pub(crate) restart: Option<String>,
    pub(crate) max_failures: Option<u32>,
    pub(crate) max_total_failures: Option<u32>,
    pub(crate) max_task_attempts: Option<u32>,
    pub(crate) blacklist_after_failures: Option<u32>,
    pub(crate) heartbeat_interval_ms: Option<u64>,
    pub(crate) heartbeat_timeout_ms: Option<u64>,
    pub(crate) task_success_percent: Option<f64>,
    pub(crate) task_failed_percent: Option<f64>,
    pub(crate) hang: Option<RawHang>,
    pub(crate) restart_backoff_ms: Option<u64>,
    pub(crate) restart_backoff_max_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHang {
    pub(crate) after_s: Option<u64>,
    pub(crate) factor: Option<f64>,
    pub(crate) action: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLauncher {
    pub(crate) kind: String,
    pub(crate) partition: Option<String>,
    pub(crate) time: Option<String>,
    pub(crate) sbatch: Option<Vec<String>>,
    pub(crate) image: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) node_selector: Option<BTreeMap<String, ScalarString>>,
    pub(crate) tolerations: Option<Vec<RawToleration>>,
    pub(crate) image_pull_secrets: Option<Vec<String>>,
    pub(crate) gang: Option<String>,
    pub(crate) queue: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawToleration {
    pub(crate) key: Option<String>,
    pub(crate) operator: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) effect: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCheckpoint {
    pub(crate) uri: String,
    pub(crate) interval_s: Option<u64>,
    pub(crate) keep: Option<u32>,
}

/// A string that may be written as a bare scalar (`AWS_ALLOW_HTTP: true`, `OMP_NUM_THREADS: 4`), as
/// environment variables and storage options often are in YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScalarString(pub(crate) String);

impl<'de> Deserialize<'de> for ScalarString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;

        impl serde::de::Visitor<'_> for ScalarVisitor {
            type Value = ScalarString;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a string, number or boolean")
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<ScalarString, E> {
                Ok(ScalarString(value.to_owned()))
            }

            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<ScalarString, E> {
                Ok(ScalarString(value.to_string()))
            }

            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<ScalarString, E> {
                Ok(ScalarString(value.to_string()))
            }

            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<ScalarString, E> {
                Ok(ScalarString(value.to_string()))
            }

            fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<ScalarString, E> {
                Ok(ScalarString(value.to_string()))
            }
        }

        deserializer.deserialize_any(ScalarVisitor)
    }
}
