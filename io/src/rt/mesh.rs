//! Cross-shard request/reply: a full mesh of bounded channels between the shards of one process.
//!
//! Owns: the channels (two per ordered pair of shards: calls and replies), request ids, the
//! per-shard map of pending calls, and the receive loops. It never shares data between threads:
//! a request and its answer are moved through the channel, and handlers run on the shard that
//! received the call.
//!
//! Why two channels per direction: the reply loop must never block, so that a shard whose
//! handlers are all busy (waiting, say, for answers from another shard) still drains replies.
//! Call loops apply backpressure (at most [`MESH_CALLS_IN_FLIGHT_PER_PEER_MAX`] handlers in flight
//! per calling peer, then the bounded channel fills and callers wait in `send`). Handlers that call
//! back into the calling shard can still deadlock when both sides exhaust their handler permits
//! (until their calls' deadlines pass); keep nested calls acyclic.
//!
//! Every call has a deadline, given by the caller (the mesh does not know which calls wait for
//! an fsync and which only read memory): a callee that is stuck, or a channel that stays full,
//! fails the call with [`MeshError::Timeout`] instead of holding the caller forever. On expiry
//! the pending entry is removed at once; the callee's handler still runs to its end, and its late
//! reply finds no entry and is dropped.
//!
//! The mesh is built from glommio `shared_channel`s created before executors start (the
//! [`MeshSetup`] handle is `Send + Sync + Clone`) rather than glommio's `channel_mesh`, whose peer
//! numbering follows glommio executor ids instead of our shard ids and whose builder shares an
//! `Rc` across threads.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};

use super::sync::{oneshot, timeout, Semaphore};
use crate::types::ShardId;

/// Handlers running at once on one shard for calls from one peer; beyond it the call channel
/// fills and the caller's `send` waits (backpressure).
pub const MESH_CALLS_IN_FLIGHT_PER_PEER_MAX: usize = 1024;
/// Default capacity of each mesh channel (messages). Channel buffers are allocated up front:
/// a mesh holds 2·n·(n−1)·capacity message slots for n shards, so keep messages small (box
/// large payloads) and the capacity modest on machines with many cores.
pub const MESH_CHANNEL_CAPACITY_DEFAULT: usize = 256;

struct Call<Req> {
    id: u64,
    req: Req,
}

struct Reply<Resp> {
    id: u64,
    resp: Resp,
}

/// Why a [`Mesh::call`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshError {
    /// The target is not a shard of this mesh.
    NoSuchShard(ShardId),
    /// The target shard has stopped (its executor ended or closed the mesh).
    Disconnected(ShardId),
    /// A call to this shard itself, before [`Mesh::serve`] installed a handler.
    NotServing(ShardId),
    /// The target shard did not answer within `after`, the deadline the caller gave. What the
    /// call asked for may still happen there: its handler runs on and its reply is dropped.
    Timeout { shard: ShardId, after: Duration },
    /// [`MeshSetup::join`] for a shard that already joined or is out of range (a wiring bug).
    AlreadyJoined(ShardId),
}

impl fmt::Display for MeshError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MeshError::NoSuchShard(s) => write!(f, "shard {} is not part of the mesh", s.0),
            MeshError::Disconnected(s) => write!(f, "shard {} has left the mesh", s.0),
            MeshError::NotServing(s) => write!(f, "shard {} serves no mesh calls yet", s.0),
            MeshError::Timeout { shard, after } => {
                write!(f, "shard {} did not answer within {after:?}", shard.0)
            }
            MeshError::AlreadyJoined(s) => write!(f, "shard {} joined the mesh twice", s.0),
        }
    }
}

impl std::error::Error for MeshError {}

struct Endpoints<Req: Send, Resp: Send> {
    calls_out: Vec<Option<SharedSender<Call<Req>>>>,
    calls_in: Vec<Option<SharedReceiver<Call<Req>>>>,
    replies_out: Vec<Option<SharedSender<Reply<Resp>>>>,
    replies_in: Vec<Option<SharedReceiver<Reply<Resp>>>>,
}

/// The mesh before executors start: create it on the main thread, clone it into the closure
/// given to [`super::run`], and call [`MeshSetup::join`] once inside each shard.
pub struct MeshSetup<Req: Send + 'static, Resp: Send + 'static> {
    shards: u32,
    slots: Slots<Req, Resp>,
}

/// One slot per shard, taken by that shard's [`MeshSetup::join`].
type Slots<Req, Resp> = Arc<Mutex<Vec<Option<Endpoints<Req, Resp>>>>>;

impl<Req: Send + 'static, Resp: Send + 'static> Clone for MeshSetup<Req, Resp> {
    fn clone(&self) -> Self {
        MeshSetup {
            shards: self.shards,
            slots: self.slots.clone(),
        }
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> MeshSetup<Req, Resp> {
    /// A full mesh over `shards` shards; every channel holds at most `capacity` messages.
    pub fn new(shards: u32, capacity: usize) -> MeshSetup<Req, Resp> {
        let n = shards as usize;
        let capacity = capacity.max(1);
        let mut eps: Vec<Endpoints<Req, Resp>> = (0..n)
            .map(|_| Endpoints {
                calls_out: (0..n).map(|_| None).collect(),
                calls_in: (0..n).map(|_| None).collect(),
                replies_out: (0..n).map(|_| None).collect(),
                replies_in: (0..n).map(|_| None).collect(),
            })
            .collect();
        for from in 0..n {
            for to in 0..n {
                if from == to {
                    continue;
                }
                let (tx, rx) = shared_channel::new_bounded(capacity);
                eps[from].calls_out[to] = Some(tx);
                eps[to].calls_in[from] = Some(rx);
                let (tx, rx) = shared_channel::new_bounded(capacity);
                eps[to].replies_out[from] = Some(tx);
                eps[from].replies_in[to] = Some(rx);
            }
        }
        MeshSetup {
            shards,
            slots: Arc::new(Mutex::new(eps.into_iter().map(Some).collect())),
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.shards
    }

    /// Connects shard `me` to every peer. Completes once every peer has joined too, so call it
    /// on every shard (each shard's executor must be running for the others to finish).
    pub async fn join(&self, me: ShardId) -> Result<Mesh<Req, Resp>, MeshError> {
        let ep = {
            let mut slots = match self.slots.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            slots.get_mut(me.0 as usize).and_then(Option::take)
        };
        let Some(ep) = ep else {
            return Err(MeshError::AlreadyJoined(me));
        };
        // Connecting waits for the peer side to connect as well, so all connections are made
        // concurrently: connecting one by one deadlocks two shards that start with each other.
        let calls_out = spawn_connect_senders(ep.calls_out);
        let replies_out = spawn_connect_senders(ep.replies_out);
        let calls_in = spawn_connect_receivers(ep.calls_in);
        let replies_in = spawn_connect_receivers(ep.replies_in);
        let calls_out = await_all(calls_out).await;
        let replies_out = await_all(replies_out).await;
        let calls_in = await_all(calls_in).await;
        let replies_in = await_all(replies_in).await;
        let inner = Rc::new(MeshInner {
            me,
            shards: self.shards,
            calls_out,
            replies_out: replies_out.into_iter().map(|s| s.map(Rc::new)).collect(),
            calls_in: RefCell::new(calls_in),
            pending: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
            handler: RefCell::new(None),
            peer_gone: (0..self.shards).map(|_| Cell::new(false)).collect(),
            closed: Cell::new(false),
        });
        for (peer, rx) in replies_in.into_iter().enumerate() {
            if let Some(rx) = rx {
                super::spawn(reply_loop(inner.clone(), ShardId(peer as u32), rx)).detach();
            }
        }
        Ok(Mesh(inner))
    }
}

fn spawn_connect_senders<T: Send + 'static>(
    v: Vec<Option<SharedSender<T>>>,
) -> Vec<Option<super::Task<ConnectedSender<T>>>> {
    v.into_iter()
        .map(|s| s.map(|s| super::spawn(async move { s.connect().await })))
        .collect()
}

fn spawn_connect_receivers<T: Send + 'static>(
    v: Vec<Option<SharedReceiver<T>>>,
) -> Vec<Option<super::Task<ConnectedReceiver<T>>>> {
    v.into_iter()
        .map(|s| s.map(|s| super::spawn(async move { s.connect().await })))
        .collect()
}

async fn await_all<T>(tasks: Vec<Option<super::Task<T>>>) -> Vec<Option<T>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(match t {
            Some(t) => Some(t.await),
            None => None,
        });
    }
    out
}

type Handler<Req, Resp> = Rc<dyn Fn(ShardId, Req) -> Pin<Box<dyn Future<Output = Resp>>>>;

struct MeshInner<Req: Send + 'static, Resp: Send + 'static> {
    me: ShardId,
    shards: u32,
    calls_out: Vec<Option<ConnectedSender<Call<Req>>>>,
    replies_out: Vec<Option<Rc<ConnectedSender<Reply<Resp>>>>>,
    calls_in: RefCell<Vec<Option<ConnectedReceiver<Call<Req>>>>>,
    /// Calls of this shard waiting for a reply: id -> (callee, where to deliver).
    pending: RefCell<HashMap<u64, (ShardId, oneshot::Sender<Resp>)>>,
    next_id: Cell<u64>,
    handler: RefCell<Option<Handler<Req, Resp>>>,
    /// Set when a peer's reply channel ended: that peer has left, calls to it fail at once.
    peer_gone: Vec<Cell<bool>>,
    closed: Cell<bool>,
}

/// This shard's end of the mesh. Cheap to clone; `!Send` (stays on its shard).
pub struct Mesh<Req: Send + 'static, Resp: Send + 'static>(Rc<MeshInner<Req, Resp>>);

impl<Req: Send + 'static, Resp: Send + 'static> Clone for Mesh<Req, Resp> {
    fn clone(&self) -> Self {
        Mesh(self.0.clone())
    }
}

/// Removes a pending call when the caller gives up (timeout, cancellation), so the map stays
/// bounded by the calls actually waiting.
struct PendingGuard<'a, Req: Send + 'static, Resp: Send + 'static> {
    inner: &'a MeshInner<Req, Resp>,
    id: u64,
}

impl<Req: Send + 'static, Resp: Send + 'static> Drop for PendingGuard<'_, Req, Resp> {
    fn drop(&mut self) {
        self.inner.pending.borrow_mut().remove(&self.id);
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Mesh<Req, Resp> {
    /// The shard this handle lives on.
    pub fn me(&self) -> ShardId {
        self.0.me
    }

    pub fn shard_count(&self) -> u32 {
        self.0.shards
    }

    /// Calls in flight from this shard that wait for a reply.
    pub fn pending_calls(&self) -> usize {
        self.0.pending.borrow().len()
    }

    /// Sends `req` to shard `to` and waits at most `within` for its handler's answer, counting
    /// the wait for room in a full channel. A call to this shard itself runs the local handler
    /// in a task of its own, so that it too runs to its end when the caller stops waiting.
    pub async fn call(&self, to: ShardId, req: Req, within: Duration) -> Result<Resp, MeshError> {
        let inner = &*self.0;
        if to == inner.me {
            let h = inner.handler.borrow().clone();
            let Some(h) = h else {
                return Err(MeshError::NotServing(to));
            };
            let (reply_tx, reply_rx) = oneshot::channel();
            super::spawn(async move {
                let _ = reply_tx.send(h(to, req).await);
            })
            .detach();
            return match timeout(within, reply_rx).await {
                Ok(Ok(resp)) => Ok(resp),
                // The handler task was dropped unfinished (the executor is stopping, or nothing
                // could ever wake it): no answer will come.
                Ok(Err(_)) => Err(MeshError::Disconnected(to)),
                Err(_) => Err(MeshError::Timeout {
                    shard: to,
                    after: within,
                }),
            };
        }
        let Some(Some(tx)) = inner.calls_out.get(to.0 as usize) else {
            return Err(MeshError::NoSuchShard(to));
        };
        if inner.closed.get() || inner.peer_gone[to.0 as usize].get() {
            return Err(MeshError::Disconnected(to));
        }
        let id = inner.next_id.get();
        inner.next_id.set(id.wrapping_add(1));
        let (reply_tx, reply_rx) = oneshot::channel();
        inner.pending.borrow_mut().insert(id, (to, reply_tx));
        // Dropped on every way out, the expiry included: the entry never outlives the caller.
        let _guard = PendingGuard { inner, id };
        let exchange = async {
            if tx.send(Call { id, req }).await.is_err() || inner.peer_gone[to.0 as usize].get() {
                return Err(MeshError::Disconnected(to));
            }
            reply_rx.await.map_err(|_| MeshError::Disconnected(to))
        };
        match timeout(within, exchange).await {
            Ok(r) => r,
            Err(_) => Err(MeshError::Timeout {
                shard: to,
                after: within,
            }),
        }
    }

    /// Leaves the mesh: closes this shard's senders so that peers' calls waiting on this shard
    /// fail with [`MeshError::Disconnected`] instead of waiting forever, and refuses new calls.
    /// [`super::run_with_mesh`] calls it when the shard's closure returns.
    pub fn close(&self) {
        let inner = &*self.0;
        inner.closed.set(true);
        inner.handler.borrow_mut().take();
        for s in inner.calls_out.iter().flatten() {
            s.close();
        }
        for s in inner.replies_out.iter().flatten() {
            s.close();
        }
        inner.calls_in.borrow_mut().clear();
    }

    /// Installs the handler for calls to this shard and starts one receive loop per peer.
    /// Calling it again replaces the handler (the loops pick up the new one).
    pub fn serve(
        &self,
        handler: impl Fn(ShardId, Req) -> Pin<Box<dyn Future<Output = Resp>>> + 'static,
    ) {
        *self.0.handler.borrow_mut() = Some(Rc::new(handler));
        let receivers: Vec<_> = self
            .0
            .calls_in
            .borrow_mut()
            .iter_mut()
            .map(Option::take)
            .collect();
        for (peer, rx) in receivers.into_iter().enumerate() {
            if let Some(rx) = rx {
                super::spawn(call_loop(self.0.clone(), ShardId(peer as u32), rx)).detach();
            }
        }
    }
}

async fn call_loop<Req: Send + 'static, Resp: Send + 'static>(
    inner: Rc<MeshInner<Req, Resp>>,
    peer: ShardId,
    rx: ConnectedReceiver<Call<Req>>,
) {
    let permits = Semaphore::new(MESH_CALLS_IN_FLIGHT_PER_PEER_MAX);
    let Some(Some(out)) = inner.replies_out.get(peer.0 as usize).cloned() else {
        return;
    };
    loop {
        let permit = permits.acquire().await;
        let Some(call) = rx.recv().await else {
            return;
        };
        let Some(h) = inner.handler.borrow().clone() else {
            return;
        };
        let out = out.clone();
        super::spawn(async move {
            let resp = h(peer, call.req).await;
            // The caller may have stopped; nothing to do then.
            let _ = out.send(Reply { id: call.id, resp }).await;
            drop(permit);
        })
        .detach();
    }
}

async fn reply_loop<Req: Send + 'static, Resp: Send + 'static>(
    inner: Rc<MeshInner<Req, Resp>>,
    peer: ShardId,
    rx: ConnectedReceiver<Reply<Resp>>,
) {
    while let Some(Reply { id, resp }) = rx.recv().await {
        let entry = inner.pending.borrow_mut().remove(&id);
        if let Some((_, tx)) = entry {
            // The caller may have been cancelled in the meantime.
            let _ = tx.send(resp);
        }
        // No entry: the caller's deadline passed (or it was cancelled) and its guard removed
        // the entry; the late reply is dropped here.
    }
    // The peer is gone: fail its outstanding calls instead of leaving them waiting forever.
    if let Some(g) = inner.peer_gone.get(peer.0 as usize) {
        g.set(true);
    }
    let orphaned: Vec<_> = {
        let mut p = inner.pending.borrow_mut();
        let ids: Vec<u64> = p
            .iter()
            .filter(|(_, (to, _))| *to == peer)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter().filter_map(|id| p.remove(&id)).collect()
    };
    drop(orphaned);
}
