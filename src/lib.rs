//! The `narad` binary's library: CLI, server wiring, the HTTP layer and the API handlers.

pub mod api;
pub mod auth;
pub mod boot_probe;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod schema;
pub mod scrape;
pub mod server;
pub mod service;
pub mod ship;
pub mod transit;
pub mod wire;
