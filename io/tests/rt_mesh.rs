//! Cross-shard request/reply over the mesh: calls across shards, calls to self, backpressure with
//! tiny channels, unknown shards, a peer that leaves, and deadlines.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::{self, Mesh, MeshError, MeshSetup, RuntimeConfig};
use narad_io::types::ShardId;

/// The deadline of calls in tests that expect an answer: far above any answer time, so that a
/// call that fails by it has been lost.
const CALL_WITHIN: Duration = Duration::from_secs(30);

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
                    rt::spawn(async move { mesh.call(peer, i, CALL_WITHIN).await })
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
            let own = mesh.call(id, 21, CALL_WITHIN).await;
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
                let r = rt::timeout(Duration::from_secs(3), mesh.call(peer, i, CALL_WITHIN))
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
                    rt::spawn(async move { m.call(peer, i, CALL_WITHIN).await })
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
                mesh.call(ShardId(7), 1, CALL_WITHIN).await.err(),
                Some(MeshError::NoSuchShard(ShardId(7)))
            );
            assert_eq!(
                mesh.call(id, 1, CALL_WITHIN).await.err(),
                Some(MeshError::NotServing(id))
            );
            while done.load(Ordering::SeqCst) < 1 {
                rt::sleep(Duration::from_millis(1)).await;
            }
            // Give shard 1's executor time to tear down its end.
            rt::sleep(Duration::from_millis(50)).await;
            let r = rt::timeout(
                Duration::from_secs(5),
                mesh.call(ShardId(1), 1, CALL_WITHIN),
            )
            .await;
            let again = rt::timeout(
                Duration::from_secs(5),
                mesh.call(ShardId(1), 2, CALL_WITHIN),
            )
            .await;
            assert_eq!(again, Ok(Err(MeshError::Disconnected(ShardId(1)))));
            Some(r)
        }
    })
    .expect("runtime starts");
    assert_eq!(out[0], Some(Ok(Err(MeshError::Disconnected(ShardId(1))))));
}

/// What [`deadline_handler`] does with a call.
const NEVER: u32 = 0;
const LATE: u32 = 1;
/// How long a [`LATE`] call takes to be answered.
const LATE_AFTER: Duration = Duration::from_millis(300);

/// Answers [`NEVER`] not within the test (a stuck handler: it waits for an hour), [`LATE`] after
/// [`LATE_AFTER`] (counting those answers in `late_answered`) and anything else at once with
/// `x + 1`. (A handler awaiting `std::future::pending()` would not do: nothing holds its waker,
/// so glommio drops the detached task at once.)
fn deadline_handler(mesh: &Mesh<u32, u32>, late_answered: Arc<AtomicUsize>) {
    mesh.serve(move |_, x| {
        let late_answered = late_answered.clone();
        Box::pin(async move {
            match x {
                NEVER => {
                    rt::sleep(Duration::from_secs(3600)).await;
                    x
                }
                LATE => {
                    rt::sleep(LATE_AFTER).await;
                    late_answered.fetch_add(1, Ordering::SeqCst);
                    x
                }
                _ => x + 1,
            }
        })
    });
}

#[test]
fn a_call_to_a_handler_that_never_answers_times_out_and_a_late_answer_is_dropped() {
    // Proves the deadline: a call whose handler never answers (on a peer, and on the own shard)
    // fails with Timeout naming the shard and the deadline, no earlier than the deadline and long
    // before the test's own bound; its pending entry is gone at once; and a reply that arrives
    // after its caller gave up is dropped quietly, with the reply loop still delivering the next
    // answer (which comes after the late one on the same FIFO channel).
    const WITHIN: Duration = Duration::from_millis(100);
    let arrived = Arc::new(AtomicUsize::new(0));
    let late_answered = Arc::new(AtomicUsize::new(0));
    let (cfg, _dir) = cfg(2, "deadline");
    let late = late_answered.clone();
    let out = rt::run_with_mesh(cfg, 8, move |id, mesh: Mesh<u32, u32>| {
        let arrived = arrived.clone();
        let late = late.clone();
        async move {
            deadline_handler(&mesh, late.clone());
            if id.0 == 1 {
                barrier(&arrived, 2).await;
                return true;
            }
            for to in [ShardId(1), ShardId(0)] {
                let t = std::time::Instant::now();
                let r = rt::timeout(Duration::from_secs(10), mesh.call(to, NEVER, WITHIN))
                    .await
                    .expect("the call's own deadline ends it");
                assert_eq!(
                    r,
                    Err(MeshError::Timeout {
                        shard: to,
                        after: WITHIN
                    })
                );
                assert!(t.elapsed() >= WITHIN, "gave up early: {:?}", t.elapsed());
                assert_eq!(mesh.pending_calls(), 0, "the expired call left its entry");
            }
            let r = mesh.call(ShardId(1), LATE, WITHIN).await;
            assert!(matches!(r, Err(MeshError::Timeout { .. })), "{r:?}");
            assert_eq!(mesh.pending_calls(), 0);
            // The late reply arrives meanwhile and finds no entry.
            rt::sleep(LATE_AFTER * 2).await;
            assert_eq!(late.load(Ordering::SeqCst), 1, "the late handler answered");
            assert_eq!(mesh.call(ShardId(1), 41, CALL_WITHIN).await, Ok(42));
            assert_eq!(mesh.pending_calls(), 0);
            barrier(&arrived, 2).await;
            true
        }
    })
    .expect("runtime starts");
    assert_eq!(out, vec![true, true]);
    assert_eq!(late_answered.load(Ordering::SeqCst), 1);
}

#[test]
fn the_deadline_covers_waiting_for_room_in_a_full_channel() {
    // Proves the deadline also bounds the wait in `send`: shard 1 does not serve yet, so the
    // first call's message fills the channel of capacity 1 and that call times out waiting for
    // a reply, and the second times out waiting for room, so it is never sent: once shard 1
    // serves, its handler sees exactly one call. Neither call leaves a pending entry.
    const WITHIN: Duration = Duration::from_millis(100);
    let calls_done = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let (cfg, _dir) = cfg(2, "fullchan");
    let seen = handled.clone();
    let out = rt::run_with_mesh(cfg, 1, move |id, mesh: Mesh<u32, u32>| {
        let (calls_done, arrived, seen) = (calls_done.clone(), arrived.clone(), seen.clone());
        async move {
            if id.0 == 0 {
                for x in 0..2 {
                    let r = rt::timeout(Duration::from_secs(10), mesh.call(ShardId(1), x, WITHIN))
                        .await
                        .expect("the call's own deadline ends it");
                    assert_eq!(
                        r,
                        Err(MeshError::Timeout {
                            shard: ShardId(1),
                            after: WITHIN
                        })
                    );
                    assert_eq!(mesh.pending_calls(), 0);
                }
            }
            barrier(&calls_done, 2).await;
            if id.0 == 1 {
                mesh.serve(move |_, x| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    Box::pin(async move { x })
                });
                // Long enough for a second message, had it been sent, to be handled too.
                rt::sleep(Duration::from_millis(200)).await;
            }
            barrier(&arrived, 2).await;
            mesh.pending_calls()
        }
    })
    .expect("runtime starts");
    assert_eq!(out, vec![0, 0]);
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "only the first call was sent"
    );
}
