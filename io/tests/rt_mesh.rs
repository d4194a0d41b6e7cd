//! Cross-shard request/reply over the mesh: calls across shards, calls to self, backpressure with
//! tiny channels, unknown shards, and a peer that leaves.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::{self, Mesh, MeshError, MeshSetup, RuntimeConfig};
use narad_io::types::ShardId;

/// The runtime's data directory (it holds only the direct-I/O probe file), removed on drop.
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(shards: u32, name: &str) -> (RuntimeConfig, Dir) {
    let dir = std::env::temp_dir().join(format!("narad-rt-mesh-{name}-{}", std::process::id()));
    let cfg = RuntimeConfig {
        shards,
        pin: false,
        ..RuntimeConfig::new(dir.clone())
    };
    (cfg, Dir(dir))
}

/// Waits (asynchronously, so this shard keeps serving) until every shard has reached this point.
async fn barrier(arrived: &AtomicUsize, shards: usize) {
    arrived.fetch_add(1, Ordering::SeqCst);
    while arrived.load(Ordering::SeqCst) < shards {
        rt::sleep(Duration::from_millis(1)).await;
    }
}

fn double_plus_me(mesh: &Mesh<u64, (u32, u32, u64)>) {
    let me = mesh.me();
    mesh.serve(move |from, x| Box::pin(async move { (from.0, me.0, x * 2) }));
}

#[test]
fn mesh_calls_cross_shards_and_self() {
    // Proves a call reaches the target shard's handler, which sees the caller's id, that the
    // answer comes back to the caller, that 200 concurrent calls each get their own answer, and
    // that a call to the own shard runs the local handler.
    let arrived = Arc::new(AtomicUsize::new(0));
    let (cfg, _dir) = cfg(2, "cross");
    let out = rt::run_with_mesh(cfg, 64, move |id, mesh: Mesh<u64, (u32, u32, u64)>| {
        let arrived = arrived.clone();
        async move {
            double_plus_me(&mesh);
            let peer = ShardId(1 - id.0);
            let calls: Vec<_> = (0..200u64)
                .map(|i| {
                    let mesh = mesh.clone();
                    rt::spawn(async move { mesh.call(peer, i).await })
                })
                .collect();
            let mut ok = 0;
            for (i, c) in calls.into_iter().enumerate() {
                let r = rt::timeout(Duration::from_secs(10), c)
                    .await
                    .expect("call answered in time");
                assert_eq!(r, Ok((id.0, peer.0, 2 * i as u64)));
                ok += 1;
            }
            let own = mesh.call(id, 21).await;
            assert_eq!(own, Ok((id.0, id.0, 42)));
            assert_eq!(mesh.pending_calls(), 0);
            barrier(&arrived, 2).await;
            ok
        }
    })
    .expect("runtime starts");
    assert_eq!(out, vec![200, 200]);
}

#[test]
fn sequential_calls_between_parking_shards_never_lose_a_wake_up() {
    // Proves the sleep/notify handshake between executors (glommio's reactor sets its
    // `should_notify` flag, fences, checks its channels, then sleeps; a sender pushes, fences,
    // reads the flag; vendor/glommio/NARAD.md) loses no wake-up: 3 shards on fewer cores each make
    // 2,000 calls one after another, so both sides park between almost every call, and every
    // call is answered before its 3 s timer. A lost wake-up leaves the callee or the caller
    // asleep until some other event; with little else running that is the call's own timer,
    // and the call then takes 3 s or more (the timer firing also wakes it, so it must be the
    // elapsed time that is checked, not only the timeout's result).
    const CALLS: u64 = 2_000;
    let (cfg, _dir) = cfg(3, "pingpong");
    let arrived = Arc::new(AtomicUsize::new(0));
    let out = rt::run_with_mesh(cfg, 4, move |id, mesh: Mesh<u64, (u32, u32, u64)>| {
        let arrived = arrived.clone();
        async move {
            double_plus_me(&mesh);
            let peer = ShardId((id.0 + 1) % 3);
            let mut answered = 0;
            for i in 0..CALLS {
                let t = std::time::Instant::now();
                let r = rt::timeout(Duration::from_secs(3), mesh.call(peer, i))
                    .await
                    .expect("call answered in time");
                assert!(
                    t.elapsed() < Duration::from_secs(3),
                    "call {i} from shard {} took {:?}: a wake-up was lost",
                    id.0,
                    t.elapsed()
                );
                assert_eq!(r, Ok((id.0, peer.0, 2 * i)));
                answered += 1;
            }
            barrier(&arrived, 3).await;
            answered
        }
    })
    .expect("runtime starts");
    assert_eq!(out, vec![CALLS; 3]);
}

#[test]
fn mesh_backpressure_with_capacity_one() {
    // Proves that with channels of capacity 1 and a slow handler, 100 concurrent callers all
    // complete (senders wait for room instead of failing or losing calls).
    let arrived = Arc::new(AtomicUsize::new(0));
    let (cfg, _dir) = cfg(2, "bp");
    let out = rt::run_with_mesh(cfg, 1, move |id, mesh: Mesh<u32, u32>| {
        let arrived = arrived.clone();
        async move {
            mesh.serve(|_, x| {
                Box::pin(async move {
                    rt::sleep(Duration::from_micros(200)).await;
                    x + 1
                })
            });
            let peer = ShardId(1 - id.0);
            let tasks: Vec<_> = (0..100u32)
                .map(|i| {
                    let m = mesh.clone();
                    rt::spawn(async move { m.call(peer, i).await })
                })
                .collect();
            let mut sum = 0u64;
            for t in tasks {
                let v = rt::timeout(Duration::from_secs(10), t)
                    .await
                    .expect("in time")
                    .expect("ok");
                sum += u64::from(v);
            }
            barrier(&arrived, 2).await;
            sum
        }
    })
    .expect("runtime starts");
    let want: u64 = (1..=100).sum();
    assert_eq!(out, vec![want, want]);
}

#[test]
fn mesh_errors_unknown_shard_self_without_handler_and_departed_peer() {
    // Proves the error values: NoSuchShard for an id outside the mesh, NotServing for a call to
    // oneself before serve, and Disconnected (not a hang) for calls to a peer that closed its end,
    // both the call that was waiting and a later one.
    let setup: MeshSetup<u8, u8> = MeshSetup::new(2, 4);
    let done = Arc::new(AtomicUsize::new(0));
    let (cfg, _dir) = cfg(2, "err");
    let out = rt::run(cfg, move |id| {
        let setup = setup.clone();
        let done = done.clone();
        async move {
            let mesh = setup.join(id).await.expect("join once");
            assert_eq!(
                setup.join(id).await.err(),
                Some(MeshError::AlreadyJoined(id))
            );
            if id.0 == 1 {
                // Leaves at once without serving.
                mesh.close();
                done.fetch_add(1, Ordering::SeqCst);
                return None;
            }
            assert_eq!(
                mesh.call(ShardId(7), 1).await.err(),
                Some(MeshError::NoSuchShard(ShardId(7)))
            );
            assert_eq!(
                mesh.call(id, 1).await.err(),
                Some(MeshError::NotServing(id))
            );
            while done.load(Ordering::SeqCst) < 1 {
                rt::sleep(Duration::from_millis(1)).await;
            }
            // Give shard 1's executor time to tear down its end.
            rt::sleep(Duration::from_millis(50)).await;
            let r = rt::timeout(Duration::from_secs(5), mesh.call(ShardId(1), 1)).await;
            let again = rt::timeout(Duration::from_secs(5), mesh.call(ShardId(1), 2)).await;
            assert_eq!(again, Ok(Err(MeshError::Disconnected(ShardId(1)))));
            Some(r)
        }
    })
    .expect("runtime starts");
    assert_eq!(out[0], Some(Ok(Err(MeshError::Disconnected(ShardId(1))))));
}
