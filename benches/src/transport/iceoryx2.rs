//! iceoryx2 publish-subscribe of `[u8]` slices, the driver subscribing and a peer process publishing.
//!
//! The service does not overflow and the publisher retries until delivered, so a full subscriber queue
//! is back-pressure, as in the ring. The subscriber polls: it spins briefly, then yields.

use std::hint::spin_loop;
use std::thread;

use iceoryx2::prelude::{
    Alignment, BackpressureStrategy, LogLevel, NodeBuilder, ServiceName, SignalHandlingMode, ipc,
    set_log_level_from_env_or,
};

use crate::error::{BenchError, Result};
use crate::peer::{self, ConsumerContext, PeerArgs};
use crate::transport::{Measurement, RunContext, Transport};
use crate::workload::{Checker, Source, monotonic_ns, queue_depth, stamp};

const TRANSPORT: Transport = Transport::Iceoryx2;
const SPINS_BEFORE_YIELD: u32 = 1 << 12;
const PAYLOAD_ALIGNMENT: usize = 64;

fn node() -> Result<iceoryx2::node::Node<ipc::Service>> {
    set_log_level_from_env_or(LogLevel::Error);
    NodeBuilder::new()
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .map_err(TRANSPORT.error(|| "creating a node"))
}

fn service_name(name: &str) -> Result<ServiceName> {
    ServiceName::new(name).map_err(TRANSPORT.error(|| format!("naming the service {name:?}")))
}

pub(super) fn run(size: usize, count: u64, context: &RunContext<'_>) -> Result<Measurement> {
    let name = format!("sluice-bench/{}", context.run_name);
    let args = PeerArgs {
        transport: TRANSPORT,
        size,
        count,
        path: name.clone(),
        cpu: context.placement.producer,
    };
    let consume = move |consumer_context: &mut ConsumerContext| {
        let depth = queue_depth(size);
        let node = node()?;
        let alignment = Alignment::new(PAYLOAD_ALIGNMENT).ok_or_else(|| BenchError::Transport {
            transport: TRANSPORT,
            operation: format!("aligning payloads to {PAYLOAD_ALIGNMENT} bytes"),
            source: "not a power of two".into(),
        })?;
        let service = node
            .service_builder(&service_name(&name)?)
            .publish_subscribe::<[u8]>()
            .payload_alignment(alignment)
            .enable_safe_overflow(false)
            .subscriber_max_buffer_size(depth)
            .history_size(0)
            .max_publishers(1)
            .max_subscribers(1)
            .create()
            .map_err(TRANSPORT.error(|| format!("creating the service {name:?}")))?;
        let subscriber = service
            .subscriber_builder()
            .buffer_size(depth)
            .create()
            .map_err(TRANSPORT.error(|| "creating the subscriber"))?;
        consumer_context.ready();
        let mut checker = Checker::new(TRANSPORT, size);
        let mut idle_spins = 0u32;
        while checker.received() < count {
            let received = subscriber
                .receive()
                .map_err(TRANSPORT.error(|| "receiving a sample"))?;
            match received {
                Some(sample) => {
                    checker.check(sample.payload())?;
                    idle_spins = 0;
                }
                None if idle_spins < SPINS_BEFORE_YIELD => {
                    idle_spins += 1;
                    spin_loop();
                }
                None => {
                    if consumer_context.aborted() {
                        break;
                    }
                    thread::yield_now();
                }
            }
        }
        let end_ns = monotonic_ns();
        checker.finish(count)?;
        Ok(end_ns)
    };
    peer::run_with_peer(context.peer, args, context.placement.consumer, consume)
}

pub(super) fn produce(args: &PeerArgs) -> Result<()> {
    let node = node()?;
    let service = node
        .service_builder(&service_name(&args.path)?)
        .publish_subscribe::<[u8]>()
        .open()
        .map_err(TRANSPORT.error(|| format!("opening the service {:?}", args.path)))?;
    let publisher = service
        .publisher_builder()
        .initial_max_slice_len(args.size)
        .max_loaned_samples(1)
        .backpressure_strategy(BackpressureStrategy::RetryUntilDelivered)
        .create()
        .map_err(TRANSPORT.error(|| "creating the publisher"))?;
    let source = Source::new(args.size);
    let start_ns = monotonic_ns();
    for sequence in 0..args.count {
        let sample = publisher
            .loan_slice_uninit(args.size)
            .map_err(TRANSPORT.error(|| format!("loaning sample {sequence}")))?;
        let mut sample = sample.write_from_slice(source.bytes());
        stamp(sample.payload_mut(), sequence);
        sample
            .send()
            .map_err(TRANSPORT.error(|| format!("sending sample {sequence}")))?;
    }
    peer::report_start(TRANSPORT, start_ns)?;
    // The samples live in this process's data segment: keep the publisher until the subscriber has them.
    peer::wait_for_driver(TRANSPORT)
}
