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
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        trig.trigger();
    });
    let dir = std::env::temp_dir().join(format!("narad-rt-signal-{}", std::process::id()));
    let cfg = RuntimeConfig {
        shards: 2,
        pin: false,
        ..RuntimeConfig::new(dir.clone())
    };
    let out = rt::run(cfg, move |_| {
        let sig = sig.clone();
        async move {
            assert!(!sig.is_triggered());
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
