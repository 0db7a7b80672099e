//! A bounded crossbeam channel between two threads of one process: the in-process upper bound.
//!
//! Records are `Vec<u8>` buffers from a pool: the producer takes a free buffer, fills it and sends it;
//! the consumer reads it and sends it back on a second channel. So allocation is not what is measured.

use std::thread;

use crossbeam_channel::bounded;

use crate::affinity::{Placement, pin_current_thread};
use crate::error::{BenchError, Result};
use crate::transport::{Measurement, Transport};
use crate::workload::{Checker, Source, monotonic_ns, queue_depth};

const TRANSPORT: Transport = Transport::Crossbeam;

pub(super) fn run(size: usize, count: u64, placement: Placement) -> Result<Measurement> {
    let depth = queue_depth(size);
    let (full_sender, full) = bounded::<Vec<u8>>(depth);
    let (free_sender, free) = bounded::<Vec<u8>>(depth);
    for _ in 0..depth {
        free_sender
            .send(vec![0u8; size])
            .map_err(|_| disconnected("filling the buffer pool"))?;
    }
    let pin = |cpu: Option<usize>, role: &str| {
        pin_current_thread(cpu).map_err(|source| BenchError::Io {
            transport: TRANSPORT,
            operation: format!("pinning the {role} to cpu {cpu:?}"),
            source,
        })
    };

    // Each thread owns its ends of both channels, so a side that fails disconnects the other.
    let (start_ns, end_ns) = thread::scope(|scope| {
        let producer = scope.spawn(move || -> Result<u64> {
            pin(placement.producer, "producer")?;
            let source = Source::new(size);
            let start_ns = monotonic_ns();
            for sequence in 0..count {
                let mut buffer = free
                    .recv()
                    .map_err(|_| disconnected("taking a free buffer"))?;
                source.fill(&mut buffer, sequence);
                full_sender
                    .send(buffer)
                    .map_err(|_| disconnected("sending a record"))?;
            }
            Ok(start_ns)
        });
        let consumer = scope.spawn(move || -> Result<u64> {
            pin(placement.consumer, "consumer")?;
            let mut checker = Checker::new(TRANSPORT, size);
            while checker.received() < count {
                let buffer = full
                    .recv()
                    .map_err(|_| disconnected("receiving a record"))?;
                checker.check(&buffer)?;
                // The producer may be done and gone; the pool is then no longer needed.
                free_sender.send(buffer).ok();
            }
            let end_ns = monotonic_ns();
            checker.finish(count)?;
            Ok(end_ns)
        });
        let joined = |handle: thread::ScopedJoinHandle<'_, Result<u64>>, role| {
            handle.join().map_err(|_| BenchError::ThreadPanicked {
                transport: TRANSPORT,
                role,
            })?
        };
        let end_ns = joined(consumer, "consumer");
        let start_ns = joined(producer, "producer");
        Ok::<_, BenchError>((start_ns?, end_ns?))
    })?;
    Ok(Measurement {
        messages: count,
        size,
        elapsed: std::time::Duration::from_nanos(end_ns.saturating_sub(start_ns)),
    })
}

fn disconnected(operation: &str) -> BenchError {
    BenchError::Io {
        transport: TRANSPORT,
        operation: operation.to_owned(),
        source: std::io::ErrorKind::BrokenPipe.into(),
    }
}
