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
