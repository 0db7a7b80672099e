//! Following sources that grow: the splits a followed source adds, and when following ends.
//!
//! The follower ([`crate::follow`]) polls the sources and hands the master what it found; the master
//! journals it ([`Entry::SplitsAdded`], [`Entry::FollowEnded`]) and the task table takes the new
//! splits' tasks.

use super::{Applied, Entry, Master};
use crate::decide::Event;
use crate::plan::{JobPlan, PlannedFile, PlannedSplit};
use crate::spec::FollowSpec;
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
    /// The sources still followed, by index.
    pub(super) fn following_sources(&self) -> impl Iterator<Item = u32> + '_ {
        self.follows
            .iter()
            .enumerate()
            .filter(|(_, follow)| follow.as_ref().is_some_and(|follow| follow.following))
            .map(|(index, _)| index as u32)
    }

    /// What polling source `source` needs, while the job runs and the source is followed.
    pub fn follow_target(&self, source: u32) -> Option<FollowTarget> {
        let follow = self.follows.get(source as usize)?.as_ref()?;
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
        let index = source as usize;
        if self.polls.len() <= index {
            self.polls.resize(index + 1, 0);
        }
        self.polls[index] += 1;
    }

    /// Where following each source stands, `None` for a source not followed.
    pub fn follows(&self) -> &[Option<SourceFollow>] {
        &self.follows
    }

    /// A followed source grew by `block`'s files and splits (for a Delta table, up to `version`).
    pub fn add_splits(&mut self, source: u32, version: Option<u64>, block: JobPlan) -> Applied<()> {
        let entry = Entry::SplitsAdded {
            source,
            version,
            files: block.files.clone(),
            splits: block.splits.clone(),
        };
        self.apply_added(source, version, block.files, block.splits);
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

    pub(super) fn apply_added(
        &mut self,
        source: u32,
        version: Option<u64>,
        files: Vec<PlannedFile>,
        splits: Vec<PlannedSplit>,
    ) {
        if let Some(Some(follow)) = self.follows.get_mut(source as usize)
            && version.is_some()
        {
            follow.version = version;
        }
        let first_split = self.plan.splits.len();
        let split_rows: Vec<u64> = splits.iter().map(|split| split.row_count).collect();
        let first_file = self.added_files.len() as u32;
        self.added_files.extend_from_slice(&files);
        self.added_splits
            .extend(splits.iter().map(|split| PlannedSplit {
                file: first_file + split.file,
                ..*split
            }));
        Arc::make_mut(&mut self.plan).append(&files, &splits);
        if split_rows.is_empty() {
            return;
        }
        self.apply_event(None, Event::SplitsAdded { split_rows });
        self.origins.place_added(&self.table, first_split);
    }

    pub(super) fn apply_follow_ended(&mut self, source: u32, reason: String) {
        if let Some(Some(follow)) = self.follows.get_mut(source as usize) {
            if !follow.following {
                return;
            }
            follow.following = false;
            follow.ended = Some(reason.clone());
        }
        tracing::info!(source, %reason, "source no longer followed");
        if self.table.following() && self.following_sources().next().is_none() {
            self.apply_event(None, Event::FollowEnded);
        }
    }
}
