//! The reading side of a ring.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{AttachError, RecvError, Role, TryRecvError};
use crate::layout::{
    RECORD_HEADER_LEN, RecordHeader, RecordMeta, ValidRecord, WAITING, check_cursors,
};
use crate::lease::{Lease, LeaseBook};
use crate::process::PeerState;
use crate::producer::{LIVENESS_SLICE, SPIN_LIMIT, last_holder, wrap_offset};
use crate::sync::{Ordering, spin_loop};
use crate::{DEFAULT_PEER_TIMEOUT, Shared, role};

/// The single reader of a ring. Taken with [`crate::Ring::consumer`]; gives the role up when dropped.
///
/// Records come out in the order they were committed. A [`Record`] borrows its bytes in place, and
/// releases them to the producer when it is dropped (or [`Record::release`]d); [`Record::lease`] turns
/// it into an owned [`Lease`] that is released whenever it is dropped, in any order (see
/// [`crate::lease`]).
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<Shared>,
    identity: u64,
    /// The end of the last record this consumer handed out and, while `book` is `None`, released.
    read_position: u64,
    /// `read_position % capacity`, kept up to date without a division per record.
    read_offset: u64,
    /// The read cursor as this consumer last published it; at most `publish_threshold` bytes behind
    /// `read_position`.
    published_read: u64,
    publish_threshold: u64,
    /// The write cursor as last seen; the producer may since have moved it further.
    cached_write: u64,
    /// The sequence number of the next record, once known.
    expected_sequence: Option<u64>,
    peer_timeout: Duration,
    empty_wait: Duration,
    /// While leases are outstanding, the book that holds the released prefix and publishes the read
    /// cursor; `published_read` is stale meanwhile.
    book: Option<Arc<LeaseBook>>,
    /// The record at the read position, while a [`Record`] borrows this consumer; it is kept here, not
    /// in the `Record`, so that handing a record out moves one pointer.
    current: ValidRecord,
    /// How long the next wait for data spins before it sleeps (see [`next_spin`]).
    spin: u32,
}

/// One record, borrowed in place from the ring: it starts at the consumer's read position.
#[derive(Debug)]
pub struct Record<'consumer> {
    consumer: &'consumer mut Consumer,
}

enum Wait {
    Data,
    Closed,
}

/// The fewest spins of a wait for data: about a microsecond.
const MIN_SPIN: u32 = if cfg!(loom) { 1 } else { 32 };

/// How long the wait after one that spun `spin` times spins: twice as long, up to [`SPIN_LIMIT`],
/// when data came within the spin (the producer keeps pace, and a sleep would add a wake-up to
/// each record), half as long, down to [`MIN_SPIN`], when the wait had to sleep (the producer is
/// slower than this reader, and spinning burns a core the producer may need). As an adaptive
/// mutex spins.
fn next_spin(spin: u32, caught: bool) -> u32 {
    if caught {
        spin.saturating_mul(2).min(SPIN_LIMIT)
    } else {
        (spin / 2).max(MIN_SPIN)
    }
}

impl Consumer {
    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Consumer, AttachError> {
        let header = shared.header();
        let identity = role::claim(&header.consumer, Role::Consumer, shared.path())?;
        let write = header.write.load(Ordering::Acquire) & !WAITING;
        let read = header.read.load(Ordering::Acquire) & !WAITING;
        if let Err(fault) = check_cursors(write, read, shared.capacity()) {
            role::give_up(&header.consumer, identity);
            return Err(AttachError::Corrupt {
                path: shared.path().to_path_buf(),
                reason: fault.to_string(),
            });
        }
        // With records waiting, the first one's sequence number is taken as it is; otherwise the next
        // record follows the last one released, whose successor's number the previous consumer stored.
        let publish_threshold = publish_threshold(shared.capacity());
        let read_offset = read % shared.capacity();
        let expected_sequence =
            (read == write).then(|| header.read_sequence.load(Ordering::Acquire));
        Ok(Consumer {
            shared,
            identity,
            read_position: read,
            read_offset,
            published_read: read,
            publish_threshold,
            cached_write: write,
            expected_sequence,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            empty_wait: Duration::ZERO,
            book: None,
            current: ValidRecord::PADDING,
            spin: SPIN_LIMIT,
        })
    }

    /// Sets how long [`Consumer::next`] waits on an empty ring with no live producer before it fails.
    pub fn set_peer_timeout(&mut self, timeout: Duration) {
        self.peer_timeout = timeout;
    }

    /// Returns the next record, waiting while the ring is empty; `None` once the producer has closed the
    /// stream and every record has been read.
    ///
    /// While the producer is dead or absent (a node daemon restarting), the call keeps waiting for a new
    /// one, up to the peer timeout.
    // Not `Iterator::next`: the record borrows the consumer, so the consumer cannot be an iterator.
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next(&mut self) -> Result<Option<Record<'_>>, RecvError> {
        loop {
            if self.read_position == self.cached_write
                && !self.refresh_write()
                && let Wait::Closed = self.wait_for_data()?
            {
                return Ok(None);
            }
            match self.parse() {
                Ok(Some(valid)) => return Ok(Some(self.record(valid))),
                Ok(None) => continue,
                Err(reason) => return Err(self.corrupt(reason)),
            }
        }
    }

    /// Returns the next record if one is committed now.
    pub fn try_next(&mut self) -> Result<Record<'_>, TryRecvError> {
        loop {
            if self.read_position == self.cached_write && !self.refresh_write() {
                self.publish_read();
                // Acquire pairs with the Release store in `Producer::close`.
                if self.shared.header().closed.load(Ordering::Acquire) != 0 && !self.refresh_write()
                {
                    return Err(TryRecvError::Closed);
                }
                return Err(TryRecvError::Empty);
            }
            match self.parse() {
                Ok(Some(valid)) => return Ok(self.record(valid)),
                Ok(None) => continue,
                Err(reason) => {
                    return Err(TryRecvError::Corrupt {
                        path: self.shared.path().to_path_buf(),
                        position: self.read_position,
                        reason,
                    });
                }
            }
        }
    }

    /// The number of bytes this consumer has released since the ring was created: the end of the
    /// released prefix, which stops at the oldest unreleased [`Lease`]. The producer sees it a little
    /// later: releases are published in batches.
    pub fn position(&self) -> u64 {
        match &self.book {
            Some(book) => book.released(),
            None => self.read_position,
        }
    }

    /// The end of the last record this consumer handed out, in bytes since the ring was created:
    /// where the read cursor stands once that record and every one before it are released. A
    /// trainer that records its work on a record keeps this position with it, so that, started
    /// again, it can tell from the read cursor whether the record's release counted.
    pub fn handed_out(&self) -> u64 {
        self.read_position
    }

    /// The path of the ring file.
    pub fn ring_path(&self) -> &std::path::Path {
        self.shared.path()
    }

    /// The address range of the ring's data region in this process: every payload lies inside it.
    pub fn data_region(&self) -> std::ops::Range<usize> {
        let start = self.shared.data() as usize;
        start..start + self.shared.capacity() as usize
    }

    /// The total time this consumer waited on an empty ring.
    pub fn empty_wait(&self) -> Duration {
        self.empty_wait
    }

    #[inline]
    fn record(&mut self, valid: ValidRecord) -> Record<'_> {
        self.current = valid;
        Record { consumer: self }
    }

    #[cold]
    fn corrupt(&self, reason: String) -> RecvError {
        RecvError::Corrupt {
            path: self.shared.path().to_path_buf(),
            position: self.read_position,
            reason,
        }
    }

    /// Reloads the write cursor; tells whether records are waiting.
    #[inline]
    fn refresh_write(&mut self) -> bool {
        // Acquire pairs with the AcqRel swap in `Producer::publish`: every byte below the write cursor
        // is written.
        self.cached_write = self.shared.header().write.load(Ordering::Acquire) & !WAITING;
        self.cached_write != self.read_position
    }

    /// Reads and checks the record header at the read cursor. Releases padding records and returns
    /// `None` for them.
    #[inline]
    fn parse(&mut self) -> Result<Option<ValidRecord>, String> {
        let capacity = self.shared.capacity();
        check_cursors(self.cached_write, self.read_position, capacity)
            .map_err(|fault| fault.to_string())?;
        let offset = self.read_offset;
        debug_assert!(offset.is_multiple_of(64) && offset + RECORD_HEADER_LEN <= capacity);
        // SAFETY: the cursors are checked, so `offset` is a multiple of 64 below `capacity` (itself a
        // multiple of 64), and the 64 header bytes lie inside the data region. They lie below the write
        // cursor, so the producer committed them and does not write them until released; read_volatile
        // copies them out, and `validate` checks every field before it is used.
        let header = unsafe {
            self.shared
                .data()
                .add(offset as usize)
                .cast::<RecordHeader>()
                .read_volatile()
        };
        let valid = header
            .validate(
                self.cached_write - self.read_position,
                capacity - offset,
                self.expected_sequence,
            )
            .map_err(|fault| fault.to_string())?;
        if valid.meta.is_some() {
            return Ok(Some(valid));
        }
        self.release(valid.size, valid.next_sequence());
        Ok(None)
    }

    /// Waits until records are published or the stream ends, having published this side's releases,
    /// and adds the time to [`Consumer::empty_wait`].
    #[cold]
    fn wait_for_data(&mut self) -> Result<Wait, RecvError> {
        self.publish_read();
        let started = Instant::now();
        let outcome = self.wait_for_published_data();
        let waited = started.elapsed();
        self.empty_wait += waited;
        // Relaxed: a statistic for the producer's side to read, ordering nothing else.
        self.shared.header().consumer_wait_ns.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        outcome
    }

    fn wait_for_published_data(&mut self) -> Result<Wait, RecvError> {
        for _ in 0..self.spin {
            spin_loop();
            if self.refresh_write() {
                self.spin = next_spin(self.spin, true);
                return Ok(Wait::Data);
            }
        }
        self.spin = next_spin(self.spin, false);
        let header = self.shared.header();
        let mut producer_missing_since: Option<Instant> = None;
        let mut producer_epoch = header.producer_epoch.load(Ordering::Acquire);
        loop {
            let seen = header.data_futex.count();
            // AcqRel: Acquire as in `refresh_write`; the flag tells the producer's next publish to wake us.
            let previous = header.write.fetch_or(WAITING, Ordering::AcqRel);
            self.cached_write = previous & !WAITING;
            if self.cached_write != self.read_position {
                header.write.fetch_and(!WAITING, Ordering::Relaxed);
                return Ok(Wait::Data);
            }
            // Acquire pairs with the Release store in `Producer::close`, made before its publishing swap:
            // either that swap saw our flag and wakes us, or our `fetch_or` came after it and this load
            // sees `closed` set. Records committed before the close may have landed after our `fetch_or`
            // read the cursor, so the cursor is read again before the end is reported.
            if header.closed.load(Ordering::Acquire) != 0 {
                header.write.fetch_and(!WAITING, Ordering::Relaxed);
                return Ok(if self.refresh_write() {
                    Wait::Data
                } else {
                    Wait::Closed
                });
            }
            let epoch = header.producer_epoch.load(Ordering::Acquire);
            if epoch != producer_epoch {
                producer_epoch = epoch;
                producer_missing_since = None;
            }
            match PeerState::of_word(header.producer.load(Ordering::Acquire)) {
                PeerState::Alive(_) => producer_missing_since = None,
                state => {
                    let since = *producer_missing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.peer_timeout {
                        header.write.fetch_and(!WAITING, Ordering::Relaxed);
                        return Err(RecvError::ProducerGone {
                            path: self.shared.path().to_path_buf(),
                            last_producer: last_holder(state),
                            waited: since.elapsed(),
                        });
                    }
                }
            }
            header.data_futex.wait(seen, Some(LIVENESS_SLICE));
        }
    }

    /// Moves past the record of `size` bytes at the read position without releasing it.
    #[inline]
    fn advance(&mut self, size: u64, next_sequence: u64) -> u64 {
        let end = self.read_position + size;
        self.read_offset = wrap_offset(self.read_offset + size, self.shared.capacity());
        self.read_position = end;
        self.expected_sequence = Some(next_sequence);
        end
    }

    /// Releases the record of `size` bytes at the read cursor. The read cursor is published in batches: once
    /// `publish_threshold` bytes are pending, at once when the producer waits for space, and always
    /// before this consumer waits for data or gives up its role. While leases are outstanding, the
    /// release goes into their book, behind them.
    #[inline]
    fn release(&mut self, size: u64, next_sequence: u64) {
        let position = self.read_position;
        let end = self.advance(size, next_sequence);
        if let Some(book) = &self.book {
            let threshold = self.publish_threshold;
            if let Some(handback) = book.release_in_order(position, end, next_sequence, threshold) {
                self.published_read = handback.published;
                self.book = None;
            }
            return;
        }
        // Relaxed: only a hint. A producer that set WAITING after this load is woken by a later
        // publication, which comes at the latest before this consumer waits for data.
        let producer_waits = self.shared.header().read.load(Ordering::Relaxed) & WAITING != 0;
        if producer_waits || end - self.published_read >= self.publish_threshold {
            self.publish_read();
        }
    }

    fn publish_read(&mut self) {
        if let Some(book) = &self.book {
            book.publish_released();
        } else if self.published_read != self.read_position {
            let next_sequence = self
                .expected_sequence
                .expect("a released record sets the next sequence");
            publish_read_cursor(
                &self.shared,
                self.read_position,
                next_sequence,
                self.published_read,
            );
            self.published_read = self.read_position;
        }
    }

    /// Hands out the record at the read position as a lease, starting a book if none is open.
    fn lease(&mut self, valid: ValidRecord) -> Lease {
        let position = self.read_position;
        let offset = self.read_offset;
        let book = self.book.get_or_insert_with(|| {
            Arc::new(LeaseBook::new(
                Arc::clone(&self.shared),
                position,
                valid.sequence,
                self.published_read,
            ))
        });
        let lease = LeaseBook::lease(book, position, offset, valid);
        self.advance(valid.size, valid.next_sequence());
        lease
    }
}

/// Publishes the read cursor at `position`, the end of released records followed by the record of
/// sequence number `next_sequence`, and wakes the producer if it sleeps. `published` is the cursor
/// as last published. Out of line: it runs once per batch of releases.
#[inline(never)]
pub(crate) fn publish_read_cursor(
    shared: &Shared,
    position: u64,
    next_sequence: u64,
    published: u64,
) {
    let header = shared.header();
    // Relaxed: published by the Release swap below, read by a producer that attaches after it.
    header.read_sequence.store(next_sequence, Ordering::Relaxed);
    // AcqRel: Release hands the bytes below the cursor back to the producer's Acquire load of the
    // read cursor; Acquire orders it after the producer's `fetch_or` of WAITING when it sees that flag.
    let previous = header.read.swap(position, Ordering::AcqRel);
    debug_assert_eq!(previous & !WAITING, published);
    if previous & WAITING != 0 {
        header.space_futex.bump();
    }
}

/// How many released bytes a consumer may keep unpublished: an eighth of the ring, at most 256 KiB, so
/// small records cost one cursor publication per hundreds of records while the producer still sees
/// space come back in small steps. Under loom, half the ring, so that models of a few records exercise
/// batching.
fn publish_threshold(capacity: u64) -> u64 {
    if cfg!(loom) {
        capacity / 2
    } else {
        (capacity / 8).min(256 << 10)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(book) = &self.book
            && book.consumer_dropped(self.identity)
        {
            return;
        }
        self.publish_read();
        role::give_up(&self.shared.header().consumer, self.identity);
    }
}

impl Record<'_> {
    /// The payload, borrowed in place, 64-byte aligned.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let offset = self.consumer.read_offset + RECORD_HEADER_LEN;
        let valid = self.consumer.current;
        debug_assert!(offset + valid.payload_len <= self.consumer.shared.capacity());
        // SAFETY: `validate` checked that the whole record lies inside the data region and below the
        // write cursor; the producer does not write it again until the read cursor passes it, which
        // happens only when this record is dropped.
        unsafe {
            std::slice::from_raw_parts(
                self.consumer.shared.data().add(offset as usize),
                valid.payload_len as usize,
            )
        }
    }

    /// What the producer said about the payload.
    #[inline]
    pub fn meta(&self) -> RecordMeta {
        self.consumer
            .current
            .meta
            .expect("padding records are never handed out")
    }

    /// The record's sequence number: records are numbered 0, 1, 2, … in commit order, without gaps,
    /// across producer restarts.
    #[inline]
    pub fn sequence(&self) -> u64 {
        self.consumer.current.sequence
    }

    /// The byte position of the record in the ring's stream.
    pub fn position(&self) -> u64 {
        self.consumer.read_position
    }

    /// Releases the record's bytes to the producer; the same as dropping it.
    pub fn release(self) {}

    /// Keeps the record past the next read: the [`Lease`] is released when it is dropped, in any
    /// order with the records read after it.
    pub fn lease(self) -> Lease {
        let record = std::mem::ManuallyDrop::new(self);
        let valid = record.consumer.current;
        // SAFETY: `record` is never dropped, so this moves the `&mut Consumer` out of it exactly once;
        // the record's release is replaced by the lease's.
        let consumer = unsafe { std::ptr::read(&record.consumer) };
        consumer.lease(valid)
    }
}

impl Drop for Record<'_> {
    #[inline]
    fn drop(&mut self) {
        let valid = self.consumer.current;
        self.consumer.release(valid.size, valid.next_sequence());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_spins_less_after_each_sleep_and_more_after_each_catch_within_bounds() {
        let mut spin = SPIN_LIMIT;
        let mut slept = vec![spin];
        while spin > MIN_SPIN {
            spin = next_spin(spin, false);
            slept.push(spin);
        }
        assert!(slept.windows(2).all(|pair| pair[1] < pair[0]), "{slept:?}");
        assert_eq!(next_spin(MIN_SPIN, false), MIN_SPIN);
        let mut caught = vec![spin];
        while spin < SPIN_LIMIT {
            spin = next_spin(spin, true);
            caught.push(spin);
        }
        assert!(
            caught.windows(2).all(|pair| pair[1] > pair[0]),
            "{caught:?}"
        );
        assert_eq!(next_spin(SPIN_LIMIT, true), SPIN_LIMIT);
        // From the fewest spins back to the most in a handful of waits that caught data.
        assert!(caught.len() <= 8, "{caught:?}");
    }
}
