//! Pinning producer and consumer to cores, the same way for every transport.

use std::io;
use std::mem;

/// The cores the consumer and the producer run on; `None` when the process may use only one core, so
/// that pinning both sides to it would only make them take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The core of the consumer (and of the memcpy measurement).
    pub consumer: Option<usize>,
    /// The core of the producer.
    pub producer: Option<usize>,
}

impl Placement {
    /// Picks the first two cores this process may run on, one per side.
    pub fn detect() -> io::Result<Placement> {
        let allowed = allowed_cpus()?;
        Ok(match allowed.as_slice() {
            [consumer, producer, ..] => Placement {
                consumer: Some(*consumer),
                producer: Some(*producer),
            },
            _ => Placement {
                consumer: None,
                producer: None,
            },
        })
    }
}

/// Lists the CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let status = unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, so it indexes inside the set.
        .filter(|cpu| unsafe { libc::CPU_ISSET(*cpu, &set) })
        .collect();
    Ok(cpus)
}

/// Pins the calling thread to `cpu`; does nothing for `None`.
pub fn pin_current_thread(cpu: Option<usize>) -> io::Result<()> {
    let Some(cpu) = cpu else {
        return Ok(());
    };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "cpu {cpu} is beyond the {} a cpu set holds",
                libc::CPU_SETSIZE
            ),
        ));
    }
    // SAFETY: cpu_set_t is a plain bit array, for which all zeroes is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: `cpu` was checked to be below CPU_SETSIZE, so it indexes inside the set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let status = unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &set) };
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_runs_only_there() {
        let allowed = allowed_cpus().expect("affinity of this thread");
        let target = *allowed.last().expect("at least one cpu");
        std::thread::spawn(move || {
            pin_current_thread(Some(target)).expect("pin to an allowed cpu");
            assert_eq!(
                allowed_cpus().expect("affinity after pinning"),
                vec![target]
            );
        })
        .join()
        .expect("pinned thread");
    }

    #[test]
    fn pinning_to_a_cpu_beyond_the_set_is_an_error() {
        let error = pin_current_thread(Some(libc::CPU_SETSIZE as usize)).expect_err("out of range");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn placement_uses_two_distinct_cpus_when_there_are_two() {
        let allowed = allowed_cpus().expect("affinity of this thread");
        let sut = Placement::detect().expect("placement");
        if allowed.len() >= 2 {
            assert_ne!(sut.consumer, sut.producer);
            assert!(sut.consumer.is_some_and(|cpu| allowed.contains(&cpu)));
            assert!(sut.producer.is_some_and(|cpu| allowed.contains(&cpu)));
        } else {
            assert_eq!(sut.producer, None);
        }
    }
}
