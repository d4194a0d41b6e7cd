//! placeholder

pub mod lease;
