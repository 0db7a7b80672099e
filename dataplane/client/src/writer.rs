//! Encoding schemas and record batches into ring records.

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamEncoder, write_message,
};
use sluice_ring::{Producer, RecordKind, RecordMeta, ReserveError, files};

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Arrow could not encode the batch or schema.
    #[error("encoding an Arrow IPC message: {0}")]
    Encode(#[from] ArrowError),
    /// The ring refused the record.
    #[error(transparent)]
    Reserve(#[from] ReserveError),
    /// The schema file beside the ring could not be written.
    #[error(
        "writing the ring's schema file {path}: {source}; check the ring directory's space and permissions"
    )]
    SchemaFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Body buffers are aligned to 64 bytes, as Arrow recommends, so they can be used in place.
const ALIGNMENT: usize = 64;

fn options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(ALIGNMENT, false, arrow::ipc::MetadataVersion::V5)
        .expect("64-byte alignment with metadata V5 is valid")
}

/// Encodes the batches of one schema into ring records.
///
/// A batch's body buffers are copied once, from the batch's own memory straight into the ring
/// record: arrow's [`StreamEncoder`] hands out the message as a list of buffers that share the
/// batch's memory, instead of a contiguous copy of the body.
pub struct Encoder {
    schema: SchemaRef,
    stream: StreamEncoder,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Encoder")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder of batches of `schema`.
    ///
    /// # Errors
    ///
    /// Dictionary-encoded columns are refused: their dictionaries would have to cross the ring as
    /// records of their own.
    pub fn new(schema: SchemaRef) -> Result<Encoder, WriteError> {
        if let Some(field) = schema
            .flattened_fields()
            .into_iter()
            .find(|field| matches!(field.data_type(), DataType::Dictionary(..)))
        {
            return Err(WriteError::Encode(ArrowError::InvalidArgumentError(
                format!(
                    "column `{}` is dictionary-encoded, which cannot cross a ring yet; cast it to its value type",
                    field.name()
                ),
            )));
        }
        let mut stream = StreamEncoder::try_new_with_options(&schema, options())?;
        // The stream's schema message goes out once, before its first batch; encoding an empty
        // batch here leaves every later call with just a batch's message.
        stream.encode(&RecordBatch::new_empty(schema.clone()))?;
        Ok(Encoder { schema, stream })
    }

    /// The schema of the batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The schema as an Arrow IPC message.
    ///
    /// # Errors
    ///
    /// Returns arrow's error if the message cannot be framed.
    pub fn schema_message(&self) -> Result<Vec<u8>, WriteError> {
        let generator = IpcDataGenerator::default();
        let mut tracker = DictionaryTracker::new(false);
        let encoded = generator.schema_to_bytes_with_dictionary_tracker(
            &self.schema,
            &mut tracker,
            &options(),
        );
        let mut message = Vec::with_capacity(encoded.ipc_message.len() + 16);
        write_message(&mut message, encoded, &options())?;
        Ok(message)
    }

    /// Writes the schema's message to the schema file beside the ring at `ring_path` (see
    /// [`sluice_ring::SCHEMA_EXTENSION`]), whole or not at all: through a temporary file renamed
    /// over it. A file that already holds the message (a ring taken over by a daemon started
    /// again) is left as it is, so that taking a ring over needs no space.
    ///
    /// # Errors
    ///
    /// Returns the file system's error, naming the file.
    pub fn write_schema_file(&self, ring_path: &std::path::Path) -> Result<(), WriteError> {
        let message = self.schema_message()?;
        let path = sluice_ring::schema_path_beside(ring_path);
        if std::fs::read(&path).is_ok_and(|written| written == message) {
            return Ok(());
        }
        let temporary = path.with_extension("schema.tmp");
        let directory = path.parent().unwrap_or(std::path::Path::new("."));
        let written = files::Sharing::of_dir(directory)
            .and_then(|sharing| files::create_temporary(&temporary, sharing))
            .map_err(std::io::Error::other)
            .and_then(|mut file| std::io::Write::write_all(&mut file, &message))
            .and_then(|()| std::fs::rename(&temporary, &path));
        written.map_err(|source| {
            let _ = std::fs::remove_file(&temporary);
            WriteError::SchemaFile { path, source }
        })
    }

    /// Writes the schema as a schema record; batches written after it use it.
    ///
    /// # Errors
    ///
    /// Returns the ring's refusal of the record.
    pub fn write_schema(&self, producer: &mut Producer) -> Result<u64, WriteError> {
        let message = self.schema_message()?;
        let mut slot = producer.reserve(message.len())?;
        slot.payload_mut().copy_from_slice(&message);
        Ok(slot.commit(RecordMeta::of_kind(RecordKind::Schema)))
    }

    /// Writes `batch` as a batch record of task `task_id` covering split rows
    /// `[first_row, first_row + row_count)`.
    ///
    /// # Errors
    ///
    /// Returns arrow's error for a batch of another schema, and the ring's refusal of the record.
    pub fn write_batch(
        &mut self,
        producer: &mut Producer,
        batch: &RecordBatch,
        task_id: u64,
        first_row: u64,
        row_count: u64,
    ) -> Result<u64, WriteError> {
        self.write_tagged_batch(producer, batch, task_id, first_row, row_count, 0)
    }

    /// Writes `batch` as [`Encoder::write_batch`] does, its record tagged with `tag`
    /// ([`RecordMeta::tag`]).
    ///
    /// # Errors
    ///
    /// As [`Encoder::write_batch`].
    pub fn write_tagged_batch(
        &mut self,
        producer: &mut Producer,
        batch: &RecordBatch,
        task_id: u64,
        first_row: u64,
        row_count: u64,
        tag: u64,
    ) -> Result<u64, WriteError> {
        if batch.schema_ref().fields() != self.schema.fields() {
            return Err(WriteError::Encode(ArrowError::SchemaError(format!(
                "a batch of schema {} cannot be written to a ring of schema {}",
                batch.schema(),
                self.schema
            ))));
        }
        let buffers = self.stream.encode(batch)?;
        let length = buffers.iter().map(|buffer| buffer.len()).sum();
        let mut slot = producer.reserve(length)?;
        let mut at = 0;
        for buffer in &buffers {
            slot.write(at, buffer.as_slice());
            at += buffer.len();
        }
        Ok(slot.commit(RecordMeta {
            kind: RecordKind::Batch,
            task_id,
            first_row,
            row_count,
            tag,
        }))
    }
}

/// Writes an error report the trainers will see.
pub fn write_error(producer: &mut Producer, message: &str) -> Result<u64, WriteError> {
    let mut slot = producer.reserve(message.len())?;
    slot.payload_mut().copy_from_slice(message.as_bytes());
    Ok(slot.commit(RecordMeta::of_kind(RecordKind::Error)))
}
