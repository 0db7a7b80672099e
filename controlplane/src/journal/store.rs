//! Where the journal's objects live: a local directory (plain files, appended in place) or an
//! object-store prefix (one object per write), behind one set of primitives.
//!
//! Objects are named by paths relative to the journal's root: `identity.json`,
//! `journal/<first sequence>.log`, `snapshot/<sequence>.snap` and, for local directories only,
//! `writers/<generation>`.

use std::fs::File;
use std::io::Write;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use sluice_store::StorageOptions;

use super::error::{JournalError, Result};
use crate::error::is_descriptor_shortage;

/// The folder of segments.
pub(super) const JOURNAL_DIR: &str = "journal";
/// The folder of snapshots.
pub(super) const SNAPSHOT_DIR: &str = "snapshot";
/// The folder of writer generations (local directories only).
pub(super) const WRITERS_DIR: &str = "writers";
/// The folder of the objects that check a store honours create-if-absent (object stores only).
const PROBES_DIR: &str = "probes";
/// The object that holds the journal's identity.
pub(super) const IDENTITY_OBJECT: &str = "identity.json";
/// The prefix of files being written before they are linked into place (local directories only).
const TEMPORARY_PREFIX: &str = ".tmp-";

/// How long a file operation of a local journal waits before it tries again while the process has
/// no file descriptor left.
pub(super) const SHORTAGE_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// Every how many tries in a row the log says again that the journal waits for a descriptor: about
/// every five seconds.
pub(super) const SHORTAGE_TRIES_PER_WARNING: u64 = 50;

/// Runs `operation`, which opens a descriptor, until it opens one: while the process has none left
/// (`EMFILE`, `ENFILE`), it waits and tries again, saying so in the log. A shortage of descriptors
/// says nothing of the journal, and passes once other files and connections are closed; failing the
/// write on it would make an AM whose journal is sound step down. Any other error is returned.
///
/// It blocks the calling thread: journal file operations run on blocking threads.
pub(super) fn through_descriptor_shortage<T>(
    object: &str,
    operation: &'static str,
    mut attempt: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let mut tries: u64 = 0;
    loop {
        match attempt() {
            Err(error) if is_descriptor_shortage(&error) => {
                if tries.is_multiple_of(SHORTAGE_TRIES_PER_WARNING) {
                    tracing::warn!(
                        object,
                        operation,
                        %error,
                        tries,
                        "the journal waits for a file descriptor and tries again; close idle connections to the AM or raise its limit of open files (ulimit -n)"
                    );
                }
                tries += 1;
                std::thread::sleep(SHORTAGE_RETRY_INTERVAL);
            }
            outcome => return outcome,
        }
    }
}

/// The name of the segment whose first record is `first`.
pub(super) fn segment_name(first: u64) -> String {
    format!("{JOURNAL_DIR}/{first:020}.log")
}

/// The name of the snapshot that covers every record before `sequence`.
pub(super) fn snapshot_name(sequence: u64) -> String {
    format!("{SNAPSHOT_DIR}/{sequence:020}.snap")
}

/// Parses a file name of the form `<20 digits><extension>`.
pub(super) fn parse_numbered(file_name: &str, extension: &str) -> Option<u64> {
    let digits = file_name.strip_suffix(extension)?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The body of the record a writer puts first when it opens the journal, and of its generation
/// file on local directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OpenRecord {
    /// The writer's own description (from the config).
    pub writer: String,
    /// Its process id.
    pub pid: u32,
    /// When it opened the journal, in milliseconds since the Unix epoch.
    pub opened_unix_ms: u64,
    /// Its generation on local directories.
    pub generation: Option<u64>,
}

impl OpenRecord {
    /// Describes the writer for error messages.
    pub fn describe(&self) -> String {
        match self.generation {
            Some(generation) => format!(
                "{}, pid {}, generation {generation}, opened at unix ms {}",
                self.writer, self.pid, self.opened_unix_ms
            ),
            None => format!(
                "{}, pid {}, opened at unix ms {}",
                self.writer, self.pid, self.opened_unix_ms
            ),
        }
    }
}

/// What an exclusive create found.
#[derive(Debug)]
pub(super) enum Created<T> {
    /// The object is new and holds the content given.
    Created(T),
    /// An object of that name was already there; nothing was written.
    Exists,
}

/// A journal's storage.
#[derive(Debug, Clone)]
pub(super) enum Store {
    Local(Arc<LocalStore>),
    Object(Arc<ObjectPrefix>),
}

impl Store {
    /// Builds the store a journal URI names.
    pub fn open(uri: &str, options: &StorageOptions) -> Result<Store> {
        let location =
            sluice_store::open_location(uri, options).map_err(|source| JournalError::Location {
                uri: uri.to_string(),
                source: Arc::new(source),
            })?;
        if location.glob.is_some() {
            return Err(JournalError::Unsupported {
                uri: uri.to_string(),
                reason: "a journal URI names one prefix, it cannot hold *, ? or [".to_string(),
            });
        }
        let uri = uri.trim_end_matches('/').to_string();
        if location.root.scheme() == "file" {
            let root = PathBuf::from("/").join(location.path.as_ref());
            return Ok(Store::Local(Arc::new(LocalStore { root, uri })));
        }
        Ok(Store::Object(Arc::new(ObjectPrefix {
            store: location.store,
            prefix: location.path,
            uri,
        })))
    }

    /// The journal's URI.
    pub fn uri(&self) -> &str {
        match self {
            Store::Local(local) => &local.uri,
            Store::Object(object) => &object.uri,
        }
    }

    /// The URI of one object, for messages.
    pub fn object_uri(&self, name: &str) -> String {
        format!("{}/{name}", self.uri())
    }

    /// Whether a write can be cut short by a crash (appends to local files can; an object-store put
    /// is all or nothing).
    pub fn tears_possible(&self) -> bool {
        matches!(self, Store::Local(_))
    }

    /// Lists the file names in one folder (without the folder).
    pub async fn list(&self, folder: &'static str) -> Result<Vec<String>> {
        match self {
            Store::Local(local) => {
                let local = Arc::clone(local);
                blocking(self.uri(), move || local.list(folder)).await
            }
            Store::Object(object) => object.list(folder).await,
        }
    }

    /// Reads a whole object; `None` when it does not exist.
    pub async fn read(&self, name: &str) -> Result<Option<Bytes>> {
        match self {
            Store::Local(local) => {
                let local = Arc::clone(local);
                let name = name.to_string();
                blocking(self.uri(), move || local.read(&name)).await
            }
            Store::Object(object) => object.read(name).await,
        }
    }

    /// Creates an object holding `content` unless one of that name exists; the content is durable
    /// when this returns `Created`.
    pub async fn create(&self, name: &str, content: Bytes) -> Result<Created<()>> {
        match self {
            Store::Local(local) => {
                let local = Arc::clone(local);
                let name = name.to_string();
                let created = blocking(self.uri(), move || local.create(&name, &content)).await?;
                Ok(match created {
                    Created::Created(_) => Created::Created(()),
                    Created::Exists => Created::Exists,
                })
            }
            Store::Object(object) => object.create(name, content).await,
        }
    }

    /// Replaces an object's content, for tests that damage a journal.
    #[cfg(test)]
    pub async fn overwrite(&self, name: &str, content: Vec<u8>) {
        match self {
            Store::Local(local) => std::fs::write(local.path(name), content).expect("overwrite"),
            Store::Object(object) => {
                object
                    .store
                    .put(&object.path(name), PutPayload::from(content))
                    .await
                    .expect("overwrite");
            }
        }
    }

    /// Deletes objects; one that is already gone is no error.
    pub async fn delete(&self, names: Vec<String>) -> Result<()> {
        match self {
            Store::Local(local) => {
                let local = Arc::clone(local);
                blocking(self.uri(), move || local.delete(&names)).await
            }
            Store::Object(object) => object.delete(names).await,
        }
    }
}

/// Runs blocking file IO off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    uri: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => Err(JournalError::WriterStopped {
            uri: uri.to_string(),
        }),
    }
}

/// A journal in a local directory. Segments are appended in place with `write` and `fdatasync`;
/// files are created whole through a temporary file, `fdatasync`, and `link` (which fails when the
/// name exists), so a visible name always holds complete content.
#[derive(Debug)]
pub(super) struct LocalStore {
    root: PathBuf,
    uri: String,
}

/// Makes temporary names unique within the process.
static TEMPORARY_COUNTER: AtomicU64 = AtomicU64::new(0);

impl LocalStore {
    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn io_error(&self, name: &str, operation: &'static str, error: std::io::Error) -> JournalError {
        JournalError::io(&format!("{}/{name}", self.uri), operation, error)
    }

    /// Creates the journal's folders.
    pub fn create_folders(&self) -> Result<()> {
        for folder in [JOURNAL_DIR, SNAPSHOT_DIR, WRITERS_DIR] {
            std::fs::create_dir_all(self.path(folder))
                .map_err(|error| self.io_error(folder, "creating the folder", error))?;
        }
        sync_directory(&self.root).map_err(|error| self.io_error("", "syncing the folder", error))
    }

    /// Removes temporary files that a writer left behind when it stopped mid-create.
    pub fn remove_temporaries(&self) -> Result<()> {
        for folder in [JOURNAL_DIR, SNAPSHOT_DIR] {
            for name in self.list_all(folder)? {
                if name.starts_with(TEMPORARY_PREFIX) {
                    let relative = format!("{folder}/{name}");
                    match std::fs::remove_file(self.path(&relative)) {
                        Ok(()) => {
                            tracing::debug!(file = %relative, "removed a leftover temporary file")
                        }
                        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                        Err(error) => {
                            return Err(self.io_error(
                                &relative,
                                "removing a temporary file",
                                error,
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn list_all(&self, folder: &str) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(self.path(folder)) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(self.io_error(folder, "listing", error)),
        };
        entries
            .map(|entry| {
                entry
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .map_err(|error| self.io_error(folder, "listing", error))
            })
            .collect()
    }

    fn list(&self, folder: &str) -> Result<Vec<String>> {
        let mut names = self.list_all(folder)?;
        names.retain(|name| !name.starts_with(TEMPORARY_PREFIX));
        Ok(names)
    }

    fn read(&self, name: &str) -> Result<Option<Bytes>> {
        match std::fs::read(self.path(name)) {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.io_error(name, "reading", error)),
        }
    }

    /// Creates `name` holding `content` unless it exists, and returns the file, positioned at its
    /// end, for appending.
    pub fn create(&self, name: &str, content: &[u8]) -> Result<Created<File>> {
        let target = self.path(name);
        let folder = target
            .parent()
            .expect("objects live in a folder")
            .to_path_buf();
        let temporary = folder.join(format!(
            "{TEMPORARY_PREFIX}{}-{}",
            std::process::id(),
            TEMPORARY_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<File> {
            let mut file = through_descriptor_shortage(&self.uri, "creating a file", || {
                File::options()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&temporary)
            })?;
            file.write_all(content)?;
            file.sync_data()?;
            Ok(file)
        };
        let file = write().map_err(|error| {
            // Best effort: a leftover is removed by the next open anyway.
            let _ = std::fs::remove_file(&temporary);
            self.io_error(name, "writing a new file", error)
        })?;
        let linked = std::fs::hard_link(&temporary, &target);
        std::fs::remove_file(&temporary)
            .map_err(|error| self.io_error(name, "removing the temporary file", error))?;
        match linked {
            Ok(()) => {
                sync_directory(&folder)
                    .map_err(|error| self.io_error(name, "syncing the folder", error))?;
                Ok(Created::Created(file))
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(Created::Exists),
            Err(error) => Err(self.io_error(name, "linking a new file into place", error)),
        }
    }

    fn delete(&self, names: &[String]) -> Result<()> {
        for name in names {
            match std::fs::remove_file(self.path(name)) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(self.io_error(name, "deleting", error)),
            }
        }
        Ok(())
    }

    /// Takes the next writer generation by creating its file exclusively, and returns it.
    pub fn take_generation(&self, record: &OpenRecord) -> Result<u64> {
        let latest = self
            .list(WRITERS_DIR)?
            .iter()
            .filter_map(|name| parse_numbered(name, ""))
            .max()
            .unwrap_or(0);
        let mut generation = latest.checked_add(1).ok_or_else(|| JournalError::Corrupt {
            object: format!("{}/{WRITERS_DIR}/{latest:020}", self.uri),
            offset: 0,
            reason: "its name is the largest generation there is, so no writer can come after it: no Sluice AM wrote it; move it out of the journal".into(),
        })?;
        loop {
            let name = format!("{WRITERS_DIR}/{generation:020}");
            let opened = File::options()
                .write(true)
                .create_new(true)
                .open(self.path(&name));
            match opened {
                Ok(mut file) => {
                    let record = OpenRecord {
                        generation: Some(generation),
                        ..record.clone()
                    };
                    let body = postcard::to_stdvec(&record).expect("an open record encodes");
                    file.write_all(&body)
                        .and_then(|()| file.sync_data())
                        .and_then(|()| sync_directory(&self.path(WRITERS_DIR)))
                        .map_err(|error| self.io_error(&name, "writing the generation", error))?;
                    return Ok(generation);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    generation += 1;
                }
                Err(error) => return Err(self.io_error(&name, "creating the generation", error)),
            }
        }
    }

    /// Returns who took the generation after `generation`, if anyone has: then the writer of
    /// `generation` is fenced.
    pub fn fenced_by(&self, generation: u64) -> Result<Option<String>> {
        let name = format!("{WRITERS_DIR}/{:020}", generation + 1);
        let path = self.path(&name);
        let read = through_descriptor_shortage(&self.uri, "checking for a newer writer", || {
            std::fs::read(&path)
        });
        match read {
            Ok(body) => Ok(Some(match postcard::from_bytes::<OpenRecord>(&body) {
                Ok(record) => record.describe(),
                Err(_) => format!("generation {}", generation + 1),
            })),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(self.io_error(&name, "checking for a newer writer", error)),
        }
    }
}

/// Makes a folder's entries (new, linked or renamed files) durable.
fn sync_directory(folder: &FsPath) -> std::io::Result<()> {
    let uri = folder.display().to_string();
    through_descriptor_shortage(&uri, "syncing the folder", || File::open(folder))?.sync_all()
}

/// A journal under an object-store prefix. Every write is a new object created with
/// `PutMode::Create`, so two writers can never both write the same name.
#[derive(Debug)]
pub(super) struct ObjectPrefix {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    uri: String,
}

impl ObjectPrefix {
    /// A journal over any `object_store` (tests use the in-memory store).
    #[cfg(test)]
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, uri: &str) -> ObjectPrefix {
        ObjectPrefix {
            store,
            prefix: Path::from(prefix),
            uri: uri.to_string(),
        }
    }

    fn path(&self, name: &str) -> Path {
        name.split('/')
            .fold(self.prefix.clone(), |path, part| path.join(part))
    }

    fn error(
        &self,
        name: &str,
        operation: &'static str,
        error: object_store::Error,
    ) -> JournalError {
        JournalError::store(&format!("{}/{name}", self.uri), operation, error)
    }

    async fn list(&self, folder: &str) -> Result<Vec<String>> {
        let folder_path = self.path(folder);
        let depth = folder_path.parts_count() + 1;
        let objects: Vec<_> = self
            .store
            .list(Some(&folder_path))
            .try_collect()
            .await
            .map_err(|error| self.error(folder, "listing", error))?;
        Ok(objects
            .into_iter()
            .filter(|object| object.location.parts_count() == depth)
            .filter_map(|object| object.location.filename().map(str::to_string))
            .collect())
    }

    async fn read(&self, name: &str) -> Result<Option<Bytes>> {
        let result = match self.store.get(&self.path(name)).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(error) => return Err(self.error(name, "reading", error)),
        };
        match result.bytes().await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(self.error(name, "reading", error)),
        }
    }

    async fn create(&self, name: &str, content: Bytes) -> Result<Created<()>> {
        let outcome = self
            .store
            .put_opts(
                &self.path(name),
                PutPayload::from(content),
                PutOptions::from(PutMode::Create),
            )
            .await;
        match outcome {
            Ok(_) => Ok(Created::Created(())),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists),
            Err(error) => Err(self.error(name, "writing with create-if-absent", error)),
        }
    }

    /// Checks that the store refuses to create an object that exists, which fencing a journal's
    /// writers relies on: a store that overwrites instead would let two AMs write one journal.
    pub async fn check_create_if_absent(&self) -> Result<()> {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let name = format!(
            "{PROBES_DIR}/{}-{}",
            std::process::id(),
            since_epoch.as_nanos()
        );
        let first = self.create(&name, Bytes::from_static(b"1")).await;
        let second = match &first {
            Ok(Created::Created(())) => Some(self.create(&name, Bytes::from_static(b"2")).await),
            _ => None,
        };
        if let Err(error) = self.delete(vec![name.clone()]).await {
            tracing::debug!(object = format!("{}/{name}", self.uri), %error, "removing the create-if-absent probe failed");
        }
        match (first?, second.transpose()?) {
            (Created::Created(()), Some(Created::Exists)) => Ok(()),
            _ => Err(JournalError::Unsupported {
                uri: self.uri.clone(),
                reason: format!(
                    "the object store wrote {name} twice although both writes asked to create it only if absent (`If-None-Match: *`); fencing an AM that lost its journal relies on that refusal, so two AMs could write this journal: use a store that honours conditional writes (AWS S3, GCS, Azure, MinIO, SeaweedFS) or a local directory"
                ),
            }),
        }
    }

    async fn delete(&self, names: Vec<String>) -> Result<()> {
        let paths: Vec<_> = names.iter().map(|name| Ok(self.path(name))).collect();
        let mut results = self
            .store
            .delete_stream(futures::stream::iter(paths).boxed());
        while let Some(result) = results.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(error) => return Err(self.error(JOURNAL_DIR, "deleting", error)),
            }
        }
        Ok(())
    }
}
