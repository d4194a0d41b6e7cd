//! TCP sockets for one shard: a listener bound with `SO_REUSEPORT` (every shard binds the same
//! port and the kernel spreads connections over them) and a stream implementing futures-lite's
//! `AsyncRead` + `AsyncWrite`.
//!
//! Owns socket set-up (options, backlog), host-name resolution and the mapping of glommio errors
//! to `std::io::Error`. Never parses protocols, never moves a socket between shards, and never
//! calls the system resolver on a shard thread: it blocks for as long as DNS takes (seconds when
//! a server is down), and everything else on the shard would wait with it.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_lite::io::{AsyncRead, AsyncWrite};

/// Default accept backlog per listening socket (per shard).
pub const LISTEN_BACKLOG_DEFAULT: u32 = 1024;
/// Longest [`TcpStream::connect_host`] waits for a host name to resolve. Above glibc's default
/// (two tries of 5 s against the first name server), so that a slow but working resolver is not
/// cut short.
pub const RESOLVE_TIMEOUT_MS: u64 = 15_000;
/// Host-name resolutions running at once in this process, each on a thread of its own: a
/// resolver that hangs must not make every reconnect attempt leave one more thread behind.
pub const RESOLVE_THREADS_MAX: usize = 8;

/// Resolver threads running now (bounded by [`RESOLVE_THREADS_MAX`]).
static RESOLVE_THREADS_RUNNING: AtomicUsize = AtomicUsize::new(0);
/// Resolver threads ever started (tests check that a literal address starts none).
static RESOLVE_THREADS_STARTED: AtomicUsize = AtomicUsize::new(0);

fn gerr<T>(e: glommio::GlommioError<T>) -> io::Error {
    io::Error::from(e)
}

/// Whether a failed accept means the process or the system ran out of a resource (descriptors,
/// buffers, memory): the accept loop then backs off instead of retrying at once.
pub fn accept_out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// A listening socket of this shard.
pub struct TcpListener(glommio::net::TcpListener, RawFd);

impl Drop for TcpListener {
    /// Stops listening at once: `shutdown(SHUT_RD)` on a listening socket takes it out of the
    /// port's `SO_REUSEPORT` group, resets the connections waiting in its backlog (their
    /// clients retry, and reach another shard's socket) and fails an accept still in flight.
    /// Without it the socket stayed listening until the runtime cancelled that accept, and a
    /// client hashed to it in between could be taken by the orphan accept and left unanswered
    /// until the process exited.
    fn drop(&mut self) {
        // SAFETY: `self.1` is the listening socket `self.0` owns and closes after this returns.
        unsafe { libc::shutdown(self.1, libc::SHUT_RD) };
    }
}

impl TcpListener {
    /// Binds `addr` with `SO_REUSEPORT` and the default backlog.
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind_with_backlog(addr, LISTEN_BACKLOG_DEFAULT)
    }

    /// Binds `addr` with `SO_REUSEADDR` + `SO_REUSEPORT` and listens with `backlog`.
    pub fn bind_with_backlog(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
        let fd = bind_reuseport(addr, backlog)?;
        // SAFETY: `fd` is a freshly created, bound and listening socket owned by nobody else;
        // glommio's listener takes ownership and closes it on drop.
        Ok(TcpListener(
            unsafe { glommio::net::TcpListener::from_raw_fd(fd) },
            fd,
        ))
    }

    /// Waits for the next connection of this shard's socket.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let s = self.0.accept().await.map_err(gerr)?;
        let peer = s.peer_addr().map_err(gerr)?;
        Ok((TcpStream::wrap(s), peer))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr().map_err(gerr)
    }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn bind_reuseport(addr: SocketAddr, backlog: u32) -> io::Result<RawFd> {
    let domain = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket syscalls on a descriptor created and owned here; every struct passed
    // by pointer lives on this stack frame with its exact size given.
    unsafe {
        let fd = cvt(libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let guard = FdGuard(fd);
        let one: libc::c_int = 1;
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let p = &one as *const libc::c_int as *const libc::c_void;
        cvt(libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            p,
            len,
        ))?;
        cvt(libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            p,
            len,
        ))?;
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr = libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                };
                cvt(libc::bind(
                    fd,
                    &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ))?;
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr = libc::in6_addr {
                    s6_addr: a.ip().octets(),
                };
                sa.sin6_flowinfo = a.flowinfo();
                sa.sin6_scope_id = a.scope_id();
                cvt(libc::bind(
                    fd,
                    &sa as *const libc::sockaddr_in6 as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                ))?;
            }
        }
        let backlog = backlog.clamp(1, i32::MAX as u32) as libc::c_int;
        cvt(libc::listen(fd, backlog))?;
        std::mem::forget(guard);
        Ok(fd)
    }
}

struct FdGuard(RawFd);
impl Drop for FdGuard {
    fn drop(&mut self) {
        // SAFETY: closes a descriptor this guard owns, on an error path.
        unsafe { libc::close(self.0) };
    }
}

/// A connected TCP stream of this shard.
pub struct TcpStream(glommio::net::TcpStream, Rc<Cell<bool>>);

impl Drop for TcpStream {
    fn drop(&mut self) {
        self.1.set(false);
    }
}

/// Asks, without reading, whether the client of a [`TcpStream`] has gone away. Cheap to clone;
/// answers "gone" once the stream itself has been dropped, so it never touches a closed (and
/// possibly reused) descriptor.
#[derive(Clone)]
pub struct PeerProbe {
    fd: RawFd,
    open: Rc<Cell<bool>>,
}

impl PeerProbe {
    /// True when the peer has closed the connection (end of stream or a socket error) or the
    /// stream was dropped. Unread data makes it answer false.
    pub fn peer_closed(&self) -> bool {
        if !self.open.get() {
            return true;
        }
        peer_closed_fd(self.fd)
    }
}

fn peer_closed_fd(fd: RawFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a non-blocking peek of at most one byte into a stack buffer, on a descriptor the
    // caller guarantees is open (the owning stream is alive).
    let rc = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr() as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if rc == 0 {
        return true;
    }
    if rc < 0 {
        let e = io::Error::last_os_error();
        return !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        );
    }
    false
}

impl TcpStream {
    fn wrap(s: glommio::net::TcpStream) -> TcpStream {
        TcpStream(s, Rc::new(Cell::new(true)))
    }

    /// A handle that can later ask whether the peer went away (see [`PeerProbe`]).
    pub fn peer_probe(&self) -> PeerProbe {
        PeerProbe {
            fd: self.0.as_raw_fd(),
            open: self.1.clone(),
        }
    }

    /// Connects to `addr` (loopback tests, the CLI, other nodes).
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        glommio::net::TcpStream::connect(addr)
            .await
            .map(TcpStream::wrap)
            .map_err(gerr)
    }

    /// Connects to a `host:port` string. A literal address (`10.0.0.7:7943`, `[::1]:7943`) is
    /// used as it is; a host name is resolved with the system resolver on a thread of its own
    /// (never this shard's), for at most [`RESOLVE_TIMEOUT_MS`], and its addresses are tried in
    /// the resolver's order until one connects (as `std::net::TcpStream::connect` does).
    pub async fn connect_host(addr: &str) -> io::Result<TcpStream> {
        let addrs = resolve(addr).await?;
        let mut last = None;
        for a in addrs {
            match TcpStream::connect(a).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address")))
    }

    /// Connects to `addr`, giving up after `timeout`.
    pub async fn connect_timeout(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let timeout = timeout.max(Duration::from_micros(1));
        glommio::net::TcpStream::connect_timeout(addr, timeout)
            .await
            .map(TcpStream::wrap)
            .map_err(gerr)
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.0.set_nodelay(on).map_err(gerr)
    }

    /// Makes closing this stream abortive: bytes not yet delivered are discarded with a reset,
    /// never delivered once a cut network heals (see [`crate::sys::set_linger_abort`]).
    pub fn set_abortive_close(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        crate::sys::set_linger_abort(self.0.as_raw_fd())
    }

    /// Bounds every single read that has to wait: it fails with `ErrorKind::TimedOut` after
    /// `dur`. `None` waits forever. A zero duration is raised to one microsecond.
    /// glommio arms the timer when a read first waits and disarms it when a read completes: a
    /// read future dropped while waiting leaves the old deadline armed for the next read, so
    /// after cancelling a read, close the stream rather than rely on a new timeout.
    pub fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.0
            .set_read_timeout(dur.map(|d| d.max(Duration::from_micros(1))))
            .map_err(gerr)
    }

    /// Like [`TcpStream::set_read_timeout`], for writes waiting for socket buffer space.
    pub fn set_write_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.0
            .set_write_timeout(dur.map(|d| d.max(Duration::from_micros(1))))
            .map_err(gerr)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.0.peer_addr().map_err(gerr)
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr().map_err(gerr)
    }

    /// Shuts down the sending half (the peer reads end-of-stream).
    pub async fn shutdown_write(&self) -> io::Result<()> {
        self.0
            .shutdown(std::net::Shutdown::Write)
            .await
            .map_err(gerr)
    }

    /// Shuts down both halves.
    pub async fn shutdown(&self) -> io::Result<()> {
        self.0
            .shutdown(std::net::Shutdown::Both)
            .await
            .map_err(gerr)
    }

    /// True when the peer has closed the connection (end of stream or a socket error), checked
    /// without blocking and without consuming data: tells a client that went away (metrics
    /// status 499) from one that is merely quiet. Unread data makes it answer false.
    pub fn poll_peer_closed(&self) -> bool {
        peer_closed_fd(self.0.as_raw_fd())
    }
}

/// The addresses of a `host:port` string: parsed at once when it is a literal address, else
/// asked of the system resolver on a thread of its own, at most [`RESOLVE_THREADS_MAX`] at a time,
/// waiting at most [`RESOLVE_TIMEOUT_MS`]. A resolver still busy at the deadline finishes on its
/// thread and its answer is dropped.
pub async fn resolve(addr: &str) -> io::Result<Vec<SocketAddr>> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let running = RESOLVE_THREADS_RUNNING.fetch_add(1, Ordering::SeqCst);
    if running >= RESOLVE_THREADS_MAX {
        RESOLVE_THREADS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("{RESOLVE_THREADS_MAX} host-name resolutions already running; retry later"),
        ));
    }
    let answer = Arc::new(Handoff::new());
    let name = addr.to_owned();
    let tx = answer.clone();
    let started = std::thread::Builder::new()
        .name("narad-resolve".into())
        .stack_size(256 << 10)
        .spawn(move || {
            tx.put(name.to_socket_addrs().map(Iterator::collect));
            RESOLVE_THREADS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = started {
        RESOLVE_THREADS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    RESOLVE_THREADS_STARTED.fetch_add(1, Ordering::SeqCst);
    let within = Duration::from_millis(RESOLVE_TIMEOUT_MS);
    match super::timeout(within, HandoffWait(&answer)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("resolving {addr} took longer than {within:?}"),
        )),
    }
}

/// One value handed from a helper thread to a task of a shard. glommio accepts a wake from a
/// thread that is not an executor (it queues the waker to the task's executor).
struct Handoff<T> {
    slot: Mutex<(Option<T>, Option<Waker>)>,
}

impl<T> Handoff<T> {
    fn new() -> Handoff<T> {
        Handoff {
            slot: Mutex::new((None, None)),
        }
    }

    fn put(&self, v: T) {
        let waker = {
            let mut s = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            s.0 = Some(v);
            s.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Waits for a [`Handoff`]'s value. Dropping it (a deadline) forgets its waker, so that the
/// helper thread never wakes a task that stopped waiting, perhaps on an executor that has ended.
struct HandoffWait<'a, T>(&'a Handoff<T>);

impl<T> Drop for HandoffWait<'_, T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.0.slot.lock().unwrap_or_else(|p| p.into_inner());
            s.1.take()
        };
        drop(waker);
    }
}

impl<T> Future for HandoffWait<'_, T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.0.slot.lock().unwrap_or_else(|p| p.into_inner());
        match s.0.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn connect_host_takes_a_literal_address_without_a_resolver_thread_and_a_name_with_one() {
        // Proves a literal `127.0.0.1:port` connects without starting a resolver thread (the
        // shard never waits on DNS for it), that `localhost:port` connects through one (the name
        // is resolved off the shard; its addresses are tried until one answers, whether
        // localhost lists ::1 or 127.0.0.1 first), and that both reach the listener.
        super::super::block_on(async {
            let mut l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
            let port = l.local_addr().unwrap().port();
            let before = RESOLVE_THREADS_STARTED.load(Ordering::SeqCst);
            for (i, host) in ["127.0.0.1", "localhost"].into_iter().enumerate() {
                let target = format!("{host}:{port}");
                let accepted = super::super::spawn(async move {
                    let (mut s, _) = l.accept().await.expect("accept");
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).await.expect("read");
                    (l, b[0])
                });
                let mut c = TcpStream::connect_host(&target).await.expect(&target);
                c.write_all(&[i as u8]).await.expect("write");
                let (back, byte) = accepted.await;
                assert_eq!(byte, i as u8, "{target} reached the listener");
                let started = RESOLVE_THREADS_STARTED.load(Ordering::SeqCst) - before;
                assert_eq!(started, i, "resolver threads after {target}");
                l = back;
            }
        });
    }
}
