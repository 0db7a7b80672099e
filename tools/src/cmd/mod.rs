//! One module per `sluice` subcommand.

pub mod bench;
pub mod demo;
pub mod gc;
