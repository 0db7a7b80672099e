//! Object-store locations by URI: `file://` and plain paths, `s3://`, `gs://` and `az://`, each through
//! `object_store`.
//!
//! The formats layer opens its sources here, and the application master its journal and data checkpoints:
//! both sit above this crate, and neither reaches into the other for storage.
//!
//! Cloud stores are built from the environment first (`AmazonS3Builder::from_env()` reads `AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` and the rest; likewise
//! `GOOGLE_*` and `AZURE_*`), then the per-source storage options override them. Option keys are the ones
//! `object_store` accepts for that store, e.g. `aws_endpoint`, `aws_region`, `aws_allow_http`,
//! `aws_virtual_hosted_style_request`, `google_service_account`, `azure_storage_account_name`.

#![forbid(unsafe_code)]

pub mod am_address;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

/// The result type of opening a location.
pub type Result<T, E = LocationError> = std::result::Result<T, E>;

/// Why a location could not be opened. Each message names the URI and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    /// The URI could not be parsed or names an unsupported scheme.
    #[error("source {uri}: {reason}")]
    SourceUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it and how to fix it.
        reason: String,
    },
    /// A storage option key or value was rejected by the object store builder.
    #[error("source {uri}: storage option {key}: {reason}")]
    StorageOption {
        /// The URI whose store was being built.
        uri: String,
        /// The option key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },
}

/// Per-source settings for the object store, overriding the environment: key → value.
pub type StorageOptions = BTreeMap<String, String>;

/// A parsed source location: the store that holds it and the path of the object or prefix in that store.
#[derive(Debug, Clone)]
pub struct Location {
    /// The store (a bucket, a container, or the local file system rooted at `/`).
    pub store: Arc<dyn ObjectStore>,
    /// The URI of the store's root, ending in `/` (`file:///`, `s3://bucket/`).
    pub root: Url,
    /// The path inside the store, up to the first glob character.
    pub path: Path,
    /// The glob pattern over whole store paths when the URI contains `*`, `?` or `[`.
    pub glob: Option<glob::Pattern>,
    /// The URI as given.
    pub uri: String,
}

impl Location {
    /// Returns the URI of `path` in this location's store.
    pub fn uri_of(&self, path: &Path) -> String {
        format!("{}{}", self.root, path)
    }

    /// Returns the table URL of this location's path with a trailing slash (for table formats).
    pub fn directory_url(&self) -> Result<Url> {
        let text = format!("{}{}/", self.root, self.path);
        Url::parse(&text).map_err(|error| LocationError::SourceUri {
            uri: self.uri.clone(),
            reason: error.to_string(),
        })
    }
}

fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// Splits `text` into the part before the first path segment holding a glob character, and the rest.
fn split_glob(text: &str) -> (&str, Option<&str>) {
    match text.find(['*', '?', '[']) {
        None => (text, None),
        Some(first) => {
            let cut = text[..first].rfind('/').map_or(0, |slash| slash + 1);
            (&text[..cut], Some(&text[cut..]))
        }
    }
}

/// Whether `uri` names local files, as [`open_location`] reads it: a plain path, or a `file://`
/// URI (its scheme in any case).
pub fn is_local(uri: &str) -> bool {
    !uri.contains("://")
        || uri
            .get(.."file://".len())
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("file://"))
}

/// Parses a source URI and builds its object store.
///
/// Plain paths (absolute or relative) are local files. `file://` URIs must be absolute.
///
/// # Errors
///
/// Returns [`LocationError::SourceUri`] for an unknown scheme or a malformed URI, and
/// [`LocationError::StorageOption`] for an option key the store does not know.
pub fn open_location(uri: &str, options: &StorageOptions) -> Result<Location> {
    let uri_error = |reason: String| LocationError::SourceUri {
        uri: uri.to_string(),
        reason,
    };
    if !uri.contains("://") {
        let absolute = std::path::absolute(uri).map_err(|error| uri_error(error.to_string()))?;
        let text = absolute.to_string_lossy().into_owned();
        let (prefix, pattern) = split_glob(&text);
        let prefix_path = Path::from_filesystem_path(if prefix.is_empty() { "/" } else { prefix })
            .or_else(|_| {
                // `from_filesystem_path` canonicalizes, which fails when the path does not exist yet (for writers).
                Path::parse(prefix.trim_start_matches('/'))
                    .map_err(|error| uri_error(error.to_string()))
            })?;
        return local_location(uri, prefix_path, pattern);
    }
    let (without_glob, pattern) = split_glob(uri);
    let url = Url::parse(if pattern.is_some() { without_glob } else { uri }).map_err(|error| {
        uri_error(format!(
            "not a valid URI ({error}); write scheme://bucket/path or a plain path"
        ))
    })?;
    let path = Path::from_url_path(url.path()).map_err(|error| uri_error(error.to_string()))?;
    match url.scheme() {
        "file" => {
            if !options.is_empty() {
                tracing::debug!(uri, "storage options are ignored for local files");
            }
            local_location(uri, path, pattern.map(|rest| rest.trim_start_matches('/')))
        }
        "s3" | "s3a" => {
            let mut builder = AmazonS3Builder::from_env().with_url(url.as_str());
            for (key, value) in options {
                let config_key = AmazonS3ConfigKey::from_str(key)
                    .map_err(|error| option_error(uri, key, &error))?;
                builder = builder.with_config(config_key, value);
            }
            let store = builder
                .build()
                .map_err(|error| uri_error(format!("building the S3 client: {error}")))?;
            cloud_location(uri, &url, Arc::new(store), path, pattern)
        }
        "gs" => {
            let mut builder = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (key, value) in options {
                let config_key = GoogleConfigKey::from_str(key)
                    .map_err(|error| option_error(uri, key, &error))?;
                builder = builder.with_config(config_key, value);
            }
            let store = builder
                .build()
                .map_err(|error| uri_error(format!("building the GCS client: {error}")))?;
            cloud_location(uri, &url, Arc::new(store), path, pattern)
        }
        "az" | "abfs" | "abfss" | "azure" => {
            let mut builder = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (key, value) in options {
                let config_key = AzureConfigKey::from_str(key)
                    .map_err(|error| option_error(uri, key, &error))?;
                builder = builder.with_config(config_key, value);
            }
            let store = builder
                .build()
                .map_err(|error| uri_error(format!("building the Azure client: {error}")))?;
            cloud_location(uri, &url, Arc::new(store), path, pattern)
        }
        other => Err(uri_error(format!(
            "unsupported scheme {other:?}; use file://, s3://, gs://, az:// or a plain path"
        ))),
    }
}

fn option_error(uri: &str, key: &str, error: &object_store::Error) -> LocationError {
    LocationError::StorageOption {
        uri: uri.to_string(),
        key: key.to_string(),
        reason: format!("{error}; see the object_store configuration keys"),
    }
}

fn compile_glob(uri: &str, full_pattern: &str) -> Result<glob::Pattern> {
    glob::Pattern::new(full_pattern).map_err(|error| LocationError::SourceUri {
        uri: uri.to_string(),
        reason: format!("invalid glob at byte {}: {}", error.pos, error.msg),
    })
}

/// Compiles the glob part of a URI, anchored under the path that precedes it.
fn glob_under(uri: &str, path: &Path, pattern: Option<&str>) -> Result<Option<glob::Pattern>> {
    pattern
        .map(|rest| {
            let prefix = path.as_ref();
            let full = if prefix.is_empty() {
                rest.to_string()
            } else {
                format!("{prefix}/{rest}")
            };
            compile_glob(uri, &full)
        })
        .transpose()
}

fn local_location(uri: &str, path: Path, pattern: Option<&str>) -> Result<Location> {
    let glob = glob_under(uri, &path, pattern)?;
    let root = Url::parse("file:///").map_err(|error| LocationError::SourceUri {
        uri: uri.to_string(),
        reason: error.to_string(),
    })?;
    Ok(Location {
        store: Arc::new(LocalFileSystem::new()),
        root,
        path,
        glob,
        uri: uri.to_string(),
    })
}

fn cloud_location(
    uri: &str,
    url: &Url,
    store: Arc<dyn ObjectStore>,
    path: Path,
    pattern: Option<&str>,
) -> Result<Location> {
    let host = url.host_str().ok_or_else(|| LocationError::SourceUri {
        uri: uri.to_string(),
        reason: "no bucket or container in the URI; write scheme://bucket/path".to_string(),
    })?;
    let root = Url::parse(&format!("{}://{host}/", url.scheme())).map_err(|error| {
        LocationError::SourceUri {
            uri: uri.to_string(),
            reason: error.to_string(),
        }
    })?;
    let glob = glob_under(uri, &path, pattern)?;
    Ok(Location {
        store,
        root,
        path,
        glob,
        uri: uri.to_string(),
    })
}

/// Returns whether a URI holds glob characters.
pub fn is_glob(uri: &str) -> bool {
    has_glob(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_local_agrees_with_the_store_open_location_builds() {
        for uri in [
            "/data/train/part-0.parquet",
            "relative/part-0.parquet",
            "file:///data/train",
            "FILE:///data/train",
            "s3://bucket/train",
            "gs://bucket/train",
            "az://container/train",
        ] {
            // Azure's client is built only with an account.
            let options = if uri.starts_with("az://") {
                StorageOptions::from([("azure_storage_account_name".into(), "account".into())])
            } else {
                StorageOptions::new()
            };
            let location = open_location(uri, &options).expect(uri);
            assert_eq!(
                is_local(uri),
                location.root.scheme() == "file",
                "{uri}: is_local says one thing, open_location built {}",
                location.root
            );
        }
    }

    #[test]
    fn plain_paths_and_file_uris_are_local() {
        let sut = open_location("/tmp/some dir/x.parquet", &StorageOptions::new()).expect("local");
        assert_eq!(sut.root.as_str(), "file:///");
        assert_eq!(sut.path.as_ref(), "tmp/some dir/x.parquet");
        assert_eq!(sut.uri_of(&sut.path), "file:///tmp/some dir/x.parquet");
        let from_uri = open_location("file:///tmp/some%20dir/x.parquet", &StorageOptions::new())
            .expect("file uri");
        assert_eq!(from_uri.path, sut.path);
    }

    #[test]
    fn globs_split_at_the_first_wild_segment() {
        let sut = open_location("file:///data/year=*/part-?.parquet", &StorageOptions::new())
            .expect("glob");
        assert_eq!(sut.path.as_ref(), "data");
        let pattern = sut.glob.expect("has glob");
        assert!(pattern.matches("data/year=2024/part-1.parquet"));
        assert!(!pattern.matches("data/year=2024/part-10.parquet"));
    }

    #[test]
    fn s3_uri_with_options() {
        let mut options = StorageOptions::new();
        options.insert("aws_endpoint".into(), "http://127.0.0.1:9".into());
        options.insert("aws_allow_http".into(), "true".into());
        options.insert("aws_region".into(), "us-east-1".into());
        let sut = open_location("s3://bucket/prefix/data", &options).expect("s3");
        assert_eq!(sut.root.as_str(), "s3://bucket/");
        assert_eq!(sut.path.as_ref(), "prefix/data");
        options.insert("no_such_option".into(), "1".into());
        let error = open_location("s3://bucket/prefix", &options).expect_err("unknown key");
        assert!(error.to_string().contains("no_such_option"), "{error}");
    }

    #[test]
    fn unknown_scheme_is_an_error_naming_it() {
        let error = open_location("ftp://host/x", &StorageOptions::new()).expect_err("ftp");
        assert!(error.to_string().contains("\"ftp\""), "{error}");
    }
}
