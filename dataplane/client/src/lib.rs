//! Arrow record batches over Sluice's shared-memory rings.
//!
//! A ring carries a stream of records (see `sluice-ring`). This crate fixes what their payloads
//! are, for the daemon that writes them and for the trainers that read them:
//! - a [`RecordKind::Schema`] record holds one encapsulated Arrow IPC schema message (the IPC
//!   stream format's framing: continuation marker, metadata length, flatbuffer, body), written
//!   before the first batch and again whenever the schema changes;
//! - a [`RecordKind::Batch`] record holds one encapsulated IPC record batch message, with its body
//!   buffers 64-byte aligned from the payload's start, so any Arrow reader can use them in place.
//!   Its [`RecordMeta`] names the task the rows belong to, and the split rows they cover:
//!   `first_row` is the split row (in the split's delivery order) of the batch's first row, and
//!   `row_count` the split rows the batch covers, rows a filter or a deletion vector removed
//!   included, so that consumed positions stay exact;
//! - a [`RecordKind::EndOfEpoch`] record ends an epoch's data for the ring, and the producer
//!   closing the ring ends the stream;
//! - a [`RecordKind::Error`] record holds a UTF-8 message from the daemon;
//! - a [`RecordKind::Dropped`] record has no payload: its meta names split rows of a task that the
//!   reader counts as read and hands out nothing of (`data.even_batches: drop`).
//!
//! An [`Encoder`] writes a schema's records into a ring, copying each batch's buffers once, straight
//! into the record; [`Reader`] decodes, keeping each
//! trainer's consumed position per task for data checkpoints.

mod reader;
mod writer;

pub use reader::{Item, ReadError, Reader};
pub use sluice_ring::{RecordKind, RecordMeta};
pub use writer::{Encoder, WriteError, write_error};
