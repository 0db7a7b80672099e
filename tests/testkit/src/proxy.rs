//! A TCP proxy that delays what it forwards and caps its bandwidth: latency for tests on a kernel
//! without the `netem` queueing discipline.
//!
//! # Implementation
//!
//! Each connection the proxy accepts gets a connection to the upstream address, and each direction
//! of the pair two threads: a reader, which stamps every chunk it reads with the time it arrived and
//! passes it on, and a writer, which writes each chunk once its time has come. A chunk's time is its
//! arrival plus the delay, so chunks read back to back leave back to back, each delayed, as on a long
//! link. With a bandwidth, a chunk of `n` bytes also occupies its direction's link for
//! `n / bandwidth` seconds, one link per direction shared by all the proxy's connections: it leaves
//! no earlier than the chunk before it plus that time.
//!
//! A reader holds at most 256 chunks its writer has not written (`CHUNKS_IN_FLIGHT`): then it stops
//! reading, and TCP's flow control slows the sender down, as a slow link would.
//!
//! An end of stream is passed on as a half close (`shutdown(Write)`), once the chunks before it have
//! been written. A failed write closes both sockets of the connection. Dropping the proxy stops its
//! acceptor (which polls a non-blocking listener, so that it stops even when its address has gone,
//! as a bed's root leg does when the bed is dropped first), closes the sockets of every connection
//! still open, and waits for their threads; writers drop the chunks still waiting.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most a reader takes from its socket at once.
const CHUNK_BYTES: usize = 64 * 1024;
/// How many chunks read in one direction of a connection may wait for their departure.
const CHUNKS_IN_FLIGHT: usize = 256;
/// How often the acceptor looks for a connection, and a waiting writer whether the proxy stops.
const POLL: Duration = Duration::from_millis(5);

/// A TCP proxy from a listening address to an upstream address that adds a delay to every chunk it
/// forwards, in each direction, caps each direction's bandwidth, and counts the bytes it forwards.
/// Stopped when dropped.
#[derive(Debug)]
pub struct DelayProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// What the proxy's threads share.
#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    delay: Duration,
    bandwidth_bytes_per_s: Option<NonZeroU64>,
    /// Set when the proxy is dropped: the acceptor takes no more connections, and writers drop what
    /// they hold.
    stopping: AtomicBool,
    /// Per direction, when its link is free again; `None` until it carried a chunk.
    link_free: [Mutex<Option<Instant>>; 2],
    /// Per direction, the bytes written.
    forwarded: [AtomicU64; 2],
    /// The sockets of every open connection, by connection number, to close them when dropped.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
}

/// Which way a chunk travels.
#[derive(Debug, Clone, Copy)]
enum Direction {
    ToUpstream = 0,
    ToClient = 1,
}

impl DelayProxy {
    /// Listens on `listen` (port 0: any free port, see [`DelayProxy::address`]) and forwards each
    /// connection to `upstream`, adding `delay` to every chunk in each direction and, with a
    /// bandwidth, keeping each direction within that many bytes per second.
    ///
    /// # Panics
    ///
    /// Panics when it cannot listen on `listen`, naming it.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        delay: Duration,
        bandwidth_bytes_per_s: Option<NonZeroU64>,
    ) -> DelayProxy {
        let listener = TcpListener::bind(listen)
            .unwrap_or_else(|error| panic!("delay proxy: cannot listen on {listen}: {error}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|error| panic!("delay proxy: a non-blocking {listen}: {error}"));
        let address = listener
            .local_addr()
            .unwrap_or_else(|error| panic!("delay proxy: the address of {listen}: {error}"));
        let shared = Arc::new(Shared {
            upstream,
            delay,
            bandwidth_bytes_per_s,
            stopping: AtomicBool::new(false),
            link_free: [Mutex::new(None), Mutex::new(None)],
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            open: Mutex::new(HashMap::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || accept(&listener, &shared))
        };
        DelayProxy {
            address,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The address the proxy listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The bytes forwarded from upstream to clients so far: what clients read through the proxy,
    /// each chunk counted as it is handed to the client's socket.
    pub fn bytes_to_client(&self) -> u64 {
        self.shared.forwarded[Direction::ToClient as usize].load(Ordering::Relaxed)
    }

    /// The bytes forwarded from clients to upstream so far.
    pub fn bytes_to_upstream(&self) -> u64 {
        self.shared.forwarded[Direction::ToUpstream as usize].load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        // Pairs with the Acquire loads in `accept`, `serve` and `wait_until`.
        self.shared.stopping.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take()
            && acceptor.join().is_err()
        {
            eprintln!("delay proxy {}: its acceptor panicked", self.address);
        }
    }
}

impl Shared {
    /// When the chunk of `length` bytes that arrived at `arrived` may leave in `direction`.
    fn departure(&self, direction: Direction, arrived: Instant, length: usize) -> Instant {
        let due = arrived + self.delay;
        let Some(bandwidth) = self.bandwidth_bytes_per_s else {
            return due;
        };
        let mut link_free = self.link_free[direction as usize]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let start = link_free.map_or(due, |free| free.max(due));
        let departure = start + Duration::from_secs_f64(length as f64 / bandwidth.get() as f64);
        *link_free = Some(departure);
        departure
    }
}

/// Takes connections until the proxy is dropped, then closes the open ones and waits for them.
fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    let mut number = 0_u64;
    // Pairs with the Release store in `DelayProxy::drop`.
    while !shared.stopping.load(Ordering::Acquire) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            // Nothing to take, or a failure (too many open files) that may pass: look again.
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        connections.retain(|connection| !connection.is_finished());
        let shared = Arc::clone(shared);
        connections.push(std::thread::spawn(move || serve(client, number, &shared)));
        number += 1;
    }
    for sockets in shared
        .open
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
    {
        for socket in sockets {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
    for connection in connections {
        let _ = connection.join();
    }
}

/// Forwards one connection both ways until both directions have ended.
fn serve(client: TcpStream, number: u64, shared: &Shared) {
    let upstream = match TcpStream::connect(shared.upstream) {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("delay proxy: cannot reach {}: {error}", shared.upstream);
            return;
        }
    };
    let (Ok(client_copy), Ok(upstream_copy)) = (client.try_clone(), upstream.try_clone()) else {
        eprintln!("delay proxy: cannot duplicate the sockets of a connection");
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    shared
        .open
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(number, [client_copy, upstream_copy]);
    // The proxy closes the sockets when it stops while the connection still runs.
    if !shared.stopping.load(Ordering::Acquire) {
        std::thread::scope(|scope| {
            scope.spawn(|| forward(&client, &upstream, Direction::ToUpstream, shared));
            forward(&upstream, &client, Direction::ToClient, shared);
        });
    }
    shared
        .open
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&number);
}

/// Forwards what `source` sends to `destination` until `source` ends or a write fails.
fn forward(source: &TcpStream, destination: &TcpStream, direction: Direction, shared: &Shared) {
    let (sender, receiver) = std::sync::mpsc::sync_channel(CHUNKS_IN_FLIGHT);
    std::thread::scope(|scope| {
        scope.spawn(move || read_chunks(source, &sender));
        write_chunks(&receiver, source, destination, direction, shared);
    });
}

/// Reads `source` in chunks, each passed on with the time it arrived, until its end or an error.
fn read_chunks(mut source: &TcpStream, chunks: &SyncSender<(Instant, Vec<u8>)>) {
    loop {
        let mut chunk = vec![0; CHUNK_BYTES];
        match source.read(&mut chunk) {
            Ok(0) => return,
            Ok(length) => {
                chunk.truncate(length);
                if chunks.send((Instant::now(), chunk)).is_err() {
                    return;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Writes each chunk to `destination` at its departure time, then half-closes `destination`; on a
/// failed write, or when the proxy stops, closes both sockets.
fn write_chunks(
    chunks: &Receiver<(Instant, Vec<u8>)>,
    source: &TcpStream,
    mut destination: &TcpStream,
    direction: Direction,
    shared: &Shared,
) {
    for (arrived, chunk) in chunks {
        let departure = shared.departure(direction, arrived, chunk.len());
        let sent = wait_until(departure, &shared.stopping) && {
            // Counted before the write, so that bytes a client has read are counted by then; a
            // count taken after the write could lag behind a client that already read the chunk.
            shared.forwarded[direction as usize].fetch_add(chunk.len() as u64, Ordering::Relaxed);
            destination.write_all(&chunk).is_ok()
        };
        if !sent {
            let _ = source.shutdown(Shutdown::Both);
            let _ = destination.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = destination.shutdown(Shutdown::Write);
}

/// Sleeps until `deadline`; returns false, sooner, when `stopping` is set.
fn wait_until(deadline: Instant, stopping: &AtomicBool) -> bool {
    loop {
        // Pairs with the Release store in `DelayProxy::drop`.
        if stopping.load(Ordering::Acquire) {
            return false;
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return true;
        };
        std::thread::sleep(left.min(POLL));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// A server on 127.0.0.1 that answers each connection by echoing what it reads until the end.
    fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("echo listens");
        let address = listener.local_addr().expect("echo address");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.expect("echo accepts");
                std::thread::spawn(move || {
                    let mut reader = stream.try_clone().expect("echo clones");
                    std::io::copy(&mut reader, &mut stream).expect("echo copies");
                });
            }
        });
        address
    }

    /// Sends `message` through the proxy, half-closes, and reads the whole answer.
    fn round_trip(proxy: &DelayProxy, message: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(proxy.address()).expect("connects to the proxy");
        stream.write_all(message).expect("sends");
        stream.shutdown(Shutdown::Write).expect("half-closes");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("reads the echo");
        answer
    }

    #[test]
    fn every_byte_is_delayed_each_way_and_counted() {
        let delay = Duration::from_millis(150);
        let sut = DelayProxy::start((Ipv4Addr::LOCALHOST, 0).into(), echo_server(), delay, None);
        let message: Vec<u8> = (0..200_000_u32).map(|byte| byte as u8).collect();
        let started = Instant::now();
        let answer = round_trip(&sut, &message);
        let elapsed = started.elapsed();
        assert_eq!(answer, message, "the echo comes back whole");
        assert!(
            elapsed >= 2 * delay,
            "a round trip takes both delays: {elapsed:?}"
        );
        assert_eq!(sut.bytes_to_upstream(), message.len() as u64);
        assert_eq!(sut.bytes_to_client(), message.len() as u64);
    }

    #[test]
    fn the_bandwidth_is_capped_in_each_direction() {
        let bandwidth = NonZeroU64::new(1_000_000).expect("non-zero");
        let sut = DelayProxy::start(
            (Ipv4Addr::LOCALHOST, 0).into(),
            echo_server(),
            Duration::ZERO,
            Some(bandwidth),
        );
        let message = vec![7; 400_000];
        let started = Instant::now();
        assert_eq!(round_trip(&sut, &message), message);
        let elapsed = started.elapsed();
        // 400 kB at 1 MB/s: 0.4 s one way; the echo starts before the last byte went up, so the
        // two ways overlap, and the bound is one way's time.
        assert!(
            elapsed >= Duration::from_millis(400),
            "400 kB through a 1 MB/s link: {elapsed:?}"
        );
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections() {
        let sut = DelayProxy::start(
            (Ipv4Addr::LOCALHOST, 0).into(),
            echo_server(),
            Duration::ZERO,
            None,
        );
        let mut stream = TcpStream::connect(sut.address()).expect("connects");
        stream.write_all(b"ping").expect("sends");
        let mut answer = [0; 4];
        stream.read_exact(&mut answer).expect("echo");
        drop(sut);
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "the connection ends: {read:?}"
        );
    }
}
