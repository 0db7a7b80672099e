//! The bytes of a ring file: the header page and the record headers, and their validation.
//!
//! ```text
//! offset 0      header page (4096 bytes, `RingHeader`)
//! offset 4096   data region (`capacity` bytes): records, each a 64-byte `RecordHeader` then its payload,
//!               padded to a multiple of 64 bytes; a record never wraps around the end of the region
//! ```
//!
//! Every value read from the file is validated before it is used as an offset or a length, so that any
//! bytes (a foreign file, a truncated one, a corrupt one) give an error, never a crash.

use crate::sync::{AtomicU32, AtomicU64, CachePadded, Futex};

/// The magic number at offset 0 of every ring file: `SLUICERG` in ASCII.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SLUICERG");
/// The version of the layout described here; a ring of another version is rejected.
pub const LAYOUT_VERSION: u32 = 3;
/// The size of the header page; the data region starts right after it.
pub const HEADER_LEN: usize = 4096;
/// Records start, and their payloads start, at multiples of this.
pub const RECORD_ALIGN: u64 = 64;
/// The size of a record header.
pub const RECORD_HEADER_LEN: u64 = 64;

/// The bit of a cursor word that says "the other side is asleep on this cursor's futex".
///
/// A cursor word holds a byte position, counted from the creation of the ring and never wrapping, in bits
/// 0..=62, and this flag in bit 63.
pub(crate) const WAITING: u64 = 1 << 63;

/// The header page, as it lies in shared memory.
///
/// Every field is valid for any bit pattern, so a `&RingHeader` over any 4096 mapped bytes is sound; the
/// values are checked by [`RingHeader::validate`] before they are trusted.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct RingHeader {
    /// [`MAGIC`].
    pub(crate) magic: u64,
    /// [`LAYOUT_VERSION`].
    pub(crate) version: u32,
    /// [`HEADER_LEN`].
    pub(crate) header_len: u32,
    /// The size of the data region in bytes, a multiple of [`RECORD_ALIGN`].
    pub(crate) capacity: u64,
    /// The packed [`ProcessId`](crate::ProcessId) of the process that created the ring.
    pub(crate) creator: u64,
    /// Set to 1 by the producer when the stream has ended.
    pub(crate) closed: AtomicU32,

    /// The packed [`ProcessId`](crate::ProcessId) of the producer, 0 when none.
    pub(crate) producer: CachePadded<AtomicU64>,
    /// The packed [`ProcessId`](crate::ProcessId) of the consumer, 0 when none.
    pub(crate) consumer: CachePadded<AtomicU64>,
    /// Counts producer attachments, so a waiting consumer notices a new producer.
    pub(crate) producer_epoch: CachePadded<AtomicU64>,

    /// The write cursor: the end of the last committed record, plus [`WAITING`] when the consumer sleeps.
    pub(crate) write: CachePadded<AtomicU64>,
    /// The read cursor: the end of the last released record, plus [`WAITING`] when the producer sleeps.
    pub(crate) read: CachePadded<AtomicU64>,
    /// The sequence number the consumer expects next; stored before each release of the read cursor.
    pub(crate) read_sequence: CachePadded<AtomicU64>,

    /// The consumer sleeps here waiting for records; bumped by the producer.
    pub(crate) data_futex: CachePadded<Futex>,
    /// The producer sleeps here waiting for space; bumped by the consumer.
    pub(crate) space_futex: CachePadded<Futex>,

    /// The retain cursor: the start of the oldest record the producer keeps, `retain <= read`. The
    /// records in `[retain, read)` are released by the consumer, but their headers stay readable
    /// until the producer folds them (see [`Producer::fold`](crate::Producer::fold)). Only the
    /// producer stores it; a producer that takes over reads it.
    pub(crate) retain: CachePadded<AtomicU64>,

    /// Nanoseconds the consumers of the ring waited on it empty, summed; only the consumer adds.
    pub(crate) consumer_wait_ns: CachePadded<AtomicU64>,
    /// Nanoseconds the producers of the ring waited on it full, summed; only the producer adds.
    pub(crate) producer_wait_ns: CachePadded<AtomicU64>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<RingHeader>() <= HEADER_LEN);
#[cfg(not(loom))]
const _: () = assert!(std::mem::align_of::<RingHeader>() <= HEADER_LEN);

/// Why a ring's header page cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderFault {
    BadMagic(u64),
    UnsupportedVersion(u32),
    BadHeaderLength(u32),
    BadCapacity(u64),
    LengthMismatch { file_len: u64, expected: u64 },
    Cursors { write: u64, read: u64 },
    Retain { retain: u64, read: u64 },
}

impl std::fmt::Display for HeaderFault {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderFault::BadMagic(found) => write!(
                formatter,
                "bad magic {found:#018x} (expected {MAGIC:#018x}): not a sluice ring"
            ),
            HeaderFault::UnsupportedVersion(found) => write!(
                formatter,
                "layout version {found}, this build reads version {LAYOUT_VERSION}: use a sluice build of the same version on both sides"
            ),
            HeaderFault::BadHeaderLength(found) => {
                write!(formatter, "header length {found}, expected {HEADER_LEN}")
            }
            HeaderFault::BadCapacity(found) => write!(
                formatter,
                "capacity {found} is not a positive multiple of {RECORD_ALIGN}"
            ),
            HeaderFault::LengthMismatch { file_len, expected } => write!(
                formatter,
                "file is {file_len} bytes, the header says {expected}: the file is truncated or corrupt"
            ),
            HeaderFault::Cursors { write, read } => write!(
                formatter,
                "inconsistent cursors (write {write}, read {read}): the ring is corrupt"
            ),
            HeaderFault::Retain { retain, read } => write!(
                formatter,
                "inconsistent cursors (retain {retain}, read {read}): the ring is corrupt"
            ),
        }
    }
}

impl RingHeader {
    /// Checks the immutable fields and the cursors against the length of the file that holds them.
    pub(crate) fn validate(&self, file_len: u64) -> Result<(), HeaderFault> {
        if self.magic != MAGIC {
            return Err(HeaderFault::BadMagic(self.magic));
        }
        if self.version != LAYOUT_VERSION {
            return Err(HeaderFault::UnsupportedVersion(self.version));
        }
        if self.header_len as usize != HEADER_LEN {
            return Err(HeaderFault::BadHeaderLength(self.header_len));
        }
        let capacity = self.capacity;
        if capacity == 0 || !capacity.is_multiple_of(RECORD_ALIGN) || capacity >= WAITING {
            return Err(HeaderFault::BadCapacity(capacity));
        }
        let expected = capacity.saturating_add(HEADER_LEN as u64);
        if file_len != expected {
            return Err(HeaderFault::LengthMismatch { file_len, expected });
        }
        // The retain cursor is loaded first: it never passes the read cursor, and both only grow,
        // so a read cursor loaded after it is at least as far even while the peers run.
        let retain = self.retain.load(crate::sync::Ordering::Acquire);
        let write = self.write.load(crate::sync::Ordering::Acquire) & !WAITING;
        let read = self.read.load(crate::sync::Ordering::Acquire) & !WAITING;
        check_cursors(write, read, capacity)?;
        if retain > read || !retain.is_multiple_of(RECORD_ALIGN) {
            return Err(HeaderFault::Retain { retain, read });
        }
        Ok(())
    }
}

/// Checks the three cursors a producer takes over, which hold still but for the read cursor:
/// `retain <= read <= write`, at most `capacity` bytes from retain to write, all on record boundaries.
#[inline]
pub(crate) fn check_retained(
    write: u64,
    read: u64,
    retain: u64,
    capacity: u64,
) -> Result<(), HeaderFault> {
    check_cursors(write, read, capacity)?;
    if retain > read || write - retain > capacity || !retain.is_multiple_of(RECORD_ALIGN) {
        return Err(HeaderFault::Retain { retain, read });
    }
    Ok(())
}

/// Checks that a pair of cursors can describe this ring: the reader is not ahead of the writer, at most
/// `capacity` bytes lie between them, and both sit on record boundaries.
#[inline]
pub(crate) fn check_cursors(write: u64, read: u64, capacity: u64) -> Result<(), HeaderFault> {
    if read > write
        || write - read > capacity
        || !write.is_multiple_of(RECORD_ALIGN)
        || !read.is_multiple_of(RECORD_ALIGN)
    {
        return Err(HeaderFault::Cursors { write, read });
    }
    Ok(())
}

/// The kind of a record a user writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RecordKind {
    /// An Arrow IPC schema message; written once before the batches that use it.
    Schema = 1,
    /// An Arrow IPC record batch message.
    Batch = 2,
    /// Marks the end of an epoch for this ring.
    EndOfEpoch = 3,
    /// An error report (UTF-8 text) from the producer.
    Error = 4,
    /// Rows of a task the producer covers without delivering them, its payload empty: a reader
    /// counts them as read and hands out nothing (with `data.even_batches: drop`, the rows of an
    /// epoch past its settled batch count).
    Dropped = 6,
}

const PADDING_KIND: u32 = 5;

/// What a record says about its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    /// The kind of payload.
    pub kind: RecordKind,
    /// The task whose rows the record holds.
    pub task_id: u64,
    /// The index, in the task's row order, of the first row in the record.
    pub first_row: u64,
    /// The number of rows in the record.
    pub row_count: u64,
    /// A number the producer tags the record with, opaque to the ring (0: none). It lies in the
    /// record's header, under its checksum, and a ledger keeps the largest tag it folded
    /// ([`crate::ledger::Ledger::largest_tag`]): a producer that takes a ring over learns from the
    /// tags of the records folded and of those still unread how far its stream had come.
    pub tag: u64,
}

impl RecordMeta {
    /// A record of `kind` that belongs to no task.
    pub fn of_kind(kind: RecordKind) -> Self {
        RecordMeta {
            kind,
            task_id: 0,
            first_row: 0,
            row_count: 0,
            tag: 0,
        }
    }

    /// This meta with `tag`.
    pub fn tagged(self, tag: u64) -> Self {
        RecordMeta { tag, ..self }
    }
}

/// A record header, as it lies in the data region.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub(crate) payload_len: u64,
    pub(crate) sequence: u64,
    pub(crate) task_id: u64,
    pub(crate) first_row: u64,
    pub(crate) row_count: u64,
    pub(crate) kind: u32,
    pub(crate) check: u32,
    /// The producer's tag ([`RecordMeta::tag`]).
    pub(crate) tag: u64,
    pub(crate) reserved: u64,
}

const _: () = assert!(std::mem::size_of::<RecordHeader>() == RECORD_HEADER_LEN as usize);

/// A record header that passed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ValidRecord {
    pub(crate) sequence: u64,
    /// `None` for padding.
    pub(crate) meta: Option<RecordMeta>,
    pub(crate) payload_len: u64,
    /// Header, payload and alignment padding.
    pub(crate) size: u64,
}

impl ValidRecord {
    /// An empty padding record: what a consumer holds before it hands out its first record.
    pub(crate) const PADDING: ValidRecord = ValidRecord {
        sequence: 0,
        meta: None,
        payload_len: 0,
        size: 0,
    };

    /// The sequence number of the record after this one. Padding takes no number of its own: it carries
    /// the number of the record that follows it, so user records are numbered without gaps.
    #[inline]
    pub(crate) fn next_sequence(&self) -> u64 {
        match self.meta {
            Some(_) => self.sequence + 1,
            None => self.sequence,
        }
    }
}

/// Why a record header cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordFault {
    Checksum,
    Kind(u32),
    Length { payload_len: u64, room: u64 },
    Sequence { found: u64, expected: u64 },
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordFault::Checksum => write!(formatter, "record header checksum mismatch"),
            RecordFault::Kind(kind) => write!(formatter, "unknown record kind {kind}"),
            RecordFault::Length { payload_len, room } => write!(
                formatter,
                "record payload of {payload_len} bytes does not fit the {room} committed bytes before it"
            ),
            RecordFault::Sequence { found, expected } => write!(
                formatter,
                "record sequence {found}, expected {expected}: records were lost or repeated"
            ),
        }
    }
}

/// The size a record with a payload of `payload_len` bytes takes in the ring, or `None` on overflow.
#[inline]
pub(crate) fn record_size(payload_len: u64) -> Option<u64> {
    payload_len
        .checked_add(RECORD_HEADER_LEN + RECORD_ALIGN - 1)
        .map(|size| size & !(RECORD_ALIGN - 1))
}

impl RecordHeader {
    #[inline]
    pub(crate) fn new(payload_len: u64, sequence: u64, meta: Option<RecordMeta>) -> Self {
        let (kind, task_id, first_row, row_count, tag) = match meta {
            Some(meta) => (
                meta.kind as u32,
                meta.task_id,
                meta.first_row,
                meta.row_count,
                meta.tag,
            ),
            None => (PADDING_KIND, 0, 0, 0, 0),
        };
        let mut header = RecordHeader {
            payload_len,
            sequence,
            task_id,
            first_row,
            row_count,
            kind,
            check: 0,
            tag,
            reserved: 0,
        };
        header.check = header.checksum();
        header
    }

    /// A cheap hash of every field but `check` (FNV-1a over the words, folded to 32 bits). The tag
    /// counts only when set, so that a record without one hashes as records did before tags.
    #[inline]
    fn checksum(&self) -> u32 {
        let words = [
            self.payload_len,
            self.sequence,
            self.task_id,
            self.first_row,
            self.row_count,
            u64::from(self.kind),
        ];
        let step = |hash: u64, word: &u64| (hash ^ word).wrapping_mul(0x0100_0000_01b3);
        let mut hash = words.iter().fold(0xcbf2_9ce4_8422_2325_u64, step);
        if self.tag != 0 {
            hash = step(hash, &self.tag);
        }
        (hash ^ (hash >> 32)) as u32
    }

    /// Validates a header read at a record boundary with `room` committed bytes from the boundary on, of
    /// which `contiguous` lie before the end of the data region.
    #[inline]
    pub(crate) fn validate(
        &self,
        room: u64,
        contiguous: u64,
        expected_sequence: Option<u64>,
    ) -> Result<ValidRecord, RecordFault> {
        if self.check != self.checksum() {
            return Err(RecordFault::Checksum);
        }
        let kind = match self.kind {
            1 => Some(RecordKind::Schema),
            2 => Some(RecordKind::Batch),
            3 => Some(RecordKind::EndOfEpoch),
            4 => Some(RecordKind::Error),
            6 => Some(RecordKind::Dropped),
            PADDING_KIND => None,
            other => return Err(RecordFault::Kind(other)),
        };
        let fault = RecordFault::Length {
            payload_len: self.payload_len,
            room: room.min(contiguous),
        };
        let size = record_size(self.payload_len).ok_or(fault.clone())?;
        if size > room || size > contiguous {
            return Err(fault);
        }
        if let Some(expected) = expected_sequence
            && self.sequence != expected
        {
            return Err(RecordFault::Sequence {
                found: self.sequence,
                expected,
            });
        }
        Ok(ValidRecord {
            sequence: self.sequence,
            meta: kind.map(|kind| RecordMeta {
                kind,
                task_id: self.task_id,
                first_row: self.first_row,
                row_count: self.row_count,
                tag: self.tag,
            }),
            payload_len: self.payload_len,
            size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn record_sizes_are_aligned() {
        assert_eq!(record_size(0), Some(64));
        assert_eq!(record_size(1), Some(128));
        assert_eq!(record_size(64), Some(128));
        assert_eq!(record_size(65), Some(192));
        assert_eq!(record_size(u64::MAX - 10), None);
    }

    #[test]
    fn header_round_trips_and_rejects_tampering() {
        let meta = RecordMeta {
            kind: RecordKind::Batch,
            task_id: 7,
            first_row: 100,
            row_count: 50,
            tag: (2 << 32) | 9,
        };
        let sut = RecordHeader::new(1000, 3, Some(meta));
        let valid = sut.validate(4096, 4096, Some(3)).expect("valid");
        assert_eq!(valid.meta, Some(meta));
        assert_eq!(valid.size, 64 + 1024);
        assert_eq!(
            sut.validate(4096, 4096, Some(4)),
            Err(RecordFault::Sequence {
                found: 3,
                expected: 4
            })
        );
        assert!(matches!(
            sut.validate(1024, 4096, Some(3)),
            Err(RecordFault::Length { .. })
        ));
        let mut tampered = sut;
        tampered.row_count = 51;
        assert_eq!(
            tampered.validate(4096, 4096, Some(3)),
            Err(RecordFault::Checksum)
        );
        let mut tampered = sut;
        tampered.tag += 1;
        assert_eq!(
            tampered.validate(4096, 4096, Some(3)),
            Err(RecordFault::Checksum),
            "the tag is under the checksum"
        );
    }

    #[test]
    fn cursors_are_checked() {
        assert!(check_cursors(128, 64, 64).is_ok());
        assert!(check_cursors(64, 128, 1024).is_err());
        assert!(check_cursors(2048, 0, 1024).is_err());
        assert!(check_cursors(65, 0, 1024).is_err());
        assert!(check_retained(1024, 512, 0, 1024).is_ok());
        assert!(check_retained(1024, 512, 576, 1024).is_err());
        assert!(check_retained(2048, 1536, 960, 1024).is_err());
        assert!(check_retained(1024, 512, 65, 1024).is_err());
    }

    /// One field of a valid header changed, with the checksum sealed over the change or not.
    #[derive(Debug, Clone)]
    enum Mutation {
        /// A payload length whose record runs past the committed or contiguous bytes.
        Length(u64),
        /// Another sequence number.
        Sequence(u64),
        /// A kind that is neither a user kind nor padding.
        Kind(u32),
        /// One of the checksummed words with bits flipped, the checksum left as it was.
        Unsealed { word: usize, flip: u64 },
    }

    fn any_meta() -> impl Strategy<Value = Option<RecordMeta>> {
        let kind = prop_oneof![
            Just(RecordKind::Schema),
            Just(RecordKind::Batch),
            Just(RecordKind::EndOfEpoch),
            Just(RecordKind::Error),
            Just(RecordKind::Dropped),
        ];
        proptest::option::of(
            (kind, any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
                |(kind, task_id, first_row, row_count, tag)| RecordMeta {
                    kind,
                    task_id,
                    first_row,
                    row_count,
                    tag,
                },
            ),
        )
    }

    fn any_mutation() -> impl Strategy<Value = Mutation> {
        // Lengths past the room, from just past it to the ones whose size overflows.
        let excess = prop_oneof![0u64..256, any::<u64>(), (u64::MAX - 256)..=u64::MAX];
        prop_oneof![
            excess.prop_map(Mutation::Length),
            (1..=u64::MAX).prop_map(Mutation::Sequence),
            prop_oneof![Just(0u32), 7u32..64, any::<u32>()]
                .prop_filter("not a known kind", |kind| *kind == 0
                    || *kind > RecordKind::Dropped as u32)
                .prop_map(Mutation::Kind),
            (0usize..6, 1..=u64::MAX).prop_map(|(word, flip)| Mutation::Unsealed { word, flip }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 16 } else { 2048 }))]

        /// A header built by the real constructor passes; one field changed after it, with the
        /// checksum sealed over the change, is caught by the check of that field; a change the
        /// checksum was not sealed over is caught by the checksum.
        #[test]
        fn each_changed_field_of_a_valid_header_is_caught_by_its_own_check(
            meta in any_meta(),
            payload_len in 0u64..65_536,
            sequence in any::<u64>(),
            spare_room in 0u64..64,
            spare_contiguous in 0u64..64,
            mutation in any_mutation(),
        ) {
            let size = record_size(payload_len).expect("a small payload");
            let room = size + spare_room * RECORD_ALIGN;
            let contiguous = size + spare_contiguous * RECORD_ALIGN;
            let valid = RecordHeader::new(payload_len, sequence, meta);
            prop_assert_eq!(
                valid.validate(room, contiguous, Some(sequence)),
                Ok(ValidRecord { sequence, meta, payload_len, size })
            );
            let mut sut = valid;
            let expected = match mutation {
                Mutation::Length(excess) => {
                    // The smallest payload whose record takes more than `fits` bytes is `fits - 63`.
                    let fits = room.min(contiguous);
                    sut.payload_len = (fits - (RECORD_ALIGN - 1)).saturating_add(excess);
                    RecordFault::Length { payload_len: sut.payload_len, room: fits }
                }
                Mutation::Sequence(delta) => {
                    sut.sequence = sequence.wrapping_add(delta);
                    RecordFault::Sequence { found: sut.sequence, expected: sequence }
                }
                Mutation::Kind(kind) => {
                    sut.kind = kind;
                    RecordFault::Kind(kind)
                }
                Mutation::Unsealed { word, flip } => {
                    match word {
                        0 => sut.payload_len ^= flip,
                        1 => sut.sequence ^= flip,
                        2 => sut.task_id ^= flip,
                        3 => sut.first_row ^= flip,
                        4 => sut.row_count ^= flip,
                        _ => sut.kind ^= (flip as u32).max(1),
                    }
                    RecordFault::Checksum
                }
            };
            if !matches!(mutation, Mutation::Unsealed { .. }) {
                sut.check = sut.checksum();
            }
            prop_assert_eq!(sut.validate(room, contiguous, Some(sequence)), Err(expected));
        }

        /// Any 64 bytes at a record boundary, with any room, validate or fail without a panic, and a
        /// record that validates fits the room it was given. Half the headers carry their own
        /// checksum, so that the checks after it see any values too.
        #[test]
        fn any_header_bytes_validate_within_their_room(
            payload_len in prop_oneof![0u64..8192, any::<u64>()],
            words in proptest::array::uniform4(any::<u64>()),
            kind in prop_oneof![0u32..8, any::<u32>()],
            check in any::<u32>(),
            sealed in any::<bool>(),
            room in prop_oneof![0u64..8192, any::<u64>()],
            contiguous in prop_oneof![0u64..8192, any::<u64>()],
            expected_sequence in proptest::option::of(any::<u64>()),
        ) {
            let mut sut = RecordHeader {
                payload_len,
                sequence: words[0],
                task_id: words[1],
                first_row: words[2],
                row_count: words[3],
                kind,
                check,
                tag: 0,
                reserved: 0,
            };
            if sealed {
                sut.check = sut.checksum();
            }
            if let Ok(valid) = sut.validate(room, contiguous, expected_sequence) {
                prop_assert!(valid.size <= room && valid.size <= contiguous);
                prop_assert!(valid.payload_len + RECORD_HEADER_LEN <= valid.size);
            }
        }
    }
}
