//! The cluster port of this shard: serves other nodes' requests (CLUSTER.md §12–13). Every shard
//! listens on `cluster.addr` (the kernel spreads connections over them, as for the API port);
//! a request for the metadata group goes to shard 0, which hosts it.
//!
//! Owns the node's cluster identity (its id and the secret it proves) and the mapping of
//! operation codes (`narad_io::peer::ops`) to the node's work. Never parses frames (io does),
//! never decides metadata (Raft does).

use std::rc::Rc;

use narad_io::peer::{self, ops, Inbound, Outcome};
use narad_io::rt::{ShutdownSignal, TcpListener};

use crate::config::Config;
use crate::node::Node;

/// Binds this shard's cluster listener (a cluster node only).
pub fn bind(config: &Config) -> Result<Option<TcpListener>, String> {
    if config.peers.is_empty() {
        return Ok(None);
    }
    let addr = crate::config::parse_listen_addr(&config.cluster_addr)
        .map_err(|e| format!("cluster.addr {e}"))?;
    TcpListener::bind(addr)
        .map(Some)
        .map_err(|e| format!("cluster.addr {addr}: {e}"))
}

/// Serves the cluster port on this shard until `shutdown`.
pub fn serve(node: &Rc<Node>, listener: TcpListener, shutdown: &ShutdownSignal) {
    let n = node.clone();
    let handler: peer::Handler = Rc::new(move |req: Inbound| {
        let n = n.clone();
        Box::pin(async move { handle(&n, req).await }) as peer::HandlerFuture
    });
    let admit: peer::Admit = Rc::new(|_id: &str| Ok(()));
    narad_io::rt::spawn(peer::serve(
        listener,
        crate::node::identity(&node.config),
        handler,
        admit,
        shutdown.clone(),
    ))
    .detach();
}

async fn handle(node: &Rc<Node>, req: Inbound) -> Outcome {
    match req.op {
        ops::RAFT_APPEND
        | ops::RAFT_VOTE
        | ops::RAFT_PRE_VOTE
        | ops::RAFT_SNAPSHOT
        | ops::RAFT_TRANSFER_LEADER
        | ops::META_PROPOSE
        | ops::META_JOIN
        | ops::META_READ_INDEX => served(node.serve_meta_rpc(&req.from, req.op, req.body()).await),
        ops::PARTITION_OP => served(node.serve_op(req.body()).await),
        ops::COMMIT_BATCH => served(node.serve_commit(req.body()).await),
        ops::LINK_PING => Outcome::Ok(Vec::new()),
        ops::FANOUT_LAG => served(node.serve_fanout_lag(req.body()).await),
        ops::TOPIC_WAIT => served(node.serve_topic_wait(req.body()).await),
        ops::MOVE_MANIFEST => served(node.serve_move_manifest(req.body()).await),
        ops::MOVE_CHUNK => served(node.serve_move_chunk(req.body()).await),
        ops::NODE_STATUS => served(Ok(node.node_status().to_string().into_bytes())),
        ops::REMOTE_PROBE | ops::REMOTE_VIEW => {
            served(node.serve_remote_probe(req.op, req.body()).await)
        }
        _ => Outcome::Unsupported,
    }
}

/// A served operation's answer, or its error, as the reply.
fn served(r: Result<Vec<u8>, String>) -> Outcome {
    r.map_or_else(Outcome::Error, Outcome::Ok)
}
