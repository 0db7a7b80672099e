//! The one place the ring takes its atomics and its sleeping from.
//!
//! Under `cfg(loom)` the atomics are loom's, and a [`Futex`] is modelled by a loom mutex and condition
//! variable, so the loom tests explore every interleaving of the cursor and wake-up protocol. Otherwise a
//! [`Futex`] is a plain `AtomicU32` in shared memory, used with the Linux `futex(2)` system call without
//! `FUTEX_PRIVATE_FLAG`, so that it works across processes.

use std::time::Duration;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Hints the processor that the caller is spinning; under loom, lets another thread run.
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// A 32-bit word that a thread or process can sleep on until another one bumps it.
///
/// The word only ever counts wake-ups: [`Futex::bump`] increments it, then wakes every sleeper. A sleeper
/// reads the count *before* it announces that it sleeps, and [`Futex::wait`] returns at once when the
/// count has moved since, so a bump between the announcement and the sleep is never lost.
#[cfg_attr(not(loom), repr(transparent))]
#[derive(Debug, Default)]
pub(crate) struct Futex {
    count: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    condvar: loom::sync::Condvar,
}

impl Futex {
    /// Reads the wake-up count; pairs with the `Release` increment in [`Futex::bump`].
    pub(crate) fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    /// Increments the wake-up count and wakes every sleeper.
    pub(crate) fn bump(&self) {
        // Release pairs with the Acquire load in `Futex::count`.
        self.count.fetch_add(1, Ordering::Release);
        self.wake_all();
    }

    /// Sleeps while the count still equals `seen`, for at most `timeout` (`None`: until woken).
    ///
    /// May return early (a signal, a spurious wake-up); callers re-check their condition in a loop.
    pub(crate) fn wait(&self, seen: u32, timeout: Option<Duration>) {
        #[cfg(loom)]
        {
            let _ = timeout;
            let guard = self.lock.lock().unwrap();
            if self.count.load(Ordering::Acquire) == seen {
                drop(self.condvar.wait(guard).unwrap());
            }
        }
        #[cfg(not(loom))]
        {
            let timespec = timeout.map(|timeout| libc::timespec {
                tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
            });
            let timespec_ptr = timespec.as_ref().map_or(std::ptr::null(), |timespec| {
                timespec as *const libc::timespec
            });
            // SAFETY: `self.count` is a live, 4-byte aligned AtomicU32 for the duration of the call, and
            // `timespec_ptr` is null or points at a timespec on this stack frame. FUTEX_WAIT only reads
            // both; any error (EAGAIN when the count moved, EINTR, ETIMEDOUT) is a return to the caller's
            // loop, which re-checks its condition.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.count.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    timespec_ptr,
                );
            }
        }
    }

    fn wake_all(&self) {
        #[cfg(loom)]
        {
            drop(self.lock.lock().unwrap());
            self.condvar.notify_all();
        }
        #[cfg(not(loom))]
        {
            // SAFETY: `self.count` is a live, 4-byte aligned AtomicU32; FUTEX_WAKE only uses its address
            // as a key and touches no memory.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.count.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                );
            }
        }
    }
}

/// Pads and aligns a value to 128 bytes, so that two hot words never share a cache line (nor the
/// adjacent line that x86 prefetches in pairs).
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
