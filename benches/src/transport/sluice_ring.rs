//! The Sluice ring: a ring file in /dev/shm, the driver consuming and a peer process producing.

use sluice_ring::{RecordKind, RecordMeta, Ring, RingOptions};

use crate::error::Result;
use crate::peer::{self, ConsumerContext, PeerArgs, STALL_TIMEOUT};
use crate::transport::{Measurement, RunContext, Transport};
use crate::workload::{Checker, QUEUE_BYTES, Source, monotonic_ns};

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
        source.fill(slot.payload_mut(), sequence);
        slot.commit(meta);
    }
    producer.close();
    peer::report_start(TRANSPORT, start_ns)
}
