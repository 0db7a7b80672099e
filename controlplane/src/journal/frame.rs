//! The byte formats of segments and snapshots, as pure functions over byte slices.
//!
//! A segment is [`SEGMENT_MAGIC`] followed by frames. A frame is
//! `length: u32 LE | crc: u32 LE | kind: u8 | body`, where `length` counts `kind` and `body`, and
//! `crc` is the CRC-32C of the four length bytes followed by `kind` and `body`. Covering the length
//! means a zero-filled region never reads as a frame (the CRC-32C of four zero bytes is not zero).
//!
//! A snapshot is `SNAPSHOT_MAGIC | sequence: u64 LE | length: u64 LE | crc: u32 LE | body`, where
//! `crc` covers `sequence`, `length` and `body`.

/// The first bytes of every segment.
pub(super) const SEGMENT_MAGIC: &[u8; 8] = b"SLJRNL01";
/// The first bytes of every snapshot.
pub(super) const SNAPSHOT_MAGIC: &[u8; 8] = b"SLSNAP01";
/// Bytes before a frame's kind: length and crc.
pub(super) const FRAME_HEADER: usize = 8;
/// The largest frame payload (kind and body) the journal writes or reads.
pub(super) const MAX_FRAME_PAYLOAD: usize = 64 << 20;
/// Bytes before a snapshot's body.
pub(super) const SNAPSHOT_HEADER: usize = 28;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecordKind {
    /// A writer opened the journal here (its body is an [`super::store::OpenRecord`]).
    Open,
    /// An entry the caller appended.
    Entry,
}

impl RecordKind {
    fn tag(self) -> u8 {
        match self {
            RecordKind::Open => 0,
            RecordKind::Entry => 1,
        }
    }

    fn from_tag(tag: u8) -> Option<RecordKind> {
        match tag {
            0 => Some(RecordKind::Open),
            1 => Some(RecordKind::Entry),
            _ => None,
        }
    }
}

/// Appends one frame holding `body` to `out`.
///
/// The caller checks `body.len() < MAX_FRAME_PAYLOAD` first.
pub(super) fn push_frame(out: &mut Vec<u8>, kind: RecordKind, body: &[u8]) {
    debug_assert!(
        body.len() < MAX_FRAME_PAYLOAD,
        "frame body of {} bytes",
        body.len()
    );
    let length = u32::try_from(body.len() + 1).expect("frame length below MAX_FRAME_PAYLOAD");
    let length_bytes = length.to_le_bytes();
    let tag = [kind.tag()];
    let crc = crc32c::crc32c_append(
        crc32c::crc32c_append(crc32c::crc32c(&length_bytes), &tag),
        body,
    );
    out.extend_from_slice(&length_bytes);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&tag);
    out.extend_from_slice(body);
}

/// One record read from a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame<'a> {
    /// The frame's byte offset in the segment.
    pub offset: u64,
    pub kind: RecordKind,
    pub body: &'a [u8],
}

/// Why reading a segment stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BadFrame {
    /// The byte offset of the first frame that does not read.
    pub offset: u64,
    /// What is wrong with it.
    pub reason: String,
    /// The offset of a well-formed frame after it, if any: then the damage is not a torn tail.
    pub valid_frame_after: Option<u64>,
}

/// A segment read up to a record limit, its end, or its first bad frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParsedSegment<'a> {
    pub frames: Vec<Frame<'a>>,
    /// Where the frames stopped, when a frame did not read.
    pub bad: Option<BadFrame>,
    /// The offset just past the last frame read.
    pub end: u64,
}

/// Why a segment cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NotASegment {
    pub reason: String,
}

/// Reads the frames of a segment, stopping after `limit` frames when given.
///
/// # Errors
///
/// Returns [`NotASegment`] when the object does not start with [`SEGMENT_MAGIC`].
pub(super) fn parse_segment(
    bytes: &[u8],
    limit: Option<u64>,
) -> Result<ParsedSegment<'_>, NotASegment> {
    if bytes.len() < SEGMENT_MAGIC.len() || &bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC {
        return Err(NotASegment {
            reason: format!(
                "not a journal segment: it does not start with {:?}",
                String::from_utf8_lossy(SEGMENT_MAGIC)
            ),
        });
    }
    let mut frames = Vec::new();
    let mut offset = SEGMENT_MAGIC.len();
    while offset < bytes.len() && limit.is_none_or(|limit| (frames.len() as u64) < limit) {
        match read_frame(bytes, offset) {
            Ok(frame) => {
                offset += FRAME_HEADER + 1 + frame.body.len();
                frames.push(frame);
            }
            Err(reason) => {
                let valid_frame_after = ((offset + 1)..bytes.len())
                    .find(|&candidate| read_frame(bytes, candidate).is_ok())
                    .map(|candidate| candidate as u64);
                return Ok(ParsedSegment {
                    frames,
                    bad: Some(BadFrame {
                        offset: offset as u64,
                        reason,
                        valid_frame_after,
                    }),
                    end: offset as u64,
                });
            }
        }
    }
    Ok(ParsedSegment {
        frames,
        bad: None,
        end: offset as u64,
    })
}

/// Reads the frame at `offset`, or says why there is none.
fn read_frame(bytes: &[u8], offset: usize) -> Result<Frame<'_>, String> {
    let remaining = bytes.len() - offset;
    if remaining < FRAME_HEADER + 1 {
        return Err(format!(
            "{remaining} bytes left, too few for a frame (a write cut short)"
        ));
    }
    let length_bytes: [u8; 4] = bytes[offset..offset + 4].try_into().expect("4 bytes");
    let length = u32::from_le_bytes(length_bytes) as usize;
    if length == 0 || length > MAX_FRAME_PAYLOAD {
        return Err(format!("frame length {length} is out of range"));
    }
    if length > remaining - FRAME_HEADER {
        return Err(format!(
            "frame of {length} bytes runs past the end of the object ({} bytes left; a write cut short)",
            remaining - FRAME_HEADER
        ));
    }
    let stored = u32::from_le_bytes(bytes[offset + 4..offset + 8].try_into().expect("4 bytes"));
    let payload = &bytes[offset + FRAME_HEADER..offset + FRAME_HEADER + length];
    let computed = crc32c::crc32c_append(crc32c::crc32c(&length_bytes), payload);
    if stored != computed {
        return Err(format!(
            "frame crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    let kind = RecordKind::from_tag(payload[0]).ok_or_else(|| {
        format!(
            "unknown record kind {} (written by a newer version of Sluice?)",
            payload[0]
        )
    })?;
    Ok(Frame {
        offset: offset as u64,
        kind,
        body: &payload[1..],
    })
}

/// Returns a snapshot buffer whose first [`SNAPSHOT_HEADER`] bytes are reserved for
/// [`seal_snapshot`]; the caller appends the body.
pub(super) fn snapshot_buffer() -> Vec<u8> {
    let mut buffer = Vec::with_capacity(4096);
    buffer.extend_from_slice(SNAPSHOT_MAGIC);
    buffer.resize(SNAPSHOT_HEADER, 0);
    buffer
}

/// Fills in the header of a buffer from [`snapshot_buffer`] once its body is complete.
pub(super) fn seal_snapshot(buffer: &mut [u8], sequence: u64) {
    debug_assert!(buffer.len() >= SNAPSHOT_HEADER && &buffer[..8] == SNAPSHOT_MAGIC);
    let length = (buffer.len() - SNAPSHOT_HEADER) as u64;
    buffer[8..16].copy_from_slice(&sequence.to_le_bytes());
    buffer[16..24].copy_from_slice(&length.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buffer[8..24]), &buffer[SNAPSHOT_HEADER..]);
    buffer[24..28].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a snapshot's header and crc and returns its body.
///
/// # Errors
///
/// Returns the byte offset of the damage and what is wrong.
pub(super) fn open_snapshot(bytes: &[u8], sequence: u64) -> Result<&[u8], (u64, String)> {
    if bytes.len() < SNAPSHOT_HEADER || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err((
            0,
            format!(
                "not a journal snapshot: it does not start with {:?}",
                String::from_utf8_lossy(SNAPSHOT_MAGIC)
            ),
        ));
    }
    let stored_sequence = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if stored_sequence != sequence {
        return Err((
            8,
            format!("the snapshot says sequence {stored_sequence}, its name says {sequence}"),
        ));
    }
    let length = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let actual = (bytes.len() - SNAPSHOT_HEADER) as u64;
    if length != actual {
        return Err((
            16,
            format!("the snapshot says {length} body bytes, the object holds {actual}"),
        ));
    }
    let stored = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    let computed = crc32c::crc32c_append(crc32c::crc32c(&bytes[8..24]), &bytes[SNAPSHOT_HEADER..]);
    if stored != computed {
        return Err((
            24,
            format!("snapshot crc32c mismatch (stored {stored:#010x}, computed {computed:#010x})"),
        ));
    }
    Ok(&bytes[SNAPSHOT_HEADER..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segment(bodies: &[&[u8]]) -> Vec<u8> {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        for body in bodies {
            push_frame(&mut bytes, RecordKind::Entry, body);
        }
        bytes
    }

    #[test]
    fn frames_round_trip_and_stop_at_the_limit() {
        let bytes = segment(&[b"one", b"", b"three"]);
        let sut = parse_segment(&bytes, None).expect("a segment");
        assert_eq!(sut.bad, None);
        let bodies: Vec<&[u8]> = sut.frames.iter().map(|frame| frame.body).collect();
        assert_eq!(bodies, vec![&b"one"[..], b"", b"three"]);
        assert_eq!(sut.end, bytes.len() as u64);
        let limited = parse_segment(&bytes, Some(2)).expect("a segment");
        assert_eq!(limited.frames.len(), 2);
        assert_eq!(
            limited.end,
            (SEGMENT_MAGIC.len() + 2 * (FRAME_HEADER + 1) + 3) as u64
        );
    }

    #[test]
    fn a_cut_last_frame_is_a_torn_tail() {
        let bytes = segment(&[b"one", b"two"]);
        for cut in (SEGMENT_MAGIC.len() + FRAME_HEADER + 4 + 1)..bytes.len() {
            let sut = parse_segment(&bytes[..cut], None).expect("a segment");
            assert_eq!(sut.frames.len(), 1, "cut at {cut}");
            let bad = sut.bad.expect("stops at the cut frame");
            assert_eq!(bad.offset, (SEGMENT_MAGIC.len() + FRAME_HEADER + 4) as u64);
            assert_eq!(bad.valid_frame_after, None, "cut at {cut}");
        }
    }

    #[test]
    fn a_zero_filled_tail_is_not_a_frame() {
        let mut bytes = segment(&[b"one"]);
        let end = bytes.len();
        bytes.resize(end + 4096, 0);
        let sut = parse_segment(&bytes, None).expect("a segment");
        assert_eq!(sut.frames.len(), 1);
        let bad = sut.bad.expect("zeros do not read");
        assert_eq!((bad.offset, bad.valid_frame_after), (end as u64, None));
    }

    #[test]
    fn a_damaged_frame_followed_by_good_ones_is_found() {
        let mut bytes = segment(&[b"one", b"two", b"three"]);
        let second = SEGMENT_MAGIC.len() + FRAME_HEADER + 4;
        bytes[second + FRAME_HEADER + 2] ^= 0x40;
        let sut = parse_segment(&bytes, None).expect("a segment");
        assert_eq!(sut.frames.len(), 1);
        let bad = sut.bad.expect("the flipped bit is caught");
        assert_eq!(bad.offset, second as u64);
        assert!(bad.reason.contains("crc32c mismatch"), "{}", bad.reason);
        assert_eq!(
            bad.valid_frame_after,
            Some((second + FRAME_HEADER + 4) as u64)
        );
    }

    #[test]
    fn a_foreign_object_is_not_a_segment() {
        let error = parse_segment(b"PAR1....", None).expect_err("not a segment");
        assert!(error.reason.contains("SLJRNL01"), "{}", error.reason);
    }

    #[test]
    fn snapshots_round_trip_and_detect_damage() {
        let mut buffer = snapshot_buffer();
        buffer.extend_from_slice(b"the state");
        seal_snapshot(&mut buffer, 42);
        assert_eq!(open_snapshot(&buffer, 42), Ok(&b"the state"[..]));
        assert_eq!(open_snapshot(&buffer, 41).expect_err("wrong name").0, 8);
        let mut flipped = buffer.clone();
        *flipped.last_mut().expect("a body") ^= 1;
        assert_eq!(open_snapshot(&flipped, 42).expect_err("flipped").0, 24);
        assert_eq!(
            open_snapshot(&buffer[..buffer.len() - 1], 42)
                .expect_err("cut")
                .0,
            16
        );
    }

    fn any_records() -> impl Strategy<Value = Vec<(RecordKind, Vec<u8>)>> {
        let kind = prop_oneof![Just(RecordKind::Open), Just(RecordKind::Entry)];
        proptest::collection::vec((kind, proptest::collection::vec(any::<u8>(), 0..200)), 0..8)
    }

    /// The segment of `records`, and the offset of each frame and of the segment's end.
    fn framed(records: &[(RecordKind, Vec<u8>)]) -> (Vec<u8>, Vec<u64>) {
        let mut bytes = SEGMENT_MAGIC.to_vec();
        let mut offsets = Vec::new();
        for (kind, body) in records {
            offsets.push(bytes.len() as u64);
            push_frame(&mut bytes, *kind, body);
        }
        offsets.push(bytes.len() as u64);
        (bytes, offsets)
    }

    /// The index of the frame holding byte `index` of a segment (at or past the magic).
    fn frame_holding(offsets: &[u64], index: usize) -> usize {
        offsets.partition_point(|&offset| offset <= index as u64) - 1
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Frames read back as they were pushed, up to any limit.
        #[test]
        fn pushed_frames_read_back(records in any_records(), limit in proptest::option::of(0u64..10)) {
            let (bytes, offsets) = framed(&records);
            let sut = parse_segment(&bytes, limit).expect("a segment");
            let read = limit.map_or(records.len(), |limit| records.len().min(limit as usize));
            prop_assert_eq!(sut.bad, None);
            prop_assert_eq!(sut.end, offsets[read]);
            let frames: Vec<(u64, RecordKind, &[u8])> =
                sut.frames.iter().map(|frame| (frame.offset, frame.kind, frame.body)).collect();
            let expected: Vec<(u64, RecordKind, &[u8])> = records[..read]
                .iter()
                .zip(&offsets)
                .map(|((kind, body), &offset)| (offset, *kind, body.as_slice()))
                .collect();
            prop_assert_eq!(frames, expected);
        }

        /// Any bytes after the magic read as frames lying end to end from the magic on, then stop
        /// at the end or at a bad frame, and a well-formed frame after it is one that reads.
        #[test]
        fn any_segment_bytes_read_as_frames_end_to_end(
            tail in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..512),
                // Frames with their CRC, then noise, so that the reads after the CRC are reached.
                (any_records(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(
                    |(records, noise)| {
                        let mut bytes = framed(&records).0.split_off(SEGMENT_MAGIC.len());
                        bytes.extend_from_slice(&noise);
                        bytes
                    }
                ),
            ],
        ) {
            let mut bytes = SEGMENT_MAGIC.to_vec();
            bytes.extend_from_slice(&tail);
            let sut = parse_segment(&bytes, None).expect("a segment");
            let mut offset = SEGMENT_MAGIC.len() as u64;
            for frame in &sut.frames {
                prop_assert_eq!(frame.offset, offset);
                offset += (FRAME_HEADER + 1 + frame.body.len()) as u64;
            }
            prop_assert_eq!(sut.end, offset);
            match sut.bad {
                None => prop_assert_eq!(sut.end, bytes.len() as u64),
                Some(bad) => {
                    prop_assert_eq!(bad.offset, sut.end);
                    if let Some(after) = bad.valid_frame_after {
                        prop_assert!(after > bad.offset);
                        prop_assert!(read_frame(&bytes, after as usize).is_ok());
                    }
                }
            }
        }

        /// A segment with one byte changed reads the frames before the frame that holds it and
        /// stops there; the next frame, if any, is found well formed after it.
        #[test]
        fn a_changed_byte_stops_the_segment_at_its_frame(
            records in any_records().prop_filter("a frame", |records| !records.is_empty()),
            at in any::<proptest::sample::Index>(),
            flip in 1..=u8::MAX,
        ) {
            let (mut bytes, offsets) = framed(&records);
            let index = SEGMENT_MAGIC.len() + at.index(bytes.len() - SEGMENT_MAGIC.len());
            bytes[index] ^= flip;
            let changed = frame_holding(&offsets, index);
            let sut = parse_segment(&bytes, None).expect("a segment");
            prop_assert_eq!(sut.frames.len(), changed);
            let bad = sut.bad.expect("the change is caught");
            prop_assert_eq!(bad.offset, offsets[changed]);
            if changed + 1 < records.len() {
                prop_assert_eq!(bad.valid_frame_after, Some(offsets[changed + 1]));
            }
        }

        /// A segment cut short reads the whole frames before the cut; a cut inside a frame is a
        /// torn tail, with no well-formed frame after it.
        #[test]
        fn a_cut_segment_is_a_torn_tail(
            records in any_records(),
            at in any::<proptest::sample::Index>(),
        ) {
            let (bytes, offsets) = framed(&records);
            let cut = SEGMENT_MAGIC.len() + at.index(bytes.len() - SEGMENT_MAGIC.len() + 1);
            let sut = parse_segment(&bytes[..cut], None).expect("a segment");
            let whole = frame_holding(&offsets, cut);
            prop_assert_eq!(sut.frames.len(), whole);
            if offsets[whole] == cut as u64 {
                prop_assert_eq!(sut.bad, None);
            } else {
                let bad = sut.bad.expect("the cut frame does not read");
                prop_assert_eq!((bad.offset, bad.valid_frame_after), (offsets[whole], None));
            }
        }

        /// Any bytes open as a snapshot or fail naming an offset in its header; a sealed snapshot
        /// opens to its body under its own sequence only, and a changed byte fails at the field that
        /// holds it (the CRC for the body).
        #[test]
        fn snapshots_open_only_whole_and_under_their_sequence(
            body in proptest::collection::vec(any::<u8>(), 0..300),
            sequence in any::<u64>(),
            other_sequence in any::<u64>(),
            at in any::<proptest::sample::Index>(),
            flip in 1..=u8::MAX,
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut sealed = snapshot_buffer();
            sealed.extend_from_slice(&body);
            seal_snapshot(&mut sealed, sequence);
            prop_assert_eq!(open_snapshot(&sealed, sequence), Ok(&body[..]));
            if other_sequence != sequence {
                prop_assert_eq!(open_snapshot(&sealed, other_sequence).map_err(|error| error.0), Err(8));
            }
            let mut changed = sealed.clone();
            let index = at.index(changed.len());
            changed[index] ^= flip;
            let field = match index {
                0..8 => 0,
                8..16 => 8,
                16..24 => 16,
                _ => 24,
            };
            prop_assert_eq!(open_snapshot(&changed, sequence).map_err(|error| error.0), Err(field));
            let mut foreign = SNAPSHOT_MAGIC.to_vec();
            foreign.extend_from_slice(&noise);
            for bytes in [&noise, &foreign] {
                if let Err((offset, _)) = open_snapshot(bytes, sequence) {
                    prop_assert!(offset < SNAPSHOT_HEADER as u64);
                }
            }
        }
    }
}
