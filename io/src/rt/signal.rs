//! Process shutdown: a [`ShutdownSignal`] that any thread can trigger and every shard can await,
//! and a dedicated thread that turns SIGTERM/SIGINT into that trigger.
//!
//! This is the one place in the runtime where state crosses threads, so it uses an atomic flag
//! and a mutex-protected waker list (control path only, touched once per waiting task).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A one-way latch: once triggered it stays triggered.
#[derive(Clone, Default)]
pub struct ShutdownSignal(Arc<Inner>);

#[derive(Default)]
struct Inner {
    triggered: AtomicBool,
    waiters: Mutex<Waiters>,
}

#[derive(Default)]
struct Waiters {
    slots: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        match self.waiters.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

impl ShutdownSignal {
    pub fn new() -> ShutdownSignal {
        ShutdownSignal::default()
    }

    /// Triggers shutdown and wakes every waiting task on every shard. Idempotent.
    pub fn trigger(&self) {
        self.0.triggered.store(true, Ordering::SeqCst);
        let wakers = {
            let mut w = self.0.lock();
            w.free.clear();
            std::mem::take(&mut w.slots)
        };
        for w in wakers.into_iter().flatten() {
            w.wake();
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.0.triggered.load(Ordering::SeqCst)
    }

    /// A future that completes once [`ShutdownSignal::trigger`] has been called.
    pub fn wait(&self) -> ShutdownWait {
        ShutdownWait {
            sig: self.0.clone(),
            slot: None,
        }
    }
}

/// Future returned by [`ShutdownSignal::wait`]. Re-polling it does not grow the waiter list.
pub struct ShutdownWait {
    sig: Arc<Inner>,
    slot: Option<usize>,
}

impl std::future::Future for ShutdownWait {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.sig.triggered.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        let mut w = self.sig.lock();
        // Checked again under the lock: `trigger` sets the flag before taking the lock, so a
        // waker registered after this check is always seen by it.
        if self.sig.triggered.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        let waker = Some(cx.waker().clone());
        let slot = match self.slot {
            Some(i) if i < w.slots.len() => {
                w.slots[i] = waker;
                i
            }
            _ => match w.free.pop() {
                Some(i) => {
                    w.slots[i] = waker;
                    i
                }
                None => {
                    w.slots.push(waker);
                    w.slots.len() - 1
                }
            },
        };
        drop(w);
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for ShutdownWait {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            if self.sig.triggered.load(Ordering::SeqCst) {
                return;
            }
            let mut w = self.sig.lock();
            if i < w.slots.len() && w.slots[i].is_some() {
                w.slots[i] = None;
                w.free.push(i);
            }
        }
    }
}

/// The thread that waits for SIGTERM/SIGINT.
pub struct SignalListener {
    thread: std::thread::JoinHandle<()>,
}

impl SignalListener {
    /// Sends `signo` to the listener thread, as the OS would deliver it (for tests).
    pub fn deliver(&self, signo: libc::c_int) -> io::Result<()> {
        use std::os::unix::thread::JoinHandleExt;
        // SAFETY: the pthread is alive until the thread is joined, which only happens by
        // consuming `self`; pthread_kill with a blocked signal just makes it pending for sigwait.
        let rc = unsafe { libc::pthread_kill(self.thread.as_pthread_t(), signo) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread and starts a thread that triggers `signal`
/// when one arrives. Call it on the main thread **before** starting executors or any other
/// thread: threads inherit the signal mask, and a thread that does not block the signals would
/// receive them with the default action (terminate).
pub fn install_termination_handler(signal: &ShutdownSignal) -> io::Result<SignalListener> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask only changes
    // this thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    let signal = signal.clone();
    let thread = std::thread::Builder::new()
        .name("narad-signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait reads `set` (a copy owned by this thread) and writes one int.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc == 0 {
                tracing::info!(signal = sig, "termination signal received, shutting down");
                signal.trigger();
                return;
            }
        })?;
    Ok(SignalListener { thread })
}
