//! Property tests of replay over the AM's own records: the journal of `tests/journal_format.rs`,
//! its snapshot and its segments changed (bytes as they lie, records and snapshot bodies sealed
//! again so that their CRCs hold and decoding is reached, object sequences), replayed as the
//! master's [`Entry`] and [`Snapshot`]. Replay gives the state or an error naming the object, and
//! never panics.

use std::path::PathBuf;

use bytes::Bytes;
use proptest::prelude::*;

use super::error::JournalError;
use super::frame::{
    SEGMENT_MAGIC, SNAPSHOT_HEADER, SNAPSHOT_MAGIC, parse_segment, push_frame, seal_snapshot,
    snapshot_buffer,
};
use super::recover::{Stored, StoredObject, replay};
use crate::master::{Entry, Snapshot};

/// The checkpoint location of the recorded job.
fn recorded() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/journal-format-1/checkpoint")
}

fn recorded_object(name: &str, sequence: u64) -> StoredObject {
    let bytes = std::fs::read(recorded().join(name)).expect("the recorded journal");
    StoredObject {
        sequence,
        object: name.to_string(),
        bytes: Bytes::from(bytes),
    }
}

/// The recorded journal as replay reads it: its snapshot (of sequence 30) and its segments, the
/// one before the snapshot with them or not.
fn recorded_journal(with_covered_segment: bool) -> Stored {
    let mut segments = vec![recorded_object("journal/00000000000000000030.log", 30)];
    if with_covered_segment {
        segments.insert(0, recorded_object("journal/00000000000000000022.log", 22));
    }
    Stored {
        snapshot: Some(recorded_object("snapshot/00000000000000000030.snap", 30)),
        segments,
    }
}

/// A change to a run of bytes.
#[derive(Debug, Clone)]
enum Edit {
    Flip {
        at: prop::sample::Index,
        flip: u8,
    },
    Insert {
        at: prop::sample::Index,
        bytes: Vec<u8>,
    },
    Delete {
        at: prop::sample::Index,
        len: usize,
    },
    Cut {
        at: prop::sample::Index,
    },
    Replace(Vec<u8>),
}

impl Edit {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Edit::Flip { at, flip } if !bytes.is_empty() => {
                let index = at.index(bytes.len());
                bytes[index] ^= flip;
            }
            Edit::Flip { .. } => {}
            Edit::Insert {
                at,
                bytes: inserted,
            } => {
                let index = at.index(bytes.len() + 1);
                bytes.splice(index..index, inserted.iter().copied());
            }
            Edit::Delete { at, len } => {
                let index = at.index(bytes.len() + 1);
                bytes.drain(index..(index + len).min(bytes.len()));
            }
            Edit::Cut { at } => bytes.truncate(at.index(bytes.len() + 1)),
            Edit::Replace(replacement) => bytes.clone_from(replacement),
        }
    }
}

/// A change to the stored journal.
#[derive(Debug, Clone)]
enum Change {
    /// Bytes of an object changed as they lie: the CRCs catch it.
    Bytes {
        object: prop::sample::Index,
        edit: Edit,
    },
    /// The snapshot's body changed and the snapshot sealed again.
    SnapshotBody(Edit),
    /// A record's body changed and its frame written again.
    RecordBody {
        segment: prop::sample::Index,
        record: prop::sample::Index,
        edit: Edit,
    },
    /// The sequences the objects' names give.
    Sequences { snapshot: u64, segments: Vec<u64> },
}

fn any_sequence() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..64, any::<u64>(), (u64::MAX - 64)..=u64::MAX]
}

fn any_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1..=u8::MAX).prop_map(|(at, flip)| Edit::Flip { at, flip }),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| Edit::Insert { at, bytes }),
        (any::<prop::sample::Index>(), 1usize..16).prop_map(|(at, len)| Edit::Delete { at, len }),
        any::<prop::sample::Index>().prop_map(|at| Edit::Cut { at }),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Edit::Replace),
    ]
}

fn any_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (any::<prop::sample::Index>(), any_edit())
            .prop_map(|(object, edit)| Change::Bytes { object, edit }),
        any_edit().prop_map(Change::SnapshotBody),
        (
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            any_edit()
        )
            .prop_map(|(segment, record, edit)| Change::RecordBody {
                segment,
                record,
                edit
            }),
        (any_sequence(), prop::collection::vec(any_sequence(), 1..3))
            .prop_map(|(snapshot, segments)| Change::Sequences { snapshot, segments }),
    ]
}

fn edited(bytes: &Bytes, edit: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut owned = bytes.to_vec();
    edit(&mut owned);
    Bytes::from(owned)
}

impl Change {
    fn apply(&self, stored: &mut Stored) {
        match self {
            Change::Bytes { object, edit } => {
                let snapshot = stored.snapshot.iter_mut();
                let objects: Vec<&mut StoredObject> =
                    snapshot.chain(stored.segments.iter_mut()).collect();
                let count = objects.len();
                if let Some(target) = objects.into_iter().nth(object.index(count)) {
                    target.bytes = edited(&target.bytes, |bytes| edit.apply(bytes));
                }
            }
            Change::SnapshotBody(edit) => {
                if let Some(snapshot) = &mut stored.snapshot
                    && snapshot.bytes.len() >= SNAPSHOT_HEADER
                {
                    let mut body = snapshot.bytes[SNAPSHOT_HEADER..].to_vec();
                    edit.apply(&mut body);
                    let mut sealed = snapshot_buffer();
                    sealed.extend_from_slice(&body);
                    seal_snapshot(&mut sealed, snapshot.sequence);
                    snapshot.bytes = Bytes::from(sealed);
                }
            }
            Change::RecordBody {
                segment,
                record,
                edit,
            } => {
                let index = segment.index(stored.segments.len());
                let target = &mut stored.segments[index];
                let Ok(parsed) = parse_segment(&target.bytes, None) else {
                    return;
                };
                if parsed.frames.is_empty() {
                    return;
                }
                let changed = record.index(parsed.frames.len());
                let mut bytes = SEGMENT_MAGIC.to_vec();
                for (position, frame) in parsed.frames.iter().enumerate() {
                    let mut body = frame.body.to_vec();
                    if position == changed {
                        edit.apply(&mut body);
                    }
                    push_frame(&mut bytes, frame.kind, &body);
                }
                bytes.extend_from_slice(&target.bytes[parsed.end as usize..]);
                target.bytes = Bytes::from(bytes);
            }
            Change::Sequences { snapshot, segments } => {
                if let Some(stored_snapshot) = &mut stored.snapshot {
                    stored_snapshot.sequence = *snapshot;
                    stored_snapshot.bytes = edited(&stored_snapshot.bytes, |bytes| {
                        if bytes.starts_with(SNAPSHOT_MAGIC) && bytes.len() >= SNAPSHOT_HEADER {
                            seal_snapshot(bytes, *snapshot);
                        }
                    });
                }
                let mut sequences = segments.clone();
                sequences.sort_unstable();
                sequences.dedup();
                for (segment, sequence) in stored.segments.iter_mut().zip(sequences) {
                    segment.sequence = sequence;
                }
                stored.segments.sort_by_key(|segment| segment.sequence);
            }
        }
    }
}

#[test]
fn the_recorded_journal_replays_as_the_masters_records() {
    for with_covered_segment in [false, true] {
        let sut = replay::<Entry, Snapshot>("mem", recorded_journal(with_covered_segment), false)
            .expect("the recorded journal replays");
        assert!(sut.snapshot.is_some());
        assert!(!sut.entries.is_empty());
        assert_eq!(sut.discarded_bytes, 0);
    }
}

#[test]
fn a_sequence_past_the_largest_is_an_error_naming_the_object() {
    let mut stored = recorded_journal(false);
    Change::Sequences {
        snapshot: u64::MAX - 14,
        segments: vec![u64::MAX - 18],
    }
    .apply(&mut stored);
    let error = replay::<Entry, Snapshot>("mem", stored, false).expect_err("a foreign sequence");
    assert!(
        matches!(
            &error,
            JournalError::Corrupt { object, .. } if object == "snapshot/00000000000000000030.snap"
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("sequence 18446744073709551601"),
        "{error}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The recorded journal, changed, replays or fails with an error of damage, of a gap or of
    /// decoding, and never panics.
    #[test]
    fn a_changed_journal_replays_or_fails_naming_the_damage(
        with_covered_segment in any::<bool>(),
        changes in prop::collection::vec(any_change(), 1..4),
        tears_possible in any::<bool>(),
    ) {
        let mut stored = recorded_journal(with_covered_segment);
        for change in &changes {
            change.apply(&mut stored);
        }
        match replay::<Entry, Snapshot>("mem", stored, tears_possible) {
            Ok(_)
            | Err(
                JournalError::Corrupt { .. }
                | JournalError::MissingRecords { .. }
                | JournalError::Decode { .. },
            ) => {}
            Err(other) => prop_assert!(false, "another error: {other}"),
        }
    }
}
