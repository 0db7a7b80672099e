//! One module per `sluice` subcommand.

pub mod am;
pub mod bench;
pub mod consume;
pub mod daemon;
pub mod demo;
pub mod gc;
pub mod r#gen;
pub mod manifests;
pub mod plan;
pub mod progress;
pub mod read;
pub mod run;
pub mod shim;
pub mod slurm;
pub mod token;

/// Raises this process's soft limit of open files to its hard limit, for the servers that hold a
/// descriptor per connection and per ring (the AM, a daemon); one that cannot be raised is said and
/// the command goes on at the limit it has.
pub fn raise_open_files_limit(label: &str) {
    match sluice_process::raise_open_files_limit() {
        Ok(limit) if limit.after > limit.before => tracing::debug!(
            before = limit.before,
            after = limit.after,
            "{label}: raised the limit of open files to its hard limit"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(
            %error,
            "{label}: the limit of open files could not be raised to its hard limit; it stays as it is"
        ),
    }
}
