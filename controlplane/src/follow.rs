//! The follower: polls every followed source of a running job and journals what it added.
//!
//! # Implementation
//! One task per followed source polls it every `follow.interval_ms`, with the master unlocked:
//! listing a store and reading footers or commits is IO. What a poll finds is applied to the
//! master and journaled through `Am::apply` before any of it can be handed out: the new splits'
//! tasks enter the table under the master's lock, and any acquire that could take them is
//! journaled after them. A source stops being polled when following ends (an `until_*` reached,
//! `sluice stop`), when the job ends, or when following fails the job.
//!
//! A Parquet file whose footer cannot be read is retried at the next polls, with a warning, since
//! a writer may still be writing it in place; after [`FILE_ATTEMPTS`] polls it fails the job,
//! naming the file. It is never skipped silently. A poll that fails as a whole (the store cannot
//! be listed) is retried the same way, up to [`POLL_ATTEMPTS`] polls in a row. A Delta commit
//! that removes data fails the job at once: that is not a passing state.

use crate::clock::wall_ms;
use crate::master::FollowTarget;
use crate::plan::{JobPlan, open_options};
use crate::service::Am;
use crate::spec::{JobSpec, SourceFormat, SourceSpec};
use sluice_formats::follow::delta_commits;
use sluice_formats::{Dataset, FormatError, OpenOptions};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Polls at which a new Parquet file's footer may still be unreadable before the job fails.
pub const FILE_ATTEMPTS: u32 = 5;

/// Polls in a row that may fail as a whole before the job fails.
pub const POLL_ATTEMPTS: u32 = 5;

/// Starts following every followed source of the job, on a thread and runtime of its own, so
/// that listing a large source or reading commits never holds up the AM's gRPC workers. The
/// thread ends once no source is followed any more, or the job is over.
pub fn spawn(am: Arc<Am>, spec: Arc<JobSpec>) -> std::io::Result<()> {
    let followed: Vec<u32> = spec
        .data
        .sources
        .iter()
        .enumerate()
        .filter(|(_, source)| source.follow.is_some())
        .map(|(index, _)| index as u32)
        .collect();
    if followed.is_empty() {
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sluice-follow".to_owned())
        .spawn(move || {
            runtime.block_on(futures::future::join_all(
                followed
                    .into_iter()
                    .map(|source| follow_source(am.clone(), spec.clone(), source)),
            ));
        })
        .map(drop)
}

/// Why one poll did not go through.
enum PollError {
    /// Worth another poll.
    Retry(String),
    /// The job cannot go on.
    Fatal(String),
}

/// What a follower keeps between polls of one source.
struct Follower {
    am: Arc<Am>,
    spec: Arc<JobSpec>,
    source: u32,
    /// The dataset of a Parquet source, opened at the first poll.
    dataset: Option<Dataset>,
    /// Files that planned into no split: known, so they are not planned at every poll.
    empty_files: HashSet<String>,
    /// Polls at which a file's footer could not be read.
    file_attempts: HashMap<String, u32>,
}

async fn follow_source(am: Arc<Am>, spec: Arc<JobSpec>, source: u32) {
    let mut follower = Follower {
        am,
        spec,
        source,
        dataset: None,
        empty_files: HashSet::new(),
        file_attempts: HashMap::new(),
    };
    let mut failed_polls = 0;
    loop {
        let Some(target) = follower.am.master().follow_target(source) else {
            return;
        };
        let interval = Duration::from_millis(target.spec.interval_ms);
        let result = follower.poll(target).await;
        follower.am.master().source_polled(source);
        match result {
            Ok(()) => failed_polls = 0,
            Err(PollError::Retry(reason)) => {
                failed_polls += 1;
                tracing::warn!(source, %reason, attempt = failed_polls, "polling a followed source failed");
                if failed_polls >= POLL_ATTEMPTS {
                    follower
                        .fail(format!(
                            "following {}: {POLL_ATTEMPTS} polls in a row failed, the last with: {reason}",
                            follower.source_spec().uri
                        ))
                        .await;
                    return;
                }
            }
            Err(PollError::Fatal(reason)) => {
                follower.fail(reason).await;
                return;
            }
        }
        tokio::time::sleep(interval).await;
    }
}

impl Follower {
    fn source_spec(&self) -> &SourceSpec {
        &self.spec.data.sources[self.source as usize]
    }

    async fn fail(&self, reason: String) {
        tracing::error!(source = self.source, %reason, "following failed");
        if let Err(error) = self.am.apply(|master| Ok(master.fail_follow(reason))).await {
            tracing::error!(%error, "journaling a failed follow failed");
        }
    }

    async fn end(&self, reason: String) -> Result<(), PollError> {
        let source = self.source;
        self.am
            .apply(|master| Ok(master.end_follow(source, reason)))
            .await
            .map_err(|error| PollError::Retry(error.to_string()))
    }

    async fn add(&self, version: Option<u64>, block: JobPlan) -> Result<(), PollError> {
        let source = self.source;
        self.am
            .apply(|master| Ok(master.add_splits(source, version, block)))
            .await
            .map_err(|error| PollError::Retry(error.to_string()))
    }

    async fn poll(&mut self, target: FollowTarget) -> Result<(), PollError> {
        match self.source_spec().format {
            SourceFormat::Delta => self.poll_delta(target).await,
            _ => self.poll_files(target).await,
        }
    }

    /// Lists a Parquet source and plans the files it did not plan before.
    async fn poll_files(&mut self, target: FollowTarget) -> Result<(), PollError> {
        // The wall clock is read before listing: a file that appears after `until_timestamp` is
        // not planned, one listed at the last poll before it is.
        let ending = target
            .spec
            .until_timestamp_ms
            .is_some_and(|until| wall_ms() as i64 >= until);
        let uri = self.source_spec().uri.clone();
        if self.dataset.is_none() {
            let dataset = Dataset::open(
                &uri,
                &open_options(self.source_spec(), self.spec.data.bad_data.policy),
            )
            .await
            .map_err(|error| PollError::Retry(error.to_string()))?;
            self.dataset = Some(dataset);
        }
        let Some(dataset) = &self.dataset else {
            return Ok(());
        };
        let mut known = target.planned.clone();
        known.extend(self.empty_files.iter().cloned());
        let found = dataset
            .unplanned_files(&known)
            .await
            .map_err(|error| PollError::Retry(error.to_string()))?;
        let mut splits = Vec::new();
        for file in &found {
            match dataset.plan_new_file(file, self.spec.data.task_rows).await {
                Ok(file_splits) if file_splits.is_empty() => {
                    self.file_attempts.remove(&file.uri);
                    self.empty_files.insert(file.uri.clone());
                }
                Ok(file_splits) => {
                    self.file_attempts.remove(&file.uri);
                    splits.extend(file_splits);
                }
                Err(error) => {
                    let attempts = self.file_attempts.entry(file.uri.clone()).or_insert(0);
                    *attempts += 1;
                    tracing::warn!(
                        file = %file.uri,
                        %error,
                        attempt = *attempts,
                        "a new file of a followed source cannot be planned yet; trying again at the next poll"
                    );
                    if *attempts >= FILE_ATTEMPTS {
                        return Err(PollError::Fatal(format!(
                            "following {uri}: new file {} could not be planned in {FILE_ATTEMPTS} polls: {error}; write files elsewhere and rename them into the directory once complete",
                            file.uri
                        )));
                    }
                }
            }
        }
        if !splits.is_empty() {
            let files = splits.len();
            self.add(None, JobPlan::of_splits(self.source, splits))
                .await?;
            tracing::info!(
                source = self.source,
                splits = files,
                "followed source planned new files"
            );
        }
        if ending {
            self.end("follow.until_timestamp passed".to_owned()).await?;
        }
        Ok(())
    }

    /// Reads a Delta table's commits after the last planned version and plans their appends,
    /// commit by commit.
    async fn poll_delta(&mut self, target: FollowTarget) -> Result<(), PollError> {
        let source = self.source_spec().clone();
        let FollowTarget {
            spec: follow,
            version,
            planned,
            ..
        } = target;
        let Some(last_planned) = version else {
            return Err(PollError::Fatal(format!(
                "following {}: the plan records no Delta version for the source; plan the job again",
                source.uri
            )));
        };
        if let Some(until) = follow.until_version
            && last_planned >= until
        {
            return self
                .end(format!("follow.until_version {until} planned"))
                .await;
        }
        let now = wall_ms() as i64;
        let options = open_options(&source, self.spec.data.bad_data.policy);
        let commits = delta_commits(&source.uri, &options, last_planned, follow.until_version)
            .await
            .map_err(|error| match error {
                FormatError::FollowUnsupported { .. } => PollError::Fatal(error.to_string()),
                other => PollError::Retry(other.to_string()),
            })?;
        for commit in commits {
            if let Some(until) = follow.until_timestamp_ms
                && commit.timestamp_ms > until
            {
                return self
                    .end(format!(
                        "version {} was committed after follow.until_timestamp",
                        commit.version
                    ))
                    .await;
            }
            if let Some(replanned) = commit.added.iter().find(|uri| planned.contains(*uri)) {
                return Err(PollError::Fatal(format!(
                    "following {}: version {} adds {replanned} again, which is already planned: following supports appends only; plan the job again",
                    source.uri, commit.version
                )));
            }
            let block = if commit.added.is_empty() {
                JobPlan::default()
            } else {
                let at_version = OpenOptions {
                    version: Some(commit.version),
                    timestamp: None,
                    ..options.clone()
                };
                let dataset = Dataset::open(&source.uri, &at_version)
                    .await
                    .map_err(|error| PollError::Retry(error.to_string()))?;
                let added: HashSet<String> = commit.added.iter().cloned().collect();
                let splits = dataset
                    .plan_files(self.spec.data.task_rows, &added)
                    .await
                    .map_err(|error| PollError::Retry(error.to_string()))?;
                JobPlan::of_splits(self.source, splits)
            };
            tracing::info!(
                source = self.source,
                version = commit.version,
                files = block.files.len(),
                "followed delta table planned a commit"
            );
            self.add(Some(commit.version), block).await?;
            if follow.until_version == Some(commit.version) {
                return self
                    .end(format!("follow.until_version {} planned", commit.version))
                    .await;
            }
        }
        if follow.until_timestamp_ms.is_some_and(|until| now > until) {
            return self.end("follow.until_timestamp passed".to_owned()).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint_store::CheckpointStore;
    use crate::master::Master;
    use crate::persist::Persist;
    use crate::spec::Format;

    async fn followed_job(directory: &std::path::Path) -> (Arc<Am>, Arc<JobSpec>) {
        let data = directory.join("data");
        sluice_formats::generate::generate(
            &sluice_formats::generate::GenerateOptions {
                out: data.to_string_lossy().into_owned(),
                rows: 30,
                files: 1,
                format: sluice_formats::FormatKind::Parquet,
                row_group_rows: 10,
                seed: 0,
                storage_options: Default::default(),
            },
            &|_| {},
        )
        .await
        .expect("generate");
        let text = format!(
            "name: follow\ndata:\n  sources: [{{ uri: 'file://{}', format: parquet, follow: {{ interval_ms: 10 }} }}]\n  task_rows: 10\nroles:\n  - {{ name: worker, command: [sluice, consume] }}\n",
            data.display()
        );
        let spec = Arc::new(JobSpec::parse(&text, Format::Yaml).expect("spec"));
        let plan = JobPlan::build(&spec).await.expect("plan");
        let master = Master::new(spec.clone(), Arc::new(plan)).expect("master");
        let am = Am::new(master, Persist::in_memory(), CheckpointStore::in_memory());
        (Arc::new(am), spec)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_that_stays_unreadable_fails_the_job_after_a_few_polls_naming_it() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (am, spec) = followed_job(directory.path()).await;
        std::fs::write(
            directory.path().join("data/part-late.parquet"),
            b"PAR1 still being written",
        )
        .expect("partial file");
        tokio::time::timeout(Duration::from_secs(30), follow_source(am.clone(), spec, 0))
            .await
            .expect("the follower gives up within 30 s (deadlock watchdog)");
        let master = am.master();
        let reason = master.failure_reason().expect("the job failed");
        assert!(
            reason.contains("part-late.parquet") && reason.contains("5 polls"),
            "{reason}"
        );
        assert_eq!(master.table().split_count(), 3, "nothing was planned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_file_completed_before_the_last_attempt_is_planned() {
        let directory = tempfile::tempdir().expect("tempdir");
        let (am, spec) = followed_job(directory.path()).await;
        let late = directory.path().join("data/part-late.parquet");
        std::fs::write(&late, b"PAR1 still being written").expect("partial file");
        // The follower runs beside the writer, on this task: its future is not `Send`.
        let writer = async {
            tokio::time::sleep(Duration::from_millis(15)).await;
            // The writer finishes the file in place: a copy of the first one.
            std::fs::copy(directory.path().join("data/part-00000.parquet"), &late)
                .expect("complete");
            let started = std::time::Instant::now();
            while am.master().table().split_count() < 6 {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the completed file was not planned within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(am.master().failure_reason(), None);
            let stop = am.master().stop("test over".to_owned());
            assert!(!stop.entries.is_empty());
        };
        tokio::time::timeout(
            Duration::from_secs(30),
            futures::future::join(follow_source(am.clone(), spec, 0), writer),
        )
        .await
        .expect("the follower ends once following does");
    }
}
