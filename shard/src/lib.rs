//! `narad-shard`: the partitions a shard owns — their lease tables (`lease`) and the host that
//! joins them to the shard's log (`host`), fan-out cursors (`fanout`) and the transit queues of
//! records accepted for another shard (`transit`). Never names glommio, never parses HTTP.

pub mod fanout;
pub mod host;
pub mod lease;
pub mod route;
pub mod transit;
pub mod wire;
