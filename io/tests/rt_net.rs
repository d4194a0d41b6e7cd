//! TCP on loopback: echo through the runtime's listener and stream, SO_REUSEPORT on one port,
//! read timeouts, and detection of a peer that closed.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use narad_io::rt::{self, TcpListener, TcpStream};

fn loopback0() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

/// Two listeners on one loopback port (one per shard in production) and that port.
fn two_listeners_on_one_port(backlog: u32) -> (TcpListener, TcpListener, SocketAddr) {
    let a = TcpListener::bind_with_backlog(loopback0(), backlog).expect("bind a");
    let addr = a.local_addr().expect("addr");
    let b = TcpListener::bind_with_backlog(addr, backlog).expect("bind b on the same port");
    (a, b, addr)
}

#[test]
fn tcp_echo_over_loopback() {
    // Proves accept returns the peer address and the stream reads and writes both ways; the
    // client is a runtime TcpStream::connect.
    rt::block_on(async {
        let l = TcpListener::bind(loopback0()).expect("bind");
        let addr = l.local_addr().expect("addr");
        let server = rt::spawn(async move {
            let (mut s, peer) = l.accept().await.expect("accept");
            assert!(peer.ip().is_loopback());
            s.set_nodelay(true).expect("nodelay");
            let mut buf = vec![0u8; 5];
            s.read_exact(&mut buf).await.expect("read");
            s.write_all(&buf).await.expect("write");
            s.flush().await.expect("flush");
        });
        let mut c = rt::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .expect("in time")
            .expect("connect");
        c.write_all(b"hello").await.expect("write");
        let mut back = vec![0u8; 5];
        rt::timeout(Duration::from_secs(5), c.read_exact(&mut back))
            .await
            .expect("in time")
            .expect("read");
        assert_eq!(&back, b"hello");
        rt::timeout(Duration::from_secs(5), server)
            .await
            .expect("server done");
    });
}

#[test]
fn reuseport_lets_two_listeners_share_a_port() {
    // Proves two sockets bind the same port (one per shard in production) and connections to it
    // are accepted; a std client stands in for an external one.
    rt::block_on(async {
        let (a, b, addr) = two_listeners_on_one_port(16);
        assert_eq!(b.local_addr().expect("addr").port(), addr.port());
        drop(b);
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            s.write_all(b"x").expect("write");
            let mut one = [0u8; 1];
            s.read_exact(&mut one).expect("read");
            one[0]
        });
        let (mut s, _) = rt::timeout(Duration::from_secs(5), a.accept())
            .await
            .expect("in time")
            .expect("accept");
        let mut one = [0u8; 1];
        s.read_exact(&mut one).await.expect("read");
        s.write_all(b"y").await.expect("write");
        assert_eq!(client.join().expect("client"), b'y');
    });
}

#[test]
fn read_timeout_and_peer_close_are_reported() {
    // Proves a read on a quiet connection fails with TimedOut after the read timeout, and that
    // poll_peer_closed tells a closed peer from a quiet one.
    rt::block_on(async {
        let l = TcpListener::bind(loopback0()).expect("bind");
        let addr = l.local_addr().expect("addr");
        let client = std::thread::spawn(move || {
            let s = std::net::TcpStream::connect(addr).expect("connect");
            std::thread::sleep(Duration::from_millis(150));
            drop(s);
        });
        let (mut s, _) = l.accept().await.expect("accept");
        assert!(!s.poll_peer_closed());
        s.set_read_timeout(Some(Duration::from_millis(20)))
            .expect("set");
        let mut buf = [0u8; 8];
        let e = s.read(&mut buf).await.expect_err("times out");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        client.join().expect("client");
        rt::sleep(Duration::from_millis(10)).await;
        assert!(s.poll_peer_closed());
    });
}

#[test]
fn a_dropped_listener_stops_taking_connections_at_once() {
    // Proves that dropping a listener takes its socket out of the port's group at once, even
    // with an accept in flight on it: 16 clients that connect right after the drop, before the
    // runtime could cancel that accept, are all served by the listener still open. Before,
    // the in-flight accept kept the dropped socket listening until its cancellation reached the
    // kernel, and a client hashed to it was reset, or taken by that orphan accept and left
    // unanswered until the process exited (a probe during a graceful drain hung 10 s).
    rt::block_on(async {
        let (a, b, addr) = two_listeners_on_one_port(64);
        // An accept in flight on `a` (the runtime submitted it), then given up, as a drain does.
        let gave_up = futures_lite::future::or(
            async {
                let _ = a.accept().await;
                false
            },
            async {
                rt::sleep(Duration::from_millis(20)).await;
                true
            },
        )
        .await;
        assert!(gave_up, "nobody connected yet");
        drop(a);
        // No await since the drop: the runtime has not run, so nothing was cancelled yet.
        let socks: Vec<std::net::TcpStream> = (0..16)
            .map(|_| std::net::TcpStream::connect(addr).expect("connect"))
            .collect();
        let clients = std::thread::spawn(move || {
            socks
                .into_iter()
                .filter(|s| {
                    let mut s = s;
                    s.set_read_timeout(Some(Duration::from_secs(2)))
                        .expect("timeout");
                    let mut one = [0u8; 1];
                    s.write_all(b"x").is_ok() && s.read_exact(&mut one).is_ok() && one[0] == b'y'
                })
                .count()
        });
        // Serve until all 16 were answered, or until nobody connects for 3 s.
        let mut answered = 0;
        while answered < 16 {
            let Ok(Ok((mut s, _))) = rt::timeout(Duration::from_secs(3), b.accept()).await else {
                break;
            };
            let mut one = [0u8; 1];
            if s.read_exact(&mut one).await.is_ok() && s.write_all(b"y").await.is_ok() {
                answered += 1;
            }
        }
        assert_eq!(
            clients.join().expect("clients"),
            16,
            "every client answered by b"
        );
    });
}
