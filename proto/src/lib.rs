//! The Sluice gRPC protocol, spoken between node daemons, trainers' clients, the CLI and the
//! application master.
//!
//! [`v1`] holds the messages and tonic services generated from `sluice/v1/sluice.proto`. Ids travel
//! there as plain fields (`task_id: u64`, `node_id: u64`, `job_id: String`); [`TaskId`], [`NodeId`]
//! and [`JobId`] give them types, and convert to and from those fields at the edge. They are the
//! only id types of the project: the AM's decisions, its journal and the daemon's task book use
//! them too, and they serialize as the plain value they wrap, so the journal's encoding is that of
//! the wire's fields.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::fmt;

pub mod connect;

/// This host's name, which a daemon reports at registration and an AM listening on every address
/// advertises; empty when the kernel does not say.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

/// The generated `sluice.v1` messages, clients and servers.
pub mod v1 {
    tonic::include_proto!("sluice.v1");
}

/// A task's identity, unique across all epochs of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "task-{}", self.0)
    }
}

impl From<u64> for TaskId {
    fn from(task_id: u64) -> TaskId {
        TaskId(task_id)
    }
}

impl From<TaskId> for u64 {
    fn from(task_id: TaskId) -> u64 {
        task_id.0
    }
}

/// A node daemon's identity, stable across its restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "node-{}", self.0)
    }
}

impl From<u64> for NodeId {
    fn from(node_id: u64) -> NodeId {
        NodeId(node_id)
    }
}

impl From<NodeId> for u64 {
    fn from(node_id: NodeId) -> u64 {
        node_id.0
    }
}

/// A job's identity, the name it is known by to the AM and its executors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub String);

impl fmt::Display for JobId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl From<String> for JobId {
    fn from(job_id: String) -> JobId {
        JobId(job_id)
    }
}

impl From<&str> for JobId {
    fn from(job_id: &str) -> JobId {
        JobId(job_id.to_owned())
    }
}

impl From<JobId> for String {
    fn from(job_id: JobId) -> String {
        job_id.0
    }
}

/// The longest job name: it names a directory on every node and, on Kubernetes, pods.
pub const JOB_NAME_MAX_LEN: usize = 63;

/// Why `value` cannot be a name that becomes one component of a path and a pod's name (a job's, a
/// role's): what is wrong with it, and the fix; `None` when it can. Such a name is lowercase letters,
/// digits, `-`, `_` and `.`, starting with a letter or digit (so never `..`, `/` or absolute), and at
/// most `max_len` characters long. Names that come from the wire or the environment are checked
/// with it as names from the spec are.
pub fn slug_problem(value: &str, max_len: usize) -> Option<(String, String)> {
    let fix = "use lowercase letters, digits, `-`, `_` and `.`, starting with a letter or digit";
    if value.is_empty() {
        return Some(("is empty".to_owned(), fix.to_owned()));
    }
    if value.len() > max_len {
        return Some((
            format!("is {} characters long", value.len()),
            format!("shorten it to at most {max_len}"),
        ));
    }
    let starts_well = value
        .chars()
        .next()
        .is_some_and(|first| first.is_ascii_lowercase() || first.is_ascii_digit());
    let all_allowed = value.chars().all(|character| {
        character.is_ascii_lowercase() || character.is_ascii_digit() || "-_.".contains(character)
    });
    (!starts_well || !all_allowed).then(|| {
        (
            "has characters that cannot name files and pods".to_owned(),
            fix.to_owned(),
        )
    })
}

/// Adds `authorization: Bearer <token>` to every call when a token is set: the shared token an AM
/// started with `--token` requires of its callers.
#[derive(Debug, Clone)]
pub struct BearerToken(pub Option<String>);

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            let value = format!("Bearer {token}").parse().map_err(|_| {
                tonic::Status::invalid_argument("the token must be printable ASCII")
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}
