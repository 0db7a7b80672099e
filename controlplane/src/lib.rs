//! The Sluice application master's core: the job spec and the scheduling decisions.
//!
//! - [`spec`] parses a job spec (YAML, TOML or JSON) and validates it once into typed values, with
//!   errors that name the key path and the fix.
//! - [`decide`] holds the task table and the decisions of the AM as pure functions of the form
//!   `decide(state, event) -> actions`: no network, no file, no clock. Time enters as a field of the
//!   events. The gRPC service, the journal and the launchers wrap these functions.
//! - [`plan`] opens the job's sources through the formats layer and plans them into splits once.
//! - [`clock`] gives the AM its time: a monotonic clock for liveness, continued across AM
//!   restarts from the journal's latest time, and the wall clock only for dates.
//! - [`master`] keeps the task table with what the AM tracks beside it (commands waiting for a
//!   node, pipeline statistics, data checkpoints), still without IO.
//! - [`service`] and [`server`] serve the `sluice.v1` gRPC API over it, turning its messages into
//!   the master's own calls and back at the edge (`wire`).
//! - [`connections`] bounds the connections that have shown no token: how many a listener keeps,
//!   and for how long.
//! - [`http`] serves the status page, its JSON API and Prometheus `/metrics` over the same state.
//! - [`journal`] makes every change to the task table durable before the AM acknowledges it:
//!   group-committed appends and snapshots in a local directory or an object store, with fencing
//!   of an older writer.
//!
//! YAML is read with `serde_norway`, the maintained fork of `serde_yaml`: `serde_yaml` was archived
//! by its author in 2024, and `serde_yml` is deprecated by its own author. `serde_norway` keeps the
//! `serde_yaml` API and its YAML 1.2 behaviour (`no` is a string, not `false`), and gets fixes.

#![forbid(unsafe_code)]

pub mod checkpoint_store;
pub mod clock;
pub mod connections;
pub mod decide;
pub mod error;
pub mod follow;
pub mod http;
pub mod journal;
pub mod launcher;
pub mod master;
pub mod persist;
pub mod plan;
pub mod server;
pub mod service;
pub mod spec;
pub mod status;
pub mod tls;
mod wire;

pub use error::{AmError, Result};
