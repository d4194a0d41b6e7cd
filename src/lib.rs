//! The `narad` binary's library: CLI, server wiring and the HTTP layer.
pub mod http;
pub mod wire;
