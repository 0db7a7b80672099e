//! A Unix domain stream socket: each record is an 8-byte little-endian length, then the payload.
//!
//! Both sides buffer, as a user would: the producer encodes into a `BufWriter` (the record's one copy,
//! or, for records larger than its buffer, a write straight from the source), and the consumer reads
//! whole records through a `BufReader` into one reused buffer.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::peer::{self, ConsumerContext, PeerArgs, STALL_TIMEOUT};
use crate::transport::{Measurement, RunContext, Transport};
use crate::workload::{Checker, Source, monotonic_ns};

const TRANSPORT: Transport = Transport::UnixSocket;
const BUFFER_BYTES: usize = 64 << 10;

/// Maps an error of `operation` to a [`BenchError`]; `operation` runs only on the error path, so the
/// per-record calls format nothing.
fn io_error<S: Into<String>>(
    operation: impl FnOnce() -> S,
) -> impl FnOnce(io::Error) -> BenchError {
    move |source| BenchError::Io {
        transport: TRANSPORT,
        operation: operation().into(),
        source,
    }
}

pub(super) fn run(size: usize, count: u64, context: &RunContext<'_>) -> Result<Measurement> {
    let path = context.scratch.join("bench.sock");
    let args = PeerArgs {
        transport: TRANSPORT,
        size,
        count,
        path: path.display().to_string(),
        cpu: context.placement.producer,
    };
    let consume = move |consumer_context: &mut ConsumerContext| {
        let listener = UnixListener::bind(&path)
            .map_err(io_error(|| format!("binding {}", path.display())))?;
        listener
            .set_nonblocking(true)
            .map_err(io_error(|| "making the listener non-blocking"))?;
        consumer_context.ready();
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    if consumer_context.aborted() {
                        return Err(io_error(|| "waiting for the producer to connect")(error));
                    }
                    thread::sleep(Duration::from_micros(50));
                }
                Err(error) => return Err(io_error(|| "accepting the producer")(error)),
            }
        };
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(STALL_TIMEOUT)))
            .map_err(io_error(|| "configuring the accepted socket"))?;
        let mut reader = BufReader::with_capacity(BUFFER_BYTES, stream);
        let mut checker = Checker::new(TRANSPORT, size);
        let mut record = vec![0u8; size];
        for sequence in 0..count {
            let mut prefix = [0u8; 8];
            reader.read_exact(&mut prefix).map_err(io_error(|| {
                format!("reading the length of record {sequence}")
            }))?;
            let len = u64::from_le_bytes(prefix);
            if len != size as u64 {
                return Err(BenchError::Corrupt {
                    transport: TRANSPORT,
                    size,
                    expected_sequence: sequence,
                    found: format!("a length prefix of {len}"),
                });
            }
            reader
                .read_exact(&mut record)
                .map_err(io_error(|| format!("reading record {sequence}")))?;
            checker.check(&record)?;
        }
        let end_ns = monotonic_ns();
        checker.finish(count)?;
        Ok(end_ns)
    };
    peer::run_with_peer(context.peer, args, context.placement.consumer, consume)
}

pub(super) fn produce(args: &PeerArgs) -> Result<()> {
    let stream = UnixStream::connect(&args.path)
        .map_err(io_error(|| format!("connecting to {}", args.path)))?;
    let mut writer = BufWriter::with_capacity(BUFFER_BYTES, stream);
    let source = Source::new(args.size);
    let prefix = (args.size as u64).to_le_bytes();
    let start_ns = monotonic_ns();
    for sequence in 0..args.count {
        writer
            .write_all(&prefix)
            .and_then(|()| writer.write_all(&sequence.to_le_bytes()))
            .and_then(|()| writer.write_all(&source.bytes()[8..]))
            .map_err(io_error(|| format!("writing record {sequence}")))?;
    }
    writer
        .flush()
        .map_err(io_error(|| "flushing the last records"))?;
    peer::report_start(TRANSPORT, start_ns)
}
