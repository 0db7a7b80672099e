//! What the kernel says about a process: CPU time from `/proc/<pid>/stat`, time its threads
//! waited for a CPU from `/proc/<pid>/task/*/schedstat`, memory from `/proc/<pid>/status`, and the
//! machine's load average from `/proc/loadavg`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{BenchError, Result};

/// CPU time a process has used, user and system together, over all its threads.
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let text = read(&path)?;
    let ticks = parse_cpu_ticks(&text).ok_or_else(|| BenchError::AmSetup {
        operation: format!("reading {path}"),
        reason: format!("no utime and stime fields in {text:?}"),
    })?;
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = if per_second > 0 {
        per_second as u64
    } else {
        100
    };
    Ok(Duration::from_nanos(ticks * 1_000_000_000 / per_second))
}

/// `utime + stime` in clock ticks: fields 14 and 15 of `stat`, counted after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The time each thread of a process has spent runnable but waiting for a CPU, by thread id:
/// the second field of `schedstat`. Empty when the kernel keeps no scheduler statistics.
pub fn cpu_waits(pid: u32) -> Result<BTreeMap<u32, Duration>> {
    let folder = format!("/proc/{pid}/task");
    let entries = std::fs::read_dir(&folder).map_err(|source| BenchError::AmIo {
        operation: format!("listing {folder}"),
        source,
    })?;
    let mut waits = BTreeMap::new();
    for entry in entries.flatten() {
        let Some(thread) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse().ok())
        else {
            continue;
        };
        // A thread may end between the listing and the read, and a kernel without scheduler
        // statistics has no such file: both leave the thread out.
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        if let Some(wait_ns) = text
            .split_whitespace()
            .nth(1)
            .and_then(|wait| wait.parse().ok())
        {
            waits.insert(thread, Duration::from_nanos(wait_ns));
        }
    }
    Ok(waits)
}

/// How long the threads alive at `after` waited for a CPU since `before`; a thread born in
/// between counts from zero.
pub fn waited_between(
    before: &BTreeMap<u32, Duration>,
    after: &BTreeMap<u32, Duration>,
) -> Duration {
    after
        .iter()
        .map(|(thread, wait)| wait.saturating_sub(before.get(thread).copied().unwrap_or_default()))
        .sum()
}

/// A process's resident memory now and at its peak, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss_bytes: u64,
    /// `VmHWM`: the most that was ever resident.
    pub hwm_bytes: u64,
}

/// Reads `VmRSS` and `VmHWM` of a process.
pub fn memory(pid: u32) -> Result<Memory> {
    let path = format!("/proc/{pid}/status");
    let text = read(&path)?;
    parse_memory(&text).ok_or_else(|| BenchError::AmSetup {
        operation: format!("reading {path}"),
        reason: "no VmRSS and VmHWM lines; is the process a zombie?".to_owned(),
    })
}

fn parse_memory(status: &str) -> Option<Memory> {
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(key))?;
        let value = line[key.len()..].trim().strip_suffix("kB")?.trim();
        value.parse::<u64>().ok().map(|kib| kib * 1024)
    };
    Some(Memory {
        rss_bytes: kib("VmRSS:")?,
        hwm_bytes: kib("VmHWM:")?,
    })
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| BenchError::AmIo {
        operation: format!("reading {path}"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_found_after_a_name_with_spaces_and_parentheses() {
        let stat =
            "4242 (sluice (am) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 731 269 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(1000));
        assert_eq!(parse_cpu_ticks("4242 (truncated) S 1"), None);
    }

    #[test]
    fn memory_lines_are_read_in_bytes() {
        let status = "Name:\tsluice\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss_bytes: 100 << 20,
                hwm_bytes: 200 << 20
            })
        );
        assert_eq!(parse_memory("Name:\tsluice\n"), None);
    }

    #[test]
    fn waits_count_the_threads_alive_at_the_end_from_their_start_or_birth() {
        let ms = Duration::from_millis;
        let before = BTreeMap::from([(1, ms(10)), (2, ms(5)), (3, ms(7))]);
        let after = BTreeMap::from([(1, ms(25)), (2, ms(5)), (4, ms(3))]);
        assert_eq!(waited_between(&before, &after), ms(18));
    }

    #[test]
    fn this_process_has_used_cpu_and_memory() {
        let pid = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_time(pid).expect("cpu time") > Duration::ZERO);
        let memory = memory(pid).expect("memory");
        assert!(memory.rss_bytes > 0 && memory.hwm_bytes >= memory.rss_bytes);
        let waits = cpu_waits(pid).expect("scheduler statistics");
        assert!(
            waits.is_empty() || waits.len() >= 2,
            "the test thread and the main thread: {waits:?}"
        );
    }
}
