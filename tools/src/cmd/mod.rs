//! One module per `sluice` subcommand.
