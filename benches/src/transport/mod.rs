//! The transports under comparison, and what one timed run of them measured.

mod crossbeam;
mod iceoryx2;
pub(crate) mod sluice_ring;
mod unix_socket;

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use crate::affinity::Placement;
use crate::error::{BenchError, Result, TransportSource};
use crate::peer::{PeerArgs, PeerCommand};

/// A way to move records from a producer to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// The Sluice shared-memory ring over a file in /dev/shm, producer and consumer in two processes.
    SluiceRing,
    /// A Unix domain stream socket with length-prefixed records, in two processes.
    UnixSocket,
    /// A bounded crossbeam channel between two threads of one process: the in-process upper bound.
    Crossbeam,
    /// iceoryx2 publish-subscribe of byte slices, in two processes.
    Iceoryx2,
}

impl Transport {
    /// Every transport, the Sluice ring first.
    pub const ALL: [Transport; 4] = [
        Transport::SluiceRing,
        Transport::UnixSocket,
        Transport::Crossbeam,
        Transport::Iceoryx2,
    ];

    /// Maps an error of `operation` on this transport to a [`BenchError`]; `operation` runs only on the
    /// error path, so the per-record calls format nothing.
    fn error<E: Into<TransportSource>, S: Into<String>>(
        self,
        operation: impl FnOnce() -> S,
    ) -> impl FnOnce(E) -> BenchError {
        move |source| BenchError::Transport {
            transport: self,
            operation: operation().into(),
            source: source.into(),
        }
    }

    /// The name used in the output and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Transport::SluiceRing => "sluice_ring",
            Transport::UnixSocket => "unix_socket",
            Transport::Crossbeam => "crossbeam",
            Transport::Iceoryx2 => "iceoryx2",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for Transport {
    type Err = BenchError;

    fn from_str(name: &str) -> Result<Transport> {
        Transport::ALL
            .into_iter()
            .find(|transport| transport.name() == name)
            .ok_or_else(|| BenchError::InvalidPeerArgs {
                reason: format!(
                    "unknown transport {name:?}; use one of sluice_ring, unix_socket, crossbeam, iceoryx2"
                ),
            })
    }
}

/// What one timed run moved, and how long it took from the producer's first record to the consumer's
/// last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// The records moved.
    pub messages: u64,
    /// The payload bytes of each record.
    pub size: usize,
    /// The time from the producer starting the first record to the consumer finishing the last.
    pub elapsed: Duration,
}

impl Measurement {
    /// Records per second.
    pub fn msgs_per_s(&self) -> f64 {
        self.messages as f64 / self.seconds()
    }

    /// Payload gigabytes (1e9 bytes) per second.
    pub fn gbps(&self) -> f64 {
        self.messages as f64 * self.size as f64 / self.seconds() / 1e9
    }

    fn seconds(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Everything a timed run needs besides the transport and the record count.
#[derive(Debug, Clone)]
pub(crate) struct RunContext<'context> {
    /// Where the cores of the two sides are.
    pub placement: Placement,
    /// How to start the producer process.
    pub peer: &'context PeerCommand,
    /// A fresh directory for the run's files (socket, ring).
    pub scratch: &'context Path,
    /// A name unique to this run, for resources that live outside `scratch`.
    pub run_name: String,
    /// The Sluice ring's capacity in bytes; `None` for the default (see `sluice_ring::capacity`).
    pub ring_bytes: Option<u64>,
}

/// Moves `count` records of `size` bytes over `transport` once and measures it.
pub(crate) fn run(
    transport: Transport,
    size: usize,
    count: u64,
    context: &RunContext<'_>,
) -> Result<Measurement> {
    match transport {
        Transport::Crossbeam => crossbeam::run(size, count, context.placement),
        Transport::SluiceRing => sluice_ring::run(size, count, context),
        Transport::UnixSocket => unix_socket::run(size, count, context),
        Transport::Iceoryx2 => iceoryx2::run(size, count, context),
    }
}

/// Runs the producer side of a two-process run, in the peer process.
pub(crate) fn produce(args: &PeerArgs) -> Result<()> {
    match args.transport {
        Transport::SluiceRing => sluice_ring::produce(args),
        Transport::UnixSocket => unix_socket::produce(args),
        Transport::Iceoryx2 => iceoryx2::produce(args),
        Transport::Crossbeam => Err(BenchError::InvalidPeerArgs {
            reason:
                "crossbeam runs in one process and has no peer; use sluice_ring, unix_socket or \
                     iceoryx2"
                    .to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names_round_trip() {
        for transport in Transport::ALL {
            assert_eq!(
                transport.name().parse::<Transport>().expect("known name"),
                transport
            );
        }
        let error = "pipe".parse::<Transport>().expect_err("unknown transport");
        assert!(error.to_string().contains("use one of"), "{error}");
    }

    #[test]
    fn measurement_rates_follow_from_count_size_and_time() {
        let sut = Measurement {
            messages: 1000,
            size: 1 << 20,
            elapsed: Duration::from_millis(500),
        };
        assert_eq!(sut.msgs_per_s(), 2000.0);
        assert!((sut.gbps() - 2000.0 * 1048576.0 / 1e9).abs() < 1e-9);
    }
}
