//! The writing side of a ring.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{AttachError, ReserveError, Role, TryReserveError};
use crate::layout::{
    RECORD_HEADER_LEN, RecordHeader, RecordMeta, WAITING, check_cursors, record_size,
};
use crate::process::{PeerState, ProcessId};
use crate::sync::{Ordering, spin_loop};
use crate::{DEFAULT_PEER_TIMEOUT, Shared, role};

/// How many times a side re-reads the other's cursor before it goes to sleep.
pub(crate) const SPIN_LIMIT: u32 = if cfg!(loom) { 1 } else { 2000 };
/// How long a sleep lasts at most before a side re-checks that its peer is alive.
pub(crate) const LIVENESS_SLICE: Duration = Duration::from_millis(100);

/// The single writer of a ring. Taken with [`crate::Ring::producer`]; gives the role up when dropped.
///
/// Writing is two steps: [`Producer::reserve`] returns a [`Slot`] whose payload the caller fills in
/// place (an Arrow IPC encoder writes straight into shared memory), then [`Slot::commit`] publishes it.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    identity: u64,
    /// The write cursor as this producer last published it.
    write_position: u64,
    /// `write_position % capacity`, kept up to date without a division per record.
    write_offset: u64,
    /// The read cursor as last seen; the consumer may since have moved it further.
    cached_read: u64,
    next_sequence: u64,
    peer_timeout: Duration,
    full_wait: Duration,
}

/// Space reserved in the ring for one record, not yet visible to the consumer.
///
/// Dropping a slot without committing it abandons it: nothing is published.
#[derive(Debug)]
pub struct Slot<'producer> {
    producer: &'producer mut Producer,
    /// Where the record starts in the data region.
    offset: u64,
    payload_len: u64,
}

impl Producer {
    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Producer, AttachError> {
        let header = shared.header();
        let identity = role::claim(&header.producer, Role::Producer, shared.path())?;
        let recovered = recover_position(&shared);
        let (write_position, cached_read, next_sequence) = match recovered {
            Ok(position) if header.closed.load(Ordering::Acquire) == 0 => position,
            Ok(_) => {
                role::give_up(&header.producer, identity);
                return Err(AttachError::Closed {
                    path: shared.path().to_path_buf(),
                });
            }
            Err(reason) => {
                role::give_up(&header.producer, identity);
                return Err(AttachError::Corrupt {
                    path: shared.path().to_path_buf(),
                    reason,
                });
            }
        };
        // Tells a waiting consumer that a producer (re)attached; pairs with its Acquire load.
        header.producer_epoch.fetch_add(1, Ordering::Release);
        let write_offset = write_position % shared.capacity();
        Ok(Producer {
            shared,
            identity,
            write_position,
            write_offset,
            cached_read,
            next_sequence,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            full_wait: Duration::ZERO,
        })
    }

    /// Sets how long [`Producer::reserve`] waits on a full ring with no live consumer before it fails.
    pub fn set_peer_timeout(&mut self, timeout: Duration) {
        self.peer_timeout = timeout;
    }

    /// Reserves room for a record with a payload of `len` bytes, waiting while the ring is full.
    ///
    /// A full ring is back-pressure: the call spins briefly, then sleeps until the consumer releases
    /// records. It fails only when the record can never fit, or when no live consumer has been attached
    /// for longer than the peer timeout.
    pub fn reserve(&mut self, len: usize) -> Result<Slot<'_>, ReserveError> {
        let (size, padding) = self.plan(len).map_err(|max| ReserveError::TooLarge {
            path: self.shared.path().to_path_buf(),
            len: len as u64,
            max,
        })?;
        if padding > 0 {
            self.wait_for_space(padding)?;
            self.write_padding(padding);
        }
        self.wait_for_space(size)?;
        Ok(self.slot(len as u64))
    }

    /// Reserves room for a record with a payload of `len` bytes if the ring has it now.
    pub fn try_reserve(&mut self, len: usize) -> Result<Slot<'_>, TryReserveError> {
        let (size, padding) = self.plan(len).map_err(|max| TryReserveError::TooLarge {
            path: self.shared.path().to_path_buf(),
            len: len as u64,
            max,
        })?;
        if !self.has_space(padding + size) {
            return Err(TryReserveError::Full);
        }
        if padding > 0 {
            self.write_padding(padding);
        }
        Ok(self.slot(len as u64))
    }

    /// Marks the end of the stream: the consumer reads what is committed, then sees the end.
    pub fn close(self) {
        // Release pairs with the Acquire load of `closed` in the consumer, which it makes after setting
        // WAITING; re-publishing the write cursor then wakes a consumer that was already asleep.
        self.shared.header().closed.store(1, Ordering::Release);
        self.publish(self.write_position);
    }

    /// The number of bytes committed to the ring since it was created.
    pub fn position(&self) -> u64 {
        self.write_position
    }

    /// The sequence number the next committed record gets.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The total time this producer waited for the consumer to release space.
    pub fn full_wait(&self) -> Duration {
        self.full_wait
    }

    /// Returns the size of the record and the padding needed before it, or the largest payload.
    fn plan(&self, len: usize) -> Result<(u64, u64), u64> {
        let capacity = self.shared.capacity();
        let max = capacity - RECORD_HEADER_LEN;
        let size = record_size(len as u64)
            .filter(|size| *size <= capacity)
            .ok_or(max)?;
        let offset = self.write_offset;
        let padding = if offset + size > capacity {
            capacity - offset
        } else {
            0
        };
        Ok((size, padding))
    }

    fn slot(&mut self, payload_len: u64) -> Slot<'_> {
        let offset = self.write_offset;
        Slot {
            producer: self,
            offset,
            payload_len,
        }
    }

    fn has_space(&mut self, needed: u64) -> bool {
        let capacity = self.shared.capacity();
        if capacity - (self.write_position - self.cached_read) >= needed {
            return true;
        }
        // Acquire pairs with the Release swap in `Consumer::publish_read`: the consumer is done with every
        // byte below the read cursor.
        self.cached_read = self.shared.header().read.load(Ordering::Acquire) & !WAITING;
        capacity - (self.write_position - self.cached_read) >= needed
    }

    fn wait_for_space(&mut self, needed: u64) -> Result<(), ReserveError> {
        if self.has_space(needed) {
            return Ok(());
        }
        for _ in 0..SPIN_LIMIT {
            spin_loop();
            if self.has_space(needed) {
                return Ok(());
            }
        }
        let header = self.shared.header();
        let started = Instant::now();
        let mut consumer_missing_since: Option<Instant> = None;
        let outcome = loop {
            let seen = header.space_futex.count();
            // AcqRel: Acquire as in `has_space`; the flag tells the consumer's next release to wake us.
            let previous = header.read.fetch_or(WAITING, Ordering::AcqRel);
            self.cached_read = previous & !WAITING;
            let capacity = self.shared.capacity();
            if capacity - (self.write_position - self.cached_read) >= needed {
                header.read.fetch_and(!WAITING, Ordering::Relaxed);
                break Ok(());
            }
            match PeerState::of_word(header.consumer.load(Ordering::Acquire)) {
                PeerState::Alive(_) => consumer_missing_since = None,
                state => {
                    let since = *consumer_missing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.peer_timeout {
                        header.read.fetch_and(!WAITING, Ordering::Relaxed);
                        break Err(ReserveError::ConsumerGone {
                            path: self.shared.path().to_path_buf(),
                            last_consumer: last_holder(state),
                            waited: since.elapsed(),
                        });
                    }
                }
            }
            header.space_futex.wait(seen, Some(LIVENESS_SLICE));
        };
        self.full_wait += started.elapsed();
        outcome
    }

    fn write_padding(&mut self, padding: u64) {
        let header = RecordHeader::new(padding - RECORD_HEADER_LEN, self.next_sequence, None);
        self.write_header(self.write_offset, header);
        self.publish(self.write_position + padding);
        self.write_position += padding;
        self.write_offset = 0;
    }

    fn write_header(&self, offset: u64, header: RecordHeader) {
        let capacity = self.shared.capacity();
        debug_assert!(offset.is_multiple_of(64) && offset + RECORD_HEADER_LEN <= capacity);
        // SAFETY: `offset + 64 <= capacity`, so the header lies inside the data region, at a 64-byte
        // aligned offset of a 64-byte aligned region. The bytes lie in `[write, read + capacity)`, which
        // the consumer does not read until the write cursor is published past them.
        unsafe {
            self.shared
                .data()
                .add(offset as usize)
                .cast::<RecordHeader>()
                .write_volatile(header);
        }
    }

    fn publish(&self, position: u64) {
        let header = self.shared.header();
        // AcqRel: Release publishes the record bytes to the consumer's Acquire load of the write cursor;
        // Acquire orders this swap after the consumer's `fetch_or` of WAITING when it reads that flag, so
        // the consumer's earlier read of the futex count cannot see the bump below.
        let previous = header.write.swap(position, Ordering::AcqRel);
        debug_assert_eq!(previous & !WAITING, self.write_position);
        if previous & WAITING != 0 {
            header.data_futex.bump();
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        role::give_up(&self.shared.header().producer, self.identity);
    }
}

impl Slot<'_> {
    /// The payload bytes, exactly as many as reserved, starting 64-byte aligned. They hold whatever an
    /// earlier record left there.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let offset = self.offset + RECORD_HEADER_LEN;
        debug_assert!(offset + self.payload_len <= self.producer.shared.capacity());
        // SAFETY: `reserve` checked that `[position, position + record_size)` is free and does not cross
        // the end of the data region, so the payload range lies inside the region, and the consumer does
        // not touch it until `commit` publishes it. The slot borrows the producer mutably, so no other
        // slice of it exists.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.producer.shared.data().add(offset as usize),
                self.payload_len as usize,
            )
        }
    }

    /// The number of payload bytes reserved.
    pub fn len(&self) -> usize {
        self.payload_len as usize
    }

    /// Tells whether the slot has an empty payload.
    pub fn is_empty(&self) -> bool {
        self.payload_len == 0
    }

    /// Publishes the record; the consumer can read it from now on. Returns its sequence number.
    pub fn commit(self, meta: RecordMeta) -> u64 {
        let producer = self.producer;
        let sequence = producer.next_sequence;
        let header = RecordHeader::new(self.payload_len, sequence, Some(meta));
        producer.write_header(self.offset, header);
        let size = record_size(self.payload_len).expect("checked by reserve");
        producer.next_sequence += 1;
        let end = producer.write_position + size;
        producer.publish(end);
        producer.write_position = end;
        producer.write_offset = wrap_offset(self.offset + size, producer.shared.capacity());
        sequence
    }
}

/// Reads the cursors of a ring a producer attaches to, and finds the sequence number it continues with.
///
/// Returns `(write cursor, read cursor, next sequence)`, or why the committed records do not parse.
fn recover_position(shared: &Shared) -> Result<(u64, u64, u64), String> {
    let header = shared.header();
    let capacity = shared.capacity();
    let write = header.write.load(Ordering::Acquire) & !WAITING;
    // Acquire pairs with the Release swap in `Consumer::publish_read`, which comes after the consumer's
    // store of `read_sequence`: when read == write, `read_sequence` follows the last committed record.
    let read = header.read.load(Ordering::Acquire) & !WAITING;
    check_cursors(write, read, capacity).map_err(|fault| fault.to_string())?;
    if read == write {
        return Ok((write, read, header.read_sequence.load(Ordering::Acquire)));
    }
    let mut position = read;
    let mut expected = None;
    while position < write {
        let offset = position % capacity;
        // SAFETY: `offset` is 64-aligned (checked cursors, record sizes are multiples of 64) and below
        // `capacity`, a multiple of 64, so 64 bytes from it lie in the data region. The records below the
        // write cursor are committed and no producer writes them; read_volatile copies them out.
        let record = unsafe {
            shared
                .data()
                .add(offset as usize)
                .cast::<RecordHeader>()
                .read_volatile()
        };
        let valid = record
            .validate(write - position, capacity - offset, expected)
            .map_err(|fault| format!("committed record at byte {position}: {fault}"))?;
        expected = Some(valid.next_sequence());
        position += valid.size;
    }
    Ok((
        write,
        read,
        expected.expect("at least one record lies between the cursors"),
    ))
}

pub(crate) fn last_holder(state: PeerState) -> Option<ProcessId> {
    match state {
        PeerState::Absent => None,
        PeerState::Alive(process) | PeerState::Dead(process) => Some(process),
    }
}

/// Maps the offset just past a record back into the data region: a record that ends exactly at the end
/// of the region is followed by one at offset 0.
pub(crate) fn wrap_offset(end_offset: u64, capacity: u64) -> u64 {
    debug_assert!(end_offset <= capacity);
    if end_offset == capacity {
        0
    } else {
        end_offset
    }
}
