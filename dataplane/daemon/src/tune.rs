//! The daemon's reading, tuned at run time: how many task reads decode at once, and how many bytes
//! of decoded batches wait ahead of the rings.
//!
//! # Implementation
//! Two [`Budget`]s bound the reading of every ring's tasks together: decode permits (a task read of
//! local files holds one while it opens its split or decodes a batch; a read from an object store
//! waits on the network most of its time, and keeps one read per open task) and read-ahead bytes
//! (a decoded batch holds its size until its feeder hands it to the ring's writer; a task read
//! holding none may take one batch past the limit, so that no feeder waits on a read that waits on
//! another's batches). Every [`TUNE_INTERVAL`] the [`Tuner`] looks at what happened since its last
//! look, from the rings' wait counters and the budgets' own ([`Observation`]):
//! - a trainer waited on an empty ring while reads waited for a permit: one more permit, up to the
//!   cap; while they waited for read-ahead bytes: twice the bytes, up to the cap;
//! - every ring stayed full (its writer waited on it most of the interval) for [`CALM_LOOKS`] looks
//!   in a row: one permit less, down to one, and half the bytes, down to [`MIN_READ_AHEAD`].
//!
//! So a daemon whose trainers keep up with it reads on as few cores as it needs, which leaves the
//! others to the trainers beside it, and holds less memory ahead; a trainer that speeds up gets the
//! parallelism back within a few looks. The caps are the job's `daemon` section, the cgroup's CPU
//! quota (in cores, rounded up) and a quarter of its memory limit; the decode runtime has as many
//! threads as the permits' cap. A daemon whose trainers do not read at all does nothing: its
//! feeders wait on full rings, and no read holds a permit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::v1;
use tokio::sync::Notify;

/// How often the tuner looks.
pub(crate) const TUNE_INTERVAL: Duration = Duration::from_millis(250);
/// Looks in a row with every ring full before the tuner gives back a permit and half the bytes.
pub(crate) const CALM_LOOKS: u32 = 4;
/// The read-ahead the tuner never goes below.
pub(crate) const MIN_READ_AHEAD: u64 = 8 << 20;
/// The read-ahead cap when the job sets none and the cgroup's memory does not ask for less.
pub(crate) const DEFAULT_MAX_READ_AHEAD: u64 = 1 << 30;

/// An amount shared by many takers whose limit may change while they hold it: a take waits until
/// the amount fits under the limit, until nothing is held (so a take larger than the limit goes
/// alone rather than never), or until its holder holds nothing.
///
/// The last rule keeps the feeders from waiting on each other: a task's reader may always hold one
/// decoded batch, so the reader a feeder waits on (its queue empty, so holding nothing) never waits
/// for bytes that batches of other tasks hold, and may be held until their feeders take them.
#[derive(Debug)]
pub(crate) struct Budget {
    state: Mutex<Held>,
    released: Notify,
    /// Nanoseconds takers waited, summed.
    waited_ns: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    limit: u64,
    used: u64,
}

/// An amount taken from a [`Budget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Taken {
    budget: Arc<Budget>,
    amount: u64,
    holder: Option<Arc<AtomicU64>>,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            state: Mutex::new(Held { limit, used: 0 }),
            released: Notify::new(),
            waited_ns: AtomicU64::new(0),
        })
    }

    /// Takes `amount` for `holder` (the amount it holds, counted with the budget's), waiting until
    /// it fits or the holder holds nothing.
    pub(crate) async fn take(
        self: &Arc<Self>,
        amount: u64,
        holder: Option<&Arc<AtomicU64>>,
    ) -> Taken {
        let mut started = None;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.lock();
                let holds_nothing =
                    holder.is_some_and(|holder| holder.load(Ordering::Acquire) == 0);
                if held.used == 0 || holds_nothing || held.used.saturating_add(amount) <= held.limit
                {
                    held.used += amount;
                    if let Some(holder) = holder {
                        holder.fetch_add(amount, Ordering::AcqRel);
                    }
                    break;
                }
            }
            started.get_or_insert_with(Instant::now);
            released.await;
        }
        if let Some(started) = started {
            let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.waited_ns.fetch_add(waited, Ordering::Relaxed);
        }
        Taken {
            budget: Arc::clone(self),
            amount,
            holder: holder.cloned(),
        }
    }

    /// Sets the limit; takers waiting for room get another look.
    pub(crate) fn set_limit(&self, limit: u64) {
        self.lock().limit = limit;
        self.released.notify_waiters();
    }

    /// The limit and the amount held.
    pub(crate) fn state(&self) -> (u64, u64) {
        let held = *self.lock();
        (held.limit, held.used)
    }

    /// How long takers waited, summed over them.
    pub(crate) fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        held.used = held.used.saturating_sub(self.amount);
        if let Some(holder) = &self.holder {
            holder.fetch_sub(self.amount, Ordering::AcqRel);
        }
        drop(held);
        self.budget.released.notify_waiters();
    }
}

/// What the host allows the daemon: its cgroup's CPU quota and memory limit, when it has them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HostLimits {
    /// The CPUs the daemon may run on (its affinity).
    pub(crate) cpus: usize,
    /// The CPU quota in cores (`cpu.max`), the tightest along the cgroup's ancestors.
    pub(crate) cpu_quota: Option<f64>,
    /// The memory limit in bytes (`memory.max`), the tightest along the ancestors.
    pub(crate) memory_limit: Option<u64>,
}

impl HostLimits {
    /// Reads the limits of this process's cgroup (v2) from `/sys/fs/cgroup`.
    pub(crate) fn read() -> HostLimits {
        let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
        let group = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| own_group(&text));
        match group {
            Some(group) => HostLimits::of_group(cpus, Path::new("/sys/fs/cgroup"), &group),
            None => HostLimits {
                cpus,
                cpu_quota: None,
                memory_limit: None,
            },
        }
    }

    /// The limits of `group` (a path as `/proc/self/cgroup` gives it) under the cgroup2 mount
    /// `root`, with `cpus` CPUs.
    fn of_group(cpus: usize, root: &Path, group: &str) -> HostLimits {
        let mut cpu_quota: Option<f64> = None;
        let mut memory_limit: Option<u64> = None;
        let mut directory = PathBuf::from(root);
        let mut directories = vec![directory.clone()];
        for part in group.split('/').filter(|part| !part.is_empty()) {
            directory.push(part);
            directories.push(directory.clone());
        }
        for directory in directories {
            if let Some(quota) = read_cpu_max(&directory.join("cpu.max")) {
                cpu_quota = Some(cpu_quota.map_or(quota, |known| known.min(quota)));
            }
            if let Some(limit) = read_memory_max(&directory.join("memory.max")) {
                memory_limit = Some(memory_limit.map_or(limit, |known| known.min(limit)));
            }
        }
        HostLimits {
            cpus,
            cpu_quota,
            memory_limit,
        }
    }

    /// The most decode permits: the job's cap, within the CPUs and the quota.
    pub(crate) fn max_threads(&self, job_max: Option<u32>) -> usize {
        let quota = self
            .cpu_quota
            .map_or(self.cpus, |quota| (quota.ceil() as usize).max(1));
        let host = self.cpus.min(quota).max(1);
        job_max.map_or(host, |max| (max as usize).min(host)).max(1)
    }

    /// The most read-ahead bytes: the job's cap (1 GiB by default), within a quarter of the memory
    /// limit.
    pub(crate) fn max_read_ahead(&self, job_max: Option<u64>) -> u64 {
        let wanted = job_max.unwrap_or(DEFAULT_MAX_READ_AHEAD);
        let host = self
            .memory_limit
            .map(|limit| (limit / 4).max(MIN_READ_AHEAD));
        host.map_or(wanted, |host| wanted.min(host)).max(1)
    }
}

/// The cgroup v2 path in `/proc/self/cgroup`'s text (`0::/path`).
fn own_group(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// A `cpu.max` (`QUOTA PERIOD`, or `max PERIOD` for none) as cores.
fn read_cpu_max(path: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut fields = text.split_whitespace();
    let quota: f64 = fields.next()?.parse().ok()?;
    let period: f64 = fields.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// A `memory.max` in bytes (`max` for none).
fn read_memory_max(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What the tuner saw over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Observation {
    /// A trainer waited on an empty ring.
    pub(crate) starved: bool,
    /// A task read waited for a decode permit.
    pub(crate) decode_waited: bool,
    /// A decoded batch waited for read-ahead bytes.
    pub(crate) read_ahead_waited: bool,
    /// Every ring's writer waited on its full ring most of the interval.
    pub(crate) full: bool,
}

/// The tuner's choices and what it bases the next on: pure, so that it is tested without a
/// daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tuner {
    /// Decode permits.
    pub(crate) threads: usize,
    /// Read-ahead bytes.
    pub(crate) read_ahead: u64,
    max_threads: usize,
    max_read_ahead: u64,
    /// Looks in a row with every ring full.
    calm: u32,
}

impl Tuner {
    /// Starts at the caps: the first batches come as fast as the host allows.
    pub(crate) fn new(max_threads: usize, max_read_ahead: u64) -> Tuner {
        Tuner {
            threads: max_threads,
            read_ahead: max_read_ahead,
            max_threads,
            max_read_ahead,
            calm: 0,
        }
    }

    /// Takes one interval's observation into the choices.
    pub(crate) fn observe(&mut self, seen: Observation) {
        if seen.starved {
            self.calm = 0;
            if seen.decode_waited {
                self.threads = (self.threads + 1).min(self.max_threads);
            }
            if seen.read_ahead_waited {
                self.read_ahead = self.read_ahead.saturating_mul(2).min(self.max_read_ahead);
            }
        } else if seen.full {
            self.calm += 1;
            if self.calm >= CALM_LOOKS {
                self.calm = 0;
                self.threads = self.threads.saturating_sub(1).max(1);
                self.read_ahead = (self.read_ahead / 2)
                    .max(MIN_READ_AHEAD)
                    .min(self.max_read_ahead);
            }
        } else {
            self.calm = 0;
        }
    }
}

/// The budgets a daemon's reading takes from, with the caps the tuner keeps them within.
#[derive(Debug)]
pub(crate) struct Tuning {
    /// Decode permits: one per task read opening its split or decoding a batch.
    pub(crate) decode: Arc<Budget>,
    /// Read-ahead: the bytes of decoded batches not yet handed to a ring's writer.
    pub(crate) read_ahead: Arc<Budget>,
    /// The tuner's state.
    tuner: Mutex<Tuner>,
    /// The host's limits the caps came from.
    pub(crate) host: HostLimits,
}

impl Tuning {
    /// Budgets at the caps of `host` and the job's `daemon` section.
    pub(crate) fn new(
        host: HostLimits,
        job_threads: Option<u32>,
        job_read_ahead: Option<u64>,
    ) -> Tuning {
        let tuner = Tuner::new(
            host.max_threads(job_threads),
            host.max_read_ahead(job_read_ahead),
        );
        Tuning {
            decode: Budget::new(tuner.threads as u64),
            read_ahead: Budget::new(tuner.read_ahead),
            tuner: Mutex::new(tuner),
            host,
        }
    }

    /// The caps: decode permits and read-ahead bytes.
    pub(crate) fn caps(&self) -> (usize, u64) {
        let tuner = self.lock();
        (tuner.max_threads, tuner.max_read_ahead)
    }

    /// The choices, the caps and what is held now, for the metrics.
    pub(crate) fn figures(&self) -> TuningFigures {
        let (max_threads, max_read_ahead) = self.caps();
        let (threads, _) = self.decode.state();
        let (read_ahead, read_ahead_held) = self.read_ahead.state();
        TuningFigures {
            threads,
            max_threads: max_threads as u64,
            read_ahead,
            read_ahead_held,
            max_read_ahead,
            cpu_quota: self.host.cpu_quota,
        }
    }

    /// The choices and caps, for the AM.
    pub(crate) fn report(&self) -> v1::ReadTuning {
        let figures = self.figures();
        v1::ReadTuning {
            threads: u32::try_from(figures.threads).unwrap_or(u32::MAX),
            max_threads: u32::try_from(figures.max_threads).unwrap_or(u32::MAX),
            read_ahead_bytes: figures.read_ahead,
            max_read_ahead_bytes: figures.max_read_ahead,
            held_bytes: figures.read_ahead_held,
        }
    }

    /// Takes an interval's observation and applies the tuner's new choices to the budgets.
    pub(crate) fn observe(&self, seen: Observation) {
        let tuner = {
            let mut tuner = self.lock();
            tuner.observe(seen);
            tuner.clone()
        };
        if self.decode.state().0 != tuner.threads as u64 {
            tracing::debug!(threads = tuner.threads, "decode parallelism tuned");
            self.decode.set_limit(tuner.threads as u64);
        }
        if self.read_ahead.state().0 != tuner.read_ahead {
            tracing::debug!(bytes = tuner.read_ahead, "read-ahead tuned");
            self.read_ahead.set_limit(tuner.read_ahead);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tuner> {
        self.tuner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The tuning's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TuningFigures {
    /// Decode permits chosen.
    pub(crate) threads: u64,
    /// Their cap.
    pub(crate) max_threads: u64,
    /// Read-ahead bytes chosen.
    pub(crate) read_ahead: u64,
    /// Read-ahead bytes held by decoded batches.
    pub(crate) read_ahead_held: u64,
    /// Their cap.
    pub(crate) max_read_ahead: u64,
    /// The cgroup's CPU quota in cores, if it has one.
    pub(crate) cpu_quota: Option<f64>,
}

/// Tunes `tuning` every [`TUNE_INTERVAL`] for as long as it runs, from the rings' waits as
/// `rings` gives them: how many rings, their trainers' waits summed, and the least of their
/// writers' waits.
pub(crate) async fn run(tuning: Arc<Tuning>, rings: impl Fn() -> (usize, Duration, Duration)) {
    let counters = || {
        let (count, trainer_wait, least_writer_wait) = rings();
        Counters {
            rings: count,
            trainer_wait,
            least_writer_wait,
            decode_wait: tuning.decode.waited(),
            read_ahead_wait: tuning.read_ahead.waited(),
        }
    };
    let mut before = counters();
    let mut ticks = tokio::time::interval(TUNE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let now = counters();
        tuning.observe(now.since(&before, TUNE_INTERVAL));
        before = now;
    }
}

/// The counters an observation is the difference of: the rings' summed waits and the budgets'.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    /// The rings served.
    pub(crate) rings: usize,
    /// How long their trainers waited on empty rings, summed.
    pub(crate) trainer_wait: Duration,
    /// The least any ring's writer waited on its full ring.
    pub(crate) least_writer_wait: Duration,
    /// How long task reads waited for decode permits, summed.
    pub(crate) decode_wait: Duration,
    /// How long decoded batches waited for read-ahead bytes, summed.
    pub(crate) read_ahead_wait: Duration,
}

impl Counters {
    /// What changed from `before` to `self` over `interval`.
    pub(crate) fn since(&self, before: &Counters, interval: Duration) -> Observation {
        let grew = |now: Duration, then: Duration| now.saturating_sub(then);
        Observation {
            // A trainer waiting a tenth of the interval is a trainer the reading holds back.
            starved: grew(self.trainer_wait, before.trainer_wait) * 10 >= interval,
            decode_waited: grew(self.decode_wait, before.decode_wait) > Duration::ZERO,
            read_ahead_waited: grew(self.read_ahead_wait, before.read_ahead_wait) > Duration::ZERO,
            full: self.rings > 0
                && self.rings == before.rings
                && grew(self.least_writer_wait, before.least_writer_wait) * 2 >= interval,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STARVED: Observation = Observation {
        starved: true,
        decode_waited: true,
        read_ahead_waited: true,
        full: false,
    };
    const FULL: Observation = Observation {
        starved: false,
        decode_waited: false,
        read_ahead_waited: false,
        full: true,
    };

    #[test]
    fn full_rings_give_back_permits_and_bytes_and_a_starved_trainer_takes_them_again() {
        let mut sut = Tuner::new(4, 256 << 20);
        for _ in 0..CALM_LOOKS - 1 {
            sut.observe(FULL);
        }
        assert_eq!(
            (sut.threads, sut.read_ahead),
            (4, 256 << 20),
            "not yet calm"
        );
        for _ in 0..CALM_LOOKS * 10 {
            sut.observe(FULL);
        }
        assert_eq!((sut.threads, sut.read_ahead), (1, MIN_READ_AHEAD));
        sut.observe(STARVED);
        assert_eq!((sut.threads, sut.read_ahead), (2, 2 * MIN_READ_AHEAD));
        for _ in 0..20 {
            sut.observe(STARVED);
        }
        assert_eq!(
            (sut.threads, sut.read_ahead),
            (4, 256 << 20),
            "up to the caps"
        );
    }

    #[test]
    fn a_starved_trainer_raises_only_what_reads_waited_for_and_a_look_between_resets_the_calm() {
        let mut sut = Tuner::new(3, 64 << 20);
        for _ in 0..CALM_LOOKS * 4 {
            sut.observe(FULL);
        }
        assert_eq!((sut.threads, sut.read_ahead), (1, MIN_READ_AHEAD));
        // A trainer that waits while no read waited (no task to read): nothing to raise.
        sut.observe(Observation {
            starved: true,
            ..Observation::default()
        });
        assert_eq!((sut.threads, sut.read_ahead), (1, MIN_READ_AHEAD));
        sut.observe(Observation {
            starved: true,
            decode_waited: true,
            ..Observation::default()
        });
        assert_eq!((sut.threads, sut.read_ahead), (2, MIN_READ_AHEAD));
        for _ in 0..CALM_LOOKS - 1 {
            sut.observe(FULL);
        }
        sut.observe(Observation::default());
        sut.observe(FULL);
        assert_eq!(
            sut.threads, 2,
            "the calm starts again after a look that is not"
        );
    }

    #[test]
    fn observations_are_the_differences_of_the_counters() {
        let before = Counters {
            rings: 2,
            trainer_wait: Duration::from_millis(100),
            least_writer_wait: Duration::from_millis(50),
            ..Counters::default()
        };
        let interval = Duration::from_millis(250);
        let starved = Counters {
            trainer_wait: Duration::from_millis(130),
            decode_wait: Duration::from_micros(1),
            ..before
        };
        assert_eq!(
            starved.since(&before, interval),
            Observation {
                starved: true,
                decode_waited: true,
                ..Observation::default()
            }
        );
        let full = Counters {
            least_writer_wait: Duration::from_millis(200),
            ..before
        };
        assert_eq!(full.since(&before, interval), FULL);
        let fewer_rings = Counters { rings: 1, ..full };
        assert!(!fewer_rings.since(&before, interval).full);
    }

    #[test]
    fn the_caps_come_from_the_job_then_the_quota_then_the_cpus() {
        let root = tempfile::tempdir().expect("a directory");
        std::fs::create_dir_all(root.path().join("job/daemon")).expect("groups");
        std::fs::write(root.path().join("cpu.max"), "max 100000\n").expect("write");
        std::fs::write(root.path().join("job/cpu.max"), "250000 100000\n").expect("write");
        std::fs::write(root.path().join("job/daemon/cpu.max"), "max 100000\n").expect("write");
        std::fs::write(root.path().join("job/memory.max"), "max\n").expect("write");
        std::fs::write(root.path().join("job/daemon/memory.max"), "1073741824\n").expect("write");
        let sut = HostLimits::of_group(8, root.path(), "/job/daemon");
        assert_eq!(sut.cpu_quota, Some(2.5));
        assert_eq!(sut.memory_limit, Some(1 << 30));
        assert_eq!(sut.max_threads(None), 3, "2.5 cores, rounded up");
        assert_eq!(sut.max_threads(Some(2)), 2, "the job's cap");
        assert_eq!(sut.max_threads(Some(6)), 3, "within the quota");
        assert_eq!(
            sut.max_read_ahead(None),
            256 << 20,
            "a quarter of the memory"
        );
        assert_eq!(sut.max_read_ahead(Some(1 << 20)), 1 << 20, "the job's cap");
        assert_eq!(
            sut.max_read_ahead(Some(1 << 40)),
            256 << 20,
            "within the memory"
        );
        let unlimited = HostLimits::of_group(2, root.path(), "/elsewhere");
        assert_eq!(unlimited.max_threads(None), 2);
        assert_eq!(unlimited.max_read_ahead(None), DEFAULT_MAX_READ_AHEAD);
        assert_eq!(
            own_group("0::/job/daemon\n").as_deref(),
            Some("/job/daemon")
        );
    }

    #[tokio::test]
    async fn a_budget_waits_for_room_lets_a_large_take_go_alone_and_follows_its_limit() {
        let sut = Budget::new(10);
        let first = sut.take(6, None).await;
        let second = sut.take(4, None).await;
        let waiting = tokio::spawn({
            let sut = Arc::clone(&sut);
            async move { sut.take(5, None).await.amount }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "no room for 5 more");
        drop(second);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "4 freed, 6 held: still no room");
        sut.set_limit(11);
        assert_eq!(
            waiting.await.expect("taken"),
            5,
            "a raised limit makes room"
        );
        assert!(sut.waited() >= Duration::from_millis(40));
        drop(first);
        assert_eq!(sut.state(), (11, 0));
        let large = sut.take(100, None).await;
        assert_eq!(sut.state(), (11, 100), "a take past the limit goes alone");
        drop(large);
    }

    #[tokio::test]
    async fn a_holder_that_holds_nothing_takes_past_the_limit_and_one_that_holds_waits() {
        let sut = Budget::new(10);
        let (reader, other) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let others = sut.take(10, Some(&other)).await;
        let first = sut.take(8, Some(&reader)).await;
        assert_eq!(
            sut.state(),
            (10, 18),
            "the reader held nothing: its batch goes"
        );
        assert_eq!(reader.load(Ordering::Acquire), 8);
        let waiting = tokio::spawn({
            let (sut, reader) = (Arc::clone(&sut), Arc::clone(&reader));
            async move { sut.take(3, Some(&reader)).await.amount }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "the reader holds a batch: its next waits"
        );
        // Its feeder takes its batch: it holds nothing again, while the others still hold theirs.
        drop(first);
        assert_eq!(waiting.await.expect("taken"), 3);
        assert_eq!(reader.load(Ordering::Acquire), 0);
        drop(others);
        assert_eq!((sut.state(), other.load(Ordering::Acquire)), ((10, 0), 0));
    }
}
