//! Where data checkpoints are kept: one immutable object per token under the checkpoint location,
//! or the AM's memory for a job without one.

use crate::decide::DataPosition;
use crate::error::{AmError, Result};
use crate::plan::JobPlan;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The object holding the job's plan under the checkpoint location.
const PLAN_OBJECT: &str = "plan.postcard";
/// The first bytes of a plan object that carries its format: then the format as a `u32` LE, then
/// the `postcard` encoding of the [`JobPlan`]. A plan object without them is of format 1, written
/// before plans carried their format; its body is the same encoding.
const PLAN_MAGIC: &[u8; 8] = b"SLPLAN\0\0";
/// The plan format this build writes. Bump it, and read the older ones, when the encoding of
/// [`JobPlan`] changes. Format 3 adds the bytes of the row formats' splits
/// ([`JobPlan::bytes`]) after the fields of formats 1 and 2; format 4 adds the identities of the
/// plain files ([`JobPlan::identities`]) after those of format 3; format 5 adds the files left out
/// because they do not decode ([`JobPlan::left_out`]) after those of format 4.
const PLAN_FORMAT: u32 = 5;

/// A plan of formats 1 and 2, whose splits carry no bytes: the fields of [`JobPlan`] before them,
/// in their order.
#[derive(serde::Deserialize)]
struct PlanWithoutBytes {
    files: Vec<crate::plan::PlannedFile>,
    splits: Vec<crate::plan::PlannedSplit>,
    versions: Vec<Option<u64>>,
}

/// A plan of format 3, whose files carry no identities: the fields of [`JobPlan`] before them, in
/// their order.
#[derive(serde::Deserialize)]
struct PlanWithoutIdentities {
    files: Vec<crate::plan::PlannedFile>,
    splits: Vec<crate::plan::PlannedSplit>,
    versions: Vec<Option<u64>>,
    bytes: Vec<crate::plan::PlannedBytes>,
}

/// A plan of format 4, which leaves no file out: the fields of [`JobPlan`] before
/// [`JobPlan::left_out`], in their order.
#[derive(serde::Deserialize)]
struct PlanWithoutLeftOut {
    files: Vec<crate::plan::PlannedFile>,
    splits: Vec<crate::plan::PlannedSplit>,
    versions: Vec<Option<u64>>,
    bytes: Vec<crate::plan::PlannedBytes>,
    identities: Vec<crate::plan::PlannedIdentity>,
}

/// The store of data checkpoints and of the job's plan.
#[derive(Debug)]
pub enum CheckpointStore {
    /// Kept in memory for the AM's life.
    Memory(Mutex<BTreeMap<String, DataPosition>>),
    /// Objects `<prefix>/data-checkpoints/<token>.json`.
    Object {
        /// The store.
        store: Arc<dyn ObjectStore>,
        /// The checkpoint location's path in it.
        prefix: Path,
        /// The location as the spec wrote it, for messages.
        uri: String,
    },
}

impl CheckpointStore {
    /// Keeps checkpoints in memory.
    pub fn in_memory() -> CheckpointStore {
        CheckpointStore::Memory(Mutex::new(BTreeMap::new()))
    }

    /// Keeps checkpoints under the location `uri`.
    pub fn at(uri: &str, options: &sluice_store::StorageOptions) -> Result<CheckpointStore> {
        let location = sluice_store::open_location(uri, options)
            .map_err(|source| AmError::InvalidRequest(format!("checkpoint.uri {uri}: {source}")))?;
        Ok(CheckpointStore::Object {
            store: location.store,
            prefix: location.path,
            uri: uri.to_owned(),
        })
    }

    /// Stores a checkpoint under its token; storing the same token again is a no-op, since a
    /// token names its content.
    pub async fn put(&self, token: &str, position: &DataPosition) -> Result<()> {
        check_token(token)?;
        match self {
            CheckpointStore::Memory(positions) => {
                positions
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .entry(token.to_owned())
                    .or_insert_with(|| position.clone());
                Ok(())
            }
            CheckpointStore::Object { store, prefix, uri } => {
                let bytes = serde_json::to_vec(position).expect("a data position serializes");
                match create(store.as_ref(), &object(prefix, token), bytes).await {
                    Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
                    Err(error) => Err(AmError::FailedPrecondition(format!(
                        "storing data checkpoint {token} under {uri}: {error}; check that the checkpoint location is writable"
                    ))),
                }
            }
        }
    }

    /// The plan a previous AM of the job stored, if any.
    pub async fn load_plan(&self) -> Result<Option<JobPlan>> {
        let CheckpointStore::Object { store, prefix, uri } = self else {
            return Ok(None);
        };
        match read(store.as_ref(), &prefix.clone().join(PLAN_OBJECT)).await {
            Ok(bytes) => decode_plan(&bytes).map(Some).map_err(|reason| {
                AmError::FailedPrecondition(format!("the job's plan {uri}/{PLAN_OBJECT} {reason}"))
            }),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(AmError::FailedPrecondition(format!(
                "reading the job's plan {uri}/{PLAN_OBJECT}: {error}"
            ))),
        }
    }

    /// Stores the job's plan once; a plan stored meanwhile by another AM wins and is returned.
    pub async fn store_plan(&self, plan: JobPlan) -> Result<JobPlan> {
        let CheckpointStore::Object { store, prefix, uri } = self else {
            return Ok(plan);
        };
        let mut bytes = PLAN_MAGIC.to_vec();
        bytes.extend_from_slice(&PLAN_FORMAT.to_le_bytes());
        let bytes = postcard::to_extend(&plan, bytes).expect("a plan serializes");
        match create(store.as_ref(), &prefix.clone().join(PLAN_OBJECT), bytes).await {
            Ok(_) => Ok(plan),
            Err(object_store::Error::AlreadyExists { .. }) => match self.load_plan().await? {
                Some(stored) => Ok(stored),
                None => Ok(plan),
            },
            Err(error) => Err(AmError::FailedPrecondition(format!(
                "storing the job's plan under {uri}: {error}; check that the checkpoint location is writable"
            ))),
        }
    }

    /// Deletes the checkpoint named `token`, pruned by `checkpoint.keep`; one already gone is no
    /// error.
    pub async fn delete(&self, token: &str) -> Result<()> {
        check_token(token)?;
        match self {
            CheckpointStore::Memory(positions) => {
                positions
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .remove(token);
                Ok(())
            }
            CheckpointStore::Object { store, prefix, uri } => {
                match store.delete(&object(prefix, token)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(error) => Err(AmError::FailedPrecondition(format!(
                        "deleting data checkpoint {token} under {uri}: {error}"
                    ))),
                }
            }
        }
    }

    /// Loads the checkpoint named `token`.
    pub async fn get(&self, token: &str) -> Result<DataPosition> {
        check_token(token)?;
        let unknown = |place: &str| {
            AmError::NotFound(format!(
                "data checkpoint {token} is not in {place}; pass a token that CommitDataCheckpoint returned for this job, and not one that `checkpoint.keep` pruned"
            ))
        };
        match self {
            CheckpointStore::Memory(positions) => positions
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get(token)
                .cloned()
                .ok_or_else(|| unknown("this AM's memory (the job has no checkpoint location)")),
            CheckpointStore::Object { store, prefix, uri } => {
                let bytes = read(store.as_ref(), &object(prefix, token)).await.map_err(
                    |error| match error {
                        object_store::Error::NotFound { .. } => unknown(uri),
                        other => AmError::FailedPrecondition(format!(
                            "reading data checkpoint {token} under {uri}: {other}"
                        )),
                    },
                )?;
                serde_json::from_slice(&bytes).map_err(|error| {
                    AmError::FailedPrecondition(format!(
                        "data checkpoint {token} under {uri} is damaged: {error}; restore another checkpoint"
                    ))
                })
            }
        }
    }
}

/// Reads a whole object.
async fn read(store: &dyn ObjectStore, path: &Path) -> object_store::Result<bytes::Bytes> {
    store.get(path).await?.bytes().await
}

/// Creates an object that must not exist yet; `AlreadyExists` when it does.
async fn create(store: &dyn ObjectStore, path: &Path, bytes: Vec<u8>) -> object_store::Result<()> {
    let options = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    store
        .put_opts(path, PutPayload::from(bytes), options)
        .await
        .map(|_| ())
}

fn object(prefix: &Path, token: &str) -> Path {
    prefix
        .clone()
        .join("data-checkpoints")
        .join(format!("{token}.json"))
}

/// A token is a plain name: it becomes an object name.
fn check_token(token: &str) -> Result<()> {
    let plain = !token.is_empty()
        && token
            .chars()
            .all(|character| character.is_ascii_alphanumeric() || "-_.".contains(character));
    if plain {
        Ok(())
    } else {
        Err(AmError::InvalidRequest(format!(
            "data checkpoint token {token:?} is malformed; pass a token exactly as CommitDataCheckpoint returned it"
        )))
    }
}

/// Decodes a plan object of any format this build reads, or says what is wrong with it.
fn decode_plan(bytes: &[u8]) -> std::result::Result<JobPlan, String> {
    let (format, body) = match bytes.strip_prefix(PLAN_MAGIC.as_slice()) {
        None => (1, bytes),
        Some(rest) => {
            let (format, body) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| "is cut short in its header; remove the checkpoint location to plan the job afresh".to_owned())?;
            (u32::from_le_bytes(*format), body)
        }
    };
    let damaged = |error| {
        format!("is damaged: {error}; remove the checkpoint location to plan the job afresh")
    };
    match format {
        1 | 2 => {
            let plan: PlanWithoutBytes = postcard::from_bytes(body).map_err(damaged)?;
            Ok(JobPlan {
                files: plan.files,
                splits: plan.splits,
                versions: plan.versions,
                bytes: Vec::new(),
                identities: Vec::new(),
                left_out: Vec::new(),
            })
        }
        3 => {
            let plan: PlanWithoutIdentities = postcard::from_bytes(body).map_err(damaged)?;
            Ok(JobPlan {
                files: plan.files,
                splits: plan.splits,
                versions: plan.versions,
                bytes: plan.bytes,
                identities: Vec::new(),
                left_out: Vec::new(),
            })
        }
        4 => {
            let plan: PlanWithoutLeftOut = postcard::from_bytes(body).map_err(damaged)?;
            Ok(JobPlan {
                files: plan.files,
                splits: plan.splits,
                versions: plan.versions,
                bytes: plan.bytes,
                identities: plan.identities,
                left_out: Vec::new(),
            })
        }
        PLAN_FORMAT => postcard::from_bytes(body).map_err(damaged),
        _ => Err(format!(
            "has format {format}, this build reads formats 1 to {PLAN_FORMAT}: run the release of Sluice that wrote it, or remove the checkpoint location to plan the job afresh"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{LeftOutFile, PlannedBytes, PlannedFile, PlannedIdentity, PlannedSplit};

    fn plan_with_bytes() -> JobPlan {
        JobPlan {
            files: vec![PlannedFile {
                source: 0,
                uri: "file:///d/rows.csv".to_owned(),
                file_size: 100,
                partition_values: Vec::new(),
                delta: None,
            }],
            splits: vec![PlannedSplit {
                file: 0,
                first_row: 0,
                row_count: 4,
            }],
            versions: vec![None],
            bytes: vec![PlannedBytes {
                split: 0,
                bytes: sluice_formats::SplitBytes {
                    start: 6,
                    end: 100,
                    first_row: 0,
                    rows: 4,
                    crc32c: Some(0x1234_5678),
                },
            }],
            identities: vec![PlannedIdentity {
                file: 0,
                identity: sluice_formats::ObjectIdentity {
                    e_tag: Some("\"2a-5f3c1d0e8b2a1-64\"".to_owned()),
                    version: None,
                    modified_ns: Some(1_764_245_847_123_456_789),
                },
            }],
            left_out: Vec::new(),
        }
    }

    /// A plan object of format `format` whose encoded fields are `fields`.
    fn encoded(format: u32, fields: &[u8]) -> Vec<u8> {
        let mut object = PLAN_MAGIC.to_vec();
        object.extend_from_slice(&format.to_le_bytes());
        object.extend_from_slice(fields);
        object
    }

    #[tokio::test]
    async fn a_plan_keeps_its_identities_and_left_out_files_and_older_formats_read_without_them() {
        let directory = tempfile::tempdir().expect("tempdir");
        let uri = format!("file://{}", directory.path().display());
        let sut = CheckpointStore::at(&uri, &Default::default()).expect("store");
        let plan = JobPlan {
            left_out: vec![LeftOutFile {
                source: 0,
                uri: "file:///d/broken.csv".to_owned(),
                cause: "csv file file:///d/broken.csv: unequal lengths".to_owned(),
            }],
            ..plan_with_bytes()
        };
        sut.store_plan(plan.clone()).await.expect("stores");
        let stored = std::fs::read(directory.path().join(PLAN_OBJECT)).expect("the plan object");
        assert_eq!(&stored[..12], encoded(5, &[]).as_slice(), "format 5");
        let loaded = sut.load_plan().await.expect("loads").expect("a plan");
        assert_eq!(loaded, plan);
        assert!(loaded.identity_of(0).is_some(), "the file is pinned");

        let none_left_out = JobPlan {
            left_out: Vec::new(),
            ..plan
        };
        let fields = postcard::to_stdvec(&(
            &none_left_out.files,
            &none_left_out.splits,
            &none_left_out.versions,
            &none_left_out.bytes,
            &none_left_out.identities,
        ))
        .expect("encodes");
        assert_eq!(decode_plan(&encoded(4, &fields)), Ok(none_left_out.clone()));

        let unpinned = JobPlan {
            identities: Vec::new(),
            ..none_left_out
        };
        let fields = postcard::to_stdvec(&(
            &unpinned.files,
            &unpinned.splits,
            &unpinned.versions,
            &unpinned.bytes,
        ))
        .expect("encodes");
        let format_3 = encoded(3, &fields);
        assert_eq!(decode_plan(&format_3), Ok(unpinned.clone()));
        assert_eq!(
            decode_plan(&format_3).expect("decodes").identity_of(0),
            None,
            "a plan of format 3 pins no file"
        );
    }

    #[tokio::test]
    async fn a_plan_keeps_its_bytes_and_plans_of_older_formats_read_without_them() {
        let plan = plan_with_bytes();
        let without_bytes = JobPlan {
            bytes: Vec::new(),
            identities: Vec::new(),
            ..plan
        };
        let body = postcard::to_stdvec(&(
            &without_bytes.files,
            &without_bytes.splits,
            &without_bytes.versions,
        ))
        .expect("encodes");
        let format_2 = encoded(2, &body);
        assert_eq!(decode_plan(&format_2), Ok(without_bytes.clone()));
        assert_eq!(decode_plan(&body), Ok(without_bytes), "format 1: no header");
    }

    #[tokio::test]
    async fn a_deleted_checkpoint_is_gone_and_deleting_it_again_is_no_error() {
        let directory = tempfile::tempdir().expect("tempdir");
        let uri = format!("file://{}", directory.path().display());
        let master = crate::service::tests::one_file_master(
            "name: store\ndata: { sources: [{ uri: 'file:///d', format: parquet }] }\nroles: [{ name: w, command: [x] }]\n",
            10,
        );
        let position = master.table().position();
        for sut in [
            CheckpointStore::in_memory(),
            CheckpointStore::at(&uri, &Default::default()).expect("store"),
        ] {
            sut.put("store-step1-0000abcd", &position)
                .await
                .expect("put");
            assert_eq!(
                sut.get("store-step1-0000abcd").await.expect("get"),
                position
            );
            sut.delete("store-step1-0000abcd").await.expect("delete");
            sut.delete("store-step1-0000abcd")
                .await
                .expect("deleting again");
            let error = sut.get("store-step1-0000abcd").await.expect_err("gone");
            assert!(error.to_string().contains("checkpoint.keep"), "{error}");
        }
    }
}
