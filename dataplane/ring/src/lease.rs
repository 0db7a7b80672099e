//! Leases: records held past the next call to [`Consumer::next`](crate::Consumer::next), released in
//! any order.
//!
//! A [`Record`](crate::Record) borrows its consumer, so it is released before the next record is read.
//! A trainer that keeps batch N while it reads N+1.. turns the record into a [`Lease`] with
//! [`Record::lease`](crate::Record::lease): an owned value that keeps the ring mapped and its bytes
//! unwritten until it is dropped, on any thread, in any order.
//!
//! # Implementation
//!
//! The read cursor says which bytes the producer may write again, and the node daemon turns it into
//! per-task consumed counts, so it must stay a prefix in ring order. While leases are outstanding, the
//! consumer and its leases share a [`LeaseBook`]: under its lock, the records handed out past the
//! **released prefix** in ring order, each marked released or not. A release marks its record, then
//! the prefix advances over the leading released records, and only the prefix is ever published as the
//! read cursor. Records the consumer reads past a held lease (plain records, padding) enter the book as
//! released at once, behind it.
//!
//! While the book is in use, the read cursor is written only under its lock, by the consumer or by a
//! lease being dropped, so the ring still has one writer of the read cursor at a time. A lease that
//! advances the prefix publishes at once, whatever the batching threshold: its holder may drop it while
//! the consumer sleeps waiting for data and the producer sleeps waiting for space, and then nobody else
//! would publish. When the consumer finds the book empty (no record handed out and unreleased), it
//! takes the cursor back and goes on without the lock.
//!
//! A consumer dropped while leases are outstanding keeps its role until the last one is released, so
//! no new consumer can read the leased records again and publish the cursor at the same time.

use std::collections::VecDeque;
use std::sync::Arc;

// The one lock of the ring, on the consumer's side only; under loom, loom's, like the atomics in
// `sync`, so that the models explore the interleavings of releases on several threads.
#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard};

use crate::consumer::publish_read_cursor;
use crate::layout::{RECORD_HEADER_LEN, RecordMeta, ValidRecord, WAITING};
use crate::sync::Ordering;
use crate::{Shared, role};

/// One record of a ring, owned: it keeps its bytes from the producer until it is dropped (or
/// [`Lease::release`]d), while the consumer reads on.
///
/// Taken with [`Record::lease`](crate::Record::lease). The read cursor only passes the records before
/// the oldest unreleased lease, so a held lease holds back the ring's space after it: a consumer that
/// keeps leases over the whole ring waits for them to be released.
#[derive(Debug)]
pub struct Lease {
    book: Arc<LeaseBook>,
    position: u64,
    offset: u64,
    valid: ValidRecord,
}

/// What a consumer and its leases share while leases are outstanding.
#[derive(Debug)]
pub(crate) struct LeaseBook {
    shared: Arc<Shared>,
    state: Mutex<BookState>,
}

#[derive(Debug)]
struct BookState {
    /// The end of the released prefix: every record before it is released.
    released: u64,
    /// The sequence number of the record at `released`.
    released_sequence: u64,
    /// The read cursor as last published.
    published: u64,
    /// The records handed out from `released` on, in ring order; the first one is unreleased.
    outstanding: VecDeque<Outstanding>,
    /// The consumer's packed identity, once the consumer was dropped with leases outstanding: the
    /// release that empties the book gives the role up.
    orphaned_role: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    position: u64,
    end: u64,
    next_sequence: u64,
    released: bool,
}

/// Where the read cursor stands when the consumer takes it back from an empty book.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handback {
    /// The read cursor as last published.
    pub(crate) published: u64,
}

impl LeaseBook {
    /// Starts a book at the consumer's released position, sequence number and published cursor.
    pub(crate) fn new(
        shared: Arc<Shared>,
        released: u64,
        released_sequence: u64,
        published: u64,
    ) -> LeaseBook {
        LeaseBook {
            shared,
            state: Mutex::new(BookState {
                released,
                released_sequence,
                published,
                outstanding: VecDeque::new(),
                orphaned_role: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BookState> {
        // A panic while the lock was held left the state consistent: every change under it is a
        // push, a pop or a flag, each complete before anything that can panic.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands out the record `[position, end)` as a lease.
    pub(crate) fn lease(
        book: &Arc<LeaseBook>,
        position: u64,
        offset: u64,
        valid: ValidRecord,
    ) -> Lease {
        let mut state = book.lock();
        debug_assert!(
            state
                .outstanding
                .back()
                .map_or(state.released, |last| last.end)
                == position,
            "records are handed out in ring order"
        );
        state.outstanding.push_back(Outstanding {
            position,
            end: position + valid.size,
            next_sequence: valid.next_sequence(),
            released: false,
        });
        drop(state);
        Lease {
            book: Arc::clone(book),
            position,
            offset,
            valid,
        }
    }

    /// Releases the record `[position, end)` that the consumer read and let go of in order (a
    /// [`Record`](crate::Record) dropped, or padding). Publishes the read cursor once `threshold`
    /// bytes are pending or the producer waits. Returns where the cursor stands when no lease is
    /// outstanding any more, for the consumer to take it back.
    pub(crate) fn release_in_order(
        &self,
        position: u64,
        end: u64,
        next_sequence: u64,
        threshold: u64,
    ) -> Option<Handback> {
        let mut state = self.lock();
        if state.outstanding.is_empty() {
            debug_assert_eq!(
                state.released, position,
                "records are released in ring order"
            );
            state.released = end;
            state.released_sequence = next_sequence;
        } else {
            state.outstanding.push_back(Outstanding {
                position,
                end,
                next_sequence,
                released: true,
            });
        }
        // Relaxed: only a hint, as in `Consumer::release`; the consumer publishes before it waits.
        let producer_waits = self.shared.header().read.load(Ordering::Relaxed) & WAITING != 0;
        if producer_waits || state.released - state.published >= threshold {
            self.publish(&mut state);
        }
        state.outstanding.is_empty().then_some(Handback {
            published: state.published,
        })
    }

    /// Publishes the released prefix as the read cursor; the consumer calls it before it waits.
    pub(crate) fn publish_released(&self) {
        let mut state = self.lock();
        self.publish(&mut state);
    }

    /// The end of the released prefix.
    pub(crate) fn released(&self) -> u64 {
        self.lock().released
    }

    /// Called by a consumer being dropped: publishes the released prefix and tells whether the book
    /// took the consumer role over, to give it up when the last lease is released.
    pub(crate) fn consumer_dropped(&self, identity: u64) -> bool {
        let mut state = self.lock();
        self.publish(&mut state);
        if state.outstanding.is_empty() {
            return false;
        }
        state.orphaned_role = Some(identity);
        true
    }

    fn release_lease(&self, position: u64) {
        let mut state = self.lock();
        let index = state
            .outstanding
            .binary_search_by_key(&position, |outstanding| outstanding.position)
            .expect("an unreleased lease is in its book");
        debug_assert!(!state.outstanding[index].released);
        state.outstanding[index].released = true;
        let before = state.released;
        while let Some(front) = state.outstanding.front().copied()
            && front.released
        {
            state.outstanding.pop_front();
            state.released = front.end;
            state.released_sequence = front.next_sequence;
        }
        if state.released != before {
            self.publish(&mut state);
        }
        if state.outstanding.is_empty()
            && let Some(identity) = state.orphaned_role.take()
        {
            role::give_up(&self.shared.header().consumer, identity);
        }
    }

    fn publish(&self, state: &mut BookState) {
        if state.published != state.released {
            publish_read_cursor(
                &self.shared,
                state.released,
                state.released_sequence,
                state.published,
            );
            state.published = state.released;
        }
    }
}

impl Lease {
    /// The payload, in place, 64-byte aligned.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let shared = &self.book.shared;
        let offset = self.offset + RECORD_HEADER_LEN;
        debug_assert!(offset + self.valid.payload_len <= shared.capacity());
        // SAFETY: the consumer validated the record (inside the data region, below the write cursor)
        // before leasing it. The read cursor passes only released records, so the producer does not
        // write these bytes again while this lease lives, and the book's `shared` keeps the memory
        // mapped as long.
        unsafe {
            std::slice::from_raw_parts(
                shared.data().add(offset as usize),
                self.valid.payload_len as usize,
            )
        }
    }

    /// What the producer said about the payload.
    #[inline]
    pub fn meta(&self) -> RecordMeta {
        self.valid
            .meta
            .expect("padding records are never handed out")
    }

    /// The record's sequence number (see [`Record::sequence`](crate::Record::sequence)).
    pub fn sequence(&self) -> u64 {
        self.valid.sequence
    }

    /// The byte position of the record in the ring's stream: the record is consumed once
    /// [`Consumer::position`](crate::Consumer::position) is past it.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Releases the record; the same as dropping it.
    pub fn release(self) {}
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.book.release_lease(self.position);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::thread;
    use std::time::Duration;

    use crate::*;

    fn meta(row: u64) -> RecordMeta {
        RecordMeta {
            kind: RecordKind::Batch,
            task_id: 1,
            first_row: row,
            row_count: 1,
            tag: 0,
        }
    }

    fn pattern(sequence: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|index| (sequence as usize * 13 + index * 5) as u8)
            .collect()
    }

    fn write(producer: &mut Producer, sequence: u64, len: usize) {
        let mut slot = producer.reserve(len).expect("reserve");
        slot.payload_mut().copy_from_slice(&pattern(sequence, len));
        slot.commit(meta(sequence));
    }

    /// The published read cursor.
    fn read_cursor(ring: &Ring) -> u64 {
        ring.cursors().1
    }

    #[test]
    fn the_read_cursor_covers_the_released_prefix_only() {
        let ring = Ring::in_memory(1 << 16).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut sut = ring.consumer().expect("consumer");
        for sequence in 0..5 {
            write(&mut producer, sequence, 100);
        }
        producer.flush();
        // 100-byte payloads take 192 bytes.
        let first = sut.next().expect("next").expect("record 0").lease();
        let second = sut.next().expect("next").expect("record 1").lease();
        sut.next().expect("next").expect("record 2").release();
        let fourth = sut.next().expect("next").expect("record 3").lease();
        assert_eq!(sut.position(), 0, "record 0 is held");

        drop(second);
        assert_eq!(sut.position(), 0, "a release behind a held lease waits");
        assert_eq!(first.payload(), pattern(0, 100));
        assert_eq!(first.meta(), meta(0));

        drop(first);
        assert_eq!(sut.position(), 3 * 192, "records 0, 1 and 2 are released");
        assert_eq!(
            read_cursor(&ring),
            3 * 192,
            "a lease that advances the prefix publishes it"
        );
        assert_eq!(fourth.sequence(), 3);
        assert_eq!(fourth.position(), 3 * 192);

        fourth.release();
        assert_eq!(sut.position(), 4 * 192);
        let last = sut.next().expect("next").expect("record 4");
        assert_eq!(last.payload(), pattern(4, 100));
        drop(last);
        assert_eq!(
            sut.position(),
            5 * 192,
            "plain records release in order again"
        );
    }

    #[test]
    fn a_held_lease_keeps_its_bytes_while_the_producer_fills_the_rest() {
        let ring = Ring::in_memory(8192).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut sut = ring.consumer().expect("consumer");
        // 1000-byte payloads take 1088 bytes: seven fit in the ring.
        let total = if cfg!(miri) { 12 } else { 40u64 };
        let writer = thread::spawn(move || {
            for sequence in 0..total {
                write(&mut producer, sequence, 1000);
            }
            producer.close();
        });
        let held = sut.next().expect("next").expect("record 0").lease();
        for sequence in 1..7 {
            let record = sut.next().expect("next").expect("a record");
            assert_eq!(record.sequence(), sequence);
        }
        assert_eq!(sut.position(), 0);
        assert!(
            matches!(sut.try_next(), Err(TryRecvError::Empty)),
            "the producer cannot pass the held lease"
        );
        assert_eq!(
            held.payload(),
            pattern(0, 1000),
            "the held bytes are intact"
        );
        let releaser = thread::spawn(move || held.release());
        let mut received = 7;
        while let Some(record) = sut.next().expect("next") {
            assert_eq!(record.sequence(), received);
            assert_eq!(record.payload(), pattern(received, 1000));
            received += 1;
        }
        assert_eq!(received, total);
        releaser.join().expect("releaser");
        writer.join().expect("writer");
    }

    #[test]
    fn a_consumer_dropped_with_leases_keeps_its_role_until_the_last_release() {
        let ring = Ring::in_memory(1 << 16).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut sut = ring.consumer().expect("consumer");
        for sequence in 0..3 {
            write(&mut producer, sequence, 100);
        }
        producer.flush();
        let first = sut.next().expect("next").expect("record 0").lease();
        let second = sut.next().expect("next").expect("record 1").lease();
        drop(sut);
        assert!(
            matches!(ring.consumer(), Err(AttachError::Busy { .. })),
            "leases keep the role"
        );
        drop(first);
        assert!(matches!(ring.consumer(), Err(AttachError::Busy { .. })));
        assert_eq!(
            second.payload(),
            pattern(1, 100),
            "the mapping outlives the consumer"
        );
        drop(second);
        assert_eq!(read_cursor(&ring), 2 * 192);
        let mut next = ring.consumer().expect("the role is free again");
        let record = next.next().expect("next").expect("record 2");
        assert_eq!(
            record.sequence(),
            2,
            "a new consumer starts after the released leases"
        );
    }

    #[test]
    fn a_lease_released_while_the_producer_sleeps_wakes_it() {
        let ring = Ring::in_memory(4096).expect("ring");
        let mut producer = ring.producer().expect("producer");
        let mut sut = ring.consumer().expect("consumer");
        let writer = thread::spawn(move || {
            for sequence in 0..3 {
                write(&mut producer, sequence, 1500);
            }
            producer.close();
        });
        let held = sut.next().expect("next").expect("record 0").lease();
        sut.next().expect("next").expect("record 1").release();
        let started = std::time::Instant::now();
        while !ring.producer_waits() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "waited 30 s for the producer to sleep: deadlock watchdog"
            );
            thread::sleep(Duration::from_millis(1));
        }
        thread::spawn(move || held.release())
            .join()
            .expect("releaser");
        let third = sut.next().expect("next").expect("record 2");
        assert_eq!(third.payload(), pattern(2, 1500));
        drop(third);
        assert!(sut.next().expect("next").is_none());
        writer.join().expect("writer");
    }
}
