//! The process shutdown latch: a std thread triggers it and tasks on several shards wake; a
//! SIGTERM delivered to the listener thread triggers it too.

use std::time::Duration;

use narad_io::rt::{self, install_termination_handler, RuntimeConfig, ShutdownSignal};

#[test]
fn trigger_from_a_std_thread_wakes_every_shard() {
    // Proves a trigger from a thread outside the runtime wakes a waiting task on each of two
    // shards (cross-thread waking), and that is_triggered then stays true.
    let sig = ShutdownSignal::new();
    let trig = sig.clone();
    // The trigger waits until both shards are about to wait (a fixed sleep raced a slow start
    // of a shard on a loaded machine).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        for _ in 0..2 {
            ready_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a shard started");
        }
        std::thread::sleep(Duration::from_millis(20));
        trig.trigger();
    });
    let dir = std::env::temp_dir().join(format!("narad-rt-signal-{}", std::process::id()));
    let cfg = RuntimeConfig {
        shards: 2,
        pin: false,
        ..RuntimeConfig::new(dir.clone())
    };
    let ready_tx = std::sync::Arc::new(std::sync::Mutex::new(ready_tx));
    let out = rt::run(cfg, move |_| {
        let sig = sig.clone();
        let ready = ready_tx.lock().expect("sender").clone();
        async move {
            assert!(!sig.is_triggered());
            ready.send(()).expect("trigger thread listens");
            rt::timeout(Duration::from_secs(5), sig.wait())
                .await
                .is_ok()
                && sig.is_triggered()
        }
    })
    .expect("runtime");
    let _ = std::fs::remove_dir_all(&dir);
    t.join().expect("trigger thread");
    assert_eq!(out, vec![true, true]);
}

#[test]
fn sigterm_triggers_the_signal() {
    // Proves the termination handler turns a SIGTERM (sent to its thread as the kernel would)
    // into the trigger, without killing the process.
    let sig = ShutdownSignal::new();
    let listener = install_termination_handler(&sig).expect("install");
    listener.deliver(libc::SIGTERM).expect("deliver");
    let ok = rt::block_on(async move {
        rt::timeout(Duration::from_secs(5), sig.wait())
            .await
            .is_ok()
    });
    assert!(ok);
}
