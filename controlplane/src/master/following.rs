//! Following sources that grow: the splits a followed source adds, and when following ends.
//!
//! The follower ([`crate::follow`]) polls the sources and hands the master what it found; the master
//! journals it ([`Entry::FilesAdded`], [`Entry::FollowEnded`]) and the task table takes the new
//! splits' tasks.
//!
//! Pure like the task table's [`decide`](crate::decide::decide): [`decide`] takes where following
//! stands and one [`FollowEvent`], changes it, and says whether following ended for every source,
//! which the master then tells the task table.

use super::{Applied, Entry, Master};
use crate::decide::Event;
use crate::plan::JobPlan;
use crate::spec::{FollowSpec, JobSpec};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Where following a source stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFollow {
    /// Whether the source is still followed.
    pub following: bool,
    /// For a Delta table, the last version planned.
    pub version: Option<u64>,
    /// Why following ended, once it has.
    pub ended: Option<String>,
}

/// Where following every source of a job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Follows {
    /// Each source's, by index; `None` for a source not followed.
    sources: Vec<Option<SourceFollow>>,
    /// Polls of each source this AM finished, one count per source of the spec: a statistic, not
    /// journaled.
    polls: Vec<u64>,
}

/// What happened that following follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FollowEvent {
    /// The follower finished a poll of `source`, whatever it found.
    Polled {
        /// The index of the source in the spec.
        source: u32,
    },
    /// A followed source grew, for a Delta table up to `version`.
    Grew {
        /// The index of the source in the spec.
        source: u32,
        /// For a Delta table, the version planned up to.
        version: Option<u64>,
    },
    /// A source is no longer followed, for `reason`.
    Ended {
        /// The index of the source in the spec.
        source: u32,
        /// Why.
        reason: String,
    },
}

/// Following ended for every source: the task table's epoch may end once its rows are consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AllEnded;

/// Applies `event` to where following stands; returns [`AllEnded`] when a source's end leaves no
/// source followed.
pub(super) fn decide(state: &mut Follows, event: FollowEvent) -> Option<AllEnded> {
    match event {
        FollowEvent::Polled { source } => {
            if let Some(polls) = state.polls.get_mut(source as usize) {
                *polls += 1;
            }
            None
        }
        FollowEvent::Grew { source, version } => {
            if let Some(Some(follow)) = state.sources.get_mut(source as usize)
                && version.is_some()
            {
                follow.version = version;
            }
            None
        }
        FollowEvent::Ended { source, reason } => {
            if let Some(Some(follow)) = state.sources.get_mut(source as usize) {
                if !follow.following {
                    return None;
                }
                follow.following = false;
                follow.ended = Some(reason);
            }
            state.following().next().is_none().then_some(AllEnded)
        }
    }
}

impl Follows {
    /// Following as a job starts: every source with a `follow` setting is followed, a Delta
    /// table from the version planned.
    pub(super) fn new(spec: &JobSpec, plan: &JobPlan) -> Follows {
        let sources: Vec<Option<SourceFollow>> = spec
            .data
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                source.follow.as_ref().map(|_| SourceFollow {
                    following: true,
                    version: plan.versions.get(index).copied().flatten(),
                    ended: None,
                })
            })
            .collect();
        Follows {
            polls: vec![0; sources.len()],
            sources,
        }
    }

    /// Where following stands as a snapshot left it, with this AM's poll counts.
    pub(super) fn restore(&mut self, sources: Vec<Option<SourceFollow>>) {
        self.sources = sources;
    }

    /// The sources still followed, by index.
    pub(super) fn following(&self) -> impl Iterator<Item = u32> + '_ {
        self.sources
            .iter()
            .enumerate()
            .filter(|(_, follow)| follow.as_ref().is_some_and(|follow| follow.following))
            .map(|(index, _)| index as u32)
    }

    /// Where following source `source` stands, `None` for a source not followed.
    pub(super) fn source(&self, source: u32) -> Option<&SourceFollow> {
        self.sources.get(source as usize)?.as_ref()
    }

    /// Every source's, by index.
    pub(super) fn sources(&self) -> &[Option<SourceFollow>] {
        &self.sources
    }

    /// The polls of source `source` this AM finished.
    pub(super) fn polls(&self, source: u32) -> u64 {
        self.polls.get(source as usize).copied().unwrap_or(0)
    }
}

/// What the follower needs to poll a source that is still followed.
#[derive(Debug, Clone)]
pub struct FollowTarget {
    /// The index of the source in the spec.
    pub source: u32,
    /// How it is followed.
    pub spec: FollowSpec,
    /// For a Delta table, the last version planned.
    pub version: Option<u64>,
    /// The URIs of the source's planned files.
    pub planned: std::collections::HashSet<String>,
}

impl Master {
    /// What polling source `source` needs, while the job runs and the source is followed.
    pub fn follow_target(&self, source: u32) -> Option<FollowTarget> {
        let follow = self.follows.source(source)?;
        if !follow.following || self.table.outcome().is_some() || self.stop_reason.is_some() {
            return None;
        }
        let spec = self
            .spec
            .data
            .sources
            .get(source as usize)?
            .follow
            .clone()?;
        Some(FollowTarget {
            source,
            spec,
            version: follow.version,
            planned: self
                .plan
                .files
                .iter()
                .filter(|file| file.source == source)
                .map(|file| file.uri.clone())
                .collect(),
        })
    }

    /// The follower finished a poll of source `source`, whatever it found.
    pub fn source_polled(&mut self, source: u32) {
        decide(&mut self.follows, FollowEvent::Polled { source });
    }

    /// Where following each source stands, `None` for a source not followed.
    pub fn follows(&self) -> &[Option<SourceFollow>] {
        self.follows.sources()
    }

    /// A followed source grew by `block`'s files and splits (for a Delta table, up to `version`),
    /// each file pinned to the identity it had when the follower planned it.
    pub fn add_splits(&mut self, source: u32, version: Option<u64>, block: JobPlan) -> Applied<()> {
        let entry = Entry::FilesAdded {
            source,
            version,
            files: block.files.clone(),
            splits: block.splits.clone(),
            bytes: block.bytes.clone(),
            identities: block.identities.clone(),
        };
        self.apply_added(source, version, block);
        Applied {
            reply: (),
            entries: vec![entry],
        }
    }

    /// Source `source` is no longer followed, for `reason`.
    pub fn end_follow(&mut self, source: u32, reason: String) -> Applied<()> {
        self.apply_follow_ended(source, reason.clone());
        Applied {
            reply: (),
            entries: vec![Entry::FollowEnded { source, reason }],
        }
    }

    /// A followed source cannot be followed further: the job fails with `reason`.
    pub fn fail_follow(&mut self, reason: String) -> Applied<()> {
        let event = Event::FollowFailed { reason };
        let entries = vec![Entry::Event(event.clone())];
        self.apply_event(None, event);
        Applied { reply: (), entries }
    }

    pub(super) fn apply_added(&mut self, source: u32, version: Option<u64>, block: JobPlan) {
        decide(&mut self.follows, FollowEvent::Grew { source, version });
        self.append_block(block, |split_rows| Event::SplitsAdded { split_rows });
    }

    /// Appends `block`'s files and splits to the plan, after every split before them, and their
    /// tasks to the table, through the event `added` makes of their row counts.
    pub(super) fn append_block(&mut self, block: JobPlan, added: impl FnOnce(Vec<u64>) -> Event) {
        let split_rows = block.split_rows();
        self.added.append(&block);
        let first_split = Arc::make_mut(&mut self.plan).append(&block);
        if split_rows.is_empty() {
            return;
        }
        self.apply_event(None, added(split_rows));
        self.origins.place_added(&self.table, first_split);
    }

    pub(super) fn apply_follow_ended(&mut self, source: u32, reason: String) {
        let was_followed = self
            .follows
            .source(source)
            .is_some_and(|follow| follow.following);
        if was_followed {
            tracing::info!(source, %reason, "source no longer followed");
        }
        let all_ended = decide(&mut self.follows, FollowEvent::Ended { source, reason });
        if all_ended.is_some() && self.table.following() {
            self.apply_event(None, Event::FollowEnded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn followed(version: Option<u64>) -> Option<SourceFollow> {
        Some(SourceFollow {
            following: true,
            version,
            ended: None,
        })
    }

    #[test]
    fn following_ends_for_all_once_the_last_followed_source_ends() {
        let mut sut = Follows {
            sources: vec![followed(None), None, followed(Some(3))],
            polls: vec![0; 3],
        };
        let ended = |source: u32| FollowEvent::Ended {
            source,
            reason: format!("stop {source}"),
        };
        assert_eq!(decide(&mut sut, ended(2)), None, "source 0 is followed");
        assert_eq!(sut.following().collect::<Vec<_>>(), [0]);
        assert_eq!(
            sut.source(2).and_then(|follow| follow.ended.as_deref()),
            Some("stop 2")
        );
        assert_eq!(decide(&mut sut, ended(2)), None, "ended before");
        assert_eq!(decide(&mut sut, ended(0)), Some(AllEnded));
        assert_eq!(decide(&mut sut, ended(0)), None, "ended before");
    }

    #[test]
    fn a_delta_source_that_grew_is_followed_from_its_new_version_and_polls_are_counted() {
        let mut sut = Follows {
            sources: vec![followed(Some(3)), followed(None)],
            polls: vec![0; 2],
        };
        let grew = |source, version| FollowEvent::Grew { source, version };
        assert_eq!(decide(&mut sut, grew(0, Some(5))), None);
        assert_eq!(
            decide(&mut sut, grew(0, None)),
            None,
            "a directory's growth"
        );
        assert_eq!(decide(&mut sut, grew(7, Some(1))), None, "no such source");
        assert_eq!(sut.source(0).and_then(|follow| follow.version), Some(5));
        for source in [1, 1, 1, u32::MAX] {
            decide(&mut sut, FollowEvent::Polled { source });
        }
        assert_eq!((sut.polls(0), sut.polls(1), sut.polls(9)), (0, 3, 0));
        assert_eq!(
            sut.polls.len(),
            2,
            "a source the spec does not have is not counted"
        );
    }
}
