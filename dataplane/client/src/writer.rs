//! Encoding schemas and record batches into ring records.

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::ipc::writer::{
    DictionaryTracker, EncodedData, IpcDataGenerator, IpcWriteOptions, write_message,
};
use sluice_ring::{Producer, RecordKind, RecordMeta, ReserveError};

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Arrow could not encode the batch or schema.
    #[error("encoding an Arrow IPC message: {0}")]
    Encode(#[from] ArrowError),
    /// The ring refused the record.
    #[error(transparent)]
    Reserve(#[from] ReserveError),
}

/// Body buffers are aligned to 64 bytes, as Arrow recommends, so they can be used in place.
const ALIGNMENT: usize = 64;

fn options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(ALIGNMENT, false, arrow::ipc::MetadataVersion::V5)
        .expect("64-byte alignment with metadata V5 is valid")
}

/// Writes one encapsulated message into a new record of `kind`.
fn write_encoded(
    producer: &mut Producer,
    encoded: EncodedData,
    meta: RecordMeta,
) -> Result<u64, WriteError> {
    let mut message = Vec::with_capacity(encoded.ipc_message.len() + encoded.arrow_data.len() + 16);
    write_message(&mut message, encoded, &options())?;
    let mut slot = producer.reserve(message.len())?;
    slot.payload_mut().copy_from_slice(&message);
    Ok(slot.commit(meta))
}

/// Writes `schema` as a schema record; batches written after it use it.
pub fn write_schema(producer: &mut Producer, schema: &Schema) -> Result<u64, WriteError> {
    let generator = IpcDataGenerator::default();
    let mut tracker = DictionaryTracker::new(false);
    let encoded =
        generator.schema_to_bytes_with_dictionary_tracker(schema, &mut tracker, &options());
    write_encoded(producer, encoded, RecordMeta::of_kind(RecordKind::Schema))
}

/// Writes `batch` as a batch record of task `task_id` covering split rows
/// `[first_row, first_row + row_count)`.
pub fn write_batch(
    producer: &mut Producer,
    batch: &RecordBatch,
    task_id: u64,
    first_row: u64,
    row_count: u64,
) -> Result<u64, WriteError> {
    let generator = IpcDataGenerator::default();
    let mut tracker = DictionaryTracker::new(false);
    let (dictionaries, encoded) =
        generator.encode(batch, &mut tracker, &options(), &mut Default::default())?;
    if !dictionaries.is_empty() {
        return Err(WriteError::Encode(ArrowError::InvalidArgumentError(
            "dictionary-encoded columns cannot cross a ring yet; cast them to their value type"
                .to_owned(),
        )));
    }
    write_encoded(
        producer,
        encoded,
        RecordMeta {
            kind: RecordKind::Batch,
            task_id,
            first_row,
            row_count,
        },
    )
}

/// Writes an error report the trainers will see.
pub fn write_error(producer: &mut Producer, message: &str) -> Result<u64, WriteError> {
    let mut slot = producer.reserve(message.len())?;
    slot.payload_mut().copy_from_slice(message.as_bytes());
    Ok(slot.commit(RecordMeta::of_kind(RecordKind::Error)))
}
