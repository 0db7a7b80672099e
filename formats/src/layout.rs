//! Where the rows of a row-format file lie: an index of its records, built once when the file is
//! planned, so that a split reads the bytes of its rows and no others.
//!
//! # Implementation
//! CSV, JSON lines and TFRecord files carry no index, so the planner streams each file once through a
//! scanner that finds where every record ends, with the same rules as the decoder that reads the split
//! later:
//! - CSV records are found by `csv-core`, the parser arrow's CSV reader is built on, with the same
//!   dialect; a quoted field may hold line breaks, so records are never found by looking for `\n`. The
//!   first record is the header: the data start after it.
//! - A JSON lines row is one top-level JSON object, as arrow's JSON reader takes it: rows are separated
//!   by whitespace, and braces inside strings do not count.
//! - TFRecord records are found by their length prefix, whose CRC is checked.
//!
//! The records are cut into groups of `task_rows` in file order, and each group keeps its byte range and
//! the CRC32C of those bytes; the planner cuts the same rows into splits, so each split is one group, and
//! its reader checks the CRC before it decodes a row. The index holds one entry per split, whatever the
//! size of the file, and the scan holds one chunk of the file at a time.
//!
//! An Arrow IPC file has an index of its own: its footer lists the blocks of its record batches. Each
//! block's message header gives its row count; a group is one record batch.

use std::ops::Range;

use crate::error::{FormatError, Result};
use crate::plan::SplitBytes;

/// Rows of a file that a reader can decode from their bytes alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowGroup {
    /// The number of rows.
    pub rows: u64,
    /// The bytes that hold them, whole records only.
    pub bytes: Range<u64>,
    /// The CRC32C of those bytes, when the planner read them.
    pub crc32c: Option<u32>,
}

/// A file's rows as consecutive groups, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileLayout {
    groups: Vec<RowGroup>,
    /// The rows of the groups up to each one, that one included.
    row_ends: Vec<u64>,
}

impl FileLayout {
    pub(crate) fn new(groups: Vec<RowGroup>) -> Self {
        let row_ends = groups
            .iter()
            .scan(0u64, |total, group| {
                *total += group.rows;
                Some(*total)
            })
            .collect();
        Self { groups, row_ends }
    }

    /// The row count of every group, in file order: what the planner cuts into splits.
    pub(crate) fn group_rows(&self) -> Vec<u64> {
        self.groups.iter().map(|group| group.rows).collect()
    }

    /// The bytes that hold the rows `[first_row, first_row + row_count)`: the groups they lie in, from
    /// the first to the last. `None` for rows past the file's end or no rows.
    pub(crate) fn bytes_of(&self, first_row: u64, row_count: u64) -> Option<SplitBytes> {
        let last_row = first_row.checked_add(row_count)?.checked_sub(1)?;
        let first = self.row_ends.partition_point(|&end| end <= first_row);
        let last = self.row_ends.partition_point(|&end| end <= last_row);
        let groups = self.groups.get(first..=last)?;
        let crc32c = groups.iter().try_fold(None, |joined: Option<u32>, group| {
            let crc = group.crc32c?;
            let length = usize::try_from(group.bytes.end - group.bytes.start).ok()?;
            Some(Some(match joined {
                None => crc,
                Some(before) => crc32c::crc32c_combine(before, crc, length),
            }))
        });
        let rows: u64 = groups.iter().map(|group| group.rows).sum();
        Some(SplitBytes {
            start: groups.first()?.bytes.start,
            end: groups.last()?.bytes.end,
            first_row: self.row_ends[last] - rows,
            rows,
            crc32c: crc32c.flatten(),
        })
    }
}

/// Cuts records into groups of `task_rows` as a scanner finds where they end, with each group's
/// bytes and their CRC32C.
///
/// A scanner hands over the file in chunks; the CRC takes in every byte of the data up to the end of
/// each chunk, so that a record may span chunks.
#[derive(Debug)]
pub(crate) struct Grouper {
    task_rows: u64,
    groups: Vec<RowGroup>,
    /// Where the open group starts; `None` before the data start (before a CSV header's end).
    start: Option<u64>,
    /// The records of the open group.
    rows: u64,
    /// The CRC32C of the bytes from `start` to `taken`.
    crc: u32,
    taken: u64,
    /// Where the last record ended, and the CRC32C of the open group up to there.
    last_end: u64,
    crc_at_last_end: u32,
}

impl Grouper {
    pub(crate) fn new(task_rows: u64) -> Self {
        Self {
            task_rows: task_rows.max(1),
            groups: Vec::new(),
            start: None,
            rows: 0,
            crc: 0,
            taken: 0,
            last_end: 0,
            crc_at_last_end: 0,
        }
    }

    /// The data start at `at`: the records before (a CSV header) are no rows.
    fn data_start(&mut self, at: u64) {
        self.start = Some(at);
        self.taken = at;
        self.last_end = at;
        self.crc = 0;
        self.crc_at_last_end = 0;
    }

    /// Takes the bytes of `chunk` (which starts at file offset `base`) up to file offset `to` into the
    /// open group's CRC.
    fn take(&mut self, chunk: &[u8], base: u64, to: u64) {
        if self.start.is_none() || to <= self.taken {
            return;
        }
        debug_assert!(self.taken >= base, "a chunk's bytes are taken in order");
        let from = usize::try_from(self.taken - base).unwrap_or(usize::MAX);
        let to_index = usize::try_from(to - base).unwrap_or(usize::MAX);
        if let Some(bytes) = chunk.get(from..to_index) {
            self.crc = crc32c::crc32c_append(self.crc, bytes);
        }
        self.taken = to;
    }

    /// A record ends at file offset `at`, inside `chunk` (which starts at `base`) or at its end.
    fn record_end(&mut self, chunk: &[u8], base: u64, at: u64) {
        let Some(start) = self.start else {
            return;
        };
        self.take(chunk, base, at);
        self.rows += 1;
        self.last_end = at;
        self.crc_at_last_end = self.crc;
        if self.rows == self.task_rows {
            self.groups.push(RowGroup {
                rows: self.rows,
                bytes: start..at,
                crc32c: Some(self.crc),
            });
            self.start = Some(at);
            self.rows = 0;
            self.crc = 0;
            self.crc_at_last_end = 0;
        }
    }

    /// The whole of `chunk` has been scanned.
    fn chunk_done(&mut self, chunk: &[u8], base: u64) {
        self.take(chunk, base, base + chunk.len() as u64);
    }

    /// The groups; the last ends where the last record does, so bytes after it (blank lines) are
    /// nobody's.
    fn finish(mut self) -> Vec<RowGroup> {
        if let (Some(start), true) = (self.start, self.rows > 0) {
            self.groups.push(RowGroup {
                rows: self.rows,
                bytes: start..self.last_end,
                crc32c: Some(self.crc_at_last_end),
            });
        }
        self.groups
    }
}

/// Finds where the records of one text format end.
pub(crate) enum Scanner {
    // Boxed: `csv-core`'s parser holds its transition table.
    Csv(Box<CsvScanner>),
    JsonLines(JsonScanner),
    TfRecord(TfRecordScanner),
}

impl Scanner {
    /// Scans `chunk`, which starts at file offset `base`, telling `grouper` where records end.
    fn scan(&mut self, chunk: &[u8], base: u64, grouper: &mut Grouper, uri: &str) -> Result<()> {
        match self {
            Self::Csv(scanner) => {
                scanner.scan(chunk, base, grouper);
                Ok(())
            }
            Self::JsonLines(scanner) => scanner.scan(chunk, base, grouper, uri),
            Self::TfRecord(scanner) => scanner.scan(chunk, base, grouper, uri),
        }
    }

    /// The file ends at `end`.
    fn finish(&mut self, end: u64, grouper: &mut Grouper, uri: &str) -> Result<()> {
        match self {
            Self::Csv(scanner) => {
                scanner.finish(end, grouper);
                Ok(())
            }
            Self::JsonLines(scanner) => scanner.finish(uri),
            Self::TfRecord(scanner) => scanner.finish(uri),
        }
    }
}

/// Streams a file's chunks through `scanner` and cuts its records into groups of `task_rows`.
///
/// `next_chunk` gives the file's bytes in order, `None` at its end; `size` is the file's size when it
/// was listed, which the bytes must match.
pub(crate) fn scan(
    mut scanner: Scanner,
    mut next_chunk: impl FnMut() -> Result<Option<bytes::Bytes>>,
    task_rows: u64,
    uri: &str,
    size: u64,
) -> Result<FileLayout> {
    let mut grouper = Grouper::new(task_rows);
    if !matches!(scanner, Scanner::Csv(_)) {
        grouper.data_start(0);
    }
    let mut base = 0u64;
    while let Some(chunk) = next_chunk()? {
        scanner.scan(&chunk, base, &mut grouper, uri)?;
        grouper.chunk_done(&chunk, base);
        base += chunk.len() as u64;
    }
    if base != size {
        return Err(FormatError::FileChanged {
            uri: uri.to_string(),
            what: format!("it was listed at {size} bytes and read as {base}"),
        });
    }
    scanner.finish(base, &mut grouper, uri)?;
    Ok(FileLayout::new(grouper.finish()))
}

/// Finds CSV records with `csv-core` in the dialect arrow's CSV reader uses by default: `,` between
/// fields, `"` quoting with doubled quotes inside, any of `\r`, `\n` and `\r\n` ending a record, blank
/// lines skipped. The first record is the header.
pub(crate) struct CsvScanner {
    parser: csv_core::Reader,
    header_seen: bool,
    /// Where `csv-core` copies field bytes, which the scan does not keep.
    fields: Vec<u8>,
    field_ends: Vec<usize>,
}

impl CsvScanner {
    pub(crate) fn new() -> Self {
        Self {
            parser: csv_core::Reader::new(),
            header_seen: false,
            fields: vec![0; 64 * 1024],
            field_ends: vec![0; 1024],
        }
    }

    fn record(&mut self, chunk: &[u8], base: u64, at: u64, grouper: &mut Grouper) {
        if self.header_seen {
            grouper.record_end(chunk, base, at);
        } else {
            self.header_seen = true;
            grouper.data_start(at);
        }
    }

    fn scan(&mut self, chunk: &[u8], base: u64, grouper: &mut Grouper) {
        let mut at = 0usize;
        loop {
            let (result, read, _, _) =
                self.parser
                    .read_record(&chunk[at..], &mut self.fields, &mut self.field_ends);
            at += read;
            match result {
                csv_core::ReadRecordResult::InputEmpty | csv_core::ReadRecordResult::End => return,
                // Only where records end matters: the fields' bytes are dropped.
                csv_core::ReadRecordResult::OutputFull
                | csv_core::ReadRecordResult::OutputEndsFull => {}
                csv_core::ReadRecordResult::Record => {
                    self.record(chunk, base, base + at as u64, grouper)
                }
            }
        }
    }

    /// A last record without a line break ends at the end of the file.
    fn finish(&mut self, end: u64, grouper: &mut Grouper) {
        loop {
            let (result, _, _, _) =
                self.parser
                    .read_record(&[], &mut self.fields, &mut self.field_ends);
            match result {
                csv_core::ReadRecordResult::Record => self.record(&[], end, end, grouper),
                csv_core::ReadRecordResult::OutputFull
                | csv_core::ReadRecordResult::OutputEndsFull => {}
                csv_core::ReadRecordResult::InputEmpty | csv_core::ReadRecordResult::End => return,
            }
        }
    }
}

/// Where a JSON lines scan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonState {
    /// Between rows.
    Between,
    /// Inside a row's object, `depth` brackets deep.
    Value { depth: u64 },
    /// Inside a string of a row.
    String { depth: u64 },
    /// Just after a backslash inside a string.
    Escape { depth: u64 },
}

/// Finds the rows of a JSON lines file: each a top-level JSON object, rows separated by whitespace.
pub(crate) struct JsonScanner {
    state: JsonState,
    row_start: u64,
}

impl JsonScanner {
    pub(crate) fn new() -> Self {
        Self {
            state: JsonState::Between,
            row_start: 0,
        }
    }

    fn scan(&mut self, chunk: &[u8], base: u64, grouper: &mut Grouper, uri: &str) -> Result<()> {
        for (index, &byte) in chunk.iter().enumerate() {
            self.state = match self.state {
                JsonState::Between => match byte {
                    b' ' | b'\t' | b'\n' | b'\r' => JsonState::Between,
                    b'{' => {
                        self.row_start = base + index as u64;
                        JsonState::Value { depth: 1 }
                    }
                    other => {
                        return Err(FormatError::Record {
                            format: "json lines",
                            file: uri.to_string(),
                            offset: base + index as u64,
                            reason: format!(
                                "a row must be a JSON object, found {:?}; fix or remove the line",
                                char::from(other)
                            ),
                        });
                    }
                },
                JsonState::Value { depth } => match byte {
                    b'"' => JsonState::String { depth },
                    b'{' | b'[' => JsonState::Value { depth: depth + 1 },
                    b'}' | b']' if depth == 1 => {
                        grouper.record_end(chunk, base, base + index as u64 + 1);
                        JsonState::Between
                    }
                    b'}' | b']' => JsonState::Value { depth: depth - 1 },
                    _ => JsonState::Value { depth },
                },
                JsonState::String { depth } => match byte {
                    b'\\' => JsonState::Escape { depth },
                    b'"' => JsonState::Value { depth },
                    _ => JsonState::String { depth },
                },
                JsonState::Escape { depth } => JsonState::String { depth },
            };
        }
        Ok(())
    }

    fn finish(&self, uri: &str) -> Result<()> {
        if self.state == JsonState::Between {
            return Ok(());
        }
        Err(FormatError::Record {
            format: "json lines",
            file: uri.to_string(),
            offset: self.row_start,
            reason: "the row is cut short by the end of the file".to_string(),
        })
    }
}

/// Finds the records of a TFRecord file by their length prefixes, checking each length's CRC.
pub(crate) struct TfRecordScanner {
    header: [u8; 12],
    header_bytes: usize,
    /// The bytes of the record's payload and data CRC still to pass.
    skip: u64,
    record_start: u64,
}

impl TfRecordScanner {
    pub(crate) fn new() -> Self {
        Self {
            header: [0; 12],
            header_bytes: 0,
            skip: 0,
            record_start: 0,
        }
    }

    fn scan(&mut self, chunk: &[u8], base: u64, grouper: &mut Grouper, uri: &str) -> Result<()> {
        let mut at = 0usize;
        while at < chunk.len() {
            if self.skip > 0 {
                let passed = self.skip.min((chunk.len() - at) as u64);
                at += passed as usize;
                self.skip -= passed;
                if self.skip == 0 {
                    grouper.record_end(chunk, base, base + at as u64);
                }
                continue;
            }
            if self.header_bytes == 0 {
                self.record_start = base + at as u64;
            }
            let taken = (12 - self.header_bytes).min(chunk.len() - at);
            self.header[self.header_bytes..self.header_bytes + taken]
                .copy_from_slice(&chunk[at..at + taken]);
            self.header_bytes += taken;
            at += taken;
            if self.header_bytes == 12 {
                self.header_bytes = 0;
                self.skip = self.payload_and_crc(uri)?;
            }
        }
        Ok(())
    }

    /// The bytes after a complete header: the payload and its CRC.
    fn payload_and_crc(&self, uri: &str) -> Result<u64> {
        let error = |reason: &str| FormatError::TfRecord {
            file: uri.to_string(),
            offset: self.record_start,
            reason: reason.to_string(),
        };
        let (length_bytes, crc_bytes) = self.header.split_at(8);
        let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        if crate::text::masked_crc32c(length_bytes) != stored {
            return Err(error(
                "length CRC mismatch: the file is corrupt or not a TFRecord file",
            ));
        }
        let mut length = [0u8; 8];
        length.copy_from_slice(length_bytes);
        u64::from_le_bytes(length)
            .checked_add(4)
            .ok_or_else(|| error("truncated record: its length runs past the end of the file"))
    }

    fn finish(&self, uri: &str) -> Result<()> {
        if self.header_bytes == 0 && self.skip == 0 {
            return Ok(());
        }
        Err(FormatError::TfRecord {
            file: uri.to_string(),
            offset: self.record_start,
            reason: "truncated record: the file ends inside it".to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Scans `content` handed over in chunks of `chunk` bytes.
    fn layout(scanner: Scanner, content: &[u8], chunk: usize, task_rows: u64) -> FileLayout {
        let mut chunks = content
            .chunks(chunk)
            .map(Bytes::copy_from_slice)
            .collect::<Vec<_>>()
            .into_iter();
        scan(
            scanner,
            || Ok(chunks.next()),
            task_rows,
            "mem",
            content.len() as u64,
        )
        .expect("scans")
    }

    fn ranges(layout: &FileLayout, content: &[u8]) -> Vec<(u64, String)> {
        layout
            .groups
            .iter()
            .map(|group| {
                let bytes = &content[group.bytes.start as usize..group.bytes.end as usize];
                assert_eq!(group.crc32c, Some(crc32c::crc32c(bytes)));
                (group.rows, String::from_utf8_lossy(bytes).into_owned())
            })
            .collect()
    }

    #[test]
    fn csv_records_are_found_by_the_parser_whatever_the_chunks() {
        let content = b"id,text\r\n1,\"two\nlines\"\r\n\r\n2,plain\n3,\"a \"\"quote\"\"\"\n4,last";
        for chunk in 1..content.len() + 1 {
            let sut = layout(Scanner::Csv(Box::new(CsvScanner::new())), content, chunk, 2);
            assert_eq!(
                ranges(&sut, content),
                // A `\r` ends the header; the `\n` after it is a blank line of the next range.
                vec![
                    (2, "\n1,\"two\nlines\"\r\n\r\n2,plain\n".to_string()),
                    (2, "3,\"a \"\"quote\"\"\"\n4,last".to_string()),
                ],
                "chunks of {chunk} bytes"
            );
        }
    }

    #[test]
    fn a_csv_of_a_header_alone_has_no_rows() {
        let sut = layout(Scanner::Csv(Box::new(CsvScanner::new())), b"a,b\n\n", 3, 2);
        assert_eq!(sut.group_rows(), Vec::<u64>::new());
    }

    #[test]
    fn json_rows_are_top_level_objects_whatever_their_strings_hold() {
        let content = b"{\"a\": \"}\\\"{\"}\n  {\"a\": [1, {\"b\": 2}]} {\"a\": 3}\n\n";
        for chunk in 1..content.len() + 1 {
            let sut = layout(Scanner::JsonLines(JsonScanner::new()), content, chunk, 2);
            assert_eq!(
                ranges(&sut, content),
                vec![
                    (
                        2,
                        "{\"a\": \"}\\\"{\"}\n  {\"a\": [1, {\"b\": 2}]}".to_string()
                    ),
                    (1, " {\"a\": 3}".to_string()),
                ],
                "chunks of {chunk} bytes"
            );
        }
    }

    #[test]
    fn a_json_row_that_is_no_object_or_is_cut_short_fails_naming_its_byte() {
        let mut chunks = vec![Bytes::from_static(b"{\"a\": 1}\n[2]\n")].into_iter();
        let error = scan(
            Scanner::JsonLines(JsonScanner::new()),
            || Ok(chunks.next()),
            1,
            "mem",
            13,
        )
        .expect_err("an array row");
        assert!(error.to_string().contains("byte 9"), "{error}");
        let mut chunks = vec![Bytes::from_static(b"{\"a\": 1}\n{\"a\"")].into_iter();
        let error = scan(
            Scanner::JsonLines(JsonScanner::new()),
            || Ok(chunks.next()),
            1,
            "mem",
            13,
        )
        .expect_err("cut short");
        assert!(
            error.to_string().contains("byte 9") && error.to_string().contains("cut short"),
            "{error}"
        );
    }

    #[test]
    fn tfrecord_records_are_found_by_their_lengths() {
        let payloads: Vec<&[u8]> = vec![b"first", b"", b"third record"];
        let content = crate::text::tfrecord_encode(payloads.iter().copied());
        for chunk in 1..content.len() + 1 {
            let sut = layout(
                Scanner::TfRecord(TfRecordScanner::new()),
                &content,
                chunk,
                2,
            );
            assert_eq!(sut.group_rows(), vec![2, 1], "chunks of {chunk} bytes");
            assert_eq!(sut.groups[0].bytes, 0..37);
            assert_eq!(sut.groups[1].bytes, 37..content.len() as u64);
        }
        let mut chunks = vec![Bytes::copy_from_slice(&content[..content.len() - 1])].into_iter();
        let error = scan(
            Scanner::TfRecord(TfRecordScanner::new()),
            || Ok(chunks.next()),
            2,
            "mem",
            content.len() as u64 - 1,
        )
        .expect_err("truncated");
        assert!(error.to_string().contains("record at byte 37"), "{error}");
    }

    #[test]
    fn a_file_read_at_another_size_than_listed_has_changed() {
        let mut chunks = vec![Bytes::from_static(b"a\n1\n")].into_iter();
        let error = scan(
            Scanner::Csv(Box::new(CsvScanner::new())),
            || Ok(chunks.next()),
            1,
            "mem",
            9,
        )
        .expect_err("changed");
        assert!(matches!(error, FormatError::FileChanged { .. }), "{error}");
    }

    #[test]
    fn the_bytes_of_rows_span_their_groups_with_the_joined_crc() {
        let content = b"0123456789";
        let group = |rows, bytes: Range<u64>| RowGroup {
            rows,
            crc32c: Some(crc32c::crc32c(
                &content[bytes.start as usize..bytes.end as usize],
            )),
            bytes,
        };
        let sut = FileLayout::new(vec![group(3, 0..4), group(0, 4..5), group(2, 5..10)]);
        assert_eq!(
            sut.bytes_of(1, 1),
            Some(SplitBytes {
                start: 0,
                end: 4,
                first_row: 0,
                rows: 3,
                crc32c: Some(crc32c::crc32c(b"0123")),
            })
        );
        assert_eq!(
            sut.bytes_of(2, 3),
            Some(SplitBytes {
                start: 0,
                end: 10,
                first_row: 0,
                rows: 5,
                crc32c: Some(crc32c::crc32c(content)),
            })
        );
        assert_eq!(
            sut.bytes_of(3, 2).map(|bytes| bytes.start..bytes.end),
            Some(5..10)
        );
        assert_eq!(sut.bytes_of(4, 2), None, "past the end");
        assert_eq!(sut.bytes_of(0, 0), None, "no rows");
    }
}
