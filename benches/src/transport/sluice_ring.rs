//! The Sluice ring: a ring file in /dev/shm, the driver consuming and a peer process producing.

use sluice_ring::{RecordKind, RecordMeta, Ring, RingOptions, TryRecvError};

use crate::error::Result;
use crate::peer::{self, ConsumerContext, PeerArgs, STALL_TIMEOUT};
use crate::transport::{Measurement, RunContext, Transport};
use crate::workload::{Checker, QUEUE_BYTES, Source, monotonic_ns, stamp};

const TRANSPORT: Transport = Transport::SluiceRing;

/// The ring's default capacity for `size`-byte records: [`QUEUE_BYTES`], or room for four records (each
/// with its 64-byte header, padded to 64 bytes) if larger.
pub(crate) fn capacity(size: usize) -> u64 {
    QUEUE_BYTES.max(4 * (size.next_multiple_of(64) + 64)) as u64
}

pub(super) fn run(size: usize, count: u64, context: &RunContext<'_>) -> Result<Measurement> {
    let path = context.scratch.join("bench.ring");
    let ring_bytes = context.ring_bytes.unwrap_or_else(|| capacity(size));
    let args = PeerArgs {
        transport: TRANSPORT,
        size,
        count,
        path: path.display().to_string(),
        cpu: context.placement.producer,
    };
    let consume = move |consumer_context: &mut ConsumerContext| {
        let ring = RingOptions::new(&path)
            .capacity(ring_bytes)
            .create()
            .map_err(TRANSPORT.error(|| format!("creating {}", path.display())))?;
        let mut consumer = ring
            .consumer()
            .map_err(TRANSPORT.error(|| "attaching the consumer"))?;
        consumer.set_peer_timeout(STALL_TIMEOUT);
        consumer_context.ready();
        let mut checker = Checker::new(TRANSPORT, size);
        while let Some(record) = consumer
            .next()
            .map_err(TRANSPORT.error(|| "reading a record"))?
        {
            checker.check(record.payload())?;
        }
        let end_ns = monotonic_ns();
        checker.finish(count)?;
        Ok(end_ns)
    };
    peer::run_with_peer(context.peer, args, context.placement.consumer, consume)
}

pub(super) fn produce(args: &PeerArgs) -> Result<()> {
    let ring =
        Ring::open(&args.path).map_err(TRANSPORT.error(|| format!("opening {}", args.path)))?;
    let mut producer = ring
        .producer()
        .map_err(TRANSPORT.error(|| "attaching the producer"))?;
    producer.set_peer_timeout(STALL_TIMEOUT);
    let source = Source::new(args.size);
    let meta = RecordMeta {
        kind: RecordKind::Batch,
        task_id: 0,
        first_row: 0,
        row_count: 1,
        tag: 0,
    };
    let start_ns = monotonic_ns();
    for sequence in 0..args.count {
        let mut slot = producer
            .reserve(args.size)
            .map_err(TRANSPORT.error(|| format!("reserving record {sequence}")))?;
        // The ring's own copy, as the daemon's encoder makes it: around the cache for a large
        // record far ahead of the consumer.
        slot.write(0, source.bytes());
        stamp(slot.payload_mut(), sequence);
        slot.commit(meta);
    }
    producer.close();
    peer::report_start(TRANSPORT, start_ns)
}

/// How far behind its consumer the producer of [`far_behind`] writes: twice the 16 MiB past which
/// the ring writes a large record around the cache.
pub(crate) const FAR_BEHIND_BYTES: u64 = 32 << 20;

/// Rounds of [`far_behind`] for each way of writing, after one that touches every page of the ring.
const FAR_BEHIND_ROUNDS: usize = 5;

/// The producer's payload GB/s for `size`-byte records with its consumer [`FAR_BEHIND_BYTES`]
/// behind, in a ring of `ring_bytes` at `path`, as a trainer that lags leaves its daemon: through
/// the ring's own [`sluice_ring::Slot::write`], and through a plain copy into
/// [`sluice_ring::Slot::payload_mut`]. Each round drains the ring, writes the backlog plainly, then
/// times records up to the ring's end; the two ways alternate, and each gives its median round.
/// Returns `(ring write, plain copy)`, or `None` when the ring holds no record past the backlog.
pub(crate) fn far_behind(
    size: usize,
    ring_bytes: u64,
    path: &std::path::Path,
) -> Result<Option<(f64, f64)>> {
    let ring = RingOptions::new(path)
        .capacity(ring_bytes)
        .create()
        .map_err(TRANSPORT.error(|| format!("creating {}", path.display())))?;
    let mut producer = ring
        .producer()
        .map_err(TRANSPORT.error(|| "attaching the producer"))?;
    let mut consumer = ring
        .consumer()
        .map_err(TRANSPORT.error(|| "attaching the consumer"))?;
    let source = Source::new(size);
    let meta = RecordMeta::of_kind(RecordKind::Batch);
    // Each record takes its 64-byte header and its payload padded to 64 bytes; two spare records
    // for the padding at the region's end.
    let record_bytes = (size.next_multiple_of(64) + 64) as u64;
    let backlog = FAR_BEHIND_BYTES.div_ceil(record_bytes);
    let timed = (ring_bytes / record_bytes).saturating_sub(backlog + 2);
    if timed == 0 {
        return Ok(None);
    }
    let mut rounds: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..=2 * FAR_BEHIND_ROUNDS {
        loop {
            match consumer.try_next() {
                Ok(_) => {}
                Err(TryRecvError::Empty) => break,
                Err(error) => return Err(TRANSPORT.error(|| "draining the ring")(error)),
            }
        }
        for _ in 0..backlog {
            let mut slot = producer
                .reserve(size)
                .map_err(TRANSPORT.error(|| "reserving a record of the backlog"))?;
            slot.payload_mut().copy_from_slice(source.bytes());
            slot.commit(meta);
        }
        let through_write = round % 2 == 1;
        let start = std::time::Instant::now();
        for _ in 0..timed {
            let mut slot = producer
                .reserve(size)
                .map_err(TRANSPORT.error(|| "reserving a record far ahead"))?;
            if through_write {
                slot.write(0, source.bytes());
            } else {
                slot.payload_mut().copy_from_slice(source.bytes());
            }
            slot.commit(meta);
        }
        producer.flush();
        let gbps = (timed as f64 * size as f64) / start.elapsed().as_secs_f64() / 1e9;
        // Round 0 touches the ring's pages for the first time.
        if round > 0 {
            rounds[usize::from(!through_write)].push(gbps);
        }
    }
    let median = |mut figures: Vec<f64>| {
        figures.sort_by(f64::total_cmp);
        figures[figures.len() / 2]
    };
    let [write, plain] = rounds;
    Ok(Some((median(write), median(plain))))
}
