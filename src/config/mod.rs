//! Configuration (being written).

pub mod cli;
