//! Arrow IPC files read by their footer: the planner takes each record batch's place and row count from
//! the footer and the batches' message headers, and a split reads its record batches and the file's
//! dictionaries by byte range, with the footer, read once per file and kept.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileDecoder;
use arrow::ipc::{Block, MetadataVersion};

use crate::error::{FormatError, Result};
use crate::layout::{FileLayout, RowGroup};
use crate::plan::{ObjectIdentity, SplitBytes};
use crate::text::{RowFile, blocking};

/// The bytes at the end of a file read at once, in the hope that they hold the whole footer: the
/// footer of a file of a few hundred record batches.
const FOOTER_GUESS_BYTES: u64 = 16 * 1024;

/// How many footers a dataset keeps.
const FOOTERS_KEPT: usize = 16;

/// The bytes of the trailer after the footer: its length (`i32`) and the magic `ARROW1`.
const TRAILER_BYTES: u64 = 10;

/// The magic and padding before the first message.
const HEADER_BYTES: u64 = 8;

/// How many record batch headers the planner reads in one request at most; nearby headers are fetched
/// together by the store, so this bounds what one request may hold.
const HEADERS_PER_REQUEST: usize = 64;

/// What an Arrow IPC file's footer says.
#[derive(Debug)]
pub(crate) struct IpcFooter {
    pub schema: SchemaRef,
    version: MetadataVersion,
    dictionaries: Vec<Block>,
    batches: Vec<Block>,
}

fn record_error(uri: &str, offset: u64, reason: impl Into<String>) -> FormatError {
    FormatError::Record {
        format: "arrow ipc",
        file: uri.to_string(),
        offset,
        reason: reason.into(),
    }
}

/// The bytes of a block (message header and body), checked to lie between the file's magic and its
/// footer.
fn block_bytes(block: &Block, data_end: u64, uri: &str) -> Result<Range<u64>> {
    let offset = u64::try_from(block.offset()).ok();
    let header = u64::try_from(block.metaDataLength()).ok();
    let body = u64::try_from(block.bodyLength()).ok();
    let range = offset
        .zip(header)
        .zip(body)
        .and_then(|((offset, header), body)| {
            let end = offset.checked_add(header)?.checked_add(body)?;
            (offset >= HEADER_BYTES && header >= 8 && end <= data_end).then_some(offset..end)
        });
    range.ok_or_else(|| {
        record_error(
            uri,
            u64::try_from(block.offset()).unwrap_or(0),
            format!(
                "the footer places a block at {} with a {}-byte header and a {}-byte body, outside the file's {data_end} bytes of messages: the file is corrupt or not an Arrow IPC file",
                block.offset(),
                block.metaDataLength(),
                block.bodyLength()
            ),
        )
    })
}

/// The footers of the Arrow IPC files a dataset read last, by URI, size and identity as planned, so
/// that the splits of a file read its footer once, from the file they were planned from.
#[derive(Debug, Default)]
pub(crate) struct IpcFooters {
    kept: Mutex<VecDeque<(KeptFooter, Arc<IpcFooter>)>>,
}

/// What a kept footer was read as: a file's URI, size and identity as planned.
#[derive(Debug, PartialEq, Eq)]
struct KeptFooter {
    uri: String,
    size: u64,
    identity: Option<ObjectIdentity>,
}

impl KeptFooter {
    fn of(file: &RowFile<'_>) -> Self {
        Self {
            uri: file.uri().to_string(),
            size: file.size(),
            identity: file.planned.identity.cloned(),
        }
    }
}

impl IpcFooters {
    /// The footer of `file`, read unless it is kept.
    pub(crate) async fn get(&self, file: &RowFile<'_>) -> Result<Arc<IpcFooter>> {
        let key = KeptFooter::of(file);
        let kept = |footers: &Self| {
            footers
                .kept
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .iter()
                .find(|(kept, _)| *kept == key)
                .map(|(_, footer)| Arc::clone(footer))
        };
        if let Some(footer) = kept(self) {
            return Ok(footer);
        }
        let footer = Arc::new(read_footer(file).await?);
        let mut footers = self
            .kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if footers.len() == FOOTERS_KEPT {
            footers.pop_front();
        }
        footers.push_back((key, Arc::clone(&footer)));
        Ok(footer)
    }
}

/// Reads and checks the footer of an Arrow IPC file.
async fn read_footer(file: &RowFile<'_>) -> Result<IpcFooter> {
    let size = file.size();
    if size < HEADER_BYTES + TRAILER_BYTES {
        return Err(record_error(
            file.uri(),
            0,
            format!("the file has {size} bytes, too few for an Arrow IPC file"),
        ));
    }
    let guess = size.min(FOOTER_GUESS_BYTES);
    let tail = file.range(size - guess..size).await?;
    let mut trailer = [0u8; TRAILER_BYTES as usize];
    trailer.copy_from_slice(&tail[tail.len() - TRAILER_BYTES as usize..]);
    let footer_length = arrow::ipc::reader::read_footer_length(trailer)
        .map_err(|error| FormatError::arrow(format!("arrow ipc file {}", file.uri()), error))?
        as u64;
    let footer_start = (size - TRAILER_BYTES)
        .checked_sub(footer_length)
        .filter(|start| *start >= HEADER_BYTES)
        .ok_or_else(|| {
            record_error(
                file.uri(),
                size - TRAILER_BYTES,
                format!("the footer's length {footer_length} runs past the start of the file"),
            )
        })?;
    let footer_bytes = if footer_start >= size - guess {
        let from = usize::try_from(footer_start - (size - guess)).unwrap_or(usize::MAX);
        tail.slice(from..tail.len() - TRAILER_BYTES as usize)
    } else {
        file.range(footer_start..size - TRAILER_BYTES).await?
    };
    let footer = arrow::ipc::root_as_footer(&footer_bytes).map_err(|error| {
        record_error(
            file.uri(),
            footer_start,
            format!("the footer is malformed: {error}"),
        )
    })?;
    let ipc_schema = footer
        .schema()
        .ok_or_else(|| record_error(file.uri(), footer_start, "the footer holds no schema"))?;
    if !ipc_schema.endianness().equals_to_target_endianness() {
        return Err(record_error(
            file.uri(),
            footer_start,
            "the file was written on a machine of the other byte order; rewrite it on this one",
        ));
    }
    let schema = arrow::ipc::convert::try_fb_to_schema(ipc_schema)
        .map_err(|error| FormatError::arrow(format!("arrow ipc file {}", file.uri()), error))?;
    let checked = |blocks: Vec<Block>| -> Result<Vec<Block>> {
        for block in &blocks {
            block_bytes(block, footer_start, file.uri())?;
        }
        Ok(blocks)
    };
    let dictionaries = footer
        .dictionaries()
        .map(|blocks| blocks.iter().copied().collect())
        .unwrap_or_default();
    let batches = footer
        .recordBatches()
        .map(|blocks| blocks.iter().copied().collect())
        .unwrap_or_default();
    Ok(IpcFooter {
        schema: Arc::new(schema),
        version: footer.version(),
        dictionaries: checked(dictionaries)?,
        batches: checked(batches)?,
    })
}

/// The row count a record batch's message header gives.
fn batch_rows(header: &[u8], offset: u64, uri: &str) -> Result<u64> {
    let flatbuffer = match header.get(..4) {
        Some([0xff, 0xff, 0xff, 0xff]) => header.get(8..),
        _ => header.get(4..),
    };
    let message = flatbuffer
        .ok_or_else(|| record_error(uri, offset, "the message header is cut short"))
        .and_then(|bytes| {
            arrow::ipc::root_as_message(bytes).map_err(|error| {
                record_error(
                    uri,
                    offset,
                    format!("the message header is malformed: {error}"),
                )
            })
        })?;
    let batch = message.header_as_record_batch().ok_or_else(|| {
        record_error(
            uri,
            offset,
            "the footer lists a record batch here, and the message is none",
        )
    })?;
    u64::try_from(batch.length())
        .map_err(|_| record_error(uri, offset, "the record batch has a negative row count"))
}

/// The record batches of an Arrow IPC file as row groups: their bytes and row counts, from the footer
/// and each batch's message header.
pub(crate) async fn layout(file: &RowFile<'_>) -> Result<FileLayout> {
    let footer = file.footers.get(file).await?;
    let data_end = file.size();
    let mut groups = Vec::with_capacity(footer.batches.len());
    for blocks in footer.batches.chunks(HEADERS_PER_REQUEST) {
        let mut places = Vec::with_capacity(blocks.len());
        let mut headers = Vec::with_capacity(blocks.len());
        for block in blocks {
            let bytes = block_bytes(block, data_end, file.uri())?;
            headers.push(bytes.start..bytes.start + block.metaDataLength() as u64);
            places.push(bytes);
        }
        let fetched = file.ranges(&headers).await?;
        for (bytes, header) in places.into_iter().zip(fetched) {
            let rows = batch_rows(&header, bytes.start, file.uri())?;
            groups.push(RowGroup {
                rows,
                bytes,
                crc32c: None,
            });
        }
    }
    Ok(FileLayout::new(groups))
}

/// Reads the record batches a split's bytes hold, with the file's dictionaries; the file's footer
/// (read once per file) must place whole record batches of `bytes.rows` rows exactly over the bytes.
pub(crate) async fn read_range(file: &RowFile<'_>, bytes: &SplitBytes) -> Result<Vec<RecordBatch>> {
    let footer = file.footers.get(file).await?;
    let changed = |what: String| FormatError::FileChanged {
        uri: file.uri().to_string(),
        what,
    };
    let blocks: Vec<Block> = footer
        .batches
        .iter()
        .filter(|block| (bytes.start..bytes.end).contains(&(block.offset() as u64)))
        .copied()
        .collect();
    let data_end = file.size();
    let ends: Vec<u64> = blocks
        .iter()
        .map(|block| block_bytes(block, data_end, file.uri()).map(|range| range.end))
        .collect::<Result<_>>()?;
    let starts_at_a_batch = blocks
        .first()
        .is_some_and(|block| block.offset() as u64 == bytes.start);
    if !starts_at_a_batch || ends.iter().max() != Some(&bytes.end) {
        return Err(changed(format!(
            "bytes {}..{} are no longer whole record batches of its footer",
            bytes.start, bytes.end
        )));
    }
    let body = file.range(bytes.start..bytes.end).await?;
    let dictionary_ranges: Vec<Range<u64>> = footer
        .dictionaries
        .iter()
        .map(|block| block_bytes(block, data_end, file.uri()))
        .collect::<Result<_>>()?;
    let dictionaries = file.ranges(&dictionary_ranges).await?;
    let uri = file.uri().to_string();
    let (start, rows) = (bytes.start, bytes.rows);
    let decoded = blocking(move || {
        let context = || format!("arrow ipc file {uri}");
        let mut decoder = FileDecoder::new(Arc::clone(&footer.schema), footer.version);
        for (block, dictionary) in footer.dictionaries.iter().zip(dictionaries) {
            decoder
                .read_dictionary(block, &Buffer::from(dictionary))
                .map_err(|error| FormatError::arrow(context(), error))?;
        }
        let body = Buffer::from(body);
        let mut batches = Vec::with_capacity(blocks.len());
        for (block, end) in blocks.iter().zip(ends) {
            let offset = block.offset() as u64 - start;
            let length = end - block.offset() as u64;
            let message = body.slice_with_length(offset as usize, length as usize);
            // The decoder's errors are the message's: a header that claims more rows or bytes
            // than its body holds is bad data.
            if let Some(batch) = decoder
                .read_record_batch(block, &message)
                .map_err(|error| {
                    record_error(
                        &uri,
                        block.offset() as u64,
                        format!("the record batch does not decode: {error}"),
                    )
                })?
            {
                batches.push(batch);
            }
        }
        Ok(batches)
    })
    .await?;
    let decoded_rows: u64 = decoded.iter().map(|batch| batch.num_rows() as u64).sum();
    if decoded_rows != rows {
        return Err(changed(format!(
            "bytes {}..{} hold {decoded_rows} rows, {rows} when planned",
            bytes.start, bytes.end
        )));
    }
    Ok(decoded)
}
