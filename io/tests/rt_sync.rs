//! Shard-local primitives: Notify broadcast, oneshot, Semaphore fairness and limits, timeout.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use narad_io::rt::{self, oneshot, Elapsed, Notify, Semaphore};

#[test]
fn notify_wakes_every_waiter_and_never_loses_a_wakeup() {
    // Proves notify_waiters wakes all current waiters, that a Notified created before the
    // notification completes even if first polled after it, and that dropped waiters unregister.
    rt::block_on(async {
        let n = Rc::new(Notify::new());
        let woken = Rc::new(RefCell::new(0));
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let n = n.clone();
                let woken = woken.clone();
                rt::spawn(async move {
                    n.notified().await;
                    *woken.borrow_mut() += 1;
                })
            })
            .collect();
        rt::sleep(Duration::from_millis(5)).await;
        assert_eq!(n.waiter_count(), 3);
        let early = n.notified();
        n.notify_waiters();
        for t in tasks {
            rt::timeout(Duration::from_secs(2), t).await.expect("woken");
        }
        assert_eq!(*woken.borrow(), 3);
        rt::timeout(Duration::from_millis(100), early)
            .await
            .expect("created before notify: ready");
        // A waiter that gives up leaves no registration behind.
        let r = rt::timeout(Duration::from_millis(5), n.notified()).await;
        assert_eq!(r, Err(Elapsed));
        assert_eq!(n.waiter_count(), 0);
    });
}

#[test]
fn a_ticket_taken_before_a_check_catches_a_notification_during_it() {
    // Proves notified_since(ticket) completes at once when notify_waiters came after the ticket
    // (a check that awaited in between missed nothing), and parks when none came.
    rt::block_on(async {
        let n = Notify::new();
        let ticket = n.ticket();
        n.notify_waiters(); // lands while the caller's check is still running
        rt::timeout(Duration::from_millis(100), n.notified_since(ticket))
            .await
            .expect("a notification after the ticket completes it at once");
        let quiet = n.ticket();
        let r = rt::timeout(Duration::from_millis(5), n.notified_since(quiet)).await;
        assert_eq!(
            r,
            Err(Elapsed),
            "no notification since the ticket: it parks"
        );
        assert_eq!(n.waiter_count(), 0);
    });
}

#[test]
fn oneshot_delivers_and_reports_cancellation() {
    // Proves a sent value arrives, a dropped sender yields Canceled, and sending to a dropped
    // receiver gives the value back.
    rt::block_on(async {
        let (tx, rx) = oneshot::channel();
        rt::spawn(async move {
            rt::sleep(Duration::from_millis(1)).await;
            tx.send(5u32).expect("receiver alive");
        })
        .detach();
        assert_eq!(rx.await, Ok(5));

        let (tx, rx) = oneshot::channel::<u32>();
        drop(tx);
        assert_eq!(rx.await, Err(oneshot::Canceled));

        let (tx, rx) = oneshot::channel::<u32>();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(9), Err(9));
    });
}

#[test]
fn semaphore_bounds_permits_and_serves_waiters_in_order() {
    // Proves try_acquire stops at the capacity, permits come back on drop, waiters are served
    // first-come first-served, a cancelled waiter does not block the queue, and an impossible
    // request (more than capacity) is refused at once.
    rt::block_on(async {
        let s = Semaphore::new(2);
        let a = s.try_acquire().expect("1st");
        let b = s.try_acquire().expect("2nd");
        assert!(s.try_acquire().is_none());
        assert!(s.acquire_n(3).await.is_none());

        let order = Rc::new(RefCell::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let s = s.clone();
            let order = order.clone();
            tasks.push(rt::spawn(async move {
                let p = s.acquire().await;
                order.borrow_mut().push(i);
                rt::sleep(Duration::from_millis(2)).await;
                drop(p);
            }));
            rt::sleep(Duration::from_millis(1)).await;
        }
        // A waiter that gives up while queued.
        let cancelled = rt::timeout(Duration::from_millis(1), s.acquire()).await;
        assert!(cancelled.is_err());
        assert_eq!(s.waiter_count(), 3);
        // Queued waiters have priority over try_acquire.
        drop(a);
        assert!(s.try_acquire().is_none());
        drop(b);
        for t in tasks {
            rt::timeout(Duration::from_secs(2), t)
                .await
                .expect("served");
        }
        assert_eq!(*order.borrow(), vec![0, 1, 2]);
        assert_eq!(s.available(), 2);
        let two = s.try_acquire_n(2).expect("both");
        assert_eq!(two.count(), 2);
    });
}

#[test]
fn timeout_elapses_on_slow_futures_only() {
    // Proves timeout returns the value of a fast future and Elapsed (after about the deadline)
    // for a slow one.
    rt::block_on(async {
        let v = rt::timeout(Duration::from_secs(1), async { 7 }).await;
        assert_eq!(v, Ok(7));
        let t0 = Instant::now();
        let r = rt::timeout(Duration::from_millis(20), rt::sleep(Duration::from_secs(5))).await;
        assert!(r.is_err());
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(19) && took < Duration::from_secs(2),
            "{took:?}"
        );
    });
}
