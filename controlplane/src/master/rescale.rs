//! Taking the rings back for a scale or a restore: which node gives its rings back, which waits for
//! its new ranks, and when the trainers may launch again.
//!
//! Pure like the task table's [`decide`](crate::decide::decide): [`decide`] takes where a rescale
//! stands and one [`RescaleEvent`], changes the state, and says whether the rescale ended. The
//! master feeds it the facts it needs (which nodes live, whether a retiring trainer still runs) in
//! the events, so that this module reads no other state. The steps are those of the
//! [master's documentation](super#scaling-a-role).

use crate::decide::NodeId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A scale or restore under way: who still has to give rings back and who waits for ranks.
///
/// Its encoding is part of the journal's snapshots: a field is added only at the end, with a
/// default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Rescale {
    /// The role sizes before the scale, over which the releasing nodes' rings are ranked.
    pub(super) previous_sizes: Vec<u32>,
    /// Live nodes that still feed rings of the previous ranks.
    releasing: BTreeSet<NodeId>,
    /// Nodes that hold no ring and wait for their new ranks.
    waiting: BTreeSet<NodeId>,
    /// Whether a restore to a data checkpoint started it: no task is handed out until it ends.
    pub(super) restore: bool,
}

/// What happened that a rescale follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RescaleEvent {
    /// A scale or restore starts: every node in `live` gives back its rings, which are ranked over
    /// `previous_sizes`.
    Started {
        /// The role sizes the rings were opened for.
        previous_sizes: Vec<u32>,
        /// The nodes alive now.
        live: BTreeSet<NodeId>,
        /// Whether a restore starts it.
        restore: bool,
        /// Whether a trainer the rescale replaces still runs.
        retiring: bool,
    },
    /// A node alive in the table registered; `held_nothing` when it listed no task.
    Registered {
        /// The node.
        node: NodeId,
        /// Whether it registered holding nothing, as a node that gave its rings back does.
        held_nothing: bool,
        /// Whether a trainer the rescale replaces still runs.
        retiring: bool,
    },
    /// A node was lost or blacklisted: it takes no part any more.
    Gone {
        /// The node.
        node: NodeId,
        /// Whether a trainer the rescale replaces still runs.
        retiring: bool,
    },
    /// An executor changed; `retiring` tells whether a trainer the rescale replaces still runs.
    Executors {
        /// Whether a trainer the rescale replaces still runs.
        retiring: bool,
    },
}

/// How a rescale ended: no trainer of the previous ranks runs and every live node has its new
/// ranks, so the trainers may launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ended {
    /// Whether a restore had started it.
    pub(super) restore: bool,
}

/// Applies `event` to the rescale under way, if any, or starts one; returns how it ended when
/// this event ended it.
pub(super) fn decide(state: &mut Option<Rescale>, event: RescaleEvent) -> Option<Ended> {
    let retiring = match event {
        RescaleEvent::Started {
            previous_sizes,
            live,
            restore,
            retiring,
        } => {
            *state = Some(Rescale {
                previous_sizes,
                releasing: live,
                waiting: BTreeSet::new(),
                restore,
            });
            retiring
        }
        RescaleEvent::Registered {
            node,
            held_nothing,
            retiring,
        } => {
            let rescale = state.as_mut()?;
            if rescale.releasing.contains(&node) {
                if !held_nothing {
                    return None;
                }
                rescale.releasing.remove(&node);
            }
            if retiring || !rescale.releasing.is_empty() {
                rescale.waiting.insert(node);
            } else {
                rescale.waiting.remove(&node);
            }
            retiring
        }
        RescaleEvent::Gone { node, retiring } => {
            let rescale = state.as_mut()?;
            rescale.releasing.remove(&node);
            rescale.waiting.remove(&node);
            retiring
        }
        RescaleEvent::Executors { retiring } => retiring,
    };
    let rescale = state.as_ref()?;
    if retiring || !rescale.releasing.is_empty() || !rescale.waiting.is_empty() {
        return None;
    }
    let ended = Ended {
        restore: rescale.restore,
    };
    *state = None;
    Some(ended)
}

impl Rescale {
    /// Whether `node` is due a `Release`: it feeds rings of the previous ranks and no trainer
    /// reads them any more, or it waits for its new ranks and no node feeds rings of the previous
    /// ones.
    pub(super) fn release_due(&self, node: NodeId, retiring: bool) -> bool {
        !retiring
            && (self.releasing.contains(&node)
                || (self.releasing.is_empty() && self.waiting.contains(&node)))
    }

    /// What a registering `node` is told while the rescale is under way: `None` when it waits for
    /// its new ranks (it opens no ring), the sizes its rings are ranked over when it still feeds
    /// rings of the previous ranks, and `Some(None)` otherwise (the current ranks).
    pub(super) fn sizes_for(&self, node: NodeId) -> Option<Option<&[u32]>> {
        if self.waiting.contains(&node) {
            None
        } else if self.releasing.contains(&node) {
            Some(Some(&self.previous_sizes))
        } else {
            Some(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64) -> NodeId {
        NodeId(id)
    }

    fn started(live: &[u64], retiring: bool) -> Option<Rescale> {
        let mut state = None;
        let ended = decide(
            &mut state,
            RescaleEvent::Started {
                previous_sizes: vec![2],
                live: live.iter().copied().map(node).collect(),
                restore: false,
                retiring,
            },
        );
        assert_eq!(ended, None, "nodes still hold rings");
        state
    }

    fn registered(state: &mut Option<Rescale>, id: u64, held_nothing: bool) -> Option<Ended> {
        decide(
            state,
            RescaleEvent::Registered {
                node: node(id),
                held_nothing,
                retiring: false,
            },
        )
    }

    #[test]
    fn no_release_is_due_while_a_retiring_trainer_still_runs() {
        let mut state = started(&[0, 1], true);
        let rescale = state.as_ref().expect("under way");
        assert!(!rescale.release_due(node(0), true));
        assert!(rescale.release_due(node(0), false));
        assert_eq!(
            decide(&mut state, RescaleEvent::Executors { retiring: false }),
            None
        );
        assert!(state.is_some(), "the nodes still feed the old rings");
    }

    #[test]
    fn a_node_that_gave_its_rings_back_waits_until_every_node_has() {
        let mut state = started(&[0, 1], false);
        assert_eq!(registered(&mut state, 0, false), None, "still holds tasks");
        let rescale = state.as_ref().expect("under way");
        assert_eq!(rescale.sizes_for(node(0)), Some(Some(&[2][..])));

        assert_eq!(registered(&mut state, 0, true), None);
        let rescale = state.as_ref().expect("under way");
        assert_eq!(rescale.sizes_for(node(0)), None, "waits for its ranks");
        assert!(!rescale.release_due(node(0), false), "node 1 still feeds");
        assert!(rescale.release_due(node(1), false));

        assert_eq!(registered(&mut state, 1, true), None);
        let rescale = state.as_ref().expect("under way");
        assert!(rescale.release_due(node(0), false), "every ring is back");
        assert_eq!(registered(&mut state, 1, true), None, "node 0 still waits");
        assert_eq!(
            registered(&mut state, 0, true),
            Some(Ended { restore: false })
        );
        assert_eq!(state, None);
    }

    #[test]
    fn a_lost_node_takes_no_part_and_may_end_the_rescale() {
        let mut state = started(&[0, 1], false);
        assert_eq!(registered(&mut state, 0, true), None);
        assert_eq!(registered(&mut state, 0, true), None, "node 1 still feeds");
        assert_eq!(
            decide(
                &mut state,
                RescaleEvent::Gone {
                    node: node(1),
                    retiring: false
                }
            ),
            None,
            "node 0 was told to wait and registers once more"
        );
        assert_eq!(
            registered(&mut state, 0, true),
            Some(Ended { restore: false })
        );
    }

    #[test]
    fn a_rescale_with_no_live_node_ends_once_the_trainers_are_gone() {
        let mut state = started(&[], true);
        assert_eq!(
            decide(&mut state, RescaleEvent::Executors { retiring: false }),
            Some(Ended { restore: false })
        );
        let mut state = None;
        assert_eq!(
            decide(&mut state, RescaleEvent::Executors { retiring: false }),
            None,
            "no rescale under way"
        );
    }
}
