//! The CPU time and peak memory of a process and all its descendants, sampled from /proc while they run.
//!
//! # Implementation
//! A thread wakes every [`SAMPLE_INTERVAL`], lists /proc, and adds to the tree every process whose
//! parent is in it (the tree may have several roots, added while it is sampled) (a process stays in the tree once seen, even when it is re-parented after its
//! parent's exit). For each process of the tree it reads the CPU time of every thread
//! (`/proc/PID/task/TID/schedstat`, nanoseconds on the CPU) and the peak resident set
//! (`VmHWM` of `/proc/PID/status`); every [`PSS_INTERVAL`] it also sums the proportional set size of
//! the tree (`Pss` of `/proc/PID/smaps_rollup`, where a page shared by n processes counts 1/n in each),
//! whose largest sum is the tree's peak memory with shared pages counted once. A thread's CPU time counts at its last sampled value once it is
//! gone, so the total of the tree never decreases and loses at most one interval of a thread that ends.
//! The samples are kept with their time on CLOCK_MONOTONIC, so the CPU time between two moments that
//! another process reports on the same clock can be read off afterwards by interpolation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::am::procfs::cpu_time;
use crate::workload::monotonic_ns;

/// How often the tree is sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(5);
/// How often the tree's proportional set size is summed, when it is: reading `smaps_rollup` walks a
/// process's page tables, too costly at every sample.
pub const PSS_INTERVAL: Duration = Duration::from_millis(100);

/// What a [`TreeSampler`] reads besides the CPU time and the peak resident set of each process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// Nothing more: the run is timed. Summing the proportional set size takes CPU time from the
    /// processes measured (tens of milliseconds per walk of a trainer that maps a ring of 256 MiB),
    /// so a timed run does without it, and its peak PSS is 0.
    Timed,
    /// The tree's proportional set size every [`PSS_INTERVAL`]: a run for its peak memory.
    Memory,
}

/// One process of a tree: its command line and the most memory it ever had resident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeProcess {
    /// Its process id.
    pub pid: u32,
    /// Its arguments, as in `/proc/PID/cmdline`.
    pub arguments: Vec<String>,
    /// The largest `VmHWM` sampled, in bytes.
    pub peak_rss_bytes: u64,
}

/// The cumulative CPU time of each process of the tree at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sample {
    at_ns: u64,
    cpu_ns: BTreeMap<u32, u64>,
}

/// Everything sampled of one process tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSamples {
    processes: BTreeMap<u32, TreeProcess>,
    samples: Vec<Sample>,
    peak_pss_bytes: u64,
}

impl TreeSamples {
    /// The processes seen, by pid.
    pub fn processes(&self) -> &BTreeMap<u32, TreeProcess> {
        &self.processes
    }

    /// The sum of the peak resident sets of every process of the tree.
    pub fn peak_rss_sum(&self) -> u64 {
        self.processes
            .values()
            .map(|process| process.peak_rss_bytes)
            .sum()
    }

    /// The largest sum over the tree's live processes of their proportional set sizes: its peak
    /// memory, with each page shared between processes counted once in all.
    pub fn peak_pss_sum(&self) -> u64 {
        self.peak_pss_bytes
    }

    /// CPU seconds the processes chosen by `include` used between two moments on CLOCK_MONOTONIC,
    /// interpolated between the samples around them.
    pub fn cpu_seconds_between(
        &self,
        start_ns: u64,
        end_ns: u64,
        include: impl Fn(&TreeProcess) -> bool,
    ) -> f64 {
        let chosen: BTreeSet<u32> = self
            .processes
            .iter()
            .filter(|(_, process)| include(process))
            .map(|(pid, _)| *pid)
            .collect();
        let series: Vec<(u64, u64)> = self
            .samples
            .iter()
            .map(|sample| {
                let total = sample
                    .cpu_ns
                    .iter()
                    .filter(|(pid, _)| chosen.contains(pid))
                    .map(|(_, cpu)| *cpu)
                    .sum();
                (sample.at_ns, total)
            })
            .collect();
        (interpolate(&series, end_ns) - interpolate(&series, start_ns)).max(0.0) / 1e9
    }
}

/// The value of a non-decreasing series at `at_ns`: linear between the samples around it, the first
/// or last value outside them.
fn interpolate(series: &[(u64, u64)], at_ns: u64) -> f64 {
    let after = series.partition_point(|(time, _)| *time <= at_ns);
    match (
        after.checked_sub(1).map(|index| series[index]),
        series.get(after).copied(),
    ) {
        (None, None) => 0.0,
        (None, Some((_, value))) | (Some((_, value)), None) => value as f64,
        (Some((time_before, before)), Some((time_after, after))) => {
            let span = (time_after - time_before).max(1) as f64;
            let fraction = (at_ns - time_before) as f64 / span;
            before as f64 + (after as f64 - before as f64) * fraction
        }
    }
}

/// A thread sampling the trees under some processes until it is stopped.
#[derive(Debug)]
pub struct TreeSampler {
    stop: Arc<AtomicBool>,
    new_roots: Arc<Mutex<Vec<u32>>>,
    thread: Option<JoinHandle<TreeSamples>>,
}

impl TreeSampler {
    /// Starts sampling the tree under `root`, reading what `sampling` says.
    pub fn start(root: u32, sampling: Sampling) -> TreeSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let new_roots = Arc::new(Mutex::new(vec![root]));
        let stopped = Arc::clone(&stop);
        let roots = Arc::clone(&new_roots);
        let thread = std::thread::spawn(move || {
            let mut state = SamplerState::default();
            let mut last_pss: Option<Instant> = None;
            // Relaxed: the flag carries no data; the samples come back through the join.
            while !stopped.load(Ordering::Relaxed) {
                state.add_roots(&roots);
                state.sample();
                if sampling == Sampling::Memory
                    && last_pss.is_none_or(|last| last.elapsed() >= PSS_INTERVAL)
                {
                    state.sample_pss();
                    last_pss = Some(Instant::now());
                }
                std::thread::sleep(SAMPLE_INTERVAL);
            }
            state.add_roots(&roots);
            state.sample();
            if sampling == Sampling::Memory {
                state.sample_pss();
            }
            state.samples
        });
        TreeSampler {
            stop,
            new_roots,
            thread: Some(thread),
        }
    }

    /// Samples the tree under `root` too, from the next sample on.
    pub fn add_root(&self, root: u32) {
        self.new_roots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(root);
    }

    /// Takes a last sample and returns everything sampled.
    pub fn finish(mut self) -> TreeSamples {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for TreeSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A sampler that panicked has nothing left to return.
            thread.join().ok();
        }
    }
}

/// What the sampling thread keeps between samples.
#[derive(Debug, Default)]
struct SamplerState {
    /// Processes of the tree, with the start time that tells them from a later process of the same pid.
    members: BTreeMap<u32, u64>,
    /// Processes seen not to belong to the tree, with their start times.
    strangers: BTreeMap<u32, u64>,
    /// The last CPU time of each thread of each member.
    threads: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// The CPU time of each member so far.
    cpu_ns: BTreeMap<u32, u64>,
    samples: TreeSamples,
}

impl SamplerState {
    fn add_roots(&mut self, roots: &Mutex<Vec<u32>>) {
        let roots: Vec<u32> = std::mem::take(
            &mut *roots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        if roots.is_empty() {
            return;
        }
        // A process seen before its root was added is looked at again.
        self.strangers.clear();
        for root in roots {
            if let Some(stat) = read_stat(root) {
                self.members.insert(root, stat.start_ticks);
            }
        }
    }

    fn sample(&mut self) {
        self.discover();
        let at_ns = monotonic_ns();
        for (&pid, &start_ticks) in &self.members {
            if read_stat(pid).is_none_or(|stat| stat.start_ticks != start_ticks) {
                continue;
            }
            let threads = self.threads.entry(pid).or_default();
            for (thread, cpu) in thread_cpu_ns(pid) {
                let last = threads.entry(thread).or_default();
                *last = (*last).max(cpu);
            }
            // The threads' own figures are exact but miss a thread that lived between two samples
            // (an io_uring worker, a blocking-pool thread); the process's `stat` counts every thread
            // that ever ran, to the clock tick. The larger of the two is the closer.
            let whole_process =
                cpu_time(pid).map_or(0, |cpu| u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX));
            let cpu = self.cpu_ns.entry(pid).or_default();
            *cpu = (*cpu).max(threads.values().sum()).max(whole_process);
            let process = self
                .samples
                .processes
                .entry(pid)
                .or_insert_with(|| TreeProcess {
                    pid,
                    arguments: command_line(pid),
                    peak_rss_bytes: 0,
                });
            if process.arguments.is_empty() {
                process.arguments = command_line(pid);
            }
            if let Some(peak) = peak_rss(pid) {
                process.peak_rss_bytes = process.peak_rss_bytes.max(peak);
            }
        }
        self.samples.samples.push(Sample {
            at_ns,
            cpu_ns: self.cpu_ns.clone(),
        });
    }

    /// Adds the tree's proportional set size now to the samples' peak.
    fn sample_pss(&mut self) {
        let total: u64 = self.members.keys().filter_map(|&pid| pss(pid)).sum();
        self.samples.peak_pss_bytes = self.samples.peak_pss_bytes.max(total);
    }

    /// Adds to the members every process whose parent is a member, until no more are found.
    fn discover(&mut self) {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut unknown: Vec<(u32, ProcStat)> = entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| !self.members.contains_key(pid))
            .filter_map(|pid| {
                let stat = read_stat(pid)?;
                let known_stranger = self.strangers.get(&pid) == Some(&stat.start_ticks);
                (!known_stranger).then_some((pid, stat))
            })
            .collect();
        loop {
            let before = unknown.len();
            unknown.retain(|(pid, stat)| {
                if self.members.contains_key(&stat.parent) {
                    self.members.insert(*pid, stat.start_ticks);
                    false
                } else {
                    true
                }
            });
            if unknown.len() == before {
                break;
            }
        }
        for (pid, stat) in unknown {
            self.strangers.insert(pid, stat.start_ticks);
        }
    }
}

/// The fields of `/proc/PID/stat` the sampler needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    parent: u32,
    start_ticks: u64,
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The parent (field 4) and the start time (field 22), counted after the command name, which is in
/// parentheses and may itself hold spaces and parentheses.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let parent = fields.nth(1)?.parse().ok()?;
    let start_ticks = fields.nth(17)?.parse().ok()?;
    Some(ProcStat {
        parent,
        start_ticks,
    })
}

/// Nanoseconds on the CPU of each live thread of `pid`: the first field of its `schedstat`.
fn thread_cpu_ns(pid: u32) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let thread = entry.file_name().to_str()?.parse().ok()?;
            let text = std::fs::read_to_string(entry.path().join("schedstat")).ok()?;
            Some((thread, text.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

fn command_line(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|byte| *byte == 0)
                .filter(|argument| !argument.is_empty())
                .map(|argument| String::from_utf8_lossy(argument).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_peak_rss(&status)
}

fn parse_peak_rss(status: &str) -> Option<u64> {
    parse_kib_field(status, "VmHWM:")
}

fn pss(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    parse_kib_field(&rollup, "Pss:")
}

/// The bytes of the first line `NAME   N kB` of a /proc file.
fn parse_kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|line| line.starts_with(name))?;
    let kib: u64 = line[name.len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn stat_fields_are_found_after_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (python3 (x) y) S 17 4242 4242 0 -1 4194560 1200 0 0 0 731 269 0 0 20 0 3 0 98765 100";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                parent: 17,
                start_ticks: 98765
            })
        );
        assert_eq!(parse_stat("4242 (cut) S 1"), None);
    }

    #[test]
    fn peak_rss_is_read_in_bytes() {
        let status = "Name:\tsluice\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(parse_peak_rss(status), Some(200 << 20));
        assert_eq!(parse_peak_rss("Name:\tsluice\n"), None);
    }

    #[test]
    fn pss_is_read_from_its_own_line_not_from_its_breakdown() {
        let rollup = "00400000-7fff [rollup]\nRss:  4096 kB\nPss:  1024 kB\nPss_Anon:  512 kB\n";
        assert_eq!(parse_kib_field(rollup, "Pss:"), Some(1 << 20));
    }

    #[test]
    fn interpolation_is_linear_between_samples_and_flat_outside() {
        let series = [(100, 0), (200, 1_000), (300, 1_000)];
        assert_eq!(interpolate(&series, 150), 500.0);
        assert_eq!(interpolate(&series, 50), 0.0);
        assert_eq!(interpolate(&series, 250), 1_000.0);
        assert_eq!(interpolate(&series, 400), 1_000.0);
        assert_eq!(interpolate(&[], 400), 0.0);
    }

    #[test]
    fn a_child_and_its_grandchild_are_sampled_with_their_cpu_and_memory() {
        for sampling in [Sampling::Timed, Sampling::Memory] {
            // The shell's child burns CPU for a while in a process of its own.
            let mut child = Command::new("sh")
                .args([
                    "-c",
                    "sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'",
                ])
                .spawn()
                .expect("spawn sh");
            let start = monotonic_ns();
            let sut = TreeSampler::start(child.id(), sampling);
            assert!(child.wait().expect("wait").success());
            let end = monotonic_ns();
            let samples = sut.finish();
            assert!(
                samples.processes().len() >= 2,
                "the shell and its child: {:?}",
                samples.processes()
            );
            let spinning =
                |process: &TreeProcess| process.arguments.iter().any(|a| a.contains("200000"));
            let cpu = samples.cpu_seconds_between(start, end, spinning);
            assert!(cpu > 0.0, "{cpu} s of CPU in {samples:?}");
            assert!(
                samples.cpu_seconds_between(start, end, |_| true) >= cpu,
                "the whole tree used at least what the busy process used"
            );
            assert!(samples.peak_rss_sum() > 0, "{samples:?}");
            assert_eq!(
                samples.peak_pss_sum() > 0,
                sampling == Sampling::Memory,
                "{sampling:?}: {samples:?}"
            );
        }
    }
}
