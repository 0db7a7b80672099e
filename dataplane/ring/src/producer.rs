//! The writing side of a ring.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{AttachError, FoldError, ReserveError, Role, TryReserveError};
use crate::layout::{
    RECORD_HEADER_LEN, RecordHeader, RecordMeta, ValidRecord, WAITING, check_retained, record_size,
};
use crate::process::{PeerState, ProcessId};
use crate::sync::{Ordering, spin_loop};
use crate::{DEFAULT_PEER_TIMEOUT, Shared, role, stream};

/// How many times a side re-reads the other's cursor before it goes to sleep.
pub(crate) const SPIN_LIMIT: u32 = if cfg!(loom) { 1 } else { 2000 };
/// How long a sleep lasts at most before a side re-checks that its peer is alive.
pub(crate) const LIVENESS_SLICE: Duration = Duration::from_millis(100);

/// The single writer of a ring. Taken with [`crate::Ring::producer`]; gives the role up when dropped.
///
/// Writing is two steps: [`Producer::reserve`] returns a [`Slot`] whose payload the caller fills in
/// place (an Arrow IPC encoder writes straight into shared memory), then [`Slot::commit`] commits it.
///
/// # When a commit becomes visible
///
/// Commits are published to the consumer in batches: the write cursor in shared memory moves once per
/// batch, not once per record. A committed record becomes visible, together with every record committed
/// before it, at the first of:
///
/// - its own commit, when it brings the unpublished bytes to the publication threshold (an eighth of
///   the ring, at most 64 KiB: a record that large is published by its own commit);
/// - its own commit or any later one, once the consumer has announced that it sleeps waiting for data;
/// - [`Producer::reserve`] or [`Producer::try_reserve`] finding the ring full, before it waits or
///   returns [`TryReserveError::Full`];
/// - [`Producer::flush`], [`Producer::close`], or dropping the producer.
///
/// So a producer that stops committing for a while (its own input ran dry) calls [`Producer::flush`]
/// first; otherwise its last records may stay invisible until its next commit. Until a record is
/// published it is not committed for anyone else: a producer killed before publishing loses it exactly
/// like a reserved slot, and the producer that takes over resumes at the published write cursor.
/// [`Producer::published_sequence`] tells how many records are published.
///
/// # Folding
///
/// The producer does not reuse the space of a released record at once: the records the consumer
/// released stay readable between the retain cursor and the read cursor until the producer
/// *folds* them, which hands each one's [`RecordMeta`] to the fold hook (see
/// [`Producer::set_fold_hook`]) and then moves the retain cursor past it. A producer folds when it
/// needs the space (in [`Producer::reserve`], also while it waits on a full ring, and in
/// [`Producer::try_reserve`]) and on [`Producer::fold`]. The hook's effects come before the retain
/// cursor moves, so a producer that dies and its successor fold every released record at least once,
/// and a hook that keeps a maximum (a consumed count) keeps it exactly.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    identity: u64,
    /// The end of the last record this producer committed.
    write_position: u64,
    /// `write_position % capacity`, kept up to date without a division per record.
    write_offset: u64,
    /// The write cursor as this producer last published it; less than `publish_threshold` bytes behind
    /// `write_position` after every commit.
    published_write: u64,
    /// The sequence number of the first record not yet published.
    published_sequence: u64,
    publish_threshold: u64,
    /// The read cursor as last seen; the consumer may since have moved it further.
    cached_read: u64,
    /// The retain cursor: the space from here to `write_position` is not free.
    retain: u64,
    fold_hook: FoldHook,
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
    /// The bytes the record takes: header, payload and alignment padding.
    size: u64,
    /// Whether [`Slot::write`] goes around the cache: the record is large and far ahead of the
    /// consumer (see [`stream`]).
    streams: bool,
}

impl Producer {
    pub(crate) fn attach(shared: Arc<Shared>) -> Result<Producer, AttachError> {
        let header = shared.header();
        let identity = role::claim(&header.producer, Role::Producer, shared.path())?;
        let recovered = recover_position(&shared);
        let (write_position, cached_read, retain, next_sequence) = match recovered {
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
        let publish_threshold = publish_threshold(shared.capacity());
        Ok(Producer {
            shared,
            identity,
            write_position,
            write_offset,
            published_write: write_position,
            published_sequence: next_sequence,
            publish_threshold,
            cached_read,
            retain,
            fold_hook: FoldHook(None),
            next_sequence,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            full_wait: Duration::ZERO,
        })
    }

    /// Sets how long [`Producer::reserve`] waits on a full ring with no live consumer before it fails.
    pub fn set_peer_timeout(&mut self, timeout: Duration) {
        self.peer_timeout = timeout;
    }

    /// Sets the hook that sees the meta and stream position of every record this producer folds, in
    /// ring order, before the record's space can be reused (see [`Producer`]). Without one, records
    /// are folded unseen.
    pub fn set_fold_hook(&mut self, hook: impl FnMut(RecordMeta, u64) + Send + 'static) {
        self.fold_hook = FoldHook(Some(Box::new(hook)));
    }

    /// Folds every record the consumer has released so far: calls the fold hook with each one's meta
    /// (padding has none), then moves the retain cursor past them. Returns the retain cursor.
    pub fn fold(&mut self) -> Result<u64, FoldError> {
        // Acquire pairs with the Release swap in `Consumer::publish_read`: the consumer is done with
        // every byte below the read cursor.
        self.cached_read = self.shared.header().read.load(Ordering::Acquire) & !WAITING;
        self.fold_to(self.cached_read)?;
        Ok(self.retain)
    }

    /// Calls `visit` with the meta and stream position of every published record the consumer has
    /// not released yet, in ring order: the records a producer that takes over finds still on
    /// their way.
    pub fn unread(&self, mut visit: impl FnMut(RecordMeta, u64)) -> Result<(), FoldError> {
        // Acquire as in `fold`; the records from the read cursor to the published write cursor were
        // written by this producer or committed by the one it took over from.
        let read = self.shared.header().read.load(Ordering::Acquire) & !WAITING;
        let mut position = read;
        while position < self.published_write {
            let valid = self.record_at(position, self.published_write)?;
            if let Some(meta) = valid.meta {
                visit(meta, position);
            }
            position += valid.size;
        }
        Ok(())
    }

    /// The retain cursor: every record below it is folded.
    pub fn retained_position(&self) -> u64 {
        self.retain
    }

    /// Reserves room for a record with a payload of `len` bytes, waiting while the ring is full.
    ///
    /// A full ring is back-pressure: the call folds what the consumer released, spins briefly, then
    /// sleeps until the consumer releases records. It fails only when the record can never fit, when a
    /// record to fold does not parse, or when no live consumer has been attached for longer than the
    /// peer timeout.
    // Always inlined, like `Slot::commit`: a slot returned through memory costs a failed store
    // forwarding per record, which waits for the previous record's stores to reach the cache.
    #[inline(always)]
    pub fn reserve(&mut self, len: usize) -> Result<Slot<'_>, ReserveError> {
        let capacity = self.shared.capacity();
        match record_size(len as u64) {
            // The fast path: the record fits before the end of the region, in space already known free.
            Some(size)
                if self.write_offset + size <= capacity
                    && capacity - (self.write_position - self.retain) >= size => {}
            _ => self.reserve_slowly(len)?,
        }
        Ok(self.slot(len as u64))
    }

    /// The rest of [`Producer::reserve`]: too large a record, padding at the end of the region, and
    /// waiting for the consumer.
    #[cold]
    fn reserve_slowly(&mut self, len: usize) -> Result<(), ReserveError> {
        let (size, padding) = self.plan(len).map_err(|max| ReserveError::TooLarge {
            path: self.shared.path().to_path_buf(),
            len: len as u64,
            max,
        })?;
        if padding > 0 {
            self.wait_for_space(padding)?;
            self.write_padding(padding);
        }
        self.wait_for_space(size)
    }

    /// Reserves room for a record with a payload of `len` bytes if the ring has it now.
    ///
    /// A full ring publishes the pending commits before it returns [`TryReserveError::Full`], so that a
    /// caller who waits for space then is not waiting on a consumer that waits for those records.
    pub fn try_reserve(&mut self, len: usize) -> Result<Slot<'_>, TryReserveError> {
        let (size, padding) = self.plan(len).map_err(|max| TryReserveError::TooLarge {
            path: self.shared.path().to_path_buf(),
            len: len as u64,
            max,
        })?;
        if !self.has_space(padding + size)? {
            self.flush();
            return Err(TryReserveError::Full);
        }
        if padding > 0 {
            self.write_padding(padding);
        }
        Ok(self.slot(len as u64))
    }

    /// Publishes every committed record to the consumer now (see [`Producer`] for when that happens
    /// on its own). Costs nothing when every commit is already published.
    pub fn flush(&mut self) {
        if self.published_write != self.write_position {
            self.publish();
        }
    }

    /// Marks the end of the stream: the consumer reads every committed record, then sees the end.
    pub fn close(mut self) {
        // Every record is published before the stream is marked closed: a consumer that sees `closed`
        // then finds them all below the write cursor it reloads.
        self.flush();
        // Release pairs with the Acquire load of `closed` in the consumer, which it makes after setting
        // WAITING; publishing the write cursor again, unchanged, then wakes a consumer already asleep.
        self.shared.header().closed.store(1, Ordering::Release);
        self.publish();
    }

    /// The number of bytes committed to the ring since it was created, published or not.
    pub fn position(&self) -> u64 {
        self.write_position
    }

    /// The number of bytes published to the consumer since the ring was created: the write cursor.
    pub fn published_position(&self) -> u64 {
        self.published_write
    }

    /// The sequence number the next committed record gets.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The sequence number of the first record not yet published: every record numbered below it is
    /// visible to the consumer and survives this producer's death. A daemon counts rows as enqueued up
    /// to here.
    pub fn published_sequence(&self) -> u64 {
        self.published_sequence
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

    /// The slot of a record with a payload of `payload_len` bytes at the write position, which the
    /// caller has checked to have room for it before the end of the region.
    #[inline]
    fn slot(&mut self, payload_len: u64) -> Slot<'_> {
        let offset = self.write_offset;
        let size = record_size(payload_len).expect("checked by the caller");
        debug_assert!(offset + size <= self.shared.capacity());
        // Relaxed: only a hint of how far behind the consumer is.
        let streams = stream::STREAMS
            && payload_len >= stream::STREAM_MIN_BYTES
            && self
                .write_position
                .saturating_sub(self.shared.header().read.load(Ordering::Relaxed) & !WAITING)
                >= stream::STREAM_BACKLOG_BYTES;
        Slot {
            producer: self,
            offset,
            payload_len,
            size,
            streams,
        }
    }

    /// Tells whether `needed` bytes are free, folding what the consumer released when they are not.
    fn has_space(&mut self, needed: u64) -> Result<bool, FoldError> {
        let capacity = self.shared.capacity();
        if capacity - (self.write_position - self.retain) >= needed {
            return Ok(true);
        }
        if capacity - (self.write_position - self.cached_read) < needed {
            self.fold()?;
        } else {
            self.fold_to(self.cached_read)?;
        }
        Ok(capacity - (self.write_position - self.retain) >= needed)
    }

    /// Folds the records in `[retain, read)`, `read` being a read cursor the consumer published.
    fn fold_to(&mut self, read: u64) -> Result<(), FoldError> {
        if read == self.retain {
            return Ok(());
        }
        // The read cursor comes from the other process: it must lie on a boundary between the records
        // kept and the ones published.
        check_retained(
            self.published_write,
            read,
            self.retain,
            self.shared.capacity(),
        )
        .map_err(|fault| FoldError::Corrupt {
            path: self.shared.path().to_path_buf(),
            position: self.retain,
            reason: fault.to_string(),
        })?;
        // Without a hook there is nothing to see, and the consumer releases whole records: the retain
        // cursor moves to the read cursor without reading the records in between.
        let position = if self.fold_hook.0.is_some() {
            self.fold_records(read)?
        } else {
            read
        };
        // Release pairs with the Acquire load of the retain cursor in `recover_position`: a producer
        // that takes over sees every effect the hook had for the records below it.
        self.shared
            .header()
            .retain
            .store(position, Ordering::Release);
        self.retain = position;
        Ok(())
    }

    /// Hands the meta of every record in `[retain, read)` to the fold hook; returns the end of the last
    /// one.
    fn fold_records(&mut self, read: u64) -> Result<u64, FoldError> {
        let mut position = self.retain;
        while position < read {
            let valid = self.record_at(position, read)?;
            if let (Some(meta), Some(hook)) = (valid.meta, self.fold_hook.0.as_mut()) {
                hook(meta, position);
            }
            position += valid.size;
        }
        Ok(position)
    }

    /// Reads and checks the header of the record at `position`, which lies below `end`, a cursor
    /// position on a record boundary that this producer published or took over.
    fn record_at(&self, position: u64, end: u64) -> Result<ValidRecord, FoldError> {
        let capacity = self.shared.capacity();
        let offset = position % capacity;
        debug_assert!(offset.is_multiple_of(64) && offset + RECORD_HEADER_LEN <= capacity);
        // SAFETY: `position` is a record boundary, so `offset` is a multiple of 64 below `capacity`
        // (a multiple of 64), and the 64 header bytes lie in the data region. They lie in
        // `[retain, write)`, which no one writes until this producer folds them; read_volatile copies
        // them out and `validate` checks every field before it is used.
        let header = unsafe {
            self.shared
                .data()
                .add(offset as usize)
                .cast::<RecordHeader>()
                .read_volatile()
        };
        header
            .validate(end - position, capacity - offset, None)
            .map_err(|fault| FoldError::Corrupt {
                path: self.shared.path().to_path_buf(),
                position,
                reason: fault.to_string(),
            })
    }

    fn wait_for_space(&mut self, needed: u64) -> Result<(), ReserveError> {
        if self.has_space(needed)? {
            return Ok(());
        }
        // The consumer may be waiting for the pending commits; it must see them before this side waits.
        self.flush();
        for _ in 0..SPIN_LIMIT {
            spin_loop();
            if self.has_space(needed)? {
                return Ok(());
            }
        }
        // A handle of its own, so that folding may borrow the producer while the header is in use.
        let shared = Arc::clone(&self.shared);
        let header = shared.header();
        let started = Instant::now();
        let mut consumer_missing_since: Option<Instant> = None;
        let outcome = loop {
            let seen = header.space_futex.count();
            // AcqRel: Acquire as in `has_space`; the flag tells the consumer's next release to wake us.
            let previous = header.read.fetch_or(WAITING, Ordering::AcqRel);
            self.cached_read = previous & !WAITING;
            if let Err(error) = self.fold_to(self.cached_read) {
                header.read.fetch_and(!WAITING, Ordering::Relaxed);
                break Err(error.into());
            }
            let capacity = self.shared.capacity();
            if capacity - (self.write_position - self.retain) >= needed {
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
        let waited = started.elapsed();
        self.full_wait += waited;
        // Relaxed: a statistic, ordering nothing else.
        header.producer_wait_ns.fetch_add(
            u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        outcome
    }

    fn write_padding(&mut self, padding: u64) {
        let header = RecordHeader::new(padding - RECORD_HEADER_LEN, self.next_sequence, None);
        self.write_header(self.write_offset, header);
        self.write_position += padding;
        self.write_offset = 0;
    }

    #[inline]
    fn write_header(&self, offset: u64, header: RecordHeader) {
        let capacity = self.shared.capacity();
        debug_assert!(offset.is_multiple_of(64) && offset + RECORD_HEADER_LEN <= capacity);
        // SAFETY: `offset + 64 <= capacity`, so the header lies inside the data region, at a 64-byte
        // aligned offset of a 64-byte aligned region. The bytes lie in `[write, retain + capacity)`,
        // which the consumer does not read until the write cursor is published past them. A plain
        // write: the fields go from registers to the ring, where a volatile write of the struct copies
        // it through the stack.
        unsafe {
            self.shared
                .data()
                .add(offset as usize)
                .cast::<RecordHeader>()
                .write(header);
        }
    }

    /// Tells whether the consumer has announced that it sleeps waiting for data. Relaxed: only a hint.
    /// A consumer that sets WAITING after this load is woken by a later publication, which comes at the
    /// latest when this producer flushes, waits, closes or is dropped.
    #[inline]
    fn consumer_waits(&self) -> bool {
        self.shared.header().write.load(Ordering::Relaxed) & WAITING != 0
    }

    /// Publishes the write cursor at `write_position`, and wakes the consumer if it sleeps. Out of line:
    /// it runs once per batch.
    #[inline(never)]
    fn publish(&mut self) {
        let header = self.shared.header();
        // AcqRel: Release publishes the record bytes to the consumer's Acquire load of the write cursor;
        // Acquire orders this swap after the consumer's `fetch_or` of WAITING when it reads that flag, so
        // the consumer's earlier read of the futex count cannot see the bump below.
        let previous = header.write.swap(self.write_position, Ordering::AcqRel);
        debug_assert_eq!(previous & !WAITING, self.published_write);
        self.published_write = self.write_position;
        self.published_sequence = self.next_sequence;
        if previous & WAITING != 0 {
            header.data_futex.bump();
        }
    }
}

/// How many committed bytes a producer may keep unpublished: an eighth of the ring, at most 64 KiB, so
/// that small records cost one cursor publication per hundreds of records while the consumer, on a ring
/// of any size, still gets records in small steps. A record of that size or more is published by its own
/// commit. Under loom, a quarter of the ring, so that models of a few records exercise batching.
fn publish_threshold(capacity: u64) -> u64 {
    if cfg!(loom) {
        capacity / 4
    } else {
        (capacity / 8).min(64 << 10)
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.flush();
        role::give_up(&self.shared.header().producer, self.identity);
    }
}

impl Slot<'_> {
    /// The payload bytes, exactly as many as reserved, starting 64-byte aligned. They hold whatever an
    /// earlier record left there.
    #[inline]
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

    /// Copies `bytes` into the payload from byte `at`, as `payload_mut()[at..][..bytes.len()]
    /// .copy_from_slice(bytes)` does; but a record of 64 KiB or more reserved 16 MiB or more ahead
    /// of the consumer is written around the cache (non-temporal stores, on x86_64): the cache
    /// would let it go before the consumer reads it, and these stores spare memory the read of
    /// every line that a plain store first makes.
    ///
    /// # Panics
    /// If `at + bytes.len()` is past the payload.
    #[inline]
    pub fn write(&mut self, at: usize, bytes: &[u8]) {
        let streams = self.streams;
        let target = &mut self.payload_mut()[at..at + bytes.len()];
        if streams {
            stream::copy(target, bytes);
        } else {
            target.copy_from_slice(bytes);
        }
    }

    /// Whether [`Slot::write`] goes around the cache.
    #[cfg(test)]
    pub(crate) fn streams(&self) -> bool {
        self.streams
    }

    /// The number of payload bytes reserved.
    pub fn len(&self) -> usize {
        self.payload_len as usize
    }

    /// Tells whether the slot has an empty payload.
    pub fn is_empty(&self) -> bool {
        self.payload_len == 0
    }

    /// Commits the record and returns its sequence number. The consumer sees it once it is published:
    /// see [`Producer`] for when that happens.
    // Always inlined: see `Producer::reserve`.
    #[inline(always)]
    pub fn commit(self, meta: RecordMeta) -> u64 {
        if self.streams {
            // The streamed payload before the header and the publication that follow.
            stream::fence();
        }
        let producer = self.producer;
        let sequence = producer.next_sequence;
        let header = RecordHeader::new(self.payload_len, sequence, Some(meta));
        producer.write_header(self.offset, header);
        producer.next_sequence += 1;
        producer.write_position += self.size;
        producer.write_offset = wrap_offset(self.offset + self.size, producer.shared.capacity());
        if producer.write_position - producer.published_write >= producer.publish_threshold
            || producer.consumer_waits()
        {
            producer.publish();
        }
        sequence
    }
}

/// Reads the cursors of a ring a producer attaches to, and finds the sequence number it continues with.
///
/// Returns `(write cursor, read cursor, retain cursor, next sequence)`, or why the committed records
/// do not parse.
fn recover_position(shared: &Shared) -> Result<(u64, u64, u64, u64), String> {
    let header = shared.header();
    let capacity = shared.capacity();
    // Acquire pairs with the Release store in `Producer::fold_to`: the effects of the fold hook for
    // the records below the retain cursor are visible.
    let retain = header.retain.load(Ordering::Acquire);
    let write = header.write.load(Ordering::Acquire) & !WAITING;
    // Acquire pairs with the Release swap in `Consumer::publish_read`, which comes after the consumer's
    // store of `read_sequence`: when read == write, `read_sequence` follows the last committed record.
    let read = header.read.load(Ordering::Acquire) & !WAITING;
    check_retained(write, read, retain, capacity).map_err(|fault| fault.to_string())?;
    if retain == write {
        return Ok((
            write,
            read,
            retain,
            header.read_sequence.load(Ordering::Acquire),
        ));
    }
    let mut position = retain;
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
        retain,
        expected.expect("at least one record lies between the cursors"),
    ))
}

/// The hook a producer calls with each record it folds.
struct FoldHook(Option<Box<dyn FnMut(RecordMeta, u64) + Send>>);

impl std::fmt::Debug for FoldHook {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(if self.0.is_some() {
            "FoldHook(set)"
        } else {
            "FoldHook(none)"
        })
    }
}

pub(crate) fn last_holder(state: PeerState) -> Option<ProcessId> {
    match state {
        PeerState::Absent => None,
        PeerState::Alive(process) | PeerState::Dead(process) => Some(process),
    }
}

/// Maps the offset just past a record back into the data region: a record that ends exactly at the end
/// of the region is followed by one at offset 0.
#[inline]
pub(crate) fn wrap_offset(end_offset: u64, capacity: u64) -> u64 {
    debug_assert!(end_offset <= capacity);
    if end_offset == capacity {
        0
    } else {
        end_offset
    }
}
