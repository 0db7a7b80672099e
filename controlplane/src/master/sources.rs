//! Sources added to a running job (`sluice source add`).
//!
//! The service parses and plans the source with the master unlocked (planning is IO); the master
//! then refuses it if the job is over or would grow past the task table's limits, numbers it after
//! the job's sources, and journals it as [`Entry::SourceAdded`]: the source's text as it was sent,
//! the Delta version it was planned at, and its files and splits pinned as planned. Its splits join
//! the plan after every split before them and their tasks join the current epoch, as a followed
//! source's do; every later epoch has them. A new AM replays the entry, or reads the sources back
//! from its snapshot, and parses each text again: the spec it was started with does not have them.
//! The daemons that registered before learn each source from the first tasks of it they are given
//! (`AssignTasks.sources`); the ones that register after, from the job's data.

use super::{Applied, Entry, Master};
use crate::decide::Event;
use crate::error::{AmError, Result};
use crate::plan::JobPlan;
use crate::spec::SourceSpec;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A source added to the running job, as journaled: parsed again when replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournaledSource {
    /// The source as it was sent: one entry of `data.sources`, in YAML or JSON.
    pub text: String,
    /// For a Delta table, the version it was planned at.
    pub version: Option<u64>,
}

/// A source added to the running job.
#[derive(Debug, Clone, PartialEq)]
pub struct AddedSource {
    /// Its index in the job's sources.
    pub index: u32,
    /// The source.
    pub spec: SourceSpec,
    /// As journaled.
    pub journaled: JournaledSource,
}

/// What adding a source brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceAdded {
    /// Its index in the job's sources.
    pub index: u32,
    /// Its files in the plan.
    pub files: u64,
    /// Its splits.
    pub splits: u64,
    /// Its rows, before any filter.
    pub rows: u64,
    /// The epoch its tasks joined.
    pub epoch: u32,
}

impl Master {
    /// The index the next source added to the job gets.
    pub fn next_source_index(&self) -> u32 {
        self.spec.data.sources.len() as u32
    }

    /// Adds the source `text` parses into (`spec`), planned into `block` (its files numbered as
    /// source 0 or any other: they are numbered again here) at the Delta `version`, if any.
    pub fn add_source(
        &mut self,
        text: String,
        spec: SourceSpec,
        version: Option<u64>,
        mut block: JobPlan,
    ) -> Result<Applied<SourceAdded>> {
        if let Some(reason) = &self.stop_reason {
            return Err(AmError::FailedPrecondition(format!(
                "the job is stopping ({reason}): a source can only be added to a running job"
            )));
        }
        if self.table.outcome().is_some() || self.outcome().is_some() {
            return Err(AmError::FailedPrecondition(
                "the job is over: a source can only be added to a running job".to_owned(),
            ));
        }
        if self.table.is_mixed() {
            return Err(AmError::FailedPrecondition(format!(
                "adding {}: the job mixes its sources by weight, and a mix is fixed when the job starts; run a job that names the source in data.sources with its weight",
                spec.uri
            )));
        }
        let split_rows = block.split_rows();
        if let Some(past) = self.table.past_limits(&split_rows) {
            return Err(AmError::FailedPrecondition(format!(
                "adding {}: {past}; add a smaller source, or run the job with a larger data.task_rows",
                spec.uri
            )));
        }
        let index = self.next_source_index();
        for file in &mut block.files {
            file.source = index;
        }
        let journaled = JournaledSource { text, version };
        let added = SourceAdded {
            index,
            files: block.files.len() as u64,
            splits: block.splits.len() as u64,
            rows: split_rows.iter().sum(),
            epoch: self.table.epoch(),
        };
        let entry = Entry::SourceAdded {
            source: journaled.clone(),
            files: block.files.clone(),
            splits: block.splits.clone(),
            bytes: block.bytes.clone(),
            identities: block.identities.clone(),
        };
        self.apply_source_added(
            AddedSource {
                index,
                spec,
                journaled,
            },
            block,
        );
        Ok(Applied {
            reply: added,
            entries: vec![entry],
        })
    }

    /// The sources added to the running job, in the order they were.
    pub fn added_sources(&self) -> &[AddedSource] {
        &self.added_sources
    }

    /// Parses a journaled source again, as the source `index` of the job.
    pub(super) fn parse_journaled(index: u32, journaled: JournaledSource) -> Result<AddedSource> {
        let spec = SourceSpec::parse_added(&journaled.text, index as usize).map_err(|error| {
            AmError::FailedPrecondition(format!(
                "the journal adds a source this release cannot read ({error}); take the job over with the release that ran it"
            ))
        })?;
        Ok(AddedSource {
            index,
            spec,
            journaled,
        })
    }

    /// Makes `source` one of the job's, with its files and splits in `block`.
    pub(super) fn apply_source_added(&mut self, source: AddedSource, block: JobPlan) {
        self.append_source(source);
        self.append_block(block, |split_rows| Event::SourceAdded { split_rows });
    }

    /// Makes `source` one of the job's sources, the daemons' as the AM's.
    fn append_source(&mut self, source: AddedSource) {
        let index = source.index as usize;
        let plan = Arc::make_mut(&mut self.plan);
        plan.versions.resize(index, None);
        plan.versions.push(source.journaled.version);
        Arc::make_mut(&mut self.spec)
            .data
            .sources
            .push(source.spec.clone());
        self.added_sources.push(source);
    }

    /// Sets the added sources to `sources`, as a snapshot holds them: the spec's sources and the
    /// plan's versions are cut back to the job's own first.
    pub(super) fn restore_sources(&mut self, sources: Vec<JournaledSource>) -> Result<()> {
        let own = self.spec.data.sources.len() - self.added_sources.len();
        Arc::make_mut(&mut self.spec).data.sources.truncate(own);
        Arc::make_mut(&mut self.plan).versions.truncate(own);
        self.added_sources.clear();
        for (offset, journaled) in sources.into_iter().enumerate() {
            let source = Master::parse_journaled((own + offset) as u32, journaled)?;
            self.append_source(source);
        }
        Ok(())
    }
}
