//! Sluice on Kubernetes: the objects of a job ([`manifests`]), how its node pods' states become
//! executor events ([`watch`]), and the launcher that creates and watches those pods
//! ([`launcher`]).
//!
//! kube-rs and the Kubernetes API types live in this crate alone, so that they are built once and
//! the rest of the workspace does not wait for them.

#![forbid(unsafe_code)]

pub mod launcher;
pub mod manifests;
pub mod watch;
