//! What the AM's listeners allow a connection that has shown no token: a place among at most
//! [`MAX_UNAUTHENTICATED`] such connections per listener, for at most [`UNAUTHENTICATED_TIMEOUT`].
//!
//! Every connection costs the AM a file descriptor from the moment it is accepted, and anyone who
//! reaches a port can open one without sending a byte. Left alone, idle connections would take every
//! descriptor the AM may open, and with them the files of its journal. So a connection that has not
//! yet made a request showing the AM's token (any request, when the AM has no token) is
//!
//! - one of at most [`MAX_UNAUTHENTICATED`] per listener: when another one comes, the oldest is
//!   closed, so that a new caller (a daemon reconnecting, `sluice status`) always gets a place and
//!   keeps it for as long as it takes an attacker to open that many connections after it;
//! - closed [`UNAUTHENTICATED_TIMEOUT`] after it was accepted, complete request or not (a request
//!   without the token gets its refusal and the connection closes soon after).
//!
//! A connection that has shown the token is the AM's own caller's: its calls and the silences between
//! them (a daemon's heartbeat interval, a trainer's checkpoints) have no deadline here; the gRPC port's
//! HTTP/2 keepalive pings close it once its peer is gone.
//!
//! # Implementation
//!
//! [`Admission`] is the bookkeeping, a pure state: connections waiting for their token in the order
//! they came, which is also the order of their deadlines (they all wait the same time). Admitting one
//! past the cap returns the oldest to close; a sweep returns those whose deadline passed; a
//! connection leaves when it shows the token or closes.
//!
//! [`ConnectionGuard`] runs it for one listener: [`ConnectionGuard::accept`] wraps each accepted
//! socket in a [`Guarded`] stream with a [`Ticket`], which the servers find in each request's
//! extensions ([`ConnectionInfo`], through tonic's and axum's connect info) and mark when the
//! request shows the token ([`Ticket::show_token`]). A sweeper task closes expired connections every
//! [`SWEEP_INTERVAL`]. Closing sets the ticket's flag and wakes the connection's task; the stream
//! then reads as ended and refuses writes, so hyper ends the connection and drops the socket.
//!
//! Accepting when the process has no descriptor left (`EMFILE`, `ENFILE`: the AM's own callers
//! took them, since connections without a token take at most half) closes the oldest waiting
//! connection when another connection waits in the queue, and tries again a little later, instead
//! of failing in a tight loop.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::clock::{Clock, SystemClock};
use crate::error::is_descriptor_shortage;

/// How many connections that have shown no token a listener keeps open at once.
///
/// The AM has two listeners (the API and the status page), so connections without a token hold at
/// most 512 descriptors: half of the soft limit of open files most systems start a process with
/// (1,024), which the AM raises to the hard limit when it can. The other half stays for what the AM
/// needs to run the job: its journal's files, the connections of its daemons and trainers (which
/// show the token with their first call), the launcher's processes and object-store connections.
/// A caller's connection needs a place only until its first request, a round trip. Under a lower
/// limit of open files a listener keeps a quarter of it ([`ConnectionGuard::new`]), so that
/// connections without a token never take every descriptor.
pub const MAX_UNAUTHENTICATED: usize = 256;

/// The share of the process's limit of open files each listener gives connections without a token,
/// when that is fewer than [`MAX_UNAUTHENTICATED`]: one in four, half of the limit for the two.
const UNAUTHENTICATED_SHARE_OF_LIMIT: u64 = 4;

/// How long a connection may stay open without showing the token: enough for a TLS handshake and a
/// request over a slow link, short enough that connections left idle are gone in seconds.
pub const UNAUTHENTICATED_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections the kernel completes and queues for a listener before the AM accepts them
/// (capped by `net.core.somaxconn`). A burst of connections (daemons calling again after a takeover,
/// or a flood) that finds the queue full has its connection attempts dropped, and each waits a
/// second or more for the kernel to try again; the default of 128 fills in a few milliseconds.
pub const LISTEN_BACKLOG: u32 = 4096;

/// How often the guard closes the connections whose time ran out.
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// How long accepting waits after an error other than a connection's own before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long accepting waits, after it found no descriptor free and closed a connection, for that
/// connection's task to let its descriptor go.
const SHORTAGE_BACKOFF: Duration = Duration::from_millis(5);

/// How often a failing accept is logged while it keeps failing.
const ACCEPT_WARNING_INTERVAL_MS: u64 = 5_000;

/// A listener on `address` with a queue of [`LISTEN_BACKLOG`] connections, reusing the address
/// as a restarted AM must.
pub fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The connections of a listener that have shown no token yet, oldest first.
#[derive(Debug)]
pub struct Admission<T> {
    cap: usize,
    timeout_ms: u64,
    next_place: u64,
    /// By place, the order of admission: each with its deadline and the connection.
    waiting: BTreeMap<u64, (u64, T)>,
}

impl<T> Admission<T> {
    /// At most `cap` connections at once (at least one), each for at most `timeout`.
    pub fn new(cap: usize, timeout: Duration) -> Admission<T> {
        Admission {
            cap: cap.max(1),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            next_place: 0,
            waiting: BTreeMap::new(),
        }
    }

    /// Admits `connection`, accepted at `now_ms`: returns its place, and the oldest waiting
    /// connection when the admission was full, which the caller closes.
    pub fn admit(&mut self, connection: T, now_ms: u64) -> (u64, Option<T>) {
        let place = self.next_place;
        self.next_place += 1;
        let deadline = now_ms.saturating_add(self.timeout_ms);
        debug_assert!(
            self.waiting
                .last_key_value()
                .is_none_or(|(_, (last, _))| *last <= deadline),
            "deadlines come in the order of admission"
        );
        self.waiting.insert(place, (deadline, connection));
        let evicted = (self.waiting.len() > self.cap)
            .then(|| self.oldest())
            .flatten();
        (place, evicted)
    }

    /// Takes the connection at `place` out, when it showed the token or closed; `None` when it had
    /// left already.
    pub fn leave(&mut self, place: u64) -> Option<T> {
        self.waiting
            .remove(&place)
            .map(|(_, connection)| connection)
    }

    /// Takes out the connections whose deadline is at or before `now_ms`, for the caller to close.
    pub fn expired(&mut self, now_ms: u64) -> Vec<T> {
        let mut expired = Vec::new();
        while let Some(entry) = self.waiting.first_entry() {
            if entry.get().0 > now_ms {
                break;
            }
            expired.push(entry.remove().1);
        }
        expired
    }

    /// Takes out the oldest waiting connection, for the caller to close.
    pub fn oldest(&mut self) -> Option<T> {
        self.waiting
            .pop_first()
            .map(|(_, (_, connection))| connection)
    }

    /// How many connections wait for their token.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// What a connection and its guard share: whether the guard closed it, and the task to wake when
/// it does.
#[derive(Debug, Default)]
struct Slot {
    closed: AtomicBool,
    shown: AtomicBool,
    waker: AtomicWaker,
}

impl Slot {
    fn close(&self) {
        // Pairs with the Acquire loads in `Guarded::closed`: a task woken by this reads it set.
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// A connection's place with its listener's guard.
#[derive(Debug, Clone)]
pub struct Ticket {
    slot: Arc<Slot>,
    place: u64,
    guard: Weak<GuardShared>,
}

impl Ticket {
    /// Notes that a request on the connection showed the AM's token: from now on the guard leaves
    /// the connection alone.
    pub fn show_token(&self) {
        if self.slot.shown.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(guard) = self.guard.upgrade() {
            guard.admission().leave(self.place);
        }
    }

    /// The ticket of the connection a request came on, found in its extensions (tonic's connect
    /// info, plain or TLS, and axum's).
    pub fn of(extensions: &axum::http::Extensions) -> Option<&Ticket> {
        use tonic::transport::server::TlsConnectInfo;
        extensions
            .get::<ConnectionInfo>()
            .or_else(|| {
                extensions
                    .get::<TlsConnectInfo<ConnectionInfo>>()
                    .map(TlsConnectInfo::get_ref)
            })
            .or_else(|| {
                extensions
                    .get::<axum::extract::ConnectInfo<ConnectionInfo>>()
                    .map(|info| &info.0)
            })
            .map(|info| &info.ticket)
    }
}

/// What a request knows of its connection: where it comes from, and its [`Ticket`].
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    /// The peer's address, when the socket knows it.
    pub remote: Option<SocketAddr>,
    ticket: Ticket,
}

/// The guard of one listener's connections: see [the module](self).
#[derive(Debug, Clone)]
pub struct ConnectionGuard {
    shared: Arc<GuardShared>,
}

#[derive(Debug)]
struct GuardShared {
    /// The listener, as the log names it.
    what: &'static str,
    clock: Arc<dyn Clock>,
    admission: Mutex<Admission<Arc<Slot>>>,
    /// When a failing accept was last logged.
    accept_warned_ms: Mutex<Option<u64>>,
}

impl GuardShared {
    fn admission(&self) -> MutexGuard<'_, Admission<Arc<Slot>>> {
        // Each call leaves the admission whole between statements that cannot panic.
        self.admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.monotonic().as_millis()).unwrap_or(u64::MAX)
    }

    fn close_expired(&self) {
        let now_ms = self.now_ms();
        let expired = self.admission().expired(now_ms);
        if !expired.is_empty() {
            tracing::debug!(
                listener = self.what,
                connections = expired.len(),
                "closing connections that showed no token in time"
            );
        }
        for slot in expired {
            slot.close();
        }
    }
}

impl ConnectionGuard {
    /// The guard of the listener named `what` in the log, with [`MAX_UNAUTHENTICATED`] places (or a
    /// quarter of the process's limit of open files, when that is fewer) and
    /// [`UNAUTHENTICATED_TIMEOUT`] on the host's clock. Its sweeper runs on the current runtime
    /// until the guard and every connection it admitted are gone.
    pub fn new(what: &'static str) -> ConnectionGuard {
        let share = sluice_process::open_files_limit() / UNAUTHENTICATED_SHARE_OF_LIMIT;
        let cap = usize::try_from(share)
            .map_or(MAX_UNAUTHENTICATED, |share| share.min(MAX_UNAUTHENTICATED));
        ConnectionGuard::with(
            what,
            cap,
            UNAUTHENTICATED_TIMEOUT,
            Arc::new(SystemClock::new()),
        )
    }

    /// A guard with its own cap, timeout and clock.
    pub fn with(
        what: &'static str,
        cap: usize,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> ConnectionGuard {
        let shared = Arc::new(GuardShared {
            what,
            clock,
            admission: Mutex::new(Admission::new(cap, timeout)),
            accept_warned_ms: Mutex::new(None),
        });
        tokio::spawn(sweep(Arc::downgrade(&shared)));
        ConnectionGuard { shared }
    }

    /// Admits `stream`: it counts among the connections without a token until a request on it
    /// shows the token. Closes the oldest waiting connection when the guard is full.
    pub fn admit<S>(&self, stream: S, remote: Option<SocketAddr>) -> Guarded<S> {
        let slot = Arc::new(Slot::default());
        let now_ms = self.shared.now_ms();
        let (place, evicted) = self.shared.admission().admit(slot.clone(), now_ms);
        if let Some(evicted) = evicted {
            evicted.close();
        }
        Guarded {
            stream,
            info: ConnectionInfo {
                remote,
                ticket: Ticket {
                    slot,
                    place,
                    guard: Arc::downgrade(&self.shared),
                },
            },
        }
    }

    /// How many connections wait for their token.
    pub fn waiting(&self) -> usize {
        self.shared.admission().len()
    }

    /// Accepts the next connection on `listener` and admits it. A failed accept is retried:
    /// at once for an error of that connection alone, after closing the oldest waiting connection
    /// when the process has no descriptor left and another connection waits in the queue, and
    /// after [`ACCEPT_BACKOFF`] otherwise.
    pub async fn accept(&self, listener: &TcpListener) -> (Guarded<TcpStream>, SocketAddr) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, %error, "setting TCP_NODELAY failed");
                    }
                    return (self.admit(stream, Some(peer)), peer);
                }
                Err(error) if is_connection_error(&error) => {}
                // The listener asks again at once after each connection it got, and finds no
                // descriptor when that connection took the last one, whether or not another
                // waits: a connection is closed to make room only for one that waits. Closing on
                // every shortage would close that last connection before its first request is
                // read, and keep the last descriptor from every caller.
                Err(error) if is_descriptor_shortage(&error) && !connection_waits(listener) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                Err(error) => {
                    let shortage = is_descriptor_shortage(&error);
                    self.warn_accept(&error, shortage);
                    let closed = shortage && {
                        let oldest = self.shared.admission().oldest();
                        oldest.map(|oldest| oldest.close()).is_some()
                    };
                    let backoff = if closed {
                        SHORTAGE_BACKOFF
                    } else {
                        ACCEPT_BACKOFF
                    };
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    fn warn_accept(&self, error: &io::Error, shortage: bool) {
        let now_ms = self.shared.now_ms();
        let mut warned = self
            .shared
            .accept_warned_ms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warned.is_some_and(|at| now_ms.saturating_sub(at) < ACCEPT_WARNING_INTERVAL_MS) {
            return;
        }
        *warned = Some(now_ms);
        let listener = self.shared.what;
        if shortage {
            tracing::warn!(
                listener,
                %error,
                "accepting a connection failed: the AM has no file descriptor left; connections without a token are closed to make room, and the AM serves on; raise the limit of open files (ulimit -n) if its own callers need more"
            );
        } else {
            tracing::warn!(listener, %error, "accepting a connection failed; trying again");
        }
    }
}

/// Whether a connection waits in `listener`'s queue, asked of the kernel without waiting. An
/// error of the question counts as one waiting: the loop then makes room as it would for a caller.
fn connection_waits(listener: &TcpListener) -> bool {
    let mut waiting = [PollFd::new(listener, PollFlags::IN)];
    rustix::event::poll(&mut waiting, Some(&Timespec::default())).map_or(true, |ready| ready > 0)
}

/// Closes the expired connections of the guard every [`SWEEP_INTERVAL`], until it is gone.
async fn sweep(shared: Weak<GuardShared>) {
    let mut ticker = tokio::time::interval(SWEEP_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticker.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.close_expired();
    }
}

/// An error of the one connection being accepted (it was reset or aborted before the accept),
/// after which the next accept can go on at once.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A connection's stream under its guard: it reads as ended and refuses writes once the guard closed
/// it, so that the server drops it.
#[derive(Debug)]
pub struct Guarded<S> {
    stream: S,
    info: ConnectionInfo,
}

impl<S> Guarded<S> {
    /// What requests on this connection know of it.
    pub fn info(&self) -> &ConnectionInfo {
        &self.info
    }

    /// Whether the guard closed the connection; registers the task to wake when it does.
    fn closed(&self, context: &Context<'_>) -> bool {
        let slot = &self.info.ticket.slot;
        // Pairs with the Release store in `Slot::close`.
        if slot.closed.load(Ordering::Acquire) {
            return true;
        }
        slot.waker.register(context.waker());
        slot.closed.load(Ordering::Acquire)
    }
}

impl<S> Drop for Guarded<S> {
    fn drop(&mut self) {
        let ticket = &self.info.ticket;
        if let Some(guard) = ticket.guard.upgrade() {
            guard.admission().leave(ticket.place);
        }
    }
}

fn closed_by_the_guard() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed by the AM: the connection showed no token in time",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closed(context) {
            // The end of the stream: the server closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(context, buffer)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed(context) {
            return Poll::Ready(Err(closed_by_the_guard()));
        }
        Pin::new(&mut this.stream).poll_write(context, buffer)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed(context) {
            return Poll::Ready(Err(closed_by_the_guard()));
        }
        Pin::new(&mut this.stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(context)
    }
}

impl tonic::transport::server::Connected for Guarded<TcpStream> {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info.clone()
    }
}

/// A listener for `axum::serve` whose connections are admitted by a [`ConnectionGuard`].
#[derive(Debug)]
pub struct GuardedListener {
    listener: TcpListener,
    guard: ConnectionGuard,
}

impl GuardedListener {
    /// Accepts on `listener` under `guard`.
    pub fn new(listener: TcpListener, guard: ConnectionGuard) -> GuardedListener {
        GuardedListener { listener, guard }
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.guard.accept(&self.listener).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, GuardedListener>>
    for ConnectionInfo
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, GuardedListener>) -> ConnectionInfo {
        stream.io().info().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::simulated::SimulatedClock;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn past_the_cap_the_oldest_connection_is_closed_and_each_new_one_gets_a_place() {
        let mut sut = Admission::new(3, TIMEOUT);
        for connection in 0..3 {
            assert_eq!(sut.admit(connection, 0).1, None);
        }
        assert_eq!(sut.admit(3, 1).1, Some(0), "the oldest makes room");
        assert_eq!(sut.admit(4, 2).1, Some(1));
        assert_eq!(sut.len(), 3, "never more than the cap");
        let (place, evicted) = sut.admit(5, 3);
        assert_eq!(evicted, Some(2));
        assert_eq!(sut.leave(place), Some(5), "the newest one shows its token");
        assert_eq!(sut.admit(6, 4).1, None, "its place is free again");
    }

    #[test]
    fn a_connection_that_shows_its_token_leaves_and_is_never_closed() {
        let mut sut = Admission::new(2, TIMEOUT);
        let (daemon, _) = sut.admit("daemon", 0);
        sut.admit("idle", 0);
        assert_eq!(sut.leave(daemon), Some("daemon"));
        assert_eq!(sut.leave(daemon), None, "it left once");
        for idle in 0..10 {
            let evicted = sut.admit("flood", idle);
            assert_ne!(evicted.1, Some("daemon"));
        }
        assert!(!sut.expired(u64::MAX).contains(&"daemon"));
    }

    #[test]
    fn connections_are_closed_once_their_time_without_a_token_ran_out() {
        let mut sut = Admission::new(10, TIMEOUT);
        sut.admit('a', 0);
        sut.admit('b', 1_000);
        let (c, _) = sut.admit('c', 2_000);
        assert!(sut.expired(4_999).is_empty(), "none is due before 5 s");
        assert_eq!(sut.expired(5_000), vec!['a']);
        assert_eq!(sut.leave(c), Some('c'));
        assert_eq!(
            sut.expired(60_000),
            vec!['b'],
            "one that left is not closed"
        );
        assert!(sut.is_empty());
    }

    #[test]
    fn a_cap_of_zero_keeps_one_connection() {
        let mut sut = Admission::new(0, TIMEOUT);
        assert_eq!(sut.admit(1, 0).1, None);
        assert_eq!(sut.admit(2, 0).1, Some(1));
    }

    /// A connected pair of loopback sockets: the client's end, and the server's end under `guard`.
    async fn connect(
        listener: &TcpListener,
        guard: &ConnectionGuard,
    ) -> (TcpStream, Guarded<TcpStream>) {
        let client = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        let (server, _) = guard.accept(listener).await;
        (client, server)
    }

    #[tokio::test]
    async fn a_connection_waits_from_its_connect_until_it_is_accepted() {
        let listener = bind("127.0.0.1:0".parse().expect("address")).expect("bind");
        assert!(!connection_waits(&listener), "nobody has connected");
        let _client = TcpStream::connect(listener.local_addr().expect("address"))
            .await
            .expect("connect");
        assert!(
            connection_waits(&listener),
            "the client's connection is queued"
        );
        let _server = listener.accept().await.expect("accept");
        assert!(!connection_waits(&listener), "the queue is empty again");
    }

    /// Serves `server` as a server would: echoes what it reads until its stream ends.
    fn echo(mut server: Guarded<TcpStream>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut buffer = [0; 64];
            while let Ok(read) = server.read(&mut buffer).await {
                if read == 0 || server.write_all(&buffer[..read]).await.is_err() {
                    break;
                }
            }
        })
    }

    /// Reads until the peer closes: the event a test of closing waits for.
    async fn closed_by_the_server(client: &mut TcpStream) -> bool {
        let mut buffer = [0; 64];
        matches!(client.read(&mut buffer).await, Ok(0) | Err(_))
    }

    #[tokio::test]
    async fn the_guard_closes_the_oldest_connection_and_those_out_of_time_but_not_one_that_showed_its_token()
     {
        let clock = Arc::new(SimulatedClock::at_wall(0));
        let sut = ConnectionGuard::with("test", 2, TIMEOUT, clock.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");

        let (mut authenticated, server) = connect(&listener, &sut).await;
        server.info().ticket.show_token();
        let authenticated_server = echo(server);
        let (mut oldest, server) = connect(&listener, &sut).await;
        let oldest_server = echo(server);
        let (mut newer, server) = connect(&listener, &sut).await;
        let newer_server = echo(server);
        let (mut newest, server) = connect(&listener, &sut).await;
        let newest_server = echo(server);

        assert!(closed_by_the_server(&mut oldest).await, "past the cap of 2");
        oldest_server.await.expect("the server's end ends");
        assert_eq!(sut.waiting(), 2);

        clock.advance(TIMEOUT);
        assert!(closed_by_the_server(&mut newer).await, "out of time");
        assert!(closed_by_the_server(&mut newest).await, "out of time");
        newer_server.await.expect("the server's end ends");
        newest_server.await.expect("the server's end ends");
        assert_eq!(sut.waiting(), 0, "a closed connection leaves");

        authenticated.write_all(b"ping").await.expect("write");
        let mut echoed = [0; 4];
        authenticated
            .read_exact(&mut echoed)
            .await
            .expect("the connection that showed its token still serves");
        assert_eq!(&echoed, b"ping");
        drop(authenticated);
        authenticated_server.await.expect("the server's end ends");
    }
}
