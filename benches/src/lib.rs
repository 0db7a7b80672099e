//! Drivers of the `sluice bench` suite.
