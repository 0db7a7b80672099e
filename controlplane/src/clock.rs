//! The AM's clocks: a monotonic one that liveness is decided on, and the wall clock for what a
//! user reads as a date.
//!
//! # Implementation
//! A node is lost when the AM has not heard from it for longer than the heartbeat timeout. Measured
//! on the wall clock, a step of it (NTP correcting a drift, an operator setting the date) would
//! expire every node at once when it jumps forward, and keep a dead node alive for as long as it
//! jumped back. So the times the AM hands the [`Master`](crate::master::Master), and journals with
//! its events, are [`AmClock`] times: milliseconds on the process's monotonic clock.
//!
//! The journal outlives the process, and a new AM replays events an earlier one journaled. Its
//! decisions replay the same only if the times in the journal never go back, so a new AM's clock
//! does not start from zero: it continues from the latest time the journal holds
//! ([`AmClock::continuing_from`]). A journal written on the wall clock by an earlier release is
//! continued the same way, from its latest wall time.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where the AM reads the time. [`SystemClock`] reads the host's clocks; tests put a simulated
/// clock in its place, whose wall time steps when they say.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Time elapsed on a clock that never steps, from an origin fixed for the clock's lifetime.
    fn monotonic(&self) -> Duration;
    /// Milliseconds since the Unix epoch by the wall clock, which may step either way.
    fn wall_ms(&self) -> u64;
}

/// The host's clocks: [`Instant`] for the monotonic time, [`SystemTime`] for the wall time.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// The host's clocks, the monotonic one counted from now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall_ms(&self) -> u64 {
        wall_ms()
    }
}

/// Milliseconds since the Unix epoch by the host's wall clock: for times shown as dates and for
/// deadlines given as dates (a followed source's `until_timestamp`), never for liveness.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// The time the AM decides liveness on and journals with its events: milliseconds on a monotonic
/// clock, continued from the latest time of the journal the AM took over.
#[derive(Debug, Clone)]
pub struct AmClock {
    source: Arc<dyn Clock>,
    /// The source's monotonic time that stands for `base_ms`.
    origin: Duration,
    base_ms: u64,
}

impl AmClock {
    /// A clock over `source` that reads `base_ms` now and runs on from there with `source`'s
    /// monotonic time: `base_ms` is the latest time of the journal taken over, 0 for a new job.
    pub fn continuing_from(source: Arc<dyn Clock>, base_ms: u64) -> AmClock {
        AmClock {
            origin: source.monotonic(),
            source,
            base_ms,
        }
    }

    /// The AM's time now, in milliseconds; it never goes back, whatever the wall clock does.
    pub fn now_ms(&self) -> u64 {
        let elapsed = self.source.monotonic().saturating_sub(self.origin);
        self.base_ms
            .saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
    }

    /// The wall clock's time now, in milliseconds since the Unix epoch.
    pub fn wall_ms(&self) -> u64 {
        self.source.wall_ms()
    }
}

#[cfg(test)]
pub(crate) mod simulated {
    //! A clock whose two times the test sets.

    use super::Clock;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A monotonic time that only the test advances and a wall time that the test steps.
    #[derive(Debug, Default)]
    pub(crate) struct SimulatedClock {
        times: Mutex<(Duration, u64)>,
    }

    impl SimulatedClock {
        /// Both clocks at `wall_ms` on the wall and zero on the monotonic clock.
        pub(crate) fn at_wall(wall_ms: u64) -> SimulatedClock {
            SimulatedClock {
                times: Mutex::new((Duration::ZERO, wall_ms)),
            }
        }

        /// Time passes: both clocks run on by `elapsed`.
        pub(crate) fn advance(&self, elapsed: Duration) {
            let mut times = self.times.lock().expect("clock lock");
            times.0 += elapsed;
            times.1 += elapsed.as_millis() as u64;
        }

        /// The wall clock is set to `wall_ms`, as NTP or an operator would; no time passes.
        pub(crate) fn set_wall(&self, wall_ms: u64) {
            self.times.lock().expect("clock lock").1 = wall_ms;
        }
    }

    impl Clock for SimulatedClock {
        fn monotonic(&self) -> Duration {
            self.times.lock().expect("clock lock").0
        }

        fn wall_ms(&self) -> u64 {
            self.times.lock().expect("clock lock").1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::simulated::SimulatedClock;
    use super::*;

    const HOUR_MS: u64 = 3_600_000;

    #[test]
    fn the_am_clock_runs_on_the_monotonic_time_whatever_the_wall_clock_does() {
        let source = Arc::new(SimulatedClock::at_wall(10 * HOUR_MS));
        let sut = AmClock::continuing_from(source.clone(), 0);
        source.advance(Duration::from_millis(250));
        assert_eq!(sut.now_ms(), 250);
        source.set_wall(15 * HOUR_MS);
        assert_eq!(sut.now_ms(), 250, "a step forward of the wall clock");
        source.set_wall(HOUR_MS);
        assert_eq!(sut.now_ms(), 250, "a step back of the wall clock");
        assert_eq!(sut.wall_ms(), HOUR_MS, "the wall time is the wall clock's");
        source.advance(Duration::from_millis(50));
        assert_eq!(sut.now_ms(), 300);
    }

    #[test]
    fn a_clock_continued_from_a_journal_starts_at_its_latest_time() {
        let source = Arc::new(SimulatedClock::at_wall(0));
        source.advance(Duration::from_secs(7));
        let sut = AmClock::continuing_from(source.clone(), 1_700_000_000_000);
        assert_eq!(sut.now_ms(), 1_700_000_000_000);
        source.advance(Duration::from_millis(20));
        assert_eq!(sut.now_ms(), 1_700_000_000_020);
    }
}
