//! Reads pinned to the object a plan saw ([`ObjectIdentity`]): the options that make a store refuse
//! any other version of it, the checks of what a read found, and the error that names the file when
//! it changed.
//!
//! # Implementation
//! A split carries the identity its file was listed with when it was planned; a Delta table's file
//! carries the empty one, which holds it to its size in the table's log. Reads of an object store
//! (S3, GCS, Azure) send the entity tag as `If-Match` and the version, where there is one, on
//! every request, ranged or whole, footer and data alike; the store refuses a read of another
//! version with a precondition error, which becomes [`FormatError::FileChanged`]. What every read
//! through `object_store` got back (`GetResult::meta`) is checked too: its size and tag, so that a
//! store that ignored `If-Match` changes nothing. A local file read through `object_store` (the row
//! formats) is checked that way alone: its `meta` is the `fstat` of the file the read opened, and
//! its modification time is compared to the nanosecond, which tells more than a failed `If-Match`
//! would. Local files read through the IO engine (Parquet) compare the size and modification time
//! of the open file (`fstat`) with the plan when they are opened, before a byte is read; the
//! engine's own [`sluice_io::FileIdentity`] then holds the file to that version while it is read.
//! A read of a pinned file that fails for another cause asks the store for the object once, so that
//! a file that shrank under a range is named as changed rather than as a bad range.

use std::ops::Range;

use object_store::path::Path;
use object_store::{GetOptions, GetRange, GetResult, ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::error::{FormatError, Result};
use crate::plan::{ObjectIdentity, Split};

impl ObjectIdentity {
    /// The identity of an object as its store listed it; for a file of the local file system
    /// (`local`), with its modification time.
    pub(crate) fn listed(meta: &ObjectMeta, local: bool) -> Self {
        Self {
            e_tag: meta.e_tag.clone(),
            version: meta.version.clone(),
            modified_ns: local
                .then(|| meta.last_modified.timestamp_nanos_opt())
                .flatten(),
        }
    }
}

impl Split {
    /// The split's file as its reads must find it: as it was planned.
    pub(crate) fn planned(&self) -> Planned<'_> {
        Planned {
            uri: &self.uri,
            size: self.file_size,
            identity: self.identity.as_ref(),
        }
    }
}

/// An entity tag without the quotes around it: a listing gives some tags bare (Azure's), while
/// responses quote them.
pub(crate) fn bare(tag: &str) -> &str {
    tag.strip_prefix('"')
        .and_then(|inner| inner.strip_suffix('"'))
        .unwrap_or(tag)
}

/// A time in nanoseconds since the Unix epoch, as a reader of an error reads it.
fn time(nanoseconds: i64) -> String {
    chrono::DateTime::from_timestamp_nanos(nanoseconds)
        .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// One file as a read must find it: as it was planned.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned<'a> {
    /// The file's URI, for errors; a `file:` URI is a file of the local file system.
    pub uri: &'a str,
    /// Its size when it was planned.
    pub size: u64,
    /// What it was when planned; `None` when the plan did not pin it.
    pub identity: Option<&'a ObjectIdentity>,
}

impl Planned<'_> {
    fn changed(&self, what: String) -> FormatError {
        FormatError::FileChanged {
            uri: self.uri.to_string(),
            what,
        }
    }

    /// Whether the file is one of the local file system.
    fn local(&self) -> bool {
        self.uri.starts_with("file:")
    }

    /// The gap under which nearby ranges of the file are fetched in one request: that of
    /// `object_store`'s `get_ranges` on an object store, none for a local file, whose ranges are read
    /// apart as `object_store`'s local store reads them.
    pub(crate) fn coalesce_gap(&self) -> u64 {
        if self.local() {
            0
        } else {
            object_store::OBJECT_STORE_COALESCE_DEFAULT
        }
    }

    /// The options of a read of `range` (of the whole object with `None`) of the planned object:
    /// on an object store, `If-Match` with its entity tag, and its version.
    pub(crate) fn get_options(&self, range: Option<Range<u64>>) -> GetOptions {
        GetOptions {
            if_match: self
                .identity
                .filter(|_| !self.local())
                .and_then(|identity| identity.e_tag.as_deref())
                .map(|tag| format!("\"{}\"", bare(tag))),
            version: self.identity.and_then(|identity| identity.version.clone()),
            range: range.map(GetRange::Bounded),
            ..GetOptions::default()
        }
    }

    /// Checks what a read through `object_store` found of the object (`GetResult::meta`): its size,
    /// and when the plan pinned it, (a local file's) modification time and its entity tag.
    ///
    /// # Errors
    ///
    /// [`FormatError::FileChanged`] naming what differs, as planned and as found.
    pub(crate) fn check_meta(&self, found: &ObjectMeta) -> Result<()> {
        if found.size != self.size {
            return Err(self.changed(format!(
                "it has {} bytes, and had {} bytes when planned",
                found.size, self.size
            )));
        }
        let Some(identity) = self.identity else {
            return Ok(());
        };
        if let Some(planned) = identity.modified_ns {
            let now = found.last_modified.timestamp_nanos_opt();
            if now != Some(planned) {
                return Err(self.changed(format!(
                    "it was modified at {}, and at {} when planned",
                    now.map_or_else(|| found.last_modified.to_string(), time),
                    time(planned)
                )));
            }
        }
        if let (Some(planned), Some(now)) = (&identity.e_tag, &found.e_tag)
            && bare(planned) != bare(now)
        {
            return Err(self.changed(format!("its ETag is {now}, and was {planned} when planned")));
        }
        Ok(())
    }

    /// Checks a local file opened for reading, by the size and modification time of the open file
    /// (`fstat`), against the plan; nothing when the plan did not pin it.
    ///
    /// # Errors
    ///
    /// [`FormatError::FileChanged`] naming what differs, as planned and as found.
    pub(crate) fn check_open_file(&self, found: &sluice_io::FileIdentity) -> Result<()> {
        let Some(identity) = self.identity else {
            return Ok(());
        };
        if found.size() != self.size {
            return Err(self.changed(format!(
                "it has {} bytes, and had {} bytes when planned",
                found.size(),
                self.size
            )));
        }
        if let Some(planned) = identity.modified_ns {
            let now = found.modified_ns();
            if now != Some(planned) {
                return Err(self.changed(format!(
                    "it was modified at {}, and at {} when planned",
                    now.map_or_else(|| "a time beyond 2262".to_owned(), time),
                    time(planned)
                )));
            }
        }
        Ok(())
    }

    /// Starts a read of `range` (of the whole object with `None`) of the object at `path` in
    /// `store`, as planned: the store refuses another version of a pinned object, and what the read
    /// found is checked ([`Planned::check_meta`]).
    ///
    /// # Errors
    ///
    /// [`FormatError::FileChanged`] when the object is not as planned; the store's error otherwise.
    pub(crate) async fn get(
        &self,
        store: &dyn ObjectStore,
        path: &Path,
        range: Option<Range<u64>>,
    ) -> Result<GetResult> {
        match store.get_opts(path, self.get_options(range.clone())).await {
            Ok(result) => {
                self.check_meta(&result.meta)?;
                Ok(result)
            }
            Err(error) => {
                let context = match range {
                    Some(range) => {
                        format!(
                            "reading bytes {}..{} of {}",
                            range.start, range.end, self.uri
                        )
                    }
                    None => format!("reading {}", self.uri),
                };
                Err(self.failed(store, path, context, error).await)
            }
        }
    }

    /// The error of a failed read of the object at `path` in `store` while doing `context`. A store
    /// that refused the planned version (`If-Match` failed) means the file changed, and so does any
    /// other failure of a read of a pinned file that the store no longer has as planned (a range past
    /// the end of a file that shrank): the file's change is the cause to name.
    pub(crate) async fn failed(
        &self,
        store: &dyn ObjectStore,
        path: &Path,
        context: String,
        error: object_store::Error,
    ) -> FormatError {
        if let object_store::Error::Precondition { source, .. } = &error {
            let tag = self
                .identity
                .and_then(|identity| identity.e_tag.as_deref())
                .unwrap_or("*");
            tracing::debug!(uri = self.uri, %source, "read refused by If-Match");
            return self.changed(format!(
                "its ETag is no longer {tag}: the store refused to read it as planned (If-Match {tag})"
            ));
        }
        let found = match &error {
            object_store::Error::NotFound { .. } => None,
            _ if self.identity.is_some() => store.head(path).await.ok(),
            _ => None,
        };
        match found.map(|meta| self.check_meta(&meta)) {
            Some(Err(changed)) => changed,
            _ => FormatError::store(context, error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use object_store::path::Path;

    fn meta(size: u64, e_tag: &str, modified_ns: i64) -> ObjectMeta {
        ObjectMeta {
            location: Path::from("d/rows.arrow"),
            last_modified: DateTime::<Utc>::from_timestamp_nanos(modified_ns),
            size,
            e_tag: Some(e_tag.to_owned()),
            version: None,
        }
    }

    #[test]
    fn a_read_that_finds_the_listed_object_passes_and_any_change_names_the_file() {
        let listed = meta(100, "\"a\"", 1_700_000_000_123_456_789);
        let local = ObjectIdentity::listed(&listed, true);
        assert_eq!(local.modified_ns, Some(1_700_000_000_123_456_789));
        let remote = ObjectIdentity::listed(&listed, false);
        assert_eq!(remote.modified_ns, None, "a store's times are not kept");
        let sut = Planned {
            uri: "file:///d/rows.arrow",
            size: 100,
            identity: Some(&local),
        };
        assert!(sut.check_meta(&listed).is_ok());
        let options = sut.get_options(Some(3..9));
        assert_eq!(
            options.if_match, None,
            "a local file's read checks what it opened"
        );
        assert_eq!(
            sut.coalesce_gap(),
            0,
            "a local file's ranges are read apart"
        );
        assert_eq!(options.range, Some(GetRange::Bounded(3..9)));

        let cases = [
            (meta(101, "\"a\"", 1_700_000_000_123_456_789), "101 bytes"),
            (
                meta(100, "\"b\"", 1_700_000_000_123_456_789),
                "ETag is \"b\"",
            ),
            (
                meta(100, "\"a\"", 1_700_000_000_123_456_790),
                "2023-11-14T22:13:20.123456790Z",
            ),
        ];
        for (found, what) in cases {
            let error = sut.check_meta(&found).expect_err("a changed object");
            let message = error.to_string();
            assert!(
                matches!(error, FormatError::FileChanged { .. })
                    && message.starts_with("file:///d/rows.arrow: ")
                    && message.contains(what)
                    && message.contains("plan again"),
                "{message}"
            );
        }

        let unpinned = Planned {
            identity: None,
            ..sut
        };
        assert!(
            unpinned.check_meta(&meta(100, "\"b\"", 0)).is_ok(),
            "a file the plan did not pin is held to its size alone"
        );
        assert_eq!(unpinned.get_options(None).if_match, None);
    }

    #[tokio::test]
    async fn a_refused_precondition_is_a_changed_file_and_other_errors_stay_the_stores() {
        let identity = ObjectIdentity {
            e_tag: Some("\"a\"".to_owned()),
            version: None,
            modified_ns: None,
        };
        let sut = Planned {
            uri: "s3://bucket/rows.csv",
            size: 100,
            identity: Some(&identity),
        };
        assert_eq!(sut.get_options(None).if_match.as_deref(), Some("\"a\""));
        let listed_bare = ObjectIdentity {
            e_tag: Some("0x8D9953E36AF2607".to_owned()),
            ..identity.clone()
        };
        let azure = Planned {
            uri: "az://container/rows.csv",
            identity: Some(&listed_bare),
            ..sut
        };
        assert_eq!(
            azure.get_options(None).if_match.as_deref(),
            Some("\"0x8D9953E36AF2607\""),
            "a tag listed bare is sent quoted"
        );
        let mut got = ObjectMeta {
            location: object_store::path::Path::from("rows.csv"),
            last_modified: chrono::DateTime::<chrono::Utc>::from_timestamp_nanos(0),
            size: 100,
            e_tag: Some("\"0x8D9953E36AF2607\"".to_owned()),
            version: None,
        };
        assert!(
            azure.check_meta(&got).is_ok(),
            "a tag listed bare is the tag a read gets quoted"
        );
        got.e_tag = Some("\"0x8D9953E36AF2608\"".to_owned());
        assert!(azure.check_meta(&got).is_err());
        assert_eq!(
            sut.coalesce_gap(),
            object_store::OBJECT_STORE_COALESCE_DEFAULT
        );
        let refused = object_store::Error::Precondition {
            path: "rows.csv".to_owned(),
            source: "412 Precondition Failed".into(),
        };
        let store = object_store::memory::InMemory::new();
        let path = Path::from("rows.csv");
        let message = sut
            .failed(&store, &path, "reading".to_owned(), refused)
            .await
            .to_string();
        assert!(
            message.starts_with("s3://bucket/rows.csv: its ETag is no longer \"a\": the store refused to read it as planned (If-Match \"a\")"),
            "{message}"
        );
        let missing = object_store::Error::NotFound {
            path: "rows.csv".to_owned(),
            source: "gone".into(),
        };
        assert!(matches!(
            sut.failed(&store, &path, "reading".to_owned(), missing)
                .await,
            FormatError::ObjectStore { .. }
        ));

        // A range past the end of an object that shrank, pinned by its size alone (a Delta table's
        // file): the change is the cause, not the range.
        store
            .put(&path, object_store::PutPayload::from_static(b"shorter"))
            .await
            .expect("put");
        let sized = ObjectIdentity::default();
        let error = Planned {
            identity: Some(&sized),
            ..sut
        }
        .get(&store, &path, Some(50..60))
        .await
        .expect_err("past the end");
        let message = error.to_string();
        assert!(
            matches!(error, FormatError::FileChanged { .. })
                && message.contains("it has 7 bytes, and had 100 bytes when planned"),
            "{message}"
        );
    }
}
