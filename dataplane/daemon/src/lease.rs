//! The daemon's lease on its rings: every call the AM answers renews it, and while it has lapsed the
//! ring writers publish nothing.
//!
//! The AM declares a node lost when it has not heard from it for its heartbeat timeout, and queues
//! the node's tasks again from the consumed counts it last heard. A node cut off from the AM does
//! not know whether that happened, so it stops feeding its trainers before it can have: the lease
//! the AM grants at registration is shorter than the heartbeat timeout, and it runs from the moment
//! the daemon *sent* the last call the AM answered, which is no later than the moment the AM heard
//! it. Once it lapses, no new batch reaches a ring until a call is answered again; what the rings
//! already held may still be read (see the architecture document's rule for a node cut off).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a writer waiting on a lapsed lease looks again.
const WAIT_SLICE: Duration = Duration::from_millis(5);

/// A lease renewed by every answered call. Shared by the session, which renews it, and the ring
/// writers, which wait on it.
#[derive(Debug)]
pub(crate) struct Lease {
    /// What the nanosecond counts below are measured from.
    origin: Instant,
    /// When the last answered call was sent, in nanoseconds since `origin`.
    renewed_ns: AtomicU64,
    /// The lease's length in milliseconds; 0 while the AM granted none (before registering, or an
    /// AM that grants no lease), and then the lease always holds.
    length_ms: AtomicU64,
}

impl Lease {
    /// A lease renewed now, with no length yet.
    pub(crate) fn new() -> Lease {
        Lease {
            origin: Instant::now(),
            renewed_ns: AtomicU64::new(0),
            length_ms: AtomicU64::new(0),
        }
    }

    /// Sets the length the AM granted; 0 for none.
    pub(crate) fn set_length(&self, length: Duration) {
        let millis = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
        // Relaxed: the length is read on its own; no other memory depends on it.
        self.length_ms.store(millis, Ordering::Relaxed);
    }

    /// The length the AM granted, if it granted one.
    pub(crate) fn length(&self) -> Option<Duration> {
        // Relaxed: see `set_length`.
        match self.length_ms.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(Duration::from_millis(millis)),
        }
    }

    /// Renews the lease from `sent`, the moment an answered call was sent. A later renewal never
    /// moves it back.
    pub(crate) fn renew(&self, sent: Instant) {
        let nanos = self.nanos(sent);
        // Relaxed: a single counter that only grows; the writers need no other memory with it.
        self.renewed_ns.fetch_max(nanos, Ordering::Relaxed);
    }

    /// Whether the lease holds now.
    pub(crate) fn holds(&self) -> bool {
        self.holds_at(Instant::now())
    }

    fn holds_at(&self, now: Instant) -> bool {
        let Some(length) = self.length() else {
            return true;
        };
        // Relaxed: see `renew`.
        let renewed = self.renewed_ns.load(Ordering::Relaxed);
        let length = u64::try_from(length.as_nanos()).unwrap_or(u64::MAX);
        self.nanos(now) < renewed.saturating_add(length)
    }

    /// How long ago the lease was last renewed.
    pub(crate) fn since_renewed(&self) -> Duration {
        // Relaxed: see `renew`.
        let renewed = self.renewed_ns.load(Ordering::Relaxed);
        Duration::from_nanos(self.nanos(Instant::now()).saturating_sub(renewed))
    }

    /// Blocks while the lease has lapsed; returns `false` as soon as `give_up` says to stop
    /// waiting, `true` once the lease holds.
    pub(crate) fn wait(&self, give_up: impl Fn() -> bool) -> bool {
        if self.holds() {
            return true;
        }
        tracing::warn!(
            since_answer_ms = self.since_renewed().as_millis() as u64,
            lease_ms = self.length().map_or(0, |length| length.as_millis() as u64),
            "no answer from the AM within the lease: the rings get no new batch until one comes"
        );
        loop {
            if give_up() {
                return false;
            }
            std::thread::sleep(WAIT_SLICE);
            if self.holds() {
                tracing::info!("the AM answers again: the rings are fed again");
                return true;
            }
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_with_no_length_always_holds() {
        let lease = Lease::new();
        assert!(lease.holds_at(Instant::now() + Duration::from_secs(3600)));
    }

    #[test]
    fn a_lease_lapses_its_length_after_the_answered_call_was_sent() {
        let lease = Lease::new();
        lease.set_length(Duration::from_millis(500));
        let sent = Instant::now();
        lease.renew(sent);
        assert!(lease.holds_at(sent + Duration::from_millis(499)));
        assert!(!lease.holds_at(sent + Duration::from_millis(500)));
        // An answer to a call sent earlier, arriving late, does not move the lease back.
        lease.renew(sent - Duration::from_millis(100));
        assert!(lease.holds_at(sent + Duration::from_millis(499)));
        lease.renew(sent + Duration::from_millis(400));
        assert!(lease.holds_at(sent + Duration::from_millis(899)));
        assert!(!lease.holds_at(sent + Duration::from_millis(900)));
    }

    #[test]
    fn a_writer_waits_on_a_lapsed_lease_until_it_is_renewed_or_told_to_stop() {
        let lease = std::sync::Arc::new(Lease::new());
        lease.set_length(Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!lease.holds());
        assert!(!lease.wait(|| true), "told to stop, the wait ends unheld");
        let renewer = {
            let lease = lease.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                lease.renew(Instant::now());
            })
        };
        assert!(lease.wait(|| false), "a renewal ends the wait");
        renewer.join().expect("renewer");
    }
}
