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
