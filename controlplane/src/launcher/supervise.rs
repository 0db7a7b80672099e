//! The executors' lifecycle as pure decisions: what to do when one exits, when a role has
//! succeeded, and when the executors' failures end the job.
//!
//! A scale replaces the job's trainers: the records of the running ones move aside as *retiring*
//! (the AM stops them, and how they end counts neither as a failure nor as a success), and the new
//! rank set starts pending.

use super::ExecutorId;
use crate::spec::{FailoverSpec, RestartPolicy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where one executor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecutorState {
    /// To be launched, or launched again.
    Pending,
    /// Running.
    Running,
    /// Exited with code 0, not to be launched again.
    Succeeded,
    /// Failed with no launch left.
    Failed,
}

/// One executor's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorRecord {
    /// Where it stands.
    pub state: ExecutorState,
    /// How often it failed.
    pub failures: u32,
    /// How often it was launched.
    pub launches: u32,
    /// How often it was launched again.
    pub restarts: u32,
    /// Its last exit code; `None` while it has not exited, or when a signal ended it.
    pub exit_code: Option<i32>,
}

impl ExecutorRecord {
    /// A record of an executor never launched.
    fn pending() -> ExecutorRecord {
        ExecutorRecord {
            state: ExecutorState::Pending,
            failures: 0,
            launches: 0,
            restarts: 0,
            exit_code: None,
        }
    }
}

/// How an executor ended, as the launcher saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it, or it vanished without leaving its code.
    Killed,
}

/// What the AM does about an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchAction {
    /// Start it (again).
    Launch(ExecutorId),
}

/// Every executor of a job and the failover rules that apply to them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Executors {
    records: BTreeMap<ExecutorId, ExecutorRecord>,
    /// Trainers of a rank set a scale replaced that still run, until they are seen ended.
    retiring: BTreeMap<ExecutorId, ExecutorRecord>,
    restart: RestartPolicyName,
    max_failures: u32,
    max_total_failures: u32,
    total_failures: u32,
    failure: Option<String>,
}

/// The restart policy, kept in a form the journal can store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum RestartPolicyName {
    OnFailure,
    Never,
    Always,
}

impl Executors {
    /// Every executor pending, under the job's failover rules.
    pub fn new(executors: impl IntoIterator<Item = ExecutorId>, failover: &FailoverSpec) -> Self {
        Executors {
            records: executors
                .into_iter()
                .map(|id| (id, ExecutorRecord::pending()))
                .collect(),
            retiring: BTreeMap::new(),
            restart: match failover.restart {
                RestartPolicy::OnFailure => RestartPolicyName::OnFailure,
                RestartPolicy::Never => RestartPolicyName::Never,
                RestartPolicy::Always => RestartPolicyName::Always,
            },
            max_failures: failover.max_failures,
            max_total_failures: failover.max_total_failures,
            total_failures: 0,
            failure: None,
        }
    }

    /// The executors waiting to be launched.
    pub fn to_launch(&self) -> Vec<LaunchAction> {
        if self.failure.is_some() {
            return Vec::new();
        }
        self.records
            .iter()
            .filter(|(_, record)| record.state == ExecutorState::Pending)
            .map(|(id, _)| LaunchAction::Launch(id.clone()))
            .collect()
    }

    /// Records that an executor was started.
    pub fn launched(&mut self, id: &ExecutorId) {
        if let Some(record) = self.records.get_mut(id) {
            if record.launches > 0 {
                record.restarts += 1;
            }
            record.launches += 1;
            record.state = ExecutorState::Running;
        }
    }

    /// Replaces every trainer with `trainers`, pending: the trainers running now retire, and
    /// those not running are dropped.
    pub fn replace_trainers(&mut self, trainers: impl IntoIterator<Item = ExecutorId>) {
        let old: Vec<ExecutorId> = self
            .records
            .keys()
            .filter(|id| matches!(id, ExecutorId::Trainer { .. }))
            .cloned()
            .collect();
        for id in old {
            if let Some(record) = self.records.remove(&id)
                && record.state == ExecutorState::Running
            {
                self.retiring.insert(id, record);
            }
        }
        for id in trainers {
            self.records.insert(id, ExecutorRecord::pending());
        }
    }

    /// Restarts every trainer in place, as a restore to a data checkpoint does: the running ones
    /// retire (the AM stops them, and how they end counts neither as a failure nor as a success)
    /// and every trainer is pending again under the same id, keeping its counts.
    pub fn restart_trainers(&mut self) {
        for (id, record) in &mut self.records {
            if !matches!(id, ExecutorId::Trainer { .. }) {
                continue;
            }
            if record.state == ExecutorState::Running {
                self.retiring.insert(id.clone(), record.clone());
            }
            record.state = ExecutorState::Pending;
        }
    }

    /// Makes every executor that ended for good pending again, with no failure counted, as the
    /// data position is reset to a checkpoint: the job runs again from there, so a job that had
    /// finished launches its daemons and trainers again. Executors still running are left alone.
    pub fn restart_ended(&mut self) {
        for record in self.records.values_mut() {
            if matches!(
                record.state,
                ExecutorState::Succeeded | ExecutorState::Failed
            ) {
                record.state = ExecutorState::Pending;
                record.failures = 0;
            }
        }
        self.total_failures = 0;
        self.failure = None;
    }

    /// Makes an executor that succeeded pending again, with no failure counted.
    pub fn launch_again(&mut self, id: &ExecutorId) {
        if let Some(record) = self.records.get_mut(id)
            && record.state == ExecutorState::Succeeded
        {
            record.state = ExecutorState::Pending;
        }
    }

    /// The trainers a scale replaced that still run.
    pub fn retiring(&self) -> impl Iterator<Item = &ExecutorId> {
        self.retiring.keys()
    }

    /// Whether a trainer has exited with code 0 for good: its data ended, so the job is finishing.
    pub fn a_trainer_succeeded(&self) -> Option<&ExecutorId> {
        self.records
            .iter()
            .find(|(id, record)| {
                matches!(id, ExecutorId::Trainer { .. }) && record.state == ExecutorState::Succeeded
            })
            .map(|(id, _)| id)
    }

    /// Records how an executor ended, and decides whether it runs again. A retiring trainer is
    /// forgotten, however it ended.
    pub fn exited(&mut self, id: &ExecutorId, exit: Exit) {
        if self.retiring.remove(id).is_some() {
            return;
        }
        let Some(record) = self.records.get_mut(id) else {
            return;
        };
        if record.state != ExecutorState::Running {
            return;
        }
        record.exit_code = match exit {
            Exit::Code(code) => Some(code),
            Exit::Killed => None,
        };
        let failed = exit != Exit::Code(0);
        if failed {
            record.failures += 1;
            self.total_failures += 1;
        }
        let restart = match self.restart {
            RestartPolicyName::Always => true,
            RestartPolicyName::OnFailure => failed,
            RestartPolicyName::Never => false,
        };
        record.state = if !failed && !restart {
            ExecutorState::Succeeded
        } else if restart && record.failures <= self.max_failures {
            ExecutorState::Pending
        } else {
            ExecutorState::Failed
        };
        if self.failure.is_none() {
            if record.state == ExecutorState::Failed {
                self.failure = Some(format!(
                    "{id} failed {} times (last exit: {}) and failover.restart ({}) with failover.max_failures ({}) allows no more launches",
                    record.failures,
                    describe(record.exit_code),
                    match self.restart {
                        RestartPolicyName::OnFailure => "on-failure",
                        RestartPolicyName::Never => "never",
                        RestartPolicyName::Always => "always",
                    },
                    self.max_failures
                ));
            } else if self.total_failures > self.max_total_failures {
                self.failure = Some(format!(
                    "{} executor failures exceed failover.max_total_failures ({})",
                    self.total_failures, self.max_total_failures
                ));
            }
        }
    }

    /// Why the executors' failures end the job, once they do.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Whether every trainer of every role exited with code 0 for good.
    pub fn trainers_succeeded(&self) -> bool {
        let mut trainers = self
            .records
            .iter()
            .filter(|(id, _)| matches!(id, ExecutorId::Trainer { .. }))
            .peekable();
        trainers.peek().is_some()
            && trainers.all(|(_, record)| record.state == ExecutorState::Succeeded)
    }

    /// Every executor with its record.
    pub fn records(&self) -> impl Iterator<Item = (&ExecutorId, &ExecutorRecord)> {
        self.records.iter()
    }
}

fn describe(code: Option<i32>) -> String {
    code.map_or_else(
        || "killed by a signal".to_owned(),
        |code| format!("code {code}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Format, JobSpec};

    fn failover(extra: &str) -> FailoverSpec {
        let text = format!(
            "name: t\ndata: {{ sources: [{{ uri: \"file:///d\", format: parquet }}] }}\nroles: [{{ name: w, num: 2, command: [x] }}]\nfailover: {{ max_failures: 2, max_total_failures: 3 {extra} }}\n"
        );
        JobSpec::parse(&text, Format::Yaml)
            .expect("valid spec")
            .failover
    }

    fn trainer(rank: u32) -> ExecutorId {
        ExecutorId::Trainer {
            role: "w".into(),
            rank,
        }
    }

    fn launch_all(sut: &mut Executors) -> Vec<ExecutorId> {
        let launched: Vec<ExecutorId> = sut
            .to_launch()
            .into_iter()
            .map(|LaunchAction::Launch(id)| id)
            .collect();
        for id in &launched {
            sut.launched(id);
        }
        launched
    }

    #[test]
    fn on_failure_relaunches_until_max_failures_then_fails_the_job() {
        let mut sut = Executors::new([trainer(0), trainer(1)], &failover(""));
        assert_eq!(launch_all(&mut sut).len(), 2);
        sut.exited(&trainer(0), Exit::Code(3));
        assert_eq!(launch_all(&mut sut), vec![trainer(0)]);
        sut.exited(&trainer(0), Exit::Killed);
        assert_eq!(launch_all(&mut sut), vec![trainer(0)]);
        assert!(sut.failure().is_none());
        sut.exited(&trainer(0), Exit::Code(1));
        let failure = sut
            .failure()
            .expect("a third failure is past max_failures 2");
        assert!(failure.contains("trainer-w-0 failed 3 times"), "{failure}");
        assert!(
            sut.to_launch().is_empty(),
            "nothing launches after the job failed"
        );
        let record = sut.records().next().expect("records").1;
        assert_eq!((record.restarts, record.exit_code), (2, Some(1)));
    }

    #[test]
    fn trainers_succeed_when_each_exits_zero() {
        let mut sut = Executors::new(
            [trainer(0), trainer(1), ExecutorId::Daemon(0)],
            &failover(""),
        );
        launch_all(&mut sut);
        sut.exited(&trainer(0), Exit::Code(0));
        assert!(!sut.trainers_succeeded());
        sut.exited(&trainer(1), Exit::Code(0));
        assert!(sut.trainers_succeeded(), "the daemon does not count");
        assert!(sut.to_launch().is_empty());
    }

    #[test]
    fn never_fails_at_the_first_failure_and_always_relaunches_success_too() {
        let mut never = Executors::new([trainer(0)], &failover(", restart: never"));
        launch_all(&mut never);
        never.exited(&trainer(0), Exit::Code(2));
        assert!(never.failure().is_some());
        let mut always = Executors::new([trainer(0)], &failover(", restart: always"));
        launch_all(&mut always);
        always.exited(&trainer(0), Exit::Code(0));
        assert_eq!(launch_all(&mut always), vec![trainer(0)]);
    }

    #[test]
    fn a_scale_retires_the_running_trainers_without_counting_how_they_end() {
        let mut sut = Executors::new(
            [trainer(0), trainer(1), ExecutorId::Daemon(0)],
            &failover(""),
        );
        launch_all(&mut sut);
        sut.exited(&trainer(1), Exit::Code(3));
        sut.replace_trainers((0..3).map(trainer));
        assert_eq!(
            sut.retiring().cloned().collect::<Vec<_>>(),
            vec![trainer(0)],
            "only the running trainer retires; the pending one is dropped"
        );
        let pending: Vec<ExecutorId> = sut
            .to_launch()
            .into_iter()
            .map(|LaunchAction::Launch(id)| id)
            .collect();
        assert_eq!(pending, (0..3).map(trainer).collect::<Vec<_>>());
        sut.exited(&trainer(0), Exit::Killed);
        assert_eq!(sut.retiring().count(), 0);
        let record = sut
            .records()
            .find(|(id, _)| **id == trainer(0))
            .expect("the new rank 0")
            .1;
        assert_eq!(
            (record.state, record.failures),
            (ExecutorState::Pending, 0),
            "the retired trainer's end is not the new one's"
        );
        assert!(sut.failure().is_none());
        assert_eq!(sut.total_failures, 1, "only the earlier failure counts");
    }

    #[test]
    fn a_restore_makes_every_ended_executor_pending_again() {
        let mut sut = Executors::new(
            [trainer(0), trainer(1), ExecutorId::Daemon(0)],
            &failover(", restart: never"),
        );
        launch_all(&mut sut);
        sut.exited(&trainer(0), Exit::Code(0));
        sut.exited(&ExecutorId::Daemon(0), Exit::Code(0));
        sut.exited(&trainer(1), Exit::Code(1));
        assert!(sut.failure().is_some());
        sut.restart_ended();
        assert!(sut.failure().is_none());
        let pending: Vec<ExecutorId> = sut
            .to_launch()
            .into_iter()
            .map(|LaunchAction::Launch(id)| id)
            .collect();
        assert_eq!(pending, vec![ExecutorId::Daemon(0), trainer(0), trainer(1)]);
        launch_all(&mut sut);
        let restarts: Vec<u32> = sut.records().map(|(_, record)| record.restarts).collect();
        assert_eq!(restarts, vec![1, 1, 1], "each one runs again");
    }

    #[test]
    fn a_restart_retires_the_running_trainers_and_keeps_their_counts() {
        let mut sut = Executors::new(
            [trainer(0), trainer(1), ExecutorId::Daemon(0)],
            &failover(""),
        );
        launch_all(&mut sut);
        sut.exited(&trainer(1), Exit::Code(3));
        sut.restart_trainers();
        assert_eq!(
            sut.retiring().cloned().collect::<Vec<_>>(),
            vec![trainer(0)],
            "only the running trainer retires"
        );
        sut.exited(&trainer(0), Exit::Killed);
        assert_eq!(sut.retiring().count(), 0);
        assert_eq!(
            launch_all(&mut sut),
            vec![trainer(0), trainer(1)],
            "the daemon runs on; both trainers launch again"
        );
        let counts: Vec<(u32, u32)> = sut
            .records()
            .filter(|(id, _)| matches!(id, ExecutorId::Trainer { .. }))
            .map(|(_, record)| (record.failures, record.restarts))
            .collect();
        assert_eq!(
            counts,
            vec![(0, 1), (1, 1)],
            "the stop is no failure, the earlier failure still counts"
        );
    }

    #[test]
    fn failures_across_executors_past_the_job_limit_fail_the_job() {
        let ids: Vec<ExecutorId> = (0..4).map(trainer).collect();
        let mut sut = Executors::new(ids.clone(), &failover(""));
        launch_all(&mut sut);
        for id in &ids {
            sut.exited(id, Exit::Code(9));
        }
        let failure = sut.failure().expect("4 failures exceed 3");
        assert!(failure.contains("max_total_failures (3)"), "{failure}");
    }
}
