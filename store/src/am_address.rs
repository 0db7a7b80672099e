//! Where a job's AM says it serves: one small object, `am-address`, under the job's checkpoint
//! location, holding the address daemons reach it at (`host:port` or `https://host:port`). An AM
//! writes it once it has the journal; a daemon whose AM stops answering reads it, so that it finds
//! an AM started again on another host with the same checkpoint location.

use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};

use crate::{LocationError, StorageOptions, open_location};

/// The object's name under the checkpoint location.
pub const OBJECT: &str = "am-address";

/// The longest address read back: anything longer is not an address this module wrote.
const MAX_LEN: usize = 1024;

/// Why the address could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum AmAddressError {
    /// The checkpoint location could not be opened.
    #[error("{0}")]
    Location(#[from] LocationError),
    /// The store refused the write or the read.
    #[error("the AM's address under {uri}: {source}")]
    Store {
        /// The checkpoint location.
        uri: String,
        /// What the store said.
        source: object_store::Error,
    },
    /// The object holds no address.
    #[error(
        "the AM's address under {uri} is damaged ({reason}); start the AM again to write it anew"
    )]
    Damaged {
        /// The checkpoint location.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn object(
    uri: &str,
) -> Result<(std::sync::Arc<dyn object_store::ObjectStore>, Path), LocationError> {
    let location = open_location(uri, &StorageOptions::default())?;
    Ok((location.store, location.path.clone().join(OBJECT)))
}

/// Writes `address` as the address of the AM of the job whose checkpoint location is `uri`.
pub async fn publish(uri: &str, address: &str) -> Result<(), AmAddressError> {
    let (store, path) = object(uri)?;
    store
        .put(&path, PutPayload::from(format!("{address}\n").into_bytes()))
        .await
        .map(drop)
        .map_err(|source| AmAddressError::Store {
            uri: uri.to_owned(),
            source,
        })
}

/// The address the AM of the job whose checkpoint location is `uri` last wrote; `None` when no AM
/// wrote one.
pub async fn read(uri: &str) -> Result<Option<String>, AmAddressError> {
    let (store, path) = object(uri)?;
    let store_error = |source| AmAddressError::Store {
        uri: uri.to_owned(),
        source,
    };
    let bytes = match store.get(&path).await {
        Ok(found) => found.bytes().await.map_err(store_error)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(source) => return Err(store_error(source)),
    };
    let damaged = |reason: &str| AmAddressError::Damaged {
        uri: uri.to_owned(),
        reason: reason.to_owned(),
    };
    if bytes.len() > MAX_LEN {
        return Err(damaged("longer than any address"));
    }
    let text = std::str::from_utf8(&bytes).map_err(|_| damaged("not UTF-8"))?;
    let address = text.trim();
    if address.is_empty() || address.chars().any(char::is_whitespace) {
        return Err(damaged("not one address"));
    }
    Ok(Some(address.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn an_address_written_is_read_back_and_a_missing_one_is_none() {
        let directory = tempfile::tempdir().expect("tempdir");
        let uri = format!("file://{}/ckpt", directory.path().display());
        runtime().block_on(async {
            assert_eq!(read(&uri).await.expect("read"), None);
            publish(&uri, "am-1:7070").await.expect("publish");
            assert_eq!(
                read(&uri).await.expect("read").as_deref(),
                Some("am-1:7070")
            );
            publish(&uri, "https://am-2:7070")
                .await
                .expect("publish again");
            assert_eq!(
                read(&uri).await.expect("read").as_deref(),
                Some("https://am-2:7070")
            );
        });
    }

    #[test]
    fn a_damaged_address_is_named() {
        let directory = tempfile::tempdir().expect("tempdir");
        let ckpt = directory.path().join("ckpt");
        std::fs::create_dir_all(&ckpt).expect("dir");
        std::fs::write(ckpt.join(OBJECT), "two words\n").expect("write");
        let uri = format!("file://{}", ckpt.display());
        let error = runtime().block_on(read(&uri)).expect_err("damaged");
        assert!(
            error.to_string().contains("is damaged (not one address)"),
            "{error}"
        );
    }
}
