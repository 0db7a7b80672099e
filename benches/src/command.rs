//! Timed runs of other programs (`sluice read`, `sluice plan`, python3 with pyarrow), and the summaries of
//! repeated measurements.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::suite::process_tree::{Sampling, TreeSampler, TreeSamples};

/// What a finished run printed, and how long it took from spawn to exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedRun {
    /// Wall time from just before the spawn to the moment its exit was seen (within a millisecond).
    pub elapsed: Duration,
    /// Everything it printed on stdout.
    pub stdout: String,
}

/// The `sluice` binary beside the running executable (`sluice-bench`): the drivers run it for the
/// jobs, reads and plans they measure.
///
/// # Errors
///
/// [`BenchError::SluiceMissing`], naming the path and the build command, when there is none; a
/// [`BenchError::Setup`] when the running executable cannot be located.
pub fn sluice_beside_current_exe() -> Result<PathBuf> {
    let executable = std::env::current_exe().map_err(|source| BenchError::Setup {
        operation: "locating the running sluice-bench".to_owned(),
        source,
    })?;
    sluice_beside(&executable)
}

/// The `sluice` binary in the directory of `executable`.
fn sluice_beside(executable: &Path) -> Result<PathBuf> {
    let path = executable.with_file_name("sluice");
    if path.is_file() {
        Ok(path)
    } else {
        Err(BenchError::SluiceMissing { path })
    }
}

/// The command line as a person would type it, for messages.
pub fn display(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(
        command
            .get_args()
            .map(OsStr::to_string_lossy)
            .map(|arg| arg.into_owned()),
    );
    words
        .into_iter()
        .map(|word| {
            if word.contains([' ', '\n', '"', '\'']) {
                format!("{:?}", word.lines().next().unwrap_or_default())
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `command` to completion and times it; kills it once `timeout` has passed.
///
/// # Errors
///
/// Returns [`BenchError::ToolMissing`] when the program cannot be started, [`BenchError::CommandFailed`]
/// when it exits with a failure, and [`BenchError::CommandTimeout`] when it outlasts `timeout`.
pub fn run_timed(command: &mut Command, timeout: Duration) -> Result<TimedRun> {
    run_watched(command, timeout, |_| (), |()| ()).map(|(run, ())| run)
}

/// Runs `command` like [`run_timed`] while a [`TreeSampler`] samples the CPU time and memory of the
/// process and of every process under it, as `sampling` says.
///
/// # Errors
///
/// As [`run_timed`].
pub fn run_sampled(
    command: &mut Command,
    timeout: Duration,
    sampling: Sampling,
) -> Result<(TimedRun, TreeSamples)> {
    run_watched(
        command,
        timeout,
        |root| TreeSampler::start(root, sampling),
        TreeSampler::finish,
    )
}

/// Runs `command` to completion with a watcher started on its pid right after the spawn and finished
/// right after its exit.
fn run_watched<W, T>(
    command: &mut Command,
    timeout: Duration,
    start: impl FnOnce(u32) -> W,
    finish: impl FnOnce(W) -> T,
) -> Result<(TimedRun, T)> {
    let shown = display(command);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().map_err(|source| BenchError::ToolMissing {
        program: command.get_program().to_string_lossy().into_owned(),
        purpose: format!("`{shown}`"),
        reason: source.to_string(),
        fix: "install it or put it on PATH".to_owned(),
    })?;
    let watcher = start(child.id());
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let collect = |reader: Option<JoinHandle<String>>| {
        reader
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default()
    };
    let status = loop {
        let polled = child.try_wait().map_err(|source| BenchError::Setup {
            operation: format!("waiting for `{shown}`"),
            source,
        })?;
        if let Some(status) = polled {
            break status;
        }
        if started.elapsed() > timeout {
            // It may have exited in the meantime; either way it is gone afterwards.
            child.kill().ok();
            child.wait().ok();
            return Err(BenchError::CommandTimeout {
                command: shown,
                timeout,
                stderr: collect(stderr).trim().to_owned(),
            });
        }
        thread::sleep(Duration::from_millis(1));
    };
    let elapsed = started.elapsed();
    let watched = finish(watcher);
    let stdout = collect(stdout);
    if !status.success() {
        return Err(BenchError::CommandFailed {
            command: shown,
            status,
            stderr: collect(stderr).trim().to_owned(),
        });
    }
    Ok((TimedRun { elapsed, stdout }, watched))
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        // What was read before an error is still worth showing.
        pipe.read_to_end(&mut bytes).ok();
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Fails with a message naming the fix unless `taskset` can pin a process to each of `cpus`.
///
/// # Errors
///
/// Returns [`BenchError::ToolMissing`] when `taskset -c CPU true` does not succeed for one of them.
pub fn check_taskset(cpus: &[usize]) -> Result<()> {
    for cpu in cpus {
        let output = Command::new("taskset")
            .args(["-c", &cpu.to_string(), "true"])
            .output();
        let reason = match output {
            Ok(output) if output.status.success() => continue,
            Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            Err(error) => error.to_string(),
        };
        return Err(BenchError::ToolMissing {
            program: "taskset".to_owned(),
            purpose: format!("pinning a side to cpu {cpu}"),
            reason,
            fix: format!("install util-linux, and run where cpus {cpus:?} are allowed"),
        });
    }
    Ok(())
}

/// Fails with a message naming the fix unless `python` can import pyarrow.
///
/// # Errors
///
/// Returns [`BenchError::ToolMissing`] when the import fails.
pub fn check_pyarrow(python: &OsStr) -> Result<()> {
    let output = Command::new(python).args(["-c", "import pyarrow"]).output();
    let reason = match output {
        Ok(output) if output.status.success() => return Ok(()),
        Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        Err(error) => error.to_string(),
    };
    Err(BenchError::ToolMissing {
        program: format!("{} with pyarrow", python.to_string_lossy()),
        purpose: "the pyarrow side of the comparison".to_owned(),
        reason,
        fix: "pip install -r scripts/requirements.txt".to_owned(),
    })
}

/// The median and the range of repeated measurements of one quantity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// The median (the mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// Every value, in the order measured.
    pub samples: Vec<f64>,
}

impl Spread {
    /// Summarises the samples of `what`, or says that there is no finite measurement of it.
    ///
    /// # Errors
    ///
    /// [`BenchError::Disagree`] when there are no samples or one is not a finite number.
    pub fn measured(samples: Vec<f64>, what: impl FnOnce() -> String) -> Result<Spread> {
        Spread::of(samples).ok_or_else(|| BenchError::Disagree {
            what: what(),
            detail: "no finite measurement".to_owned(),
        })
    }

    /// Summarises `samples`; `None` when there are none or one is not a finite number.
    pub fn of(samples: Vec<f64>) -> Option<Spread> {
        if samples.is_empty() || samples.iter().any(|value| !value.is_finite()) {
            return None;
        }
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len().is_multiple_of(2) {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        } else {
            sorted[middle]
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            samples,
        })
    }
}

/// The 1-minute load average from `/proc/loadavg`, where there is one.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A load average as a report prints it: two decimals, or `?` where none could be read.
pub fn format_load(load: Option<f64>) -> String {
    load.map_or_else(|| "?".to_owned(), |value| format!("{value:.2}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle_value_and_the_extremes() {
        let sut = Spread::of(vec![3.0, 1.0, 2.0]).expect("spread");
        assert_eq!((sut.median, sut.min, sut.max), (2.0, 1.0, 3.0));
        assert_eq!(sut.samples, vec![3.0, 1.0, 2.0], "samples keep their order");
        let even = Spread::of(vec![4.0, 1.0, 2.0, 10.0]).expect("spread");
        assert_eq!(even.median, 3.0);
        assert!(Spread::of(Vec::new()).is_none());
        assert!(Spread::of(vec![1.0, f64::NAN]).is_none());
    }

    #[test]
    fn a_run_reports_its_output_and_a_failure_its_stderr() {
        let sut = run_timed(
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            Duration::from_secs(20),
        )
        .expect("runs");
        assert_eq!(sut.stdout, "out\n");
        let error = run_timed(
            Command::new("sh").args(["-c", "echo broken >&2; exit 3"]),
            Duration::from_secs(20),
        )
        .expect_err("fails");
        let message = error.to_string();
        assert!(
            message.contains("broken") && message.contains("exit status: 3"),
            "{message}"
        );
        let missing = run_timed(
            &mut Command::new("/nonexistent/sluice-no-such-program"),
            Duration::from_secs(20),
        )
        .expect_err("missing");
        assert!(
            missing.to_string().contains("sluice-no-such-program"),
            "{missing}"
        );
    }

    #[test]
    fn sluice_is_found_beside_the_executable_or_named_with_its_build_command() {
        let directory = tempfile::tempdir().expect("tempdir");
        let executable = directory.path().join("sluice-bench");
        let error = sluice_beside(&executable).expect_err("no sluice yet");
        let message = error.to_string();
        let expected = directory.path().join("sluice");
        assert!(
            message.contains(&expected.display().to_string())
                && message.contains("cargo build --release -p sluice-cli"),
            "{message}"
        );
        std::fs::write(&expected, b"").expect("write sluice");
        assert_eq!(sluice_beside(&executable).expect("sluice"), expected);
    }

    #[test]
    fn a_run_that_outlasts_its_timeout_is_killed() {
        let error = run_timed(
            Command::new("sh").args(["-c", "echo waiting >&2; exec sleep 30"]),
            Duration::from_millis(200),
        )
        .expect_err("times out");
        assert!(
            matches!(error, BenchError::CommandTimeout { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("waiting"), "{error}");
    }
}
