//! Sources by URI: `file://` and plain paths, `s3://`, `gs://` and `az://`, each through `object_store`.
//!
//! The locations themselves come from the `sluice-store` crate, which the application master's journal
//! and checkpoints use too; see there for the environment variables and storage option keys each store
//! reads. This module opens them with the formats layer's error type.

pub use sluice_store::{Location, LocationError, StorageOptions, is_glob};

use crate::error::Result;

/// Parses a source URI and builds its object store.
///
/// Plain paths (absolute or relative) are local files. `file://` URIs must be absolute.
///
/// # Errors
///
/// Returns [`crate::FormatError::SourceUri`] for an unknown scheme or a malformed URI, and
/// [`crate::FormatError::StorageOption`] for an option key the store does not know.
pub fn open_location(uri: &str, options: &StorageOptions) -> Result<Location> {
    Ok(sluice_store::open_location(uri, options)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FormatError;

    #[test]
    fn a_location_error_keeps_its_kind_and_message_as_a_format_error() {
        let error = open_location("ftp://host/x", &StorageOptions::new()).expect_err("ftp");
        assert!(
            matches!(&error, FormatError::SourceUri { uri, .. } if uri == "ftp://host/x"),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with("source ftp://host/x: unsupported scheme \"ftp\"")
        );
        let mut options = StorageOptions::new();
        options.insert("no_such_option".into(), "1".into());
        let error = open_location("s3://bucket/prefix", &options).expect_err("unknown key");
        assert!(
            matches!(&error, FormatError::StorageOption { key, .. } if key == "no_such_option"),
            "{error:?}"
        );
    }
}
